/*
 * A Redis module for respway's tests (tests/learned_commands.rs): commands whose key
 * specifications have the shapes a proxy must follow — a single-key write and read, a
 * multi-key write with a key count, a read of the keys after a keyword, and a command whose
 * specs are incomplete (it names its keys itself: COMMAND GETKEYS). Built by the tests with
 * the system's C compiler.
 *
 * Written against the module API as Redis 7.0 documents it (module-api reference: the API
 * table reached through the context's first pointer, RedisModule_SetCommandInfo and its
 * structures); only what this module calls is declared here.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct Ctx Ctx;
typedef struct Str Str;
typedef struct CallReply CallReply;
typedef struct Command Command;
typedef int (*CmdFunc)(Ctx *ctx, Str **argv, int argc);

enum { OK = 0, ERR = 1 };

/* Key-spec flags and types (module-api reference, RedisModule_SetCommandInfo). */
#define KEY_RO (1ULL << 0)
#define KEY_RW (1ULL << 1)
#define KEY_OW (1ULL << 2)
#define KEY_ACCESS (1ULL << 4)
#define KEY_UPDATE (1ULL << 5)
#define KEY_INCOMPLETE (1ULL << 9)
enum { BS_INVALID = 0, BS_UNKNOWN, BS_INDEX, BS_KEYWORD };
enum { FK_OMITTED = 0, FK_UNKNOWN, FK_RANGE, FK_KEYNUM };

typedef struct {
    const char *notes;
    uint64_t flags;
    int begin_search_type;
    union {
        struct { int pos; } index;
        struct { const char *keyword; int startfrom; } keyword;
    } bs;
    int find_keys_type;
    union {
        struct { int lastkey; int keystep; int limit; } range;
        struct { int keynumidx; int firstkey; int keystep; } keynum;
    } fk;
} KeySpec;

typedef struct { const char *since; const char *changes; } HistoryEntry;

typedef struct Arg {
    const char *name;
    int type;
    int key_spec_index;
    const char *token;
    const char *summary;
    const char *since;
    int flags;
    const char *deprecated_since;
    struct Arg *subargs;
    const char *display_text;
} Arg;

typedef struct {
    int version;
    size_t sizeof_historyentry;
    size_t sizeof_keyspec;
    size_t sizeof_arg;
} InfoVersion;

typedef struct {
    const InfoVersion *version;
    const char *summary;
    const char *complexity;
    const char *since;
    HistoryEntry *history;
    const char *tips;
    int arity;
    KeySpec *key_specs;
    Arg *args;
} CommandInfo;

static const InfoVersion INFO_VERSION = {1, sizeof(HistoryEntry), sizeof(KeySpec), sizeof(Arg)};

static int (*GetApi)(const char *, void *);
static void (*SetModuleAttribs)(Ctx *, const char *, int, int);
static int (*CreateCommand)(Ctx *, const char *, CmdFunc, const char *, int, int, int);
static Command *(*GetCommand)(Ctx *, const char *);
static int (*SetCommandInfo)(Command *, const CommandInfo *);
static CallReply *(*Call)(Ctx *, const char *, const char *, ...);
static int (*ReplyWithCallReply)(Ctx *, CallReply *);
static void (*FreeCallReply)(CallReply *);
static int (*ReplyWithError)(Ctx *, const char *);
static int (*ReplyWithSimpleString)(Ctx *, const char *);
static int (*ReplyWithLongLong)(Ctx *, long long);
static int (*WrongArity)(Ctx *);
static long long (*CallReplyInteger)(CallReply *);
static int (*StringToLongLong)(const Str *, long long *);
static int (*IsKeysPositionRequest)(Ctx *);
static void (*KeyAtPos)(Ctx *, int);

#define API(name) if (GetApi("RedisModule_" #name, (void *)&name) != OK) return ERR;

static int init(Ctx *ctx) {
    GetApi = (int (*)(const char *, void *))(unsigned long)((void **)ctx)[0];
    API(SetModuleAttribs) API(CreateCommand) API(GetCommand) API(SetCommandInfo) API(Call)
    API(ReplyWithCallReply) API(FreeCallReply) API(ReplyWithError) API(ReplyWithSimpleString)
    API(ReplyWithLongLong) API(WrongArity) API(CallReplyInteger) API(StringToLongLong)
    API(IsKeysPositionRequest) API(KeyAtPos)
    SetModuleAttribs(ctx, "keyspecs", 1, 1);
    return OK;
}

/* Forwards to a core command and answers its reply. */
static int forward(Ctx *ctx, const char *cmd, const char *fmt, Str *a, Str *b) {
    CallReply *r = b ? Call(ctx, cmd, fmt, a, b) : Call(ctx, cmd, fmt, a);
    if (!r) return ReplyWithError(ctx, "ERR call failed");
    ReplyWithCallReply(ctx, r);
    FreeCallReply(r);
    return OK;
}

/* KS.SET key value: SET. */
static int ks_set(Ctx *ctx, Str **argv, int argc) {
    if (argc != 3) return WrongArity(ctx);
    return forward(ctx, "SET", "!ss", argv[1], argv[2]);
}

/* KS.GET key: GET. */
static int ks_get(Ctx *ctx, Str **argv, int argc) {
    if (argc != 2) return WrongArity(ctx);
    return forward(ctx, "GET", "s", argv[1], NULL);
}

/* KS.MSET numkeys key... value: every key set to value. */
static int ks_mset(Ctx *ctx, Str **argv, int argc) {
    long long n;
    if (argc < 4) return WrongArity(ctx);
    if (StringToLongLong(argv[1], &n) != OK || n < 1 || n + 3 != argc)
        return ReplyWithError(ctx, "ERR bad numkeys");
    for (long long i = 0; i < n; i++) {
        CallReply *r = Call(ctx, "SET", "!ss", argv[2 + i], argv[argc - 1]);
        if (r) FreeCallReply(r);
    }
    return ReplyWithSimpleString(ctx, "OK");
}

/* KS.COUNT tag KEYS key...: how many of the keys exist. */
static int ks_count(Ctx *ctx, Str **argv, int argc) {
    long long found = 0;
    if (argc < 4) return WrongArity(ctx);
    for (int i = 3; i < argc; i++) {
        CallReply *r = Call(ctx, "EXISTS", "s", argv[i]);
        if (r) {
            found += CallReplyInteger(r);
            FreeCallReply(r);
        }
    }
    return ReplyWithLongLong(ctx, found);
}

/* KS.ODD key value [key value ...]: sets each key to its value. Its key specs say they may
 * miss keys; the module names them itself when asked (getkeys-api: COMMAND GETKEYS). */
static int ks_odd(Ctx *ctx, Str **argv, int argc) {
    if (argc < 3 || argc % 2 == 0) return WrongArity(ctx);
    if (IsKeysPositionRequest(ctx)) {
        for (int i = 1; i < argc; i += 2) KeyAtPos(ctx, i);
        return OK;
    }
    for (int i = 1; i < argc; i += 2) {
        CallReply *r = Call(ctx, "SET", "!ss", argv[i], argv[i + 1]);
        if (r) FreeCallReply(r);
    }
    return ReplyWithSimpleString(ctx, "OK");
}

static int info(Ctx *ctx, const char *name, int arity, KeySpec *specs) {
    CommandInfo ci;
    memset(&ci, 0, sizeof ci);
    ci.version = &INFO_VERSION;
    ci.arity = arity;
    ci.key_specs = specs;
    return SetCommandInfo(GetCommand(ctx, name), &ci);
}

int RedisModule_OnLoad(Ctx *ctx, Str **argv, int argc) {
    (void)argv;
    (void)argc;
    if (init(ctx) != OK) return ERR;
    if (CreateCommand(ctx, "ks.set", ks_set, "write deny-oom", 1, 1, 1) != OK) return ERR;
    if (CreateCommand(ctx, "ks.get", ks_get, "readonly", 1, 1, 1) != OK) return ERR;
    if (CreateCommand(ctx, "ks.mset", ks_mset, "write deny-oom", 0, 0, 0) != OK) return ERR;
    if (CreateCommand(ctx, "ks.count", ks_count, "readonly", 0, 0, 0) != OK) return ERR;
    if (CreateCommand(ctx, "ks.odd", ks_odd, "write deny-oom getkeys-api", 1, 1, 1) != OK)
        return ERR;

    KeySpec set[2], get[2], mset[2], count[2], odd[2];
    memset(set, 0, sizeof set);
    memset(get, 0, sizeof get);
    memset(mset, 0, sizeof mset);
    memset(count, 0, sizeof count);
    memset(odd, 0, sizeof odd);
    set[0].flags = KEY_OW | KEY_UPDATE;
    set[0].begin_search_type = BS_INDEX;
    set[0].bs.index.pos = 1;
    set[0].find_keys_type = FK_RANGE;
    set[0].fk.range.keystep = 1;
    get[0] = set[0];
    get[0].flags = KEY_RO | KEY_ACCESS;
    mset[0].flags = KEY_OW | KEY_UPDATE;
    mset[0].begin_search_type = BS_INDEX;
    mset[0].bs.index.pos = 1;
    mset[0].find_keys_type = FK_KEYNUM;
    mset[0].fk.keynum.keynumidx = 0;
    mset[0].fk.keynum.firstkey = 1;
    mset[0].fk.keynum.keystep = 1;
    count[0].flags = KEY_RO | KEY_ACCESS;
    count[0].begin_search_type = BS_KEYWORD;
    count[0].bs.keyword.keyword = "KEYS";
    count[0].bs.keyword.startfrom = 1;
    count[0].find_keys_type = FK_RANGE;
    count[0].fk.range.lastkey = -1;
    count[0].fk.range.keystep = 1;
    odd[0] = set[0];
    odd[0].flags = KEY_RW | KEY_UPDATE | KEY_INCOMPLETE;
    if (info(ctx, "ks.set", 3, set) != OK) return ERR;
    if (info(ctx, "ks.get", 2, get) != OK) return ERR;
    if (info(ctx, "ks.mset", -4, mset) != OK) return ERR;
    if (info(ctx, "ks.count", -4, count) != OK) return ERR;
    if (info(ctx, "ks.odd", -3, odd) != OK) return ERR;
    return OK;
}

//! The Redis 7 command table: arity, flags, key positions and the proxy's class of every
//! command and subcommand.
//!
//! The table itself (`command_table.rs`, next to this file) is generated from a real
//! redis-server's `COMMAND` reply by `filters/scripts/gen_command_table.py`; it is checked
//! in, and `python3 filters/scripts/gen_command_table.py --check` fails when it is stale.
//! It currently holds Redis 7.0.15 ([`REDIS_VERSION`]), plus `WAITAOF` (Redis 7.2), kept by
//! hand in the script.
//!
//! # Per request
//!
//! 1. [`lookup`] `argv[0]` (case-insensitive, no allocation, one perfect-hash probe);
//! 2. [`CommandInfo::resolve`] the subcommand of container commands (`OBJECT ENCODING`,
//!    `XINFO STREAM`, `CLIENT SETNAME`, ...), each of which has its own arity, flags and
//!    key positions;
//! 3. [`CommandInfo::arity_ok`], then act on [`CommandInfo::class`];
//! 4. [`CommandInfo::key_indices`] for the positions of the keys.
//!
//! # How the class is decided
//!
//! The generator applies these rules in order; the first match wins (the reason is written
//! as a comment above every entry of the generated table):
//!
//! 1. **Proxy**: `PING`, `ECHO`, `QUIT`, `SELECT`, `HELLO`, `COMMAND`, `CLIENT`, `INFO`,
//!    `AUTH`, `TIME`, `RESET`, `READONLY`, `READWRITE`, `SLOWLOG`, `LATENCY` are answered by the proxy
//!    ([`ProxyCommand`]); the subcommands of `COMMAND` and `CLIENT` inherit their parent's
//!    class.
//! 2. **Split**: `MGET` ([`SplitKind::Mget`]), `MSET` ([`SplitKind::Mset`]) and `DEL`,
//!    `UNLINK`, `EXISTS`, `TOUCH` ([`SplitKind::SumInt`]).
//! 3. **Transaction**: `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH` (the session pins a
//!    dedicated connection to the transaction's shard).
//! 4. **Fanout**: `SCRIPT LOAD | EXISTS | FLUSH` (every endpoint), `FUNCTION LOAD | DELETE |
//!    FLUSH | RESTORE` (every primary), `FUNCTION LIST | DUMP` (one primary) ([`FanoutKind`]).
//! 5. **Blocking**: `BLPOP`, `BRPOP`, `BLMOVE`, `BRPOPLPUSH`, `BLMPOP`, `BZPOPMIN`,
//!    `BZPOPMAX`, `BZMPOP`, `XREAD`, `XREADGROUP` (a dedicated connection each), and `WAIT`,
//!    `WAITAOF` (a dedicated connection to every primary).
//! 6. **PubSub** ([`PubSubKind`]) and **Keyspace** ([`KeyspaceKind`]: `SCAN`, `KEYS`,
//!    `DBSIZE`, `RANDOMKEY`, `FLUSHDB`, `FLUSHALL`).
//! 7. **Unsupported** by name: `MOVE` (another database), `MIGRATE`, `RESTORE-ASKING`.
//! 8. **Unsupported** when Redis flags the command `blocking`, `pubsub` or `admin`
//!    (`CONFIG SET`, `DEBUG`, `SHUTDOWN`, `SAVE`, `REPLICAOF`, `MONITOR`, `PFDEBUG`, most
//!    `CLUSTER`/`ACL` subcommands, ...).
//! 9. **Unsupported** when the command has no keys at all: `SWAPDB`, `PUBSUB HELP`,
//!    `OBJECT HELP`, the container commands themselves (an unknown subcommand resolves to
//!    the container), ...
//! 10. **Single** when the key positions can only ever name one key (`GET`, `SET`, `HSET`,
//!     `XADD`, `SORT_RO`, `GEORADIUS_RO`, `OBJECT ENCODING` (key at 2), `MEMORY USAGE`,
//!     `XINFO STREAM`, `XGROUP CREATE`, ...).
//! 11. **SameShard** otherwise: several keys, numkeys or an optional destination key
//!     (`RENAME`, `SMOVE`, `LMOVE`, `COPY`, `MSETNX`, `SINTER`/`SUNION`/`SDIFF` and their
//!     `STORE` forms, `PFCOUNT`, `PFMERGE`, `BITOP`, `LCS`, `SORT`, `GEORADIUS` (`STORE`),
//!     `GEOSEARCHSTORE`, `ZRANGESTORE`, `ZUNIONSTORE`/`ZINTERSTORE`/`ZDIFFSTORE`, `ZUNION`,
//!     `ZINTER`, `ZDIFF`, `ZINTERCARD`, `SINTERCARD`, `LMPOP`, `ZMPOP`, `EVAL`, `EVALSHA`,
//!     `EVAL_RO`, `EVALSHA_RO`, `FCALL`, `FCALL_RO`). `EVAL ... 0` yields no keys; the
//!     caller decides what to do with a key-less script.
//!
//! # Key positions
//!
//! Commands whose keys sit at fixed positions use Redis's legacy `(first, last, step)`
//! ([`KeySpec::Range`]; the generator checks it against the server's key specs). Commands
//! with movable keys get a dedicated [`KeySpec`] variant that mirrors Redis's own key
//! finder; the generator fails on any key-spec shape it does not know. The generated file
//! also embeds `COMMAND GETKEYS` answers of the live server, and a test checks
//! [`CommandInfo::key_indices`] against them.
//!
//! Known limits: `SORT ... BY/GET pattern` names keys through patterns that cannot be
//! routed (only the sorted key and the `STORE` destination are keys here), and `COPY ... DB`
//! copies into another database of the same shard.

use bytes::Bytes;

mod keys;
pub use keys::ASKED_KEYS;
pub mod learned;
#[path = "command_table.rs"]
mod table;

/// Redis `write`: the command may modify data.
pub const WRITE: u32 = 1 << 0;
/// Redis `readonly`: the command only reads data.
pub const READONLY: u32 = 1 << 1;
/// Redis `denyoom`: rejected when the server is over `maxmemory`.
pub const DENYOOM: u32 = 1 << 2;
/// Redis `module`: implemented by a module.
pub const MODULE: u32 = 1 << 3;
/// Redis `admin`: administrative command.
pub const ADMIN: u32 = 1 << 4;
/// Redis `pubsub`: publish/subscribe command.
pub const PUBSUB: u32 = 1 << 5;
/// Redis `noscript`: not allowed in scripts.
pub const NOSCRIPT: u32 = 1 << 6;
/// Redis `blocking`: may block the client.
pub const BLOCKING: u32 = 1 << 7;
/// Redis `loading`: allowed while the database is loading.
pub const LOADING: u32 = 1 << 8;
/// Redis `stale`: allowed on a replica with stale data.
pub const STALE: u32 = 1 << 9;
/// Redis `skip_monitor`: not shown by `MONITOR`.
pub const SKIP_MONITOR: u32 = 1 << 10;
/// Redis `skip_slowlog`: not logged in the slow log.
pub const SKIP_SLOWLOG: u32 = 1 << 11;
/// Redis `asking`: cluster `ASKING` semantics (importing slot).
pub const ASKING: u32 = 1 << 12;
/// Redis `fast`: O(1) or O(log N).
pub const FAST: u32 = 1 << 13;
/// Redis `no_auth`: allowed before authentication.
pub const NO_AUTH: u32 = 1 << 14;
/// Redis `no_mandatory_keys`: may have keys but need not (`EVAL ... 0`).
pub const NO_MANDATORY_KEYS: u32 = 1 << 15;
/// Redis `no_async_loading`: denied during async loading.
pub const NO_ASYNC_LOADING: u32 = 1 << 16;
/// Redis `no_multi`: not allowed inside `MULTI`.
pub const NO_MULTI: u32 = 1 << 17;
/// Redis `movablekeys`: key positions depend on the arguments.
pub const MOVABLE_KEYS: u32 = 1 << 18;
/// Redis `allow_busy`: allowed while a script is busy.
pub const ALLOW_BUSY: u32 = 1 << 19;

/// Version of the redis-server the table was generated from.
pub const REDIS_VERSION: &str = table::REDIS_VERSION;

/// One Redis command or subcommand.
#[derive(Debug)]
pub struct CommandInfo {
    /// Lowercase name; subcommands as `container|sub`, e.g. `object|encoding`.
    pub name: &'static str,
    /// Redis arity, counting the command name (and for subcommands the container name):
    /// `n` means exactly `n` arguments, `-n` at least `n`.
    pub arity: i32,
    /// Flag bit set ([`WRITE`], [`READONLY`], ...).
    pub flags: u32,
    /// The flags as Redis's `COMMAND` reply names them, in its order.
    pub flag_names: &'static [&'static str],
    /// Redis's legacy `(first key, last key, step)` as `COMMAND` reports it (`(0, 0, 0)`
    /// when the keys are movable or absent; a negative last counts from the end).
    pub legacy_range: (i32, i32, i32),
    /// ACL categories as `COMMAND` reports them (`@read`, `@string`, ...).
    pub acl_categories: &'static [&'static str],
    /// Where the keys are.
    pub keys: KeySpec,
    /// What the proxy does with the command.
    pub class: CommandClass,
    /// Subcommands of a container command (`OBJECT`, `CLIENT`, `XINFO`, ...), sorted by
    /// name; empty otherwise.
    pub subcommands: &'static [CommandInfo],
}

/// Positions of a command's keys in its argv (`args[0]` is the command name).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KeySpec {
    /// No keys.
    None,
    /// Keys at `first`, `first + step`, ... up to `last`; a negative `last` counts from the
    /// end (`-1` = the last argument, `-2` = the one before, as `BLPOP`'s timeout).
    Range {
        /// Index of the first key.
        first: u8,
        /// Index of the last key, or from the end when negative.
        last: i8,
        /// Distance between keys (2 for `MSET`'s key/value pairs).
        step: u8,
    },
    /// A key count at `numkeys_index`, then that many keys from
    /// `numkeys_index + first_offset` on (`EVAL`, `EVALSHA`, `FCALL`, `LMPOP`, `ZMPOP`,
    /// `SINTERCARD`, `ZUNION`, `ZINTER`, `ZDIFF`, `ZINTERCARD`, ...).
    NumKeys {
        /// Index of the key count.
        numkeys_index: u8,
        /// Offset of the first key from the key count.
        first_offset: u8,
        /// `args[1]` is a key too, before the counted ones (the destination of
        /// `ZUNIONSTORE`, `ZINTERSTORE`, `ZDIFFSTORE`).
        extra_first_key: bool,
    },
    /// `GEORADIUS`, `GEORADIUSBYMEMBER`: the key at 1, plus the argument after every
    /// `STORE` / `STOREDIST` option at or after `search_from` (a superset of both what the
    /// command uses, the last one, and what Redis's key specs report, the first of each).
    StoreOption {
        /// Index of the first optional argument.
        search_from: u8,
    },
    /// `SORT`: the key at 1, plus the destination of the last `STORE` option (options are
    /// skipped as Redis does: `LIMIT` takes 2 arguments, `BY` and `GET` one).
    Sort,
    /// `XREAD`, `XREADGROUP`: after the options, `STREAMS key... id...` with one ID per key.
    Streams,
    /// `MIGRATE`: the key at 3, or, when it is empty, the keys after the `KEYS` option.
    Migrate,
    /// A command learned from the shards ([`learned`]): its key specifications, as the
    /// server reported them (every key any of them finds, in ascending order).
    Learned(&'static [learned::LearnedSpec]),
    /// A command learned from the shards whose key specifications say they may miss keys
    /// (`incomplete`): a shard names its keys (`COMMAND GETKEYS`) before it is placed, which
    /// the session does ([`CommandInfo::key_indices`] cannot: it is an error).
    Asked,
}

/// What the proxy does with a command.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum CommandClass {
    /// Exactly one key, forwarded to the shard that owns it (`GET`, `SET`, `HSET`, `INCR`,
    /// `OBJECT ENCODING`, ...).
    Single,
    /// Split per shard and merged: `MGET` (array in key order), `MSET` (`OK`), and `DEL`,
    /// `UNLINK`, `EXISTS`, `TOUCH` (integer sum).
    Split(SplitKind),
    /// Several keys that must all hash to one shard (`RENAME`, `SMOVE`, `SINTERSTORE`,
    /// `ZUNIONSTORE`, `LMOVE`, `COPY`, `MSETNX`, `PFCOUNT`, `EVAL`, `FCALL`, `BITOP`,
    /// `GEORADIUS ... STORE`, `SORT ... STORE`, ...). A script with no keys yields an empty
    /// key list; the caller decides.
    SameShard,
    /// Answered by the proxy itself.
    Proxy(ProxyCommand),
    /// `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`: the session runs the transaction on a
    /// dedicated connection to the one shard all its keys hash to.
    Transaction,
    /// Key-less commands sent to several endpoints of every cluster the listener routes to,
    /// their replies merged.
    Fanout(FanoutKind),
    /// Blocking commands (`BLPOP`, `BZPOPMIN`, `XREAD ... BLOCK`, ...): run on a dedicated
    /// connection to the shard all their keys hash to, with their own timeout. `XREAD` and
    /// `XREADGROUP` without `BLOCK` are forwarded like [`CommandClass::SameShard`].
    Blocking,
    /// Publish/subscribe.
    PubSub(PubSubKind),
    /// Commands over the whole keyspace: every shard of every routed cluster.
    Keyspace(KeyspaceKind),
    /// Not supported by a sharding proxy: admin commands, commands that move keys between
    /// servers or databases, and key-less commands the proxy does not answer.
    Unsupported,
}

/// Which [`CommandClass::PubSub`] command.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum PubSubKind {
    /// `SUBSCRIBE channel ...`.
    Subscribe,
    /// `UNSUBSCRIBE [channel ...]`.
    Unsubscribe,
    /// `PSUBSCRIBE pattern ...`.
    Psubscribe,
    /// `PUNSUBSCRIBE [pattern ...]`.
    Punsubscribe,
    /// `SSUBSCRIBE shardchannel ...`.
    Ssubscribe,
    /// `SUNSUBSCRIBE [shardchannel ...]`.
    Sunsubscribe,
    /// `PUBLISH channel message`.
    Publish,
    /// `SPUBLISH shardchannel message`.
    Spublish,
    /// `PUBSUB CHANNELS [pattern]`.
    Channels,
    /// `PUBSUB SHARDCHANNELS [pattern]`.
    ShardChannels,
    /// `PUBSUB NUMSUB [channel ...]`.
    NumSub,
    /// `PUBSUB SHARDNUMSUB [shardchannel ...]`.
    ShardNumSub,
    /// `PUBSUB NUMPAT`.
    NumPat,
}

/// Which [`CommandClass::Keyspace`] command.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum KeyspaceKind {
    /// `SCAN cursor [MATCH p] [COUNT n] [TYPE t]`.
    Scan,
    /// `KEYS pattern`.
    Keys,
    /// `DBSIZE`.
    Dbsize,
    /// `RANDOMKEY`.
    RandomKey,
    /// `FLUSHDB` / `FLUSHALL` `[ASYNC|SYNC]`.
    Flush,
}

/// How a [`CommandClass::Split`] command is split and its replies merged.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum SplitKind {
    /// `MGET`: one sub-`MGET` per shard; replies reassembled in key order.
    Mget,
    /// `MSET`: one sub-`MSET` per shard with the key/value pairs; reply `OK`.
    Mset,
    /// `DEL`, `UNLINK`, `EXISTS`, `TOUCH`: one sub-command per shard; integer replies summed.
    SumInt,
}

/// Where a [`CommandClass::Fanout`] command goes and how its replies are merged.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum FanoutKind {
    /// `SCRIPT LOAD`: every endpoint (replicas run `EVALSHA_RO` too); the SHA1 if all agree.
    ScriptLoad,
    /// `SCRIPT EXISTS`: every endpoint; 1 for a script only where every endpoint has it.
    ScriptExists,
    /// `SCRIPT FLUSH`: every endpoint; `OK` when all are.
    ScriptFlush,
    /// `FUNCTION LOAD | DELETE | FLUSH | RESTORE`: every primary (replicas get them by
    /// replication); the first reply when all succeed.
    FunctionWrite,
    /// `FUNCTION LIST | DUMP`: the first primary of the first cluster.
    FunctionRead,
    /// `SCRIPT KILL`, `FUNCTION KILL`: every endpoint, each on a connection of its own (a
    /// shard running a script answers nothing else); `OK` when one killed a script.
    Kill,
}

/// A command answered by the proxy itself.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum ProxyCommand {
    /// `PING [message]`.
    Ping,
    /// `ECHO message`.
    Echo,
    /// `QUIT`.
    Quit,
    /// `SELECT db`.
    Select,
    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
    Hello,
    /// `COMMAND` and its subcommands.
    Command,
    /// `CLIENT` and its subcommands.
    Client,
    /// `INFO [section ...]`.
    Info,
    /// `AUTH [user] password`.
    Auth,
    /// `TIME`.
    Time,
    /// `RESET`.
    Reset,
    /// `READONLY`, `READWRITE` (Redis Cluster's replica-read switch): accepted, no effect.
    ReadMode,
    /// `SLOWLOG GET | LEN | RESET | HELP`: the proxy's own slow log.
    Slowlog,
    /// `LATENCY HISTOGRAM | LATEST | RESET | HELP`: from the proxy's own latency counters.
    Latency,
}

/// Every top-level command (subcommands in [`CommandInfo::subcommands`]), sorted by name.
pub fn all() -> &'static [CommandInfo] {
    &table::COMMANDS
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;
const PHF_SEED_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// MurmurHash3's 64-bit finalizer.
#[inline]
fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Looks a top-level command up by `argv[0]`, ignoring ASCII case, without allocating:
/// one FNV-1a pass over the name, one perfect-hash probe and one comparison.
#[inline]
pub fn lookup(name: &[u8]) -> Option<&'static CommandInfo> {
    if name.is_empty() || name.len() > table::MAX_NAME_LEN {
        return None;
    }
    let mut h = FNV_OFFSET;
    for &b in name {
        h = (h ^ u64::from(b.to_ascii_lowercase())).wrapping_mul(FNV_PRIME);
    }
    let bucket = (fmix64(h) >> (64 - table::PHF_BUCKET_BITS)) as usize;
    let seed = u64::from(table::PHF_SEEDS[bucket % table::PHF_SEEDS.len()]);
    let slot = fmix64(h ^ seed.wrapping_mul(PHF_SEED_MUL)) as usize & (table::PHF_SLOTS.len() - 1);
    // An empty slot holds u16::MAX, past the end of the table.
    let cmd = table::COMMANDS.get(usize::from(table::PHF_SLOTS[slot]))?;
    cmd.name
        .as_bytes()
        .eq_ignore_ascii_case(name)
        .then_some(cmd)
}

impl CommandInfo {
    /// Whether every bit of `flag` is set.
    #[inline]
    pub fn has_flag(&self, flag: u32) -> bool {
        self.flags & flag == flag
    }

    /// Redis's `write` flag: the command may modify data. (Scripts, `EVAL` and `FCALL`,
    /// carry neither `write` nor `readonly`; their `_RO` forms are `readonly`.)
    #[inline]
    pub fn is_write(&self) -> bool {
        self.flags & WRITE != 0
    }

    /// Redis's `readonly` flag.
    #[inline]
    pub fn is_readonly(&self) -> bool {
        self.flags & READONLY != 0
    }

    /// Whether `argc` arguments (counting the command name) satisfy the arity.
    #[inline]
    pub fn arity_ok(&self, argc: usize) -> bool {
        let n = self.arity.unsigned_abs() as usize;
        if self.arity >= 0 {
            argc == n
        } else {
            argc >= n
        }
    }

    /// The subcommand `name` of this container command, ignoring ASCII case.
    pub fn subcommand(&'static self, name: &[u8]) -> Option<&'static CommandInfo> {
        let skip = self.name.len() + 1;
        self.subcommands.iter().find(|s| {
            s.name
                .as_bytes()
                .get(skip..)
                .is_some_and(|sub| sub.eq_ignore_ascii_case(name))
        })
    }

    /// For a container command, the subcommand named by `args[1]` (ignoring ASCII case);
    /// `self` when there are no subcommands, no `args[1]` or no such subcommand.
    #[inline]
    pub fn resolve(&'static self, args: &[Bytes]) -> &'static CommandInfo {
        if self.subcommands.is_empty() {
            return self;
        }
        match args.get(1) {
            Some(sub) => self.subcommand(sub).unwrap_or(self),
            None => self,
        }
    }
}

#[cfg(test)]
mod tests;

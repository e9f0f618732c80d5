//! The command table's tests: classes, key positions, subcommands, arity.

use super::keys::{MIGRATE_KEYS_NOT_EMPTY, UNBALANCED_STREAMS};
use super::*;

fn argv(parts: &[&str]) -> Vec<Bytes> {
    parts
        .iter()
        .map(|p| Bytes::copy_from_slice(p.as_bytes()))
        .collect()
}

fn cmd(name: &str) -> &'static CommandInfo {
    lookup(name.as_bytes()).unwrap_or_else(|| panic!("{name} not in the table"))
}

/// Key indices of a space-separated command line (`''` is an empty argument).
fn keys(line: &str) -> Result<Vec<usize>, &'static str> {
    let parts: Vec<&str> = line
        .split(' ')
        .map(|p| if p == "''" { "" } else { p })
        .collect();
    keys_of(&parts)
}

fn keys_of(parts: &[&str]) -> Result<Vec<usize>, &'static str> {
    let args = argv(parts);
    let c = cmd(parts[0]).resolve(&args);
    assert!(c.arity_ok(args.len()), "{parts:?}: arity");
    let mut out = vec![usize::MAX; 3];
    c.key_indices(&args, &mut out).map(|()| out)
}

const FLAG_NAMES: [(&str, u32); 20] = [
    ("write", WRITE),
    ("readonly", READONLY),
    ("denyoom", DENYOOM),
    ("module", MODULE),
    ("admin", ADMIN),
    ("pubsub", PUBSUB),
    ("noscript", NOSCRIPT),
    ("blocking", BLOCKING),
    ("loading", LOADING),
    ("stale", STALE),
    ("skip_monitor", SKIP_MONITOR),
    ("skip_slowlog", SKIP_SLOWLOG),
    ("asking", ASKING),
    ("fast", FAST),
    ("no_auth", NO_AUTH),
    ("no_mandatory_keys", NO_MANDATORY_KEYS),
    ("no_async_loading", NO_ASYNC_LOADING),
    ("no_multi", NO_MULTI),
    ("movablekeys", MOVABLE_KEYS),
    ("allow_busy", ALLOW_BUSY),
];

fn every_command() -> impl Iterator<Item = &'static CommandInfo> {
    all()
        .iter()
        .flat_map(|c| std::iter::once(c).chain(c.subcommands.iter()))
}

#[test]
fn lookup_is_case_insensitive() {
    assert_eq!(cmd("GeT").name, "get");
    assert_eq!(lookup(b"GET").unwrap().name, "get");
    assert_eq!(lookup(b"georadiusbymember_ro").unwrap().arity, -5);
    assert_eq!(lookup(b"RESTORE-ASKING").unwrap().name, "restore-asking");
    assert!(lookup(b"").is_none());
    assert!(lookup(b"nosuchcommand").is_none());
    assert!(lookup(b"ge").is_none());
    assert!(lookup(b"gett").is_none());
    assert!(lookup(b"object|encoding").is_none());
    assert!(lookup(b"georadiusbymember_ro_").is_none());
    assert!(lookup(&[0xff; 8]).is_none());
}

#[test]
fn lookup_finds_every_command_in_any_case() {
    assert!(all().len() > 200);
    assert!(all().windows(2).all(|w| w[0].name < w[1].name));
    for c in all() {
        assert!(std::ptr::eq(lookup(c.name.as_bytes()).unwrap(), c));
        let upper = c.name.to_ascii_uppercase();
        assert!(std::ptr::eq(lookup(upper.as_bytes()).unwrap(), c));
        // A near miss must not be found.
        let mut longer = c.name.as_bytes().to_vec();
        longer.push(b'x');
        assert!(lookup(&longer).is_none_or(|o| o.name != c.name));
    }
}

#[test]
fn table_is_consistent() {
    for c in every_command() {
        let mut flags = 0;
        for name in c.flag_names {
            let (_, bit) = FLAG_NAMES
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{}: flag {name}", c.name));
            flags |= bit;
        }
        assert_eq!(flags, c.flags, "{}", c.name);
        assert_eq!(c.name, c.name.to_ascii_lowercase());
        assert_ne!(c.arity, 0, "{}", c.name);
        if c.has_flag(MOVABLE_KEYS) {
            assert!(!matches!(c.keys, KeySpec::Range { .. }) || c.name == "sort_ro");
        } else if let KeySpec::Range { first, last, step } = c.keys {
            let legacy = (i32::from(first), i32::from(last), i32::from(step));
            assert_eq!(legacy, c.legacy_range, "{}", c.name);
        }
        for s in c.subcommands {
            assert!(s.name.starts_with(&format!("{}|", c.name)));
            assert!(s.subcommands.is_empty());
        }
        assert!(c.subcommands.windows(2).all(|w| w[0].name < w[1].name));
    }
    assert_eq!(REDIS_VERSION.split('.').next(), Some("7"));
}

#[test]
fn flags() {
    assert!(cmd("set").is_write());
    assert!(!cmd("get").is_write());
    assert!(cmd("get").is_readonly());
    assert!(cmd("get").has_flag(READONLY | FAST));
    assert!(!cmd("get").has_flag(READONLY | WRITE));
    assert!(cmd("blpop").has_flag(BLOCKING));
    assert!(cmd("subscribe").has_flag(PUBSUB));
    assert!(cmd("eval").has_flag(MOVABLE_KEYS | NO_MANDATORY_KEYS | NOSCRIPT));
    assert!(cmd("debug").has_flag(ADMIN));
    assert_eq!(cmd("get").flag_names, ["readonly", "fast"]);
    assert_eq!(cmd("mset").legacy_range, (1, -1, 2));
    assert_eq!(cmd("eval").legacy_range, (0, 0, 0));
    assert!(cmd("get").acl_categories.contains(&"@string"));
}

#[test]
fn arity() {
    let get = cmd("get");
    assert!(!get.arity_ok(0));
    assert!(!get.arity_ok(1));
    assert!(get.arity_ok(2));
    assert!(!get.arity_ok(3));
    let set = cmd("set");
    assert!(!set.arity_ok(2));
    assert!(set.arity_ok(3));
    assert!(set.arity_ok(7));
    assert!(cmd("ping").arity_ok(1));
    assert!(cmd("ping").arity_ok(2));
    assert!(!cmd("mget").arity_ok(1));
    assert!(cmd("mget").arity_ok(2));
    let enc = cmd("object").resolve(&argv(&["object", "encoding", "k"]));
    assert!(enc.arity_ok(3));
    assert!(!enc.arity_ok(4));
}

#[test]
fn resolve_subcommands() {
    let object = cmd("object");
    let enc = object.resolve(&argv(&["OBJECT", "EnCoDiNg", "k"]));
    assert_eq!(enc.name, "object|encoding");
    assert_eq!(enc.class, CommandClass::Single);
    assert!(std::ptr::eq(object.resolve(&argv(&["object"])), object));
    assert!(std::ptr::eq(
        object.resolve(&argv(&["object", "nope"])),
        object
    ));
    assert_eq!(object.class, CommandClass::Unsupported);
    let get = cmd("get");
    assert!(std::ptr::eq(get.resolve(&argv(&["get", "encoding"])), get));
    for (parent, sub) in [
        ("client", "setname"),
        ("client", "no-evict"),
        ("config", "get"),
        ("memory", "usage"),
        ("xinfo", "stream"),
        ("xgroup", "createconsumer"),
        ("command", "getkeys"),
        ("cluster", "keyslot"),
        ("script", "load"),
        ("function", "list"),
        ("pubsub", "channels"),
        ("acl", "whoami"),
    ] {
        let c = cmd(parent).resolve(&argv(&[parent, sub]));
        assert_eq!(c.name, format!("{parent}|{sub}"));
    }
    assert!(cmd("client").subcommand(b"LIST").is_some());
    assert!(cmd("client").subcommand(b"lis").is_none());
}

#[test]
fn key_indices_fixed_positions() {
    assert_eq!(keys("get k"), Ok(vec![1]));
    assert_eq!(keys("set k v EX 10"), Ok(vec![1]));
    assert_eq!(keys("mset a 1 b 2 c 3"), Ok(vec![1, 3, 5]));
    assert_eq!(keys("mset a 1"), Ok(vec![1]));
    assert_eq!(
        keys("mset a 1 b"),
        Err("wrong number of arguments for 'mset' command")
    );
    assert_eq!(
        keys("msetnx a 1 b 2 c"),
        Err("wrong number of arguments for 'msetnx' command")
    );
    assert_eq!(keys("mget a b c"), Ok(vec![1, 2, 3]));
    assert_eq!(keys("mget a"), Ok(vec![1]));
    assert_eq!(keys("del a b c d"), Ok(vec![1, 2, 3, 4]));
    assert_eq!(keys("blpop a b 0"), Ok(vec![1, 2]));
    assert_eq!(keys("rename a b"), Ok(vec![1, 2]));
    assert_eq!(keys("bitop and d a b"), Ok(vec![2, 3, 4]));
    assert_eq!(keys("lcs a b LEN"), Ok(vec![1, 2]));
    assert_eq!(keys("ping"), Ok(vec![]));
    assert_eq!(keys("object encoding k"), Ok(vec![2]));
    assert_eq!(keys("OBJECT FREQ k"), Ok(vec![2]));
    assert_eq!(keys("memory usage k SAMPLES 5"), Ok(vec![2]));
    assert_eq!(keys("xinfo stream k FULL"), Ok(vec![2]));
    // Called without arity checks, nothing panics.
    let mut out = Vec::new();
    for c in every_command() {
        for n in 0..4 {
            let args = argv(&vec!["x"; n]);
            let _ = c.key_indices(&args, &mut out);
            assert!(out.iter().all(|&i| i < n));
        }
    }
}

#[test]
fn key_indices_numkeys() {
    let e = keys;
    assert_eq!(e("eval s 2 a b x"), Ok(vec![3, 4]));
    assert_eq!(e("EVALSHA s 1 a"), Ok(vec![3]));
    assert_eq!(e("fcall f 2 a b"), Ok(vec![3, 4]));
    assert_eq!(e("eval s 0"), Ok(vec![]));
    assert_eq!(e("eval s 0 x"), Ok(vec![]));
    assert_eq!(e("eval s -1 a"), Err("Number of keys can't be negative"));
    assert_eq!(
        e("eval s 3 a b"),
        Err("Number of keys can't be greater than number of args")
    );
    assert_eq!(
        e("eval s 99999999999999999999 a"),
        Err("value is not an integer or out of range")
    );
    for bad in ["x", "", "+1", " 1", "01", "-0", "1.0"] {
        assert_eq!(
            keys_of(&["eval", "s", bad, "a"]),
            Err("value is not an integer or out of range"),
            "{bad:?}"
        );
    }
    assert_eq!(
        e("eval s 9223372036854775807 a"),
        Err("Number of keys can't be greater than number of args")
    );
    assert_eq!(
        e("eval s -9223372036854775808 a"),
        Err("Number of keys can't be negative")
    );

    assert_eq!(e("zunionstore d 2 a b"), Ok(vec![1, 3, 4]));
    assert_eq!(e("zunionstore d 2 a b WEIGHTS 1 2"), Ok(vec![1, 3, 4]));
    assert_eq!(e("zinterstore d 1 a"), Ok(vec![1, 3]));
    assert_eq!(
        e("zunionstore d 0 a"),
        Err("at least 1 input key is needed for 'zunionstore' command")
    );
    assert_eq!(e("zunionstore d 3 a b"), Err("syntax error"));
    assert_eq!(
        e("zdiff x a"),
        Err("value is not an integer or out of range")
    );
    assert_eq!(e("zunion 2 a b WITHSCORES"), Ok(vec![2, 3]));

    assert_eq!(e("lmpop 2 a b LEFT"), Ok(vec![2, 3]));
    assert_eq!(e("lmpop 0 a LEFT"), Err("numkeys should be greater than 0"));
    assert_eq!(e("lmpop x a LEFT"), Err("numkeys should be greater than 0"));
    assert_eq!(e("lmpop 3 a LEFT"), Err("syntax error"));
    assert_eq!(e("zmpop 1 a MIN"), Ok(vec![2]));
    assert_eq!(e("sintercard 2 a b"), Ok(vec![2, 3]));
    assert_eq!(
        e("sintercard 3 a b"),
        Err("Number of keys can't be greater than number of args")
    );
}

#[test]
fn key_indices_options() {
    assert_eq!(keys("georadius k 1 2 3 m"), Ok(vec![1]));
    assert_eq!(keys("georadius k 1 2 3 m STORE d"), Ok(vec![1, 7]));
    assert_eq!(
        keys("georadius k 1 2 3 m storedist d store e"),
        Ok(vec![1, 7, 9])
    );
    assert_eq!(keys("georadiusbymember k m 3 km STORE d"), Ok(vec![1, 6]));
    assert_eq!(keys("sort k"), Ok(vec![1]));
    assert_eq!(keys("sort k BY store GET store STORE d"), Ok(vec![1, 7]));
    assert_eq!(keys("sort k LIMIT 0 store"), Ok(vec![1]));
    assert_eq!(keys("sort_ro k BY p"), Ok(vec![1]));

    assert_eq!(keys("xread COUNT 2 STREAMS a b 0 0"), Ok(vec![4, 5]));
    assert_eq!(keys("xreadgroup GROUP streams c STREAMS a >"), Ok(vec![5]));
    assert_eq!(keys("xread COUNT 2 a 0"), Err("syntax error"));
    assert_eq!(keys("xread COUNT 2 STREAMS"), Err("syntax error"));
    assert_eq!(keys("xread STREAMS a b 0"), Err(UNBALANCED_STREAMS));

    assert_eq!(keys("migrate h 1 k 0 10"), Ok(vec![3]));
    assert_eq!(
        keys("migrate h 1 '' 0 10 AUTH keys KEYS a b"),
        Ok(vec![9, 10])
    );
    assert_eq!(
        keys("migrate h 1 k 0 10 KEYS a"),
        Err(MIGRATE_KEYS_NOT_EMPTY)
    );
}

#[test]
fn key_indices_reuses_the_vector() {
    let mut out = Vec::with_capacity(8);
    let ptr = out.as_ptr();
    let args = argv(&["mget", "a", "b", "c", "d", "e", "f", "g", "h"]);
    cmd("mget").key_indices(&args, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8]);
    cmd("get").key_indices(&args[..2], &mut out).unwrap();
    assert_eq!(out, [1]);
    assert_eq!(out.as_ptr(), ptr);
}

/// The live server's `COMMAND GETKEYS` answers, recorded by the generator.
#[test]
fn key_indices_match_redis_getkeys() {
    assert!(table::GETKEYS_VECTORS.len() > 40);
    let mut out = Vec::new();
    for (parts, expected) in table::GETKEYS_VECTORS {
        let args = argv(parts);
        let c = cmd(parts[0]).resolve(&args);
        let got = c.key_indices(&args, &mut out).map(|()| out.clone());
        match expected {
            // Redis answers [] both for `EVAL s 0` and for a bad numkeys.
            Some([]) => assert!(got.as_ref().map_or(true, |k| k.is_empty()), "{parts:?}"),
            Some(want) => assert_eq!(got.as_deref(), Ok(*want), "{parts:?}"),
            None => assert!(got.is_err(), "{parts:?}: {got:?}"),
        }
    }
}

#[test]
fn classes() {
    use CommandClass::*;
    let cases: &[(&str, CommandClass)] = &[
        ("set", Single),
        ("get", Single),
        ("hset", Single),
        ("incr", Single),
        ("xadd", Single),
        ("sort_ro", Single),
        ("georadius_ro", Single),
        ("mget", Split(SplitKind::Mget)),
        ("mset", Split(SplitKind::Mset)),
        ("del", Split(SplitKind::SumInt)),
        ("unlink", Split(SplitKind::SumInt)),
        ("exists", Split(SplitKind::SumInt)),
        ("touch", Split(SplitKind::SumInt)),
        ("rename", SameShard),
        ("renamenx", SameShard),
        ("smove", SameShard),
        ("sinterstore", SameShard),
        ("sunionstore", SameShard),
        ("sdiffstore", SameShard),
        ("sinter", SameShard),
        ("zunionstore", SameShard),
        ("lmove", SameShard),
        ("rpoplpush", SameShard),
        ("copy", SameShard),
        ("msetnx", SameShard),
        ("pfmerge", SameShard),
        ("pfcount", SameShard),
        ("eval", SameShard),
        ("evalsha", SameShard),
        ("fcall", SameShard),
        ("bitop", SameShard),
        ("georadius", SameShard),
        ("sort", SameShard),
        ("lmpop", SameShard),
        ("zmpop", SameShard),
        ("sintercard", SameShard),
        ("ping", Proxy(ProxyCommand::Ping)),
        ("echo", Proxy(ProxyCommand::Echo)),
        ("quit", Proxy(ProxyCommand::Quit)),
        ("select", Proxy(ProxyCommand::Select)),
        ("hello", Proxy(ProxyCommand::Hello)),
        ("command", Proxy(ProxyCommand::Command)),
        ("client", Proxy(ProxyCommand::Client)),
        ("info", Proxy(ProxyCommand::Info)),
        ("auth", Proxy(ProxyCommand::Auth)),
        ("time", Proxy(ProxyCommand::Time)),
        ("blpop", Blocking),
        ("brpop", Blocking),
        ("blmove", Blocking),
        ("bzpopmin", Blocking),
        ("blmpop", Blocking),
        ("xread", Blocking),
        ("xreadgroup", Blocking),
        ("wait", Blocking),
        ("waitaof", Blocking),
        ("keys", Keyspace(KeyspaceKind::Keys)),
        ("scan", Keyspace(KeyspaceKind::Scan)),
        ("randomkey", Keyspace(KeyspaceKind::RandomKey)),
        ("dbsize", Keyspace(KeyspaceKind::Dbsize)),
        ("flushall", Keyspace(KeyspaceKind::Flush)),
        ("flushdb", Keyspace(KeyspaceKind::Flush)),
        ("subscribe", PubSub(PubSubKind::Subscribe)),
        ("psubscribe", PubSub(PubSubKind::Psubscribe)),
        ("publish", PubSub(PubSubKind::Publish)),
        ("spublish", PubSub(PubSubKind::Spublish)),
        ("multi", Transaction),
        ("exec", Transaction),
        ("discard", Transaction),
        ("watch", Transaction),
        ("unwatch", Transaction),
        ("config", Unsupported),
        ("shutdown", Unsupported),
        ("debug", Unsupported),
        ("monitor", Unsupported),
        ("save", Unsupported),
        ("bgsave", Unsupported),
        ("replicaof", Unsupported),
        ("slaveof", Unsupported),
        ("cluster", Unsupported),
        ("script", Unsupported),
        ("function", Unsupported),
        ("acl", Unsupported),
        ("swapdb", Unsupported),
        ("move", Unsupported),
        ("migrate", Unsupported),
    ];
    for &(name, class) in cases {
        assert_eq!(cmd(name).class, class, "{name}");
    }
    let sub = |p: &[&str]| cmd(p[0]).resolve(&argv(p)).class;
    assert_eq!(sub(&["object", "encoding", "k"]), Single);
    assert_eq!(
        sub(&["script", "load", "return 1"]),
        Fanout(FanoutKind::ScriptLoad)
    );
    assert_eq!(
        sub(&["script", "exists", "a"]),
        Fanout(FanoutKind::ScriptExists)
    );
    assert_eq!(sub(&["function", "list"]), Fanout(FanoutKind::FunctionRead));
    assert_eq!(
        sub(&["function", "flush"]),
        Fanout(FanoutKind::FunctionWrite)
    );
    assert_eq!(sub(&["script", "kill"]), Fanout(FanoutKind::Kill));
    assert_eq!(cmd("reset").class, Proxy(ProxyCommand::Reset));
    assert_eq!(cmd("readonly").class, Proxy(ProxyCommand::ReadMode));
    assert_eq!(sub(&["memory", "usage", "k"]), Single);
    assert_eq!(sub(&["xinfo", "groups", "k"]), Single);
    assert_eq!(sub(&["xgroup", "create", "k", "g", "$"]), Single);
    assert_eq!(sub(&["object", "help"]), Unsupported);
    assert_eq!(sub(&["config", "get", "x"]), Unsupported);
    assert_eq!(
        sub(&["script", "load", "x"]),
        Fanout(FanoutKind::ScriptLoad)
    );
    assert_eq!(
        sub(&["client", "setname", "x"]),
        Proxy(ProxyCommand::Client)
    );
    assert_eq!(sub(&["command", "count"]), Proxy(ProxyCommand::Command));
    // Every keyed class has keys; every single-key command names at most one.
    for c in every_command() {
        match c.class {
            Single | Split(_) | SameShard => assert_ne!(c.keys, KeySpec::None, "{}", c.name),
            _ => {}
        }
        if c.class == Single {
            assert!(
                matches!(c.keys, KeySpec::Range { first, last, .. } if last >= 0 && i16::from(last) == i16::from(first)),
                "{}",
                c.name
            );
        }
    }
}

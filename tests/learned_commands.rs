//! Commands respway learns from the shards (`discovery::commands`): a real module's commands
//! (Debian's `redis-redisearch`, RediSearch 1.2, whose `FT.*` commands carry key specs) reach
//! the shard that owns their key, answer as against one Redis, and a shard without the module
//! gives its own error; a module built here (`tests/modules/keyspecs.c`) has the key-spec
//! shapes RediSearch lacks (a key count, a keyword, incomplete specs), and its commands are
//! placed, split or refused, checked by ACL users and invalidate the near cache as built-in
//! ones do.

use std::net::SocketAddr;

use crate::support::*;

const REDISEARCH: &str = "/usr/lib/redis/modules/redisearch.so";

/// `tests/modules/keyspecs.c`, compiled once per test process with the system's C compiler.
fn keyspecs_module() -> &'static str {
    static BUILT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/modules/keyspecs.c");
        let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("keyspecs-{}.so", std::process::id()));
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .expect("cc (a C compiler) builds the test module");
        assert!(status.success(), "cc failed on {src}");
        out.to_string_lossy().into_owned()
    })
}

fn with_keyspecs() -> Proc {
    redis_with(&["--loadmodule", keyspecs_module()])
}

fn with_search() -> Proc {
    assert!(
        std::path::Path::new(REDISEARCH).exists(),
        "{REDISEARCH} is missing: install Debian's redis-redisearch (tests/run.sh --deps-only)"
    );
    redis_with(&["--loadmodule", REDISEARCH])
}

/// The reply, or the error's text.
fn value(c: &mut redis::Connection, args: &[&str]) -> Result<redis::Value, String> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query::<redis::Value>(c).map_err(|e| e.to_string())
}

/// The shards on which `FT.INFO name` finds the index.
fn holders(shards: &[SocketAddr], name: &str) -> Vec<usize> {
    (0..shards.len())
        .filter(|&i| {
            let mut c = sync_client(shards[i]);
            redis::cmd("FT.INFO")
                .arg(name)
                .query::<redis::Value>(&mut c)
                .is_ok()
        })
        .collect()
}

/// The same FT.CREATE, FT.ADD, FT.SEARCH through respway over 3 shards and on one Redis:
/// identical replies, each index (and its documents) on exactly one shard, the indexes
/// spread over the shards.
#[test]
fn redisearch_commands_reach_the_shard_that_owns_the_index() {
    let shards: Vec<Proc> = (0..3).map(|_| with_search()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let direct = with_search();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", false), 1);
    let mut through = sync_client(rw.addr);
    let mut one = sync_client(direct.addr);
    let mut used = std::collections::BTreeSet::new();
    for i in 0..12 {
        let idx = format!("idx{i}");
        let script: Vec<Vec<String>> = vec![
            vec!["FT.CREATE", &idx, "SCHEMA", "title", "TEXT", "n", "NUMERIC"],
            vec![
                "FT.ADD",
                &idx,
                &format!("{idx}:d1"),
                "1.0",
                "FIELDS",
                "title",
                "hello world",
                "n",
                "5",
            ],
            vec![
                "FT.ADD",
                &idx,
                &format!("{idx}:d2"),
                "1.0",
                "FIELDS",
                "title",
                "hello there",
                "n",
                "7",
            ],
            vec![
                "FT.SEARCH",
                &idx,
                "hello",
                "NOCONTENT",
                "SORTBY",
                "n",
                "ASC",
            ],
            vec!["FT.SEARCH", &idx, "@n:[6 10]"],
            vec![
                "FT.ADD",
                &idx,
                &format!("{idx}:d1"),
                "1.0",
                "FIELDS",
                "title",
                "again",
            ],
            vec!["ft.search", &idx, "world"],
        ]
        .into_iter()
        .map(|c| c.into_iter().map(str::to_string).collect())
        .collect();
        for cmd in &script {
            let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let a = value(&mut through, &args);
            let b = value(&mut one, &args);
            assert_eq!(a, b, "{cmd:?}");
        }
        let on = holders(&addrs, &idx);
        assert_eq!(on.len(), 1, "{idx} on shards {on:?}");
        // Its documents (hashes FT.ADD wrote) are on the index's shard.
        let mut c = sync_client(addrs[on[0]]);
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("{idx}:d2"))
            .query(&mut c)
            .unwrap();
        assert_eq!(exists, 1, "{idx}:d2 beside its index");
        used.insert(on[0]);
    }
    assert!(used.len() > 1, "every index on one shard: {used:?}");
}

/// Sends `args(i)` for 24 names through respway: each is either served (`check(i, true)`
/// says where it went) or answered with exactly the words a Redis without the module says
/// (`check(i, false)`); both happen.
fn served_or_the_shards_own_error(
    through: &mut redis::Connection,
    args: impl Fn(usize) -> Vec<String>,
    check: impl Fn(usize, bool),
) {
    let bare = redis();
    let mut bare_c = sync_client(bare.addr);
    let (mut served, mut refused) = (0, 0);
    for i in 0..24 {
        let a = args(i);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        match value(through, &a) {
            Ok(redis::Value::Okay) => {
                check(i, true);
                served += 1;
            }
            other => {
                assert_eq!(other, value(&mut bare_c, &a), "{a:?}");
                check(i, false);
                refused += 1;
            }
        }
    }
    assert!(
        served > 0 && refused > 0,
        "served {served}, refused {refused}"
    );
}

/// A rolling upgrade: one shard has no module. Its keys get its own `ERR unknown command`,
/// the other shards' keys are served.
#[test]
fn a_shard_without_the_module_answers_its_own_error() {
    let shards = [with_search(), with_search(), redis()];
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", false), 1);
    served_or_the_shards_own_error(
        &mut sync_client(rw.addr),
        |i| {
            ["FT.CREATE", &format!("ix{i}"), "SCHEMA", "t", "TEXT"]
                .map(String::from)
                .to_vec()
        },
        |i, served| {
            if served {
                assert_eq!(holders(&addrs[..2], &format!("ix{i}")).len(), 1, "ix{i}");
            }
        },
    );
}

/// Keys of a command with incomplete specs are asked of a shard that knows the command: one
/// without the module (a rolling upgrade) is passed over for the next. A key of the shard
/// without it gets that shard's own error there, as any command of the module does.
#[test]
fn keys_are_asked_of_a_shard_that_knows_the_command() {
    let shards = [redis(), with_keyspecs(), with_keyspecs()];
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", false), 1);
    served_or_the_shards_own_error(
        &mut sync_client(rw.addr),
        |i| {
            ["KS.ODD", &format!("odd{i}"), "v"]
                .map(String::from)
                .to_vec()
        },
        |i, served| {
            let on = holding(&addrs, &format!("odd{i}"));
            if served {
                assert!(on.len() == 1 && on[0] != 0, "odd{i} on {on:?}");
            } else {
                assert!(on.is_empty(), "odd{i} on {on:?}");
            }
        },
    );
    // `/commands` says its keys are asked for.
    let admin = respway::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        false,
        rw.server.as_ref().expect("server"),
    )
    .expect("admin");
    let (_, page) = http_get(admin.local_addr(), "/commands");
    assert!(
        page.lines()
            .any(|l| l.contains("  ks.odd arity=-3 ")
                && l.ends_with("class=same_shard keys=[asked]")),
        "{page}"
    );
}

/// `/commands` on the admin port lists what each endpoint taught, with its version.
#[test]
fn the_admin_page_shows_each_endpoints_commands_and_version() {
    let shards = [with_search(), redis()];
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", false), 1);
    let admin = respway::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        false,
        rw.server.as_ref().expect("server"),
    )
    .expect("admin");
    let (status, page) = http_get(admin.local_addr(), "/commands");
    assert_eq!(status, 200, "{page}");
    let version = redis::cmd("INFO")
        .arg("server")
        .query::<String>(&mut sync_client(addrs[0]))
        .unwrap();
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap()
        .trim()
        .to_string();
    let with = format!(
        "cluster main endpoint {} version=redis {version} learned=",
        addrs[0]
    );
    let without = format!(
        "cluster main endpoint {} version=redis {version} learned=0\n",
        addrs[1]
    );
    assert!(page.contains(&with), "{page}");
    assert!(page.contains(&without), "{page}");
    assert!(
        page.contains("  ft.add arity=-1 flags=write,denyoom,module acl=@write,@slow class=single keys=[index 1 range(lastkey=0,step=1,limit=0) RW]"),
        "{page}"
    );
}

/// The shards holding `key`.
fn holding(shards: &[SocketAddr], key: &str) -> Vec<usize> {
    (0..shards.len())
        .filter(|&i| {
            let n: i64 = redis::cmd("EXISTS")
                .arg(key)
                .query(&mut sync_client(shards[i]))
                .unwrap();
            n == 1
        })
        .collect()
}

fn calls(addr: SocketAddr, cmd: &str) -> u64 {
    commandstat(addr, cmd)
}

/// Every key-spec shape through respway over 3 shards: a single-key write and read, a
/// multi-key write with a key count and a read of the keys after a keyword (forwarded when
/// their keys share a shard, refused with RENAME's own error when not, nothing run anywhere),
/// and a command with incomplete specs (its keys asked of a shard, then placed as the others).
/// The same commands on one Redis with the module answer the same.
#[test]
fn a_modules_key_specs_place_its_commands() {
    let shards: Vec<Proc> = (0..3).map(|_| with_keyspecs()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let direct = with_keyspecs();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", true), 1);
    let mut through = sync_client(rw.addr);
    let mut one = sync_client(direct.addr);
    let mut used = std::collections::BTreeSet::new();
    for i in 0..20 {
        let (k, tagged) = (
            format!("k{i}"),
            [
                format!("{{t{i}}}a"),
                format!("{{t{i}}}b"),
                format!("{{t{i}}}nope"),
            ],
        );
        let script: Vec<Vec<&str>> = vec![
            vec!["KS.SET", &k, "v1"],
            vec!["ks.get", &k],
            vec!["KS.MSET", "2", &tagged[0], &tagged[1], "w"],
            vec![
                "KS.COUNT", "tag", "KEYS", &tagged[0], &tagged[1], &tagged[2],
            ],
            vec!["KS.COUNT", "tag", "keys", &tagged[1]],
            vec!["KS.GET", &tagged[0]],
        ];
        for cmd in &script {
            assert_eq!(value(&mut through, cmd), value(&mut one, cmd), "{cmd:?}");
        }
        // Each key on exactly one shard, the one respway's own GET reads it from.
        let on = holding(&addrs, &k);
        assert_eq!(on.len(), 1, "{k} on {on:?}");
        used.insert(on[0]);
        assert_eq!(
            value(&mut through, &["GET", &k]),
            Ok(redis::Value::BulkString(b"v1".to_vec()))
        );
        let a = holding(&addrs, &tagged[0]);
        assert_eq!(
            (a.len(), holding(&addrs, &tagged[1])),
            (1, a.clone()),
            "{tagged:?}"
        );
    }
    assert!(used.len() > 1, "every key on one shard");
    // Keys on two shards: refused as RENAME is, and nothing set anywhere.
    let (x, y) = (0..50)
        .map(|i| format!("x{i}"))
        .collect::<Vec<_>>()
        .windows(2)
        .find_map(|w| {
            let mut c = sync_client(rw.addr);
            let _: () = redis::cmd("SET").arg(&w[0]).arg(1).query(&mut c).unwrap();
            let _: () = redis::cmd("SET").arg(&w[1]).arg(1).query(&mut c).unwrap();
            let apart = holding(&addrs, &w[0]) != holding(&addrs, &w[1]);
            let _: () = redis::cmd("DEL").arg(&w[0]).query(&mut c).unwrap();
            let _: () = redis::cmd("DEL").arg(&w[1]).query(&mut c).unwrap();
            apart.then(|| (w[0].clone(), w[1].clone()))
        })
        .expect("two keys on two shards");
    let rename = value(&mut through, &["RENAME", &x, &y]).unwrap_err();
    assert!(rename.contains("hash to the same slot"), "{rename}");
    assert_eq!(
        value(&mut through, &["KS.MSET", "2", &x, &y, "z"]).unwrap_err(),
        rename
    );
    assert_eq!(
        value(&mut through, &["KS.COUNT", "t", "KEYS", &x, &y]).unwrap_err(),
        rename
    );
    assert!(holding(&addrs, &x).is_empty() && holding(&addrs, &y).is_empty());
    // A key count as large as an integer goes: too many keys (Redis's words), on a
    // connection that goes on serving.
    let huge = value(&mut through, &["KS.MSET", "9223372036854775807", &x, "z"]).unwrap_err();
    assert!(
        huge.contains("Number of keys can't be greater than number of args"),
        "{huge}"
    );
    assert_eq!(
        value(&mut through, &["PING"]),
        Ok(redis::Value::SimpleString("PONG".into()))
    );
    // Incomplete key specs: a shard names the keys (COMMAND GETKEYS, the module's own
    // answer), and the command goes to the shard that owns them; keys on two shards are
    // refused as RENAME is and run nowhere; a wrong arity is Redis's error.
    let odd = ["KS.ODD", "{odd}a", "1", "{odd}b", "2"];
    assert_eq!(value(&mut through, &odd), value(&mut one, &odd));
    let a = holding(&addrs, "{odd}a");
    assert_eq!((a.len(), holding(&addrs, "{odd}b")), (1, a.clone()));
    assert_eq!(
        value(&mut through, &["GET", "{odd}b"]),
        Ok(redis::Value::BulkString(b"2".to_vec()))
    );
    assert_eq!(
        value(&mut through, &["KS.ODD", &x, "1", &y, "2"]).unwrap_err(),
        rename
    );
    assert!(holding(&addrs, &x).is_empty() && holding(&addrs, &y).is_empty());
    assert_eq!(
        value(&mut through, &["KS.ODD", "k"]),
        value(&mut one, &["KS.ODD", "k"])
    );
    assert_eq!(addrs.iter().map(|a| calls(*a, "ks.odd")).sum::<u64>(), 1);
    // Pipelined with other commands: none passes it, every reply in order.
    let mut raw = RespConn::connect(rw.addr);
    raw.send_pipeline(&[
        vec!["KS.ODD", "{odd}p", "1"],
        vec!["GET", "{odd}p"],
        vec!["KS.ODD", "{odd}p", "2"],
        vec!["KS.ODD", &x, "1", &y, "2"],
        vec!["GET", "{odd}p"],
    ]);
    let replies: Vec<Resp> = (0..5).map(|_| raw.read().expect("a reply")).collect();
    assert_eq!(replies[0], Resp::Simple("OK".into()));
    assert_eq!(replies[1], Resp::Bulk(Some(b"1".to_vec())));
    assert_eq!(replies[2], Resp::Simple("OK".into()));
    assert!(replies[3].is_error(), "{:?}", replies[3]);
    assert_eq!(replies[4], Resp::Bulk(Some(b"2".to_vec())));
    // Queued in MULTI, it is refused: respway asks a shard for keys only outside one.
    let mut tx = sync_client(rw.addr);
    let _: () = redis::cmd("MULTI").query(&mut tx).unwrap();
    let queued = value(&mut tx, &["KS.ODD", "{odd}a", "3"]).unwrap_err();
    assert!(queued.contains("COMMAND GETKEYS"), "{queued}");
    // Counted under their own names, as built-in commands are.
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut through)
        .unwrap();
    assert!(stats.contains("cmdstat_ks.set:calls=20,"), "{stats}");
    assert!(stats.contains("cmdstat_ks.count:calls=41,"), "{stats}");
}

/// A `read_only` user runs the module's reads, not its writes (Redis names no ACL category
/// for a module's commands; respway gives them those their flags imply), and a user limited
/// to some keys is held to them.
#[test]
fn acl_users_are_held_to_learned_commands() {
    let shard = with_keyspecs();
    let y = format!(
        "listeners:
  - name: main
    address: 127.0.0.1:0
    op_timeout: 2s
    users:
      - {{ name: reader, password: readpw, read_only: true }}
      - {{ name: app, password: apppw, rules: [\"~app:*\", \"+@all\"] }}
    routes: {{ catch_all: main }}
clusters:
  - name: main
    connect_timeout: 500ms
    shards: [{{ endpoints: [{{ address: \"{}\" }}] }}]
",
        shard.addr
    );
    let rw = respway(&y, 1);
    let client = |user: &str, pw: &str| {
        let c = redis::Client::open(format!("redis://{user}:{pw}@{}/", rw.addr)).unwrap();
        c.get_connection().unwrap()
    };
    let mut app = client("app", "apppw");
    assert_eq!(
        value(&mut app, &["KS.SET", "app:1", "v"]),
        Ok(redis::Value::Okay)
    );
    let denied = value(&mut app, &["KS.SET", "other", "v"]).unwrap_err();
    assert!(denied.contains("NOPERM"), "{denied}");
    // Keys a shard names (incomplete specs) are held to the patterns too.
    assert_eq!(
        value(&mut app, &["KS.ODD", "app:2", "v"]),
        Ok(redis::Value::Okay)
    );
    let denied = value(&mut app, &["KS.ODD", "app:2", "v", "other", "v"]).unwrap_err();
    assert!(denied.contains("NOPERM"), "{denied}");
    let mut reader = client("reader", "readpw");
    assert_eq!(
        value(&mut reader, &["KS.GET", "app:1"]),
        Ok(redis::Value::BulkString(b"v".to_vec()))
    );
    let denied = value(&mut reader, &["KS.SET", "app:1", "w"]).unwrap_err();
    assert!(
        denied.contains("User reader has no permissions to run the 'ks.set' command"),
        "{denied}"
    );
    let denied = value(&mut reader, &["KS.MSET", "1", "app:1", "w"]).unwrap_err();
    assert!(denied.contains("NOPERM"), "{denied}");
    assert_eq!(
        value(&mut sync_client(shard.addr), &["GET", "app:1"]),
        Ok(redis::Value::BulkString(b"v".to_vec()))
    );
}

/// A learned write ends the near cache's entries of its keys (`ttl` mode: no tracker, so only
/// respway's own invalidation can).
#[test]
fn a_learned_write_invalidates_the_near_cache() {
    let shard = with_keyspecs();
    let y = sharded_yaml(&[shard.addr], "{ policy: maglev }", false).replace(
        "    connect_timeout: 500ms\n",
        "    connect_timeout: 500ms\n    near_cache: { mode: ttl, max_age: 60s }\n",
    );
    let rw = respway(&y, 1);
    let mut c = sync_client(rw.addr);
    for round in 0..3 {
        let v = format!("v{round}");
        let _: () = redis::cmd("SET").arg("k").arg("old").query(&mut c).unwrap();
        for _ in 0..3 {
            let got: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
            assert_eq!(got, "old");
        }
        let before = calls(shard.addr, "get");
        let _: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
        assert_eq!(
            calls(shard.addr, "get"),
            before,
            "GET k is served from the cache"
        );
        assert_eq!(value(&mut c, &["KS.SET", "k", &v]), Ok(redis::Value::Okay));
        assert_eq!(
            value(&mut c, &["GET", "k"]),
            Ok(redis::Value::BulkString(v.into_bytes()))
        );
        assert_eq!(
            value(&mut c, &["KS.MSET", "1", "k", "m"]),
            Ok(redis::Value::Okay)
        );
        assert_eq!(
            value(&mut c, &["GET", "k"]),
            Ok(redis::Value::BulkString(b"m".to_vec()))
        );
        // A write whose keys a shard names (incomplete specs) ends them too.
        for _ in 0..3 {
            let got: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
            assert_eq!(got, "m");
        }
        let before = calls(shard.addr, "get");
        let _: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
        assert_eq!(calls(shard.addr, "get"), before, "GET k is cached again");
        assert_eq!(value(&mut c, &["KS.ODD", "k", "o"]), Ok(redis::Value::Okay));
        assert_eq!(
            value(&mut c, &["GET", "k"]),
            Ok(redis::Value::BulkString(b"o".to_vec()))
        );
    }
}

/// A rolling upgrade of one shard: restarted with the module, it is asked again when the
/// learner's connection to it is opened again, and its keys are then served; before, they
/// got the shard's own `unknown command`.
#[test]
fn a_shard_restarted_with_the_module_is_learned_again() {
    let mut shard = redis();
    let port = shard.addr.port();
    let rw = respway(&sharded_yaml(&[shard.addr], "{ policy: maglev }", false), 1);
    let mut c = sync_client(rw.addr);
    let before = value(&mut c, &["KS.SET", "k", "v"]).unwrap_err();
    assert!(before.contains("unknown command 'KS.SET'"), "{before}");
    shard.kill();
    let _upgraded = redis_on_with(port, &["--loadmodule", keyspecs_module()]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match value(&mut c, &["KS.SET", "k", "v"]) {
            Ok(redis::Value::Okay) => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "not learned after the restart: {other:?}"
            ),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        value(&mut sync_client(shard.addr), &["GET", "k"]),
        Ok(redis::Value::BulkString(b"v".to_vec()))
    );
}

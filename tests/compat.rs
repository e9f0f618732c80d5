//! Commands Redis runs that respway refused or answered differently: blocking commands inside
//! MULTI (Redis runs them without blocking), SCRIPT KILL and FUNCTION KILL (a runaway script
//! must be stoppable through respway), and the argument errors of PING and FCALL. Each reply
//! is compared with a plain redis-server's.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

fn three_shards() -> (Vec<Proc>, Vec<SocketAddr>, Respway) {
    // A script is BUSY to others after 100 ms (Redis's default is 5 s).
    let shards: Vec<Proc> = (0..3)
        .map(|_| redis_with(&["--busy-reply-threshold", "100"]))
        .collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: crc16_slots }", true), 1);
    (shards, addrs, rw)
}

fn run(addr: SocketAddr, cmds: &[Vec<&str>]) -> Vec<Resp> {
    let mut c = RespConn::connect(addr);
    c.send_pipeline(cmds);
    cmds.iter().map(|_| c.read().expect("reply")).collect()
}

fn same_as_redis(rw: SocketAddr, plain: SocketAddr, cmds: &[Vec<&str>]) {
    let want = run(plain, cmds);
    let got = run(rw, cmds);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "reply {i} to {:?}", cmds[i]);
    }
}

/// Inside MULTI, Redis runs BLPOP and the other blocking commands as if their timeout had
/// passed: they never block. respway refused them and the client then stalled in MULTI.
#[test]
fn blocking_commands_run_inside_multi_without_blocking() {
    let (_shards, _addrs, rw) = three_shards();
    let plain = redis();
    let cmds: Vec<Vec<&str>> = vec![
        vec!["RPUSH", "{l}a", "1", "2"],
        vec!["ZADD", "{l}z", "1", "m"],
        vec!["XADD", "{l}s", "1-1", "f", "v"],
        vec!["MULTI"],
        vec!["BLPOP", "{l}a", "0"],
        vec!["BRPOP", "{l}a", "{l}empty", "0"],
        vec!["BLPOP", "{l}empty", "0"],
        vec!["BLMOVE", "{l}a", "{l}b", "LEFT", "RIGHT", "0"],
        vec!["BRPOPLPUSH", "{l}b", "{l}c", "0"],
        vec!["BLMPOP", "0", "2", "{l}c", "{l}a", "LEFT"],
        vec!["BZPOPMIN", "{l}z", "0"],
        vec!["BZPOPMAX", "{l}z", "0"],
        vec!["BZMPOP", "0", "1", "{l}z", "MIN"],
        vec!["XREAD", "BLOCK", "0", "STREAMS", "{l}s", "0"],
        vec!["EXEC"],
        vec!["LRANGE", "{l}c", "0", "-1"],
        // The client is out of MULTI: a plain command answers.
        vec!["PING"],
    ];
    same_as_redis(rw.addr, plain.addr, &cmds);
}

#[test]
fn ping_and_fcall_argument_errors_are_redis_own() {
    let (_shards, _addrs, rw) = three_shards();
    let plain = redis();
    let lib = "#!lua name=t\nredis.register_function('f', function(k, a) return 1 end)";
    let cmds: Vec<Vec<&str>> = vec![
        vec!["PING", "a", "b"],
        // Redis looks the function up before it reads numkeys.
        vec!["FCALL", "nosuch", "notanumber"],
        vec!["FUNCTION", "LOAD", lib],
        vec!["PING", "a"],
        vec!["FCALL", "f", "notanumber"],
        vec!["FCALL_RO", "f", "notanumber"],
        vec!["EVAL", "return 1", "notanumber"],
        vec!["FCALL", "f", "-1"],
        vec!["FCALL", "f", "2", "k"],
        vec!["PING"],
    ];
    same_as_redis(rw.addr, plain.addr, &cmds);
}

/// A runaway script makes its shard answer BUSY; SCRIPT KILL through respway stops it (on
/// every shard, over connections of their own), and the shard serves again. FUNCTION KILL
/// likewise. With nothing running, the reply is Redis's NOTBUSY.
#[test]
fn script_kill_and_function_kill_stop_a_runaway_script() {
    let (_shards, addrs, rw) = three_shards();
    let plain = redis();
    same_as_redis(
        rw.addr,
        plain.addr,
        &[vec!["SCRIPT", "KILL"], vec!["FUNCTION", "KILL"]],
    );
    let spin = "local i = 0 while true do i = i + 1 end";
    for kill in [&["SCRIPT", "KILL"][..], &["FUNCTION", "KILL"]] {
        let runaway = if kill[0] == "SCRIPT" {
            spawn_call(rw.addr, &["EVAL", spin, "1", "{r}k"])
        } else {
            let mut c = RespConn::connect(rw.addr);
            let lib = format!(
                "#!lua name=spin\nredis.register_function{{function_name='spin', callback=function(k) {spin} end, flags={{'no-writes'}}}}"
            );
            c.call(&["FUNCTION", "LOAD", "REPLACE", &lib]);
            spawn_call(rw.addr, &["FCALL", "spin", "1", "{r}k"])
        };
        // The script runs once its shard answers BUSY to others.
        let deadline = Instant::now() + Duration::from_secs(10);
        let busy = loop {
            let found = addrs.iter().position(|&a| {
                RespConn::connect(a)
                    .call(&["GET", "x"])
                    .error()
                    .is_some_and(|e| e.starts_with("BUSY"))
            });
            if let Some(i) = found {
                break i;
            }
            assert!(Instant::now() < deadline, "the script never ran");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut c = RespConn::connect(rw.addr);
        assert_eq!(c.call(kill), Resp::Simple("OK".into()), "{kill:?}");
        let r = runaway.join().expect("runaway caller");
        assert!(
            r.error().is_some(),
            "the script's caller gets an error: {r:?}"
        );
        assert_eq!(
            RespConn::connect(addrs[busy]).call(&["PING"]),
            Resp::Simple("PONG".into())
        );
        assert_eq!(c.call(&["SET", "{r}k", "v"]), Resp::Simple("OK".into()));
    }
}

/// One CROSSSLOT text everywhere, Redis Cluster's: a same-shard command, a transaction and a
/// blocking command whose keys live on two shards.
#[test]
fn crossslot_is_redis_clusters_text_everywhere() {
    let (_shards, _addrs, rw) = three_shards();
    let want = Resp::Error("CROSSSLOT Keys in request don't hash to the same slot".into());
    // Keys that land on different shards (crc16 slots over three shards).
    let (a, b) = ("{a}k", "{b}k");
    let mut c = RespConn::connect(rw.addr);
    c.call(&["SET", a, "1"]);
    assert_eq!(c.call(&["RENAME", a, b]), want, "same-shard command");
    assert_eq!(
        c.call(&["SINTERSTORE", a, a, b]),
        want,
        "same-shard command"
    );
    assert_eq!(c.call(&["BLPOP", a, b, "1"]), want, "blocking command");
    assert_eq!(c.call(&["MULTI"]), Resp::Simple("OK".into()));
    c.call(&["GET", a]);
    assert_eq!(c.call(&["GET", b]), want, "transaction");
    c.call(&["DISCARD"]);
}

/// redis-py 8.1 and node-redis 6.3 send `CLIENT MAINT_NOTIFICATIONS ON moving-endpoint-type
/// ...` on connect. respway refused it with its own "not supported" text, so a healthy fleet
/// showed errors on `client`. A CLIENT subcommand that the advertised Redis version does not
/// know gets that Redis's own answer (the clients then go on without notifications, which
/// respway never pushes); subcommands Redis knows are unchanged.
#[test]
fn client_subcommands_redis_does_not_know_get_redis_own_answer() {
    let (_shards, _addrs, rw) = three_shards();
    let plain = redis();
    let long = "x".repeat(200);
    let cmds: Vec<Vec<&str>> = vec![
        vec![
            "CLIENT",
            "MAINT_NOTIFICATIONS",
            "ON",
            "moving-endpoint-type",
            "internal-ip",
        ],
        vec!["CLIENT", "maint_notifications", "off"],
        vec!["CLIENT", "NOSUCHSUB"],
        vec!["CLIENT", &long],
        vec!["CLIENT", "SETNAME", "n"],
        vec!["CLIENT", "GETNAME"],
        vec!["PING"],
    ];
    same_as_redis(rw.addr, plain.addr, &cmds);
}

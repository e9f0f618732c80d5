//! Pub/sub through respway, against real redis-server shards: channels on the shard their
//! name hashes to, patterns on every shard, messages across sidecars exactly once and in
//! order, RESP2 subscriber mode and RESP3 push, one upstream subscription per worker and
//! shard, and a slow subscriber disconnected without holding up the others.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;

fn three_shards() -> (Vec<Proc>, Vec<SocketAddr>) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs = shards.iter().map(|p| p.addr).collect();
    (shards, addrs)
}

fn bulk_text(r: &Resp) -> String {
    match r {
        Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("bulk: {other:?}"),
    }
}

/// The parts of a message / confirmation (RESP2 array or RESP3 push).
fn parts(r: &Resp) -> Vec<Resp> {
    match r {
        Resp::Array(Some(v)) => v.clone(),
        Resp::Other(b'>', v) => v.clone(),
        other => panic!("pub/sub frame: {other:?}"),
    }
}

/// Sends `cmd names...` and checks each confirmation (counts from `base + 1`).
fn subscribe(c: &mut RespConn, cmd: &str, names: &[String], base: i64) {
    let mut args = vec![cmd.to_string()];
    args.extend(names.iter().cloned());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    c.send(&a);
    for (i, n) in names.iter().enumerate() {
        let p = parts(&c.read().expect("confirmation"));
        assert_eq!(bulk_text(&p[0]), cmd.to_ascii_lowercase());
        assert_eq!(&bulk_text(&p[1]), n);
        assert_eq!(p[2], Resp::Int(base + i as i64 + 1));
    }
}

/// 100 channels and 10 patterns over 3 shards, subscribers on one sidecar, publishers on
/// another: every message delivered exactly once per subscription, in order per channel;
/// a pattern's messages come once although it is subscribed on every shard.
#[test]
fn messages_cross_sidecars_exactly_once_in_order() {
    let (_shards, addrs) = three_shards();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true);
    let a = respway(&yaml, 2);
    let b = respway(&yaml, 2);
    let channels: Vec<String> = (0..100).map(|i| format!("ch:{}:{i}", i % 10)).collect();
    let patterns: Vec<String> = (0..10).map(|p| format!("ch:{p}:*")).collect();
    let mut sub = RespConn::connect(a.addr);
    subscribe(&mut sub, "SUBSCRIBE", &channels, 0);
    subscribe(&mut sub, "PSUBSCRIBE", &patterns, 100);
    // The channels live on several shards.
    let mut on = std::collections::HashSet::new();
    for ch in &channels {
        for (i, s) in addrs.iter().enumerate() {
            let Resp::Array(Some(v)) = RespConn::connect(*s).call(&["PUBSUB", "NUMSUB", ch]) else {
                panic!("NUMSUB")
            };
            if v[1] == Resp::Int(1) {
                on.insert(i);
            }
        }
    }
    assert_eq!(on.len(), 3, "channels spread over the shards");
    let per_channel = 20;
    let mut publisher = RespConn::connect(b.addr);
    let mut cmds = Vec::new();
    for n in 0..per_channel {
        for ch in &channels {
            cmds.push(vec!["PUBLISH".to_string(), ch.clone(), format!("{ch}#{n}")]);
        }
    }
    publisher.send_pipeline(&cmds);
    for _ in &cmds {
        // One subscriber per channel on the channel's shard, and one per pattern (on every
        // shard): 2 receivers at the shard.
        assert_eq!(publisher.read().expect("PUBLISH reply"), Resp::Int(2));
    }
    let total = cmds.len() * 2;
    let mut direct: HashMap<String, Vec<String>> = HashMap::new();
    let mut by_pattern: HashMap<(String, String), Vec<String>> = HashMap::new();
    for _ in 0..total {
        let p = parts(&sub.read().expect("message"));
        match bulk_text(&p[0]).as_str() {
            "message" => direct
                .entry(bulk_text(&p[1]))
                .or_default()
                .push(bulk_text(&p[2])),
            "pmessage" => by_pattern
                .entry((bulk_text(&p[1]), bulk_text(&p[2])))
                .or_default()
                .push(bulk_text(&p[3])),
            other => panic!("unexpected {other}"),
        }
    }
    for ch in &channels {
        let want: Vec<String> = (0..per_channel).map(|n| format!("{ch}#{n}")).collect();
        assert_eq!(direct.get(ch), Some(&want), "{ch}");
        let pat = format!("{}*", &ch[..ch.rfind(':').unwrap() + 1]);
        assert_eq!(
            by_pattern.get(&(pat.clone(), ch.clone())),
            Some(&want),
            "{pat} {ch}"
        );
    }
    // Nothing more.
    assert_eq!(
        sub.call(&["PING"]).clone(),
        Resp::Array(Some(vec![Resp::bulk("pong"), Resp::bulk("")]))
    );
}

/// RESP2 subscriber mode: only the subscription commands, PING, QUIT and RESET; PING answers
/// in subscriber form; UNSUBSCRIBE ends the mode; RESET too.
#[test]
fn resp2_subscriber_mode_is_exact() {
    let (_shards, addrs) = three_shards();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", true), 1);
    let mut c = RespConn::connect(rw.addr);
    subscribe(&mut c, "SUBSCRIBE", &["news".to_string()], 0);
    let e = c.call(&["GET", "k"]);
    assert_eq!(
        e.error(),
        Some(
            "ERR Can't execute 'get': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
             RESET are allowed in this context"
        ),
        "{e:?}"
    );
    assert_eq!(
        c.call(&["PING", "hi"]),
        Resp::Array(Some(vec![Resp::bulk("pong"), Resp::bulk("hi")]))
    );
    let p = parts(&c.call(&["UNSUBSCRIBE"]));
    assert_eq!(
        (bulk_text(&p[0]), bulk_text(&p[1]), &p[2]),
        ("unsubscribe".into(), "news".into(), &Resp::Int(0))
    );
    assert_eq!(c.call(&["PING"]), Resp::Simple("PONG".into()));
    assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    subscribe(&mut c, "SSUBSCRIBE", &["sharded".to_string()], 0);
    assert!(c.call(&["GET", "k"]).is_error());
    assert_eq!(c.call(&["RESET"]), Resp::Simple("RESET".into()));
    assert_eq!(c.call(&["GET", "k"]), Resp::bulk("v"));
    // The unsubscribed channels are gone upstream too.
    let numsub = |s: SocketAddr| match RespConn::connect(s).call(&["PUBSUB", "NUMSUB", "news"]) {
        Resp::Array(Some(v)) => v[1].clone(),
        r => panic!("NUMSUB: {r:?}"),
    };
    wait_until(Duration::from_secs(5), "news unsubscribed upstream", || {
        addrs.iter().all(|&s| numsub(s) == Resp::Int(0))
    });
    for s in &addrs {
        let Resp::Array(Some(v)) = RespConn::connect(*s).call(&["PUBSUB", "NUMSUB", "news"]) else {
            panic!("NUMSUB")
        };
        assert_eq!(v[1], Resp::Int(0), "news still subscribed at {s}");
    }
}

/// A RESP3 client gets confirmations and messages as pushes and may run other commands while
/// subscribed; SPUBLISH reaches SSUBSCRIBE; PUBSUB CHANNELS / NUMSUB / NUMPAT merge the shards.
#[test]
fn resp3_gets_pushes_and_keeps_running_commands() {
    let (_shards, addrs) = three_shards();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", true), 1);
    let mut c = RespConn::connect(rw.addr);
    let Resp::Other(b'%', _) = c.call(&["HELLO", "3"]) else {
        panic!("HELLO 3 map")
    };
    c.send(&["SUBSCRIBE", "a", "b"]);
    for n in ["a", "b"] {
        let Resp::Other(b'>', p) = c.read().expect("push") else {
            panic!("push confirmation")
        };
        assert_eq!(bulk_text(&p[1]), n);
    }
    assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    assert_eq!(c.call(&["GET", "k"]), Resp::bulk("v"));
    let mut p = RespConn::connect(rw.addr);
    assert_eq!(p.call(&["PUBLISH", "b", "hello"]), Resp::Int(1));
    let Resp::Other(b'>', m) = c.read().expect("push message") else {
        panic!("push")
    };
    assert_eq!(
        m,
        vec![Resp::bulk("message"), Resp::bulk("b"), Resp::bulk("hello")]
    );
    c.send(&["SSUBSCRIBE", "s1"]);
    let Resp::Other(b'>', _) = c.read().expect("ssubscribe push") else {
        panic!("push")
    };
    assert_eq!(p.call(&["SPUBLISH", "s1", "x"]), Resp::Int(1));
    let Resp::Other(b'>', m) = c.read().expect("smessage") else {
        panic!("push")
    };
    assert_eq!(
        m,
        vec![Resp::bulk("smessage"), Resp::bulk("s1"), Resp::bulk("x")]
    );
    c.send(&["PSUBSCRIBE", "p*"]);
    let _ = c.read().expect("psubscribe push");
    let Resp::Array(Some(mut chans)) = p.call(&["PUBSUB", "CHANNELS"]) else {
        panic!("CHANNELS")
    };
    chans.sort_by_key(bulk_text);
    assert_eq!(chans, vec![Resp::bulk("a"), Resp::bulk("b")]);
    assert_eq!(
        p.call(&["PUBSUB", "NUMSUB", "a", "zz"]),
        Resp::Array(Some(vec![
            Resp::bulk("a"),
            Resp::Int(1),
            Resp::bulk("zz"),
            Resp::Int(0)
        ]))
    );
    assert_eq!(p.call(&["PUBSUB", "NUMPAT"]), Resp::Int(1));
    assert_eq!(
        p.call(&["PUBSUB", "SHARDCHANNELS"]),
        Resp::Array(Some(vec![Resp::bulk("s1")]))
    );
}

/// The soft limit on open files of this process.
fn fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_string))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

/// 10,000 subscribers of one channel (fewer if this process may not open that many files)
/// through one sidecar worker: one upstream subscription at the shard, and a message reaches
/// every one of them.
#[test]
fn many_subscribers_share_one_upstream_subscription() {
    let (_shards, addrs) = three_shards();
    let rw = respway_process(&sharded_yaml(&addrs, "{ policy: maglev }", true), &[]);
    // This process runs every other test file's tests too (tests/it.rs), beside this one: its
    // soft limit is raised to the hard one (as respway does at start), and this test takes at
    // most half of it, so the tests beside it keep files to open.
    respway_xds::raise_open_files_limit();
    let n = 10_000
        .min(fd_limit().saturating_sub(300))
        .min(fd_limit() / 2);
    assert!(n >= 500, "too few files allowed: {}", fd_limit());
    let mut subs: Vec<RespConn> = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = RespConn::connect(rw.addr);
        c.send(&["SUBSCRIBE", "fanout"]);
        subs.push(c);
    }
    for c in &mut subs {
        let p = parts(&c.read().expect("confirmation"));
        assert_eq!(p[2], Resp::Int(1));
    }
    let mut upstream = 0;
    for s in &addrs {
        let Resp::Array(Some(v)) = RespConn::connect(*s).call(&["PUBSUB", "NUMSUB", "fanout"])
        else {
            panic!("NUMSUB")
        };
        let Resp::Int(k) = v[1] else { panic!("count") };
        upstream += k;
    }
    assert_eq!(upstream, 1, "one upstream subscription for {n} subscribers");
    let mut p = RespConn::connect(rw.addr);
    assert_eq!(p.call(&["PUBLISH", "fanout", "hi"]), Resp::Int(1));
    for c in &mut subs {
        let m = parts(&c.read().expect("message"));
        assert_eq!(m[2], Resp::bulk("hi"));
    }
}

/// A subscriber that stops reading is disconnected once its queue passes
/// `pubsub_buffer_limit`, and counted; another subscriber of the same channel gets every
/// message.
#[test]
fn a_slow_subscriber_is_cut_and_the_others_keep_receiving() {
    let (_shards, addrs) = three_shards();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true).replace(
        "    op_timeout: 2s\n",
        "    op_timeout: 2s\n    pubsub_buffer_limit: 1048576\n",
    );
    let rw = respway(&yaml, 1);
    let mut slow = RespConn::connect(rw.addr);
    subscribe(&mut slow, "SUBSCRIBE", &["firehose".to_string()], 0);
    let mut fast = RespConn::connect(rw.addr);
    subscribe(&mut fast, "SUBSCRIBE", &["firehose".to_string()], 0);
    // 20 MB of messages: far more than the slow one's socket buffers and queue hold. The
    // fast one reads each batch before the next is published.
    let pad = "x".repeat(1024);
    let total = 20_000;
    let batch = 100;
    let mut p = RespConn::connect(rw.addr);
    for b in 0..total / batch {
        let cmds: Vec<Vec<String>> = (0..batch)
            .map(|i| {
                let n = b * batch + i;
                vec!["PUBLISH".into(), "firehose".into(), format!("{n}:{pad}")]
            })
            .collect();
        p.send_pipeline(&cmds);
        for _ in 0..batch {
            assert!(matches!(p.read().expect("publish"), Resp::Int(_)));
        }
        for i in 0..batch {
            let m = parts(&fast.read().expect("message"));
            let text = bulk_text(&m[2]);
            assert_eq!(
                text.split(':').next(),
                Some(format!("{}", b * batch + i).as_str())
            );
        }
    }
    // The slow one was disconnected (what it had not read yet is cut short), and counted.
    let (got, end) = slow.read_until_closed(Duration::from_secs(20));
    assert!(end.is_ok(), "slow subscriber not disconnected: {end:?}");
    assert!(got.len() < total * 1024, "{} bytes", got.len());
    let info = p.call(&["INFO", "proxy"]).text();
    assert!(
        info.contains("client_output_buffer_limit_disconnections:1\r\n"),
        "{info}"
    );
}

/// Runs a client script in `tests/clients` and fails with its output unless it exits 0.
fn run_script(program: &str, args: &[&str]) {
    let (ok, out) = run_bounded(program, args);
    assert!(
        ok,
        "{program} {args:?} failed ({SETUP} if a library is missing):\n{out}"
    );
}

/// redis-py (RESP3 by default, and RESP2), node-redis (RESP3) and ioredis (RESP2) subscribe
/// through one sidecar and publish through another, unchanged.
#[test]
fn client_libraries_subscribe_and_publish_across_sidecars() {
    let (_shards, addrs) = three_shards();
    let yaml = sharded_yaml(&addrs, "{ policy: crc16_slots }", true);
    let a = respway(&yaml, 1);
    let b = respway(&yaml, 1);
    let (sa, sb) = (a.addr.to_string(), b.addr.to_string());
    for protocol in ["default", "2"] {
        run_script(
            "python3",
            &[
                "pubsub.py",
                "--addr",
                &sa,
                "--pub-addr",
                &sb,
                "--protocol",
                protocol,
            ],
        );
    }
    for lib in ["node-redis", "ioredis"] {
        run_script(
            "node",
            &["pubsub.mjs", "--lib", lib, "--addr", &sa, "--pub-addr", &sb],
        );
    }
}

/// A shard restarted under a subscription: the worker's link reconnects and subscribes again,
/// and messages published after the shard is back reach the subscriber (on the same client
/// connection, which never noticed).
#[test]
fn subscriptions_survive_a_shard_restart() {
    let mut shard = redis();
    let port = shard.addr.port();
    let rw = respway(&sharded_yaml(&[shard.addr], "{ policy: maglev }", true), 1);
    let mut sub = RespConn::connect(rw.addr);
    subscribe(&mut sub, "SUBSCRIBE", &["alerts".to_string()], 0);
    subscribe(&mut sub, "PSUBSCRIBE", &["al*".to_string()], 1);
    shard.kill();
    let _back = redis_on(port);
    let mut p = RespConn::connect(rw.addr);
    // Until the link has subscribed again the shard has no receiver; bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    loop {
        n += 1;
        let r = p.call(&["PUBLISH", "alerts", &format!("m{n}")]);
        if r == Resp::Int(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not resubscribed: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The last message arrives directly and by pattern (an earlier one may too, if the link
    // had subscribed again to one of them only).
    let (mut direct, mut by_pattern) = (false, false);
    for _ in 0..2 * n {
        let m = parts(&sub.read().expect("message"));
        let last = m.last() == Some(&Resp::bulk(format!("m{n}")));
        match bulk_text(&m[0]).as_str() {
            "message" => direct |= last,
            "pmessage" => by_pattern |= last,
            other => panic!("{other}"),
        }
        if direct && by_pattern {
            break;
        }
    }
    assert!(
        direct && by_pattern,
        "m{n}: direct {direct}, pattern {by_pattern}"
    );
}

/// Patterns are subscribed on the clusters the listener's routes send channels to, not on a
/// mirror's target cluster (no channel is ever published there through respway); PUBSUB
/// NUMPAT does not count it either.
#[test]
fn patterns_are_not_subscribed_on_mirror_clusters() {
    let old = redis();
    let new = redis();
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    op_timeout: 2s\n    routes:\n      catch_all: old\n      catch_all_mirrors:\n        - {{ cluster: new, mode: dual_write }}\nclusters:\n  - name: old\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n  - name: new\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        old.addr, new.addr
    );
    let rw = respway(&yaml, 1);
    let mut sub = RespConn::connect(rw.addr);
    subscribe(&mut sub, "PSUBSCRIBE", &["news:*".to_string()], 0);
    assert_eq!(
        RespConn::connect(old.addr).call(&["PUBSUB", "NUMPAT"]),
        Resp::Int(1)
    );
    assert_eq!(
        RespConn::connect(new.addr).call(&["PUBSUB", "NUMPAT"]),
        Resp::Int(0),
        "the mirror's cluster holds no pattern"
    );
    assert_eq!(
        RespConn::connect(rw.addr).call(&["PUBSUB", "NUMPAT"]),
        Resp::Int(1)
    );
}

/// The pub/sub link of a shard whose bytes arrive a few at a time (a relay writing 1 to 13
/// bytes per write): messages of 1 byte to 200 KB, published in one pipeline, reach the
/// subscriber intact and in order.
#[test]
fn messages_arriving_in_tiny_reads_are_delivered_intact() {
    let shard = redis();
    let relay = Dribble::start(shard.addr, 13);
    let yaml = sharded_yaml(&[relay.addr], "{ policy: maglev }", true)
        .replace("op_timeout: 2s", "op_timeout: 60s")
        .replace("connect_timeout: 500ms", "connect_timeout: 10s");
    let rw = respway(&yaml, 1);
    let mut sub = RespConn::connect(rw.addr);
    sub.stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    subscribe(&mut sub, "SUBSCRIBE", &["big".to_string()], 0);
    let messages: Vec<Vec<u8>> = [1usize, 200_000, 17, 65_536, 3]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|k| {
                    if k % 101 == 0 {
                        b'\r'
                    } else {
                        b'a' + (i as u8)
                    }
                })
                .collect()
        })
        .collect();
    let mut publisher = RespConn::connect(shard.addr);
    let mut out = Vec::new();
    for m in &messages {
        encode_cmd(&mut out, &[b"PUBLISH", b"big", m]);
    }
    publisher.write_raw(&out).unwrap();
    for _ in &messages {
        assert_eq!(publisher.read().expect("PUBLISH reply"), Resp::Int(1));
    }
    for (i, m) in messages.iter().enumerate() {
        let p = parts(&sub.read().expect("message"));
        assert_eq!(bulk_text(&p[0]), "message");
        assert_eq!(bulk_text(&p[1]), "big");
        assert!(p[2] == Resp::Bulk(Some(m.clone())), "message {i} differs");
    }
}

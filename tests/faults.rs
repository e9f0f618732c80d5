//! The fault suite: real redis-server shards (and fake shards where a real one cannot
//! misbehave on demand), respway, and clients that record every acknowledged write and read
//! all of them back afterwards. Every test asserts "0 acknowledged writes lost".

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::*;

/// Reads `key` from whichever shard holds it (a key lives on exactly one).
fn read_back(shards: &[SocketAddr], key: &str) -> Option<String> {
    let mut found = None;
    for &s in shards {
        let mut c = RespConn::connect(s);
        if let Resp::Bulk(Some(v)) = c.call(&["GET", key]) {
            assert!(found.is_none(), "{key} is on two shards");
            found = Some(String::from_utf8_lossy(&v).into_owned());
        }
    }
    found
}

/// Clients pipelining SET / INCR / GET on their own keys: every reply must be the one Redis
/// gives a single connection (INCRs consecutive, a GET sees the SET before it), and afterwards
/// every key holds the last value whose SET was acknowledged.
fn order_holds_with(connections_per_endpoint: usize) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true).replace(
        "    connect_timeout: 500ms\n",
        &format!(
            "    connect_timeout: 500ms\n    connections_per_endpoint: {connections_per_endpoint}\n"
        ),
    );
    let rw = respway(&yaml, 2);
    let addr = rw.addr;
    let threads: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                let mut last: HashMap<String, String> = HashMap::new();
                let mut counter = 0i64;
                let deadline = Instant::now() + Duration::from_millis(1500);
                let mut round = 0u64;
                while Instant::now() < deadline && round < 2_000 {
                    let mut cmds: Vec<Vec<String>> = Vec::new();
                    for j in 0..16 {
                        let key = format!("order:{t}:{j}");
                        for v in 0..3 {
                            cmds.push(vec!["SET".into(), key.clone(), format!("{round}.{v}")]);
                        }
                        cmds.push(vec!["INCR".into(), format!("order:{t}:ctr")]);
                        cmds.push(vec!["GET".into(), key]);
                    }
                    c.send_pipeline(&cmds);
                    for cmd in &cmds {
                        let r = c.read().expect("reply");
                        match cmd[0].as_str() {
                            "SET" => {
                                assert_eq!(r, Resp::Simple("OK".into()), "{cmd:?}");
                                last.insert(cmd[1].clone(), cmd[2].clone());
                            }
                            "INCR" => {
                                counter += 1;
                                assert_eq!(r, Resp::Int(counter), "INCR out of order");
                            }
                            _ => assert_eq!(
                                r.text(),
                                last[&cmd[1]],
                                "GET {} did not see the SET before it",
                                cmd[1]
                            ),
                        }
                    }
                    round += 1;
                }
                last
            })
        })
        .collect();
    let mut acked = HashMap::new();
    for t in threads {
        acked.extend(t.join().expect("a client saw a reply out of order"));
    }
    // Sessions, not commands, are spread: a worker with several sessions uses several of
    // each endpoint's connections.
    for &a in &addrs {
        let info = RespConn::connect(a).call(&["INFO", "clients"]).text();
        let n: usize = info
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("connected_clients");
        // respway's connections plus this INFO connection.
        assert!(
            n > connections_per_endpoint.min(2),
            "shard {a}: {n} connections, sessions are not spread"
        );
    }
    drop(rw);
    let lost: Vec<_> = acked
        .iter()
        .filter(|(k, v)| read_back(&addrs, k).as_ref() != Some(*v))
        .collect();
    assert!(acked.len() >= 96, "every client wrote its keys");
    assert_eq!(lost.len(), 0, "acknowledged writes lost: {lost:?}");
}

#[test]
fn order_and_last_write_win_with_one_connection_per_endpoint() {
    order_holds_with(1);
}

#[test]
fn order_and_last_write_win_with_two_connections_per_endpoint() {
    order_holds_with(2);
}

#[test]
fn order_and_last_write_win_with_four_connections_per_endpoint() {
    order_holds_with(4);
}

/// Until transactions are supported, a refused MULTI must not let its queued commands run
/// outside a transaction: everything up to EXEC/DISCARD is refused and not forwarded, and
/// EXEC aborts like Redis does after a queuing error.
#[test]
fn refused_multi_runs_nothing_and_exec_aborts() {
    let shards: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", true), 1);
    let mut c = RespConn::connect(rw.addr);
    let cmds: Vec<Vec<&str>> = vec![
        vec!["MULTI"],
        vec!["SET", "tx:{a}:1", "x"],
        vec!["INCR", "tx:{a}:n"],
        vec!["EXEC"],
        vec!["MULTI"],
        vec!["SET", "tx:{a}:2", "y"],
        vec!["DISCARD"],
        vec!["SET", "after", "z"],
        vec!["MULTI"],
        vec!["PING"],
        vec!["WATCH", "k"],
        vec!["MULTI"],
        vec!["EXEC"],
    ];
    c.send_pipeline(&cmds);
    let replies: Vec<Resp> = cmds.iter().map(|_| c.read().expect("reply")).collect();
    assert!(replies[0].is_error(), "MULTI refused: {:?}", replies[0]);
    assert!(
        replies[1].is_error() && replies[2].is_error(),
        "{replies:?}"
    );
    assert_eq!(
        replies[3],
        Resp::Error("EXECABORT Transaction discarded because of previous errors.".into())
    );
    assert!(replies[4].is_error() && replies[5].is_error());
    assert_eq!(
        replies[6],
        Resp::Simple("OK".into()),
        "DISCARD ends the state"
    );
    assert_eq!(
        replies[7],
        Resp::Simple("OK".into()),
        "commands after DISCARD run"
    );
    assert!(
        replies[8].is_error() && replies[9].is_error(),
        "PING is queued too"
    );
    assert_eq!(
        replies[10],
        Resp::Error("ERR WATCH inside MULTI is not allowed".into())
    );
    assert_eq!(
        replies[11],
        Resp::Error("ERR MULTI calls can not be nested".into())
    );
    assert!(replies[12].error().unwrap_or("").starts_with("EXECABORT"));
    // The redis crate's atomic pipeline fails as a whole and applies nothing.
    let mut rc = sync_client(rw.addr);
    let r: redis::RedisResult<(String, i64)> = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("tx:{b}:1")
        .arg("v")
        .cmd("INCR")
        .arg("tx:{b}:n")
        .query(&mut rc);
    assert!(r.is_err(), "an atomic pipeline cannot succeed: {r:?}");
    let ok: String = redis::cmd("SET").arg("k2").arg("v").query(&mut rc).unwrap();
    assert_eq!(ok, "OK", "the connection is usable after EXEC");
    drop(rw);
    for k in ["tx:{a}:1", "tx:{a}:n", "tx:{a}:2", "tx:{b}:1", "tx:{b}:n"] {
        assert_eq!(
            read_back(&addrs, k),
            None,
            "{k} was applied outside a transaction"
        );
    }
    assert_eq!(read_back(&addrs, "after").as_deref(), Some("z"));
}

//! Placement parity with a real nutcracker (twemproxy): keys written through nutcracker must be
//! found where respway's picker looks for them, including when the servers are not listed in
//! the order twemproxy sorts them by name (it sorts a pool's servers before building the
//! `modula` distribution; shorter names first, then bytewise).
//!
//! Each test starts its own redis-server shards, one nutcracker and (for the end-to-end half)
//! respway in-process; every process is stopped when the test ends, also when it fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use respway_filters::hash::{build_picker, ShardInput};
use respway_filters::model::{HashPolicy, HashTag, KeyHash};

/// Keys written per test.
const KEYS: usize = 20_000;

/// One twemproxy server as configured: its redis, weight and optional name.
struct Server {
    redis: Proc,
    weight: u32,
    name: Option<&'static str>,
}

impl Server {
    /// The name twemproxy sorts and (for ketama) hashes the server by: its given name, else
    /// `host:port` (these tests never use port 11211, where it would be just `host`).
    fn twemproxy_name(&self) -> String {
        match self.name {
            Some(n) => n.to_string(),
            None => self.redis.addr.to_string(),
        }
    }
}

/// Starts one redis-server per `(name, weight)`, in that (config) order.
fn servers(spec: &[(Option<&'static str>, u32)]) -> Vec<Server> {
    spec.iter()
        .map(|&(name, weight)| Server {
            redis: redis(),
            weight,
            name,
        })
        .collect()
}

/// Twemproxy's server order (`conf_server_name_cmp` → `string_compare`): shorter names first,
/// equal lengths bytewise. Used only to assert that a test's config order is *not* it.
fn twemproxy_sorted(names: &[String]) -> Vec<String> {
    let mut sorted = names.to_vec();
    sorted.sort_by(|a, b| {
        a.len()
            .cmp(&b.len())
            .then_with(|| a.as_bytes().cmp(b.as_bytes()))
    });
    sorted
}

/// Key `i`: mostly plain keys, every tenth one hashtag'd.
fn key_of(i: usize) -> String {
    if i.is_multiple_of(10) {
        format!("{{tag{}}}:k{i}", i % 37)
    } else {
        format!("user:{i}")
    }
}

/// Starts nutcracker over `servers` (config order) with this distribution and key hash,
/// hash_tag `{}`, and waits for its listener.
fn start_nutcracker(servers: &[Server], distribution: &str, hash: &str) -> Proc {
    let mut yml = format!(
        "alpha:\n  listen: 127.0.0.1:0\n  hash: {hash}\n  distribution: {distribution}\n  hash_tag: \"{{}}\"\n  redis: true\n  auto_eject_hosts: false\n  servers:\n"
    );
    for s in servers {
        match s.name {
            Some(name) => yml.push_str(&format!("   - {}:{} {name}\n", s.redis.addr, s.weight)),
            None => yml.push_str(&format!("   - {}:{}\n", s.redis.addr, s.weight)),
        }
    }
    nutcracker(&yml)
}

/// Writes `SET key_of(i) i` for every key through nutcracker in one raw pipeline (nutcracker
/// closes connections that send CLIENT SETINFO, as the redis crate does on connect).
fn write_through_nutcracker(nc: SocketAddr) {
    let mut out = Vec::new();
    for i in 0..KEYS {
        let (key, val) = (key_of(i), i.to_string());
        encode_cmd(&mut out, &[b"SET", key.as_bytes(), val.as_bytes()]);
    }
    let mut c = RespConn::connect(nc);
    c.write_raw(&out).unwrap();
    let expect = b"+OK\r\n".repeat(KEYS);
    let mut got = Vec::new();
    while got.len() < expect.len() {
        let k = c.read_raw().expect("nutcracker replies");
        assert!(!k.is_empty(), "nutcracker closed the connection");
        got.extend_from_slice(&k);
    }
    assert!(got == expect, "every SET through nutcracker succeeded");
}

/// Which server (config index) holds each key, read back from the redis servers themselves.
fn placement(servers: &[Server]) -> HashMap<String, usize> {
    let mut at = HashMap::new();
    for (i, s) in servers.iter().enumerate() {
        let mut c = sync_client(s.redis.addr);
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).expect("KEYS");
        assert!(
            !keys.is_empty(),
            "server {i} ({}) got no keys: the test would not tell placements apart",
            s.twemproxy_name()
        );
        for k in keys {
            assert!(at.insert(k, i).is_none(), "a key is on two servers");
        }
    }
    assert_eq!(at.len(), KEYS, "every key is on some server");
    at
}

/// respway's picker, built through the filters API from the twemproxy names and weights in
/// config order, must pick the server that holds each key.
fn assert_picker_matches(servers: &[Server], policy: &HashPolicy, at: &HashMap<String, usize>) {
    let names: Vec<String> = servers.iter().map(Server::twemproxy_name).collect();
    let inputs: Vec<ShardInput<'_>> = servers
        .iter()
        .zip(&names)
        .map(|(s, n)| ShardInput {
            hash_key: n,
            weight: s.weight,
            slots: &[],
        })
        .collect();
    let picker = build_picker(policy, Some(HashTag::default()), &inputs).unwrap();
    let wrong: Vec<String> = (0..KEYS)
        .map(key_of)
        .filter(|k| picker.pick(k.as_bytes()) != at[k])
        .collect();
    assert!(
        wrong.is_empty(),
        "{policy:?} over {names:?} (weights {:?}): {} of {KEYS} keys are not on the shard \
         respway picks, e.g. {:?}",
        servers.iter().map(|s| s.weight).collect::<Vec<_>>(),
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// respway in-process, configured with the same servers (YAML shard `name` = twemproxy name
/// when one was given, unnamed otherwise, and the same weights, in config order), must return
/// every key written through nutcracker.
fn assert_found_through_respway(servers: &[Server], hash: &str) {
    let mut y = String::from(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 2s\n    routes:\n      catch_all: main\n",
    );
    y.push_str(&format!(
        "clusters:\n  - name: main\n    hash: {hash}\n    connect_timeout: 500ms\n    shards:\n"
    ));
    for s in servers {
        match s.name {
            Some(name) => y.push_str(&format!(
                "      - name: \"{name}\"\n        weight: {}\n",
                s.weight
            )),
            None => y.push_str(&format!("      - weight: {}\n", s.weight)),
        }
        y.push_str(&format!(
            "        endpoints:\n          - {{ address: \"{}\", role: primary }}\n",
            s.redis.addr
        ));
    }
    let rw = respway(&y, 2);
    let mut c = sync_client(rw.addr);
    let mut p = redis::pipe();
    for i in 0..KEYS {
        p.cmd("GET").arg(key_of(i));
    }
    let vals: Vec<Option<i64>> = p.query(&mut c).unwrap();
    let missing = vals
        .iter()
        .enumerate()
        .filter(|(i, v)| **v != Some(*i as i64))
        .count();
    assert_eq!(
        missing, 0,
        "{missing} of {KEYS} keys written by nutcracker not found through respway ({hash})"
    );
}

/// The whole check for one pool: nutcracker places the keys, then both the picker and respway
/// must agree with where they landed.
fn check(spec: &[(Option<&'static str>, u32)], distribution: &str, hash: &str, policy: HashPolicy) {
    let started = Instant::now();
    let servers = servers(spec);
    let names: Vec<String> = servers.iter().map(Server::twemproxy_name).collect();
    assert_ne!(
        twemproxy_sorted(&names),
        names,
        "the servers must be listed out of twemproxy's sorted order"
    );
    let nc = start_nutcracker(&servers, distribution, hash);
    write_through_nutcracker(nc.addr);
    drop(nc);
    let at = placement(&servers);
    assert_picker_matches(&servers, &policy, &at);
    let yaml_hash = format!("{{ policy: {distribution}, key_hash: {hash} }}");
    assert_found_through_respway(&servers, &yaml_hash);
    assert!(
        started.elapsed() < slack(Duration::from_secs(20)),
        "took {:?}",
        started.elapsed()
    );
}

/// Named servers out of order: "s10" sorts after "s2" (longer), "a" first, "bb" among the
/// two-byte names; unequal weights.
const NAMED: &[(Option<&str>, u32)] = &[
    (Some("s10"), 1),
    (Some("s2"), 3),
    (Some("a"), 2),
    (Some("bb"), 1),
    (Some("s1"), 2),
];

#[test]
fn modula_named_servers_out_of_sorted_order_match_nutcracker() {
    check(
        NAMED,
        "modula",
        "fnv1a_64",
        HashPolicy::Modula {
            key_hash: KeyHash::Fnv1a64,
        },
    );
}

/// Unnamed servers are sorted by their `host:port` name; the servers are listed by descending
/// port (all `127.0.0.1:<5-digit port>` here, so bytewise order is port order), with unequal
/// weights and another key hash.
#[test]
fn modula_unnamed_servers_out_of_sorted_order_match_nutcracker() {
    let mut pool = servers(&[(None, 1), (None, 1), (None, 1), (None, 1)]);
    pool.sort_by_key(|s| std::cmp::Reverse(s.redis.addr.port()));
    for (s, w) in pool.iter_mut().zip([2, 1, 3, 1]) {
        s.weight = w;
    }
    let names: Vec<String> = pool.iter().map(Server::twemproxy_name).collect();
    assert_ne!(twemproxy_sorted(&names), names);
    let nc = start_nutcracker(&pool, "modula", "murmur");
    write_through_nutcracker(nc.addr);
    drop(nc);
    let at = placement(&pool);
    assert_picker_matches(
        &pool,
        &HashPolicy::Modula {
            key_hash: KeyHash::Murmur,
        },
        &at,
    );
    assert_found_through_respway(&pool, "{ policy: modula, key_hash: murmur }");
}

/// Ketama does not depend on the server order (points are hashed from the names); it must
/// still match with the same unsorted names and weights.
#[test]
fn ketama_named_servers_out_of_sorted_order_match_nutcracker() {
    check(
        NAMED,
        "ketama",
        "fnv1a_64",
        HashPolicy::Ketama {
            key_hash: KeyHash::Fnv1a64,
        },
    );
}

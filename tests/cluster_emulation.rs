//! Cluster emulation (a listener's `cluster_emulation`): respway over three plain
//! redis-server shards answers as a Redis Cluster that owns every slot, so cluster-aware
//! clients connect through it unchanged, while respway still routes every key itself.
//!
//! - The replies are compared with a real Redis Cluster node's (`redis-server
//!   --cluster-enabled yes` owning every slot): the same shapes in RESP2 and RESP3, the same
//!   `CLUSTER KEYSLOT` for keys with and without `{tags}`.
//! - redis-py's `RedisCluster` and ioredis's `Cluster` (pinned in `tests/clients/`) run
//!   `py_cluster.py` / `ioredis_cluster.mjs` through one sidecar, then through two sidecar
//!   processes that announce each other (the slots split over them).
//!   `py_cluster.py` also runs against a real three-node Redis Cluster, which checks the script.
//! - Without emulation `CLUSTER` stays refused, and `RedisCluster` does not start.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

/// Keys whose slot is compared with a real Redis Cluster's: plain, tagged, empty and odd tags.
const KEYS: &[&str] = &[
    "foo",
    "bar",
    "{user1000}.following",
    "{user1000}.followers",
    "a{}b",
    "{}x",
    "x{}",
    "{a}{b}",
    "{{a}}",
    "tail{",
    "",
    "é",
];

/// Three plain shards behind respway (crc16_slots) with `emulation` as the listener's
/// `cluster_emulation` (`None`: no such key).
fn behind_respway(emulation: Option<&str>) -> (Vec<Proc>, Respway) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let mut yaml = sharded_yaml(&addrs, "{ policy: crc16_slots }", true);
    if let Some(e) = emulation {
        yaml = yaml.replacen(
            "    op_timeout: 2s\n",
            &format!("    op_timeout: 2s\n    cluster_emulation: {e}\n"),
            1,
        );
    }
    (shards, respway(&yaml, 1))
}

/// A real Redis Cluster node that owns every slot (a cluster of one), once it says
/// `cluster_state:ok`.
fn real_cluster_node() -> Proc {
    let node = redis_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        // A node alone has not learned its own address from a peer: announce it.
        "--cluster-announce-ip",
        "127.0.0.1",
    ]);
    let mut c = RespConn::connect(node.addr);
    assert_eq!(
        c.call(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]),
        Resp::Simple("OK".into())
    );
    let start = Instant::now();
    while !c
        .call(&["CLUSTER", "INFO"])
        .text()
        .contains("cluster_state:ok")
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the real cluster node never said cluster_state:ok"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    node
}

/// A connection that said `HELLO proto` (2 or 3) first.
fn conn(addr: SocketAddr, proto: u8) -> RespConn {
    let mut c = RespConn::connect(addr);
    let hello = c.call(&["HELLO", &proto.to_string()]);
    assert!(!hello.is_error(), "HELLO {proto}: {hello:?}");
    c
}

/// `r` with node ids (40 hex digits) as `<id>` and the given ports as -1, for comparing the
/// shapes of two servers' replies.
fn mask(r: &Resp, ports: &[u16]) -> Resp {
    let all = |v: &[Resp]| v.iter().map(|x| mask(x, ports)).collect::<Vec<_>>();
    match r {
        Resp::Bulk(Some(b)) if b.len() == 40 && b.iter().all(u8::is_ascii_hexdigit) => {
            Resp::bulk("<id>")
        }
        Resp::Int(n) if ports.iter().any(|p| i64::from(*p) == *n) => Resp::Int(-1),
        Resp::Array(Some(v)) => Resp::Array(Some(all(v))),
        Resp::Other(t, v) => Resp::Other(*t, all(v)),
        other => other.clone(),
    }
}

/// The text of a bulk (RESP2) or verbatim (RESP3, without its `txt:`) reply.
fn text_of(r: &Resp) -> String {
    match r {
        Resp::Other(b'=', v) => v[0].text()[4..].to_string(),
        other => other.text(),
    }
}

/// `CLUSTER INFO`'s fields in order.
fn info_fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn is_node_id(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// One `CLUSTER NODES` line's fields.
fn node_fields(line: &str) -> Vec<String> {
    line.split(' ').map(str::to_string).collect()
}

#[test]
fn replies_have_a_real_cluster_nodes_shapes_in_resp2_and_resp3() {
    let (_shards, rw) = behind_respway(Some("true"));
    let real = real_cluster_node();
    let ports = [rw.addr.port(), real.addr.port()];
    for proto in [2, 3] {
        let mut ours = conn(rw.addr, proto);
        let mut theirs = conn(real.addr, proto);
        for sub in ["SLOTS", "SHARDS"] {
            let (a, b) = (ours.call(&["CLUSTER", sub]), theirs.call(&["CLUSTER", sub]));
            assert_eq!(
                mask(&a, &ports),
                mask(&b, &ports),
                "CLUSTER {sub}, RESP{proto}:\nrespway {a:?}\nredis   {b:?}"
            );
        }
        // SLOTS: one node, the address the client connected to, owning every slot.
        let slots = ours.call(&["CLUSTER", "SLOTS"]);
        let Resp::Array(Some(ranges)) = &slots else {
            panic!("{slots:?}")
        };
        let Resp::Array(Some(range)) = &ranges[0] else {
            panic!("{slots:?}")
        };
        assert_eq!(range[0], Resp::Int(0));
        assert_eq!(range[1], Resp::Int(16383));
        let Resp::Array(Some(node)) = &range[2] else {
            panic!("{slots:?}")
        };
        assert_eq!(node[0].text(), "127.0.0.1");
        assert_eq!(node[1], Resp::Int(i64::from(rw.addr.port())));
        let id = node[2].text();
        assert!(is_node_id(&id), "{id}");

        // NODES: one line, the same fields as Redis's, this node myself.
        let (a, b) = (
            ours.call(&["CLUSTER", "NODES"]),
            theirs.call(&["CLUSTER", "NODES"]),
        );
        assert_eq!(
            std::mem::discriminant(&a),
            std::mem::discriminant(&b),
            "NODES RESP{proto}: {a:?} / {b:?}"
        );
        let (a, b) = (text_of(&a), text_of(&b));
        assert!(a.ends_with('\n') && b.ends_with('\n'), "{a:?} / {b:?}");
        let (a, b) = (node_fields(a.trim_end()), node_fields(b.trim_end()));
        assert_eq!(a.len(), b.len(), "{a:?} / {b:?}");
        assert_eq!(a[0], id);
        assert!(
            a[1].starts_with(&format!("{}@", rw.addr)),
            "{a:?} (address {})",
            rw.addr
        );
        for i in [2, 3, 7, 8] {
            assert_eq!(a[i], b[i], "field {i} of {a:?} / {b:?}");
        }
        assert_eq!(a[8], "0-16383");

        // INFO: Redis's fields, in Redis's order; the values of a one-node cluster.
        let (a, b) = (
            ours.call(&["CLUSTER", "INFO"]),
            theirs.call(&["CLUSTER", "INFO"]),
        );
        assert_eq!(std::mem::discriminant(&a), std::mem::discriminant(&b));
        let (a, b) = (info_fields(&text_of(&a)), info_fields(&text_of(&b)));
        let names = |f: &[(String, String)]| f.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(names(&a), names(&b));
        for (k, v) in &a[..7] {
            assert_eq!(
                Some(v),
                b.iter().find(|(n, _)| n == k).map(|(_, v)| v),
                "{k}"
            );
        }

        // MYID and MYSHARDID: 40 hex digits, the id every other reply shows.
        assert_eq!(ours.call(&["CLUSTER", "MYID"]).text(), id);
        assert!(is_node_id(&ours.call(&["CLUSTER", "MYSHARDID"]).text()));
        // KEYSLOT: Redis's crc16 with hashtags.
        for key in KEYS {
            assert_eq!(
                ours.call(&["CLUSTER", "KEYSLOT", key]),
                theirs.call(&["CLUSTER", "KEYSLOT", key]),
                "CLUSTER KEYSLOT {key:?}"
            );
        }
        // What clients send around the cluster commands.
        for cmd in [&["ASKING"][..], &["READONLY"], &["READWRITE"]] {
            assert_eq!(ours.call(cmd), theirs.call(cmd), "{cmd:?}");
        }
        for cmd in [
            &["CLUSTER", "NOSUCH"][..],
            &["CLUSTER"],
            &["CLUSTER", "KEYSLOT"],
            &["CLUSTER", "KEYSLOT", "a", "b"],
        ] {
            assert_eq!(ours.call(cmd), theirs.call(cmd), "{cmd:?}");
        }
        // INFO and HELLO say cluster, as a cluster node's do.
        let info = text_of(&ours.call(&["INFO", "cluster"]));
        assert_eq!(info, text_of(&theirs.call(&["INFO", "cluster"])));
        assert!(text_of(&ours.call(&["INFO"])).contains("cluster_enabled:1\r\n"));
        assert!(text_of(&ours.call(&["INFO", "server"])).contains("redis_mode:cluster\r\n"));
        let hello = match ours.call(&["HELLO", &proto.to_string()]) {
            Resp::Array(Some(v)) | Resp::Other(b'%', v) => v,
            other => panic!("HELLO: {other:?}"),
        };
        let mode = hello.iter().position(|f| *f == Resp::bulk("mode"));
        assert_eq!(mode.map(|i| &hello[i + 1]), Some(&Resp::bulk("cluster")));
    }
    // The id is the same on every connection and every call.
    let ids: Vec<String> = (0..3)
        .map(|_| RespConn::connect(rw.addr).call(&["CLUSTER", "MYID"]).text())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
}

#[test]
fn slot_commands_respway_cannot_answer_are_refused_by_name() {
    let (_shards, rw) = behind_respway(Some("true"));
    let mut c = RespConn::connect(rw.addr);
    for (cmd, name) in [
        (&["CLUSTER", "COUNTKEYSINSLOT", "5"][..], "COUNTKEYSINSLOT"),
        (&["CLUSTER", "GETKEYSINSLOT", "5", "10"], "GETKEYSINSLOT"),
    ] {
        assert_eq!(
            c.call(cmd).error(),
            Some(
                format!(
                    "ERR respway: CLUSTER {name} is not supported: respway emulates the cluster \
                     (its shards keep no slots; respway routes every key itself)"
                )
                .as_str()
            )
        );
    }
    for (cmd, name) in [
        (&["CLUSTER", "ADDSLOTS", "1"][..], "ADDSLOTS"),
        (&["cluster", "failover"], "FAILOVER"),
        (&["CLUSTER", "MEET", "127.0.0.1", "7000"], "MEET"),
    ] {
        assert_eq!(
            c.call(cmd).error(),
            Some(
                format!(
                    "ERR respway: CLUSTER {name} is not supported: respway emulates the cluster \
                     (it answers CLUSTER SLOTS, SHARDS, NODES, INFO, KEYSLOT, MYID, MYSHARDID, \
                     REPLICAS, LINKS and HELP)"
                )
                .as_str()
            )
        );
    }
    // Every node is a primary without replicas; there is no cluster bus.
    let id = c.call(&["CLUSTER", "MYID"]).text();
    assert_eq!(
        c.call(&["CLUSTER", "REPLICAS", &id]),
        Resp::Array(Some(vec![]))
    );
    assert_eq!(
        c.call(&["CLUSTER", "REPLICAS", "nosuchnode"]).error(),
        Some("ERR Unknown node nosuchnode")
    );
    assert_eq!(c.call(&["CLUSTER", "LINKS"]), Resp::Array(Some(vec![])));
    // The keys still go where respway routes them.
    assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    assert_eq!(c.get("k"), Some(b"v".to_vec()));
}

#[test]
fn without_emulation_cluster_is_refused() {
    let (_shards, rw) = behind_respway(None);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(
        c.call(&["CLUSTER", "SLOTS"]).error(),
        Some("ERR command 'CLUSTER' is not supported by respway")
    );
    assert_eq!(
        c.call(&["asking"]).error(),
        Some("ERR command 'asking' is not supported by respway")
    );
    let info = c.call(&["INFO", "server"]).text();
    assert!(info.contains("redis_mode:standalone\r\n"), "{info}");
}

// --- cluster-aware clients -----------------------------------------------------------------

/// Runs a client script in `tests/clients` with `--addr` for each of `addrs`, plus `extra`;
/// fails the test with its output unless it exits 0. Returns the output.
fn run_client(program: &str, script: &str, addrs: &[SocketAddr], extra: &[&str]) -> String {
    let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    let mut args = vec![script];
    for a in &addrs {
        args.extend(["--addr", a.as_str()]);
    }
    args.extend_from_slice(extra);
    let (ok, out) = run_bounded(program, &args);
    eprintln!("{program} {}:\n{out}", args.join(" "));
    assert!(ok, "{} failed; its output:\n{out}", args.join(" "));
    out
}

/// Panics (naming `setup.sh`) unless python3 imports redis-py.
fn require_redis_py() {
    let (ok, out) = run_bounded("python3", &["-c", "import redis.cluster"]);
    assert!(ok, "python3 cannot import redis.cluster: {out}; {SETUP}");
}

/// Panics (naming `setup.sh`) unless ioredis is installed.
fn require_ioredis() {
    assert!(
        clients_dir().join("node_modules/ioredis").is_dir(),
        "tests/clients/node_modules/ioredis is missing; {SETUP}"
    );
}

#[test]
fn redis_py_cluster_through_one_sidecar() {
    require_redis_py();
    let (_shards, rw) = behind_respway(Some("true"));
    for proto in ["default", "2"] {
        run_client(
            "python3",
            "py_cluster.py",
            &[rw.addr],
            &["--protocol", proto],
        );
    }
}

#[test]
fn ioredis_cluster_through_one_sidecar() {
    require_ioredis();
    let (_shards, rw) = behind_respway(Some("true"));
    run_client("node", "ioredis_cluster.mjs", &[rw.addr], &[]);
    run_client("node", "ioredis_cluster.mjs", &[rw.addr], &["--resp", "2"]);
}

/// `total_commands_processed` of a sidecar's listener.
fn commands_processed(addr: SocketAddr) -> u64 {
    let info = RespConn::connect(addr).call(&["INFO", "stats"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total_commands_processed in {info}"))
}

/// Two sidecar processes over the same three shards, each announcing both.
fn two_sidecars() -> (Vec<Proc>, Vec<Proc>) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let ports = [free_port(), free_port()];
    let announce = format!(
        "{{ announce: [\"127.0.0.1:{}\", \"127.0.0.1:{}\"] }}",
        ports[0], ports[1]
    );
    let sidecars = ports
        .iter()
        .map(|&p| {
            let yaml = sharded_yaml(&addrs, "{ policy: crc16_slots }", true).replacen(
                "    address: 127.0.0.1:0\n    op_timeout: 2s\n",
                &format!(
                    "    address: 127.0.0.1:{p}\n    op_timeout: 2s\n    cluster_emulation: {announce}\n"
                ),
                1,
            );
            Spawn::new(env!("CARGO_BIN_EXE_respway"))
                .config("--config", "respway.yaml", &yaml)
                .on_port(p)
                .args(["--workers", "1"])
                .start()
        })
        .collect();
    (shards, sidecars)
}

#[test]
fn announced_sidecars_split_the_slots_and_agree() {
    let (_shards, sidecars) = two_sidecars();
    let addrs: Vec<SocketAddr> = sidecars.iter().map(|s| s.addr).collect();
    let slots: Vec<Resp> = addrs
        .iter()
        .map(|&a| RespConn::connect(a).call(&["CLUSTER", "SLOTS"]))
        .collect();
    assert_eq!(
        slots[0], slots[1],
        "both sidecars give the same CLUSTER SLOTS"
    );
    let Resp::Array(Some(ranges)) = &slots[0] else {
        panic!("{:?}", slots[0])
    };
    let mut ids = Vec::new();
    for (i, (first, last)) in [(0, 8191), (8192, 16383)].into_iter().enumerate() {
        let Resp::Array(Some(r)) = &ranges[i] else {
            panic!("{ranges:?}")
        };
        assert_eq!((&r[0], &r[1]), (&Resp::Int(first), &Resp::Int(last)));
        let Resp::Array(Some(node)) = &r[2] else {
            panic!("{r:?}")
        };
        assert_eq!(node[0].text(), "127.0.0.1");
        assert_eq!(node[1], Resp::Int(i64::from(addrs[i].port())));
        ids.push(node[2].text());
    }
    assert_ne!(ids[0], ids[1]);
    for (i, &a) in addrs.iter().enumerate() {
        let mut c = RespConn::connect(a);
        // Each sidecar is the node of its own address.
        assert_eq!(c.call(&["CLUSTER", "MYID"]).text(), ids[i]);
        let nodes = c.call(&["CLUSTER", "NODES"]).text();
        let lines: Vec<Vec<String>> = nodes.lines().map(node_fields).collect();
        assert_eq!(lines.len(), 2, "{nodes}");
        for (j, l) in lines.iter().enumerate() {
            assert_eq!(l[0], ids[j]);
            assert!(l[1].starts_with(&format!("{}@", addrs[j])), "{nodes}");
            let flags = if i == j { "myself,master" } else { "master" };
            assert_eq!(l[2], flags, "{nodes}");
        }
        let info = c.call(&["CLUSTER", "INFO"]).text();
        for want in ["cluster_known_nodes:2\r\n", "cluster_size:2\r\n"] {
            assert!(info.contains(want), "{info}");
        }
        let shards = c.call(&["CLUSTER", "SHARDS"]);
        let Resp::Array(Some(list)) = &shards else {
            panic!("{shards:?}")
        };
        assert_eq!(list.len(), 2, "{shards:?}");
    }
}

#[test]
fn redis_py_cluster_spreads_over_two_announced_sidecars() {
    require_redis_py();
    let (_shards, sidecars) = two_sidecars();
    let addrs: Vec<SocketAddr> = sidecars.iter().map(|s| s.addr).collect();
    let before: Vec<u64> = addrs.iter().map(|&a| commands_processed(a)).collect();
    run_client(
        "python3",
        "py_cluster.py",
        &addrs,
        &["--protocol", "default"],
    );
    for (i, &a) in addrs.iter().enumerate() {
        let n = commands_processed(a) - before[i];
        assert!(n >= 300, "sidecar {a} served only {n} commands");
    }
}

#[test]
fn ioredis_cluster_spreads_over_two_announced_sidecars() {
    require_ioredis();
    let (_shards, sidecars) = two_sidecars();
    let addrs: Vec<SocketAddr> = sidecars.iter().map(|s| s.addr).collect();
    let before: Vec<u64> = addrs.iter().map(|&a| commands_processed(a)).collect();
    run_client("node", "ioredis_cluster.mjs", &addrs, &[]);
    for (i, &a) in addrs.iter().enumerate() {
        let n = commands_processed(a) - before[i];
        assert!(n >= 300, "sidecar {a} served only {n} commands");
    }
}

#[test]
fn redis_py_cluster_does_not_start_without_emulation() {
    require_redis_py();
    let (_shards, rw) = behind_respway(None);
    let out = run_client("python3", "py_cluster.py", &[rw.addr], &["--refused"]);
    // redis-py's words for the refused CLUSTER SLOTS.
    let want = "refused RedisClusterException: Redis Cluster cannot be connected. Please provide \
                at least one reachable node: Cluster mode is not enabled on this node";
    assert!(out.contains(want), "{out}");
}

/// A real three-node Redis Cluster on loopback (`redis-cli --cluster create`), once every
/// node says `cluster_state:ok` and knows the three.
fn real_cluster() -> Vec<Proc> {
    let nodes: Vec<Proc> = (0..3)
        .map(|_| {
            redis_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
        })
        .collect();
    let mut args = vec!["--cluster".to_string(), "create".to_string()];
    args.extend(nodes.iter().map(|n| n.addr.to_string()));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
    let out = std::process::Command::new("redis-cli")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("redis-cli must be installed");
    assert!(
        out.status.success(),
        "redis-cli --cluster create: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let start = Instant::now();
    for n in &nodes {
        let mut c = RespConn::connect(n.addr);
        loop {
            let info = c.call(&["CLUSTER", "INFO"]).text();
            if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the real cluster never settled: {info}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    nodes
}

/// The script itself, against a real Redis Cluster: what it expects is what Redis Cluster
/// does.
#[test]
fn redis_py_cluster_script_against_a_real_cluster() {
    require_redis_py();
    let nodes = real_cluster();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    for proto in ["default", "2"] {
        run_client("python3", "py_cluster.py", &addrs, &["--protocol", proto]);
    }
}

/// A configuration change turns emulation on and off for the commands after it, on
/// connections already open.
#[test]
fn a_config_change_turns_emulation_on_and_off() {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let off = sharded_yaml(&addrs, "{ policy: crc16_slots }", true);
    let on = off.replacen(
        "    op_timeout: 2s\n",
        "    op_timeout: 2s\n    cluster_emulation: true\n",
        1,
    );
    let config = |yaml: &str| {
        respway_xds::translate(&respway_xds::parse_yaml(yaml).expect("yaml")).expect("config")
    };
    let rw = respway(&off, 1);
    let server = rw.server.as_ref().expect("server");
    let mut c = RespConn::connect(rw.addr);
    let refused = Some("ERR command 'CLUSTER' is not supported by respway");
    assert_eq!(c.call(&["CLUSTER", "MYID"]).error(), refused);
    server.apply(config(&on)).expect("apply");
    let slots = c.call(&["CLUSTER", "SLOTS"]);
    assert!(!slots.is_error(), "{slots:?}");
    assert!(is_node_id(&c.call(&["CLUSTER", "MYID"]).text()));
    server.apply(config(&off)).expect("apply");
    assert_eq!(c.call(&["CLUSTER", "MYID"]).error(), refused);
}

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

/// A sidecar process on `port` over `shards` (crc16_slots) whose cluster emulation announces
/// the sidecars on `ports` (loopback), with `listener` as more of its listener's YAML (lines
/// indented by four) and `extra` arguments.
fn announcing_sidecar(
    shards: &[SocketAddr],
    port: u16,
    ports: &[u16],
    listener: &str,
    extra: &[&str],
) -> Proc {
    let announce: Vec<String> = ports.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    let announce = format!("{{ announce: [{}] }}", announce.join(", "));
    let yaml = sharded_yaml(shards, "{ policy: crc16_slots }", true).replacen(
        "    address: 127.0.0.1:0\n    op_timeout: 2s\n",
        &format!(
            "    address: 127.0.0.1:{port}\n    op_timeout: 2s\n    cluster_emulation: {announce}\n{listener}"
        ),
        1,
    );
    Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .config("--config", "respway.yaml", &yaml)
        .on_port(port)
        .args(["--workers", "1"])
        .args(extra)
        .start()
}

/// Two sidecar processes over the same three shards, each announcing both.
fn two_sidecars() -> (Vec<Proc>, Vec<Proc>) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let ports = [free_port(), free_port()];
    let sidecars = ports
        .iter()
        .map(|&p| announcing_sidecar(&addrs, p, &ports, "", &[]))
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

// --- announced sidecars that die, and walks node by node -----------------------------------

/// How soon a killed sidecar must be out of the live ones' map (and redis-py's errors over):
/// its checks are refused at once, so it is out within `1 s + 2 × 250 ms` of its death
/// (`discovery::peers`); asserted with [`slack`].
const OUT_WITHIN: Duration = Duration::from_secs(2);

/// `CLUSTER SLOTS` of the sidecar at `addr`: per range, (first, last, its node's port).
fn slot_map(addr: SocketAddr) -> Vec<(i64, i64, i64)> {
    let r = RespConn::connect(addr).call(&["CLUSTER", "SLOTS"]);
    let int = |x: &Resp| match x {
        Resp::Int(n) => *n,
        other => panic!("{other:?} in {r:?}"),
    };
    let Resp::Array(Some(ranges)) = &r else {
        panic!("{r:?}")
    };
    ranges
        .iter()
        .map(|range| {
            let Resp::Array(Some(v)) = range else {
                panic!("{r:?}")
            };
            let Resp::Array(Some(node)) = &v[2] else {
                panic!("{r:?}")
            };
            (int(&v[0]), int(&v[1]), int(&node[1]))
        })
        .collect()
}

/// `respway_cluster_emulation_node_{name}` of listener `main` and announced node
/// 127.0.0.1:`port` in the `/metrics` of the admin endpoint `admin`.
fn node_metric(admin: SocketAddr, name: &str, port: u16) -> String {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "{body}");
    let series = format!(
        "respway_cluster_emulation_node_{name}{{listener=\"main\",node=\"127.0.0.1:{port}\"}} "
    );
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in /metrics:\n{body}"))
        .to_string()
}

/// A client script in `tests/clients` running beside the test: its stdout read line by line,
/// its stdin written to; killed on drop.
struct Background {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Background {
    fn start(program: &str, args: &[&str]) -> Background {
        use std::io::BufRead;
        let mut child = std::process::Command::new(program)
            .args(args)
            .current_dir(clients_dir())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {program}: {e}; {SETUP}"));
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Background {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line starting with `prefix` and returns it; panics with what it printed
    /// when it ends or `timeout` passes first.
    fn line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    eprintln!("script: {l}");
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return l;
                    }
                }
                Err(e) => panic!(
                    "no line {prefix:?} from the script ({e:?}); it printed:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn say(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to the script");
        stdin.flush().expect("flush");
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `name=` in a `key=value` line.
fn field(line: &str, name: &str) -> f64 {
    line.split(' ')
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {name}= in {line}"))
}

/// Two sidecars announce each other and one is killed: within [`OUT_WITHIN`] the live one's
/// map gives it every slot, redis-py's `RedisCluster` (started from both) goes on through it
/// with errors for no longer than that, and the operator sees the dead one out in
/// `/metrics` and `/clusters`. Restarted, it is back in both maps.
#[test]
fn a_killed_sidecar_leaves_the_map_and_comes_back_when_restarted() {
    require_redis_py();
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let ports = [free_port(), free_port()];
    let admin = loopback(free_port());
    let live = announcing_sidecar(
        &addrs,
        ports[0],
        &ports,
        "",
        &["--admin", &admin.to_string()],
    );
    let other = announcing_sidecar(&addrs, ports[1], &ports, "", &[]);
    let other_listening = Instant::now();
    let (p0, p1) = (i64::from(ports[0]), i64::from(ports[1]));
    let both = vec![(0, 8191, p0), (8192, 16383, p1)];
    let alone = vec![(0, 16383, p0)];
    assert_eq!(slot_map(live.addr), both);
    assert_eq!(slot_map(other.addr), both);
    let node_up = |port: u16| node_metric(admin, "up", port);

    let after = slack(OUT_WITHIN) + Duration::from_secs(2);
    let (a0, a1) = (live.addr.to_string(), other.addr.to_string());
    let after_s = format!("{:.1}", after.as_secs_f64());
    let mut script = Background::start(
        "python3",
        &[
            "py_cluster_outage.py",
            "--addr",
            &a0,
            "--addr",
            &a1,
            "--after",
            &after_s,
        ],
    );
    script.line("ready", Duration::from_secs(60));
    // On purpose: the live one checks every second, so by now it has seen the other answer
    // (a sidecar that never answered is given three seconds to come up, not 1.5).
    let seen = other_listening + Duration::from_millis(1500);
    std::thread::sleep(seen.saturating_duration_since(Instant::now()));
    drop(other);
    script.say("killed");
    // While redis-py runs on: how soon the live one's map leaves the killed one out.
    let out_after = poll_until(after, || slot_map(live.addr) == alone);
    let summary = script.line("summary", after + Duration::from_secs(30));
    let last = field(&summary, "last_error_after_s");
    assert!(
        last <= slack(OUT_WITHIN).as_secs_f64(),
        "redis-py failed commands until {last} s after the kill: {summary}"
    );
    assert!(field(&summary, "ok_in_last_s") > 0.0, "{summary}");
    let took = out_after.unwrap_or_else(|| {
        panic!(
            "{after:?} after the kill, the live sidecar's CLUSTER SLOTS is still {:?}",
            slot_map(live.addr)
        )
    });
    eprintln!("the killed sidecar was out of the live one's map {took:?} after the kill");
    assert!(
        took <= slack(OUT_WITHIN),
        "out of the map only {took:?} after the kill"
    );
    // What the operator sees.
    assert_eq!(node_up(ports[1]), "0");
    assert_eq!(node_up(ports[0]), "1", "its own address is not checked");
    let (_, clusters) = http_get(admin, "/clusters");
    let line = format!(
        "listener main cluster_emulation node 127.0.0.1:{} state=out checked=yes changes=1",
        ports[1]
    );
    assert!(clusters.contains(&line), "{clusters}");
    assert!(
        live.log().contains("out of the map"),
        "no log line of the change:\n{}",
        live.log()
    );

    // Restarted: back in the live one's map after two answered checks, and in its own.
    let other = announcing_sidecar(&addrs, ports[1], &ports, "", &[]);
    let took = wait_until(
        Duration::from_secs(15),
        "the restarted sidecar back in the map",
        || slot_map(live.addr) == both,
    );
    eprintln!("the restarted sidecar was back in the map {took:?} after it listened");
    assert_eq!(slot_map(other.addr), both);
    assert_eq!(node_up(ports[1]), "1");
    run_client(
        "python3",
        "py_cluster.py",
        &[live.addr, other.addr],
        &["--protocol", "default"],
    );
}

/// A sidecar whose listener needs TLS or a password still passes the others' checks: any RESP
/// reply proves it alive (`-ERR this port speaks TLS`, `-NOAUTH`), so both stay in the map.
#[test]
fn sidecars_behind_tls_or_a_password_stay_in_the_map() {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let ports = [free_port(), free_port()];
    let admins = [loopback(free_port()), loopback(free_port())];
    let pki = Pki::new("emulation");
    let files = pki.issue("server", &["localhost", "127.0.0.1"], false);
    let tls = format!(
        "    tls:\n      cert: {}\n      key: {}\n",
        files.cert.display(),
        files.key.display()
    );
    let password = "    downstream_auth_password: secret\n";
    let admin = admins.map(|a| a.to_string());
    let _a = announcing_sidecar(&addrs, ports[0], &ports, &tls, &["--admin", &admin[0]]);
    let b = announcing_sidecar(&addrs, ports[1], &ports, password, &["--admin", &admin[1]]);
    let ping = raw_command(b.addr, &["PING"]).expect("PING");
    assert!(ping.starts_with("-NOAUTH"), "PING without AUTH: {ping}");
    // On purpose: long enough for three failed checks of each (a peer that never answered is
    // checked every second, and would be out by now).
    std::thread::sleep(Duration::from_secs(4));
    for (admin, other) in [(admins[0], ports[1]), (admins[1], ports[0])] {
        assert_eq!(node_metric(admin, "up", other), "1", "{admin} sees {other}");
        assert_eq!(node_metric(admin, "changes_total", other), "0");
        let (_, clusters) = http_get(admin, "/clusters");
        let line = format!(
            "listener main cluster_emulation node 127.0.0.1:{other} state=up checked=yes changes=0"
        );
        assert!(clusters.contains(&line), "{clusters}");
    }
}

/// redis-py walks the cluster node by node (`scan_iter`, `KEYS` and `DBSIZE` on every primary,
/// `RANDOMKEY` per node): through two announced sidecars each key is listed and counted once,
/// as on a real Redis Cluster. So does a raw `SCAN` walk of each sidecar with small pages, and
/// `redis-cli --cluster info`.
#[test]
fn a_walk_node_by_node_lists_each_key_once() {
    require_redis_py();
    let (_shards, sidecars) = two_sidecars();
    let addrs: Vec<SocketAddr> = sidecars.iter().map(|s| s.addr).collect();
    for proto in ["default", "2"] {
        run_client(
            "python3",
            "py_cluster_walk.py",
            &addrs,
            &["--protocol", proto],
        );
    }
    // The script wrote 1,050 keys; each sidecar's walk gives those of its slots.
    let total = 1050;
    let mut walked: Vec<Vec<String>> = Vec::new();
    for (i, &a) in addrs.iter().enumerate() {
        let mut c = RespConn::connect(a);
        let mut keys = Vec::new();
        let mut cursor = "0".to_string();
        loop {
            let r = c.call(&["SCAN", &cursor, "COUNT", "10"]);
            let Resp::Array(Some(v)) = &r else {
                panic!("{r:?}")
            };
            let Resp::Array(Some(page)) = &v[1] else {
                panic!("{r:?}")
            };
            keys.extend(page.iter().map(Resp::text));
            cursor = v[0].text();
            if cursor == "0" {
                break;
            }
        }
        let range = if i == 0 { 0..=8191 } else { 8192..=16383 };
        for k in &keys {
            let slot = c.call(&["CLUSTER", "KEYSLOT", k]);
            let Resp::Int(slot) = slot else {
                panic!("{slot:?}")
            };
            assert!(range.contains(&slot), "{a} listed {k} of slot {slot}");
        }
        let Resp::Int(n) = c.call(&["DBSIZE"]) else {
            panic!("DBSIZE")
        };
        assert_eq!(n as usize, keys.len(), "{a}: DBSIZE and its SCAN walk");
        let Resp::Array(Some(all)) = c.call(&["KEYS", "*"]) else {
            panic!("KEYS")
        };
        assert_eq!(all.len(), keys.len(), "{a}: KEYS * and its SCAN walk");
        walked.push(keys);
    }
    let mut every: Vec<&String> = walked.iter().flatten().collect();
    assert_eq!(every.len(), total, "the two walks list each key once");
    every.sort();
    every.dedup();
    assert_eq!(every.len(), total);
    if have("redis-cli") {
        let out = std::process::Command::new("redis-cli")
            .args(["--cluster", "info", &addrs[0].to_string()])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("redis-cli");
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("redis-cli --cluster info:\n{text}");
        assert!(
            text.contains(&format!("[OK] {total} keys in 2 masters.")),
            "{text}"
        );
    }
}

/// The walk script itself, against a real Redis Cluster: what it expects is what Redis
/// Cluster does.
#[test]
fn redis_py_cluster_walk_script_against_a_real_cluster() {
    require_redis_py();
    let nodes = real_cluster();
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.addr).collect();
    run_client(
        "python3",
        "py_cluster_walk.py",
        &addrs,
        &["--protocol", "default"],
    );
}

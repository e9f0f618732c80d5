//! A fleet on one etcd: a real etcd, three `respway-xds serve --store` replicas, six sidecars
//! (the `respway` binary) spread over them by their `xds.servers` lists, two real shards.
//! An apply through one replica reaches every sidecar; `GET /status` through any replica lists
//! all six; a replica killed under load loses no request (its sidecars move on and get the next
//! apply); the reshard gate through one replica waits for a sidecar on another that does not ACK.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use respway_xds::server::ServerStatus;

use crate::support::*;

const TOKEN: &str = "fleet-test-token";
const SIDECARS: usize = 6;

/// One replica: its ADS port, admin port and process.
struct Replica {
    grpc: u16,
    admin: SocketAddr,
    proc: Proc,
}

fn replica(etcd: &Etcd, name: &str, dir: &Path) -> Replica {
    std::fs::create_dir_all(dir).unwrap();
    let token = dir.join(".admin-token");
    std::fs::write(&token, TOKEN).unwrap();
    let (grpc, admin) = (free_port(), free_port());
    let proc = Spawn::new(respway_xds_bin())
        .args(["serve", "--resources", dir.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{grpc}")])
        .args(["--admin", &format!("127.0.0.1:{admin}")])
        .args(["--store", &format!("etcd://{}/fleet", etcd.addr())])
        .args(["--replica", name])
        .env("RESPWAY_XDS_ADMIN_TOKEN_FILE", &token)
        .env("RUST_LOG", "warn")
        .on_port(admin)
        .start();
    wait_port(loopback(grpc), "a replica's ADS port");
    Replica {
        grpc,
        admin: loopback(admin),
        proc,
    }
}

/// `respway-xds apply` of `text` as `name` through `r`; the generation it answers.
fn apply(r: &Replica, work: &Path, name: &str, text: &str) -> u64 {
    let file = work.join(name);
    std::fs::write(&file, text).unwrap();
    std::fs::write(work.join("token"), TOKEN).unwrap();
    let out = std::process::Command::new(respway_xds_bin())
        .args(["apply", "--admin", &r.admin.to_string()])
        .arg(&file)
        .env("RESPWAY_XDS_ADMIN_TOKEN_FILE", work.join("token"))
        .output()
        .expect("respway-xds apply");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "apply {name}: {said}");
    status(r).version
}

fn status(r: &Replica) -> ServerStatus {
    let (code, body) = http_get(r.admin, "/status");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status JSON")
}

fn listener_file(node: &str, port: u16, prefix: Option<&str>) -> String {
    let prefixes = prefix.map_or(String::new(), |p| {
        format!(", prefixes: [{{ prefix: \"{p}\", cluster: c }}]")
    });
    format!(
        "targets: {{ node_ids: [{node}] }}\nlisteners:\n  - name: main\n    address: 127.0.0.1:{port}\n    routes: {{ catch_all: c{prefixes} }}\n"
    )
}

fn clusters_file(shards: &[SocketAddr], spare: bool) -> String {
    let mut y = String::from("clusters:\n  - name: c\n    shards:\n");
    for s in shards {
        y.push_str(&format!(
            "      - {{ endpoints: [{{ address: \"{s}\" }}] }}\n"
        ));
    }
    if spare {
        y.push_str(&format!(
            "  - name: spare\n    shards: [{{ endpoints: [{{ address: \"{}\" }}] }}]\n",
            shards[0]
        ));
    }
    y
}

/// A sidecar of node `node` whose servers are `replicas` in that order.
fn sidecar(work: &Path, node: &str, port: u16, replicas: &[u16]) -> Proc {
    let servers: Vec<String> = replicas
        .iter()
        .map(|g| format!("\"http://127.0.0.1:{g}\""))
        .collect();
    let boot = work.join(format!("{node}.bootstrap.yaml"));
    std::fs::write(
        &boot,
        format!(
            "node: {{ id: {node} }}\nxds:\n  servers: [{}]\n  keepalive: {{ interval: 1s, timeout: 1s }}\n",
            servers.join(", ")
        ),
    )
    .unwrap();
    Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--bootstrap", boot.to_str().unwrap(), "--workers", "1"])
        .env("RUST_LOG", "warn")
        .on_port(port)
        .start()
}

/// Whether node `id` holds generation `generation` in `s` (connected, caught up, every type it
/// was sent ACKed).
fn holds(s: &ServerStatus, id: &str, generation: u64) -> bool {
    s.nodes.iter().any(|n| {
        n.id == id
            && n.connected
            && n.generation >= generation
            && n.types.len() == 3
            && n.types
                .values()
                .all(|t| t.sent.is_some() && t.acked == t.sent)
    })
}

/// Waits until every sidecar holds `generation` as `r` sees the fleet; how long it took.
fn all_hold(r: &Replica, nodes: &[String], generation: u64, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let s = status(r);
        if nodes.iter().all(|n| holds(&s, n, generation)) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "not every sidecar holds generation {generation} through this replica: {:#?}",
            s.nodes
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_fleet_of_three_replicas_on_etcd_serves_six_sidecars() {
    let etcd = Etcd::start();
    let shards: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let work: PathBuf = std::env::temp_dir().join(format!("respway-fleet-{}", etcd.addr().port()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let start = |i: usize| replica(&etcd, &format!("r{i}"), &work.join(format!("r{i}")));
    let (r0, mut r1, r2) = (start(0), start(1), start(2));
    let grpc = [r0.grpc, r1.grpc, r2.grpc];
    let nodes: Vec<String> = (0..SIDECARS).map(|i| format!("s{i}")).collect();
    let ports: Vec<u16> = (0..SIDECARS).map(|_| free_port()).collect();

    // The files, through replica 0.
    apply(&r0, &work, "clusters.yaml", &clusters_file(&addrs, false));
    for (node, port) in nodes.iter().zip(&ports) {
        apply(
            &r0,
            &work,
            &format!("{node}.yaml"),
            &listener_file(node, *port, None),
        );
    }
    // Sidecar i starts on replica i % 3, then the next ones.
    let mut sidecars: Vec<Proc> = (0..SIDECARS)
        .map(|i| {
            let order: Vec<u16> = (0..3).map(|k| grpc[(i + k) % 3]).collect();
            sidecar(&work, &nodes[i], ports[i], &order)
        })
        .collect();
    let g = status(&r2).version;
    all_hold(&r2, &nodes, g, slack(Duration::from_secs(10)));
    // Replica 2 lists all six, each on the replica its stream is on.
    let s = status(&r2);
    for (i, n) in nodes.iter().enumerate() {
        let row = s.nodes.iter().find(|x| &x.id == n).unwrap();
        assert_eq!(
            row.replica.as_deref(),
            Some(format!("r{}", i % 3).as_str()),
            "{row:?}"
        );
    }

    // Its metrics say the same: two sidecars here, six in the fleet.
    let (code, metrics) = http_get(r2.admin, "/metrics");
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metrics.contains("\nrespway_xds_nodes_connected 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nrespway_xds_fleet_nodes_connected 6\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nrespway_xds_store_connected 1\n"),
        "{metrics}"
    );

    // An apply through replica 0 reaches all six; every replica numbers it alike.
    let g = apply(&r0, &work, "clusters.yaml", &clusters_file(&addrs, true));
    for (i, r) in [(1, &r1), (2, &r2)] {
        let start = Instant::now();
        while status(r).version < g {
            assert!(
                start.elapsed() < slack(Duration::from_secs(1)),
                "replica {i} is behind"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(status(r).version, g, "replica {i}: the same generation");
    }
    let took = all_hold(&r1, &nodes, g, slack(Duration::from_secs(1)));
    eprintln!("an apply through replica 0 was held by all six sidecars after at most {took:?} (as replica 1 sees it)");

    // Replica 1 killed under load on its two sidecars: they move on, no request fails, and
    // the next apply reaches them.
    let on_1: Vec<usize> = (0..SIDECARS).filter(|i| i % 3 == 1).collect();
    let loads: Vec<_> = on_1
        .iter()
        .map(|&i| set_get_load(loopback(ports[i]), 2, Duration::from_secs(60)))
        .collect();
    for l in &loads {
        l.wait_round_trips(50, "the load before replica 1 dies");
    }
    r1.proc.kill();
    let g = apply(&r0, &work, "clusters.yaml", &clusters_file(&addrs, false));
    all_hold(&r2, &nodes, g, slack(Duration::from_secs(15)));
    for l in &loads {
        l.wait_round_trips(50, "the load after replica 1 died");
    }
    let done: u64 = loads.into_iter().map(|l| l.finish()).sum();
    eprintln!("{done} checked round trips through replica 1's sidecars, none failed");
    let s = status(&r2);
    for &i in &on_1 {
        let row = s.nodes.iter().find(|x| x.id == nodes[i]).unwrap();
        assert_ne!(row.replica.as_deref(), Some("r1"), "{row:?}");
    }

    // The reshard gate through replica 0 waits for a sidecar on replica 2 that does not ACK.
    let stuck = 2; // s2 started on replica 2
    let row = s
        .nodes
        .iter()
        .find(|x| x.id == nodes[stuck])
        .unwrap()
        .clone();
    assert_eq!(row.replica.as_deref(), Some("r2"), "{row:?}");
    let pid = sidecars[stuck].pid().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let g = apply(
        &r0,
        &work,
        &format!("{}.yaml", nodes[stuck]),
        &listener_file(&nodes[stuck], ports[stuck], Some("x:")),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let auth = respway_xds::admin::AdminAuth::token(TOKEN);
    let gate = |timeout: Duration| {
        rt.block_on(respway_xds::reshard::acks::wait(
            &r0.admin.to_string(),
            &auth,
            g,
            timeout,
            &[],
        ))
    };
    match gate(Duration::from_secs(2)) {
        Err(respway_xds::reshard::acks::WaitError::Timeout(pending)) => {
            let ids: Vec<&str> = pending.iter().map(|(id, _)| id.as_str()).collect();
            assert_eq!(ids, [nodes[stuck].as_str()], "{pending:?}");
        }
        other => panic!("the gate did not wait for the stopped sidecar: {other:?}"),
    }
    signal("-CONT");
    let acked = gate(slack(Duration::from_secs(10))).expect("the gate opens once it ACKs");
    assert_eq!(acked, SIDECARS);
    drop(sidecars.drain(..));
    let _ = std::fs::remove_dir_all(&work);
}

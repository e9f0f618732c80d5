//! `compare` end to end on a tiny topology: two redis-server shards, a standalone
//! redis-server, nutcracker, respway, and respway fed by respway-xds with config pushes
//! during the runs — started, measured, and stopped again.
//!
//! The respway and respway-xds binaries are the workspace's own (`cargo test --workspace`
//! builds them next to this test), or `$RESPWAY_BIN` / `$RESPWAY_XDS_BIN`.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use respway_perf::compare::{compare, CompareOptions};
use respway_perf::plot::compare_plots;
use respway_perf::report::CompareResult;
use respway_perf::scenario::{Load, Scenario};
use respway_perf::topology::{self, RespwaySpec, TargetSpec, TopologySpec};
use respway_perf::workload::{Cmd, HotKeys, Workload};
use respway_perf::Control;

use crate::support::counting_children;
use respway_testkit::slack;

fn has_nutcracker() -> bool {
    respway_testkit::nutcracker_bin().is_some()
}

/// A workspace binary: `$ENV`, else the one built next to this test (`target/<profile>/`).
fn workspace_bin(name: &str, env: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/compare-HASH → target/<profile>/NAME
    let p = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        p.is_file(),
        "{} is not built: run the tests with `cargo test --workspace` (or build it with \
         `cargo build -p {name}`, or set {env})",
        p.display()
    );
    p
}

fn topology_spec(shards: usize, targets: Vec<TargetSpec>) -> TopologySpec {
    TopologySpec {
        shards,
        targets,
        respway: Some(workspace_bin("respway", "RESPWAY_BIN")),
        respway_xds: Some(workspace_bin("respway-xds", "RESPWAY_XDS_BIN")),
        ..TopologySpec::default()
    }
}

fn tiny(targets: Vec<TargetSpec>) -> Scenario {
    let mut sc = Scenario::new("tiny");
    sc.workload = Workload {
        keyspace: 500,
        commands: [(Cmd::Get, 4.0), (Cmd::Set, 1.0), (Cmd::Mget, 1.0)]
            .into_iter()
            .collect(),
        hot: Some(HotKeys {
            prefix: "HIGH_FREQ_".into(),
            share: 0.2,
            keys: 3,
        }),
        multi_keys: 3,
        ..Workload::default()
    };
    sc.load = Load {
        connections: 4,
        pipeline: 4,
        duration: Duration::from_millis(700),
        interval: Duration::from_millis(100),
        pool_requests: 4000,
        ..Load::default()
    };
    sc.rounds = 2;
    sc.warmup = Duration::from_millis(200);
    sc.preload = true;
    sc.topology = topology_spec(2, targets);
    sc
}

fn assert_closed(r: &CompareResult) {
    for t in &r.targets {
        let addr: SocketAddr = t.address.parse().unwrap();
        assert!(
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err(),
            "{} still listens on {addr} after compare returned",
            t.name
        );
    }
}

#[test]
fn compare_runs_end_to_end_on_a_tiny_topology() {
    // Counts this process's children, or starts some while another test counts them.
    let _children = counting_children();
    let mut targets = vec![TargetSpec::Redis { name: None }];
    if has_nutcracker() {
        targets.push(TargetSpec::Nutcracker { name: None });
    } else {
        eprintln!("nutcracker not installed: comparing without it");
    }
    targets.push(TargetSpec::Respway(RespwaySpec {
        name: Some("respway-hot".into()),
        hot_keys: vec!["HIGH_FREQ_".into()],
        ..RespwaySpec::default()
    }));
    let sc = tiny(targets);
    let r = compare(&sc, &CompareOptions::default(), &Control::new()).unwrap();
    assert_eq!(r.targets.len(), sc.topology.targets.len());
    assert_eq!(r.preloaded_keys, 503);
    for t in &r.targets {
        assert_eq!(t.rounds.len(), 2, "{}", t.name);
        assert!(t.throughput > 0.0, "{}", t.name);
        assert_eq!(
            t.summary.error_total, 0,
            "{}: {:?}",
            t.name, t.summary.errors
        );
        assert!(t.summary.latency.p50 > 0, "{}", t.name);
        assert!(t.shard_balance.is_some(), "{}", t.name);
        let executed: u64 = t.shard_commands.iter().sum();
        // at least every measured request reached a server (MGET/hot keys may fan out)
        assert!(
            executed >= t.summary.replies,
            "{}: {executed} < {}",
            t.name,
            t.summary.replies
        );
        match t.kind.as_str() {
            "redis" => {
                assert_eq!(t.shard_commands.len(), 1);
                assert!(t.proxy_cpu_s_per_m.is_none());
            }
            _ => {
                assert_eq!(t.shard_commands.len(), 2, "{}", t.name);
                assert!(t.proxy_cpu_s_per_m.is_some(), "{}", t.name);
            }
        }
        assert!(!t.summary.timeline.is_empty());
    }
    let text = r.text();
    assert!(
        text.contains("× redis") && text.contains("shard max/mean"),
        "{text}"
    );
    assert!(r.markdown().starts_with("| target | req/s |"));
    // JSON round trip and plots.
    let json = serde_json::to_string(&r).unwrap();
    let back: CompareResult = serde_json::from_str(&json).unwrap();
    assert_eq!(back.targets.len(), r.targets.len());
    let dir: PathBuf =
        std::env::temp_dir().join(format!("respway-perf-compare-{}", std::process::id()));
    let plots = compare_plots(&dir, &back).unwrap();
    for p in plots {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len > 1000 && len < 200_000, "{}: {len} bytes", p.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert_closed(&r);
}

/// Children of this process still alive (any thread's), by command name.
fn children_named(name: &str) -> usize {
    let mut n = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let kids = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for pid in kids.split_whitespace() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == name {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn a_failed_start_stops_what_it_started() {
    // Counts this process's children, or starts some while another test counts them.
    let _children = counting_children();
    // Two shards start, then respway cannot: both shards must be gone afterwards.
    let spec = TopologySpec {
        shards: 2,
        respway: Some(PathBuf::from("/nonexistent/respway")),
        targets: vec![TargetSpec::Respway(RespwaySpec::default())],
        ..TopologySpec::default()
    };
    assert_eq!(children_named("redis-server"), 0);
    let e = topology::start(&spec).unwrap_err().to_string();
    assert_eq!(e, "respway: /nonexistent/respway is not a file");
    assert_eq!(children_named("redis-server"), 0);
}

#[test]
fn replicas_start_synced_and_everything_stops_on_drop() {
    // Counts this process's children, or starts some while another test counts them.
    let _children = counting_children();
    if !has_nutcracker() {
        eprintln!("nutcracker not installed: skipped");
        return;
    }
    let spec = TopologySpec {
        shards: 1,
        replicas: 1,
        targets: vec![TargetSpec::Nutcracker { name: None }],
        ..TopologySpec::default()
    };
    let run = topology::start(&spec).unwrap();
    assert_eq!(run.shards.len(), 1);
    assert_eq!(run.shards[0].len(), 2, "primary + replica");
    let info = topology::command(run.shards[0][1], &[b"INFO", b"replication"]).unwrap();
    let respway_filters::resp::Frame::Bulk(info) = info else {
        panic!("INFO: {info:?}")
    };
    assert!(String::from_utf8_lossy(&info).contains("master_link_status:up"));
    let nut = run.targets[0].addr;
    assert_eq!(
        topology::command(nut, &[b"SET", b"k", b"v"]).unwrap(),
        respway_filters::resp::Frame::Simple("OK".into())
    );
    assert_eq!(children_named("redis-server"), 2);
    assert_eq!(children_named("nutcracker"), 1);
    drop(run);
    assert_eq!(children_named("redis-server"), 0);
    assert_eq!(children_named("nutcracker"), 0);
}

#[test]
fn config_pushes_reach_a_respway_xds_target_during_each_run() {
    // Counts this process's children, or starts some while another test counts them.
    let _children = counting_children();
    // respway-xds starts on shard 0 only; each run adds shard 1, then a hot-key rule.
    let mut sc = tiny(vec![
        TargetSpec::Respway(RespwaySpec::default()),
        TargetSpec::RespwayXds(RespwaySpec {
            shards: Some(1),
            ..RespwaySpec::default()
        }),
    ]);
    sc.load.duration = Duration::from_millis(1200);
    sc.config_pushes = serde_yaml_ng::from_str(
        "- { at: 300ms, shards: 2, label: add shard s1 }\n\
         - { at: 700ms, hot_keys: [HIGH_FREQ_] }\n",
    )
    .unwrap();
    sc.validate().unwrap();
    let r = compare(&sc, &CompareOptions::default(), &Control::new()).unwrap();
    let x = r.targets.iter().find(|t| t.kind == "respway-xds").unwrap();
    assert_eq!(x.summary.error_total, 0, "{:?}", x.summary.errors);
    assert_eq!(x.shard_commands.len(), 2);
    assert!(
        x.shard_commands[1] > 0,
        "the pushed shard got no commands: {:?}",
        x.shard_commands
    );
    // Two pushes per round, each changed something (so every round started from the base
    // configuration again) and was ACKed by the sidecar.
    let lines = r.push_lines().join("\n");
    assert_eq!(r.pushes.len(), 4, "{lines}");
    let mut last_version = 0;
    for (i, p) in r.pushes.iter().enumerate() {
        assert_eq!(p.target, "respway-xds");
        assert_eq!(p.round, 1 + i / 2);
        assert!(p.error.is_none(), "{lines}");
        assert!(
            p.ack_ms.is_some_and(
                |ms| ms > 0.0 && ms < slack(Duration::from_secs(10)).as_secs_f64() * 1e3
            ),
            "{lines}"
        );
        let v = p.version.unwrap();
        assert!(v > last_version, "{lines}");
        last_version = v;
        let (lo, hi) = if i % 2 == 0 { (0.3, 0.7) } else { (0.7, 1.2) };
        assert!(p.at_s >= lo && p.at_s < hi, "{lines}");
    }
    assert_eq!(r.pushes[0].label, "add shard s1");
    assert_eq!(r.pushes[1].label, "hot_keys [\"HIGH_FREQ_\"]");
    // Markers on the timeline: one per push, in time order, the second round's after the
    // first round's end.
    assert_eq!(r.markers.len(), 4);
    assert!(r.markers.windows(2).all(|w| w[0].t_s < w[1].t_s));
    assert!(r.markers[2].t_s > 1.0, "{:?}", r.markers);
    assert!(
        r.text().contains("push: respway-xds round 2 at"),
        "{}",
        r.text()
    );
    // The static respway target got no pushes and served both shards throughout.
    let plain = r.targets.iter().find(|t| t.kind == "respway").unwrap();
    assert_eq!(plain.summary.error_total, 0);
    assert!(plain.shard_commands.iter().all(|&c| c > 0));
    assert_closed(&r);
    assert_eq!(children_named("respway-xds"), 0);
    assert_eq!(children_named("respway"), 0);
}

#[test]
fn a_push_respway_refuses_is_reported_before_the_runs() {
    // Counts this process's children, or starts some while another test counts them.
    let _children = counting_children();
    let mut sc = tiny(vec![TargetSpec::RespwayXds(RespwaySpec::default())]);
    sc.config_pushes = serde_yaml_ng::from_str("- { at: 100ms, read_policy: sideways }\n").unwrap();
    let e = compare(&sc, &CompareOptions::default(), &Control::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("config_pushes[0]: respway-xds-push0: respway rejects its configuration:"),
        "{e}"
    );
    assert!(e.contains("read_policy"), "{e}");
    assert_eq!(children_named("redis-server"), 0);
    assert_eq!(children_named("respway-xds"), 0);
    assert_eq!(children_named("respway"), 0);
}

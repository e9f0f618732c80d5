//! The sidecar under a real management server: the `respway` binary started with a bootstrap
//! that points at `respway-xds`'s ADS server (run in this process through its library, on
//! loopback), while clients keep a bounded load going.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use respway_xds::server::{Server as Mgmt, ServerStatus};
use support::*;

/// A management server on fixed loopback ports, stoppable and restartable.
struct MgmtProc {
    server: Mgmt,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MgmtProc {
    fn start(dir: &Path, grpc: u16) -> MgmtProc {
        let server = Mgmt::new(dir).with_poll_interval(Duration::from_millis(100));
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let s = server.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut listener = None;
                for _ in 0..50 {
                    match tokio::net::TcpListener::bind(("127.0.0.1", grpc)).await {
                        Ok(l) => {
                            listener = Some(l);
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
                let _ = ready_tx.send(());
                let _ = s
                    .serve(listener.expect("bind the xDS port"), None, async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        ready_rx.recv().unwrap();
        MgmtProc {
            server,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn status(&self) -> ServerStatus {
        self.server.status()
    }

    fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MgmtProc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn resources(port: u16, shards: &[SocketAddr], shadow: SocketAddr, step: usize) -> String {
    churn_yaml(&format!("127.0.0.1:{port}"), shards, shadow, step)
}

/// Writes a resource file atomically (as an editor's save would end up).
fn save(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Waits until the node has ACKed the latest version of every type the server sent it, after
/// the server's snapshot version reached `min_version`. Returns how long it took.
fn wait_acked(m: &MgmtProc, node: &str, min_version: u64) -> Duration {
    let start = Instant::now();
    loop {
        let s = m.status();
        if s.version >= min_version {
            if let Some(n) = s.nodes.iter().find(|n| n.id == node) {
                if n.connected
                    && n.types.len() == 3
                    && n.types
                        .values()
                        .all(|t| t.sent.is_some() && t.acked == t.sent)
                {
                    return start.elapsed();
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "node {node} did not ACK version {min_version}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn bootstrap(dir: &Path, grpc: u16, static_yaml: Option<&str>) -> PathBuf {
    let mut y = format!(
        "node: {{ id: sidecar-1, zone: z1 }}\nxds: {{ server: \"http://127.0.0.1:{grpc}\" }}\n"
    );
    if let Some(s) = static_yaml {
        y.push_str("static_resources:\n");
        for l in s.lines() {
            y.push_str(&format!("  {l}\n"));
        }
    }
    let p = dir.join("bootstrap.yaml");
    std::fs::write(&p, y).unwrap();
    p
}

fn sidecar(bootstrap: &Path, port: u16) -> Proc {
    Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--bootstrap", bootstrap.to_str().unwrap(), "--workers", "2"])
        .env("RUST_LOG", "warn")
        .on_port(port)
        .start()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn xds_edits_under_load_fail_no_request() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let shadow = redis();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let (port, grpc) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("respway-xds-e2e-{port}"));
    let res = dir.join("resources");
    std::fs::create_dir_all(&res).unwrap();
    let initial = resources(port, &addrs, shadow.addr, 0);
    save(&res, "main.yaml", &initial);
    let mut mgmt = MgmtProc::start(&res, grpc);
    let boot = bootstrap(&dir, grpc, Some(&initial));
    let respway = sidecar(&boot, port);
    wait_acked(&mgmt, "sidecar-1", 1);

    let load = set_get_load(respway.addr, 4, Duration::from_secs(60));

    // 1. 50 edits: each is pushed and ACKed; time from save to ACK (reported, not asserted).
    let mut took = Vec::new();
    for step in 1..=50 {
        let v = mgmt.status().version;
        save(
            &res,
            "main.yaml",
            &resources(port, &addrs, shadow.addr, step),
        );
        took.push(wait_acked(&mgmt, "sidecar-1", v + 1));
    }
    took.sort();
    eprintln!(
        "xDS save-to-ACK over {} edits: p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took[took.len() - 1]
    );

    // 2. Moving the listener is refused by the management server itself (the sidecar could
    //    not take it): reported, not pushed.
    let v = mgmt.status().version;
    let moved = resources(free_port(), &addrs, shadow.addr, 0);
    save(&res, "main.yaml", &moved);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = mgmt.status();
        if s.errors
            .iter()
            .any(|e| e.contains("listener \"main\": address: changed from"))
        {
            assert_eq!(s.version, v, "not committed");
            break;
        }
        assert!(Instant::now() < deadline, "not refused: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    //    A change the sidecar cannot take (a second listener) is served, and NACKed by the
    //    sidecar naming the field; traffic goes on with the last good configuration.
    let added = resources(port, &addrs, shadow.addr, 0).replace(
        "clusters:\n",
        &format!(
            "  - name: extra\n    address: 127.0.0.1:{}\n    routes: {{ catch_all: main }}\nclusters:\n",
            free_port()
        ),
    );
    save(&res, "main.yaml", &added);
    let deadline = Instant::now() + Duration::from_secs(10);
    let nack = loop {
        let s = mgmt.status();
        let n = s.nodes.iter().find(|n| n.id == "sidecar-1").cloned();
        if let Some(nack) = n.and_then(|n| n.types.values().find_map(|t| t.nack.clone())) {
            if s.version > v {
                break nack;
            }
        }
        assert!(Instant::now() < deadline, "no NACK: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(nack.message.contains("listeners"), "{}", nack.message);
    std::thread::sleep(Duration::from_millis(300));

    // 3. The management server goes away during load, then comes back on the same port; the
    //    sidecar keeps serving, reconnects and takes the next version.
    mgmt.stop();
    std::thread::sleep(Duration::from_millis(1000));
    save(&res, "main.yaml", &resources(port, &addrs, shadow.addr, 5));
    let mgmt = MgmtProc::start(&res, grpc);
    wait_acked(&mgmt, "sidecar-1", 1);
    let v = mgmt.status().version;
    save(&res, "main.yaml", &resources(port, &addrs, shadow.addr, 6));
    wait_acked(&mgmt, "sidecar-1", v + 1);

    let n = load.finish();
    assert!(n > 500, "only {n} round trips");
    drop(respway);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sidecar_without_static_resources_waits_for_xds_and_restarts_from_bootstrap() {
    let shard = redis();
    let (port, grpc) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("respway-xds-boot-{port}"));
    let res = dir.join("resources");
    std::fs::create_dir_all(&res).unwrap();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:{port}\n    routes: {{ catch_all: c }}\nclusters:\n  - name: c\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
        shard.addr
    );
    save(&res, "main.yaml", &yaml);
    let mgmt = MgmtProc::start(&res, grpc);
    // No static resources: the listener comes from xDS.
    let boot = bootstrap(&dir, grpc, None);
    let p = sidecar(&boot, port);
    let mut c = sync_client(p.addr);
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut c).unwrap();
    drop(c);
    drop(p);
    drop(mgmt);
    // The server is gone: a sidecar with static resources in its bootstrap still starts.
    let boot = bootstrap(&dir, grpc, Some(&yaml));
    let p = sidecar(&boot, port);
    let mut c = sync_client(p.addr);
    let v: String = redis::cmd("GET").arg("k").query(&mut c).unwrap();
    assert_eq!(v, "v");
    let _ = std::fs::remove_dir_all(&dir);
}

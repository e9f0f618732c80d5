//! The sidecar under a real management server: the `respway` binary started with a bootstrap
//! that points at `respway-xds`'s ADS server (run in this process through its library, on
//! loopback), while clients keep a bounded load going.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::*;

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

/// `respway_config_changes_total{source="xds",outcome="applied"}` of a sidecar's admin endpoint.
fn xds_applies(admin: SocketAddr) -> u64 {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| {
            l.strip_prefix("respway_config_changes_total{source=\"xds\",outcome=\"applied\"} ")
        })
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Whether `m` has `node` connected now.
fn connected(m: &MgmtProc, node: &str) -> bool {
    m.status().nodes.iter().any(|n| n.id == node && n.connected)
}

#[test]
fn sidecar_fails_over_between_two_management_servers_under_load() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let shadow = redis();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let (port, admin_port) = (free_port(), free_port());
    let grpc = [free_port(), free_port()];
    let dir = std::env::temp_dir().join(format!("respway-xds-failover-{port}"));
    let res = dir.join("resources");
    std::fs::create_dir_all(&res).unwrap();
    let initial = resources(port, &addrs, shadow.addr, 0);
    save(&res, "main.yaml", &initial);
    // Two stateless servers over one directory, as a control plane spread over zones runs.
    let mut mgmt: Vec<Option<MgmtProc>> = grpc
        .iter()
        .map(|g| Some(MgmtProc::start(&res, *g)))
        .collect();
    let boot = dir.join("bootstrap.yaml");
    let mut y = format!(
        "node: {{ id: sidecar-1, zone: z1 }}\nxds:\n  servers: [\"http://127.0.0.1:{}\", \"127.0.0.1:{}\"]\nstatic_resources:\n",
        grpc[0], grpc[1]
    );
    for l in initial.lines() {
        y.push_str(&format!("  {l}\n"));
    }
    std::fs::write(&boot, y).unwrap();
    let admin = loopback(admin_port);
    let respway = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .args([
            "--bootstrap",
            boot.to_str().unwrap(),
            "--workers",
            "2",
            "--admin",
            &admin.to_string(),
        ])
        .env("RUST_LOG", "warn")
        .on_port(port)
        .start();
    // The first server listed is the one used; the other has not heard of the sidecar.
    wait_acked(mgmt[0].as_ref().unwrap(), "sidecar-1", 1);
    assert!(!connected(mgmt[1].as_ref().unwrap(), "sidecar-1"));
    wait_port(admin, "the sidecar's admin endpoint");
    assert_eq!(xds_applies(admin), 1, "the first xDS configuration");
    let versions = |m: &MgmtProc| -> Vec<Option<String>> {
        let s = m.status();
        let n = s.nodes.into_iter().find(|n| n.id == "sidecar-1").unwrap();
        n.types.into_values().map(|t| t.acked).collect()
    };
    let acked_on_first = versions(mgmt[0].as_ref().unwrap());

    let load = set_get_load(respway.addr, 4, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));

    // The active server goes away under load: the sidecar moves to the other one at once, which
    // sends the same versions (content hashes), so the sidecar ACKs without re-applying.
    let killed = Instant::now();
    mgmt[0].take().unwrap().stop();
    let other = mgmt[1].as_ref().unwrap();
    wait_acked(other, "sidecar-1", 1);
    let took = killed.elapsed();
    eprintln!("xDS failover: ACKed on the other server {took:?} after the first one stopped");
    assert!(took < Duration::from_secs(5), "failover took {took:?}");
    assert_eq!(versions(other), acked_on_first, "the same versions");
    assert_eq!(
        xds_applies(admin),
        1,
        "the same content is not applied again"
    );

    // The next edit (step 2: a prefix route to the shadow cluster, no hot-key rule) arrives
    // through the other server and is applied.
    save(&res, "main.yaml", &resources(port, &addrs, shadow.addr, 2));
    let deadline = Instant::now() + Duration::from_secs(10);
    while versions(other) == acked_on_first {
        assert!(Instant::now() < deadline, "the edit was not ACKed");
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_acked(other, "sidecar-1", 2);
    // (CDS and LDS both changed: each response may be its own apply.)
    assert!(xds_applies(admin) > 1, "the edit is applied");
    let mut c = sync_client(respway.addr);
    let _: () = redis::cmd("SET")
        .arg("side:failover")
        .arg("1")
        .query(&mut c)
        .unwrap();
    let mut direct = sync_client(shadow.addr);
    let got: Option<String> = redis::cmd("GET")
        .arg("side:failover")
        .query(&mut direct)
        .unwrap();
    assert_eq!(got.as_deref(), Some("1"), "the new route is in effect");

    // The first server comes back: the sidecar stays where it is (no flapping back).
    let back = MgmtProc::start(&res, grpc[0]);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(!connected(&back, "sidecar-1"));
    assert!(connected(mgmt[1].as_ref().unwrap(), "sidecar-1"));

    let n = load.finish();
    assert!(n > 200, "only {n} round trips");
    drop(back);
    drop(mgmt);
    drop(respway);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13, item 7: a sidecar reaches a TLS management server with its bootstrap's CA and
/// client certificate and gets its listener's password; a sidecar naming the same node id
/// with another node's certificate gets nothing (and says why), and never listens.
#[test]
fn secrets_reach_a_sidecar_over_mtls_only_with_its_own_certificate() {
    let shard = redis();
    let pki = respway_testkit::Pki::new("sidecar-mtls");
    let server_cert = pki.issue("xds", &["localhost"], false);
    let tls = respway_tls::ServerTls::server(
        "xds test",
        &respway_tls::ServerFiles {
            cert: server_cert.cert,
            key: server_cert.key,
            client_ca: Some(pki.ca()),
            require_client_cert: true,
        },
        &[b"h2"],
    )
    .expect("server tls");
    let (port, other_port, grpc) = (free_port(), free_port(), free_port());
    let dir = pki.dir().join("xds");
    let res = dir.join("resources");
    std::fs::create_dir_all(&res).unwrap();
    // One file per node (targeted by id), each with its listener and the cluster.
    let file = |port: u16, name: &str| {
        format!(
            "targets: {{ node_ids: [{name}] }}\nlisteners:\n  - name: {name}\n    address: 127.0.0.1:{port}\n    downstream_auth_password: s3cret\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
            shard.addr
        )
    };
    save(&res, "a.yaml", &file(port, "sidecar-a"));
    save(&res, "b.yaml", &file(other_port, "sidecar-b"));
    let mgmt = MgmtProc::start_with(
        &res,
        grpc,
        respway_xds::secure::Security {
            tls: Some(tls),
            ..Default::default()
        },
    );
    assert!(
        mgmt.status().errors.is_empty(),
        "{:?}",
        mgmt.status().errors
    );
    let bootstrap = |node: &str, cert: &respway_testkit::CertFiles| {
        let path = dir.join(format!(
            "{node}-{}.yaml",
            cert.cert.file_stem().unwrap().to_string_lossy()
        ));
        std::fs::write(
            &path,
            format!(
                "node: {{ id: {node} }}\nxds:\n  servers: [\"https://127.0.0.1:{grpc}\"]\n  tls: {{ ca: \"{}\", cert: \"{}\", key: \"{}\", server_name: localhost }}\n",
                pki.ca().display(),
                cert.cert.display(),
                cert.key.display()
            ),
        )
        .unwrap();
        path
    };
    // Its own certificate: configured, listening, and the password is the one served.
    let own = pki.issue("sidecar-a", &["sidecar-a"], false);
    let boot = bootstrap("sidecar-a", &own);
    let _a = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--bootstrap", boot.to_str().unwrap(), "--workers", "1"])
        .env("RUST_LOG", "warn")
        .on_port(port)
        .start();
    let mut c = RespConn::connect(loopback(port));
    match c.call(&["SET", "k", "v"]) {
        Resp::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.call(&["AUTH", "s3cret"]), Resp::Simple("OK".into()));
    assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    // Node sidecar-b's listener, asked for with sidecar-c's certificate: refused.
    let wrong = pki.issue("sidecar-c", &["sidecar-c"], false);
    let boot = bootstrap("sidecar-b", &wrong);
    let log = dir.join("sidecar-b.log");
    let mut b = std::process::Command::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--bootstrap", boot.to_str().unwrap(), "--workers", "1"])
        .env("RUST_LOG", "warn")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("PermissionDenied") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let listening = std::net::TcpStream::connect(loopback(other_port)).is_ok();
    let _ = b.kill();
    let _ = b.wait();
    assert!(
        text.contains("PermissionDenied") && text.contains("not valid for that node id"),
        "{text}"
    );
    assert!(
        !listening,
        "sidecar-b got no configuration, so it does not listen"
    );
    let refused = mgmt
        .status()
        .refusals
        .into_iter()
        .find(|r| r.claimed_node == "sidecar-b");
    assert!(refused
        .is_some_and(|r| r.message.contains("secrets")
            && r.certificate == Some(vec!["sidecar-c".to_string()])));
}

/// Issue 13, item 8: the sidecar's xDS wiring is the library's (`respway::xds::Feed`), so a
/// test drives it in process: the first configuration starts a server, and an edit of the
/// resource file reaches it through the same feed.
#[test]
fn the_xds_feed_starts_and_updates_an_in_process_server() {
    let shards: Vec<Proc> = (0..2).map(|_| redis()).collect();
    let shadow = redis();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let (port, grpc) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("respway-xds-feed-{port}"));
    let res = dir.join("resources");
    std::fs::create_dir_all(&res).unwrap();
    save(&res, "main.yaml", &resources(port, &addrs, shadow.addr, 0));
    let mgmt = MgmtProc::start(&res, grpc);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = respway_xds::client::AdsClientConfig::new(format!("127.0.0.1:{grpc}"), "feed-1");
        let events = std::sync::Arc::new(respway::admin::ConfigEvents::default());
        let mut feed = respway::xds::Feed::spawn(cfg, events, None);
        let first = tokio::time::timeout(Duration::from_secs(20), feed.first())
            .await
            .expect("a first configuration")
            .expect("the client runs");
        let server = respway::start(first, respway::Options::default()).expect("start");
        feed.attach(server.config_handle());
        assert_eq!(server.local_addrs()[0].port(), port);
        let applies = feed.status().applies;
        // An edit (the next churn step) is applied through the feed.
        save(&res, "main.yaml", &resources(port, &addrs, shadow.addr, 1));
        let deadline = Instant::now() + Duration::from_secs(20);
        while feed.status().applies <= applies {
            assert!(
                Instant::now() < deadline,
                "the edit never arrived: {:?}",
                feed.status()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = feed.status();
        assert!(s.connected && s.last_nack.is_none(), "{s:?}");
        let mut c = RespConn::connect(loopback(port));
        assert_eq!(c.call(&["SET", "feed", "1"]), Resp::Simple("OK".into()));
        server.shutdown();
    });
    drop(mgmt);
}

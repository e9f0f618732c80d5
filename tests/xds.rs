//! The sidecar under a real management server: the `respway` binary started with a bootstrap
//! that points at `respway-xds`'s ADS server (run in this process through its library, on
//! loopback), while clients keep a bounded load going.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::*;

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
    // Load runs on after the NACK: the last good configuration keeps serving.
    load.wait_round_trips(
        50,
        "round trips on the last good configuration after the NACK",
    );

    // 3. The management server goes away during load, then comes back on the same port; the
    //    sidecar keeps serving, reconnects and takes the next version.
    mgmt.stop();
    // The management server stays away for a second under load: the fault itself.
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
    // Load before the active server goes away.
    load.wait_round_trips(50, "the load to run before the failover");

    // The active server goes away under load: the sidecar moves to the other one at once, which
    // sends the same versions (content hashes), so the sidecar ACKs without re-applying.
    let killed = Instant::now();
    mgmt[0].take().unwrap().stop();
    let other = mgmt[1].as_ref().unwrap();
    wait_acked(other, "sidecar-1", 1);
    let took = killed.elapsed();
    eprintln!("xDS failover: ACKed on the other server {took:?} after the first one stopped");
    assert!(
        took < slack(Duration::from_secs(5)),
        "failover took {took:?}"
    );
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
    // Time for a move back to show, which none may.
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

/// `DIR/resources`, created, with one file: listener `l` on `port` routing everything to
/// cluster `main` of one shard at `shard`.
fn one_listener(dir: &Path, port: u16, shard: SocketAddr) -> PathBuf {
    let res = dir.join("resources");
    std::fs::create_dir_all(&res).unwrap();
    save(
        &res,
        "a.yaml",
        &format!(
            "listeners:\n  - name: l\n    address: 127.0.0.1:{port}\n    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    shards:\n      - endpoints: [ {{ address: \"{shard}\" }} ]\n"
        ),
    );
    res
}

/// Runs the `respway` binary on bootstrap `boot` (one worker, warnings on stderr to `log`, as
/// a sidecar that may never listen) until its log contains `until` or `limit` has passed,
/// then `meanwhile` (while it still runs), then stops it. Returns the log and what
/// `meanwhile` returned.
fn run_until_logged<R>(
    boot: &Path,
    log: &Path,
    until: &str,
    limit: Duration,
    meanwhile: impl FnOnce() -> R,
) -> (String, R) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--bootstrap", boot.to_str().unwrap(), "--workers", "1"])
        .env("RUST_LOG", "warn")
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    let text = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(until) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let r = meanwhile();
    let _ = child.kill();
    let _ = child.wait();
    (text, r)
}

/// A respway-xds on `grpc` serving `res` over TLS (certificate for `localhost`) that requires
/// a client certificate signed by `pki`'s CA.
fn mtls_mgmt(pki: &respway_testkit::Pki, res: &Path, grpc: u16) -> MgmtProc {
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
    MgmtProc::start_with(
        res,
        grpc,
        respway_xds::secure::Security {
            tls: Some(tls),
            ..Default::default()
        },
    )
}

/// Issue 26, item 9: a sidecar with no client certificate, against a management server that
/// requires one, logs the TLS alert that says why (not just "broken pipe").
#[test]
fn a_sidecar_without_a_client_certificate_logs_the_tls_alert() {
    let pki = respway_testkit::Pki::new("sidecar-nocert");
    let (port, grpc) = (free_port(), free_port());
    let dir = pki.dir().join("xds");
    let res = one_listener(&dir, port, "127.0.0.1:1".parse().unwrap());
    let _mgmt = mtls_mgmt(&pki, &res, grpc);
    let boot = dir.join("nocert.yaml");
    std::fs::write(
        &boot,
        format!(
            "node: {{ id: nocert }}\nxds:\n  servers: [\"https://127.0.0.1:{grpc}\"]\n  tls: {{ ca: \"{}\", server_name: localhost }}\n",
            pki.ca().display()
        ),
    )
    .unwrap();
    let (text, ()) = run_until_logged(
        &boot,
        &dir.join("nocert.log"),
        "keeping the last applied config",
        Duration::from_secs(15),
        || (),
    );
    assert!(
        text.contains("TLS alert from the server: certificate required"),
        "{text}"
    );
}

/// Issue 26, item 9: a management server that accepts the connection and then says nothing
/// (here: a socket nobody reads) holds the sidecar only `xds.keepalive.interval + timeout`
/// (1 s + 1 s here; 30 s + 10 s by default): its PING goes unanswered, the sidecar moves to
/// the next server, gets its configuration there and listens.
#[test]
fn a_silent_management_server_is_left_after_the_keepalive() {
    let shard = redis();
    let (port, grpc) = (free_port(), free_port());
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = std::env::temp_dir().join(format!("respway-xds-silent-{port}"));
    let res = one_listener(&dir, port, shard.addr);
    let _mgmt = MgmtProc::start(&res, grpc);
    let boot = dir.join("bootstrap.yaml");
    std::fs::write(
        &boot,
        format!(
            "node: {{ id: silent-1 }}\nxds:\n  servers: [\"http://{}\", \"http://127.0.0.1:{grpc}\"]\n  keepalive: {{ interval: 1s, timeout: 1s }}\n",
            silent.local_addr().unwrap()
        ),
    )
    .unwrap();
    // Listens only once configured, which only the second server does.
    let sidecar = sidecar(&boot, port);
    let log = sidecar.log();
    assert!(
        log.contains("keep-alive timed out")
            && log.contains(&format!(
                "server=\"http://{}\"",
                silent.local_addr().unwrap()
            )),
        "the silent server's failure is logged: {log}"
    );
    let mut c = RespConn::connect(loopback(port));
    assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
    drop(sidecar);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 13, item 7: a sidecar reaches a TLS management server with its bootstrap's CA and
/// client certificate and gets its listener's password; a sidecar naming the same node id
/// with another node's certificate gets nothing (and says why), and never listens.
#[test]
fn secrets_reach_a_sidecar_over_mtls_only_with_its_own_certificate() {
    let shard = redis();
    let pki = respway_testkit::Pki::new("sidecar-mtls");
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
    let mgmt = mtls_mgmt(&pki, &res, grpc);
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
    let (text, listening) = run_until_logged(
        &boot,
        &dir.join("sidecar-b.log"),
        "PermissionDenied",
        Duration::from_secs(30),
        || std::net::TcpStream::connect(loopback(other_port)).is_ok(),
    );
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
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
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

// === the sidecar against a scripted ADS server ===

use respway_xds::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use respway_xds::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use respway_xds::pb::google::protobuf::Any;
use std::sync::Mutex;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// An ADS server that sends what the test pushes (on the first stream) and reports every
/// request it gets.
struct Scripted {
    requests: mpsc::UnboundedSender<DiscoveryRequest>,
    pushes: Mutex<Option<mpsc::Receiver<DiscoveryResponse>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Scripted {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let mut pushes = self
            .pushes
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| tonic::Status::unavailable("one stream only"))?;
        let requests = self.requests.clone();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    req = inbound.message() => match req {
                        Ok(Some(r)) => { let _ = requests.send(r); }
                        _ => break,
                    },
                    push = pushes.recv() => match push {
                        Some(p) => if tx.send(Ok(p)).await.is_err() { break },
                        None => break,
                    },
                }
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream =
        ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("no delta"))
    }
}

/// The scripted server's end in the test: pushes, and the requests received so far (in
/// order of arrival).
struct Script {
    rt: tokio::runtime::Runtime,
    grpc: SocketAddr,
    push: mpsc::Sender<DiscoveryResponse>,
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    seen: Vec<DiscoveryRequest>,
}

impl Script {
    fn start() -> Script {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (push, pushes) = mpsc::channel(8);
        let (req_tx, requests) = mpsc::unbounded_channel();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let grpc = listener.local_addr().unwrap();
        let svc = Scripted {
            requests: req_tx,
            pushes: Mutex::new(Some(pushes)),
        };
        rt.spawn(tonic::transport::Server::builder().serve_with_incoming(
            AggregatedDiscoveryServiceServer::new(svc),
            tonic::transport::server::TcpIncoming::from(listener),
        ));
        Script {
            rt,
            grpc,
            push,
            requests,
            seen: Vec::new(),
        }
    }

    /// Queues a response of `type_url` with `nonce` (sent once the sidecar's stream is open).
    fn send<T: prost::Message + prost::Name>(
        &self,
        type_url: &str,
        version: &str,
        nonce: &str,
        items: &[T],
    ) {
        let resources = items
            .iter()
            .map(|m| Any {
                type_url: T::type_url(),
                value: m.encode_to_vec(),
            })
            .collect();
        let resp = DiscoveryResponse {
            version_info: version.into(),
            resources,
            type_url: type_url.into(),
            nonce: nonce.into(),
            ..Default::default()
        };
        self.rt.block_on(self.push.send(resp)).unwrap();
    }

    /// The position (among the requests received) and the request answering `nonce`; waits
    /// up to 10 s for it.
    fn answer_to(&mut self, nonce: &str) -> (usize, DiscoveryRequest) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = self.seen.iter().position(|r| r.response_nonce == nonce) {
                return (i, self.seen[i].clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let requests = &mut self.requests;
            let next = self
                .rt
                .block_on(async { tokio::time::timeout(left, requests.recv()).await });
            match next {
                Ok(Some(r)) => self.seen.push(r),
                _ => panic!("no answer to {nonce} in 10 s; got {:?}", self.seen),
            }
        }
    }
}

/// Issue 26, item 7: a cluster whose `ClusterLoadAssignment` never arrives is used with no
/// endpoints once `xds.initial_fetch_timeout` (1 s here) has passed, as Envoy does: the
/// listener routing to it applies, its keys get a clear `unavailable` error while the other
/// cluster's keys are served, the CDS response is ACKed at once (before the timeout, so
/// before the LDS ACK that waits for it), and a later LDS version is ACKed.
#[test]
fn a_cluster_whose_assignment_never_arrives_is_used_with_no_endpoints_after_the_timeout() {
    let good = redis();
    let port = free_port();
    let mut script = Script::start();
    let yaml = |op_timeout: &str| {
        format!(
            "listeners:\n  - name: main\n    address: 127.0.0.1:{port}\n    op_timeout: {op_timeout}\n    routes:\n      catch_all: good\n      prefixes:\n        - {{ prefix: \"never:\", cluster: never }}\nclusters:\n  - name: good\n    shards:\n      - endpoints: [ {{ address: \"{}\" }} ]\n  - name: never\n    shards:\n      - endpoints: [ {{ address: \"127.0.0.1:1\" }} ]\n",
            good.addr
        )
    };
    let r = respway_xds::parse_yaml(&yaml("2s")).expect("valid");
    let good_only: Vec<_> = r
        .endpoints
        .iter()
        .filter(|e| e.cluster_name == "good")
        .cloned()
        .collect();
    assert_eq!(good_only.len(), 1);
    script.send(respway_xds::CLUSTER_TYPE_URL, "v1", "c1", &r.clusters);
    script.send(respway_xds::ENDPOINT_TYPE_URL, "v1", "e1", &good_only);
    script.send(respway_xds::LISTENER_TYPE_URL, "v1", "l1", &r.listeners);

    let dir = std::env::temp_dir().join(format!("respway-xds-never-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let boot = dir.join("bootstrap.yaml");
    std::fs::write(
        &boot,
        format!(
            "node: {{ id: never-1 }}\nxds: {{ server: \"http://{}\", initial_fetch_timeout: 1s }}\n",
            script.grpc
        ),
    )
    .unwrap();
    // Listens only once the listener applied: after the timeout.
    let sidecar = sidecar(&boot, port);

    let (cds_at, cds) = script.answer_to("c1");
    let (lds_at, lds) = script.answer_to("l1");
    assert_eq!(
        (cds.version_info.as_str(), &cds.error_detail),
        ("v1", &None),
        "CDS is ACKed"
    );
    assert_eq!(
        (lds.version_info.as_str(), &lds.error_detail),
        ("v1", &None),
        "LDS is ACKed"
    );
    assert!(
        cds_at < lds_at,
        "CDS is answered at once, before the LDS ACK that waits for the timeout: {:?}",
        script.seen
    );

    let mut c = RespConn::connect(loopback(port));
    assert_eq!(c.call(&["SET", "k", "1"]), Resp::Simple("OK".into()));
    assert_eq!(
        RespConn::connect(good.addr).call(&["GET", "k"]),
        Resp::bulk("1")
    );
    match c.call(&["GET", "never:x"]) {
        Resp::Error(e) => assert!(
            e.contains("unavailable") && e.contains("no endpoints"),
            "{e}"
        ),
        other => panic!("expected an error for the cluster with no endpoints, got {other:?}"),
    }
    assert_eq!(
        c.call(&["GET", "k"]),
        Resp::bulk("1"),
        "the connection serves on"
    );
    let log = sidecar.log();
    assert!(
        log.contains("no ClusterLoadAssignment arrived in time") && log.contains("never"),
        "{log}"
    );

    // A later listener version is ACKed (it used to be NACKed while the assignment was
    // missing).
    let r2 = respway_xds::parse_yaml(&yaml("3s")).expect("valid");
    script.send(respway_xds::LISTENER_TYPE_URL, "v2", "l2", &r2.listeners);
    let (_, lds2) = script.answer_to("l2");
    assert_eq!(
        (lds2.version_info.as_str(), &lds2.error_detail),
        ("v2", &None),
        "{}",
        sidecar.log()
    );
    drop(sidecar);
    let _ = std::fs::remove_dir_all(&dir);
}

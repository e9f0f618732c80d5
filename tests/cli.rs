//! The binary's command line: `--version` with the commit, `--check`'s summary, log formats
//! (JSON lines; no ANSI colour when stderr is not a terminal), `--admin` and its loopback rule.

mod support;

use std::process::Command;

use support::*;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_respway"))
}

/// `respway --config PATH --check`.
fn check(path: &std::path::Path) -> std::process::Output {
    bin()
        .arg("--config")
        .arg(path)
        .arg("--check")
        .output()
        .expect("run")
}

#[test]
fn version_names_the_commit() {
    let out = bin().arg("--version").output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.starts_with(&format!("respway {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
}

#[test]
fn check_prints_a_one_line_summary() {
    let (a, b) = (redis(), redis());
    let dir = std::env::temp_dir().join(format!("respway-cli-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.yaml");
    std::fs::write(
        &path,
        sharded_yaml(&[a.addr, b.addr], "{ policy: maglev }", true),
    )
    .unwrap();
    let out = check(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "config OK: 1 listener, 1 cluster, 2 endpoints\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--check` loads every TLS file the configuration names: a missing listener certificate
/// or key, or a cluster CA, is reported by listener or cluster and field, exit 2 (the real
/// start would fail on it).
#[test]
fn check_reports_missing_tls_files_by_field() {
    let dir = std::env::temp_dir().join(format!("respway-cli-tls-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.yaml");
    let missing = |f: &str| dir.join(f).display().to_string();
    std::fs::write(
        &path,
        format!(
            "listeners:
  - name: edge
    address: 127.0.0.1:0
    tls: {{ cert: \"{}\", key: \"{}\" }}
    routes: {{ catch_all: main }}
clusters:
  - name: main
    tls: {{ ca: \"{}\" }}
    shards: [{{ endpoints: [{{ address: \"127.0.0.1:6379\" }}] }}]
",
            missing("no-cert.pem"),
            missing("no-key.pem"),
            missing("no-ca.pem")
        ),
    )
    .unwrap();
    let out = check(&path);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("config OK"));
    for (what, file) in [
        ("listener \"edge\": tls.cert", "no-cert.pem"),
        ("listener \"edge\": tls.key", "no-key.pem"),
        ("cluster \"main\": tls.ca", "no-ca.pem"),
    ] {
        assert!(
            err.lines().any(|l| l.contains(what) && l.contains(file)),
            "{what} {file}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_logs_are_one_object_per_line_without_colour() {
    let shard = redis();
    let admin = free_port();
    let admin_arg = format!("127.0.0.1:{admin}");
    let rw = respway_process(
        &sharded_yaml(&[shard.addr], "{ policy: maglev }", true),
        &["--log-format", "json", "--admin", &admin_arg],
    );
    wait_port(loopback(admin), "admin");
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["PING"]), Resp::Simple("PONG".into()));
    let log = rw.log();
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escapes in a log that is not a terminal: {log}"
    );
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.iter().any(|l| l.contains("listening")), "{log}");
    assert!(
        lines.iter().any(|l| l.contains("admin endpoint listening")),
        "{log}"
    );
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{l}");
    }
}

#[test]
fn a_non_loopback_admin_address_is_refused_by_name() {
    let shard = redis();
    let dir = std::env::temp_dir().join(format!("respway-cli-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.yaml");
    let yaml = sharded_yaml(&[shard.addr], "{ policy: maglev }", true)
        .replace("127.0.0.1:0", &format!("127.0.0.1:{}", free_port()));
    std::fs::write(&path, yaml).unwrap();
    let out = bin()
        .arg("--config")
        .arg(&path)
        .args(["--admin", "0.0.0.0:0", "--workers", "1"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--admin: admin address 0.0.0.0:0 is not loopback"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// POST /logging changes the log filter at run time; POST /drain stops the process as
/// SIGTERM does (every command answered, exit 0).
#[test]
fn admin_changes_the_log_level_and_drains() {
    let shard = redis();
    let admin = free_port();
    let admin_arg = format!("127.0.0.1:{admin}");
    let mut rw = respway_process(
        &sharded_yaml(&[shard.addr], "{ policy: maglev }", true),
        &["--admin", &admin_arg],
    );
    let admin = loopback(admin);
    wait_port(admin, "admin");
    // At info, a client leaving logs nothing; at debug it does.
    drop(RespConn::connect(rw.addr));
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !rw.log().contains("client connection ended"),
        "{}",
        rw.log()
    );
    assert_eq!(http(admin, "POST", "/logging?level=debug").0, 200);
    let (status, body) = http(admin, "POST", "/logging?level=nonsense=%3D");
    assert_eq!(status, 400, "{body}");
    assert_eq!(http(admin, "POST", "/logging").0, 400);
    {
        let mut c = RespConn::connect(rw.addr);
        // The first upstream request opens a connection, logged at debug.
        assert_eq!(c.call(&["GET", "k"]), Resp::Bulk(None));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !(rw.log().contains("log level changed") && rw.log().contains("DEBUG")) {
        assert!(std::time::Instant::now() < deadline, "{}", rw.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(http(admin, "POST", "/drain"), (200, "draining\n".into()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let status = loop {
        if let Some(s) = rw.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not stopped by POST /drain"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}: {}", rw.log());
    assert!(rw.log().contains("drain requested"), "{}", rw.log());
}

/// Configuration changes are counted by source and outcome, with the time of the last of
/// each, in /metrics: a refused SIGHUP reload and an applied one.
#[test]
fn config_changes_are_counted_in_metrics() {
    let shard = redis();
    let admin = free_port();
    let admin_arg = format!("127.0.0.1:{admin}");
    let yaml = sharded_yaml(&[shard.addr], "{ policy: maglev }", true);
    let rw = respway_process(&yaml, &["--admin", &admin_arg]);
    let admin = loopback(admin);
    wait_port(admin, "admin");
    let path = rw.config.clone().expect("config file");
    let served = std::fs::read_to_string(&path).unwrap();
    let metric = |name: &str| -> Option<String> {
        let (_, body) = http(admin, "GET", "/metrics");
        body.lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
    };
    let wait_for = |name: &str, want: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while metric(name).as_deref() != Some(want) {
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: {:?}",
                metric(name)
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    std::fs::write(&path, served.replace("op_timeout: 2s", "op_timeout: -1s")).unwrap();
    rw.signal("-HUP");
    wait_for(
        "respway_config_changes_total{source=\"file\",outcome=\"refused\"}",
        "1",
    );
    std::fs::write(&path, served.replace("op_timeout: 2s", "op_timeout: 3s")).unwrap();
    rw.signal("-HUP");
    wait_for(
        "respway_config_changes_total{source=\"file\",outcome=\"applied\"}",
        "1",
    );
    assert_eq!(metric("respway_config_version").as_deref(), Some("2"));
    assert!(metric(
        "respway_config_last_change_timestamp_seconds{source=\"file\",outcome=\"applied\"}"
    )
    .is_some());
}

/// A bootstrap's `node.zone` is the zone of its static resources (set over them by the
/// sidecar, as over every configuration from a file), and `--zone` overrides it: both show
/// in /config_dump.
#[test]
fn the_nodes_zone_applies_to_static_resources_and_zone_overrides_it() {
    let shard = redis();
    for (extra, want) in [(None, "z1"), (Some("z9"), "z9")] {
        let admin = free_port();
        let admin_arg = format!("127.0.0.1:{admin}");
        let boot = format!(
            "node: {{ id: a, zone: z1 }}\nstatic_resources:\n  listeners:\n    - name: l\n      address: 127.0.0.1:0\n      routes: {{ catch_all: c }}\n  clusters:\n    - name: c\n      shards:\n        - endpoints: [ {{ address: \"{}\" }} ]\n",
            shard.addr
        );
        let mut args = vec!["--workers", "1", "--admin", &admin_arg];
        if let Some(z) = extra {
            args.extend(["--zone", z]);
        }
        let _rw = Spawn::new(env!("CARGO_BIN_EXE_respway"))
            .config("--bootstrap", "boot.yaml", &boot)
            .args(&args)
            .start();
        let admin = loopback(admin);
        wait_port(admin, "admin");
        let (status, body) = http_get(admin, "/config_dump");
        assert_eq!(status, 200);
        assert!(body.contains(&format!("\"zone\": \"{want}\"")), "{body}");
    }
}

//! The binary's command line: `--version` with the commit, `--check`'s summary, log formats
//! (JSON lines; no ANSI colour when stderr is not a terminal), `--admin` and its loopback rule.

use std::net::SocketAddr;
use std::process::Command;

use crate::support::*;

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

/// `--check` names the mirrors whose clusters share primaries (shards reused when a cluster
/// grows), where copies are skipped; before, it said nothing about them (issue 29).
#[test]
fn check_names_mirrors_over_shared_primaries() {
    let (a, b, c) = (redis(), redis(), redis());
    let dir = std::env::temp_dir().join(format!("respway-cli-{}", free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.yaml");
    let shard = |x: std::net::SocketAddr| {
        format!("      - endpoints: [ {{ address: \"{x}\", role: primary }} ]\n")
    };
    std::fs::write(
        &path,
        format!(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: old\n      catch_all_mirrors:\n        - {{ cluster: new, mode: dual_write }}\nclusters:\n  - name: old\n    shards:\n{}{}  - name: new\n    shards:\n{}{}{}",
            shard(a.addr),
            shard(b.addr),
            shard(a.addr),
            shard(b.addr),
            shard(c.addr)
        ),
    )
    .unwrap();
    let out = check(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        format!(
            "config OK: 1 listener, 2 clusters, 5 endpoints\nnote: listener \"l\", catch_all: \
             clusters \"old\" and \"new\" share the primaries {}, {} (database 0); a write is \
             not copied to the Redis it already reached, so it runs once there\n",
            a.addr, b.addr
        )
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
    // Time for a log line to show, which none may at info.
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
        let dump: serde_yaml_ng::Value = serde_yaml_ng::from_str(&body).expect("YAML");
        assert_eq!(dump["node"]["zone"].as_str(), Some(want), "{body}");
    }
}

/// A configuration with every key of the schema (but `node.id`, which the model does not keep):
/// two listeners (one with a password, TLS and mirrors on prefix routes, one with ACL users and
/// a sole empty prefix), six clusters, one per hash policy, with hot keys, every read policy,
/// upstream auth (per endpoint too, from a file), TLS both ways, slots, weights and hash keys.
/// `main` is `a` and `b`; the other endpoints are free ports nothing listens on.
fn every_key_yaml(a: SocketAddr, b: SocketAddr, pki: &Pki, pw_file: &std::path::Path) -> String {
    let server = pki.issue("server", &["127.0.0.1"], false);
    let client = pki.issue("client", &["respway"], false);
    let p = || free_port();
    format!(
        r#"node: {{ id: n1, zone: z1 }}
listeners:
  - name: edge
    address: 127.0.0.1:0
    op_timeout: 250ms
    max_pending_per_client: 2048
    client_buffer_limit: 33554432
    client_buffer_hard_limit: 134217728
    client_stall_timeout: 2m
    max_auth_failures: 5
    allow_keyless_scripts: true
    allow_restricted_scripts: true
    admin_commands: true
    keys_max: 5000
    pubsub_buffer_limit: 1048576
    slowlog_threshold: 0us
    slowlog_max_len: 64
    hot_key_sample: 0
    protocol: resp3
    advertised_redis_version: "7.2.4"
    downstream_auth_password: client-secret
    limits: {{ max_bulk_len: 16777216, max_multibulk_len: 65536, max_inline_len: 16384 }}
    tls: {{ cert: "{cert}", key: "{key}", client_ca: "{ca}", require_client_cert: true }}
    routes:
      case_insensitive: true
      catch_all: main
      catch_all_mirrors:
        - {{ cluster: v2, mode: dual_write, fraction: 12.5 }}
      prefixes:
        - prefix: "up:"
          cluster: profile
          remove_prefix: true
          mirrors:
            - {{ cluster: v2, mode: dual_write, primary: mirror, include_reads: true, fraction: 0.0001 }}
        - prefix: "sess:"
          cluster: sessions
          mirrors:
            - {{ cluster: v2, mode: read_only }}
            - {{ cluster: main, mode: forward, include_reads: true, fraction: 50 }}
  - name: acl
    address: 127.0.0.1:{l2}
    slowlog_threshold: 1500us
    hot_key_sample: 7
    users:
      - {{ name: default, nopass: true, rules: "~public:* +@read" }}
      - {{ name: app, password: [app-secret-1, app-secret-2], rules: ["~app:*", "+@all", "-flushall"] }}
      - {{ name: ro, enabled: false, password_sha256: "{ro_hash}", read_only: true }}
    routes:
      prefixes:
        - {{ prefix: "", cluster: ring }}
clusters:
  - name: main
    hash: {{ policy: maglev, table_size: 251 }}
    connections_per_endpoint: 2
    max_queue_per_connection: 8192
    dedicated_connections: 8
    connect_timeout: 500ms
    auth: {{ username: respway, password: upstream-secret }}
    db: 2
    databases: 4
    read_policy: zone_local
    zone_fallback: any_replica
    hot_keys:
      - {{ prefix: HIGH_FREQ_, read: same_zone }}
      - {{ prefix: "cfg:" }}
    shards:
      - name: s0
        endpoints:
          - {{ address: "{a}", role: primary, zone: z1, auth: {{ password_file: "{pw}" }} }}
          - {{ address: 127.0.0.1:{r0}, role: replica, zone: z2 }}
      - name: s1
        weight: 2
        endpoints:
          - {{ address: 127.0.0.1:{r1}, role: replica, zone: z1, auth: {{ username: replica, password: endpoint-secret }} }}
          - {{ address: "{b}", role: primary, zone: z2, auth: {{ password: endpoint-secret }} }}
  - name: profile
    hash: {{ policy: ketama, key_hash: md5 }}
    hashtag: null
    read_policy: prefer_replica
    shards:
      - name: redis-a
        endpoints: [{{ address: 127.0.0.1:{k0} }}]
      - name: redis-b
        hash_key: legacy-b
        endpoints: [{{ address: 127.0.0.1:{k1} }}]
      - endpoints: [{{ address: 127.0.0.1:11211 }}]
  - name: sessions
    hash: {{ policy: crc16_slots }}
    hashtag: "::"
    shards:
      - slots: ["0-8191"]
        endpoints: [{{ address: 127.0.0.1:{c0} }}]
      - slots: ["8192-16382", 16383]
        endpoints: [{{ address: 127.0.0.1:{c1} }}]
  - name: ring
    hash: {{ policy: ring_hash, minimum_ring_size: 64, maximum_ring_size: 4096, function: murmur_hash_2 }}
    tls: {{ insecure_skip_verify: true }}
    shards:
      - endpoints: [{{ address: 127.0.0.1:{g0} }}]
      - endpoints: [{{ address: 127.0.0.1:{g1} }}]
  - name: v2
    hash: {{ policy: modula, key_hash: fnv1_32 }}
    read_policy: any
    hot_keys:
      - {{ prefix: HIGH_FREQ_, read: random }}
    shards:
      - name: m0
        weight: 3
        endpoints:
          - {{ address: 127.0.0.1:{m0}, role: primary, zone: z1 }}
          - {{ address: 127.0.0.1:{m1}, role: replica, zone: z2 }}
  - name: legacy
    hash: {{ policy: crc32_slots, slots: 128 }}
    tls: {{ ca: "{ca}", cert: "{ccert}", key: "{ckey}", server_name: redis.test }}
    shards:
      - endpoints: [{{ address: 127.0.0.1:{s0} }}]
      - endpoints: [{{ address: 127.0.0.1:{s1} }}]
"#,
        cert = server.cert.display(),
        key = server.key.display(),
        ca = pki.ca().display(),
        ccert = client.cert.display(),
        ckey = client.key.display(),
        pw = pw_file.display(),
        ro_hash = "ab".repeat(32),
        l2 = p(),
        r0 = p(),
        r1 = p(),
        k0 = p(),
        k1 = p(),
        c0 = p(),
        c1 = p(),
        g0 = p(),
        g1 = p(),
        m0 = p(),
        m1 = p(),
        s0 = p(),
        s1 = p(),
    )
}

/// `GET /config_dump` is the configuration served in the file's own language (issue 27, item
/// 7): the schema's keys and units, a leading `# version: N` comment, every secret as
/// `<redacted>`, served as `application/yaml`. With the secrets put back, `respway --check`
/// accepts it (TLS files included) and it loads to the very model the original file loads
/// to; `?format=json` is the same tree as JSON, with the version.
#[test]
fn config_dump_is_yaml_that_check_accepts_and_loads_to_the_same_model() {
    let (a, b) = (redis(), redis());
    let pki = Pki::new("dump");
    let pw_file = pki.dir().join("endpoint-password");
    std::fs::write(&pw_file, "endpoint-secret\n").unwrap();
    let admin = free_port();
    let admin_arg = format!("127.0.0.1:{admin}");
    let rw = respway_process(
        &every_key_yaml(a.addr, b.addr, &pki, &pw_file),
        &["--admin", &admin_arg],
    );
    let admin = loopback(admin);
    wait_port(admin, "admin");
    let original = rw.config.clone().expect("config file");

    let (status, body) = http_get(admin, "/config_dump");
    assert_eq!(status, 200, "{body}");
    for secret in [
        "client-secret",
        "app-secret",
        "upstream-secret",
        "endpoint-secret",
    ] {
        assert!(!body.contains(secret), "{secret} in /config_dump:\n{body}");
    }
    // The secrets, in the order the dump shows them: the listeners' (the password of `edge`,
    // the digests of `app` and `ro`), then the clusters' (`main`'s, then its endpoints').
    let hex =
        |p: &str| respway_filters::acl::digest_to_hex(&respway_filters::acl::sha256(p.as_bytes()));
    let secrets = [
        "client-secret".to_string(),
        hex("app-secret-1"),
        hex("app-secret-2"),
        "ab".repeat(32),
        "upstream-secret".to_string(),
        "endpoint-secret".to_string(),
        "endpoint-secret".to_string(),
        "endpoint-secret".to_string(),
    ];
    let mut restored = body.clone();
    for s in &secrets {
        restored = restored.replacen("<redacted>", s, 1);
    }
    let dumped = pki.dir().join("dump.yaml");
    std::fs::write(&dumped, &restored).unwrap();
    let out = check(&dumped);
    assert!(
        out.status.success(),
        "respway --check refused the dump: {}\n{restored}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("config OK: 2 listeners, 6 clusters"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        respway_xds::load_file(&dumped).expect("the dump loads"),
        respway_xds::load_file(&original).expect("the original loads"),
        "the dump:\n{restored}"
    );
    assert_eq!(body.matches("<redacted>").count(), secrets.len(), "{body}");
    assert!(body.starts_with("# version: 1\n"), "{body}");
    // The file's units and names, not the model's.
    for text in [
        "connect_timeout: 500ms",
        "client_stall_timeout: 2m",
        "policy: crc16_slots",
    ] {
        assert!(body.contains(text), "{text}:\n{body}");
    }

    let out = std::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "10"])
        .arg(format!("http://{admin}/config_dump"))
        .output()
        .expect("curl");
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.contains("content-type: application/yaml"), "{head}");

    let (status, json) = http_get(admin, "/config_dump?format=json");
    assert_eq!(status, 200, "{json}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["version"], 1);
    let yaml: serde_json::Value = serde_yaml_ng::from_str(&body).expect("YAML");
    assert_eq!(json["config"], yaml, "the JSON and the YAML differ");
}

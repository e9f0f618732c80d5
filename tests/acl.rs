//! ACL users and upstream credentials, end to end: real redis-server shards behind respway,
//! raw RESP and `redis` crate clients. Every refusal is checked for its exact error and, on
//! the shard itself, for the write that must not have happened.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

const NOPERM_KEY: &str = "NOPERM No permissions to access a key";
const NOAUTH: &str = "NOAUTH Authentication required.";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";
const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

/// One listener over one shard at `shard`, with `users` (YAML lines at the listener's
/// indentation) and `extra` listener fields.
fn yaml(shard: SocketAddr, extra: &str, users: &str) -> String {
    format!(
        "listeners:
  - name: main
    address: 127.0.0.1:0
    op_timeout: 2s
{extra}{users}    routes: {{ catch_all: main }}
clusters:
  - name: main
    connect_timeout: 500ms
    shards: [{{ endpoints: [{{ address: \"{shard}\" }}] }}]
"
    )
}

const USERS: &str = "    users:
      - { name: admin, password: adminpw }
      - { name: reader, password: readpw, read_only: true }
      - name: app
        password_sha256: 8d969eef6ecad3c29a3a629280e686cf0c3f5d5a86aff3ca12020c923adc6c92
        rules: [\"~app:*\", \"+@all\", \"-@dangerous\"]
      - { name: off, password: offpw, enabled: false }
      - { name: sub, nopass: true, rules: \"+subscribe +publish &news.* allkeys\" }
";

fn ok() -> Resp {
    Resp::Simple("OK".into())
}

fn err(r: &Resp) -> &str {
    r.error()
        .unwrap_or_else(|| panic!("expected an error, got {r:?}"))
}

fn authed(addr: SocketAddr, user: &str, pass: &str) -> RespConn {
    let mut c = RespConn::connect(addr);
    assert_eq!(c.call(&["AUTH", user, pass]), ok(), "AUTH {user}");
    c
}

fn exists(shard: SocketAddr, key: &str) -> bool {
    RespConn::connect(shard).call(&["EXISTS", key]) == Resp::Int(1)
}

#[test]
fn without_auth_nothing_is_served() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(err(&c.call(&["SET", "app:k", "v"])), NOAUTH);
    assert_eq!(err(&c.call(&["GET", "app:k"])), NOAUTH);
    assert_eq!(err(&c.call(&["ACL", "WHOAMI"])), NOAUTH);
    assert!(!exists(shard.addr, "app:k"));
    // No default user is defined: AUTH with a password alone names it, and fails.
    assert_eq!(err(&c.call(&["AUTH", "adminpw"])), WRONGPASS);
}

#[test]
fn wrong_password_unknown_user_and_disabled_user_are_one_error() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(err(&c.call(&["AUTH", "admin", "nope"])), WRONGPASS);
    assert_eq!(err(&c.call(&["AUTH", "nosuch", "adminpw"])), WRONGPASS);
    // The right password of a disabled user.
    assert_eq!(err(&c.call(&["AUTH", "off", "offpw"])), WRONGPASS);
    assert_eq!(err(&c.call(&["SET", "k", "v"])), NOAUTH);
    assert!(!exists(shard.addr, "k"));
    // The digest form and the plaintext form both authenticate.
    assert_eq!(c.call(&["AUTH", "app", "123456"]), ok());
    assert_eq!(c.call(&["AUTH", "admin", "adminpw"]), ok());
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    assert!(exists(shard.addr, "k"));
}

#[test]
fn a_read_only_user_cannot_write() {
    let shard = redis();
    RespConn::connect(shard.addr).call(&["SET", "k", "old"]);
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = authed(rw.addr, "reader", "readpw");
    assert_eq!(c.get("k"), Some(b"old".to_vec()));
    for cmd in [
        &["SET", "k", "new"][..],
        &["DEL", "k"],
        &["MSET", "k", "new", "k2", "v"],
    ] {
        let want = format!(
            "NOPERM User reader has no permissions to run the '{}' command",
            cmd[0].to_ascii_lowercase()
        );
        assert_eq!(err(&c.call(cmd)), want);
    }
    let mut s = RespConn::connect(shard.addr);
    assert_eq!(s.get("k"), Some(b"old".to_vec()));
    assert_eq!(s.call(&["EXISTS", "k2"]), Resp::Int(0));
}

#[test]
fn keys_outside_the_patterns_are_refused_also_in_multi_key_commands() {
    let shard = redis();
    RespConn::connect(shard.addr).call(&["SET", "secret", "s"]);
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = authed(rw.addr, "app", "123456");
    assert_eq!(c.call(&["SET", "app:1", "a"]), ok());
    assert_eq!(err(&c.call(&["GET", "secret"])), NOPERM_KEY);
    assert_eq!(err(&c.call(&["SET", "other", "x"])), NOPERM_KEY);
    assert_eq!(err(&c.call(&["MGET", "app:1", "secret"])), NOPERM_KEY);
    assert_eq!(
        err(&c.call(&["MSET", "app:2", "b", "other", "x"])),
        NOPERM_KEY
    );
    assert_eq!(err(&c.call(&["DEL", "app:1", "secret"])), NOPERM_KEY);
    assert_eq!(
        c.call(&["MGET", "app:1", "app:9"]),
        Resp::Array(Some(vec![Resp::bulk("a"), Resp::Bulk(None)]))
    );
    let mut s = RespConn::connect(shard.addr);
    assert_eq!(s.get("secret"), Some(b"s".to_vec()), "DEL did not reach it");
    assert_eq!(s.call(&["EXISTS", "other", "app:2"]), Resp::Int(0));
    assert_eq!(s.get("app:1"), Some(b"a".to_vec()));
}

#[test]
fn a_forbidden_key_or_command_in_multi_aborts_exec() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = authed(rw.addr, "app", "123456");
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(
        c.call(&["SET", "app:tx", "1"]),
        Resp::Simple("QUEUED".into())
    );
    assert_eq!(err(&c.call(&["SET", "other", "1"])), NOPERM_KEY);
    assert_eq!(err(&c.call(&["EXEC"])), EXECABORT);
    // A denied command (FLUSHALL is @dangerous) does the same.
    assert_eq!(c.call(&["MULTI"]), ok());
    assert_eq!(
        c.call(&["SET", "app:tx", "2"]),
        Resp::Simple("QUEUED".into())
    );
    assert_eq!(
        err(&c.call(&["FLUSHALL"])),
        "NOPERM User app has no permissions to run the 'flushall' command"
    );
    assert_eq!(err(&c.call(&["EXEC"])), EXECABORT);
    let mut s = RespConn::connect(shard.addr);
    assert_eq!(s.call(&["EXISTS", "app:tx", "other"]), Resp::Int(0));
    // A transaction within the patterns runs.
    assert_eq!(c.call(&["MULTI"]), ok());
    c.call(&["SET", "app:tx", "3"]);
    assert_eq!(c.call(&["EXEC"]), Resp::Array(Some(vec![ok()])));
    assert_eq!(s.get("app:tx"), Some(b"3".to_vec()));
}

#[test]
fn a_denied_category_refuses_flushall_and_keys() {
    let shard = redis();
    RespConn::connect(shard.addr).call(&["SET", "app:keep", "1"]);
    let rw = respway(&yaml(shard.addr, "    admin_commands: true\n", USERS), 1);
    let mut c = authed(rw.addr, "app", "123456");
    assert_eq!(
        err(&c.call(&["FLUSHALL"])),
        "NOPERM User app has no permissions to run the 'flushall' command"
    );
    assert_eq!(
        err(&c.call(&["KEYS", "*"])),
        "NOPERM User app has no permissions to run the 'keys' command"
    );
    assert_eq!(
        err(&c.call(&["CONFIG", "GET", "maxmemory"])),
        "NOPERM User app has no permissions to run the 'config|get' command"
    );
    assert!(exists(shard.addr, "app:keep"), "FLUSHALL did not run");
    // The admin may (admin_commands lets FLUSHALL through).
    let mut a = authed(rw.addr, "admin", "adminpw");
    assert_eq!(a.call(&["FLUSHALL"]), ok());
    assert!(!exists(shard.addr, "app:keep"));
}

#[test]
fn channels_follow_the_channel_patterns() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["AUTH", "sub", "anything"]), ok(), "nopass");
    assert_eq!(
        err(&c.call(&["PUBLISH", "other", "m"])),
        "NOPERM No permissions to access a channel"
    );
    assert_eq!(c.call(&["PUBLISH", "news.a", "m"]), Resp::Int(0));
    assert_eq!(
        err(&c.call(&["SUBSCRIBE", "news.a", "other"])),
        "NOPERM No permissions to access a channel"
    );
    assert_eq!(
        err(&c.call(&["GET", "k"])),
        "NOPERM User sub has no permissions to run the 'get' command"
    );
}

#[test]
fn acl_whoami_and_list_are_answered_locally() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = authed(rw.addr, "app", "123456");
    assert_eq!(c.call(&["ACL", "WHOAMI"]), Resp::bulk("app"));
    // ACL LIST is @dangerous: app may not; admin may.
    assert_eq!(
        err(&c.call(&["ACL", "LIST"])),
        "NOPERM User app has no permissions to run the 'acl|list' command"
    );
    let mut a = authed(rw.addr, "admin", "adminpw");
    assert_eq!(a.call(&["ACL", "WHOAMI"]), Resp::bulk("admin"));
    let list = a.call(&["ACL", "LIST"]);
    let lines: Vec<String> = match &list {
        Resp::Array(Some(v)) => v.iter().map(Resp::text).collect(),
        other => panic!("ACL LIST: {other:?}"),
    };
    assert_eq!(
        lines,
        [
            "user admin on #<redacted> ~* &* +@all",
            "user reader on #<redacted> ~* &* +@all -@write",
            "user app on #<redacted> ~app:* resetchannels +@all -@dangerous",
            "user off off #<redacted> ~* &* +@all",
            "user sub on nopass ~* resetchannels &news.* -@all +subscribe +publish",
        ]
    );
    for l in &lines {
        assert!(!l.contains("adminpw") && !l.contains("8d969eef"), "{l}");
    }
    assert!(err(&a.call(&["ACL", "SETUSER", "x", "on"]))
        .starts_with("ERR respway: ACL SETUSER is not supported"));
}

#[test]
fn hello_3_auth_authenticates_and_switches_protocol() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let mut c = RespConn::connect(rw.addr);
    let r = c.call(&["HELLO", "3", "AUTH", "reader", "nope"]);
    assert_eq!(err(&r), WRONGPASS);
    assert_eq!(err(&c.call(&["GET", "k"])), NOAUTH);
    let r = c.call(&["HELLO", "3", "AUTH", "reader", "readpw"]);
    assert!(matches!(r, Resp::Other(b'%', _)), "a RESP3 map: {r:?}");
    assert_eq!(c.call(&["ACL", "WHOAMI"]), Resp::bulk("reader"));
    assert_eq!(
        err(&c.call(&["SET", "k", "v"])),
        "NOPERM User reader has no permissions to run the 'set' command"
    );
    assert!(!exists(shard.addr, "k"));
}

#[test]
fn the_downstream_password_is_the_default_users_and_the_redis_crate_logs_in() {
    let shard = redis();
    let extra = "    downstream_auth_password: client-secret\n";
    let users = "    users: [{ name: reader, password: readpw, read_only: true }]\n";
    let rw = respway(&yaml(shard.addr, extra, users), 2);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(err(&c.call(&["SET", "k", "v"])), NOAUTH);
    assert_eq!(c.call(&["AUTH", "client-secret"]), ok());
    assert_eq!(c.call(&["ACL", "WHOAMI"]), Resp::bulk("default"));
    assert_eq!(c.call(&["SET", "k", "v"]), ok());
    // The redis crate with a username: AUTH reader readpw on connect.
    let client = redis::Client::open(format!("redis://reader:readpw@{}/", rw.addr)).unwrap();
    let mut rc = client.get_connection().unwrap();
    let v: String = redis::cmd("GET").arg("k").query(&mut rc).unwrap();
    assert_eq!(v, "v");
    let e = redis::cmd("SET")
        .arg("k")
        .arg("w")
        .query::<()>(&mut rc)
        .unwrap_err();
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
    assert_eq!(RespConn::connect(shard.addr).get("k"), Some(b"v".to_vec()));
}

#[test]
fn a_default_user_with_nopass_needs_no_auth_and_keeps_its_rules() {
    let shard = redis();
    let users = "    users:\n      - { name: default, nopass: true, rules: \"~pub:* +@read\" }\n      - { name: admin, password: adminpw }\n";
    let rw = respway(&yaml(shard.addr, "", users), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["GET", "pub:x"]), Resp::Bulk(None));
    assert_eq!(err(&c.call(&["GET", "x"])), NOPERM_KEY);
    assert_eq!(
        err(&c.call(&["SET", "pub:x", "1"])),
        "NOPERM User default has no permissions to run the 'set' command"
    );
    assert_eq!(c.call(&["AUTH", "admin", "adminpw"]), ok());
    assert_eq!(c.call(&["SET", "x", "1"]), ok());
    // RESET goes back to the default user and its rules.
    assert_eq!(c.call(&["RESET"]), Resp::Simple("RESET".into()));
    assert_eq!(err(&c.call(&["GET", "x"])), NOPERM_KEY);
}

/// `INFO proxy`'s field `name` through respway, as a number.
fn info_field(addr: SocketAddr, name: &str) -> u64 {
    let Resp::Bulk(Some(text)) = authed(addr, "admin", "adminpw").call(&["INFO", "proxy"]) else {
        panic!("INFO proxy")
    };
    let text = String::from_utf8(text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in INFO proxy: {text}"))
}

/// Failures from one address (every client of a sidecar comes from loopback) never lock out
/// the right password: past the global rate, failed attempts are answered late (a tarpit)
/// and counted; a correct password is answered at once.
#[test]
fn failed_auth_slows_the_guesser_but_never_refuses_the_right_password() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "    max_auth_failures: 100\n", USERS), 1);
    // 30 wrong passwords at once from 127.0.0.1, on 30 connections.
    let mut guessers: Vec<RespConn> = (0..30).map(|_| RespConn::connect(rw.addr)).collect();
    for g in &mut guessers {
        g.send(&["AUTH", "admin", "wrong"]);
    }
    // Meanwhile the application logs in from the same address, on a new connection.
    let mut app = RespConn::connect(rw.addr);
    assert_eq!(app.call(&["AUTH", "admin", "adminpw"]), ok());
    assert_eq!(app.call(&["SET", "k", "v"]), ok());
    for g in &mut guessers {
        assert_eq!(err(&g.read().expect("reply")), WRONGPASS);
    }
    // And on a connection that failed before.
    let g = &mut guessers[0];
    assert_eq!(g.call(&["AUTH", "admin", "adminpw"]), ok());
    assert!(exists(shard.addr, "k"));
    assert_eq!(info_field(rw.addr, "auth_failures"), 30);
    let slowed = info_field(rw.addr, "auth_tarpitted");
    assert!(
        (1..=30).contains(&slowed),
        "failures past the global rate are answered late: {slowed}"
    );
}

#[test]
fn the_per_connection_limit_still_closes_the_connection() {
    let shard = redis();
    let rw = respway(&yaml(shard.addr, "    max_auth_failures: 2\n", USERS), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(err(&c.call(&["AUTH", "admin", "x"])), WRONGPASS);
    c.send(&["AUTH", "admin", "y"]);
    let (bytes, _) = c.read_until_closed(Duration::from_secs(5));
    assert!(String::from_utf8_lossy(&bytes).starts_with("-WRONGPASS"));
}

/// A shard with `requirepass` and an ACL user `svc` (password `svcpw`, `~*` `+@all`).
fn guarded_shard() -> Proc {
    let s = redis_with(&["--requirepass", "shardpw"]);
    let mut c = RespConn::connect(s.addr);
    assert_eq!(c.call(&["AUTH", "shardpw"]), ok());
    assert_eq!(
        c.call(&["ACL", "SETUSER", "svc", "on", ">svcpw", "~*", "+@all"]),
        ok()
    );
    s
}

fn cluster_yaml(shard: SocketAddr, auth: &str, endpoint_auth: &str) -> String {
    format!(
        "listeners:
  - {{ name: main, address: 127.0.0.1:0, op_timeout: 2s, routes: {{ catch_all: main }} }}
clusters:
  - name: main
    connect_timeout: 500ms
{auth}    shards: [{{ endpoints: [{{ address: \"{shard}\"{endpoint_auth} }}] }}]
"
    )
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("respway-acl-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn upstream_password_from_a_file_and_from_an_environment_variable() {
    let shard = guarded_shard();
    let dir = scratch("pwfile");
    let file = dir.join("shard.pw");
    std::fs::write(&file, "shardpw\n").unwrap();
    let auth = format!("    auth: {{ password_file: \"{}\" }}\n", file.display());
    let rw = respway(&cluster_yaml(shard.addr, &auth, ""), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "from-file", "1"]), ok());
    drop(rw);

    // An ACL user's password from the environment of the respway binary.
    let dir2 = scratch("pwenv");
    let port = free_port();
    let yaml = cluster_yaml(
        shard.addr,
        "    auth: { username: svc, password_env: RESPWAY_TEST_SHARD_PW }\n",
        "",
    )
    .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    let cfg = dir2.join("respway.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let p = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--config", cfg.to_str().unwrap()])
        .env("RESPWAY_TEST_SHARD_PW", "svcpw")
        .env("RUST_LOG", "warn")
        .on_port(port)
        .start();
    let mut c = RespConn::connect(p.addr);
    assert_eq!(c.call(&["SET", "from-env", "1"]), ok());
    let mut s = RespConn::connect(shard.addr);
    s.call(&["AUTH", "shardpw"]);
    assert_eq!(s.call(&["EXISTS", "from-file", "from-env"]), Resp::Int(2));
    // The upstream saw the user: its CLIENT LIST shows respway's connection as svc.
    let list = s.call(&["CLIENT", "LIST"]).text();
    assert!(list.contains("user=svc"), "{list}");
    assert!(!p.log().contains("svcpw"), "the password is never logged");
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(dir2);
}

#[test]
fn a_missing_password_file_or_variable_names_the_field() {
    let shard = redis();
    let auth = "    auth: { password_file: /nonexistent/respway.pw }\n";
    let e = respway_xds::parse_yaml(&cluster_yaml(shard.addr, auth, ""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cluster \"main\": auth.password_file: cannot read \"/nonexistent/respway.pw\""),
        "{e}"
    );
    let auth = "    auth: { password_env: RESPWAY_TEST_NO_SUCH_VARIABLE }\n";
    let e = respway_xds::parse_yaml(&cluster_yaml(shard.addr, auth, ""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "auth.password_env: environment variable RESPWAY_TEST_NO_SUCH_VARIABLE is not set"
        ),
        "{e}"
    );
}

#[test]
fn an_endpoints_own_credentials_override_the_clusters() {
    let shard = guarded_shard();
    // The cluster's password is wrong for this shard; the endpoint's own is right.
    let auth = "    auth: { password: wrong }\n";
    let ep = ", auth: { username: svc, password: svcpw }";
    let rw = respway(&cluster_yaml(shard.addr, auth, ep), 1);
    let mut c = RespConn::connect(rw.addr);
    assert_eq!(c.call(&["SET", "ep", "1"]), ok());
    // The configuration dump shows no password.
    let config = respway_xds::translate(
        &respway_xds::parse_yaml(&cluster_yaml(shard.addr, auth, ep)).unwrap(),
    )
    .unwrap();
    let dump = respway_xds::config_dump(&config, true).to_yaml(1);
    assert!(!dump.contains("svcpw") && !dump.contains("wrong"), "{dump}");
}

// === over xDS ===

#[test]
fn users_pushed_over_ads_are_enforced() {
    let shard = redis();
    let (port, grpc) = (free_port(), free_port());
    let dir = scratch("ads");
    let res = dir.join("resources");
    std::fs::create_dir_all(&res).unwrap();
    let users = "    users:
      - { name: app, password: apppw, rules: [\"~app:*\", \"+@all\"] }
";
    let y = yaml(shard.addr, "", users).replace("127.0.0.1:0", &format!("127.0.0.1:{port}"));
    std::fs::write(res.join("main.yaml"), &y).unwrap();
    // Plaintext on loopback: the users' password digests go to any node here (the rule
    // that keeps them to the node's own certificate is tested in tests/xds.rs).
    let _mgmt = MgmtProc::start_with(
        &res,
        grpc,
        respway_xds::secure::Security {
            secrets_to_unauthenticated: true,
            ..Default::default()
        },
    );
    let boot = dir.join("bootstrap.yaml");
    std::fs::write(
        &boot,
        format!("node: {{ id: sidecar-1 }}\nxds: {{ server: \"http://127.0.0.1:{grpc}\" }}\n"),
    )
    .unwrap();
    let p = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--bootstrap", boot.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .on_port(port)
        .start();
    let mut c = RespConn::connect(p.addr);
    assert_eq!(err(&c.call(&["SET", "app:1", "v"])), NOAUTH);
    assert_eq!(err(&c.call(&["AUTH", "app", "wrong"])), WRONGPASS);
    assert_eq!(c.call(&["AUTH", "app", "apppw"]), ok());
    assert_eq!(c.call(&["SET", "app:1", "v"]), ok());
    assert_eq!(err(&c.call(&["SET", "other", "v"])), NOPERM_KEY);
    assert!(exists(shard.addr, "app:1") && !exists(shard.addr, "other"));

    // A changed rule reaches the connected session (same user, new permissions).
    let y2 = y.replace("\"~app:*\", \"+@all\"", "\"~app:*\", \"+@all\", \"-set\"");
    let tmp = res.join(".main.yaml.tmp");
    std::fs::write(&tmp, &y2).unwrap();
    std::fs::rename(&tmp, res.join("main.yaml")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c.call(&["SET", "app:2", "v"]);
        if r.is_error() {
            assert_eq!(
                err(&r),
                "NOPERM User app has no permissions to run the 'set' command"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the new rules never arrived");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A script runs on the shard with the upstream user's rights, so Redis cannot hold a
/// restricted user to its rules inside it: respway refuses scripts to such users (the
/// read-only user, a user with key patterns), and nothing is written on the shard.
#[test]
fn a_restricted_user_cannot_write_through_a_script() {
    let shard = redis();
    let mut s = RespConn::connect(shard.addr);
    let set = "return redis.call('set', KEYS[1], 'x')";
    let set_secret = "return redis.call('set', 'secret', 'x')";
    let Resp::Bulk(Some(sha)) = s.call(&["SCRIPT", "LOAD", set]) else {
        panic!("SCRIPT LOAD")
    };
    let sha = String::from_utf8(sha).unwrap();
    assert_eq!(
        s.call(&[
            "FUNCTION",
            "LOAD",
            "#!lua name=w\nredis.register_function('wf', function(k) return redis.call('set', k[1], 'x') end)",
        ]),
        Resp::Bulk(Some(b"w".to_vec()))
    );
    let rw = respway(&yaml(shard.addr, "", USERS), 1);
    let script_refused = |user: &str, r: &Resp| {
        let e = err(r);
        assert!(
            e.starts_with(&format!("NOPERM User {user} may not run scripts")),
            "{e}"
        );
    };
    let mut ro = authed(rw.addr, "reader", "readpw");
    script_refused("reader", &ro.call(&["EVAL", set, "1", "app:b"]));
    script_refused("reader", &ro.call(&["EVALSHA", &sha, "1", "app:b"]));
    script_refused("reader", &ro.call(&["FCALL", "wf", "1", "app:b"]));
    // A key inside the patterns, a script that writes outside them.
    let mut app = authed(rw.addr, "app", "123456");
    script_refused("app", &app.call(&["EVAL", set_secret, "1", "app:b"]));
    script_refused("app", &app.call(&["EVAL_RO", "return 1", "1", "app:b"]));
    // Inside MULTI the refusal aborts the transaction.
    assert_eq!(app.call(&["MULTI"]), ok());
    script_refused("app", &app.call(&["EVAL", set, "1", "app:b"]));
    assert_eq!(err(&app.call(&["EXEC"])), EXECABORT);
    for key in ["app:b", "secret"] {
        assert!(!exists(shard.addr, key), "{key} was written");
    }
    // A read-only script of a read-only user with every key is safe: Redis refuses writes
    // in it.
    s.call(&["SET", "app:c", "v"]);
    assert_eq!(
        ro.call(&["EVAL_RO", "return redis.call('get', KEYS[1])", "1", "app:c"]),
        Resp::Bulk(Some(b"v".to_vec()))
    );
    // An unrestricted user runs scripts as before.
    let mut admin = authed(rw.addr, "admin", "adminpw");
    assert_eq!(admin.call(&["EVAL", set, "1", "app:b"]), ok());
    assert!(exists(shard.addr, "app:b"));
}

/// `allow_restricted_scripts: true` lets restricted users run scripts again (the script has
/// the upstream user's rights; documented).
#[test]
fn a_listener_can_opt_in_to_scripts_for_restricted_users() {
    let shard = redis();
    let rw = respway(
        &yaml(shard.addr, "    allow_restricted_scripts: true\n", USERS),
        1,
    );
    let mut app = authed(rw.addr, "app", "123456");
    assert_eq!(
        app.call(&[
            "EVAL",
            "return redis.call('set', KEYS[1], 'x')",
            "1",
            "app:b"
        ]),
        ok()
    );
    // The declared keys are still checked.
    assert_eq!(
        err(&app.call(&["EVAL", "return 1", "1", "other"])),
        NOPERM_KEY
    );
    assert!(exists(shard.addr, "app:b"));
}

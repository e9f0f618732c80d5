//! The record of the keys dual-write copies touched, through the sidecar's admin endpoint
//! (`GET /mirror`, `GET /mirror/keys`), against real redis-servers and the `respway` binary:
//! the keys written are listed hex-encoded, `since=` a cursor lists only the later ones, the
//! record survives a SIGHUP that keeps the dual write and is gone after one that stops it;
//! and the sidecar's admin address reaches `respway-xds`'s `GET /status` through its
//! `node.metadata`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

/// One listener (`catch_all: old`; keyless scripts and `FLUSHALL` let through) with `mirrors`
/// over two one-shard clusters.
fn yaml(old: SocketAddr, new: SocketAddr, mirrors: &str) -> String {
    format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 2s\n    allow_keyless_scripts: true\n    admin_commands: true\n    routes:\n      catch_all: old\n      catch_all_mirrors:\n{mirrors}clusters:\n  - name: old\n    shards:\n      - endpoints: [ {{ address: \"{old}\", role: primary }} ]\n  - name: new\n    shards:\n      - endpoints: [ {{ address: \"{new}\", role: primary }} ]\n"
    )
}

const DUAL_WRITE: &str = "        - { cluster: new, mode: dual_write }\n";

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `key=value` fields of the `/mirror` line of `cluster` (`None`: no line).
fn mirror_line(admin: SocketAddr, cluster: &str) -> Option<Vec<(String, String)>> {
    let (status, body) = http_get(admin, "/mirror");
    assert_eq!(status, 200, "{body}");
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("cluster {cluster} ")))?;
    Some(
        line.split(' ')
            .skip(2)
            .map(|f| {
                let (k, v) = f.split_once('=').unwrap_or_else(|| panic!("{line}"));
                (k.to_string(), v.to_string())
            })
            .collect(),
    )
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `GET /mirror/keys?...`: the status, the first line's fields and the keys (hex) listed.
fn keys(admin: SocketAddr, query: &str) -> (u16, Vec<String>, BTreeSet<String>) {
    let (status, body) = http_get(admin, &format!("/mirror/keys?{query}"));
    let mut lines = body.lines();
    let head = lines
        .next()
        .unwrap_or_default()
        .split(' ')
        .map(str::to_string)
        .collect();
    (status, head, lines.map(str::to_string).collect())
}

/// Until `/mirror` shows every copy to `new` applied: its fields then.
fn applied(admin: SocketAddr, copies: u64) -> Vec<(String, String)> {
    let mut last = None;
    wait_for("the copies to be applied", || {
        last = mirror_line(admin, "new");
        last.as_ref().is_some_and(|f| {
            field(f, "mirrored") == Some(&copies.to_string())
                && field(f, "applied") == Some(&copies.to_string())
        })
    });
    last.unwrap()
}

/// Edits the served config file and SIGHUPs; waits until version `version` serves.
fn reload(rw: &Proc, admin: SocketAddr, edit: impl FnOnce(String) -> String, version: u64) {
    let path = rw.config.clone().expect("config file");
    let served = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(served)).unwrap();
    rw.signal("-HUP");
    wait_for("the reloaded configuration", || {
        let (_, body) = http_get(admin, "/metrics");
        body.lines()
            .any(|l| l == format!("respway_config_version {version}"))
    });
}

/// Writes through several connections (spread over both workers) and checks what the record
/// lists: every key a write copy touched, once, hex-encoded; reads are not listed; `since=`
/// the cursor lists only the keys written after it; a SIGHUP that keeps the dual write keeps
/// the record (same id, same keys, cursors still good, new writes recorded into it); one that
/// turns the mirror to `forward` drops it (404), and a later dual write starts a new one.
#[test]
fn the_record_lists_the_keys_dual_write_copied_across_pushes() {
    let (old, new) = (redis(), redis());
    let admin = loopback(free_port());
    let rw = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .config(
            "--config",
            "respway.yaml",
            &yaml(old.addr, new.addr, DUAL_WRITE),
        )
        .args(["--workers", "2", "--admin", &admin.to_string()])
        .start();
    wait_port(admin, "admin");
    // Nothing written yet: the record exists, empty, and `old` receives nothing.
    let empty = mirror_line(admin, "new").expect("a line for new");
    assert_eq!(field(&empty, "keys"), Some("0"));
    assert_eq!(field(&empty, "mirrored"), Some("0"));
    assert!(mirror_line(admin, "old").is_none());
    let id = field(&empty, "record").expect("a record").to_string();
    assert_eq!(id.len(), 16);

    let mut written = BTreeSet::new();
    let mut writes = 0u64;
    for c in 0..4 {
        let mut conn = sync_client(rw.addr);
        for i in 0..10 {
            let k = format!("k{}", (c * 7 + i) % 25);
            let _: () = redis::cmd("SET").arg(&k).arg(i).query(&mut conn).unwrap();
            let _: Option<String> = redis::cmd("GET").arg("read-only").query(&mut conn).unwrap();
            written.insert(k);
            writes += 1;
        }
        let _: () = redis::cmd("MSET")
            .arg(format!("m{c}"))
            .arg(1)
            .arg("k0")
            .arg(2)
            .query(&mut conn)
            .unwrap();
        written.extend([format!("m{c}"), "k0".to_string()]);
        writes += 1;
    }
    let f = applied(admin, writes);
    assert_eq!(field(&f, "record"), Some(id.as_str()));
    assert_eq!(field(&f, "failed"), Some("0"));
    assert_eq!(field(&f, "dropped"), Some("0"));
    assert_eq!(field(&f, "overflowed"), Some("0"));
    assert_eq!(field(&f, "incomplete"), Some("0"));
    // Distinct keys, though a key written through both workers is held by both parts.
    assert_eq!(field(&f, "keys"), Some(written.len().to_string().as_str()));

    let want: BTreeSet<String> = written.iter().map(|k| hex(k)).collect();
    let (status, head, listed) = keys(admin, "cluster=new");
    assert_eq!(status, 200, "{head:?}");
    assert_eq!(head[0..2], ["record", &id]);
    assert_eq!(head[2], "cursor");
    assert_eq!(head[4..], ["overflowed", "0", "incomplete", "0"]);
    let cursor = head[3].clone();
    assert!(cursor.starts_with(&format!("{id}:")), "{cursor}");
    assert_eq!(cursor.split(':').nth(1).unwrap().split('.').count(), 2);
    assert_eq!(listed, want);
    assert!(!listed.contains(&hex("read-only")));

    // Written after the cursor: only those (one old key again, one new).
    let mut conn = sync_client(rw.addr);
    let _: () = redis::cmd("SET")
        .arg("k3")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("late")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    writes += 2;
    let (status, head, listed) = keys(admin, &format!("cluster=new&since={cursor}"));
    assert_eq!(status, 200);
    assert_eq!(listed, BTreeSet::from([hex("k3"), hex("late")]));
    let cursor2 = head[3].clone();
    // Percent-encoded, as a client may send it.
    let (status, _, listed) = keys(
        admin,
        &format!("cluster=new&since={}", url_encode(&cursor2)),
    );
    assert_eq!(status, 200);
    assert!(listed.is_empty(), "{listed:?}");

    // Refusals: a cursor of another record, a malformed one, clusters without a record.
    let other = format!("{:016x}:0.0", u64::from_str_radix(&id, 16).unwrap() ^ 1);
    assert_eq!(keys(admin, &format!("cluster=new&since={other}")).0, 409);
    assert_eq!(keys(admin, "cluster=new&since=nonsense").0, 400);
    assert_eq!(keys(admin, &format!("cluster=new&since={id}:1")).0, 400);
    assert_eq!(keys(admin, "cluster=old").0, 404);
    assert_eq!(keys(admin, "cluster=nope").0, 404);
    assert_eq!(keys(admin, "").0, 400);

    // A push that keeps the dual write keeps the record.
    reload(
        &rw,
        admin,
        |y| y.replace("op_timeout: 2s", "op_timeout: 3s"),
        2,
    );
    let f = applied(admin, writes);
    assert_eq!(field(&f, "record"), Some(id.as_str()));
    let (status, head, listed) = keys(admin, &format!("cluster=new&since={cursor2}"));
    assert_eq!(status, 200, "the cursor is still good");
    assert!(listed.is_empty());
    assert_eq!(head[3], cursor2);
    let (_, _, all) = keys(admin, "cluster=new");
    assert!(all.is_superset(&want) && all.contains(&hex("late")));
    // Writes on the new configuration record into the same record.
    let mut conn = sync_client(rw.addr);
    let _: () = redis::cmd("SET")
        .arg("after-push")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    writes += 1;
    let (_, _, listed) = keys(admin, &format!("cluster=new&since={cursor2}"));
    assert_eq!(listed, BTreeSet::from([hex("after-push")]));
    applied(admin, writes);

    // `forward`: no dual write, no record; the counters stay.
    reload(
        &rw,
        admin,
        |y| y.replace("mode: dual_write", "mode: forward"),
        3,
    );
    let (status, _, _) = keys(admin, "cluster=new");
    assert_eq!(status, 404);
    let f = mirror_line(admin, "new").expect("the counters stay");
    assert_eq!(field(&f, "mirrored"), Some(writes.to_string().as_str()));
    assert_eq!(field(&f, "record"), None);
    assert_eq!(keys(admin, &format!("cluster=new&since={cursor2}")).0, 404);

    // Dual write again: a new record, empty, and the old cursor is refused.
    reload(
        &rw,
        admin,
        |y| y.replace("mode: forward", "mode: dual_write"),
        4,
    );
    let f = mirror_line(admin, "new").unwrap();
    let new_id = field(&f, "record").expect("a record again");
    assert_ne!(new_id, id);
    assert_eq!(field(&f, "keys"), Some("0"));
    assert_eq!(field(&f, "incomplete"), Some("0"));
    assert_eq!(keys(admin, &format!("cluster=new&since={cursor2}")).0, 409);
    // A write copy without keys cannot be listed: the record says it is incomplete.
    let mut conn = sync_client(rw.addr);
    let _: i64 = redis::cmd("EVAL")
        .arg("redis.call('SET', 'hidden', 1) return 1")
        .arg(0)
        .query(&mut conn)
        .unwrap();
    let (status, head, listed) = keys(admin, "cluster=new");
    assert_eq!(status, 200);
    assert_eq!(head[4..], ["overflowed", "0", "incomplete", "1"]);
    assert!(listed.is_empty(), "{listed:?}");
}

/// New-first (`primary: mirror`): the new cluster answers and the copies go to the route's
/// own cluster, so the record is `old`'s. A `FLUSHALL` (run on the routes' cluster, copied
/// nowhere) marks it incomplete.
#[test]
fn new_first_copies_are_recorded_for_the_routes_cluster() {
    let (old, new) = (redis(), redis());
    let mirrors = "        - { cluster: new, mode: dual_write, primary: mirror }\n";
    let rw = respway(&yaml(old.addr, new.addr, mirrors), 2);
    let admin = respway::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        false,
        rw.server.as_ref().expect("server"),
    )
    .expect("admin");
    let admin = admin_addr(&admin);
    let mut conn = sync_client(rw.addr);
    let _: () = redis::cmd("SET").arg("a").arg(1).query(&mut conn).unwrap();
    let _: () = redis::cmd("SET").arg("b").arg(1).query(&mut conn).unwrap();
    assert_eq!(keys(admin, "cluster=new").0, 404);
    let (status, head, listed) = keys(admin, "cluster=old");
    assert_eq!(status, 200);
    assert_eq!(listed, BTreeSet::from([hex("a"), hex("b")]));
    assert_eq!(head[4..], ["overflowed", "0", "incomplete", "0"]);
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    let (_, head, _) = keys(admin, "cluster=old");
    assert_eq!(head[4..], ["overflowed", "0", "incomplete", "1"]);
    let f = mirror_line(admin, "old").expect("old receives the copies");
    assert_eq!(field(&f, "incomplete"), Some("1"));
    assert!(mirror_line(admin, "new").is_none());
}

fn admin_addr(a: &respway::admin::Admin) -> SocketAddr {
    a.local_addr()
}

/// A sidecar fed by `respway-xds serve`, with no static resources and `--admin 127.0.0.1:0`:
/// the address its admin endpoint bound (the port resolved) reaches the management server in
/// `node.metadata` and shows as the node's `admin` in `GET /status`, raw and through the CLI
/// client's parser; `--admin-advertise` names another address instead.
#[test]
fn the_sidecars_admin_address_shows_in_the_xds_status() {
    let shard = redis();
    let work = std::env::temp_dir().join(format!(
        "respway-mirror-record-{}-{}",
        std::process::id(),
        shard.addr.port()
    ));
    let res = work.join("res");
    std::fs::create_dir_all(&res).unwrap();
    let ports = [free_port(), free_port()];
    for (i, port) in ports.iter().enumerate() {
        std::fs::write(
            res.join(format!("zone-z{i}.yaml")),
            format!(
                "targets: {{ zones: [z{i}] }}\nlisteners:\n  - name: main\n    address: 127.0.0.1:{port}\n    routes: {{ catch_all: c }}\n"
            ),
        )
        .unwrap();
    }
    std::fs::write(
        res.join("clusters.yaml"),
        format!(
            "clusters:\n  - name: c\n    shards:\n      - endpoints: [ {{ address: \"{}\" }} ]\n",
            shard.addr
        ),
    )
    .unwrap();
    let (grpc, xds_admin) = (free_port(), loopback(free_port()));
    let _xds = Spawn::new(respway_xds_bin())
        .args(["serve", "--resources", res.to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{grpc}")])
        .args(["--admin", &xds_admin.to_string(), "--poll-ms", "50"])
        .on_port(grpc)
        .start();
    wait_port(xds_admin, "respway-xds admin");
    let advertised = "10.1.2.3:9901";
    let sidecars: Vec<Proc> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let boot = work.join(format!("bootstrap-{i}.yaml"));
            std::fs::write(
                &boot,
                format!(
                    "node: {{ id: sidecar-{i}, zone: z{i} }}\nxds: {{ server: \"http://127.0.0.1:{grpc}\" }}\n"
                ),
            )
            .unwrap();
            let mut args = vec![
                "--bootstrap".to_string(),
                boot.display().to_string(),
                "--workers".into(),
                "1".into(),
                "--admin".into(),
                "127.0.0.1:0".into(),
            ];
            if i == 1 {
                args.extend(["--admin-advertise".into(), advertised.into()]);
            }
            Spawn::new(env!("CARGO_BIN_EXE_respway"))
                .args(args)
                .env("RUST_LOG", "warn")
                .on_port(*port)
                .start()
        })
        .collect();
    let admin_of = |json: &serde_json::Value, id: &str| -> Option<String> {
        json["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["id"] == id)?
            .get("admin")?
            .as_str()
            .map(str::to_string)
    };
    let mut json = serde_json::Value::Null;
    wait_for("both sidecars to show in /status", || {
        let (status, body) = http_get(xds_admin, "/status");
        assert_eq!(status, 200, "{body}");
        json = serde_json::from_str(&body).expect("JSON");
        admin_of(&json, "sidecar-0").is_some() && admin_of(&json, "sidecar-1").is_some()
    });
    // The bound address: the port resolved, and the sidecar's admin endpoint answers there.
    let bound: SocketAddr = admin_of(&json, "sidecar-0")
        .unwrap()
        .parse()
        .expect("IP:port");
    assert!(bound.ip().is_loopback() && bound.port() != 0, "{bound}");
    assert_eq!(http_get(bound, "/healthz"), (200, "ok\n".to_string()));
    assert_eq!(admin_of(&json, "sidecar-1").as_deref(), Some(advertised));
    // The CLI client's parser reads it too.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt
        .block_on(respway_xds::admin::fetch_status(
            &xds_admin.to_string(),
            &Default::default(),
        ))
        .expect("GET /status");
    let node = |id: &str| status.nodes.iter().find(|n| n.id == id).expect("node");
    assert_eq!(node("sidecar-0").admin, Some(bound.to_string()));
    assert_eq!(node("sidecar-1").admin.as_deref(), Some(advertised));
    drop(sidecars);
    let _ = std::fs::remove_dir_all(&work);
}

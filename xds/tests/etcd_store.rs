//! Several respway-xds replicas on one etcd (`serve --store etcd://...`): an apply through any
//! replica reaches the others' copies within a second, a new replica starts from etcd, a write
//! based on an old copy is refused, and a replica that loses etcd keeps serving. A real
//! `etcd` (Debian's etcd-server) on loopback ports.

use std::path::Path;
use std::time::{Duration, Instant};

use respway_testkit::*;

/// The admin token of every replica here.
const TOKEN: &str = "etcd-test-token";

/// A replica: its admin port is the process's port. Its token file is a hidden file of its
/// resource directory (hidden files are not resource files).
fn replica(etcd: &Etcd, prefix: &str, dir: &Path) -> Proc {
    let admin = free_port();
    let token = dir.join(".admin-token");
    std::fs::write(&token, TOKEN).unwrap();
    Spawn::new(env!("CARGO_BIN_EXE_respway-xds"))
        .env("RESPWAY_XDS_ADMIN_TOKEN_FILE", &token)
        .on_port(admin)
        .args([
            "serve".to_string(),
            "--resources".into(),
            dir.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", free_port()),
            "--admin".into(),
            format!("127.0.0.1:{admin}"),
            "--store".into(),
            format!("etcd://{}/{prefix}", etcd.addr()),
        ])
        .start()
}

fn resources(shard_port: u16) -> String {
    format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:6380\n    routes: {{ catch_all: c }}\nclusters:\n  - name: c\n    shards: [{{ endpoints: [{{ address: \"127.0.0.1:{shard_port}\" }}] }}]\n"
    )
}

/// `respway-xds apply` of `text` as `base.yaml` through `admin`: (exit success, output).
fn apply(admin: &Proc, text: &str) -> (bool, String) {
    let (code, said) = apply_code(admin, text);
    (code == Some(0), said)
}

/// `respway-xds apply` of `text` as `base.yaml` through `admin`: (exit code, output).
fn apply_code(admin: &Proc, text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, text).unwrap();
    std::fs::write(dir.path().join("token"), TOKEN).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_respway-xds"))
        .env("RESPWAY_XDS_ADMIN_TOKEN_FILE", dir.path().join("token"))
        .args(["apply", "--admin", &admin.addr.to_string()])
        .arg(&file)
        .output()
        .expect("respway-xds apply");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), said)
}

/// Waits (at most `within`) until `dir/base.yaml` holds `text`; how long it took.
fn copied(dir: &Path, text: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if std::fs::read_to_string(dir.join("base.yaml")).is_ok_and(|t| t == text) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{} never got the file",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A replica's `/status`.
fn status(admin: &Proc) -> serde_json::Value {
    let (status, body) = http_get(admin.addr, "/status");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The served version in a replica's `/status`.
fn served(admin: &Proc) -> u64 {
    status(admin)["version"].as_u64().unwrap()
}

#[test]
fn an_apply_through_any_replica_reaches_every_replica() {
    let etcd = Etcd::start();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = replica(&etcd, "fleet", dirs[0].path());
    let r2 = replica(&etcd, "fleet", dirs[1].path());
    let v1 = resources(7001);
    let (ok, said) = apply(&r1, &v1);
    assert!(ok, "{said}");
    let took = copied(dirs[1].path(), &v1, Duration::from_secs(1));
    let start = Instant::now();
    while served(&r2) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "replica 2 serves nothing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("replica 2 had replica 1's apply after {took:?}");
    // The other way round.
    let v2 = resources(7002);
    let (ok, said) = apply(&r2, &v2);
    assert!(ok, "{said}");
    copied(dirs[0].path(), &v2, Duration::from_secs(1));
    // A replica started now reads etcd whole.
    let r3 = replica(&etcd, "fleet", dirs[2].path());
    copied(dirs[2].path(), &v2, Duration::from_secs(1));
    assert!(served(&r3) > 0);
    // Another prefix is another fleet.
    let other = tempfile::tempdir().unwrap();
    let _r4 = replica(&etcd, "other", other.path());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!other.path().join("base.yaml").exists());
}

#[test]
fn a_replica_that_loses_etcd_keeps_serving_and_refuses_applies() {
    let mut etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let r = replica(&etcd, "lost", dir.path());
    let v1 = resources(7001);
    assert!(apply(&r, &v1).0);
    let version = served(&r);
    assert!(version > 0);
    etcd.kill();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(served(&r), version, "the last copy is still served");
    // Refused as unavailable (HTTP 503, exit 1: try again later), not as a conflict or a
    // bad file (409 or 400, exit 2).
    let (code, said) = apply_code(&r, &resources(7002));
    assert_eq!(code, Some(1), "an apply without etcd: {said}");
    assert!(said.contains("etcd"), "{said}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("base.yaml")).unwrap(),
        v1
    );
    // It says so.
    let store = &status(&r)["store"];
    assert_eq!(store["connected"], false, "{store}");
    assert!(store["lost"].as_u64() >= Some(1), "{store}");
    assert!(
        store["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{store}"
    );
    let (code, metrics) = http_get(r.addr, "/metrics");
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metrics.contains("\nrespway_xds_store_connected 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nrespway_xds_store_lost_total 1\n"),
        "{metrics}"
    );
    // etcd back: the replica follows it again (it retries each second) and applies work.
    etcd.restart();
    let start = Instant::now();
    while status(&r)["store"]["connected"] != true {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never reconnected: {}",
            status(&r)["store"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status(&r)["store"]["error"], serde_json::Value::Null);
    let (_, metrics) = http_get(r.addr, "/metrics");
    assert!(
        metrics.contains("\nrespway_xds_store_connected 1\n"),
        "{metrics}"
    );
    let v2 = resources(7002);
    let (ok, said) = apply(&r, &v2);
    assert!(ok, "{said}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("base.yaml")).unwrap(),
        v2
    );
    assert_ne!(served(&r), version);
}

/// A write based on a copy older than etcd's newest change is refused (two concurrent applies
/// cannot both win): the store's transaction holds only if nothing under the prefix changed
/// since the revision its copy is of.
#[test]
fn a_write_based_on_an_old_copy_is_refused() {
    let etcd = Etcd::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url =
            respway_xds::store::EtcdUrl::parse(&format!("etcd://{}/race", etcd.addr())).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = respway_xds::store::EtcdStore::open(url, dir.path()).await;
        // Another replica writes first.
        let mut other = etcd_client::Client::connect([etcd.addr().to_string()], None)
            .await
            .unwrap();
        other
            .put("/race/files/a.yaml", resources(7001), None)
            .await
            .unwrap();
        let err = store.put("b.yaml", &resources(7002)).await.unwrap_err();
        assert!(
            matches!(&err, respway_xds::cache::ApplyError::Conflict(e)
                if e.contains("changed in etcd since this replica read them")),
            "{err:?}"
        );
        let got = other.get("/race/files/b.yaml", None).await.unwrap();
        assert!(got.kvs().is_empty(), "nothing written");
    });
}

/// A frozen etcd (its connections open and silent) is noticed: the replica says etcd is lost
/// within seconds and follows it again once it answers.
#[test]
fn a_replica_notices_a_frozen_etcd() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let r = replica(&etcd, "frozen", dir.path());
    assert!(apply(&r, &resources(7001)).0);
    let connected = |want: bool, within: Duration| {
        let start = Instant::now();
        while status(&r)["store"]["connected"] != want {
            assert!(
                start.elapsed() < within,
                "store connected never became {want}: {}",
                status(&r)["store"]
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        start.elapsed()
    };
    etcd.freeze();
    let took = connected(false, slack(Duration::from_secs(10)));
    eprintln!("a frozen etcd was noticed after {took:?}");
    etcd.thaw();
    connected(true, slack(Duration::from_secs(10)));
    assert!(apply(&r, &resources(7002)).0);
}

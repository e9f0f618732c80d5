//! The example scenarios under `examples/` that run in a few seconds, run as they are.

use std::path::Path;
use std::process::Command;

use crate::support::respway_xds_bin;

/// `examples/xds/run.sh`: respway-xds and two sidecars over local redis-server shards; a route
/// change and a mirror toggle reach both, checked with redis-cli by the script itself.
#[test]
fn xds_example_runs_and_its_checks_pass() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/xds/run.sh");
    let xds = respway_xds_bin();
    let out = Command::new("bash")
        .arg(&script)
        .env("RESPWAY_BIN", env!("CARGO_BIN_EXE_respway"))
        .env("RESPWAY_XDS_BIN", &xds)
        .output()
        .expect("run examples/xds/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "run.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("== every check passed"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // The status shows both sidecars, each having ACKed the last listener version it was sent.
    for node in ["sidecar-1  z1    yes", "sidecar-2  z2    yes"] {
        assert!(stdout.contains(node), "{stdout}");
    }
}

/// `examples/demo/run.sh` (the README's first command) with this build's respway: it checks
/// its fixed ports before anything else, naming the busy one, and otherwise runs to the end
/// with every key where it says. Both halves use the demo's fixed ports (6380, 7001-7003), so
/// they run one after the other in this one test.
#[test]
fn demo_checks_its_ports_first_then_runs() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo/run.sh");
    let demo = || {
        Command::new("bash")
            .arg(&script)
            .env("RESPWAY_BIN", env!("CARGO_BIN_EXE_respway"))
            .output()
            .expect("run examples/demo/run.sh")
    };
    // A busy port: refused at once, before the build, with the port named.
    let busy = std::net::TcpListener::bind("127.0.0.1:7002").expect("bind 127.0.0.1:7002");
    let out = demo();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("port 7002") && stderr.contains("in use"),
        "{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("== building"), "{stdout}");
    drop(busy);

    let out = demo();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "run.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // MGET through respway sees the keys written through it; KEYS asks every shard.
    for want in ["alice", "bob", "carol", "42", "CROSSSLOT", "visits"] {
        assert!(stdout.contains(want), "{want} missing:\n{stdout}");
    }
    // Each shard holds some keys and all of them together hold the demo's keys.
    let shards: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("shard on "))
        .collect();
    assert_eq!(shards.len(), 3, "{stdout}");
    for k in [
        "user:1",
        "user:2",
        "visits",
        "{cart:7}:count",
        "{cart:7}:total",
    ] {
        assert!(
            shards.iter().filter(|l| l.contains(k)).count() == 1,
            "{k} not on exactly one shard:\n{stdout}"
        );
    }
}

/// `examples/migration/run.sh`: 2 shards grown to 4 in move mode with `respway-xds reshard`
/// under an INCR load through two sidecars; the script checks every key's value and TTL, the
/// counter against the acknowledged INCRs, and that nothing is left to move.
#[test]
fn migration_example_reshards_under_load_and_its_checks_pass() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/migration/run.sh");
    let xds = respway_xds_bin();
    let out = Command::new("bash")
        .arg(&script)
        .env("RESPWAY_BIN", env!("CARGO_BIN_EXE_respway"))
        .env("RESPWAY_XDS_BIN", &xds)
        .env("RESPWAY_COMPARE_BIN", env!("CARGO_BIN_EXE_respway-compare"))
        .output()
        .expect("run examples/migration/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("== every check passed"),
        "run.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

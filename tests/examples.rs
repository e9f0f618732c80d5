//! The example scenarios under `examples/` that run in a few seconds, run as they are.

use std::path::Path;
use std::process::Command;

/// The `respway-xds` binary next to this build's, built now only if it is not there (it
/// belongs to another package of the workspace: `cargo test --workspace` builds it with the
/// rest; a build from here would rebuild the xds crate with other features).
fn respway_xds_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = dir.join("respway-xds");
    if bin.is_file() {
        return bin;
    }
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "-q", "-p", "respway-xds", "--bin", "respway-xds"]);
    if profile == "release" {
        build.arg("--release");
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build -p respway-xds failed");
    assert!(bin.is_file(), "{} missing", bin.display());
    bin
}

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

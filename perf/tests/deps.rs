//! What building the harness builds: respway-perf talks to a `respway-xds` management server
//! over its admin HTTP API only, so it must not compile the server (tonic, the Envoy protos,
//! the ADS cache) to do so. Read from `cargo tree` over the workspace's lock file, offline.

use std::path::Path;
use std::process::Command;

#[test]
fn the_harness_does_not_build_the_management_server() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let out = Command::new(cargo)
        .args(["tree", "--offline", "--locked", "-e", "normal,build"])
        .args(["--prefix", "none", "-p", "respway-perf", "--manifest-path"])
        .arg(&manifest)
        .output()
        .expect("cargo runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo tree failed: {stderr}");
    let tree = String::from_utf8_lossy(&out.stdout);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.contains(&"respway-perf") && crates.contains(&"respway-filters"),
        "unexpected cargo tree output:\n{tree}"
    );
    let server: Vec<&&str> = crates
        .iter()
        .filter(|c| matches!(**c, "respway-xds" | "tonic" | "envoy-types" | "prost"))
        .collect();
    assert!(
        server.is_empty(),
        "respway-perf builds {server:?} (the management server's crates):\n{tree}"
    );
}

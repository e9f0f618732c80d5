//! The root package's integration tests, as one test binary: each file of `tests/` is a module
//! of it (the files stay where they are; `Cargo.toml` sets `autotests = false` and names this
//! binary and the few others), so `cargo test` links one binary instead of one per file, and
//! the tests of every file share the two cores instead of waiting for the binary before.
//!
//! `cargo test NAME` still finds a test by name (its path is now `file::name`); one file's
//! tests are `cargo test --test it file::`.
//!
//! Tests of different files now run at the same time in one process: what a test may not
//! share with them is handled in `support` (the near cache's process-wide stamps:
//! `alone_in_process`). Four files stay binaries of their own: `docs.rs`, `metrics_table.rs`
//! and `source_rules.rs` (read the repository, edited apart from the others) and `garbage.rs`
//! (its panic hook counts the panics of the whole process, which must be respway's alone).

mod support;

mod acl;
mod admin;
mod blocking;
mod chain;
mod cli;
mod client_tracking;
mod clients;
mod cluster_emulation;
mod compare;
mod compare_move;
mod compare_scope;
mod compat;
mod e2e;
mod examples;
mod faults;
mod health;
mod hot_copy;
mod keyspace;
mod learned_commands;
mod mirror_record;
mod move_mode;
mod near_cache;
mod near_cache_autopilot;
mod near_cache_ttl;
mod nutcracker;
mod nutcracker_import;
mod packaging;
mod pubsub;
mod redis_cluster;
mod reshard;
mod reshard_copy;
mod reshard_metrics;
mod resp3;
mod sentinel;
mod sentinel_failover;
mod swap;
mod tls;
mod transactions;
mod wait;
mod xds;
mod xds_fleet;

/// With `autotests = false` a file added to a `tests/` folder is compiled by nothing until it
/// is named: every `.rs` file directly in the `tests/` folder of the workspace's crates that
/// build one test binary is a module of that crate's `tests/it.rs` or a `[[test]]` of its
/// `Cargo.toml`.
#[test]
fn every_test_file_is_built() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for krate in [".", "xds", "filters", "perf"] {
        let dir = root.join(krate);
        let read = |rel: &str| {
            std::fs::read_to_string(dir.join(rel))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.join(rel).display()))
        };
        let manifest = read("Cargo.toml");
        assert!(
            manifest.contains("autotests = false"),
            "{krate}/Cargo.toml: no `autotests = false`"
        );
        let it = read("tests/it.rs");
        for entry in std::fs::read_dir(dir.join("tests")).expect("tests/") {
            let path = entry.expect("dir entry").path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            let module = it.lines().any(|l| l.trim() == format!("mod {stem};"));
            let target = manifest.contains(&format!("path = \"tests/{name}\""));
            if !module && !target {
                missing.push(format!("{krate}/tests/{name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "test files no binary builds (add `mod NAME;` to the crate's tests/it.rs): {missing:?}"
    );
}

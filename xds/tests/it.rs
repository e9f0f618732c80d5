//! respway-xds's integration tests, as one test binary: each file of `tests/` is a module of it
//! (the files stay where they are; `Cargo.toml` sets `autotests = false`), so `cargo test`
//! links one binary instead of one per file. `cargo test NAME` still finds a test by name (its
//! path is now `file::name`); one file's tests are `cargo test -p respway-xds --test it file::`.
//!
//! The tests of every file run at the same time in this one process: none may change what the
//! process shares (its environment, its working directory).

mod acl;
mod admin_limits;
mod ads;
mod ads_embedded;
mod bootstrap;
mod etcd_store;
mod golden;
mod redis_cluster;
mod security;
mod sentinel;
mod tls;
mod translate;
mod yaml;

//! respway-filters's integration tests, as one test binary: each file of `tests/` is a module
//! of it (the files stay where they are; `Cargo.toml` sets `autotests = false`), so `cargo test`
//! links one binary instead of one per file. `cargo test NAME` still finds a test by name (its
//! path is now `file::name`); one file's tests are `cargo test -p respway-filters --test it
//! file::`.

mod support;

mod hot_key;
mod mirror;
mod place;
mod resp_proptest;
mod sort_patterns;
mod zone;

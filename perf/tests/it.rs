//! respway-perf's integration tests, as one test binary: each file of `tests/` is a module of
//! it (the files stay where they are; `Cargo.toml` sets `autotests = false`), so `cargo test`
//! links one binary instead of one per file. `cargo test NAME` still finds a test by name (its
//! path is now `file::name`); one file's tests are `cargo test -p respway-perf --test it file::`.
//!
//! The tests of every file run at the same time in this one process: `support` holds what
//! some of them may not share (`compare`'s tests count this process's children).

mod support;

mod compare;
mod deps;
mod replay;
mod sink;

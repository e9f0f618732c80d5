//! # respway-testkit
//!
//! The one test harness of the workspace: every process a test starts runs on a free loopback
//! port and is killed when its handle is dropped (also when the test panics), and one raw RESP
//! client reads what comes back.
//!
//! The modules, grouped by concern:
//!
//! Processes
//! - [`process`] — [`Proc`] (a child killed on drop, with its scratch directory and log),
//!   [`free_port`], [`wait_port`], [`Spawn`] (any binary, optionally on a config file whose
//!   `127.0.0.1:0` becomes a free port: tests pass `env!("CARGO_BIN_EXE_respway")`),
//!   [`have`], [`rss_of`].
//! - [`servers`] — `redis-server` ([`redis`], [`redis_with`], [`redis_on`], [`redis_on_with`])
//!   and nutcracker ([`nutcracker`]).
//! - [`cluster`] — [`RedisCluster`], a real Redis Cluster (`redis-cli --cluster create`).
//! - [`etcd`] — [`Etcd`], a one-member etcd (the shared store of respway-xds replicas).
//! - [`fake`] — [`FakeShard`], a shard that misbehaves on demand ([`FakeMode`]), and
//!   [`Dribble`], a relay that hands a real server's replies on a few bytes at a time.
//!
//! Clients
//! - [`resp`] — the raw client [`RespConn`], the values it reads ([`Resp`]), [`parse_resp`],
//!   [`encode_cmd`] and the one-shot [`raw_command`].
//! - [`http`](mod@http) — a minimal HTTP/1.0 client for admin endpoints (respway's, Prometheus's,
//!   redis_exporter's): one request per connection, read until close.
//!
//! Certificates
//! - [`certs`] — [`Pki`], a test CA issuing server and client certificates (also expired) as
//!   PEM files.
//!
//! Time
//! - [`timing`] — [`wait_until`] / [`poll_until`] (a condition polled with a deadline, instead
//!   of a fixed sleep), [`slack`] (a timed upper bound times [`slack_factor`]: 3, or
//!   `RESPWAY_TEST_SLACK`) and [`Progress`] (what a load's clients have done, waited on
//!   instead of sleeping while the load runs).
//!
//! Documentation
//! - [`generated`] — [`check_generated`]: the blocks of a page written from the code (reference
//!   tables between marker comments), checked against what the code renders, or rewritten with
//!   `RESPWAY_BLESS=1`.
//!
//! Everything here panics on failure, with a message naming what failed: it is test code.
//! It depends on nothing but `std` and rcgen (the certificates' issuer) — not on `respway` (whose tests use it) and not on
//! `respway-filters`, so replies are checked with a parser that is not the code under test.

pub mod certs;
pub mod cluster;
pub mod etcd;
pub mod fake;
pub mod generated;
pub mod http;
pub mod process;
pub mod resp;
pub mod servers;
pub mod timing;

pub use certs::{CertFiles, Pki};
pub use cluster::RedisCluster;
pub use etcd::Etcd;
pub use fake::{Dribble, FakeMode, FakeShard};
pub use generated::{cell, check_generated, Block};
pub use http::{http, http_get, url_encode};
pub use process::{free_port, have, loopback, rss_of, wait_port, Proc, Spawn};
pub use resp::{encode_cmd, parse_resp, raw_command, Resp, RespConn};
pub use servers::{
    nutcracker, nutcracker_bin, redis, redis_on, redis_on_with, redis_starting_on, redis_with,
    sentinel_on,
};
pub use timing::{poll_until, slack, slack_factor, wait_until, ClientCounter, Progress};

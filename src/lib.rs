//! # respway — the sidecar
//!
//! A map of the crate (how it fits with the other crates, and one command walked through the
//! folders: `ARCHITECTURE.md` at the root):
//! - [`start`] runs the data plane: `workers` threads, each with its own current-thread tokio
//!   runtime, its own `SO_REUSEPORT` listener socket per listener, its own sessions and its own
//!   upstream connections (Envoy's worker model: what the request path shares between workers
//!   is the read-only configuration);
//! - [`Server::apply`] hot-swaps the configuration: it is validated and compiled once, stored
//!   in an `ArcSwap`, and each worker rebuilds its chain parts, reusing the connections to
//!   endpoints that remain; sessions pick the new parts up before their next request, and
//!   requests in flight finish on the chain they started with.
//!
//! The folders, as floors from the top down (a folder imports only folders below it; the
//! module-graph test in `tests/source_rules.rs` keeps it so, see `ARCHITECTURE.md`):
//! - `runtime`: bootstrap, the workers and their lifecycle, the side threads, xDS wiring, the
//!   admin HTTP endpoint, [`Server`] and its hot swaps;
//! - `session`: one client connection (decode, dispatch, replies in order, backpressure) and
//!   everything a session does that is not the chain: the proxy's own commands, transactions,
//!   blocking commands, `WAIT`, keyspace-wide commands, pub/sub, cluster emulation;
//! - `stack`: the chain for one configuration snapshot, and where each kind of command goes;
//!   the listener's ACL users;
//! - `cache`: the near cache (a service of the chain in front of the upstream), client
//!   tracking's registry, hot-key copies;
//! - `discovery`: which endpoints exist and are usable: Sentinel, Redis Cluster topologies,
//!   active health checks, and the side-thread loop that follows them;
//! - `upstream`: pooled, pipelined connections to the shards, dedicated ones, the request
//!   queue, redirections;
//! - `stats`: counters, latency histograms, the registry that sums them over workers, the
//!   table of metric families, the slow log and hot-key detection (it imports no feature:
//!   features register the sources it sums);
//! - `lifecycle`: the stop signal of workers and side threads, the side-thread spawner;
//! - `net`: bytes on sockets: TLS streams and configurations, output queues, spare buffers.

mod cache;
mod discovery;
mod lifecycle;
mod net;
mod runtime;
mod session;
mod stack;
mod stats;
mod upstream;

pub use runtime::{admin, bootstrap, check_files, start, xds, ConfigHandle, Options, Server};
pub use stats::{hotkeys, slowlog};

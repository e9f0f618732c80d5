//! Discovery: which endpoints exist and which are usable, decided beside the request path
//! (Envoy's cluster manager: discovery and health apart from the connection pools).
//!
//! - `endpoints`: the connection settings of one configured endpoint;
//! - `sentinel`: the primaries and replicas of Sentinel-managed shards, followed on a thread
//!   of their own and swapped in by compiling the configuration again;
//! - `redis_cluster`: the shards of Redis Clusters (slots, primaries, replicas) discovered
//!   from seed nodes and followed the same way;
//! - `watchers`: the side-thread loop of those two: a task per master or cluster the current
//!   configuration names;
//! - `health`: active health checks of endpoints (`PING` or `EXISTS drain_key`, and `ROLE`),
//!   on a thread of their own, their verdicts shared with the workers through atomics.

pub(crate) mod endpoints;
pub(crate) mod health;
pub(crate) mod redis_cluster;
pub(crate) mod sentinel;
pub(crate) mod watchers;

//! # respway-filters
//!
//! The data-plane pieces of respway, with no sockets, YAML or gRPC in them. The sidecar
//! (`respway`) reads clients and shards and calls these; the configuration crate
//! (`respway-xds`) produces the [`model`].
//!
//! Invariant for every layer: each request gets exactly one reply, in request order.
//!
//! The modules, grouped by concern:
//!
//! The protocol
//! - [`resp`]: the RESP codec: requests (arrays and inline commands) decoded, replies (RESP2
//!   and RESP3) framed without being parsed, zero-copy over `Bytes`;
//! - [`codec_limits`]: the decoder's limits (as Redis's `proto-max-bulk-len` and friends);
//! - [`command`]: the Redis 7 command table (arity, flags, key positions, proxy class);
//! - [`request`]: the request that flows through the chain (argv, command, key positions
//!   computed once) and its reply;
//! - [`error`]: what the proxy answers for instead of Redis ([`error::Failure`]: upstream
//!   failures, refusals), typed from where it happens to where the reply is written.
//!
//! Configuration
//! - [`model`]: the validated configuration model that both static YAML and xDS become;
//! - [`routing`]: one configuration compiled for the request path (prefix routes, per
//!   cluster its shard picker, hot-key rules, read policy and endpoints);
//! - [`acl`]: ACL users' permissions (`ACL SETUSER` rules) and password digests.
//!
//! Placement
//! - [`place`]: where a request's keys live, for every kind of command (the route layer,
//!   transactions, blocking commands, pub/sub channels), with one typed refusal per reason;
//! - [`hash`]: shard pickers (Envoy maglev and ring hash, twemproxy ketama/modula, slots);
//! - [`sort_patterns`]: the keys `SORT ... BY / GET` patterns form, which must share a shard.
//!
//! The layers of the chain, in the order `src/stack/mod.rs` stacks them
//! - [`prefix_route`]: picks the cluster from the key's prefix;
//! - [`mirror`]: request mirroring and the online-migration modes of a route;
//! - [`mirror_stats`]: the counters mirroring and move mode record;
//! - [`moving`]: move mode, keys moved to their new owner (`MIGRATE`) before a command;
//! - [`write_record`]: the keys dual-write copies touched, per receiving cluster (what a
//!   copy-mode migration re-checks);
//! - [`hot_key`]: keys under a hot prefix written to every shard, read from one;
//! - [`multi_key`]: MGET/MSET/DEL/... split into one sub-command per shard and merged;
//! - [`hash_layer`]: picks the shard with the cluster's picker;
//! - [`zone`]: picks the endpoint of the shard (primary, or by read policy and zone);
//! - [`fanout`]: one request sent as N sub-requests and the replies joined in order (used by
//!   the hot-key and multi-key layers).

pub mod acl;
pub mod codec_limits;
pub mod command;
pub mod error;
pub mod fanout;
pub mod hash;
pub mod hash_layer;
pub mod hot_key;
pub mod mirror;
pub mod mirror_stats;
pub mod model;
pub mod moving;
pub mod multi_key;
pub mod place;
pub mod prefix_route;
pub mod request;
pub mod resp;
pub mod routing;
pub mod sort_patterns;
pub mod write_record;
pub mod zone;

//! # respway-filters
//!
//! The data-plane pieces of respway, with no sockets, YAML or gRPC in them:
//!
//! - [`resp`]: the RESP2 codec (requests, inline commands, replies), zero-copy over `Bytes`;
//! - [`command`]: the Redis 7 command table (arity, flags, key positions, proxy class);
//! - [`model`]: the validated configuration model that both static YAML and xDS become;
//! - [`hash`]: shard pickers (Envoy maglev and ring hash, twemproxy ketama/modula, slots).
//!
//! Invariant for every layer: each request gets exactly one reply, in request order.

pub mod acl;
pub mod codec_limits;
pub mod command;
pub mod fanout;
pub mod hash;
pub mod hash_layer;
pub mod hot_key;
pub mod mirror;
pub mod model;
pub mod multi_key;
pub mod place;
pub mod prefix_route;
pub mod request;
pub mod resp;
pub mod routing;
pub mod sort_patterns;
pub mod zone;

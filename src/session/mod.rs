//! The session: one client connection and everything it does that is not the chain.
//!
//! - `conn`: the connection loop (decode every pipelined command, dispatch, write replies
//!   strictly in request order, backpressure, the turn clock) and the transaction lane;
//! - `state`: a session's own state (user, protocol, database, name, client id);
//! - `listener`: one listener on one worker: the state its sessions share, the swappable chain
//!   parts, binding its socket;
//! - `local`: commands the proxy answers itself (PING, HELLO, AUTH, SELECT, CLIENT, INFO, ...);
//! - `cluster_emulation`: `CLUSTER SLOTS`, `SHARDS`, `NODES`, ... of a listener that answers as
//!   a Redis Cluster, for cluster-aware clients;
//! - `tracking`: `CLIENT TRACKING`, `CACHING`, `TRACKINGINFO`, `GETREDIR` (the registry of
//!   tracking sessions is the cache's);
//! - `tx`: transactions pinned to one shard;
//! - `blocking`: blocking commands (`BLPOP`, `XREAD BLOCK`, ...) on dedicated connections;
//! - `wait`: `WAIT` / `WAITAOF` on dedicated connections;
//! - `pubsub`: publish/subscribe across shards (one subscription link per worker and primary);
//! - `keyspace`: `SCAN`, `KEYS`, `DBSIZE`, `RANDOMKEY`, `FLUSHDB`, `FLUSHALL` over every shard;
//! - `fanout`: key-less commands sent to several endpoints and merged;
//! - `scatter`: the one scatter-gather those three, pub/sub's `PUBSUB` and `WAIT` use (which
//!   targets, what each is sent and how the answers combine are theirs).

pub(crate) mod blocking;
pub(crate) mod cluster_emulation;
pub(crate) mod conn;
pub(crate) mod fanout;
pub(crate) mod keyspace;
pub(crate) mod listener;
pub(crate) mod local;
pub(crate) mod pubsub;
pub(crate) mod scatter;
pub(crate) mod state;
pub(crate) mod tracking;
pub(crate) mod tx;
pub(crate) mod wait;

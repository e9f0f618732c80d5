//! The validated data-plane model: what the sidecar serves, independent of where the
//! configuration came from (static YAML or xDS). `respway-xds` translates both sources into
//! these types; nothing here knows about YAML, protobuf or sockets.
//!
//! Invariants (checked by the translator, relied on by the data plane):
//! - every cluster has at least one shard, every shard exactly one primary endpoint;
//! - every route and the catch-all name a cluster that exists in [`Config::clusters`];
//! - shard names are unique within a cluster, cluster and listener names are unique.

use std::net::SocketAddr;
use std::time::Duration;

/// One complete configuration snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Listeners, each with its own routes.
    pub listeners: Vec<Listener>,
    /// Upstream clusters by name (order is the order of the source).
    pub clusters: Vec<Cluster>,
}

impl Config {
    /// The cluster with this name.
    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.iter().find(|c| c.name == name)
    }
}

/// A downstream listener: where clients connect and how their commands are routed.
#[derive(Debug, Clone, PartialEq)]
pub struct Listener {
    /// Unique name.
    pub name: String,
    /// Address to bind (127.0.0.1:6380 by default).
    pub address: SocketAddr,
    /// Prefix routes and catch-all.
    pub routes: RouteTable,
    /// When set, clients must `AUTH` with this password before other commands.
    pub downstream_password: Option<String>,
    /// How long one command may wait for its upstream reply before the client gets `-ERR`.
    pub op_timeout: Duration,
    /// Replies a single client may have outstanding before the proxy stops reading from it.
    pub max_pending_per_client: usize,
    /// Codec limits for client input.
    pub limits: crate::codec_limits::Limits,
}

/// Key-prefix routing (Envoy `RedisProxy.PrefixRoutes`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteTable {
    /// Prefix routes; the longest matching prefix wins.
    pub routes: Vec<PrefixRoute>,
    /// Match prefixes ignoring ASCII case.
    pub case_insensitive: bool,
    /// Cluster for keys that match no prefix, and for key-less commands.
    pub catch_all: Option<String>,
}

/// One prefix route.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixRoute {
    /// The key prefix (may be empty only if it is the sole route).
    pub prefix: String,
    /// Remove the prefix from the key before it is hashed and forwarded.
    pub remove_prefix: bool,
    /// Target cluster name.
    pub cluster: String,
}

/// A set of shards that together hold one keyspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Unique name.
    pub name: String,
    /// How keys are placed on shards.
    pub hash: HashPolicy,
    /// Hashtag delimiters; `None` hashes the whole key.
    pub hashtag: Option<HashTag>,
    /// Shards in configuration order (the order matters to ring hash and modula).
    pub shards: Vec<Shard>,
    /// Persistent connections per worker and endpoint (default 1).
    pub connections_per_endpoint: usize,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Upstream credentials sent as `AUTH` on connect.
    pub auth: Option<UpstreamAuth>,
    /// Database sent as `SELECT` on connect (0 = none sent).
    pub db: u32,
}

/// Upstream `AUTH` credentials.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamAuth {
    /// ACL user name; `None` sends the one-argument form.
    pub username: Option<String>,
    /// Password.
    pub password: String,
}

/// One shard: a primary and its replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// Unique within the cluster; shown in errors and stats.
    pub name: String,
    /// The string this shard is hashed by. Envoy maglev/ring: the primary's `ip:port` unless
    /// a `hash_key` is given. Twemproxy ketama: the server name, else `host:port`
    /// (just `host` when the port is 11211).
    pub hash_key: String,
    /// Relative weight (maglev, ring hash, ketama, modula).
    pub weight: u32,
    /// Owned slots for the slot-table policies (inclusive ranges); empty = even split.
    pub slots: Vec<(u32, u32)>,
    /// Endpoints; exactly one has [`Role::Primary`].
    pub endpoints: Vec<Endpoint>,
}

impl Shard {
    /// The primary endpoint.
    pub fn primary(&self) -> &Endpoint {
        self.endpoints
            .iter()
            .find(|e| e.role == Role::Primary)
            .unwrap_or(&self.endpoints[0])
    }
}

/// A Redis server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Socket address.
    pub address: SocketAddr,
    /// Primary or replica.
    pub role: Role,
    /// Locality zone, if known.
    pub zone: Option<String>,
}

/// Endpoint role within a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Takes writes (and reads by default).
    Primary,
    /// Read-only copy.
    Replica,
}

/// Hashtag delimiters, e.g. `{` and `}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashTag {
    /// Opening delimiter.
    pub open: u8,
    /// Closing delimiter.
    pub close: u8,
}

impl Default for HashTag {
    fn default() -> Self {
        HashTag {
            open: b'{',
            close: b'}',
        }
    }
}

/// Key → shard placement.
#[derive(Debug, Clone, PartialEq)]
pub enum HashPolicy {
    /// Envoy maglev: hosts by xxHash64 of their hash key, keys by murmur2_64.
    Maglev {
        /// Prime table size (Envoy default 65537).
        table_size: u64,
    },
    /// Envoy ring hash.
    RingHash {
        /// Envoy `minimum_ring_size` (default 1024).
        minimum_ring_size: u64,
        /// Envoy `maximum_ring_size` (default 8M).
        maximum_ring_size: u64,
        /// Hash used to place hosts on the ring.
        function: RingHashFunction,
    },
    /// Twemproxy ketama continuum (md5 points, 160 per server at equal weights).
    Ketama {
        /// Key hash.
        key_hash: KeyHash,
    },
    /// Twemproxy modula: `hash % sum(weights)`.
    Modula {
        /// Key hash.
        key_hash: KeyHash,
    },
    /// Codis style: `crc32(tag) % slots`, slot → shard table.
    Crc32Slots {
        /// Number of slots (Codis: 1024).
        slots: u32,
    },
    /// Redis Cluster style: `crc16(tag) % 16384`, slot → shard table.
    Crc16Slots,
}

/// Host placement hash for Envoy's ring hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingHashFunction {
    /// xxHash64 (Envoy default).
    XxHash,
    /// 64-bit MurmurHash2 (libstdc++ `std::hash`).
    MurmurHash2,
}

/// Twemproxy key hash functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHash {
    /// Twemproxy's (32-bit state) fnv1a_64, the default.
    Fnv1a64,
    /// fnv1a_32.
    Fnv1a32,
    /// fnv1_64 (32-bit state like twemproxy).
    Fnv1_64,
    /// fnv1_32.
    Fnv1_32,
    /// First 4 digest bytes of MD5, little-endian.
    Md5,
    /// Real IEEE CRC32.
    Crc32a,
    /// libmemcached crc32 (`(~crc >> 16) & 0x7fff`).
    Crc32,
    /// Jenkins one-at-a-time.
    OneAtATime,
    /// Murmur (twemproxy's 32-bit murmur).
    Murmur,
}

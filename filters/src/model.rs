//! The validated data-plane model: what the sidecar serves, independent of where the
//! configuration came from (static YAML or xDS). `respway-xds` translates both sources into
//! these types; nothing here knows about YAML, protobuf or sockets.
//!
//! Invariants (checked by the translator, relied on by the data plane):
//! - every cluster has at least one shard, every shard exactly one primary endpoint;
//! - every route and the catch-all name a cluster that exists in [`Config::clusters`];
//! - shard names are unique within a cluster, cluster and listener names are unique.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod near_cache;
pub use near_cache::{NearCache, NearCacheAdmit, NearCacheMode};

/// One complete configuration snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Listeners, each with its own routes.
    pub listeners: Vec<Listener>,
    /// Upstream clusters by name (order is the order of the source).
    pub clusters: Vec<Cluster>,
    /// The zone this sidecar runs in (for zone-local reads); `--zone` and `RESPWAY_ZONE`
    /// override it.
    pub zone: Option<String>,
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
    /// When set, clients must `AUTH` with this password before other commands: the
    /// password of the `default` user, who may run every command on every key.
    pub downstream_password: Option<String>,
    /// ACL users (none: no ACL; every client is `default`, checked for nothing).
    pub users: Vec<AclUser>,
    /// How long one command may wait for its upstream reply before the client gets `-ERR`.
    pub op_timeout: Duration,
    /// Replies a single client may have outstanding before the proxy stops reading from it.
    pub max_pending_per_client: usize,
    /// Codec limits for client input.
    pub limits: crate::codec_limits::Limits,
    /// Per-client memory bounds and session rules.
    pub client: ClientLimits,
    /// The RESP versions spoken with clients, and what the proxy says it is.
    pub resp: RespSettings,
    /// TLS for clients (`None`: plaintext).
    pub tls: Option<ListenerTls>,
    /// What the listener's slow log and hot-key detection keep.
    pub observe: Observe,
    /// Answer as a Redis Cluster owning every slot (`CLUSTER SLOTS`, ...), for cluster-aware
    /// clients; `None`: `CLUSTER` is refused.
    pub cluster_emulation: Option<ClusterEmulation>,
}

/// A listener's cluster emulation: the nodes it announces, the 16384 slots split evenly over
/// them in order (empty: one node, the local address of the client's connection).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ClusterEmulation {
    /// The sidecar addresses announced as the cluster's nodes.
    pub announce: Vec<SocketAddr>,
}

/// A listener's slow log and hot-key detection; `None` takes the process's setting (the
/// sidecar's `--slowlog-threshold-us`, `--slowlog-max-len`, `--hot-key-sample`). A push that
/// changes them applies to the commands after it; kept entries and counts stay.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Observe {
    /// Commands at least this slow (dispatch to reply) are logged, like Redis's
    /// `slowlog-log-slower-than` (zero logs every command).
    pub slowlog_threshold: Option<Duration>,
    /// Entries kept per worker, like Redis's `slowlog-max-len` (zero keeps none).
    pub slowlog_max_len: Option<usize>,
    /// One key in this many of the commands routed by key is counted for hot-key detection
    /// (zero turns it off).
    pub hot_key_sample: Option<u64>,
}

/// A listener's TLS: its certificate files, and the CA that signs client certificates (mTLS).
/// The files are read by the sidecar (reloaded when they change), not by the translator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenerTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA certificates that sign client certificates; set, a client may present one and it
    /// is verified.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client without a valid certificate is refused.
    pub require_client_cert: bool,
}

/// TLS to a cluster's shards. The server's certificate is verified against `ca` (there are no
/// built-in roots) for `server_name`, else the endpoint's IP address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    /// PEM CA certificates the shards' certificates must chain to (`None` only with
    /// `insecure_skip_verify`).
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain (for shards that require one), with `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// The name sent as SNI and that the certificate must be valid for; `None`: the
    /// endpoint's IP address.
    pub server_name: Option<String>,
    /// Accept any server certificate (logged at warn whenever it is loaded).
    pub insecure_skip_verify: bool,
}

/// An ACL user of a listener, as Redis's `ACL SETUSER`: passwords (kept as SHA-256 digests
/// only) and permission rules. `{:?}` shows how many passwords, not their digests.
#[derive(Clone, PartialEq, Eq)]
pub struct AclUser {
    /// The name clients give to `AUTH name password`; `default` is the user of
    /// `AUTH password` and of clients that never authenticate.
    pub name: String,
    /// Off: `AUTH` as this user fails (`-WRONGPASS`), whatever the password.
    pub enabled: bool,
    /// SHA-256 digests of the accepted passwords.
    pub passwords: Vec<crate::acl::Digest>,
    /// Any password is accepted (and a `default` user with `nopass` needs no `AUTH`).
    pub nopass: bool,
    /// Redis ACL rules (`~pattern`, `+@read`, `-flushall`, ...), applied left to right from
    /// no permission at all; checked when the configuration is read.
    pub rules: Vec<String>,
    /// After the rules, take every `@write` command away.
    pub read_only: bool,
}

impl std::fmt::Debug for AclUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclUser")
            .field("name", &self.name)
            .field("enabled", &self.enabled)
            .field(
                "passwords",
                &format_args!("<{} redacted>", self.passwords.len()),
            )
            .field("nopass", &self.nopass)
            .field("rules", &self.rules)
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Which RESP versions a listener speaks with its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProtocolMode {
    /// Each client chooses with `HELLO` (RESP2 until it sends `HELLO 3`), as Redis does
    /// (default).
    #[default]
    Auto,
    /// RESP2 only: `HELLO 3` answers `-NOPROTO` (Envoy's `protocol_version: RESP2`).
    Resp2,
    /// RESP3 only: every command but `HELLO`, `AUTH` and `QUIT` answers `-NOPROTO` until
    /// the client sent `HELLO 3` (Envoy's `protocol_version: RESP3`).
    Resp3,
}

/// Protocol settings of a listener.
#[derive(Debug, Clone, PartialEq)]
pub struct RespSettings {
    /// Which RESP versions clients may use.
    pub protocol: ProtocolMode,
    /// The Redis version the proxy reports (`HELLO`'s `version`, `INFO`'s `redis_version`),
    /// which clients read to pick features (default: the version of the command table).
    pub advertised_version: String,
}

impl Default for RespSettings {
    fn default() -> Self {
        RespSettings {
            protocol: ProtocolMode::Auto,
            advertised_version: crate::command::REDIS_VERSION.to_string(),
        }
    }
}

/// Bounds on what one client connection may cost, and session rules of a listener.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientLimits {
    /// Bytes of replies held for one client (ready to write, or expected from requests in
    /// flight): at or above it the session reads and dispatches nothing more from that client
    /// until it reads its replies (default 64 MiB).
    pub buffer_limit: usize,
    /// Bytes of replies held for one client past which its connection is closed (logged and
    /// counted), like Redis's `client-output-buffer-limit` hard limit (default 256 MiB).
    pub buffer_hard_limit: usize,
    /// A client held at `buffer_limit` that takes no reply byte for this long is disconnected
    /// (a client that writes a whole pipeline before reading, and would otherwise wait forever)
    /// (default 30 s).
    pub stall_timeout: Duration,
    /// Failed `AUTH` attempts on one connection before it is closed (default 10).
    pub max_auth_failures: u32,
    /// Let `EVAL`/`EVALSHA`/`FCALL` with no keys run on the catch-all cluster's first shard
    /// (default: refused, since a script that touches keys would write them on the wrong
    /// shard).
    pub allow_keyless_scripts: bool,
    /// Let ACL users whose rules are not `allkeys allcommands` run scripts (default:
    /// refused, since a script runs on the shard with the upstream user's rights; read-only
    /// scripts of a user with every key and read command are allowed either way).
    pub allow_restricted_scripts: bool,
    /// Let `FLUSHDB` / `FLUSHALL` through, to every primary (default: refused, since one
    /// command would empty every shard).
    pub admin_commands: bool,
    /// Most keys `KEYS` may return before it is refused (default 100,000): each shard's
    /// whole reply is held before the merge.
    pub keys_max: usize,
    /// Bytes of messages held for one subscriber past which it is disconnected, like Redis's
    /// `client-output-buffer-limit pubsub` hard limit (default 32 MiB).
    pub pubsub_buffer_limit: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            buffer_limit: 64 << 20,
            buffer_hard_limit: 256 << 20,
            stall_timeout: Duration::from_secs(30),
            max_auth_failures: 10,
            allow_keyless_scripts: false,
            allow_restricted_scripts: false,
            admin_commands: false,
            keys_max: 100_000,
            pubsub_buffer_limit: 32 << 20,
        }
    }
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
    /// Mirror policies of the catch-all route.
    pub catch_all_mirrors: Vec<MirrorPolicy>,
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
    /// Mirror policies of this route (request mirroring and migration modes).
    pub mirrors: Vec<MirrorPolicy>,
}

/// One mirror target of a route: where copies go, which commands, how many, and in which
/// migration mode. The online migration playbook is dual-write → backfill → switch reads
/// (make the target primary) → stop dual-write, each step a config change.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorPolicy {
    /// The other cluster.
    pub cluster: String,
    /// What happens to commands on this route.
    pub mode: MirrorMode,
    /// Mirror reads too (default: writes only).
    pub include_reads: bool,
    /// Share of eligible commands copied, in parts per million (1_000_000 = 100%).
    pub fraction_ppm: u32,
}

/// Migration mode of a mirror target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorMode {
    /// No mirroring (the policy is kept but inactive).
    Forward,
    /// Writes (and reads if `include_reads`) go to both sides. The reply comes from the side
    /// marked primary; the other side gets an asynchronous copy through a bounded queue.
    DualWrite {
        /// `false`: the route's own cluster is primary (old-first); `true`: the mirror
        /// cluster answers the client and the route's cluster gets the copy (new-first).
        target_is_primary: bool,
    },
    /// Writes are refused with an error (a cut-over window); reads are served.
    ReadOnly,
    /// The route's keys live on the mirror cluster; a key whose owner changes is moved there
    /// from its owner in the route's cluster (`MIGRATE`) before a command that names it is
    /// forwarded (see `respway_filters::moving`).
    Move,
    /// The phase before [`Move`](MirrorMode::Move), while sidecars switch one by one: a
    /// command naming a key whose owner changes is refused (run nowhere); every other command
    /// is served by the route's own cluster, as before. It agrees with the old placement
    /// (nothing moves) and with `Move` (no key that may have moved is served), so each
    /// sidecar may switch when it gets the push.
    PrepareMove,
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
    /// Shards in configuration order (the order matters to ring hash and even slot splits;
    /// modula sorts them by hash key, as twemproxy does).
    pub shards: Vec<Shard>,
    /// Persistent connections per worker and endpoint (default 1).
    pub connections_per_endpoint: usize,
    /// Requests that may wait to be written on one upstream connection; beyond it a request
    /// gets an immediate error naming the shard (default 16384).
    pub max_queue_per_connection: usize,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Upstream credentials sent as `AUTH` on connect.
    pub auth: Option<UpstreamAuth>,
    /// Credentials of single endpoints, overriding [`Cluster::auth`] for them (Envoy's
    /// `RedisProtocolOptions.credentials`); at most one per address.
    pub endpoint_auth: Vec<EndpointAuth>,
    /// The shards' database a client's database 0 maps to: a client that sent `SELECT n`
    /// uses database `db + n` (0 = none sent on connect for clients that never select).
    pub db: u32,
    /// Databases a client may `SELECT` on this cluster: `0..databases` (default 16, as
    /// Redis's `databases`). Connections per database are opened on first use.
    pub databases: u32,
    /// Dedicated connections (transactions) one worker may have open to one endpoint at
    /// once; they are reused, not closed, between transactions (default 32).
    pub dedicated_connections: usize,
    /// Hot-key rules: keys under these prefixes are written to every shard and read from one.
    pub hot_keys: Vec<HotKeyRule>,
    /// Which endpoint of a shard serves reads.
    pub read_policy: ReadPolicy,
    /// TLS to the shards (`None`: plaintext).
    pub tls: Option<UpstreamTls>,
    /// Active health checks of every endpoint (`None`: only the connections' own health).
    pub health_check: Option<HealthCheck>,
    /// A near cache of this cluster's reads in every worker (`None`: no cache).
    pub near_cache: Option<NearCache>,
    /// A Redis Cluster: the shards (slot ranges, primaries, replicas) are discovered from
    /// these seed nodes and followed, instead of configured (`shards` then holds one
    /// placeholder shard until the sidecar fills them in). Placement is Redis Cluster's own:
    /// `crc16_slots` with `{}` hashtags.
    pub redis_cluster: Option<RedisClusterSource>,
}

/// Where a Redis Cluster's topology is learned, and how often (Envoy's `RedisClusterConfig`:
/// the same meanings and defaults).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RedisClusterSource {
    /// Nodes asked for the topology (`CLUSTER SHARDS`, else `CLUSTER SLOTS`) until one answers;
    /// after the first answer every known node is asked too.
    pub seeds: Vec<SocketAddr>,
    /// Interval between topology refreshes (default 5 s).
    pub cluster_refresh_rate: Duration,
    /// How long one refresh may take (default 3 s).
    pub cluster_refresh_timeout: Duration,
    /// The least time between two refreshes triggered by redirections or failures (default
    /// 5 s).
    pub redirect_refresh_interval: Duration,
    /// Redirections (`MOVED`, `ASK`) that trigger a refresh (default 5; 0: never).
    pub redirect_refresh_threshold: u32,
    /// Upstream failures that trigger a refresh (default 0: never).
    pub failure_refresh_threshold: u32,
    /// Endpoints that became unhealthy that trigger a refresh (default 0: never).
    pub host_degraded_refresh_threshold: u32,
}

impl Default for RedisClusterSource {
    fn default() -> Self {
        RedisClusterSource {
            seeds: Vec::new(),
            cluster_refresh_rate: Duration::from_secs(5),
            cluster_refresh_timeout: Duration::from_secs(3),
            redirect_refresh_interval: Duration::from_secs(5),
            redirect_refresh_threshold: 5,
            failure_refresh_threshold: 0,
            host_degraded_refresh_threshold: 0,
        }
    }
}

/// Active health checking of a cluster's endpoints, as Envoy's Redis health checker: each
/// endpoint is sent `PING` (or `EXISTS drain_key`) and `ROLE` every `interval` on a connection
/// of its own. An endpoint starts healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// Time between two checks of one endpoint (default 1 s).
    pub interval: Duration,
    /// How long one check may take before it counts as failed (default 500 ms).
    pub timeout: Duration,
    /// Failed checks in a row that take a healthy endpoint out of rotation (default 3).
    pub unhealthy_threshold: u32,
    /// Passed checks in a row that put an unhealthy endpoint back (default 2).
    pub healthy_threshold: u32,
    /// Envoy's Redis health checker `key`: while `EXISTS key` answers 1 the endpoint is out of
    /// rotation ("draining"), at once; it is back as soon as the key is gone.
    pub drain_key: Option<String>,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            drain_key: None,
        }
    }
}

/// A hot-key rule (e.g. prefix `HIGH_FREQ_`).
#[derive(Debug, Clone, PartialEq)]
pub struct HotKeyRule {
    /// Key prefix the rule applies to (matched on the key as forwarded, case-sensitive).
    pub prefix: String,
    /// How reads of a hot key pick their one shard.
    pub read: HotKeyRead,
}

/// Shard choice for reads of a hot key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotKeyRead {
    /// Round-robin over the shards, per client connection (default).
    RoundRobin,
    /// A random shard.
    Random,
    /// A shard with an endpoint in the sidecar's zone, round-robin among those; else any.
    SameZone,
}

/// Which endpoint of a shard serves reads. Writes always go to the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPolicy {
    /// The primary (default).
    Primary,
    /// A healthy replica if there is one, else the primary.
    PreferReplica,
    /// A healthy replica in the sidecar's zone; else the fallback.
    ZoneLocal {
        /// What to use when no replica in this zone is healthy.
        fallback: ZoneFallback,
    },
    /// Any healthy endpoint, primary included, round-robin.
    Any,
}

/// Fallback of [`ReadPolicy::ZoneLocal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneFallback {
    /// The primary.
    Primary,
    /// A healthy replica in another zone, else the primary.
    AnyReplica,
}

/// Upstream `AUTH` credentials (`{:?}` shows the password as `<redacted>`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UpstreamAuth {
    /// ACL user name; `None` sends the one-argument form.
    pub username: Option<String>,
    /// Password.
    pub password: String,
}

impl std::fmt::Debug for UpstreamAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Upstream credentials of one endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointAuth {
    /// The endpoint's address.
    pub address: SocketAddr,
    /// What it is sent on connect.
    pub auth: UpstreamAuth,
}

impl Cluster {
    /// The credentials connections to `address` send: the endpoint's own, else the
    /// cluster's.
    pub fn auth_for(&self, address: SocketAddr) -> Option<&UpstreamAuth> {
        self.endpoint_auth
            .iter()
            .find(|e| e.address == address)
            .map(|e| &e.auth)
            .or(self.auth.as_ref())
    }
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
    /// Endpoints; exactly one has [`Role::Primary`]. For a shard with a [`Shard::sentinel`]
    /// the sidecar fills them in from the Sentinels (the translation leaves the placeholder
    /// [`NO_ENDPOINT`] as primary: no primary known yet).
    pub endpoints: Vec<Endpoint>,
    /// The Sentinels that name this shard's primary and replicas, instead of fixed endpoints.
    pub sentinel: Option<SentinelSource>,
}

/// Where a Sentinel-managed shard learns its primary and replicas.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SentinelSource {
    /// The master's name as the Sentinels monitor it (`SENTINEL MONITOR <name> ...`).
    pub master: String,
    /// The Sentinels' addresses (every one is asked and subscribed to). Credentials sent to
    /// them are their own in [`Cluster::endpoint_auth`]; the cluster's `auth` is for the data
    /// nodes and never sent to a Sentinel.
    pub sentinels: Vec<SocketAddr>,
    /// The zones of the data nodes the Sentinels may name, by address (sorted), for
    /// zone-local reads: Sentinel knows no zones. A node not listed has none.
    pub zones: Vec<(SocketAddr, String)>,
    /// How long writes are held from the first Sentinel event that says a failover of the
    /// master has begun until `+switch-master` names the new primary (then they go there);
    /// zero: never held (writes go to the old primary, which may drop them when demoted).
    pub failover_hold: std::time::Duration,
    /// While the primary is down and no switch has happened, the replicas that were in the
    /// read rotation keep serving reads (they hold the freshest data there is, though it may
    /// fall behind); false: they leave the rotation as soon as the Sentinels see them
    /// unlinked, and reads go to the primary (and fail while it is down).
    pub serve_stale_reads: bool,
}

/// The default [`SentinelSource::failover_hold`]: longer than a planned failover takes
/// (Sentinel's own steps, about 1.2 s from `+try-failover` to `+switch-master` on loopback).
pub const DEFAULT_FAILOVER_HOLD: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest [`SentinelSource::failover_hold`] a configuration may set.
pub const MAX_FAILOVER_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

impl Shard {
    /// The primary endpoint.
    pub fn primary(&self) -> &Endpoint {
        self.endpoints
            .iter()
            .find(|e| e.role == Role::Primary)
            .unwrap_or(&self.endpoints[0])
    }
}

/// The address of the one endpoint of a cluster that has none: an EDS cluster whose
/// `ClusterLoadAssignment` did not arrive within the ADS client's warm timeout is used as
/// Envoy does, with no hosts. Nothing is ever connected to it: the upstream answers each
/// request to it with an `unavailable` error ([`NO_ENDPOINT_REASON`]). Port 0 is no address a
/// Redis server can listen on, so no configured endpoint is mistaken for it.
pub const NO_ENDPOINT: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

/// Why a request to [`NO_ENDPOINT`] fails.
pub const NO_ENDPOINT_REASON: &str =
    "no endpoints (its ClusterLoadAssignment did not arrive within the xDS initial_fetch_timeout)";

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

/// Default of [`Cluster::databases`].
pub const DEFAULT_DATABASES: u32 = 16;
/// Default of [`Cluster::dedicated_connections`].
pub const DEFAULT_DEDICATED_CONNECTIONS: usize = 32;
/// Default of [`Cluster::max_queue_per_connection`].
pub const DEFAULT_MAX_QUEUE_PER_CONNECTION: usize = 16384;

#[cfg(test)]
mod secret_tests {
    use super::*;

    /// A `{:?}` of a configuration (a log line, a panic message) never shows a password or
    /// a password's digest.
    #[test]
    fn debug_output_redacts_passwords_and_digests() {
        let auth = UpstreamAuth {
            username: Some("app".into()),
            password: "hunter2-upstream".into(),
        };
        let user = AclUser {
            name: "app".into(),
            enabled: true,
            passwords: vec![crate::acl::sha256(b"hunter2-user")],
            nopass: false,
            rules: vec!["~app:*".into()],
            read_only: false,
        };
        let text = format!(
            "{auth:?} {user:?} {:?}",
            EndpointAuth {
                address: "127.0.0.1:1".parse().unwrap(),
                auth: auth.clone(),
            }
        );
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("passwords: [["), "no digest bytes: {text}");
        assert!(
            text.contains("<redacted>") && text.contains("app"),
            "{text}"
        );
    }
}

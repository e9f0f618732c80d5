//! The configuration reference: every key of every mapping of the schema, with its type, its
//! default and what it means. The reader's known keys (the lists [`Map::new`] checks a
//! mapping's keys against, and its unknown-key error names) are these tables' key names, in
//! their order, so that a key cannot be read without being documented, nor documented without
//! being read. The key tables of docs/configuration.md (and the health check's in
//! docs/operations-and-metrics.md, `targets`' in docs/xds.md) are rendered from them between
//! `<!-- generated: config.* -->` markers; the test below fails when a page differs, and
//! `RESPWAY_BLESS=1 cargo test -p respway-xds --lib yaml::reference` rewrites the pages.
//!
//! The texts are Markdown, one line each. Links name pages from the repository's root
//! (`docs/security.md#tls`), or a heading of the page the table is in (`#read-policy`).
//!
//! [`Map::new`]: super::value::Map::new

/// One key of a mapping.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the texts are read by the reference pages' test")
)]
pub(super) struct Key {
    /// The key, as written in YAML.
    pub(super) name: &'static str,
    /// What its value is.
    pub(super) ty: &'static str,
    /// Its value when left out (`required`, `null`, ...; may be empty).
    pub(super) default: &'static str,
    /// What it does.
    pub(super) meaning: &'static str,
}

const fn key(
    name: &'static str,
    ty: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> Key {
    Key {
        name,
        ty,
        default,
        meaning,
    }
}

/// The names of `keys`, in order (`N` is their number): a mapping's known keys.
const fn names<const N: usize>(keys: &[Key]) -> [&'static str; N] {
    assert!(keys.len() == N);
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = keys[i].name;
        i += 1;
    }
    out
}

/// `"policy"` and then the names of `keys` (`N` is one more than their number): the known keys
/// of a `hash` of one policy.
const fn policy_names<const N: usize>(keys: &[Key]) -> [&'static str; N] {
    assert!(keys.len() + 1 == N);
    let mut out = ["policy"; N];
    let mut i = 0;
    while i < keys.len() {
        out[i + 1] = keys[i].name;
        i += 1;
    }
    out
}

/// The top level of a sidecar's file.
pub(super) const TOP: &[Key] = &[
    key("node", "[node](#node)", "none", "the sidecar itself"),
    key(
        "listeners",
        "list of [listener](#listener)",
        "required, not empty",
        "where clients connect",
    ),
    key(
        "clusters",
        "list of [cluster](#cluster)",
        "required, not empty",
        "the Redis shards behind respway",
    ),
];
/// The keys of [`TOP`], in order.
pub(super) const TOP_KEYS: &[&str] = &names::<{ TOP.len() }>(TOP);

/// `node`: the sidecar itself.
pub(super) const NODE: &[Key] = &[
    key("id", "string or null", "null", "the node's id; accepted and not used yet (it will name the sidecar to an xDS server)"),
    key("zone", "string or null", "null", "the zone this sidecar runs in, for [`zone_local`](#read-policy) reads and [`same_zone`](#hot-keys) hot keys; `--zone` and `RESPWAY_ZONE` override it"),
];
/// The keys of [`NODE`], in order.
pub(super) const NODE_KEYS: &[&str] = &names::<{ NODE.len() }>(NODE);

/// A listener (`listeners[i]`).
pub(super) const LISTENER: &[Key] = &[
    key("name", "string", "required", "unique name; also the stats prefix"),
    key("address", "`IP:port`", "`127.0.0.1:6380`", "address to bind; two listeners may not share one"),
    key("op_timeout", "duration", "`1s`", "how long a command may wait for its upstream reply before the client gets an error; counted again from each reply byte its connection receives, up to 8 × `op_timeout` (see [Failures and limits](docs/failover-and-redis-cluster.md#failures-and-limits))"),
    key("max_pending_per_client", "integer ≥ 1", "`1024`", "replies one client may have outstanding before respway stops reading from it"),
    key("client_buffer_limit", "integer ≥ 1 (bytes)", "`67108864` (64 MiB)", "bytes of replies held for one client (ready to write, or expected from requests in flight) at which respway reads and dispatches nothing more from it until it reads its replies"),
    key("client_buffer_hard_limit", "integer ≥ `client_buffer_limit` (bytes)", "`268435456` (256 MiB)", "bytes of replies held for one client past which its connection is closed (logged and counted), like Redis's `client-output-buffer-limit` hard limit (a `client_buffer_limit` above 256 MiB needs it raised too)"),
    key("client_stall_timeout", "duration", "`30s`", "a client held at `client_buffer_limit` that takes no reply byte for this long is disconnected (one that writes a whole pipeline before reading would otherwise wait forever)"),
    key("max_auth_failures", "integer ≥ 1", "`10`", "failed `AUTH` attempts on one connection before it is closed"),
    key("allow_keyless_scripts", "bool", "`false`", "let `EVAL`/`EVALSHA`/`FCALL` with no keys run on the catch-all cluster's first shard; refused by default, since a script that touches keys would write them on the wrong shard"),
    key("allow_restricted_scripts", "bool", "`false`", "let users whose rules are not every command and key run `EVAL`/`EVALSHA`/`FCALL` (see [Users](#users)); refused by default, since a script runs with the upstream user's rights"),
    key("admin_commands", "bool", "`false`", "let `FLUSHDB`/`FLUSHALL` through to every primary of every routed cluster; refused by default (one command would empty every shard)"),
    key("keys_max", "integer > 0", "`100000`", "most keys `KEYS` may return; past it `KEYS` is refused (each shard's whole reply is held before the merge; use `SCAN`)"),
    key("pubsub_buffer_limit", "bytes > 0", "`33554432` (32 MiB)", "messages held for one subscriber past which it is disconnected, like Redis's `client-output-buffer-limit pubsub` hard limit"),
    key("slowlog_threshold", "duration (`0us` allowed)", "the sidecar's `--slowlog-threshold-us` (10 ms)", "commands at least this slow go to the [slow log](docs/operations-and-metrics.md#slow-log), like Redis's `slowlog-log-slower-than`; `0us` logs every command"),
    key("slowlog_max_len", "integer 0 … 100000", "the sidecar's `--slowlog-max-len` (128)", "slow-log entries kept per worker, like Redis's `slowlog-max-len`; `0` keeps none"),
    key("hot_key_sample", "integer 0 … 4294967295", "the sidecar's `--hot-key-sample` (16)", "[hot-key detection](docs/operations-and-metrics.md#hot-key-detection) counts one key in this many; `0` turns it off"),
    key("protocol", "`auto`, `resp2` or `resp3`", "`auto`", "`auto`: each client picks with `HELLO` (RESP2 until `HELLO 3`); `resp2`: `HELLO 3` answers `-NOPROTO`; `resp3`: commands before `HELLO 3` answer `-NOPROTO` (Envoy's `protocol_version: RESP3`)"),
    key("advertised_redis_version", r#"string of digits and dots, e.g. `"7.2.4"`"#, "the version of the command table (`7.0.15`)", "reported in `HELLO`'s `version` and `INFO`'s `redis_version` (clients pick features by it); quote it, since an unquoted `7.2` is a number"),
    key("cluster_emulation", "`true`, `false`, or `{ announce: [IP:port, ...] }`", "`false`", "answer as a Redis Cluster that owns every slot, for cluster-aware clients (see [Cluster emulation](docs/commands.md#cluster-emulation-for-cluster-aware-clients)): `true` is one node, the address each client connected to; `announce` lists the sidecars that are the nodes (IP addresses clients can reach, each once), the slots split evenly in order over those that answer (each sidecar PINGs the others every second)"),
    key("downstream_auth_password", "string or null", "null", "when set, clients must `AUTH` with it first: the password of the `default` user (every command, every key)"),
    key("users", "list of [users](#users)", "none", "ACL users; with any, clients must `AUTH` (unless a user `default` has `nopass`)"),
    key("limits", "[limits](#limits)", "Redis's defaults", "decoder limits for client input"),
    key("routes", "[routes](#routes)", "required", "which cluster serves which key"),
    key("tls", "[listener TLS](#listener-tls) or null", "null", "TLS for clients (files, reloaded when they change); see [Security: TLS](docs/security.md#tls)"),
];
/// The keys of [`LISTENER`], in order.
pub(super) const LISTENER_KEYS: &[&str] = &names::<{ LISTENER.len() }>(LISTENER);

/// A listener's `tls`.
pub(super) const LISTENER_TLS: &[Key] = &[
    key("cert", "file path", "required", "PEM certificate chain, leaf first"),
    key("key", "file path", "required", "PEM private key (PKCS#8, PKCS#1 or SEC1)"),
    key("client_ca", "file path or null", "null", "PEM CA certificates that sign client certificates: a client may present one, and it is verified against these"),
    key("require_client_cert", "bool", "`false`", "with `client_ca`: a client without a valid certificate is refused (mTLS)"),
];
/// The keys of [`LISTENER_TLS`], in order.
pub(super) const LISTENER_TLS_KEYS: &[&str] = &names::<{ LISTENER_TLS.len() }>(LISTENER_TLS);

/// A listener's user (`users[i]`).
pub(super) const USERS: &[Key] = &[
    key("name", "string", "required", "the name given to `AUTH name password`; `default` is the user of `AUTH password` and of clients that never authenticate. Unique, no spaces"),
    key("enabled", "bool", "`true`", "`false`: `AUTH` as this user fails with `-WRONGPASS`, whatever the password"),
    key("password", "string or list of strings", "none", "plaintext passwords, hashed (SHA-256) when the file is read; only the digests are kept and sent over xDS"),
    key("password_sha256", "string or list of strings", "none", "SHA-256 digests, 64 hex digits each (Redis's `#<hash>`)"),
    key("nopass", "bool", "`false`", "any password is accepted (a `default` user with `nopass` needs no `AUTH`); exclusive with passwords. A user needs passwords or `nopass`"),
    key("rules", "list of strings, or one string of space-separated rules", "every permission (`allcommands allkeys allchannels`)", "Redis ACL rules, applied left to right from no permission at all (as `ACL SETUSER` on a new user); an empty list is an error"),
    key("read_only", "bool", "`false`", "after the rules, `-@write`: only commands without the `@write` category"),
];
/// The keys of [`USERS`], in order.
pub(super) const USER_KEYS: &[&str] = &names::<{ USERS.len() }>(USERS);

/// A listener's `limits`.
pub(super) const LIMITS: &[Key] = &[
    key(
        "max_bulk_len",
        "integer ≥ 1",
        "`536870912` (512 MiB)",
        "largest bulk string (Redis `proto-max-bulk-len`)",
    ),
    key(
        "max_multibulk_len",
        "integer ≥ 1",
        "`1048576`",
        "most elements in one command",
    ),
    key(
        "max_inline_len",
        "integer ≥ 1",
        "`65536`",
        "longest inline command line",
    ),
];
/// The keys of [`LIMITS`], in order.
pub(super) const LIMITS_KEYS: &[&str] = &names::<{ LIMITS.len() }>(LIMITS);

/// A listener's `routes`.
pub(super) const ROUTES: &[Key] = &[
    key(
        "case_insensitive",
        "bool",
        "`false`",
        "match prefixes ignoring ASCII case",
    ),
    key(
        "catch_all",
        "cluster name or null",
        "null",
        "cluster for keys matching no prefix, and for key-less commands",
    ),
    key(
        "catch_all_mirrors",
        "list of [mirror](#mirror)",
        "empty",
        "mirror policies of the catch-all route; requires `catch_all`",
    ),
    key(
        "prefixes",
        "list of [prefix](#prefix)",
        "empty",
        "prefix routes",
    ),
];
/// The keys of [`ROUTES`], in order.
pub(super) const ROUTES_KEYS: &[&str] = &names::<{ ROUTES.len() }>(ROUTES);

/// A prefix route (`routes.prefixes[i]`).
pub(super) const PREFIX: &[Key] = &[
    key("prefix", "string", "required", "key prefix"),
    key("cluster", "cluster name", "required", "target cluster"),
    key(
        "remove_prefix",
        "bool",
        "`false`",
        "strip the prefix from the key before hashing and forwarding",
    ),
    key(
        "mirrors",
        "list of [mirror](#mirror)",
        "empty",
        "mirror policies of this route",
    ),
];
/// The keys of [`PREFIX`], in order.
pub(super) const PREFIX_KEYS: &[&str] = &names::<{ PREFIX.len() }>(PREFIX);

/// A mirror policy (`mirrors[i]`, `catch_all_mirrors[i]`).
pub(super) const MIRROR: &[Key] = &[
    key("cluster", "cluster name", "required", "the other cluster"),
    key("mode", "`forward`, `dual_write`, `read_only`, `prepare_move` or `move`", "`dual_write`", "`dual_write`: commands go to both clusters; one answers the client, the other gets an asynchronous copy (through a bounded queue). `forward`: no mirroring (the policy is kept, inactive). `read_only`: writes are refused with an error, reads are served. `move`: the keys move to the mirror cluster, each before the first command that names it ([move mode](docs/migration-and-resharding.md#move-mode)). `prepare_move`: the phase before `move`: commands naming a key whose owner changes are refused, the others served by the route's cluster (likewise)"),
    key("primary", "`route` or `mirror`", "`route`", "`dual_write` only: which cluster answers the client; the other one gets the copy"),
    key("include_reads", "bool", "`false`", "copy read commands too (by default only writes are copied)"),
    key("fraction", "number from 0 to 100", "`100`", "percentage of the eligible commands copied; decimals allowed down to `0.0001`"),
];
/// The keys of [`MIRROR`], in order.
pub(super) const MIRROR_KEYS: &[&str] = &names::<{ MIRROR.len() }>(MIRROR);

/// A cluster (`clusters[i]`).
pub(super) const CLUSTER: &[Key] = &[
    key("name", "string", "required", "unique name"),
    key("hash", "[hash](#hash)", "`{ policy: maglev, table_size: 65537 }`", "how keys are placed on shards"),
    key("hashtag", r#"two characters, `""` or null"#, r#"`"{}"`"#, r#"hashtag delimiters: only the part between them is hashed (`{user:1}:a` and `{user:1}:b` land together); `null` or `""` hashes whole keys"#),
    key("connections_per_endpoint", "integer ≥ 1", "`1`", "persistent connections per worker and endpoint"),
    key("max_queue_per_connection", "integer ≥ 1", "`16384`", "requests that may wait to be written on one upstream connection; beyond it a request gets an immediate error naming the shard"),
    key("dedicated_connections", "integer from 1 to 65535", "`32`", "connections one worker may have open to one endpoint for transactions (`MULTI`/`WATCH`) and blocking commands (`BLPOP`, `XREAD ... BLOCK`, ...); reused, not closed, between them; beyond it a transaction or blocking command gets an error"),
    key("connect_timeout", "duration", "`1s`", "TCP connect timeout"),
    key("auth", "[auth](#auth) or null", "null", "credentials sent with `AUTH` on every upstream connection"),
    key("db", "integer", "`0`", "database selected with `SELECT` on connect; `0` sends none"),
    key("databases", "integer from 1 to 256", "`16`", "a client may `SELECT` 0 to `databases - 1`; a client's database n is the shards' database `db` + n; connections per database are opened on first use"),
    key("read_policy", "`primary`, `prefer_replica`, `zone_local` or `any`", "`primary`", "which endpoint of a shard serves reads; see [read policy](#read-policy)"),
    key("zone_fallback", "`primary` or `any_replica`", "`primary`", "`zone_local` only: what serves reads when no replica in the sidecar's zone is healthy"),
    key("hot_keys", "list of [hot key](#hot-keys)", "empty", "keys copied to every shard"),
    key("shards", "list of [shard](#shard)", "required, not empty (none with `redis_cluster`)", "the shards, in order (order matters to even slot splits; modula sorts shards by name, as twemproxy does)"),
    key("tls", "[upstream TLS](#upstream-tls) or null", "null", "TLS to the shards, for every upstream connection (pooled, transactions, blocking commands, pub/sub, fan-outs); see [Security: TLS](docs/security.md#tls)"),
    key("health_check", "[health check](docs/operations-and-metrics.md#health-checks) or null", "null", "active checks of every endpoint (`PING` or `EXISTS drain_key`, and `ROLE`)"),
    key("near_cache", "[near cache](#near-cache-settings) or null", "null", "a cache of the cluster's read replies in every worker"),
    key("redis_cluster", "[Redis Cluster](#redis-cluster-settings) or null", "null", "the cluster is a Redis Cluster: its shards are discovered from seed nodes instead of listed (see [Redis Cluster upstreams](docs/failover-and-redis-cluster.md#redis-cluster-upstreams))"),
];
/// The keys of [`CLUSTER`], in order.
pub(super) const CLUSTER_KEYS: &[&str] = &names::<{ CLUSTER.len() }>(CLUSTER);

/// A cluster's `redis_cluster` (Envoy's `RedisClusterConfig`).
pub(super) const REDIS_CLUSTER: &[Key] = &[
    key("seeds", "list of `IP:port`", "required, not empty", "nodes asked for the topology until one answers; after the first answer every known node may be asked"),
    key("cluster_refresh_rate", "duration > 0", "`5s`", "interval between topology refreshes"),
    key("cluster_refresh_timeout", "duration > 0", "`3s`", "how long one node may take to answer a refresh"),
    key("redirect_refresh_interval", "duration > 0", "`5s`", "the least time between two refreshes triggered by redirections or failures"),
    key("redirect_refresh_threshold", "integer", "`5`", "`MOVED` redirections that trigger a refresh (`0`: never)"),
    key("failure_refresh_threshold", "integer", "`0`", "failed requests to the cluster's nodes that trigger a refresh (`0`: never)"),
    key("host_degraded_refresh_threshold", "integer", "`0`", "accepted for Envoy's sake; not used yet (respway has no per-host degraded state for Redis Cluster nodes)"),
];
/// The keys of [`REDIS_CLUSTER`], in order.
pub(super) const REDIS_CLUSTER_KEYS: &[&str] = &names::<{ REDIS_CLUSTER.len() }>(REDIS_CLUSTER);

/// A hot-key rule (`hot_keys[i]`).
pub(super) const HOT_KEY: &[Key] = &[
    key("prefix", "string", "required, not empty", "keys starting with it (case-sensitive, on the key as forwarded, after `remove_prefix`)"),
    key("read", "`round_robin`, `random` or `same_zone`", "`round_robin`", "which shard a read goes to: round-robin per client connection, a random one, or one with an endpoint in the sidecar's [zone](#node) (round-robin among those, else any)"),
];
/// The keys of [`HOT_KEY`], in order.
pub(super) const HOT_KEY_KEYS: &[&str] = &names::<{ HOT_KEY.len() }>(HOT_KEY);

/// A cluster's `near_cache`.
pub(super) const NEAR_CACHE: &[Key] = &[
    key("mode", "`tracked`, `bcast` or `ttl`", "`tracked`", "how entries learn that their key changed: Redis's tracking of the keys filled, per endpoint (`CLIENT TRACKING on REDIRECT ... OPTIN`); broadcast tracking of the prefixes (`CLIENT TRACKING ... BCAST PREFIX ...`: no server memory per key read, an invalidation for every write under the prefixes); or `max_age` alone, for servers without tracking (writes through this sidecar still invalidate)"),
    key("prefixes", "list of strings", "empty: every key", "keys cached, by prefix (case-sensitive, on the key as forwarded, after `remove_prefix`)"),
    key("admit", "`all` or `hot`", "`all`", "which of those keys are cached: every one (from its second read), or the ones each worker finds read often (see `hot_reads_per_sec`)"),
    key("max_bytes", "size", "`64mb`", "bytes of entries one worker may hold (keys, replies and a fixed overhead per entry)"),
    key("max_entry_bytes", "size, at most `max_bytes`", "`64kb`", "largest reply cached; larger ones are served but not kept"),
    key("max_age", "duration", "`60s`; `10s` in `ttl` mode", "how long an entry may be served after it was filled, whatever the mode: with a tracker the backstop (Redis ends an entry whose key changes), in `ttl` mode the bound on staleness"),
    key("hot_reads_per_sec", "integer ≥ 0", "`0`: automatic", "`admit: hot`: the estimated reads per second of a key above which it is admitted (it leaves below half of it); `0`: admission adapts to the read rate (a key read twice among a worker's last ~65,000 reads is admitted, one not read among them leaves)"),
];
/// The keys of [`NEAR_CACHE`], in order.
pub(super) const NEAR_CACHE_KEYS: &[&str] = &names::<{ NEAR_CACHE.len() }>(NEAR_CACHE);

/// A cluster's `health_check` (documented in docs/operations-and-metrics.md).
pub(super) const HEALTH_CHECK: &[Key] = &[
    key("interval", "duration > 0", "`1s`", "time between two checks of one endpoint"),
    key("timeout", "duration > 0", "`500ms`", "how long one check may take before it counts as failed"),
    key("unhealthy_threshold", "integer ≥ 1", "`3`", "failed checks in a row that take a healthy endpoint out of rotation"),
    key("healthy_threshold", "integer ≥ 1", "`2`", "passed checks in a row that put an unhealthy endpoint back"),
    key("drain_key", "string or null", "null", "Envoy's Redis health checker `key`: while `EXISTS drain_key` answers 1 the endpoint is out of rotation (draining)"),
];
/// The keys of [`HEALTH_CHECK`], in order.
pub(super) const HEALTH_CHECK_KEYS: &[&str] = &names::<{ HEALTH_CHECK.len() }>(HEALTH_CHECK);

/// Credentials: a cluster's, an endpoint's or a Sentinel shard's `auth`.
pub(super) const AUTH: &[Key] = &[
    key(
        "username",
        "string or null",
        "null",
        "ACL user; null sends the one-argument `AUTH password`",
    ),
    key("password", "string", "", "the password, inline"),
    key(
        "password_file",
        "path",
        "",
        r#"a file holding the password, read when the configuration is loaded (its trailing newline, `\n` or `\r\n`, is not part of it)"#,
    ),
    key(
        "password_env",
        "name",
        "",
        "an environment variable holding the password",
    ),
];
/// The keys of [`AUTH`], in order.
pub(super) const AUTH_KEYS: &[&str] = &names::<{ AUTH.len() }>(AUTH);

/// A cluster's `tls`.
pub(super) const CLUSTER_TLS: &[Key] = &[
    key("ca", "file path", "required unless `insecure_skip_verify`", "PEM CA certificates the shards' certificates must chain to; respway has no built-in roots"),
    key("cert", "file path or null", "null", "PEM client certificate chain, for shards that verify clients (`tls-auth-clients yes`); with `key`"),
    key("key", "file path or null", "null", "PEM private key of `cert`"),
    key("server_name", "DNS name or IP, or null", "the endpoint's IP address", "sent as SNI; the shard's certificate must be valid for it"),
    key("insecure_skip_verify", "bool", "`false`", "accept any certificate (no `ca` then); logged at warn whenever it is loaded"),
];
/// The keys of [`CLUSTER_TLS`], in order.
pub(super) const CLUSTER_TLS_KEYS: &[&str] = &names::<{ CLUSTER_TLS.len() }>(CLUSTER_TLS);

/// A shard (`shards[i]`).
pub(super) const SHARD: &[Key] = &[
    key("name", "string", "`shard-<index>`", "unique in the cluster; shown in errors and stats"),
    key("hash_key", "string or null", "see below", "the string the shard is placed by (Envoy's `envoy.lb` `hash_key`; twemproxy's server name)"),
    key("weight", "integer ≥ 1", "`1`", "relative weight (maglev, ring hash, ketama, modula)"),
    key("slots", "list of slots", "empty", r#"slot policies only: the slots this shard owns, each `"N"`, `"FIRST-LAST"` (inclusive) or an integer"#),
    key("endpoints", "list of [endpoint](#endpoint)", "required unless `sentinel`, 1 to 65535", "the shard's primary and replicas"),
    key("sentinel", "[sentinel](#sentinel-managed-shards) or null", "null", "instead of `endpoints`: the Sentinels that name the shard's primary and replicas"),
];
/// The keys of [`SHARD`], in order.
pub(super) const SHARD_KEYS: &[&str] = &names::<{ SHARD.len() }>(SHARD);

/// An endpoint (`endpoints[i]`).
pub(super) const ENDPOINT: &[Key] = &[
    key("address", "`IP:port`", "required", "the Redis server"),
    key("role", "`primary` or `replica`", "`primary` when it is the shard's only endpoint, else required", "writes go to the primary; reads may use replicas"),
    key("zone", "string or null", "null", "locality zone, for same-zone reads"),
    key("auth", "[auth](#auth) or null", "null", "this endpoint's own credentials, sent instead of the cluster's `auth` (Envoy's per-upstream `RedisProtocolOptions.credentials`)"),
];
/// The keys of [`ENDPOINT`], in order.
pub(super) const ENDPOINT_KEYS: &[&str] = &names::<{ ENDPOINT.len() }>(ENDPOINT);

/// A shard's `sentinel`.
pub(super) const SENTINEL: &[Key] = &[
    key("master", "string", "required", "the master's name on the Sentinels"),
    key("sentinels", "list of `IP:port`", "required, at least one", "every one is asked and subscribed to"),
    key("auth", "[auth](#auth) or null", "null", "sent to the Sentinels (the cluster's `auth` is for the data nodes and is never sent to a Sentinel)"),
    key("zones", "map of `IP:port` to zone, or null", "null", "the zones of the data nodes the Sentinels may name (Sentinel knows none), for `zone_local` reads; a node not listed has no zone"),
    key("failover_hold", "duration", "`5s`", "how long writes to the shard are held (not sent, not refused) from the first Sentinel event that says a failover of the master began until `+switch-master` names the new primary; `0s`: never held; at most `10s`"),
    key("serve_stale_reads", "bool", "`true`", "while the primary is down and no switch has happened, the replicas that were in the read rotation keep serving reads (the freshest data there is; it may fall behind); `false`: they leave the rotation as soon as the Sentinels see them unlinked, and reads go to the primary, failing while it is down"),
];
/// The keys of [`SENTINEL`], in order.
pub(super) const SENTINEL_KEYS: &[&str] = &names::<{ SENTINEL.len() }>(SENTINEL);
/// `targets` of a `respway-xds` resource file (documented in docs/xds.md).
pub(super) const TARGETS: &[Key] = &[
    key(
        "node_ids",
        "list of strings",
        "empty",
        "sidecars whose `node.id` is listed",
    ),
    key(
        "zones",
        "list of strings",
        "empty",
        "sidecars whose `node.locality.zone` is listed",
    ),
];
/// The keys of [`TARGETS`], in order.
pub(super) const TARGETS_KEYS: &[&str] = &names::<{ TARGETS.len() }>(TARGETS);

/// The top level of a `respway-xds` resource file: [`TOP`]'s keys and `targets` (`node` is
/// known only to be refused with a message of its own); docs/xds.md describes it in prose.
pub(super) const FRAGMENT_TOP_KEYS: &[&str] = &["targets", "listeners", "clusters", "node"];

/// `cluster_emulation: { announce: [...] }`, described in [`LISTENER`]'s `cluster_emulation`.
pub(super) const EMULATION_KEYS: &[&str] = &["announce"];

/// A placement policy of a cluster's `hash`.
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "the texts are read by the reference pages' test")
)]
pub(super) struct Policy {
    /// Its `policy` value.
    pub(super) name: &'static str,
    /// Its other keys (their meaning is not used: the type and default say it).
    pub(super) keys: &'static [Key],
    /// The keys a `hash` of this policy may have: `policy` and [`Policy::keys`].
    pub(super) known: &'static [&'static str],
    /// What it places keys like.
    pub(super) like: &'static str,
}

const MAGLEV: &[Key] = &[key("table_size", "a prime ≤ 5000011", "`65537`", "")];
const RING_HASH: &[Key] = &[
    key("minimum_ring_size", "integer ≥ 1", "`1024`", ""),
    key(
        "maximum_ring_size",
        "integer from `minimum_ring_size` to 8388608",
        "`8388608`",
        "",
    ),
    key("function", "`xx_hash` or `murmur_hash_2`", "`xx_hash`", ""),
];
const KEY_HASH: &[Key] = &[key("key_hash", "a key hash (below)", "`fnv1a_64`", "")];
const CRC32_SLOTS: &[Key] = &[key("slots", "integer from 1 to 1048576", "`1024`", "")];

/// Every placement policy, in the order the unknown-policy error names them.
pub(super) const POLICIES: &[Policy] = &[
    Policy {
        name: "maglev",
        keys: MAGLEV,
        known: &policy_names::<{ MAGLEV.len() + 1 }>(MAGLEV),
        like: "Envoy's maglev with the Redis proxy's key hash",
    },
    Policy {
        name: "ring_hash",
        keys: RING_HASH,
        known: &policy_names::<{ RING_HASH.len() + 1 }>(RING_HASH),
        like: "Envoy's ring hash",
    },
    Policy {
        name: "ketama",
        keys: KEY_HASH,
        known: &policy_names::<{ KEY_HASH.len() + 1 }>(KEY_HASH),
        like: "twemproxy `distribution: ketama`",
    },
    Policy {
        name: "modula",
        keys: KEY_HASH,
        known: &policy_names::<{ KEY_HASH.len() + 1 }>(KEY_HASH),
        like: "twemproxy `distribution: modula`",
    },
    Policy {
        name: "crc32_slots",
        keys: CRC32_SLOTS,
        known: &policy_names::<{ CRC32_SLOTS.len() + 1 }>(CRC32_SLOTS),
        like: "Codis: `crc32(key) % slots`, then a slot table",
    },
    Policy {
        name: "crc16_slots",
        keys: &[],
        known: &policy_names::<1>(&[]),
        like: "Redis Cluster: `crc16(key) % 16384`, then a slot table",
    },
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use respway_testkit::{cell, check_generated, Block};

    use super::*;

    const CONFIGURATION: &str = "docs/configuration.md";
    const OPERATIONS: &str = "docs/operations-and-metrics.md";
    const XDS: &str = "docs/xds.md";

    /// How the pages' tables are rewritten after a change to the tables above.
    const BLESS: &str = "RESPWAY_BLESS=1 cargo test -p respway-xds --lib yaml::reference";

    /// `(block id, page, name, keys)` for each listed table, the name as written.
    macro_rules! tables {
        ($(($id:literal, $page:expr, $keys:ident)),* $(,)?) => {
            &[$(($id, $page, stringify!($keys), $keys)),*]
        };
    }

    /// Every key table: its block's id (after `config.`), the page it is in, its name, its
    /// keys.
    const TABLES: &[(&str, &str, &str, &[Key])] = tables![
        ("top", CONFIGURATION, TOP),
        ("node", CONFIGURATION, NODE),
        ("listener", CONFIGURATION, LISTENER),
        ("listener_tls", CONFIGURATION, LISTENER_TLS),
        ("users", CONFIGURATION, USERS),
        ("limits", CONFIGURATION, LIMITS),
        ("routes", CONFIGURATION, ROUTES),
        ("prefix", CONFIGURATION, PREFIX),
        ("mirror", CONFIGURATION, MIRROR),
        ("cluster", CONFIGURATION, CLUSTER),
        ("redis_cluster", CONFIGURATION, REDIS_CLUSTER),
        ("hot_keys", CONFIGURATION, HOT_KEY),
        ("near_cache", CONFIGURATION, NEAR_CACHE),
        ("auth", CONFIGURATION, AUTH),
        ("upstream_tls", CONFIGURATION, CLUSTER_TLS),
        ("shard", CONFIGURATION, SHARD),
        ("endpoint", CONFIGURATION, ENDPOINT),
        ("sentinel", CONFIGURATION, SENTINEL),
        ("health_check", OPERATIONS, HEALTH_CHECK),
        ("targets", XDS, TARGETS),
    ];

    /// The folder of every page above, which their links are made relative to.
    const DIR: &str = "docs";

    fn key_table(keys: &[Key]) -> String {
        let mut out = String::from("\n| key | type | default | meaning |\n|---|---|---|---|\n");
        for k in keys {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                k.name,
                cell(k.ty, DIR),
                cell(k.default, DIR),
                cell(k.meaning, DIR)
            ));
        }
        out.push('\n');
        out
    }

    fn hash_table() -> String {
        let mut out =
            String::from("\n| policy | keys (default): type | places keys like |\n|---|---|---|\n");
        for p in POLICIES {
            let keys: Vec<String> = p
                .keys
                .iter()
                .map(|k| format!("`{}` ({}): {}", k.name, k.default, k.ty))
                .collect();
            let keys = if keys.is_empty() {
                "—".to_string()
            } else {
                keys.join("; ")
            };
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                p.name,
                cell(&keys, DIR),
                cell(p.like, DIR)
            ));
        }
        out.push('\n');
        out
    }

    fn block(id: &str, body: String) -> Block {
        Block {
            id: format!("config.{id}"),
            note: format!("from xds/src/yaml/reference.rs: edit it, then run `{BLESS}`"),
            body,
        }
    }

    /// The generated blocks of `page`.
    fn blocks(page: &str) -> Vec<Block> {
        let mut out: Vec<Block> = TABLES
            .iter()
            .filter(|(_, p, _, _)| *p == page)
            .map(|(id, _, _, keys)| block(id, key_table(keys)))
            .collect();
        if page == CONFIGURATION {
            out.push(block("hash", hash_table()));
        }
        out
    }

    /// Each page's key tables are the ones the tables above render, word for word.
    #[test]
    fn the_pages_key_tables_are_the_generated_ones() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for page in [CONFIGURATION, OPERATIONS, XDS] {
            check_generated(&root, page, "config.", &blocks(page), BLESS);
        }
    }

    /// Every table of this file is rendered into a page, every key has its words, no key is
    /// listed twice, and the known-key lists that are not tables say what they must.
    #[test]
    fn every_table_is_rendered_and_whole() {
        let source = include_str!("reference.rs");
        let declared: BTreeSet<&str> = source
            .lines()
            .filter_map(|l| l.strip_prefix("pub(super) const "))
            .filter_map(|l| l.split_once(": &[Key]").map(|(name, _)| name))
            .collect();
        let rendered: BTreeSet<&str> = TABLES.iter().map(|(_, _, name, _)| *name).collect();
        assert_eq!(declared, rendered, "a key table is rendered into no page");
        for (id, _, _, keys) in TABLES {
            let mut seen = BTreeSet::new();
            for k in *keys {
                assert!(seen.insert(k.name), "{id}: {} twice", k.name);
                assert!(!k.ty.is_empty() && !k.meaning.is_empty(), "{id}.{}", k.name);
                for text in [k.ty, k.default, k.meaning] {
                    assert!(!text.contains('\n'), "{id}.{}: more than a line", k.name);
                }
            }
        }
        for (file, text) in [
            ("mod.rs", include_str!("mod.rs")),
            ("listener.rs", include_str!("listener.rs")),
            ("cluster.rs", include_str!("cluster.rs")),
            ("shards.rs", include_str!("shards.rs")),
            ("redis_cluster.rs", include_str!("redis_cluster.rs")),
        ] {
            assert!(
                !text.contains("_KEYS: &[&str] = &["),
                "{file} lists known keys of its own: list them here, with their words"
            );
        }
        let top: BTreeSet<&str> = TOP_KEYS.iter().copied().chain(["targets"]).collect();
        let fragment: BTreeSet<&str> = FRAGMENT_TOP_KEYS.iter().copied().collect();
        assert_eq!(
            top, fragment,
            "a resource file's top level is a sidecar's and targets"
        );
        let emulation = LISTENER
            .iter()
            .find(|k| k.name == "cluster_emulation")
            .expect("cluster_emulation");
        for k in EMULATION_KEYS {
            assert!(
                emulation.ty.contains(k),
                "cluster_emulation does not name {k}"
            );
        }
    }
}

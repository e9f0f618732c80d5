//! The table of every metric family: what `/metrics` writes, in order, and what the
//! documentation's metrics table is rendered from.

use super::*;

use Kind::{Counter, Gauge, Histogram};

/// Every metric family, in the order `/metrics` writes them (and `INFO proxy` its fields).
pub(crate) static FAMILIES: &[MetricFamily] = &[
    series(
        "respway_build_info",
        Gauge,
        "The running build: its version and the git commit it was built from (as respway --version says).",
        &["version", "commit"],
        scrape::build_info,
    )
    .with_doc("Always 1."),
    process(
        "respway_config_version",
        Gauge,
        "Version of the configuration being served (1 = the first applied).",
        |p| p.config_version,
        "config_version",
    ),
    process("respway_workers", Gauge, "Worker threads.", |p| p.workers, "workers"),
    os(
        "process_cpu_seconds_total",
        Counter,
        "Total user and system CPU time spent in seconds.",
        scrape::cpu_seconds,
    ),
    os(
        "process_resident_memory_bytes",
        Gauge,
        "Resident memory size in bytes.",
        scrape::resident_bytes,
    ),
    os(
        "process_virtual_memory_bytes",
        Gauge,
        "Virtual memory size in bytes.",
        scrape::virtual_bytes,
    ),
    os(
        "process_open_fds",
        Gauge,
        "Number of open file descriptors.",
        scrape::open_fds,
    ),
    os(
        "process_max_fds",
        Gauge,
        "Maximum number of open file descriptors (the soft RLIMIT_NOFILE).",
        scrape::max_fds,
    ),
    os(
        "process_start_time_seconds",
        Gauge,
        "Start time of the process since unix epoch in seconds.",
        scrape::start_time,
    ),
    series(
        "respway_tls_certificate_expiry_timestamp_seconds",
        Gauge,
        "notAfter (Unix time) of each certificate file in use by a listener or cluster, by the setting naming it (cert, ca, client_ca); for a file of several certificates, the earliest.",
        &["listener", "cluster", "certificate"],
        scrape::certificate_expiry,
    )
    .with_doc("See [TLS](docs/security.md#tls)."),
    series(
        "respway_accept_errors_total",
        Counter,
        "Failed accepts since start, process-wide, by socket (listeners: the RESP listeners; admin) and reason (emfile: out of file descriptors; enfile: the system is; other).",
        &["socket", "reason"],
        scrape::accept_failures,
    )
    .with_doc("Process-wide, as descriptors run out per process; every socket and reason is listed, at 0 from the start."),
    listener(
        "respway_downstream_connections_active",
        Gauge,
        "Client connections open.",
        |t| t.active,
        Some(Info {
            field: "connected_clients",
            section: Some("clients"),
            read: InfoRead::Same,
        }),
    ),
    listener(
        "respway_downstream_connections_total",
        Counter,
        "Client connections accepted.",
        |t| t.connections,
        Some(Info {
            field: "total_connections_received",
            section: Some("stats"),
            read: InfoRead::Same,
        }),
    ),
    listener(
        "respway_downstream_received_bytes_total",
        Counter,
        "Bytes read from clients.",
        |t| t.bytes_in,
        None,
    ),
    listener(
        "respway_downstream_sent_bytes_total",
        Counter,
        "Bytes written to clients.",
        |t| t.bytes_out,
        None,
    ),
    listener(
        "respway_protocol_errors_total",
        Counter,
        "Client streams closed for a RESP protocol error.",
        |t| t.protocol_errors,
        same("protocol_errors"),
    ),
    listener(
        "respway_unsupported_commands_total",
        Counter,
        "Commands refused as not supported.",
        |t| t.unsupported,
        same("unsupported_commands"),
    ),
    listener(
        "respway_session_timeouts_total",
        Counter,
        "Commands the session answered with a timeout itself.",
        |t| t.timeouts,
        same("upstream_timeouts"),
    ),
    listener(
        "respway_client_output_buffer_limit_disconnections_total",
        Counter,
        "Clients disconnected for holding too many reply bytes.",
        |t| t.output_limit_closes,
        same("client_output_buffer_limit_disconnections"),
    ),
    listener(
        "respway_auth_failures_total",
        Counter,
        "Failed AUTH attempts.",
        |t| t.auth_failures,
        same("auth_failures"),
    ),
    listener(
        "respway_auth_tarpitted_total",
        Counter,
        "Failed AUTH attempts answered late, past the process's rate of failures.",
        |t| t.auth_tarpitted,
        same("auth_tarpitted"),
    ),
    listener(
        "respway_tls_handshake_failures_total",
        Counter,
        "TLS handshakes with clients that failed or timed out.",
        |t| t.tls_handshake_failures,
        same("tls_handshake_failures"),
    )
    .with_doc("See [TLS](docs/security.md#tls)."),
    listener(
        "respway_tls_plaintext_refused_total",
        Counter,
        "Plaintext clients on a TLS listener, closed.",
        |t| t.tls_plaintext_refused,
        same("tls_plaintext_connections_refused"),
    )
    .with_doc("See [TLS](docs/security.md#tls)."),
    MetricFamily {
        doc: "Buckets 1, 2, 4 … 1024: how deep clients pipeline.",
        info: Some(Info {
            field: "total_commands_processed",
            section: Some("stats"),
            read: InfoRead::Process(|p| p.totals.commands),
        }),
        ..series(
            "respway_downstream_pipeline_depth",
            Histogram,
            "Reads from clients by the commands each held (pipeline depth).",
            LISTENER,
            scrape::pipeline_depth,
        )
    },
    series(
        "respway_commands_total",
        Counter,
        "Commands answered, by top-level command (a command learned from the shards by its own name, for the first 64 learned; other unknown names as `other`) and its family (read, write, blocking, connection, other).",
        COMMAND,
        scrape::command_calls,
    )
    .with_doc("The top-level command: `client|setname` counts as `client`; the families are described below the table."),
    series(
        "respway_command_errors_total",
        Counter,
        "Commands answered with an error reply (family connection: HELLO, AUTH, CLIENT, SELECT... which clients may send on connect and see refused).",
        COMMAND,
        scrape::command_errors,
    ),
    series(
        "respway_command_seconds_total",
        Counter,
        "Time from dispatch to reply ready, summed over the commands answered (divided by respway_commands_total: the command's mean latency).",
        COMMAND,
        scrape::command_seconds,
    ),
    series(
        "respway_command_duration_seconds",
        Histogram,
        "Time from dispatch to reply ready (respway plus upstream), by listener and command family (read, write, blocking, connection, other).",
        &["listener", "family"],
        scrape::command_duration,
    )
    .with_doc("Commands answered by respway itself count 0. 4 buckets per power of two from 16 µs to ~2 s, so p50 … p99.99 read from it are within 25%."),
    series(
        "respway_config_changes_total",
        Counter,
        "Configuration changes by source (xds, file) and outcome (applied = ACK, refused = NACK: the last good configuration stays).",
        &["source", "outcome"],
        scrape::config_changes,
    )
    .with_doc("Source `file` is a SIGHUP reload; every source and outcome is listed from the start, at 0."),
    series(
        "respway_config_last_change_timestamp_seconds",
        Gauge,
        "Unix time of the last applied and of the last refused configuration change, by source.",
        &["source", "outcome"],
        scrape::config_last_change,
    ),
    series(
        "respway_mirror_copies_total",
        Counter,
        "Mirrored copies per receiving cluster: queued (mirrored), dropped (queue full), failed upstream, applied (answered without an error); over configuration pushes.",
        &["listener", "cluster", "outcome"],
        scrape::mirror_copies,
    )
    .with_doc("As `INFO mirror` shows them; `mirrored - applied - failed` are still queued or in flight."),
    series(
        "respway_mirror_moves_total",
        Counter,
        "Move mode: MIGRATEs per receiving cluster that moved keys (moved), found none of them on the old shard (absent), or failed (failed: the command was not run); over configuration pushes.",
        &["listener", "cluster", "outcome"],
        scrape::mirror_moves,
    )
    .with_doc("`absent`: the old shard answered `NOKEY`. As `INFO mirror`'s `moved`, `absent` and `move_failed`; see [move mode](docs/migration-and-resharding.md#move-mode)."),
    series(
        "respway_hot_key_rule_writes_total",
        Counter,
        "Writes under a hot-key rule, run on the key's home shard and copied to every other shard (outcome: all, or partial_failure when a copy failed).",
        &["listener", "cluster", "prefix", "outcome"],
        scrape::hot_key_rule_writes,
    )
    .with_doc("As `INFO hotkeys` shows them, kept over configuration pushes; see [hot keys](docs/caching.md#hot-keys)."),
    series(
        "respway_hot_key_read_fallbacks_total",
        Counter,
        "Reads of a hot key's copy that said the key does not exist (or failed), sent again to the key's home shard.",
        &["listener", "cluster", "prefix"],
        scrape::hot_key_read_fallbacks,
    ),
    series(
        "respway_hot_key_copy_state",
        Gauge,
        "1 for the state of each hot-key rule's copy pass (copying, done: reads spread, failed: retried), 0 for the others.",
        &["cluster", "prefix", "state"],
        scrape::hot_key_copy_state,
    ),
    series(
        "respway_hot_key_copied_keys",
        Gauge,
        "Keys the current (or last) copy pass of a hot-key rule has copied from their home shard to every other shard.",
        &["cluster", "prefix"],
        scrape::hot_key_copied_keys,
    ),
    series(
        "respway_hot_key_requests",
        Gauge,
        "Estimated requests of the hottest keys per cluster over the last one to two minutes (hot-key detection).",
        &["cluster", "key"],
        scrape::hot_key_requests,
    )
    .with_doc("The 5 hottest keys of each cluster; see [hot-key detection](#hot-key-detection)."),
    endpoint(
        "respway_upstream_requests_total",
        Counter,
        "Requests sent to each endpoint (per-shard load; counted from when its pools were created).",
        |v| Some(Value::Int(v.requests)),
        None,
    )
    .with_doc("A configuration change that keeps the endpoint keeps its count."),
    endpoint(
        "respway_upstream_queued_requests",
        Gauge,
        "Requests waiting now in the queues of each endpoint's shared connections (not yet written).",
        |v| Some(Value::Int(v.queued as u64)),
        None,
    )
    .with_doc("Read from the queues at scrape time."),
    endpoint(
        "respway_upstream_inflight_requests",
        Gauge,
        "Requests sent on each endpoint's connections (shared and dedicated) and not yet answered, now: the queue in the shard and on the wire (respway_upstream_queued_requests: not yet sent).",
        |v| Some(Value::Int(v.inflight)),
        None,
    )
    .with_doc("Kept per connection, added into a per-worker count, summed at scrape."),
    endpoint(
        "respway_upstream_connections",
        Gauge,
        "Connections open now to each endpoint (shared and dedicated, every worker).",
        |v| Some(Value::Int(v.connections)),
        None,
    ),
    endpoint(
        "respway_upstream_connects_total",
        Counter,
        "Connections opened to each endpoint (first connects and reconnects; counted from when its pools were created).",
        |v| Some(Value::Int(v.connects)),
        Some(proxy(
            "upstream_connects",
            InfoRead::Process(|p| p.upstream.connects),
        )),
    )
    .with_doc("`INFO proxy` keeps the process total."),
    endpoint(
        "respway_upstream_connect_failures_total",
        Counter,
        "Failed connect attempts to each endpoint (counted from when its pools were created).",
        |v| Some(Value::Int(v.connect_failures)),
        Some(proxy(
            "upstream_connect_failures",
            InfoRead::Process(|p| p.upstream.connect_failures),
        )),
    )
    .with_doc("`INFO proxy` keeps the process total."),
    endpoint(
        "respway_upstream_duration_seconds",
        Histogram,
        "Time each endpoint took per request, from the write of its batch to its reply (compare with respway_command_duration_seconds: the difference is time in respway).",
        |v| v.latency.as_ref().map(Value::Latency),
        None,
    ),
    MetricFamily {
        doc: "Every kind is listed for every endpoint; the kinds are those of the `INFO proxy` fields, which keep the process totals. See [Failures and limits](docs/failover-and-redis-cluster.md#failures-and-limits).",
        info: Some(proxy(
            "upstream_errors_",
            InfoRead::PerKind(scrape::upstream_errors_by_kind),
        )),
        ..series(
            "respway_upstream_errors_total",
            Counter,
            "Requests to each endpoint that failed in respway, by kind (counted from when its pools were created).",
            &["cluster", "shard", "endpoint", "kind"],
            scrape::upstream_errors,
        )
    },
    endpoint(
        "respway_upstream_healthy",
        Gauge,
        "Share of workers that have the endpoint in (1: every worker can reach it; 0: every worker has it out after a failed connect).",
        |v| {
            Some(Value::Float(if v.workers == 0 {
                1.0
            } else {
                v.healthy_workers as f64 / v.workers as f64
            }))
        },
        None,
    )
    .with_doc("See [outliers](#outliers-endpoints-out-of-rotation)."),
    endpoint(
        "respway_upstream_check_healthy",
        Gauge,
        "1 while the active health check has the endpoint in rotation, 0 while it is unhealthy or draining (endpoints of clusters with a health_check only).",
        |v| v.check.as_ref().map(|c| Value::Int(u64::from(c.in_rotation))),
        None,
    )
    .with_doc("See [health checks](#health-checks)."),
    endpoint(
        "respway_upstream_check_demoted",
        Gauge,
        "1 while the endpoint, configured as its shard's primary, answers ROLE as a replica and writes to the shard are refused (endpoints of clusters with a health_check only).",
        |v| v.check.as_ref().map(|c| Value::Int(u64::from(c.state == "demoted"))),
        None,
    ),
    endpoint(
        "respway_upstream_check_transitions_total",
        Counter,
        "Times the active health check changed the endpoint's state (healthy, unhealthy, draining, demoted).",
        |v| v.check.as_ref().map(|c| Value::Int(c.transitions)),
        None,
    ),
    series(
        "respway_near_cache_hits_total",
        Counter,
        "Reads served from the near cache (summed over workers).",
        &["cluster"],
        scrape::near_cache::<0>,
    )
    .with_doc("See [near cache](docs/caching.md#near-cache)."),
    series(
        "respway_near_cache_misses_total",
        Counter,
        "Cacheable reads the near cache did not hold (or held no longer): sent to the shard.",
        &["cluster"],
        scrape::near_cache::<1>,
    ),
    series(
        "respway_near_cache_fills_total",
        Counter,
        "Replies kept by the near cache.",
        &["cluster"],
        scrape::near_cache::<2>,
    ),
    series(
        "respway_near_cache_fills_dropped_total",
        Counter,
        "Replies not kept: a write, an invalidation, a lost connection or tracker came between the read and its reply, or the tracking commands failed.",
        &["cluster"],
        scrape::near_cache::<3>,
    ),
    series(
        "respway_near_cache_too_large_total",
        Counter,
        "Replies larger than near_cache.max_entry_bytes, served but not kept.",
        &["cluster"],
        scrape::near_cache::<4>,
    ),
    series(
        "respway_near_cache_invalidations_total",
        Counter,
        "Keys named by the invalidations Redis sent to the near cache's trackers.",
        &["cluster"],
        scrape::near_cache::<5>,
    ),
    series(
        "respway_near_cache_flushes_total",
        Counter,
        "Times every near-cache entry of an endpoint ended at once because its tracker was lost or came back, or Redis sent a flush.",
        &["cluster"],
        scrape::near_cache::<6>,
    ),
    series(
        "respway_near_cache_evictions_total",
        Counter,
        "Near-cache entries evicted to stay within near_cache.max_bytes.",
        &["cluster"],
        scrape::near_cache::<7>,
    ),
    series(
        "respway_near_cache_not_admitted_total",
        Counter,
        "Cacheable reads not cached: with admit: all, the first read of a key in the doorkeeper's window; with admit: hot, reads of keys that are not hot.",
        &["cluster"],
        scrape::near_cache::<8>,
    ),
    series(
        "respway_near_cache_entries",
        Gauge,
        "Near-cache entries held now (every worker).",
        &["cluster"],
        scrape::near_cache::<9>,
    ),
    series(
        "respway_near_cache_bytes",
        Gauge,
        "Bytes the near cache holds now: keys, replies and a fixed overhead per entry (every worker).",
        &["cluster"],
        scrape::near_cache::<10>,
    )
    .with_doc("The overhead is 160 bytes per entry."),
    series(
        "respway_near_cache_trackers_up",
        Gauge,
        "Near-cache trackers connected now (one per worker and endpoint in tracked and bcast modes).",
        &["cluster"],
        scrape::near_cache::<11>,
    ),
    series(
        "respway_near_cache_hot_keys",
        Gauge,
        "Keys admitted to the near cache as hot now (admit: hot; a key admitted by several workers counts once per worker).",
        &["cluster"],
        scrape::near_cache::<12>,
    ),
    process(
        "respway_client_tracking_sessions",
        Gauge,
        "Client connections with CLIENT TRACKING on now (client-side caching through the sidecar).",
        |_| crate::stats::process::TRACKING_SESSIONS.load(std::sync::atomic::Ordering::Relaxed) as u64,
        "client_tracking_sessions",
    )
    .with_doc("See [client-side caching](docs/caching.md#client-side-caching-client-tracking)."),
    process(
        "respway_client_tracking_announced_keys_total",
        Counter,
        "Keys named in invalidation pushes to tracking clients.",
        |_| crate::stats::process::TRACKING_ANNOUNCED_KEYS.load(std::sync::atomic::Ordering::Relaxed),
        "client_tracking_announced_keys",
    ),
    process(
        "respway_client_tracking_flushes_total",
        Counter,
        "Invalidation pushes to tracking clients that name every key (a key-less write, a tracker or upstream connection lost, too many keys followed).",
        |_| crate::stats::process::TRACKING_ANNOUNCED_FLUSHES.load(std::sync::atomic::Ordering::Relaxed),
        "client_tracking_flushes",
    ),
    process(
        "respway_client_tracking_unfollowed_reads_total",
        Counter,
        "Reads of tracking clients that Redis could not follow (no tracked near cache on the cluster, its tracker down, a read in MULTI), announced right after their reply.",
        |_| crate::stats::process::TRACKING_UNFOLLOWED_READS.load(std::sync::atomic::Ordering::Relaxed),
        "client_tracking_unfollowed_reads",
    ),
    series(
        "respway_sentinel_answering",
        Gauge,
        "Sentinels of a Sentinel-managed shard that answered the last round (asked every second and on each event about its master).",
        &["cluster", "shard"],
        scrape::sentinel_answering,
    )
    .with_doc("See [Sentinel-managed shards](docs/failover-and-redis-cluster.md#sentinel-managed-shards)."),
    series(
        "respway_sentinel_primary_changes_total",
        Counter,
        "Times the Sentinels named a new primary for a Sentinel-managed shard (failovers followed).",
        &["cluster", "shard"],
        scrape::sentinel_primary_changes,
    ),
    series(
        "respway_sentinel_failover_holds_total",
        Counter,
        "Failovers of a Sentinel-managed shard during which its writes were held (from the first Sentinel event of the failover until the new primary was published, at most the shard's failover_hold).",
        &["cluster", "shard"],
        scrape::sentinel_holds,
    )
    .with_doc("See [Planned failovers lose no write](docs/failover-and-redis-cluster.md#planned-failovers-lose-no-write)."),
    series(
        "respway_sentinel_held_writes_total",
        Counter,
        "Writes to a Sentinel-managed shard held during a failover, then sent to the new primary (or, when no switch came within failover_hold, to the primary known then).",
        &["cluster", "shard"],
        scrape::sentinel_held_writes,
    ),
    series(
        "respway_cluster_emulation_node_up",
        Gauge,
        "Whether a sidecar that a listener's cluster emulation announces is in the emulated cluster's map (1), or out after 3 failed PINGs in a row (0, back after 2 answered); a listener's own configured address is not checked and stays 1.",
        &["listener", "node"],
        scrape::peer_up,
    )
    .with_doc("One series per listener announcing two sidecars or more, and per announced address (`node`, `IP:port`). See [Cluster emulation](docs/commands.md#cluster-emulation-for-cluster-aware-clients)."),
    series(
        "respway_cluster_emulation_node_changes_total",
        Counter,
        "Times an announced sidecar went out of the emulated cluster's map or came back.",
        &["listener", "node"],
        scrape::peer_changes,
    ),
    endpoint(
        "respway_upstream_ejections_total",
        Counter,
        "Times a worker took the endpoint out (a failed connect, or a connection lost right after it opened).",
        |v| Some(Value::Int(v.ejections)),
        None,
    ),
    process(
        "respway_redis_cluster_refreshes_total",
        Counter,
        "Redis Cluster topology refreshes a node answered (CLUSTER SHARDS or CLUSTER SLOTS).",
        |_| crate::stats::process::REDIS_CLUSTER_REFRESHES.load(std::sync::atomic::Ordering::Relaxed),
        "redis_cluster_refreshes",
    )
    .with_doc("See [Redis Cluster upstreams](docs/failover-and-redis-cluster.md#redis-cluster-upstreams)."),
    process(
        "respway_redis_cluster_topology_changes_total",
        Counter,
        "Redis Cluster topology refreshes that found a change (slots moved, a failover, a node added or gone), each swapped in as a configuration change.",
        |_| crate::stats::process::REDIS_CLUSTER_CHANGES.load(std::sync::atomic::Ordering::Relaxed),
        "redis_cluster_topology_changes",
    ),
    process(
        "respway_redis_cluster_moved_total",
        Counter,
        "MOVED redirections of Redis Cluster nodes that respway followed (the command sent again to the slot's new owner).",
        |_| crate::stats::process::REDIS_CLUSTER_REDIRECTS[0].load(std::sync::atomic::Ordering::Relaxed),
        "redis_cluster_moved",
    ),
    process(
        "respway_redis_cluster_ask_total",
        Counter,
        "ASK redirections of Redis Cluster nodes that respway followed (ASKING and the command sent to the importing node).",
        |_| crate::stats::process::REDIS_CLUSTER_REDIRECTS[1].load(std::sync::atomic::Ordering::Relaxed),
        "redis_cluster_ask",
    ),
    process(
        "respway_redis_cluster_tryagain_total",
        Counter,
        "TRYAGAIN answers of Redis Cluster nodes after which respway sent the command again.",
        |_| crate::stats::process::REDIS_CLUSTER_REDIRECTS[2].load(std::sync::atomic::Ordering::Relaxed),
        "redis_cluster_tryagain",
    )
    .with_doc("The command is sent again after a pause."),
    process(
        "respway_upstream_stuck_connections_total",
        Counter,
        "Upstream connections replaced because requests on them stopped being answered.",
        |p| p.upstream.stuck,
        "upstream_stuck_connections",
    ),
    process(
        "respway_upstream_protocol_errors_total",
        Counter,
        "Upstream connections closed because the peer broke the protocol.",
        |p| p.upstream.protocol_errors,
        "upstream_protocol_errors",
    ),
];

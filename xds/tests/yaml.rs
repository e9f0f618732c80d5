//! The YAML schema end to end: the full example, every default, and the exact text of errors.

use std::path::Path;
use std::time::Duration;

use respway_filters::codec_limits::Limits;
use respway_filters::model::{
    ClientLimits, Cluster, ClusterEmulation, Config, Endpoint, HashPolicy, HashTag, HotKeyRead,
    HotKeyRule, KeyHash, Listener, MirrorMode, MirrorPolicy, PrefixRoute, ProtocolMode, ReadPolicy,
    RespSettings, RingHashFunction, Role, RouteTable, Shard, UpstreamAuth, ZoneFallback,
};
use respway_xds::{default_config, load_file, parse_yaml, to_resources, translate};

fn load(yaml: &str) -> Config {
    let resources = parse_yaml(yaml).unwrap_or_else(|e| panic!("parse_yaml:\n{e}"));
    translate(&resources).unwrap_or_else(|e| panic!("translate:\n{e}"))
}

fn errors(yaml: &str) -> String {
    parse_yaml(yaml).expect_err("should fail").to_string()
}

fn ep(addr: &str, role: Role, zone: Option<&str>) -> Endpoint {
    Endpoint {
        address: addr.parse().unwrap(),
        role,
        zone: zone.map(str::to_string),
    }
}

fn shard(name: &str, hash_key: &str, endpoints: Vec<Endpoint>) -> Shard {
    Shard {
        name: name.to_string(),
        hash_key: hash_key.to_string(),
        weight: 1,
        slots: Vec::new(),
        endpoints,
        sentinel: None,
    }
}

/// Shard `name` with its one endpoint, a primary at `addr` in no zone, hashed by `addr`.
fn one_primary(name: &str, addr: &str) -> Shard {
    shard(name, addr, vec![ep(addr, Role::Primary, None)])
}

/// Shard `name` hashed by its primary's address: a primary and a replica, each given as
/// `(address, zone)`.
fn primary_and_replica(name: &str, primary: (&str, &str), replica: (&str, &str)) -> Shard {
    shard(
        name,
        primary.0,
        vec![
            ep(primary.0, Role::Primary, Some(primary.1)),
            ep(replica.0, Role::Replica, Some(replica.1)),
        ],
    )
}

fn cluster(name: &str, hash: HashPolicy, shards: Vec<Shard>) -> Cluster {
    Cluster {
        tls: None,
        health_check: None,
        near_cache: None,
        redis_cluster: None,
        name: name.to_string(),
        hash,
        hashtag: Some(HashTag::default()),
        shards,
        connections_per_endpoint: 1,
        databases: respway_filters::model::DEFAULT_DATABASES,
        dedicated_connections: respway_filters::model::DEFAULT_DEDICATED_CONNECTIONS,
        max_queue_per_connection: respway_filters::model::DEFAULT_MAX_QUEUE_PER_CONNECTION,
        connect_timeout: Duration::from_secs(1),
        auth: None,
        endpoint_auth: Vec::new(),
        db: 0,
        hot_keys: Vec::new(),
        read_policy: ReadPolicy::Primary,
    }
}

fn mirror(cluster: &str, mode: MirrorMode, include_reads: bool, fraction_ppm: u32) -> MirrorPolicy {
    MirrorPolicy {
        cluster: cluster.to_string(),
        mode,
        include_reads,
        fraction_ppm,
    }
}

fn hot(prefix: &str, read: HotKeyRead) -> HotKeyRule {
    HotKeyRule {
        prefix: prefix.to_string(),
        read,
    }
}

fn full_example_model() -> Config {
    Config {
        zone: None,
        listeners: vec![Listener {
            observe: Default::default(),
            cluster_emulation: None,
            tls: None,
            name: "main".into(),
            address: "127.0.0.1:6380".parse().unwrap(),
            routes: RouteTable {
                routes: vec![
                    PrefixRoute {
                        prefix: "up:".into(),
                        remove_prefix: true,
                        cluster: "profile".into(),
                        mirrors: vec![mirror(
                            "main-v2",
                            MirrorMode::DualWrite {
                                target_is_primary: true,
                            },
                            true,
                            1_000_000,
                        )],
                    },
                    PrefixRoute {
                        prefix: "sess:".into(),
                        remove_prefix: false,
                        cluster: "sessions".into(),
                        mirrors: vec![mirror("main-v2", MirrorMode::ReadOnly, false, 1_000_000)],
                    },
                ],
                case_insensitive: true,
                catch_all: Some("main".into()),
                catch_all_mirrors: vec![mirror(
                    "main-v2",
                    MirrorMode::DualWrite {
                        target_is_primary: false,
                    },
                    false,
                    125_000,
                )],
            },
            downstream_password: Some("client-secret".into()),
            users: Vec::new(),
            op_timeout: Duration::from_millis(250),
            max_pending_per_client: 2048,
            resp: RespSettings {
                protocol: ProtocolMode::Auto,
                advertised_version: "7.0.15".into(),
            },
            client: respway_filters::model::ClientLimits {
                buffer_limit: 32 << 20,
                buffer_hard_limit: 128 << 20,
                stall_timeout: Duration::from_secs(10),
                max_auth_failures: 5,
                allow_keyless_scripts: false,
                allow_restricted_scripts: false,
                admin_commands: false,
                keys_max: 100_000,
                pubsub_buffer_limit: 32 << 20,
            },
            limits: Limits {
                max_bulk_len: 16 * 1024 * 1024,
                max_multibulk_len: 65536,
                max_inline_len: 16384,
            },
        }],
        clusters: vec![
            Cluster {
                connections_per_endpoint: 2,
                databases: 16,
                dedicated_connections: 32,
                max_queue_per_connection: 8192,
                connect_timeout: Duration::from_millis(500),
                auth: Some(UpstreamAuth {
                    username: Some("respway".into()),
                    password: "upstream-secret".into(),
                }),
                db: 2,
                read_policy: ReadPolicy::ZoneLocal {
                    fallback: ZoneFallback::AnyReplica,
                },
                hot_keys: vec![
                    hot("HIGH_FREQ_", HotKeyRead::SameZone),
                    hot("cfg:", HotKeyRead::RoundRobin),
                ],
                health_check: Some(respway_filters::model::HealthCheck {
                    drain_key: Some("maint".into()),
                    ..Default::default()
                }),
                near_cache: Some(respway_filters::model::NearCache {
                    prefixes: vec!["user:".into()],
                    ..Default::default()
                }),
                ..cluster(
                    "main",
                    HashPolicy::Maglev { table_size: 65537 },
                    vec![
                        primary_and_replica(
                            "s0",
                            ("127.0.0.1:7001", "z1"),
                            ("127.0.0.1:7101", "z2"),
                        ),
                        Shard {
                            weight: 2,
                            ..primary_and_replica(
                                "s1",
                                ("127.0.0.1:7002", "z2"),
                                ("127.0.0.1:7102", "z1"),
                            )
                        },
                    ],
                )
            },
            Cluster {
                hashtag: None,
                read_policy: ReadPolicy::PreferReplica,
                ..cluster(
                    "profile",
                    HashPolicy::Ketama {
                        key_hash: KeyHash::Fnv1a64,
                    },
                    vec![
                        shard(
                            "redis-a",
                            "redis-a",
                            vec![ep("127.0.0.1:7201", Role::Primary, None)],
                        ),
                        shard(
                            "redis-b",
                            "legacy-b",
                            vec![ep("127.0.0.1:7202", Role::Primary, None)],
                        ),
                    ],
                )
            },
            cluster(
                "sessions",
                HashPolicy::Crc16Slots,
                vec![
                    Shard {
                        slots: vec![(0, 8191)],
                        ..one_primary("shard-0", "127.0.0.1:7301")
                    },
                    Shard {
                        slots: vec![(8192, 16383)],
                        ..one_primary("shard-1", "127.0.0.1:7302")
                    },
                ],
            ),
            Cluster {
                read_policy: ReadPolicy::Any,
                hot_keys: vec![hot("HIGH_FREQ_", HotKeyRead::Random)],
                ..cluster(
                    "main-v2",
                    HashPolicy::Maglev { table_size: 65537 },
                    vec![primary_and_replica(
                        "shard-0",
                        ("127.0.0.1:7401", "z1"),
                        ("127.0.0.1:7402", "z2"),
                    )],
                )
            },
        ],
    }
}

#[test]
fn full_example_file_loads_to_the_expected_model() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/full.yaml");
    let config = load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config, full_example_model());
}

#[test]
fn model_round_trips_through_envoy_resources() {
    let model = full_example_model();
    assert_eq!(translate(&to_resources(&model)).unwrap(), model);
    let default = default_config();
    assert_eq!(translate(&to_resources(&default)).unwrap(), default);
}

#[test]
fn every_default() {
    let config = load(
        r#"
listeners:
  - name: default
    routes: { catch_all: default }
clusters:
  - name: default
    shards:
      - endpoints: [{ address: 127.0.0.1:6379 }]
"#,
    );
    // Listener: 127.0.0.1:6380, 1s, 1024 pending, Redis's limits, no password.
    // Cluster: maglev 65537, hashtag "{}", 1 connection, 1s connect, no auth, db 0;
    // shard "shard-0" of weight 1 hashed by its primary's ip:port, the lone endpoint primary.
    assert_eq!(config, default_config());
    let l = &config.listeners[0];
    assert_eq!(l.address, "127.0.0.1:6380".parse().unwrap());
    assert_eq!(l.op_timeout, Duration::from_secs(1));
    assert_eq!(l.max_pending_per_client, 1024);
    assert_eq!(l.limits, Limits::default());
    assert_eq!(
        l.client,
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
    );
    assert_eq!(
        l.resp,
        RespSettings {
            protocol: ProtocolMode::Auto,
            advertised_version: respway_filters::command::REDIS_VERSION.to_string(),
        }
    );
    assert_eq!(l.downstream_password, None);
    assert!(!l.routes.case_insensitive);
    let c = &config.clusters[0];
    assert_eq!(c.hash, HashPolicy::Maglev { table_size: 65537 });
    assert_eq!(c.hashtag, Some(HashTag::default()));
    assert_eq!(c.connections_per_endpoint, 1);
    assert_eq!(c.max_queue_per_connection, 16384);
    assert_eq!((c.databases, c.dedicated_connections), (16, 32));
    assert_eq!(c.connect_timeout, Duration::from_secs(1));
    assert_eq!((c.auth.clone(), c.db), (None, 0));
    let s = &c.shards[0];
    assert_eq!(
        (s.name.as_str(), s.hash_key.as_str()),
        ("shard-0", "127.0.0.1:6379")
    );
    assert_eq!(s.weight, 1);
    assert_eq!(s.endpoints[0].role, Role::Primary);
    assert_eq!(s.endpoints[0].zone, None);
}

#[test]
fn policy_defaults_and_twemproxy_hash_keys() {
    let config = load(
        r#"
listeners:
  - name: l
    routes:
      prefixes:
        - { prefix: "a", cluster: ring }
        - { prefix: "b", cluster: ketama }
        - { prefix: "c", cluster: modula }
        - { prefix: "d", cluster: crc32 }
clusters:
  - name: ring
    hash: { policy: ring_hash }
    shards:
      - { name: r0, endpoints: [{ address: 127.0.0.1:7001 }] }
  - name: ketama
    hash: { policy: ketama }
    shards:
      - { endpoints: [{ address: 10.0.0.1:11211 }] }
      - { endpoints: [{ address: 10.0.0.2:6379 }] }
      - { name: cache-3, endpoints: [{ address: 10.0.0.3:6379 }] }
      - { name: cache-4, hash_key: old-4, endpoints: [{ address: 10.0.0.4:6379 }] }
  - name: modula
    hash: { policy: modula, key_hash: murmur }
    shards:
      - { endpoints: [{ address: 10.0.1.1:6379 }] }
  - name: crc32
    hash: { policy: crc32_slots }
    hashtag: ""
    shards:
      - { endpoints: [{ address: 10.0.2.1:6379 }] }
      - { endpoints: [{ address: 10.0.2.2:6379 }] }
"#,
    );
    assert_eq!(config.listeners[0].routes.catch_all, None);
    let ring = config.cluster("ring").unwrap();
    assert_eq!(
        ring.hash,
        HashPolicy::RingHash {
            minimum_ring_size: 1024,
            maximum_ring_size: 8 * 1024 * 1024,
            function: RingHashFunction::XxHash
        }
    );
    // Envoy hashes a host by its address even when the shard has a name.
    assert_eq!(ring.shards[0].hash_key, "127.0.0.1:7001");
    let ketama = config.cluster("ketama").unwrap();
    assert_eq!(
        ketama.hash,
        HashPolicy::Ketama {
            key_hash: KeyHash::Fnv1a64
        }
    );
    let keys: Vec<(&str, &str)> = ketama
        .shards
        .iter()
        .map(|s| (s.name.as_str(), s.hash_key.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            ("shard-0", "10.0.0.1"),
            ("shard-1", "10.0.0.2:6379"),
            ("cache-3", "cache-3"),
            ("cache-4", "old-4"),
        ]
    );
    let modula = config.cluster("modula").unwrap();
    assert_eq!(
        modula.hash,
        HashPolicy::Modula {
            key_hash: KeyHash::Murmur
        }
    );
    assert_eq!(modula.shards[0].hash_key, "10.0.1.1:6379");
    let crc32 = config.cluster("crc32").unwrap();
    assert_eq!(crc32.hash, HashPolicy::Crc32Slots { slots: 1024 });
    assert_eq!(crc32.hashtag, None);
    assert!(crc32.shards.iter().all(|s| s.slots.is_empty()));
}

#[test]
fn endpoints_are_in_canonical_order() {
    let config = load(
        r#"
listeners: [{ name: l, routes: { catch_all: c } }]
clusters:
  - name: c
    shards:
      - endpoints:
          - { address: 127.0.0.1:7103, role: replica, zone: z1 }
          - { address: 127.0.0.1:7102, role: replica, zone: z3 }
          - { address: 127.0.0.1:7001, role: primary, zone: z2 }
"#,
    );
    let addrs: Vec<String> = config.clusters[0].shards[0]
        .endpoints
        .iter()
        .map(|e| e.address.to_string())
        .collect();
    assert_eq!(
        addrs,
        ["127.0.0.1:7001", "127.0.0.1:7102", "127.0.0.1:7103"]
    );
}

#[test]
fn many_errors_are_reported_together() {
    let text = r#"
listeners:
  - name: main
    adress: 127.0.0.1:6380
    op_timeout: 0s
    routes:
      catch_all: mian
      prefixes:
        - { prefix: "up:", cluster: profile }
clusters:
  - name: main
    hash: { policy: maglev, table_size: 65536 }
    hashtag: "{"
    shards:
      - name: s0
        endpoints:
          - { address: 127.0.0.1:7001, role: primary }
          - { address: 127.0.0.1:7101, role: primary }
      - name: s1
        endpoints:
          - { address: "127.0.0.1:99999" }
"#;
    assert_eq!(
        errors(text),
        r#"listener "main": adress: unknown field (expected one of: name, address, op_timeout, max_pending_per_client, client_buffer_limit, client_buffer_hard_limit, client_stall_timeout, max_auth_failures, allow_keyless_scripts, allow_restricted_scripts, admin_commands, keys_max, pubsub_buffer_limit, slowlog_threshold, slowlog_max_len, hot_key_sample, protocol, advertised_redis_version, cluster_emulation, downstream_auth_password, users, limits, routes, tls)
listener "main": op_timeout: must be greater than 0
listener "main": routes.catch_all: unknown cluster "mian"
listener "main": routes.prefixes[0].cluster: unknown cluster "profile"
cluster "main": hash.table_size: 65536 is not a prime number
cluster "main": hashtag: must be exactly two ASCII characters such as "{}" (got "{")
cluster "main": shards[0].endpoints[1].role: shard "s0" already has a primary (endpoints[0]): exactly one endpoint must have role primary
cluster "main": shards[1].endpoints[0].address: invalid socket address "127.0.0.1:99999""#
    );
}

#[test]
fn unknown_fields_anywhere_name_their_path() {
    let text = r#"
listener: []
listeners:
  - name: l
    limits: { max_bulk: 1 }
    routes: { catch_all: c, prefixes: [{ prefix: a, cluster: c, strip: true }] }
clusters:
  - name: c
    hash: { policy: ketama, table_size: 65537 }
    auth: { user: x, password: y }
    shards:
      - nmae: s0
        endpoints: [{ address: 127.0.0.1:7001, zones: z1 }]
"#;
    assert_eq!(
        errors(text),
        r#"listener: unknown field (expected one of: node, listeners, clusters)
listener "l": limits.max_bulk: unknown field (expected one of: max_bulk_len, max_multibulk_len, max_inline_len)
listener "l": routes.prefixes[0].strip: unknown field (expected one of: prefix, cluster, remove_prefix, mirrors)
cluster "c": hash.table_size: unknown field (expected one of: policy, key_hash)
cluster "c": auth.user: unknown field (expected one of: username, password, password_file, password_env)
cluster "c": shards[0].nmae: unknown field (expected one of: name, hash_key, weight, slots, endpoints, sentinel)
cluster "c": shards[0].endpoints[0].zones: unknown field (expected one of: address, role, zone, auth)"#
    );
}

#[test]
fn bad_values_say_what_was_expected() {
    let text = r#"
listeners:
  - name: l
    address: localhost:6380
    op_timeout: 1.5s
    max_pending_per_client: -1
    routes: { case_insensitive: "yes", catch_all: c }
  - name: l
    address: 127.0.0.1:6381
    routes: {}
clusters:
  - name: c
    hash: { policy: jump }
    connections_per_endpoint: 0
    shards: []
  - hash: { policy: ring_hash, minimum_ring_size: 2048, maximum_ring_size: 1024, function: md5 }
    shards:
      - weight: 0
        slots: ["0-9"]
        endpoints:
          - { address: 127.0.0.1:7001, role: leader }
          - { address: 127.0.0.1:7002 }
"#;
    assert_eq!(
        errors(text),
        r#"listener "l": name: duplicate listener name (also listeners[0])
listener "l": address: invalid socket address "localhost:6380": use an IP address, host names are not resolved
listener "l": op_timeout: invalid duration "1.5s" (expected an integer and a unit: us, ms, s, m or h, e.g. "250ms")
listener "l": max_pending_per_client: expected an unsigned integer, got a number
listener "l": routes.case_insensitive: expected true or false, got a string
cluster "c": hash.policy: unknown policy "jump" (expected one of: maglev, ring_hash, ketama, modula, crc32_slots, crc16_slots)
cluster "c": connections_per_endpoint: must be greater than 0
cluster "c": shards: must not be empty
clusters[1]: name: required
clusters[1]: hash.function: unknown function "md5" (expected one of: xx_hash, murmur_hash_2)
clusters[1]: hash.minimum_ring_size: 2048 is larger than maximum_ring_size 1024
clusters[1]: shards[0].endpoints[0].role: unknown role "leader" (expected one of: primary, replica)
clusters[1]: shards[0].weight: must be greater than 0
clusters[1]: shards[0].endpoints[1].role: required when a shard has more than one endpoint"#
    );
}

#[test]
fn shard_level_checks() {
    let text = r#"
listeners: [{ name: l, routes: { catch_all: a } }]
clusters:
  - name: a
    shards:
      - { name: x, endpoints: [{ address: 127.0.0.1:7001 }] }
      - { name: x, endpoints: [{ address: 127.0.0.1:7001 }] }
      - endpoints:
          - { address: 127.0.0.1:7003, role: replica }
          - { address: 127.0.0.1:7004, role: replica }
  - name: b
    hash: { policy: ketama }
    shards:
      - { name: same, endpoints: [{ address: 127.0.0.1:8001 }] }
      - { hash_key: same, endpoints: [{ address: 127.0.0.1:8002 }] }
  - name: c
    hash: { policy: crc32_slots, slots: 16 }
    shards:
      - { slots: ["0-7", 9], endpoints: [{ address: 127.0.0.1:9001 }] }
      - { slots: ["7-15"], endpoints: [{ address: 127.0.0.1:9002 }] }
      - { slots: ["10-20", "x"], endpoints: [{ address: 127.0.0.1:9003 }] }
  - name: d
    hash: { policy: crc16_slots }
    shards:
      - { slots: ["0-100"], endpoints: [{ address: 127.0.0.1:9101 }] }
      - { endpoints: [{ address: 127.0.0.1:9102 }] }
  - name: e
    hash: { policy: crc16_slots }
    shards:
      - { slots: ["0-100"], endpoints: [{ address: 127.0.0.1:9201 }] }
"#;
    assert_eq!(
        errors(text),
        r#"cluster "a": shards[1].name: duplicate shard name "x" (also shards[0])
cluster "a": shards[1].endpoints[0].address: 127.0.0.1:7001 is already used by shards[0].endpoints[0]
cluster "b": shards[1].endpoints[0]: hash key "same" of shard "shard-1" is also the hash key of shard "same"
cluster "c": shards[2].slots[1]: invalid slot range "x" (expected "N" or "FIRST-LAST")
cluster "d": shards[1].slots: required: the other shards list their slots, shard "shard-1" does not
cluster "e": shards: slots 101-16383 are assigned to no shard"#
    );
    // Once each shard is well formed, the cluster-wide checks run.
    let text = r#"
listeners: [{ name: l, routes: { catch_all: a } }]
clusters:
  - name: a
    shards:
      - { name: x, endpoints: [{ address: 127.0.0.1:7001 }] }
      - { name: x, endpoints: [{ address: 127.0.0.1:7001 }] }
  - name: c
    hash: { policy: crc32_slots, slots: 16 }
    shards:
      - { slots: ["0-7", 9], endpoints: [{ address: 127.0.0.1:9001 }] }
      - { slots: ["7-15"], endpoints: [{ address: 127.0.0.1:9002 }] }
      - { slots: ["10-20"], endpoints: [{ address: 127.0.0.1:9003 }] }
"#;
    assert_eq!(
        errors(text),
        r#"cluster "a": shards[1].name: duplicate shard name "x" (also shards[0])
cluster "a": shards[1].endpoints[0].address: 127.0.0.1:7001 is already used by shards[0].endpoints[0]
cluster "c": shards[1].slots[0]: slot 7 is already assigned to shard "shard-0"
cluster "c": shards[2].slots[0]: slot range "10-20" is out of bounds (slots are 0-15)"#
    );
}

#[test]
fn documents_that_are_not_configurations() {
    assert_eq!(
        errors(""),
        "the document is empty: listeners and clusters are required"
    );
    assert_eq!(errors("[1, 2]"), "expected a mapping, got a list");
    assert_eq!(
        errors("listeners: []\nclusters: []"),
        "listeners: must not be empty\nclusters: must not be empty"
    );
    assert!(errors("listeners: [").starts_with("invalid YAML: "));
}

#[test]
fn load_file_puts_the_file_name_on_every_line() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("respway-xds-yaml");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "listeners: [{ name: l, routes: { catch_all: nope } }]\nclusters: []\n",
    )
    .unwrap();
    let shown = path.display().to_string();
    assert_eq!(
        load_file(&path).unwrap_err().to_string(),
        format!(
            "{shown}: listener \"l\": routes.catch_all: unknown cluster \"nope\"\n{shown}: clusters: must not be empty"
        )
    );
    let missing = dir.join("missing.yaml");
    let err = load_file(&missing).unwrap_err();
    assert_eq!(err.0.len(), 1);
    assert_eq!(err.0[0].resource, missing.display().to_string());
    assert!(err.0[0].reason.starts_with("cannot read: "), "{err}");
}

#[test]
fn the_picker_build_is_the_last_check() {
    // What only building the picker finds: twemproxy's 86-byte point buffer, and an even split
    // with more shards than slots.
    let long = "n".repeat(90);
    let text = format!(
        r#"
listeners: [{{ name: l, routes: {{ catch_all: k }} }}]
clusters:
  - name: k
    hash: {{ policy: ketama }}
    shards:
      - {{ name: {long}, endpoints: [{{ address: 127.0.0.1:7001 }}] }}
  - name: s
    hash: {{ policy: crc32_slots, slots: 1 }}
    shards:
      - {{ endpoints: [{{ address: 127.0.0.1:7002 }}] }}
      - {{ endpoints: [{{ address: 127.0.0.1:7003 }}] }}
"#
    );
    // The reasons are the picker's own words (respway-filters), so only their place is pinned.
    let shown = errors(&text);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 2, "{shown}");
    assert!(
        lines[0].starts_with(&format!(
            "cluster \"k\": ketama: shard 0 name \"{long}\" is too long"
        )),
        "{shown}"
    );
    assert!(
        lines[1].starts_with("cluster \"s\": cannot split 1 slots"),
        "{shown}"
    );
    // Modula does not place shards by hash key, so two shards may share one.
    load(
        r#"
listeners: [{ name: l, routes: { catch_all: m } }]
clusters:
  - name: m
    hash: { policy: modula }
    shards:
      - { hash_key: same, endpoints: [{ address: 127.0.0.1:7001 }] }
      - { hash_key: same, endpoints: [{ address: 127.0.0.1:7002 }] }
"#,
    );
}

/// The ```yaml blocks of a document of the repository (a path from the repository's root).
fn yaml_blocks(rel: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    doc.split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().to_string())
        .collect()
}

/// The documentation's examples are the real ones: the configuration reference's full example
/// is `examples/full.yaml`, its smallest file is the built-in configuration and its node
/// example sets the zone; Getting started's first file is that smallest file; the README's
/// example loads.
#[test]
fn doc_examples_are_the_real_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let reference = "docs/configuration.md";
    let doc = std::fs::read_to_string(root.join("..").join(reference)).unwrap();
    let full = doc
        .split("\n## Full example\n")
        .nth(1)
        .and_then(|s| s.split("```yaml\n").nth(1))
        .and_then(|s| s.split("```").next())
        .unwrap_or_else(|| panic!("{reference}: no yaml block under \"## Full example\""));
    let file = std::fs::read_to_string(root.join("examples/full.yaml")).unwrap();
    // The file's leading comment is not in the document's copy.
    let body = &file[file.find("\nlisteners:").unwrap() + 1..];
    assert_eq!(
        full, body,
        "{reference}'s full example differs from examples/full.yaml"
    );
    let blocks = yaml_blocks(reference);
    assert_eq!(blocks[0], body);
    let smallest = &blocks[1];
    assert_eq!(load(smallest), default_config());
    // The node example is a sidecar's file's.
    let node = blocks
        .iter()
        .find(|b| b.starts_with("node:"))
        .expect("a node example");
    let with_node = format!("{node}{smallest}");
    assert_eq!(load(&with_node).zone.as_deref(), Some("z1"));

    let first = yaml_blocks("docs/getting-started.md");
    assert_eq!(
        &first[0], smallest,
        "docs/getting-started.md's first configuration is not the reference's smallest file"
    );

    let readme = yaml_blocks("README.md");
    assert_eq!(readme.len(), 1, "the README has one configuration example");
    let config = load(&readme[0]);
    assert_eq!(config.listeners.len(), 1);
    assert_eq!(config.clusters.len(), 2);
}

#[test]
fn anchors_and_merge_keys() {
    let config = load(
        r#"
listeners: [{ name: l, routes: { catch_all: a } }]
clusters:
  - &base
    name: a
    hash: { policy: ketama }
    connect_timeout: 2s
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - <<: *base
    name: b
"#,
    );
    assert_eq!(config.clusters[1].name, "b");
    assert_eq!(config.clusters[1].connect_timeout, Duration::from_secs(2));
    assert_eq!(config.clusters[1].shards, config.clusters[0].shards);
}

/// Two clusters `a` and `b` and a listener routing `p:` to `a` with the given route body.
fn with_routes(routes: &str, clusters_extra: &str) -> String {
    format!(
        r#"
listeners:
  - name: l
    routes:
{routes}
clusters:
  - name: a
    shards: [{{ endpoints: [{{ address: 127.0.0.1:7001 }}] }}]
  - name: b
    shards: [{{ endpoints: [{{ address: 127.0.0.1:7002 }}] }}]
  - name: c
    shards: [{{ endpoints: [{{ address: 127.0.0.1:7003 }}] }}]
{clusters_extra}"#
    )
}

#[test]
fn node_sets_the_zone() {
    let base = r#"
listeners: [{ name: l, routes: { catch_all: a } }]
clusters: [{ name: a, shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }] }]
"#;
    assert_eq!(load(base).zone, None);
    assert_eq!(load(&format!("node: {{ id: n1 }}{base}")).zone, None);
    assert_eq!(load(&format!("node: {{ zone: null }}{base}")).zone, None);
    let config = load(&format!("node: {{ id: n1, zone: us-east-1a }}{base}"));
    assert_eq!(config.zone.as_deref(), Some("us-east-1a"));
    // parse_yaml carries it beside the Envoy resources.
    let resources = parse_yaml(&format!("node: {{ zone: z9 }}{base}")).unwrap();
    assert_eq!(resources.node_zone.as_deref(), Some("z9"));
    assert_eq!(
        errors(&format!(
            "node: {{ id: \"\", zone: \"\", region: r }}{base}"
        )),
        r#"node.region: unknown field (expected one of: id, zone)
node.id: must not be empty (leave it out or use null)
node.zone: must not be empty (leave it out or use null)"#
    );
    assert_eq!(
        errors(&format!("node: {{ zone: 3 }}{base}")),
        "node.zone: expected a string, got a number"
    );
}

#[test]
fn mirror_defaults_and_values() {
    let config = load(&with_routes(
        r#"
      catch_all: a
      catch_all_mirrors: [{ cluster: b }]
      prefixes:
        - prefix: "p:"
          cluster: a
          mirrors:
            - { cluster: b, mode: forward, fraction: 0 }
            - { cluster: c, mode: dual_write, primary: route, include_reads: true, fraction: 0.0001 }
        - prefix: "q:"
          cluster: b
          mirrors:
            - { cluster: a, primary: mirror, fraction: 33.3333 }
            - { cluster: c, mode: read_only, fraction: 50 }
"#,
        "",
    ));
    let routes = &config.listeners[0].routes;
    // Defaults: dual_write, the route answering, writes only, everything.
    assert_eq!(
        routes.catch_all_mirrors,
        [mirror(
            "b",
            MirrorMode::DualWrite {
                target_is_primary: false
            },
            false,
            1_000_000
        )]
    );
    assert_eq!(
        routes.routes[0].mirrors,
        [
            mirror("b", MirrorMode::Forward, false, 0),
            mirror(
                "c",
                MirrorMode::DualWrite {
                    target_is_primary: false
                },
                true,
                1
            ),
        ]
    );
    assert_eq!(
        routes.routes[1].mirrors,
        [
            mirror(
                "a",
                MirrorMode::DualWrite {
                    target_is_primary: true
                },
                false,
                333_333
            ),
            mirror("c", MirrorMode::ReadOnly, false, 500_000),
        ]
    );
    // No mirrors at all: empty lists.
    let config = load(&with_routes(
        "      catch_all: a\n      prefixes: [{ prefix: x, cluster: b }]",
        "",
    ));
    assert!(config.listeners[0].routes.catch_all_mirrors.is_empty());
    assert!(config.listeners[0].routes.routes[0].mirrors.is_empty());
}

#[test]
fn mirror_errors() {
    let text = with_routes(
        r#"
      catch_all_mirrors: [{ cluster: b }]
      prefixes:
        - prefix: "p:"
          cluster: a
          mirrors:
            - { cluster: a }
            - { cluster: nope }
            - { cluster: b, mode: dual_write, primary: mirror }
            - { cluster: b, mode: forward }
            - { cluster: c, primary: mirror }
        - prefix: "q:"
          cluster: a
          mirrors:
            - { cluster: b, mode: read_only }
            - { cluster: c, mode: read_only }
            - { mode: mirror, primary: both, include_reads: 1, fraction: 100.5, copies: 2 }
            - { cluster: b, fraction: 12.34567 }
            - { cluster: c, fraction: "50%" }
            - 7
        - prefix: "r:"
          cluster: a
          mirrors:
            # A mirror with errors of its own is left out of the checks across mirrors.
            - { cluster: b, mode: forward, primary: route }
            - { cluster: b, mode: forward }
        - prefix: "s:"
          cluster: a
          mirrors:
            - { cluster: b, mode: move }
            - { cluster: c }
"#,
        "",
    );
    assert_eq!(
        errors(&text),
        r#"listener "l": routes.catch_all_mirrors: requires catch_all
listener "l": routes.prefixes[0].mirrors[0].cluster: "a" is the route's own cluster
listener "l": routes.prefixes[0].mirrors[1].cluster: unknown cluster "nope"
listener "l": routes.prefixes[0].mirrors[3].cluster: duplicate mirror cluster "b" (also mirrors[2])
listener "l": routes.prefixes[0].mirrors[4].primary: only one mirror of a route may be primary (also mirrors[2])
listener "l": routes.prefixes[1].mirrors[1].mode: only one read_only mirror per route (also mirrors[0])
listener "l": routes.prefixes[1].mirrors[2].copies: unknown field (expected one of: cluster, mode, primary, include_reads, fraction)
listener "l": routes.prefixes[1].mirrors[2].cluster: required
listener "l": routes.prefixes[1].mirrors[2].primary: unknown primary "both" (expected one of: route, mirror)
listener "l": routes.prefixes[1].mirrors[2].mode: unknown mode "mirror" (expected one of: forward, dual_write, read_only, prepare_move, move)
listener "l": routes.prefixes[1].mirrors[2].include_reads: expected true or false, got a number
listener "l": routes.prefixes[1].mirrors[2].fraction: must be between 0 and 100 (a percentage)
listener "l": routes.prefixes[1].mirrors[3].fraction: 12.34567 has more than 4 decimal places (the resolution is 0.0001%)
listener "l": routes.prefixes[1].mirrors[4].fraction: expected a percentage (a number), got a string
listener "l": routes.prefixes[1].mirrors[5]: expected a mapping, got a number
listener "l": routes.prefixes[2].mirrors[0].primary: only used with mode dual_write
listener "l": routes.prefixes[3].mirrors[0].mode: mode move must be the route's only mirror: its keys live on one cluster at a time"#
    );
    assert_eq!(
        errors(&with_routes(
            "      catch_all: a\n      catch_all_mirrors: { cluster: b }",
            ""
        )),
        r#"listener "l": routes.catch_all_mirrors: expected a list, got a mapping"#
    );
    assert_eq!(
        errors(&with_routes(
            "      catch_all: a\n      catch_all_mirrors: [{ cluster: a }, { cluster: b, primary: mirror }, { cluster: c, primary: mirror }]",
            ""
        )),
        r#"listener "l": routes.catch_all_mirrors[0].cluster: "a" is the route's own cluster
listener "l": routes.catch_all_mirrors[2].primary: only one mirror of a route may be primary (also catch_all_mirrors[1])"#
    );
}

#[test]
fn read_policies_and_hot_keys() {
    let config = load(
        r#"
listeners: [{ name: l, routes: { catch_all: d } }]
clusters:
  - name: d
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: p
    read_policy: primary
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: r
    read_policy: prefer_replica
    hot_keys: [{ prefix: HOT_ }]
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
  - name: z
    read_policy: zone_local
    hot_keys:
      - { prefix: a, read: round_robin }
      - { prefix: b, read: random }
      - { prefix: ab, read: same_zone }
    shards: [{ endpoints: [{ address: 127.0.0.1:7004 }] }]
  - name: zp
    read_policy: zone_local
    zone_fallback: primary
    shards: [{ endpoints: [{ address: 127.0.0.1:7005 }] }]
  - name: za
    read_policy: zone_local
    zone_fallback: any_replica
    shards: [{ endpoints: [{ address: 127.0.0.1:7006 }] }]
  - name: any
    read_policy: any
    hot_keys: []
    shards: [{ endpoints: [{ address: 127.0.0.1:7007 }] }]
"#,
    );
    let policies: Vec<(&str, ReadPolicy)> = config
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.read_policy))
        .collect();
    let zone_local = |fallback| ReadPolicy::ZoneLocal { fallback };
    assert_eq!(
        policies,
        [
            ("d", ReadPolicy::Primary),
            ("p", ReadPolicy::Primary),
            ("r", ReadPolicy::PreferReplica),
            ("z", zone_local(ZoneFallback::Primary)),
            ("zp", zone_local(ZoneFallback::Primary)),
            ("za", zone_local(ZoneFallback::AnyReplica)),
            ("any", ReadPolicy::Any),
        ]
    );
    assert!(config.clusters[0].hot_keys.is_empty());
    assert_eq!(
        config.clusters[2].hot_keys,
        [hot("HOT_", HotKeyRead::RoundRobin)]
    );
    assert_eq!(
        config.clusters[3].hot_keys,
        [
            hot("a", HotKeyRead::RoundRobin),
            hot("b", HotKeyRead::Random),
            hot("ab", HotKeyRead::SameZone),
        ]
    );
    assert!(config.clusters[6].hot_keys.is_empty());
}

#[test]
fn read_policy_and_hot_key_errors() {
    let text = r#"
listeners: [{ name: l, routes: { catch_all: a } }]
clusters:
  - name: a
    read_policy: replica
    zone_fallback: any_replica
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    read_policy: prefer_replica
    zone_fallback: any_replica
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    zone_fallback: nearest
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
  - name: d
    hot_keys:
      - { prefix: "" }
      - { prefix: HOT_, read: sticky }
      - { prefix: X_ }
      - { prefix: X_, read: random }
      - { read: random, ttl: 1 }
      - HOT_
    shards: [{ endpoints: [{ address: 127.0.0.1:7004 }] }]
  - name: e
    hot_keys: { prefix: HOT_ }
    shards: [{ endpoints: [{ address: 127.0.0.1:7005 }] }]
"#;
    assert_eq!(
        errors(text),
        r#"cluster "a": read_policy: unknown read policy "replica" (expected one of: primary, prefer_replica, zone_local, any)
cluster "b": zone_fallback: only used with read_policy zone_local
cluster "c": zone_fallback: unknown zone fallback "nearest" (expected one of: primary, any_replica)
cluster "c": zone_fallback: only used with read_policy zone_local
cluster "d": hot_keys[0].prefix: must not be empty
cluster "d": hot_keys[1].read: unknown read "sticky" (expected one of: round_robin, random, same_zone)
cluster "d": hot_keys[3].prefix: duplicate hot-key prefix "X_" (also hot_keys[2])
cluster "d": hot_keys[4].ttl: unknown field (expected one of: prefix, read)
cluster "d": hot_keys[4].prefix: required
cluster "d": hot_keys[5]: expected a mapping, got a string
cluster "e": hot_keys: expected a list, got a mapping"#
    );
}

#[test]
fn client_limits_and_upstream_queue_bound() {
    let text = r#"
listeners:
  - name: l
    client_buffer_limit: 1048576
    client_buffer_hard_limit: 4194304
    client_stall_timeout: 1500ms
    max_auth_failures: 3
    allow_keyless_scripts: true
    admin_commands: true
    keys_max: 10
    pubsub_buffer_limit: 4096
    routes: { catch_all: a }
  - name: equal
    address: 127.0.0.1:6381
    client_buffer_limit: 2048
    client_buffer_hard_limit: 2048
    allow_keyless_scripts: false
    routes: { catch_all: a }
  - name: only-hard
    address: 127.0.0.1:6382
    client_buffer_hard_limit: 67108864
    routes: { catch_all: a }
clusters:
  - name: a
    max_queue_per_connection: 64
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
"#;
    let config = load(text);
    let d = ClientLimits::default();
    assert_eq!(
        config.listeners[0].client,
        ClientLimits {
            buffer_limit: 1 << 20,
            buffer_hard_limit: 4 << 20,
            stall_timeout: Duration::from_millis(1500),
            max_auth_failures: 3,
            allow_keyless_scripts: true,
            allow_restricted_scripts: false,
            admin_commands: true,
            keys_max: 10,
            pubsub_buffer_limit: 4096,
        }
    );
    assert_eq!(
        config.listeners[1].client,
        ClientLimits {
            buffer_limit: 2048,
            buffer_hard_limit: 2048,
            ..d.clone()
        }
    );
    // The hard limit may equal the default (soft) limit.
    assert_eq!(
        config.listeners[2].client,
        ClientLimits {
            buffer_hard_limit: 64 << 20,
            ..d
        }
    );
    assert_eq!(config.clusters[0].max_queue_per_connection, 64);
    // The resources carry every value: translating them again gives the same model.
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
}

#[test]
fn client_limit_and_queue_bound_errors() {
    let text = r#"
listeners:
  - name: l
    client_buffer_limit: 0
    client_buffer_hard_limit: -1
    client_stall_timeout: 0s
    max_auth_failures: 0
    allow_keyless_scripts: "yes"
    routes: { catch_all: a }
  - name: m
    address: 127.0.0.1:6381
    client_buffer_limit: 2048
    client_buffer_hard_limit: 1024
    client_stall_timeout: 30
    max_auth_failures: 4294967296
    routes: { catch_all: a }
  - name: n
    address: 127.0.0.1:6382
    client_buffer_limit: 536870912
    client_stall_timeout: 5 minutes
    max_auth_failures: -3
    allow_keyless_scripts: 1
    routes: { catch_all: a }
  - name: o
    address: 127.0.0.1:6383
    client_buffer_hard_limit: 1024
    routes: { catch_all: a }
clusters:
  - name: a
    max_queue_per_connection: 0
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    max_queue_per_connection: -1
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    max_queue_per_connection: 4294967296
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
  - name: d
    max_queue_per_connection: "16"
    shards: [{ endpoints: [{ address: 127.0.0.1:7004 }] }]
"#;
    assert_eq!(
        errors(text),
        r#"listener "l": client_buffer_limit: must be greater than 0
listener "l": client_buffer_hard_limit: expected an unsigned integer, got a number
listener "l": client_stall_timeout: must be greater than 0
listener "l": max_auth_failures: must be greater than 0
listener "l": allow_keyless_scripts: expected true or false, got a string
listener "m": client_buffer_hard_limit: 1024 is less than client_buffer_limit 2048
listener "m": client_stall_timeout: expected a string, got a number
listener "m": max_auth_failures: must be at most 4294967295
listener "n": client_buffer_hard_limit: 268435456 is less than client_buffer_limit 536870912
listener "n": client_stall_timeout: invalid duration "5 minutes" (expected an integer and a unit: us, ms, s, m or h, e.g. "250ms")
listener "n": max_auth_failures: expected an unsigned integer, got a number
listener "n": allow_keyless_scripts: expected true or false, got a number
listener "o": client_buffer_hard_limit: 1024 is less than client_buffer_limit 67108864
cluster "a": max_queue_per_connection: must be greater than 0
cluster "b": max_queue_per_connection: expected an unsigned integer, got a number
cluster "c": max_queue_per_connection: must be at most 4294967295
cluster "d": max_queue_per_connection: expected an unsigned integer, got a string"#
    );
}

#[test]
fn protocol_and_advertised_version() {
    let text = r#"
listeners:
  - name: auto
    protocol: auto
    advertised_redis_version: "7.2.4"
    routes: { catch_all: a }
  - name: resp2
    address: 127.0.0.1:6381
    protocol: resp2
    advertised_redis_version: 6.2.14
    routes: { catch_all: a }
  - name: resp3
    address: 127.0.0.1:6382
    protocol: resp3
    routes: { catch_all: a }
  - name: unset
    address: 127.0.0.1:6383
    protocol: null
    advertised_redis_version: null
    routes: { catch_all: a }
clusters:
  - name: a
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
"#;
    let config = load(text);
    let d = RespSettings::default();
    let resp: Vec<&RespSettings> = config.listeners.iter().map(|l| &l.resp).collect();
    assert_eq!(
        resp,
        [
            &RespSettings {
                protocol: ProtocolMode::Auto,
                advertised_version: "7.2.4".into(),
            },
            &RespSettings {
                protocol: ProtocolMode::Resp2,
                advertised_version: "6.2.14".into(),
            },
            &RespSettings {
                protocol: ProtocolMode::Resp3,
                ..d.clone()
            },
            &d,
        ]
    );
    // The resources carry every value: translating them again gives the same model.
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
}

#[test]
fn protocol_and_advertised_version_errors() {
    let text = r#"
listeners:
  - name: l
    protocol: resp4
    advertised_redis_version: ""
    routes: { catch_all: a }
  - name: m
    address: 127.0.0.1:6381
    protocol: 3
    advertised_redis_version: 7.2
    routes: { catch_all: a }
  - name: n
    address: 127.0.0.1:6382
    protocol: RESP3
    advertised_redis_version: 7.2.4-rc1
    routes: { catch_all: a }
  - name: o
    address: 127.0.0.1:6383
    advertised_redis_version: "7..2"
    routes: { catch_all: a }
  - name: p
    address: 127.0.0.1:6384
    advertised_redis_version: [7, 2]
    routes: { catch_all: a }
clusters:
  - name: a
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
"#;
    assert_eq!(
        errors(text),
        r#"listener "l": protocol: unknown protocol "resp4" (expected one of: auto, resp2, resp3)
listener "l": advertised_redis_version: must not be empty (leave it out or use null)
listener "m": protocol: expected a string, got a number
listener "m": advertised_redis_version: expected a string, got a number (quote the version, e.g. "7.2")
listener "n": protocol: unknown protocol "RESP3" (expected one of: auto, resp2, resp3)
listener "n": advertised_redis_version: invalid version "7.2.4-rc1" (expected digits and dots, e.g. "7.2.4")
listener "o": advertised_redis_version: invalid version "7..2" (expected digits and dots, e.g. "7.2.4")
listener "p": advertised_redis_version: expected a string, got a list"#
    );
}

#[test]
fn databases_and_dedicated_connections() {
    let text = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    db: 4
    databases: 1
    dedicated_connections: 1
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    databases: 256
    dedicated_connections: 65535
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    databases: null
    dedicated_connections: null
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
"#;
    let config = load(text);
    let got: Vec<(u32, u32, usize)> = config
        .clusters
        .iter()
        .map(|c| (c.db, c.databases, c.dedicated_connections))
        .collect();
    assert_eq!(got, [(4, 1, 1), (0, 256, 65535), (0, 16, 32)]);
    // The resources carry every value: translating them again gives the same model.
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
}

#[test]
fn databases_and_dedicated_connection_errors() {
    let text = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    databases: 0
    dedicated_connections: 0
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    databases: 257
    dedicated_connections: 65536
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    databases: -1
    dedicated_connections: "32"
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
"#;
    assert_eq!(
        errors(text),
        r#"cluster "a": dedicated_connections: must be greater than 0
cluster "a": databases: must be greater than 0
cluster "b": dedicated_connections: must be at most 65535
cluster "b": databases: must be at most 256
cluster "c": dedicated_connections: expected an unsigned integer, got a string
cluster "c": databases: expected an unsigned integer, got a number"#
    );
}

#[test]
fn health_checks() {
    let text = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    health_check: { interval: 2s, timeout: 250ms, unhealthy_threshold: 5, healthy_threshold: 1, drain_key: maint }
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    health_check: {}
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
"#;
    let config = load(text);
    let got: Vec<_> = config
        .clusters
        .iter()
        .map(|c| c.health_check.clone())
        .collect();
    assert_eq!(
        got,
        [
            Some(respway_filters::model::HealthCheck {
                interval: Duration::from_secs(2),
                timeout: Duration::from_millis(250),
                unhealthy_threshold: 5,
                healthy_threshold: 1,
                drain_key: Some("maint".into()),
            }),
            Some(respway_filters::model::HealthCheck::default()),
            None,
        ]
    );
    // The resources carry every value: translating them again gives the same model.
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
    // The YAML writes Envoy's own field: one Redis health checker.
    let resources = respway_xds::parse_yaml(text).unwrap();
    let hc = &resources.clusters[0].health_checks;
    assert_eq!(hc.len(), 1);
    assert!(
        matches!(&hc[0].health_checker,
            Some(respway_xds::pb::envoy::config::core::v3::health_check::HealthChecker::CustomHealthCheck(c))
                if c.name == "envoy.health_checkers.redis"),
        "{hc:?}"
    );
    assert!(resources.clusters[2].health_checks.is_empty());
}

#[test]
fn health_check_errors() {
    let text = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    health_check: { interval: 0s, timeout: 0ms, unhealthy_threshold: 0, healthy_threshold: 0 }
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    health_check: { interval: soon, unhealthy_threshold: -1, drain_key: "", jitter: 1s }
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    health_check: true
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
"#;
    assert_eq!(
        errors(text),
        r#"cluster "a": health_check.interval: must be greater than 0
cluster "a": health_check.timeout: must be greater than 0
cluster "a": health_check.unhealthy_threshold: must be greater than 0
cluster "a": health_check.healthy_threshold: must be greater than 0
cluster "b": health_check.jitter: unknown field (expected one of: interval, timeout, unhealthy_threshold, healthy_threshold, drain_key)
cluster "b": health_check.interval: invalid duration "soon" (expected an integer and a unit: us, ms, s, m or h, e.g. "250ms")
cluster "b": health_check.unhealthy_threshold: expected an unsigned integer, got a number
cluster "b": health_check.drain_key: must not be empty (leave it out or use null)
cluster "c": health_check: expected a mapping, got a boolean"#
    );
}

#[test]
fn near_caches() {
    use respway_filters::model::{NearCache, NearCacheAdmit, NearCacheMode};
    let text = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    near_cache:
      mode: bcast
      prefixes: ["user:", HIGH_FREQ_]
      admit: hot
      max_bytes: 1gb
      max_entry_bytes: 1536
      max_age: 2m
      hot_reads_per_sec: 50
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    near_cache: {}
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
  - name: d
    near_cache: { mode: ttl, max_bytes: 64MB, max_entry_bytes: "4096", max_age: 250ms }
    shards: [{ endpoints: [{ address: 127.0.0.1:7004 }] }]
  - name: e
    near_cache: { mode: tracked, max_bytes: 2m, max_entry_bytes: 10k, admit: all }
    shards: [{ endpoints: [{ address: 127.0.0.1:7005 }] }]
  - name: f
    near_cache: { mode: ttl }
    shards: [{ endpoints: [{ address: 127.0.0.1:7006 }] }]
"#;
    let config = load(text);
    let got: Vec<_> = config
        .clusters
        .iter()
        .map(|c| c.near_cache.clone())
        .collect();
    let d = NearCache::default();
    assert_eq!(
        got,
        [
            Some(NearCache {
                mode: NearCacheMode::Bcast,
                prefixes: vec!["user:".into(), "HIGH_FREQ_".into()],
                admit: NearCacheAdmit::Hot,
                max_bytes: 1 << 30,
                max_entry_bytes: 1536,
                max_age: Duration::from_secs(120),
                hot_reads_per_sec: 50,
            }),
            Some(d.clone()),
            None,
            Some(NearCache {
                mode: NearCacheMode::Ttl,
                max_bytes: 64 << 20,
                max_entry_bytes: 4096,
                max_age: Duration::from_millis(250),
                ..d.clone()
            }),
            // k and m are powers of 1000, as in redis.conf.
            Some(NearCache {
                max_bytes: 2_000_000,
                max_entry_bytes: 10_000,
                ..d.clone()
            }),
            // max_age's default is the mode's: 60 s with a tracker, 10 s in ttl mode.
            Some(NearCache {
                mode: NearCacheMode::Ttl,
                max_age: Duration::from_secs(10),
                ..d.clone()
            }),
        ]
    );
    // The resources carry every value: translating them again gives the same model.
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
    // The YAML writes respway's ClusterOptions.near_cache, every field set; none without it.
    let resources = parse_yaml(text).unwrap();
    let options = |i: usize| {
        let any = &resources.clusters[i].typed_extension_protocol_options["respway.cluster"];
        <respway_xds::pb::respway::v1::ClusterOptions as prost::Message>::decode(
            any.value.as_slice(),
        )
        .unwrap()
    };
    use respway_xds::pb::respway::v1 as rw;
    assert_eq!(
        options(1).near_cache,
        Some(rw::NearCache {
            mode: rw::NearCacheMode::Tracked as i32,
            prefixes: Vec::new(),
            admit: rw::NearCacheAdmit::All as i32,
            max_bytes: 64 << 20,
            max_entry_bytes: 64 << 10,
            max_age: Some(respway_xds::pb::google::protobuf::Duration {
                seconds: 60,
                nanos: 0
            }),
            hot_reads_per_sec: 0,
        })
    );
    assert_eq!(options(2).near_cache, None);
}

#[test]
fn near_cache_errors() {
    let text = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    near_cache: { mode: lru, admit: warm, max_bytes: 0, max_entry_bytes: 0kb, max_age: 0s, hot_reads_per_sec: 0 }
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: b
    near_cache:
      prefixes:
        - "user:"
        - ""
        - "user:"
        - 7
        - session:
      max_bytes: 64 MiB
      max_entry_bytes: -1
      max_age: soon
      ttl: 1s
    shards: [{ endpoints: [{ address: 127.0.0.1:7002 }] }]
  - name: c
    near_cache: { max_bytes: 1mb, max_entry_bytes: 2mb }
    shards: [{ endpoints: [{ address: 127.0.0.1:7003 }] }]
  - name: d
    near_cache: { max_entry_bytes: 100mb, prefixes: "user:" }
    shards: [{ endpoints: [{ address: 127.0.0.1:7004 }] }]
  - name: e
    near_cache: true
    shards: [{ endpoints: [{ address: 127.0.0.1:7005 }] }]
  - name: f
    near_cache: { max_bytes: [1], hot_reads_per_sec: many, max_entry_bytes: 99999999999gb }
    shards: [{ endpoints: [{ address: 127.0.0.1:7006 }] }]
"#;
    assert_eq!(
        errors(text),
        r#"cluster "a": near_cache.mode: unknown mode "lru" (expected one of: tracked, bcast, ttl)
cluster "a": near_cache.admit: unknown admission "warm" (expected one of: all, hot)
cluster "a": near_cache.max_bytes: must be greater than 0
cluster "a": near_cache.max_entry_bytes: must be greater than 0
cluster "a": near_cache.max_age: must be greater than 0
cluster "b": near_cache.ttl: unknown field (expected one of: mode, prefixes, admit, max_bytes, max_entry_bytes, max_age, hot_reads_per_sec)
cluster "b": near_cache.prefixes[1]: must not be empty
cluster "b": near_cache.prefixes[2]: duplicate prefix "user:" (also prefixes[0])
cluster "b": near_cache.prefixes[3]: expected a string, got a number
cluster "b": near_cache.prefixes[4]: expected a string, got a mapping (quote a prefix that ends in a colon: "session:")
cluster "b": near_cache.max_bytes: invalid size "64 MiB" (expected an integer of bytes, or an integer and a unit: kb, mb or gb (powers of 1024), k, m or g (powers of 1000), e.g. "64mb")
cluster "b": near_cache.max_entry_bytes: expected an unsigned integer, got a number
cluster "b": near_cache.max_age: invalid duration "soon" (expected an integer and a unit: us, ms, s, m or h, e.g. "250ms")
cluster "c": near_cache.max_entry_bytes: 2097152 is more than max_bytes 1048576
cluster "d": near_cache.prefixes: expected a list, got a string
cluster "d": near_cache.max_entry_bytes: 104857600 is more than max_bytes 67108864 (the default)
cluster "e": near_cache: expected a mapping, got a boolean
cluster "f": near_cache.max_bytes: expected a size (an integer or a string such as "64mb"), got a list
cluster "f": near_cache.max_entry_bytes: invalid size "99999999999gb" (expected an integer of bytes, or an integer and a unit: kb, mb or gb (powers of 1024), k, m or g (powers of 1000), e.g. "64mb")
cluster "f": near_cache.hot_reads_per_sec: expected an unsigned integer, got a string"#
    );
}

#[test]
fn cluster_emulation() {
    let text = r#"
listeners:
  - name: one
    cluster_emulation: true
    routes: { catch_all: a }
  - name: two
    address: 127.0.0.1:6381
    cluster_emulation:
      announce: ["10.0.0.5:6379", "10.0.0.6:6379"]
    routes: { catch_all: a }
  - name: off
    address: 127.0.0.1:6382
    cluster_emulation: false
    routes: { catch_all: a }
  - name: unset
    address: 127.0.0.1:6383
    routes: { catch_all: a }
clusters:
  - name: a
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
"#;
    let config = load(text);
    let emulation: Vec<_> = config
        .listeners
        .iter()
        .map(|l| l.cluster_emulation.clone())
        .collect();
    assert_eq!(
        emulation,
        [
            Some(ClusterEmulation::default()),
            Some(ClusterEmulation {
                announce: vec![
                    "10.0.0.5:6379".parse().unwrap(),
                    "10.0.0.6:6379".parse().unwrap()
                ],
            }),
            None,
            None,
        ]
    );
    // The resources carry every value: translating them again gives the same model.
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
}

#[test]
fn cluster_emulation_errors() {
    let text = r#"
listeners:
  - name: l
    cluster_emulation: yes please
    routes: { catch_all: a }
  - name: m
    address: 127.0.0.1:6381
    cluster_emulation: { announce: ["10.0.0.5:6379", "10.0.0.5:6379", "host:6379", 7] }
    routes: { catch_all: a }
  - name: n
    address: 127.0.0.1:6382
    cluster_emulation: { anounce: [] }
    routes: { catch_all: a }
  - name: o
    address: 127.0.0.1:6383
    cluster_emulation: { announce: "0.0.0.0:6379" }
    routes: { catch_all: a }
clusters:
  - name: a
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
"#;
    assert_eq!(
        errors(text),
        r#"listener "l": cluster_emulation: expected true, false or a mapping with announce, got a string
listener "m": cluster_emulation.announce[3]: expected a string, got a number
listener "m": cluster_emulation.announce[1]: duplicate address 10.0.0.5:6379 (also announce[0])
listener "m": cluster_emulation.announce[2]: invalid socket address "host:6379": use an IP address, host names are not resolved
listener "n": cluster_emulation.anounce: unknown field (expected one of: announce)
listener "o": cluster_emulation.announce: 0.0.0.0:6379 is not an address clients can connect to (give the sidecar's IP and port)"#
    );
}

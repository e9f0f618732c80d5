//! Envoy v3 resources → model, as an xDS server would send them: plain Envoy configs, Envoy's
//! newer load-balancing extensions, and the exact errors (Envoy field paths) for what respway
//! refuses.

use std::collections::HashMap;

use prost::{Message, Name};
use std::time::Duration;

use respway_filters::model::{
    ClientLimits, HashPolicy, HashTag, HotKeyRead, HotKeyRule, MirrorMode, MirrorPolicy,
    ProtocolMode, ReadPolicy as Reads, RespSettings, RingHashFunction, Role, ZoneFallback,
};
use respway_xds::pb::envoy::config::cluster::v3::{
    cluster::{LbConfig, LbPolicy, MaglevLbConfig},
    load_balancing_policy, LoadBalancingPolicy, OutlierDetection,
};
use respway_xds::pb::envoy::config::core::v3::{
    address, socket_address, Address, HealthCheck, Locality, Metadata, RuntimeFractionalPercent,
    SocketAddress, TypedExtensionConfig,
};
use respway_xds::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use respway_xds::pb::envoy::config::listener::v3::{filter::ConfigType, Filter};
use respway_xds::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    redis_proxy::{
        conn_pool_settings::ReadPolicy, prefix_routes::route::RequestMirrorPolicy, ProtocolVersion,
    },
    RedisProxy,
};
use respway_xds::pb::envoy::extensions::load_balancing_policies::{
    maglev::v3::Maglev, ring_hash::v3::RingHash,
};
use respway_xds::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};
use respway_xds::pb::google::protobuf::{
    value::Kind, Any, Duration as PbDuration, Struct, UInt64Value, Value,
};
use respway_xds::pb::respway::v1::{
    self as rw, shard_hashing, ClusterOptions, ListenerSettings, RouteMirrorMode, ShardHashing,
};
use respway_xds::{parse_yaml, to_resources, translate, Resources};

/// Resources for a small valid config: listener `main` → cluster `main`, two maglev shards.
fn base() -> Resources {
    parse_yaml(
        r#"
listeners:
  - name: main
    routes:
      catch_all: main
      prefixes: [{ prefix: "a:", cluster: main }]
clusters:
  - name: main
    shards:
      - name: s0
        endpoints:
          - { address: 10.0.0.1:6379, role: primary, zone: z1 }
          - { address: 10.0.0.2:6379, role: replica, zone: z2 }
      - name: s1
        endpoints: [{ address: 10.0.0.3:6379, zone: z2 }]
"#,
    )
    .unwrap()
}

fn errors(r: &Resources) -> String {
    translate(r).expect_err("should fail").to_string()
}

fn pack<T: Message + Name>(m: &T) -> Any {
    Any {
        type_url: T::type_url(),
        value: m.encode_to_vec(),
    }
}

/// Edits the listener's RedisProxy in place.
fn edit_redis(r: &mut Resources, f: impl FnOnce(&mut RedisProxy)) {
    let filter = r.listeners[0].filter_chains[0].filters.last_mut().unwrap();
    let Some(ConfigType::TypedConfig(any)) = &mut filter.config_type else {
        panic!("typed_config")
    };
    let mut redis = RedisProxy::decode(any.value.as_slice()).unwrap();
    f(&mut redis);
    *any = pack(&redis);
}

fn addr(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn host(ip: &str, port: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(addr(ip, port)),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn with_respway(mut e: LbEndpoint, fields: &[(&str, Kind)]) -> LbEndpoint {
    let s = Struct {
        fields: fields
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Value {
                        kind: Some(v.clone()),
                    },
                )
            })
            .collect(),
    };
    e.metadata = Some(Metadata {
        filter_metadata: HashMap::from([("respway".to_string(), s)]),
        ..Default::default()
    });
    e
}

fn text(s: &str) -> Kind {
    Kind::StringValue(s.to_string())
}

#[test]
fn plain_envoy_resources_translate() {
    // What an Envoy user would write: a STATIC cluster, every host its own shard, no respway
    // extension at all, and Envoy's listener-wide hashtag flag left off.
    let mut r = base();
    r.endpoints.clear();
    let c = &mut r.clusters[0];
    c.cluster_discovery_type = None;
    c.eds_cluster_config = None;
    c.typed_extension_protocol_options.clear();
    c.load_assignment = Some(ClusterLoadAssignment {
        cluster_name: "main".into(),
        endpoints: vec![LocalityLbEndpoints {
            locality: Some(Locality {
                zone: "z9".into(),
                ..Default::default()
            }),
            lb_endpoints: vec![host("10.0.0.7", 6379), host("10.0.0.8", 6379)],
            ..Default::default()
        }],
        ..Default::default()
    });
    r.listeners[0].filter_chains[0].filters.remove(0); // no respway.listener filter
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().enable_hashtagging = false
    });

    let config = translate(&r).unwrap_or_else(|e| panic!("{e}"));
    let c = &config.clusters[0];
    assert_eq!(c.hashtag, None);
    assert_eq!(c.connections_per_endpoint, 1);
    let shards: Vec<(&str, &str, Role, Option<&str>)> = c
        .shards
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.hash_key.as_str(),
                s.endpoints[0].role,
                s.endpoints[0].zone.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        shards,
        [
            ("10.0.0.7:6379", "10.0.0.7:6379", Role::Primary, Some("z9")),
            ("10.0.0.8:6379", "10.0.0.8:6379", Role::Primary, Some("z9")),
        ]
    );
    assert_eq!(config.listeners[0].max_pending_per_client, 1024);
    assert_eq!(config.listeners[0].client, ClientLimits::default());
    assert_eq!(config.listeners[0].resp, RespSettings::default());
    assert_eq!(c.max_queue_per_connection, 16384);
    assert_eq!((c.databases, c.dedicated_connections), (16, 32));

    // The flag on: the cluster hashes by "{...}".
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().enable_hashtagging = true
    });
    assert_eq!(
        translate(&r).unwrap().clusters[0].hashtag,
        Some(HashTag::default())
    );
}

#[test]
fn envoy_load_balancing_policy_extensions() {
    let mut r = base();
    let c = &mut r.clusters[0];
    c.lb_policy = 0;
    c.lb_config = None;
    let policy = |any: Any| {
        Some(LoadBalancingPolicy {
            policies: vec![
                load_balancing_policy::Policy {
                    typed_extension_config: Some(TypedExtensionConfig {
                        name: "some.future.policy".into(),
                        typed_config: Some(Any {
                            type_url: "type.googleapis.com/some.Future".into(),
                            value: vec![],
                        }),
                    }),
                },
                load_balancing_policy::Policy {
                    typed_extension_config: Some(TypedExtensionConfig {
                        name: "envoy.load_balancing_policies.x".into(),
                        typed_config: Some(any),
                    }),
                },
            ],
        })
    };
    c.load_balancing_policy = policy(pack(&Maglev {
        table_size: Some(UInt64Value { value: 251 }),
        ..Default::default()
    }));
    assert_eq!(
        translate(&r).unwrap().clusters[0].hash,
        HashPolicy::Maglev { table_size: 251 }
    );
    r.clusters[0].load_balancing_policy = policy(pack(&RingHash {
        hash_function: 2,
        ..Default::default()
    }));
    assert_eq!(
        translate(&r).unwrap().clusters[0].hash,
        HashPolicy::RingHash {
            minimum_ring_size: 1024,
            maximum_ring_size: 8 * 1024 * 1024,
            function: RingHashFunction::MurmurHash2
        }
    );
    r.clusters[0].load_balancing_policy = policy(pack(&ShardHashing { policy: None }));
    assert_eq!(
        errors(&r),
        r#"cluster "main": load_balancing_policy.policies[1].typed_extension_config.typed_config.policy: required: one of ketama, modula, crc32_slots, crc16_slots"#
    );
    r.clusters[0].load_balancing_policy = policy(pack(&ShardHashing {
        policy: Some(shard_hashing::Policy::Crc32Slots(
            shard_hashing::Crc32Slots { slots: 1 << 30 },
        )),
    }));
    assert_eq!(
        errors(&r),
        r#"cluster "main": load_balancing_policy.policies[1].typed_extension_config.typed_config.crc32_slots.slots: must be between 1 and 1048576"#
    );
    r.clusters[0].load_balancing_policy = Some(LoadBalancingPolicy { policies: vec![] });
    r.clusters[0].lb_policy = LbPolicy::Maglev as i32;
    assert_eq!(
        errors(&r),
        "cluster \"main\": lb_policy: MAGLEV conflicts with load_balancing_policy\n\
         cluster \"main\": load_balancing_policy.policies: no supported policy (respway supports \
         type.googleapis.com/respway.v1.ShardHashing, \
         type.googleapis.com/envoy.extensions.load_balancing_policies.maglev.v3.Maglev and \
         type.googleapis.com/envoy.extensions.load_balancing_policies.ring_hash.v3.RingHash; got none)"
    );
}

#[test]
fn unsupported_envoy_fields_are_refused_by_name() {
    let mut r = base();
    edit_redis(&mut r, |p| {
        let s = p.settings.as_mut().unwrap();
        s.read_policy = ReadPolicy::PreferMaster as i32;
        s.enable_redirection = true;
        let routes = p.prefix_routes.as_mut().unwrap();
        routes.routes[0].request_mirror_policy = vec![RequestMirrorPolicy {
            cluster: "other".into(),
            runtime_fraction: Some(RuntimeFractionalPercent {
                default_value: Some(FractionalPercent::default()),
                runtime_key: "redis.mirror".into(),
            }),
            ..Default::default()
        }];
        routes.routes[0].key_formatter = "%KEY%".into();
        routes.catch_all_route.as_mut().unwrap().read_command_policy = Some(Default::default());
        p.custom_commands = vec!["FOO".into()];
    });
    r.listeners[0].filter_chains[0].filters.insert(
        0,
        Filter {
            name: "envoy.filters.network.tcp_proxy".into(),
            config_type: Some(ConfigType::TypedConfig(Any {
                type_url:
                    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
                        .into(),
                value: vec![],
            })),
        },
    );
    let c = &mut r.clusters[0];
    c.health_checks = vec![HealthCheck::default()];
    c.outlier_detection = Some(OutlierDetection::default());
    let r2 = {
        let mut r2 = base();
        r2.clusters[0].lb_policy = LbPolicy::RoundRobin as i32;
        r2.clusters[0].lb_config = None;
        r2
    };
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[0]: unsupported network filter "envoy.filters.network.tcp_proxy" (type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy); respway runs envoy.filters.network.redis_proxy and respway.listener
listener "main": filter_chains[0].filters[2].typed_config.settings.enable_redirection: not supported by respway
listener "main": filter_chains[0].filters[2].typed_config.settings.read_policy: PREFER_MASTER is not supported by respway (use MASTER, PREFER_REPLICA, REPLICA, ANY or LOCAL_ZONE_AFFINITY, or respway.v1.ClusterOptions.read_policy)
listener "main": filter_chains[0].filters[2].typed_config.custom_commands: not supported by respway
listener "main": filter_chains[0].filters[2].typed_config.prefix_routes.routes[0].key_formatter: not supported by respway
listener "main": filter_chains[0].filters[2].typed_config.prefix_routes.routes[0].request_mirror_policy[0].cluster: unknown cluster "other"
listener "main": filter_chains[0].filters[2].typed_config.prefix_routes.routes[0].request_mirror_policy[0].runtime_fraction.runtime_key: not supported by respway (it has no runtime; use default_value)
listener "main": filter_chains[0].filters[2].typed_config.prefix_routes.catch_all_route.read_command_policy: not supported by respway
cluster "main": outlier_detection: not supported by respway
cluster "main": health_checks[0].health_checker: required: a custom_health_check named envoy.health_checkers.redis"#
    );
    assert_eq!(
        errors(&r2),
        "cluster \"main\": lb_policy: ROUND_ROBIN is not supported: respway places keys on shards by hash \
         (use MAGLEV, RING_HASH, or a load_balancing_policy with respway.v1.ShardHashing)"
    );
}

#[test]
fn envoy_side_validation_errors() {
    let mut r = base();
    // Non-prime maglev table.
    r.clusters[0].lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig {
        table_size: Some(UInt64Value { value: 1000 }),
    }));
    // Routes to a cluster that does not exist.
    edit_redis(&mut r, |p| {
        p.prefix_routes.as_mut().unwrap().routes[0].cluster = "nope".into();
    });
    // Two primaries in shard s0, a bad port and an unknown metadata key.
    let cla = &mut r.endpoints[0];
    cla.endpoints[0].lb_endpoints[0] = with_respway(
        host("10.0.0.1", 6379),
        &[("shard", text("s0")), ("role", text("primary"))],
    );
    cla.endpoints[1].lb_endpoints[0] = with_respway(
        host("10.0.0.2", 6379),
        &[("shard", text("s0")), ("role", text("primary"))],
    );
    cla.endpoints[1].lb_endpoints[1] = with_respway(
        host("10.0.0.3", 99999),
        &[("shard", text("s1")), ("weight", Kind::NumberValue(2.0))],
    );
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].cluster: unknown cluster "nope"
cluster "main": maglev_lb_config.table_size: 1000 is not a prime number
cluster_load_assignment "main": endpoints[1].lb_endpoints[1].endpoint.address.socket_address.port_value: invalid port 99999
cluster_load_assignment "main": endpoints[1].lb_endpoints[1].metadata.filter_metadata.respway.weight: unknown field (expected one of: shard, shard_index, role, slots, sentinel_master, sentinel_zones, sentinel_failover_hold, sentinel_serve_stale_reads)"#
    );
    let cla = &mut r.endpoints[0];
    cla.endpoints[1].lb_endpoints[1] = host("10.0.0.3", 6379);
    r.clusters[0].lb_config = None;
    edit_redis(&mut r, |p| {
        p.prefix_routes.as_mut().unwrap().routes[0].cluster = "main".into();
    });
    assert_eq!(
        errors(&r),
        r#"cluster_load_assignment "main": endpoints[1].lb_endpoints[0].metadata.filter_metadata.respway.role: shard "s0" already has a primary (endpoints[0].lb_endpoints[0]): exactly one endpoint must have role primary"#
    );
}

#[test]
fn cross_resource_checks() {
    let mut r = base();
    r.clusters.push(r.clusters[0].clone());
    r.endpoints.push(r.endpoints[0].clone());
    r.listeners.push(r.listeners[0].clone());
    let mut missing = r.clusters[0].clone();
    missing.name = "orphan".into();
    r.clusters.push(missing);
    assert_eq!(
        errors(&r),
        r#"listener "main": name: duplicate listener name (also listeners[0])
listener "main": address: 127.0.0.1:6380 is also the address of listener "main"
cluster_load_assignment "main": cluster_name: duplicate ClusterLoadAssignment (also endpoints[0])
cluster "main": name: duplicate cluster name (also clusters[0])
cluster "orphan": no ClusterLoadAssignment for "orphan""#
    );
}

#[test]
fn shard_order_follows_shard_index() {
    // Zones group endpoints so that s1 appears first; shard_index restores the order.
    let r = parse_yaml(
        r#"
listeners: [{ name: l, routes: { catch_all: c } }]
clusters:
  - name: c
    hash: { policy: modula }
    shards:
      - { name: s0, endpoints: [{ address: 10.0.0.1:6379, zone: b }] }
      - { name: s1, endpoints: [{ address: 10.0.0.2:6379, zone: a }] }
      - { name: s2, endpoints: [{ address: 10.0.0.3:6379, zone: b }] }
"#,
    )
    .unwrap();
    let zones: Vec<&str> = r.endpoints[0]
        .endpoints
        .iter()
        .map(|l| l.locality.as_ref().unwrap().zone.as_str())
        .collect();
    assert_eq!(zones, ["b", "a"]);
    let names: Vec<String> = translate(&r).unwrap().clusters[0]
        .shards
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(names, ["s0", "s1", "s2"]);
}

#[test]
fn listener_without_redis_proxy() {
    let mut r = base();
    r.listeners[0].filter_chains[0].filters.pop();
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters: an envoy.filters.network.redis_proxy filter (RedisProxy) is required"#
    );
    r.listeners[0].filter_chains.clear();
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains: one filter chain is required"#
    );
}

#[test]
fn listeners_that_disagree_on_hashtagging() {
    let mut r = base();
    r.clusters[0].typed_extension_protocol_options.clear(); // no ClusterOptions.hashtag
    add_listener_other(&mut r);
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().enable_hashtagging = false
    });
    assert_eq!(
        errors(&r),
        r#"cluster "main": typed_extension_protocol_options: listeners "other" enable hashtagging and "main" do not; set respway.v1.ClusterOptions.hashtag"#
    );
}

/// Resources with clusters `main` and `next`; listener `main` routes `a:` and the catch-all to
/// `main`, without mirrors.
fn two_clusters() -> Resources {
    parse_yaml(
        r#"
listeners:
  - name: main
    routes:
      catch_all: main
      prefixes: [{ prefix: "a:", cluster: main }]
clusters:
  - name: main
    shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }]
  - name: next
    shards: [{ endpoints: [{ address: 10.0.1.1:6379 }] }]
"#,
    )
    .unwrap()
}

/// [`two_clusters`] and a third cluster, `third`, a copy of `next`.
fn three_clusters() -> Resources {
    let mut r = two_clusters();
    r.clusters.push(r.clusters[1].clone());
    r.clusters[2].name = "third".into();
    let mut third = r.endpoints[1].clone();
    third.cluster_name = "third".into();
    r.endpoints.push(third);
    r
}

/// Adds listener `other`: a copy of the first listener, on 127.0.0.1:6381.
fn add_listener_other(r: &mut Resources) {
    let mut second = r.listeners[0].clone();
    second.name = "other".into();
    second.address = Some(addr("127.0.0.1", 6381));
    r.listeners.push(second);
}

/// Edits the listener's `respway.v1.ListenerSettings` in place.
/// The first listener's `respway.v1.ListenerSettings`.
fn settings_of(r: &Resources) -> ListenerSettings {
    let Some(ConfigType::TypedConfig(any)) =
        &r.listeners[0].filter_chains[0].filters[0].config_type
    else {
        panic!("typed_config")
    };
    ListenerSettings::decode(any.value.as_slice()).unwrap()
}

fn edit_settings(r: &mut Resources, f: impl FnOnce(&mut ListenerSettings)) {
    let filter = &mut r.listeners[0].filter_chains[0].filters[0];
    let Some(ConfigType::TypedConfig(any)) = &mut filter.config_type else {
        panic!("typed_config")
    };
    let mut settings = ListenerSettings::decode(any.value.as_slice()).unwrap();
    f(&mut settings);
    *any = pack(&settings);
}

/// Edits cluster `i`'s `respway.v1.ClusterOptions` in place.
fn edit_options(r: &mut Resources, i: usize, f: impl FnOnce(&mut ClusterOptions)) {
    let any = r.clusters[i]
        .typed_extension_protocol_options
        .get_mut("respway.cluster")
        .unwrap();
    let mut options = ClusterOptions::decode(any.value.as_slice()).unwrap();
    f(&mut options);
    *any = pack(&options);
}

fn mirror_to(
    cluster: &str,
    fraction: Option<(u32, DenominatorType)>,
    reads: bool,
) -> RequestMirrorPolicy {
    RequestMirrorPolicy {
        cluster: cluster.into(),
        runtime_fraction: fraction.map(|(numerator, d)| RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator,
                denominator: d as i32,
            }),
            runtime_key: String::new(),
        }),
        exclude_read_commands: !reads,
    }
}

fn dual_write(cluster: &str, target_is_primary: bool, reads: bool, ppm: u32) -> MirrorPolicy {
    MirrorPolicy {
        cluster: cluster.into(),
        mode: MirrorMode::DualWrite { target_is_primary },
        include_reads: reads,
        fraction_ppm: ppm,
    }
}

#[test]
fn plain_envoy_mirror_policies_are_dual_writes_with_the_route_answering() {
    use DenominatorType::{Hundred, Million, TenThousand};
    let mut r = three_clusters();
    r.listeners[0].filter_chains[0].filters.remove(0); // no respway.listener filter
    edit_redis(&mut r, |p| {
        let routes = p.prefix_routes.as_mut().unwrap();
        routes.routes[0].request_mirror_policy = vec![
            // Envoy: no runtime_fraction is everything, and reads are mirrored unless excluded.
            mirror_to("next", None, true),
            mirror_to("third", Some((7, TenThousand)), false),
        ];
        routes
            .catch_all_route
            .as_mut()
            .unwrap()
            .request_mirror_policy = vec![
            mirror_to("next", Some((25, Hundred)), false),
            // A numerator above the denominator is 100%, as in Envoy.
            mirror_to("third", Some((150, Hundred)), false),
        ];
    });
    let config = translate(&r).unwrap_or_else(|e| panic!("{e}"));
    let routes = &config.listeners[0].routes;
    assert_eq!(
        routes.routes[0].mirrors,
        [
            dual_write("next", false, true, 1_000_000),
            dual_write("third", false, false, 700),
        ]
    );
    assert_eq!(
        routes.catch_all_mirrors,
        [
            dual_write("next", false, false, 250_000),
            dual_write("third", false, false, 1_000_000),
        ]
    );
    edit_redis(&mut r, |p| {
        p.prefix_routes.as_mut().unwrap().routes[0].request_mirror_policy =
            vec![mirror_to("next", Some((3, Million)), false)];
    });
    assert_eq!(
        translate(&r).unwrap().listeners[0].routes.routes[0].mirrors,
        [dual_write("next", false, false, 3)]
    );
}

#[test]
fn mirrors_zone_read_policies_and_hot_keys_round_trip() {
    let model = translate(
        &parse_yaml(
            r#"
node: { zone: z2 }
listeners:
  - name: main
    routes:
      catch_all: main
      catch_all_mirrors:
        - { cluster: next, primary: mirror, fraction: 0.0001 }
        - { cluster: third, mode: read_only, include_reads: true }
      prefixes:
        - prefix: "a:"
          cluster: main
          mirrors:
            - { cluster: next, mode: forward, fraction: 12.5 }
            - { cluster: third, include_reads: true, fraction: 0.07 }
        - { prefix: "b:", cluster: next, mirrors: [{ cluster: main, fraction: 0 }] }
clusters:
  - name: main
    read_policy: zone_local
    zone_fallback: any_replica
    hot_keys: [{ prefix: H_, read: same_zone }, { prefix: G_, read: random }, { prefix: F_ }]
    shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }]
  - name: next
    read_policy: zone_local
    shards: [{ endpoints: [{ address: 10.0.1.1:6379 }] }]
  - name: third
    read_policy: prefer_replica
    shards: [{ endpoints: [{ address: 10.0.2.1:6379 }] }]
"#,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(model.zone.as_deref(), Some("z2"));
    let resources = to_resources(&model);
    assert_eq!(translate(&resources).unwrap(), model);

    // What Envoy can say goes in request_mirror_policy, each fraction in its coarsest exact
    // denominator; the rest in respway.v1.ListenerSettings.mirror_modes.
    let filters = &resources.listeners[0].filter_chains[0].filters;
    let Some(ConfigType::TypedConfig(any)) = &filters[1].config_type else {
        panic!("typed_config")
    };
    let redis = RedisProxy::decode(any.value.as_slice()).unwrap();
    let routes = redis.prefix_routes.unwrap();
    let fraction = |n, d: DenominatorType| Some((n, d));
    assert_eq!(
        routes.routes[0].request_mirror_policy,
        [
            mirror_to("next", fraction(1250, DenominatorType::TenThousand), false),
            mirror_to("third", fraction(7, DenominatorType::TenThousand), true),
        ]
    );
    assert_eq!(
        routes.catch_all_route.unwrap().request_mirror_policy,
        [
            mirror_to("next", fraction(1, DenominatorType::Million), false),
            mirror_to("third", fraction(100, DenominatorType::Hundred), true),
        ]
    );
    let Some(ConfigType::TypedConfig(any)) = &filters[0].config_type else {
        panic!("typed_config")
    };
    let settings = ListenerSettings::decode(any.value.as_slice()).unwrap();
    let entry = |prefix: Option<&str>, cluster: &str, mode: rw::MirrorMode, primary: bool| {
        RouteMirrorMode {
            prefix: prefix.map(str::to_string),
            cluster: cluster.into(),
            mode: mode as i32,
            target_is_primary: primary,
        }
    };
    assert_eq!(
        settings.mirror_modes,
        [
            entry(Some("a:"), "next", rw::MirrorMode::Forward, false),
            entry(Some("a:"), "third", rw::MirrorMode::DualWrite, false),
            entry(Some("b:"), "main", rw::MirrorMode::DualWrite, false),
            entry(None, "next", rw::MirrorMode::DualWrite, true),
            entry(None, "third", rw::MirrorMode::ReadOnly, false),
        ]
    );
    let options = ClusterOptions::decode(
        resources.clusters[0].typed_extension_protocol_options["respway.cluster"]
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(
        (options.read_policy, options.zone_fallback),
        (
            rw::ReadPolicy::ZoneLocal as i32,
            rw::ZoneFallback::AnyReplica as i32
        )
    );
    assert_eq!(
        options.hot_keys,
        [
            rw::HotKey {
                prefix: "H_".into(),
                read: rw::HotKeyRead::SameZone as i32
            },
            rw::HotKey {
                prefix: "G_".into(),
                read: rw::HotKeyRead::Random as i32
            },
            rw::HotKey {
                prefix: "F_".into(),
                read: rw::HotKeyRead::RoundRobin as i32
            },
        ]
    );
    assert_eq!(resources.node_zone.as_deref(), Some("z2"));
}

#[test]
fn mirror_policy_and_mode_errors() {
    let mut r = two_clusters();
    edit_redis(&mut r, |p| {
        let routes = p.prefix_routes.as_mut().unwrap();
        routes.routes[0].request_mirror_policy = vec![
            mirror_to("main", None, false),
            mirror_to("next", None, false),
            mirror_to("next", None, false),
            mirror_to("", None, false),
            RequestMirrorPolicy {
                cluster: "gone".into(),
                runtime_fraction: Some(RuntimeFractionalPercent::default()),
                exclude_read_commands: false,
            },
            RequestMirrorPolicy {
                cluster: "next".into(),
                runtime_fraction: Some(RuntimeFractionalPercent {
                    default_value: Some(FractionalPercent {
                        numerator: 1,
                        denominator: 9,
                    }),
                    runtime_key: String::new(),
                }),
                exclude_read_commands: false,
            },
        ];
    });
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].request_mirror_policy[3].cluster: required
listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].request_mirror_policy[4].cluster: unknown cluster "gone"
listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].request_mirror_policy[4].runtime_fraction.default_value: required
listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].request_mirror_policy[5].runtime_fraction.default_value.denominator: unknown value 9
listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].request_mirror_policy[0].cluster: "main" is the route's own cluster
listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].request_mirror_policy[2].cluster: duplicate mirror cluster "next" (also request_mirror_policy[1])
listener "main": filter_chains[0].filters[1].typed_config.prefix_routes.routes[0].request_mirror_policy[5].cluster: duplicate mirror cluster "next" (also request_mirror_policy[1])"#
    );

    // The modes: entries must name a route and one of its mirrors, once.
    let mut r = three_clusters();
    edit_redis(&mut r, |p| {
        let routes = p.prefix_routes.as_mut().unwrap();
        routes.routes[0].request_mirror_policy = vec![
            mirror_to("next", None, false),
            mirror_to("third", None, false),
        ];
        routes
            .catch_all_route
            .as_mut()
            .unwrap()
            .request_mirror_policy = vec![
            mirror_to("next", None, false),
            mirror_to("third", None, false),
        ];
    });
    let entry = |prefix: Option<&str>, cluster: &str, mode: i32, primary: bool| RouteMirrorMode {
        prefix: prefix.map(str::to_string),
        cluster: cluster.into(),
        mode,
        target_is_primary: primary,
    };
    use rw::MirrorMode::{DualWrite, Forward, ReadOnly};
    edit_settings(&mut r, |s| {
        s.mirror_modes = vec![
            entry(Some("A:"), "next", Forward as i32, false),
            entry(Some("a:"), "main", Forward as i32, false),
            entry(Some("a:"), "next", Forward as i32, true),
            entry(Some("a:"), "third", 9, false),
            entry(Some("a:"), "third", DualWrite as i32, false),
            entry(None, "next", DualWrite as i32, true),
            entry(None, "third", DualWrite as i32, true),
        ];
    });
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[0].prefix: no route has the prefix "A:"
listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[1].cluster: routes[0] has no request_mirror_policy for cluster "main"
listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[2].target_is_primary: only used with MIRROR_MODE_DUAL_WRITE
listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[3].mode: unknown value 9
listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[4]: another entry for routes[0] and cluster "third" (also mirror_modes[3])
listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[6].target_is_primary: only one mirror of a route may be primary (also mirror_modes[5])"#
    );
    edit_settings(&mut r, |s| {
        s.mirror_modes = vec![
            entry(Some("a:"), "next", ReadOnly as i32, false),
            entry(Some("a:"), "third", ReadOnly as i32, false),
        ];
    });
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[1].mode: only one MIRROR_MODE_READ_ONLY mirror per route (also mirror_modes[0])"#
    );
    edit_redis(&mut r, |p| {
        p.prefix_routes.as_mut().unwrap().catch_all_route = None;
    });
    edit_settings(&mut r, |s| {
        s.mirror_modes = vec![entry(None, "next", Forward as i32, false)];
    });
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[0].typed_config.mirror_modes[0].prefix: unset, which names the catch_all_route, but there is none"#
    );
}

#[test]
fn envoy_read_policy_applies_to_clusters_without_their_own() {
    let mut r = two_clusters();
    edit_redis(&mut r, |p| {
        p.prefix_routes.as_mut().unwrap().routes[0].request_mirror_policy =
            vec![mirror_to("next", None, false)];
    });
    // Only `main` leaves its read policy to the listener; `next`, mirrored to, too.
    for i in 0..2 {
        edit_options(&mut r, i, |o| {
            o.read_policy = rw::ReadPolicy::Unspecified as i32
        });
    }
    let read_policies = |r: &Resources| -> Vec<Reads> {
        translate(r)
            .unwrap_or_else(|e| panic!("{e}"))
            .clusters
            .iter()
            .map(|c| c.read_policy)
            .collect()
    };
    assert_eq!(read_policies(&r), [Reads::Primary, Reads::Primary]);
    for (envoy, ours) in [
        (ReadPolicy::Master, Reads::Primary),
        (ReadPolicy::Replica, Reads::PreferReplica),
        (ReadPolicy::PreferReplica, Reads::PreferReplica),
        (ReadPolicy::Any, Reads::Any),
        (
            ReadPolicy::LocalZoneAffinity,
            Reads::ZoneLocal {
                fallback: ZoneFallback::AnyReplica,
            },
        ),
    ] {
        edit_redis(&mut r, |p| {
            p.settings.as_mut().unwrap().read_policy = envoy as i32
        });
        assert_eq!(read_policies(&r), [ours, ours], "{envoy:?}");
    }
    // respway's own value wins.
    edit_options(&mut r, 1, |o| {
        o.read_policy = rw::ReadPolicy::Primary as i32
    });
    assert_eq!(
        read_policies(&r),
        [
            Reads::ZoneLocal {
                fallback: ZoneFallback::AnyReplica
            },
            Reads::Primary
        ]
    );
    // A cluster no listener routes to reads from its primary.
    let mut lone = r.clone();
    edit_redis(&mut lone, |p| {
        p.prefix_routes.as_mut().unwrap().routes[0].request_mirror_policy = vec![];
    });
    edit_options(&mut lone, 1, |o| o.read_policy = 0);
    assert_eq!(read_policies(&lone)[1], Reads::Primary);

    // Listeners that disagree.
    add_listener_other(&mut r);
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().read_policy = ReadPolicy::Replica as i32
    });
    assert_eq!(
        errors(&r),
        r#"cluster "main": typed_extension_protocol_options: listeners "main" (REPLICA), "other" (LOCAL_ZONE_AFFINITY) disagree on settings.read_policy; set respway.v1.ClusterOptions.read_policy"#
    );
    // REPLICA and PREFER_REPLICA are the same policy to respway.
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().read_policy = ReadPolicy::PreferReplica as i32
    });
    let last = r.listeners.len() - 1;
    r.listeners.swap(0, last);
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().read_policy = ReadPolicy::Replica as i32
    });
    assert_eq!(read_policies(&r), [Reads::PreferReplica, Reads::Primary]);
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().read_policy =
            ReadPolicy::LocalZoneAffinityReplicasAndPrimary as i32
    });
    assert_eq!(
        errors(&r),
        r#"listener "other": filter_chains[0].filters[1].typed_config.settings.read_policy: LOCAL_ZONE_AFFINITY_REPLICAS_AND_PRIMARY is not supported by respway (use MASTER, PREFER_REPLICA, REPLICA, ANY or LOCAL_ZONE_AFFINITY, or respway.v1.ClusterOptions.read_policy)"#
    );
}

#[test]
fn cluster_options_read_policy_and_hot_keys() {
    let mut r = two_clusters();
    edit_options(&mut r, 0, |o| {
        o.read_policy = rw::ReadPolicy::ZoneLocal as i32;
        o.hot_keys = vec![
            rw::HotKey {
                prefix: "H_".into(),
                read: rw::HotKeyRead::SameZone as i32,
            },
            rw::HotKey {
                prefix: "h_".into(),
                read: 0,
            },
        ];
    });
    let c = &translate(&r).unwrap().clusters[0];
    assert_eq!(
        c.read_policy,
        Reads::ZoneLocal {
            fallback: ZoneFallback::Primary
        }
    );
    assert_eq!(
        c.hot_keys,
        [
            HotKeyRule {
                prefix: "H_".into(),
                read: HotKeyRead::SameZone
            },
            HotKeyRule {
                prefix: "h_".into(),
                read: HotKeyRead::RoundRobin
            },
        ]
    );
    edit_options(&mut r, 0, |o| {
        o.read_policy = rw::ReadPolicy::Any as i32;
        o.zone_fallback = rw::ZoneFallback::AnyReplica as i32;
        o.hot_keys = vec![
            rw::HotKey {
                prefix: String::new(),
                read: 0,
            },
            rw::HotKey {
                prefix: "X".into(),
                read: 7,
            },
            rw::HotKey {
                prefix: "X".into(),
                read: 1,
            },
        ];
    });
    edit_options(&mut r, 1, |o| {
        o.read_policy = 9;
        o.zone_fallback = 5;
    });
    assert_eq!(
        errors(&r),
        r#"cluster "main": typed_extension_protocol_options["respway.cluster"].zone_fallback: only used with READ_POLICY_ZONE_LOCAL
cluster "main": typed_extension_protocol_options["respway.cluster"].hot_keys[1].read: unknown value 7
cluster "main": typed_extension_protocol_options["respway.cluster"].hot_keys[0].prefix: must not be empty
cluster "main": typed_extension_protocol_options["respway.cluster"].hot_keys[2].prefix: duplicate hot-key prefix "X" (also hot_keys[1])
cluster "next": typed_extension_protocol_options["respway.cluster"].zone_fallback: unknown value 5
cluster "next": typed_extension_protocol_options["respway.cluster"].read_policy: unknown value 9"#
    );
}

#[test]
fn node_zone_is_carried_beside_the_resources() {
    let mut r = base();
    assert_eq!(translate(&r).unwrap().zone, None);
    r.node_zone = Some("z1".into());
    assert_eq!(translate(&r).unwrap().zone.as_deref(), Some("z1"));
    r.node_zone = Some(String::new());
    assert_eq!(errors(&r), "node: zone: must not be empty (leave it unset)");
}

#[test]
fn client_limits_and_queue_bound_travel_in_the_extensions() {
    let model = translate(
        &parse_yaml(
            r#"
listeners:
  - name: main
    client_buffer_limit: 1048576
    client_buffer_hard_limit: 8388608
    client_stall_timeout: 250ms
    max_auth_failures: 2
    allow_keyless_scripts: true
    allow_restricted_scripts: true
    admin_commands: true
    keys_max: 500
    pubsub_buffer_limit: 65536
    routes: { catch_all: main }
clusters:
  - name: main
    max_queue_per_connection: 512
    shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }]
"#,
        )
        .unwrap(),
    )
    .unwrap();
    let client = ClientLimits {
        buffer_limit: 1 << 20,
        buffer_hard_limit: 8 << 20,
        stall_timeout: Duration::from_millis(250),
        max_auth_failures: 2,
        allow_keyless_scripts: true,
        allow_restricted_scripts: true,
        admin_commands: true,
        keys_max: 500,
        pubsub_buffer_limit: 65536,
    };
    assert_eq!(model.listeners[0].client, client);
    assert_eq!(model.clusters[0].max_queue_per_connection, 512);
    let resources = to_resources(&model);
    assert_eq!(translate(&resources).unwrap(), model);

    // respway.v1.ListenerSettings and respway.v1.ClusterOptions carry them.
    let settings = settings_of(&resources);
    assert_eq!(
        (
            settings.client_buffer_limit,
            settings.client_buffer_hard_limit,
            settings.client_stall_timeout,
            settings.max_auth_failures,
            settings.allow_keyless_scripts,
            (
                settings.allow_restricted_scripts,
                settings.admin_commands,
                settings.keys_max,
                settings.pubsub_buffer_limit
            ),
        ),
        (
            1 << 20,
            8 << 20,
            Some(PbDuration {
                seconds: 0,
                nanos: 250_000_000
            }),
            2,
            true,
            (true, true, 500, 65536),
        )
    );
    let options = ClusterOptions::decode(
        resources.clusters[0].typed_extension_protocol_options["respway.cluster"]
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(options.max_queue_per_connection, 512);

    // 0 and unset are the defaults, as an xDS server leaving them out would send.
    let mut r = resources;
    edit_settings(&mut r, |s| {
        s.client_buffer_limit = 0;
        s.client_buffer_hard_limit = 0;
        s.client_stall_timeout = None;
        s.max_auth_failures = 0;
        s.allow_keyless_scripts = false;
        s.allow_restricted_scripts = false;
        s.admin_commands = false;
        s.keys_max = 0;
        s.pubsub_buffer_limit = 0;
    });
    edit_options(&mut r, 0, |o| o.max_queue_per_connection = 0);
    let config = translate(&r).unwrap();
    assert_eq!(config.listeners[0].client, ClientLimits::default());
    assert_eq!(config.clusters[0].max_queue_per_connection, 16384);
    // One value given, the others defaulted.
    edit_settings(&mut r, |s| s.client_buffer_hard_limit = 64 << 20);
    assert_eq!(
        translate(&r).unwrap().listeners[0].client,
        ClientLimits {
            buffer_hard_limit: 64 << 20,
            ..ClientLimits::default()
        }
    );
}

#[test]
fn client_limit_errors() {
    let at = r#"listener "main": filter_chains[0].filters[0].typed_config"#;
    let mut r = base();
    edit_settings(&mut r, |s| {
        s.client_buffer_limit = 2048;
        s.client_buffer_hard_limit = 1024;
        s.client_stall_timeout = Some(PbDuration::default());
    });
    assert_eq!(
        errors(&r),
        format!(
            "{at}.client_buffer_hard_limit: 1024 is less than client_buffer_limit 2048
{at}.client_stall_timeout: must be greater than 0"
        )
    );
    edit_settings(&mut r, |s| {
        s.client_buffer_limit = 0;
        s.client_stall_timeout = Some(PbDuration {
            seconds: -1,
            nanos: 0,
        });
    });
    assert_eq!(
        errors(&r),
        format!(
            "{at}.client_buffer_hard_limit: 1024 is less than client_buffer_limit 67108864 (the default)
{at}.client_stall_timeout: invalid duration (-1s, 0ns)"
        )
    );
    edit_settings(&mut r, |s| {
        s.client_buffer_limit = 512 << 20;
        s.client_buffer_hard_limit = 0;
        s.client_stall_timeout = None;
    });
    assert_eq!(
        errors(&r),
        format!(
            "{at}.client_buffer_hard_limit: 268435456 (the default) is less than client_buffer_limit 536870912"
        )
    );
}

/// The listener's `RedisProxy` and `respway.v1.ListenerSettings` as `to_resources` wrote them.
fn redis_and_settings(r: &Resources) -> (RedisProxy, ListenerSettings) {
    let filters = &r.listeners[0].filter_chains[0].filters;
    let decode = |f: &Filter| {
        let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
            panic!("typed_config")
        };
        any.value.clone()
    };
    (
        RedisProxy::decode(decode(&filters[1]).as_slice()).unwrap(),
        ListenerSettings::decode(decode(&filters[0]).as_slice()).unwrap(),
    )
}

#[test]
fn envoy_protocol_version_and_listener_settings_protocol() {
    // Plain Envoy, no respway.listener filter: RESP2 (also proto3's unset) lets clients choose,
    // RESP3 is enforced.
    let mut r = base();
    r.listeners[0].filter_chains[0].filters.remove(0);
    let resp = |r: &Resources| {
        translate(r).unwrap_or_else(|e| panic!("{e}")).listeners[0]
            .resp
            .clone()
    };
    edit_redis(&mut r, |p| {
        p.protocol_version = ProtocolVersion::Resp2 as i32
    });
    assert_eq!(resp(&r), RespSettings::default());
    assert_eq!(resp(&r).protocol, ProtocolMode::Auto);
    edit_redis(&mut r, |p| {
        p.protocol_version = ProtocolVersion::Resp3 as i32
    });
    assert_eq!(
        resp(&r),
        RespSettings {
            protocol: ProtocolMode::Resp3,
            ..RespSettings::default()
        }
    );

    // ListenerSettings.protocol, when set, wins over protocol_version.
    let mut r = base();
    use rw::Protocol as P;
    use ProtocolVersion::{Resp2, Resp3};
    for (envoy, own, mode) in [
        (Resp2, P::Unspecified, ProtocolMode::Auto),
        (Resp3, P::Unspecified, ProtocolMode::Resp3),
        (Resp2, P::Auto, ProtocolMode::Auto),
        (Resp2, P::Resp2, ProtocolMode::Resp2),
        (Resp2, P::Resp3, ProtocolMode::Resp3),
        (Resp3, P::Auto, ProtocolMode::Auto),
        (Resp3, P::Resp2, ProtocolMode::Resp2),
        (Resp3, P::Resp3, ProtocolMode::Resp3),
    ] {
        edit_redis(&mut r, |p| p.protocol_version = envoy as i32);
        edit_settings(&mut r, |s| s.protocol = own as i32);
        assert_eq!(resp(&r).protocol, mode, "{envoy:?} with {own:?}");
    }

    // The advertised version: empty is the default.
    edit_settings(&mut r, |s| s.advertised_redis_version = "7.2.4".into());
    assert_eq!(resp(&r).advertised_version, "7.2.4");
    edit_settings(&mut r, |s| s.advertised_redis_version = String::new());
    assert_eq!(
        resp(&r).advertised_version,
        respway_filters::command::REDIS_VERSION
    );
}

#[test]
fn protocol_and_advertised_version_round_trip() {
    for (name, mode, envoy, own) in [
        (
            "auto",
            ProtocolMode::Auto,
            ProtocolVersion::Resp2,
            rw::Protocol::Auto,
        ),
        (
            "resp2",
            ProtocolMode::Resp2,
            ProtocolVersion::Resp2,
            rw::Protocol::Resp2,
        ),
        (
            "resp3",
            ProtocolMode::Resp3,
            ProtocolVersion::Resp3,
            rw::Protocol::Resp3,
        ),
    ] {
        let model = translate(
            &parse_yaml(&format!(
                r#"
listeners:
  - name: main
    protocol: {name}
    advertised_redis_version: "6.2.14"
    routes: {{ catch_all: main }}
clusters:
  - name: main
    shards: [{{ endpoints: [{{ address: 10.0.0.1:6379 }}] }}]
"#
            ))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            model.listeners[0].resp,
            RespSettings {
                protocol: mode,
                advertised_version: "6.2.14".into(),
            }
        );
        let resources = to_resources(&model);
        let (redis, settings) = redis_and_settings(&resources);
        assert_eq!(redis.protocol_version, envoy as i32, "{name}");
        assert_eq!(settings.protocol, own as i32, "{name}");
        assert_eq!(settings.advertised_redis_version, "6.2.14");
        assert_eq!(translate(&resources).unwrap(), model);
    }
}

#[test]
fn protocol_and_advertised_version_errors() {
    let at = r#"listener "main": filter_chains[0].filters[0].typed_config"#;
    let rp = r#"listener "main": filter_chains[0].filters[1].typed_config"#;
    let mut r = base();
    edit_redis(&mut r, |p| p.protocol_version = 2);
    edit_settings(&mut r, |s| {
        s.protocol = 4;
        s.advertised_redis_version = "7.x".into();
    });
    assert_eq!(
        errors(&r),
        format!(
            "{rp}.protocol_version: unknown value 2
{at}.protocol: unknown value 4
{at}.advertised_redis_version: invalid version \"7.x\" (expected digits and dots, e.g. \"7.2.4\")"
        )
    );
    edit_redis(&mut r, |p| {
        p.protocol_version = ProtocolVersion::Resp3 as i32
    });
    edit_settings(&mut r, |s| {
        s.protocol = rw::Protocol::Unspecified as i32;
        s.advertised_redis_version = "7.2.".into();
    });
    assert_eq!(
        errors(&r),
        format!(
            "{at}.advertised_redis_version: invalid version \"7.2.\" (expected digits and dots, e.g. \"7.2.4\")"
        )
    );
}

#[test]
fn databases_and_dedicated_connections_travel_in_cluster_options() {
    let model = translate(
        &parse_yaml(
            r#"
listeners:
  - name: main
    routes: { catch_all: main }
clusters:
  - name: main
    db: 3
    databases: 4
    dedicated_connections: 2
    shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }]
"#,
        )
        .unwrap(),
    )
    .unwrap();
    let c = &model.clusters[0];
    assert_eq!((c.db, c.databases, c.dedicated_connections), (3, 4, 2));
    let resources = to_resources(&model);
    assert_eq!(translate(&resources).unwrap(), model);
    let options = ClusterOptions::decode(
        resources.clusters[0].typed_extension_protocol_options["respway.cluster"]
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!((options.databases, options.dedicated_connections), (4, 2));

    // 0 is the default, as an xDS server leaving them out would send.
    let mut r = resources;
    edit_options(&mut r, 0, |o| {
        o.databases = 0;
        o.dedicated_connections = 0;
    });
    let c = &translate(&r).unwrap().clusters[0];
    assert_eq!((c.databases, c.dedicated_connections), (16, 32));
    // The largest values.
    edit_options(&mut r, 0, |o| {
        o.databases = 256;
        o.dedicated_connections = 65535;
    });
    let c = &translate(&r).unwrap().clusters[0];
    assert_eq!((c.databases, c.dedicated_connections), (256, 65535));

    // Beyond them.
    edit_options(&mut r, 0, |o| {
        o.databases = 257;
        o.dedicated_connections = 65536;
    });
    let at = r#"cluster "main": typed_extension_protocol_options["respway.cluster"]"#;
    assert_eq!(
        errors(&r),
        format!(
            "{at}.databases: must be at most 256
{at}.dedicated_connections: must be at most 65535"
        )
    );
}

#[test]
fn redis_proxy_requires_what_envoy_requires() {
    // Envoy's proto validation: stat_prefix min_len 1, settings required, op_timeout required.
    let mut r = base();
    edit_redis(&mut r, |p| {
        p.stat_prefix.clear();
        p.settings = None;
    });
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[1].typed_config.stat_prefix: required (Envoy requires it; respway labels metrics with the listener name)
listener "main": filter_chains[0].filters[1].typed_config.settings: required (Envoy requires it, with settings.op_timeout)"#
    );
    let mut r = base();
    edit_redis(&mut r, |p| p.settings.as_mut().unwrap().op_timeout = None);
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].filters[1].typed_config.settings.op_timeout: required (Envoy requires it)"#
    );
    // Any stat_prefix is accepted; metrics stay labelled by the listener name.
    let mut r = base();
    edit_redis(&mut r, |p| p.stat_prefix = "redis_stats".into());
    assert_eq!(translate(&r).unwrap().listeners[0].name, "main");
}

#[test]
fn enable_command_stats_is_accepted_either_way() {
    // respway always keeps per-command stats, so the flag asks for nothing it would not do.
    for on in [false, true] {
        let mut r = base();
        edit_redis(&mut r, |p| {
            p.settings.as_mut().unwrap().enable_command_stats = on
        });
        translate(&r).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn eds_endpoints_come_over_ads_only() {
    use respway_xds::pb::envoy::config::core::v3::{
        config_source::ConfigSourceSpecifier, AggregatedConfigSource, ApiConfigSource,
        PathConfigSource, SelfConfigSource,
    };
    let with = |spec: Option<ConfigSourceSpecifier>| {
        let mut r = base();
        let eds = r.clusters[0].eds_cluster_config.as_mut().unwrap();
        eds.eds_config.as_mut().unwrap().config_source_specifier = spec;
        r
    };
    translate(&with(Some(ConfigSourceSpecifier::Ads(
        AggregatedConfigSource {},
    ))))
    .unwrap();
    translate(&with(None)).unwrap();
    let mut unset = base();
    unset.clusters[0].eds_cluster_config = None;
    translate(&unset).unwrap();
    let path = with(Some(ConfigSourceSpecifier::PathConfigSource(
        PathConfigSource {
            path: "/etc/envoy/eds.yaml".into(),
            ..Default::default()
        },
    )));
    assert_eq!(
        errors(&path),
        r#"cluster "main": eds_cluster_config.eds_config.path_config_source: not supported by respway: endpoints come over the ADS stream (use ads: {})"#
    );
    let api = with(Some(ConfigSourceSpecifier::ApiConfigSource(
        ApiConfigSource::default(),
    )));
    assert!(errors(&api).contains("eds_cluster_config.eds_config.api_config_source: not supported"));
    let own = with(Some(ConfigSourceSpecifier::Self_(
        SelfConfigSource::default(),
    )));
    assert!(errors(&own).contains("eds_cluster_config.eds_config.self: not supported"));
}

/// The slow log's and hot-key detection's settings go from YAML into the model, into
/// `respway.v1.ListenerSettings` and back; unset stays unset (the sidecar's flags apply), and
/// a bad value names its field.
#[test]
fn observability_settings_travel_in_the_extension() {
    let yaml = |extra: &str| {
        format!(
            "listeners:\n  - name: main\n{extra}    routes: {{ catch_all: main }}\nclusters:\n  - name: main\n    shards: [{{ endpoints: [{{ address: 10.0.0.1:6379 }}] }}]\n"
        )
    };
    let model = translate(
        &parse_yaml(&yaml(
            "    slowlog_threshold: 0us\n    slowlog_max_len: 7\n    hot_key_sample: 0\n",
        ))
        .unwrap(),
    )
    .unwrap();
    let o = &model.listeners[0].observe;
    assert_eq!(
        (o.slowlog_threshold, o.slowlog_max_len, o.hot_key_sample),
        (Some(Duration::ZERO), Some(7), Some(0))
    );
    let resources = to_resources(&model);
    assert_eq!(translate(&resources).unwrap(), model);
    let s = settings_of(&resources);
    assert_eq!(
        (s.slowlog_threshold, s.slowlog_max_len, s.hot_key_sample),
        (Some(PbDuration::default()), Some(7), Some(0))
    );

    let unset = translate(&parse_yaml(&yaml("")).unwrap()).unwrap();
    assert_eq!(unset.listeners[0].observe, Default::default());
    assert_eq!(translate(&to_resources(&unset)).unwrap(), unset);

    let e = parse_yaml(&yaml(
        "    slowlog_threshold: soon\n    slowlog_max_len: 100001\n    hot_key_sample: -1\n",
    ))
    .expect_err("bad values")
    .to_string();
    assert!(
        e.contains("slowlog_threshold: invalid duration \"soon\""),
        "{e}"
    );
    assert!(e.contains("slowlog_max_len: must be at most 100000"), "{e}");
    assert!(
        e.contains("hot_key_sample: expected an unsigned integer"),
        "{e}"
    );

    let mut r = resources;
    edit_settings(&mut r, |s| {
        s.slowlog_max_len = Some(1 << 40);
        s.slowlog_threshold = Some(PbDuration {
            seconds: -1,
            nanos: 0,
        });
    });
    let e = errors(&r);
    assert!(e.contains("slowlog_max_len: must be at most 100000"), "{e}");
    assert!(
        e.contains("slowlog_threshold: invalid duration (-1s, 0ns)"),
        "{e}"
    );
}

/// Envoy's Redis health checker as Envoy says it: its `key` is the drain key, the thresholds
/// and durations are taken as given, the model writes back out to the same resource.
#[test]
fn redis_health_checks_translate_and_round_trip() {
    use respway_xds::pb::envoy::config::core::v3::health_check::{
        custom_health_check, CustomHealthCheck, HealthChecker, TcpHealthCheck,
    };
    use respway_xds::pb::envoy::extensions::health_checkers::redis::v3::Redis;
    use respway_xds::pb::google::protobuf::UInt32Value;
    let redis = |key: &str| {
        Some(HealthChecker::CustomHealthCheck(CustomHealthCheck {
            name: "envoy.health_checkers.redis".into(),
            config_type: Some(custom_health_check::ConfigType::TypedConfig(pack(&Redis {
                key: key.into(),
                aws_iam: None,
            }))),
        }))
    };
    let mut r = base();
    r.clusters[0].health_checks = vec![HealthCheck {
        timeout: Some(PbDuration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        interval: Some(PbDuration {
            seconds: 2,
            nanos: 0,
        }),
        unhealthy_threshold: Some(UInt32Value { value: 4 }),
        healthy_threshold: Some(UInt32Value { value: 1 }),
        health_checker: redis("maint"),
        ..Default::default()
    }];
    let config = translate(&r).expect("valid");
    let h = config.clusters[0].health_check.clone().expect("a check");
    assert_eq!(
        h,
        respway_filters::model::HealthCheck {
            interval: Duration::from_secs(2),
            timeout: Duration::from_millis(200),
            unhealthy_threshold: 4,
            healthy_threshold: 1,
            drain_key: Some("maint".into()),
        }
    );
    assert_eq!(
        to_resources(&config).clusters[0].health_checks,
        r.clusters[0].health_checks
    );
    // Unset numbers take the defaults; an empty key is PING.
    let mut d = base();
    d.clusters[0].health_checks = vec![HealthCheck {
        health_checker: redis(""),
        ..Default::default()
    }];
    assert_eq!(
        translate(&d).expect("valid").clusters[0].health_check,
        Some(respway_filters::model::HealthCheck::default())
    );
    // No health check, none in the model.
    assert_eq!(translate(&base()).unwrap().clusters[0].health_check, None);

    // What respway does not run is refused by name.
    let mut bad = base();
    let c = &mut bad.clusters[0];
    c.health_checks = vec![HealthCheck {
        interval: Some(PbDuration::default()),
        unhealthy_threshold: Some(UInt32Value { value: 0 }),
        healthy_threshold: Some(UInt32Value { value: 0 }),
        alt_port: Some(UInt32Value { value: 1 }),
        interval_jitter_percent: 5,
        health_checker: Some(HealthChecker::TcpHealthCheck(TcpHealthCheck::default())),
        ..Default::default()
    }];
    assert_eq!(
        errors(&bad),
        r#"cluster "main": health_checks[0].interval_jitter_percent: not supported by respway
cluster "main": health_checks[0].alt_port: not supported by respway
cluster "main": health_checks[0].interval: must be greater than 0
cluster "main": health_checks[0].unhealthy_threshold: must be greater than 0
cluster "main": health_checks[0].healthy_threshold: must be greater than 0
cluster "main": health_checks[0].tcp_health_check: not supported by respway (use a custom_health_check named envoy.health_checkers.redis)"#
    );
    let mut two = base();
    two.clusters[0].health_checks = vec![
        HealthCheck {
            health_checker: redis(""),
            ..Default::default()
        };
        2
    ];
    assert_eq!(
        errors(&two),
        r#"cluster "main": health_checks: respway runs one health check per cluster (got 2)"#
    );
    let mut other = base();
    other.clusters[0].health_checks = vec![HealthCheck {
        health_checker: Some(HealthChecker::CustomHealthCheck(CustomHealthCheck {
            name: "envoy.health_checkers.thrift".into(),
            config_type: None,
        })),
        ..Default::default()
    }];
    assert_eq!(
        errors(&other),
        r#"cluster "main": health_checks[0].custom_health_check.name: unsupported health checker "envoy.health_checkers.thrift" (respway runs envoy.health_checkers.redis)"#
    );
    let mut iam = base();
    iam.clusters[0].health_checks = vec![HealthCheck {
        health_checker: Some(HealthChecker::CustomHealthCheck(CustomHealthCheck {
            name: "envoy.health_checkers.redis".into(),
            config_type: Some(custom_health_check::ConfigType::TypedConfig(pack(&Redis {
                key: String::new(),
                aws_iam: Some(Default::default()),
            }))),
        })),
        ..Default::default()
    }];
    let mut wrong = base();
    wrong.clusters[0].health_checks = vec![HealthCheck {
        health_checker: Some(HealthChecker::CustomHealthCheck(CustomHealthCheck {
            name: "envoy.health_checkers.redis".into(),
            config_type: Some(custom_health_check::ConfigType::TypedConfig(pack(
                &UInt32Value { value: 1 },
            ))),
        })),
        ..Default::default()
    }];
    assert_eq!(
        format!("{}\n{}", errors(&iam), errors(&wrong)),
        r#"cluster "main": health_checks[0].custom_health_check.typed_config.aws_iam: not supported by respway
cluster "main": health_checks[0].custom_health_check.typed_config: expected type.googleapis.com/envoy.extensions.health_checkers.redis.v3.Redis, got "type.googleapis.com/google.protobuf.UInt32Value""#
    );
}

/// `respway.v1.ClusterOptions.near_cache`: zeros and unset fields are the defaults, the model
/// writes back out to the same message (every field set), and what is wrong is named by its
/// field under the cluster's options.
#[test]
fn near_caches_translate_and_round_trip() {
    use respway_filters::model::{NearCache, NearCacheAdmit, NearCacheMode};
    let options = |r: &Resources| {
        ClusterOptions::decode(
            r.clusters[0].typed_extension_protocol_options["respway.cluster"]
                .value
                .as_slice(),
        )
        .unwrap()
    };
    let given = rw::NearCache {
        mode: rw::NearCacheMode::Bcast as i32,
        prefixes: vec!["user:".into(), "HIGH_FREQ_".into()],
        admit: rw::NearCacheAdmit::Hot as i32,
        max_bytes: 1 << 30,
        max_entry_bytes: 1 << 20,
        max_age: Some(PbDuration {
            seconds: 0,
            nanos: 1_500_000,
        }),
        hot_reads_per_sec: 20,
    };
    let mut r = base();
    edit_options(&mut r, 0, |o| o.near_cache = Some(given.clone()));
    let config = translate(&r).expect("valid");
    assert_eq!(
        config.clusters[0].near_cache,
        Some(NearCache {
            mode: NearCacheMode::Bcast,
            prefixes: vec!["user:".into(), "HIGH_FREQ_".into()],
            admit: NearCacheAdmit::Hot,
            max_bytes: 1 << 30,
            max_entry_bytes: 1 << 20,
            max_age: Duration::from_micros(1500),
            hot_reads_per_sec: 20,
        })
    );
    assert_eq!(options(&to_resources(&config)).near_cache, Some(given));

    // An empty message is every default, written back out explicitly.
    let mut d = base();
    edit_options(&mut d, 0, |o| o.near_cache = Some(rw::NearCache::default()));
    let config = translate(&d).expect("valid");
    assert_eq!(config.clusters[0].near_cache, Some(NearCache::default()));
    let written = options(&to_resources(&config)).near_cache.unwrap();
    assert_eq!(written.mode, rw::NearCacheMode::Tracked as i32);
    assert_eq!(written.admit, rw::NearCacheAdmit::All as i32);
    assert_eq!(
        (
            written.max_bytes,
            written.max_entry_bytes,
            written.hot_reads_per_sec
        ),
        (64 << 20, 64 << 10, 0)
    );
    assert_eq!(
        written.max_age,
        Some(PbDuration {
            seconds: 60,
            nanos: 0
        })
    );
    // None set, none in the model, none written.
    let config = translate(&base()).unwrap();
    assert_eq!(config.clusters[0].near_cache, None);
    assert_eq!(options(&to_resources(&config)).near_cache, None);

    let mut bad = base();
    edit_options(&mut bad, 0, |o| {
        o.near_cache = Some(rw::NearCache {
            mode: 7,
            prefixes: vec!["a".into(), String::new(), "a".into()],
            admit: 9,
            max_bytes: 4096,
            max_entry_bytes: 8192,
            max_age: Some(PbDuration {
                seconds: 0,
                nanos: 0,
            }),
            hot_reads_per_sec: 0,
        })
    });
    assert_eq!(
        errors(&bad),
        r#"cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.mode: unknown value 7
cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.admit: unknown value 9
cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.max_age: must be greater than 0
cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.prefixes[1]: must not be empty
cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.prefixes[2]: duplicate prefix "a" (also prefixes[0])
cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.max_entry_bytes: 8192 is more than max_bytes 4096"#
    );
    // The entry cap is checked against the budget in effect, a default one included.
    let mut big = base();
    edit_options(&mut big, 0, |o| {
        o.near_cache = Some(rw::NearCache {
            max_entry_bytes: 100 << 20,
            max_age: Some(PbDuration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        })
    });
    assert_eq!(
        errors(&big),
        r#"cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.max_age: invalid duration (-1s, 0ns)
cluster "main": typed_extension_protocol_options["respway.cluster"].near_cache.max_entry_bytes: 104857600 is more than max_bytes 67108864 (the default)"#
    );
}

#[test]
fn cluster_emulation_translates_and_its_errors_name_the_field() {
    let at = r#"listener "main": filter_chains[0].filters[0].typed_config.cluster_emulation"#;
    let mut r = base();
    // Unset: off.
    assert_eq!(translate(&r).unwrap().listeners[0].cluster_emulation, None);
    // Set without addresses: one node, the connection's local address.
    edit_settings(&mut r, |s| {
        s.cluster_emulation = Some(rw::ClusterEmulation::default())
    });
    let config = translate(&r).unwrap();
    assert_eq!(
        config.listeners[0].cluster_emulation,
        Some(respway_filters::model::ClusterEmulation::default())
    );
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
    edit_settings(&mut r, |s| {
        s.cluster_emulation = Some(rw::ClusterEmulation {
            announce: vec!["10.0.0.5:6379".into(), "[fd00::6]:6379".into()],
        })
    });
    let config = translate(&r).unwrap();
    let announce = &config.listeners[0]
        .cluster_emulation
        .as_ref()
        .unwrap()
        .announce;
    assert_eq!(
        announce,
        &[
            "10.0.0.5:6379".parse().unwrap(),
            "[fd00::6]:6379".parse().unwrap()
        ]
    );
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);

    edit_settings(&mut r, |s| {
        s.cluster_emulation = Some(rw::ClusterEmulation {
            announce: vec![
                "10.0.0.5:6379".into(),
                "sidecar:6379".into(),
                "0.0.0.0:6379".into(),
                "10.0.0.5:6379".into(),
                "10.0.0.6:0".into(),
            ],
        })
    });
    assert_eq!(
        errors(&r),
        format!(
            "{at}.announce[1]: invalid socket address \"sidecar:6379\": use an IP address, host names are not resolved
{at}.announce[2]: 0.0.0.0:6379 is not an address clients can connect to (give the sidecar's IP and port)
{at}.announce[3]: duplicate address 10.0.0.5:6379 (also announce[0])
{at}.announce[4]: 10.0.0.6:0 is not an address clients can connect to (give the sidecar's IP and port)"
        )
    );
}

//! Envoy v3 resources → model, as an xDS server would send them: plain Envoy configs, Envoy's
//! newer load-balancing extensions, and the exact errors (Envoy field paths) for what respway
//! refuses.

use std::collections::HashMap;

use prost::{Message, Name};
use respway_filters::model::{HashPolicy, HashTag, RingHashFunction, Role};
use respway_xds::pb::envoy::config::cluster::v3::{
    cluster::{LbConfig, LbPolicy, MaglevLbConfig},
    load_balancing_policy, LoadBalancingPolicy, OutlierDetection,
};
use respway_xds::pb::envoy::config::core::v3::{
    address, socket_address, Address, HealthCheck, Locality, Metadata, SocketAddress,
    TypedExtensionConfig,
};
use respway_xds::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use respway_xds::pb::envoy::config::listener::v3::{filter::ConfigType, Filter};
use respway_xds::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    redis_proxy::{conn_pool_settings::ReadPolicy, prefix_routes::route::RequestMirrorPolicy},
    RedisProxy,
};
use respway_xds::pb::envoy::extensions::load_balancing_policies::{
    maglev::v3::Maglev, ring_hash::v3::RingHash,
};
use respway_xds::pb::google::protobuf::{value::Kind, Any, Struct, UInt64Value, Value};
use respway_xds::pb::respway::v1::{shard_hashing, ShardHashing};
use respway_xds::{parse_yaml, translate, Resources};

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
        s.read_policy = ReadPolicy::PreferReplica as i32;
        s.enable_redirection = true;
        let routes = p.prefix_routes.as_mut().unwrap();
        routes.routes[0].request_mirror_policy = vec![RequestMirrorPolicy {
            cluster: "main".into(),
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
listener "main": filter_chains[0].filters[2].typed_config.settings.read_policy: PREFER_REPLICA is not supported yet (only MASTER)
listener "main": filter_chains[0].filters[2].typed_config.custom_commands: not supported by respway
listener "main": filter_chains[0].filters[2].typed_config.prefix_routes.routes[0].request_mirror_policy: not supported yet
listener "main": filter_chains[0].filters[2].typed_config.prefix_routes.routes[0].key_formatter: not supported by respway
listener "main": filter_chains[0].filters[2].typed_config.prefix_routes.catch_all_route.read_command_policy: not supported by respway
cluster "main": health_checks: not supported by respway
cluster "main": outlier_detection: not supported by respway"#
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
cluster_load_assignment "main": endpoints[1].lb_endpoints[1].metadata.filter_metadata.respway.weight: unknown field (expected one of: shard, shard_index, role, slots)"#
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
    let mut second = r.listeners[0].clone();
    second.name = "other".into();
    second.address = Some(addr("127.0.0.1", 6381));
    r.listeners.push(second);
    edit_redis(&mut r, |p| {
        p.settings.as_mut().unwrap().enable_hashtagging = false
    });
    assert_eq!(
        errors(&r),
        r#"cluster "main": typed_extension_protocol_options: listeners "other" enable hashtagging and "main" do not; set respway.v1.ClusterOptions.hashtag"#
    );
}

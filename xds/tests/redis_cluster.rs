//! A cluster's `redis_cluster` end to end: YAML → Envoy's `cluster_type: envoy.clusters.redis`
//! with `RedisClusterConfig` and inline seeds → the model, back again, and the errors.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, LbPolicy};
use respway_filters::model::{HashPolicy, HashTag, RedisClusterSource, NO_ENDPOINT};
use respway_xds::{parse_yaml, to_resources, translate};

const TEXT: &str = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    redis_cluster:
      seeds: ["127.0.0.1:7000", "127.0.0.1:7001"]
      cluster_refresh_rate: 2s
      cluster_refresh_timeout: 500ms
      redirect_refresh_interval: 1s
      redirect_refresh_threshold: 3
      failure_refresh_threshold: 2
      host_degraded_refresh_threshold: 1
  - name: b
    redis_cluster: { seeds: ["127.0.0.1:7100"] }
"#;

#[test]
fn redis_clusters_read_as_envoys_redis_cluster_type() {
    let resources = parse_yaml(TEXT).expect("parse");
    let a = &resources.clusters[0];
    match &a.cluster_discovery_type {
        Some(ClusterDiscoveryType::ClusterType(ct)) => {
            assert_eq!(ct.name, "envoy.clusters.redis");
            assert!(ct.typed_config.as_ref().is_some_and(|t| t
                .type_url
                .ends_with("envoy.extensions.clusters.redis.v3.RedisClusterConfig")));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.lb_policy, LbPolicy::ClusterProvided as i32);
    assert!(a.load_assignment.is_some(), "the seeds are inline");
    assert!(
        resources.endpoints.is_empty(),
        "no ClusterLoadAssignment for a Redis Cluster"
    );
    let config = translate(&resources).expect("translate");
    let a = &config.clusters[0];
    assert_eq!(
        a.redis_cluster,
        Some(RedisClusterSource {
            seeds: vec![
                "127.0.0.1:7000".parse().unwrap(),
                "127.0.0.1:7001".parse().unwrap()
            ],
            cluster_refresh_rate: Duration::from_secs(2),
            cluster_refresh_timeout: Duration::from_millis(500),
            redirect_refresh_interval: Duration::from_secs(1),
            redirect_refresh_threshold: 3,
            failure_refresh_threshold: 2,
            host_degraded_refresh_threshold: 1,
        })
    );
    assert_eq!(a.hash, HashPolicy::Crc16Slots);
    assert_eq!(a.hashtag, Some(HashTag::default()));
    assert_eq!(a.databases, 1, "database 0 only");
    assert_eq!(
        a.shards.len(),
        1,
        "one placeholder until the topology is known"
    );
    assert_eq!(a.shards[0].endpoints[0].address, NO_ENDPOINT);
    assert_eq!(a.shards[0].slots, vec![(0, 16383)]);
    // Envoy's defaults.
    let b = config.clusters[1].redis_cluster.clone().expect("b");
    assert_eq!(
        b,
        RedisClusterSource {
            seeds: vec!["127.0.0.1:7100".parse().unwrap()],
            ..RedisClusterSource::default()
        }
    );
    assert_eq!(b.cluster_refresh_rate, Duration::from_secs(5));
    assert_eq!(b.redirect_refresh_threshold, 5);
    // The model goes to Envoy resources and back unchanged.
    assert_eq!(translate(&to_resources(&config)).expect("again"), config);
}

#[test]
fn redis_cluster_errors_name_the_field() {
    let text = r#"
listeners:
  - name: l
    routes: { catch_all: a }
clusters:
  - name: a
    redis_cluster: { seeds: [] }
  - name: b
    hash: { policy: maglev }
    db: 2
    databases: 4
    redis_cluster: { seeds: ["127.0.0.1:7000", "127.0.0.1:7000", nowhere], cluster_refresh_rate: 0s, refresh: 1s }
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: c
    redis_cluster: true
"#;
    let e = parse_yaml(text).expect_err("errors").to_string();
    for want in [
        r#"cluster "a": redis_cluster.seeds: must not be empty"#,
        r#"cluster "b": redis_cluster.refresh: unknown field"#,
        r#"cluster "b": redis_cluster.seeds[1]: 127.0.0.1:7000 is listed twice"#,
        r#"cluster "b": redis_cluster.seeds[2]: "#,
        r#"cluster "b": redis_cluster.cluster_refresh_rate: must be greater than 0"#,
        r#"cluster "b": shards: a redis_cluster's shards are discovered from its seeds: give no shards"#,
        r#"cluster "b": hash: a redis_cluster places keys by Redis Cluster's slots (crc16_slots)"#,
        r#"cluster "b": db: a redis_cluster has database 0 only"#,
        r#"cluster "b": databases: a redis_cluster has database 0 only (databases: 1)"#,
        r#"cluster "c": redis_cluster: expected a mapping, got a boolean"#,
    ] {
        assert!(e.contains(want), "missing {want:?} in:\n{e}");
    }
}

//! The dump's tests: every key read back through the file path and the xDS path.

use std::time::Duration;

use respway_filters::acl::{digest_to_hex, sha256};
use respway_filters::model::{EndpointAuth, UpstreamAuth};

use super::*;

/// Every key of the schema but `node.id` (not in the model) and the password files and
/// variables (the model keeps the password read: `auth.password` stands for them).
const EVERY_KEY: &str = r#"
node: { zone: z1 }
listeners:
  - name: edge
    address: 127.0.0.1:7000
    op_timeout: 250ms
    max_pending_per_client: 2048
    client_buffer_limit: 33554432
    client_buffer_hard_limit: 134217728
    client_stall_timeout: 90s
    max_auth_failures: 5
    allow_keyless_scripts: true
    allow_restricted_scripts: true
    admin_commands: true
    keys_max: 5000
    pubsub_buffer_limit: 1048576
    slowlog_threshold: 0us
    slowlog_max_len: 64
    hot_key_sample: 0
    protocol: resp2
    advertised_redis_version: "7.2"
    cluster_emulation: { announce: ["10.0.0.5:7000", "[fd00::6]:7000"] }
    downstream_auth_password: client-secret
    limits: { max_bulk_len: 16777216, max_multibulk_len: 65536, max_inline_len: 16384 }
    tls: { cert: /etc/respway/cert.pem, key: /etc/respway/key.pem, client_ca: /etc/respway/ca.pem, require_client_cert: true }
    routes:
      case_insensitive: true
      catch_all: main
      catch_all_mirrors:
        - { cluster: v2, mode: dual_write, fraction: 12.5 }
      prefixes:
        - prefix: "up:"
          cluster: profile
          remove_prefix: true
          mirrors:
            - { cluster: v2, mode: dual_write, primary: mirror, include_reads: true, fraction: 0.0001 }
        - prefix: "sess:"
          cluster: sessions
          mirrors:
            - { cluster: v2, mode: read_only, fraction: 33.3333 }
            - { cluster: main, mode: forward, include_reads: true }
  - name: acl
    address: "[::1]:7001"
    slowlog_threshold: 1500us
    hot_key_sample: 7
    cluster_emulation: true
    users:
      - { name: default, nopass: true, rules: "~public:* +@read" }
      - { name: app, password: [app-secret-1, app-secret-2], rules: ["~app:*", "+@all", "-flushall"] }
      - { name: ro, enabled: false, password_sha256: "abababababababababababababababababababababababababababababababab", read_only: true }
    routes:
      prefixes:
        - { prefix: "", cluster: ring }
clusters:
  - name: main
    hash: { policy: maglev, table_size: 251 }
    connections_per_endpoint: 2
    max_queue_per_connection: 8192
    dedicated_connections: 8
    connect_timeout: 2h
    auth: { username: respway, password: upstream-secret }
    db: 2
    databases: 4
    read_policy: zone_local
    zone_fallback: any_replica
    hot_keys:
      - { prefix: HIGH_FREQ_, read: same_zone }
      - { prefix: "cfg:" }
    health_check: { interval: 2s, timeout: 250ms, unhealthy_threshold: 4, healthy_threshold: 1, drain_key: maint }
    near_cache: { mode: bcast, prefixes: ["user:", HIGH_FREQ_], admit: hot, max_bytes: 1536kb, max_entry_bytes: 1000, max_age: 2m, hot_reads_per_sec: 50 }
    shards:
      - name: s0
        endpoints:
          - { address: 127.0.0.1:7101, role: replica, zone: z2, auth: { username: r, password: endpoint-secret } }
          - { address: 127.0.0.1:7001, role: primary, zone: z1, auth: { password: endpoint-secret } }
      - name: s1
        weight: 2
        endpoints:
          - { address: 127.0.0.1:7002, role: primary }
  - name: profile
    hash: { policy: ketama, key_hash: md5 }
    hashtag: null
    read_policy: prefer_replica
    shards:
      - name: redis-a
        endpoints: [{ address: 127.0.0.1:7201 }]
      - name: redis-b
        hash_key: legacy-b
        endpoints: [{ address: 127.0.0.1:7202 }]
      - name: shard-2
        endpoints: [{ address: 127.0.0.1:7203 }]
      - endpoints: [{ address: 127.0.0.1:11211 }]
  - name: sessions
    hash: { policy: crc16_slots }
    hashtag: "::"
    shards:
      - slots: ["0-8191"]
        endpoints: [{ address: 127.0.0.1:7301 }]
      - slots: ["8192-16382", 16383]
        endpoints: [{ address: 127.0.0.1:7302 }]
  - name: ring
    hash: { policy: ring_hash, minimum_ring_size: 64, maximum_ring_size: 4096, function: murmur_hash_2 }
    tls: { insecure_skip_verify: true }
    shards:
      - endpoints: [{ address: 127.0.0.1:7401 }]
      - hash_key: ring-b
        endpoints: [{ address: 127.0.0.1:7402 }]
  - name: v2
    hash: { policy: modula, key_hash: fnv1_32 }
    read_policy: any
    hot_keys:
      - { prefix: HIGH_FREQ_, read: random }
    near_cache: {}
    shards:
      - name: m0
        weight: 3
        endpoints:
          - { address: 127.0.0.1:7501, role: primary, zone: z1 }
          - { address: 127.0.0.1:7502, role: replica, zone: z2 }
  - name: legacy
    hash: { policy: crc32_slots, slots: 128 }
    tls: { ca: /etc/respway/ca.pem, cert: /etc/respway/client.pem, key: /etc/respway/client.key, server_name: redis.test }
    shards:
      - endpoints: [{ address: 127.0.0.1:7601 }]
      - endpoints: [{ address: 127.0.0.1:7602 }]
"#;

/// The secrets of [`EVERY_KEY`] in the order a dump shows them.
fn every_key_secrets() -> Vec<String> {
    let hex = |p: &str| digest_to_hex(&sha256(p.as_bytes()));
    vec![
        "client-secret".into(),
        hex("app-secret-1"),
        hex("app-secret-2"),
        "ab".repeat(32),
        "upstream-secret".into(),
        "endpoint-secret".into(),
        "endpoint-secret".into(),
    ]
}

/// `text` with each `<redacted>` replaced by the next of `secrets`; all of them used.
fn restore(text: &str, secrets: &[String]) -> String {
    assert_eq!(text.matches(REDACTED).count(), secrets.len(), "{text}");
    secrets
        .iter()
        .fold(text.to_string(), |t, s| t.replacen(REDACTED, s, 1))
}

/// The model of a file.
fn load(text: &str) -> Config {
    let (_, config) = crate::yaml::load(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    config
}

/// A configuration using every key, dumped with and without the defaults, reads back
/// (secrets put back) to the very model; no secret is in the dump.
#[test]
fn a_dump_of_every_key_loads_to_the_same_model() {
    let model = load(EVERY_KEY);
    for all in [false, true] {
        let dump = config_dump(&model, all);
        assert!(dump.notes().is_empty(), "{:?}", dump.notes());
        let text = dump.to_yaml(7);
        assert!(text.starts_with("# version: 7\n"), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(!text.contains(&every_key_secrets()[1]), "a digest: {text}");
        let back = load(&restore(&text, &every_key_secrets()));
        assert_eq!(back, model, "include_defaults: {all}\n{text}");
    }
}

/// The README's full example (xds/examples/full.yaml) reads back to its model.
#[test]
fn a_dump_of_the_full_example_loads_to_the_same_model() {
    let model = load(include_str!("../../../examples/full.yaml"));
    let secrets = ["client-secret".to_string(), "upstream-secret".to_string()];
    for all in [false, true] {
        let text = config_dump(&model, all).to_yaml(1);
        assert_eq!(load(&restore(&text, &secrets)), model, "{text}");
    }
}

/// The dump speaks the file's language: durations with units, policies, modes and
/// hashtags by their YAML names, fractions as percentages, endpoint credentials under
/// their endpoint, password digests redacted.
#[test]
fn a_dump_uses_the_files_keys_and_units() {
    let text = config_dump(&load(EVERY_KEY), false).to_yaml(1);
    for want in [
        "op_timeout: 250ms\n",
        "client_stall_timeout: 90s\n",
        "connect_timeout: 2h\n",
        "slowlog_threshold: 0us\n",
        "slowlog_threshold: 1500us\n",
        "protocol: resp2\n",
        "advertised_redis_version: '7.2'\n",
        "cluster_emulation:\n    announce:\n    - 10.0.0.5:7000\n    - '[fd00::6]:7000'\n",
        "cluster_emulation: true\n",
        "policy: crc16_slots\n",
        "function: murmur_hash_2\n",
        "key_hash: md5\n",
        "hashtag: '::'\n",
        "hashtag: null\n",
        "fraction: 12.5\n",
        "fraction: 0.0001\n",
        "fraction: 33.3333\n",
        "primary: mirror\n",
        "mode: read_only\n",
        "read_policy: zone_local\n",
        "zone_fallback: any_replica\n",
        "read: same_zone\n",
        "- 8192-16382\n",
        "downstream_auth_password: <redacted>\n",
        "password_sha256: <redacted>\n",
        "  - <redacted>\n",
        "hash_key: legacy-b\n",
        "hash_key: ring-b\n",
        "address: '[::1]:7001'\n",
        "  health_check:\n    interval: 2s\n    timeout: 250ms\n    unhealthy_threshold: 4\n    healthy_threshold: 1\n    drain_key: maint\n",
        "  near_cache:\n    mode: bcast\n    prefixes:\n    - 'user:'\n    - HIGH_FREQ_\n    admit: hot\n    max_bytes: 1536kb\n    max_entry_bytes: 1000\n    max_age: 2m\n    hot_reads_per_sec: 50\n",
        "  near_cache: {}\n",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    // The model's own spellings are gone.
    for model_word in [
        "secs",
        "nanos",
        "Crc16Slots",
        "open",
        "fraction_ppm",
        "ZoneLocal",
    ] {
        assert!(!text.contains(model_word), "{model_word}:\n{text}");
    }
    // A replica listed first keeps its own credentials, under its own address.
    let tree = config_dump(&load(EVERY_KEY), false);
    let s0 = &tree.tree()["clusters"][0]["shards"][0]["endpoints"];
    assert_eq!(s0[0]["address"].as_str(), Some("127.0.0.1:7001"));
    assert_eq!(s0[0]["auth"]["username"], Value::Null);
    assert_eq!(s0[1]["auth"]["username"].as_str(), Some("r"));
}

/// Without defaults, the built-in configuration is the README's smallest file; with them,
/// every setting shows its value and it still reads back.
#[test]
fn defaults_are_left_out_unless_asked_for() {
    let model = crate::default_config();
    assert_eq!(
        config_dump(&model, false).to_yaml(1),
        "# version: 1
listeners:
- name: default
  routes:
    catch_all: default
clusters:
- name: default
  shards:
  - endpoints:
    - address: 127.0.0.1:6379
"
    );
    let all = config_dump(&model, true).to_yaml(1);
    for want in [
        "address: 127.0.0.1:6380\n",
        "op_timeout: 1s\n",
        "client_buffer_limit: 67108864\n",
        "protocol: auto\n",
        "max_bulk_len: 536870912\n",
        "case_insensitive: false\n",
        "table_size: 65537\n",
        "hashtag: '{}'\n",
        "databases: 16\n",
        "read_policy: primary\n",
        "name: shard-0\n",
        "hash_key: 127.0.0.1:6379\n",
        "weight: 1\n",
        "role: primary\n",
    ] {
        assert!(all.contains(want), "{want:?} missing:\n{all}");
    }
    assert_eq!(load(&all), model);
}

/// What only xDS can say and a file cannot: a duration finer than a microsecond is shown
/// rounded up (never to zero) and noted; credentials for an address that is no endpoint
/// are noted, not dropped silently. The notes lead the YAML as comments and are in the
/// JSON.
#[test]
fn what_a_file_cannot_say_is_noted() {
    let mut model = load(EVERY_KEY);
    model.listeners[0].op_timeout = Duration::new(1, 500);
    model.clusters[0].endpoint_auth.push(EndpointAuth {
        address: "10.9.9.9:6379".parse().unwrap(),
        auth: UpstreamAuth {
            username: None,
            password: "ghost-secret".into(),
        },
    });
    let dump = config_dump(&model, false);
    let text = dump.to_yaml(3);
    assert!(text.contains("op_timeout: 1000001us\n"), "{text}");
    assert_eq!(dump.notes().len(), 2, "{:?}", dump.notes());
    assert!(
        text.starts_with(
            "# version: 3\n# listener \"edge\": op_timeout: 1000000500ns is shown as 1000001us"
        ),
        "{text}"
    );
    assert!(
        dump.notes()[1].contains("cluster \"main\"") && dump.notes()[1].contains("10.9.9.9:6379"),
        "{:?}",
        dump.notes()
    );
    assert!(!text.contains("ghost"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&dump.to_json(3)).unwrap();
    assert_eq!(json["version"], 3);
    assert_eq!(json["notes"][1].as_str(), Some(dump.notes()[1].as_str()));
    let yaml: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(json["config"], yaml);
}

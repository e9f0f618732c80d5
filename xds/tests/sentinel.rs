//! Sentinel-managed shards in the YAML schema and over xDS: what they read into, how they
//! round-trip, and the exact errors.

use respway_filters::model::{Role, SentinelSource, NO_ENDPOINT};
use respway_xds::{config_dump, parse_yaml, to_resources, translate};

const YAML: &str = r#"
listeners:
  - name: main
    address: 127.0.0.1:6380
    routes: { catch_all: cache }
clusters:
  - name: cache
    hash: { policy: ketama }
    auth: { password: data-secret }
    shards:
      - name: s0
        sentinel:
          master: m0
          sentinels: [127.0.0.1:26379, 127.0.0.1:26380, 127.0.0.1:26381]
          auth: { username: watcher, password: s-secret }
          zones: { "127.0.0.1:7101": z1, "127.0.0.1:7102": z2 }
      - name: s1
        weight: 2
        sentinel: { master: m1, sentinels: [127.0.0.1:26379, 127.0.0.1:26380, 127.0.0.1:26381], auth: { username: watcher, password: s-secret } }
      - name: s2
        endpoints: [ { address: 127.0.0.1:7000 } ]
"#;

fn errors(yaml: &str) -> String {
    match parse_yaml(yaml) {
        Err(e) => e.to_string(),
        Ok(r) => translate(&r).expect_err("should fail").to_string(),
    }
}

#[test]
fn a_sentinel_shard_reads_into_its_master_and_sentinels_and_round_trips() {
    let config = translate(&parse_yaml(YAML).expect("parses")).expect("translates");
    let c = &config.clusters[0];
    let sentinels: Vec<std::net::SocketAddr> =
        ["127.0.0.1:26379", "127.0.0.1:26380", "127.0.0.1:26381"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
    assert_eq!(
        c.shards[0].sentinel,
        Some(SentinelSource {
            master: "m0".into(),
            sentinels: sentinels.clone(),
            zones: vec![
                ("127.0.0.1:7101".parse().unwrap(), "z1".into()),
                ("127.0.0.1:7102".parse().unwrap(), "z2".into()),
            ],
            failover_hold: respway_filters::model::DEFAULT_FAILOVER_HOLD,
        })
    );
    assert_eq!(c.shards[1].sentinel.as_ref().unwrap().master, "m1");
    assert_eq!(c.shards[1].weight, 2);
    // No primary known until the sidecar asks: the placeholder, and keys hashed by the name,
    // never by an address that changes with each failover.
    assert_eq!(c.shards[0].endpoints.len(), 1);
    assert_eq!(c.shards[0].endpoints[0].address, NO_ENDPOINT);
    assert_eq!(c.shards[0].endpoints[0].role, Role::Primary);
    assert_eq!(c.shards[0].hash_key, "s0");
    assert_eq!(c.shards[2].sentinel, None);
    // The Sentinels' credentials are theirs, once per address; the cluster's stay the data
    // nodes'.
    assert_eq!(c.auth.as_ref().unwrap().password, "data-secret");
    assert_eq!(c.endpoint_auth.len(), 3);
    assert!(c
        .endpoint_auth
        .iter()
        .all(|e| e.auth.username.as_deref() == Some("watcher") && e.auth.password == "s-secret"));

    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
    let dumped = config_dump(&config, true).to_yaml(1);
    assert!(dumped.contains("sentinel:"), "{dumped}");
    assert!(!dumped.contains("0.0.0.0:0"), "{dumped}");
    assert!(dumped.contains("127.0.0.1:7101: z1"), "{dumped}");
    let reread = translate(&parse_yaml(&dumped.replace("<redacted>", "s-secret")).unwrap());
    assert_eq!(reread.unwrap().clusters[0].shards, c.shards);
}

#[test]
fn sentinel_shard_errors_name_the_field() {
    let bad = YAML.replace(
        "sentinels: [127.0.0.1:26379, 127.0.0.1:26380, 127.0.0.1:26381]\n",
        "sentinels: []\n",
    );
    assert!(
        errors(&bad).contains("shards[0].sentinel.sentinels"),
        "{}",
        errors(&bad)
    );
    let both = YAML.replace(
        "        sentinel:\n          master: m0",
        "        endpoints: [ { address: 127.0.0.1:7001 } ]\n        sentinel:\n          master: m0",
    );
    let e = errors(&both);
    assert!(
        e.contains("shards[0].endpoints: a shard has either endpoints or sentinel, not both"),
        "{e}"
    );
    let no_master = YAML.replace("          master: m0\n", "");
    let e = errors(&no_master);
    assert!(e.contains("shards[0].sentinel.master: required"), "{e}");
    let twice = YAML.replace(
        "[127.0.0.1:26379, 127.0.0.1:26380, 127.0.0.1:26381]\n          auth",
        "[127.0.0.1:26379, 127.0.0.1:26379]\n          auth",
    );
    let e = errors(&twice);
    assert!(
        e.contains("shards[0].sentinel.sentinels[1]: 127.0.0.1:26379 is listed twice"),
        "{e}"
    );
}

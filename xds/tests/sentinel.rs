//! Sentinel-managed shards in the YAML schema and over xDS: what they read into, how they
//! round-trip, and the exact errors.

use envoy_types::pb::google::protobuf::value::Kind;
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
            serve_stale_reads: true,
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

/// The first shard's Sentinel source as the model has it, read from `YAML` with `line` added
/// to its `sentinel` block, through YAML → xDS → model; the dump (with and without `--all`)
/// reads back to the same.
fn sentinel_of(line: &str) -> SentinelSource {
    let yaml = YAML.replace(
        "          master: m0\n",
        &format!("          master: m0\n{line}"),
    );
    let config = translate(&parse_yaml(&yaml).expect("parses")).expect("translates");
    // Over xDS: the resources the management server serves translate into the same model.
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);
    for all in [false, true] {
        let dumped = config_dump(&config, all).to_yaml(1);
        let reread = translate(&parse_yaml(&dumped.replace("<redacted>", "s-secret")).unwrap());
        assert_eq!(
            reread.unwrap().clusters[0].shards,
            config.clusters[0].shards,
            "{dumped}"
        );
    }
    config.clusters[0].shards[0].sentinel.clone().unwrap()
}

fn hold_of(line: &str) -> std::time::Duration {
    sentinel_of(line).failover_hold
}

fn stale_of(line: &str) -> bool {
    sentinel_of(line).serve_stale_reads
}

/// `r` with endpoint `k` of the (only) locality saying `value` for metadata `key`, and that
/// field's path.
fn with_meta(
    r: &respway_xds::Resources,
    k: usize,
    key: &str,
    value: Kind,
) -> (respway_xds::Resources, String) {
    let mut r = r.clone();
    let e = &mut r.endpoints[0].endpoints[0].lb_endpoints[k];
    let md = &mut e.metadata.as_mut().unwrap().filter_metadata;
    let fields = &mut md.get_mut("respway").unwrap().fields;
    let value = envoy_types::pb::google::protobuf::Value { kind: Some(value) };
    fields.insert(key.into(), value);
    let at = format!("endpoints[0].lb_endpoints[{k}].metadata.filter_metadata.respway.{key}");
    (r, at)
}

/// The translation error of resources made by [`with_meta`], and the field's path.
fn err((r, at): (respway_xds::Resources, String)) -> (String, String) {
    (translate(&r).expect_err("should fail").to_string(), at)
}

/// The `key` metadata of the first shard's Sentinels, in order.
fn sentinel_meta(r: &respway_xds::Resources, key: &str) -> Vec<Option<Kind>> {
    let eps = &r.endpoints[0].endpoints[0].lb_endpoints;
    eps.iter()
        .map(|e| &e.metadata.as_ref().unwrap().filter_metadata["respway"])
        .filter(|md| md.fields["shard"].kind == Some(Kind::StringValue("s0".into())))
        .map(|md| md.fields.get(key).and_then(|v| v.kind.clone()))
        .collect()
}

/// The `sentinel_failover_hold` metadata of the first shard's Sentinels, in order.
fn sentinel_holds(r: &respway_xds::Resources) -> Vec<Option<String>> {
    let text = |k: Kind| match k {
        Kind::StringValue(s) => s,
        other => panic!("{other:?}"),
    };
    sentinel_meta(r, "sentinel_failover_hold")
        .into_iter()
        .map(|k| k.map(text))
        .collect()
}

/// The `sentinel_serve_stale_reads` metadata of the first shard's Sentinels, in order.
fn sentinel_stales(r: &respway_xds::Resources) -> Vec<Option<bool>> {
    let flag = |k: Kind| match k {
        Kind::BoolValue(b) => b,
        other => panic!("{other:?}"),
    };
    sentinel_meta(r, "sentinel_serve_stale_reads")
        .into_iter()
        .map(|k| k.map(flag))
        .collect()
}

#[test]
fn a_sentinel_shards_failover_hold_is_read_emitted_and_dumped() {
    use respway_filters::model::DEFAULT_FAILOVER_HOLD;
    use std::time::Duration;
    assert_eq!(hold_of(""), DEFAULT_FAILOVER_HOLD);
    assert_eq!(
        hold_of("          failover_hold: 250ms\n"),
        Duration::from_millis(250)
    );
    assert_eq!(hold_of("          failover_hold: 0s\n"), Duration::ZERO);
    assert_eq!(
        hold_of("          failover_hold: 10s\n"),
        Duration::from_secs(10)
    );
    assert_eq!(
        hold_of("          failover_hold: 5s\n"),
        DEFAULT_FAILOVER_HOLD
    );

    // Only a hold other than the default travels, on the first Sentinel, as a duration.
    let with = |line: &str| {
        let yaml = YAML.replace(
            "          master: m0\n",
            &format!("          master: m0\n{line}"),
        );
        let read = parse_yaml(&yaml).unwrap();
        let config = translate(&read).unwrap();
        // Both writers: the YAML reader's and the management server's (from the model).
        let holds = sentinel_holds(&read);
        assert_eq!(sentinel_holds(&to_resources(&config)), holds);
        (holds, config_dump(&config, false).to_yaml(1))
    };
    let (holds, dumped) = with("          failover_hold: 250ms\n");
    assert_eq!(holds[0].as_deref(), Some("250ms"));
    assert!(dumped.contains("failover_hold: 250ms"), "{dumped}");
    let (holds, dumped) = with("          failover_hold: 0s\n");
    assert_eq!(holds[0].as_deref(), Some("0us"));
    assert!(dumped.contains("failover_hold: 0us"), "{dumped}");
    let (holds, dumped) = with("");
    assert!(holds.iter().all(Option::is_none), "{holds:?}");
    assert!(!dumped.contains("failover_hold"), "{dumped}");
    let all = config_dump(&translate(&parse_yaml(YAML).unwrap()).unwrap(), true).to_yaml(1);
    assert!(all.contains("failover_hold: 5s"), "{all}");
}

#[test]
fn a_failover_hold_over_10s_or_not_a_duration_is_refused_by_name() {
    let with = |line: &str| {
        errors(&YAML.replace(
            "          master: m0\n",
            &format!("          master: m0\n{line}"),
        ))
    };
    let e = with("          failover_hold: 11s\n");
    assert!(
        e.contains(
            "shards[0].sentinel.failover_hold: 11s is more than 10s, the longest a failover may hold writes"
        ),
        "{e}"
    );
    assert_eq!(e.matches("failover_hold").count(), 1, "one error: {e}");
    let e = with("          failover_hold: soon\n");
    assert!(
        e.contains("shards[0].sentinel.failover_hold: invalid duration \"soon\""),
        "{e}"
    );
    let e = with("          failover_hold: 250\n");
    assert!(e.contains("shards[0].sentinel.failover_hold"), "{e}");
}

#[test]
fn over_xds_a_failover_hold_is_a_sentinel_shards_and_the_same_on_each_sentinel() {
    let yaml = YAML.replace(
        "          master: m0\n",
        "          master: m0\n          failover_hold: 250ms\n",
    );
    let resources = to_resources(&translate(&parse_yaml(&yaml).unwrap()).unwrap());
    let with = |k: usize, v: Kind| with_meta(&resources, k, "sentinel_failover_hold", v);
    // Another Sentinel may repeat the first's hold, not contradict it.
    assert!(translate(&with(1, Kind::StringValue("250ms".into())).0).is_ok());
    let (e, _) = err(with(1, Kind::StringValue("1s".into())));
    assert!(
        e.contains(
            "sentinel_failover_hold and sentinel_serve_stale_reads differ from the shard's first Sentinel's"
        ),
        "{e}"
    );
    let (e, at) = err(with(0, Kind::StringValue("11s".into())));
    assert!(e.contains(&format!("{at}: 11s is more than 10s")), "{e}");
    let (e, at) = err(with(0, Kind::NumberValue(250.0)));
    assert!(
        e.contains(&format!("{at}: expected a duration such as \"250ms\"")),
        "{e}"
    );
    // s2's primary, the locality's last endpoint, is no Sentinel.
    let last = resources.endpoints[0].endpoints[0].lb_endpoints.len() - 1;
    let (e, at) = err(with(last, Kind::StringValue("1s".into())));
    assert!(
        e.contains(&format!("{at}: only endpoints with role sentinel")),
        "{e}"
    );
}

#[test]
fn a_sentinel_shards_serve_stale_reads_is_read_emitted_and_dumped() {
    assert!(stale_of(""));
    assert!(!stale_of("          serve_stale_reads: false\n"));
    assert!(stale_of("          serve_stale_reads: true\n"));
    // The other shards keep the default.
    let yaml = YAML.replace(
        "          master: m0\n",
        "          master: m0\n          serve_stale_reads: false\n",
    );
    let config = translate(&parse_yaml(&yaml).unwrap()).unwrap();
    assert!(
        config.clusters[0].shards[1]
            .sentinel
            .as_ref()
            .unwrap()
            .serve_stale_reads
    );

    // Only `false` travels, on the first Sentinel, as a bool.
    let with = |line: &str| {
        let yaml = YAML.replace(
            "          master: m0\n",
            &format!("          master: m0\n{line}"),
        );
        let read = parse_yaml(&yaml).unwrap();
        let config = translate(&read).unwrap();
        // Both writers: the YAML reader's and the management server's (from the model).
        let stales = sentinel_stales(&read);
        assert_eq!(sentinel_stales(&to_resources(&config)), stales);
        (stales, config_dump(&config, false).to_yaml(1))
    };
    let (stales, dumped) = with("          serve_stale_reads: false\n");
    assert_eq!(stales, [Some(false), None, None]);
    assert!(dumped.contains("serve_stale_reads: false"), "{dumped}");
    for line in ["          serve_stale_reads: true\n", ""] {
        let (stales, dumped) = with(line);
        assert!(stales.iter().all(Option::is_none), "{stales:?}");
        assert!(!dumped.contains("serve_stale_reads"), "{dumped}");
    }
    let all = config_dump(&translate(&parse_yaml(YAML).unwrap()).unwrap(), true).to_yaml(1);
    assert!(all.contains("serve_stale_reads: true"), "{all}");
}

#[test]
fn a_serve_stale_reads_not_a_bool_is_refused_by_name() {
    for value in ["\"no\"", "0", "[false]"] {
        let e = errors(&YAML.replace(
            "          master: m0\n",
            &format!("          master: m0\n          serve_stale_reads: {value}\n"),
        ));
        assert!(
            e.contains("shards[0].sentinel.serve_stale_reads: expected true or false, got "),
            "{e}"
        );
        assert_eq!(e.matches("serve_stale_reads").count(), 1, "one error: {e}");
    }
}

#[test]
fn over_xds_serve_stale_reads_is_a_sentinel_shards_and_the_same_on_each_sentinel() {
    let yaml = YAML.replace(
        "          master: m0\n",
        "          master: m0\n          serve_stale_reads: false\n",
    );
    let resources = to_resources(&translate(&parse_yaml(&yaml).unwrap()).unwrap());
    let with = |k: usize, v: Kind| with_meta(&resources, k, "sentinel_serve_stale_reads", v);
    // Another Sentinel may repeat the first's value, not contradict it.
    assert!(translate(&with(1, Kind::BoolValue(false)).0).is_ok());
    let (e, _) = err(with(1, Kind::BoolValue(true)));
    assert!(
        e.contains("endpoints[0].lb_endpoints[1]: shard_index, weight"),
        "{e}"
    );
    assert!(
        e.contains(
            "sentinel_failover_hold and sentinel_serve_stale_reads differ from the shard's first Sentinel's"
        ),
        "{e}"
    );
    let (e, at) = err(with(0, Kind::StringValue("false".into())));
    assert!(e.contains(&format!("{at}: expected true or false")), "{e}");
    let (e, at) = err(with(0, Kind::NumberValue(0.0)));
    assert!(e.contains(&format!("{at}: expected true or false")), "{e}");
    // s2's primary, the locality's last endpoint, is no Sentinel.
    let last = resources.endpoints[0].endpoints[0].lb_endpoints.len() - 1;
    let (e, at) = err(with(last, Kind::BoolValue(false)));
    assert!(
        e.contains(&format!("{at}: only endpoints with role sentinel")),
        "{e}"
    );

    // Without the YAML's `false`, a later Sentinel's `false` contradicts the first's default.
    let plain = to_resources(&translate(&parse_yaml(YAML).unwrap()).unwrap());
    let (e, _) = err(with_meta(
        &plain,
        2,
        "sentinel_serve_stale_reads",
        Kind::BoolValue(false),
    ));
    assert!(
        e.contains("endpoints[0].lb_endpoints[2]: shard_index, weight"),
        "{e}"
    );
}

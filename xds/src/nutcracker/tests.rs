use std::time::Duration;

use respway_filters::model::{Config, HashPolicy, HashTag, KeyHash};

use super::*;

/// Converts `text` and loads the result as `--config` would (parse, then translate).
fn load(text: &str) -> (String, Config) {
    let yaml = convert(text).unwrap_or_else(|e| panic!("{e}"));
    let resources = crate::parse_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let config = crate::translate(&resources).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    (yaml, config)
}

/// The errors of converting `text`, one display line each.
fn errors(text: &str) -> Vec<String> {
    match convert(text) {
        Ok(y) => panic!("converted:\n{y}"),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

const TWO_POOLS: &str = "\
alpha:
  listen: 127.0.0.1:22121
  hash: fnv1a_64
  distribution: ketama
  hash_tag: \"{}\"
  timeout: 400
  redis: true
  redis_auth: s3cret
  server_connections: 2
  auto_eject_hosts: false
  servers:
   - 127.0.0.1:7001:1 s10
   - 127.0.0.1:7002:3 s2
   - 127.0.0.1:7003:2
beta:
  listen: 127.0.0.1:22122
  hash: murmur
  distribution: modula
  redis: true
  redis_db: 3
  preconnect: true
  backlog: 1024
  server_retry_timeout: 2000
  server_failure_limit: 1
  servers:
   - 10.0.0.1:11211:1
   - 10.0.0.2:6379:2
";

#[test]
fn each_pool_is_a_listener_and_a_cluster_with_nutcrackers_names() {
    let (yaml, c) = load(TWO_POOLS);
    let names: Vec<&str> = c.listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    let alpha = &c.listeners[0];
    assert_eq!(alpha.address, "127.0.0.1:22121".parse().unwrap());
    assert_eq!(alpha.op_timeout, Duration::from_millis(400));
    assert_eq!(alpha.routes.catch_all.as_deref(), Some("alpha"));
    // nutcracker makes clients AUTH with redis_auth, and sends it to the servers.
    assert_eq!(alpha.downstream_password.as_deref(), Some("s3cret"));
    let a = &c.clusters[0];
    assert_eq!(
        a.hash,
        HashPolicy::Ketama {
            key_hash: KeyHash::Fnv1a64
        }
    );
    assert_eq!(a.hashtag, Some(HashTag::default()));
    assert_eq!(a.connections_per_endpoint, 2);
    assert_eq!(a.auth.as_ref().unwrap().password, "s3cret");
    let shards: Vec<(&str, &str, u32)> = a
        .shards
        .iter()
        .map(|s| (s.name.as_str(), s.hash_key.as_str(), s.weight))
        .collect();
    assert_eq!(
        shards,
        [
            ("s10", "s10", 1),
            ("s2", "s2", 3),
            // Unnamed: nutcracker's name is `host:port`.
            ("127.0.0.1:7003", "127.0.0.1:7003", 2)
        ]
    );

    let b = &c.clusters[1];
    assert_eq!(
        b.hash,
        HashPolicy::Modula {
            key_hash: KeyHash::Murmur
        }
    );
    // No hash_tag: nutcracker hashes whole keys (respway's own default would be "{}").
    assert_eq!(b.hashtag, None);
    assert_eq!(b.db, 3);
    assert!(b.auth.is_none());
    let keys: Vec<&str> = b.shards.iter().map(|s| s.hash_key.as_str()).collect();
    // On port 11211 an unnamed server is named by its host alone.
    assert_eq!(keys, ["10.0.0.1", "10.0.0.2:6379"]);
    assert_eq!(c.listeners[1].downstream_password, None);

    // What is ignored is said, with why.
    for note in [
        "# no timeout: nutcracker waits for a reply forever",
        "# backlog: 1024 is ignored",
        "# preconnect: true is ignored",
        "# server_retry_timeout: 2000 is ignored",
        "# server_failure_limit: 1 is ignored",
    ] {
        assert!(yaml.contains(note), "{note:?} missing from:\n{yaml}");
    }
}

#[test]
fn refused_settings_name_the_pool_and_the_key() {
    let text = "\
alpha:
  listen: 127.0.0.1:22121
  redis: true
  auto_eject_hosts: true
  distribution: random
  tcp_keepalive: true
  servers:
   - 127.0.0.1:7001:1
beta:
  listen: /tmp/beta.sock 0666
  servers:
   - 127.0.0.1:7002:1
gamma:
  listen: 127.0.0.1:22123
  redis: false
  hash: jenkins
  servers:
   - localhost:7003:1
   - /tmp/redis.sock:1
   - 127.0.0.1:7004:0
";
    let errs = errors(text);
    let expect = [
        "pool \"alpha\": tcp_keepalive: unknown nutcracker key",
        "pool \"alpha\": auto_eject_hosts: true is refused",
        "pool \"alpha\": distribution: random is refused",
        "pool \"beta\": redis: not set, which nutcracker reads as false, a memcached pool",
        "pool \"beta\": listen: \"/tmp/beta.sock 0666\" is a unix socket",
        "pool \"gamma\": redis: false is a memcached pool",
        "pool \"gamma\": hash: jenkins is a nutcracker hash respway does not have",
        "pool \"gamma\": servers[0]: \"localhost\" is not an IP address",
        "pool \"gamma\": servers[1]: \"/tmp/redis.sock:1\" is a unix socket server",
        "pool \"gamma\": servers[2]: \"127.0.0.1:7004:0\" has a zero weight",
    ];
    for e in expect {
        assert!(
            errs.iter().any(|l| l.starts_with(e)),
            "no error starting {e:?} in:\n{}",
            errs.join("\n")
        );
    }
    assert_eq!(errs.len(), expect.len(), "{}", errs.join("\n"));
    // A host name's error says how to keep its placement.
    assert!(
        errs.iter()
            .any(|l| l.contains("\"IP:7003:1 localhost:7003\"")),
        "{}",
        errs.join("\n")
    );
}

#[test]
fn servers_are_parsed_from_the_end_as_nutcracker_does() {
    let s = parse_server("127.0.0.1:6379:5 cache-a").unwrap();
    assert_eq!(
        s,
        Server {
            name: "cache-a".into(),
            address: "127.0.0.1:6379".parse().unwrap(),
            weight: 5
        }
    );
    assert_eq!(
        parse_server("[::1]:6379:1").unwrap().address,
        "[::1]:6379".parse().unwrap()
    );
    assert_eq!(parse_server("::1:6379:1").unwrap().name, "::1:6379");
    // A host name is refused, with the line that keeps the server's placement.
    let e = parse_server("cache.local:11211:2").unwrap_err();
    assert!(e.contains("\"IP:11211:2 cache.local\""), "{e}");
    let e = parse_server("cache.local:6379:2").unwrap_err();
    assert!(e.contains("\"IP:6379:2 cache.local:6379\""), "{e}");
    assert!(parse_server("127.0.0.1:6379").is_err());
    assert!(parse_server("127.0.0.1:6379:x").is_err());
    assert!(parse_server("127.0.0.1:0:1").is_err());
    assert!(parse_server("127.0.0.1:6379:1 ").is_err());
    // Two spaces: the weight would be "1 a" to nutcracker too.
    assert!(parse_server("127.0.0.1:6379:1 a b").is_err());
}

#[test]
fn duplicate_names_and_bad_values_are_errors() {
    let text = "\
alpha:
  listen: 127.0.0.1:22121
  redis: yes
  timeout: -5
  hash_tag: \"{\"
  server_connections: 0
  servers:
   - 127.0.0.1:7001:1 a
   - 127.0.0.1:7002:1 a
";
    let errs = errors(text);
    for e in [
        "pool \"alpha\": redis: \"yes\" is not \"true\" or \"false\"",
        "pool \"alpha\": timeout: \"-5\" is not a number",
        "pool \"alpha\": hash_tag: \"{\" is not two characters",
        "pool \"alpha\": server_connections: cannot be 0",
        "pool \"alpha\": servers[1]: server name \"a\" is also the name of servers[0]",
    ] {
        assert!(
            errs.iter().any(|l| l.starts_with(e)),
            "no error starting {e:?} in:\n{}",
            errs.join("\n")
        );
    }
}

#[test]
fn a_nutcracker_file_is_told_from_respways_own() {
    assert!(is_nutcracker(TWO_POOLS));
    // A pool with errors is still a nutcracker file, so that its errors are nutcracker's.
    assert!(is_nutcracker("a: { servers: [] }\nb: 3\n"));
    assert!(!is_nutcracker(
        "listeners: []\nclusters:\n  - { name: c, shards: [] }\n"
    ));
    assert!(!is_nutcracker("clusters: { x: { servers: [] } }\n"));
    assert!(!is_nutcracker("- a\n- b\n"));
    assert!(!is_nutcracker("not: [valid"));
    assert!(convert_if_nutcracker("listeners: []\n").is_none());
}

#[test]
fn names_and_passwords_are_quoted() {
    let text = "\
\"odd: pool\":
  listen: 127.0.0.1:22121
  redis: true
  redis_auth: \"pa\\\"ss: #x\"
  servers:
   - \"127.0.0.1:7001:1 #weird\"
";
    let (_, c) = load(text);
    assert_eq!(c.listeners[0].name, "odd: pool");
    assert_eq!(c.clusters[0].auth.as_ref().unwrap().password, "pa\"ss: #x");
    assert_eq!(c.clusters[0].shards[0].hash_key, "#weird");
}

#[test]
fn load_file_takes_a_nutcracker_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nutcracker.yml");
    std::fs::write(&path, TWO_POOLS).unwrap();
    let c = crate::load_file(&path).unwrap();
    assert_eq!(c.clusters.len(), 2);
    std::fs::write(
        &path,
        "alpha:\n  listen: 127.0.0.1:1\n  redis: true\n  auto_eject_hosts: true\n  servers: [\"127.0.0.1:2:1\"]\n",
    )
    .unwrap();
    let e = crate::load_file(&path).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}: pool \"alpha\": auto_eject_hosts: true is refused",
            path.display()
        )),
        "{e}"
    );
    assert_eq!(import_file(&path).unwrap_err().to_string(), e);
}

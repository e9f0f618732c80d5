//! ACL users and upstream credentials through the configuration: YAML → model → Envoy
//! resources (what xDS sends) → model, the Envoy fields respway accepts for them, and the
//! exact errors.

use prost::{Message, Name};
use respway_filters::acl::{digest_to_hex, sha256};
use respway_filters::model::{AclUser, Config, EndpointAuth, UpstreamAuth};
use respway_xds::pb::envoy::config::core::v3::{data_source, DataSource};
use respway_xds::pb::envoy::config::listener::v3::filter::ConfigType;
use respway_xds::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    RedisProtocolOptions, RedisProxy,
};
use respway_xds::pb::google::protobuf::Any;
use respway_xds::pb::respway::v1::{ListenerSettings, User};
use respway_xds::{parse_yaml, to_resources, translate, Resources};

const YAML: &str = r#"
listeners:
  - name: main
    downstream_auth_password: client-secret
    users:
      - { name: reader, password: [pw1, pw2], read_only: true }
      - name: app
        password_sha256: 8D969EEF6ECAD3C29A3A629280E686CF0C3F5D5A86AFF3CA12020C923ADC6C92
        rules: "~app:* +@all -@dangerous"
      - { name: off, nopass: true, enabled: false, rules: [nocommands] }
    routes: { catch_all: main }
clusters:
  - name: main
    auth: { username: svc, password: upstream-secret }
    shards:
      - endpoints:
          - { address: 10.0.0.1:6379, role: primary, auth: { password: ep-secret } }
          - { address: 10.0.0.2:6379, role: replica }
"#;

fn load(yaml: &str) -> Config {
    translate(&parse_yaml(yaml).unwrap_or_else(|e| panic!("{e}"))).unwrap_or_else(|e| panic!("{e}"))
}

fn errors(yaml: &str) -> String {
    match parse_yaml(yaml) {
        Err(e) => e.to_string(),
        Ok(r) => translate(&r).expect_err("should fail").to_string(),
    }
}

fn unpack<T: Message + Default>(any: &Any) -> T {
    T::decode(any.value.as_slice()).unwrap()
}

fn filter_any(r: &mut Resources, i: usize) -> &mut Any {
    match &mut r.listeners[0].filter_chains[0].filters[i].config_type {
        Some(ConfigType::TypedConfig(any)) => any,
        _ => panic!("typed_config"),
    }
}

fn pack<T: Message + Name>(m: &T) -> Any {
    Any {
        type_url: T::type_url(),
        value: m.encode_to_vec(),
    }
}

#[test]
fn users_and_credentials_read_hash_and_round_trip() {
    let c = load(YAML);
    let l = &c.listeners[0];
    assert_eq!(l.downstream_password.as_deref(), Some("client-secret"));
    assert_eq!(
        l.users,
        vec![
            AclUser {
                name: "reader".into(),
                enabled: true,
                passwords: vec![sha256(b"pw1"), sha256(b"pw2")],
                nopass: false,
                rules: vec!["allcommands".into(), "allkeys".into(), "allchannels".into()],
                read_only: true,
            },
            AclUser {
                name: "app".into(),
                enabled: true,
                passwords: vec![sha256(b"123456")],
                nopass: false,
                rules: vec!["~app:*".into(), "+@all".into(), "-@dangerous".into()],
                read_only: false,
            },
            AclUser {
                name: "off".into(),
                enabled: false,
                passwords: vec![],
                nopass: true,
                rules: vec!["nocommands".into()],
                read_only: false,
            },
        ]
    );
    let cl = &c.clusters[0];
    assert_eq!(
        cl.auth,
        Some(UpstreamAuth {
            username: Some("svc".into()),
            password: "upstream-secret".into()
        })
    );
    assert_eq!(
        cl.endpoint_auth,
        vec![EndpointAuth {
            address: "10.0.0.1:6379".parse().unwrap(),
            auth: UpstreamAuth {
                username: None,
                password: "ep-secret".into()
            }
        }]
    );
    let ep = |a: &str| cl.auth_for(a.parse().unwrap()).unwrap().password.as_str();
    assert_eq!(ep("10.0.0.1:6379"), "ep-secret");
    assert_eq!(ep("10.0.0.2:6379"), "upstream-secret");
    // Through Envoy resources and back: the same model.
    assert_eq!(translate(&to_resources(&c)).unwrap(), c);
}

#[test]
fn xds_carries_digests_and_never_a_users_plaintext_password() {
    let mut r = parse_yaml(YAML).unwrap();
    let settings: ListenerSettings = unpack(filter_any(&mut r, 0));
    assert_eq!(settings.users.len(), 3);
    assert_eq!(
        settings.users[0].password_sha256,
        [
            digest_to_hex(&sha256(b"pw1")),
            digest_to_hex(&sha256(b"pw2"))
        ]
    );
    let bytes = settings.encode_to_vec();
    for secret in [&b"pw1"[..], b"pw2"] {
        assert!(!bytes.windows(secret.len()).any(|w| w == secret));
    }
    // The config dump shows no password, digest or plaintext.
    let dump = respway_xds::config_dump(&load(YAML), true).to_yaml(1);
    for s in [
        "client-secret",
        "upstream-secret",
        "ep-secret",
        "pw1",
        "8d969eef",
    ] {
        assert!(!dump.contains(s), "{s} in {dump}");
    }
}

#[test]
fn users_sent_over_xds_translate() {
    let mut r = parse_yaml(
        "listeners: [{ name: main, routes: { catch_all: main } }]\nclusters: [{ name: main, shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }] }]\n",
    )
    .unwrap();
    let any = filter_any(&mut r, 0);
    let mut s: ListenerSettings = unpack(any);
    s.users = vec![
        User {
            name: "a".into(),
            enabled: None,
            password_sha256: vec![digest_to_hex(&sha256(b"x"))],
            rules: vec!["~k*".into(), "+get".into()],
            ..Default::default()
        },
        // Empty rules: every permission.
        User {
            name: "b".into(),
            nopass: true,
            ..Default::default()
        },
    ];
    *any = pack(&s);
    let c = translate(&r).unwrap();
    let u = &c.listeners[0].users;
    assert!(u[0].enabled && u[0].rules == ["~k*", "+get"]);
    assert_eq!(u[1].rules, ["allcommands", "allkeys", "allchannels"]);

    // Bad users are refused naming the ListenerSettings field.
    s.users = vec![
        User {
            name: "a b".into(),
            nopass: true,
            ..Default::default()
        },
        User {
            name: "c".into(),
            password_sha256: vec!["abc".into()],
            rules: vec!["+nosuch".into()],
            ..Default::default()
        },
        User {
            name: "c".into(),
            ..Default::default()
        },
    ];
    *filter_any(&mut r, 0) = pack(&s);
    let e = translate(&r).unwrap_err().to_string();
    let at = "listener \"main\": filter_chains[0].filters[0].typed_config.users";
    for want in [
        format!("{at}[0].name: must not contain spaces or control characters"),
        format!("{at}[1].password_sha256[0]: expected 64 hexadecimal digits (a SHA-256 digest)"),
        format!("{at}[1].rules[0]: unknown command \"nosuch\" in rule \"+nosuch\""),
        format!("{at}[2].name: duplicate user \"c\" (also users[1])"),
        format!("{at}[2].password_sha256: required: a user needs a password or nopass"),
    ] {
        assert!(e.contains(&want), "missing {want:?} in\n{e}");
    }
}

#[test]
fn envoy_downstream_auth_username_is_one_user_with_every_permission() {
    let mut r = parse_yaml(
        "listeners: [{ name: main, routes: { catch_all: main } }]\nclusters: [{ name: main, shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }] }]\n",
    )
    .unwrap();
    let inline = |s: &str| DataSource {
        specifier: Some(data_source::Specifier::InlineString(s.into())),
        ..Default::default()
    };
    let any = filter_any(&mut r, 1);
    let mut redis: RedisProxy = unpack(any);
    redis.downstream_auth_username = Some(inline("envoy"));
    redis.downstream_auth_passwords = vec![inline("p1"), inline("p2")];
    *any = pack(&redis);
    let c = translate(&r).unwrap();
    let l = &c.listeners[0];
    assert_eq!(l.downstream_password, None);
    assert_eq!(l.users.len(), 1);
    assert_eq!(l.users[0].name, "envoy");
    assert_eq!(l.users[0].passwords, [sha256(b"p1"), sha256(b"p2")]);
    assert_eq!(l.users[0].rules, ["allcommands", "allkeys", "allchannels"]);
    assert_eq!(translate(&to_resources(&c)).unwrap(), c);
}

#[test]
fn envoy_auth_password_reads_files_and_environment_variables() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "from-file\r\n").unwrap();
    let mut r = parse_yaml(
        "listeners: [{ name: main, routes: { catch_all: main } }]\nclusters: [{ name: main, auth: { password: x }, shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }] }]\n",
    )
    .unwrap();
    let set = |r: &mut Resources, ds: data_source::Specifier| {
        let opts = r.clusters[0]
            .typed_extension_protocol_options
            .get_mut("envoy.filters.network.redis_proxy")
            .unwrap();
        let mut o: RedisProtocolOptions = unpack(opts);
        o.auth_password = Some(DataSource {
            specifier: Some(ds),
            ..Default::default()
        });
        *opts = pack(&o);
    };
    set(
        &mut r,
        data_source::Specifier::Filename(file.display().to_string()),
    );
    let c = translate(&r).unwrap();
    assert_eq!(c.clusters[0].auth.as_ref().unwrap().password, "from-file");
    // PATH is set in every test environment; its value is not printed.
    set(
        &mut r,
        data_source::Specifier::EnvironmentVariable("PATH".into()),
    );
    let c = translate(&r).unwrap();
    assert_eq!(
        c.clusters[0].auth.as_ref().unwrap().password,
        std::env::var("PATH").unwrap()
    );
    set(
        &mut r,
        data_source::Specifier::EnvironmentVariable("RESPWAY_TEST_UNSET_VARIABLE".into()),
    );
    let e = translate(&r).unwrap_err().to_string();
    assert!(
        e.contains("auth_password.environment_variable: environment variable RESPWAY_TEST_UNSET_VARIABLE is not set"),
        "{e}"
    );
    set(
        &mut r,
        data_source::Specifier::Filename("/nonexistent/pw".into()),
    );
    let e = translate(&r).unwrap_err().to_string();
    assert!(
        e.contains("auth_password.filename: cannot read \"/nonexistent/pw\""),
        "{e}"
    );
}

#[test]
fn yaml_user_and_auth_errors_name_their_path() {
    // Problems across users are looked for once every user reads.
    let e = errors(
        r#"
listeners:
  - name: main
    downstream_auth_password: pw
    users:
      - { name: default, password: x }
      - { name: u, password: x, nopass: true }
      - { name: v, rules: "+get ~k* bogus" }
    routes: { catch_all: main }
clusters: [{ name: main, shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }] }]
"#,
    );
    for want in [
        "listener \"main\": users[0].name: the default user's password is already set by downstream_auth_password: set it in one place",
        "listener \"main\": users[1].nopass: conflicts with password",
        "listener \"main\": users[2].rules: unknown rule \"bogus\"",
        "listener \"main\": users[2].password: required: a user needs a password or nopass",
    ] {
        assert!(e.contains(want), "missing {want:?} in\n{e}");
    }
    let e = errors(
        r#"
listeners:
  - name: main
    users:
      - { name: w, password: x, rules: [] }
      - { name: "", password_sha256: nothex }
    routes: { catch_all: main }
clusters:
  - name: main
    auth: { password: a, password_env: B }
    shards: [{ endpoints: [{ address: 10.0.0.1:6379, auth: { username: u } }] }]
"#,
    );
    for want in [
        "listener \"main\": users[0].rules: must not be empty (leave it out for every permission, or use nocommands)",
        "listener \"main\": users[1].name: must not be empty",
        "listener \"main\": users[1].password_sha256: expected 64 hexadecimal digits (a SHA-256 digest)",
        "cluster \"main\": auth.password_env: conflicts with password: give the password one way",
        "cluster \"main\": shards[0].endpoints[0].auth.password: required: one of password, password_file, password_env",
    ] {
        assert!(e.contains(want), "missing {want:?} in\n{e}");
    }
}

//! TLS settings: YAML `listeners[].tls` and `clusters[].tls` ↔ Envoy's TLS transport socket
//! (`DownstreamTlsContext` on the filter chain, `UpstreamTlsContext` on the cluster), the
//! round trip between them, and the exact errors for what respway refuses.

use std::path::PathBuf;

use prost::{Message, Name};
use respway_filters::model::{ListenerTls, UpstreamTls};
use respway_xds::pb::envoy::config::core::v3::{
    data_source, transport_socket::ConfigType, DataSource, TransportSocket,
};
use respway_xds::pb::envoy::extensions::transport_sockets::tls::v3::{
    certificate_validation_context::TrustChainVerification,
    common_tls_context::ValidationContextType, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, SdsSecretConfig, TlsParameters, UpstreamTlsContext,
};
use respway_xds::pb::google::protobuf::{Any, BoolValue};
use respway_xds::{parse_yaml, to_resources, translate, Resources};

const YAML: &str = r#"
listeners:
  - name: main
    tls:
      cert: /etc/respway/tls/server.pem
      key: /etc/respway/tls/server.key
      client_ca: /etc/respway/tls/clients-ca.pem
      require_client_cert: true
    routes: { catch_all: secure }
  - name: open
    address: 127.0.0.1:6381
    tls: { cert: /etc/respway/tls/server.pem, key: /etc/respway/tls/server.key }
    routes: { catch_all: lab }
clusters:
  - name: secure
    tls:
      ca: /etc/respway/tls/redis-ca.pem
      cert: /etc/respway/tls/client.pem
      key: /etc/respway/tls/client.key
      server_name: redis.internal
    shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }]
  - name: lab
    tls: { insecure_skip_verify: true }
    shards: [{ endpoints: [{ address: 10.0.0.2:6379 }] }]
"#;

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn errors_yaml(yaml: &str) -> String {
    parse_yaml(yaml).expect_err("should fail").to_string()
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

fn tls_socket<T: Message + Name>(m: &T) -> TransportSocket {
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(ConfigType::TypedConfig(pack(m))),
    }
}

fn unpack<T: Message + Default>(ts: &TransportSocket) -> T {
    let Some(ConfigType::TypedConfig(any)) = &ts.config_type else {
        panic!("no typed_config");
    };
    T::decode(any.value.as_slice()).unwrap()
}

fn file(path: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(data_source::Specifier::Filename(path.into())),
        ..Default::default()
    })
}

#[test]
fn yaml_tls_reads_into_the_model_and_round_trips_through_envoy_resources() {
    let resources = parse_yaml(YAML).unwrap();
    let config = translate(&resources).unwrap();
    assert_eq!(
        config.listeners[0].tls,
        Some(ListenerTls {
            cert: p("/etc/respway/tls/server.pem"),
            key: p("/etc/respway/tls/server.key"),
            client_ca: Some(p("/etc/respway/tls/clients-ca.pem")),
            require_client_cert: true,
        })
    );
    assert_eq!(
        config.listeners[1]
            .tls
            .as_ref()
            .map(|t| (&t.client_ca, t.require_client_cert)),
        Some((&None, false))
    );
    assert_eq!(
        config.clusters[0].tls,
        Some(UpstreamTls {
            ca: Some(p("/etc/respway/tls/redis-ca.pem")),
            cert: Some(p("/etc/respway/tls/client.pem")),
            key: Some(p("/etc/respway/tls/client.key")),
            server_name: Some("redis.internal".into()),
            insecure_skip_verify: false,
        })
    );
    assert_eq!(
        config.clusters[1].tls,
        Some(UpstreamTls {
            ca: None,
            cert: None,
            key: None,
            server_name: None,
            insecure_skip_verify: true,
        })
    );
    assert_eq!(translate(&to_resources(&config)).unwrap(), config);

    // What the Envoy resources say: the files as DataSource.filename, mTLS as
    // require_client_certificate, the server name as sni, insecure as ACCEPT_UNTRUSTED.
    let ts = resources.listeners[0].filter_chains[0]
        .transport_socket
        .as_ref()
        .expect("listener transport socket");
    assert_eq!(ts.name, "envoy.transport_sockets.tls");
    let d: DownstreamTlsContext = unpack(ts);
    assert_eq!(
        d.require_client_certificate,
        Some(BoolValue { value: true })
    );
    let common = d.common_tls_context.unwrap();
    assert_eq!(
        common.tls_certificates[0].certificate_chain,
        file("/etc/respway/tls/server.pem")
    );
    assert_eq!(
        common.tls_certificates[0].private_key,
        file("/etc/respway/tls/server.key")
    );
    let Some(ValidationContextType::ValidationContext(v)) = common.validation_context_type else {
        panic!("no validation context");
    };
    assert_eq!(v.trusted_ca, file("/etc/respway/tls/clients-ca.pem"));
    let u: UpstreamTlsContext = unpack(resources.clusters[0].transport_socket.as_ref().unwrap());
    assert_eq!(u.sni, "redis.internal");
    let u: UpstreamTlsContext = unpack(resources.clusters[1].transport_socket.as_ref().unwrap());
    let Some(ValidationContextType::ValidationContext(v)) =
        u.common_tls_context.unwrap().validation_context_type
    else {
        panic!("no validation context");
    };
    assert_eq!(
        v.trust_chain_verification,
        TrustChainVerification::AcceptUntrusted as i32
    );
    assert_eq!(v.trusted_ca, None);
    // Without tls: no transport socket.
    let plain = parse_yaml(
        "listeners: [{ name: l, routes: { catch_all: c } }]\nclusters: [{ name: c, shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }] }]\n",
    )
    .unwrap();
    assert!(plain.listeners[0].filter_chains[0]
        .transport_socket
        .is_none());
    assert!(plain.clusters[0].transport_socket.is_none());
}

#[test]
fn yaml_tls_errors_name_their_path() {
    let yaml = r#"
listeners:
  - name: main
    tls: { cert: /a.pem, require_client_cert: true, ciphers: x }
    routes: { catch_all: c }
clusters:
  - name: c
    tls: { cert: /c.pem, server_name: "" }
    shards: [{ endpoints: [{ address: 10.0.0.1:6379 }] }]
  - name: d
    tls: { ca: /ca.pem, insecure_skip_verify: true, key: /k.pem }
    shards: [{ endpoints: [{ address: 10.0.0.2:6379 }] }]
"#;
    assert_eq!(
        errors_yaml(yaml),
        r#"listener "main": tls.ciphers: unknown field (expected one of: cert, key, client_ca, require_client_cert)
listener "main": tls.key: required
cluster "c": tls.ca: required: respway verifies the shards' certificates and has no built-in CA roots (insecure_skip_verify: ACCEPT_UNTRUSTED accepts any certificate)
cluster "c": tls.key: required: a filename
cluster "c": tls.server_name: must not be empty (leave it out or use null)
cluster "d": tls.ca: contradicts insecure_skip_verify: ACCEPT_UNTRUSTED (no certificate is verified)
cluster "d": tls.cert: required: a filename"#
    );
}

fn base() -> Resources {
    parse_yaml(YAML).unwrap()
}

#[test]
fn envoy_tls_fields_respway_does_not_implement_are_refused_by_name() {
    // Inline material, SDS, TLS parameters, ALPN and session settings on the listener.
    let mut r = base();
    let mut d: DownstreamTlsContext = unpack(
        r.listeners[0].filter_chains[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    d.require_sni = Some(BoolValue { value: true });
    let common = d.common_tls_context.as_mut().unwrap();
    common.tls_params = Some(TlsParameters::default());
    common.alpn_protocols = vec!["redis".into()];
    common.tls_certificates[0].private_key = Some(DataSource {
        specifier: Some(data_source::Specifier::InlineString("-----BEGIN".into())),
        ..Default::default()
    });
    common.validation_context_type = Some(ValidationContextType::ValidationContextSdsSecretConfig(
        SdsSecretConfig::default(),
    ));
    r.listeners[0].filter_chains[0].transport_socket = Some(tls_socket(&d));
    // A listener's second certificate, and a transport socket that is not TLS.
    let mut d2: DownstreamTlsContext = unpack(
        r.listeners[1].filter_chains[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    let certs = &mut d2.common_tls_context.as_mut().unwrap().tls_certificates;
    certs.push(certs[0].clone());
    r.listeners[1].filter_chains[0].transport_socket = Some(tls_socket(&d2));
    r.clusters[0].transport_socket = Some(TransportSocket {
        name: "envoy.transport_sockets.alts".into(),
        config_type: None,
    });
    // An upstream context that verifies nothing, and one whose CA is inline bytes.
    r.clusters[1].transport_socket = Some(tls_socket(&UpstreamTlsContext {
        auto_host_sni: true,
        ..Default::default()
    }));
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].transport_socket.typed_config.require_sni: not supported by respway
listener "main": filter_chains[0].transport_socket.typed_config.common_tls_context.tls_params: not supported by respway
listener "main": filter_chains[0].transport_socket.typed_config.common_tls_context.alpn_protocols: not supported by respway
listener "main": filter_chains[0].transport_socket.typed_config.common_tls_context.tls_certificates[0].private_key.inline_string: not supported by respway (use filename: respway reads certificates and keys from files, and reloads them when they change)
listener "main": filter_chains[0].transport_socket.typed_config.common_tls_context.validation_context_sds_secret_config: not supported by respway (use validation_context)
listener "open": filter_chains[0].transport_socket.typed_config.common_tls_context.tls_certificates: exactly one certificate is supported by respway (got 2)
cluster "secure": transport_socket.name: transport socket "envoy.transport_sockets.alts" is not supported by respway (use envoy.transport_sockets.tls)
cluster "lab": transport_socket.typed_config.auto_host_sni: not supported by respway
cluster "lab": transport_socket.typed_config.common_tls_context.validation_context.trusted_ca: required: respway verifies the shards' certificates and has no built-in CA roots (trust_chain_verification: ACCEPT_UNTRUSTED accepts any certificate)"#
    );

    // Upstream: inline CA bytes; a listener that would accept untrusted client certificates,
    // and one that requires client certificates without a CA.
    let mut r = base();
    r.clusters[0].transport_socket = Some(tls_socket(&UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            validation_context_type: Some(ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: Some(DataSource {
                        specifier: Some(data_source::Specifier::InlineBytes(b"pem".to_vec())),
                        ..Default::default()
                    }),
                    match_typed_subject_alt_names: vec![Default::default()],
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }));
    let mut d: DownstreamTlsContext = unpack(
        r.listeners[0].filter_chains[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    if let Some(ValidationContextType::ValidationContext(v)) = d
        .common_tls_context
        .as_mut()
        .unwrap()
        .validation_context_type
        .as_mut()
    {
        v.trust_chain_verification = TrustChainVerification::AcceptUntrusted as i32;
    }
    r.listeners[0].filter_chains[0].transport_socket = Some(tls_socket(&d));
    let mut d2: DownstreamTlsContext = unpack(
        r.listeners[1].filter_chains[0]
            .transport_socket
            .as_ref()
            .unwrap(),
    );
    d2.require_client_certificate = Some(BoolValue { value: true });
    r.listeners[1].filter_chains[0].transport_socket = Some(tls_socket(&d2));
    assert_eq!(
        errors(&r),
        r#"listener "main": filter_chains[0].transport_socket.typed_config.common_tls_context.validation_context.trust_chain_verification: ACCEPT_UNTRUSTED is not supported on a listener by respway (client certificates are verified against trusted_ca)
listener "open": filter_chains[0].transport_socket.typed_config.require_client_certificate: needs common_tls_context.validation_context.trusted_ca (the CA that signs the client certificates)
cluster "secure": transport_socket.typed_config.common_tls_context.validation_context.match_typed_subject_alt_names: not supported by respway
cluster "secure": transport_socket.typed_config.common_tls_context.validation_context.trusted_ca.inline_bytes: not supported by respway (use filename: respway reads certificates and keys from files, and reloads them when they change)
cluster "secure": transport_socket.typed_config.common_tls_context.validation_context.trusted_ca: required: respway verifies the shards' certificates and has no built-in CA roots (trust_chain_verification: ACCEPT_UNTRUSTED accepts any certificate)"#
    );
}

//! One config path: a YAML file is read straight into Envoy resources, and only the
//! translation checks what they mean.
//!
//! - The resources read from each example configuration are pinned in `tests/golden/`
//!   (written out with their maps sorted and their packed messages decoded). They were
//!   recorded when the YAML was still read into the model and written out as resources from
//!   it, and equalled what that gave; `RESPWAY_BLESS=1` records them again after a deliberate
//!   change.
//! - A semantic error of a YAML file is found by the translation, once, and named by the
//!   file's own key path.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use prost::{Message, Name};
use respway_xds::pb::envoy::config::cluster::v3::Cluster;
use respway_xds::pb::envoy::config::core::v3::transport_socket;
use respway_xds::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use respway_xds::pb::envoy::config::listener::v3::{filter::ConfigType, Listener};
use respway_xds::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    RedisProtocolOptions, RedisProxy,
};
use respway_xds::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, UpstreamTlsContext,
};
use respway_xds::pb::google::protobuf::Any;
use respway_xds::pb::respway::v1::{ClusterOptions, ListenerSettings, ShardHashing};
use respway_xds::{load_file, parse_yaml, Resources};

/// The example configurations whose resources are pinned.
const EXAMPLES: &[(&str, &str)] = &[
    ("full", "xds/examples/full.yaml"),
    ("demo", "examples/demo/respway.yaml"),
    ("hot_key", "examples/hot_key/respway.yaml"),
    ("migration", "examples/migration/respway.yaml"),
    ("zone_local", "examples/zone_local/respway.yaml"),
];

/// A packed message, decoded when it is one respway writes.
fn any(a: &Any) -> String {
    fn show<T: Message + Name + Default + std::fmt::Debug>(a: &Any) -> Option<String> {
        (a.type_url == T::type_url())
            .then(|| format!("{:#?}", T::decode(a.value.as_slice()).expect("decodes")))
    }
    show::<RedisProxy>(a)
        .or_else(|| show::<ListenerSettings>(a))
        .or_else(|| show::<ClusterOptions>(a))
        .or_else(|| show::<RedisProtocolOptions>(a))
        .or_else(|| show::<ShardHashing>(a))
        .or_else(|| show::<DownstreamTlsContext>(a))
        .or_else(|| show::<UpstreamTlsContext>(a))
        .unwrap_or_else(|| panic!("unexpected {}", a.type_url))
}

fn transport(ts: &mut Option<respway_xds::pb::envoy::config::core::v3::TransportSocket>) -> String {
    match ts.as_mut().and_then(|t| t.config_type.take()) {
        Some(transport_socket::ConfigType::TypedConfig(a)) => any(&a),
        _ => "none".to_string(),
    }
}

fn listener(mut l: Listener) -> String {
    let mut out = String::new();
    for chain in &mut l.filter_chains {
        let tls = transport(&mut chain.transport_socket);
        writeln!(out, "transport socket: {tls}").unwrap();
        for f in &mut chain.filters {
            if let Some(ConfigType::TypedConfig(a)) = f.config_type.take() {
                writeln!(out, "filter {}: {}", f.name, any(&a)).unwrap();
            }
        }
    }
    format!("{l:#?}\n{out}")
}

fn cluster(mut c: Cluster) -> String {
    let mut out = String::new();
    let tls = transport(&mut c.transport_socket);
    writeln!(out, "transport socket: {tls}").unwrap();
    let options: BTreeMap<_, _> = std::mem::take(&mut c.typed_extension_protocol_options)
        .into_iter()
        .collect();
    for (name, a) in options {
        writeln!(out, "protocol options {name}: {}", any(&a)).unwrap();
    }
    for p in c
        .load_balancing_policy
        .iter_mut()
        .flat_map(|p| &mut p.policies)
    {
        if let Some(a) = p
            .typed_extension_config
            .as_mut()
            .and_then(|t| t.typed_config.take())
        {
            writeln!(out, "load balancing policy: {}", any(&a)).unwrap();
        }
    }
    format!("{c:#?}\n{out}")
}

fn assignment(mut cla: ClusterLoadAssignment) -> String {
    let mut out = String::new();
    for (li, locality) in cla.endpoints.iter_mut().enumerate() {
        for (ei, e) in locality.lb_endpoints.iter_mut().enumerate() {
            let Some(md) = e.metadata.take() else {
                continue;
            };
            let md: BTreeMap<String, BTreeMap<String, String>> = md
                .filter_metadata
                .into_iter()
                .map(|(ns, s)| {
                    let fields = s
                        .fields
                        .into_iter()
                        .map(|(k, v)| (k, format!("{:?}", v.kind)))
                        .collect();
                    (ns, fields)
                })
                .collect();
            writeln!(out, "endpoints[{li}].lb_endpoints[{ei}] metadata: {md:#?}").unwrap();
        }
    }
    format!("{cla:#?}\n{out}")
}

/// The resources as text: each resource, its maps sorted and its packed messages decoded.
fn render(r: &Resources) -> String {
    let mut out = format!("node_zone: {:?}\n", r.node_zone);
    for l in &r.listeners {
        out.push_str(&listener(l.clone()));
    }
    for c in &r.clusters {
        out.push_str(&cluster(c.clone()));
    }
    for cla in &r.endpoints {
        out.push_str(&assignment(cla.clone()));
    }
    out
}

#[test]
fn the_examples_read_into_the_pinned_resources() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bless = std::env::var_os("RESPWAY_BLESS").is_some();
    for (name, file) in EXAMPLES {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let resources = parse_yaml(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let got = render(&resources);
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.txt"));
        if bless {
            std::fs::write(&golden, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        assert!(
            got == want,
            "{file}: the resources differ from {}; if the change is meant, run \
             `RESPWAY_BLESS=1 cargo test -p respway-xds --test it golden::`",
            golden.display()
        );
    }
}

#[test]
fn a_semantic_error_is_found_once_by_the_translation_in_the_yaml_terms() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("respway-xds-golden");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    // Well formed, but: a table size that is not prime (a range), a route to no cluster
    // (a dangling reference), and a shard with two primaries.
    std::fs::write(
        &path,
        r#"
listeners:
  - name: l
    routes: { catch_all: nope }
clusters:
  - name: users
    hash: { policy: maglev, table_size: 65536 }
    shards:
      - endpoints: [{ address: 127.0.0.1:7001 }]
      - endpoints:
          - { address: 127.0.0.1:7002, role: primary }
          - { address: 127.0.0.1:7003, role: primary }
"#,
    )
    .unwrap();
    let shown = path.display().to_string();
    assert_eq!(
        load_file(&path).unwrap_err().to_string(),
        format!(
            "{shown}: listener \"l\": routes.catch_all: unknown cluster \"nope\"\n\
             {shown}: cluster \"users\": hash.table_size: 65536 is not a prime number\n\
             {shown}: cluster \"users\": shards[1].endpoints[1].role: shard \"shard-1\" already \
             has a primary (endpoints[0]): exactly one endpoint must have role primary"
        )
    );
    // Reading the text alone reports the same three, each once: the reader checks only the
    // shape, and the translation the rest.
    let text = std::fs::read_to_string(&path).unwrap();
    let read = parse_yaml(&text).unwrap_err().to_string();
    assert_eq!(read.lines().count(), 3, "{read}");
}

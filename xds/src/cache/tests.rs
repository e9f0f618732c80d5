//! The snapshot cache against real directories of resource files: merge precedence, per-class
//! failures, versions, `apply`.

use super::*;

const BASE: &str = "
listeners:
  - name: main
    routes: { catch_all: cache }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7001 }]
";

fn dir_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Cache) {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    let cache = Cache::new(dir.path());
    (dir, cache)
}

fn endpoint_of(
    snap: &NodeSnapshot,
    cluster: &str,
) -> envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
    let any = &snap.get(ResourceType::Endpoint).resources[cluster];
    Message::decode(any.value.as_slice()).expect("decodes")
}

#[test]
fn untargeted_file_serves_every_node() {
    let (_d, cache) = dir_with(&[("base.yaml", BASE)]);
    let r = cache.reload();
    assert_eq!(r.committed, Some(1), "{:?}", r.errors);
    let snap = cache.snapshot();
    let a = snap.for_node("a", None).expect("snapshot");
    let b = snap.for_node("b", Some("z9")).expect("snapshot");
    assert!(Arc::ptr_eq(&a, &b));
    let listeners = a.get(ResourceType::Listener);
    assert_eq!(
        listeners.version,
        content_version(ResourceType::Listener, &listeners.resources)
    );
    assert_eq!(listeners.version.len(), 16);
    assert_eq!(
        a.get(ResourceType::Cluster)
            .resources
            .keys()
            .collect::<Vec<_>>(),
        ["cache"]
    );
}

#[test]
fn targeted_files_override_by_name_most_specific_first() {
    let zone = "
targets: { zones: [z1] }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7101 }]
";
    let node = "
targets: { node_ids: [n1] }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7201 }]
";
    let (_d, cache) = dir_with(&[("base.yaml", BASE), ("z1.yaml", zone), ("n1.yaml", node)]);
    assert_eq!(cache.reload().errors, Vec::<String>::new());
    let snap = cache.snapshot();
    let base = snap.for_node("x", None).expect("base");
    let z1 = snap.for_node("x", Some("z1")).expect("z1");
    let n1 = snap.for_node("n1", Some("z1")).expect("n1");
    let n1_elsewhere = snap.for_node("n1", None).expect("n1");
    let cla = |s: &NodeSnapshot| endpoint_of(s, "cache");
    assert_ne!(cla(&base), cla(&z1));
    assert_ne!(cla(&z1), cla(&n1));
    assert_eq!(cla(&n1), cla(&n1_elsewhere));
    // The listener comes from the base file for all of them.
    assert_eq!(
        base.get(ResourceType::Listener),
        n1.get(ResourceType::Listener)
    );
}

#[test]
fn a_failing_class_keeps_its_snapshot_while_the_others_move() {
    let zone = |cluster: &str| {
        format!("targets: {{ zones: [z1] }}\nlisteners:\n  - name: main\n    routes: {{ catch_all: {cluster} }}\n")
    };
    let (d, cache) = dir_with(&[("base.yaml", BASE), ("z1.yaml", &zone("cache"))]);
    assert_eq!(cache.reload().committed, Some(1));
    let before = cache.snapshot().for_node("a", Some("z1")).expect("z1");
    // z1's listener now routes nowhere, and the base file's endpoint moves.
    std::fs::write(d.path().join("z1.yaml"), zone("gone")).expect("write");
    std::fs::write(d.path().join("base.yaml"), BASE.replace("7001", "7002")).expect("write");
    let r = cache.reload();
    assert_eq!(r.committed, Some(2));
    assert_eq!(
            r.errors,
            ["z1.yaml: listener \"main\": routes.catch_all: unknown cluster \"gone\" (in the snapshot for other nodes in zone \"z1\")"]
        );
    let snap = cache.snapshot();
    assert_eq!(snap.errors(), r.errors);
    let z1 = snap.for_node("a", Some("z1")).expect("held");
    assert!(Arc::ptr_eq(&z1, &before), "z1 keeps what it had");
    let other = snap.for_node("a", None).expect("served");
    assert_eq!(endpoint_address_of(&other), "127.0.0.1:7002");
    assert_eq!(endpoint_address_of(&z1), "127.0.0.1:7001");
    assert_eq!(cache.report().errors, r.errors);
    // /apply refuses a file that breaks some class.
    let Err(ApplyError::Invalid(errors)) = cache.apply("z1.yaml", &zone("also-gone")) else {
        panic!("expected invalid");
    };
    assert!(errors[0].contains("also-gone"), "{errors:?}");
    // Fixed: z1 moves too.
    std::fs::write(d.path().join("z1.yaml"), zone("cache")).expect("write");
    assert_eq!(
        cache.reload(),
        Reload {
            committed: Some(3),
            errors: vec![]
        }
    );
    let z1 = cache.snapshot().for_node("a", Some("z1")).expect("z1");
    assert_eq!(endpoint_address_of(&z1), "127.0.0.1:7002");
}

#[test]
fn classes_without_a_listener_are_reported_and_served_nothing() {
    let clusters = "clusters:\n  - name: cache\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7001 }]\n";
    let n1 = "targets: { node_ids: [n1] }\nlisteners:\n  - name: main\n    routes: { catch_all: cache }\n";
    let (_d, cache) = dir_with(&[("clusters.yaml", clusters), ("n1.yaml", n1)]);
    let r = cache.reload();
    assert_eq!(
        r,
        Reload {
            committed: Some(1),
            errors: vec![]
        }
    );
    let snap = cache.snapshot();
    assert!(snap.for_node("n1", Some("z9")).is_some());
    assert!(snap.for_node("n2", None).is_none());
    assert_eq!(
        snap.unserved_reason("n2", None),
        Some("no listener: nothing is served to other nodes, as to a node no file is for")
    );
    assert_eq!(snap.unserved_reason("n1", None), None);
    assert_eq!(cache.report().unserved.len(), 1);
}

fn endpoint_address_of(snap: &NodeSnapshot) -> String {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint;
    let cla = endpoint_of(snap, "cache");
    let Some(lb_endpoint::HostIdentifier::Endpoint(e)) =
        &cla.endpoints[0].lb_endpoints[0].host_identifier
    else {
        panic!("no endpoint");
    };
    let Some(address::Address::SocketAddress(sa)) =
        e.address.as_ref().and_then(|a| a.address.as_ref())
    else {
        panic!("no socket address");
    };
    let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
        panic!("no port");
    };
    format!("{}:{port}", sa.address)
}

#[test]
fn same_precedence_conflict_is_an_error_and_nothing_is_served() {
    let (_d, cache) = dir_with(&[("a.yaml", BASE), ("b.yaml", BASE)]);
    let r = cache.reload();
    assert_eq!(r.committed, None);
    assert!(
            r.errors.iter().any(|e| e.starts_with(
                "listener \"main\" is defined by \"a.yaml\" and \"b.yaml\" at the same precedence (files for every node)"
            )),
            "{:?}",
            r.errors
        );
    assert_eq!(cache.snapshot().version, 0);
}

#[test]
fn invalid_file_keeps_its_previous_version() {
    let (d, cache) = dir_with(&[("base.yaml", BASE)]);
    assert_eq!(cache.reload().committed, Some(1));
    std::fs::write(d.path().join("base.yaml"), BASE.replace("7001", "99999")).expect("write");
    let r = cache.reload();
    assert_eq!(r.committed, None);
    assert_eq!(
            r.errors,
            [
                "base.yaml: cluster \"cache\": shards[0].endpoints[0].address: invalid socket address \"127.0.0.1:99999\""
            ]
        );
    let report = cache.report();
    assert_eq!(report.version, 1);
    assert!(matches!(
        report.files[0].state,
        FileState::Invalid {
            serving_previous: true,
            ..
        }
    ));
    // Unchanged directory: no new scan result.
    assert_eq!(cache.reload().errors, Vec::<String>::new());
}

#[test]
fn cross_file_reference_errors_name_the_file_and_nodes() {
    let listener_only = "
targets: { zones: [z1] }
listeners:
  - name: extra
    address: 127.0.0.1:6390
    routes: { catch_all: missing }
";
    let (_d, cache) = dir_with(&[("base.yaml", BASE), ("extra.yaml", listener_only)]);
    let r = cache.reload();
    // The nodes outside z1 are served; those of z1, which had nothing, get nothing.
    assert_eq!(r.committed, Some(1));
    let snap = cache.snapshot();
    assert!(snap.for_node("a", None).is_some());
    assert!(snap.for_node("a", Some("z1")).is_none());
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(
        r.errors[0].starts_with(
            "extra.yaml: listener \"extra\": routes.catch_all: unknown cluster \"missing\""
        ),
        "{}",
        r.errors[0]
    );
    assert!(
        r.errors[0].ends_with("(in the snapshot for other nodes in zone \"z1\")"),
        "{}",
        r.errors[0]
    );
}

#[test]
fn merged_errors_use_the_files_yaml_paths() {
    // Routes and mirrors naming clusters no file for the node defines: reported by the
    // YAML paths of the file that wrote them, not by the Envoy translation's.
    let routes = "
listeners:
  - name: extra
    address: 127.0.0.1:6390
    routes:
      catch_all: gone
      catch_all_mirrors: [{ cluster: cache }, { cluster: gone-mirror }]
      prefixes:
        - { prefix: 'a:', cluster: cache }
        - { prefix: 'b:', cluster: gone-b, mirrors: [{ cluster: gone-b-mirror }] }
";
    let (_d, cache) = dir_with(&[("base.yaml", BASE), ("routes.yaml", routes)]);
    let r = cache.reload();
    assert_eq!(r.committed, None);
    let who = " (in the snapshot for other nodes)";
    assert_eq!(
            r.errors,
            [
                format!("routes.yaml: listener \"extra\": routes.catch_all: unknown cluster \"gone\"{who}"),
                format!("routes.yaml: listener \"extra\": routes.catch_all_mirrors[1].cluster: unknown cluster \"gone-mirror\"{who}"),
                format!("routes.yaml: listener \"extra\": routes.prefixes[1].cluster: unknown cluster \"gone-b\"{who}"),
                format!("routes.yaml: listener \"extra\": routes.prefixes[1].mirrors[0].cluster: unknown cluster \"gone-b-mirror\"{who}"),
            ]
        );
    // An invalid hash policy is the file's own error, by its YAML path too.
    let hash = "
clusters:
  - name: ring
    hash: { policy: ring_hash, minimum_ring_size: 2048, maximum_ring_size: 1024 }
    shards:
      - endpoints: [{ address: 127.0.0.1:7009 }]
";
    let (_d, cache) = dir_with(&[("base.yaml", BASE), ("ring.yaml", hash)]);
    assert_eq!(
            cache.reload().errors,
            ["ring.yaml: cluster \"ring\": hash.minimum_ring_size: 2048 is larger than maximum_ring_size 1024"]
        );
}

#[test]
fn versions_move_only_for_changed_types() {
    let (d, cache) = dir_with(&[("base.yaml", BASE)]);
    cache.reload();
    let before = versions(&cache, "a", None);
    std::fs::write(d.path().join("base.yaml"), BASE.replace("7001", "7002")).expect("write");
    assert_eq!(cache.reload().committed, Some(2));
    let after = versions(&cache, "a", None);
    assert_ne!(after[1], before[1], "EDS moved");
    assert_eq!(after[0], before[0], "CDS did not");
    assert_eq!(after[2], before[2], "LDS did not");
}

/// CDS, EDS and LDS `version_info` for node `id` in `zone`.
fn versions(cache: &Cache, id: &str, zone: Option<&str>) -> [String; 3] {
    let snap = cache.snapshot().for_node(id, zone).expect("snapshot");
    ResourceType::PUSH_ORDER.map(|t| snap.get(t).version.clone())
}

#[test]
fn version_info_is_the_content_hash_in_every_server() {
    let zone = "
targets: { zones: [z1] }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7101 }]
";
    let (d, first) = dir_with(&[("base.yaml", BASE), ("z1.yaml", zone)]);
    first.reload();
    let original = versions(&first, "a", Some("z1"));
    let other_zone = versions(&first, "a", None);
    assert_ne!(original[1], other_zone[1], "different endpoints");
    assert_eq!(original[2], other_zone[2], "the same listener");

    // The first server sees an intermediate edit; a second one starts after it.
    std::fs::write(d.path().join("z1.yaml"), zone.replace("7101", "7102")).expect("write");
    assert_eq!(first.reload().committed, Some(2));
    let second = Cache::new(d.path());
    assert_eq!(second.reload().committed, Some(1));
    for (id, z) in [("a", Some("z1")), ("a", None), ("b", Some("z9"))] {
        assert_eq!(
            versions(&first, id, z),
            versions(&second, id, z),
            "{id} in {z:?}"
        );
    }
    let edited = versions(&second, "a", Some("z1"));
    assert_ne!(edited[1], original[1], "changed content, changed version");
    assert_eq!(edited[0], original[0]);

    // Back to the original content: back to the original versions.
    std::fs::write(d.path().join("z1.yaml"), zone).expect("write");
    assert_eq!(first.reload().committed, Some(3));
    assert_eq!(versions(&first, "a", Some("z1")), original);
}

#[test]
fn content_version_ignores_map_encoding_order() {
    // Endpoint metadata (two namespaces, several fields) and a cluster's protocol options
    // are protobuf maps: each fresh encoding may order them differently.
    let text = "
listeners:
  - name: main
    routes: { catch_all: cache }
clusters:
  - name: cache
    hash: { policy: ketama }
    shards:
      - name: s0
        hash_key: custom
        endpoints:
          - { address: 127.0.0.1:7001, role: primary, zone: z1 }
          - { address: 127.0.0.1:7002, role: replica, zone: z2 }
";
    let resources = crate::parse_yaml(text).expect("valid");
    let pack = |m: &dyn Fn() -> Vec<u8>| {
        BTreeMap::from([(
            "cache".to_string(),
            Any {
                type_url: ResourceType::Endpoint.type_url().to_string(),
                value: m(),
            },
        )])
    };
    let mut encodings = BTreeSet::new();
    let mut hashes = BTreeSet::new();
    for _ in 0..32 {
        // A fresh model → resources each time: fresh maps, fresh iteration orders.
        let again = crate::to_resources(&crate::translate(&resources).expect("translates"));
        let bytes = again.endpoints[0].encode_to_vec();
        encodings.insert(bytes.clone());
        hashes.insert(content_version(
            ResourceType::Endpoint,
            &pack(&|| bytes.clone()),
        ));
        let cluster = BTreeMap::from([(
            "cache".to_string(),
            Any {
                type_url: ResourceType::Cluster.type_url().to_string(),
                value: again.clusters[0].encode_to_vec(),
            },
        )]);
        hashes.insert(content_version(ResourceType::Cluster, &cluster));
    }
    assert!(
        encodings.len() > 1,
        "the maps always encoded in one order; this test no longer shows anything"
    );
    assert_eq!(hashes.len(), 2, "one EDS and one CDS version: {hashes:?}");
}

#[test]
fn node_section_and_empty_targets_are_refused() {
    let text = "node: { zone: z1 }\ntargets: {}\nclusters: []\n";
    let err = yaml::parse_fragment(text).unwrap_err().to_string();
    assert_eq!(
            err,
            "node: not used in a respway-xds resource file: a sidecar's own node is in its bootstrap; name the sidecars a file is for with `targets`\n\
             targets: names no node id and no zone (leave `targets` out for a file for every node)"
        );
}

#[test]
fn moving_a_listener_is_refused_and_the_served_version_stays() {
    let with_addr = |a: &str| {
        BASE.replace(
            "  - name: main\n",
            &format!("  - name: main\n    address: {a}\n"),
        )
    };
    let (d, cache) = dir_with(&[("base.yaml", &with_addr("127.0.0.1:6380"))]);
    assert_eq!(cache.reload().committed, Some(1));
    std::fs::write(d.path().join("base.yaml"), with_addr("127.0.0.1:6390")).expect("write");
    let r = cache.reload();
    assert_eq!(r.committed, None);
    assert_eq!(
            r.errors,
            ["base.yaml: listener \"main\": address: changed from 127.0.0.1:6380 to 127.0.0.1:6390, \
              which running sidecars refuse (a listener cannot move while respway runs); to move it, \
              restart respway-xds with the new file, then the sidecars (in the snapshot for other nodes)"]
        );
    let report = cache.report();
    assert_eq!((report.version, report.errors), (1, r.errors.clone()));
    // /apply refuses it too, and writes nothing.
    let Err(ApplyError::Invalid(errors)) = cache.apply("base.yaml", &with_addr("127.0.0.1:6391"))
    else {
        panic!("expected invalid");
    };
    assert!(
        errors[0].contains("address: changed from 127.0.0.1:6380 to 127.0.0.1:6391"),
        "{errors:?}"
    );
    // Other edits of the same listener, and new listeners, still go through.
    std::fs::write(
        d.path().join("base.yaml"),
        with_addr("127.0.0.1:6380").replace("7001", "7002"),
    )
    .expect("write");
    assert_eq!(cache.reload().committed, Some(2));
    let extra = "listeners:\n  - name: extra\n    address: 127.0.0.1:6399\n    routes: { catch_all: cache }\n";
    assert_eq!(cache.apply("extra.yaml", extra), Ok(3));
}

#[test]
fn moving_a_listener_for_some_nodes_names_them() {
    let with_addr = |a: &str| {
        BASE.replace(
            "  - name: main\n",
            &format!("  - name: main\n    address: {a}\n"),
        )
    };
    let (d, cache) = dir_with(&[("base.yaml", &with_addr("127.0.0.1:6380"))]);
    assert_eq!(cache.reload().committed, Some(1));
    // A file for zone z1 redefining the listener at another address moves it for the
    // nodes of z1 only.
    let z1 = "targets: { zones: [z1] }\nlisteners:\n  - name: main\n    address: 127.0.0.1:6381\n    routes: { catch_all: cache }\n";
    std::fs::write(d.path().join("z1.yaml"), z1).expect("write");
    let r = cache.reload();
    assert_eq!(r.committed, None);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(
        r.errors[0].starts_with(
            "z1.yaml: listener \"main\": address: changed from 127.0.0.1:6380 to 127.0.0.1:6381"
        ),
        "{}",
        r.errors[0]
    );
    assert!(
        r.errors[0].ends_with("(in the snapshot for other nodes in zone \"z1\")"),
        "{}",
        r.errors[0]
    );
}

#[test]
fn apply_validates_then_writes_atomically() {
    let (d, cache) = dir_with(&[("base.yaml", BASE)]);
    cache.reload();
    assert_eq!(
        cache.apply("../x.yaml", BASE),
        Err(ApplyError::Name("../x.yaml".into()))
    );
    let bad = "listeners:\n  - name: two\n    address: 127.0.0.1:6391\n    routes: { catch_all: nowhere }\n";
    let Err(ApplyError::Invalid(errors)) = cache.apply("two.yaml", bad) else {
        panic!("expected invalid");
    };
    assert!(errors[0].contains("nowhere"), "{errors:?}");
    assert!(!d.path().join("two.yaml").exists());
    let good = bad.replace("nowhere", "cache");
    assert_eq!(cache.apply("two.yaml", &good), Ok(2));
    assert!(d.path().join("two.yaml").exists());
    let names: Vec<String> = std::fs::read_dir(d.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");

    // Another file being invalid does not stop an apply.
    std::fs::write(d.path().join("broken.yaml"), "listeners: [").expect("write");
    let three = good.replace("routes:", "op_timeout: 2s\n    routes:");
    assert_eq!(cache.apply("two.yaml", &three), Ok(3));
    let report = cache.report();
    let broken = report
        .files
        .iter()
        .find(|f| f.name == "broken.yaml")
        .expect("listed");
    assert!(matches!(broken.state, FileState::Invalid { .. }));
}

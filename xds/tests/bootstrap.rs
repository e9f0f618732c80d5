//! Regenerates respway's extension types from `proto/respway/v1/*.proto` and fails when the
//! checked-in `src/gen/respway.v1.rs` differs (linkerd's bootstrap test). Run with
//! `RESPWAY_BLESS=1` to write the fresh file over the checked-in one after changing a proto.

use std::path::{Path, PathBuf};

#[test]
fn generated_code_is_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let protos = root.join("proto");
    let mut files: Vec<PathBuf> = std::fs::read_dir(protos.join("respway/v1"))
        .expect("proto/respway/v1")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "proto"))
        .collect();
    files.sort();

    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("respway-xds-bootstrap");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("create temp dir");
    let mut config = prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() && Path::new("/usr/bin/protoc").exists() {
        // Given to prost-build, not set in the environment: the other tests of this binary
        // run in this process at the same time.
        config.protoc_executable("/usr/bin/protoc");
    }
    config
        .out_dir(&out)
        .enable_type_names()
        .type_name_domain(["."], "type.googleapis.com")
        // Well-known types (`google.protobuf.Duration`) are envoy-types' own, the ones Envoy's
        // messages use, so no prost-types dependency is needed.
        .prost_types_path("::envoy_types::pb::google::protobuf")
        .compile_protos(&files, &[&protos])
        .expect("protoc and prost-build");

    let fresh = std::fs::read_to_string(out.join("respway.v1.rs")).expect("generated file");
    let checked_in_path = root.join("src/gen/respway.v1.rs");
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    if fresh != checked_in {
        if std::env::var_os("RESPWAY_BLESS").is_some() {
            std::fs::write(&checked_in_path, &fresh).expect("write src/gen/respway.v1.rs");
            return;
        }
        panic!(
            "src/gen/respway.v1.rs is stale: it differs from what proto/respway/v1/*.proto \
             generates; run `RESPWAY_BLESS=1 cargo test -p respway-xds --test it generated_code_is_fresh` and \
             commit the result"
        );
    }
}

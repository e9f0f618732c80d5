//! Protobuf types: Envoy's v3 API (re-exported from `envoy-types`) and respway's own extension
//! messages, generated from `xds/proto/respway/v1/*.proto` into `src/gen/respway.v1.rs` and
//! checked in (`tests/bootstrap.rs` fails when the checked-in file is stale).
//!
//! These types stay inside this crate's API surface for configuration sources; the sidecar
//! sees only [`respway_filters::model`].

pub use envoy_types::pb::envoy;
pub use envoy_types::pb::google;

/// respway's extension messages, carried in Envoy resources the way Envoy carries its own
/// extensions (`typed_config`, `typed_extension_protocol_options`, `load_balancing_policy`).
pub mod respway {
    /// Version 1 of the extension messages.
    pub mod v1 {
        include!("gen/respway.v1.rs");
    }
}

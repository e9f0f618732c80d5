//! Envoy's TLS transport socket (`envoy.transport_sockets.tls`) → respway's TLS settings:
//! `DownstreamTlsContext` on a listener's filter chain ([`ListenerTls`]) and
//! `UpstreamTlsContext` on a cluster ([`UpstreamTls`]).
//!
//! Certificates, keys and CAs are files on the sidecar (`DataSource.filename`), which it
//! watches and reloads; inline material, SDS and every other field are refused by name.

use std::path::PathBuf;

use envoy_types::pb::envoy::config::core::v3::{
    data_source, transport_socket::ConfigType, DataSource, TransportSocket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    certificate_validation_context::TrustChainVerification,
    common_tls_context::ValidationContextType, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, UpstreamTlsContext,
};
use prost::Name;
use respway_filters::model::{ListenerTls, UpstreamTls};

use super::{type_name, unpack, unsupported};
use crate::error::{index, join, Cx};

use crate::names::TLS_TRANSPORT_SOCKET;

/// The `typed_config` of a TLS transport socket at `at`, decoded as `T`.
fn typed<T: prost::Message + Name + Default>(
    cx: &mut Cx,
    at: &str,
    ts: &TransportSocket,
) -> Option<(String, T)> {
    if ts.name != TLS_TRANSPORT_SOCKET {
        cx.err(
            join(at, "name"),
            format!(
                "transport socket {:?} is not supported by respway (use {TLS_TRANSPORT_SOCKET})",
                ts.name
            ),
        );
        return None;
    }
    let typed = join(at, "typed_config");
    let Some(ConfigType::TypedConfig(any)) = &ts.config_type else {
        cx.err(&typed, format!("required: a {}", T::full_name()));
        return None;
    };
    if type_name(any) != T::full_name() {
        cx.err(
            &typed,
            format!("expected {}, got {:?}", T::type_url(), any.type_url),
        );
        return None;
    }
    match unpack::<T>(any) {
        Ok(t) => Some((typed, t)),
        Err(e) => {
            cx.err(typed, e);
            None
        }
    }
}

/// A file path from a `DataSource`; inline material and environment variables are refused.
fn file(cx: &mut Cx, field: &str, ds: Option<&DataSource>) -> Option<PathBuf> {
    let Some(ds) = ds else {
        cx.err(field, "required: a filename");
        return None;
    };
    if ds.watched_directory.is_some() {
        cx.err(
            join(field, "watched_directory"),
            "not supported by respway (the files themselves are watched)",
        );
    }
    let refused = |cx: &mut Cx, which: &str| {
        cx.err(
            join(field, which),
            "not supported by respway (use filename: respway reads certificates and keys from \
             files, and reloads them when they change)",
        );
        None
    };
    match &ds.specifier {
        Some(data_source::Specifier::Filename(f)) if f.is_empty() => {
            cx.err(join(field, "filename"), "must not be empty");
            None
        }
        Some(data_source::Specifier::Filename(f)) => Some(PathBuf::from(f)),
        Some(data_source::Specifier::InlineString(_)) => refused(cx, "inline_string"),
        Some(data_source::Specifier::InlineBytes(_)) => refused(cx, "inline_bytes"),
        Some(data_source::Specifier::EnvironmentVariable(_)) => refused(cx, "environment_variable"),
        None => {
            cx.err(field, "required: a filename");
            None
        }
    }
}

/// The certificate and key (both `None` when `required` is false and none is given), and the
/// validation context, of a `CommonTlsContext` at `at`.
struct Common {
    cert: Option<(PathBuf, PathBuf)>,
    validation: Option<(String, CertificateValidationContext)>,
}

#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
fn common(cx: &mut Cx, at: &str, c: Option<&CommonTlsContext>, required: bool) -> Common {
    let mut out = Common {
        cert: None,
        validation: None,
    };
    let Some(c) = c else {
        if required {
            cx.err(join(at, "common_tls_context"), "required");
        }
        return out;
    };
    let at = join(at, "common_tls_context");
    unsupported(
        cx,
        &at,
        &[
            ("tls_params", c.tls_params.is_some()),
            (
                "tls_certificate_sds_secret_configs",
                !c.tls_certificate_sds_secret_configs.is_empty(),
            ),
            (
                "tls_certificate_provider_instance",
                c.tls_certificate_provider_instance.is_some(),
            ),
            (
                "custom_tls_certificate_selector",
                c.custom_tls_certificate_selector.is_some(),
            ),
            (
                "tls_certificate_certificate_provider",
                c.tls_certificate_certificate_provider.is_some(),
            ),
            (
                "tls_certificate_certificate_provider_instance",
                c.tls_certificate_certificate_provider_instance.is_some(),
            ),
            ("alpn_protocols", !c.alpn_protocols.is_empty()),
            ("custom_handshaker", c.custom_handshaker.is_some()),
            ("key_log", c.key_log.is_some()),
        ],
    );
    let certs = join(&at, "tls_certificates");
    if c.tls_certificates.len() > 1 {
        cx.err(
            &certs,
            format!(
                "exactly one certificate is supported by respway (got {})",
                c.tls_certificates.len()
            ),
        );
    }
    match c.tls_certificates.first() {
        Some(t) => {
            let ta = index(&certs, 0);
            unsupported(
                cx,
                &ta,
                &[
                    ("watched_directory", t.watched_directory.is_some()),
                    ("private_key_provider", t.private_key_provider.is_some()),
                    ("password", t.password.is_some()),
                    ("ocsp_staple", t.ocsp_staple.is_some()),
                    (
                        "signed_certificate_timestamp",
                        !t.signed_certificate_timestamp.is_empty(),
                    ),
                ],
            );
            let chain = file(
                cx,
                &join(&ta, "certificate_chain"),
                t.certificate_chain.as_ref(),
            );
            let key = file(cx, &join(&ta, "private_key"), t.private_key.as_ref());
            out.cert = chain.zip(key);
        }
        None if required => cx.err(certs, "required: the listener's certificate and key"),
        None => {}
    }
    match &c.validation_context_type {
        None => {}
        Some(ValidationContextType::ValidationContext(v)) => {
            out.validation = Some((join(&at, "validation_context"), v.clone()));
        }
        Some(ValidationContextType::ValidationContextSdsSecretConfig(_)) => cx.err(
            join(&at, "validation_context_sds_secret_config"),
            "not supported by respway (use validation_context)",
        ),
        Some(ValidationContextType::CombinedValidationContext(_)) => cx.err(
            join(&at, "combined_validation_context"),
            "not supported by respway (use validation_context)",
        ),
        Some(ValidationContextType::ValidationContextCertificateProvider(_)) => cx.err(
            join(&at, "validation_context_certificate_provider"),
            "not supported by respway (use validation_context)",
        ),
        Some(ValidationContextType::ValidationContextCertificateProviderInstance(_)) => cx.err(
            join(&at, "validation_context_certificate_provider_instance"),
            "not supported by respway (use validation_context)",
        ),
    }
    out
}

/// The CA file of a validation context at `at` (`None` when it has none), and whether it
/// accepts untrusted certificates (`trust_chain_verification: ACCEPT_UNTRUSTED`).
#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
fn validation(
    cx: &mut Cx,
    at: &str,
    v: &CertificateValidationContext,
    upstream: bool,
) -> (Option<PathBuf>, bool) {
    unsupported(
        cx,
        at,
        &[
            (
                "ca_certificate_provider_instance",
                v.ca_certificate_provider_instance.is_some(),
            ),
            ("system_root_certs", v.system_root_certs.is_some()),
            ("watched_directory", v.watched_directory.is_some()),
            (
                "verify_certificate_spki",
                !v.verify_certificate_spki.is_empty(),
            ),
            (
                "verify_certificate_hash",
                !v.verify_certificate_hash.is_empty(),
            ),
            (
                "match_typed_subject_alt_names",
                !v.match_typed_subject_alt_names.is_empty(),
            ),
            (
                "match_subject_alt_names",
                !v.match_subject_alt_names.is_empty(),
            ),
            (
                "require_signed_certificate_timestamp",
                v.require_signed_certificate_timestamp.is_some(),
            ),
            ("crl", v.crl.is_some()),
            ("allow_expired_certificate", v.allow_expired_certificate),
            (
                "custom_validator_config",
                v.custom_validator_config.is_some(),
            ),
            ("only_verify_leaf_cert_crl", v.only_verify_leaf_cert_crl),
            ("max_verify_depth", v.max_verify_depth.is_some()),
            ("suppress_client_ca_list", v.suppress_client_ca_list),
        ],
    );
    let insecure = match TrustChainVerification::try_from(v.trust_chain_verification) {
        Ok(TrustChainVerification::VerifyTrustChain) => false,
        Ok(TrustChainVerification::AcceptUntrusted) if upstream => true,
        Ok(TrustChainVerification::AcceptUntrusted) => {
            cx.err(
                join(at, "trust_chain_verification"),
                "ACCEPT_UNTRUSTED is not supported on a listener by respway (client certificates \
                 are verified against trusted_ca)",
            );
            false
        }
        Err(_) => {
            cx.err(
                join(at, "trust_chain_verification"),
                format!("unknown value {}", v.trust_chain_verification),
            );
            false
        }
    };
    let ca = v
        .trusted_ca
        .as_ref()
        .and_then(|ds| file(cx, &join(at, "trusted_ca"), Some(ds)));
    (ca, insecure)
}

/// A listener filter chain's `transport_socket` at `at`.
#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
pub(super) fn listener(cx: &mut Cx, at: &str, ts: &TransportSocket) -> Option<ListenerTls> {
    let before = cx.count();
    let (typed, d) = typed::<DownstreamTlsContext>(cx, at, ts)?;
    unsupported(
        cx,
        &typed,
        &[
            ("require_sni", d.require_sni.is_some_and(|b| b.value)),
            (
                "disable_stateful_session_resumption",
                d.disable_stateful_session_resumption,
            ),
            ("session_timeout", d.session_timeout.is_some()),
            ("ocsp_staple_policy", d.ocsp_staple_policy != 0),
            (
                "full_scan_certs_on_sni_mismatch",
                d.full_scan_certs_on_sni_mismatch.is_some(),
            ),
            ("prefer_client_ciphers", d.prefer_client_ciphers),
            (
                "session_ticket_keys_type",
                d.session_ticket_keys_type.is_some(),
            ),
        ],
    );
    let c = common(cx, &typed, d.common_tls_context.as_ref(), true);
    let client_ca = c
        .validation
        .as_ref()
        .and_then(|(at, v)| validation(cx, at, v, false).0);
    let require_client_cert = d.require_client_certificate.is_some_and(|b| b.value);
    if require_client_cert && client_ca.is_none() && cx.count() == before {
        cx.err(
            join(&typed, "require_client_certificate"),
            "needs common_tls_context.validation_context.trusted_ca (the CA that signs the \
             client certificates)",
        );
    }
    if cx.count() > before {
        return None;
    }
    let (cert, key) = c.cert?;
    Some(ListenerTls {
        cert,
        key,
        client_ca,
        require_client_cert,
    })
}

/// A cluster's `transport_socket` at `at`.
#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
pub(super) fn cluster(cx: &mut Cx, at: &str, ts: &TransportSocket) -> Option<UpstreamTls> {
    let before = cx.count();
    let (typed, u) = typed::<UpstreamTlsContext>(cx, at, ts)?;
    unsupported(
        cx,
        &typed,
        &[
            ("auto_host_sni", u.auto_host_sni),
            ("auto_sni_san_validation", u.auto_sni_san_validation),
            ("allow_renegotiation", u.allow_renegotiation),
            ("max_session_keys", u.max_session_keys.is_some()),
            ("enforce_rsa_key_usage", u.enforce_rsa_key_usage.is_some()),
        ],
    );
    let c = common(cx, &typed, u.common_tls_context.as_ref(), false);
    let (ca, insecure) = match &c.validation {
        Some((at, v)) => validation(cx, at, v, true),
        None => (None, false),
    };
    let vc = join(&typed, "common_tls_context.validation_context");
    match (&ca, insecure) {
        (None, false) => cx.err(
            join(&vc, "trusted_ca"),
            "required: respway verifies the shards' certificates and has no built-in CA roots \
             (trust_chain_verification: ACCEPT_UNTRUSTED accepts any certificate)",
        ),
        (Some(_), true) => cx.err(
            join(&vc, "trusted_ca"),
            "contradicts trust_chain_verification: ACCEPT_UNTRUSTED (no certificate is verified)",
        ),
        _ => {}
    }
    if cx.count() > before {
        return None;
    }
    let (cert, key) = c.cert.unzip();
    Some(UpstreamTls {
        ca,
        cert,
        key,
        server_name: (!u.sni.is_empty()).then(|| u.sni.clone()),
        insecure_skip_verify: insecure,
    })
}

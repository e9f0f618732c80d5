//! TLS for respway, with rustls (ring provider).
//!
//! - [`ServerTls`] / [`ClientTls`]: a rustls configuration built from PEM files and held in an
//!   [`ArcSwap`], so every new handshake takes the current one without a lock. [`watch`] polls the
//!   files' metadata on a thread of its own and swaps in a new configuration when one changed;
//!   connections already open keep theirs (a rotation drops nothing). A file that fails to load
//!   leaves the last good configuration serving, and is logged.
//! - [`peer_matches`]: whether a peer's certificate is valid for a name (its DNS
//!   subjectAltNames), which the xDS server uses to tie a client certificate to a node id.
//!
//! Loading reads files with `std::fs`: it runs at config load and on the watcher thread, never on
//! an async runtime's thread per connection.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

pub use tokio_rustls::{client, server, TlsAcceptor, TlsConnector};

/// The files of a TLS server (a listener, the ADS server, an admin API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that sign client certificates. Set: clients may present one and it
    /// is verified against these.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client without a valid certificate is refused (mTLS).
    pub require_client_cert: bool,
}

/// The files and checks of a TLS client (to an upstream Redis, to the ADS server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    /// PEM CA certificates the server's certificate must chain to. `None`: none is trusted, so
    /// verification fails unless `insecure_skip_verify` (there are no built-in roots).
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain (mTLS), with `key`.
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// The name the server's certificate must be valid for (and the SNI sent). `None`: the
    /// host the caller connects to.
    pub server_name: Option<String>,
    /// Accept any server certificate (still checks the handshake's signatures). Only by
    /// explicit configuration; logged at warn on every load.
    pub insecure_skip_verify: bool,
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed as PEM.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A certificate file held no certificate.
    #[error("{0}: no PEM certificate in the file")]
    NoCert(PathBuf),
    /// rustls refused the material (key does not match the certificate, bad CA, ...).
    #[error("{what}: {source}")]
    Rustls {
        /// Which part.
        what: String,
        /// rustls's error.
        source: rustls::Error,
    },
    /// The client CA could not build a verifier.
    #[error("{path}: {reason}")]
    Verifier {
        /// The CA file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// `server_name` is not a DNS name or IP address.
    #[error("server_name {0:?} is not a DNS name or IP address")]
    ServerName(String),
    /// A client certificate without its key or the other way round.
    #[error("cert and key must be given together")]
    CertWithoutKey,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_err = |e: rustls::pki_types::pem::Error| TlsError::File {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(file_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(file_err)?;
    if certs.is_empty() {
        return Err(TlsError::NoCert(path.to_owned()));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        path: path.to_owned(),
        reason: format!("no usable private key: {e}"),
    })
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for c in certs(path)? {
        store.add(c).map_err(|e| TlsError::Rustls {
            what: format!("{}: CA certificate", path.display()),
            source: e,
        })?;
    }
    Ok(store)
}

fn rustls_err(what: &str) -> impl FnOnce(rustls::Error) -> TlsError + '_ {
    move |source| TlsError::Rustls {
        what: what.to_owned(),
        source,
    }
}

/// Builds a server configuration from `files`, offering `alpn` protocols (`h2` for gRPC).
pub fn server_config(
    files: &ServerFiles,
    alpn: &[&[u8]],
) -> Result<rustls::ServerConfig, TlsError> {
    let p = provider();
    let builder = rustls::ServerConfig::builder_with_provider(p.clone())
        .with_safe_default_protocol_versions()
        .map_err(rustls_err("protocol versions"))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                p,
            );
            let v = if files.require_client_cert {
                v
            } else {
                v.allow_unauthenticated()
            };
            let v = v.build().map_err(|e| TlsError::Verifier {
                path: ca.clone(),
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(v)
        }
        None => builder.with_no_client_auth(),
    };
    let what = format!("{} with {}", files.cert.display(), files.key.display());
    let mut config = builder
        .with_single_cert(certs(&files.cert)?, key(&files.key)?)
        .map_err(rustls_err(&what))?;
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(config)
}

/// Builds a client configuration from `files`, offering `alpn` protocols.
pub fn client_config(
    files: &ClientFiles,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, TlsError> {
    let p = provider();
    let builder = rustls::ClientConfig::builder_with_provider(p.clone())
        .with_safe_default_protocol_versions()
        .map_err(rustls_err("protocol versions"))?;
    let store = match &files.ca {
        Some(ca) => roots(ca)?,
        None => RootCertStore::empty(),
    };
    let builder = builder.with_root_certificates(store);
    let mut config = match (&files.cert, &files.key) {
        (Some(c), Some(k)) => {
            let what = format!("{} with {}", c.display(), k.display());
            builder
                .with_client_auth_cert(certs(c)?, key(k)?)
                .map_err(rustls_err(&what))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err(TlsError::CertWithoutKey),
    };
    if files.insecure_skip_verify {
        tracing::warn!(
            "TLS insecure_skip_verify is set: the server's certificate is NOT verified; anyone on \
             the path can impersonate the server"
        );
        config
            .dangerous()
            .set_certificate_verifier(Arc::new(NoVerify(p)));
    }
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(config)
}

/// Accepts any server certificate; checks only that the handshake is signed by its key.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// What a file looked like when it was last loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Option<(SystemTime, u64)>);

fn stamp(path: &Path) -> Stamp {
    Stamp(
        std::fs::metadata(path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len()))),
    )
}

/// A configuration of type `T` built from files, swapped when they change.
pub struct Reloading<T> {
    current: ArcSwap<T>,
    files: Vec<PathBuf>,
    stamps: Mutex<Vec<Stamp>>,
    build: Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>,
    what: String,
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<T> Reloading<T> {
    fn new(
        what: String,
        files: Vec<PathBuf>,
        build: Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>,
    ) -> Result<Self, TlsError> {
        let stamps = files.iter().map(|f| stamp(f)).collect();
        let first = build()?;
        Ok(Reloading {
            current: ArcSwap::from_pointee(first),
            files,
            stamps: Mutex::new(stamps),
            build,
            what,
        })
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<T> {
        self.current.load_full()
    }

    /// Rebuilds when a file's modification time or length changed since the last load.
    /// `Ok(true)`: a new configuration is in use. On error the last good one stays.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now: Vec<Stamp> = self.files.iter().map(|f| stamp(f)).collect();
        let mut stamps = self.stamps.lock().unwrap_or_else(|p| p.into_inner());
        if *stamps == now {
            return Ok(false);
        }
        // Remember the new stamps even when the build fails, so a broken file is reported
        // once, not every period; the next change is tried again.
        *stamps = now;
        drop(stamps);
        let next = (self.build)()?;
        self.current.store(Arc::new(next));
        Ok(true)
    }

    /// What this configuration is for (in logs).
    pub fn what(&self) -> &str {
        &self.what
    }
}

/// A TLS server configuration that follows its files.
pub type ServerTls = Reloading<rustls::ServerConfig>;
/// A TLS client configuration that follows its files, with the name servers must match.
pub type ClientTls = Reloading<rustls::ClientConfig>;

impl ServerTls {
    /// Loads `files` (`what` names the user in logs: `listener main`, `xds server`).
    pub fn server(
        what: impl Into<String>,
        files: &ServerFiles,
        alpn: &'static [&'static [u8]],
    ) -> Result<Arc<Self>, TlsError> {
        let mut paths = vec![files.cert.clone(), files.key.clone()];
        paths.extend(files.client_ca.clone());
        let f = files.clone();
        Reloading::new(
            what.into(),
            paths,
            Box::new(move || server_config(&f, alpn)),
        )
        .map(Arc::new)
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current())
    }
}

impl ClientTls {
    /// Loads `files`.
    pub fn client(
        what: impl Into<String>,
        files: &ClientFiles,
        alpn: &'static [&'static [u8]],
    ) -> Result<Arc<Self>, TlsError> {
        if let Some(n) = &files.server_name {
            ServerName::try_from(n.clone()).map_err(|_| TlsError::ServerName(n.clone()))?;
        }
        let mut paths: Vec<PathBuf> = Vec::new();
        paths.extend(files.ca.clone());
        paths.extend(files.cert.clone());
        paths.extend(files.key.clone());
        let f = files.clone();
        Reloading::new(
            what.into(),
            paths,
            Box::new(move || client_config(&f, alpn)),
        )
        .map(Arc::new)
    }

    /// A connector with the current configuration.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.current())
    }
}

/// The name to verify and send as SNI: `configured`, else `host` (a DNS name or IP).
pub fn server_name(configured: Option<&str>, host: &str) -> Result<ServerName<'static>, TlsError> {
    let n = configured.unwrap_or(host);
    ServerName::try_from(n.to_owned()).map_err(|_| TlsError::ServerName(n.to_owned()))
}

/// Polls the files of `tls` every `period` on a thread of its own, and swaps in a new
/// configuration when they change. The thread ends when the last other handle is dropped.
pub fn watch<T: Send + Sync + 'static>(tls: &Arc<Reloading<T>>, period: Duration) {
    let weak: Weak<Reloading<T>> = Arc::downgrade(tls);
    let name = format!("tls-watch {}", tls.what);
    let spawned = std::thread::Builder::new().name(name).spawn(move || loop {
        std::thread::sleep(period);
        let Some(tls) = weak.upgrade() else { return };
        match tls.reload_if_changed() {
            Ok(true) => tracing::info!(what = %tls.what, "TLS certificates reloaded"),
            Ok(false) => {}
            Err(e) => tracing::error!(
                what = %tls.what,
                error = %e,
                "TLS certificates changed but do not load; the previous ones stay in use"
            ),
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the TLS file watcher; certificates will not reload");
    }
}

/// Whether `cert` (a peer's leaf certificate) is valid for `name`: `name` is one of its DNS
/// subjectAltNames (or IP addresses). The chain was verified by the handshake already.
pub fn peer_matches(cert: &CertificateDer<'_>, name: &str) -> bool {
    let Ok(sn) = ServerName::try_from(name) else {
        return false;
    };
    let Ok(ee) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    ee.verify_is_valid_for_subject_name(&sn).is_ok()
}

/// The DNS subjectAltNames of `cert` (a peer's leaf certificate), for logs and status only:
/// decide with [`peer_matches`]. Empty when it has none or does not parse.
pub fn peer_dns_names(cert: &CertificateDer<'_>) -> Vec<String> {
    webpki::EndEntityCert::try_from(cert)
        .map(|ee| ee.valid_dns_names().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Re-exports for callers that name rustls types.
pub use rustls;

//! # respway-tls
//!
//! TLS for respway, with rustls (ring provider): the sidecar's listeners and shard
//! connections, and the management server's ADS and admin ports use it. One module (this
//! file); its parts, grouped by concern:
//!
//! Configurations from files
//! - [`ServerFiles`] / [`ClientFiles`]: the PEM files of a TLS server or client;
//!   [`server_config`] / [`client_config`] build rustls configurations from them, and
//!   [`TlsError`] says which file failed and why.
//! - [`ServerTls`] / [`ClientTls`] ([`Reloading`]): a configuration held in an `ArcSwap`, so
//!   every new handshake takes the current one without a lock. [`watch`] polls the files'
//!   metadata on a thread of its own and swaps in a new configuration when one changed;
//!   connections already open keep theirs (a rotation drops nothing). A file that fails to
//!   load leaves the last good configuration serving, and is logged.
//!
//! Certificate lifetimes
//! - [`Expiry`], [`not_after`], [`utc_date`], [`EXPIRY_WARNING`]: when the certificates in use
//!   stop being valid; a warning when one comes within a week of it and when it has passed,
//!   once per change.
//!
//! Names and identities
//! - [`server_name`]: the name to verify and send as SNI.
//! - [`peer_matches`] / [`peer_dns_names`]: whether a peer's certificate is valid for a name
//!   (its DNS subjectAltNames), which the xDS server uses to tie a client certificate to a
//!   node id.
//! - Re-exported: `rustls` and tokio-rustls's acceptor and connector.
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
    /// The certificate files, each named by its setting (`cert`, `ca`, `client_ca`).
    certificates: Vec<(&'static str, PathBuf)>,
    /// Their expiry as last loaded.
    expiry: Mutex<Vec<Expiry>>,
}

/// When the certificates of one file in use stop being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    /// The setting that names the file: `cert`, `ca` or `client_ca`.
    pub setting: &'static str,
    /// The file.
    pub path: PathBuf,
    /// The earliest notAfter of the certificates in the file (Unix time, seconds).
    pub not_after: i64,
    /// What was last logged about it (so a state is logged once, on load or when it changes).
    state: ExpiryState,
}

/// How close a certificate is to its notAfter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpiryState {
    Valid,
    Soon,
    Expired,
}

/// A certificate expiring within this long is warned about.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn expiry_state(not_after: i64, now: i64) -> ExpiryState {
    let warn = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
    if not_after <= now {
        ExpiryState::Expired
    } else if not_after - now <= warn {
        ExpiryState::Soon
    } else {
        ExpiryState::Valid
    }
}

/// The earliest notAfter (Unix time, seconds) of the certificates in the PEM file `path`:
/// when the chain it holds stops being valid.
///
/// # Errors
/// The file does not load as PEM certificates, or one does not parse as X.509.
pub fn not_after(path: &Path) -> Result<i64, TlsError> {
    certs(path)?
        .iter()
        .map(|der| {
            x509_parser::parse_x509_certificate(der)
                .map(|(_, c)| c.validity().not_after.timestamp())
                .map_err(|e| TlsError::File {
                    path: path.to_owned(),
                    reason: format!("certificate does not parse: {e}"),
                })
        })
        .try_fold(i64::MAX, |min, t| Ok(min.min(t?)))
}

/// `t` (Unix time, seconds) as `YYYY-MM-DDTHH:MM:SSZ` (UTC, proleptic Gregorian).
pub fn utc_date(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    // Civil date from days since 1970-01-01, by 400-year eras of 146,097 days starting on
    // March 1st (so the leap day ends a year).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The expiry of each certificate file of `certificates` (setting, path) of `what`. The files
/// were loaded by rustls already; one whose notAfter cannot be read (a certificate this parser
/// refuses) is logged and left out, never refused.
fn load_expiry(what: &str, certificates: &[(&'static str, PathBuf)]) -> Vec<Expiry> {
    certificates
        .iter()
        .filter_map(|(setting, path)| match not_after(path) {
            Ok(not_after) => Some(Expiry {
                setting,
                path: path.clone(),
                not_after,
                state: ExpiryState::Valid,
            }),
            Err(e) => {
                tracing::warn!(%what, %setting, error = %e, "cannot read the certificate's expiry");
                None
            }
        })
        .collect()
}

impl<T> Reloading<T> {
    fn new(
        what: String,
        files: Vec<PathBuf>,
        certificates: Vec<(&'static str, PathBuf)>,
        build: Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>,
    ) -> Result<Self, TlsError> {
        let stamps = files.iter().map(|f| stamp(f)).collect();
        let first = build()?;
        let expiry = load_expiry(&what, &certificates);
        let r = Reloading {
            current: ArcSwap::from_pointee(first),
            files,
            stamps: Mutex::new(stamps),
            build,
            what,
            certificates,
            expiry: Mutex::new(expiry),
        };
        r.check_expiry();
        Ok(r)
    }

    /// The certificate files in use and when each expires.
    pub fn expiry(&self) -> Vec<Expiry> {
        self.expiry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Logs at warn, once per change of state, a certificate in use that has expired or
    /// expires within [`EXPIRY_WARNING`], with its date. Run at every load and by
    /// [`watch`] every period, so a certificate that nears its date while in use is reported
    /// too.
    pub fn check_expiry(&self) {
        let now = unix_now();
        let mut expiry = self.expiry.lock().unwrap_or_else(|p| p.into_inner());
        for e in expiry.iter_mut() {
            let state = expiry_state(e.not_after, now);
            if state == e.state {
                continue;
            }
            e.state = state;
            let date = utc_date(e.not_after);
            let file = e.path.display();
            match state {
                ExpiryState::Valid => {}
                ExpiryState::Soon => tracing::warn!(
                    what = %self.what,
                    setting = %e.setting,
                    %file,
                    not_after = %date,
                    "TLS certificate expires within 7 days"
                ),
                ExpiryState::Expired => tracing::warn!(
                    what = %self.what,
                    setting = %e.setting,
                    %file,
                    not_after = %date,
                    "TLS certificate has expired"
                ),
            }
        }
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
        let expiry = load_expiry(&self.what, &self.certificates);
        self.current.store(Arc::new(next));
        *self.expiry.lock().unwrap_or_else(|p| p.into_inner()) = expiry;
        self.check_expiry();
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
        let mut certificates = vec![("cert", files.cert.clone())];
        certificates.extend(files.client_ca.clone().map(|p| ("client_ca", p)));
        let f = files.clone();
        Reloading::new(
            what.into(),
            paths,
            certificates,
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
        let mut certificates: Vec<(&'static str, PathBuf)> = Vec::new();
        certificates.extend(files.ca.clone().map(|p| ("ca", p)));
        certificates.extend(files.cert.clone().map(|p| ("cert", p)));
        let f = files.clone();
        Reloading::new(
            what.into(),
            paths,
            certificates,
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
            Ok(false) => tls.check_expiry(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_date(978_307_200), "2001-01-01T00:00:00Z");
        assert_eq!(utc_date(951_782_400 + 3_661), "2000-02-29T01:01:01Z");
        assert_eq!(utc_date(4_102_444_799), "2099-12-31T23:59:59Z");
        assert_eq!(utc_date(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn expiry_states() {
        let day = 86_400;
        assert_eq!(expiry_state(100, 100), ExpiryState::Expired);
        assert_eq!(expiry_state(100 + 6 * day, 100), ExpiryState::Soon);
        assert_eq!(expiry_state(100 + 8 * day, 100), ExpiryState::Valid);
    }
}

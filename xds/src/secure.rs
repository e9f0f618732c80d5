//! The control plane's security: TLS (and mTLS) on the ADS and admin ports, the admin API's
//! credentials, and the rule that secrets reach only the node they are for.
//!
//! - **TLS.** With [`Security::tls`], both ports accept only TLS ([`tls_incoming`]): each
//!   connection's handshake runs in a task of its own, bounded by [`HANDSHAKE_TIMEOUT`] (at most
//!   [`MAX_HANDSHAKES`] at once), and a
//!   failed one (a plaintext client, a wrong CA, an expired or missing client certificate) is
//!   logged with the peer and rustls's reason and never reaches ADS or the admin API. The
//!   certificate files are reloaded when they change ([`respway_tls::watch`]).
//! - **Admin credentials.** `POST /apply` needs `Authorization: Bearer <token>` matching
//!   [`Security::admin_token`] (compared in constant time), or a verified client certificate
//!   valid for one of [`Security::admin_identities`]. Without either it answers 401, also when
//!   the server has no credentials configured at all: changing the served configuration is
//!   never open to anyone who can reach the port.
//! - **Secrets per node.** A node's resources that carry secrets — inline passwords of
//!   `RedisProxy.downstream_auth_password(s)` or of a cluster's `RedisProtocolOptions`, or
//!   inline key material of a transport socket, or ACL users' password digests
//!   ([`carries_secrets`]) — are served only on a
//!   stream whose client certificate is valid for the node id (a DNS subjectAltName equal to
//!   `node.id`, see [`respway_tls::peer_matches`]). Any other stream claiming that node id is
//!   ended with `PERMISSION_DENIED` naming the node, and nothing is sent on it, unless the
//!   operator opted out with [`Security::secrets_to_unauthenticated`]. A certificate proves a
//!   node id, not a zone, so a resource file for zones that carries secrets is refused when it
//!   is loaded ([`crate::cache`]).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::config::core::v3::{DataSource, TransportSocket};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::extensions::filters::network::redis_proxy::v3::{
    RedisProtocolOptions, RedisProxy,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, UpstreamTlsContext,
};
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use respway_tls::rustls::pki_types::CertificateDer;
use respway_tls::{ClientTls, ServerTls};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::pb::respway::v1::ListenerSettings;
use crate::Resources;

/// How long a TLS handshake on the ADS or admin port may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS handshakes in progress at once on one port; more connections wait in the kernel's
/// accept queue, so a connection flood cannot grow memory without bound.
pub const MAX_HANDSHAKES: usize = 256;

/// How often certificate files are checked for changes.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(2);

/// Who may connect to the management server and what they get (module docs).
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// TLS on the ADS and admin ports; `None`: plaintext (loopback use).
    pub tls: Option<Arc<ServerTls>>,
    /// The bearer token `POST /apply` accepts.
    pub admin_token: Option<String>,
    /// Names (DNS subjectAltNames) a client certificate may be valid for to use
    /// `POST /apply` without a token.
    pub admin_identities: Vec<String>,
    /// Serve resources carrying secrets to streams that did not authenticate as their node
    /// (no client certificate, or one for another name). Off by default.
    pub secrets_to_unauthenticated: bool,
}

impl Security {
    /// Whether a stream with client certificate `cert` may get node `node`'s secrets.
    pub fn may_get_secrets(&self, node: &str, cert: Option<&CertificateDer<'_>>) -> bool {
        self.secrets_to_unauthenticated || cert.is_some_and(|c| respway_tls::peer_matches(c, node))
    }

    /// Whether an admin request may change the served configuration: its bearer token (the
    /// `Authorization` header's value) or its connection's client certificate.
    pub fn may_apply(
        &self,
        authorization: Option<&[u8]>,
        cert: Option<&CertificateDer<'_>>,
    ) -> bool {
        let token_ok = match (&self.admin_token, authorization) {
            (Some(want), Some(h)) => h
                .strip_prefix(b"Bearer ")
                // The ACL's digest compare: constant time, and blind to the length too.
                .is_some_and(|got| {
                    respway_filters::acl::password_matches(
                        &[respway_filters::acl::sha256(want.as_bytes())],
                        got,
                    )
                }),
            _ => false,
        };
        let cert_ok = cert.is_some_and(|c| {
            self.admin_identities
                .iter()
                .any(|n| respway_tls::peer_matches(c, n))
        });
        token_ok || cert_ok
    }

    /// What a refused admin request is told.
    pub fn refusal(&self) -> String {
        if self.admin_token.is_none() && self.admin_identities.is_empty() {
            "POST /apply needs credentials, and this server has none configured: start \
             respway-xds with --admin-token-file (or RESPWAY_XDS_ADMIN_TOKEN_FILE) or \
             --admin-identity with TLS client certificates"
                .to_string()
        } else {
            "POST /apply needs credentials: Authorization: Bearer <token>, or a client \
             certificate for an admin identity"
                .to_string()
        }
    }
}

/// What the server knows of a connection's peer (tonic puts it in each request's extensions).
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The peer's address.
    pub remote: Option<SocketAddr>,
    /// The client certificate the handshake verified (leaf), if one was presented.
    pub cert: Option<CertificateDer<'static>>,
}

/// A TLS connection accepted by [`tls_incoming`].
pub struct TlsConn {
    inner: respway_tls::server::TlsStream<TcpStream>,
    info: PeerInfo,
    /// The port's connection slot this connection holds, when the port has a cap.
    _slot: Option<OwnedSemaphorePermit>,
}

impl TlsConn {
    /// Its peer.
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The pause after failed accepts (`EMFILE`, `ENFILE`, `ENOBUFS`...): 10 ms, doubling up to
/// 1 s while they go on, back to 10 ms after an accept succeeds. Without it a listener out of
/// file descriptors would spin on `accept`.
#[derive(Debug)]
pub(crate) struct AcceptBackoff {
    next: Duration,
}

const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            next: ACCEPT_BACKOFF_MIN,
        }
    }
}

impl AcceptBackoff {
    /// Counts the failure in `errors`, logs it, and pauses.
    pub(crate) async fn failed(&mut self, port: &str, e: &std::io::Error, errors: &AtomicU64) {
        let n = errors.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(port, error = %e, failed_accepts = n, pause = ?self.next, "accept failed; pausing");
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(ACCEPT_BACKOFF_MAX);
    }

    pub(crate) fn succeeded(&mut self) {
        self.next = ACCEPT_BACKOFF_MIN;
    }
}

/// Accepts plaintext TCP connections on `listener` (`TCP_NODELAY` set); failed accepts are
/// counted in `accept_errors` and paused after ([`AcceptBackoff`]), where tonic's own
/// `TcpIncoming` retries at once (a spin while out of file descriptors).
pub fn tcp_incoming(
    listener: TcpListener,
    what: &'static str,
    accept_errors: Arc<AtomicU64>,
) -> mpsc::Receiver<std::io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::default();
        loop {
            let stream = tokio::select! {
                a = listener.accept() => match a {
                    Ok((s, _)) => {
                        backoff.succeeded();
                        s
                    }
                    Err(e) => {
                        backoff.failed(what, &e, &accept_errors).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let _ = stream.set_nodelay(true);
            if tx.send(Ok(stream)).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// Accepts TCP connections on `listener` and completes their TLS handshakes with `tls`'s
/// current configuration, each in a task of its own (a slow or broken client delays no other).
/// `what` names the port in logs. The receiver yields each connection that completed one.
/// With `slots`, a connection holds one of them from before its accept until it is dropped
/// (at most that many open at once; more wait in the kernel's accept queue). Failed accepts
/// are counted in `accept_errors` and paused after ([`AcceptBackoff`]).
pub fn tls_incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    what: &'static str,
    slots: Option<Arc<Semaphore>>,
    accept_errors: Arc<AtomicU64>,
) -> mpsc::Receiver<std::io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::default();
        loop {
            let conn_slot = match &slots {
                Some(s) => {
                    let Ok(p) = s.clone().acquire_owned().await else {
                        return;
                    };
                    Some(p)
                }
                None => None,
            };
            let Ok(slot) = handshakes.clone().acquire_owned().await else {
                return;
            };
            let (stream, peer) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => {
                        backoff.succeeded();
                        a
                    }
                    Err(e) => {
                        backoff.failed(what, &e, &accept_errors).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            let _ = stream.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                drop(slot);
                match done {
                    Ok(Ok(s)) => {
                        let cert = s
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| c.clone().into_owned());
                        let conn = TlsConn {
                            inner: s,
                            info: PeerInfo {
                                remote: Some(peer),
                                cert,
                            },
                            _slot: conn_slot,
                        };
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(port = what, %peer, error = %e, "TLS handshake failed; connection closed")
                    }
                    Err(_) => tracing::warn!(
                        port = what,
                        %peer,
                        "TLS handshake not done within {HANDSHAKE_TIMEOUT:?}; connection closed"
                    ),
                }
            });
        }
    });
    rx
}

/// A client TLS configuration compared by identity (for configs that derive `PartialEq`).
#[derive(Clone)]
pub struct ClientTlsRef {
    /// The configuration.
    pub tls: Arc<ClientTls>,
    /// The name the server's certificate must be valid for; `None`: the host connected to.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for ClientTlsRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTlsRef")
            .field("tls", &self.tls.what())
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl PartialEq for ClientTlsRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.tls, &other.tls) && self.server_name == other.server_name
    }
}

impl Eq for ClientTlsRef {}

impl ClientTlsRef {
    /// Connects to `host:port` and completes a TLS handshake, verifying the server's
    /// certificate for `server_name` (else `host`).
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
    ) -> std::io::Result<respway_tls::client::TlsStream<TcpStream>> {
        let name = respway_tls::server_name(self.server_name.as_deref(), host)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let tcp = TcpStream::connect((host, port)).await?;
        let _ = tcp.set_nodelay(true);
        self.tls.connector().connect(name, tcp).await
    }
}

// === secrets in resources ===

/// Whether `r` carries secrets: an inline password or key (module docs). File and
/// environment-variable sources name where a secret is, which is not one.
pub fn carries_secrets(r: &Resources) -> bool {
    r.listeners.iter().any(listener_secrets) || r.clusters.iter().any(cluster_secrets)
}

/// The resources of `r` that carry secrets, as `listener "name"` / `cluster "name"`.
pub fn secret_holders(r: &Resources) -> Vec<String> {
    let listeners = r
        .listeners
        .iter()
        .filter(|l| listener_secrets(l))
        .map(|l| format!("listener {:?}", l.name));
    let clusters = r
        .clusters
        .iter()
        .filter(|c| cluster_secrets(c))
        .map(|c| format!("cluster {:?}", c.name));
    listeners.chain(clusters).collect()
}

fn inline(ds: &DataSource) -> bool {
    matches!(
        ds.specifier,
        Some(Specifier::InlineString(_)) | Some(Specifier::InlineBytes(_))
    )
}

fn unpack<T: Message + Name + Default>(any: &Any) -> Option<T> {
    (any.type_url.ends_with(&T::full_name()))
        .then(|| T::decode(any.value.as_slice()).ok())
        .flatten()
}

fn tls_context_secrets(c: &CommonTlsContext) -> bool {
    c.tls_certificates.iter().any(|t| {
        t.private_key.as_ref().is_some_and(inline) || t.password.as_ref().is_some_and(inline)
    })
}

fn transport_secrets(t: Option<&TransportSocket>) -> bool {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType as T;
    let Some(Some(T::TypedConfig(any))) = t.map(|t| &t.config_type) else {
        return false;
    };
    if let Some(d) = unpack::<DownstreamTlsContext>(any) {
        return d
            .common_tls_context
            .as_ref()
            .is_some_and(tls_context_secrets);
    }
    if let Some(u) = unpack::<UpstreamTlsContext>(any) {
        return u
            .common_tls_context
            .as_ref()
            .is_some_and(tls_context_secrets);
    }
    false
}

// `downstream_auth_password` is deprecated in Envoy but still accepted, so still a secret.
#[allow(deprecated)]
fn listener_secrets(l: &Listener) -> bool {
    l.filter_chains.iter().any(|fc| {
        transport_secrets(fc.transport_socket.as_ref())
            || fc.filters.iter().any(|f| match &f.config_type {
                Some(ConfigType::TypedConfig(any)) => {
                    unpack::<RedisProxy>(any).is_some_and(|r| {
                        r.downstream_auth_password.as_ref().is_some_and(inline)
                            || r.downstream_auth_passwords.iter().any(inline)
                    }) || unpack::<ListenerSettings>(any).is_some_and(|s| {
                        // Password digests are as good as passwords to whoever guesses
                        // offline; ACL rules alone are not secret.
                        s.users.iter().any(|u| !u.password_sha256.is_empty())
                    })
                }
                _ => false,
            })
    })
}

fn cluster_secrets(c: &Cluster) -> bool {
    transport_secrets(c.transport_socket.as_ref())
        || c.typed_extension_protocol_options.values().any(|any| {
            unpack::<RedisProtocolOptions>(any).is_some_and(|o| {
                o.auth_password.as_ref().is_some_and(inline)
                    || o.credentials
                        .iter()
                        .any(|c| c.auth_password.as_ref().is_some_and(inline))
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(yaml: &str) -> bool {
        carries_secrets(&crate::parse_yaml(yaml).expect("valid"))
    }

    #[test]
    fn inline_passwords_and_password_digests_are_secrets_rules_and_files_are_not() {
        let base = |listener: &str, cluster: &str| {
            format!(
                "listeners:\n  - name: l\n    address: 127.0.0.1:7000\n    routes: {{ catch_all: c }}\n{listener}clusters:\n  - name: c\n{cluster}    shards:\n      - endpoints: [ {{ address: \"127.0.0.1:7001\" }} ]\n"
            )
        };
        assert!(!secrets(&base("", "")));
        assert!(secrets(&base("    downstream_auth_password: pw\n", "")));
        assert!(secrets(&base("", "    auth: { password: pw }\n")));
        assert!(secrets(&base(
            "    users:\n      - { name: app, password: pw, rules: [\"~app:*\", \"+@read\"] }\n",
            ""
        )));
        assert!(!secrets(&base(
            "    users:\n      - { name: app, nopass: true, rules: [\"~app:*\", \"+@read\"] }\n",
            ""
        )));
    }
}

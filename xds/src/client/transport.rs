//! The ADS client's transport: the gRPC channel (TLS, keepalive), and what a failed TLS
//! handshake tells the log.

use super::*;

/// The first TLS error one connection to a management server met, in words (such as the
/// alert of a server that requires a client certificate). Written only when a read or write
/// fails, read once per connection attempt: its lock is never contended.
#[derive(Debug, Clone, Default)]
pub(super) struct TlsNote(Arc<Mutex<Option<String>>>);

impl TlsNote {
    /// Keeps what `e` says about TLS, if it is a TLS error and none was kept before.
    pub(super) fn record(&self, e: &std::io::Error) {
        let Some(text) = tls_reason(e) else {
            return;
        };
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(text);
    }

    pub(super) fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// The rustls error `e` carries, if any.
pub(super) fn rustls_error(e: &std::io::Error) -> Option<&respway_tls::rustls::Error> {
    e.get_ref()?.downcast_ref::<respway_tls::rustls::Error>()
}

/// `e` in words when it is a TLS error: the alert a server sent, with what to check.
pub(super) fn tls_reason(e: &std::io::Error) -> Option<String> {
    use respway_tls::rustls::{AlertDescription as A, Error as TlsError};
    Some(match rustls_error(e)? {
        TlsError::AlertReceived(alert) => {
            let what = match alert {
                A::CertificateRequired => "certificate required (the server requires a client certificate: set xds.tls.cert and xds.tls.key)",
                A::BadCertificate => "bad certificate (the server refused the client certificate)",
                A::UnknownCA => "unknown CA (the server does not trust the CA of the client certificate)",
                A::CertificateExpired => "certificate expired (the client certificate is out of its validity period)",
                A::CertificateRevoked => "certificate revoked",
                A::CertificateUnknown => "certificate unknown (the server refused the client certificate)",
                A::AccessDenied => "access denied",
                A::HandshakeFailure => "handshake failure (no TLS version, cipher or protocol in common)",
                A::NoApplicationProtocol => "no application protocol (the server does not offer h2)",
                _ => return Some(format!("TLS alert from the server: {alert:?}")),
            };
            format!("TLS alert from the server: {what}")
        }
        // Said as rustls says it, so that an error chain already saying it is not repeated.
        other => other.to_string(),
    })
}

/// A TLS connection to a management server: first the bytes read after the handshake
/// (`first`, see `connect_channel`), then the stream; its TLS errors are noted in
/// [`TlsNote`] (HTTP/2 may report the connection's end only as "connection closed").
pub(super) struct Watched<S> {
    pub(super) inner: S,
    pub(super) note: TlsNote,
    pub(super) first: Vec<u8>,
    /// How much of `first` was read.
    pub(super) taken: usize,
}

impl<S> Watched<S> {
    pub(super) fn noted<T>(&self, r: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(e)) = &r {
            self.note.record(e);
        }
        r
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.taken < self.first.len() {
            let n = (self.first.len() - self.taken).min(buf.remaining());
            let at = self.taken;
            buf.put_slice(&self.first[at..at + n]);
            self.taken += n;
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.noted(r)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.noted(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.noted(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.noted(r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A gRPC channel to management server `server` (`HOST:PORT`, `http://HOST:PORT`, or
/// `https://HOST:PORT`), over TLS when `tls` is given (the scheme does not choose: the
/// configuration does), with the keepalive the ADS client uses.
///
/// # Errors
/// The address is not a URI, or connecting (TCP or the TLS handshake) failed; the error's
/// sources say why.
pub async fn channel(
    server: &str,
    tls: Option<&ClientTlsRef>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let keepalive = (KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT);
    connect_channel(server, tls, keepalive, TlsNote::default()).await
}

/// [`channel`] with the keepalive `(interval, timeout)`, recording the first TLS error of
/// the connection in `note`.
pub(super) async fn connect_channel(
    server: &str,
    tls: Option<&ClientTlsRef>,
    (interval, timeout): (Duration, Duration),
    note: TlsNote,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    // With TLS the handshake is the connector's (below); tonic is given the address as
    // `http://` so that it adds none of its own.
    let authority = server
        .strip_prefix("https://")
        .or_else(|| server.strip_prefix("http://"))
        .unwrap_or(server);
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(interval)
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(true);
    match tls {
        None => endpoint.connect().await,
        Some(tls) => {
            let tls = tls.clone();
            let connector = tower::service_fn(move |uri: tonic::codegen::http::Uri| {
                let tls = tls.clone();
                let note = note.clone();
                async move {
                    let host = uri.host().unwrap_or_default();
                    let host = host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string();
                    let port = uri.port_u16().unwrap_or(443);
                    let mut stream = tls
                        .connect(&host, port)
                        .await
                        .inspect_err(|e| note.record(e))?;
                    // A server that refuses the client (no or a wrong client certificate,
                    // TLS 1.3) says so in an alert right after the handshake and closes. Were
                    // the HTTP/2 preface written first, the server would close with it unread
                    // (a reset that drops the alert) or HTTP/2 would report only "broken
                    // pipe" or "connection closed". So the server's first bytes (its
                    // SETTINGS, or the alert) are read now, briefly, and handed to HTTP/2
                    // first; an alert fails the connection attempt with its reason.
                    let mut first = vec![0u8; FIRST_BYTES];
                    let read = tokio::time::timeout(FIRST_BYTES_WAIT, stream.read(&mut first));
                    let n = match read.await {
                        Ok(Ok(n)) => n,
                        Ok(Err(e)) => {
                            note.record(&e);
                            return Err(e);
                        }
                        Err(_) => 0,
                    };
                    first.truncate(n);
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Watched {
                        inner: stream,
                        note,
                        first,
                        taken: 0,
                    }))
                }
            });
            endpoint.connect_with_connector(connector).await
        }
    }
}

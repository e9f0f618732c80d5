//! The management server's admin HTTP endpoint (HTTP/1.1 and HTTP/2, hyper); its client, used by
//! `respway-xds apply` and `respway-xds status`, is [`client`] (re-exported here).
//!
//! - `GET /status`: [`ServerStatus`](crate::server::ServerStatus) as JSON: the served version, each resource file's state,
//!   the merged snapshots' errors and the node classes served nothing, per node id: zone,
//!   connected, the sidecar's admin endpoint (`admin`, from its `node.metadata`), and per type
//!   URL the last version sent, the last version the node ACKed, and its last NACK (version,
//!   nonce, error); the latest refused ADS streams (by peer and certificate); this port's
//!   connections and both ports' failed accepts.
//! - `POST /apply?name=FILE.yaml` with a YAML body: validates it as resource file `FILE.yaml`
//!   (alone and merged with the directory), writes it into the directory atomically (temp file
//!   and rename) and loads it at once. `200 {"version": N}` with the served version, or
//!   `400 {"errors": [...]}` and nothing written. It needs credentials (a bearer token or an
//!   admin client certificate, see [`crate::secure`]); without them `401 {"errors": [...]}`.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;

use respway_tls::rustls::pki_types::CertificateDer;

use crate::cache::ApplyError;
use crate::secure::{tls_incoming, AcceptBackoff};
use crate::server::Server;

pub mod client;
pub mod metrics;

pub use crate::server::admin_state::{
    AdminLimits, AdminStats, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS,
};
pub use client::{apply, fetch_status, AdminAuth, AdminError};

/// The largest `POST /apply` body accepted.
const MAX_APPLY_BODY: usize = 16 << 20;

/// The body of a successful `POST /apply`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The served snapshot version after the file was loaded.
    pub version: u64,
}

/// The body of a refused `POST /apply` (and of other errors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// Every error, each naming the file, resource and field.
    pub errors: Vec<String>,
}

/// Serves the admin endpoint on `listener` until `stop` changes or its sender is dropped;
/// over TLS when the server's [`Security`](crate::secure::Security) has it. At most
/// [`AdminLimits::max_connections`] connections are open at once.
pub async fn serve(listener: TcpListener, server: Server, mut stop: watch::Receiver<bool>) {
    let state = server.admin_state().clone();
    if let Some(tls) = server.security().tls.clone() {
        let mut incoming = tls_incoming(
            listener,
            tls,
            "admin",
            Some(state.slots.clone()),
            state.accept_errors.clone(),
        );
        loop {
            let conn = tokio::select! {
                c = incoming.recv() => match c {
                    Some(Ok(c)) => c,
                    Some(Err(_)) => continue,
                    None => return,
                },
                _ = stop.changed() => return,
            };
            let peer = conn.peer().clone();
            let remote = peer.remote;
            tokio::spawn(serve_connection(
                conn,
                remote,
                peer.cert,
                server.clone(),
                stop.clone(),
                None,
            ));
        }
    }
    let mut backoff = AcceptBackoff::default();
    loop {
        let slot = tokio::select! {
            s = state.slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => return,
            },
            _ = stop.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    backoff.succeeded();
                    a
                }
                Err(e) => {
                    backoff.failed("admin", &e, &state.accept_errors).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        tokio::spawn(serve_connection(
            stream,
            Some(peer),
            None,
            server.clone(),
            stop.clone(),
            Some(slot),
        ));
    }
}

/// Serves HTTP/1.1 or HTTP/2 on one connection; `cert` is its verified client certificate.
/// `slot` (or, over TLS, the connection itself) holds one of the port's connection slots.
async fn serve_connection<IO>(
    io: IO,
    peer: Option<SocketAddr>,
    cert: Option<CertificateDer<'static>>,
    server: Server,
    mut stop: watch::Receiver<bool>,
    slot: Option<OwnedSemaphorePermit>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _slot = slot;
    let _open = InFlight::new(&server.admin_state().open);
    let timeout = server.admin_state().limits.idle_timeout;
    let cert = Arc::new(cert);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let busy = in_flight.clone();
    let service = hyper::service::service_fn(move |req| {
        let guard = InFlight::new(&busy);
        let (server, cert) = (server.clone(), cert.clone());
        async move {
            let r = handle(server, cert, req).await;
            drop(guard);
            r
        }
    });
    // HTTP/1.1 or HTTP/2 (h2 by ALPN over TLS, or prior knowledge), by the client's preface.
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeout);
    let io = IdleTimeout::new(io, timeout, in_flight);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r {
            tracing::debug!(?peer, error = %e, "admin connection closed");
        },
        _ = stop.changed() => {}
    }
}

/// Counts a request in progress (or an open connection) while it lives.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(n: &Arc<AtomicUsize>) -> InFlight {
        n.fetch_add(1, Ordering::Relaxed);
        InFlight(n.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection that fails with `TimedOut` once no byte went either way for `timeout` while
/// no request was in progress.
struct IdleTimeout<IO> {
    io: IO,
    timeout: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    in_flight: Arc<AtomicUsize>,
}

impl<IO> IdleTimeout<IO> {
    fn new(io: IO, timeout: Duration, in_flight: Arc<AtomicUsize>) -> Self {
        IdleTimeout {
            io,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            in_flight,
        }
    }

    fn active(&mut self) {
        let next = tokio::time::Instant::now() + self.timeout;
        self.deadline.as_mut().reset(next);
    }

    /// Called when the connection is pending: whether it has been idle too long.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.deadline.as_mut().poll(cx).is_pending() {
            return false;
        }
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            // A request is being handled (e.g. a large apply): not idle.
            self.active();
            let _ = self.deadline.as_mut().poll(cx);
            return false;
        }
        true
    }
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "admin connection idle")
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleTimeout<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    this.active();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_shutdown(cx) {
            Poll::Pending if this.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> hyper::Response<Full<Bytes>> {
    let mut text = serde_json::to_vec_pretty(body).unwrap_or_default();
    text.push(b'\n');
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)))
        .unwrap_or_default()
}

fn refused(status: StatusCode, errors: Vec<String>) -> hyper::Response<Full<Bytes>> {
    json(status, &Refused { errors })
}

async fn handle(
    server: Server,
    cert: Arc<Option<CertificateDer<'static>>>,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    Ok(match (req.method().clone(), path.as_str()) {
        (Method::GET, "/status") => json(StatusCode::OK, &server.status()),
        (Method::GET, "/metrics") => hyper::Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(metrics::render(&server))))
            .unwrap_or_default(),
        (Method::POST, "/apply") => {
            let security = server.security();
            let authorization = req
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if !security.may_apply(authorization, cert.as_ref().as_ref()) {
                tracing::warn!("POST /apply refused: no valid credentials");
                return Ok(refused(StatusCode::UNAUTHORIZED, vec![security.refusal()]));
            }
            let Some(name) = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("name="))
                .map(str::to_string)
            else {
                return Ok(refused(
                    StatusCode::BAD_REQUEST,
                    vec!["POST /apply needs ?name=FILE.yaml".to_string()],
                ));
            };
            let body = match Limited::new(req.into_body(), MAX_APPLY_BODY)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return Ok(refused(
                        StatusCode::BAD_REQUEST,
                        vec![format!("cannot read the body: {e}")],
                    ))
                }
            };
            let Ok(text) = String::from_utf8(body.to_vec()) else {
                return Ok(refused(
                    StatusCode::BAD_REQUEST,
                    vec!["the body is not UTF-8".to_string()],
                ));
            };
            let cache = server.cache().clone();
            let result = tokio::task::spawn_blocking(move || cache.apply(&name, &text)).await;
            match result {
                Ok(Ok(version)) => json(StatusCode::OK, &Applied { version }),
                Ok(Err(ApplyError::Invalid(errors))) => refused(StatusCode::BAD_REQUEST, errors),
                Ok(Err(e @ ApplyError::Name(_))) => {
                    refused(StatusCode::BAD_REQUEST, vec![e.to_string()])
                }
                Ok(Err(e @ ApplyError::Io(_))) => {
                    refused(StatusCode::INTERNAL_SERVER_ERROR, vec![e.to_string()])
                }
                Ok(Err(e @ ApplyError::Conflict(_))) => {
                    refused(StatusCode::CONFLICT, vec![e.to_string()])
                }
                Ok(Err(e @ ApplyError::Unavailable(_))) => {
                    refused(StatusCode::SERVICE_UNAVAILABLE, vec![e.to_string()])
                }
                Err(e) => refused(StatusCode::INTERNAL_SERVER_ERROR, vec![e.to_string()]),
            }
        }
        _ => refused(
            StatusCode::NOT_FOUND,
            vec!["endpoints: GET /status, POST /apply?name=FILE.yaml".to_string()],
        ),
    })
}

//! The management server's admin HTTP endpoint (HTTP/1.1 and HTTP/2, hyper); its client, used by
//! `respway-xds apply` and `respway-xds status`, is [`client`] (re-exported here).
//!
//! - `GET /status`: [`ServerStatus`](crate::server::ServerStatus) as JSON: the served version, each resource file's state,
//!   the merged snapshot's errors, and per node id: zone, connected, and per type URL the last
//!   version sent, the last version the node ACKed, and its last NACK (version, nonce, error).
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
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;

use std::net::SocketAddr;
use std::sync::Arc;

use respway_tls::rustls::pki_types::CertificateDer;

use crate::cache::ApplyError;
use crate::secure::tls_incoming;
use crate::server::Server;

pub mod client;
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
/// over TLS when the server's [`Security`](crate::secure::Security) has it.
pub async fn serve(listener: TcpListener, server: Server, mut stop: watch::Receiver<bool>) {
    if let Some(tls) = server.security().tls.clone() {
        let mut incoming = tls_incoming(listener, tls, "admin");
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
            ));
        }
    }
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
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
        ));
    }
}

/// Serves HTTP/1.1 or HTTP/2 on one connection; `cert` is its verified client certificate.
async fn serve_connection<IO>(
    io: IO,
    peer: Option<SocketAddr>,
    cert: Option<CertificateDer<'static>>,
    server: Server,
    mut stop: watch::Receiver<bool>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let cert = Arc::new(cert);
    let service = hyper::service::service_fn(move |req| handle(server.clone(), cert.clone(), req));
    // HTTP/1.1 or HTTP/2 (h2 by ALPN over TLS, or prior knowledge), by the client's preface.
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r {
            tracing::debug!(?peer, error = %e, "admin connection error");
        },
        _ = stop.changed() => {}
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
                Err(e) => refused(StatusCode::INTERNAL_SERVER_ERROR, vec![e.to_string()]),
            }
        }
        _ => refused(
            StatusCode::NOT_FOUND,
            vec!["endpoints: GET /status, POST /apply?name=FILE.yaml".to_string()],
        ),
    })
}

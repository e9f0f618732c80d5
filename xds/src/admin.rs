//! The management server's admin HTTP endpoint (HTTP/1.1, hyper) and a small client for it,
//! used by `respway-xds apply` and `respway-xds status`.
//!
//! - `GET /status`: [`ServerStatus`] as JSON: the served version, each resource file's state,
//!   the merged snapshot's errors, and per node id: zone, connected, and per type URL the last
//!   version sent, the last version the node ACKed, and its last NACK (version, nonce, error).
//! - `POST /apply?name=FILE.yaml` with a YAML body: validates it as resource file `FILE.yaml`
//!   (alone and merged with the directory), writes it into the directory atomically (temp file
//!   and rename) and loads it at once. `200 {"version": N}` with the served version, or
//!   `400 {"errors": [...]}` and nothing written.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::cache::ApplyError;
use crate::server::{Server, ServerStatus};

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

/// Serves the admin endpoint on `listener` until `stop` changes or its sender is dropped.
pub async fn serve(listener: TcpListener, server: Server, mut stop: watch::Receiver<bool>) {
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
        let server = server.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(server.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "admin connection error");
                },
                _ = stop.changed() => {}
            }
        });
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
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    Ok(match (req.method().clone(), path.as_str()) {
        (Method::GET, "/status") => json(StatusCode::OK, &server.status()),
        (Method::POST, "/apply") => {
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

// === client ===

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The endpoint could not be reached or spoke no HTTP.
    #[error("admin endpoint {addr}: {reason}")]
    Transport {
        /// The address asked.
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// The server refused the request; every error it gave.
    #[error("{}", .0.join("\n"))]
    Refused(Vec<String>),
}

/// Fetches `GET /status` from the admin endpoint at `addr` (`HOST:PORT`).
///
/// # Errors
/// The endpoint is unreachable or answered with an error.
pub async fn fetch_status(addr: &str) -> Result<ServerStatus, AdminError> {
    let (status, body) = request(addr, Method::GET, "/status", Bytes::new()).await?;
    decode(addr, status, &body)
}

/// Sends `text` as resource file `name` with `POST /apply` to the admin endpoint at `addr`;
/// returns the served version afterwards.
///
/// # Errors
/// The endpoint is unreachable, or refused the file (every error, naming file and field).
pub async fn apply(addr: &str, name: &str, text: &str) -> Result<u64, AdminError> {
    let path = format!("/apply?name={name}");
    let (status, body) = request(addr, Method::POST, &path, Bytes::from(text.to_string())).await?;
    decode::<Applied>(addr, status, &body).map(|a| a.version)
}

fn decode<T: for<'de> Deserialize<'de>>(
    addr: &str,
    status: StatusCode,
    body: &[u8],
) -> Result<T, AdminError> {
    let transport = |reason: String| AdminError::Transport {
        addr: addr.to_string(),
        reason,
    };
    if status.is_success() {
        return serde_json::from_slice(body).map_err(|e| transport(format!("bad JSON: {e}")));
    }
    match serde_json::from_slice::<Refused>(body) {
        Ok(r) => Err(AdminError::Refused(r.errors)),
        Err(_) => Err(transport(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(body)
        ))),
    }
}

async fn request(
    addr: &str,
    method: Method,
    path: &str,
    body: Bytes,
) -> Result<(StatusCode, Bytes), AdminError> {
    let transport = |reason: String| AdminError::Transport {
        addr: addr.to_string(),
        reason,
    };
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| transport(e.to_string()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| transport(e.to_string()))?;
    let conn = tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/yaml")
        .body(Full::new(body))
        .map_err(|e| transport(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| transport(e.to_string()))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| transport(e.to_string()))?
        .to_bytes();
    conn.abort();
    Ok((status, body))
}

//! The client of the admin endpoint: `respway-xds apply` / `status`. (The perf harness has its
//! own, `perf/src/xds_admin.rs`, so that it does not build this crate.)

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;

use super::{Applied, Refused};
use crate::secure::ClientTlsRef;
use crate::server::ServerStatus;

/// The admin client's credentials and transport.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminAuth {
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// TLS to the admin endpoint (with a client certificate when the config has one).
    pub tls: Option<ClientTlsRef>,
}

impl AdminAuth {
    /// A bearer token over plaintext.
    pub fn token(token: impl Into<String>) -> AdminAuth {
        AdminAuth {
            token: Some(token.into()),
            tls: None,
        }
    }
}

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
    /// The server could not do it now (`503`: its shared store is not reachable); every
    /// error it gave. Worth trying again.
    #[error("{}", .0.join("\n"))]
    Unavailable(Vec<String>),
}

/// Fetches `GET /status` from the admin endpoint at `addr` (`HOST:PORT`).
///
/// # Errors
/// The endpoint is unreachable or answered with an error.
pub async fn fetch_status(addr: &str, auth: &AdminAuth) -> Result<ServerStatus, AdminError> {
    let (status, body) = request(addr, auth, Method::GET, "/status", Bytes::new()).await?;
    decode(addr, status, &body)
}

/// Sends `text` as resource file `name` with `POST /apply` to the admin endpoint at `addr`;
/// returns the served version afterwards.
///
/// # Errors
/// The endpoint is unreachable, or refused the file (every error, naming file and field).
pub async fn apply(
    addr: &str,
    auth: &AdminAuth,
    name: &str,
    text: &str,
) -> Result<u64, AdminError> {
    let path = format!("/apply?name={name}");
    let body = Bytes::from(text.to_string());
    let (status, body) = request(addr, auth, Method::POST, &path, body).await?;
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
        Ok(r) if status == StatusCode::SERVICE_UNAVAILABLE => {
            Err(AdminError::Unavailable(r.errors))
        }
        Ok(r) => Err(AdminError::Refused(r.errors)),
        Err(_) => Err(transport(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(body)
        ))),
    }
}

async fn request(
    addr: &str,
    auth: &AdminAuth,
    method: Method,
    path: &str,
    body: Bytes,
) -> Result<(StatusCode, Bytes), AdminError> {
    let transport = |reason: String| AdminError::Transport {
        addr: addr.to_string(),
        reason,
    };
    let (mut sender, conn) = match &auth.tls {
        None => {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| transport(e.to_string()))?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| transport(e.to_string()))?;
            (sender, tokio::spawn(async move { conn.await.map(|_| ()) }))
        }
        Some(tls) => {
            let (host, port) = split_host_port(addr)
                .ok_or_else(|| transport("the address must be HOST:PORT".to_string()))?;
            let stream = tls
                .connect(host, port)
                .await
                .map_err(|e| transport(format!("TLS: {e}")))?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| transport(e.to_string()))?;
            (sender, tokio::spawn(async move { conn.await.map(|_| ()) }))
        }
    };
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr)
        .header("content-type", "application/yaml");
    if let Some(t) = &auth.token {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
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

/// `HOST:PORT` (also `[v6]:PORT`) split at its last colon.
pub(crate) fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host, port.parse().ok()?))
}

//! A client of the `respway-xds` admin endpoint, for the `respway-xds` targets' config pushes:
//! `GET /status` and `POST /apply?name=FILE` with a bearer token, over plain HTTP/1.1 on
//! loopback.
//!
//! It is written here, on hyper's HTTP/1.1 client, rather than taken from the `respway-xds`
//! crate: that crate is the management server (tonic, the Envoy protos, the ADS cache), and
//! the harness needs two requests and the few status fields it waits on. Unknown fields of
//! the server's JSON are ignored, so the server may report more than is read here.
//!
//! Every request is bounded: a connect timeout, read and write timeouts, and a cap on the size
//! of the answer. The callers (setup and the push thread of a run) are plain threads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;

use crate::Error;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one request may take, connect included.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a status of many nodes is a few hundred KiB).
const MAX_RESPONSE: usize = 16 << 20;

/// The admin endpoint's bearer token. Its `Debug` does not show it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AdminToken(String);

impl AdminToken {
    /// A token, as written to the server's `--admin-token-file`.
    pub fn new(token: impl Into<String>) -> AdminToken {
        AdminToken(token.into())
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

/// What the harness reads of `GET /status`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Status {
    /// The served snapshot version (0: nothing loaded).
    pub version: u64,
    /// Errors of the merged snapshots at the last scan.
    #[serde(default)]
    pub errors: Vec<String>,
    /// Every node seen since the server started.
    #[serde(default)]
    pub nodes: Vec<NodeStatus>,
}

/// One node (by id) in [`Status`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NodeStatus {
    /// `node.id`.
    pub id: String,
    /// Whether an ADS stream of this node is open.
    pub connected: bool,
    /// Per type URL.
    #[serde(default)]
    pub types: BTreeMap<String, TypeStatus>,
}

/// One node's state for one resource type.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct TypeStatus {
    /// The `version_info` of the last response sent.
    pub sent: Option<String>,
    /// The version the node last ACKed.
    pub acked: Option<String>,
    /// The last NACK, until the node ACKs the latest version sent.
    pub nack: Option<Nack>,
}

/// A rejected response.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Nack {
    /// What the node found wrong.
    pub message: String,
}

#[derive(Deserialize)]
struct Applied {
    version: u64,
}

#[derive(Deserialize)]
struct Refused {
    errors: Vec<String>,
}

/// `GET /status` from the admin endpoint at `admin`.
///
/// # Errors
/// The endpoint is unreachable, answered with an error, or not with a status.
pub fn status(admin: SocketAddr, token: &AdminToken) -> Result<Status, Error> {
    let (code, body) = request(admin, token, "GET", "/status", b"")?;
    decode(admin, code, &body)
}

/// Sends `text` as resource file `name` (`POST /apply?name=NAME`); returns the served version
/// afterwards.
///
/// # Errors
/// The endpoint is unreachable, or refused the file (every error it gave, one per line).
pub fn apply(admin: SocketAddr, token: &AdminToken, name: &str, text: &str) -> Result<u64, Error> {
    let path = format!("/apply?name={name}");
    let (code, body) = request(admin, token, "POST", &path, text.as_bytes())?;
    decode::<Applied>(admin, code, &body).map(|a| a.version)
}

fn decode<T: for<'de> Deserialize<'de>>(
    admin: SocketAddr,
    code: u16,
    body: &[u8],
) -> Result<T, Error> {
    if (200..300).contains(&code) {
        return serde_json::from_slice(body)
            .map_err(|e| Error::Run(format!("admin endpoint {admin}: bad JSON: {e}")));
    }
    match serde_json::from_slice::<Refused>(body) {
        Ok(r) => Err(Error::Run(r.errors.join("\n"))),
        Err(_) => Err(Error::Run(format!(
            "admin endpoint {admin}: HTTP {code}: {}",
            String::from_utf8_lossy(body)
        ))),
    }
}

/// One request on a fresh connection, over hyper's HTTP/1.1 client on a current-thread
/// runtime of its own (the callers are plain threads); the status code and the body, at most
/// [`MAX_RESPONSE`] bytes of it.
fn request(
    admin: SocketAddr,
    token: &AdminToken,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), Error> {
    let fail = |what: String| Error::Run(format!("admin endpoint {admin}: {what}"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, admin.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/yaml");
    if !token.0.is_empty() {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {}", token.0));
    }
    let req = req
        .body(Full::new(Bytes::copy_from_slice(body)))
        .map_err(|e| fail(e.to_string()))?;
    let exchange = async {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(admin))
            .await
            .map_err(|_| "connect: timed out".to_string())?
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let conn = tokio::spawn(conn);
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let code = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| format!("read: {e}"))?
            .to_bytes();
        conn.abort();
        Ok::<_, String>((code, body.to_vec()))
    };
    rt.block_on(async { tokio::time::timeout(IO_TIMEOUT, exchange).await })
        .map_err(|_| fail("no answer in time".to_string()))?
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `request` makes of `raw`, answered (then the connection closed) by a one-shot
    /// server on loopback.
    fn parse_response(raw: &'static [u8]) -> Result<(u16, Vec<u8>), Error> {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = c.read(&mut head);
            let _ = c.write_all(raw);
        });
        let r = request(addr, &AdminToken::new("t"), "GET", "/status", b"");
        server.join().unwrap();
        r
    }

    #[test]
    fn responses_framed_every_way_give_their_body() {
        let sized = b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{\"version\":3}";
        assert_eq!(
            parse_response(sized).unwrap(),
            (200, b"{\"version\":3}".to_vec())
        );
        let chunked = b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n\
                        4\r\n{\"er\r\n9;x=1\r\nrors\":[]}\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (400, b"{\"errors\":[]}".to_vec())
        );
        let to_close = b"HTTP/1.0 401 Unauthorized\r\n\r\nno";
        assert_eq!(parse_response(to_close).unwrap(), (401, b"no".to_vec()));
    }

    #[test]
    fn broken_responses_are_errors_not_panics() {
        for raw in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\n",
            b"SSH-2.0\r\n\r\n",
            b"HTTP/1.1 2x0 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nff\r\nab",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab",
        ] {
            assert!(
                parse_response(raw).is_err(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn the_token_is_not_shown_by_debug() {
        let t = AdminToken::new("s3cret");
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn refusals_carry_every_error_of_the_server() {
        let admin: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let e = decode::<Applied>(admin, 400, br#"{"errors":["a: bad","b: worse"]}"#)
            .err()
            .unwrap();
        assert_eq!(e.to_string(), "a: bad\nb: worse");
        let e = decode::<Applied>(admin, 502, b"gateway").err().unwrap();
        assert_eq!(
            e.to_string(),
            "admin endpoint 127.0.0.1:1: HTTP 502: gateway"
        );
    }
}

//! A client of the `respway-xds` admin endpoint, for the `respway-xds` targets' config pushes:
//! `GET /status` and `POST /apply?name=FILE` with a bearer token, over plain HTTP/1.1 on
//! loopback.
//!
//! It is written here, with `std`'s blocking sockets, rather than taken from the `respway-xds`
//! crate: that crate is the management server (tonic, the Envoy protos, the ADS cache), and
//! the harness needs two requests and the few status fields it waits on. Unknown fields of
//! the server's JSON are ignored, so the server may report more than is read here.
//!
//! Every request is bounded: a connect timeout, read and write timeouts, and a cap on the size
//! of the answer. The callers (setup and the push thread of a run) are plain threads.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::Deserialize;

use crate::Error;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one read or write may wait.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (a status of many nodes is a few hundred KiB).
const MAX_RESPONSE: u64 = 16 << 20;

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

/// One request on a fresh connection (`Connection: close`); the status code and the body.
fn request(
    admin: SocketAddr,
    token: &AdminToken,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), Error> {
    let fail = |what: String| Error::Run(format!("admin endpoint {admin}: {what}"));
    let mut s = TcpStream::connect_timeout(&admin, CONNECT_TIMEOUT)
        .map_err(|e| fail(format!("connect: {e}")))?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {admin}\r\ncontent-type: application/yaml\r\n\
         content-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if !token.0.is_empty() {
        head.push_str(&format!("authorization: Bearer {}\r\n", token.0));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .map_err(|e| fail(format!("write: {e}")))?;
    let mut raw = Vec::new();
    (&mut s)
        .take(MAX_RESPONSE + 1)
        .read_to_end(&mut raw)
        .map_err(|e| fail(format!("read: {e}")))?;
    if raw.len() as u64 > MAX_RESPONSE {
        return Err(fail(format!("answer larger than {MAX_RESPONSE} bytes")));
    }
    parse_response(&raw).map_err(fail)
}

/// An HTTP/1.1 response read to the end of the connection: its status code and body (framed
/// by `content-length`, chunked, or the end of the connection).
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete HTTP response")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "response head is not UTF-8")?;
    let rest = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let code = status
        .strip_prefix("HTTP/1.")
        .and_then(|s| s.get(2..5))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad content-length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        rest.get(..n)
            .ok_or_else(|| format!("body cut short: {} of {n} bytes", rest.len()))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok((code, body))
}

/// A chunked body's data.
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line cut short")?;
        let line = std::str::from_utf8(&rest[..eol]).map_err(|_| "bad chunk size line")?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(hex, 16).map_err(|_| format!("bad chunk size {hex:?}"))?;
        rest = &rest[eol + 2..];
        if n == 0 {
            return Ok(body);
        }
        let data = rest.get(..n).ok_or("chunk cut short")?;
        body.extend_from_slice(data);
        rest = rest.get(n + 2..).ok_or("chunk cut short")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! What copy mode asks each sidecar's admin endpoint, which xDS ACKs do not carry: its copies
//! still queued or in flight to a cluster (`GET /mirror`), and the keys its copies wrote since
//! a cursor (`GET /mirror/keys`). A sidecar announces its admin address to the server in its
//! node metadata (`respway_admin`), and `GET /status` shows it per node (`admin`).
//!
//! Plain HTTP/1.0 over TCP, one request per connection, bounded in time: the admin endpoint is
//! respway's own, and nothing here needs more.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// How long one admin request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes of one answer: a record holds at most 1,000,000 keys.
const MAX_ANSWER: u64 = 1 << 30;

/// `GET path` on `addr`: the status code and the body.
///
/// # Errors
/// The sidecar cannot be reached, or its answer is not HTTP.
pub async fn get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let fetch = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("sidecar admin {addr}: {e}"))?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("sidecar admin {addr}: {e}"))?;
        let mut buf = Vec::new();
        s.take(MAX_ANSWER)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| format!("sidecar admin {addr}: {e}"))?;
        Ok::<_, String>(buf)
    };
    let buf = tokio::time::timeout(TIMEOUT, fetch)
        .await
        .map_err(|_| format!("sidecar admin {addr}: no answer in {TIMEOUT:?}"))??;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("sidecar admin {addr}: not an HTTP answer"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("sidecar admin {addr}: not an HTTP answer"))?;
    Ok((code, body.to_string()))
}

/// One cluster's line of `GET /mirror`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MirrorLine {
    /// Copies queued.
    pub mirrored: u64,
    /// Copies answered without an error.
    pub applied: u64,
    /// Copies that failed.
    pub failed: u64,
    /// The record's id, when the cluster has one.
    pub record: Option<String>,
    /// Whether the record overflowed or missed a keyless write.
    pub unusable: bool,
}

impl MirrorLine {
    /// Copies still queued or in flight.
    pub fn in_flight(&self) -> u64 {
        self.mirrored.saturating_sub(self.applied + self.failed)
    }
}

/// `cluster`'s line in a `GET /mirror` body (a cluster with no line: no copy ever).
pub fn parse_mirror(body: &str, cluster: &str) -> MirrorLine {
    let mut m = MirrorLine::default();
    for line in body.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("cluster") || words.next() != Some(cluster) {
            continue;
        }
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                continue;
            };
            let n = || v.parse::<u64>().unwrap_or(0);
            match k {
                "mirrored" => m.mirrored = n(),
                "applied" => m.applied = n(),
                "failed" => m.failed = n(),
                "record" => m.record = Some(v.to_string()),
                "overflowed" | "incomplete" if v != "0" => m.unusable = true,
                _ => {}
            }
        }
    }
    m
}

/// `cluster`'s line of the sidecar at `admin`.
///
/// # Errors
/// The sidecar cannot be reached or did not answer 200.
pub async fn mirror(admin: &str, cluster: &str) -> Result<MirrorLine, String> {
    match get(admin, "/mirror").await? {
        (200, body) => Ok(parse_mirror(&body, cluster)),
        (code, body) => Err(format!(
            "sidecar admin {admin}: GET /mirror answered {code}: {}",
            body.trim()
        )),
    }
}

/// The keys a record lists since a cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The keys (hex) and the cursor they go up to.
    Keys {
        /// The record's id.
        id: String,
        /// The cursor after them.
        cursor: String,
        /// The keys, hex-encoded.
        keys: Vec<String>,
    },
    /// The record cannot say (replaced, overflowed, a keyless write, none): compare all.
    Unusable(String),
}

/// The keys `cluster`'s record at `admin` lists since `since` (all without).
///
/// # Errors
/// The sidecar cannot be reached.
pub async fn written(admin: &str, cluster: &str, since: Option<&str>) -> Result<Written, String> {
    let mut path = format!("/mirror/keys?cluster={}", encode(cluster));
    if let Some(c) = since {
        path.push_str(&format!("&since={}", encode(c)));
    }
    let (code, body) = get(admin, &path).await?;
    if code != 200 {
        return Ok(Written::Unusable(format!(
            "sidecar admin {admin}: {code} {}",
            body.trim()
        )));
    }
    let mut lines = body.lines();
    let head: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    // record ID cursor CURSOR overflowed 0|1 incomplete 0|1
    match head.as_slice() {
        ["record", id, "cursor", cursor, "overflowed", o, "incomplete", i] => {
            if *o != "0" || *i != "0" {
                return Ok(Written::Unusable(format!(
                    "sidecar admin {admin}: the record of {cluster} {}",
                    if *o != "0" {
                        "overflowed"
                    } else {
                        "missed a write without keys"
                    }
                )));
            }
            Ok(Written::Keys {
                id: (*id).to_string(),
                cursor: (*cursor).to_string(),
                keys: lines
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        }
        _ => Ok(Written::Unusable(format!(
            "sidecar admin {admin}: GET /mirror/keys answered no record line"
        ))),
    }
}

/// Most admin requests in flight at once: many sidecars are asked together, not one by one.
const CONCURRENT: usize = 64;

/// `f(item)` for every `(id, item)`, at most [`CONCURRENT`] at once; the results by id, in
/// `items`' order.
pub async fn each<A, T, F, Fut>(items: Vec<(String, A)>, f: F) -> Vec<(String, T)>
where
    A: Send + 'static,
    T: Send + 'static,
    F: Fn(A) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    let mut set = tokio::task::JoinSet::new();
    let n = items.len();
    for (i, (id, item)) in items.into_iter().enumerate() {
        let fut = f(item);
        let permits = permits.clone();
        set.spawn(async move {
            let _permit = permits.acquire_owned().await;
            (i, id, fut.await)
        });
    }
    let mut out: Vec<Option<(String, T)>> = (0..n).map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        if let Ok((i, id, t)) = r {
            out[i] = Some((id, t));
        }
    }
    out.into_iter().flatten().collect()
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~:".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_line_gives_the_copies_in_flight_and_the_record() {
        let body = "cluster old mirrored=3 applied=3 failed=0 dropped=0\n\
                    cluster new mirrored=10 applied=7 failed=1 dropped=2 record=00000000000000ab \
                    keys=5 overflowed=0 incomplete=0 cursor=00000000000000ab:4.1\n";
        let m = parse_mirror(body, "new");
        assert_eq!(m.in_flight(), 2);
        assert_eq!(m.record.as_deref(), Some("00000000000000ab"));
        assert!(!m.unusable);
        assert_eq!(parse_mirror(body, "old").in_flight(), 0);
        assert_eq!(parse_mirror(body, "other"), MirrorLine::default());
        let over = parse_mirror(
            "cluster new mirrored=1 applied=1 failed=0 dropped=0 record=1 keys=1 overflowed=1 \
             incomplete=0 cursor=1:1",
            "new",
        );
        assert!(over.unusable);
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("ab:1.2"), "ab:1.2");
        assert_eq!(encode("a b&c"), "a%20b%26c");
    }
}

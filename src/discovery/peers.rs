//! Whether the sidecars a listener's cluster emulation announces are alive, so that the
//! emulated cluster's map gives slots only to sidecars that answer.
//!
//! A listener with `cluster_emulation: { announce: [...] }` (two addresses or more) makes the
//! announced sidecars the nodes of its emulated cluster, the 16384 slots split evenly over
//! them. A sidecar that dies would keep its share of the map, and a cluster-aware client would
//! keep sending those slots' commands to it (redis-py fails them; others fall back). So every
//! sidecar checks the others:
//!
//! - One task per announced address (of every listener with two or more, each address once),
//!   on the health-check thread ([`crate::discovery::health`]'s runtime), reconciled with each
//!   new snapshot. A listener's own configured address is not checked (it is this process).
//! - Every [`EVERY`] a plain RESP `PING` over TCP, answered within [`TIMEOUT`] (connect,
//!   write and first reply line). **Any RESP reply** proves the sidecar alive: `+PONG`, and as
//!   well `-NOAUTH` from a listener with a password, or `-ERR this port speaks TLS` from a TLS
//!   listener (which a TLS listener counts in its `respway_tls_plaintext_refused_total`). The
//!   connection is kept while the peer answers `+PONG`, and opened again after anything else.
//! - A sidecar starts live. [`OUT_AFTER`] failures in a row (a refused connect, a reset, no
//!   reply in time, bytes that are not RESP) take it out of the map; [`BACK_AFTER`] passes in
//!   a row put it back. A live sidecar that had answered before and fails a check is checked
//!   again after [`RECHECK`] instead of [`EVERY`], so a killed sidecar leaves the map within
//!   `EVERY + 2 × RECHECK` (1.5 s) of its death (more when its checks time out instead of
//!   being refused: at most `EVERY + 3 × TIMEOUT + 2 × RECHECK`, 3 s). One that never answered
//!   since its task started (a sidecar still starting) is checked every [`EVERY`]: three
//!   seconds to come up before it is taken out.
//! - Each change is logged (a warning when a sidecar goes out, info when it is back), counted,
//!   and shown in `/metrics` (`respway_cluster_emulation_node_up`,
//!   `respway_cluster_emulation_node_changes_total`) and the admin `/clusters`.
//!
//! The verdict of each address is a [`PeerCheck`] of atomics. A worker building its parts for
//! a snapshot takes the listener's [`Announced`] (its addresses in order, each with its check)
//! once; a session reads one atomic per announced node when it answers `CLUSTER ...` or a
//! keyspace-wide command, never a lock. What the map is with some nodes out is
//! `session::cluster_emulation`'s to say.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use respway_filters::model::{Config, Listener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::discovery::Handle;
use crate::stats::PeerStatus;

/// How often a sidecar is checked.
pub(crate) const EVERY: Duration = Duration::from_secs(1);
/// How soon a live sidecar that had answered is checked again after a failed check.
pub(crate) const RECHECK: Duration = Duration::from_millis(250);
/// How long one check waits for the connect and the reply.
pub(crate) const TIMEOUT: Duration = Duration::from_millis(500);
/// Failed checks in a row that take a sidecar out of the map.
pub(crate) const OUT_AFTER: u32 = 3;
/// Passed checks in a row that put it back.
pub(crate) const BACK_AFTER: u32 = 2;

/// What the checks of one announced address found.
#[derive(Debug)]
pub(crate) struct PeerCheck {
    /// In the map (starts `true`): what the sessions read.
    up: AtomicBool,
    /// Checks in a row that went against the state (failures while up, passes while out).
    streak: AtomicU32,
    /// Times it went out or came back.
    changes: AtomicU64,
    /// A task checks it (a listener's own address is not checked).
    checked: AtomicBool,
    /// For the admin endpoint: the last failure and when the state last changed.
    detail: Mutex<Detail>,
}

#[derive(Debug, Default)]
struct Detail {
    last_error: String,
    since: Option<SystemTime>,
}

impl Default for PeerCheck {
    fn default() -> Self {
        PeerCheck {
            up: AtomicBool::new(true),
            streak: AtomicU32::new(0),
            changes: AtomicU64::new(0),
            checked: AtomicBool::new(false),
            detail: Mutex::default(),
        }
    }
}

impl PeerCheck {
    /// Whether the sidecar is in the map.
    #[inline]
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One failed check of `addr`.
    fn failed(&self, addr: SocketAddr, error: String) {
        tracing::debug!(node = %addr, error = %error, "cluster emulation: check failed");
        if !self.is_up() {
            self.streak.store(0, Ordering::Relaxed);
            self.detail().last_error = error;
            return;
        }
        let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= OUT_AFTER {
            self.streak.store(0, Ordering::Relaxed);
            self.up.store(false, Ordering::Relaxed);
            self.changes.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                node = %addr,
                error = %error,
                "cluster emulation: an announced sidecar failed {OUT_AFTER} checks in a row: \
                 out of the map (its slots are split over the live nodes)"
            );
            let mut d = self.detail();
            d.since = Some(SystemTime::now());
            d.last_error = error;
        } else {
            self.detail().last_error = error;
        }
    }

    /// One passed check of `addr`.
    fn passed(&self, addr: SocketAddr) {
        if self.is_up() {
            self.streak.store(0, Ordering::Relaxed);
            return;
        }
        let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= BACK_AFTER {
            self.streak.store(0, Ordering::Relaxed);
            self.up.store(true, Ordering::Relaxed);
            self.changes.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                node = %addr,
                "cluster emulation: an announced sidecar answered {BACK_AFTER} checks in a \
                 row: back in the map"
            );
            self.detail().since = Some(SystemTime::now());
        }
    }

    /// Takes it out as three failed checks would (unit tests of the map).
    #[cfg(test)]
    pub(crate) fn take_out_for_test(&self) {
        self.up.store(false, Ordering::Relaxed);
    }

    /// What the admin endpoint and the metrics show.
    pub(crate) fn status(&self) -> PeerStatus {
        let d = self.detail();
        PeerStatus {
            up: self.is_up(),
            checked: self.checked.load(Ordering::Relaxed),
            changes: self.changes.load(Ordering::Relaxed),
            last_error: d.last_error.clone(),
            since: d.since,
        }
    }
}

/// One listener's announced sidecars, in the order announced, each with its check: what a
/// session reads to know which nodes are in the map.
#[derive(Debug)]
pub(crate) struct Announced {
    pub(crate) nodes: Box<[(SocketAddr, Arc<PeerCheck>)]>,
}

/// Every announced address's check, process-wide.
#[derive(Debug, Default)]
pub(crate) struct Peers {
    map: Mutex<HashMap<SocketAddr, Arc<PeerCheck>>>,
}

impl Peers {
    /// The check of `addr` (created live when new). Taken when a worker builds its parts and
    /// when the checker reconciles, never per request; entries are kept when an address
    /// leaves the configuration (a worker on an older snapshot may hold one).
    pub(crate) fn get(&self, addr: SocketAddr) -> Arc<PeerCheck> {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(addr).or_default().clone()
    }

    /// `listener`'s announced sidecars with their checks; `None` without cluster emulation
    /// or with fewer than two announced (one node owns every slot whatever its state).
    pub(crate) fn announced(&self, listener: &Listener) -> Option<Arc<Announced>> {
        let announce = &listener.cluster_emulation.as_ref()?.announce;
        if announce.len() < 2 {
            return None;
        }
        Some(Arc::new(Announced {
            nodes: announce.iter().map(|&a| (a, self.get(a))).collect(),
        }))
    }

    /// Per listener with announced sidecars and per address, in order, its status:
    /// `([listener, address], status)`.
    pub(crate) fn statuses(&self, config: &Config) -> Vec<([String; 2], PeerStatus)> {
        let mut out = Vec::new();
        for l in &config.listeners {
            let Some(a) = self.announced(l) else { continue };
            for (addr, check) in a.nodes.iter() {
                out.push(([l.name.clone(), addr.to_string()], check.status()));
            }
        }
        out
    }
}

/// The addresses `config`'s listeners announce that are checked: those of listeners with two
/// or more, but the listener's own configured address.
fn targets(config: &Config) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for l in &config.listeners {
        let Some(e) = &l.cluster_emulation else {
            continue;
        };
        if e.announce.len() < 2 {
            continue;
        }
        for &a in &e.announce {
            if a != l.address && !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// Starts and stops check tasks to match the current snapshot (on the health-check thread's
/// runtime, at each reconcile there). A task that stays keeps running; a new one starts from
/// the address's last state.
pub(crate) fn reconcile(
    shared: &Handle,
    tasks: &mut HashMap<SocketAddr, tokio::task::JoinHandle<()>>,
) {
    let want = targets(shared.serving().config());
    tasks.retain(|addr, t| {
        let keep = want.contains(addr);
        if !keep {
            t.abort();
            shared
                .peers()
                .get(*addr)
                .checked
                .store(false, Ordering::Relaxed);
        }
        keep
    });
    for addr in want {
        if tasks.contains_key(&addr) {
            continue;
        }
        let check = shared.peers().get(addr);
        check.checked.store(true, Ordering::Relaxed);
        tasks.insert(addr, tokio::spawn(check_loop(check, addr)));
    }
}

/// Checks `addr` until aborted.
async fn check_loop(check: Arc<PeerCheck>, addr: SocketAddr) {
    let mut conn: Option<TcpStream> = None;
    // It answered since this task started: a failure then is checked again sooner.
    let mut answered = false;
    loop {
        let started = Instant::now();
        let result = match tokio::time::timeout(TIMEOUT, probe(&mut conn, addr)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no reply within {TIMEOUT:?}")),
        };
        let next = match result {
            Ok(()) => {
                answered = true;
                check.passed(addr);
                EVERY
            }
            Err(e) => {
                conn = None;
                check.failed(addr, e);
                if answered && check.is_up() {
                    RECHECK
                } else {
                    EVERY
                }
            }
        };
        tokio::time::sleep_until(started + next).await;
    }
}

/// One check: `PING` on the kept connection, else (or when that one fails: the peer may have
/// closed it) on a new one.
async fn probe(conn: &mut Option<TcpStream>, addr: SocketAddr) -> Result<(), String> {
    if let Some(c) = conn.as_mut() {
        match ping(c).await {
            Ok(keep) => {
                if !keep {
                    *conn = None;
                }
                return Ok(());
            }
            Err(_) => *conn = None,
        }
    }
    let mut c = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = c.set_nodelay(true);
    if ping(&mut c).await? {
        *conn = Some(c);
    }
    Ok(())
}

/// Sends `PING` and reads the first line of the reply: `Ok(true)` for `+PONG` (the connection
/// can be used again), `Ok(false)` for any other RESP reply (alive, but the connection is not
/// kept), `Err` when it closes, fails or answers with bytes that are not RESP.
async fn ping(c: &mut TcpStream) -> Result<bool, String> {
    c.write_all(b"*1\r\n$4\r\nPING\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 128];
    let mut n = 0;
    while !buf[..n].windows(2).any(|w| w == b"\r\n") && n < buf.len() {
        let r = c
            .read(&mut buf[n..])
            .await
            .map_err(|e| format!("read: {e}"))?;
        if r == 0 {
            return Err("closed without a reply".into());
        }
        n += r;
    }
    match buf[0] {
        b'+' if buf[..n].starts_with(b"+PONG\r\n") => Ok(true),
        b'+' | b'-' | b':' | b'$' | b'*' | b'_' | b',' | b'#' | b'(' | b'!' | b'=' | b'%'
        | b'~' | b'>' | b'|' => Ok(false),
        _ => Err(format!(
            "not a RESP reply: {:?}",
            String::from_utf8_lossy(&buf[..n.min(32)])
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn peers_go_out_after_three_failures_and_back_after_two_passes() {
        let c = PeerCheck::default();
        let a = addr("10.0.0.6:6379");
        assert!(c.is_up(), "starts live");
        c.failed(a, "refused".into());
        c.failed(a, "refused".into());
        c.passed(a);
        c.failed(a, "refused".into());
        c.failed(a, "refused".into());
        assert!(c.is_up(), "failures in a row only count");
        c.failed(a, "refused".into());
        assert!(!c.is_up());
        assert_eq!(c.status().changes, 1);
        assert_eq!(c.status().last_error, "refused");
        c.passed(a);
        c.failed(a, "reset".into());
        c.passed(a);
        assert!(!c.is_up(), "passes in a row only count");
        c.passed(a);
        assert!(c.is_up());
        assert_eq!(c.status().changes, 2);
    }

    #[test]
    fn a_listener_checks_the_other_announced_addresses() {
        let yaml = "listeners:\n  - name: a\n    address: 127.0.0.1:7001\n    cluster_emulation: { announce: [\"127.0.0.1:7001\", \"127.0.0.1:7002\", \"127.0.0.1:7003\"] }\n    routes: { catch_all: c }\n  - name: b\n    address: 127.0.0.1:7101\n    cluster_emulation: { announce: [\"127.0.0.1:7002\"] }\n    routes: { catch_all: c }\nclusters:\n  - name: c\n    shards:\n      - endpoints: [ { address: \"127.0.0.1:6379\" } ]\n";
        let config =
            respway_xds::translate(&respway_xds::parse_yaml(yaml).expect("yaml")).expect("config");
        assert_eq!(
            targets(&config),
            vec![addr("127.0.0.1:7002"), addr("127.0.0.1:7003")]
        );
        let peers = Peers::default();
        let a = peers
            .announced(&config.listeners[0])
            .expect("three announced");
        assert_eq!(a.nodes.len(), 3);
        assert!(Arc::ptr_eq(
            &a.nodes[1].1,
            &peers.get(addr("127.0.0.1:7002"))
        ));
        assert!(peers.announced(&config.listeners[1]).is_none(), "one node");
    }

    /// Any RESP reply proves a sidecar alive; a closed connection or other bytes do not.
    #[tokio::test]
    async fn any_resp_reply_counts() {
        for (reply, want) in [
            (&b"+PONG\r\n"[..], Ok(true)),
            (b"-NOAUTH Authentication required.\r\n", Ok(false)),
            (b"-ERR this port speaks TLS\r\n", Ok(false)),
            (b"\x15\x03\x03\x00\x02\x02\x32", Err(())),
            (b"", Err(())),
        ] {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = l.local_addr().unwrap();
            let server = tokio::spawn(async move {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 14];
                s.read_exact(&mut b).await.unwrap();
                s.write_all(reply).await.unwrap();
            });
            let mut c = TcpStream::connect(at).await.unwrap();
            let got = ping(&mut c).await.map_err(|_| ());
            assert_eq!(got, want, "{reply:?}");
            server.await.unwrap();
        }
    }
}

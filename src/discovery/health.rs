//! Active health checks (Envoy's Redis health checker), for clusters with a `health_check`.
//!
//! One thread with its own current-thread runtime runs one task per endpoint of every such
//! cluster of the current snapshot. Each task, every `interval`, on one connection of its own
//! (opened and prepared as the pools open theirs: TLS, `AUTH`, `PING`), sends `PING` (or
//! `EXISTS drain_key`) and `ROLE` (and, to a configured replica, `INFO replication`), and
//! waits at most `timeout` for the replies. A timeout, a
//! connection error or an error reply (`-LOADING`, `-MASTERDOWN`, anything) is a failure, and
//! the connection is opened again for the next check.
//!
//! - An endpoint starts healthy; `unhealthy_threshold` failures in a row take it out of
//!   rotation, `healthy_threshold` passes in a row put it back. A replica that says it is not
//!   in sync ([`crate::upstream::check::in_sync`]) fails the check.
//! - `EXISTS drain_key` answering non-zero takes it out at once ("draining"); it is back as
//!   soon as the key is gone.
//! - A configured primary whose `ROLE` says `slave` is "demoted": writes to its shard are
//!   refused by the upstream (never sent) until it answers `master` again or the
//!   configuration names another primary; reads are served as before. A replica answering
//!   `master` is logged.
//!
//! The state of each endpoint is an [`EndpointCheck`] of atomics, shared with the workers'
//! endpoint handles (looked up once, when a worker builds its parts for a snapshot): the zone
//! layer reads it with one atomic load per replica it considers, the upstream with one per
//! write. When the snapshot changes, the tasks are reconciled: endpoints that left stop, new
//! ones start, those that stay keep their state.
//!
//! The same thread runs the checks of the sidecars a listener's cluster emulation announces
//! (`discovery::peers`), reconciled at the same moments.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use respway_filters::model::{HealthCheck, Role};
use respway_filters::resp::Frame;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::discovery::Handle;
use crate::lifecycle::Stop;
use crate::upstream::check::{EndpointCheck, DRAINING, HEALTHY, UNHEALTHY};
use crate::upstream::{Control, EndpointConfig};

/// What the checks write beside the verdict the upstream reads.
impl EndpointCheck {
    /// The configuration names this endpoint with `role` (at every reconcile that starts
    /// its task): a demotion seen while it was configured as a primary no longer applies once
    /// it is configured as a replica.
    fn configured_as(&self, role: Role) {
        if role == Role::Replica && self.demoted.swap(false, Ordering::Relaxed) {
            self.transitions.fetch_add(1, Ordering::Relaxed);
        }
        if role == Role::Primary {
            self.promoted.store(false, Ordering::Relaxed);
        }
    }

    /// One failed check.
    fn failed(&self, hc: &HealthCheck, label: &str, error: String) {
        self.detail().last_error = error;
        let state = self.state.load(Ordering::Relaxed);
        if state == UNHEALTHY {
            self.streak.store(0, Ordering::Relaxed);
            return;
        }
        let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= u64::from(hc.unhealthy_threshold) {
            self.streak.store(0, Ordering::Relaxed);
            self.set_state(UNHEALTHY, label);
        }
    }

    /// One passed check; `draining` when the drain key exists.
    fn passed(&self, hc: &HealthCheck, label: &str, draining: bool) {
        let state = self.state.load(Ordering::Relaxed);
        if state == UNHEALTHY {
            let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
            if n < u64::from(hc.healthy_threshold) {
                return;
            }
        }
        self.streak.store(0, Ordering::Relaxed);
        self.set_state(if draining { DRAINING } else { HEALTHY }, label);
    }

    /// What `ROLE` said, against the configured role.
    fn role(&self, configured: Role, label: &str, said: Said) {
        match (configured, said) {
            (Role::Primary, Said::Replica(of)) => {
                let changed = {
                    let mut d = self.detail();
                    let changed = d.replica_of != of || !self.demoted();
                    d.replica_of = of.clone();
                    changed
                };
                if !self.demoted.swap(true, Ordering::Relaxed) || changed {
                    if changed {
                        self.transitions.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::warn!(
                        endpoint = %label,
                        replica_of = %of,
                        "health check: the configured primary answers ROLE as a replica; \
                         writes to its shard are refused"
                    );
                }
            }
            (Role::Primary, Said::Primary) => {
                if self.demoted.swap(false, Ordering::Relaxed) {
                    self.transitions.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        endpoint = %label,
                        "health check: the configured primary answers ROLE as primary again"
                    );
                }
            }
            (Role::Replica, Said::Primary) => {
                if !self.promoted.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        endpoint = %label,
                        "health check: a configured replica answers ROLE as a primary"
                    );
                }
            }
            (Role::Replica, _) => {
                self.promoted.store(false, Ordering::Relaxed);
            }
            (Role::Primary, Said::Other) => {}
        }
    }
}

/// Every endpoint's check state, by cluster name and address.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    map: Mutex<HashMap<(String, SocketAddr), Arc<EndpointCheck>>>,
}

impl Checks {
    /// The state of `address` in `cluster` (created healthy when new). Taken when a worker
    /// builds its parts, never per request. Entries are kept when an endpoint leaves: a
    /// worker still serving an older snapshot may hold one, and an endpoint that comes back
    /// is checked again from its last state.
    pub(crate) fn get(&self, cluster: &str, address: SocketAddr) -> Arc<EndpointCheck> {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        m.entry((cluster.to_string(), address)).or_default().clone()
    }
}

/// What `ROLE` said.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    Primary,
    /// A replica of `HOST:PORT`.
    Replica(String),
    Other,
}

/// What one task checks; a change restarts the task (its state is kept).
#[derive(Debug, Clone, PartialEq)]
struct Target {
    cfg: EndpointConfig,
    hc: HealthCheck,
    role: Role,
}

struct Task {
    target: Target,
    handle: tokio::task::JoinHandle<()>,
}

/// Starts the checker thread; it ends when `stop` leaves [`Stop::Run`].
pub(crate) fn start(shared: Handle, stop: watch::Receiver<Stop>) -> std::io::Result<()> {
    crate::lifecycle::side_thread("respway-health", move || run(shared, stop))?;
    Ok(())
}

async fn run(shared: Handle, mut stop: watch::Receiver<Stop>) {
    let mut changed = shared.subscribe();
    let mut tasks: HashMap<(String, SocketAddr), Task> = HashMap::new();
    // The checks of the sidecars that cluster emulation announces run here too.
    let mut peers = HashMap::new();
    loop {
        reconcile(&shared, &mut tasks);
        crate::discovery::peers::reconcile(&shared, &mut peers);
        tokio::select! {
            r = changed.changed() => if r.is_err() { break },
            r = stop.changed() => if r.is_err() || *stop.borrow() != Stop::Run { break },
        }
    }
    for t in tasks.into_values() {
        t.handle.abort();
    }
    for t in peers.into_values() {
        t.abort();
    }
}

/// Starts and stops tasks to match the current snapshot.
fn reconcile(shared: &Handle, tasks: &mut HashMap<(String, SocketAddr), Task>) {
    let snap = shared.serving();
    let mut want: HashMap<(String, SocketAddr), Target> = HashMap::new();
    for (ci, c) in snap.config().clusters.iter().enumerate() {
        let Some(hc) = &c.health_check else { continue };
        let tls = snap.upstream_tls(ci);
        for s in &c.shards {
            for e in &s.endpoints {
                if e.address == respway_filters::model::NO_ENDPOINT {
                    continue;
                }
                let cfg =
                    crate::discovery::endpoints::endpoint_config(c, s, e.address, tls.clone());
                want.insert(
                    (c.name.clone(), e.address),
                    Target {
                        cfg,
                        hc: hc.clone(),
                        role: e.role,
                    },
                );
            }
        }
    }
    tasks.retain(|k, t| {
        let keep = want.get(k) == Some(&t.target);
        if !keep {
            t.handle.abort();
        }
        keep
    });
    for (k, target) in want {
        if tasks.contains_key(&k) {
            continue;
        }
        let check = shared.checks().get(&k.0, k.1);
        check.configured_as(target.role);
        let handle = tokio::spawn(check_loop(check, target.clone()));
        tasks.insert(k, Task { target, handle });
    }
}

/// Checks one endpoint every `interval` until aborted.
async fn check_loop(check: Arc<EndpointCheck>, t: Target) {
    let label = t.cfg.label.clone();
    let mut conn: Option<Control> = None;
    loop {
        let started = Instant::now();
        let result = match tokio::time::timeout(t.hc.timeout, probe(&mut conn, &t)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", t.hc.timeout)),
        };
        match result {
            Ok((draining, said)) => {
                check.role(t.role, &label, said);
                check.passed(&t.hc, &label, draining);
            }
            Err(e) => {
                conn = None;
                check.failed(&t.hc, &label, e);
            }
        }
        tokio::time::sleep_until(started + t.hc.interval).await;
    }
}

/// One check: (the drain key exists, what `ROLE` said), or why it failed.
async fn probe(conn: &mut Option<Control>, t: &Target) -> Result<(bool, Said), String> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(Control::open(&t.cfg).await?),
    };
    let check: &[&[u8]] = match &t.hc.drain_key {
        Some(k) => &[b"EXISTS", k.as_bytes()],
        None => &[b"PING"],
    };
    // A configured replica is in rotation only while it says it is in sync.
    let replica = t.role == Role::Replica;
    if replica {
        c.send(&[check, &[b"ROLE"], &[b"INFO", b"replication"]])
            .await?;
    } else {
        c.send(&[check, &[b"ROLE"]]).await?;
    }
    let check = c.next().await?;
    let said = c.next().await?;
    let info = if replica { Some(c.next().await?) } else { None };
    // The check's own reply decides; `ROLE` or `INFO` refused (an upstream user without the
    // permission, a renamed command) only leaves the role or the sync unchecked.
    if let Frame::Error(e) | Frame::BlobError(e) = &check {
        return Err(String::from_utf8_lossy(e).into_owned());
    }
    if let Some(Frame::Bulk(text) | Frame::Verbatim(text)) = &info {
        crate::upstream::check::in_sync(text)?;
    }
    let draining = matches!(check, Frame::Integer(n) if n > 0);
    Ok((draining, role(&said)))
}

/// `ROLE`'s reply: `master ...`, or `slave HOST PORT ...`.
fn role(f: &Frame) -> Said {
    let Frame::Array(items) = f else {
        return Said::Other;
    };
    let text = |i: usize| match items.get(i) {
        Some(Frame::Bulk(b) | Frame::Simple(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Frame::Integer(n)) => n.to_string(),
        _ => String::new(),
    };
    match text(0).as_str() {
        "master" => Said::Primary,
        "slave" => Said::Replica(format!("{}:{}", text(1), text(2))),
        _ => Said::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn thresholds_and_drain() {
        let hc = HealthCheck::default();
        let c = EndpointCheck::default();
        assert!(c.in_rotation(), "starts healthy");
        c.failed(&hc, "e", "x".into());
        c.failed(&hc, "e", "x".into());
        assert!(c.in_rotation());
        c.failed(&hc, "e", "LOADING".into());
        assert!(!c.in_rotation());
        assert_eq!(c.view().state, "unhealthy");
        assert_eq!(c.view().last_error, "LOADING");
        c.passed(&hc, "e", false);
        assert!(!c.in_rotation());
        c.passed(&hc, "e", false);
        assert!(c.in_rotation());
        c.passed(&hc, "e", true);
        assert_eq!(c.view().state, "draining");
        assert!(!c.in_rotation());
        c.passed(&hc, "e", false);
        assert!(c.in_rotation());
        assert_eq!(c.view().transitions, 4);
        c.role(Role::Primary, "e", Said::Replica("h:1".into()));
        assert!(c.demoted());
        assert_eq!(c.view().state, "demoted");
        assert_eq!(c.replica_of(), "h:1");
        c.role(Role::Primary, "e", Said::Primary);
        assert!(!c.demoted());
        // Named a replica by the configuration, a demoted endpoint no longer is.
        c.role(Role::Primary, "e", Said::Replica("h:1".into()));
        c.configured_as(Role::Replica);
        assert!(!c.demoted());
        c.role(Role::Replica, "e", Said::Replica("h:2".into()));
        assert!(!c.demoted());
        assert_eq!(c.view().state, "healthy");
    }

    #[test]
    fn role_replies() {
        let bulk = |s: &str| Frame::Bulk(Bytes::from(s.to_string()));
        assert_eq!(
            role(&Frame::Array(vec![bulk("master"), Frame::Integer(0)])),
            Said::Primary
        );
        assert_eq!(
            role(&Frame::Array(vec![
                bulk("slave"),
                bulk("10.0.0.1"),
                Frame::Integer(6379),
                bulk("connected"),
                Frame::Integer(1),
            ])),
            Said::Replica("10.0.0.1:6379".into())
        );
        assert_eq!(
            role(&Frame::Error(Bytes::from_static(b"NOPERM"))),
            Said::Other
        );
        assert_eq!(role(&Frame::Array(vec![bulk("sentinel")])), Said::Other);
    }
}

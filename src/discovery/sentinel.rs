//! Sentinel-managed shards: the shards whose primary and replicas the Sentinels name.
//!
//! One thread of its own (a current-thread runtime, off the workers) keeps, per Sentinel
//! master a configuration names, one watcher:
//! - it subscribes on every Sentinel to the events about instances (`+switch-master`,
//!   `+sdown`/`-sdown`, `+odown`/`-odown`, replica changes) and asks again at once when one
//!   names the master;
//! - it asks every Sentinel (`SENTINEL MASTER`, `SENTINEL REPLICAS`) at once, and every
//!   second as a backstop;
//! - when the answer changes, it records it and has the configuration compiled again
//!   ([`crate::discovery::Running::republish`]): the workers swap the shard's endpoints as for any
//!   configuration change, without dropping a request. New commands go to the new primary;
//!   commands already sent to the old one are answered by it or fail (a lost connection),
//!   and are never sent again; the pools of a node that left the shard, or changed role, are
//!   closed once no session uses them.
//!
//! Sentinels that disagree: the answer with the highest `config-epoch` wins (a Sentinel
//! reaches a new epoch only by a failover that a majority of the Sentinels voted for), ties
//! go to the address most of them give. Sentinels that do not answer change nothing: the last
//! known primary stays, and they are asked again each second.
//!
//! Keys never move to another shard: a shard whose primary is not known answers its keys with
//! an error naming it, as does a shard whose primary is down.

// A watcher is keyed by how its Sentinels are reached; the TLS part of that hashes and
// compares its settings only, never the configuration the file watcher swaps inside it.
#![allow(clippy::mutable_key_type)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use respway_filters::model::{Config, Endpoint, Role, NO_ENDPOINT};
use respway_filters::resp::Frame;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::discovery::Handle;
use crate::upstream::hold::Hold;
use crate::upstream::{Control, EndpointConfig};

/// How often every Sentinel is asked, whatever they publish.
const POLL: Duration = Duration::from_secs(1);
/// The longest a Sentinel may take to answer one round.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);
/// The Sentinel events that can change a master's primary or replicas.
const EVENTS: &[&str] = &[
    "+switch-master",
    "+sdown",
    "-sdown",
    "+odown",
    "-odown",
    "+slave",
    "+slave-reconf-done",
    "+convert-to-slave",
    "+reboot",
    "+failover-end",
];
/// The events that say a failover of a master began or goes on: its writes are held from
/// the first (see [`crate::upstream::hold`]) until `+switch-master`.
const FAILOVER_STEPS: &[&str] = &[
    "+try-failover",
    "+elected-leader",
    "+failover-state-select-slave",
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+failover-state-wait-promotion",
    "+promoted-slave",
    "+failover-state-reconf-slaves",
];
/// The events that say a failover ended without a switch: held writes go to the primary.
const FAILOVER_ENDS: &[&str] = &[
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
    "+failover-end-for-timeout",
];

/// A master as the configuration names it: its name and its Sentinels.
pub(crate) type Key = (String, Vec<SocketAddr>);

/// What the Sentinels say of one master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// The primary.
    pub(crate) primary: SocketAddr,
    /// Replicas every Sentinel of the winning answer sees up and linked to the primary, by
    /// address.
    pub(crate) replicas: Vec<SocketAddr>,
    /// The winning answer's `config-epoch`.
    pub(crate) epoch: u64,
}

pub(crate) use crate::stats::SentinelStatus as Status;

/// What is known of every watched master; read when a configuration is compiled.
#[derive(Debug, Default)]
pub(crate) struct Discovery {
    found: Mutex<HashMap<Key, Found>>,
    status: Mutex<HashMap<Key, Status>>,
    /// Per master, the hold on its writes during a failover (shared with the workers'
    /// handles of its primary).
    holds: Mutex<HashMap<Key, Arc<Hold>>>,
}

impl Discovery {
    /// `config` with the endpoints of each Sentinel-managed shard as last found (the
    /// placeholder primary stays where none is known yet).
    pub(crate) fn resolve(&self, mut config: Config) -> Config {
        let found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        for c in &mut config.clusters {
            for s in &mut c.shards {
                let Some(src) = &s.sentinel else { continue };
                let key = (src.master.clone(), src.sentinels.clone());
                let zone = |a: SocketAddr| {
                    let z = src.zones.iter().find(|(z, _)| *z == a);
                    z.map(|(_, z)| z.clone())
                };
                s.endpoints = match found.get(&key) {
                    Some(f) => std::iter::once(Endpoint {
                        address: f.primary,
                        role: Role::Primary,
                        zone: zone(f.primary),
                    })
                    .chain(f.replicas.iter().map(|&address| Endpoint {
                        address,
                        role: Role::Replica,
                        zone: zone(address),
                    }))
                    .collect(),
                    None => vec![Endpoint {
                        address: NO_ENDPOINT,
                        role: Role::Primary,
                        zone: None,
                    }],
                };
            }
        }
        config
    }

    /// The hold on the writes of `key`'s shard (made on first use).
    pub(crate) fn hold(&self, key: &Key) -> Arc<Hold> {
        let mut holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        holds.entry(key.clone()).or_default().clone()
    }

    /// Records `f` for `key`; true when it changed.
    fn set(&self, key: &Key, f: Found) -> bool {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        if found.get(key) == Some(&f) {
            return false;
        }
        found.insert(key.clone(), f);
        true
    }

    /// What is known of `key`.
    pub(crate) fn get(&self, key: &Key) -> Option<Found> {
        let found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        found.get(key).cloned()
    }

    fn forget(&self, key: &Key) {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        found.remove(key);
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        status.remove(key);
    }

    /// Records a round: how many Sentinels answered, and whether the primary changed.
    fn round(&self, key: &Key, answering: usize, sentinels: usize, changed: bool, epoch: u64) {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let s = status.entry(key.clone()).or_default();
        s.answering = answering;
        s.sentinels = sentinels;
        s.primary_changes += u64::from(changed);
        s.epoch = s.epoch.max(epoch);
    }

    /// Every Sentinel-managed shard of `config` with its master's status (zero before the
    /// first round).
    pub(crate) fn statuses(&self, config: &Config) -> Vec<([String; 2], String, Status)> {
        let status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for c in &config.clusters {
            for s in &c.shards {
                let Some(src) = &s.sentinel else { continue };
                let key = (src.master.clone(), src.sentinels.clone());
                let mut st = status.get(&key).copied().unwrap_or(Status {
                    sentinels: src.sentinels.len(),
                    ..Status::default()
                });
                if let Some(h) = holds.get(&key) {
                    st.holds = h.holds.load(std::sync::atomic::Ordering::Relaxed);
                    st.held_writes = h.writes.load(std::sync::atomic::Ordering::Relaxed);
                }
                out.push(([c.name.clone(), s.name.clone()], src.master.clone(), st));
            }
        }
        out
    }
}

/// Whether `config` has a Sentinel-managed shard.
pub(crate) fn any(config: &Config) -> bool {
    config
        .clusters
        .iter()
        .any(|c| c.shards.iter().any(|s| s.sentinel.is_some()))
}

/// The masters `config` names, each with how its Sentinels are reached (their own
/// credentials, the cluster's TLS and connect timeout).
fn wanted(handle: &Handle) -> HashMap<(Key, Vec<EndpointConfig>), String> {
    let snapshot = handle.serving();
    let mut out = HashMap::new();
    for (ci, c) in snapshot.config().clusters.iter().enumerate() {
        for s in &c.shards {
            let Some(src) = &s.sentinel else { continue };
            let tls = snapshot.upstream_tls(ci);
            let cfgs = src
                .sentinels
                .iter()
                .map(|&address| EndpointConfig {
                    address,
                    label: format!("sentinel {address} of master {}", src.master).into(),
                    connect_timeout: c.connect_timeout,
                    auth: c
                        .endpoint_auth
                        .iter()
                        .find(|e| e.address == address)
                        .map(|e| {
                            let mut v = Vec::new();
                            if let Some(u) = &e.auth.username {
                                v.push(Bytes::from(u.clone()));
                            }
                            v.push(Bytes::from(e.auth.password.clone()));
                            v
                        }),
                    db: 0,
                    databases: 1,
                    dedicated: 0,
                    max_queue: 1,
                    tls: tls.clone(),
                    missing: None,
                    readonly: false,
                    replica: false,
                })
                .collect();
            let key = (src.master.clone(), src.sentinels.clone());
            let what = format!("cluster {} shard {}", c.name, s.name);
            out.insert((key, cfgs), what);
        }
    }
    out
}

/// The settings of master `key` in the configuration now serving (read each round, so a
/// change applies without a new watcher): `failover_hold` and `serve_stale_reads`.
fn settings(handle: &Handle, key: &Key) -> (Duration, bool) {
    let serving = handle.serving();
    let found = serving.config().clusters.iter().find_map(|c| {
        c.shards.iter().find_map(|s| {
            let src = s.sentinel.as_ref()?;
            (src.master == key.0 && src.sentinels == key.1)
                .then_some((src.failover_hold, src.serve_stale_reads))
        })
    });
    found.unwrap_or((Duration::ZERO, false))
}

/// The Sentinel watchers: one per master a configuration names (see the module above).
pub(crate) struct Masters;

impl crate::discovery::watchers::Watch for Masters {
    type Key = (Key, Vec<EndpointConfig>);
    type Value = String;
    fn wanted(handle: &Handle) -> HashMap<Self::Key, Self::Value> {
        wanted(handle)
    }
    fn watch(
        handle: Handle,
        key: Self::Key,
        what: String,
        first: tokio::sync::oneshot::Sender<()>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        watch_master(handle, key.0, key.1, what, first)
    }
    fn forget(handle: &Handle, key: &Self::Key) {
        handle.sentinels().forget(&key.0);
    }
}

/// One master: subscribes on each of its Sentinels and asks them all, at once and then on
/// each event and each [`POLL`]; `first` hears when the first round is over. Its writes are
/// held for at most the shard's `failover_hold` from the first event of a failover until the
/// new primary is published (or the failover ends otherwise).
async fn watch_master(
    handle: Handle,
    key: Key,
    sentinels: Vec<EndpointConfig>,
    what: String,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let kick = Arc::new(Notify::new());
    let hold = handle.sentinels().hold(&key);
    hold.set_bound(settings(&handle, &key).0);
    let mut subs = JoinSet::new();
    for cfg in &sentinels {
        subs.spawn(subscribe(
            cfg.clone(),
            key.0.clone(),
            kick.clone(),
            hold.clone(),
        ));
    }
    let mut links: Vec<Option<Control>> = sentinels.iter().map(|_| None).collect();
    let mut first = Some(first);
    let mut silent = false;
    loop {
        let asks = sentinels
            .iter()
            .zip(links.iter_mut())
            .map(|(cfg, link)| ask(cfg, link, &key.0));
        let answers = futures_util::future::join_all(asks).await;
        let mut ok = Vec::new();
        for (cfg, a) in sentinels.iter().zip(answers) {
            match a {
                Ok(a) => ok.push((cfg.address, a)),
                Err(e) => {
                    tracing::debug!(sentinel = %cfg.address, master = %key.0, error = %e, "Sentinel did not answer")
                }
            }
        }
        let (bound, stale) = settings(&handle, &key);
        hold.set_bound(bound);
        let before = handle.sentinels().get(&key);
        let winner = decide(&ok, before.as_ref().filter(|_| stale));
        let changed = matches!((&before, &winner), (Some(b), Some(w)) if b.primary != w.primary);
        let epoch = winner.as_ref().map_or(0, |w| w.epoch);
        (handle.sentinels()).round(&key, ok.len(), sentinels.len(), changed, epoch);
        match winner {
            Some(found) => {
                silent = false;
                if handle.sentinels().set(&key, found.clone()) {
                    match before {
                        Some(b) if b.primary != found.primary => tracing::warn!(
                            %what, master = %key.0, from = %b.primary, to = %found.primary,
                            epoch = found.epoch, "Sentinel: the primary changed"
                        ),
                        Some(_) => tracing::info!(
                            %what, master = %key.0, replicas = ?found.replicas,
                            "Sentinel: the replicas changed"
                        ),
                        None => tracing::info!(
                            %what, master = %key.0, primary = %found.primary,
                            replicas = ?found.replicas, epoch = found.epoch,
                            "Sentinel: primary found"
                        ),
                    }
                    if let Err(e) = handle.republish() {
                        tracing::error!(error = %e, "Sentinel: the configuration with the new endpoints was refused");
                    }
                    if changed && hold.on() {
                        tracing::info!(%what, master = %key.0, to = %found.primary, "Sentinel: held writes go to the new primary");
                        hold.release(Some(found.primary));
                    }
                }
            }
            None if !silent => {
                silent = true;
                tracing::warn!(%what, master = %key.0, "Sentinel: no Sentinel names a primary; the last known one stays");
            }
            None => {}
        }
        if let Some(f) = first.take() {
            let _ = f.send(());
        }
        // A hold whose bound passed (no switch came): ended here, its writes were sent.
        if hold.on() && !hold.is_held() {
            tracing::warn!(%what, master = %key.0, ?bound, "Sentinel: no switch within failover_hold; held writes went to the primary known");
            hold.release(None);
        }
        let poll = if hold.on() { POLL / 10 } else { POLL };
        tokio::select! {
            _ = kick.notified() => {}
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// One Sentinel's answer about a master.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    primary: SocketAddr,
    epoch: u64,
    /// Replicas it does not see down or disconnected.
    replicas: Vec<SocketAddr>,
    /// It sees the primary down (`s_down` or `o_down`) or cannot reach it (`disconnected`).
    primary_down: bool,
    /// Replicas it does not see down (`s_down`, `o_down`), linked to their primary or not.
    alive: Vec<SocketAddr>,
}

/// The winning answer: the highest epoch, then the primary most Sentinels give; its replicas
/// are those every Sentinel of that answer sees up (any of them seeing one down takes it out).
/// With `stale` (the last answer, when stale reads are served): while a Sentinel of the winning
/// answer sees that same primary down, its replicas stay unless one sees them down themselves
/// (unlinked from the dead primary, or a flickering Sentinel link, they still serve reads;
/// the dead primary cannot).
fn decide(answers: &[(SocketAddr, Answer)], stale: Option<&Found>) -> Option<Found> {
    let epoch = answers.iter().map(|(_, a)| a.epoch).max()?;
    let mut votes: Vec<(SocketAddr, usize)> = Vec::new();
    for (_, a) in answers.iter().filter(|(_, a)| a.epoch == epoch) {
        match votes.iter_mut().find(|(p, _)| *p == a.primary) {
            Some(v) => v.1 += 1,
            None => votes.push((a.primary, 1)),
        }
    }
    votes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let primary = votes.first()?.0;
    let agree: Vec<&Answer> = answers
        .iter()
        .map(|(_, a)| a)
        .filter(|a| a.epoch == epoch && a.primary == primary)
        .collect();
    let mut replicas: Vec<SocketAddr> = agree
        .iter()
        .flat_map(|a| a.replicas.iter().copied())
        .filter(|r| *r != primary && agree.iter().all(|a| a.replicas.contains(r)))
        .collect();
    if let Some(before) = stale.filter(|b| b.primary == primary) {
        if agree.iter().any(|a| a.primary_down) {
            let alive = |r: &SocketAddr| agree.iter().all(|a| a.alive.contains(r));
            replicas.extend(before.replicas.iter().filter(|r| alive(r)));
        }
    }
    replicas.sort();
    replicas.dedup();
    Some(Found {
        primary,
        replicas,
        epoch,
    })
}

/// Asks one Sentinel about `master` on its link (opened when there is none; dropped when the
/// round fails, to be opened again next round).
async fn ask(
    cfg: &EndpointConfig,
    link: &mut Option<Control>,
    master: &str,
) -> Result<Answer, String> {
    let round = async {
        let l = match link {
            Some(l) => l,
            None => link.insert(Control::open(cfg).await?),
        };
        let m = master.as_bytes();
        l.send(&[&[b"SENTINEL", b"MASTER", m], &[b"SENTINEL", b"REPLICAS", m]])
            .await?;
        let master_info = l.next().await?;
        let replicas = l.next().await?;
        answer(&master_info, &replicas)
    };
    match tokio::time::timeout(ASK_TIMEOUT, round).await {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => {
            *link = None;
            Err(e)
        }
        Err(_) => {
            *link = None;
            Err(format!("no answer within {ASK_TIMEOUT:?}"))
        }
    }
}

/// The fields of one instance in a `SENTINEL MASTER` / `SENTINEL REPLICAS` reply (a flat
/// array of names and values in RESP2, a map in RESP3).
fn fields(f: &Frame) -> Option<HashMap<&[u8], &[u8]>> {
    fn text(f: &Frame) -> Option<&[u8]> {
        match f {
            Frame::Bulk(b) | Frame::Simple(b) => Some(b.as_ref()),
            _ => None,
        }
    }
    let mut out = HashMap::new();
    match f {
        Frame::Array(items) => {
            for pair in items.chunks(2) {
                if let [k, v] = pair {
                    out.insert(text(k)?, text(v)?);
                }
            }
        }
        Frame::Map(pairs) => {
            for (k, v) in pairs {
                out.insert(text(k)?, text(v)?);
            }
        }
        _ => return None,
    }
    Some(out)
}

fn address(f: &HashMap<&[u8], &[u8]>) -> Option<SocketAddr> {
    let ip = std::str::from_utf8(f.get(b"ip".as_slice())?).ok()?;
    let port = std::str::from_utf8(f.get(b"port".as_slice())?).ok()?;
    format!("{ip}:{port}").parse().ok()
}

/// A replica not to read from: seen down or disconnected, or not linked to its primary (a
/// demoted primary resyncing, a replica whose primary is gone: either serves stale data).
fn flagged_down(f: &HashMap<&[u8], &[u8]>) -> bool {
    let link = f.get(b"master-link-status".as_slice()).copied();
    link.is_some_and(|l| l != b"ok") || flagged(f, &[b"s_down", b"o_down", b"disconnected"])
}

/// Whether the instance's `flags` hold one of `any`.
fn flagged(f: &HashMap<&[u8], &[u8]>, any: &[&[u8]]) -> bool {
    let flags = f.get(b"flags".as_slice()).copied().unwrap_or_default();
    flags.split(|&b| b == b',').any(|flag| any.contains(&flag))
}

/// A Sentinel's answer from its replies to `SENTINEL MASTER` and `SENTINEL REPLICAS`.
fn answer(master: &Frame, replicas: &Frame) -> Result<Answer, String> {
    if let Frame::Error(e) = master {
        return Err(String::from_utf8_lossy(e).into_owned());
    }
    let m = fields(master).ok_or("SENTINEL MASTER: unexpected reply")?;
    let primary = address(&m).ok_or("SENTINEL MASTER: no ip and port")?;
    let epoch = m
        .get(b"config-epoch".as_slice())
        .and_then(|e| std::str::from_utf8(e).ok())
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let (mut list, mut alive) = (Vec::new(), Vec::new());
    match replicas {
        Frame::Array(items) => {
            for r in items {
                let Some(f) = fields(r) else { continue };
                let Some(a) = address(&f) else { continue };
                if !flagged_down(&f) {
                    list.push(a);
                }
                if !flagged(&f, &[b"s_down", b"o_down"]) {
                    alive.push(a);
                }
            }
        }
        Frame::Error(e) => return Err(String::from_utf8_lossy(e).into_owned()),
        _ => return Err("SENTINEL REPLICAS: unexpected reply".into()),
    }
    Ok(Answer {
        primary,
        epoch,
        replicas: list,
        // Its link to the primary down counts too: the first second after a crash, before
        // `s_down`, it sees the primary's replicas unlinked already.
        primary_down: flagged(&m, &[b"s_down", b"o_down", b"disconnected"]),
        alive,
    })
}

/// Subscribes on one Sentinel to the events that can change a master, and wakes the watcher
/// on each that names `master`; reconnects (100 ms, doubling up to 2 s) when the link fails.
/// A failover's first step starts the hold on `master`'s writes (for at most its bound); a
/// failover that ends without a switch ends it.
async fn subscribe(cfg: EndpointConfig, master: String, kick: Arc<Notify>, hold: Arc<Hold>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        // The link that subscribed, when one did (the backoff starts over after it).
        let mut subscribed = false;
        let lost: Result<std::convert::Infallible, String> = async {
            let mut link = Control::open(&cfg).await?;
            let mut args: Vec<&[u8]> = vec![b"SUBSCRIBE"];
            let all = EVENTS.iter().chain(FAILOVER_STEPS).chain(FAILOVER_ENDS);
            args.extend(all.map(|e| e.as_bytes()));
            link.send(&[&args]).await?;
            subscribed = true;
            // A new link may have missed an event: ask again.
            kick.notify_one();
            loop {
                let frame = link.next().await?;
                if names(&frame, &master) {
                    match channel(&frame) {
                        Some(c) if FAILOVER_STEPS.contains(&c) && hold.start() => {
                            tracing::info!(sentinel = %cfg.address, %master, event = c, bound = ?hold.bound(), "Sentinel: a failover began; writes are held until the switch");
                        }
                        Some(c) if FAILOVER_ENDS.contains(&c) && hold.on() => {
                            tracing::warn!(sentinel = %cfg.address, %master, event = c, "Sentinel: the failover ended without a switch; held writes go to the primary");
                            hold.release(None);
                        }
                        _ => {}
                    }
                    kick.notify_one();
                }
            }
        }
        .await;
        let Err(lost) = lost;
        tracing::debug!(sentinel = %cfg.address, error = %lost, "Sentinel subscription lost; reconnecting");
        if subscribed {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// The channel of a pushed message (the event's name).
fn channel(frame: &Frame) -> Option<&str> {
    let Frame::Array(items) = frame else {
        return None;
    };
    match items.get(1) {
        Some(Frame::Bulk(c)) => std::str::from_utf8(c).ok(),
        _ => None,
    }
}

/// Whether a pushed event message names `master`: `+switch-master <master> ...`, or an
/// instance event `<type> <name> <ip> <port> @ <master> <ip> <port>`.
fn names(frame: &Frame, master: &str) -> bool {
    let Frame::Array(items) = frame else {
        return false;
    };
    let (Some(Frame::Bulk(kind)), Some(Frame::Bulk(payload))) = (items.first(), items.get(2))
    else {
        return false;
    };
    if kind.as_ref() != b"message" {
        return false;
    }
    let words: Vec<&[u8]> = payload.split(|&b| b == b' ').collect();
    let m = master.as_bytes();
    words.first() == Some(&m)
        || words.get(1) == Some(&m)
        || words
            .iter()
            .position(|w| *w == b"@")
            .is_some_and(|at| words.get(at + 1) == Some(&m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(primary: &str, epoch: u64, replicas: &[&str]) -> (SocketAddr, Answer) {
        (
            "127.0.0.1:1".parse().unwrap(),
            Answer {
                primary: primary.parse().unwrap(),
                epoch,
                replicas: replicas.iter().map(|r| r.parse().unwrap()).collect(),
                primary_down: false,
                alive: replicas.iter().map(|r| r.parse().unwrap()).collect(),
            },
        )
    }

    #[test]
    fn the_highest_epoch_wins_then_the_most_named_primary() {
        let f = decide(
            &[
                a("127.0.0.1:7001", 1, &["127.0.0.1:7002"]),
                a("127.0.0.1:7002", 2, &["127.0.0.1:7003"]),
                a("127.0.0.1:7001", 1, &["127.0.0.1:7002"]),
            ],
            None,
        )
        .unwrap();
        assert_eq!(f.primary, "127.0.0.1:7002".parse().unwrap());
        assert_eq!(f.epoch, 2);
        assert_eq!(f.replicas, vec!["127.0.0.1:7003".parse().unwrap()]);
        let f = decide(
            &[
                a("127.0.0.1:7001", 3, &[]),
                a("127.0.0.1:7002", 3, &[]),
                a("127.0.0.1:7002", 3, &[]),
            ],
            None,
        )
        .unwrap();
        assert_eq!(f.primary, "127.0.0.1:7002".parse().unwrap());
        assert_eq!(decide(&[], None), None);
    }

    #[test]
    fn a_replica_any_agreeing_sentinel_sees_down_is_left_out() {
        let f = decide(
            &[
                a("127.0.0.1:7001", 1, &["127.0.0.1:7002", "127.0.0.1:7003"]),
                a("127.0.0.1:7001", 1, &["127.0.0.1:7003"]),
            ],
            None,
        )
        .unwrap();
        assert_eq!(f.replicas, vec!["127.0.0.1:7003".parse().unwrap()]);
    }

    #[test]
    fn while_the_primary_is_down_its_replicas_in_rotation_stay() {
        let before = Found {
            primary: "127.0.0.1:7001".parse().unwrap(),
            replicas: vec!["127.0.0.1:7002".parse().unwrap()],
            epoch: 1,
        };
        // The primary down, the replica unlinked (or flagged disconnected) but not down.
        let mut down = a("127.0.0.1:7001", 1, &[]);
        down.1.primary_down = true;
        down.1.alive = vec!["127.0.0.1:7002".parse().unwrap()];
        let f = decide(std::slice::from_ref(&down), Some(&before)).unwrap();
        assert_eq!(f.replicas, before.replicas, "kept");
        assert!(
            decide(std::slice::from_ref(&down), None)
                .unwrap()
                .replicas
                .is_empty(),
            "stale reads refused"
        );
        // Seen down itself: out.
        let mut gone = down.clone();
        gone.1.alive.clear();
        assert!(decide(&[down.clone(), gone], Some(&before))
            .unwrap()
            .replicas
            .is_empty());
        // The primary up: only linked replicas, as always.
        let mut up = down.clone();
        up.1.primary_down = false;
        assert!(decide(&[up], Some(&before)).unwrap().replicas.is_empty());
        // A new primary: the last answer's replicas say nothing of it.
        let mut other = down;
        other.1.primary = "127.0.0.1:7003".parse().unwrap();
        assert!(decide(&[other], Some(&before)).unwrap().replicas.is_empty());
    }

    #[test]
    fn events_name_their_master() {
        let msg = |payload: &str| {
            Frame::Array(vec![
                Frame::bulk(&b"message"[..]),
                Frame::bulk(&b"+sdown"[..]),
                Frame::bulk(Bytes::from(payload.to_string())),
            ])
        };
        assert!(names(&msg("m0 127.0.0.1 1 127.0.0.1 2"), "m0"));
        assert!(names(&msg("master m0 127.0.0.1 7001"), "m0"));
        assert!(names(
            &msg("slave 127.0.0.1:7002 127.0.0.1 7002 @ m0 127.0.0.1 7001"),
            "m0"
        ));
        assert!(!names(
            &msg("slave 127.0.0.1:7002 127.0.0.1 7002 @ m1 127.0.0.1 7001"),
            "m0"
        ));
    }
}

//! The copy pass of hot-key rules: when a configuration adds a rule (cluster, prefix), the
//! keys that already exist under the prefix are copied from their home shard (the one the
//! cluster's hash gives them) to every other shard; when it removes one, the extra copies are
//! deleted.
//!
//! Until a rule's pass has finished in this sidecar, reads of its keys go to their home shard
//! only (the layer reads [`HotKeyRoute::copied`], which this module sets); writes are copied
//! from the start (`respway_filters::hot_key`). The pass, per shard: `SCAN` the primary
//! (`MATCH` the prefix, glob-escaped, then `*`; `COUNT 100`), keep the keys whose home is that
//! shard, and `MIGRATE ... COPY REPLACE KEYS k...` them to every other shard, at most
//! [`KEYS_PER_SEC`] keys a second. `MIGRATE` copies the value and the TTL, and replaces an
//! older copy, so a pass can run again at any time (a restart runs it again for every rule):
//! it is idempotent. A pass that fails (a shard down, `MIGRATE` refused) is retried with a
//! backoff (1 s doubling to 30 s); meanwhile the rule's reads stay on the home shards.
//!
//! Why a side thread (`respway-hotcopy`, like the Sentinel watchers and the health checks):
//! the pass is long (one `SCAN` of every shard), must not run on the workers' request path,
//! and is once per sidecar, not per worker. It uses its own connections.
//!
//! A rule is known by its cluster's name, its prefix and its cluster's shard names: the same
//! rule over the same shards keeps its state over every push (and Sentinel failovers, which
//! keep shard names); a new shard set is copied again.
//!
//! [`HotKeyRoute::copied`]: respway_filters::routing::HotKeyRoute::copied

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use respway_filters::hot_key::copy_command;
use respway_filters::resp::Frame;
use respway_filters::routing::ClusterRoute;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::discovery::{Handle, Serving};
use crate::lifecycle::Stop;
use crate::upstream::Control;

/// Keys copied (or deleted) per second by one pass, at most.
pub(crate) const KEYS_PER_SEC: u64 = 1_000;
/// Keys asked of `SCAN` at a time.
const SCAN_COUNT: &str = "100";
/// `MIGRATE`'s timeout (ms) in a pass: short, as on the write path
/// ([`respway_filters::hot_key::COPY_TIMEOUT_MS`]): a shard copying to another that copies
/// back waits for it until one times out; the one that timed out sends its copy again.
const MIGRATE_TIMEOUT_MS: u64 = 100;
/// Attempts of one `MIGRATE` of a pass that answers `IOERR` before the pass fails.
const MIGRATE_ATTEMPTS: u32 = 5;
/// How long one command of a pass may take before the pass fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A rule: cluster name, prefix, the cluster's shard names.
type RuleKey = (String, Vec<u8>, Vec<String>);

/// The pass state of every hot-key rule of the current configuration (shared by the
/// compiler, which hands each rule its flag, the copy thread, and `INFO hotkeys`/metrics).
#[derive(Debug, Default)]
pub(crate) struct Copies {
    rules: Mutex<HashMap<RuleKey, Arc<RuleCopy>>>,
}

/// One rule's pass.
#[derive(Debug, Default)]
pub(crate) struct RuleCopy {
    /// The flag the request path reads: set when a pass has finished.
    copied: Arc<AtomicBool>,
    /// [`State`] as a number.
    state: AtomicU8,
    /// Keys copied by the current (or last) pass.
    keys: AtomicU64,
    /// The last failure (empty when none).
    error: Mutex<String>,
}

pub(crate) use crate::stats::{CopyProgress as Progress, CopyState as State};

impl RuleCopy {
    fn set(&self, state: State) {
        self.state.store(state as u8, Ordering::Relaxed);
        if state == State::Done {
            self.copied.store(true, Ordering::Release);
        }
    }

    fn state(&self) -> State {
        match self.state.load(Ordering::Relaxed) {
            1 => State::Done,
            2 => State::Failed,
            _ => State::Copying,
        }
    }

    fn progress(&self) -> Progress {
        Progress {
            state: self.state(),
            keys: self.keys.load(Ordering::Relaxed),
            error: self.error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }
}

/// What `INFO hotkeys` and the metrics read of the passes.
impl crate::stats::CopySource for Copies {
    fn progress(&self, cluster: &str, prefix: &str) -> Option<Progress> {
        Copies::progress(self, cluster, prefix)
    }

    fn all(&self) -> Vec<(String, String, Progress)> {
        Copies::all(self)
    }
}

impl Copies {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RuleKey, Arc<RuleCopy>>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands every hot-key rule of freshly compiled `clusters` the flag of its pass (a rule
    /// seen before over the same shards keeps its state).
    pub(crate) fn adopt(&self, clusters: &mut [ClusterRoute]) {
        let mut rules = self.lock();
        for c in clusters {
            let shards: Vec<String> = c.shards.iter().map(|s| s.name.clone()).collect();
            for r in &mut c.hot_keys {
                let key = (c.name.clone(), r.prefix.clone(), shards.clone());
                r.copied = rules.entry(key).or_default().copied.clone();
            }
        }
    }

    /// The pass of the rule `prefix` of cluster `cluster`, if it has one.
    pub(crate) fn progress(&self, cluster: &str, prefix: &str) -> Option<Progress> {
        let rules = self.lock();
        rules
            .iter()
            .find(|((c, p, _), _)| c == cluster && p == prefix.as_bytes())
            .map(|(_, r)| r.progress())
    }

    /// Every rule's pass: (cluster, prefix, progress).
    pub(crate) fn all(&self) -> Vec<(String, String, Progress)> {
        let rules = self.lock();
        let mut v: Vec<_> = rules
            .iter()
            .map(|((c, p, _), r)| {
                (
                    c.clone(),
                    String::from_utf8_lossy(p).into_owned(),
                    r.progress(),
                )
            })
            .collect();
        v.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        v
    }

    /// True when no rule's pass is running or failed.
    fn all_done(&self) -> bool {
        self.lock().values().all(|r| r.state() == State::Done)
    }
}

/// Starts the copy thread, and waits up to `first_wait` for the passes of the first
/// configuration (so the first clients read spread when the keyspace is small); it ends when
/// `stop` leaves [`Stop::Run`].
pub(crate) fn start(
    running: Handle,
    copies: Arc<Copies>,
    stop: watch::Receiver<Stop>,
    first_wait: Duration,
) -> std::io::Result<()> {
    let shared = Arc::new(CopyThread {
        running,
        copies: copies.clone(),
    });
    crate::lifecycle::side_thread("respway-hotcopy", move || run(shared, stop))?;
    let until = std::time::Instant::now() + first_wait;
    while !copies.all_done() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// What the copy thread holds: the running sidecar (as discovery sees it) and the passes'
/// state, which the compiled rules read too.
struct CopyThread {
    running: Handle,
    copies: Arc<Copies>,
}

/// A rule of one cluster, as the thread tracks it.
type Rule = (String, Vec<u8>);

async fn run(shared: Arc<CopyThread>, mut stop: watch::Receiver<Stop>) {
    let mut changed = shared.running.subscribe();
    let mut copying: HashMap<RuleKey, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut deleting: HashMap<Rule, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut before: HashSet<Rule> = HashSet::new();
    loop {
        before = reconcile(&shared, &mut copying, &mut deleting, &before);
        tokio::select! {
            r = changed.changed() => if r.is_err() { break },
            r = stop.changed() => if r.is_err() || *stop.borrow() != Stop::Run { break },
        }
    }
    for t in copying.into_values().chain(deleting.into_values()) {
        t.abort();
    }
}

/// Starts the passes of the current configuration's new rules, deletes the copies of the
/// rules it removed, and forgets the state of rules it no longer has. Returns its rules.
fn reconcile(
    shared: &Arc<CopyThread>,
    copying: &mut HashMap<RuleKey, tokio::task::JoinHandle<()>>,
    deleting: &mut HashMap<Rule, tokio::task::JoinHandle<()>>,
    before: &HashSet<Rule>,
) -> HashSet<Rule> {
    let snap = shared.running.serving();
    let Some(routing) = snap.first_routing() else {
        return HashSet::new();
    };
    let clusters = routing.clusters.clone();
    let mut want: HashMap<RuleKey, usize> = HashMap::new();
    for (ci, c) in clusters.iter().enumerate() {
        let shards: Vec<String> = c.shards.iter().map(|s| s.name.clone()).collect();
        for r in &c.hot_keys {
            want.insert((c.name.clone(), r.prefix.clone(), shards.clone()), ci);
        }
    }
    let now: HashSet<Rule> = want
        .keys()
        .map(|(c, p, _)| (c.clone(), p.clone()))
        .collect();
    // Passes of rules that are gone (or whose shards changed) stop; their state goes.
    copying.retain(|k, t| {
        if !want.contains_key(k) {
            t.abort();
            return false;
        }
        !t.is_finished()
    });
    shared.copies.lock().retain(|k, _| want.contains_key(k));
    // A rule back again stops deleting its copies.
    deleting.retain(|k, t| {
        let keep = !now.contains(k) && !t.is_finished();
        if !keep {
            t.abort();
        }
        keep
    });
    for (key, ci) in want {
        let state = {
            let mut rules = shared.copies.lock();
            rules.entry(key.clone()).or_default().clone()
        };
        if state.state() == State::Done || copying.contains_key(&key) {
            continue;
        }
        let name = clusters[ci].name.clone();
        let task = tokio::spawn(copy_rule(shared.clone(), name, key.1.clone(), state));
        copying.insert(key, task);
    }
    for gone in before.difference(&now) {
        if !clusters.iter().any(|c| c.name == gone.0) {
            continue;
        }
        let task = tokio::spawn(uncopy_rule(shared.clone(), gone.0.clone(), gone.1.clone()));
        if let Some(old) = deleting.insert(gone.clone(), task) {
            old.abort();
        }
    }
    now
}

/// The current snapshot and the index of cluster `name` in it (`None`: the cluster is gone).
fn current(shared: &CopyThread, name: &str) -> Option<(Arc<dyn Serving>, usize)> {
    let snap = shared.running.serving();
    let ci = snap.config().clusters.iter().position(|c| c.name == name)?;
    Some((snap, ci))
}

/// Runs the pass of rule `prefix` of cluster `cluster` until one succeeds; each attempt uses
/// the configuration served then (a failover may have named new primaries).
async fn copy_rule(
    shared: Arc<CopyThread>,
    cluster: String,
    prefix: Vec<u8>,
    state: Arc<RuleCopy>,
) {
    let mut backoff = RETRY_FIRST;
    let what = String::from_utf8_lossy(&prefix).into_owned();
    loop {
        let Some((snap, ci)) = current(&shared, &cluster) else {
            return;
        };
        state.set(State::Copying);
        state.keys.store(0, Ordering::Relaxed);
        match pass(&*snap, ci, &prefix, Work::Copy(&state)).await {
            Ok(()) => {
                state
                    .error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
                state.set(State::Done);
                tracing::info!(
                    cluster = %cluster,
                    prefix = %what,
                    keys = state.keys.load(Ordering::Relaxed),
                    "hot-key rule: existing keys copied to every shard; reads spread"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(
                    cluster = %cluster,
                    prefix = %what,
                    error = %e,
                    retry_in = ?backoff,
                    "hot-key rule: copying the existing keys failed; reads stay on each key's home shard"
                );
                *state.error.lock().unwrap_or_else(|e| e.into_inner()) = e;
                state.set(State::Failed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Deletes the copies of the removed rule `prefix` of cluster `cluster`, retrying until it
/// succeeds (or a push brings the rule back, which aborts it).
async fn uncopy_rule(shared: Arc<CopyThread>, cluster: String, prefix: Vec<u8>) {
    let mut backoff = RETRY_FIRST;
    loop {
        let Some((snap, ci)) = current(&shared, &cluster) else {
            return;
        };
        match pass(&*snap, ci, &prefix, Work::Delete).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(
                    cluster = %cluster,
                    prefix = %String::from_utf8_lossy(&prefix),
                    error = %e,
                    retry_in = ?backoff,
                    "hot-key rule removed: deleting its copies failed"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// What a pass does with the keys it finds.
enum Work<'a> {
    /// Copies each shard's own keys to the other shards, counting them here.
    Copy(&'a RuleCopy),
    /// Deletes each shard's copies of other shards' keys (unless another rule of the
    /// cluster still covers them).
    Delete,
}

/// One pass over every shard of cluster `ci` for the keys under `prefix`.
async fn pass(snap: &dyn Serving, ci: usize, prefix: &[u8], work: Work<'_>) -> Result<(), String> {
    let (Some(c), Some(route)) = (
        snap.config().clusters.get(ci),
        snap.first_routing().and_then(|r| r.clusters.get(ci)),
    ) else {
        return Ok(());
    };
    let pattern = glob_prefix(prefix);
    let started = Instant::now();
    let mut done: u64 = 0;
    for (i, s) in c.shards.iter().enumerate() {
        let Some(addr) = route.shards.get(i).and_then(|r| r.primary_address) else {
            return Err(format!("shard {}: no primary known", s.name));
        };
        let cfg = crate::discovery::endpoints::endpoint_config(c, s, addr, snap.upstream_tls(ci));
        // Connections are kept between passes (one per shard primary and database), so
        // rules added and removed again and again do not open new ones.
        let link_key = (c.name.clone(), addr, c.db);
        let mut conn = match LINKS.with(|l| l.borrow_mut().remove(&link_key)) {
            Some(l) => l,
            None => Control::open(&cfg)
                .await
                .map_err(|e| format!("shard {}: {e}", s.name))?,
        };
        let result: Result<(), String> = async {
        let mut cursor = Bytes::from_static(b"0");
        loop {
            let reply = call(
                &mut conn,
                &[
                    &b"SCAN"[..],
                    &cursor,
                    b"MATCH",
                    &pattern,
                    b"COUNT",
                    SCAN_COUNT.as_bytes(),
                ],
            )
            .await
            .map_err(|e| format!("shard {}: SCAN: {e}", s.name))?;
            let (next, keys) = scan_reply(reply).map_err(|e| format!("shard {}: {e}", s.name))?;
            let keys: Vec<Bytes> = match work {
                Work::Copy(_) => keys
                    .into_iter()
                    .filter(|k| route.picker.pick(k) == i)
                    .collect(),
                Work::Delete => keys
                    .into_iter()
                    .filter(|k| {
                        route.picker.pick(k) != i
                            && !route.hot_keys.iter().any(|r| k.starts_with(&r.prefix))
                    })
                    .collect(),
            };
            if !keys.is_empty() {
                match work {
                    Work::Copy(state) => {
                        for t in (0..c.shards.len()).filter(|&t| t != i) {
                            let Some(args) =
                                copy_command(route, t, 0, MIGRATE_TIMEOUT_MS, keys.iter().cloned())
                            else {
                                return Err(format!(
                                    "shard {}: no primary known",
                                    c.shards[t].name
                                ));
                            };
                            let mut answer = call(&mut conn, &args).await;
                            for _ in 1..MIGRATE_ATTEMPTS {
                                if !matches!(&answer, Ok(Frame::Error(e)) if e.starts_with(b"IOERR"))
                                {
                                    break;
                                }
                                answer = call(&mut conn, &args).await;
                            }
                            match answer {
                                Ok(Frame::Simple(_)) => {}
                                Ok(Frame::Error(e) | Frame::BlobError(e)) => {
                                    return Err(format!(
                                        "shard {}: MIGRATE to shard {}: {}",
                                        s.name,
                                        c.shards[t].name,
                                        String::from_utf8_lossy(&e)
                                    ))
                                }
                                Ok(other) => {
                                    return Err(format!(
                                        "shard {}: MIGRATE: unexpected reply {other:?}",
                                        s.name
                                    ))
                                }
                                Err(e) => return Err(format!("shard {}: MIGRATE: {e}", s.name)),
                            }
                        }
                        state.keys.fetch_add(keys.len() as u64, Ordering::Relaxed);
                    }
                    Work::Delete => {
                        let mut args = vec![Bytes::from_static(b"DEL")];
                        args.extend(keys.iter().cloned());
                        match call(&mut conn, &args).await {
                            Ok(Frame::Error(e) | Frame::BlobError(e)) => {
                                return Err(format!(
                                    "shard {}: DEL: {}",
                                    s.name,
                                    String::from_utf8_lossy(&e)
                                ))
                            }
                            Ok(_) => {}
                            Err(e) => return Err(format!("shard {}: DEL: {e}", s.name)),
                        }
                    }
                }
                done += keys.len() as u64;
                // The rate: no faster than KEYS_PER_SEC keys since the pass started.
                let due = started + Duration::from_millis(done * 1000 / KEYS_PER_SEC);
                tokio::time::sleep_until(due).await;
            }
            if &next[..] == b"0" {
                break;
            }
            cursor = next;
        }
        Ok(())
        }
        .await;
        // A connection that failed is dropped, never reused.
        if result.is_ok() {
            LINKS.with(|l| l.borrow_mut().insert(link_key, conn));
        }
        result?;
    }
    Ok(())
}

/// A link per shard primary, by (cluster, address, database).
type LinkKey = (String, std::net::SocketAddr, u32);

thread_local! {
    /// The copy thread's idle connections (its tasks all run on its one thread).
    static LINKS: std::cell::RefCell<HashMap<LinkKey, Control>> = std::cell::RefCell::default();
}

/// `SCAN`'s `MATCH` pattern for the keys starting with `prefix`: its glob characters escaped,
/// then `*`.
pub(crate) fn glob_prefix(prefix: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(prefix.len() + 1);
    for &b in prefix {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            p.push(b'\\');
        }
        p.push(b);
    }
    p.push(b'*');
    p
}

/// `SCAN`'s reply: the next cursor and the keys.
fn scan_reply(f: Frame) -> Result<(Bytes, Vec<Bytes>), String> {
    let Frame::Array(mut items) = f else {
        return Err(format!("SCAN: unexpected reply {f:?}"));
    };
    if items.len() != 2 {
        return Err("SCAN: unexpected reply".into());
    }
    let keys = match items.pop() {
        Some(Frame::Array(keys)) => keys
            .into_iter()
            .filter_map(|k| match k {
                Frame::Bulk(b) => Some(b),
                _ => None,
            })
            .collect(),
        _ => return Err("SCAN: unexpected reply".into()),
    };
    match items.pop() {
        Some(Frame::Bulk(c) | Frame::Simple(c)) => Ok((c, keys)),
        _ => Err("SCAN: unexpected reply".into()),
    }
}

/// One command of a pass on `conn`, answered within [`COMMAND_TIMEOUT`].
async fn call<B: AsRef<[u8]>>(conn: &mut Control, args: &[B]) -> Result<Frame, String> {
    match tokio::time::timeout(COMMAND_TIMEOUT, conn.call(args)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {COMMAND_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_glob_escaped() {
        assert_eq!(glob_prefix(b"HIGH_FREQ_"), b"HIGH_FREQ_*");
        assert_eq!(glob_prefix(b"a*b?[c]\\"), b"a\\*b\\?\\[c\\]\\\\*");
    }
}

//! The shared store of several respway-xds replicas: etcd (`serve --store
//! etcd://HOST:PORT[,HOST:PORT...]/PREFIX`).
//!
//! The resource files live in etcd, one key per file: `PREFIX/files/NAME.yaml`. Each replica
//! keeps a copy of them in its own resource directory (`--resources`, which it must not share):
//! at start it reads every file under the prefix at one revision and writes them there (and
//! removes the files etcd does not have), then follows the prefix with an etcd watch from that
//! revision on. The snapshot cache reads the directory as before; the store tells it to scan
//! after each change it wrote, and the directory is not polled otherwise, so a replica never
//! serves a set of files etcd did not hold at one revision.
//!
//! `POST /apply` (and `respway-xds apply`) through any replica validates the file against that
//! replica's copy, then writes it to etcd in a transaction that holds only if no file under the
//! prefix changed since the revision that copy is of: of two concurrent applies one wins and
//! the other is told (`changed in etcd since this replica read it`), as is an apply through a
//! replica that is behind. The apply answers once the replica's own copy has the write (its
//! watch saw it), so its reply's version is the one served. Every other replica sees the write
//! through its watch and pushes it the moment it arrives.
//!
//! A replica that loses etcd keeps serving its last copy, logs it, and follows the prefix again
//! (reading it whole) once etcd answers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::watch;

use crate::cache::{is_resource_name, ApplyError, Cache, SharedStore, StoreStatus};

pub mod fleet;

/// Between attempts to reach etcd again.
const RETRY: Duration = Duration::from_secs(1);
/// How long connecting to an etcd member may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The HTTP/2 keepalive to etcd: a PING after this long without a frame, answered within it.
const KEEPALIVE: Duration = Duration::from_secs(2);
/// How long an apply waits for its write to come back through the watch.
const APPLY_WAIT: Duration = Duration::from_secs(5);

/// A parsed `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    /// `HOST:PORT` of each etcd member.
    pub endpoints: Vec<String>,
    /// The key prefix (without a trailing `/`).
    pub prefix: String,
}

impl EtcdUrl {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn parse(url: &str) -> Result<EtcdUrl, String> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("{url:?}: expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX"))?;
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| format!("{url:?}: no /PREFIX after the endpoints"))?;
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(format!("{url:?}: the prefix is empty"));
        }
        let endpoints: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .collect();
        if endpoints.is_empty() || endpoints.iter().any(|h| !h.contains(':')) {
            return Err(format!("{url:?}: expected HOST:PORT endpoints"));
        }
        Ok(EtcdUrl {
            endpoints,
            prefix: format!("/{}", prefix.trim_start_matches('/')),
        })
    }

    fn files(&self) -> String {
        format!("{}/files/", self.prefix)
    }
}

/// A connection to etcd, made when first needed and made again after a failure.
struct Link {
    endpoints: Vec<String>,
    client: Mutex<Option<Client>>,
}

impl Link {
    fn new(endpoints: &[String]) -> Link {
        Link {
            endpoints: endpoints.to_vec(),
            client: Mutex::new(None),
        }
    }

    async fn get(&self) -> Result<Client, String> {
        if let Some(c) = self
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(c);
        }
        // A member that does not answer is given up on within seconds (the kernel's connect
        // retries take minutes), and an idle watch on a member that died, or lost its leader,
        // fails instead of waiting forever: the replica then says etcd is lost.
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(KEEPALIVE, KEEPALIVE)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        let c = Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| format!("etcd {}: {e}", self.endpoints.join(",")))?;
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    fn forget(&self) {
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// One replica's link to etcd.
pub struct EtcdStore {
    url: EtcdUrl,
    dir: PathBuf,
    link: Link,
    /// The revision of the copy's latest file change (a file's `mod_revision`, or a delete's
    /// revision): the generation its snapshot is served as, the same on every replica.
    changed: AtomicI64,
    /// The revision the copy is of, for applies waiting for their write.
    revision: watch::Sender<i64>,
    /// Whether the watch is following etcd now.
    connected: watch::Sender<bool>,
    /// Why etcd was last lost, and how often it was.
    lost: Mutex<(Option<String>, u64)>,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to etcd and writes the files under the prefix into `dir` (the first copy).
    /// Call from a Tokio runtime. When etcd does not answer, the directory's copy from an
    /// earlier run is served (and reported as such) until [`EtcdStore::follow`] reaches it.
    pub async fn open(url: EtcdUrl, dir: &Path) -> Arc<EtcdStore> {
        let store = Arc::new(EtcdStore {
            link: Link::new(&url.endpoints),
            url,
            dir: dir.to_path_buf(),
            changed: AtomicI64::new(0),
            revision: watch::Sender::new(0),
            connected: watch::Sender::new(false),
            lost: Mutex::new((None, 0)),
            runtime: tokio::runtime::Handle::current(),
        });
        if let Err(e) = store.read_all().await {
            store.lose(e);
        }
        store
    }

    /// Notes that etcd is lost (logged once per loss).
    fn lose(&self, error: String) {
        let was = self.connected.send_replace(false);
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if was || lost.1 == 0 {
            lost.1 += 1;
            tracing::warn!(error = %error, "etcd lost: serving the last copy of the resource files");
        }
        lost.0 = Some(error);
    }

    /// Whether the store follows etcd now (`false` while etcd is lost: the last copy is served).
    pub fn connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// The revision of the copy's latest file change: the generation it is served as.
    fn changed(&self) -> u64 {
        u64::try_from(self.changed.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// The etcd revision this replica's copy is of.
    pub fn revision(&self) -> i64 {
        *self.revision.borrow()
    }

    async fn client(&self) -> Result<Client, String> {
        self.link.get().await
    }

    fn forget_client(&self) {
        self.link.forget();
    }

    /// Reads every file under the prefix at one revision into the directory.
    async fn read_all(&self) -> Result<(), String> {
        let mut c = self.client().await?;
        let prefix = self.url.files();
        let got = c
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| {
                self.forget_client();
                format!("etcd get {prefix}: {e}")
            })?;
        let revision = got.header().map_or(0, |h| h.revision());
        let mut changed = 0;
        let mut texts = BTreeMap::new();
        for kv in got.kvs() {
            let Some(name) = kv.key_str().ok().and_then(|k| k.strip_prefix(&prefix)) else {
                continue;
            };
            if !is_resource_name(name) {
                continue;
            }
            changed = changed.max(kv.mod_revision());
            texts.insert(
                name.to_string(),
                kv.value_str().unwrap_or_default().to_string(),
            );
        }
        // Files of the directory that etcd does not have go.
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if is_resource_name(&name) && !texts.contains_key(&name) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        for (name, text) in &texts {
            self.write(name, text)?;
        }
        self.changed.store(changed, Ordering::Relaxed);
        self.revision.send_replace(revision);
        Ok(())
    }

    /// Writes one file of the copy atomically (a hidden temporary file renamed over it).
    fn write(&self, name: &str, text: &str) -> Result<(), String> {
        let target = self.dir.join(name);
        if std::fs::read_to_string(&target).is_ok_and(|t| t == text) {
            return Ok(());
        }
        let tmp = self.dir.join(format!(".{name}.etcd.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &target))
            .map_err(|e| format!("{}: {e}", target.display()))
    }

    /// Follows the prefix forever: each change is written into the directory and `cache`
    /// scans it; a lost etcd is read whole again once it answers.
    pub async fn follow(self: Arc<Self>, cache: Arc<Cache>) {
        let mut read = self.revision() == 0;
        if !read {
            // The server loaded the copy as its own generation 1: serve it as the store's.
            self.settle(&cache, None).await;
        }
        loop {
            if read {
                if let Err(e) = self.read_all().await {
                    self.lose(e);
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
                self.settle(&cache, None).await;
            }
            if let Err(e) = self.watch_once(&cache).await {
                self.lose(e);
            }
            read = true;
            tokio::time::sleep(RETRY).await;
        }
    }

    /// One watch from the copy's revision on, until it fails.
    async fn watch_once(self: &Arc<Self>, cache: &Arc<Cache>) -> Result<(), String> {
        let mut c = self.client().await?;
        let prefix = self.url.files();
        let from = self.revision() + 1;
        let mut stream = c
            .watch(
                prefix.as_str(),
                Some(WatchOptions::new().with_prefix().with_start_revision(from)),
            )
            .await
            .map_err(|e| {
                self.forget_client();
                format!("etcd watch {prefix}: {e}")
            })?;
        if !self.connected.send_replace(true) {
            self.lost.lock().unwrap_or_else(|e| e.into_inner()).0 = None;
            tracing::info!(prefix = %self.url.prefix, "following the resource files in etcd");
        }
        loop {
            let msg = stream.message().await.map_err(|e| {
                self.forget_client();
                format!("etcd watch: {e}")
            })?;
            let Some(resp) = msg else {
                return Err("etcd closed the watch".into());
            };
            if resp.canceled() {
                return Err(format!(
                    "etcd cancelled the watch: {}",
                    resp.cancel_reason()
                ));
            }
            // The events' own revisions: the header's may count writes outside the prefix.
            let mut revision = 0;
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let Some(name) = kv.key_str().ok().and_then(|k| k.strip_prefix(&prefix)) else {
                    continue;
                };
                revision = revision.max(kv.mod_revision());
                if !is_resource_name(name) {
                    continue;
                }
                match ev.event_type() {
                    EventType::Put => self.write(name, kv.value_str().unwrap_or_default())?,
                    EventType::Delete => {
                        let _ = std::fs::remove_file(self.dir.join(name));
                    }
                }
                self.changed.fetch_max(kv.mod_revision(), Ordering::Relaxed);
            }
            if revision > 0 {
                self.settle(cache, Some(revision)).await;
            }
        }
    }

    /// Has `cache` scan the copy, serving it as generation [`EtcdStore::changed`] at least;
    /// then, with `revision`, moves the copy's revision there. That happens on the scanning
    /// thread, right after the scan: an apply waiting for it answers then, not once this task
    /// is polled again behind every stream woken by the push.
    async fn settle(self: &Arc<Self>, cache: &Arc<Cache>, revision: Option<i64>) {
        let (store, c, changed) = (self.clone(), cache.clone(), self.changed());
        let scanned = tokio::task::spawn_blocking(move || {
            c.reload_at(changed);
            if let Some(r) = revision {
                store.revision.send_replace(r);
            }
        });
        if let Err(e) = scanned.await {
            tracing::error!(error = %e, "resource directory scan panicked");
        }
    }

    /// Writes `text` as file `name` to etcd, if no file under the prefix changed since the
    /// revision this replica's copy is of; then waits until the copy has it. Blocking (the
    /// cache's apply runs on a blocking thread).
    ///
    /// # Errors
    /// [`ApplyError::Conflict`]: another write came first; [`ApplyError::Unavailable`]: etcd
    /// did not answer, or the copy did not catch up.
    pub fn put_blocking(&self, name: &str, text: &str) -> Result<(), ApplyError> {
        self.runtime.block_on(self.put(name, text))
    }

    /// [`EtcdStore::put_blocking`], from async code.
    ///
    /// # Errors
    /// As [`EtcdStore::put_blocking`].
    pub async fn put(&self, name: &str, text: &str) -> Result<(), ApplyError> {
        let unavailable = ApplyError::Unavailable;
        let base = self.revision();
        let prefix = self.url.files();
        let key = format!("{prefix}{name}");
        // Every key under the prefix last modified at or before the copy's revision.
        let guard = Compare::mod_revision(prefix.as_str(), CompareOp::Less, base + 1).with_prefix();
        let txn = Txn::new()
            .when([guard])
            .and_then([TxnOp::put(key.as_str(), text, None)]);
        let mut c = self.client().await.map_err(unavailable)?;
        let resp = tokio::time::timeout(APPLY_WAIT, c.txn(txn))
            .await
            .map_err(|_| unavailable(format!("etcd did not answer the write within {APPLY_WAIT:?}: it may or may not have been written (see respway-xds status)")))?
            .map_err(|e| {
                self.forget_client();
                unavailable(format!("etcd txn: {e}"))
            })?;
        if !resp.succeeded() {
            return Err(ApplyError::Conflict(format!(
                "the resource files changed in etcd since this replica read them (revision {base}): nothing written; apply again"
            )));
        }
        let written = resp.header().map_or(base + 1, |h| h.revision());
        let mut rx = self.revision.subscribe();
        tokio::time::timeout(APPLY_WAIT, rx.wait_for(|r| *r >= written))
            .await
            .map_err(|_| {
                unavailable(format!("written to etcd (revision {written}), but this replica has not seen it within {APPLY_WAIT:?}"))
            })?
            .map_err(|e| unavailable(e.to_string()))?;
        Ok(())
    }
}

impl SharedStore for EtcdStore {
    fn write(&self, name: &str, text: &str) -> Result<(), ApplyError> {
        self.put_blocking(name, text)
    }

    fn status(&self) -> StoreStatus {
        let lost = self.lost.lock().unwrap_or_else(|e| e.into_inner()).clone();
        StoreStatus {
            url: format!("etcd://{}{}", self.url.endpoints.join(","), self.url.prefix),
            connected: self.connected(),
            revision: self.revision(),
            error: lost.0,
            lost: lost.1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            EtcdUrl::parse("etcd://127.0.0.1:2379,10.0.0.2:2379/respway/prod").unwrap(),
            EtcdUrl {
                endpoints: vec!["127.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                prefix: "/respway/prod".into(),
            }
        );
        assert!(EtcdUrl::parse("http://x:1/p").is_err());
        assert!(EtcdUrl::parse("etcd://x:1/").is_err());
        assert!(EtcdUrl::parse("etcd://x/p").is_err());
        assert!(EtcdUrl::parse("etcd://x:1").is_err());
    }
}

//! The management server's snapshot cache: a directory of YAML resource files, merged into one
//! snapshot per node, validated, versioned and published on a [`watch`] channel that every
//! ADS stream of [`crate::server`] follows.
//!
//! # Files
//! Every `*.yaml` / `*.yml` file in the directory (not in subdirectories, and not hidden: names
//! starting with `.` are skipped, which is where [`Cache::apply`] writes its temporary file) is
//! the sidecar's YAML schema (`xds/SCHEMA.md`) with `listeners` and `clusters` both optional,
//! no `node`, and an optional `targets: { node_ids: [...], zones: [...] }`. A file naming
//! `zones` may not carry secrets ([`crate::secure::secret_holders`]): a zone is declared by the
//! sidecar, not proven by its certificate; such a file is invalid (its last good version stays).
//!
//! # Merge rules (also in `xds/SCHEMA.md`)
//! - A file without `targets` is for every node. A file with `targets` is for the nodes whose
//!   id is in `node_ids` **or** whose zone (the ADS request's `node.locality.zone`) is in
//!   `zones`.
//! - A node's snapshot is the union, by resource name (listeners and clusters separately), of
//!   the files it matches. When several files define the same name, the most specific one wins:
//!   a file matching the node by id, then by zone, then an untargeted file. Two files defining
//!   the same name at the same precedence for some node is an error.
//! - A node that matches no file gets no snapshot: the server does not answer it (it keeps what
//!   it has, e.g. its bootstrap's static resources).
//! - Each merged snapshot must pass [`crate::translate`] (so routes may name clusters of other
//!   files). Route and mirror clusters are checked on the merged model first, so that those
//!   errors name the file's YAML paths (`routes.prefixes[0].cluster`), not the Envoy ones the
//!   translation would. A snapshot with no listener or no cluster is not served: its nodes are
//!   treated like nodes no file is for, and the class is listed in [`LoadReport::unserved`]
//!   (e.g. shared clusters plus per-node listener files: nodes no listener file names).
//!
//! # Validation and versions
//! A snapshot depends only on which named ids and zones a node has, so every distinct snapshot
//! is built and translated when the files change, for every combination of a named id (or
//! none) and a named zone (or none). A file that does not parse keeps its previous good
//! version in the snapshot (or stays out, if it never had one) and is reported. Each class of
//! nodes stands alone: a merged snapshot that fails translation is reported, naming its
//! nodes, and they keep their previous snapshot (or get none, if they had none), while every
//! other class gets the change. A snapshot that gives a listener its nodes already have a new
//! address fails the same way: running sidecars cannot move a listener and would NACK it (the error
//! names the listener and `address`). When no node gets anything new, nothing is committed.
//! [`Cache::apply`] refuses a file that makes any class fail.
//!
//! Each committed change gets this server's next generation number ([`Snapshot::version`]:
//! 1, 2, ..., shown by the admin endpoint; it counts this process's commits and is never sent
//! to sidecars). The `version_info` of a node's resources of one type is a hash of their
//! content ([`content_version`]): it moves only for types whose content moved, and two
//! servers serving the same directory (or one server before and after a restart) give the same
//! `version_info` for the same content, so a sidecar that fails over from one to the other
//! reports a version the other recognizes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use respway_filters::model::{self, Config};
use tokio::sync::watch;

use crate::yaml::{self, Fragment};
use crate::{to_resources, translate, Resources};

// === ResourceType ===

pub use crate::yaml::Targets;
pub use crate::ResourceType;

// === Targeting (the files each node gets) ===

/// How specifically a file matches a node; the higher wins a name defined by several files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Level {
    /// An untargeted file.
    All,
    /// The node's zone is in the file's `targets.zones`.
    Zone,
    /// The node's id is in the file's `targets.node_ids`.
    NodeId,
}

impl Level {
    fn describe(self) -> &'static str {
        match self {
            Level::All => "files for every node",
            Level::Zone => "files targeting the zone",
            Level::NodeId => "files targeting the node id",
        }
    }
}

/// A resource file that parsed.
#[derive(Debug)]
struct LoadedFile {
    name: String,
    text: String,
    targets: Option<Targets>,
    config: Config,
}

impl LoadedFile {
    /// How the file matches node `id` in `zone`; `None` when it does not.
    fn level(&self, id: &str, zone: Option<&str>) -> Option<Level> {
        let Some(t) = &self.targets else {
            return Some(Level::All);
        };
        if t.node_ids.iter().any(|n| n == id) {
            Some(Level::NodeId)
        } else if zone.is_some_and(|z| t.zones.iter().any(|x| x == z)) {
            Some(Level::Zone)
        } else {
            None
        }
    }
}

mod merge;
mod snapshot;

use merge::*;
pub use snapshot::*;

/// What became of one resource file at the last scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileState {
    /// It parsed; its current content is in the served snapshot, unless the merged snapshot
    /// was rejected (see [`LoadReport::errors`]).
    Ok,
    /// It did not parse (or could not be read).
    Invalid {
        /// Every error, one per line, each starting with the file name.
        error: String,
        /// Whether an earlier good version of the file is still served.
        serving_previous: bool,
    },
}

/// One resource file in a [`LoadReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReport {
    /// The file name inside the directory.
    pub name: String,
    /// Its state.
    pub state: FileState,
}

/// The state of the resource directory: the served version and what was wrong at the last scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The served snapshot version (0: nothing loaded yet).
    pub version: u64,
    /// The files found at the last scan, by name.
    pub files: Vec<FileReport>,
    /// Errors of the merged snapshots at the last scan: the nodes they name keep what they
    /// were served (the change reached the others, if any).
    pub errors: Vec<String>,
    /// The node classes served nothing because their files define no listener or no cluster.
    pub unserved: Vec<String>,
}

/// The result of one scan of the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reload {
    /// The new version, when the scan committed one.
    pub committed: Option<u64>,
    /// Every error of the scan (invalid files, then merge errors); empty when all is well.
    pub errors: Vec<String>,
}

/// Why [`Cache::apply`] refused a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The name is not a plain `*.yaml`/`*.yml` file name.
    #[error("invalid file name {0:?}: expected a plain name ending in .yaml or .yml")]
    Name(String),
    /// The file or the merged snapshot is invalid; nothing was written.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
    /// The file could not be written.
    #[error("cannot write {0}")]
    Io(String),
    /// The shared store (etcd) refused the write: another write came first (the files
    /// changed since this replica's copy was read). Nothing was written.
    #[error("{0}")]
    Conflict(String),
    /// The shared store (etcd) did not answer, or this replica did not see the write within
    /// the wait: try again later (`respway-xds status` says what is served).
    #[error("{0}")]
    Unavailable(String),
}

/// Where an apply writes instead of the directory: a store shared by several replicas (etcd,
/// see [`crate::store`]), which writes the file into the directory itself once it holds it,
/// and has the cache scan.
pub trait SharedStore: Send + Sync {
    /// Writes file `name` to the store and returns once this replica's directory holds it
    /// and was scanned. Blocking (applies run on a blocking thread).
    ///
    /// # Errors
    /// [`ApplyError::Conflict`]: another write came first; [`ApplyError::Unavailable`]: the
    /// store is not reachable, or the write was not seen in time.
    fn write(&self, name: &str, text: &str) -> Result<(), ApplyError>;
    /// The store's state, for `GET /status`.
    fn status(&self) -> StoreStatus;
}

/// A shared store's state in `GET /status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreStatus {
    /// `etcd://HOST:PORT[,...]/PREFIX`.
    pub url: String,
    /// Whether the replica follows the store now; `false`: it serves its last copy.
    pub connected: bool,
    /// The store revision this replica's copy of the files is of.
    pub revision: i64,
    /// Why the store was lost, while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Times the replica lost the store since it started.
    #[serde(default)]
    pub lost: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// The directory's `*.yaml` contents at the last scan; `None` before the first.
    seen: Option<BTreeMap<String, Result<String, String>>>,
    files: Vec<FileReport>,
    errors: Vec<String>,
    /// The least generation the next commit gets (a shared store's revision).
    floor: u64,
}

/// The snapshot cache over one resource directory. Cheap to share (`Arc`); scans are
/// serialized.
pub struct Cache {
    dir: PathBuf,
    inner: Mutex<Inner>,
    tx: watch::Sender<Arc<Snapshot>>,
    /// Set with a shared store: applies go through it.
    store: std::sync::OnceLock<Arc<dyn SharedStore>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("dir", &self.dir)
            .field("shared_store", &self.store.get().map(|s| s.status().url))
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// A cache over `dir`, with nothing loaded yet (version 0): call [`Cache::reload`] or run
    /// [`Cache::watch`].
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache {
            dir: dir.into(),
            inner: Mutex::new(Inner::default()),
            tx: watch::Sender::new(Arc::new(Snapshot::default())),
            store: std::sync::OnceLock::new(),
        }
    }

    /// Sends applies through `store` instead of writing the directory (once; later calls
    /// change nothing).
    pub fn set_store(&self, store: Arc<dyn SharedStore>) {
        let _ = self.store.set(store);
    }

    /// The shared store's state; `None` without one (the directory is the store).
    pub fn store_status(&self) -> Option<StoreStatus> {
        self.store.get().map(|s| s.status())
    }

    /// The resource directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The served snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees every committed snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// The served version and the errors of the last scan.
    pub fn report(&self) -> LoadReport {
        let inner = self.lock();
        let snapshot = self.snapshot();
        LoadReport {
            version: snapshot.version,
            files: inner.files.clone(),
            errors: inner.errors.clone(),
            unserved: snapshot.unserved().map(str::to_string).collect(),
        }
    }

    /// Scans the directory now; commits and publishes a new snapshot when the files changed
    /// and the result is valid. Blocking (file I/O and translation): from async code, call it
    /// through `spawn_blocking`, as [`Cache::watch`] does.
    pub fn reload(&self) -> Reload {
        let mut inner = self.lock();
        self.scan(&mut inner, None)
    }

    /// [`Cache::reload`], serving the result as generation `generation` at least: a shared
    /// store's revision, so that every replica of the store numbers the same files alike.
    /// When the scan commits nothing (the files make the same snapshot) and the served
    /// generation is below it, the served snapshot is published again as that generation.
    pub fn reload_at(&self, generation: u64) -> Reload {
        let mut inner = self.lock();
        inner.floor = inner.floor.max(generation);
        let mut reload = self.scan(&mut inner, None);
        let active = self.snapshot();
        if reload.committed.is_none() && active.version < inner.floor && active.version > 0 {
            let built = build(active.files.clone(), &active, inner.floor);
            let version = built.snapshot.version;
            self.tx.send_replace(Arc::new(built.snapshot));
            tracing::info!(version, "resource snapshot served as the store's revision");
            reload.committed = Some(version);
        }
        reload
    }

    /// Polls the directory every `interval` (≈200 ms gives pushes well within a second of an
    /// edit), forever.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            let this = self.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || this.reload()).await {
                tracing::error!(error = %e, "resource directory scan panicked");
            }
        }
    }

    /// Validates `text` as resource file `name` (alone, and merged with the directory as it
    /// would be with it), then writes it into the directory atomically (a hidden temporary
    /// file renamed over `name`) and scans, so it is served as the next version. Returns the
    /// served version afterwards. Blocking, like [`Cache::reload`].
    ///
    /// # Errors
    /// A bad name, an invalid file or merged snapshot (nothing is written), or a write error.
    pub fn apply(&self, name: &str, text: &str) -> Result<u64, ApplyError> {
        if name.starts_with('.')
            || name.contains('/')
            || name.contains('\\')
            || !is_resource_file(name)
        {
            return Err(ApplyError::Name(name.to_string()));
        }
        let mut inner = self.lock();
        if let Err(errors) = parse_file(name, text) {
            return Err(ApplyError::Invalid(errors));
        }
        match self.candidate(&self.read_dir(Some((name, text))), 0).1 {
            Err(errors) => return Err(ApplyError::Invalid(errors)),
            Ok(Some(s)) if !s.errors.is_empty() => return Err(ApplyError::Invalid(s.errors)),
            Ok(Some(_) | None) => {}
        }
        if let Some(store) = self.store.get() {
            // The store writes the file here and scans once it holds it; its own check (no
            // change since this copy was read) stands in for this lock.
            drop(inner);
            store.write(name, text)?;
            let inner = self.lock();
            return if inner.errors.is_empty() {
                Ok(self.tx.borrow().version)
            } else {
                Err(ApplyError::Invalid(inner.errors.clone()))
            };
        }
        let tmp = self.dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let target = self.dir.join(name);
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &target))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                ApplyError::Io(format!("{}: {e}", target.display()))
            })?;
        self.scan(&mut inner, None);
        if inner.errors.is_empty() {
            // Other files may be invalid; they do not concern this one.
            Ok(self.tx.borrow().version)
        } else {
            // Another file changed at the same moment and broke the merged snapshot.
            Err(ApplyError::Invalid(inner.errors.clone()))
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory's resource files: name → content, or why it could not be read.
    fn read_dir(&self, extra: Option<(&str, &str)>) -> BTreeMap<String, Result<String, String>> {
        let mut out = BTreeMap::new();
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                for e in entries.flatten() {
                    let Ok(name) = e.file_name().into_string() else {
                        continue;
                    };
                    if name.starts_with('.') || !is_resource_file(&name) {
                        continue;
                    }
                    if !e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
                        continue;
                    }
                    let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string());
                    out.insert(name, text);
                }
            }
            Err(e) => {
                out.insert(
                    String::new(),
                    Err(format!("cannot read {}: {e}", self.dir.display())),
                );
            }
        }
        if let Some((name, text)) = extra {
            out.insert(name.to_string(), Ok(text.to_string()));
        }
        out
    }

    /// The snapshot `disk` would give: per-file states, and the new snapshot (`Ok(None)` when
    /// it equals the served one) or the merge errors.
    #[allow(clippy::type_complexity)]
    fn candidate(
        &self,
        disk: &BTreeMap<String, Result<String, String>>,
        floor: u64,
    ) -> (Vec<FileReport>, Result<Option<Snapshot>, Vec<String>>) {
        let active = self.snapshot();
        let previous = |name: &str| active.files.iter().find(|f| f.name == name).cloned();
        let mut files = Vec::new();
        let mut reports = Vec::new();
        for (name, text) in disk {
            if name.is_empty() {
                // The directory itself could not be read: keep serving what is served.
                let error = text.clone().err().unwrap_or_default();
                reports.push(FileReport {
                    name: self.dir.display().to_string(),
                    state: FileState::Invalid {
                        error,
                        serving_previous: true,
                    },
                });
                return (reports, Ok(None));
            }
            let parsed = match text {
                Ok(text) => match previous(name) {
                    Some(f) if f.text == *text => Ok(f),
                    _ => parse_file(name, text)
                        .map(
                            |Fragment {
                                 targets, config, ..
                             }| {
                                Arc::new(LoadedFile {
                                    name: name.clone(),
                                    text: text.clone(),
                                    targets,
                                    config,
                                })
                            },
                        )
                        .map_err(|e| e.join("\n")),
                },
                Err(e) => Err(format!("{name}: cannot read: {e}")),
            };
            match parsed {
                Ok(f) => {
                    files.push(f);
                    reports.push(FileReport {
                        name: name.clone(),
                        state: FileState::Ok,
                    });
                }
                Err(error) => {
                    let prev = previous(name);
                    reports.push(FileReport {
                        name: name.clone(),
                        state: FileState::Invalid {
                            error,
                            serving_previous: prev.is_some(),
                        },
                    });
                    files.extend(prev);
                }
            }
        }
        let unchanged = files.len() == active.files.len()
            && files
                .iter()
                .zip(&active.files)
                .all(|(a, b)| Arc::ptr_eq(a, b));
        if unchanged {
            return (reports, Ok(None));
        }
        let built = build(files, &active, (active.version + 1).max(floor));
        let result = if built.snapshot.errors.is_empty() || built.changed {
            Ok(Some(built.snapshot))
        } else {
            // Every class with errors keeps its snapshot, and no other moved: nothing to commit.
            Err(built.snapshot.errors)
        };
        (reports, result)
    }

    fn scan(&self, inner: &mut Inner, extra: Option<(&str, &str)>) -> Reload {
        let disk = self.read_dir(extra);
        if inner.seen.as_ref() == Some(&disk) {
            return Reload {
                committed: None,
                errors: Vec::new(),
            };
        }
        let (reports, result) = self.candidate(&disk, inner.floor);
        let mut errors: Vec<String> = Vec::new();
        for r in &reports {
            if let FileState::Invalid {
                error,
                serving_previous,
            } = &r.state
            {
                tracing::warn!(
                    file = %r.name,
                    serving_previous,
                    "invalid resource file, not pushed:\n{error}"
                );
                errors.push(error.clone());
            }
        }
        let mut committed = None;
        match result {
            Ok(Some(snapshot)) => {
                let version = snapshot.version;
                for e in &snapshot.errors {
                    tracing::warn!(
                        version,
                        "merged snapshot invalid for some nodes, which keep their previous one: {e}"
                    );
                }
                for u in snapshot.unserved() {
                    tracing::warn!(version, "{u}");
                }
                inner.errors = snapshot.errors.clone();
                errors.extend(snapshot.errors.iter().cloned());
                self.tx.send_replace(Arc::new(snapshot));
                tracing::info!(version, "resource snapshot committed");
                committed = Some(version);
            }
            Ok(None) => inner.errors = self.tx.borrow().errors.clone(),
            Err(merge_errors) => {
                for e in &merge_errors {
                    tracing::warn!(
                        version = self.tx.borrow().version,
                        "merged snapshot invalid, not pushed; the served version stays: {e}"
                    );
                }
                inner.errors = merge_errors.clone();
                errors.extend(merge_errors);
            }
        }
        inner.seen = Some(disk);
        inner.files = reports;
        Reload { committed, errors }
    }
}

/// Parses resource file `name`; its errors each start with the name. A file for zones may not
/// carry secrets: a zone is what a sidecar says it is (`node.locality.zone`), not what its
/// client certificate proves, so only node ids (and every node) are bound to certificates.
fn parse_file(name: &str, text: &str) -> Result<Fragment, Vec<String>> {
    let fragment = yaml::parse_fragment(text).map_err(|e| {
        e.iter()
            .map(|e| prefixed(name, &e.to_string()))
            .collect::<Vec<_>>()
    })?;
    if fragment
        .targets
        .as_ref()
        .is_some_and(|t| !t.zones.is_empty())
    {
        let holders = crate::secure::secret_holders(&fragment.resources);
        if !holders.is_empty() {
            let verb = if holders.len() == 1 {
                "carries"
            } else {
                "carry"
            };
            return Err(vec![format!(
                "{name}: targets.zones: {} {verb} secrets (inline passwords or keys), which a \
                 file for zones may not: a zone is what a sidecar says it is, not what its \
                 certificate proves; put them in files with targets.node_ids (served only to \
                 each node's certificate)",
                holders.join(", ")
            )]);
        }
    }
    Ok(fragment)
}

/// `name: ` in front of every line of `text`.
fn prefixed(name: &str, text: &str) -> String {
    text.lines()
        .map(|l| format!("{name}: {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_resource_file(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}

/// Whether `name` is a resource file's name: a `*.yaml` / `*.yml` file directly in the
/// directory, not hidden (a shared store keeps only such files in a replica's copy).
pub(crate) fn is_resource_name(name: &str) -> bool {
    !name.starts_with('.') && !name.contains('/') && is_resource_file(name)
}

#[cfg(test)]
mod tests;

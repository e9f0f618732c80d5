//! What the server reports: per file, node and type (versions sent, ACKed, NACKed), refusals,
//! and the registry of connected nodes it is built from.

use super::*;

// === status ===

/// Everything `GET /status` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// The served snapshot version (0: nothing loaded).
    pub version: u64,
    /// The resource files at the last scan.
    pub files: Vec<FileStatus>,
    /// Errors of the merged snapshots at the last scan: the nodes each names keep what they
    /// were served; the change reached the others.
    pub errors: Vec<String>,
    /// The classes of nodes served nothing because their files define no listener or no
    /// cluster (e.g. nodes no per-node listener file names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unserved: Vec<String>,
    /// Every node seen since the server started, by id.
    pub nodes: Vec<NodeStatus>,
    /// The latest refused ADS streams (at most [`MAX_REFUSALS`], oldest first), by the peer
    /// that opened them: not attributed to the node id the peer claimed.
    #[serde(default)]
    pub refusals: Vec<Refusal>,
    /// The admin port's connections and failed accepts.
    #[serde(default)]
    pub admin: AdminStats,
    /// Failed accepts on the ADS port, each followed by a pause.
    #[serde(default)]
    pub ads_accept_errors: u64,
    /// The store shared with other replicas (`serve --store`); absent when the resource
    /// directory is the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<crate::cache::StoreStatus>,
}

/// How many refused streams [`ServerStatus::refusals`] keeps.
pub const MAX_REFUSALS: usize = 64;

/// A refused ADS stream: a peer that claimed a node id whose resources carry secrets without a
/// client certificate for that id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    /// When, in seconds since the Unix epoch.
    pub at: u64,
    /// The peer's address.
    pub peer: Option<String>,
    /// The DNS subjectAltNames of the peer's client certificate; `None`: it presented none.
    pub certificate: Option<Vec<String>>,
    /// The node id the peer claimed (not proven).
    pub claimed_node: String,
    /// Why it was refused (what the peer was told).
    pub message: String,
}

/// One resource file in [`ServerStatus`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileStatus {
    /// The file name in the resource directory.
    pub name: String,
    /// Whether its current content parsed.
    pub ok: bool,
    /// Why not, one error per line.
    pub error: Option<String>,
    /// When not ok: whether an earlier good version of it is still served.
    pub serving_previous: bool,
}

/// One node (by id) in [`ServerStatus`]. Streams of several sidecars sharing an id are merged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// `node.id`.
    pub id: String,
    /// `node.locality.zone`, when set.
    pub zone: Option<String>,
    /// Whether an ADS stream of this node is open.
    pub connected: bool,
    /// Why this node is served nothing although files are for it (they define no listener or
    /// no cluster for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unserved: Option<String>,
    /// The server generation ([`ServerStatus::version`]) its stream has last caught up with:
    /// every type whose content for this node changed by then is in `sent` (0: none yet). With
    /// `sent == acked` it tells that the node holds a given `POST /apply`'s result, also when
    /// that change left its own content as it was (then nothing is sent).
    #[serde(default)]
    pub generation: u64,
    /// Per type URL.
    pub types: BTreeMap<String, TypeStatus>,
    /// The sidecar's admin endpoint (`IP:port`), as its last opened stream named it in
    /// `node.metadata` ([`NODE_ADMIN_METADATA`](crate::names::NODE_ADMIN_METADATA)); `None`
    /// (left out of the JSON) when it named none: no admin endpoint, or not a respway sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// With a shared store (`serve --store`): the respway-xds replica its stream is on (this
    /// replica's name, or another's as published in the store); left out without a store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// One node's state for one resource type. ACKs and NACKs are tracked apart: a NACKed
/// version is never shown as ACKed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TypeStatus {
    /// The `version_info` of the last response sent.
    pub sent: Option<String>,
    /// The version of the last response the node ACKed: the one sent with the nonce that a
    /// request without `error_detail` answered. A NACK (a request with `error_detail`, whatever
    /// its `version_info`) never changes it, nor does a request answering a nonce the server
    /// did not send.
    pub acked: Option<String>,
    /// The last NACK, until the node ACKs the latest version sent.
    pub nack: Option<Nack>,
}

/// A rejected response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Nack {
    /// The rejected version: the one sent with the nonce the NACK answered (`None` when that
    /// nonce is not one of the stream's recent ones).
    pub version: Option<String>,
    /// The nonce the NACK answered (`response_nonce`).
    #[serde(default)]
    pub nonce: String,
    /// `error_detail.message`: what the node found wrong.
    pub message: String,
}

#[derive(Debug, Default)]
pub(super) struct NodeEntry {
    pub(super) zone: Option<String>,
    pub(super) admin: Option<String>,
    pub(super) streams: u32,
    pub(super) generation: u64,
    pub(super) types: [TypeStatus; 3],
}

/// Per-node ACK/NACK state, shared by the stream tasks, and the latest refused streams. Each
/// node's entry has a lock of its own, which its streams hold a handle to ([`NodeHandle`]): a
/// push to many streams updates their entries without a shared lock.
#[derive(Debug, Default)]
pub(super) struct Registry {
    pub(super) nodes: Mutex<BTreeMap<String, NodeHandle>>,
    pub(super) refusals: Mutex<VecDeque<Refusal>>,
    /// Counts the changes to any node's entry (a shared store publishes the rows again only
    /// when it moved).
    pub(super) changes: Arc<AtomicU64>,
}

/// One node's entry in the [`Registry`], and the registry's change count.
#[derive(Debug, Clone)]
pub(super) struct NodeHandle(Arc<Mutex<NodeEntry>>, Arc<AtomicU64>);

impl NodeHandle {
    /// The entry, locked; the registry's change count moves when the guard is taken (the
    /// caller changes it).
    fn lock(&self) -> MutexGuard<'_, NodeEntry> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One stream of the node fewer.
    pub(super) fn disconnect(&self) {
        let mut e = self.lock();
        e.streams = e.streams.saturating_sub(1);
    }

    /// Notes that a stream of the node has sent what generation `generation` changed for it.
    pub(super) fn caught_up(&self, generation: u64) {
        self.lock().generation = generation;
    }

    pub(super) fn update(&self, t: ResourceType, f: impl FnOnce(&mut TypeStatus)) {
        f(&mut self.lock().types[t.index()]);
    }
}

impl Registry {
    pub(super) fn lock(&self) -> MutexGuard<'_, BTreeMap<String, NodeHandle>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A stream of node `id` opened: its entry, to update it with.
    pub(super) fn connect(&self, id: &str, zone: Option<&str>, admin: Option<&str>) -> NodeHandle {
        let node = self
            .lock()
            .entry(id.to_string())
            .or_insert_with(|| NodeHandle(Arc::default(), self.changes.clone()))
            .clone();
        {
            let mut e = node.lock();
            e.zone = zone.map(str::to_string);
            e.admin = admin.map(str::to_string);
            e.streams += 1;
        }
        node
    }

    pub(super) fn refuse(&self, refusal: Refusal) {
        let mut list = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if list.len() == MAX_REFUSALS {
            list.pop_front();
        }
        list.push_back(refusal);
    }

    pub(super) fn refusals(&self) -> Vec<Refusal> {
        let list = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        list.iter().cloned().collect()
    }

    pub(super) fn status(&self, snapshot: &Snapshot) -> Vec<NodeStatus> {
        self.lock()
            .iter()
            .map(|(id, e)| (id, e.0.lock().unwrap_or_else(|p| p.into_inner())))
            .map(|(id, e)| NodeStatus {
                id: id.clone(),
                zone: e.zone.clone(),
                connected: e.streams > 0,
                unserved: snapshot
                    .unserved_reason(id, e.zone.as_deref())
                    .map(str::to_string),
                generation: e.generation,
                types: ResourceType::PUSH_ORDER
                    .into_iter()
                    .map(|t| (t.type_url().to_string(), e.types[t.index()].clone()))
                    .collect(),
                admin: e.admin.clone(),
                replica: None,
            })
            .collect()
    }
}

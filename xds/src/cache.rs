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

// === Snapshot ===

/// The resources of one type for one node, keyed by resource name (a listener's or cluster's
/// `name`, an assignment's `cluster_name`), packed as `Any`.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeResources {
    /// The `version_info` sent with them: [`content_version`] of `resources`.
    pub version: String,
    /// The resources by name.
    pub resources: BTreeMap<String, Any>,
}

/// What one node is served: one [`TypeResources`] per type.
#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    types: [Arc<TypeResources>; 3],
    /// Each listener's address and the file it comes from, to refuse moving a listener.
    listeners: ListenerAddrs,
    /// Whether the resources carry secrets ([`crate::secure::carries_secrets`]): served only
    /// to a stream authenticated as the node.
    secrets: bool,
}

/// Listener name → (address, the file defining it).
type ListenerAddrs = BTreeMap<String, (SocketAddr, String)>;

impl NodeSnapshot {
    /// The node's resources of type `t`.
    pub fn get(&self, t: ResourceType) -> &Arc<TypeResources> {
        &self.types[t.index()]
    }

    /// Whether these resources carry secrets (inline passwords or keys).
    pub fn carries_secrets(&self) -> bool {
        self.secrets
    }

    fn from_resources(
        r: &Resources,
        listeners: ListenerAddrs,
        previous: Option<&NodeSnapshot>,
        interner: &mut Interner,
    ) -> Self {
        fn packed<T: Message + Name + Default + PartialEq>(
            t: ResourceType,
            items: &[T],
            name: impl Fn(&T) -> &str,
            previous: Option<&Arc<TypeResources>>,
            interner: &mut Interner,
        ) -> Arc<TypeResources> {
            let resources: BTreeMap<String, Any> = items
                .iter()
                .map(|m| (name(m).to_string(), interner.intern(t, name(m), m)))
                .collect();
            match previous {
                Some(prev) if prev.resources == resources => prev.clone(),
                _ => Arc::new(TypeResources {
                    version: content_version(t, &resources),
                    resources,
                }),
            }
        }
        let prev = |t: ResourceType| previous.map(|p| p.get(t));
        let types = [
            packed(
                ResourceType::Cluster,
                &r.clusters,
                |c| &c.name,
                prev(ResourceType::Cluster),
                interner,
            ),
            packed(
                ResourceType::Endpoint,
                &r.endpoints,
                |e| &e.cluster_name,
                prev(ResourceType::Endpoint),
                interner,
            ),
            packed(
                ResourceType::Listener,
                &r.listeners,
                |l| &l.name,
                prev(ResourceType::Listener),
                interner,
            ),
        ];
        NodeSnapshot {
            types,
            listeners,
            secrets: crate::secure::carries_secrets(r),
        }
    }
}

// === Content versions ===

/// The `version_info` of resources of type `t`: 16 hex digits of an xxh64 hash of their
/// names and content, the same in every process for the same content.
///
/// Protobuf maps (endpoint metadata, a cluster's `typed_extension_protocol_options`) encode in
/// no fixed order, so the hash is not taken over the packed bytes but over a canonical form:
/// each resource decoded, its map fields taken out and written sorted by key, the rest
/// encoded as usual (respway's resources have no other maps). A resource that does not decode
/// as `t` is hashed as its bytes.
///
/// A 64-bit hash may collide; nothing relies on it not to: the server decides what to push by
/// comparing content, and the client compares content with what it applied.
pub fn content_version(t: ResourceType, resources: &BTreeMap<String, Any>) -> String {
    let mut c = Canonical::default();
    c.bytes(t.type_url().as_bytes());
    for (name, any) in resources {
        c.bytes(name.as_bytes());
        c.bytes(any.type_url.as_bytes());
        c.resource(t, &any.value);
    }
    format!("{:016x}", xxhash_rust::xxh64::xxh64(&c.out, 0))
}

/// A canonical, self-delimiting byte form of resources (see [`content_version`]).
#[derive(Default)]
struct Canonical {
    out: Vec<u8>,
}

impl Canonical {
    fn bytes(&mut self, b: &[u8]) {
        self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.out.extend_from_slice(b);
    }

    fn tag(&mut self, tag: u8) {
        self.out.push(tag);
    }

    fn message(&mut self, m: &impl Message) {
        self.bytes(&m.encode_to_vec());
    }

    fn resource(&mut self, t: ResourceType, value: &[u8]) {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        match t {
            ResourceType::Cluster => match Cluster::decode(value) {
                Ok(mut c) => {
                    self.tag(1);
                    let options = std::mem::take(&mut c.typed_extension_protocol_options);
                    let metadata = c.metadata.take();
                    self.message(&c);
                    self.any_map(&options);
                    self.metadata(metadata.as_ref());
                }
                Err(_) => self.raw(value),
            },
            ResourceType::Endpoint => match ClusterLoadAssignment::decode(value) {
                Ok(mut a) => {
                    self.tag(1);
                    let named = std::mem::take(&mut a.named_endpoints);
                    // In structure order, which the encoded rest pins down.
                    let mut metadata = Vec::new();
                    for l in &mut a.endpoints {
                        metadata.push(l.metadata.take());
                        for e in &mut l.lb_endpoints {
                            metadata.push(e.metadata.take());
                        }
                    }
                    self.message(&a);
                    for m in &metadata {
                        self.metadata(m.as_ref());
                    }
                    let named: BTreeMap<&String, _> = named.iter().collect();
                    self.bytes(&(named.len() as u64).to_le_bytes());
                    for (k, e) in named {
                        self.bytes(k.as_bytes());
                        self.message(e);
                    }
                }
                Err(_) => self.raw(value),
            },
            ResourceType::Listener => match Listener::decode(value) {
                Ok(mut l) => {
                    self.tag(1);
                    let mut metadata = vec![l.metadata.take()];
                    for f in l
                        .filter_chains
                        .iter_mut()
                        .chain(&mut l.default_filter_chain)
                    {
                        metadata.push(f.metadata.take());
                    }
                    self.message(&l);
                    for m in &metadata {
                        self.metadata(m.as_ref());
                    }
                }
                Err(_) => self.raw(value),
            },
        }
    }

    fn raw(&mut self, value: &[u8]) {
        self.tag(0);
        self.bytes(value);
    }

    fn any_map(&mut self, map: &HashMap<String, Any>) {
        let sorted: BTreeMap<&String, &Any> = map.iter().collect();
        self.bytes(&(sorted.len() as u64).to_le_bytes());
        for (k, v) in sorted {
            self.bytes(k.as_bytes());
            self.bytes(v.type_url.as_bytes());
            self.bytes(&v.value);
        }
    }

    fn metadata(&mut self, m: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>) {
        let Some(m) = m else {
            self.tag(0);
            return;
        };
        self.tag(1);
        let sorted: BTreeMap<&String, _> = m.filter_metadata.iter().collect();
        self.bytes(&(sorted.len() as u64).to_le_bytes());
        for (k, s) in sorted {
            self.bytes(k.as_bytes());
            self.structure(s);
        }
        self.any_map(&m.typed_filter_metadata);
    }

    fn structure(&mut self, s: &envoy_types::pb::google::protobuf::Struct) {
        let sorted: BTreeMap<&String, _> = s.fields.iter().collect();
        self.bytes(&(sorted.len() as u64).to_le_bytes());
        for (k, v) in sorted {
            self.bytes(k.as_bytes());
            self.value(v);
        }
    }

    fn value(&mut self, v: &envoy_types::pb::google::protobuf::Value) {
        use envoy_types::pb::google::protobuf::value::Kind;
        match &v.kind {
            None => self.tag(0),
            Some(Kind::NullValue(n)) => {
                self.tag(1);
                self.bytes(&n.to_le_bytes());
            }
            Some(Kind::NumberValue(n)) => {
                self.tag(2);
                self.bytes(&n.to_bits().to_le_bytes());
            }
            Some(Kind::StringValue(s)) => {
                self.tag(3);
                self.bytes(s.as_bytes());
            }
            Some(Kind::BoolValue(b)) => {
                self.tag(4);
                self.bytes(&[u8::from(*b)]);
            }
            Some(Kind::StructValue(s)) => {
                self.tag(5);
                self.structure(s);
            }
            Some(Kind::ListValue(l)) => {
                self.tag(6);
                self.bytes(&(l.values.len() as u64).to_le_bytes());
                for v in &l.values {
                    self.value(v);
                }
            }
        }
    }
}

/// Packed resources by type and name, so that equal resources share their bytes across node
/// classes and snapshots. Protobuf maps (e.g. endpoint metadata) encode in no fixed order, so
/// two encodings of one message may differ; with this, unequal bytes mean unequal content,
/// and streams compare bytes to decide what to push.
#[derive(Default)]
struct Interner {
    pool: HashMap<(ResourceType, String), Vec<Any>>,
}

impl Interner {
    /// Seeds the pool with every resource of `snapshot`.
    fn seed(&mut self, snapshot: &Snapshot) {
        for node in snapshot.nodes.values() {
            for t in ResourceType::PUSH_ORDER {
                for (name, any) in &node.get(t).resources {
                    let list = self.pool.entry((t, name.clone())).or_default();
                    if !list.iter().any(|a| a == any) {
                        list.push(any.clone());
                    }
                }
            }
        }
    }

    /// `m` packed: bytes already in the pool for an equal message, else a fresh encoding.
    fn intern<T: Message + Name + Default + PartialEq>(
        &mut self,
        t: ResourceType,
        name: &str,
        m: &T,
    ) -> Any {
        let list = self.pool.entry((t, name.to_string())).or_default();
        if let Some(a) = list
            .iter()
            .find(|a| T::decode(a.value.as_slice()).is_ok_and(|old| old == *m))
        {
            return a.clone();
        }
        let any = Any {
            type_url: T::type_url(),
            value: m.encode_to_vec(),
        };
        list.push(any.clone());
        any
    }
}

/// The files of one snapshot that a node matches, with how; nodes with the same key get the
/// same resources.
type ClassKey = Vec<(String, Level)>;

/// One committed version of the resource directory: the files it was built from and the
/// snapshot of every class of nodes.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// This server's generation: 0 before any file was loaded, then 1, 2, ... per committed
    /// change. Local to the process (another server over the same directory, or this one after
    /// a restart, counts its own); the `version_info` sent is [`TypeResources::version`].
    pub version: u64,
    files: Vec<Arc<LoadedFile>>,
    nodes: HashMap<ClassKey, Arc<NodeSnapshot>>,
    /// The node ids and zones the files name.
    named_ids: BTreeSet<String>,
    named_zones: BTreeSet<String>,
    /// The previous snapshot of the nodes whose new one is invalid, by (named id or none,
    /// named zone or none): they keep what they were served.
    held: HashMap<Combo, Arc<NodeSnapshot>>,
    /// The errors of the classes held at their previous snapshot.
    errors: Vec<String>,
    /// The classes whose files define no listener or no cluster: why, by class.
    unserved: BTreeMap<ClassKey, String>,
}

/// A node id the files name (or none: any other id) and a zone they name (or none).
type Combo = (Option<String>, Option<String>);

impl Snapshot {
    /// The resources for node `id` in `zone`; `None` when no file is for it, or when its files
    /// define no listener or no cluster ([`Snapshot::unserved_reason`]).
    pub fn for_node(&self, id: &str, zone: Option<&str>) -> Option<Arc<NodeSnapshot>> {
        let key = class_key(&self.files, id, zone);
        if key.is_empty() {
            return None;
        }
        if let Some(n) = self.nodes.get(&key) {
            return Some(n.clone());
        }
        self.held.get(&self.combo(id, zone)).cloned()
    }

    /// Why node `id` in `zone` is served nothing although files are for it (they define no
    /// listener or no cluster); `None` when it is served or no file is for it.
    pub fn unserved_reason(&self, id: &str, zone: Option<&str>) -> Option<&str> {
        let key = class_key(&self.files, id, zone);
        if self.nodes.contains_key(&key) {
            return None;
        }
        self.unserved.get(&key).map(String::as_str)
    }

    /// The node classes served nothing because their files define no listener or no cluster,
    /// each with the nodes it stands for.
    pub fn unserved(&self) -> impl Iterator<Item = &str> {
        self.unserved.values().map(String::as_str)
    }

    /// The errors of the node classes that kept their previous snapshot in this version.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }

    fn combo(&self, id: &str, zone: Option<&str>) -> Combo {
        (
            self.named_ids.contains(id).then(|| id.to_string()),
            zone.filter(|z| self.named_zones.contains(*z))
                .map(str::to_string),
        )
    }

    /// The names of the files this snapshot was built from.
    pub fn file_names(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|f| f.name.as_str())
    }
}

fn class_key(files: &[Arc<LoadedFile>], id: &str, zone: Option<&str>) -> ClassKey {
    files
        .iter()
        .filter_map(|f| f.level(id, zone).map(|l| (f.name.clone(), l)))
        .collect()
}

/// The nodes a (named id, named zone) combination stands for, in words.
fn describe_class(id: Option<&str>, zone: Option<&str>, any_zone_named: bool) -> String {
    match (id, zone) {
        (Some(id), Some(z)) => format!("node {id:?} in zone {z:?}"),
        (Some(id), None) if any_zone_named => format!("node {id:?} in other zones"),
        (Some(id), None) => format!("node {id:?}"),
        (None, Some(z)) => format!("other nodes in zone {z:?}"),
        (None, None) => "other nodes".to_string(),
    }
}

/// What [`build`] made of a set of files.
struct Built {
    snapshot: Snapshot,
    /// Whether some node is served differently than by `previous` (a new snapshot, or none).
    changed: bool,
}

/// Builds the snapshot of every class of nodes from `files` as generation `version`, sharing
/// unchanged per-type resources with `previous`. Each class stands alone: one that fails keeps
/// serving its nodes their snapshot in `previous` (its errors, naming the file, resource and
/// field and the nodes, are in [`Snapshot::errors`]), and one whose files define no listener or
/// no cluster is served nothing ([`Snapshot::unserved`]); the other classes are served.
fn build(files: Vec<Arc<LoadedFile>>, previous: &Snapshot, version: u64) -> Built {
    let named_ids: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.node_ids.iter().cloned())
        .collect();
    let named_zones: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.zones.iter().cloned())
        .collect();
    // Every distinct class: a node with a named id (or an unnamed one, which never equals a
    // named id since those are not empty) in a named zone (or another one).
    let mut classes: BTreeMap<ClassKey, (Vec<String>, Vec<Combo>)> = BTreeMap::new();
    for id in named_ids.iter().map(|s| Some(s.as_str())).chain([None]) {
        for zone in named_zones.iter().map(|s| Some(s.as_str())).chain([None]) {
            let key = class_key(&files, id.unwrap_or(""), zone);
            if !key.is_empty() {
                let (who, combos) = classes.entry(key).or_default();
                who.push(describe_class(id, zone, !named_zones.is_empty()));
                combos.push((id.map(str::to_string), zone.map(str::to_string)));
            }
        }
    }

    let mut nodes = HashMap::new();
    let mut interner = Interner::default();
    interner.seed(previous);
    // error text → the classes that have it, so an error in a file for every node is one line.
    let mut errors: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failed: Vec<ClassKey> = Vec::new();
    let mut unserved = BTreeMap::new();
    for (key, (who, _)) in &classes {
        match merge(&files, key) {
            Ok((resources, addrs)) => {
                let prev = previous.nodes.get(key).map(|n| n.as_ref());
                let snap = NodeSnapshot::from_resources(&resources, addrs, prev, &mut interner);
                nodes.insert(key.clone(), Arc::new(snap));
            }
            Err(MergeError::Incomplete(what)) => {
                unserved.insert(
                    key.clone(),
                    format!(
                        "{what}: nothing is served to {}, as to a node no file is for",
                        who.join(", ")
                    ),
                );
            }
            Err(MergeError::Invalid(errs)) => {
                for e in errs {
                    errors.entry(e).or_default().extend(who.iter().cloned());
                }
                failed.push(key.clone());
            }
        }
    }
    for (key, e, who) in moved_listeners(&files, &nodes, previous) {
        errors.entry(e).or_default().push(who);
        if nodes.remove(&key).is_some() {
            failed.push(key);
        }
    }
    // The nodes of a failed class keep what they were served.
    let mut held = HashMap::new();
    for key in &failed {
        for (id, zone) in classes.get(key).map(|c| c.1.as_slice()).unwrap_or_default() {
            if let Some(prev) = previous.for_node(id.as_deref().unwrap_or(""), zone.as_deref()) {
                held.insert((id.clone(), zone.clone()), prev);
            }
        }
    }
    let errors = errors
        .into_iter()
        .map(|(e, who)| format!("{e} (in the snapshot for {})", who.join(", ")))
        .collect();
    let snapshot = Snapshot {
        version,
        files,
        nodes,
        named_ids,
        named_zones,
        held,
        errors,
        unserved,
    };
    // Did the change reach anyone? Compared for every (named id, named zone) combination of
    // the old and the new files.
    let ids: BTreeSet<&str> = snapshot
        .named_ids
        .iter()
        .chain(&previous.named_ids)
        .map(String::as_str)
        .collect();
    let zones: BTreeSet<&str> = snapshot
        .named_zones
        .iter()
        .chain(&previous.named_zones)
        .map(String::as_str)
        .collect();
    let same = |a: Option<Arc<NodeSnapshot>>, b: Option<Arc<NodeSnapshot>>| match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            Arc::ptr_eq(&a, &b)
                || ResourceType::PUSH_ORDER
                    .into_iter()
                    .all(|t| a.get(t).resources == b.get(t).resources)
        }
        _ => false,
    };
    let changed = ids.iter().copied().chain([""]).any(|id| {
        zones
            .iter()
            .copied()
            .map(Some)
            .chain([None])
            .any(|zone| !same(snapshot.for_node(id, zone), previous.for_node(id, zone)))
    });
    Built { snapshot, changed }
}

/// A running sidecar cannot move a listener (it does not rebind, and NACKs a change of the
/// address of a listener it serves), so a change that gives an existing listener of some node
/// a new address is refused for those nodes, naming the listener and the field: they keep
/// their previous snapshot. Every (named id, named zone) combination of the old and the new
/// files stands for the nodes whose old and new snapshots are compared. A restarted
/// respway-xds starts afresh. Returns the new class, the error and the nodes, per move.
fn moved_listeners(
    files: &[Arc<LoadedFile>],
    nodes: &HashMap<ClassKey, Arc<NodeSnapshot>>,
    previous: &Snapshot,
) -> Vec<(ClassKey, String, String)> {
    let mut out = Vec::new();
    if previous.nodes.is_empty() && previous.held.is_empty() {
        return out;
    }
    let all = || files.iter().chain(&previous.files);
    let ids: BTreeSet<&str> = all()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.node_ids.iter().map(String::as_str))
        .collect();
    let zones: BTreeSet<&str> = all()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.zones.iter().map(String::as_str))
        .collect();
    for id in ids.iter().copied().map(Some).chain([None]) {
        for zone in zones.iter().copied().map(Some).chain([None]) {
            let Some(old) = previous.for_node(id.unwrap_or(""), zone) else {
                continue;
            };
            let key = class_key(files, id.unwrap_or(""), zone);
            let Some(new) = nodes.get(&key) else {
                continue;
            };
            for (name, (addr, file)) in &new.listeners {
                let Some((was, _)) = old.listeners.get(name) else {
                    continue;
                };
                if was != addr {
                    let e = format!(
                        "{file}: listener {name:?}: address: changed from {was} to {addr}, which \
                         running sidecars refuse (a listener cannot move while respway runs); \
                         to move it, restart respway-xds with the new file, then the sidecars"
                    );
                    out.push((key.clone(), e, describe_class(id, zone, !zones.is_empty())));
                }
            }
        }
    }
    out
}

/// Why one class's files do not make a snapshot.
enum MergeError {
    /// They define no listener or no cluster: not a configuration for anyone (what is missing).
    Incomplete(String),
    /// Conflicting definitions, or a merged snapshot that does not translate.
    Invalid(Vec<String>),
}

/// Merges the files of one class (see the module docs) and translates the result; also
/// returns where each listener is, and from which file.
fn merge(
    files: &[Arc<LoadedFile>],
    key: &ClassKey,
) -> Result<(Resources, ListenerAddrs), MergeError> {
    let by_name: HashMap<&str, &LoadedFile> = files
        .iter()
        .map(|f| (f.name.as_str(), f.as_ref()))
        .collect();
    let mut errors = Vec::new();
    // Where each resource of the merged snapshot comes from, to put the file in front of the
    // translation's errors.
    let mut origin: HashMap<String, String> = HashMap::new();

    let mut listeners: BTreeMap<&str, Vec<(Level, &str, &model::Listener)>> = BTreeMap::new();
    let mut clusters: BTreeMap<&str, Vec<(Level, &str, &model::Cluster)>> = BTreeMap::new();
    for (name, level) in key {
        let f = by_name[name.as_str()];
        for l in &f.config.listeners {
            listeners
                .entry(&l.name)
                .or_default()
                .push((*level, &f.name, l));
        }
        for c in &f.config.clusters {
            clusters
                .entry(&c.name)
                .or_default()
                .push((*level, &f.name, c));
        }
    }
    fn pick<'a, T>(
        kind: &str,
        name: &str,
        defs: &[(Level, &'a str, &'a T)],
        errors: &mut Vec<String>,
    ) -> Option<(&'a str, &'a T)> {
        let top = defs.iter().map(|d| d.0).max()?;
        let winners: Vec<_> = defs.iter().filter(|d| d.0 == top).collect();
        if winners.len() > 1 {
            let files: Vec<String> = winners.iter().map(|d| format!("{:?}", d.1)).collect();
            errors.push(format!(
                "{kind} {name:?} is defined by {} at the same precedence ({})",
                files.join(" and "),
                top.describe()
            ));
            return None;
        }
        Some((winners[0].1, winners[0].2))
    }
    let mut config = Config {
        zone: None,
        listeners: Vec::new(),
        clusters: Vec::new(),
    };
    for (name, defs) in &listeners {
        if let Some((file, l)) = pick("listener", name, defs, &mut errors) {
            origin.insert(format!("listener {name:?}"), file.to_string());
            config.listeners.push(l.clone());
        }
    }
    for (name, defs) in &clusters {
        if let Some((file, c)) = pick("cluster", name, defs, &mut errors) {
            origin.insert(format!("cluster {name:?}"), file.to_string());
            origin.insert(
                format!("cluster_load_assignment {name:?}"),
                file.to_string(),
            );
            config.clusters.push(c.clone());
        }
    }
    if !errors.is_empty() {
        return Err(MergeError::Invalid(errors));
    }
    match (config.listeners.is_empty(), config.clusters.is_empty()) {
        (false, false) => {}
        (true, true) => return Err(MergeError::Incomplete("no listener and no cluster".into())),
        (true, false) => return Err(MergeError::Incomplete("no listener".into())),
        (false, true) => return Err(MergeError::Incomplete("no cluster".into())),
    }
    // Routes may name clusters of other files, so they are checked here, once merged, and
    // reported by the file's own paths (`routes.prefixes[0].cluster`) rather than by the
    // Envoy paths the translation below would give.
    let known: HashSet<&str> = config.clusters.iter().map(|c| c.name.as_str()).collect();
    for l in &config.listeners {
        let resource = format!("listener {:?}", l.name);
        let file = origin
            .get(&resource)
            .map(String::as_str)
            .unwrap_or_default();
        for (field, reason) in yaml::unknown_clusters(l, &known) {
            errors.push(format!("{file}: {resource}: {field}: {reason}"));
        }
    }
    if !errors.is_empty() {
        return Err(MergeError::Invalid(errors));
    }
    let resources = to_resources(&config);
    match translate(&resources) {
        Ok(config) => {
            let addrs = config
                .listeners
                .iter()
                .map(|l| {
                    let file = origin
                        .get(&format!("listener {:?}", l.name))
                        .cloned()
                        .unwrap_or_default();
                    (l.name.clone(), (l.address, file))
                })
                .collect();
            Ok((resources, addrs))
        }
        Err(e) => Err(MergeError::Invalid(
            e.iter()
                .map(|e| match origin.get(&e.resource) {
                    Some(file) => format!("{file}: {e}"),
                    None => e.to_string(),
                })
                .collect(),
        )),
    }
}

// === Cache ===

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
}

#[derive(Debug, Default)]
struct Inner {
    /// The directory's `*.yaml` contents at the last scan; `None` before the first.
    seen: Option<BTreeMap<String, Result<String, String>>>,
    files: Vec<FileReport>,
    errors: Vec<String>,
}

/// The snapshot cache over one resource directory. Cheap to share (`Arc`); scans are
/// serialized.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    inner: Mutex<Inner>,
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Cache {
    /// A cache over `dir`, with nothing loaded yet (version 0): call [`Cache::reload`] or run
    /// [`Cache::watch`].
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache {
            dir: dir.into(),
            inner: Mutex::new(Inner::default()),
            tx: watch::Sender::new(Arc::new(Snapshot::default())),
        }
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
        match self.candidate(&self.read_dir(Some((name, text)))).1 {
            Err(errors) => return Err(ApplyError::Invalid(errors)),
            Ok(Some(s)) if !s.errors.is_empty() => return Err(ApplyError::Invalid(s.errors)),
            Ok(Some(_) | None) => {}
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
                        .map(|Fragment { targets, config }| {
                            Arc::new(LoadedFile {
                                name: name.clone(),
                                text: text.clone(),
                                targets,
                                config,
                            })
                        })
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
        let built = build(files, &active, active.version + 1);
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
        let (reports, result) = self.candidate(&disk);
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
        let holders = crate::secure::secret_holders(&to_resources(&fragment.config));
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

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "
listeners:
  - name: main
    routes: { catch_all: cache }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7001 }]
";

    fn dir_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Cache) {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        let cache = Cache::new(dir.path());
        (dir, cache)
    }

    fn endpoint_of(
        snap: &NodeSnapshot,
        cluster: &str,
    ) -> envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
        let any = &snap.get(ResourceType::Endpoint).resources[cluster];
        Message::decode(any.value.as_slice()).expect("decodes")
    }

    #[test]
    fn untargeted_file_serves_every_node() {
        let (_d, cache) = dir_with(&[("base.yaml", BASE)]);
        let r = cache.reload();
        assert_eq!(r.committed, Some(1), "{:?}", r.errors);
        let snap = cache.snapshot();
        let a = snap.for_node("a", None).expect("snapshot");
        let b = snap.for_node("b", Some("z9")).expect("snapshot");
        assert!(Arc::ptr_eq(&a, &b));
        let listeners = a.get(ResourceType::Listener);
        assert_eq!(
            listeners.version,
            content_version(ResourceType::Listener, &listeners.resources)
        );
        assert_eq!(listeners.version.len(), 16);
        assert_eq!(
            a.get(ResourceType::Cluster)
                .resources
                .keys()
                .collect::<Vec<_>>(),
            ["cache"]
        );
    }

    #[test]
    fn targeted_files_override_by_name_most_specific_first() {
        let zone = "
targets: { zones: [z1] }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7101 }]
";
        let node = "
targets: { node_ids: [n1] }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7201 }]
";
        let (_d, cache) = dir_with(&[("base.yaml", BASE), ("z1.yaml", zone), ("n1.yaml", node)]);
        assert_eq!(cache.reload().errors, Vec::<String>::new());
        let snap = cache.snapshot();
        let base = snap.for_node("x", None).expect("base");
        let z1 = snap.for_node("x", Some("z1")).expect("z1");
        let n1 = snap.for_node("n1", Some("z1")).expect("n1");
        let n1_elsewhere = snap.for_node("n1", None).expect("n1");
        let cla = |s: &NodeSnapshot| endpoint_of(s, "cache");
        assert_ne!(cla(&base), cla(&z1));
        assert_ne!(cla(&z1), cla(&n1));
        assert_eq!(cla(&n1), cla(&n1_elsewhere));
        // The listener comes from the base file for all of them.
        assert_eq!(
            base.get(ResourceType::Listener),
            n1.get(ResourceType::Listener)
        );
    }

    #[test]
    fn a_failing_class_keeps_its_snapshot_while_the_others_move() {
        let zone = |cluster: &str| {
            format!("targets: {{ zones: [z1] }}\nlisteners:\n  - name: main\n    routes: {{ catch_all: {cluster} }}\n")
        };
        let (d, cache) = dir_with(&[("base.yaml", BASE), ("z1.yaml", &zone("cache"))]);
        assert_eq!(cache.reload().committed, Some(1));
        let before = cache.snapshot().for_node("a", Some("z1")).expect("z1");
        // z1's listener now routes nowhere, and the base file's endpoint moves.
        std::fs::write(d.path().join("z1.yaml"), zone("gone")).expect("write");
        std::fs::write(d.path().join("base.yaml"), BASE.replace("7001", "7002")).expect("write");
        let r = cache.reload();
        assert_eq!(r.committed, Some(2));
        assert_eq!(
            r.errors,
            ["z1.yaml: listener \"main\": routes.catch_all: unknown cluster \"gone\" (in the snapshot for other nodes in zone \"z1\")"]
        );
        let snap = cache.snapshot();
        assert_eq!(snap.errors(), r.errors);
        let z1 = snap.for_node("a", Some("z1")).expect("held");
        assert!(Arc::ptr_eq(&z1, &before), "z1 keeps what it had");
        let other = snap.for_node("a", None).expect("served");
        assert_eq!(endpoint_address_of(&other), "127.0.0.1:7002");
        assert_eq!(endpoint_address_of(&z1), "127.0.0.1:7001");
        assert_eq!(cache.report().errors, r.errors);
        // /apply refuses a file that breaks some class.
        let Err(ApplyError::Invalid(errors)) = cache.apply("z1.yaml", &zone("also-gone")) else {
            panic!("expected invalid");
        };
        assert!(errors[0].contains("also-gone"), "{errors:?}");
        // Fixed: z1 moves too.
        std::fs::write(d.path().join("z1.yaml"), zone("cache")).expect("write");
        assert_eq!(
            cache.reload(),
            Reload {
                committed: Some(3),
                errors: vec![]
            }
        );
        let z1 = cache.snapshot().for_node("a", Some("z1")).expect("z1");
        assert_eq!(endpoint_address_of(&z1), "127.0.0.1:7002");
    }

    #[test]
    fn classes_without_a_listener_are_reported_and_served_nothing() {
        let clusters = "clusters:\n  - name: cache\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7001 }]\n";
        let n1 = "targets: { node_ids: [n1] }\nlisteners:\n  - name: main\n    routes: { catch_all: cache }\n";
        let (_d, cache) = dir_with(&[("clusters.yaml", clusters), ("n1.yaml", n1)]);
        let r = cache.reload();
        assert_eq!(
            r,
            Reload {
                committed: Some(1),
                errors: vec![]
            }
        );
        let snap = cache.snapshot();
        assert!(snap.for_node("n1", Some("z9")).is_some());
        assert!(snap.for_node("n2", None).is_none());
        assert_eq!(
            snap.unserved_reason("n2", None),
            Some("no listener: nothing is served to other nodes, as to a node no file is for")
        );
        assert_eq!(snap.unserved_reason("n1", None), None);
        assert_eq!(cache.report().unserved.len(), 1);
    }

    fn endpoint_address_of(snap: &NodeSnapshot) -> String {
        use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
        use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint;
        let cla = endpoint_of(snap, "cache");
        let Some(lb_endpoint::HostIdentifier::Endpoint(e)) =
            &cla.endpoints[0].lb_endpoints[0].host_identifier
        else {
            panic!("no endpoint");
        };
        let Some(address::Address::SocketAddress(sa)) =
            e.address.as_ref().and_then(|a| a.address.as_ref())
        else {
            panic!("no socket address");
        };
        let Some(socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
            panic!("no port");
        };
        format!("{}:{port}", sa.address)
    }

    #[test]
    fn same_precedence_conflict_is_an_error_and_nothing_is_served() {
        let (_d, cache) = dir_with(&[("a.yaml", BASE), ("b.yaml", BASE)]);
        let r = cache.reload();
        assert_eq!(r.committed, None);
        assert!(
            r.errors.iter().any(|e| e.starts_with(
                "listener \"main\" is defined by \"a.yaml\" and \"b.yaml\" at the same precedence (files for every node)"
            )),
            "{:?}",
            r.errors
        );
        assert_eq!(cache.snapshot().version, 0);
    }

    #[test]
    fn invalid_file_keeps_its_previous_version() {
        let (d, cache) = dir_with(&[("base.yaml", BASE)]);
        assert_eq!(cache.reload().committed, Some(1));
        std::fs::write(d.path().join("base.yaml"), BASE.replace("7001", "99999")).expect("write");
        let r = cache.reload();
        assert_eq!(r.committed, None);
        assert_eq!(
            r.errors,
            [
                "base.yaml: cluster \"cache\": shards[0].endpoints[0].address: invalid socket address \"127.0.0.1:99999\""
            ]
        );
        let report = cache.report();
        assert_eq!(report.version, 1);
        assert!(matches!(
            report.files[0].state,
            FileState::Invalid {
                serving_previous: true,
                ..
            }
        ));
        // Unchanged directory: no new scan result.
        assert_eq!(cache.reload().errors, Vec::<String>::new());
    }

    #[test]
    fn cross_file_reference_errors_name_the_file_and_nodes() {
        let listener_only = "
targets: { zones: [z1] }
listeners:
  - name: extra
    address: 127.0.0.1:6390
    routes: { catch_all: missing }
";
        let (_d, cache) = dir_with(&[("base.yaml", BASE), ("extra.yaml", listener_only)]);
        let r = cache.reload();
        // The nodes outside z1 are served; those of z1, which had nothing, get nothing.
        assert_eq!(r.committed, Some(1));
        let snap = cache.snapshot();
        assert!(snap.for_node("a", None).is_some());
        assert!(snap.for_node("a", Some("z1")).is_none());
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert!(
            r.errors[0].starts_with(
                "extra.yaml: listener \"extra\": routes.catch_all: unknown cluster \"missing\""
            ),
            "{}",
            r.errors[0]
        );
        assert!(
            r.errors[0].ends_with("(in the snapshot for other nodes in zone \"z1\")"),
            "{}",
            r.errors[0]
        );
    }

    #[test]
    fn merged_errors_use_the_files_yaml_paths() {
        // Routes and mirrors naming clusters no file for the node defines: reported by the
        // YAML paths of the file that wrote them, not by the Envoy translation's.
        let routes = "
listeners:
  - name: extra
    address: 127.0.0.1:6390
    routes:
      catch_all: gone
      catch_all_mirrors: [{ cluster: cache }, { cluster: gone-mirror }]
      prefixes:
        - { prefix: 'a:', cluster: cache }
        - { prefix: 'b:', cluster: gone-b, mirrors: [{ cluster: gone-b-mirror }] }
";
        let (_d, cache) = dir_with(&[("base.yaml", BASE), ("routes.yaml", routes)]);
        let r = cache.reload();
        assert_eq!(r.committed, None);
        let who = " (in the snapshot for other nodes)";
        assert_eq!(
            r.errors,
            [
                format!("routes.yaml: listener \"extra\": routes.catch_all: unknown cluster \"gone\"{who}"),
                format!("routes.yaml: listener \"extra\": routes.catch_all_mirrors[1].cluster: unknown cluster \"gone-mirror\"{who}"),
                format!("routes.yaml: listener \"extra\": routes.prefixes[1].cluster: unknown cluster \"gone-b\"{who}"),
                format!("routes.yaml: listener \"extra\": routes.prefixes[1].mirrors[0].cluster: unknown cluster \"gone-b-mirror\"{who}"),
            ]
        );
        // An invalid hash policy is the file's own error, by its YAML path too.
        let hash = "
clusters:
  - name: ring
    hash: { policy: ring_hash, minimum_ring_size: 2048, maximum_ring_size: 1024 }
    shards:
      - endpoints: [{ address: 127.0.0.1:7009 }]
";
        let (_d, cache) = dir_with(&[("base.yaml", BASE), ("ring.yaml", hash)]);
        assert_eq!(
            cache.reload().errors,
            ["ring.yaml: cluster \"ring\": hash.minimum_ring_size: 2048 is larger than maximum_ring_size 1024"]
        );
    }

    #[test]
    fn versions_move_only_for_changed_types() {
        let (d, cache) = dir_with(&[("base.yaml", BASE)]);
        cache.reload();
        let before = versions(&cache, "a", None);
        std::fs::write(d.path().join("base.yaml"), BASE.replace("7001", "7002")).expect("write");
        assert_eq!(cache.reload().committed, Some(2));
        let after = versions(&cache, "a", None);
        assert_ne!(after[1], before[1], "EDS moved");
        assert_eq!(after[0], before[0], "CDS did not");
        assert_eq!(after[2], before[2], "LDS did not");
    }

    /// CDS, EDS and LDS `version_info` for node `id` in `zone`.
    fn versions(cache: &Cache, id: &str, zone: Option<&str>) -> [String; 3] {
        let snap = cache.snapshot().for_node(id, zone).expect("snapshot");
        ResourceType::PUSH_ORDER.map(|t| snap.get(t).version.clone())
    }

    #[test]
    fn version_info_is_the_content_hash_in_every_server() {
        let zone = "
targets: { zones: [z1] }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7101 }]
";
        let (d, first) = dir_with(&[("base.yaml", BASE), ("z1.yaml", zone)]);
        first.reload();
        let original = versions(&first, "a", Some("z1"));
        let other_zone = versions(&first, "a", None);
        assert_ne!(original[1], other_zone[1], "different endpoints");
        assert_eq!(original[2], other_zone[2], "the same listener");

        // The first server sees an intermediate edit; a second one starts after it.
        std::fs::write(d.path().join("z1.yaml"), zone.replace("7101", "7102")).expect("write");
        assert_eq!(first.reload().committed, Some(2));
        let second = Cache::new(d.path());
        assert_eq!(second.reload().committed, Some(1));
        for (id, z) in [("a", Some("z1")), ("a", None), ("b", Some("z9"))] {
            assert_eq!(
                versions(&first, id, z),
                versions(&second, id, z),
                "{id} in {z:?}"
            );
        }
        let edited = versions(&second, "a", Some("z1"));
        assert_ne!(edited[1], original[1], "changed content, changed version");
        assert_eq!(edited[0], original[0]);

        // Back to the original content: back to the original versions.
        std::fs::write(d.path().join("z1.yaml"), zone).expect("write");
        assert_eq!(first.reload().committed, Some(3));
        assert_eq!(versions(&first, "a", Some("z1")), original);
    }

    #[test]
    fn content_version_ignores_map_encoding_order() {
        // Endpoint metadata (two namespaces, several fields) and a cluster's protocol options
        // are protobuf maps: each fresh encoding may order them differently.
        let text = "
listeners:
  - name: main
    routes: { catch_all: cache }
clusters:
  - name: cache
    hash: { policy: ketama }
    shards:
      - name: s0
        hash_key: custom
        endpoints:
          - { address: 127.0.0.1:7001, role: primary, zone: z1 }
          - { address: 127.0.0.1:7002, role: replica, zone: z2 }
";
        let resources = crate::parse_yaml(text).expect("valid");
        let pack = |m: &dyn Fn() -> Vec<u8>| {
            BTreeMap::from([(
                "cache".to_string(),
                Any {
                    type_url: ResourceType::Endpoint.type_url().to_string(),
                    value: m(),
                },
            )])
        };
        let mut encodings = BTreeSet::new();
        let mut hashes = BTreeSet::new();
        for _ in 0..32 {
            // A fresh model → resources each time: fresh maps, fresh iteration orders.
            let again = crate::to_resources(&crate::translate(&resources).expect("translates"));
            let bytes = again.endpoints[0].encode_to_vec();
            encodings.insert(bytes.clone());
            hashes.insert(content_version(
                ResourceType::Endpoint,
                &pack(&|| bytes.clone()),
            ));
            let cluster = BTreeMap::from([(
                "cache".to_string(),
                Any {
                    type_url: ResourceType::Cluster.type_url().to_string(),
                    value: again.clusters[0].encode_to_vec(),
                },
            )]);
            hashes.insert(content_version(ResourceType::Cluster, &cluster));
        }
        assert!(
            encodings.len() > 1,
            "the maps always encoded in one order; this test no longer shows anything"
        );
        assert_eq!(hashes.len(), 2, "one EDS and one CDS version: {hashes:?}");
    }

    #[test]
    fn node_section_and_empty_targets_are_refused() {
        let text = "node: { zone: z1 }\ntargets: {}\nclusters: []\n";
        let err = yaml::parse_fragment(text).unwrap_err().to_string();
        assert_eq!(
            err,
            "node: not used in a respway-xds resource file: a sidecar's own node is in its bootstrap; name the sidecars a file is for with `targets`\n\
             targets: names no node id and no zone (leave `targets` out for a file for every node)"
        );
    }

    #[test]
    fn moving_a_listener_is_refused_and_the_served_version_stays() {
        let with_addr = |a: &str| {
            BASE.replace(
                "  - name: main\n",
                &format!("  - name: main\n    address: {a}\n"),
            )
        };
        let (d, cache) = dir_with(&[("base.yaml", &with_addr("127.0.0.1:6380"))]);
        assert_eq!(cache.reload().committed, Some(1));
        std::fs::write(d.path().join("base.yaml"), with_addr("127.0.0.1:6390")).expect("write");
        let r = cache.reload();
        assert_eq!(r.committed, None);
        assert_eq!(
            r.errors,
            ["base.yaml: listener \"main\": address: changed from 127.0.0.1:6380 to 127.0.0.1:6390, \
              which running sidecars refuse (a listener cannot move while respway runs); to move it, \
              restart respway-xds with the new file, then the sidecars (in the snapshot for other nodes)"]
        );
        let report = cache.report();
        assert_eq!((report.version, report.errors), (1, r.errors.clone()));
        // /apply refuses it too, and writes nothing.
        let Err(ApplyError::Invalid(errors)) =
            cache.apply("base.yaml", &with_addr("127.0.0.1:6391"))
        else {
            panic!("expected invalid");
        };
        assert!(
            errors[0].contains("address: changed from 127.0.0.1:6380 to 127.0.0.1:6391"),
            "{errors:?}"
        );
        // Other edits of the same listener, and new listeners, still go through.
        std::fs::write(
            d.path().join("base.yaml"),
            with_addr("127.0.0.1:6380").replace("7001", "7002"),
        )
        .expect("write");
        assert_eq!(cache.reload().committed, Some(2));
        let extra = "listeners:\n  - name: extra\n    address: 127.0.0.1:6399\n    routes: { catch_all: cache }\n";
        assert_eq!(cache.apply("extra.yaml", extra), Ok(3));
    }

    #[test]
    fn moving_a_listener_for_some_nodes_names_them() {
        let with_addr = |a: &str| {
            BASE.replace(
                "  - name: main\n",
                &format!("  - name: main\n    address: {a}\n"),
            )
        };
        let (d, cache) = dir_with(&[("base.yaml", &with_addr("127.0.0.1:6380"))]);
        assert_eq!(cache.reload().committed, Some(1));
        // A file for zone z1 redefining the listener at another address moves it for the
        // nodes of z1 only.
        let z1 = "targets: { zones: [z1] }\nlisteners:\n  - name: main\n    address: 127.0.0.1:6381\n    routes: { catch_all: cache }\n";
        std::fs::write(d.path().join("z1.yaml"), z1).expect("write");
        let r = cache.reload();
        assert_eq!(r.committed, None);
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert!(r.errors[0].starts_with("z1.yaml: listener \"main\": address: changed from 127.0.0.1:6380 to 127.0.0.1:6381"), "{}", r.errors[0]);
        assert!(
            r.errors[0].ends_with("(in the snapshot for other nodes in zone \"z1\")"),
            "{}",
            r.errors[0]
        );
    }

    #[test]
    fn apply_validates_then_writes_atomically() {
        let (d, cache) = dir_with(&[("base.yaml", BASE)]);
        cache.reload();
        assert_eq!(
            cache.apply("../x.yaml", BASE),
            Err(ApplyError::Name("../x.yaml".into()))
        );
        let bad = "listeners:\n  - name: two\n    address: 127.0.0.1:6391\n    routes: { catch_all: nowhere }\n";
        let Err(ApplyError::Invalid(errors)) = cache.apply("two.yaml", bad) else {
            panic!("expected invalid");
        };
        assert!(errors[0].contains("nowhere"), "{errors:?}");
        assert!(!d.path().join("two.yaml").exists());
        let good = bad.replace("nowhere", "cache");
        assert_eq!(cache.apply("two.yaml", &good), Ok(2));
        assert!(d.path().join("two.yaml").exists());
        let names: Vec<String> = std::fs::read_dir(d.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");

        // Another file being invalid does not stop an apply.
        std::fs::write(d.path().join("broken.yaml"), "listeners: [").expect("write");
        let three = good.replace("routes:", "op_timeout: 2s\n    routes:");
        assert_eq!(cache.apply("two.yaml", &three), Ok(3));
        let report = cache.report();
        let broken = report
            .files
            .iter()
            .find(|f| f.name == "broken.yaml")
            .expect("listed");
        assert!(matches!(broken.state, FileState::Invalid { .. }));
    }
}

//! Snapshots: the resources of one node, their content versions, and the set of snapshots
//! one generation serves (by class of nodes).

use super::*;

use std::sync::OnceLock;

// === Snapshot ===

/// The resources of one type for one node, keyed by resource name (a listener's or cluster's
/// `name`, an assignment's `cluster_name`), packed as `Any`.
pub struct TypeResources {
    /// The `version_info` sent with them: [`content_version`] of `resources`.
    pub version: String,
    /// The resources by name.
    pub resources: BTreeMap<String, Any>,
    /// Their encoded views ([`TypeResources::encoded`]), each made on first use.
    views: Views,
}

impl TypeResources {
    /// Resources of version `version` (their [`content_version`]).
    pub fn new(version: String, resources: BTreeMap<String, Any>) -> TypeResources {
        TypeResources {
            version,
            resources,
            views: Views::default(),
        }
    }

    /// The resources of type `t` that a subscription covers (all of them, or those of `names`
    /// that exist), encoded as in a `DiscoveryResponse`. Made once per view and shared: every
    /// stream of a node class with the same subscription gets the same [`Encoded`]. `names` is
    /// set to the equal set the view was made for, so that the streams come to share one set
    /// (and find their view by pointer).
    pub fn encoded(
        &self,
        t: ResourceType,
        names: Option<&mut Arc<BTreeSet<String>>>,
    ) -> Arc<Encoded> {
        let Some(names) = names else {
            return self
                .views
                .all
                .get_or_init(|| Arc::new(Encoded::new(t, &self.version, self.resources.iter())))
                .clone();
        };
        let mut named = self.views.named.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((n, e)) = named
            .iter()
            .find(|(n, _)| Arc::ptr_eq(n, names) || n == names)
        {
            if !Arc::ptr_eq(n, names) {
                *names = n.clone();
            }
            return e.clone();
        }
        let e = Arc::new(Encoded::new(
            t,
            &self.version,
            names.iter().filter_map(|n| self.resources.get_key_value(n)),
        ));
        if named.len() == MAX_NAMED_VIEWS {
            named.remove(0);
        }
        named.push((names.clone(), e.clone()));
        e
    }
}

impl Clone for TypeResources {
    fn clone(&self) -> Self {
        TypeResources::new(self.version.clone(), self.resources.clone())
    }
}

impl PartialEq for TypeResources {
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version && self.resources == other.resources
    }
}

impl std::fmt::Debug for TypeResources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypeResources")
            .field("version", &self.version)
            .field("resources", &self.resources)
            .finish_non_exhaustive()
    }
}

/// How many subscriptions by name one [`TypeResources`] keeps the views of (the latest made);
/// the streams of one node class usually share one.
const MAX_NAMED_VIEWS: usize = 16;

/// The views of a [`TypeResources`] made so far.
#[derive(Default)]
struct Views {
    all: OnceLock<Arc<Encoded>>,
    named: Mutex<Vec<NamedView>>,
}

/// A subscription's names and their view.
type NamedView = (Arc<BTreeSet<String>>, Arc<Encoded>);

/// A view of the resources of one type (all of them, or those of some names), encoded once as
/// the fields of a `DiscoveryResponse` that do not vary by stream: `version_info` (1),
/// `resources` (2) and `type_url` (4). A stream sends them with its own `nonce` (5) and the
/// `control_plane` (6) after them, which is the message prost would encode.
#[derive(Debug)]
pub struct Encoded {
    /// The `version_info`.
    pub version: Arc<str>,
    /// Fields 1, 2 and 4 of the `DiscoveryResponse`, encoded.
    pub fields: bytes::Bytes,
    /// xxh3 of the view's names and packed bytes: views with different digests differ.
    pub digest: u64,
    /// How many resources.
    pub count: usize,
}

impl Encoded {
    fn new<'a>(
        t: ResourceType,
        version: &str,
        items: impl Iterator<Item = (&'a String, &'a Any)>,
    ) -> Encoded {
        use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
        let mut digest = xxhash_rust::xxh3::Xxh3::new();
        let resources: Vec<Any> = items
            .map(|(name, any)| {
                digest.update(&(name.len() as u64).to_le_bytes());
                digest.update(name.as_bytes());
                digest.update(&(any.value.len() as u64).to_le_bytes());
                digest.update(&any.value);
                any.clone()
            })
            .collect();
        let count = resources.len();
        let fields = DiscoveryResponse {
            version_info: version.to_string(),
            resources,
            type_url: t.type_url().to_string(),
            ..Default::default()
        }
        .encode_to_vec();
        Encoded {
            version: version.into(),
            fields: fields.into(),
            digest: digest.digest(),
            count,
        }
    }
}

/// What one node is served: one [`TypeResources`] per type.
#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    pub(super) types: [Arc<TypeResources>; 3],
    /// Each listener's address and the file it comes from, to refuse moving a listener.
    pub(super) listeners: ListenerAddrs,
    /// Whether the resources carry secrets ([`crate::secure::carries_secrets`]): served only
    /// to a stream authenticated as the node.
    pub(super) secrets: bool,
}

/// Listener name → (address, the file defining it).
pub(super) type ListenerAddrs = BTreeMap<String, (SocketAddr, String)>;

impl NodeSnapshot {
    /// The node's resources of type `t`.
    pub fn get(&self, t: ResourceType) -> &Arc<TypeResources> {
        &self.types[t.index()]
    }

    /// Whether these resources carry secrets (inline passwords or keys).
    pub fn carries_secrets(&self) -> bool {
        self.secrets
    }

    pub(super) fn from_resources(
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
                _ => Arc::new(TypeResources::new(
                    content_version(t, &resources),
                    resources,
                )),
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
pub(super) struct Canonical {
    pub(super) out: Vec<u8>,
}

impl Canonical {
    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        self.out.extend_from_slice(b);
    }

    pub(super) fn tag(&mut self, tag: u8) {
        self.out.push(tag);
    }

    pub(super) fn message(&mut self, m: &impl Message) {
        self.bytes(&m.encode_to_vec());
    }

    pub(super) fn resource(&mut self, t: ResourceType, value: &[u8]) {
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

    pub(super) fn raw(&mut self, value: &[u8]) {
        self.tag(0);
        self.bytes(value);
    }

    pub(super) fn any_map(&mut self, map: &HashMap<String, Any>) {
        let sorted: BTreeMap<&String, &Any> = map.iter().collect();
        self.bytes(&(sorted.len() as u64).to_le_bytes());
        for (k, v) in sorted {
            self.bytes(k.as_bytes());
            self.bytes(v.type_url.as_bytes());
            self.bytes(&v.value);
        }
    }

    pub(super) fn metadata(
        &mut self,
        m: Option<&envoy_types::pb::envoy::config::core::v3::Metadata>,
    ) {
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

    pub(super) fn structure(&mut self, s: &envoy_types::pb::google::protobuf::Struct) {
        let sorted: BTreeMap<&String, _> = s.fields.iter().collect();
        self.bytes(&(sorted.len() as u64).to_le_bytes());
        for (k, v) in sorted {
            self.bytes(k.as_bytes());
            self.value(v);
        }
    }

    pub(super) fn value(&mut self, v: &envoy_types::pb::google::protobuf::Value) {
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
pub(super) struct Interner {
    pub(super) pool: HashMap<(ResourceType, String), Vec<Any>>,
}

impl Interner {
    /// Seeds the pool with every resource of `snapshot`.
    pub(super) fn seed(&mut self, snapshot: &Snapshot) {
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
    pub(super) fn intern<T: Message + Name + Default + PartialEq>(
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
pub(super) type ClassKey = Vec<(String, Level)>;

/// One committed version of the resource directory: the files it was built from and the
/// snapshot of every class of nodes.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// This server's generation: 0 before any file was loaded, then 1, 2, ... per committed
    /// change. Local to the process (another server over the same directory, or this one after
    /// a restart, counts its own); the `version_info` sent is [`TypeResources::version`].
    pub version: u64,
    pub(super) files: Vec<Arc<LoadedFile>>,
    pub(super) nodes: HashMap<ClassKey, Arc<NodeSnapshot>>,
    /// The node ids and zones the files name.
    pub(super) named_ids: BTreeSet<String>,
    pub(super) named_zones: BTreeSet<String>,
    /// The previous snapshot of the nodes whose new one is invalid, by (named id or none,
    /// named zone or none): they keep what they were served.
    pub(super) held: HashMap<Combo, Arc<NodeSnapshot>>,
    /// The errors of the classes held at their previous snapshot.
    pub(super) errors: Vec<String>,
    /// The classes whose files define no listener or no cluster: why, by class.
    pub(super) unserved: BTreeMap<ClassKey, String>,
}

/// A node id the files name (or none: any other id) and a zone they name (or none).
pub(super) type Combo = (Option<String>, Option<String>);

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

    pub(super) fn combo(&self, id: &str, zone: Option<&str>) -> Combo {
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

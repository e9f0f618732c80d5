//! The ADS protocol state of one session: what was requested and acknowledged per type, the
//! last good resources, and how a response is applied (or NACKed with its reason).

use super::*;

/// A response received and not answered yet: its ACK waits until what it brought is in use
/// (warm) or warming fails.
#[derive(Debug, Clone)]
pub(super) struct Owed {
    pub(super) version: String,
    pub(super) nonce: String,
}

/// A set of resources by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Set {
    pub(super) clusters: BTreeMap<String, Cluster>,
    pub(super) endpoints: BTreeMap<String, ClusterLoadAssignment>,
    pub(super) listeners: BTreeMap<String, Listener>,
}

impl Set {
    pub(super) fn of(r: &Resources) -> Set {
        Set {
            clusters: r
                .clusters
                .iter()
                .map(|c| (c.name.clone(), c.clone()))
                .collect(),
            endpoints: r
                .endpoints
                .iter()
                .map(|e| (e.cluster_name.clone(), e.clone()))
                .collect(),
            listeners: r
                .listeners
                .iter()
                .map(|l| (l.name.clone(), l.clone()))
                .collect(),
        }
    }
}

/// The client's state; the desired and applied parts survive reconnects, the rest is per
/// stream.
pub(super) struct State {
    pub(super) node: Node,
    pub(super) zone: Option<String>,
    pub(super) warm_timeout: Duration,
    pub(super) status: Option<watch::Sender<ClientStatus>>,
    /// ACKed `version_info` per type ([`ResourceType::index`]).
    pub(super) versions: [String; 3],
    /// What the server asked for, per resource: the latest response of each type, with each
    /// resource found invalid replaced by its last good version (or left out when it has none).
    /// What of it is warm is applied.
    pub(super) desired: Set,
    /// The set last passed to `apply` successfully.
    pub(super) applied: Option<Resources>,
    // --- per stream ---
    /// The latest nonce received per type.
    pub(super) nonces: [String; 3],
    /// Responses not answered yet, per type.
    pub(super) owed: [Option<Owed>; 3],
    /// Errors found in the owed response of each type (its NACK lists them).
    pub(super) invalid: [Vec<ConfigError>; 3],
    /// The EDS names last requested on this stream.
    pub(super) eds_names: Option<BTreeSet<String>>,
    /// The nonce the last EDS request carried: a request that carried a nonce the server had
    /// already replaced is ignored by it, so the subscription is sent again with the next one.
    pub(super) eds_sent_nonce: Option<String>,
    /// When the held responses are NACKed if still cold.
    pub(super) warm_deadline: Option<Instant>,
    /// The assignments desired clusters wait for, each with the time it is given up on (then
    /// the cluster is used with no endpoints: [`no_endpoints`]).
    pub(super) warming: BTreeMap<String, Instant>,
    /// Whether this stream delivered a response (resets the backoff).
    pub(super) received: bool,
}

/// `node.metadata` naming the sidecar's admin endpoint `admin`.
fn node_admin_metadata(admin: &str) -> envoy_types::pb::google::protobuf::Struct {
    use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
    Struct {
        fields: [(
            crate::names::NODE_ADMIN_METADATA.to_string(),
            Value {
                kind: Some(Kind::StringValue(admin.to_string())),
            },
        )]
        .into(),
    }
}

impl State {
    pub(super) fn new(cfg: &AdsClientConfig, status: Option<watch::Sender<ClientStatus>>) -> State {
        let node = Node {
            id: cfg.node_id.clone(),
            cluster: "respway".to_string(),
            locality: cfg.zone.as_ref().map(|z| Locality {
                zone: z.clone(),
                ..Default::default()
            }),
            user_agent_name: "respway".to_string(),
            metadata: cfg.admin.as_ref().map(|a| node_admin_metadata(a)),
            ..Default::default()
        };
        State {
            node,
            zone: cfg.zone.clone(),
            warm_timeout: cfg.warm_timeout,
            status,
            versions: Default::default(),
            desired: Set::default(),
            applied: None,
            nonces: Default::default(),
            owed: Default::default(),
            invalid: Default::default(),
            eds_names: None,
            eds_sent_nonce: None,
            warm_deadline: None,
            warming: BTreeMap::new(),
            received: false,
        }
    }

    pub(super) fn publish(&self, f: impl FnOnce(&mut ClientStatus)) {
        if let Some(s) = &self.status {
            s.send_modify(f);
        }
    }

    /// Forgets the per-stream state and returns the first requests of a new stream: CDS, EDS
    /// (when clusters need assignments) and LDS, each with the ACKed version. What the last
    /// stream left unanswered is dropped back to what is applied (the new stream's responses
    /// bring it again).
    pub(super) fn start_stream(&mut self) -> Vec<DiscoveryRequest> {
        self.nonces = Default::default();
        for t in ResourceType::PUSH_ORDER {
            if self.owed[t.index()].take().is_some() {
                self.revert_type(t);
            }
        }
        self.invalid = Default::default();
        self.warm_deadline = None;
        self.eds_sent_nonce = None;
        let names = eds_names(&self.desired.clusters);
        self.eds_names = (!names.is_empty()).then_some(names);
        let mut out = vec![self.request(ResourceType::Cluster, None)];
        if self.eds_names.is_some() {
            out.push(self.request(ResourceType::Endpoint, None));
        }
        out.push(self.request(ResourceType::Listener, None));
        out
    }

    /// A request for type `t` carrying the ACKed version, the subscription and the latest
    /// nonce received: an ACK right after the version is accepted, a NACK with `error`.
    pub(super) fn request(
        &mut self,
        t: ResourceType,
        error: Option<RpcStatus>,
    ) -> DiscoveryRequest {
        if t == ResourceType::Endpoint {
            self.eds_sent_nonce = Some(self.nonces[t.index()].clone());
        }
        let resource_names = match t {
            ResourceType::Endpoint => self.eds_names.iter().flatten().cloned().collect(),
            _ => Vec::new(),
        };
        DiscoveryRequest {
            version_info: self.versions[t.index()].clone(),
            node: Some(self.node.clone()),
            resource_names,
            resource_locators: Vec::new(),
            type_url: t.type_url().to_string(),
            response_nonce: self.nonces[t.index()].clone(),
            error_detail: error,
        }
    }

    pub(super) fn on_response(
        &mut self,
        resp: DiscoveryResponse,
        apply: &mut (dyn FnMut(&Resources, Config) -> Result<(), String> + Send),
    ) -> Vec<DiscoveryRequest> {
        let Some(t) = ResourceType::from_type_url(&resp.type_url) else {
            tracing::debug!(type_url = %resp.type_url, "response of a type not subscribed; ignored");
            return Vec::new();
        };
        self.nonces[t.index()] = resp.nonce.clone();
        tracing::debug!(type_url = t.type_url(), version = %resp.version_info, n = resp.resources.len(), "response");
        // A response supersedes the one of its type still owed (whose nonce the server has
        // replaced): what that one brought and is not in use is forgotten.
        if self.owed[t.index()].take().is_some() {
            self.revert_type(t);
        }
        self.invalid[t.index()].clear();
        let decoded = match t {
            ResourceType::Cluster => decode(t, &resp.resources, |c: &Cluster| &c.name)
                .map(|items| self.desired.clusters = items),
            ResourceType::Endpoint => decode(t, &resp.resources, |e: &ClusterLoadAssignment| {
                &e.cluster_name
            })
            .map(|items| self.desired.endpoints.extend(items)),
            ResourceType::Listener => decode(t, &resp.resources, |l: &Listener| &l.name)
                .map(|items| self.desired.listeners = items),
        };
        if let Err(errors) = decoded {
            let message = errors.to_string();
            let mut out = vec![self.nack(t, CODE_INVALID_ARGUMENT, &message)];
            out.extend(self.evaluate(apply, false));
            return out;
        }
        self.owed[t.index()] = Some(Owed {
            version: resp.version_info.clone(),
            nonce: resp.nonce.clone(),
        });
        self.evaluate(apply, false)
    }

    /// The types with a response owed.
    pub(super) fn owed_types(&self) -> Vec<ResourceType> {
        ResourceType::PUSH_ORDER
            .into_iter()
            .filter(|t| self.owed[t.index()].is_some())
            .collect()
    }

    /// The NACK of the latest response of type `t` (which is then no longer owed).
    pub(super) fn nack(&mut self, t: ResourceType, code: i32, message: &str) -> DiscoveryRequest {
        tracing::warn!(type_url = t.type_url(), nonce = %self.nonces[t.index()], "NACK: {message}");
        self.owed[t.index()] = None;
        let msg = message.to_string();
        self.publish(|s| s.last_nack = Some(msg));
        self.request(
            t,
            Some(RpcStatus {
                code,
                message: message.to_string(),
                details: Vec::new(),
            }),
        )
    }

    /// The applied resources by name.
    pub(super) fn applied_set(&self) -> Set {
        self.applied.as_ref().map(Set::of).unwrap_or_default()
    }

    /// Sets the desired resources of type `t` back to what is applied.
    pub(super) fn revert_type(&mut self, t: ResourceType) {
        let a = self.applied_set();
        match t {
            ResourceType::Cluster => self.desired.clusters = a.clusters,
            ResourceType::Endpoint => self.desired.endpoints = a.endpoints,
            ResourceType::Listener => self.desired.listeners = a.listeners,
        }
    }

    /// The part of the desired set that can be in use now. A cluster whose assignment has
    /// not arrived is warming: its applied version stays (or it is left out when new). A
    /// listener naming a cluster that is not there keeps its applied version, if that one's
    /// clusters are there (or waits, left out). A cluster no longer desired that an applied
    /// listener still uses stays until that listener changes.
    pub(super) fn effective(&self) -> Set {
        let desired = &self.desired;
        let applied = self.applied_set();
        let mut eff = Set::default();
        for (name, c) in &desired.clusters {
            let warm = eds_name(c).is_none_or(|n| desired.endpoints.contains_key(&n));
            if warm {
                eff.clusters.insert(name.clone(), c.clone());
            } else if let Some(old) = applied.clusters.get(name) {
                eff.clusters.insert(name.clone(), old.clone());
            }
        }
        let usable = |l: &Listener, eff: &Set| {
            referenced_clusters(l)
                .iter()
                .all(|n| eff.clusters.contains_key(n) || applied.clusters.contains_key(n))
        };
        for (name, l) in &desired.listeners {
            if usable(l, &eff) {
                eff.listeners.insert(name.clone(), l.clone());
            } else if let Some(old) = applied.listeners.get(name).filter(|o| usable(o, &eff)) {
                eff.listeners.insert(name.clone(), old.clone());
            }
        }
        // Clusters the listeners in use still need, kept at their applied version.
        let needed: BTreeSet<String> = eff
            .listeners
            .values()
            .flat_map(referenced_clusters)
            .collect();
        for n in needed {
            if let (std::collections::btree_map::Entry::Vacant(v), Some(old)) =
                (eff.clusters.entry(n.clone()), applied.clusters.get(&n))
            {
                v.insert(old.clone());
            }
        }
        for c in eff.clusters.values() {
            if let Some(n) = eds_name(c) {
                let a = if desired.clusters.get(&c.name) == Some(c) {
                    desired.endpoints.get(&n)
                } else {
                    applied.endpoints.get(&n)
                };
                if let Some(a) = a.or_else(|| applied.endpoints.get(&n)) {
                    eff.endpoints.insert(n, a.clone());
                }
            }
        }
        eff
    }

    pub(super) fn resources(&self, s: &Set) -> Resources {
        Resources {
            listeners: s.listeners.values().cloned().collect(),
            clusters: s.clusters.values().cloned().collect(),
            endpoints: s.endpoints.values().cloned().collect(),
            node_zone: self.zone.clone(),
        }
    }

    /// Replaces each resource an error names by its applied version (or drops it when it has
    /// none) and records the error against its type. False when an error names no resource
    /// it could revert.
    pub(super) fn revert_blamed(&mut self, errors: &ConfigErrors) -> bool {
        let applied = self.applied_set();
        let mut changed = false;
        for e in errors.iter() {
            let Some(t) = blamed_type(&e.resource) else {
                continue;
            };
            let reverted = match t {
                ResourceType::Cluster => {
                    revert(&mut self.desired.clusters, &applied.clusters, &e.resource)
                }
                ResourceType::Endpoint => {
                    revert(&mut self.desired.endpoints, &applied.endpoints, &e.resource)
                }
                ResourceType::Listener => {
                    revert(&mut self.desired.listeners, &applied.listeners, &e.resource)
                }
            };
            if reverted {
                changed = true;
                self.invalid[t.index()].push(e.clone());
            }
        }
        changed
    }

    /// Applies what of the desired set is warm and valid, NACKs the responses with invalid
    /// resources (those keep their last good version), ACKs the responses now wholly in use,
    /// and holds the rest until they are warm (see the module docs). `forced`: the warming
    /// timeout passed: responses still not wholly in use are NACKed with what they wait for.
    pub(super) fn evaluate(
        &mut self,
        apply: &mut (dyn FnMut(&Resources, Config) -> Result<(), String> + Send),
        forced: bool,
    ) -> Vec<DiscoveryRequest> {
        let mut out = Vec::new();
        // Assignments no desired cluster needs are dropped.
        let needed = eds_names(&self.desired.clusters);
        self.desired.endpoints.retain(|n, _| needed.contains(n));
        let endpoints = &self.desired.endpoints;
        self.warming
            .retain(|n, _| needed.contains(n) && !endpoints.contains_key(n));
        let give_up = Instant::now() + self.warm_timeout;
        for n in needed.iter().filter(|n| !endpoints.contains_key(*n)) {
            self.warming.entry(n.clone()).or_insert(give_up);
        }
        let mut eff = self.effective();
        let mut rounds = 0;
        let resources = loop {
            // Warming clusters are checked on their own fields now (the assignment they wait
            // for is no error yet), then the set that can be in use.
            let mut check = eff.clone();
            check.clusters.extend(self.desired.clusters.clone());
            check.endpoints.extend(self.desired.endpoints.clone());
            let waiting: BTreeSet<String> = self
                .desired
                .clusters
                .values()
                .filter_map(|c| {
                    let n = eds_name(c).filter(|n| !self.desired.endpoints.contains_key(n))?;
                    Some(format!("cluster {:?}: {}", c.name, missing_assignment(&n)))
                })
                .collect();
            let early = match translate(&self.resources(&check)) {
                Ok(_) => Vec::new(),
                Err(errors) => errors
                    .iter()
                    .filter(|e| !(e.field.is_empty() && waiting.contains(&e.to_string())))
                    .cloned()
                    .collect(),
            };
            let r = self.resources(&eff);
            let result = if early.is_empty() {
                translate(&r).map(|_| ())
            } else {
                Err(ConfigErrors(early))
            };
            match result {
                Ok(()) => break Some(r),
                Err(errors) => {
                    rounds += 1;
                    if rounds > 8 || !self.revert_blamed(&errors) {
                        // Errors that name no single resource: every owed response is refused
                        // whole.
                        let message = errors.to_string();
                        for t in self.owed_types() {
                            out.push(self.nack(t, CODE_INVALID_ARGUMENT, &message));
                            self.revert_type(t);
                        }
                        break None;
                    }
                    eff = self.effective();
                }
            }
        };
        // Clusters no listener in use routes to are checked but not applied (they do
        // nothing): a change that only adds clusters waits for the listener that uses them,
        // and applies with it. A sidecar with nothing applied yet waits for a listener.
        let resources = resources.map(|mut r| {
            let used: BTreeSet<String> = r.listeners.iter().flat_map(referenced_clusters).collect();
            r.clusters.retain(|c| used.contains(&c.name));
            let names: BTreeSet<String> = r.clusters.iter().filter_map(eds_name).collect();
            r.endpoints.retain(|e| names.contains(&e.cluster_name));
            r
        });
        let resources = resources.filter(|r| self.applied.is_some() || !r.listeners.is_empty());
        if let Some(r) = resources {
            if self.applied.as_ref() != Some(&r) {
                // Translated once more without the unused clusters; the caller gets the
                // `Config` and need not translate again.
                let applied = translate(&r)
                    .map_err(|e| e.to_string())
                    .and_then(|c| apply(&r, c));
                match applied {
                    Ok(()) => {
                        self.applied = Some(r);
                        self.publish(|s| s.applies += 1);
                        tracing::info!("applied a new configuration");
                    }
                    Err(message) => {
                        for t in self.owed_types() {
                            out.push(self.nack(t, CODE_INTERNAL, &message));
                            self.revert_type(t);
                        }
                    }
                }
            }
        }
        // Answer what can be answered.
        let eff = self.effective();
        for t in self.owed_types() {
            let i = t.index();
            if !self.invalid[i].is_empty() {
                let message = self.invalid[i]
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n");
                self.invalid[i].clear();
                out.push(self.nack(t, CODE_INVALID_ARGUMENT, &message));
            } else if self.in_use(t, &eff) {
                // CDS (valid) is ACKed at once: its clusters warm meanwhile.
                if let Some(o) = self.owed[i].take() {
                    self.versions[i] = o.version;
                    debug_assert_eq!(o.nonce, self.nonces[i]);
                    out.push(self.request(t, None));
                }
            } else if forced && !self.waits_only_for_warming(&eff) {
                let message = self.waiting_for(t, &eff).join("\n");
                out.push(self.nack(t, CODE_INVALID_ARGUMENT, &message));
            }
        }
        self.publish_versions();
        if self.owed_types().is_empty() {
            self.warm_deadline = None;
        } else if self.warm_deadline.is_none() {
            tracing::debug!("holding an update until it is warm");
            self.warm_deadline = Some(Instant::now() + self.warm_timeout);
        }
        // Ask for the assignments the desired clusters need; again when some are still
        // missing and the server has answered EDS since they were asked for (it ignores a
        // request carrying a nonce it has already replaced). An EDS response is never held,
        // so this request is never mistaken for the answer to one.
        let needed = eds_names(&self.desired.clusters);
        let missing = needed
            .iter()
            .any(|n| !self.desired.endpoints.contains_key(n));
        let subscribed = self.eds_names.clone().unwrap_or_default();
        let asked_before_last_response =
            self.eds_sent_nonce.as_ref() != Some(&self.nonces[ResourceType::Endpoint.index()]);
        if self.owed[ResourceType::Endpoint.index()].is_none()
            && (needed != subscribed || (missing && asked_before_last_response))
        {
            self.eds_names = Some(needed);
            out.push(self.request(ResourceType::Endpoint, None));
        }
        out
    }

    /// True when the type's latest response can be ACKed: for LDS, every listener it brought
    /// is in use as sent; CDS and EDS are taken as they come (clusters warm in the
    /// background).
    pub(super) fn in_use(&self, t: ResourceType, eff: &Set) -> bool {
        match t {
            ResourceType::Listener => self
                .desired
                .listeners
                .iter()
                .all(|(n, l)| eff.listeners.get(n) == Some(l)),
            ResourceType::Cluster | ResourceType::Endpoint => true,
        }
    }

    /// True when every listener not in use as sent waits only for desired clusters still
    /// warming: their own timeout settles it (they apply, with no endpoints if need be), so
    /// the held LDS response is not NACKed before.
    pub(super) fn waits_only_for_warming(&self, eff: &Set) -> bool {
        self.desired
            .listeners
            .iter()
            .filter(|(n, l)| eff.listeners.get(*n) != Some(l))
            .all(|(_, l)| {
                referenced_clusters(l)
                    .iter()
                    .filter(|c| !eff.clusters.contains_key(*c))
                    .all(|c| {
                        self.desired
                            .clusters
                            .get(c)
                            .and_then(eds_name)
                            .is_some_and(|a| self.warming.contains_key(&a))
                    })
            })
    }

    /// The earliest time something is due: a held response's warm timeout or a cluster's.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.warming
            .values()
            .copied()
            .chain(self.warm_deadline)
            .min()
    }

    /// A deadline passed: clusters whose assignment did not arrive in time are used with no
    /// endpoints (as Envoy does after `initial_fetch_timeout`), then held responses whose own
    /// timeout passed are NACKed with what they still wait for.
    pub(super) fn on_deadline(
        &mut self,
        apply: &mut (dyn FnMut(&Resources, Config) -> Result<(), String> + Send),
    ) -> Vec<DiscoveryRequest> {
        let now = Instant::now();
        let expired: Vec<String> = self
            .warming
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for n in expired {
            self.warming.remove(&n);
            tracing::warn!(
                assignment = %n,
                timeout = ?self.warm_timeout,
                "no ClusterLoadAssignment arrived in time: the cluster is used with no endpoints (its keys get unavailable errors) until one does"
            );
            self.desired.endpoints.insert(n.clone(), no_endpoints(&n));
        }
        let forced = self.warm_deadline.is_some_and(|d| d <= now);
        if forced {
            self.warm_deadline = None;
        }
        self.evaluate(apply, forced)
    }

    /// What the type's owed response waits for, in words.
    pub(super) fn waiting_for(&self, t: ResourceType, eff: &Set) -> Vec<String> {
        let mut out = Vec::new();
        match t {
            ResourceType::Listener => {
                for (n, l) in &self.desired.listeners {
                    if eff.listeners.get(n) != Some(l) {
                        let missing: Vec<String> = referenced_clusters(l)
                            .into_iter()
                            .filter(|c| !eff.clusters.contains_key(c))
                            .collect();
                        out.push(format!(
                            "listener {n:?}: waits for cluster(s) {}",
                            missing.join(", ")
                        ));
                    }
                }
            }
            ResourceType::Cluster | ResourceType::Endpoint => {}
        }
        out
    }

    pub(super) fn publish_versions(&self) {
        let versions: HashMap<String, String> = ResourceType::PUSH_ORDER
            .into_iter()
            .filter(|t| !self.versions[t.index()].is_empty())
            .map(|t| (t.type_url().to_string(), self.versions[t.index()].clone()))
            .collect();
        self.publish(|s| s.applied_versions = versions);
    }
}

/// Sets the resource an error names (`error_resource`: `listener "x"`) back to its version in
/// `old`, or removes it when `old` has none. False when no resource of `map` has that name, or
/// it is already at the old version.
pub(super) fn revert<T: Clone + PartialEq>(
    map: &mut BTreeMap<String, T>,
    old: &BTreeMap<String, T>,
    error_resource: &str,
) -> bool {
    let Some(name) = map
        .keys()
        .find(|n| error_resource.ends_with(&format!(" {n:?}")))
        .cloned()
    else {
        return false;
    };
    match old.get(&name) {
        Some(o) if map.get(&name) == Some(o) => false,
        Some(o) => {
            map.insert(name, o.clone());
            true
        }
        None => {
            map.remove(&name);
            true
        }
    }
}

/// The pending type an error's resource belongs to.
pub(super) fn blamed_type(resource: &str) -> Option<ResourceType> {
    if resource.starts_with("listener") {
        Some(ResourceType::Listener)
    } else if resource.starts_with("cluster_load_assignment") {
        Some(ResourceType::Endpoint)
    } else if resource.starts_with("cluster") {
        Some(ResourceType::Cluster)
    } else {
        None
    }
}

/// The assignment name an EDS cluster needs (`eds_cluster_config.service_name`, else its
/// name); `None` for other cluster types.
pub(super) fn eds_name(c: &Cluster) -> Option<String> {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32 => Some(
            c.eds_cluster_config
                .as_ref()
                .map(|e| e.service_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| c.name.clone()),
        ),
        _ => None,
    }
}

/// The assignment a cluster is given when its own did not arrive in time: one endpoint at
/// [`NO_ENDPOINT`], which the data path never connects to and answers every request to with
/// an `unavailable` error naming the cluster.
pub(super) fn no_endpoints(name: &str) -> ClusterLoadAssignment {
    let address = Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: NO_ENDPOINT.ip().to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                NO_ENDPOINT.port(),
            ))),
            ..Default::default()
        })),
    };
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(address),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub(super) fn eds_names(clusters: &BTreeMap<String, Cluster>) -> BTreeSet<String> {
    clusters.values().filter_map(eds_name).collect()
}

/// Decodes a response's resources, keyed by name; every error at once.
pub(super) fn decode<T: Message + Default>(
    t: ResourceType,
    resources: &[Any],
    name: impl Fn(&T) -> &str,
) -> Result<BTreeMap<String, T>, ConfigErrors> {
    let kind = match t {
        ResourceType::Cluster => "clusters",
        ResourceType::Endpoint => "endpoints",
        ResourceType::Listener => "listeners",
    };
    let mut errors = Vec::new();
    let mut out = BTreeMap::new();
    for (i, any) in resources.iter().enumerate() {
        let at = format!("{kind}[{i}]");
        if any.type_url != t.type_url() {
            errors.push(ConfigError::new(
                at,
                "type_url",
                format!("expected {}, got {:?}", t.type_url(), any.type_url),
            ));
            continue;
        }
        match T::decode(any.value.as_slice()) {
            Ok(m) => {
                let n = name(&m).to_string();
                match out.entry(n) {
                    std::collections::btree_map::Entry::Occupied(o) => errors.push(
                        ConfigError::new(at, "name", format!("duplicate {:?}", o.key())),
                    ),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(m);
                    }
                }
            }
            Err(e) => errors.push(ConfigError::new(at, "", format!("cannot decode: {e}"))),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The admin address travels as the `node.metadata` string `respway_admin`; without one
    /// the node has no metadata.
    #[test]
    fn the_node_names_the_admin_endpoint_in_its_metadata() {
        use envoy_types::pb::google::protobuf::value::Kind;
        let mut cfg = AdsClientConfig::new("a", "n");
        assert_eq!(State::new(&cfg, None).node.metadata, None);
        cfg.admin = Some("127.0.0.1:9901".into());
        let meta = State::new(&cfg, None).node.metadata.expect("metadata");
        assert_eq!(
            meta.fields
                .get(crate::names::NODE_ADMIN_METADATA)
                .and_then(|v| v.kind.clone()),
            Some(Kind::StringValue("127.0.0.1:9901".into()))
        );
    }
}

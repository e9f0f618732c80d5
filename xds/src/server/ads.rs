//! The ADS service: one stream per sidecar, its subscriptions, nonces, and the responses it
//! is sent as the snapshot cache moves.

use super::*;

// === ADS service ===

/// The ADS service over a [`Cache`]; see the module docs for the protocol.
#[derive(Debug, Clone)]
pub struct Ads {
    pub(super) cache: Arc<Cache>,
    pub(super) registry: Arc<Registry>,
    pub(super) security: Arc<Security>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) next_stream: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, GrpcStatus>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, GrpcStatus> {
        if *self.stop.borrow() {
            return Err(GrpcStatus::unavailable("respway-xds is shutting down"));
        }
        let (tx, rx) = mpsc::channel(8);
        let peer = request.extensions().get::<PeerInfo>();
        let cert = peer.and_then(|p| p.cert.clone());
        let remote = peer
            .and_then(|p| p.remote)
            .or_else(|| request.remote_addr());
        let stream = AdsStream {
            id: self.next_stream.fetch_add(1, Ordering::Relaxed),
            cache: self.cache.clone(),
            registry: self.registry.clone(),
            security: self.security.clone(),
            cert,
            remote,
            denied: None,
            node: None,
            registered: false,
            types: Default::default(),
            nonces: 0,
            snapshot: None,
        };
        tokio::spawn(stream.run(request.into_inner(), tx, self.stop.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream =
        ReceiverStream<Result<DeltaDiscoveryResponse, GrpcStatus>>;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, GrpcStatus> {
        Err(GrpcStatus::unimplemented(
            "respway-xds serves state-of-the-world ADS only (StreamAggregatedResources)",
        ))
    }
}

/// What a stream subscribed to for one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Subscription {
    pub(super) wildcard: bool,
    pub(super) names: BTreeSet<String>,
}

impl Subscription {
    /// The subscription a request asks for. LDS and CDS: always wildcard. EDS: `"*"`, or an
    /// empty list on the first request of the type, is wildcard; otherwise the names.
    pub(super) fn from_request(
        t: ResourceType,
        names: &[String],
        previous: Option<&Subscription>,
    ) -> Self {
        let star = names.iter().any(|n| n == "*");
        let wildcard = match t {
            ResourceType::Cluster | ResourceType::Listener => true,
            ResourceType::Endpoint => star || (names.is_empty() && previous.is_none()),
        };
        Subscription {
            wildcard,
            names: if wildcard {
                BTreeSet::new()
            } else {
                names.iter().cloned().collect()
            },
        }
    }

    /// The resources of `res` this subscription covers, by name.
    pub(super) fn view<'a>(&'a self, res: &'a TypeResources) -> Vec<(&'a String, &'a [u8])> {
        if self.wildcard {
            res.resources
                .iter()
                .map(|(n, a)| (n, a.value.as_slice()))
                .collect()
        } else {
            self.names
                .iter()
                .filter_map(|n| res.resources.get_key_value(n))
                .map(|(n, a)| (n, a.value.as_slice()))
                .collect()
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct TypeState {
    /// `None` until the client asks for this type.
    pub(super) subscription: Option<Subscription>,
    /// The latest nonce sent for this type.
    pub(super) nonce: String,
    /// What was last sent, and for which subscription.
    pub(super) sent: Option<(Arc<TypeResources>, Subscription)>,
    /// The version sent with each of the latest nonces (at most [`NONCE_HISTORY`]), oldest
    /// first, so that an ACK or NACK of an older response is put down to the right version.
    pub(super) history: VecDeque<(String, String)>,
}

/// How many nonces per type a stream remembers the version of.
pub(super) const NONCE_HISTORY: usize = 16;

impl TypeState {
    /// The version sent with `nonce`, when it is one of the recent ones.
    pub(super) fn version_of(&self, nonce: &str) -> Option<String> {
        self.history
            .iter()
            .rev()
            .find(|(n, _)| n == nonce)
            .map(|(_, v)| v.clone())
    }
}

/// One ADS stream.
pub(super) struct AdsStream {
    pub(super) id: u64,
    pub(super) cache: Arc<Cache>,
    pub(super) registry: Arc<Registry>,
    pub(super) security: Arc<Security>,
    /// The client certificate of the stream's connection, if TLS verified one.
    pub(super) cert: Option<CertificateDer<'static>>,
    /// The peer's address, for logs.
    pub(super) remote: Option<SocketAddr>,
    /// Set when the node's resources carry secrets this stream may not get: the stream ends
    /// with it, and nothing more is sent.
    pub(super) denied: Option<GrpcStatus>,
    /// `(id, zone)` from the first request.
    pub(super) node: Option<(String, Option<String>)>,
    /// Whether the node is in the registry (the stream was not refused at once).
    pub(super) registered: bool,
    pub(super) types: [TypeState; 3],
    pub(super) nonces: u64,
    /// The node's snapshot and the cache version it is from.
    pub(super) snapshot: Option<(u64, Option<Arc<NodeSnapshot>>)>,
}

pub(super) type Outbox = mpsc::Sender<Result<DiscoveryResponse, GrpcStatus>>;

impl AdsStream {
    pub(super) async fn run(
        mut self,
        mut inbound: Streaming<DiscoveryRequest>,
        tx: Outbox,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut snapshots = self.cache.subscribe();
        loop {
            let out = tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => match self.on_request(req, &snapshots) {
                        Ok(out) => out,
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            break;
                        }
                    },
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(stream = self.id, %status, "ADS stream ended");
                        break;
                    }
                },
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let snap = snapshots.borrow_and_update().clone();
                    self.on_snapshot(&snap)
                }
                _ = stop.changed() => break,
                () = tx.closed() => break,
            };
            if let Some(status) = self.denied.take() {
                let _ = tx.send(Err(status)).await;
                break;
            }
            for resp in out {
                if tx.send(Ok(resp)).await.is_err() {
                    break;
                }
            }
        }
        if let Some((id, _)) = self.node.as_ref().filter(|_| self.registered) {
            self.registry.disconnect(id);
            tracing::debug!(stream = self.id, node = %id, "ADS stream closed");
        }
    }

    pub(super) fn on_request(
        &mut self,
        req: DiscoveryRequest,
        snapshots: &watch::Receiver<Arc<Snapshot>>,
    ) -> Result<Vec<DiscoveryResponse>, GrpcStatus> {
        if self.node.is_none() {
            let Some(node) = &req.node else {
                return Err(GrpcStatus::invalid_argument(
                    "the first DiscoveryRequest of a stream must carry node",
                ));
            };
            let zone = node
                .locality
                .as_ref()
                .map(|l| l.zone.clone())
                .filter(|z| !z.is_empty());
            // A respway sidecar names its admin endpoint in `node.metadata` (tools find it in
            // `GET /status`).
            let admin = node
                .metadata
                .as_ref()
                .and_then(|m| m.fields.get(crate::names::NODE_ADMIN_METADATA))
                .and_then(|v| match &v.kind {
                    Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => {
                        Some(s.clone()).filter(|s| !s.is_empty())
                    }
                    _ => None,
                });
            self.node = Some((node.id.clone(), zone.clone()));
            // A stream refused at once never shows on the row of the node it claimed to be.
            let snap = snapshots.borrow().clone();
            self.node_snapshot(&snap);
            if let Some(status) = self.denied.take() {
                return Err(status);
            }
            self.registry
                .connect(&node.id, zone.as_deref(), admin.as_deref());
            self.registered = true;
            tracing::debug!(stream = self.id, node = %node.id, zone = ?zone, admin = ?admin, "ADS stream opened");
        }
        let node_id = self.node.as_ref().map(|n| n.0.clone()).unwrap_or_default();
        let Some(t) = ResourceType::from_type_url(&req.type_url) else {
            tracing::debug!(stream = self.id, type_url = %req.type_url, "type not served; ignored");
            return Ok(Vec::new());
        };
        let ts = &mut self.types[t.index()];
        if !req.response_nonce.is_empty() {
            let current = req.response_nonce == ts.nonce;
            // What the request answers is known by its nonce, not by its version_info (a
            // NACK's is the version still in use, or whatever the client put there).
            let answered = ts.version_of(&req.response_nonce);
            match &req.error_detail {
                Some(detail) => {
                    tracing::warn!(
                        node = %node_id,
                        type_url = t.type_url(),
                        rejected = ?answered,
                        nonce = %req.response_nonce,
                        "NACK: {}",
                        detail.message
                    );
                    let nack = Nack {
                        version: answered,
                        nonce: req.response_nonce.clone(),
                        message: detail.message.clone(),
                    };
                    self.registry.update(&node_id, t, |s| s.nack = Some(nack));
                }
                None => {
                    if let Some(version) = answered {
                        self.registry.update(&node_id, t, |s| {
                            if current {
                                s.nack = None;
                            }
                            s.acked = Some(version);
                        });
                    }
                }
            }
            if !current {
                // Stale: a newer response is on its way; the client answers that one.
                return Ok(Vec::new());
            }
        }
        let sub = Subscription::from_request(t, &req.resource_names, ts.subscription.as_ref());
        let changed = ts.subscription.as_ref() != Some(&sub);
        ts.subscription = Some(sub.clone());
        let initial = req.response_nonce.is_empty();
        if !(initial || changed) {
            return Ok(Vec::new());
        }
        let snap = snapshots.borrow().clone();
        // A client opening a stream with the version it has (a reconnect, a failover to another
        // server over the same files: versions are content hashes) is not sent it again. Only
        // for the wildcard types: an EDS version covers every assignment, and which names the
        // client's version was for is not known.
        if initial && !req.version_info.is_empty() && sub.wildcard && t != ResourceType::Endpoint {
            if let Some(node) = self.node_snapshot(&snap) {
                let res = node.get(t);
                if res.version == req.version_info {
                    let ts = &mut self.types[t.index()];
                    ts.sent = Some((res.clone(), sub));
                    let v = res.version.clone();
                    self.registry.update(&node_id, t, |s| {
                        s.sent = Some(v.clone());
                        s.acked = Some(v);
                        s.nack = None;
                    });
                    self.caught_up(&snap);
                    return Ok(Vec::new());
                }
            }
        }
        let out = self.respond(t, &snap, initial).into_iter().collect();
        self.caught_up(&snap);
        Ok(out)
    }

    pub(super) fn on_snapshot(&mut self, snap: &Snapshot) -> Vec<DiscoveryResponse> {
        let out = ResourceType::PUSH_ORDER
            .into_iter()
            .filter_map(|t| self.respond(t, snap, false))
            .collect();
        self.caught_up(snap);
        out
    }

    /// Records that this stream's `sent` now reflects `snap` (after its responses are made,
    /// so a reader never sees the generation before the versions it implies).
    fn caught_up(&self, snap: &Snapshot) {
        if let Some((id, _)) = self.node.as_ref().filter(|_| self.registered) {
            self.registry.caught_up(id, snap.version);
        }
    }

    /// The node's snapshot in `snap`, computed once per cache version; `None` (and
    /// [`AdsStream::denied`] set) when it carries secrets this stream may not get.
    pub(super) fn node_snapshot(&mut self, snap: &Snapshot) -> Option<Arc<NodeSnapshot>> {
        if self.denied.is_some() {
            return None;
        }
        let (id, zone) = self.node.as_ref()?;
        let s = match &self.snapshot {
            Some((v, s)) if *v == snap.version => s.clone(),
            _ => {
                let s = snap.for_node(id, zone.as_deref());
                self.snapshot = Some((snap.version, s.clone()));
                s
            }
        };
        let s = s?;
        if s.carries_secrets() && !self.security.may_get_secrets(id, self.cert.as_ref()) {
            let why = match &self.cert {
                None => "the stream presented no client certificate",
                Some(_) => "its client certificate is not valid for that node id",
            };
            let message = format!(
                "node {id:?}: its resources carry secrets (passwords or keys), which are served \
                 only to a client certificate whose DNS subjectAltName is the node id; {why}"
            );
            let certificate = self.cert.as_ref().map(respway_tls::peer_dns_names);
            tracing::warn!(stream = self.id, claimed_node = %id, peer = ?self.remote, ?certificate, "ADS stream refused: {message}");
            self.registry.refuse(Refusal {
                at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                peer: self.remote.map(|a| a.to_string()),
                certificate,
                claimed_node: id.clone(),
                message: message.clone(),
            });
            self.denied = Some(GrpcStatus::permission_denied(message));
            return None;
        }
        Some(s)
    }

    /// A response for type `t` when the client subscribed to it and its resources changed
    /// since the last one (or always, with `force`).
    pub(super) fn respond(
        &mut self,
        t: ResourceType,
        snap: &Snapshot,
        force: bool,
    ) -> Option<DiscoveryResponse> {
        let node = self.node_snapshot(snap)?;
        let res = node.get(t);
        let ts = &mut self.types[t.index()];
        let sub = ts.subscription.as_ref()?;
        if !force {
            if let Some((sent, sent_sub)) = &ts.sent {
                let same = (Arc::ptr_eq(sent, res) && sent_sub == sub)
                    || sent_sub.view(sent) == sub.view(res);
                if same {
                    return None;
                }
            }
        }
        let resources = if sub.wildcard {
            res.resources.values().cloned().collect()
        } else {
            sub.names
                .iter()
                .filter_map(|n| res.resources.get(n).cloned())
                .collect()
        };
        self.nonces += 1;
        let nonce = format!("{}-{}", self.id, self.nonces);
        ts.nonce = nonce.clone();
        ts.sent = Some((res.clone(), sub.clone()));
        let version = res.version.clone();
        if ts.history.len() == NONCE_HISTORY {
            ts.history.pop_front();
        }
        ts.history.push_back((nonce.clone(), version.clone()));
        if let Some((id, _)) = &self.node {
            let v = version.clone();
            self.registry.update(id, t, |s| s.sent = Some(v));
        }
        Some(DiscoveryResponse {
            version_info: version,
            resources,
            canary: false,
            type_url: t.type_url().to_string(),
            nonce,
            control_plane: Some(ControlPlane {
                identifier: CONTROL_PLANE.to_string(),
            }),
            resource_errors: Vec::new(),
        })
    }
}

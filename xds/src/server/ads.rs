//! The ADS service: one stream per sidecar, its subscriptions, nonces, and the responses it
//! is sent as the snapshot cache moves.

use super::*;

use crate::cache::Encoded;

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

impl Ads {
    /// Opens a stream: its task runs until the client or the server ends it; its responses
    /// come out of the receiver.
    pub(super) fn open<M: Outbound>(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<mpsc::Receiver<M>, GrpcStatus> {
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
            handle: None,
            types: Default::default(),
            nonces: 0,
            snapshot: None,
        };
        // Boxed: the task's future holds a pointer to the stream's state.
        tokio::spawn(Box::new(stream).run(request.into_inner(), tx, self.stop.clone()));
        Ok(rx)
    }
}

/// The message type of a stream's responses: [`Outgoing`] for the server's own service
/// ([`wire::AdsServer`]), a decoded `DiscoveryResponse` for the generated one.
pub(super) trait Outbound: Send + 'static {
    fn response(o: Outgoing) -> Self;
    fn error(status: GrpcStatus) -> Self;
}

impl Outbound for Result<DiscoveryResponse, GrpcStatus> {
    fn response(o: Outgoing) -> Self {
        Ok(o.decoded())
    }

    fn error(status: GrpcStatus) -> Self {
        Err(status)
    }
}

/// Serves the same streams as [`wire::AdsServer`], through the generated service (each
/// response decoded into a `DiscoveryResponse` and encoded again by prost, per stream): for
/// embedding in another tonic server ([`Server::ads_service`]).
#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, GrpcStatus>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, GrpcStatus> {
        self.open(request)
            .map(|rx| Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream =
        ReceiverStream<Result<DeltaDiscoveryResponse, GrpcStatus>>;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, GrpcStatus> {
        Err(wire::delta_unimplemented())
    }
}

/// What a stream subscribed to for one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Subscription {
    pub(super) wildcard: bool,
    /// Empty when wildcard.
    pub(super) names: Arc<BTreeSet<String>>,
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
        let names: BTreeSet<String> = if wildcard {
            BTreeSet::new()
        } else {
            names.iter().cloned().collect()
        };
        // The same names as before: the same set (the stream's views share it).
        let names = match previous {
            Some(p) if *p.names == names => p.names.clone(),
            _ => Arc::new(names),
        };
        Subscription { wildcard, names }
    }

    /// The names, when not wildcard.
    pub(super) fn names_mut(&mut self) -> Option<&mut Arc<BTreeSet<String>>> {
        (!self.wildcard).then_some(&mut self.names)
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

/// What a stream last sent of one type.
#[derive(Debug)]
pub(super) struct Sent {
    pub(super) res: Arc<TypeResources>,
    /// The subscription it was for.
    pub(super) sub: Subscription,
    /// What was sent: `sub`'s view of `res`.
    pub(super) encoded: Arc<Encoded>,
}

impl Sent {
    /// Whether `encoded`, `sub`'s view of `res`, holds what was sent (byte for byte).
    fn same(&self, res: &TypeResources, sub: &Subscription, encoded: &Arc<Encoded>) -> bool {
        Arc::ptr_eq(&self.encoded, encoded)
            || (self.encoded.digest == encoded.digest
                && self.encoded.count == encoded.count
                && self.sub.view(&self.res) == sub.view(res))
    }
}

#[derive(Debug, Default)]
pub(super) struct TypeState {
    /// `None` until the client asks for this type.
    pub(super) subscription: Option<Subscription>,
    /// The counter of the latest nonce sent for this type (0: none yet).
    pub(super) nonce: u64,
    /// What was last sent, and for which subscription.
    pub(super) sent: Option<Sent>,
    /// The version sent with each of the latest nonces (at most [`NONCE_HISTORY`], by
    /// counter), oldest first, so that an ACK or NACK of an older response is put down to the
    /// right version.
    pub(super) history: VecDeque<(u64, Arc<str>)>,
}

/// How many nonces per type a stream remembers the version of.
pub(super) const NONCE_HISTORY: usize = 16;

impl TypeState {
    /// The version sent with the nonce of counter `nonce`, when it is one of the recent ones.
    pub(super) fn version_of(&self, nonce: u64) -> Option<&Arc<str>> {
        self.history
            .iter()
            .rev()
            .find(|(n, _)| *n == nonce)
            .map(|(_, v)| v)
    }
}

/// The counter of `nonce` when it is one stream `stream` sent (`"{stream}-{counter}"`, as
/// [`Outgoing`] writes it).
pub(super) fn nonce_counter(stream: u64, nonce: &str) -> Option<u64> {
    fn number(digits: &str) -> Option<u64> {
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        canonical.then(|| digits.parse().ok()).flatten()
    }
    let (s, n) = nonce.split_once('-')?;
    (number(s)? == stream).then(|| number(n)).flatten()
}

/// Sets `slot` to `version` (without allocating when it holds it already).
fn set(slot: &mut Option<String>, version: &str) {
    if slot.as_deref() != Some(version) {
        *slot = Some(version.to_string());
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
    /// The node's entry in the registry, once the stream is not refused at once.
    pub(super) handle: Option<NodeHandle>,
    pub(super) types: [TypeState; 3],
    pub(super) nonces: u64,
    /// The node's snapshot and the cache version it is from.
    pub(super) snapshot: Option<(u64, Option<Arc<NodeSnapshot>>)>,
}

impl AdsStream {
    /// The stream's task. (An async block, not an async fn, whose state would hold each
    /// argument twice: the task of each of thousands of streams is smaller.)
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn's state holds its arguments twice"
    )]
    pub(super) fn run<M: Outbound>(
        mut self: Box<Self>,
        mut inbound: Streaming<DiscoveryRequest>,
        tx: mpsc::Sender<M>,
        mut stop: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = ()> + Send {
        async move {
            let mut snapshots = self.cache.subscribe();
            loop {
                let out = tokio::select! {
                    msg = inbound.message() => match msg {
                        Ok(Some(req)) => match self.on_request(req, &snapshots) {
                            Ok(out) => out,
                            Err(status) => {
                                let _ = tx.send(M::error(status)).await;
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
                    let _ = tx.send(M::error(status)).await;
                    break;
                }
                for resp in out {
                    if tx.send(M::response(resp)).await.is_err() {
                        break;
                    }
                }
            }
            if let (Some(handle), Some((id, _))) = (&self.handle, &self.node) {
                handle.disconnect();
                tracing::debug!(stream = self.id, node = %id, "ADS stream closed");
            }
        }
    }

    pub(super) fn on_request(
        &mut self,
        req: DiscoveryRequest,
        snapshots: &watch::Receiver<Arc<Snapshot>>,
    ) -> Result<Vec<Outgoing>, GrpcStatus> {
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
            self.handle = Some(
                self.registry
                    .connect(&node.id, zone.as_deref(), admin.as_deref()),
            );
            tracing::debug!(stream = self.id, node = %node.id, zone = ?zone, admin = ?admin, "ADS stream opened");
        }
        let Some(t) = ResourceType::from_type_url(&req.type_url) else {
            tracing::debug!(stream = self.id, type_url = %req.type_url, "type not served; ignored");
            return Ok(Vec::new());
        };
        let ts = &mut self.types[t.index()];
        if !req.response_nonce.is_empty() {
            let counter = nonce_counter(self.id, &req.response_nonce);
            let current = ts.nonce != 0 && counter == Some(ts.nonce);
            // What the request answers is known by its nonce, not by its version_info (a
            // NACK's is the version still in use, or whatever the client put there).
            let answered = counter.and_then(|n| ts.version_of(n));
            let handle = self.handle.as_ref();
            match &req.error_detail {
                Some(detail) => {
                    let node_id = self.node.as_ref().map_or("", |n| n.0.as_str());
                    tracing::warn!(
                        node = %node_id,
                        type_url = t.type_url(),
                        rejected = ?answered,
                        nonce = %req.response_nonce,
                        "NACK: {}",
                        detail.message
                    );
                    let nack = Nack {
                        version: answered.map(|v| v.to_string()),
                        nonce: req.response_nonce.clone(),
                        message: detail.message.clone(),
                    };
                    if let Some(h) = handle {
                        h.update(t, |s| s.nack = Some(nack));
                    }
                }
                None => {
                    if let (Some(version), Some(h)) = (answered, handle) {
                        h.update(t, |s| {
                            if current {
                                s.nack = None;
                            }
                            set(&mut s.acked, version);
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
                    let encoded = res.encoded(t, None);
                    let ts = &mut self.types[t.index()];
                    ts.sent = Some(Sent {
                        res: res.clone(),
                        sub,
                        encoded,
                    });
                    if let Some(h) = &self.handle {
                        h.update(t, |s| {
                            set(&mut s.sent, &res.version);
                            set(&mut s.acked, &res.version);
                            s.nack = None;
                        });
                    }
                    self.caught_up(&snap);
                    return Ok(Vec::new());
                }
            }
        }
        let out = self.respond(t, &snap, initial).into_iter().collect();
        self.caught_up(&snap);
        Ok(out)
    }

    pub(super) fn on_snapshot(&mut self, snap: &Snapshot) -> Vec<Outgoing> {
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
        if let Some(h) = &self.handle {
            h.caught_up(snap.version);
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
    ) -> Option<Outgoing> {
        let node = self.node_snapshot(snap)?;
        let res = node.get(t);
        let ts = &mut self.types[t.index()];
        let sub = ts.subscription.as_mut()?;
        if let Some(sent) = &ts.sent {
            if !force && Arc::ptr_eq(&sent.res, res) && sent.sub == *sub {
                return None;
            }
        }
        // Made once per view and shared by the streams: no per-stream copy or encoding.
        let encoded = res.encoded(t, sub.names_mut());
        let sub = &*sub;
        let sent = Sent {
            res: res.clone(),
            sub: sub.clone(),
            encoded: encoded.clone(),
        };
        if !force && ts.sent.as_ref().is_some_and(|s| s.same(res, sub, &encoded)) {
            // The same content: remembered as sent, so that the next comparison is cheap.
            ts.sent = Some(sent);
            return None;
        }
        self.nonces += 1;
        let nonce = self.nonces;
        ts.nonce = nonce;
        ts.sent = Some(sent);
        if ts.history.len() == NONCE_HISTORY {
            ts.history.pop_front();
        }
        ts.history.push_back((nonce, encoded.version.clone()));
        if let Some(h) = &self.handle {
            h.update(t, |s| set(&mut s.sent, &encoded.version));
        }
        Some(Outgoing {
            encoded,
            stream: self.id,
            nonce,
        })
    }
}

mod wire;

pub(super) use wire::Outgoing;

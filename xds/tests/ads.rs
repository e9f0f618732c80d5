//! ADS end to end over real tonic on 127.0.0.1: the management server (`respway_xds::server`)
//! with a resource directory, a generic ADS client built directly on envoy-types'
//! `AggregatedDiscoveryServiceClient`, and respway's client library (`respway_xds::client`),
//! also against a scripted ADS server that sends what respway-xds never would.
//!
//! Every wait is bounded; the only timing asserted is the "an edit is pushed within 1 s".

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use respway_xds::admin::{self, AdminError};
use respway_xds::cache::ResourceType;
use respway_xds::client::{self, AdsClientConfig, ClientStatus};
use respway_xds::pb::envoy::config::cluster::v3::Cluster;
use respway_xds::pb::envoy::config::core::v3::{address, HealthCheck, Locality, Node};
use respway_xds::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment};
use respway_xds::pb::envoy::config::listener::v3::Listener;
use respway_xds::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use respway_xds::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use respway_xds::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use respway_xds::pb::google::protobuf::Any;
use respway_xds::secure::Security;
use respway_xds::server::{NodeStatus, Server, ServerStatus};
use respway_xds::{
    parse_yaml, translate, Resources, CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use respway_testkit::slack;

/// How long any single wait may take before the test fails: 10 s, times the slack factor
/// (it outlasts [`warm_timeout`], which is stretched too).
fn wait() -> Duration {
    slack(Duration::from_secs(10))
}

/// The client library's warm timeout here: 2 s, times the slack factor, as is the bound that
/// tells a change applied at once from one held until this timeout (in
/// `a_warming_cluster_holds_only_what_depends_on_it`).
fn warm_timeout() -> Duration {
    slack(Duration::from_secs(2))
}

fn base(endpoint: &str) -> String {
    format!(
        "
listeners:
  - name: main
    address: 127.0.0.1:16380
    routes: {{ catch_all: cache }}
clusters:
  - name: cache
    shards:
      - endpoints: [{{ address: {endpoint} }}]
"
    )
}

// === harness: the management server ===

/// The admin token of the servers [`start`] starts.
const TOKEN: &str = "ads-test-token";

fn auth() -> admin::AdminAuth {
    admin::AdminAuth::token(TOKEN)
}

struct Running {
    grpc: SocketAddr,
    admin: SocketAddr,
    server: Server,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn start(dir: &Path) -> Running {
    start_on(dir, "127.0.0.1:0".parse().expect("addr")).await
}

/// Like [`start`], serving secrets (inline passwords) to nodes without a client certificate:
/// these tests speak plaintext; tests/security.rs covers the rule itself.
async fn start_open_secrets(dir: &Path) -> Running {
    start_with(dir, "127.0.0.1:0".parse().expect("addr"), true).await
}

async fn start_on(dir: &Path, grpc: SocketAddr) -> Running {
    start_with(dir, grpc, false).await
}

async fn start_with(dir: &Path, grpc: SocketAddr, open_secrets: bool) -> Running {
    let grpc = TcpListener::bind(grpc).await.expect("bind grpc");
    let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
    let (grpc_addr, admin_addr) = (
        grpc.local_addr().expect("addr"),
        admin.local_addr().expect("addr"),
    );
    let dir = dir.to_path_buf();
    let server = tokio::task::spawn_blocking(move || Server::new(dir))
        .await
        .expect("load")
        .with_security(Security {
            admin_token: Some(TOKEN.to_string()),
            secrets_to_unauthenticated: open_secrets,
            ..Security::default()
        });
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.clone().serve(grpc, Some(admin), async {
        let _ = stopped.await;
    }));
    Running {
        grpc: grpc_addr,
        admin: admin_addr,
        server,
        stop: Some(stop),
        task,
    }
}

impl Running {
    fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    fn status(&self) -> ServerStatus {
        self.server.status()
    }

    fn node(&self, id: &str) -> Option<NodeStatus> {
        self.status().nodes.into_iter().find(|n| n.id == id)
    }

    /// The `version_info` served now to node `id` in `zone`: CDS, EDS, LDS.
    fn served(&self, id: &str, zone: Option<&str>) -> [String; 3] {
        let snap = self.server.cache().snapshot();
        let node = snap.for_node(id, zone).expect("a snapshot for the node");
        ResourceType::PUSH_ORDER.map(|t| node.get(t).version.clone())
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(wait(), &mut self.task)
            .await
            .expect("server stops in time")
            .expect("server task")
            .expect("server result");
    }
}

/// The version of type URL `url` in CDS, EDS, LDS `versions`.
fn of<'a>(versions: &'a [String; 3], url: &str) -> &'a str {
    let t = ResourceType::from_type_url(url).expect("a served type");
    &versions[t.index()]
}

/// Whether every type's `acked` (and `sent`) is `versions`' own.
fn all_acked(n: &NodeStatus, versions: &[String; 3]) -> bool {
    n.types.len() == 3
        && n.types
            .iter()
            .all(|(url, t)| t.acked.as_deref() == Some(of(versions, url)) && t.sent == t.acked)
}

/// The content-hash versions of resources, packed as the server packs them: CDS, EDS, LDS.
fn content_versions(r: &Resources) -> [String; 3] {
    fn packed<T: Message>(t: ResourceType, items: &[T], name: impl Fn(&T) -> &str) -> String {
        let map = items
            .iter()
            .map(|m| {
                let any = Any {
                    type_url: t.type_url().to_string(),
                    value: m.encode_to_vec(),
                };
                (name(m).to_string(), any)
            })
            .collect();
        respway_xds::cache::content_version(t, &map)
    }
    [
        packed(ResourceType::Cluster, &r.clusters, |c| &c.name),
        packed(ResourceType::Endpoint, &r.endpoints, |e| &e.cluster_name),
        packed(ResourceType::Listener, &r.listeners, |l| &l.name),
    ]
}

/// Waits until `check` holds, polling; fails after [`wait`].
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + wait();
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// === harness: a generic ADS client on envoy-types alone ===

/// A bare ADS client: whatever a non-respway xDS consumer would do with envoy-types.
struct Raw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
    node: Node,
}

impl Raw {
    async fn connect(addr: SocketAddr, id: &str, zone: Option<&str>) -> Raw {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        let (tx, rx) = mpsc::channel(16);
        let node = Node {
            id: id.to_string(),
            locality: zone.map(|z| Locality {
                zone: z.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let rx = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("stream")
            .into_inner();
        Raw { tx, rx, node }
    }

    async fn send(
        &self,
        type_url: &str,
        version: &str,
        names: &[&str],
        nonce: &str,
        error: Option<&str>,
    ) {
        let req = DiscoveryRequest {
            version_info: version.to_string(),
            node: Some(self.node.clone()),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: type_url.to_string(),
            response_nonce: nonce.to_string(),
            error_detail: error.map(|m| respway_xds::pb::google::rpc::Status {
                code: 3,
                message: m.to_string(),
                details: Vec::new(),
            }),
            ..Default::default()
        };
        self.tx.send(req).await.expect("send");
    }

    async fn recv(&mut self) -> DiscoveryResponse {
        self.recv_within(wait()).await.expect("a response in time")
    }

    async fn recv_within(&mut self, d: Duration) -> Option<DiscoveryResponse> {
        match tokio::time::timeout(d, self.rx.message()).await {
            Ok(r) => Some(r.expect("stream ok").expect("stream open")),
            Err(_) => None,
        }
    }

    async fn ack(&self, resp: &DiscoveryResponse, names: &[&str]) {
        self.send(&resp.type_url, &resp.version_info, names, &resp.nonce, None)
            .await;
    }

    /// The whole SotW handshake: CDS and LDS wildcard, ACK, then EDS for the clusters, ACK.
    async fn fetch_all(&mut self) -> Fetched {
        self.send(CLUSTER_TYPE_URL, "", &[], "", None).await;
        self.send(LISTENER_TYPE_URL, "", &[], "", None).await;
        let mut got = BTreeMap::new();
        while got.len() < 2 {
            let r = self.recv().await;
            self.ack(&r, &[]).await;
            got.insert(r.type_url.clone(), r);
        }
        let clusters: Vec<Cluster> = decode_all(&got[CLUSTER_TYPE_URL].resources);
        let listeners: Vec<Listener> = decode_all(&got[LISTENER_TYPE_URL].resources);
        let names: Vec<String> = clusters.iter().map(|c| c.name.clone()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.send(ENDPOINT_TYPE_URL, "", &names, "", None).await;
        let eds = self.recv().await;
        assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
        self.ack(&eds, &names).await;
        let endpoints: Vec<ClusterLoadAssignment> = decode_all(&eds.resources);
        Fetched {
            versions: [
                got[CLUSTER_TYPE_URL].version_info.clone(),
                eds.version_info.clone(),
                got[LISTENER_TYPE_URL].version_info.clone(),
            ],
            resources: Resources {
                listeners,
                clusters,
                endpoints,
                node_zone: None,
            },
        }
    }
}

struct Fetched {
    /// CDS, EDS, LDS.
    versions: [String; 3],
    resources: Resources,
}

fn decode_all<T: Message + Default>(anys: &[Any]) -> Vec<T> {
    anys.iter()
        .map(|a| T::decode(a.value.as_slice()).expect("decodes"))
        .collect()
}

fn endpoint_address(cla: &ClusterLoadAssignment) -> String {
    let lb = &cla.endpoints[0].lb_endpoints[0];
    let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = &lb.host_identifier else {
        panic!("no endpoint");
    };
    let Some(address::Address::SocketAddress(sa)) =
        e.address.as_ref().and_then(|a| a.address.as_ref())
    else {
        panic!("no socket address");
    };
    let Some(respway_xds::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(
        port,
    )) = sa.port_specifier
    else {
        panic!("no port");
    };
    format!("{}:{port}", sa.address)
}

// === the management server, seen by a generic ADS client ===

#[tokio::test]
async fn generic_client_fetches_lds_cds_eds_and_acks() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("base.yaml"), base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut raw = Raw::connect(server.grpc, "generic-1", None).await;
    let fetched = raw.fetch_all().await;
    // What a generic client got is exactly what the file says, and respway accepts it; its
    // versions are the hashes of that content.
    let expected = parse_yaml(&base("127.0.0.1:7001")).expect("valid");
    assert_eq!(fetched.versions, content_versions(&expected));
    assert_eq!(fetched.resources, expected);
    let config = translate(&fetched.resources).expect("translates");
    assert_eq!(config.listeners[0].name, "main");
    assert_eq!(
        endpoint_address(&fetched.resources.endpoints[0]),
        "127.0.0.1:7001"
    );
    eventually("the server to record every ACK", || {
        server
            .node("generic-1")
            .is_some_and(|n| n.connected && all_acked(&n, &fetched.versions))
    })
    .await;
    // The admin endpoint reports the same.
    let status = admin::fetch_status(&server.admin.to_string(), &auth())
        .await
        .expect("status");
    assert_eq!(status.version, 1);
    assert!(status.files.iter().all(|f| f.ok));
    drop(raw);
    eventually("the node to show as disconnected", || {
        server.node("generic-1").is_some_and(|n| !n.connected)
    })
    .await;
    server.stop().await;
}

/// A node's `generation` says which `POST /apply` its `sent` versions already reflect, also for
/// an apply that changed nothing for it (then nothing is sent, and `sent` alone could not tell).
#[tokio::test]
async fn a_nodes_generation_follows_each_apply_also_one_that_leaves_it_unchanged() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("base.yaml"), base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let admin = server.admin.to_string();
    let mut raw = Raw::connect(server.grpc, "n", None).await;
    let first = raw.fetch_all().await;
    eventually("generation 1 ACKed", || {
        server
            .node("n")
            .is_some_and(|n| n.generation == 1 && all_acked(&n, &first.versions))
    })
    .await;
    // A change for another node only: n is sent nothing, and catches up with it all the same.
    let other = format!(
        "targets: {{ node_ids: [other] }}\n{}",
        base("127.0.0.1:7002")
            .replace("name: cache", "name: cache2")
            .replace("catch_all: cache", "catch_all: cache2")
    );
    let v2 = admin::apply(&admin, &auth(), "other.yaml", &other)
        .await
        .expect("apply");
    assert_eq!(v2, 2);
    eventually("generation 2 without a push", || {
        server
            .node("n")
            .is_some_and(|n| n.generation == 2 && all_acked(&n, &first.versions))
    })
    .await;
    assert!(raw.recv_within(Duration::from_millis(200)).await.is_none());
    // A change for n: once its generation is 3, `sent` is already the new listener version.
    let changed = base("127.0.0.1:7001").replace(
        "catch_all: cache }",
        "catch_all: cache, case_insensitive: true }",
    );
    let v3 = admin::apply(&admin, &auth(), "base.yaml", &changed)
        .await
        .expect("apply");
    assert_eq!(v3, 3);
    eventually("generation 3", || {
        server.node("n").is_some_and(|n| n.generation == 3)
    })
    .await;
    let n = server.node("n").expect("node");
    let lds = &n.types[LISTENER_TYPE_URL];
    assert_ne!(
        lds.sent.as_deref(),
        Some(of(&first.versions, LISTENER_TYPE_URL))
    );
    server.stop().await;
}

#[tokio::test]
async fn stale_nonces_are_ignored_and_nacks_recorded() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("base.yaml"), base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut raw = Raw::connect(server.grpc, "n", None).await;
    raw.send(CLUSTER_TYPE_URL, "", &[], "", None).await;
    let cds = raw.recv().await;
    // A request answering a nonce the server never sent gets no response.
    raw.send(CLUSTER_TYPE_URL, "", &["*"], "not-a-nonce", None)
        .await;
    assert!(raw.recv_within(Duration::from_millis(300)).await.is_none());
    // A NACK of the current response is recorded, with the rejected version.
    raw.send(
        CLUSTER_TYPE_URL,
        "",
        &[],
        &cds.nonce,
        Some("cluster \"cache\": lb_policy: nope"),
    )
    .await;
    eventually("the NACK in the status", || {
        server.node("n").is_some_and(|n| {
            n.types[CLUSTER_TYPE_URL].nack.as_ref().is_some_and(|k| {
                k.version.as_deref() == Some(cds.version_info.as_str())
                    && k.message == "cluster \"cache\": lb_policy: nope"
            }) && n.types[CLUSTER_TYPE_URL].acked.is_none()
        })
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn a_nacked_version_is_never_shown_as_acked() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut raw = Raw::connect(server.grpc, "picky", None).await;
    raw.fetch_all().await;
    let eds =
        |server: &Running| server.node("picky").expect("listed").types[ENDPOINT_TYPE_URL].clone();
    eventually("EDS v1 ACKed", || {
        let t = eds(&server);
        t.acked.is_some() && t.acked == t.sent
    })
    .await;
    let v1 = eds(&server).acked.expect("v1");

    std::fs::write(&file, base("127.0.0.1:7002")).expect("write");
    let push = raw.recv().await;
    let v2 = push.version_info.clone();
    assert_ne!(v2, v1);
    // A NACK carrying the rejected version as its version_info (what a careless client
    // sends) is still a NACK: v2 is rejected, v1 stays the ACKed one.
    raw.send(
        ENDPOINT_TYPE_URL,
        &v2,
        &["cache"],
        &push.nonce,
        Some("cluster_load_assignment \"cache\": no"),
    )
    .await;
    eventually("the NACK of v2 in the status", || {
        let t = eds(&server);
        t.nack.as_ref().is_some_and(|k| {
            k.version.as_deref() == Some(v2.as_str())
                && k.nonce == push.nonce
                && k.message == "cluster_load_assignment \"cache\": no"
        })
    })
    .await;
    let t = eds(&server);
    assert_eq!(t.acked.as_deref(), Some(v1.as_str()), "{t:?}");
    assert_eq!(t.sent.as_deref(), Some(v2.as_str()));
    // A NACK with an empty version_info does not forget the ACKed version either.
    raw.send(
        ENDPOINT_TYPE_URL,
        "",
        &["cache"],
        &push.nonce,
        Some("again"),
    )
    .await;
    eventually("the second NACK", || {
        eds(&server).nack.is_some_and(|k| k.message == "again")
    })
    .await;
    assert_eq!(eds(&server).acked.as_deref(), Some(v1.as_str()));
    // An "ACK" of a nonce the server never sent is no ACK of anything.
    raw.send(ENDPOINT_TYPE_URL, &v2, &["cache"], "made-up", None)
        .await;
    // Then a real ACK of v2 clears the NACK.
    raw.ack(&push, &["cache"]).await;
    eventually("v2 ACKed", || {
        let t = eds(&server);
        t.acked.as_deref() == Some(v2.as_str()) && t.nack.is_none()
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_nonce_is_not_an_ack() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("base.yaml"), base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut raw = Raw::connect(server.grpc, "liar", None).await;
    raw.send(CLUSTER_TYPE_URL, "", &[], "", None).await;
    let cds = raw.recv().await;
    raw.send(CLUSTER_TYPE_URL, "7", &[], "not-a-nonce", None)
        .await;
    // Then a NACK of the real response, so that there is something to wait for.
    raw.send(CLUSTER_TYPE_URL, "7", &[], &cds.nonce, Some("bad"))
        .await;
    eventually("the NACK", || {
        server
            .node("liar")
            .is_some_and(|n| n.types[CLUSTER_TYPE_URL].nack.is_some())
    })
    .await;
    let t = server.node("liar").expect("listed").types[CLUSTER_TYPE_URL].clone();
    assert_eq!(t.acked, None, "{t:?}");
    assert_eq!(
        t.nack.and_then(|k| k.version).as_deref(),
        Some(cds.version_info.as_str())
    );
    server.stop().await;
}

#[tokio::test]
async fn the_full_example_is_served_as_is() {
    // xds/examples/full.yaml, the full example of docs/configuration.md, copied unchanged into a resource
    // directory: loaded, served, and what a client gets is the file's model.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/full.yaml");
    let dir = tempfile::tempdir().expect("dir");
    std::fs::copy(&example, dir.path().join("full.yaml")).expect("copy");
    let server = start_open_secrets(dir.path()).await;
    let status = server.status();
    assert_eq!(status.version, 1, "{status:?}");
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    assert!(status.files.iter().all(|f| f.ok), "{:?}", status.files);
    let mut raw = Raw::connect(server.grpc, "sidecar-1", Some("z1")).await;
    let fetched = raw.fetch_all().await;
    assert!(
        fetched.versions.iter().all(|v| v.len() == 16),
        "content-hash versions: {:?}",
        fetched.versions
    );
    let served = translate(&fetched.resources).expect("translates");
    let mut file = respway_xds::load_file(&example).expect("loads");
    // Resources are served by name.
    file.clusters.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(served, file);
    server.stop().await;
}

#[tokio::test]
async fn an_edited_file_is_pushed() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut raw = Raw::connect(server.grpc, "editor", None).await;
    let before = raw.fetch_all().await.versions;

    let edited = Instant::now();
    std::fs::write(&file, base("127.0.0.1:7002")).expect("write");
    let push = raw.recv().await;
    let elapsed = edited.elapsed();
    // Only the endpoints changed, so only EDS moves, to the new content's hash.
    assert_eq!(push.type_url, ENDPOINT_TYPE_URL);
    assert_ne!(push.version_info, before[1]);
    let after = content_versions(&parse_yaml(&base("127.0.0.1:7002")).expect("valid"));
    assert_eq!(push.version_info, after[1]);
    let cla: Vec<ClusterLoadAssignment> = decode_all(&push.resources);
    assert_eq!(endpoint_address(&cla[0]), "127.0.0.1:7002");
    // Typically one poll interval (200 ms); not asserted as a time (a loaded CI machine is
    // slower), only that the edit is pushed without anything else happening.
    eprintln!("edit pushed after {elapsed:?}");
    raw.ack(&push, &["cache"]).await;
    assert!(
        raw.recv_within(Duration::from_millis(400)).await.is_none(),
        "CDS and LDS did not change and are not resent"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_invalid_file_is_reported_and_not_pushed() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut raw = Raw::connect(server.grpc, "watcher", None).await;
    raw.fetch_all().await;

    std::fs::write(&file, base("127.0.0.1:99999")).expect("write");
    let admin = server.admin.to_string();
    let deadline = Instant::now() + wait();
    let status = loop {
        let s = admin::fetch_status(&admin, &auth()).await.expect("status");
        if s.files.iter().any(|f| !f.ok) {
            break s;
        }
        assert!(Instant::now() < deadline, "the error never showed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.version, 1, "the previous version stays");
    let f = &status.files[0];
    assert_eq!(f.name, "base.yaml");
    assert!(f.serving_previous);
    assert_eq!(
        f.error.as_deref(),
        Some("base.yaml: cluster \"cache\": shards[0].endpoints[0].address: invalid socket address \"127.0.0.1:99999\"")
    );
    assert!(
        raw.recv_within(Duration::from_millis(500)).await.is_none(),
        "nothing is pushed"
    );

    // A merged snapshot that does not translate is refused as a whole.
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    std::fs::write(
        dir.path().join("extra.yaml"),
        "listeners:\n  - name: extra\n    address: 127.0.0.1:16381\n    routes: { catch_all: nowhere }\n",
    )
    .expect("write");
    eventually("the merge error in the status", || {
        let s = server.status();
        s.files.iter().all(|f| f.ok) && !s.errors.is_empty()
    })
    .await;
    let s = server.status();
    assert_eq!(s.version, 1);
    assert!(
        s.errors[0].starts_with("extra.yaml: listener \"extra\": ")
            && s.errors[0].contains("nowhere")
            && s.errors[0].ends_with("(in the snapshot for other nodes)"),
        "{:?}",
        s.errors
    );
    assert!(raw.recv_within(Duration::from_millis(300)).await.is_none());
    server.stop().await;
}

#[tokio::test]
async fn files_target_nodes_by_id_and_zone() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("base.yaml"), base("127.0.0.1:7001")).expect("write");
    std::fs::write(
        dir.path().join("zone-z1.yaml"),
        "targets: { zones: [z1] }\nclusters:\n  - name: cache\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7101 }]\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("canary.yaml"),
        "targets: { node_ids: [canary] }\nclusters:\n  - name: cache\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7201 }]\n",
    )
    .expect("write");
    let server = start(dir.path()).await;
    assert_eq!(server.status().errors, Vec::<String>::new());
    for (id, zone, want) in [
        ("plain", None, "127.0.0.1:7001"),
        ("plain-z2", Some("z2"), "127.0.0.1:7001"),
        ("in-z1", Some("z1"), "127.0.0.1:7101"),
        ("canary", Some("z1"), "127.0.0.1:7201"),
        ("canary", None, "127.0.0.1:7201"),
    ] {
        let mut raw = Raw::connect(server.grpc, id, zone).await;
        let fetched = raw.fetch_all().await;
        assert_eq!(
            endpoint_address(&fetched.resources.endpoints[0]),
            want,
            "node {id} in {zone:?}"
        );
        // The listener is the base file's for everyone.
        assert_eq!(fetched.resources.listeners[0].name, "main");
    }
    server.stop().await;
}

// === the client library against the management server ===

/// Runs the client library, recording every applied set; `fail` decides whether an apply
/// fails (and with what message).
struct Lib {
    status: watch::Receiver<ClientStatus>,
    applied: Arc<Mutex<Vec<Resources>>>,
    task: JoinHandle<()>,
}

type FailFn = Box<dyn Fn(&Resources) -> Option<String> + Send>;

fn run_lib(server: String, node: &str, zone: Option<&str>, fail: FailFn) -> Lib {
    run_lib_on(vec![server], node, zone, fail)
}

fn run_lib_on(servers: Vec<String>, node: &str, zone: Option<&str>, fail: FailFn) -> Lib {
    let mut cfg = AdsClientConfig::with_servers(servers, node);
    cfg.zone = zone.map(str::to_string);
    cfg.backoff_min = Duration::from_millis(20);
    cfg.backoff_max = Duration::from_millis(200);
    cfg.warm_timeout = warm_timeout();
    let (tx, rx) = watch::channel(ClientStatus::default());
    let applied = Arc::new(Mutex::new(Vec::new()));
    let log = applied.clone();
    let task = tokio::spawn(client::run(
        cfg,
        move |r: &Resources, _config| match fail(r) {
            Some(e) => Err(e),
            None => {
                log.lock().expect("lock").push(r.clone());
                Ok(())
            }
        },
        Some(tx),
    ));
    Lib {
        status: rx,
        applied,
        task,
    }
}

impl Lib {
    async fn until(&mut self, what: &str, check: impl Fn(&ClientStatus) -> bool) -> ClientStatus {
        let result = tokio::time::timeout(wait(), self.status.wait_for(check))
            .await
            .map(|r| r.map(|s| s.clone()));
        match result {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => panic!("the client task ended"),
            Err(_) => panic!("timed out waiting for {what}: {:?}", *self.status.borrow()),
        }
    }

    fn applied(&self) -> Vec<Resources> {
        self.applied.lock().expect("lock").clone()
    }
}

impl Drop for Lib {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether the client holds `versions` (CDS, EDS, LDS).
fn versions(s: &ClientStatus, versions: &[String; 3]) -> bool {
    [CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL]
        .iter()
        .all(|t| s.applied_versions.get(*t).map(String::as_str) == Some(of(versions, t)))
}

#[tokio::test]
async fn client_applies_acks_and_follows_edits() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut lib = run_lib(server.url(), "sidecar-1", Some("z1"), Box::new(|_| None));
    let v1 = server.served("sidecar-1", Some("z1"));
    let s = lib
        .until("the first apply", |s| s.applies == 1 && versions(s, &v1))
        .await;
    assert!(s.connected);
    assert_eq!(s.last_nack, None);
    let applied = lib.applied();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].node_zone.as_deref(), Some("z1"));
    let config = translate(&applied[0]).expect("valid");
    assert_eq!(config.zone.as_deref(), Some("z1"));
    eventually("the server to see the ACKs", || {
        server
            .node("sidecar-1")
            .is_some_and(|n| n.zone.as_deref() == Some("z1") && all_acked(&n, &v1))
    })
    .await;

    std::fs::write(&file, base("127.0.0.1:7002")).expect("write");
    let s = lib.until("the edit", |s| s.applies == 2).await;
    let v2 = server.served("sidecar-1", Some("z1"));
    assert_ne!(v2[1], v1[1]);
    assert_eq!(s.applied_versions[ENDPOINT_TYPE_URL], v2[1]);
    assert_eq!(s.applied_versions[CLUSTER_TYPE_URL], v1[0]);
    assert_eq!(
        endpoint_address(&lib.applied()[1].endpoints[0]),
        "127.0.0.1:7002"
    );

    // A new cluster and a listener routing to it: warmed (CDS → EDS → LDS) and applied once.
    std::fs::write(
        dir.path().join("more.yaml"),
        "listeners:\n  - name: more\n    address: 127.0.0.1:16382\n    routes: { catch_all: more }\nclusters:\n  - name: more\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7301 }]\n",
    )
    .expect("write");
    eventually("the server to load it", || server.status().version == 3).await;
    let v3 = server.served("sidecar-1", Some("z1"));
    assert!((0..3).all(|i| v3[i] != v2[i]), "every type moved");
    let s = lib.until("the new cluster", |s| versions(s, &v3)).await;
    assert_eq!(s.applies, 3, "one apply for the whole change");
    let last = lib.applied().pop().expect("applied");
    assert_eq!(last.clusters.len(), 2);
    assert_eq!(last.endpoints.len(), 2);
    assert_eq!(last.listeners.len(), 2);

    // Removing them again: the cluster's removal waits for the listener that uses it.
    std::fs::remove_file(dir.path().join("more.yaml")).expect("remove");
    let s = lib.until("the removal", |s| s.applies == 4).await;
    assert_eq!(s.last_nack, None, "nothing was NACKed on the way");
    let last = lib.applied().pop().expect("applied");
    assert_eq!(last.clusters.len(), 1);
    assert_eq!(last.listeners.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn client_nacks_a_failed_apply_and_the_server_shows_it() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    // The sidecar refuses any config whose endpoint is 127.0.0.1:7666.
    let mut lib = run_lib(
        server.url(),
        "picky",
        None,
        Box::new(|r: &Resources| {
            (endpoint_address(&r.endpoints[0]) == "127.0.0.1:7666").then(|| {
                "listener \"main\": address: cannot bind 127.0.0.1:16380: address in use"
                    .to_string()
            })
        }),
    );
    lib.until("the first apply", |s| s.applies == 1).await;
    let good = server.served("picky", None);
    std::fs::write(&file, base("127.0.0.1:7666")).expect("write");
    let s = lib.until("the NACK", |s| s.last_nack.is_some()).await;
    assert_eq!(
        s.last_nack.as_deref(),
        Some("listener \"main\": address: cannot bind 127.0.0.1:16380: address in use")
    );
    assert_eq!(s.applies, 1);
    assert_eq!(
        s.applied_versions[ENDPOINT_TYPE_URL], good[1],
        "the last good version stays"
    );
    eventually("the NACK in the server status", || {
        server.node("picky").is_some_and(|n| {
            let eds = &n.types[ENDPOINT_TYPE_URL];
            let bad = server.served("picky", None);
            eds.acked.as_deref() == Some(good[1].as_str())
                && eds.sent.as_deref() == Some(bad[1].as_str())
                && bad[1] != good[1]
                && eds.nack.as_ref().is_some_and(|k| {
                    k.version.as_deref() == Some(bad[1].as_str())
                        && k.message.contains("cannot bind")
                })
        })
    })
    .await;
    // A fixed file is applied, and the NACK clears on the server.
    std::fs::write(&file, base("127.0.0.1:7003")).expect("write");
    lib.until("the fix", |s| s.applies == 2).await;
    eventually("the NACK to clear", || {
        server
            .node("picky")
            .is_some_and(|n| n.types[ENDPOINT_TYPE_URL].nack.is_none())
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn client_reconnects_to_a_restarted_server() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let addr = server.grpc;
    let mut lib = run_lib(server.url(), "survivor", None, Box::new(|_| None));
    lib.until("the first apply", |s| s.applies == 1).await;
    let v1 = server.served("survivor", None);

    server.stop().await;
    lib.until("the disconnect", |s| !s.connected).await;
    assert_eq!(
        lib.applied().len(),
        1,
        "the config stays while the server is away"
    );

    // A new server instance on the same port, serving the same files: the same versions,
    // nothing to apply.
    let server = start_on(dir.path(), addr).await;
    assert_eq!(server.served("survivor", None), v1);
    lib.until("the reconnect", |s| s.connected).await;
    eventually("the ACKs to the new server", || {
        server.node("survivor").is_some_and(|n| all_acked(&n, &v1))
    })
    .await;
    assert_eq!(lib.status.borrow().applies, 1, "same content, no re-apply");
    server.stop().await;

    // Away again; the files change; the next instance brings the change.
    lib.until("the disconnect", |s| !s.connected).await;
    std::fs::write(&file, base("127.0.0.1:7009")).expect("write");
    let server = start_on(dir.path(), addr).await;
    lib.until("the next version", |s| s.applies == 2 && s.connected)
        .await;
    assert_eq!(
        endpoint_address(&lib.applied()[1].endpoints[0]),
        "127.0.0.1:7009"
    );
    server.stop().await;
}

#[tokio::test]
async fn two_servers_over_one_directory_serve_the_same_versions() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let a = start(dir.path()).await;
    // The first server sees an edit the second never does.
    std::fs::write(&file, base("127.0.0.1:7002")).expect("write");
    eventually("a to load the edit", || a.status().version == 2).await;
    let b = start(dir.path()).await;
    assert_eq!((a.status().version, b.status().version), (2, 1));
    let mut from_a = Raw::connect(a.grpc, "n", None).await;
    let mut from_b = Raw::connect(b.grpc, "n", None).await;
    let (va, vb) = (from_a.fetch_all().await, from_b.fetch_all().await);
    assert_eq!(va.versions, vb.versions, "same files, same versions");
    assert_eq!(va.resources, vb.resources);

    // A change gives a different version, the same on both.
    std::fs::write(&file, base("127.0.0.1:7003")).expect("write");
    let (pa, pb) = (from_a.recv().await, from_b.recv().await);
    assert_eq!(pa.type_url, ENDPOINT_TYPE_URL);
    assert_eq!(pa.version_info, pb.version_info);
    assert_ne!(pa.version_info, va.versions[1]);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn client_fails_over_to_the_next_server_and_stays_there() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let a = start(dir.path()).await;
    let b = start(dir.path()).await;
    let a_addr = a.grpc;
    let v1 = a.served("twin", None);
    assert_eq!(b.served("twin", None), v1);
    let mut lib = run_lib_on(vec![a.url(), b.url()], "twin", None, Box::new(|_| None));
    let s = lib
        .until("the first apply", |s| s.applies == 1 && versions(s, &v1))
        .await;
    assert_eq!(s.server.as_deref(), Some(a.url().as_str()));
    assert!(b.node("twin").is_none(), "one server at a time");

    // The active server goes away: the next one at once, same versions, nothing re-applied.
    let b_url = b.url();
    a.stop().await;
    lib.until("the stream to b", |s| {
        s.connected && s.server.as_deref() == Some(b_url.as_str())
    })
    .await;
    eventually("the ACKs to b", || {
        b.node("twin").is_some_and(|n| all_acked(&n, &v1))
    })
    .await;
    assert_eq!(lib.status.borrow().applies, 1, "same content, no re-apply");

    // The next edit comes through b.
    std::fs::write(&file, base("127.0.0.1:7002")).expect("write");
    let s = lib.until("the edit", |s| s.applies == 2).await;
    assert_eq!(
        s.applied_versions[ENDPOINT_TYPE_URL],
        b.served("twin", None)[1]
    );
    assert_eq!(
        endpoint_address(&lib.applied()[1].endpoints[0]),
        "127.0.0.1:7002"
    );

    // The first server comes back: the client stays on b.
    let a = start_on(dir.path(), a_addr).await;
    // Time for a move back to show, which none may.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(a.node("twin").is_none(), "no moving back");
    assert_eq!(lib.status.borrow().server.as_deref(), Some(b_url.as_str()));

    // b goes away too: back to a, which has the same files.
    b.stop().await;
    let a_url = a.url();
    lib.until("the stream to a", |s| {
        s.connected && s.server.as_deref() == Some(a_url.as_str())
    })
    .await;
    let v2 = a.served("twin", None);
    eventually("the ACKs to a", || {
        a.node("twin").is_some_and(|n| all_acked(&n, &v2))
    })
    .await;
    assert_eq!(lib.status.borrow().applies, 2);
    a.stop().await;
}

#[tokio::test]
async fn apply_through_the_admin_endpoint() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("base.yaml"), base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut lib = run_lib(server.url(), "routed", None, Box::new(|_| None));
    lib.until("the first apply", |s| s.applies == 1).await;
    let admin = server.admin.to_string();

    // Invalid: refused with the field named, nothing written.
    let bad = "listeners:\n  - name: main\n    routes: { catch_all: cache, prefixes: [{ prefix: \"a:\", cluster: cache, mirrors: [{ cluster: cache }] }] }\n";
    let err = admin::apply(&admin, &auth(), "routes.yaml", bad)
        .await
        .unwrap_err();
    let AdminError::Refused(errors) = err else {
        panic!("refused expected: {err}");
    };
    assert!(
        errors.iter().any(|e| e.starts_with(
            "routes.yaml: listener \"main\": routes.prefixes[0].mirrors[0].cluster: "
        )),
        "{errors:?}"
    );
    assert!(!dir.path().join("routes.yaml").exists());
    let err = admin::apply(&admin, &auth(), "../escape.yaml", bad)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("invalid file name"), "{err}");

    // A route change for this node only, overriding the base listener.
    let routes = "targets: { node_ids: [routed] }\nlisteners:\n  - name: main\n    address: 127.0.0.1:16380\n    routes: { catch_all: cache, prefixes: [{ prefix: \"a:\", cluster: cache, remove_prefix: true }] }\n";
    let version = admin::apply(&admin, &auth(), "routes.yaml", routes)
        .await
        .expect("applied");
    assert_eq!(version, 2);
    assert!(dir.path().join("routes.yaml").exists());
    let s = lib.until("the route change", |s| s.applies == 2).await;
    assert_eq!(
        s.applied_versions[LISTENER_TYPE_URL],
        server.served("routed", None)[2]
    );
    let config = translate(&lib.applied()[1]).expect("valid");
    assert_eq!(config.listeners[0].routes.routes[0].prefix, "a:");
    server.stop().await;
}

#[tokio::test]
async fn the_server_refuses_to_move_a_listener() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut raw = Raw::connect(server.grpc, "mover", None).await;
    raw.fetch_all().await;
    let admin = server.admin.to_string();

    // Through /apply: refused, naming the listener and the field; nothing written.
    let moved = base("127.0.0.1:7001").replace("127.0.0.1:16380", "127.0.0.1:16390");
    let err = admin::apply(&admin, &auth(), "base.yaml", &moved)
        .await
        .unwrap_err();
    let AdminError::Refused(errors) = err else {
        panic!("refused expected: {err}");
    };
    assert!(
        errors.iter().any(|e| {
            e.starts_with(
            "base.yaml: listener \"main\": address: changed from 127.0.0.1:16380 to 127.0.0.1:16390"
        )
        }),
        "{errors:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        base("127.0.0.1:7001")
    );

    // Through a directory edit: reported, not pushed, the previous version still served.
    std::fs::write(&file, &moved).expect("write");
    eventually("the refusal in the status", || {
        server
            .status()
            .errors
            .iter()
            .any(|e| e.contains("listener \"main\": address: changed from 127.0.0.1:16380"))
    })
    .await;
    assert_eq!(server.status().version, 1);
    assert!(
        raw.recv_within(Duration::from_millis(400)).await.is_none(),
        "nothing is pushed"
    );
    // Putting it back (with another change) is served again.
    std::fs::write(&file, base("127.0.0.1:7002")).expect("write");
    let push = raw.recv().await;
    assert_eq!(push.type_url, ENDPOINT_TYPE_URL);
    assert!(server.status().errors.is_empty());
    server.stop().await;
}

// === the client library against a scripted ADS server ===

/// An ADS server that sends what the test scripts and reports every request.
#[derive(Clone)]
struct Scripted {
    requests: mpsc::UnboundedSender<DiscoveryRequest>,
    responses: Arc<Mutex<Option<mpsc::Receiver<DiscoveryResponse>>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Scripted {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let mut script = self
            .responses
            .lock()
            .expect("lock")
            .take()
            .expect("one stream");
        let requests = self.requests.clone();
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    req = inbound.message() => match req {
                        Ok(Some(r)) => { let _ = requests.send(r); }
                        _ => break,
                    },
                    resp = script.recv() => match resp {
                        Some(r) => { if tx.send(Ok(r)).await.is_err() { break; } }
                        None => break,
                    },
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("no delta"))
    }
}

struct Script {
    url: String,
    send: mpsc::Sender<DiscoveryResponse>,
    requests: mpsc::UnboundedReceiver<DiscoveryRequest>,
    nonce: u64,
    /// The version of each response pushed, by nonce.
    pushed: BTreeMap<String, String>,
    /// Requests an Envoy-strict server would flag: one carrying a response's nonce without
    /// `error_detail` (so an ACK of it) but with another version than that response's.
    violations: Vec<String>,
}

async fn scripted() -> Script {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (send, script) = mpsc::channel(8);
    let (req_tx, requests) = mpsc::unbounded_channel();
    let svc = Scripted {
        requests: req_tx,
        responses: Arc::new(Mutex::new(Some(script))),
    };
    tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
        AggregatedDiscoveryServiceServer::new(svc),
        tonic::transport::server::TcpIncoming::from(listener),
    ));
    Script {
        url: format!("http://{addr}"),
        send,
        requests,
        nonce: 0,
        pushed: BTreeMap::new(),
        violations: Vec::new(),
    }
}

impl Script {
    async fn push(&mut self, t: ResourceType, version: &str, resources: Vec<Any>) -> String {
        self.nonce += 1;
        let nonce = format!("n{}", self.nonce);
        self.pushed.insert(nonce.clone(), version.to_string());
        self.send
            .send(DiscoveryResponse {
                version_info: version.to_string(),
                resources,
                type_url: t.type_url().to_string(),
                nonce: nonce.clone(),
                ..Default::default()
            })
            .await
            .expect("push");
        nonce
    }

    /// The next request, checked against the strict rule (see `violations`).
    async fn recv(&mut self) -> DiscoveryRequest {
        let r = tokio::time::timeout(wait(), self.requests.recv())
            .await
            .expect("a request in time")
            .expect("open");
        self.check(&r);
        r
    }

    fn check(&mut self, r: &DiscoveryRequest) {
        if r.error_detail.is_none() {
            if let Some(v) = self.pushed.get(&r.response_nonce) {
                if *v != r.version_info {
                    self.violations.push(format!(
                        "{} request with nonce {} (version {v}) but version_info {:?} and no error_detail",
                        r.type_url, r.response_nonce, r.version_info
                    ));
                }
            }
        }
    }

    /// Every request that arrives within `d`, checked.
    async fn drain(&mut self, d: Duration) -> Vec<DiscoveryRequest> {
        let mut out = Vec::new();
        let until = tokio::time::Instant::now() + d;
        while let Ok(Some(r)) = tokio::time::timeout_at(until, self.requests.recv()).await {
            self.check(&r);
            out.push(r);
        }
        out
    }

    /// The next request of type `t` (others are skipped).
    async fn next(&mut self, t: ResourceType) -> DiscoveryRequest {
        loop {
            let r = self.recv().await;
            if r.type_url == t.type_url() {
                return r;
            }
        }
    }

    /// The requests answering each of `nonces`, in that order (others are skipped).
    async fn answers_to(&mut self, nonces: &[String]) -> Vec<DiscoveryRequest> {
        let mut got: BTreeMap<String, DiscoveryRequest> = BTreeMap::new();
        while got.len() < nonces.len() {
            let r = self.recv().await;
            if nonces.contains(&r.response_nonce) {
                got.insert(r.response_nonce.clone(), r);
            }
        }
        nonces
            .iter()
            .map(|n| got.remove(n).expect("answered"))
            .collect()
    }

    /// The next request answering `nonce` (others are skipped).
    async fn answer_to(&mut self, nonce: &str) -> DiscoveryRequest {
        loop {
            let r = self.recv().await;
            if r.response_nonce == nonce {
                return r;
            }
        }
    }
}

fn packed<T: Message + prost::Name>(items: &[T]) -> Vec<Any> {
    items
        .iter()
        .map(|m| Any {
            type_url: T::type_url(),
            value: m.encode_to_vec(),
        })
        .collect()
}

#[tokio::test]
async fn client_nacks_an_invalid_resource_naming_the_field() {
    let mut script = scripted().await;
    let mut lib = run_lib(script.url.clone(), "strict", None, Box::new(|_| None));
    let first = script.next(ResourceType::Cluster).await;
    assert_eq!(first.node.as_ref().map(|n| n.id.as_str()), Some("strict"));
    assert_eq!(first.version_info, "");
    assert!(
        first.resource_names.is_empty(),
        "CDS is a wildcard subscription"
    );
    let good = parse_yaml(&base("127.0.0.1:7001")).expect("valid");

    // An Envoy field respway does not implement.
    let mut bad_cluster = good.clusters[0].clone();
    bad_cluster.health_checks = vec![HealthCheck::default()];
    let nonce = script
        .push(ResourceType::Cluster, "v1", packed(&[bad_cluster]))
        .await;
    let nack = script.answer_to(&nonce).await;
    let detail = nack.error_detail.expect("a NACK");
    assert_eq!(detail.code, 3);
    assert_eq!(
        detail.message,
        "cluster \"cache\": health_checks[0].health_checker: required: a custom_health_check named envoy.health_checkers.redis"
    );
    assert_eq!(nack.version_info, "", "nothing accepted yet");
    assert!(lib.applied().is_empty());

    // Undecodable bytes are NACKed too.
    let garbage = Any {
        type_url: CLUSTER_TYPE_URL.to_string(),
        value: vec![0xff, 0xff],
    };
    let nonce = script
        .push(ResourceType::Cluster, "v2", vec![garbage])
        .await;
    let nack = script.answer_to(&nonce).await;
    assert!(nack
        .error_detail
        .expect("a NACK")
        .message
        .starts_with("clusters[0]: cannot decode: "));

    // The good set, CDS (ACKed at once) then LDS then (asked for by name) EDS: applied once
    // it is warm.
    let cds = script
        .push(ResourceType::Cluster, "v3", packed(&good.clusters))
        .await;
    let ack = script.answer_to(&cds).await;
    assert_eq!(
        (ack.version_info.as_str(), &ack.error_detail),
        ("v3", &None)
    );
    let lds = script
        .push(ResourceType::Listener, "v3", packed(&good.listeners))
        .await;
    let eds_req = script.next(ResourceType::Endpoint).await;
    assert_eq!(eds_req.resource_names, ["cache"]);
    // Time for an apply to show, which none may until the endpoints come.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(lib.applied().is_empty(), "not warm without the endpoints");
    let eds = script
        .push(ResourceType::Endpoint, "v3", packed(&good.endpoints))
        .await;
    for ack in script.answers_to(&[lds, eds]).await {
        assert_eq!(ack.error_detail, None);
        assert_eq!(ack.version_info, "v3");
    }
    let s = lib.until("the apply", |s| s.applies == 1).await;
    assert_eq!(s.applied_versions[CLUSTER_TYPE_URL], "v3");

    // A later invalid listener is NACKed with the last accepted version; the config stays.
    let mut bad_listener = good.listeners[0].clone();
    bad_listener.freebind = Some(respway_xds::pb::google::protobuf::BoolValue { value: true });
    let nonce = script
        .push(ResourceType::Listener, "v4", packed(&[bad_listener]))
        .await;
    let nack = script.answer_to(&nonce).await;
    assert_eq!(nack.version_info, "v3");
    assert_eq!(
        nack.error_detail.expect("NACK").message,
        "listener \"main\": freebind: not supported by respway"
    );
    assert_eq!(lib.applied().len(), 1);
}

/// Issue 26, item 7: CDS is ACKed at once; the server never sends the assignment, so after
/// warm_timeout (2 s here, times the slack factor) the cluster is used with no endpoints (one
/// at `NO_ENDPOINT`) and the listener routing to it applies and is ACKed.
#[tokio::test]
async fn an_update_that_never_warms_applies_with_no_endpoints_after_the_timeout() {
    let mut script = scripted().await;
    let mut lib = run_lib(script.url.clone(), "cold", None, Box::new(|_| None));
    let good = parse_yaml(&base("127.0.0.1:7001")).expect("valid");
    script.next(ResourceType::Cluster).await;
    let cds = script
        .push(ResourceType::Cluster, "v1", packed(&good.clusters))
        .await;
    let ack = script.answer_to(&cds).await;
    assert_eq!(
        (ack.version_info.as_str(), &ack.error_detail),
        ("v1", &None)
    );
    assert!(
        lib.applied().is_empty(),
        "nothing to apply without a listener"
    );
    let lds = script
        .push(ResourceType::Listener, "v1", packed(&good.listeners))
        .await;
    let ack = script.answer_to(&lds).await;
    assert_eq!(
        (ack.version_info.as_str(), &ack.error_detail),
        ("v1", &None)
    );
    lib.until("the apply", |s| s.applies == 1).await;
    let config = translate(&lib.applied().pop().expect("applied")).expect("valid");
    let endpoints: Vec<_> = config.clusters[0].shards[0]
        .endpoints
        .iter()
        .map(|e| e.address)
        .collect();
    assert_eq!(endpoints, [respway_filters::model::NO_ENDPOINT]);
    // The assignment, when it comes, replaces the placeholder.
    script
        .push(ResourceType::Endpoint, "v1", packed(&good.endpoints))
        .await;
    lib.until("the assignment", |s| s.applies == 2).await;
    let config = translate(&lib.applied().pop().expect("applied")).expect("valid");
    assert_eq!(
        config.clusters[0].shards[0].endpoints[0].address,
        "127.0.0.1:7001".parse().unwrap()
    );
    assert!(script.violations.is_empty(), "{:?}", script.violations);
}

/// Brings a scripted client to the applied base config (CDS, LDS, EDS at `v1`).
async fn base_applied(script: &mut Script, lib: &mut Lib) -> Resources {
    let good = parse_yaml(&base("127.0.0.1:7001")).expect("valid");
    script.next(ResourceType::Cluster).await;
    let cds = script
        .push(ResourceType::Cluster, "v1", packed(&good.clusters))
        .await;
    let lds = script
        .push(ResourceType::Listener, "v1", packed(&good.listeners))
        .await;
    let eds = script
        .push(ResourceType::Endpoint, "v1", packed(&good.endpoints))
        .await;
    for a in script.answers_to(&[cds, lds, eds]).await {
        assert_eq!((a.version_info.as_str(), &a.error_detail), ("v1", &None));
    }
    lib.until("the base config", |s| s.applies == 1).await;
    good
}

/// A CDS update that adds a cluster needs its assignment: the client ACKs the CDS update at
/// once (the cluster warms meanwhile, as in Envoy), subscribes to the assignment, and ACKs
/// the EDS response that lacks it at once — every request passes an Envoy-strict server's
/// check (nonce of a response, no error ⇒ that response's version).
#[tokio::test]
async fn acks_cds_at_once_when_a_cluster_is_added() {
    let mut script = scripted().await;
    let mut lib = run_lib(script.url.clone(), "strict", None, Box::new(|_| None));
    let good = base_applied(&mut script, &mut lib).await;
    let two = parse_yaml(&format!(
        "{}  - name: extra\n    shards:\n      - endpoints: [{{ address: 127.0.0.1:7002 }}]\n",
        base("127.0.0.1:7001")
    ))
    .expect("valid");
    assert_eq!(two.clusters.len(), 2);
    let cds = script
        .push(ResourceType::Cluster, "v2", packed(&two.clusters))
        .await;
    let ack = script.answer_to(&cds).await;
    assert_eq!(
        (ack.version_info.as_str(), &ack.error_detail),
        ("v2", &None)
    );
    let sub = script.next(ResourceType::Endpoint).await;
    assert_eq!(sub.resource_names, ["cache", "extra"]);
    // The server answers with the old assignment only, then with both.
    let eds2 = script
        .push(ResourceType::Endpoint, "v2", packed(&good.endpoints))
        .await;
    let ack = script.answer_to(&eds2).await;
    assert_eq!(
        (ack.version_info.as_str(), &ack.error_detail),
        ("v2", &None)
    );
    let eds3 = script
        .push(ResourceType::Endpoint, "v3", packed(&two.endpoints))
        .await;
    let ack = script.answer_to(&eds3).await;
    assert_eq!(ack.error_detail, None);
    script.drain(Duration::from_millis(200)).await;
    assert!(script.violations.is_empty(), "{:?}", script.violations);
}

/// One invalid cluster in a response: the valid ones are applied (a fresh sidecar listens),
/// the NACK names the invalid one, and its last good version stays.
#[tokio::test]
async fn a_response_with_one_invalid_cluster_applies_the_rest() {
    let mut script = scripted().await;
    let mut lib = run_lib(script.url.clone(), "partial", None, Box::new(|_| None));
    script.next(ResourceType::Cluster).await;
    let good = parse_yaml(&base("127.0.0.1:7001")).expect("valid");
    let mut broken = good.clusters[0].clone();
    broken.name = "broken".into();
    broken.health_checks = vec![HealthCheck::default()];
    let mut clusters = good.clusters.clone();
    clusters.push(broken.clone());
    let cds = script
        .push(ResourceType::Cluster, "v1", packed(&clusters))
        .await;
    let lds = script
        .push(ResourceType::Listener, "v1", packed(&good.listeners))
        .await;
    let eds = script
        .push(ResourceType::Endpoint, "v1", packed(&good.endpoints))
        .await;
    let answers = script.answers_to(&[cds, lds, eds]).await;
    let nack = answers[0].error_detail.as_ref().expect("CDS NACKed");
    assert_eq!(
        nack.message,
        "cluster \"broken\": health_checks[0].health_checker: required: a custom_health_check named envoy.health_checkers.redis"
    );
    assert_eq!(answers[0].version_info, "", "CDS v1 is not ACKed");
    assert_eq!(
        (answers[1].version_info.as_str(), &answers[1].error_detail),
        ("v1", &None)
    );
    let s = lib
        .until("the valid part applied", |s| s.applies == 1)
        .await;
    assert!(s.last_nack.is_some());
    let applied = lib.applied().pop().expect("applied");
    assert_eq!(applied.listeners.len(), 1, "the sidecar listens");
    assert_eq!(applied.clusters.len(), 1);
    assert_eq!(applied.clusters[0].name, "cache");

    // A later response breaks `cache` and changes a listener: `cache` keeps its last good
    // version, the listener change applies.
    let mut bad_cache = good.clusters[0].clone();
    bad_cache.health_checks = vec![HealthCheck::default()];
    let cds2 = script
        .push(ResourceType::Cluster, "v2", packed(&[bad_cache]))
        .await;
    let nack = script.answer_to(&cds2).await;
    assert_eq!(nack.version_info, "", "still nothing of CDS ACKed");
    assert_eq!(
        nack.error_detail.expect("NACK").message,
        "cluster \"cache\": health_checks[0].health_checker: required: a custom_health_check named envoy.health_checkers.redis"
    );
    let moved = parse_yaml(&base("127.0.0.1:7001").replace("16380", "16390")).expect("valid");
    let mut renamed = moved.listeners[0].clone();
    renamed.name = "second".into();
    let lds2 = script
        .push(
            ResourceType::Listener,
            "v2",
            packed(&[good.listeners[0].clone(), renamed]),
        )
        .await;
    let ack = script.answer_to(&lds2).await;
    assert_eq!(
        (ack.version_info.as_str(), &ack.error_detail),
        ("v2", &None)
    );
    lib.until("the listener change", |s| s.applies == 2).await;
    let applied = lib.applied().pop().expect("applied");
    assert_eq!(applied.listeners.len(), 2);
    assert_eq!(
        applied.clusters,
        vec![good.clusters[0].clone()],
        "last good cache"
    );
    assert!(script.violations.is_empty(), "{:?}", script.violations);
}

/// A cluster whose assignment never comes holds only what depends on it: a change to
/// another listener in the same LDS response applies at once (well within the warm
/// timeout), CDS is ACKed at once; after the timeout the cluster is used with no endpoints,
/// and the listener that waited for it applies and LDS is ACKed.
#[tokio::test]
async fn a_warming_cluster_holds_only_what_depends_on_it() {
    let mut script = scripted().await;
    let mut lib = run_lib(script.url.clone(), "warming", None, Box::new(|_| None));
    let good = base_applied(&mut script, &mut lib).await;
    let two = parse_yaml(&format!(
        "{}  - name: slow\n    shards:\n      - endpoints: [{{ address: 127.0.0.1:7002 }}]\n",
        base("127.0.0.1:7001")
    ))
    .expect("valid");
    let cds = script
        .push(ResourceType::Cluster, "v2", packed(&two.clusters))
        .await;
    // main now has another op_timeout; a new listener routes to the warming cluster.
    let faster = parse_yaml(
        &base("127.0.0.1:7001").replace("    routes:", "    op_timeout: 77ms\n    routes:"),
    )
    .expect("valid");
    let slow_listener = parse_yaml(
        "listeners:\n  - name: waits\n    address: 127.0.0.1:16391\n    routes: { catch_all: slow }\nclusters:\n  - name: slow\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7002 }]\n",
    )
    .expect("valid")
    .listeners;
    let started = Instant::now();
    let lds = script
        .push(
            ResourceType::Listener,
            "v2",
            packed(&[faster.listeners[0].clone(), slow_listener[0].clone()]),
        )
        .await;
    lib.until("main's change", |s| s.applies == 2).await;
    // 1.5 s, times the slack factor: under the warm timeout (2 s, times the same factor).
    assert!(
        started.elapsed() < slack(Duration::from_millis(1500)),
        "{:?}",
        started.elapsed()
    );
    let applied = lib.applied().pop().expect("applied");
    let config = translate(&applied).expect("valid");
    assert_eq!(
        config.listeners.len(),
        1,
        "the waiting listener is not applied"
    );
    assert_eq!(config.listeners[0].op_timeout, Duration::from_millis(77));
    // After warm_timeout (2 s here, times the slack factor) `slow` is used with no endpoints:
    // the waiting listener applies and LDS is ACKed.
    let answers = script.answers_to(&[cds, lds]).await;
    for a in &answers {
        assert_eq!((a.version_info.as_str(), &a.error_detail), ("v2", &None));
    }
    lib.until("the waiting listener", |s| s.applies == 3).await;
    let config = translate(&lib.applied().pop().expect("applied")).expect("valid");
    assert_eq!(config.listeners.len(), 2);
    let _ = good;
    assert!(script.violations.is_empty(), "{:?}", script.violations);
}

/// Issue 13, item 6: a sidecar that reconnects (or fails over to another server over the same
/// files) with the versions it has gets no CDS or LDS response for them — no needless
/// re-push — and the server lists them as sent and ACKed. EDS is answered (the server cannot
/// know which names the versions covered), and a later edit is pushed as usual.
#[tokio::test]
async fn a_reconnect_with_current_versions_is_not_pushed_again() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("base.yaml");
    std::fs::write(&file, base("127.0.0.1:7001")).expect("write");
    let server = start(dir.path()).await;
    let mut first = Raw::connect(server.grpc, "again", None).await;
    let had = first.fetch_all().await.versions;
    drop(first);
    let mut again = Raw::connect(server.grpc, "again", None).await;
    again.send(CLUSTER_TYPE_URL, &had[0], &[], "", None).await;
    again.send(LISTENER_TYPE_URL, &had[2], &[], "", None).await;
    again
        .send(ENDPOINT_TYPE_URL, &had[1], &["cache"], "", None)
        .await;
    let eds = again.recv().await;
    assert_eq!(eds.type_url, ENDPOINT_TYPE_URL);
    again.ack(&eds, &["cache"]).await;
    assert!(
        again
            .recv_within(Duration::from_millis(500))
            .await
            .is_none(),
        "CDS and LDS at the versions the client has are not sent again"
    );
    let node = server.node("again").expect("listed");
    for (url, v) in [(CLUSTER_TYPE_URL, &had[0]), (LISTENER_TYPE_URL, &had[2])] {
        assert_eq!(node.types[url].sent.as_ref(), Some(v), "{node:?}");
        assert_eq!(node.types[url].acked.as_ref(), Some(v), "{node:?}");
    }
    // An edit that changes the listener reaches the reconnected stream.
    let edited = base("127.0.0.1:7001").replace(
        "    routes: { catch_all: cache }",
        "    op_timeout: 2s\n    routes: { catch_all: cache }",
    );
    assert_ne!(edited, base("127.0.0.1:7001"));
    std::fs::write(&file, edited).expect("write");
    let push = again.recv().await;
    assert_eq!(push.type_url, LISTENER_TYPE_URL, "{push:?}");
    assert_ne!(&push.version_info, &had[2]);
    server.stop().await;
}

// === node classes no file completes (issue 26, item 8) ===

/// Shared clusters for every node, a listener per named node, and zone endpoints: the class of
/// "other nodes" has no listener. That class is reported, not a reason to serve nobody.
#[tokio::test]
async fn per_node_listeners_are_served_when_other_nodes_have_none() {
    let dir = tempfile::tempdir().expect("dir");
    let listener = |id: &str, port: u16| {
        format!(
            "targets: {{ node_ids: [{id}] }}\nlisteners:\n  - name: main\n    address: 127.0.0.1:{port}\n    routes: {{ catch_all: cache }}\n"
        )
    };
    for (name, text) in [
        (
            "clusters.yaml",
            "clusters:\n  - name: cache\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7001 }]\n".to_string(),
        ),
        ("n1.yaml", listener("n1", 16381)),
        ("n2.yaml", listener("n2", 16382)),
        (
            "zone-z1.yaml",
            "targets: { zones: [z1] }\nclusters:\n  - name: cache\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7101 }]\n".to_string(),
        ),
    ] {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    let server = start(dir.path()).await;
    let status = server.status();
    assert_eq!(status.errors, Vec::<String>::new());
    assert_eq!(status.version, 1, "{status:?}");
    for (id, zone, endpoint) in [
        ("n1", Some("z1"), "127.0.0.1:7101"),
        ("n2", None, "127.0.0.1:7001"),
    ] {
        let mut raw = Raw::connect(server.grpc, id, zone).await;
        let fetched = raw.fetch_all().await;
        assert_eq!(
            endpoint_address(&fetched.resources.endpoints[0]),
            endpoint,
            "{id}"
        );
        assert_eq!(fetched.resources.listeners[0].name, "main");
    }
    // The nodes no listener file names are reported, not errors; one that connects gets
    // nothing, and its row says why.
    assert_eq!(
        status.unserved,
        [
            "no listener: nothing is served to other nodes, as to a node no file is for",
            "no listener: nothing is served to other nodes in zone \"z1\", as to a node no file is for",
        ]
    );
    let mut stray = Raw::connect(server.grpc, "n3", Some("z1")).await;
    stray.send(CLUSTER_TYPE_URL, "", &[], "", None).await;
    assert!(stray
        .recv_within(Duration::from_millis(300))
        .await
        .is_none());
    let row = server.node("n3").expect("listed");
    assert!(
        row.connected
            && row
                .unserved
                .as_deref()
                .is_some_and(|u| u.starts_with("no listener")),
        "{row:?}"
    );
    let text = admin::fetch_status(&server.admin.to_string(), &auth())
        .await
        .expect("status");
    assert_eq!(text.unserved, status.unserved);
    // An edit reaching only some classes is still served to them.
    std::fs::write(
        dir.path().join("n2.yaml"),
        listener("n2", 16382).replace("catch_all: cache", "catch_all: gone"),
    )
    .expect("write");
    eventually("the error for n2", || !server.status().errors.is_empty()).await;
    assert_eq!(
        server.status().version,
        1,
        "nobody else was changed: nothing committed"
    );
    std::fs::write(dir.path().join("clusters.yaml"), "clusters:\n  - name: cache\n    shards:\n      - endpoints: [{ address: 127.0.0.1:7002 }]\n").expect("write");
    let mut n2 = Raw::connect(server.grpc, "n2", None).await;
    let mut n1 = Raw::connect(server.grpc, "n1", Some("z2")).await;
    eventually("the cluster edit", || server.status().version == 2).await;
    let (f1, f2) = (n1.fetch_all().await, n2.fetch_all().await);
    assert_eq!(
        endpoint_address(&f1.resources.endpoints[0]),
        "127.0.0.1:7002"
    );
    // n2 keeps its last good snapshot (routes to cache, the old endpoint).
    assert_eq!(
        endpoint_address(&f2.resources.endpoints[0]),
        "127.0.0.1:7001"
    );
    let errors = server.status().errors;
    assert!(
        errors.len() == 1
            && errors[0].starts_with(
                "n2.yaml: listener \"main\": routes.catch_all: unknown cluster \"gone\""
            )
            && errors[0].contains("node \"n2\""),
        "{errors:?}"
    );
    server.stop().await;
}

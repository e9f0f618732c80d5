//! The ADS service both ways: [`Server::serve`]'s (responses written from views the streams
//! share) and [`Server::ads_service`]'s (the generated service, for embedding in another tonic
//! server): the same responses but for the nonce, and the same statuses.

use std::net::SocketAddr;
use std::time::Duration;

use respway_testkit::slack;
use respway_xds::pb::envoy::config::core::v3::Node;
use respway_xds::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use respway_xds::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse,
};
use respway_xds::server::Server;
use respway_xds::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

const CONFIG: &str = "
listeners:
  - name: main
    address: 127.0.0.1:16380
    routes: { catch_all: cache }
clusters:
  - name: cache
    shards:
      - endpoints: [{ address: 127.0.0.1:7001 }]
";

/// CDS and LDS wildcard, then EDS for `cache`: the three responses, in that order.
async fn fetch(addr: SocketAddr) -> Vec<DiscoveryResponse> {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(8);
    let mut inbound = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let mut out = Vec::new();
    for (url, names) in [
        (CLUSTER_TYPE_URL, vec![]),
        (LISTENER_TYPE_URL, vec![]),
        (ENDPOINT_TYPE_URL, vec!["cache".to_string()]),
    ] {
        let req = DiscoveryRequest {
            node: Some(Node {
                id: "n1".to_string(),
                ..Default::default()
            }),
            type_url: url.to_string(),
            resource_names: names,
            ..Default::default()
        };
        tx.send(req).await.expect("send");
        let resp = tokio::time::timeout(slack(Duration::from_secs(10)), inbound.message())
            .await
            .expect("a response in time")
            .expect("stream ok")
            .expect("stream open");
        assert_eq!(resp.type_url, url);
        out.push(resp);
    }
    out
}

async fn delta_status(addr: SocketAddr) -> tonic::Status {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let (_tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(1);
    client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect_err("delta xDS is not served")
}

#[tokio::test]
async fn the_embedded_service_answers_as_the_served_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("base.yaml"), CONFIG).expect("write");
    let path = dir.path().to_path_buf();
    let server = tokio::task::spawn_blocking(move || Server::new(path))
        .await
        .expect("load");

    let served = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let served_addr = served.local_addr().expect("addr");
    let (stop_served, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.clone().serve(served, None, async {
        let _ = stopped.await;
    }));

    let embedded = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let embedded_addr = embedded.local_addr().expect("addr");
    let (stop_tx, stop_rx) = watch::channel(false);
    let embedding = tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
        server.ads_service(stop_rx),
        tonic::transport::server::TcpIncoming::from(embedded),
    ));

    let a = fetch(served_addr).await;
    let b = fetch(embedded_addr).await;
    for (a, b) in a.iter().zip(&b) {
        assert!(!a.nonce.is_empty() && !b.nonce.is_empty());
        let without_nonce = |r: &DiscoveryResponse| DiscoveryResponse {
            nonce: String::new(),
            ..r.clone()
        };
        assert_eq!(without_nonce(a), without_nonce(b), "{}", a.type_url);
        assert_eq!(a.resources.len(), 1, "{}", a.type_url);
    }

    let (sa, sb) = (
        delta_status(served_addr).await,
        delta_status(embedded_addr).await,
    );
    assert_eq!(sa.code(), tonic::Code::Unimplemented);
    assert_eq!((sa.code(), sa.message()), (sb.code(), sb.message()));

    let _ = stop_served.send(());
    let _ = stop_tx.send(true);
    serving.await.expect("task").expect("serve");
    embedding.abort();
}

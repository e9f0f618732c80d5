//! The control plane's security against real TLS peers (issue 13, item 7): a TLS management
//! server over a directory holding the full example (which carries passwords), reached by
//! tonic ADS clients and the admin client with certificates from a test CA.
//!
//! Each refusal is checked twice: the client's error says why, and nothing was served (the
//! server never saw the node, or sent it no resource).

use std::path::Path;
use std::time::Duration;

use respway_testkit::{CertFiles, Pki};
use respway_tls::{ClientFiles, ClientTls, ServerFiles, ServerTls};
use respway_xds::admin::{self, AdminAuth, AdminError};
use respway_xds::client::{channel, error_chain, status_text};
use respway_xds::pb::envoy::config::core::v3::{Locality, Node};
use respway_xds::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use respway_xds::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use respway_xds::secure::{ClientTlsRef, Security};
use respway_xds::server::Server;
use respway_xds::CLUSTER_TYPE_URL;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

const TOKEN: &str = "the-admin-token";

struct Running {
    grpc: std::net::SocketAddr,
    admin: std::net::SocketAddr,
    server: Server,
    _stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

/// A TLS server (client certificates verified against `pki`'s CA when presented, required
/// with `require`) over a directory holding the full example.
async fn start(pki: &Pki, require: bool, open_secrets: bool) -> Running {
    let dir = tempfile::tempdir().expect("dir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/full.yaml");
    std::fs::copy(&example, dir.path().join("full.yaml")).expect("copy");
    let cert = pki.issue("xds-server", &["localhost", "127.0.0.1"], false);
    let tls = ServerTls::server(
        "xds test",
        &ServerFiles {
            cert: cert.cert,
            key: cert.key,
            client_ca: Some(pki.ca()),
            require_client_cert: require,
        },
        &[b"h2", b"http/1.1"],
    )
    .expect("server tls");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (g, a) = (grpc.local_addr().unwrap(), admin.local_addr().unwrap());
    let path = dir.path().to_path_buf();
    let server = tokio::task::spawn_blocking(move || Server::new(path))
        .await
        .expect("load")
        .with_security(Security {
            tls: Some(tls),
            admin_token: Some(TOKEN.to_string()),
            admin_identities: vec!["operator".to_string()],
            secrets_to_unauthenticated: open_secrets,
        });
    assert!(server.status().errors.is_empty(), "{:?}", server.status());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.clone().serve(grpc, Some(admin), async {
        let _ = stopped.await;
    }));
    Running {
        grpc: g,
        admin: a,
        server,
        _stop: stop,
        _dir: dir,
    }
}

fn client_tls(ca: &Path, cert: Option<&CertFiles>) -> ClientTlsRef {
    let tls = ClientTls::client(
        "test client",
        &ClientFiles {
            ca: Some(ca.to_path_buf()),
            cert: cert.map(|c| c.cert.clone()),
            key: cert.map(|c| c.key.clone()),
            server_name: Some("localhost".into()),
            insecure_skip_verify: false,
        },
        &[b"h2", b"http/1.1"],
    )
    .expect("client tls");
    ClientTlsRef {
        tls,
        server_name: Some("localhost".into()),
    }
}

/// What one ADS stream for node `id` got: the first response, or the error (connect or
/// stream) as text.
async fn first_response(
    addr: std::net::SocketAddr,
    tls: Option<&ClientTlsRef>,
    id: &str,
) -> Result<DiscoveryResponse, String> {
    first_response_in(addr, tls, id, None).await
}

/// [`first_response`] for a node that says it is in `zone`.
async fn first_response_in(
    addr: std::net::SocketAddr,
    tls: Option<&ClientTlsRef>,
    id: &str,
    zone: Option<&str>,
) -> Result<DiscoveryResponse, String> {
    let ch = channel(&addr.to_string(), tls)
        .await
        .map_err(|e| error_chain(&e))?;
    let mut client = AggregatedDiscoveryServiceClient::new(ch);
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: id.to_string(),
            locality: zone.map(|z| Locality {
                zone: z.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        type_url: CLUSTER_TYPE_URL.to_string(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut inbound = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .map_err(|s| status_text(&s))?
        .into_inner();
    let got = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .map_err(|_| "no response within 10 s".to_string())?;
    drop(tx);
    match got {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err("stream closed".into()),
        Err(s) => Err(status_text(&s)),
    }
}

fn seen(server: &Server, id: &str) -> bool {
    server.status().nodes.iter().any(|n| n.id == id)
}

#[tokio::test]
async fn secrets_go_only_to_the_certificate_of_their_node() {
    let pki = Pki::new("secrets");
    let x = start(&pki, false, false).await;
    // The node's own certificate: everything, passwords included.
    let own = pki.issue("sidecar-1", &["sidecar-1"], false);
    let r = first_response(
        x.grpc,
        Some(&client_tls(&pki.ca(), Some(&own))),
        "sidecar-1",
    )
    .await
    .expect("served");
    assert!(!r.resources.is_empty());
    // Another node's (valid) certificate claiming this node id: refused, nothing sent.
    let other = pki.issue("sidecar-2", &["sidecar-2"], false);
    let err = first_response(
        x.grpc,
        Some(&client_tls(&pki.ca(), Some(&other))),
        "sidecar-1",
    )
    .await
    .unwrap_err();
    assert!(
        err.starts_with("PermissionDenied")
            && err.contains("\"sidecar-1\"")
            && err.contains("not valid for that node id"),
        "{err}"
    );
    // No certificate at all (TLS without mTLS): refused the same way.
    let err = first_response(x.grpc, Some(&client_tls(&pki.ca(), None)), "sidecar-1")
        .await
        .unwrap_err();
    assert!(
        err.starts_with("PermissionDenied") && err.contains("no client certificate"),
        "{err}"
    );
    let node = x
        .server
        .status()
        .nodes
        .into_iter()
        .find(|n| n.id == "sidecar-1")
        .expect("listed");
    let refusals = x.server.status().refusals;
    assert!(
        refusals.len() == 2
            && refusals
                .iter()
                .all(|r| r.claimed_node == "sidecar-1" && r.message.contains("secrets")),
        "{refusals:?}"
    );
    let cds = &node.types[CLUSTER_TYPE_URL];
    assert_eq!(
        cds.sent.as_deref(),
        Some(r.version_info.as_str()),
        "what was sent is what the authenticated stream got: {node:?}"
    );
}

#[tokio::test]
async fn the_operator_may_open_secrets_to_unauthenticated_nodes() {
    let pki = Pki::new("open");
    let x = start(&pki, false, true).await;
    let r = first_response(x.grpc, Some(&client_tls(&pki.ca(), None)), "anyone")
        .await
        .expect("served without a client certificate");
    assert!(!r.resources.is_empty());
}

#[tokio::test]
async fn wrong_ca_expired_certificates_and_plaintext_are_refused_before_ads() {
    let pki = Pki::new("main");
    let x = start(&pki, true, false).await;
    // A client that trusts another CA: its handshake fails verifying the server.
    let other = Pki::new("other");
    let err = first_response(x.grpc, Some(&client_tls(&other.ca(), None)), "n-wrong-ca")
        .await
        .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    // mTLS required: a client without a certificate, and one whose certificate expired.
    let err = first_response(x.grpc, Some(&client_tls(&pki.ca(), None)), "n-no-cert")
        .await
        .unwrap_err();
    assert!(err.contains("CertificateRequired"), "{err}");
    let stale = pki.issue("stale", &["n-expired"], true);
    let err = first_response(
        x.grpc,
        Some(&client_tls(&pki.ca(), Some(&stale))),
        "n-expired",
    )
    .await
    .unwrap_err();
    assert!(err.contains("CertificateExpired"), "{err}");
    // A plaintext client to the TLS port.
    let err = first_response(x.grpc, None, "n-plaintext")
        .await
        .unwrap_err();
    assert!(err.contains("transport error"), "{err}");
    for id in ["n-wrong-ca", "n-no-cert", "n-expired", "n-plaintext"] {
        assert!(!seen(&x.server, id), "{id} reached ADS");
    }
    // A valid certificate still gets through the same server.
    let ok = pki.issue("n-ok", &["n-ok"], false);
    first_response(x.grpc, Some(&client_tls(&pki.ca(), Some(&ok))), "n-ok")
        .await
        .expect("served");
}

#[tokio::test]
async fn apply_needs_a_token_or_an_admin_certificate() {
    let pki = Pki::new("admin");
    let x = start(&pki, false, false).await;
    let addr = x.admin.to_string();
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/full.yaml"))
            .unwrap();
    let before = x.server.status().version;
    let tls = |cert: Option<&CertFiles>| Some(client_tls(&pki.ca(), cert));
    let refused = |r: Result<u64, AdminError>| match r {
        Err(AdminError::Refused(e)) => e.join("\n"),
        other => panic!("not refused: {other:?}"),
    };
    // No credentials, a wrong token, a certificate that is not an admin's: 401, nothing written.
    let e = refused(
        admin::apply(
            &addr,
            &AdminAuth {
                token: None,
                tls: tls(None),
            },
            "x.yaml",
            &text,
        )
        .await,
    );
    assert!(e.contains("POST /apply needs credentials"), "{e}");
    let wrong = AdminAuth {
        token: Some("not-the-token".into()),
        tls: tls(None),
    };
    refused(admin::apply(&addr, &wrong, "x.yaml", &text).await);
    let sidecar = pki.issue("sidecar-1", &["sidecar-1"], false);
    let e = refused(
        admin::apply(
            &addr,
            &AdminAuth {
                token: None,
                tls: tls(Some(&sidecar)),
            },
            "x.yaml",
            &text,
        )
        .await,
    );
    assert!(e.contains("credentials"), "{e}");
    assert_eq!(x.server.status().version, before, "nothing was applied");
    assert!(!x._dir.path().join("x.yaml").exists());
    // Plaintext to the TLS admin port: no HTTP answer at all.
    let err = admin::fetch_status(&addr, &AdminAuth::default())
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::Transport { .. }), "{err}");
    // The token, or the operator's certificate: applied.
    let good = AdminAuth {
        token: Some(TOKEN.into()),
        tls: tls(None),
    };
    let v1 = admin::apply(
        &addr,
        &good,
        "full.yaml",
        &text.replace("op_timeout: 250ms", "op_timeout: 300ms"),
    )
    .await
    .expect("token");
    let operator = pki.issue("operator", &["operator"], false);
    let v2 = admin::apply(
        &addr,
        &AdminAuth {
            token: None,
            tls: tls(Some(&operator)),
        },
        "full.yaml",
        &text.replace("op_timeout: 250ms", "op_timeout: 350ms"),
    )
    .await
    .expect("admin certificate");
    assert!(v2 > v1 && v1 > before, "{before} {v1} {v2}");
}

#[tokio::test]
async fn a_server_without_admin_credentials_refuses_every_apply() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().to_path_buf();
    let server = tokio::task::spawn_blocking(move || Server::new(path))
        .await
        .expect("load");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = admin.local_addr().unwrap().to_string();
    let (_stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.clone().serve(grpc, Some(admin), async {
        let _ = stopped.await;
    }));
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/full.yaml"))
            .unwrap();
    for auth in [AdminAuth::default(), AdminAuth::token("anything")] {
        match admin::apply(&addr, &auth, "full.yaml", &text).await {
            Err(AdminError::Refused(e)) => {
                assert!(e[0].contains("has none configured"), "{e:?}")
            }
            other => panic!("not refused: {other:?}"),
        }
    }
    assert!(!dir.path().join("full.yaml").exists());
    // Reading the status needs no credentials.
    admin::fetch_status(&addr, &AdminAuth::default())
        .await
        .expect("status");
}

/// A file for zone z1 carrying an upstream password: the zone is what the sidecar says, not
/// what its certificate proves, so such a file is refused (issue 26, item 3) and the last
/// good one stays served.
#[tokio::test]
async fn zone_files_may_not_carry_secrets() {
    let pki = Pki::new("zones");
    let x = start(&pki, false, false).await;
    let dir = x._dir.path();
    std::fs::remove_file(dir.join("full.yaml")).expect("rm");
    let cluster = |port: u16, auth: &str| {
        format!("clusters:\n  - name: cache\n{auth}    shards:\n      - endpoints: [{{ address: 127.0.0.1:{port} }}]\n")
    };
    std::fs::write(
        dir.join("base.yaml"),
        format!(
            "listeners:\n  - name: zoned\n    address: 127.0.0.1:16390\n    routes: {{ catch_all: cache }}\n{}",
            cluster(7001, "")
        ),
    )
    .expect("write");
    std::fs::write(
        dir.join("z1.yaml"),
        format!("targets: {{ zones: [z1] }}\n{}", cluster(7101, "")),
    )
    .expect("write");
    settled(&x.server, |s| {
        s.files.len() == 2 && s.files.iter().all(|f| f.ok) && s.errors.is_empty()
    })
    .await;
    std::fs::write(
        dir.join("z1.yaml"),
        format!(
            "targets: {{ zones: [z1] }}\n{}",
            cluster(7102, "    auth: { password: zone-secret }\n")
        ),
    )
    .expect("write");
    let s = settled(&x.server, |s| {
        s.files.iter().any(|f| f.name == "z1.yaml" && !f.ok)
    })
    .await;
    let z1 = s.files.iter().find(|f| f.name == "z1.yaml").unwrap();
    assert_eq!(
        z1.error.as_deref(),
        Some(
            "z1.yaml: targets.zones: cluster \"cache\" carries secrets (inline passwords or keys), \
             which a file for zones may not: a zone is what a sidecar says it is, not what its \
             certificate proves; put them in files with targets.node_ids (served only to each \
             node's certificate)"
        ),
        "{s:?}"
    );
    assert!(z1.serving_previous);
    // Another node's own certificate, claiming z1: the last good z1 file, and no password.
    let other = pki.issue("sidecar-2", &["sidecar-2"], false);
    let r = first_response_in(
        x.grpc,
        Some(&client_tls(&pki.ca(), Some(&other))),
        "sidecar-2",
        Some("z1"),
    )
    .await
    .expect("served");
    let bytes: Vec<u8> = r.resources.iter().flat_map(|a| a.value.clone()).collect();
    assert!(!bytes.windows(11).any(|w| w == b"zone-secret"));
    assert!(!r.resources.is_empty());
    // POST /apply refuses it too, and writes nothing.
    let good = AdminAuth {
        token: Some(TOKEN.into()),
        tls: Some(client_tls(&pki.ca(), None)),
    };
    let text = format!(
        "targets: {{ zones: [z2] }}\n{}",
        cluster(7201, "    auth: { password: zone-secret }\n")
    );
    match admin::apply(&x.admin.to_string(), &good, "z2.yaml", &text).await {
        Err(AdminError::Refused(e)) => {
            assert!(
                e[0].starts_with("z2.yaml: targets.zones: cluster \"cache\" carries secrets"),
                "{e:?}"
            )
        }
        other => panic!("not refused: {other:?}"),
    }
    assert!(!dir.join("z2.yaml").exists());
}

/// The server's status once `want` holds (polled; fails after 10 s).
async fn settled(
    server: &Server,
    want: impl Fn(&respway_xds::server::ServerStatus) -> bool,
) -> respway_xds::server::ServerStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = server.status();
        if want(&s) {
            return s;
        }
        assert!(std::time::Instant::now() < deadline, "{s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An impostor's refused stream is an event naming its address and certificate; the row of
/// the node it claimed to be shows nothing of it (issue 26, item 9).
#[tokio::test]
async fn an_impostors_refusal_is_an_event_not_on_the_real_nodes_row() {
    let pki = Pki::new("impostor");
    let x = start(&pki, false, false).await;
    let own = pki.issue("sidecar-1", &["sidecar-1"], false);
    first_response_in(
        x.grpc,
        Some(&client_tls(&pki.ca(), Some(&own))),
        "sidecar-1",
        Some("z1"),
    )
    .await
    .expect("served");
    let other = pki.issue("sidecar-2", &["sidecar-2"], false);
    let err = first_response_in(
        x.grpc,
        Some(&client_tls(&pki.ca(), Some(&other))),
        "sidecar-1",
        Some("z-impostor"),
    )
    .await
    .unwrap_err();
    assert!(err.starts_with("PermissionDenied"), "{err}");
    let status = serde_json::to_value(x.server.status()).expect("json");
    let rows = status["nodes"].as_array().expect("nodes");
    assert_eq!(rows.len(), 1, "{status:#}");
    assert_eq!(rows[0]["id"], "sidecar-1");
    assert_eq!(rows[0]["zone"], "z1", "{status:#}");
    assert!(rows[0].get("refused").is_none(), "{status:#}");
    let events = status["refusals"].as_array().expect("refusals");
    assert_eq!(events.len(), 1, "{status:#}");
    let e = &events[0];
    assert_eq!(e["claimed_node"], "sidecar-1");
    assert_eq!(e["certificate"], serde_json::json!(["sidecar-2"]));
    assert!(
        e["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:")),
        "{e}"
    );
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("not valid for that node id")),
        "{e}"
    );
    // Without a certificate: the event says so.
    first_response_in(
        x.grpc,
        Some(&client_tls(&pki.ca(), None)),
        "sidecar-1",
        None,
    )
    .await
    .unwrap_err();
    let status = serde_json::to_value(x.server.status()).expect("json");
    let events = status["refusals"].as_array().expect("refusals");
    assert_eq!(events.len(), 2, "{status:#}");
    assert!(events[1]["certificate"].is_null(), "{status:#}");
    assert_eq!(status["nodes"][0]["zone"], "z1", "{status:#}");
}

/// Plain `curl https://...` against the TLS admin port: curl offers h2 in ALPN, and the port
/// accepts it, so it must speak HTTP/2 (issue 26, item 5); HTTP/1.1 still works.
#[tokio::test]
async fn curl_gets_the_status_over_tls_with_http2_and_http1() {
    let pki = Pki::new("curl");
    let x = start(&pki, false, false).await;
    let url = format!("https://localhost:{}/status", x.admin.port());
    for (flag, want) in [("--http2", "HTTP/2"), ("--http1.1", "HTTP/1.1")] {
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new("curl")
                .args(["-sS", "--max-time", "10", "--resolve"])
                .arg(format!("localhost:{}:127.0.0.1", x.admin.port()))
                .arg("--cacert")
                .arg(pki.ca())
                .args([flag, "-w", "\n%{http_version} %{http_code}", &url])
                .output(),
        )
        .await
        .expect("curl in time")
        .expect("curl runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "curl {flag}: {stderr}{stdout}");
        let (body, last) = stdout.rsplit_once('\n').expect("the -w line");
        let version = want.trim_start_matches("HTTP/");
        assert_eq!(last, format!("{version} 200"), "curl {flag}: {stderr}");
        let status: respway_xds::server::ServerStatus =
            serde_json::from_str(body).expect("status JSON");
        assert_eq!(status.version, x.server.status().version);
    }
}

//! Handshakes over loopback TCP with certificates from a test CA: what is accepted, what is
//! refused and with which error, and a rotation that keeps open connections.

use std::path::PathBuf;
use std::sync::Arc;

use respway_testkit::Pki;
use respway_tls::{
    peer_matches, server_name, ClientFiles, ClientTls, ServerFiles, ServerTls, TlsError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn server_files(pki: &Pki, stem: &str, expired: bool, mtls: Option<bool>) -> ServerFiles {
    let f = pki.issue(stem, &["localhost", "127.0.0.1"], expired);
    ServerFiles {
        cert: f.cert,
        key: f.key,
        client_ca: mtls.map(|_| pki.ca()),
        require_client_cert: mtls.unwrap_or(false),
    }
}

fn client_files(ca: PathBuf, cert: Option<respway_testkit::CertFiles>) -> ClientFiles {
    ClientFiles {
        ca: Some(ca),
        cert: cert.as_ref().map(|c| c.cert.clone()),
        key: cert.map(|c| c.key),
        server_name: None,
        insecure_skip_verify: false,
    }
}

/// Serves echo over TLS with `tls` on a loopback port; each accepted connection's handshake
/// result (the client certificate's DER, if any) goes to the returned channel.
async fn echo_server(
    tls: Arc<ServerTls>,
) -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<Result<Option<Vec<u8>>, String>>,
) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                match acceptor.accept(s).await {
                    Ok(mut s) => {
                        let peer = s
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| c.to_vec());
                        let _ = tx.send(Ok(peer));
                        let mut buf = [0u8; 64];
                        while let Ok(n) = s.read(&mut buf).await {
                            if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// Connects, handshakes and echoes one message. Returns the server certificate's DER.
async fn echo_once(
    addr: std::net::SocketAddr,
    tls: &ClientTls,
) -> Result<(Vec<u8>, respway_tls::client::TlsStream<TcpStream>), String> {
    let s = TcpStream::connect(addr).await.unwrap();
    let name = server_name(None, "localhost").unwrap();
    let mut s = tls
        .connector()
        .connect(name, s)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    assert_eq!(&buf, b"ping");
    let cert = s.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    Ok((cert, s))
}

#[tokio::test]
async fn verified_handshake_and_client_identity() {
    let pki = Pki::new("ok");
    let server =
        ServerTls::server("test", &server_files(&pki, "srv", false, Some(true)), &[]).unwrap();
    let (addr, mut seen) = echo_server(server).await;
    let client_cert = pki.issue("node-a", &["node-a"], false);
    let client =
        ClientTls::client("test", &client_files(pki.ca(), Some(client_cert)), &[]).unwrap();
    echo_once(addr, &client).await.unwrap();
    let peer = seen
        .recv()
        .await
        .unwrap()
        .unwrap()
        .expect("client certificate");
    let der = respway_tls::rustls::pki_types::CertificateDer::from(peer);
    assert!(peer_matches(&der, "node-a"));
    assert!(!peer_matches(&der, "node-b"));
}

#[tokio::test]
async fn wrong_ca_expired_certificate_and_missing_client_certificate_are_refused() {
    let pki = Pki::new("main");
    let other = Pki::new("other");
    // A client trusting another CA.
    let server = ServerTls::server("test", &server_files(&pki, "srv", false, None), &[]).unwrap();
    let (addr, _seen) = echo_server(server).await;
    let client = ClientTls::client("test", &client_files(other.ca(), None), &[]).unwrap();
    let err = echo_once(addr, &client).await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    // A server whose certificate expired.
    let server = ServerTls::server("test", &server_files(&pki, "old", true, None), &[]).unwrap();
    let (addr, _seen) = echo_server(server).await;
    let client = ClientTls::client("test", &client_files(pki.ca(), None), &[]).unwrap();
    let err = echo_once(addr, &client).await.unwrap_err();
    assert!(err.contains("certificate expired"), "{err}");
    // mTLS: a client without a certificate, and one with an expired certificate.
    let server =
        ServerTls::server("test", &server_files(&pki, "srv2", false, Some(true)), &[]).unwrap();
    let (addr, mut seen) = echo_server(server).await;
    let client = ClientTls::client("test", &client_files(pki.ca(), None), &[]).unwrap();
    assert!(echo_once(addr, &client).await.is_err());
    let err = seen.recv().await.unwrap().unwrap_err();
    assert!(err.contains("peer sent no certificates"), "{err}");
    let stale = pki.issue("stale", &["node-a"], true);
    let client = ClientTls::client("test", &client_files(pki.ca(), Some(stale)), &[]).unwrap();
    assert!(echo_once(addr, &client).await.is_err());
    let err = seen.recv().await.unwrap().unwrap_err();
    assert!(err.contains("certificate expired"), "{err}");
    // A plaintext client: the server's handshake fails, nothing is echoed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    assert!(!buf.windows(4).any(|w| w == b"PING"), "{buf:?}");
    assert!(seen.recv().await.unwrap().is_err());
}

#[tokio::test]
async fn rotation_swaps_certificates_for_new_handshakes_and_keeps_open_connections() {
    let pki = Pki::new("rot");
    let files = server_files(&pki, "srv", false, None);
    let server = ServerTls::server("test", &files, &[]).unwrap();
    let (addr, _seen) = echo_server(server.clone()).await;
    let client = ClientTls::client("test", &client_files(pki.ca(), None), &[]).unwrap();
    let (first, mut open) = echo_once(addr, &client).await.unwrap();
    assert!(!server.reload_if_changed().unwrap(), "nothing changed yet");
    // New files at the same paths (a longer SAN list, so the length differs even when the
    // modification time's resolution is coarse).
    let next = pki.issue("next", &["localhost", "127.0.0.1", "respway.test"], false);
    std::fs::copy(&next.cert, &files.cert).unwrap();
    std::fs::copy(&next.key, &files.key).unwrap();
    assert!(server.reload_if_changed().unwrap());
    let (second, _) = echo_once(addr, &client).await.unwrap();
    assert_ne!(first, second, "a new handshake gets the new certificate");
    // The connection opened before the rotation still works.
    open.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    open.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    // A broken file keeps the last good configuration serving.
    std::fs::write(&files.key, "not a key").unwrap();
    let err = server.reload_if_changed().unwrap_err();
    assert!(matches!(err, TlsError::File { .. }), "{err}");
    echo_once(addr, &client).await.unwrap();
}

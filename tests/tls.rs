//! TLS on the data path, against real `redis-server`s (plaintext and `--tls-port`) and real
//! TLS clients (`redis-cli --tls`, and a rustls client speaking RESP): a TLS listener in front
//! of plaintext shards, what wrong CAs, expired certificates, plaintext clients and clients
//! without a certificate get, TLS to the shards with every kind of upstream connection, and
//! a certificate rotation under load, and the expiry warnings and metric.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use respway_tls::rustls::pki_types::ServerName;
use respway_tls::rustls::{ClientConnection, StreamOwned};
use respway_tls::ClientFiles;

/// A RESP client over rustls (blocking, with read timeouts).
struct TlsConn {
    s: StreamOwned<ClientConnection, std::net::TcpStream>,
    buf: Vec<u8>,
}

/// Connects to `addr` as `localhost`, trusting `ca`, presenting `cert` if given, and
/// completes the handshake.
fn tls_connect(addr: SocketAddr, ca: &Path, cert: Option<&CertFiles>) -> std::io::Result<TlsConn> {
    let files = ClientFiles {
        ca: Some(ca.to_owned()),
        cert: cert.map(|c| c.cert.clone()),
        key: cert.map(|c| c.key.clone()),
        server_name: None,
        insecure_skip_verify: false,
    };
    let config = respway_tls::client_config(&files, &[]).expect("client config");
    let name = ServerName::try_from("localhost").expect("name");
    let conn = ClientConnection::new(Arc::new(config), name).expect("client connection");
    let tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let _ = tcp.set_nodelay(true);
    let mut s = StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(TlsConn { s, buf: Vec::new() })
}

impl TlsConn {
    fn send(&mut self, args: &[&str]) -> std::io::Result<()> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        let mut out = Vec::new();
        encode_cmd(&mut out, &a);
        self.s.write_all(&out)?;
        self.s.flush()
    }

    fn read(&mut self) -> std::io::Result<Resp> {
        loop {
            if let Some((r, n)) = parse_resp(&self.buf)? {
                self.buf.drain(..n);
                return Ok(r);
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn call(&mut self, args: &[&str]) -> std::io::Result<Resp> {
        self.send(args)?;
        self.read()
    }

    /// The server's leaf certificate (DER).
    fn server_cert(&self) -> Vec<u8> {
        self.s.conn.peer_certificates().expect("server certificate")[0].to_vec()
    }
}

/// A `tls:` block for a listener.
fn listener_tls(files: &CertFiles, client_ca: Option<&Path>) -> String {
    let mut y = format!(
        "    tls:\n      cert: {}\n      key: {}\n",
        files.cert.display(),
        files.key.display()
    );
    if let Some(ca) = client_ca {
        y.push_str(&format!(
            "      client_ca: {}\n      require_client_cert: true\n",
            ca.display()
        ));
    }
    y
}

fn cluster_yaml(name: &str, shards: &[SocketAddr], tls: &str) -> String {
    let mut y = format!("  - name: {name}\n    connect_timeout: 2s\n{tls}    shards:\n");
    for (i, a) in shards.iter().enumerate() {
        y.push_str(&format!(
            "      - name: s{i}\n        endpoints: [{{ address: \"{a}\" }}]\n"
        ));
    }
    y
}

/// An `INFO` field of the listener at `addr` (over TLS), waiting (10 s at most) until it
/// reaches `want`: the server counts a failed handshake after the client saw it fail.
fn wait_info_at_least(addr: SocketAddr, ca: &Path, field: &str, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = tls_connect(addr, ca, None).expect("connect for INFO");
        let info = c.call(&["INFO"]).expect("INFO").text();
        let n = info
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in INFO:\n{info}"));
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-cli` with `args` (bounded); its output.
fn redis_cli(args: &[&str]) -> String {
    let (ok, out) = run_bounded("redis-cli", args);
    assert!(ok, "redis-cli {args:?}: {out}");
    out
}

/// Sends a `SET` in plaintext on `c` (to a TLS listener): the answer is respway's error and
/// the connection is closed. Returns the connection, still open on the client's side.
fn told_this_port_speaks_tls(mut c: RespConn) -> RespConn {
    c.send(&["SET", "plain:key", "v"]);
    let (got, end) = c.read_until_closed(Duration::from_secs(10));
    assert!(end.is_ok(), "closed: {end:?}");
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR this port speaks TLS\r\n"
    );
    c
}

#[test]
fn tls_listener_in_front_of_plaintext_shards() {
    let pki = Pki::new("listener");
    let other = Pki::new("other");
    let good = pki.issue("server", &["localhost", "127.0.0.1"], false);
    let expired = pki.issue("expired", &["localhost", "127.0.0.1"], true);
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let old_port = free_port();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    client_stall_timeout: 1s\n{}    routes: {{ catch_all: main }}\n  - name: old\n    address: 127.0.0.1:{old_port}\n{}    routes: {{ catch_all: main }}\nclusters:\n{}",
        listener_tls(&good, None),
        listener_tls(&expired, None),
        cluster_yaml("main", &addrs, "")
    );
    let rw = respway(&yaml, 1);
    let old = loopback(old_port);

    // SET, GET and MGET across the three shards.
    let mut c = tls_connect(rw.addr, &pki.ca(), None).expect("TLS client");
    let keys: Vec<String> = (0..30).map(|i| format!("tls:k{i}")).collect();
    for k in &keys {
        assert_eq!(c.call(&["SET", k, &format!("v-{k}")]).unwrap().text(), "OK");
    }
    for k in &keys {
        assert_eq!(c.call(&["GET", k]).unwrap().text(), format!("v-{k}"));
    }
    let mut mget = vec!["MGET"];
    mget.extend(keys.iter().map(String::as_str));
    let Resp::Array(Some(values)) = c.call(&mget).unwrap() else {
        panic!("MGET reply");
    };
    let want: Vec<Resp> = keys.iter().map(|k| Resp::bulk(format!("v-{k}"))).collect();
    assert_eq!(values, want);
    for a in &addrs {
        assert!(dbsize(*a) > 0, "shard {a} got none of the keys");
    }
    // redis-cli --tls (OpenSSL) too.
    let port = rw.addr.port().to_string();
    let ca = pki.ca().display().to_string();
    let out = redis_cli(&[
        "--tls",
        "--cacert",
        &ca,
        "-h",
        "localhost",
        "-p",
        &port,
        "GET",
        "tls:k7",
    ]);
    assert_eq!(out.trim(), "v-tls:k7");

    // A client that trusts another CA fails verification; so does one offered an expired
    // certificate; both are counted by the listener.
    let err = tls_connect(rw.addr, &other.ca(), None)
        .err()
        .expect("wrong CA");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    let err = tls_connect(old, &pki.ca(), None).err().expect("expired");
    assert!(err.to_string().contains("certificate expired"), "{err}");
    let out = run_bounded(
        "redis-cli",
        &[
            "--tls",
            "--cacert",
            &ca,
            "-h",
            "localhost",
            "-p",
            &old_port.to_string(),
            "PING",
        ],
    );
    assert!(!out.1.contains("PONG"), "{out:?}");
    // (INFO's proxy section counts every listener of the process; redis-cli may try more
    // than once.)
    let mut failed = wait_info_at_least(rw.addr, &pki.ca(), "tls_handshake_failures", 3);
    assert!(failed >= 3, "{failed}");
    // A late-counted attempt of redis-cli's would still be counted after that: wait until
    // the count holds still for 300 ms (5 s at most), so the checks below are exact.
    let settle = Instant::now() + Duration::from_secs(5);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = wait_info_at_least(rw.addr, &pki.ca(), "tls_handshake_failures", failed);
        if now == failed || Instant::now() > settle {
            break;
        }
        failed = now;
    }

    // A plaintext client: its command is not executed, and it is told why.
    let plain = RespConn::connect(rw.addr);
    let _plain = told_this_port_speaks_tls(plain);
    for a in &addrs {
        assert_eq!(raw_command(*a, &["EXISTS", "plain:key"]).unwrap(), ":0\r\n");
    }
    assert_eq!(
        wait_info_at_least(rw.addr, &pki.ca(), "tls_plaintext_connections_refused", 1),
        1
    );
    // One that sends its command 300 ms after connecting and then stays connected past
    // client_stall_timeout is refused the same way and counted as refused plaintext, not as a
    // failed handshake (the refusal is not part of the bounded handshake).
    let slow = RespConn::connect(rw.addr);
    std::thread::sleep(Duration::from_millis(300));
    let slow = told_this_port_speaks_tls(slow);
    std::thread::sleep(Duration::from_millis(1500));
    drop(slow);
    assert_eq!(
        wait_info_at_least(rw.addr, &pki.ca(), "tls_plaintext_connections_refused", 2),
        2
    );
    assert_eq!(
        wait_info_at_least(rw.addr, &pki.ca(), "tls_handshake_failures", failed),
        failed
    );

    // A client that connects and never starts its handshake is closed after
    // client_stall_timeout (1 s here), without a byte.
    let mut idle = RespConn::connect(rw.addr);
    let (got, end) = idle.read_until_closed(Duration::from_secs(20));
    assert!(end.is_ok(), "not closed: {end:?}");
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(
        wait_info_at_least(rw.addr, &pki.ca(), "tls_handshake_failures", failed + 1),
        failed + 1
    );
    // The session opened first still works.
    assert_eq!(c.call(&["GET", "tls:k0"]).unwrap().text(), "v-tls:k0");
}

#[test]
fn mtls_listener_refuses_clients_without_a_certificate() {
    let pki = Pki::new("mtls");
    let server = pki.issue("server", &["localhost", "127.0.0.1"], false);
    let client = pki.issue("client", &["app-1"], false);
    let strangers = Pki::new("stranger");
    let stranger = strangers.issue("client", &["app-1"], false);
    let shard = redis();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n{}    routes: {{ catch_all: main }}\nclusters:\n{}",
        listener_tls(&server, Some(&pki.ca())),
        cluster_yaml("main", &[shard.addr], "")
    );
    let rw = respway(&yaml, 1);
    // Without a certificate (TLS 1.3: the refusal arrives with the first read), and with one
    // from another CA.
    let refused =
        tls_connect(rw.addr, &pki.ca(), None).and_then(|mut c| c.call(&["SET", "a", "1"]));
    assert!(refused.is_err(), "{refused:?}");
    let refused = tls_connect(rw.addr, &pki.ca(), Some(&stranger))
        .and_then(|mut c| c.call(&["SET", "a", "1"]));
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(raw_command(shard.addr, &["EXISTS", "a"]).unwrap(), ":0\r\n");
    // With a valid one.
    let mut c = tls_connect(rw.addr, &pki.ca(), Some(&client)).expect("mTLS client");
    assert_eq!(c.call(&["SET", "a", "1"]).unwrap().text(), "OK");
    assert_eq!(c.call(&["GET", "a"]).unwrap().text(), "1");
    assert!(wait_info_at_least_mtls(rw.addr, &pki.ca(), &client, 2) >= 2);
}

/// `tls_handshake_failures` of an mTLS listener, read with a valid client certificate.
fn wait_info_at_least_mtls(addr: SocketAddr, ca: &Path, cert: &CertFiles, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = tls_connect(addr, ca, Some(cert)).expect("connect for INFO");
        let info = c.call(&["INFO"]).expect("INFO").text();
        let n: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("tls_handshake_failures:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("tls_handshake_failures");
        if n >= want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-server` speaking only TLS on a free port, with `files` and clients not asked for
/// a certificate.
fn tls_redis(ca: &Path, files: &CertFiles) -> Proc {
    let port = free_port();
    Spawn::new("redis-server")
        .on_port(port)
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--tls-cert-file")
        .arg(&files.cert)
        .arg("--tls-key-file")
        .arg(&files.key)
        .arg("--tls-ca-cert-file")
        .arg(ca)
        .args(["--tls-auth-clients", "no"])
        .start()
}

/// `redis-cli --tls` on a TLS shard.
fn shard_cli(shard: SocketAddr, ca: &Path, args: &[&str]) -> String {
    let port = shard.port().to_string();
    let ca = ca.display().to_string();
    let mut a = vec!["--tls", "--cacert", &ca, "-h", "localhost", "-p", &port];
    a.extend_from_slice(args);
    redis_cli(&a)
}

#[test]
fn upstream_tls_for_every_kind_of_connection_and_server_name_checks() {
    let pki = Pki::new("upstream");
    let shard_cert = pki.issue("redis", &["localhost", "127.0.0.1"], false);
    let shard = tls_redis(&pki.ca(), &shard_cert);
    let ca = pki.ca().display().to_string();
    let wrong_port = free_port();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes: {{ catch_all: main }}\n  - name: wrong\n    address: 127.0.0.1:{wrong_port}\n    routes: {{ catch_all: wrong }}\nclusters:\n{}{}",
        cluster_yaml(
            "main",
            &[shard.addr],
            &format!("    tls: {{ ca: {ca}, server_name: localhost }}\n")
        ),
        cluster_yaml(
            "wrong",
            &[shard.addr],
            &format!("    tls: {{ ca: {ca}, server_name: other.example }}\n")
        ),
    );
    let rw = respway(&yaml, 1);
    let mut c = RespConn::connect(rw.addr);
    // Pooled connections.
    assert_eq!(c.call(&["SET", "up:k", "secret"]).text(), "OK");
    assert_eq!(c.call(&["GET", "up:k"]).text(), "secret");
    assert_eq!(
        shard_cli(shard.addr, &pki.ca(), &["GET", "up:k"]).trim(),
        "secret"
    );
    // A dedicated connection (a transaction).
    assert_eq!(c.call(&["MULTI"]).text(), "OK");
    assert_eq!(c.call(&["INCR", "up:n"]).text(), "QUEUED");
    assert_eq!(c.call(&["EXEC"]), Resp::Array(Some(vec![Resp::Int(1)])));
    // A blocking command on its dedicated connection, answered by a push from another client.
    let mut pusher = RespConn::connect(rw.addr);
    c.send(&["BLPOP", "up:list", "5"]);
    assert_eq!(pusher.call(&["RPUSH", "up:list", "x"]), Resp::Int(1));
    assert_eq!(
        c.read().unwrap(),
        Resp::Array(Some(vec![Resp::bulk("up:list"), Resp::bulk("x")]))
    );
    // A keyspace fan-out.
    assert_eq!(c.call(&["DBSIZE"]), Resp::Int(2));
    // The pub/sub link.
    let mut sub = RespConn::connect(rw.addr);
    assert_eq!(
        sub.call(&["SUBSCRIBE", "up:ch"]),
        Resp::Array(Some(vec![
            Resp::bulk("subscribe"),
            Resp::bulk("up:ch"),
            Resp::Int(1)
        ]))
    );
    assert_eq!(pusher.call(&["PUBLISH", "up:ch", "hello"]), Resp::Int(1));
    assert_eq!(
        sub.read().unwrap(),
        Resp::Array(Some(vec![
            Resp::bulk("message"),
            Resp::bulk("up:ch"),
            Resp::bulk("hello")
        ]))
    );

    // A certificate not valid for server_name: refused, the command gets an error naming the
    // shard, and nothing is written.
    let mut c = RespConn::connect(loopback(wrong_port));
    let r = c.call(&["SET", "wrong:k", "v"]);
    let e = r.error().unwrap_or_else(|| panic!("{r:?}"));
    assert!(e.contains(&format!("shard s0 ({})", shard.addr)), "{e}");
    assert!(e.contains("not valid for name \"other.example\""), "{e}");
    assert_eq!(
        shard_cli(shard.addr, &pki.ca(), &["EXISTS", "wrong:k"]).trim(),
        "0"
    );
}

#[test]
fn certificate_rotation_under_load_drops_nothing() {
    let pki = Pki::new("rotate");
    let first = pki.issue("first", &["localhost", "127.0.0.1"], false);
    // The listener's files: copies, replaced in place later.
    let dir = pki.dir().to_owned();
    let cert: PathBuf = dir.join("listener.pem");
    let key: PathBuf = dir.join("listener.key");
    std::fs::copy(&first.cert, &cert).unwrap();
    std::fs::copy(&first.key, &key).unwrap();
    let live = CertFiles {
        cert: cert.clone(),
        key: key.clone(),
    };
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n{}    routes: {{ catch_all: main }}\nclusters:\n{}",
        listener_tls(&live, None),
        cluster_yaml("main", &addrs, "")
    );
    let rw = respway(&yaml, 2);
    let before = tls_connect(rw.addr, &pki.ca(), None).unwrap().server_cert();

    // Clients on long-lived connections, and one that reconnects every 20 round trips.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let progress = Progress::new(3);
    let loops: Vec<_> = (0..3)
        .map(|t| {
            let (stop, failures, ca, addr) = (stop.clone(), failures.clone(), pki.ca(), rw.addr);
            let counter = progress.counter(t);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut c = tls_connect(addr, &ca, None).expect("connect");
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) && done < 200_000 && Instant::now() < deadline {
                    if t == 2 && done % 20 == 19 {
                        match tls_connect(addr, &ca, None) {
                            Ok(n) => c = n,
                            Err(e) => {
                                eprintln!("reconnect failed: {e}");
                                failures.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    let k = format!("rot:{t}:{}", done % 100);
                    let v = format!("v{done}");
                    let ok = c
                        .call(&["SET", &k, &v])
                        .map(|r| r.text() == "OK")
                        .unwrap_or(false)
                        && c.call(&["GET", &k]).map(|r| r.text() == v).unwrap_or(false);
                    if !ok {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                    done += 1;
                    counter.tick();
                }
                done
            })
        })
        .collect();
    // Load before the rotation, and after it: 60 round trips per client (the reconnecting
    // one connects 3 times in them).
    progress.wait_each(
        60,
        Duration::from_secs(30),
        "round trips before the rotation",
    );
    // A new certificate from the same CA (more names, so the files' sizes change too),
    // written over the listener's files.
    let next = pki.issue("next", &["localhost", "127.0.0.1", "respway.test"], false);
    std::fs::copy(&next.key, &key).unwrap();
    std::fs::copy(&next.cert, &cert).unwrap();
    // A new connection gets the new certificate once the watcher (2 s period) has seen it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let got = tls_connect(rw.addr, &pki.ca(), None).unwrap().server_cert();
        if got != before || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    progress.wait_each(
        60,
        Duration::from_secs(30),
        "round trips after the rotation",
    );
    stop.store(true, Ordering::Relaxed);
    let done: u64 = loops.into_iter().map(|l| l.join().unwrap()).sum();
    assert_ne!(
        after, before,
        "new connections still get the first certificate"
    );
    let want = std::fs::read_to_string(&next.cert).unwrap();
    let der = respway_tls::rustls::pki_types::CertificateDer::from(after);
    let pem_der = respway_tls::rustls::pki_types::pem::PemObject::from_pem_slice(want.as_bytes())
        .map(|c: respway_tls::rustls::pki_types::CertificateDer<'_>| c.to_vec())
        .unwrap();
    assert_eq!(
        der.to_vec(),
        pem_der,
        "the new certificate is the one written"
    );
    assert_eq!(failures.load(Ordering::Relaxed), 0, "{done} round trips");
    assert!(done > 0);
}

/// notAfter of the certificate in `pem`, as Unix time, read by the openssl CLI (independent of
/// respway's parser).
fn openssl_not_after(pem: &Path) -> i64 {
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-enddate", "-dateopt", "iso_8601", "-in"])
        .arg(pem)
        .output()
        .expect("openssl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let date = text
        .trim()
        .strip_prefix("notAfter=")
        .unwrap_or_else(|| panic!("{text}"));
    let out = std::process::Command::new("date")
        .args(["-u", "-d", date, "+%s"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{date}: {e}"))
}

/// A listener with an expired certificate, one whose certificate expires in 3 days (made with
/// the openssl CLI) and one with a fresh certificate, and a cluster whose client certificate
/// has expired: respway starts, warns about the three with their dates (and not about the fresh
/// one), and exports every notAfter as the openssl CLI reads it.
#[test]
fn certificate_expiry_is_warned_and_exported() {
    let pki = Pki::new("expiry");
    let old = pki.issue("old", &["localhost"], true);
    let fresh = pki.issue("fresh", &["localhost"], false);
    let near = CertFiles {
        cert: pki.dir().join("near.pem"),
        key: pki.dir().join("near.key"),
    };
    let ok = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "3", "-subj", "/CN=localhost", "-keyout"])
        .arg(&near.key)
        .arg("-out")
        .arg(&near.cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl req")
        .success();
    assert!(ok, "openssl req");
    let shard = redis();
    let ca = pki.ca().display().to_string();
    let yaml = format!(
        "listeners:\n  - name: old\n    address: 127.0.0.1:0\n    routes: {{ catch_all: main }}\n{}  - name: near\n    address: 127.0.0.1:{}\n    routes: {{ catch_all: main }}\n{}  - name: fresh\n    address: 127.0.0.1:{}\n    routes: {{ catch_all: main }}\n{}clusters:\n{}",
        listener_tls(&old, None),
        free_port(),
        listener_tls(&near, None),
        free_port(),
        listener_tls(&fresh, None),
        cluster_yaml(
            "main",
            &[shard.addr],
            &format!(
                "    tls: {{ ca: {ca}, cert: {}, key: {}, server_name: localhost }}\n",
                old.cert.display(),
                old.key.display()
            )
        ),
    );
    let admin = loopback(free_port());
    let rw = respway_process(&yaml, &["--admin", &admin.to_string()]);
    wait_port(admin, "admin");
    let log = rw.log();
    let warned = |who: &str, what: &str, date: &str| {
        log.lines()
            .any(|l| l.contains("WARN") && l.contains(who) && l.contains(what) && l.contains(date))
    };
    let day = |t: i64| {
        let out = std::process::Command::new("date")
            .args(["-u", "-d", &format!("@{t}"), "+%Y-%m-%d"])
            .output()
            .expect("date");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let near_end = openssl_not_after(&near.cert);
    for l in log.lines().filter(|l| l.contains("WARN")) {
        eprintln!("{l}");
    }
    assert!(warned("listener \"old\"", "expired", "2001-01-01"), "{log}");
    assert!(warned("cluster \"main\"", "expired", "2001-01-01"), "{log}");
    assert!(
        warned("listener \"near\"", "expires", &day(near_end)),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("listener \"fresh\"")),
        "{log}"
    );
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200);
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text");
    let expiry = |labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| {
                s.metric == "respway_tls_certificate_expiry_timestamp_seconds"
                    && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            })
            .unwrap_or_else(|| panic!("no expiry for {labels:?} in\n{body}"));
        match s.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{other:?}"),
        }
    };
    let l = |name| [("listener", name), ("certificate", "cert")];
    assert_eq!(expiry(&l("old")), openssl_not_after(&old.cert) as f64);
    assert_eq!(expiry(&l("near")), near_end as f64);
    assert_eq!(expiry(&l("fresh")), openssl_not_after(&fresh.cert) as f64);
    assert_eq!(
        expiry(&[("cluster", "main"), ("certificate", "cert")]),
        openssl_not_after(&old.cert) as f64
    );
    assert_eq!(
        expiry(&[("cluster", "main"), ("certificate", "ca")]),
        openssl_not_after(&pki.ca()) as f64
    );
}

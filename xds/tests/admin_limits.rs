//! respway-xds's admin port under a flood of idle connections (issue 26, item 4): at most
//! `max_connections` are open at once, each is closed after `idle_timeout` without a byte, and
//! a request made behind them is still served. Real TCP on 127.0.0.1, bounded waits.

use std::time::{Duration, Instant};

use respway_xds::admin::{self, AdminAuth, AdminLimits};
use respway_xds::server::Server;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_connections_are_capped_and_closed() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().to_path_buf();
    let server = tokio::task::spawn_blocking(move || Server::new(path))
        .await
        .expect("load")
        .with_admin_limits(AdminLimits {
            max_connections: 4,
            idle_timeout: Duration::from_secs(1),
        });
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = admin.local_addr().expect("addr");
    let (_stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.clone().serve(grpc, Some(admin), async {
        let _ = stopped.await;
    }));
    // Three times the cap, sending nothing.
    let mut idle = Vec::new();
    for _ in 0..12 {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
    }
    let open = |s: &Server| {
        serde_json::to_value(s.status()).expect("json")["admin"]["open_connections"].as_u64()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while open(&server) != Some(4) {
        assert!(Instant::now() < deadline, "{:?}", open(&server));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A request behind them is served once the idle ones time out.
    let status = tokio::time::timeout(
        Duration::from_secs(15),
        admin::fetch_status(&addr.to_string(), &AdminAuth::default()),
    )
    .await
    .expect("served in time")
    .expect("status");
    assert_eq!(status.admin.max_connections, 4);
    assert!(status.admin.open_connections <= 4, "{:?}", status.admin);
    // Every idle connection was closed by the server (EOF), none left hanging.
    for (i, mut c) in idle.into_iter().enumerate() {
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("idle connection {i} still open"));
        assert!(matches!(n, Ok(0) | Err(_)), "connection {i}: {n:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while open(&server) != Some(0) {
        assert!(Instant::now() < deadline, "{:?}", open(&server));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The respway-xds binary under `ulimit` (`limit`: a `sh` ulimit argument such as `-n 40`),
/// its stderr in `log`.
struct Xds {
    child: std::process::Child,
    admin: std::net::SocketAddr,
    grpc: std::net::SocketAddr,
    log: std::path::PathBuf,
}

impl Xds {
    fn start(dir: &std::path::Path, limit: &str) -> Xds {
        let admin: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let grpc: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = dir.join(format!("xds-{}.log", admin.port()));
        let resources = dir.join("resources");
        std::fs::create_dir_all(&resources).expect("dir");
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit {limit} && exec \"$@\""))
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_respway-xds"))
            .args(["serve", "--resources"])
            .arg(&resources)
            .args(["--listen", &grpc.to_string()])
            .args(["--admin", &admin.to_string()])
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn");
        Xds {
            child,
            admin,
            grpc,
            log,
        }
    }

    /// The log without its colour codes.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut out = String::with_capacity(text.len());
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Waits (bounded) for the log to contain `what`.
    async fn logged(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.log();
            if text.contains(what) {
                return text;
            }
            assert!(Instant::now() < deadline, "no {what:?} in:\n{text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Xds {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// At start respway-xds raises its soft open-files limit to the hard one and logs it; out of
/// descriptors, its admin port pauses between failed accepts (counted in the status) instead
/// of spinning, and serves again once descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_files_limit_is_raised_and_emfile_is_paused_and_counted() {
    let dir = tempfile::tempdir().expect("dir");
    // Soft 64, hard as it is: raised.
    let hard = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "ulimit -Hn"])
            .output()
            .expect("sh")
            .stdout,
    )
    .expect("utf-8")
    .trim()
    .to_string();
    if hard != "64" {
        let xds = Xds::start(dir.path(), "-Sn 64");
        let text = xds.logged("RLIMIT_NOFILE").await;
        let line = text.lines().find(|l| l.contains("RLIMIT_NOFILE")).unwrap();
        assert!(
            line.contains(&format!("soft={hard}")) && line.contains("was=64"),
            "{line}"
        );
    }
    // Soft and hard 40: out of descriptors with a few dozen connections.
    let xds = Xds::start(dir.path(), "-n 40");
    let text = xds.logged("respway-xds serving").await;
    assert!(text.contains("soft=40"), "{text}");
    let mut flood = Vec::new();
    for port in [xds.admin, xds.grpc] {
        for _ in 0..60 {
            match TcpStream::connect(port).await {
                Ok(c) => flood.push(c),
                Err(e) => panic!("connect: {e}"),
            }
        }
    }
    // Two seconds out of descriptors: 10 ms doubling to 1 s is about 8 pauses (50 ms fixed
    // pauses, or none, would be 40 or thousands).
    xds.logged("accept failed; pausing").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(flood);
    let status = {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match admin::fetch_status(&xds.admin.to_string(), &AdminAuth::default()).await {
                Ok(s) => break s,
                Err(e) => assert!(Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (admin, ads) = (status.admin.accept_errors, status.ads_accept_errors);
    eprintln!("failed accepts while out of descriptors: admin {admin}, ADS {ads}");
    for failed in [admin, ads] {
        assert!((1..=15).contains(&failed), "{admin} {ads}\n{}", xds.log());
    }
}

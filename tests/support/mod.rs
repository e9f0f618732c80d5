//! The root package's test support: the workspace's one harness and raw RESP client
//! (`respway-testkit`, re-exported whole), plus what needs this package — respway started
//! in-process from a YAML config, the `respway` binary, `redis` crate clients and loads — and
//! the YAML the tests share.

#![allow(dead_code)]

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use respway_testkit::*;

/// A field of `INFO commandstats` (e.g. `calls` of `cmdstat_get`) on one server; 0 if absent.
pub fn commandstat(addr: SocketAddr, cmd: &str) -> u64 {
    let mut c = sync_client(addr);
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .expect("INFO");
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Zipf(`s`) over ranks 1..=`n`: the running sums of `1 / r^s` (rank `r` is the first whose
/// sum reaches `u * total` for a uniform `u`), and the total.
pub fn zipf_cdf(n: usize, s: f64) -> (Vec<f64>, f64) {
    let mut cdf = Vec::with_capacity(n);
    let mut sum = 0.0;
    for r in 1..=n {
        sum += 1.0 / (r as f64).powf(s);
        cdf.push(sum);
    }
    (cdf, sum)
}

/// Number of keys on one server.
pub fn dbsize(addr: SocketAddr) -> u64 {
    let mut c = sync_client(addr);
    redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE")
}

/// A blocking `redis` crate connection.
pub fn sync_client(addr: SocketAddr) -> redis::Connection {
    let client = redis::Client::open(format!("redis://{addr}/")).expect("client");
    let c = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    c
}

/// respway running in this process.
pub struct Respway {
    pub server: Option<respway::Server>,
    pub addr: SocketAddr,
    /// Held while the server runs: no [`alone_in_process`] test runs meanwhile. Dropped
    /// after the server is shut down ([`Drop`] of `Respway` runs before its fields').
    _sharing: SharingProcess,
}

impl Drop for Respway {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// Starts respway from YAML text (listener address 127.0.0.1:0 is fine).
pub fn respway(yaml: &str, workers: usize) -> Respway {
    respway_in_zone(yaml, workers, None)
}

/// Starts respway from YAML text, as a sidecar in `zone` (like `--zone`).
pub fn respway_in_zone(yaml: &str, workers: usize, zone: Option<&str>) -> Respway {
    let opts = respway::Options {
        workers,
        ..Default::default()
    };
    respway_with(yaml, zone, opts)
}

/// Starts respway from YAML text without learning commands from the shards
/// (`--no-command-learning`): for fake shards whose connections are counted or numbered.
pub fn respway_not_learning(yaml: &str) -> Respway {
    let opts = respway::Options {
        learn_commands: false,
        ..Default::default()
    };
    respway_with(yaml, None, opts)
}

/// Starts respway from YAML text with these process options.
pub fn respway_with(yaml: &str, zone: Option<&str>, opts: respway::Options) -> Respway {
    let sharing = sharing_process();
    let resources = respway_xds::parse_yaml(yaml).unwrap_or_else(|e| panic!("bad test yaml: {e}"));
    let mut config =
        respway_xds::translate(&resources).unwrap_or_else(|e| panic!("bad test config: {e}"));
    if let Some(z) = zone {
        config.zone = Some(z.to_string());
    }
    let server = respway::start(config, opts).expect("respway start");
    let addr = server.local_addrs()[0];
    Respway {
        server: Some(server),
        addr,
        _sharing: sharing,
    }
}

/// YAML for one listener on a free port over `shards` with the given hash block.
pub fn sharded_yaml(shards: &[SocketAddr], hash: &str, hashtag: bool) -> String {
    let mut y = String::new();
    y.push_str("listeners:\n  - name: main\n    address: 127.0.0.1:0\n    op_timeout: 2s\n    routes:\n      catch_all: main\n");
    y.push_str(&format!("clusters:\n  - name: main\n    hash: {hash}\n"));
    if !hashtag {
        y.push_str("    hashtag: null\n");
    }
    y.push_str("    connect_timeout: 500ms\n    shards:\n");
    for (i, a) in shards.iter().enumerate() {
        y.push_str(&format!(
            "      - name: s{i}\n        endpoints:\n          - {{ address: \"{a}\", role: primary }}\n"
        ));
    }
    y
}

/// Clients that each loop `SET k v` + `GET k` in one pipeline and check every reply, until
/// [`Load::finish`] or `max` has passed. One pipeline is one write, decoded in one batch, so
/// both run on the same chain even when a config swap moves the key to another shard.
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
    /// Round trips checked so far, per client.
    progress: Progress,
}

/// Starts `clients` load threads against `addr`.
pub fn set_get_load(addr: SocketAddr, clients: usize, max: Duration) -> Load {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = Progress::new(clients);
    let threads = (0..clients)
        .map(|t| {
            let stop = stop.clone();
            let counter = progress.counter(t);
            std::thread::spawn(move || {
                let mut c = sync_client(addr);
                let deadline = Instant::now() + max;
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline
                {
                    let key = format!("t{t}:k{}", i % 500);
                    let val = format!("v{i}");
                    let (ok, got): (String, String) = redis::pipe()
                        .cmd("SET")
                        .arg(&key)
                        .arg(&val)
                        .cmd("GET")
                        .arg(&key)
                        .query(&mut c)
                        .unwrap_or_else(|e| panic!("request failed at {i}: {e}"));
                    assert_eq!(ok, "OK");
                    assert_eq!(got, val, "wrong reply for {key}");
                    i += 1;
                    counter.tick();
                }
                i
            })
        })
        .collect();
    Load {
        stop,
        threads,
        progress,
    }
}

impl Load {
    /// Waits (30 s at most) until every client has checked `n` more round trips than now:
    /// the load has run (before a fault, through a state the test is about) however slow the
    /// machine. Fails naming `what`, at once if a client stopped (a failed or wrong reply).
    #[track_caller]
    pub fn wait_round_trips(&self, n: u64, what: &str) {
        self.progress.wait_each(n, Duration::from_secs(30), what);
    }

    /// Stops the clients and returns how many round trips they made; panics if any client saw
    /// a failed or wrong reply.
    pub fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().expect("a client saw a failed or wrong reply"))
            .sum()
    }
}

/// A config that changes with `step`: 3 or 4 shards, a hot-key rule, a mirror to `shadow`, a
/// prefix route — what the swap and xDS tests cycle through under load.
pub fn churn_yaml(listen: &str, shards: &[SocketAddr], shadow: SocketAddr, step: usize) -> String {
    let n = if step.is_multiple_of(2) { 3 } else { 4 };
    let hot = if step.is_multiple_of(3) {
        "    hot_keys:\n      - { prefix: HOT_ }\n"
    } else {
        ""
    };
    let mirror = if step % 4 == 1 {
        "      catch_all_mirrors:\n        - { cluster: shadow, mode: dual_write }\n"
    } else {
        ""
    };
    let prefix = if step % 5 == 2 {
        "      prefixes:\n        - { prefix: \"side:\", cluster: shadow }\n"
    } else {
        ""
    };
    let mut y = format!(
        "listeners:\n  - name: main\n    address: {listen}\n    routes:\n      catch_all: main\n{mirror}{prefix}clusters:\n  - name: main\n{hot}    shards:\n"
    );
    for (i, a) in shards.iter().take(n).enumerate() {
        y.push_str(&format!(
            "      - name: s{i}\n        endpoints: [ {{ address: \"{a}\", role: primary }} ]\n"
        ));
    }
    y.push_str(&format!(
        "  - name: shadow\n    shards:\n      - endpoints: [ {{ address: \"{shadow}\", role: primary }} ]\n"
    ));
    y
}

/// Starts the `respway` binary (`--workers 1`) on a config whose first listener address
/// `127.0.0.1:0` is replaced by a free port; stderr goes to `log` in the process's directory
/// ([`Proc::log`]).
pub fn respway_process(yaml: &str, extra_args: &[&str]) -> Proc {
    Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .config("--config", "respway.yaml", yaml)
        .args(["--workers", "1"])
        .args(extra_args)
        .start()
}

/// The `respway-xds` binary next to this build's, built now only if it is not there (it
/// belongs to another package of the workspace: `cargo test --workspace` builds it with the
/// rest; a build from here would rebuild the xds crate with other features).
pub fn respway_xds_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = dir.join("respway-xds");
    if bin.is_file() {
        return bin;
    }
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "-q", "-p", "respway-xds", "--bin", "respway-xds"]);
    if profile == "release" {
        build.arg("--release");
    }
    let status = build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build -p respway-xds failed");
    assert!(bin.is_file(), "{} missing", bin.display());
    bin
}

/// How long one client script (`tests/clients/`) may run before it is killed (and the test
/// fails). The scripts bound each scenario (5 s) and each connection attempt themselves, so a
/// stalled one fails alone.
pub const CLIENT_SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);

/// The client scripts' directory.
pub fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// What to do when a client library is missing.
pub const SETUP: &str =
    "run tests/clients/setup.sh (it installs the pinned redis-py, node-redis and ioredis)";

/// Runs `program args` in `tests/clients` with a bound of [`CLIENT_SCRIPT_TIMEOUT`]; returns whether
/// it exited 0 and what it printed (stdout and stderr, interleaved as written).
pub fn run_bounded(program: &str, args: &[&str]) -> (bool, String) {
    let log = std::env::temp_dir().join(format!(
        "respway-clients-{}-{}.log",
        std::process::id(),
        free_port()
    ));
    let out = std::fs::File::create(&log).expect("log file");
    let err = out.try_clone().expect("log file");
    let mut child = Command::new(program)
        .args(args)
        .current_dir(clients_dir())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {program}: {e}; {SETUP}"));
    let deadline = Instant::now() + CLIENT_SCRIPT_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status {
        Some(s) if s.success() => (true, text),
        Some(s) => {
            text.push_str(&format!("[{program} exited with {s}]\n"));
            (false, text)
        }
        None => {
            text.push_str(&format!(
                "[{program} killed after {}s]\n",
                CLIENT_SCRIPT_TIMEOUT.as_secs()
            ));
            (false, text)
        }
    }
}

/// An in-process respway-xds management server (over resource directory `dir`) on a fixed
/// loopback port, on a thread of its own; stoppable and restartable on the same port.
pub struct MgmtProc {
    pub server: respway_xds::server::Server,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MgmtProc {
    pub fn start(dir: &Path, grpc: u16) -> MgmtProc {
        MgmtProc::start_with(dir, grpc, respway_xds::secure::Security::default())
    }

    pub fn start_with(dir: &Path, grpc: u16, security: respway_xds::secure::Security) -> MgmtProc {
        let server = respway_xds::server::Server::new(dir)
            .with_poll_interval(Duration::from_millis(100))
            .with_security(security);
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let s = server.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut listener = None;
                for _ in 0..50 {
                    match tokio::net::TcpListener::bind(("127.0.0.1", grpc)).await {
                        Ok(l) => {
                            listener = Some(l);
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
                let _ = ready_tx.send(());
                let _ = s
                    .serve(listener.expect("bind the xDS port"), None, async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        ready_rx.recv().unwrap();
        MgmtProc {
            server,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn status(&self) -> respway_xds::server::ServerStatus {
        self.server.status()
    }

    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MgmtProc {
    fn drop(&mut self) {
        self.stop();
    }
}

// === blocked clients (blocking commands, WAIT) ===

/// Connections of these servers blocked in `cmd` now (`CLIENT LIST`: `flags=b`, `cmd=...`).
pub fn blocked(addrs: &[SocketAddr], cmd: &str) -> usize {
    let want = format!(" cmd={cmd} ");
    addrs
        .iter()
        .map(|&s| {
            RespConn::connect(s)
                .call(&["CLIENT", "LIST"])
                .text()
                .lines()
                .filter(|l| l.contains(" flags=b ") && l.contains(&want))
                .count()
        })
        .sum()
}

/// Waits (10 ms polls, 5 s at most) until `n` connections are blocked in `cmd`.
pub fn wait_blocked(addrs: &[SocketAddr], cmd: &str, n: usize) {
    let start = Instant::now();
    while blocked(addrs, cmd) < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{n} connections never blocked in {cmd} (have {})",
            blocked(addrs, cmd)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (10 ms polls, 5 s at most) until no connection is blocked in `cmd`.
pub fn wait_unblocked(addrs: &[SocketAddr], cmd: &str) {
    let start = Instant::now();
    while blocked(addrs, cmd) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{} connections still blocked in {cmd} after {:?}",
            blocked(addrs, cmd),
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `args` on a new connection to `addr` in a thread; the thread returns the reply.
pub fn spawn_call(addr: SocketAddr, args: &[&str]) -> std::thread::JoinHandle<Resp> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let mut c = RespConn::connect(addr);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        c.call(&a)
    })
}

// === respway's process-wide state: tests that need this process's sidecars to themselves ===
//
// Every test file of this package but four is a module of one test binary (tests/it.rs), so
// the sidecars that tests start in-process ([`respway`], or `respway::start` directly) run in
// one process with those of every other file. Some of respway's state is per process, as a
// sidecar is one process: the near cache's key stamps and flush count (a write through any
// sidecar of the process ends every near cache's entries of that key's stamp; a key-less
// write such as FLUSHDB or a script without keys ends all of them). A test that counts what
// its in-process near cache serves therefore takes [`alone_in_process`]: it waits until no
// other test has an in-process sidecar running and keeps others from starting one until it
// ends. Tests that start sidecars in-process hold [`sharing_process`] for as long as they run
// ([`respway`] takes it itself; a test calling `respway::start` directly takes it first).
// Sidecars started as processes ([`respway_process`]) share nothing and take neither.

/// Sidecars running in-process now, and whether a test holds the process alone.
struct Sharing {
    sidecars: usize,
    alone: bool,
}

static SHARING: Mutex<Sharing> = Mutex::new(Sharing {
    sidecars: 0,
    alone: false,
});
static SHARING_CHANGED: Condvar = Condvar::new();

thread_local! {
    /// This thread runs a test that holds [`alone_in_process`]: its own sidecars do not wait.
    static ALONE_HERE: Cell<bool> = const { Cell::new(false) };
}

fn sharing() -> std::sync::MutexGuard<'static, Sharing> {
    SHARING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An in-process sidecar's share of the process ([`sharing_process`]); released on drop.
pub struct SharingProcess {
    counted: bool,
}

/// Waits while a test holds the process alone, then counts one in-process sidecar until the
/// returned value is dropped. Hold it for as long as the sidecar runs. Waiting only for a test
/// that holds the process alone (never for one that waits to): a test may start several
/// sidecars, from several threads, without a deadlock.
pub fn sharing_process() -> SharingProcess {
    if ALONE_HERE.with(Cell::get) {
        return SharingProcess { counted: false };
    }
    let mut s = sharing();
    while s.alone {
        s = SHARING_CHANGED
            .wait(s)
            .unwrap_or_else(PoisonError::into_inner);
    }
    s.sidecars += 1;
    SharingProcess { counted: true }
}

impl Drop for SharingProcess {
    fn drop(&mut self) {
        if self.counted {
            let mut s = sharing();
            s.sidecars -= 1;
            if s.sidecars == 0 {
                SHARING_CHANGED.notify_all();
            }
        }
    }
}

/// The process to this test alone ([`sharing_process`]), until the returned value is dropped:
/// take it first in the test, keep it to the end, and start the test's in-process sidecars
/// from the test's own thread.
pub struct AloneInProcess {
    /// Not `Send`: released on the thread that marked itself.
    _here: std::marker::PhantomData<*const ()>,
}

/// Waits until no other test has an in-process sidecar running and none holds the process
/// alone, then keeps them from starting one until the returned value is dropped.
pub fn alone_in_process() -> AloneInProcess {
    let mut s = sharing();
    while s.alone || s.sidecars > 0 {
        s = SHARING_CHANGED
            .wait(s)
            .unwrap_or_else(PoisonError::into_inner);
    }
    s.alone = true;
    ALONE_HERE.with(|a| a.set(true));
    AloneInProcess {
        _here: std::marker::PhantomData,
    }
}

impl Drop for AloneInProcess {
    fn drop(&mut self) {
        ALONE_HERE.with(|a| a.set(false));
        sharing().alone = false;
        SHARING_CHANGED.notify_all();
    }
}

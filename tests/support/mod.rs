//! The end-to-end harness: real `redis-server` and `nutcracker` processes on free loopback
//! ports, started by the tests and always stopped (on drop, also when a test panics), plus
//! respway itself started in-process from a YAML config.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound and released; the caller binds it right away).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// Waits until something accepts on `addr`.
pub fn wait_port(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not start listening on {addr}");
}

/// A child process killed on drop.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: Option<PathBuf>,
}

impl Proc {
    /// Kills the process now (a shard dying mid-run).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Starts `redis-server` on a free loopback port, without persistence.
pub fn redis() -> Proc {
    redis_with(&[])
}

/// Starts `redis-server` with extra arguments.
pub fn redis_with(extra: &[&str]) -> Proc {
    for _ in 0..5 {
        if let Some(p) = try_redis(free_port(), extra) {
            return p;
        }
    }
    panic!("could not start redis-server");
}

/// Starts `redis-server` on this port (a shard coming back after a crash).
pub fn redis_on(port: u16) -> Proc {
    redis_on_with(port, &[])
}

/// Starts `redis-server` on this port with extra arguments (in the same directory as the one
/// before it on this port, so an AOF written there is loaded).
pub fn redis_on_with(port: u16, extra: &[&str]) -> Proc {
    try_redis(port, extra).unwrap_or_else(|| panic!("could not start redis-server on {port}"))
}

fn try_redis(port: u16, extra: &[&str]) -> Option<Proc> {
    let dir = std::env::temp_dir().join(format!("respway-redis-{port}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--dir", dir.to_str().expect("utf8 path")])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = cmd
        .spawn()
        .expect("redis-server must be installed (apt-get install redis-server)");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut p = Proc {
        child,
        addr,
        dir: Some(dir),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = p.child.try_wait() {
            break; // port taken
        }
        if raw_command(addr, &["PING"])
            .map(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
            .unwrap_or(false)
        {
            return Some(p);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    p.kill();
    None
}

/// Sends one command with a plain socket and returns the raw reply text.
pub fn raw_command(addr: SocketAddr, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    s.write_all(out.as_bytes())?;
    let mut buf = vec![0u8; 1 << 16];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

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
    let resources = respway_xds::parse_yaml(yaml).unwrap_or_else(|e| panic!("bad test yaml: {e}"));
    let mut config =
        respway_xds::translate(&resources).unwrap_or_else(|e| panic!("bad test config: {e}"));
    if let Some(z) = zone {
        config.zone = Some(z.to_string());
    }
    let server = respway::start(config, respway::Options { workers }).expect("respway start");
    let addr = server.local_addrs()[0];
    Respway {
        server: Some(server),
        addr,
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

/// True when a command exists on PATH.
pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Clients that each loop `SET k v` + `GET k` in one pipeline and check every reply, until
/// [`Load::finish`] or `max` has passed. One pipeline is one write, decoded in one batch, so
/// both run on the same chain even when a config swap moves the key to another shard.
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

/// Starts `clients` load threads against `addr`.
pub fn set_get_load(addr: SocketAddr, clients: usize, max: Duration) -> Load {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let threads = (0..clients)
        .map(|t| {
            let stop = stop.clone();
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
                }
                i
            })
        })
        .collect();
    Load { stop, threads }
}

impl Load {
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

/// A RESP value as the test client reads it (RESP2 and the RESP3 types).
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    /// `+...`
    Simple(String),
    /// `-...`
    Error(String),
    /// `:n`
    Int(i64),
    /// `$n` (None = `$-1` or RESP3 `_`)
    Bulk(Option<Vec<u8>>),
    /// `*n` (None = `*-1`)
    Array(Option<Vec<Resp>>),
    /// RESP3 `%`, `~`, `>`, `,`, `#`, `(`, `=` kept as (type byte, parts).
    Other(u8, Vec<Resp>),
}

impl Resp {
    /// The bulk or simple string as text (panics on other types).
    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) => s.clone(),
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }
    /// True for `-...`.
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
    /// The error text, if this is an error.
    pub fn error(&self) -> Option<&str> {
        match self {
            Resp::Error(e) => Some(e),
            _ => None,
        }
    }
}

/// Encodes one command as a RESP array of bulk strings.
pub fn encode_cmd(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// The one raw RESP test client: a blocking socket, pipelines written as given, replies parsed
/// one at a time. Every read has a timeout, so a test never hangs on a missing reply.
pub struct RespConn {
    pub stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

impl RespConn {
    /// Connects with a 10 s read timeout.
    pub fn connect(addr: SocketAddr) -> RespConn {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let _ = stream.set_nodelay(true);
        RespConn {
            stream,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Writes raw bytes.
    pub fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Writes one command.
    pub fn send(&mut self, args: &[&str]) {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        let mut out = Vec::new();
        encode_cmd(&mut out, &a);
        self.write_raw(&out).expect("write");
    }

    /// Writes every command in one write.
    pub fn send_pipeline<S: AsRef<str>>(&mut self, cmds: &[Vec<S>]) {
        let mut out = Vec::new();
        for c in cmds {
            let a: Vec<&[u8]> = c.iter().map(|s| s.as_ref().as_bytes()).collect();
            encode_cmd(&mut out, &a);
        }
        self.write_raw(&out).expect("write");
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&str]) -> Resp {
        self.send(args);
        self.read().expect("reply")
    }

    /// Reads one reply (an error on EOF, timeout or a malformed reply).
    pub fn read(&mut self) -> std::io::Result<Resp> {
        loop {
            if let Some((v, n)) = parse_resp(&self.buf[self.pos..])? {
                self.pos += n;
                if self.pos == self.buf.len() {
                    self.buf.clear();
                    self.pos = 0;
                }
                return Ok(v);
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Parses one RESP value from the start of `b`: `Ok(None)` when incomplete.
pub fn parse_resp(b: &[u8]) -> std::io::Result<Option<(Resp, usize)>> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if eol == 0 {
        return Err(bad("empty line"));
    }
    let line = std::str::from_utf8(&b[1..eol]).map_err(|_| bad("not utf8"))?;
    let head = eol + 2;
    let int = || line.parse::<i64>().map_err(|_| bad("bad length"));
    let agg = |n: i64, mult: i64, t: u8| -> std::io::Result<Option<(Resp, usize)>> {
        let mut at = head;
        let mut items = Vec::new();
        for _ in 0..n * mult {
            match parse_resp(&b[at..])? {
                Some((v, k)) => {
                    items.push(v);
                    at += k;
                }
                None => return Ok(None),
            }
        }
        Ok(Some((
            if t == b'*' {
                Resp::Array(Some(items))
            } else {
                Resp::Other(t, items)
            },
            at,
        )))
    };
    match b[0] {
        b'+' => Ok(Some((Resp::Simple(line.to_string()), head))),
        b'-' => Ok(Some((Resp::Error(line.to_string()), head))),
        b':' => Ok(Some((Resp::Int(int()?), head))),
        b'_' => Ok(Some((Resp::Bulk(None), head))),
        b',' | b'#' | b'(' => Ok(Some((
            Resp::Other(b[0], vec![Resp::Simple(line.to_string())]),
            head,
        ))),
        b'$' | b'=' | b'!' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Resp::Bulk(None), head)));
            }
            let n = n as usize;
            if b.len() < head + n + 2 {
                return Ok(None);
            }
            let data = b[head..head + n].to_vec();
            Ok(Some((
                match b[0] {
                    b'$' => Resp::Bulk(Some(data)),
                    t => Resp::Other(t, vec![Resp::Bulk(Some(data))]),
                },
                head + n + 2,
            )))
        }
        b'*' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Resp::Array(None), head)));
            }
            agg(n, 1, b'*')
        }
        b'~' | b'>' => agg(int()?, 1, b[0]),
        b'%' | b'|' => agg(int()?, 2, b[0]),
        _ => Err(bad("unknown type byte")),
    }
}

/// The resident set size of this process, in bytes (Linux).
pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// The resident set size of process `pid`, in bytes (Linux).
pub fn rss_of(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// How a [`FakeShard`] treats one accepted connection (numbered from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeMode {
    /// Answers like a tiny Redis: PING → PONG, GET → `$1 v`, anything else → `+OK`.
    Normal,
    /// Normal for this many commands, then half a reply, then silence with the socket open.
    StallAfter(usize),
    /// Answers every command, PING included, with bytes that are not RESP.
    Garbage,
}

/// A fake shard on a free loopback port, for faults a real redis-server cannot produce on
/// demand. Stopped (and its threads ended) on drop.
pub struct FakeShard {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeShard {
    /// Starts a fake shard; `mode(i)` decides how connection `i` behaves.
    pub fn start(mode: fn(usize) -> FakeMode) -> FakeShard {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let i = a.fetch_add(1, Ordering::Relaxed);
                        let s = s.clone();
                        let m = mode(i);
                        conns.push(std::thread::spawn(move || fake_conn(stream, m, s)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        FakeShard {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeShard {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn fake_conn(
    mut stream: TcpStream,
    mode: FakeMode,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = Vec::new();
    let mut served = 0usize;
    let mut stalled = false;
    let mut chunk = [0u8; 16 * 1024];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => continue,
        }
        if stalled {
            buf.clear();
            continue;
        }
        let mut out = Vec::new();
        let mut at = 0;
        while let Ok(Some((cmd, n))) = parse_resp(&buf[at..]) {
            at += n;
            let name = match &cmd {
                Resp::Array(Some(a)) if !a.is_empty() => a[0].text().to_ascii_uppercase(),
                _ => String::new(),
            };
            match mode {
                FakeMode::Garbage => out.extend_from_slice(b"<html>not redis</html>\r\n"),
                FakeMode::StallAfter(k) if served >= k => {
                    out.extend_from_slice(b"$10\r\nabc");
                    stalled = true;
                    break;
                }
                _ => out.extend_from_slice(match name.as_str() {
                    "PING" => b"+PONG\r\n",
                    "GET" => b"$1\r\nv\r\n",
                    _ => b"+OK\r\n",
                }),
            }
            served += 1;
        }
        buf.drain(..at);
        if stream.write_all(&out).is_err() {
            return;
        }
    }
}

/// Starts the `respway` binary (`--workers 1`) on a config whose first listener address
/// `127.0.0.1:0` is replaced by a free port; stderr goes to `log` in the process's directory.
pub fn respway_process(yaml: &str, extra_args: &[&str]) -> Proc {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("respway-proc-{port}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("respway.yaml");
    std::fs::write(
        &path,
        yaml.replacen("127.0.0.1:0", &format!("127.0.0.1:{port}"), 1),
    )
    .expect("write config");
    let log = std::fs::File::create(dir.join("log")).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_respway"))
        .args(["--config", path.to_str().expect("utf8"), "--workers", "1"])
        .args(extra_args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("respway binary");
    let p = Proc {
        child,
        addr: ([127, 0, 0, 1], port).into(),
        dir: Some(dir),
    };
    wait_port(p.addr, "respway");
    p
}

/// The log the process wrote (see [`respway_process`]).
pub fn process_log(p: &Proc) -> String {
    p.dir
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("log")).ok())
        .unwrap_or_default()
}

//! The sink (`respway-perf sink`): one reply per complete command wherever the stream is
//! cut, protocol errors close the connection, respway-perf's closed loop and
//! redis-benchmark run clean against it, and the CLI prints its address, refuses
//! non-loopback addresses and exits after its duration.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use respway_perf::closed::{run_closed, ClosedConfig};
use respway_perf::sink::{run_sink, Scan, Scanner, SinkConfig, SinkStats, PROTOCOL_ERROR};
use respway_perf::workload::{generate_pools, Cmd, Workload};
use respway_perf::{Control, Error};
use respway_testkit::{slack, RespConn};

const REPLY: &[u8] = b"$3\r\nxxx\r\n";

/// A sink on a free loopback port, in a thread of this process; stopped on drop.
struct Sink {
    addr: SocketAddr,
    ctl: Control,
    handle: Option<JoinHandle<Result<SinkStats, Error>>>,
}

impl Sink {
    fn start(cfg: SinkConfig) -> Sink {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = l.local_addr().unwrap();
        let ctl = Control::new();
        let c = ctl.clone();
        let handle = std::thread::spawn(move || run_sink(l, &cfg, &c));
        Sink {
            addr,
            ctl,
            handle: Some(handle),
        }
    }

    fn default() -> Sink {
        Sink::start(SinkConfig {
            duration: Duration::from_secs(60),
            ..SinkConfig::default()
        })
    }

    /// Stops it and returns what it served.
    fn stop(mut self) -> SinkStats {
        self.ctl.stop();
        let h = self.handle.take().unwrap();
        h.join().expect("sink thread").expect("sink result")
    }

    /// A raw client (TCP_NODELAY) with 5 s read and write timeouts.
    fn connect(&self) -> RespConn {
        let c = RespConn::connect(self.addr);
        c.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        c.stream
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        c
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.ctl.stop();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A pipeline of commands of every shape the sink must count, with the offset just past
/// each complete command (the blank line and `*0` complete nothing: Redis answers neither).
fn pipeline() -> (Vec<u8>, Vec<usize>) {
    let parts: [(&[u8], bool); 9] = [
        (b"*2\r\n$3\r\nGET\r\n$5\r\nkey:1\r\n", true),
        (b"PING\r\n", true),
        (
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$12\r\n\r\n*1\r\n$0\r\n\r\n\r\n",
            true,
        ),
        (b"\r\n", false),
        (b"*0\r\n", false),
        (b"*1\r\n$0\r\n\r\n", true),
        (b"get  k\n", true),
        (b"*-1\r\n", false),
        (b"*2\r\n$4\r\nECHO\r\n$10\r\n$3\r\nxxx\r\n*\r\n", true),
    ];
    let mut buf = Vec::new();
    let mut ends = Vec::new();
    for (p, counts) in parts {
        buf.extend_from_slice(p);
        if counts {
            ends.push(buf.len());
        }
    }
    (buf, ends)
}

fn commands_within(ends: &[usize], upto: usize) -> usize {
    ends.iter().filter(|&&e| e <= upto).count()
}

fn read_exact_replies(c: &mut RespConn, n: usize) {
    let got = c
        .read_exact_raw(n * REPLY.len())
        .unwrap_or_else(|e| panic!("reading {n} replies: {e}"));
    assert_eq!(got, REPLY.repeat(n));
}

/// Nothing more arrives within 100 ms.
fn assert_nothing_more(c: &mut RespConn) {
    c.stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    match c.read_raw() {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("unexpected bytes or close: {other:?}"),
    }
    c.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
}

#[test]
fn scanner_counts_commands_split_at_every_byte_boundary() {
    let (buf, ends) = pipeline();
    let total = ends.len() as u64;
    assert_eq!(
        Scanner::new().feed(&buf),
        Scan {
            commands: total,
            error: false
        }
    );
    for cut in 0..=buf.len() {
        let mut sc = Scanner::new();
        let a = sc.feed(&buf[..cut]);
        assert!(!a.error, "cut {cut}");
        assert_eq!(a.commands, commands_within(&ends, cut) as u64, "cut {cut}");
        let b = sc.feed(&buf[cut..]);
        assert!(!b.error, "cut {cut}");
        assert_eq!(a.commands + b.commands, total, "cut {cut}");
    }
    // One byte at a time: every boundary at once.
    let mut sc = Scanner::new();
    let mut seen = 0;
    for (i, b) in buf.iter().enumerate() {
        let s = sc.feed(std::slice::from_ref(b));
        assert!(!s.error);
        seen += s.commands;
        assert_eq!(seen, commands_within(&ends, i + 1) as u64, "byte {i}");
    }
    assert_eq!(seen, total);
}

#[test]
fn scanner_finds_protocol_errors() {
    let bad: [&[u8]; 10] = [
        b"*x\r\n",
        b"*\r\n",
        b"*1\n",
        b"*1\r\n:3\r\n",
        b"*1\r\n$-1\r\n",
        b"*1\r\n$\r\n",
        b"*1\r\n$3\r\nGETX\r\n",
        b"*1\r\n$3\r\nGET\rX",
        b"*99999999999999999999\r\n",
        b"*1\r\n$999999999999\r\n",
    ];
    for b in bad {
        let mut sc = Scanner::new();
        let s = sc.feed(b);
        assert_eq!(
            s,
            Scan {
                commands: 0,
                error: true
            },
            "{:?}",
            String::from_utf8_lossy(b)
        );
        assert!(sc.failed());
        // Byte by byte, the same.
        let mut sc = Scanner::new();
        let any = b.iter().any(|x| sc.feed(std::slice::from_ref(x)).error);
        assert!(any, "{:?} byte by byte", String::from_utf8_lossy(b));
        assert!(sc.feed(b"PING\r\n").error, "errors stick");
    }
    // Commands before the error are still counted.
    let mut sc = Scanner::new();
    assert_eq!(
        sc.feed(b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n?"),
        Scan {
            commands: 2,
            error: true
        }
    );
}

#[test]
fn sink_replies_once_per_command_wherever_the_stream_is_cut() {
    let sink = Sink::default();
    let (buf, ends) = pipeline();
    let mut s = sink.connect();
    let mut expected_total = 0u64;
    let t0 = Instant::now();
    // Each cut: the first part, a pause so the sink reads it alone, then exactly the
    // replies of the commands it completed; then the rest and the other replies.
    for cut in 0..=buf.len() {
        assert!(t0.elapsed() < slack(Duration::from_secs(30)), "too slow");
        let before = commands_within(&ends, cut);
        s.write_raw(&buf[..cut]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        read_exact_replies(&mut s, before);
        s.write_raw(&buf[cut..]).unwrap();
        read_exact_replies(&mut s, ends.len() - before);
        expected_total += ends.len() as u64;
    }
    // One byte per write (TCP_NODELAY: one segment each).
    for b in &buf {
        s.write_raw(std::slice::from_ref(b)).unwrap();
    }
    read_exact_replies(&mut s, ends.len());
    expected_total += ends.len() as u64;
    // A deep pipeline of tiny inline commands: a 64 KiB read holds more commands than the
    // prepared reply buffer has replies, so their replies leave in several writes.
    let many = 100_000;
    let deep = b"P\n".repeat(many);
    let writer = {
        let mut w = s.stream.try_clone().unwrap();
        std::thread::spawn(move || w.write_all(&deep))
    };
    read_exact_replies(&mut s, many);
    writer.join().unwrap().unwrap();
    expected_total += many as u64;
    assert_nothing_more(&mut s);
    drop(s);
    let stats = sink.stop();
    assert_eq!(stats.commands, expected_total);
    assert_eq!(stats.connections, 1);
    assert_eq!(stats.protocol_errors, 0);
}

#[test]
fn sink_reply_size_is_configurable() {
    let sink = Sink::start(SinkConfig {
        reply_size: 100,
        duration: Duration::from_secs(60),
    });
    let mut s = sink.connect();
    s.write_raw(b"PING\r\nPING\r\n").unwrap();
    let one = [b"$100\r\n".as_slice(), &[b'x'; 100], b"\r\n"].concat();
    let got = s.read_exact_raw(2 * one.len()).unwrap();
    assert_eq!(got, one.repeat(2));
    assert!(SinkConfig {
        reply_size: usize::MAX,
        ..SinkConfig::default()
    }
    .validate()
    .is_err());
}

#[test]
fn a_protocol_error_gets_an_error_and_closes_the_connection() {
    let sink = Sink::default();
    for bad in [
        b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n$x\r\n".as_slice(),
        b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n:1\r\n",
        b"PING\r\n*1\r\n$4\r\nPING\r\n*2\r\n$1\r\nab\r\n",
    ] {
        let mut s = sink.connect();
        s.write_raw(bad).unwrap();
        // Until EOF (5 s at most).
        let (got, end) = s.read_until_closed(Duration::from_secs(5));
        end.expect("the sink closes the connection");
        assert_eq!(got, [REPLY, REPLY, PROTOCOL_ERROR].concat());
    }
    // The sink still serves new connections.
    let mut s = sink.connect();
    s.write_raw(b"PING\r\n").unwrap();
    read_exact_replies(&mut s, 1);
    drop(s);
    let stats = sink.stop();
    assert_eq!(stats.protocol_errors, 3);
    assert_eq!(stats.commands, 7);
}

#[test]
fn respway_perf_closed_loop_runs_clean_against_the_sink() {
    let sink = Sink::default();
    let w = Workload {
        keyspace: 1000,
        commands: Cmd::ALL.iter().map(|&c| (c, 1.0)).collect(),
        ..Workload::default()
    };
    let pools = Arc::new(generate_pools(&w, 8, 512, 16).unwrap());
    let t0 = Instant::now();
    let rec = run_closed(
        &ClosedConfig {
            addr: sink.addr,
            connections: 8,
            pipeline: 16,
            threads: 2,
            duration: Duration::from_millis(700),
            max_requests: 5_000_000,
            cycle: true,
            reply_timeout: Duration::from_secs(5),
            interval: Duration::from_millis(100),
        },
        pools,
        &Control::new(),
    )
    .unwrap();
    assert!(
        t0.elapsed() < slack(Duration::from_secs(5)),
        "{:?}",
        t0.elapsed()
    );
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    assert!(rec.replies > 1000, "{}", rec.replies);
    assert_eq!(rec.replies, rec.sent);
    let stats = sink.stop();
    assert_eq!(stats.commands, rec.replies);
    assert_eq!(stats.connections, 8);
    assert_eq!(stats.protocol_errors, 0);
}

#[test]
fn respway_perf_run_cli_reports_no_errors_against_the_sink() {
    let sink = Sink::default();
    let (st, out) = stdout_bounded(
        Command::new(env!("CARGO_BIN_EXE_respway-perf"))
            .args(["run", "-t", &sink.addr.to_string()])
            .args([
                "--keyspace",
                "1000",
                "--commands",
                "get=1",
                "--value-size",
                "3",
            ])
            .args(["-c", "8", "-P", "16", "-n", "200000", "-d", "1s"]),
        Duration::from_secs(30),
    );
    assert!(st.success(), "{st}: {out}");
    // "127.0.0.1:PORT: N replies in T s = R req/s; errors 0"
    let first = out.lines().next().unwrap_or_default();
    assert!(first.ends_with("errors 0"), "{out}");
    let replies: u64 = first
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(replies > 0, "{out}");
    let stats = sink.stop();
    assert_eq!(stats.commands, replies);
}

/// Runs `cmd` (stdout captured, stderr dropped) for at most `limit`: its exit status and
/// its output.
fn stdout_bounded(cmd: &mut Command, limit: Duration) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let st = wait_bounded(&mut child, limit);
    let out = read_all(child.stdout.take());
    (st, out)
}

/// Everything left in a child's captured output (empty when it was not captured).
fn read_all(pipe: Option<impl Read>) -> String {
    let mut s = String::new();
    if let Some(mut p) = pipe {
        p.read_to_string(&mut s).unwrap();
    }
    s
}

/// Waits for `child` at most `limit`; kills it past that.
fn wait_bounded(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{child:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn redis_benchmark_completes_against_the_sink() {
    if !respway_testkit::have("redis-benchmark") {
        eprintln!("redis-benchmark not installed: skipped");
        return;
    }
    let sink = Sink::default();
    let (st, out) = stdout_bounded(
        Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &sink.addr.port().to_string()])
            .args(["-t", "get", "-n", "20000", "-P", "16", "-q"]),
        Duration::from_secs(30),
    );
    assert!(st.success(), "{st}: {out}");
    assert!(out.contains("GET"), "{out}");
    let stats = sink.stop();
    // redis-benchmark first asks CONFIG GET twice (the sink's bulk reply is not what it
    // expects: it only warns), then 20 000 GETs.
    assert!(stats.commands >= 20_000, "{stats:?}");
    assert_eq!(stats.protocol_errors, 0);
}

#[test]
fn the_cli_prints_its_address_serves_and_exits_after_its_duration() {
    let bin = env!("CARGO_BIN_EXE_respway-perf");
    let mut child = Command::new(bin)
        .args(["sink", "--listen", "127.0.0.1:0", "--duration", "1500ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let mut s = RespConn::connect(addr);
    s.stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    s.write_raw(b"*1\r\n$4\r\nPING\r\nPING\r\n").unwrap();
    let got = s.read_exact_raw(2 * REPLY.len()).unwrap();
    assert_eq!(got, REPLY.repeat(2));
    drop(s);
    let st = wait_bounded(&mut child, Duration::from_secs(10));
    assert!(st.success(), "{st}");
    let err = read_all(child.stderr.take());
    assert!(err.contains("2 commands"), "{err}");
}

#[test]
fn the_cli_refuses_a_non_loopback_address() {
    let bin = env!("CARGO_BIN_EXE_respway-perf");
    let mut child = Command::new(bin)
        .args(["sink", "--listen", "0.0.0.0:0", "--duration", "1s"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = wait_bounded(&mut child, Duration::from_secs(10));
    let out = read_all(child.stdout.take());
    let err = read_all(child.stderr.take());
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(out.is_empty(), "nothing bound, no address printed: {out}");
    assert!(err.contains("not a loopback address"), "{err}");
}

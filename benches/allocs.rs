//! Heap allocations per request through the whole proxy: respway in this process (one
//! worker, one local `redis-server` shard), a raw client on a loopback socket, and a counting
//! global allocator (`stats_alloc`) over the process. The client allocates nothing in its
//! loop (requests encoded beforehand, replies read into a buffer of their known length), and
//! redis-server is another process, so what is counted is respway's session, filter chain and
//! upstream connection, plus its background tasks (negligible over the requests counted).
//!
//! For each case (GET and SET of 64 B, 4 KiB, 64 KiB and 1 MiB values, one command per round
//! trip and 16 per pipeline; MSET and MGET of 4 keys at 64 B and 4 KiB) it prints allocations,
//! reallocations and bytes allocated per request; then GET of a 2-byte value from 50 clients
//! at once, 16 per pipeline; then MSET and MGET of 10 keys over 3 shards (split per shard and
//! merged).
//!
//! Run: `cargo bench --bench allocs` (`-- N` sets the requests per case, default 20,000).

use std::alloc::System;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// `rounds` round trips of `req` (holding `per` commands), each answered by exactly
/// `reply.len()` bytes equal to `reply`. Allocates nothing.
fn run(c: &mut TcpStream, req: &[u8], reply: &[u8], buf: &mut [u8], rounds: usize) {
    for _ in 0..rounds {
        c.write_all(req).expect("write");
        c.read_exact(buf).expect("read");
        assert!(*buf == *reply, "unexpected reply");
    }
}

/// The allocations of `rounds` round trips, after a warm-up (connections opened, buffers
/// grown to their working size).
fn measure(c: &mut TcpStream, req: &[u8], reply: &[u8], rounds: usize) -> stats_alloc::Stats {
    let mut buf = vec![0u8; reply.len()];
    run(c, req, reply, &mut buf, rounds.clamp(10, 1000));
    let region = Region::new(GLOBAL);
    run(c, req, reply, &mut buf, rounds);
    region.change()
}

/// Appends `$len\r\nvalue\r\n` to `out`.
fn bulk(out: &mut Vec<u8>, value: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// One line of the table: allocations, reallocations and bytes per request.
fn row(
    out: &mut impl Write,
    cmd: &str,
    size: usize,
    pipeline: usize,
    requests: usize,
    s: &stats_alloc::Stats,
    note: &str,
) {
    let per = |v: usize| v as f64 / requests as f64;
    writeln!(
        out,
        "{:<6} {:>9} {:>3} {:>9} {:>12.2} {:>12.2} {:>14.0}{note}",
        cmd,
        size,
        pipeline,
        requests,
        per(s.allocations),
        per(s.reallocations),
        per(s.bytes_allocated)
    )
    .expect("stdout");
}

/// respway in this process (one worker) over these shards, and its listener's address.
fn start_over(shards: &[std::net::SocketAddr]) -> (respway::Server, std::net::SocketAddr) {
    let mut yaml = String::from(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    routes:\n      catch_all: main\n\
         clusters:\n  - name: main\n    shards:\n",
    );
    for (i, a) in shards.iter().enumerate() {
        yaml += &format!(
            "      - name: s{i}\n        endpoints:\n          - {{ address: \"{a}\" }}\n"
        );
    }
    let config =
        respway_xds::translate(&respway_xds::parse_yaml(&yaml).expect("yaml")).expect("config");
    let server = respway::start(
        config,
        respway::Options {
            workers: 1,
            ..Default::default()
        },
    )
    .expect("start");
    let addr = server.local_addrs()[0];
    (server, addr)
}

/// A client connection without Nagle's delay, failing after 30 s without a reply.
fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let c = TcpStream::connect(addr).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    c
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    let shard = respway_testkit::redis();
    let (server, addr) = start_over(&[shard.addr]);
    let mut c = connect(addr);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<6} {:>9} {:>3} {:>9} {:>12} {:>12} {:>14}",
        "cmd", "value", "P", "requests", "allocs/req", "reallocs/req", "bytes/req"
    )
    .expect("stdout");
    for size in [64usize, 4096, 65536, 1 << 20] {
        let value = vec![b'x'; size];
        for pipeline in [1usize, 16] {
            // Fewer requests for large values: the count per request is what matters.
            let requests = (n * 64 / size.max(64)).clamp(200, n);
            let rounds = requests.div_ceil(pipeline);
            let requests = rounds * pipeline;
            // MSET/MGET of 4 keys (one shard: forwarded whole, not split), small values only.
            let multi: &[&str] = if size <= 4096 { &["MSET", "MGET"] } else { &[] };
            for &cmd in ["SET", "GET"].iter().chain(multi) {
                let mut req = Vec::new();
                let mut reply = Vec::new();
                for i in 0..pipeline {
                    let key = format!("k{i}");
                    let keys: Vec<String> = (0..4).map(|j| format!("m{i}.{j}")).collect();
                    if cmd == "MSET" {
                        let mut argv: Vec<&[u8]> = vec![b"MSET"];
                        for k in &keys {
                            argv.push(k.as_bytes());
                            argv.push(&value);
                        }
                        encode(&mut req, &argv);
                        reply.extend_from_slice(b"+OK\r\n");
                    } else if cmd == "MGET" {
                        let mut argv: Vec<&[u8]> = vec![b"MGET"];
                        argv.extend(keys.iter().map(|k| k.as_bytes()));
                        encode(&mut req, &argv);
                        reply.extend_from_slice(b"*4\r\n");
                        for _ in 0..4 {
                            bulk(&mut reply, &value);
                        }
                    } else if cmd == "SET" {
                        encode(&mut req, &[b"SET", key.as_bytes(), &value]);
                        reply.extend_from_slice(b"+OK\r\n");
                    } else {
                        encode(&mut req, &[b"GET", key.as_bytes()]);
                        bulk(&mut reply, &value);
                    }
                }
                let s = measure(&mut c, &req, &reply, rounds);
                row(&mut out, cmd, size, pipeline, requests, &s, "");
            }
        }
    }
    drop(c);
    // Many clients at once (as redis-benchmark -c 50 -P 16): up to 800 commands in flight,
    // dispatched in bursts before the connection task takes them, which is what per-thread
    // pools of request parts have to cover.
    for (clients, pipeline) in [(50usize, 16usize)] {
        let rounds = (n / (clients * pipeline)).max(10);
        let requests = rounds * clients * pipeline;
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(clients + 1));
        let threads: Vec<_> = (0..clients)
            .map(|t| {
                let barrier = barrier.clone();
                let mut req = Vec::new();
                let mut reply = Vec::new();
                for i in 0..pipeline {
                    encode(&mut req, &[b"GET", format!("c{t}.{i}").as_bytes()]);
                    reply.extend_from_slice(b"$2\r\n64\r\n");
                }
                let mut c = connect(addr);
                for i in 0..pipeline {
                    let mut set = Vec::new();
                    encode(&mut set, &[b"SET", format!("c{t}.{i}").as_bytes(), b"64"]);
                    c.write_all(&set).expect("write");
                    let mut ok = [0u8; 5];
                    c.read_exact(&mut ok).expect("read");
                }
                let mut buf = vec![0u8; reply.len()];
                run(&mut c, &req, &reply, &mut buf, 10);
                std::thread::spawn(move || {
                    barrier.wait();
                    run(&mut c, &req, &reply, &mut buf, rounds);
                })
            })
            .collect();
        let region = Region::new(GLOBAL);
        barrier.wait();
        for t in threads {
            t.join().expect("client");
        }
        let s = region.change();
        let note = format!("   ({clients} clients)");
        row(&mut out, "GET", 2, pipeline, requests, &s, &note);
    }
    server.shutdown();
    split_rows(&mut out, n);
}

/// MSET and MGET of 10 keys at 64 B over 3 shards: each command is split into one
/// sub-command per shard and the replies are merged.
fn split_rows(out: &mut impl Write, n: usize) {
    let shards: Vec<_> = (0..3).map(|_| respway_testkit::redis()).collect();
    let addrs: Vec<_> = shards.iter().map(|s| s.addr).collect();
    let (server, addr) = start_over(&addrs);
    let mut c = connect(addr);
    let value = [b'x'; 64];
    for pipeline in [1usize, 16] {
        let rounds = n.div_ceil(pipeline);
        let requests = rounds * pipeline;
        for cmd in ["MSET", "MGET"] {
            let mut req = Vec::new();
            let mut reply = Vec::new();
            for i in 0..pipeline {
                let keys: Vec<String> = (0..10).map(|j| format!("s{i}.{j}")).collect();
                let mut argv: Vec<&[u8]> = vec![cmd.as_bytes()];
                for k in &keys {
                    argv.push(k.as_bytes());
                    if cmd == "MSET" {
                        argv.push(&value);
                    }
                }
                encode(&mut req, &argv);
                if cmd == "MSET" {
                    reply.extend_from_slice(b"+OK\r\n");
                } else {
                    reply.extend_from_slice(b"*10\r\n");
                    for _ in 0..10 {
                        bulk(&mut reply, &value);
                    }
                }
            }
            let s = measure(&mut c, &req, &reply, rounds);
            row(
                out,
                cmd,
                64,
                pipeline,
                requests,
                &s,
                "   (10 keys, 3 shards)",
            );
        }
    }
    drop(c);
    server.shutdown();
}

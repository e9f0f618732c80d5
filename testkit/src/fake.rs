//! Fake shards, for faults a real `redis-server` cannot produce on demand.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::resp::{parse_resp, Resp};

/// How a [`FakeShard`] treats one accepted connection (numbered from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeMode {
    /// Answers like a tiny Redis: PING → PONG, GET → `$1 v`, anything else → `+OK`.
    Normal,
    /// Normal for this many commands, then half a reply, then silence with the socket open.
    StallAfter(usize),
    /// Answers every command, PING included, with bytes that are not RESP.
    Garbage,
    /// Reads everything and never answers, with the socket open.
    Silent,
    /// Normal, but `PTTL` answers `-2`: every key is gone right after its `GET` (it expired
    /// between the two).
    ExpiredOnRead,
}

/// A fake shard on a free loopback port. Stopped (and its threads ended) on drop.
pub struct FakeShard {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeShard {
    /// Starts a fake shard; `mode(i)` decides how connection `i` behaves.
    pub fn start(mode: fn(usize) -> FakeMode) -> FakeShard {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
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
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn fake_conn(mut stream: TcpStream, mode: FakeMode, stop: Arc<AtomicBool>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = Vec::new();
    let mut served = 0usize;
    let mut stalled = mode == FakeMode::Silent;
    let mut chunk = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
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
                    "PTTL" if mode == FakeMode::ExpiredOnRead => b":-2\r\n",
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

/// A loopback relay in front of a real server that hands the server's bytes on in tiny
/// pieces: every write toward the client is at most `max_chunk` bytes (sizes cycle from 1 to
/// `max_chunk`), with `TCP_NODELAY`, so a large reply reaches the client in many short reads.
/// Client-to-server bytes pass unchanged. Stopped (and its threads ended) on drop.
pub struct Dribble {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Dribble {
    /// Starts a relay to `target`.
    pub fn start(target: SocketAddr, max_chunk: usize) -> Dribble {
        Dribble::start_paced(target, max_chunk, None)
    }

    /// A relay to `target` that hands the server's bytes on at about `bytes_per_sec` (a slow
    /// link): large replies take seconds to arrive.
    pub fn throttled(target: SocketAddr, bytes_per_sec: u64) -> Dribble {
        Dribble::start_paced(target, 16 * 1024, Some(bytes_per_sec.max(1)))
    }

    fn start_paced(target: SocketAddr, max_chunk: usize, pace: Option<u64>) -> Dribble {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let max_chunk = max_chunk.max(1);
        let thread = std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(target) else {
                            continue;
                        };
                        for c in [&client, &server] {
                            let _ = c.set_nonblocking(false);
                            let _ = c.set_nodelay(true);
                            let _ = c.set_read_timeout(Some(Duration::from_millis(50)));
                        }
                        let (c2, s2) = (
                            client.try_clone().expect("clone"),
                            server.try_clone().expect("clone"),
                        );
                        let (st1, st2) = (s.clone(), s.clone());
                        conns.push(std::thread::spawn(move || {
                            relay(client, server, usize::MAX, None, st1)
                        }));
                        conns.push(std::thread::spawn(move || {
                            relay(s2, c2, max_chunk, pace, st2)
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        Dribble {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Dribble {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Copies `from` to `to` in writes of at most `max_chunk` bytes until EOF, an error or `stop`;
/// then shuts both down so the other direction ends too.
fn relay(
    mut from: TcpStream,
    mut to: TcpStream,
    max_chunk: usize,
    pace: Option<u64>,
    stop: Arc<AtomicBool>,
) {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut size = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let n = match from.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        let mut at = 0;
        while at < n {
            let step = match (max_chunk, pace) {
                (usize::MAX, _) => n,
                (_, Some(_)) => max_chunk,
                _ => {
                    size = size % max_chunk + 1;
                    size
                }
            };
            let end = (at + step).min(n);
            if to.write_all(&chunk[at..end]).is_err() {
                return;
            }
            if let Some(rate) = pace {
                std::thread::sleep(Duration::from_micros((end - at) as u64 * 1_000_000 / rate));
            }
            at = end;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

//! Arbitrary damage to client streams, against a running sidecar over real shards: commands
//! with flipped bytes, cut short, with bogus lengths or stray line ends, many connections at
//! once, while well-behaved clients keep checking their own replies.
//!
//! What must hold: no panic anywhere in respway (this file is its own process, so a panic
//! hook counts respway's panics alone); every damaged connection ends (its replies, then
//! at most a protocol error, then the close) without a hang; what respway writes is always
//! whole RESP replies; and the good clients never see a failed or wrong reply.

mod support;

use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use respway_filters::codec_limits::Limits;
use respway_filters::resp::{encode_command, reply_len};
use support::*;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// A few valid commands (RESP or inline) on keys of their own, pipelined.
fn valid_pipeline(rng: &mut SmallRng) -> Vec<u8> {
    let mut out = BytesMut::new();
    for _ in 0..rng.random_range(1..=5) {
        let k = |rng: &mut SmallRng| format!("fz:{}", rng.random_range(0..50)).into_bytes();
        let args: Vec<Vec<u8>> = match rng.random_range(0..9) {
            0 => vec![b"GET".to_vec(), k(rng)],
            1 => vec![
                b"SET".to_vec(),
                k(rng),
                vec![b'v'; rng.random_range(0..300)],
            ],
            2 => vec![b"MGET".to_vec(), k(rng), k(rng), k(rng)],
            3 => vec![
                b"MSET".to_vec(),
                k(rng),
                b"1".to_vec(),
                k(rng),
                b"2".to_vec(),
            ],
            4 => vec![b"DEL".to_vec(), k(rng), k(rng)],
            5 => vec![
                b"INCR".to_vec(),
                format!("fz:n{}", rng.random_range(0..5)).into_bytes(),
            ],
            6 => vec![b"HSET".to_vec(), b"fz:h".to_vec(), k(rng), b"x".to_vec()],
            7 => vec![b"PING".to_vec()],
            _ => {
                // inline
                out.extend_from_slice(b"GET fz:1\r\n");
                continue;
            }
        };
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        encode_command(&refs, &mut out);
    }
    out.to_vec()
}

/// 1 to 3 random kinds of damage.
fn damage(rng: &mut SmallRng, mut b: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.random_range(1..=3) {
        let at = rng.random_range(0..=b.len());
        match rng.random_range(0..7) {
            0 if !b.is_empty() => {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            1 => b.truncate(at),
            2 => {
                let junk: Vec<u8> = (0..rng.random_range(1..20)).map(|_| rng.random()).collect();
                b.splice(at..at, junk);
            }
            3 => {
                b.splice(at..at, b"\r\n".iter().copied());
            }
            4 => {
                let lens: [&[u8]; 5] = [
                    b"*0\r\n",
                    b"$-1\r\n",
                    b"*-1\r\n",
                    b"$99999999999\r\n",
                    b"*2147483648\r\n",
                ];
                let l = lens[rng.random_range(0..lens.len())];
                b.splice(at..at, l.iter().copied());
            }
            5 if at < b.len() => {
                let end = rng.random_range(at..=b.len());
                let copy = b[at..end].to_vec();
                b.extend_from_slice(&copy);
            }
            _ => {
                // a digit of some length prefix made larger
                if let Some(i) = b.iter().position(|&c| c == b'$') {
                    b.insert(i + 1, b'9');
                }
            }
        }
    }
    b
}

/// Sends `bytes`, closes the sending side, and reads until respway closes (at most 5 s).
/// Returns what it wrote back, or `None` when it did not close in time.
fn exchange(addr: SocketAddr, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut c = RespConn::connect(addr);
    // respway may close first (protocol error): a failed write is part of the game.
    let _ = c.write_raw(bytes);
    let _ = c.stream.shutdown(Shutdown::Write);
    match c.read_until_closed(Duration::from_secs(5)) {
        (out, Ok(())) => Some(out),
        (out, Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(out),
        _ => None,
    }
}

/// Checks that `out` is a sequence of whole replies; returns how many.
fn whole_replies(out: &[u8]) -> Result<usize, String> {
    let limits = Limits {
        max_bulk_len: usize::MAX / 4,
        max_multibulk_len: usize::MAX / 4,
        ..Limits::default()
    };
    let mut at = 0;
    let mut n = 0;
    while at < out.len() {
        match reply_len(&out[at..], &limits) {
            Ok(Some(len)) => {
                at += len;
                n += 1;
            }
            Ok(None) => return Err(format!("a reply cut short at byte {at}")),
            Err(e) => return Err(format!("not RESP at byte {at}: {e}")),
        }
    }
    Ok(n)
}

#[test]
fn damaged_streams_never_panic_hang_or_disturb_other_clients() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let shards = [redis(), redis(), redis()];
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let rw = respway(&sharded_yaml(&addrs, "{ policy: maglev }", true), 2);
    let load = set_get_load(rw.addr, 2, Duration::from_secs(60));

    const STREAMS: usize = 3000;
    const THREADS: usize = 6;
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let next = next.clone();
            let addr = rw.addr;
            std::thread::spawn(move || {
                let mut problems = Vec::new();
                let (mut replies, mut protocol_errors) = (0, 0);
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= STREAMS {
                        return (problems, replies, protocol_errors);
                    }
                    let mut rng = SmallRng::seed_from_u64(i as u64);
                    let valid = valid_pipeline(&mut rng);
                    let sent = damage(&mut rng, valid);
                    match exchange(addr, &sent) {
                        None => problems.push(format!(
                            "stream {i} not closed within 5 s: {:?}",
                            String::from_utf8_lossy(&sent)
                        )),
                        Some(out) => match whole_replies(&out) {
                            Ok(n) => {
                                replies += n;
                                let text = String::from_utf8_lossy(&out);
                                if text.contains("-ERR Protocol error") {
                                    protocol_errors += 1;
                                }
                            }
                            Err(e) => problems.push(format!(
                                "stream {i}: {e}: sent {:?}, got {:?}",
                                String::from_utf8_lossy(&sent),
                                String::from_utf8_lossy(&out)
                            )),
                        },
                    }
                }
            })
        })
        .collect();
    let mut problems = Vec::new();
    let (mut replies, mut protocol_errors) = (0, 0);
    for w in workers {
        let (p, n, e) = w.join().unwrap();
        problems.extend(p);
        replies += n;
        protocol_errors += e;
    }
    let round_trips = load.finish();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "respway panicked");
    // The damage broke the protocol of some streams and left others valid RESP (with odd
    // keys, lengths or commands); respway answered the valid parts.
    eprintln!("{STREAMS} streams: {replies} replies, {protocol_errors} ended by a protocol error");
    assert!(
        protocol_errors > STREAMS / 10 && protocol_errors < STREAMS,
        "{protocol_errors} of {STREAMS} streams ended by a protocol error"
    );
    assert!(
        replies > STREAMS,
        "only {replies} replies to {STREAMS} streams"
    );
    assert!(round_trips > 0);
    // Still serving on a fresh connection.
    let mut c = sync_client(rw.addr);
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}

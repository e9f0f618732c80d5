//! The open-loop driver: requests leave at scheduled times whatever the target does, and a
//! reply's latency is measured from the time its request *should* have been sent.
//!
//! A closed-loop client that stalls with its target stops sending, so the requests that
//! would have waited during the stall are never measured ("coordinated omission"). Here the
//! schedule is fixed in advance — a constant rate with even or Poisson spacing, or a
//! recorded trace's own timing — and a request sent late because the target (or its socket
//! buffer) held the sender up still counts from its scheduled time. The latency from the
//! actual send is kept too (`service_latency`): the gap between the two is the queueing a
//! closed-loop tool would hide.
//!
//! Shape: one pacer thread (the caller's) walks the schedule, sleeping until the next send
//! and spinning only for the last ~150 µs so sends are on time; everything due is written
//! per connection in one write. One reader thread per connection (blocking reads) matches
//! replies FIFO to the (scheduled time, send time, kind) the pacer queued for it before
//! writing. Bounded by duration, request count, and a drain timeout after the last send.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use respway_filters::resp::reply_len;
use serde::{Deserialize, Serialize};

use crate::closed::reply_limits;
use crate::stats::{Recorder, ERR_CONNECTION, ERR_TIMEOUT};
use crate::workload::RequestPool;
use crate::{Control, Error};

/// How a constant-rate schedule spaces its requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exactly `1/rate` apart.
    #[default]
    Uniform,
    /// Exponentially distributed gaps with mean `1/rate` (a Poisson process).
    Poisson,
}

/// The next request to send: when (ns after the start), on which connection, which request
/// of that connection's pool.
pub type Slot = (u64, usize, usize);

/// A send schedule. Times must not decrease.
pub trait Schedule {
    /// The next send, or `None` when the schedule is over.
    fn next_send(&mut self) -> Option<Slot>;
}

/// A constant rate over `connections` connections (request `i` on connection `i % n`),
/// cycling through each connection's pool.
#[derive(Debug)]
pub struct RateSchedule {
    rate: f64,
    arrival: Arrival,
    rng: StdRng,
    i: u64,
    t_ns: f64,
    lens: Vec<usize>,
    next: Vec<usize>,
}

impl RateSchedule {
    /// `rate` requests per second; `seed` drives Poisson gaps; `lens[c]` is connection `c`'s
    /// pool length.
    pub fn new(rate: f64, arrival: Arrival, seed: u64, lens: Vec<usize>) -> Self {
        let n = lens.len();
        RateSchedule {
            rate,
            arrival,
            rng: StdRng::seed_from_u64(seed ^ 0xa771_7a15),
            i: 0,
            t_ns: 0.0,
            lens,
            next: vec![0; n],
        }
    }
}

impl Schedule for RateSchedule {
    fn next_send(&mut self) -> Option<Slot> {
        if self.lens.is_empty() || self.rate.is_nan() || self.rate <= 0.0 {
            return None;
        }
        let at = self.t_ns as u64;
        let gap = 1e9 / self.rate;
        self.t_ns += match self.arrival {
            Arrival::Uniform => gap,
            Arrival::Poisson => {
                let u: f64 = self.rng.random();
                -(1.0 - u).ln() * gap
            }
        };
        let c = (self.i % self.lens.len() as u64) as usize;
        self.i += 1;
        if self.lens[c] == 0 {
            return None;
        }
        let idx = self.next[c];
        self.next[c] = (idx + 1) % self.lens[c];
        Some((at, c, idx))
    }
}

/// A fixed list of sends (a recorded trace's timing).
#[derive(Debug)]
pub struct ListSchedule {
    items: std::vec::IntoIter<Slot>,
}

impl ListSchedule {
    /// From `(ns, connection, request)` triples sorted by time.
    pub fn new(items: Vec<Slot>) -> Self {
        ListSchedule {
            items: items.into_iter(),
        }
    }
}

impl Schedule for ListSchedule {
    fn next_send(&mut self) -> Option<Slot> {
        self.items.next()
    }
}

/// How an open-loop run is driven.
#[derive(Debug, Clone)]
pub struct OpenConfig {
    /// The target.
    pub addr: SocketAddr,
    /// Stop sending after this long.
    pub duration: Duration,
    /// Stop after this many requests.
    pub max_requests: u64,
    /// After the last send, wait at most this long for the outstanding replies.
    pub drain: Duration,
    /// Timeline interval.
    pub interval: Duration,
}

/// What the pacer tells a reader about each request it queued: scheduled send (ns after
/// start), actual send (ns after start), kind.
type Sent = (u64, u64, u16);

struct Conn {
    stream: Option<TcpStream>,
    tx: Option<mpsc::Sender<Sent>>,
    sent: Arc<AtomicU64>,
    out: Vec<u8>,
}

/// Runs the schedule against `cfg.addr` with one connection per pool.
pub fn run_open(
    cfg: &OpenConfig,
    pools: Arc<Vec<RequestPool>>,
    schedule: &mut dyn Schedule,
    ctl: &Control,
) -> Result<Recorder, Error> {
    crate::check_loopback(cfg.addr)?;
    let n = pools.len();
    if n == 0 {
        return Err(Error::Config(
            "open loop needs at least one connection".into(),
        ));
    }
    let mut conns = Vec::with_capacity(n);
    let mut readers = Vec::with_capacity(n);
    let pacer_done = Arc::new(AtomicBool::new(false));
    let done_at = Arc::new(AtomicU64::new(u64::MAX));
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let s = TcpStream::connect_timeout(&cfg.addr, Duration::from_secs(5))
            .map_err(|e| Error::Run(format!("could not connect to {}: {e}", cfg.addr)))?;
        let _ = s.set_nodelay(true);
        streams.push(s);
    }
    let start = Instant::now();
    for (c, s) in streams.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel::<Sent>();
        let sent = Arc::new(AtomicU64::new(0));
        let rs = s.try_clone().map_err(Error::Io)?;
        let _ = rs.set_read_timeout(Some(Duration::from_millis(20)));
        let sent2 = Arc::clone(&sent);
        let pacer_done = Arc::clone(&pacer_done);
        let done_at = Arc::clone(&done_at);
        let interval = cfg.interval;
        let drain = cfg.drain;
        let ctl2 = ctl.clone();
        readers.push(
            std::thread::Builder::new()
                .name(format!("open-rd-{c}"))
                .spawn(move || {
                    reader(
                        rs,
                        rx,
                        &sent2,
                        &pacer_done,
                        &done_at,
                        start,
                        interval,
                        drain,
                        &ctl2,
                    )
                })
                .map_err(Error::Io)?,
        );
        conns.push(Conn {
            stream: Some(s),
            tx: Some(tx),
            sent,
            out: Vec::with_capacity(16 * 1024),
        });
    }
    let mut prec = Recorder::new(start, cfg.interval, true);
    let dur_ns = cfg.duration.as_nanos() as u64;
    let mut count = 0u64;
    let mut pending = schedule.next_send();
    let mut touched: Vec<usize> = Vec::new();
    'run: while let Some((at, _, _)) = pending {
        if ctl.stopped() || at >= dur_ns || count >= cfg.max_requests {
            break;
        }
        // Wait until `at`: sleep while far, spin for the last stretch.
        loop {
            let now = start.elapsed().as_nanos() as u64;
            if now >= at {
                break;
            }
            let wait = at - now;
            if wait > 150_000 {
                std::thread::sleep(Duration::from_nanos(wait - 100_000));
            } else {
                std::thread::yield_now();
            }
            if ctl.stopped() {
                break 'run;
            }
        }
        let now_ns = start.elapsed().as_nanos() as u64;
        // Everything due now goes out, grouped per connection.
        while let Some((at, c, idx)) = pending {
            if at > now_ns || at >= dur_ns || count >= cfg.max_requests {
                break;
            }
            let conn = &mut conns[c];
            let pool = &pools[c];
            count += 1;
            match (&conn.stream, &conn.tx) {
                (Some(_), Some(tx)) => {
                    conn.out.extend_from_slice(pool.request(idx));
                    let _ = tx.send((at, now_ns, pool.kind(idx)));
                    conn.sent.fetch_add(1, Ordering::Release);
                    if conn.out.len() == pool.request(idx).len() {
                        touched.push(c);
                    }
                }
                _ => prec.error(ERR_CONNECTION, 1),
            }
            pending = schedule.next_send();
        }
        let t = Instant::now();
        for c in touched.drain(..) {
            let conn = &mut conns[c];
            let k = conn.out.len();
            if k == 0 {
                continue;
            }
            let ok = conn
                .stream
                .as_mut()
                .is_some_and(|s| s.write_all(&conn.out).is_ok());
            conn.out.clear();
            if ok {
                prec.sent(0, t);
            } else {
                // The reader sees the closed socket and counts what is lost.
                conn.stream = None;
                conn.tx = None;
            }
        }
        ctl.done.store(count, Ordering::Relaxed);
    }
    prec.sent = count;
    done_at.store(start.elapsed().as_nanos() as u64, Ordering::Release);
    pacer_done.store(true, Ordering::Release);
    for c in &mut conns {
        c.tx = None;
    }
    let mut total = prec;
    for r in readers {
        match r.join() {
            Ok(rec) => total.merge(&rec),
            Err(_) => return Err(Error::Run("a reader thread panicked".into())),
        }
    }
    // `sent` counted by the pacer; readers add none.
    Ok(total)
}

#[allow(clippy::too_many_arguments)]
fn reader(
    mut s: TcpStream,
    rx: mpsc::Receiver<Sent>,
    sent: &AtomicU64,
    pacer_done: &AtomicBool,
    done_at: &AtomicU64,
    start: Instant,
    interval: Duration,
    drain: Duration,
    ctl: &Control,
) -> Recorder {
    let mut rec = Recorder::new(start, interval, true);
    let limits = reply_limits();
    let mut buf: Vec<u8> = vec![0; 64 * 1024];
    let mut len = 0usize;
    let mut received = 0u64;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match s.read(&mut buf[len..]) {
            Ok(0) => {
                let lost = sent.load(Ordering::Acquire).saturating_sub(received);
                if !pacer_done.load(Ordering::Acquire) || lost > 0 {
                    rec.error(ERR_CONNECTION, lost.max(1));
                }
                return rec;
            }
            Ok(k) => {
                len += k;
                let now = Instant::now();
                let now_ns = now.saturating_duration_since(start).as_nanos() as u64;
                let slot = rec.slot(now);
                let mut pos = 0;
                loop {
                    match reply_len(&buf[pos..len], &limits) {
                        Ok(Some(rl)) => {
                            let Ok((at, actual, kind)) = rx.recv() else {
                                rec.error("protocol: reply to no request", 1);
                                return rec;
                            };
                            received += 1;
                            rec.record(
                                slot,
                                kind,
                                now_ns.saturating_sub(at) / 1000,
                                &buf[pos..pos + rl],
                            );
                            rec.record_service(now_ns.saturating_sub(actual) / 1000);
                            pos += rl;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let lost = sent.load(Ordering::Acquire).saturating_sub(received);
                            rec.error(&format!("protocol: {}", e.0), lost.max(1));
                            return rec;
                        }
                    }
                }
                rec.replied_at(now);
                buf.copy_within(pos..len, 0);
                len -= pos;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                let lost = sent.load(Ordering::Acquire).saturating_sub(received);
                rec.error(ERR_CONNECTION, lost.max(1));
                return rec;
            }
        }
        if pacer_done.load(Ordering::Acquire) {
            let total = sent.load(Ordering::Acquire);
            if received >= total {
                return rec;
            }
            let waited =
                (start.elapsed().as_nanos() as u64).saturating_sub(done_at.load(Ordering::Acquire));
            if waited > drain.as_nanos() as u64 || ctl.stopped() {
                rec.error(ERR_TIMEOUT, total - received);
                return rec;
            }
        }
    }
}

//! The closed-loop driver: N connections, each with `pipeline` requests in flight, as fast
//! as the target answers (maximum throughput).
//!
//! Built to not be the bottleneck: a few threads, each a current-thread tokio runtime owning
//! a share of the connections (one small task each, no cross-thread wake-ups); a connection
//! writes a whole pipeline batch, taken as one slice of its pre-encoded [`RequestPool`], with
//! one system call, then cuts the replies out of its read buffer with
//! [`respway_filters::resp::reply_len`] — no allocation, one clock read per read system call.
//! A reply's latency is from its batch's write to the read that completed it, like
//! `redis-benchmark -P`.
//!
//! Every run is bounded: by its duration, by its request count and by a reply timeout (a
//! connection whose replies stop coming is closed and its outstanding requests counted as
//! [`ERR_TIMEOUT`](crate::stats::ERR_TIMEOUT)). The timeout is kept by a watchdog task per
//! thread rather than a timer per read, which would cost a timer-wheel insert and removal
//! per round trip.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use respway_filters::codec_limits::Limits;
use respway_filters::resp::reply_len;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::stats::{Recorder, ERR_CONNECTION, ERR_TIMEOUT};
use crate::workload::RequestPool;
use crate::{Control, Error};

/// How a closed-loop run is driven.
#[derive(Debug, Clone)]
pub struct ClosedConfig {
    /// The target.
    pub addr: SocketAddr,
    /// Connections.
    pub connections: usize,
    /// Requests per batch: one write, then wait for every reply (`redis-benchmark -P`).
    pub pipeline: usize,
    /// Driver threads (each a current-thread runtime owning a share of the connections).
    pub threads: usize,
    /// Stop after this long.
    pub duration: Duration,
    /// Stop after this many requests in all.
    pub max_requests: u64,
    /// Start the pool over when a connection reaches its end (generated traffic); when
    /// false, each connection runs its pool once (replay).
    pub cycle: bool,
    /// Give up on a connection whose reply takes longer than this.
    pub reply_timeout: Duration,
    /// Timeline interval.
    pub interval: Duration,
}

/// Runs the closed loop: connection `i` sends from `pools[i % pools.len()]`. Returns the
/// merged measurements. Fails only when no connection could be opened.
pub fn run_closed(
    cfg: &ClosedConfig,
    pools: Arc<Vec<RequestPool>>,
    ctl: &Control,
) -> Result<Recorder, Error> {
    crate::check_loopback(cfg.addr)?;
    if pools.is_empty() || pools.iter().all(RequestPool::is_empty) {
        return Err(Error::Config(
            "nothing to send: the request pools are empty".into(),
        ));
    }
    let conns = cfg.connections.max(1);
    let threads = cfg.threads.clamp(1, conns);
    // Request quota per connection: generated traffic splits the total evenly; a replay
    // runs each connection's pool once (its length was already bounded by the caller).
    let quota = |c: usize| -> u64 {
        if cfg.cycle {
            let base = cfg.max_requests / conns as u64;
            base + u64::from((c as u64) < cfg.max_requests % conns as u64)
        } else {
            (pools[c % pools.len()].len() as u64).min(cfg.max_requests)
        }
    };
    let barrier = Arc::new(Barrier::new(threads));
    let start_cell = Arc::new(OnceLock::new());
    let go = Arc::new(Barrier::new(threads));
    let mut handles = Vec::new();
    for t in 0..threads {
        let mine: Vec<(usize, u64)> = (0..conns)
            .filter(|c| c % threads == t)
            .map(|c| (c, quota(c)))
            .collect();
        let cfg = cfg.clone();
        let pools = Arc::clone(&pools);
        let ctl = ctl.clone();
        let barrier = Arc::clone(&barrier);
        let go = Arc::clone(&go);
        let start_cell = Arc::clone(&start_cell);
        handles.push(
            std::thread::Builder::new()
                .name(format!("closed-{t}"))
                .spawn(move || thread_main(&cfg, &pools, &mine, &ctl, &barrier, &go, &start_cell))
                .map_err(Error::Io)?,
        );
    }
    let mut total: Option<Recorder> = None;
    let mut connect_errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok((rec, errs)) => {
                connect_errors.extend(errs);
                match &mut total {
                    None => total = Some(rec),
                    Some(t) => t.merge(&rec),
                }
            }
            Err(_) => return Err(Error::Run("a driver thread panicked".into())),
        }
    }
    if connect_errors.len() == conns {
        return Err(Error::Run(format!(
            "could not connect to {}: {}",
            cfg.addr, connect_errors[0]
        )));
    }
    total.ok_or_else(|| Error::Run("no driver thread".into()))
}

type ThreadResult = (Recorder, Vec<String>);

fn thread_main(
    cfg: &ClosedConfig,
    pools: &Arc<Vec<RequestPool>>,
    mine: &[(usize, u64)],
    ctl: &Control,
    barrier: &Barrier,
    go: &Barrier,
    start_cell: &OnceLock<Instant>,
) -> ThreadResult {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            barrier.wait();
            go.wait();
            let start = *start_cell.get_or_init(Instant::now);
            let rec = Recorder::new(start, cfg.interval, false);
            return (rec, vec![format!("runtime: {e}")]);
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        // Connect everything first, then start all threads' connections together.
        let mut streams = Vec::new();
        let mut errors = Vec::new();
        for &(c, q) in mine {
            match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(cfg.addr)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    streams.push((c, q, s));
                }
                Ok(Err(e)) => errors.push(e.to_string()),
                Err(_) => errors.push("connect timed out".to_string()),
            }
        }
        barrier.wait();
        let start = *start_cell.get_or_init(Instant::now);
        go.wait();
        let rec = Rc::new(RefCell::new(Recorder::new(start, cfg.interval, false)));
        let deadline = start + cfg.duration;
        let mut tasks = Vec::new();
        for (c, q, s) in streams {
            let pools = Arc::clone(pools);
            let rec = Rc::clone(&rec);
            let ctl = ctl.clone();
            let cfg = cfg.clone();
            let state = Rc::new(ConnState {
                outstanding: Cell::new(0),
                since: Cell::new(start),
            });
            let st = Rc::clone(&state);
            let handle = tokio::task::spawn_local(async move {
                let pool = &pools[c % pools.len()];
                conn_loop(s, pool, q, &cfg, deadline, &rec, &ctl, &st).await;
            });
            tasks.push((handle, state));
        }
        // The watchdog: no timer per read on the hot path; instead, every 50 ms, a
        // connection whose replies have not progressed for `reply_timeout` is aborted and
        // its outstanding requests counted as timeouts.
        loop {
            if tasks.iter().all(|(h, _)| h.is_finished()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = Instant::now();
            for (h, st) in &tasks {
                let n = st.outstanding.get();
                if !h.is_finished()
                    && n > 0
                    && now.saturating_duration_since(st.since.get()) > cfg.reply_timeout
                {
                    h.abort();
                    st.outstanding.set(0);
                    rec.borrow_mut().error(ERR_TIMEOUT, n);
                }
            }
        }
        for (h, _) in tasks {
            let _ = h.await;
        }
        let rec = Rc::try_unwrap(rec)
            .map(RefCell::into_inner)
            .unwrap_or_else(|rc| rc.borrow().clone());
        (rec, errors)
    })
}

/// Generous limits for replies: a big MGET or LRANGE is fine.
pub(crate) fn reply_limits() -> Limits {
    Limits {
        max_bulk_len: usize::MAX / 4,
        max_multibulk_len: usize::MAX / 4,
        ..Limits::default()
    }
}

/// What the watchdog sees of a connection: requests awaiting replies, and since when the
/// replies last progressed.
struct ConnState {
    outstanding: Cell<u64>,
    since: Cell<Instant>,
}

#[allow(clippy::too_many_arguments)]
async fn conn_loop(
    mut stream: TcpStream,
    pool: &RequestPool,
    quota: u64,
    cfg: &ClosedConfig,
    deadline: Instant,
    rec: &RefCell<Recorder>,
    ctl: &Control,
    st: &ConnState,
) {
    let limits = reply_limits();
    let mut rbuf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut next = 0usize;
    let mut remaining = quota;
    let pipeline = cfg.pipeline.max(1) as u64;
    while remaining > 0 {
        if ctl.stopped() || Instant::now() >= deadline {
            break;
        }
        if next >= pool.len() {
            if !cfg.cycle || pool.is_empty() {
                break;
            }
            next = 0;
        }
        let n = (pipeline.min(remaining) as usize).min(pool.len() - next);
        let t0 = Instant::now();
        if stream.write_all(pool.range(next, next + n)).await.is_err() {
            rec.borrow_mut().error(ERR_CONNECTION, n as u64);
            return;
        }
        rec.borrow_mut().sent(n as u64, t0);
        st.outstanding.set(n as u64);
        st.since.set(t0);
        let mut got = 0usize;
        let mut pos = 0usize;
        while got < n {
            if rbuf.capacity() - rbuf.len() < 16 * 1024 {
                rbuf.reserve(64 * 1024);
            }
            let read = stream.read_buf(&mut rbuf).await;
            let lost = (n - got) as u64;
            match read {
                Err(_) | Ok(0) => {
                    st.outstanding.set(0);
                    rec.borrow_mut().error(ERR_CONNECTION, lost);
                    return;
                }
                Ok(_) => {}
            }
            let now = Instant::now();
            let lat = now.saturating_duration_since(t0).as_micros() as u64;
            let mut r = rec.borrow_mut();
            let slot = r.slot(now);
            while got < n {
                match reply_len(&rbuf[pos..], &limits) {
                    Ok(Some(len)) => {
                        r.record(slot, pool.kind(next + got), lat, &rbuf[pos..pos + len]);
                        pos += len;
                        got += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        r.error(&format!("protocol: {}", e.0), (n - got) as u64);
                        st.outstanding.set(0);
                        return;
                    }
                }
            }
            r.replied_at(now);
            drop(r);
            st.outstanding.set((n - got) as u64);
            st.since.set(now);
            if pos == rbuf.len() {
                rbuf.clear();
                pos = 0;
            } else if got == n {
                // More bytes than replies asked for: the stream is out of step.
                rec.borrow_mut()
                    .error("protocol: unexpected data after the replies", 1);
                return;
            }
        }
        next += n;
        remaining -= n as u64;
        ctl.done.fetch_add(n as u64, Ordering::Relaxed);
    }
}

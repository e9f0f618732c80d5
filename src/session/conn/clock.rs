//! The session's clock: latency of each reply from its dispatch, counted per run of one
//! command, and one clock read per client read (`Batch`); the timer of the oldest request.

use std::future::Future;
use std::task::{Context, Poll};

use tokio::time::Instant;

use super::{Live, BACKSTOP};
use crate::session::listener::ListenerCtx;
use crate::stats;
use respway_filters::request::is_error;

/// The clock of one turn of the session's reply loop: read at most once, for the latency of
/// the replies the turn completes, and the run of replies of one command and one backstop
/// (dispatched from one read) not yet counted: counted when the run ends or the turn is
/// dropped, so that a pipeline of GETs costs one subtraction and one counter update per run.
pub(super) struct TurnClock<'a> {
    now: Option<Instant>,
    stats: &'a stats::CommandStats,
    run: Run,
}

/// Replies of command `idx` whose session backstop is `backstop`, `us` each; `n == 0`: none.
pub(super) struct Run {
    idx: u16,
    backstop: Instant,
    us: u64,
    n: u64,
    failed: u64,
}

impl<'a> TurnClock<'a> {
    pub(super) fn new(stats: &'a stats::CommandStats) -> Self {
        // Any instant will do while the run is empty: one read once per process, not a clock
        // read per turn.
        static ANY: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let any = *ANY.get_or_init(Instant::now);
        TurnClock {
            now: None,
            stats,
            run: Run {
                idx: 0,
                backstop: any,
                us: 0,
                n: 0,
                failed: 0,
            },
        }
    }

    /// Counts one reply of command `idx` dispatched with `backstop`; its latency in µs.
    #[inline(always)]
    pub(super) fn count(&mut self, live: &Live, idx: u16, backstop: Instant, failed: bool) -> u64 {
        let r = &self.run;
        if r.n == 0 || r.idx != idx || r.backstop != backstop {
            self.flush();
            let now = *self.now.get_or_insert_with(Instant::now);
            self.run = Run {
                idx,
                backstop,
                us: now
                    .saturating_duration_since(started(live, backstop))
                    .as_micros() as u64,
                n: 0,
                failed: 0,
            };
        }
        let r = &mut self.run;
        r.n += 1;
        r.failed += u64::from(failed);
        r.us
    }

    fn flush(&mut self) {
        let r = &self.run;
        if r.n > 0 {
            self.stats.record_n(r.idx, r.us, r.n, r.failed);
        }
    }
}

impl Drop for TurnClock<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// When the session answers a command whose upstream deadline is `deadline` itself, if
/// nothing did: after the latest moment the upstream may answer it (see
/// [`crate::upstream::STRETCH`]).
#[inline(always)]
pub(super) fn backstop(deadline: Instant, op: std::time::Duration) -> Instant {
    deadline + op * crate::upstream::STRETCH + BACKSTOP
}

/// When a command whose session backstop is `backstop` was dispatched (the backstop less the
/// spans added to it there).
#[inline(always)]
pub(super) fn started(live: &Live, backstop: Instant) -> Instant {
    let op = live.parts.listener.op_timeout;
    backstop
        .checked_sub(op + op * crate::upstream::STRETCH + BACKSTOP)
        .unwrap_or(backstop)
}

/// Counts a reply that came from upstream (or a future): its latency runs from dispatch
/// (see [`started`]). `Some(µs)` when it is slow enough for the slow log.
#[inline(always)]
pub(super) fn record(
    ctx: &ListenerCtx,
    live: &Live,
    clock: &mut TurnClock<'_>,
    idx: u16,
    backstop: Instant,
    reply: &[u8],
) -> Option<u64> {
    let us = clock.count(live, idx, backstop, is_error(reply));
    (us >= ctx.stats.slow.threshold_us()).then_some(us)
}

thread_local! {
    /// While a session dispatches the commands of one read (`Batch`): whether the clock may
    /// be cached, and its reading.
    static BATCH_NOW: std::cell::Cell<(bool, Option<Instant>)> =
        const { std::cell::Cell::new((false, None)) };
}

/// Now, read once for all the commands dispatched from one client read (their deadlines then
/// differ by the microseconds the dispatch takes, not by a clock read each); outside a
/// [`Batch`], the clock itself.
#[inline]
pub(super) fn batch_now() -> Instant {
    BATCH_NOW.with(|c| match c.get() {
        (true, Some(t)) => t,
        (true, None) => {
            let t = Instant::now();
            c.set((true, Some(t)));
            t
        }
        (false, _) => Instant::now(),
    })
}

/// The span of one `decode_all` on this thread: [`batch_now`] caches the clock until it
/// ends (a dispatch never awaits, so no other session runs meanwhile).
pub(super) struct Batch;

impl Batch {
    pub(super) fn start() -> Batch {
        BATCH_NOW.with(|c| c.set((true, None)));
        Batch
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        BATCH_NOW.with(|c| c.set((false, None)));
    }
}

impl super::Session {
    /// True when `deadline` has passed; otherwise makes sure the timer will wake us by then.
    pub(super) fn poll_timeout(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        if !self.timer_armed || self.timer.deadline() > deadline {
            self.timer.as_mut().reset(deadline);
            self.timer_armed = true;
        }
        loop {
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return false,
                Poll::Ready(()) => {
                    if Instant::now() >= deadline {
                        self.timer_armed = false;
                        return true;
                    }
                    self.timer.as_mut().reset(deadline);
                }
            }
        }
    }
}

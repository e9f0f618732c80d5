//! Writes held during a failover: a shard's primary is about to be replaced (a Sentinel said
//! a failover of its master began), so a write sent to it now may be acknowledged and then
//! dropped when it is made a replica. Such writes wait, neither sent nor refused, until the
//! new primary is named ([`Hold::release`]) or the hold's bound passes, and then go to the
//! primary the worker's newest endpoints name.
//!
//! Order: while one of a session's requests waits here, its later requests wait behind it
//! ([`super::Track`]) and are sent only when the session polls them, which it does oldest first,
//! after the replies before them: the client's commands run in the order it sent them, as on
//! a Redis whose writes are paused.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// One shard's hold, shared by the discovery thread that starts and ends it and every
/// worker's handle of the shard's primary (one atomic load per write to that primary).
#[derive(Debug, Default)]
pub(crate) struct Hold {
    held: AtomicBool,
    /// While held: when the hold ends whatever happens; once released: the new primary
    /// (`None`: the same one, the failover ended otherwise).
    state: Mutex<(Option<Instant>, Option<SocketAddr>)>,
    released: Notify,
    /// Holds started.
    pub(crate) holds: AtomicU64,
    /// Writes held (each once, whatever became of it).
    pub(crate) writes: AtomicU64,
    /// The longest a hold lasts, in microseconds (0: writes are never held).
    bound_us: AtomicU64,
}

impl Hold {
    /// True while writes must wait.
    #[inline]
    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire) && self.until().is_some_and(|u| Instant::now() < u)
    }

    fn until(&self) -> Option<Instant> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Sets the longest a hold lasts (the shard's `failover_hold`; zero: never held).
    pub(crate) fn set_bound(&self, bound: Duration) {
        let us = u64::try_from(bound.as_micros()).unwrap_or(u64::MAX);
        self.bound_us.store(us, Ordering::Relaxed);
    }

    /// The longest a hold lasts.
    pub(crate) fn bound(&self) -> Duration {
        Duration::from_micros(self.bound_us.load(Ordering::Relaxed))
    }

    /// Starts a hold that ends at the latest after its bound (a hold already on keeps its
    /// end). True when it started now.
    pub(crate) fn start(&self) -> bool {
        let bound = self.bound();
        if bound.is_zero() {
            return false;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.held.load(Ordering::Acquire) && s.0.is_some_and(|u| Instant::now() < u) {
            return false;
        }
        *s = (Some(Instant::now() + bound), None);
        self.held.store(true, Ordering::Release);
        self.holds.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// True while a hold is on, its bound passed or not (the discovery thread ends it).
    pub(crate) fn on(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Ends the hold: the writes held go to `to` (`None`: the primary the workers know).
    pub(crate) fn release(&self, to: Option<SocketAddr>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = (None, to);
        self.held.store(false, Ordering::Release);
        drop(s);
        self.released.notify_waiters();
    }

    /// Waits until the hold ends (released, or its bound passed) and returns where the
    /// writes go (`None`: the primary the workers know).
    pub(crate) async fn wait(&self) -> Option<SocketAddr> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let until = {
                let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if !self.held.load(Ordering::Acquire) {
                    return s.1;
                }
                match s.0 {
                    Some(u) if Instant::now() < u => u,
                    _ => return None,
                }
            };
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }
}

impl super::Upstream {
    /// `req` sent later (see the module): when `hold` is given, once the hold ends, to the
    /// primary the worker's newest endpoints name; otherwise when the session polls it (its
    /// requests before it are answered). Its time to wait for a reply starts when it is sent.
    pub(super) fn later(
        &self,
        mut req: respway_filters::request::Request,
        fill: Option<Box<dyn super::Rider>>,
        on_fallback: Option<Box<dyn super::Rider>>,
        hold: Option<Arc<Hold>>,
    ) -> super::UpstreamFuture {
        let turn = self.track.wait();
        let deadline = self.deadline_of(&req);
        let op = deadline.saturating_duration_since(tokio::time::Instant::now());
        let shard = req.shard_index().unwrap_or(0);
        let primary = usize::from(req.primary);
        let label = (self.endpoints.get(req.cluster, shard, primary))
            .map_or_else(|| Arc::from(""), |h| h.label().clone());
        let mut up = self.clone();
        // Yields the sent request's future (polled in its place), not its reply.
        #[allow(clippy::async_yields_async)]
        let send = async move {
            let held = match &hold {
                Some(h) => {
                    let to = h.wait().await;
                    up.endpoints = newest(up.endpoints, req.cluster, shard, primary, to).await;
                    true
                }
                // Behind a held write of a Sentinel-managed shard: to its newest endpoints too.
                None => match up.endpoints.get(req.cluster, shard, primary) {
                    Some(p) if p.hold().is_some() => {
                        up.endpoints = super::latest().unwrap_or(up.endpoints);
                        true
                    }
                    _ => false,
                },
            };
            if held {
                // The shard's endpoints may have changed: its primary.
                req.endpoint = None;
            }
            req.deadline = Some(Instant::now() + op);
            let f = up.send_now(req, fill, on_fallback);
            drop(turn);
            f
        };
        super::UpstreamFuture::held(send, label, deadline)
    }
}

/// The worker's newest endpoints once they name `to` as the primary of `(cluster, shard)`
/// (the discovery thread released the hold after publishing them; the worker builds them
/// soon after). Looks every millisecond, for at most a second.
async fn newest(
    current: Arc<super::Endpoints>,
    cluster: usize,
    shard: usize,
    primary: usize,
    to: Option<SocketAddr>,
) -> Arc<super::Endpoints> {
    let give_up = Instant::now() + Duration::from_secs(1);
    loop {
        let l = super::latest().unwrap_or_else(|| current.clone());
        let named =
            (l.get(cluster, shard, primary)).is_some_and(|h| Some(h.config().address) == to);
        if to.is_none() || named || Instant::now() >= give_up {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hold_ends_when_released_or_at_its_bound() {
        let h = Arc::new(Hold::default());
        assert!(!h.is_held());
        assert!(!h.start(), "a zero bound never holds");
        h.set_bound(Duration::from_secs(5));
        assert!(h.start());
        assert!(!h.start(), "one hold at a time");
        assert!(h.is_held());
        let to: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        let waiter = tokio::spawn({
            let h = h.clone();
            async move { h.wait().await }
        });
        tokio::task::yield_now().await;
        h.release(Some(to));
        assert_eq!(waiter.await.unwrap(), Some(to));
        assert!(!h.is_held() && !h.on());
        assert_eq!(h.holds.load(Ordering::Relaxed), 1);
        // A bound that passes ends the wait, to the primary known (none named).
        h.set_bound(Duration::from_millis(20));
        assert!(h.start());
        assert_eq!(h.wait().await, None);
        assert!(!h.is_held() && h.on(), "passed, not released yet");
    }
}

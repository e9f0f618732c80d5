//! Dedicated connections: one holder (a transaction, a blocking command, WAIT) at a time.

use super::*;

/// Why a command on a dedicated connection that broke earlier fails.
pub(super) const DEDICATED_BROKE: &str = "the connection broke before this command was sent";

/// Decrements the count of open dedicated connections when their task ends.
#[derive(Debug)]
pub(super) struct OpenGuard(pub(super) Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection one session holds for a transaction (`WATCH` ... `EXEC`): its commands run
/// on it alone, in order. It never reconnects: if it breaks or a reply is late, it is closed
/// (which discards a `MULTI` in progress on Redis) and every later command on it fails.
#[derive(Debug)]
pub(crate) struct Dedicated {
    pub(super) tx: queue::Sender<UpstreamRequest>,
    pub(super) handle: EndpointHandle,
    pub(super) flavor: Flavor,
}

impl Dedicated {
    /// Queues `args` and returns the reply's future.
    pub(crate) fn send(&self, args: Vec<Bytes>, deadline: Instant) -> UpstreamFuture {
        let i = &self.handle.inner;
        crate::stats::bump(&i.requests, 1);
        if let Some(e) = self.handle.failing_over() {
            i.stats.count(error::kind(&e));
            return UpstreamFuture::failed(e, i.cfg.label.clone(), deadline);
        }
        if self.tx.is_closed() {
            // The connection broke (it is never reopened under a transaction): a lost
            // connection, not an endpoint that left the configuration (`Closed`).
            let e = UpstreamError::ConnectionLost(DEDICATED_BROKE.into());
            i.stats.count(error::kind(&e));
            return UpstreamFuture::failed(e, i.cfg.label.clone(), deadline);
        }
        send_on(
            &self.tx,
            args,
            None,
            deadline,
            i.cfg.label.clone(),
            &i.stats,
            i.cfg.max_queue,
            (None, None),
        )
    }

    /// Puts the connection back in the idle pool at once: for a holder whose every request
    /// was answered by Redis (not by respway: a timeout or a lost connection ends the
    /// connection's task), so nothing is in flight and no state is left on it.
    pub(crate) fn give_back(self) {
        if self.tx.is_closed() {
            return;
        }
        if let Some(pools) = self.handle.pools(self.flavor) {
            pools
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.tx);
        }
    }

    /// Ends the transaction: sends `cleanup` (e.g. `DISCARD`, `UNWATCH` for a client that
    /// left mid-transaction; nothing after `EXEC`), then a `PING`; once the `PING` is
    /// answered the connection is idle again and goes back to the pool. Answers are awaited
    /// by a task of its own, so the session does not wait.
    pub(crate) fn release(self, cleanup: &[&'static [u8]], timeout: Duration) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let deadline = Instant::now() + timeout;
        let futs: Vec<UpstreamFuture> = cleanup
            .iter()
            .chain(std::iter::once(&&b"PING"[..]))
            .map(|c| self.send(vec![Bytes::from_static(c)], deadline))
            .collect();
        tokio::spawn(async move {
            // Errors of the cleanup commands themselves are expected (`DISCARD` without
            // `MULTI`); an error of the proxy's own (connection lost, timeout) is not.
            let mut clean = true;
            let mut last = Bytes::new();
            for f in futs {
                match f.await {
                    Ok(r) => last = r,
                    Err(_) => clean = false,
                }
            }
            clean &= &last[..] == b"+PONG\r\n";
            if clean {
                self.give_back();
            }
        });
    }
}

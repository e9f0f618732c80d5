//! Time in tests: waiting on a condition with a deadline instead of sleeping a fixed time, and
//! wall-clock bounds stretched by one slack factor.
//!
//! A fixed sleep "for the server to start" or "for the push to arrive" is either too long (the
//! suite waits for nothing) or too short on a loaded machine (the test fails for nothing);
//! [`wait_until`] returns as soon as the state is there and fails, naming it, only when it never
//! comes. A test that sleeps to let time pass on purpose (to show that something does *not*
//! happen, or to pace a load) keeps its sleep, with a comment saying so.
//!
//! An assertion that something took *less* than a bound (a failover seen within 1.5 s, an
//! invalidation within 1 s) measures the machine as much as the code: CI runs the whole suite
//! on 2 cores, many tests at once. Such bounds are written as `slack(bound)`: the bound the
//! code is meant to meet, times [`slack_factor`] (3 unless `RESPWAY_TEST_SLACK` says otherwise).
//! Bounds the other way (something took *at least* a time) are not stretched: a loaded machine
//! only makes those later.
//!
//! A test that runs a load through a fault ("load before the failover, and after it") waits
//! for the load to have done its work, not for a time: its clients count what they do in a
//! [`Progress`], and the test waits until every client has done so much more
//! ([`Progress::wait_each`]), which a loaded machine only makes take longer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How often [`wait_until`] asks.
const POLL: Duration = Duration::from_millis(10);

/// The factor timed upper bounds of the tests are multiplied by ([`slack`]): 3, or the value
/// of the environment variable `RESPWAY_TEST_SLACK` (a number of at least 1, read once per
/// test process: `RESPWAY_TEST_SLACK=1` for the bare bounds on an idle machine, more on a
/// slow or crowded one). Panics on a value that is not such a number, rather than testing with
/// a bound nobody chose.
pub fn slack_factor() -> f64 {
    static FACTOR: OnceLock<f64> = OnceLock::new();
    *FACTOR.get_or_init(|| match std::env::var("RESPWAY_TEST_SLACK") {
        Err(_) => 3.0,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && f >= 1.0 => f,
            _ => panic!("RESPWAY_TEST_SLACK={v:?}: a number of at least 1 is wanted"),
        },
    })
}

/// `bound` times [`slack_factor`]: what a timed assertion compares an elapsed time with, so
/// the bound the code must meet is written once, as is, and a loaded machine does not fail it.
pub fn slack(bound: Duration) -> Duration {
    bound.mul_f64(slack_factor())
}

/// Polls `cond` (every 10 ms) until it is true and returns how long that took; panics with
/// `what` (what was awaited) once `timeout` has passed without it. The timeout is how long a
/// test gives up after, not a bound it asserts: make it generous (it is not stretched by
/// [`slack`]).
#[track_caller]
pub fn wait_until(timeout: Duration, what: &str, cond: impl FnMut() -> bool) -> Duration {
    match poll_until(timeout, cond) {
        Some(took) => took,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Polls `cond` (every 10 ms) until it is true: how long that took, or `None` once `timeout`
/// has passed without it (for a test that reports the failure itself).
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// What each client of a load has done so far (round trips, commands: the load's unit), shared
/// between the clients' threads and the test, so the test waits until the load has done
/// something instead of sleeping while it runs.
#[derive(Clone)]
pub struct Progress {
    clients: Arc<[ClientProgress]>,
}

#[derive(Default)]
struct ClientProgress {
    done: AtomicU64,
    ended: AtomicBool,
}

/// One client's count in a [`Progress`]: moved into the client's thread, it marks the client
/// ended when dropped (the thread returned or panicked), so a wait on the load fails at once
/// instead of at its timeout.
pub struct ClientCounter {
    clients: Arc<[ClientProgress]>,
    i: usize,
}

impl Progress {
    /// The progress of `clients` clients, none started.
    pub fn new(clients: usize) -> Progress {
        Progress {
            clients: (0..clients).map(|_| ClientProgress::default()).collect(),
        }
    }

    /// Client `i`'s counter, for its thread (one per client).
    pub fn counter(&self, i: usize) -> ClientCounter {
        assert!(
            i < self.clients.len(),
            "client {i} of {}",
            self.clients.len()
        );
        ClientCounter {
            clients: self.clients.clone(),
            i,
        }
    }

    /// How many clients it counts for.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// What each client has done so far.
    pub fn done(&self) -> Vec<u64> {
        self.clients
            .iter()
            .map(|c| c.done.load(Ordering::Acquire))
            .collect()
    }

    /// Waits until every client has done `n` more than when this is called (polled every
    /// 10 ms) and returns how long that took. Panics with `what` (what was awaited) once
    /// `timeout` has passed without it, or as soon as a client that has not done it ended
    /// (its thread returned or panicked: its join says why). The timeout is how long the
    /// test gives up after, not a bound it asserts: make it generous.
    #[track_caller]
    pub fn wait_each(&self, n: u64, timeout: Duration, what: &str) -> Duration {
        let want: Vec<u64> = self.done().iter().map(|d| d + n).collect();
        let mut short = Vec::new();
        let took = poll_until(timeout, || {
            short = self
                .clients
                .iter()
                .zip(&want)
                .enumerate()
                .filter(|(_, (c, w))| c.done.load(Ordering::Acquire) < **w)
                .map(|(i, (c, _))| (i, c.ended.load(Ordering::Acquire)))
                .collect();
            short.is_empty() || short.iter().any(|&(_, ended)| ended)
        });
        let counts = self.done();
        match (took, short.iter().find(|&&(_, ended)| ended)) {
            (Some(took), None) => took,
            (_, Some((i, _))) => panic!(
                "client {i} of the load ended while waiting for {what} (done: {counts:?}, \
                 wanted {want:?}; its thread's join says why)"
            ),
            (None, None) => panic!(
                "timed out after {timeout:?} waiting for {what} (done: {counts:?}, wanted \
                 {want:?})"
            ),
        }
    }
}

impl ClientCounter {
    /// One more done.
    pub fn tick(&self) {
        self.add(1);
    }

    /// `n` more done.
    pub fn add(&self, n: u64) {
        self.clients[self.i].done.fetch_add(n, Ordering::AcqRel);
    }
}

impl Drop for ClientCounter {
    fn drop(&mut self) {
        self.clients[self.i].ended.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_return_when_the_condition_holds_and_fail_naming_it() {
        let start = Instant::now();
        let mut n = 0;
        wait_until(Duration::from_secs(5), "three polls", || {
            n += 1;
            n == 3
        });
        assert_eq!(n, 3);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(poll_until(Duration::from_millis(30), || false), None);
        let failed = std::panic::catch_unwind(|| {
            wait_until(Duration::from_millis(30), "nothing", || false);
        })
        .expect_err("a timeout panics");
        let text = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("waiting for nothing"), "{text}");
    }

    #[test]
    fn progress_waits_for_every_client_and_fails_when_one_ends() {
        let p = Progress::new(2);
        let (a, b) = (p.counter(0), p.counter(1));
        a.add(5);
        b.add(7);
        let ticking = std::thread::spawn(move || {
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(5));
                a.tick();
                b.tick();
            }
            (a, b)
        });
        p.wait_each(3, Duration::from_secs(5), "three more each");
        assert!(p.done()[0] >= 8 && p.done()[1] >= 10, "{:?}", p.done());
        let (a, b) = ticking.join().unwrap();
        assert_eq!(p.done(), [8, 10]);
        let failed = std::panic::catch_unwind(|| {
            p.wait_each(1, Duration::from_millis(30), "one more each");
        })
        .expect_err("no client moved");
        let text = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            text.contains("timed out") && text.contains("one more each"),
            "{text}"
        );
        b.tick();
        drop(a);
        let started = Instant::now();
        let failed = std::panic::catch_unwind(|| {
            p.wait_each(1, Duration::from_secs(30), "one more each");
        })
        .expect_err("client 0 ended");
        let text = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(text.contains("client 0 of the load ended"), "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "failed at once"
        );
        drop(b);
    }

    #[test]
    fn slack_stretches_bounds_by_at_least_one() {
        assert!(slack_factor() >= 1.0);
        assert_eq!(
            slack(Duration::from_secs(2)),
            Duration::from_secs(2).mul_f64(slack_factor())
        );
    }
}

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

use std::sync::OnceLock;
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
    fn slack_stretches_bounds_by_at_least_one() {
        assert!(slack_factor() >= 1.0);
        assert_eq!(
            slack(Duration::from_secs(2)),
            Duration::from_secs(2).mul_f64(slack_factor())
        );
    }
}

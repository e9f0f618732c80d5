//! Measurements: latency histograms (hdrhistogram, microseconds), errors by kind and a
//! per-interval timeline, recorded by the drivers and summed into a [`RunSummary`].
//!
//! Each driver thread owns one [`Recorder`] (no sharing on the hot path); they are merged
//! when the run ends.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Most distinct error kinds kept; further ones are counted under `other`.
const MAX_ERROR_KINDS: usize = 32;

/// Error kind for requests that got no reply before the driver gave up.
pub const ERR_TIMEOUT: &str = "timeout (no reply)";
/// Error kind for requests lost with their connection (closed, reset, refused).
pub const ERR_CONNECTION: &str = "connection";

fn histogram() -> Histogram<u64> {
    // Auto-resizing, 3 significant figures: grows to the largest latency seen.
    Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant figures are valid"))
}

/// One interval of the timeline.
#[derive(Debug, Clone)]
pub struct Interval {
    /// Replies (including error replies) received in the interval.
    pub replies: u64,
    /// Error replies and lost requests in the interval.
    pub errors: u64,
    /// Latencies of the replies received in the interval, µs.
    pub hist: Histogram<u64>,
}

/// What one driver thread measured.
#[derive(Debug, Clone)]
pub struct Recorder {
    start: Instant,
    interval: Duration,
    /// Latency of every reply, µs (for open loop: from the intended send time).
    pub total: Histogram<u64>,
    /// Open loop only: latency from the actual send time, µs (what a closed-loop tool would
    /// report; the gap to `total` is the queueing that coordinated omission hides).
    pub service: Option<Histogram<u64>>,
    /// Latency per request kind, µs.
    pub by_kind: Vec<Option<Histogram<u64>>>,
    /// Errors by kind: the error reply's text (`ERR unknown command ...`), or
    /// [`ERR_TIMEOUT`] / [`ERR_CONNECTION`].
    pub errors: BTreeMap<String, u64>,
    /// Replies received (including error replies).
    pub replies: u64,
    /// Requests written.
    pub sent: u64,
    /// The timeline, one entry per `interval` since `start`.
    pub intervals: Vec<Interval>,
    /// When the first request was sent and the last reply received.
    pub first_send: Option<Instant>,
    /// See `first_send`.
    pub last_reply: Option<Instant>,
}

impl Recorder {
    /// A recorder whose timeline starts at `start` with one entry per `interval`.
    pub fn new(start: Instant, interval: Duration, open_loop: bool) -> Self {
        Recorder {
            start,
            interval: interval.max(Duration::from_millis(10)),
            total: histogram(),
            service: open_loop.then(histogram),
            by_kind: Vec::new(),
            errors: BTreeMap::new(),
            replies: 0,
            sent: 0,
            intervals: Vec::new(),
            first_send: None,
            last_reply: None,
        }
    }

    /// The timeline slot for `now`; call once per read, then [`Recorder::record`] each reply.
    #[inline]
    pub fn slot(&mut self, now: Instant) -> usize {
        let i = (now.saturating_duration_since(self.start).as_nanos()
            / self.interval.as_nanos().max(1)) as usize;
        while self.intervals.len() <= i {
            self.intervals.push(Interval {
                replies: 0,
                errors: 0,
                hist: histogram(),
            });
        }
        i
    }

    /// Records that `n` requests were written at `at`.
    #[inline]
    pub fn sent(&mut self, n: u64, at: Instant) {
        self.sent += n;
        if self.first_send.is_none() {
            self.first_send = Some(at);
        }
    }

    /// Records one reply: its kind, latency in µs and the reply bytes (only the first line is
    /// looked at, and only when it is an error).
    #[inline]
    pub fn record(&mut self, slot: usize, kind: u16, latency_us: u64, reply: &[u8]) {
        self.replies += 1;
        self.total.record(latency_us).ok();
        let iv = &mut self.intervals[slot];
        iv.replies += 1;
        iv.hist.record(latency_us).ok();
        let k = usize::from(kind);
        if self.by_kind.len() <= k {
            self.by_kind.resize(k + 1, None);
        }
        self.by_kind[k]
            .get_or_insert_with(histogram)
            .record(latency_us)
            .ok();
        if reply.first() == Some(&b'-') {
            self.intervals[slot].errors += 1;
            let end = reply
                .iter()
                .position(|&b| b == b'\r')
                .unwrap_or(reply.len());
            let text = String::from_utf8_lossy(&reply[1..end.min(61)]).into_owned();
            self.error(&text, 1);
        }
    }

    /// Records the service time (open loop) of the last reply, µs.
    #[inline]
    pub fn record_service(&mut self, latency_us: u64) {
        if let Some(h) = &mut self.service {
            h.record(latency_us).ok();
        }
    }

    /// Marks the time of the last reply.
    #[inline]
    pub fn replied_at(&mut self, now: Instant) {
        self.last_reply = Some(now);
    }

    /// Counts `n` errors of a kind.
    pub fn error(&mut self, kind: &str, n: u64) {
        if n == 0 {
            return;
        }
        let key = if self.errors.contains_key(kind) || self.errors.len() < MAX_ERROR_KINDS {
            kind.to_string()
        } else {
            "other".to_string()
        };
        *self.errors.entry(key).or_default() += n;
    }

    /// Adds another recorder's measurements (same start and interval) to this one.
    pub fn merge(&mut self, o: &Recorder) {
        let _ = self.total.add(&o.total);
        if let (Some(a), Some(b)) = (&mut self.service, &o.service) {
            let _ = a.add(b);
        }
        if self.by_kind.len() < o.by_kind.len() {
            self.by_kind.resize(o.by_kind.len(), None);
        }
        for (i, h) in o.by_kind.iter().enumerate() {
            if let Some(h) = h {
                let _ = self.by_kind[i].get_or_insert_with(histogram).add(h);
            }
        }
        for (k, n) in &o.errors {
            self.error(k, *n);
        }
        self.replies += o.replies;
        self.sent += o.sent;
        if let Some(last) = o.intervals.len().checked_sub(1) {
            let _ = self.slot(self.start + self.interval * (last as u32));
        }
        for (i, iv) in o.intervals.iter().enumerate() {
            let me = &mut self.intervals[i];
            me.replies += iv.replies;
            me.errors += iv.errors;
            let _ = me.hist.add(&iv.hist);
        }
        self.first_send = match (self.first_send, o.first_send) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_reply = self.last_reply.max(o.last_reply);
    }

    /// Sums it all up. `names` gives the kind names.
    pub fn summary(&self, names: &[String]) -> RunSummary {
        let elapsed = match (self.first_send, self.last_reply) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        };
        let error_total: u64 = self.errors.values().sum();
        let lost = self.errors.get(ERR_TIMEOUT).copied().unwrap_or(0)
            + self.errors.get(ERR_CONNECTION).copied().unwrap_or(0);
        let error_replies = error_total - lost;
        let secs = self.interval.as_secs_f64();
        // The last interval usually ends early (when the last reply came): rate it over the
        // time it covered, and leave it out when that is under a fifth of an interval.
        let end_s = self
            .last_reply
            .map(|t| t.saturating_duration_since(self.start).as_secs_f64());
        let n = self.intervals.len();
        let timeline = self
            .intervals
            .iter()
            .enumerate()
            .filter_map(|(i, iv)| {
                let from = i as f64 * secs;
                let to = match end_s {
                    Some(e) if i + 1 == n && e < from + secs => e,
                    _ => from + secs,
                };
                if i + 1 == n && n > 1 && to - from < secs / 5.0 {
                    return None;
                }
                Some(TimePoint {
                    t_s: to,
                    rps: iv.replies as f64 / (to - from).max(1e-9),
                    p99_us: (iv.replies > 0).then(|| iv.hist.value_at_quantile(0.99)),
                    errors: iv.errors,
                })
            })
            .collect();
        let by_command = self
            .by_kind
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                let h = h.as_ref()?;
                let name = names.get(i).cloned().unwrap_or_else(|| format!("kind{i}"));
                Some((
                    name,
                    CommandSummary {
                        count: h.len(),
                        latency: Latency::of(h),
                    },
                ))
            })
            .collect();
        RunSummary {
            sent: self.sent,
            replies: self.replies,
            ok: self.replies.saturating_sub(error_replies),
            errors: self.errors.clone(),
            error_total,
            elapsed_s: elapsed,
            throughput: if elapsed > 0.0 {
                self.replies as f64 / elapsed
            } else {
                0.0
            },
            latency: Latency::of(&self.total),
            service_latency: self.service.as_ref().map(Latency::of),
            percentiles: percentile_curve(&self.total),
            by_command,
            interval_s: secs,
            timeline,
        }
    }
}

/// Latency percentiles, in µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl Latency {
    /// The percentiles of a histogram (zeros when empty).
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            p9999: h.value_at_quantile(0.9999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

/// The latency percentile curve: `(percentile, µs)` at percentiles `100·(1 − 10^−x)` for
/// `x` = 0, 0.1, …, 5 and at 100.
pub fn percentile_curve(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut v: Vec<(f64, u64)> = (0..=50)
        .map(|i| {
            let q = 1.0 - 10f64.powf(-(i as f64) / 10.0);
            (q * 100.0, h.value_at_quantile(q))
        })
        .collect();
    v.push((100.0, h.max()));
    v
}

/// One command kind's count and latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandSummary {
    /// Replies.
    pub count: u64,
    /// Latency, µs.
    pub latency: Latency,
}

/// One point of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimePoint {
    /// End of the interval, seconds since the run started.
    pub t_s: f64,
    /// Replies per second in the interval.
    pub rps: f64,
    /// 99th percentile latency of the interval's replies, µs (none without replies).
    pub p99_us: Option<u64>,
    /// Errors in the interval.
    pub errors: u64,
}

/// The result of one run against one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Requests written.
    pub sent: u64,
    /// Replies received (including error replies).
    pub replies: u64,
    /// Replies that were not errors.
    pub ok: u64,
    /// Errors by kind (error replies by their text, lost requests as timeout / connection).
    pub errors: BTreeMap<String, u64>,
    /// Sum of `errors`.
    pub error_total: u64,
    /// From the first request written to the last reply, seconds.
    pub elapsed_s: f64,
    /// Replies per second over `elapsed_s`.
    pub throughput: f64,
    /// Latency of all replies, µs (open loop: from the intended send time).
    pub latency: Latency,
    /// Open loop: latency from the actual send time, µs.
    pub service_latency: Option<Latency>,
    /// The percentile curve of `latency`.
    pub percentiles: Vec<(f64, u64)>,
    /// Per command.
    pub by_command: BTreeMap<String, CommandSummary>,
    /// Timeline interval, seconds.
    pub interval_s: f64,
    /// Throughput, p99 and errors per interval.
    pub timeline: Vec<TimePoint>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_merge_and_summarise() {
        let start = Instant::now();
        let names = vec!["GET".to_string(), "SET".to_string()];
        let mut a = Recorder::new(start, Duration::from_millis(100), false);
        let mut b = Recorder::new(start, Duration::from_millis(100), false);
        a.sent(3, start);
        let s = a.slot(start);
        a.record(s, 0, 100, b"$1\r\nx\r\n");
        a.record(s, 1, 200, b"-ERR boom\r\n");
        a.error(ERR_TIMEOUT, 1);
        let s = b.slot(start + Duration::from_millis(250));
        b.sent(1, start);
        b.record(s, 0, 300, b"+OK\r\n");
        b.replied_at(start + Duration::from_secs(1));
        a.merge(&b);
        let sum = a.summary(&names);
        assert_eq!(sum.sent, 4);
        assert_eq!(sum.replies, 3);
        assert_eq!(sum.ok, 2);
        assert_eq!(sum.error_total, 2);
        assert_eq!(sum.errors["ERR boom"], 1);
        assert_eq!(sum.errors[ERR_TIMEOUT], 1);
        assert_eq!(sum.by_command["GET"].count, 2);
        assert_eq!(sum.timeline.len(), 3);
        assert_eq!(sum.timeline[0].rps, 20.0);
        assert_eq!(sum.timeline[1].p99_us, None);
        assert_eq!(sum.timeline[2].errors, 0);
        assert!((sum.throughput - 3.0).abs() < 1e-9);
        assert_eq!(sum.latency.max, 300);
        assert_eq!(sum.percentiles.last(), Some(&(100.0, 300)));
    }
}

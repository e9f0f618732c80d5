//! `GET /metrics`: the Prometheus text exposition (format 0.0.4) of the admin endpoint,
//! written from the table of metric families (`stats::FAMILIES`): what one scrape reads is
//! gathered once (`stats::Scrape`), on the admin thread, then each family writes its
//! `# HELP` and `# TYPE` lines and its series.

use std::fmt::Write as _;

use super::State;
use crate::stats::{
    bucket_upper_us, CmdTotals, MetricFamily, Read, Scrape, Value, BUCKETS, ENDPOINT_LABELS,
    FAMILIES,
};

/// A label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition.
pub(super) fn metrics(state: &State) -> String {
    let changes = state.hooks.config_events.as_ref().map(|e| e.counts());
    let snapshot = state.config.current();
    let sentinels = state.config.discovery().statuses(&snapshot.config);
    let peers = state.config.peers().statuses(&snapshot.config);
    let scrape = Scrape::gather(
        &state.registry,
        snapshot,
        state.workers,
        changes,
        sentinels,
        peers,
    );
    let bounds = latency_bounds();
    let mut o = String::with_capacity(16 * 1024);
    for f in FAMILIES {
        family(&mut o, f, &scrape, &bounds);
    }
    o
}

/// Writes one family: its `# HELP` and `# TYPE` lines and its series (nothing when its reader
/// leaves it out).
fn family(o: &mut String, f: &MetricFamily, s: &Scrape, bounds: &[usize]) {
    let mut body = String::new();
    let mut put = |labels: &[(&str, &str)], v: Value<'_>| {
        debug_assert!(
            labels.iter().all(|(k, _)| f.labels.contains(k)),
            "{}: {labels:?} is not in the table's labels",
            f.name
        );
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
            .collect();
        sample(&mut body, f.name, &labels.join(","), v, bounds);
    };
    let present = match f.read {
        Read::Listener(get) => {
            for l in &s.listeners {
                put(&[("listener", &l.name)], Value::Int(get(&l.totals)));
            }
            true
        }
        Read::Process(get) => {
            put(&[], Value::Int(get(&s.process)));
            true
        }
        Read::Endpoint(get) => {
            for (labels, v) in &s.endpoints {
                if let Some(value) = get(v) {
                    let pairs: Vec<(&str, &str)> = ENDPOINT_LABELS
                        .iter()
                        .copied()
                        .zip(labels.iter().map(String::as_str))
                        .collect();
                    put(&pairs, value);
                }
            }
            true
        }
        Read::Series(read) => read(s, &mut put),
    };
    if present {
        let _ = writeln!(
            o,
            "# HELP {} {}\n# TYPE {} {}",
            f.name,
            f.help,
            f.name,
            f.kind.name()
        );
        o.push_str(&body);
    }
}

/// Writes one series of `name` with `labels` (already written as `k="v",...`).
fn sample(o: &mut String, name: &str, labels: &str, v: Value<'_>, bounds: &[usize]) {
    let braced = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    match v {
        Value::Int(n) => {
            let _ = writeln!(o, "{name}{braced} {n}");
        }
        Value::Float(x) => {
            let _ = writeln!(o, "{name}{braced} {x}");
        }
        Value::Latency(t) => histogram(o, name, labels, t, bounds),
        Value::Depth(buckets, sum) => depth(o, name, labels, buckets, sum),
    }
}

/// The latency histograms' buckets: from 16 µs to about 2 s, four per power of two.
fn latency_bounds() -> Vec<usize> {
    (0..BUCKETS - 1)
        .filter(|&i| (15..=2_200_000).contains(&bucket_upper_us(i)))
        .collect()
}

/// Writes one latency histogram series: cumulative `_bucket`s at `bounds` (in seconds),
/// `+Inf`, `_sum`, `_count`.
fn histogram(o: &mut String, name: &str, labels: &str, t: &CmdTotals, bounds: &[usize]) {
    let mut cum = 0;
    let mut next = 0;
    for &i in bounds {
        while next <= i {
            cum += t.hist[next];
            next += 1;
        }
        let le = (bucket_upper_us(i) + 1) as f64 / 1e6;
        let _ = writeln!(o, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
    }
    let total: u64 = t.hist.iter().sum();
    let _ = writeln!(o, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
    let _ = writeln!(o, "{name}_sum{{{labels}}} {}", t.usec as f64 / 1e6);
    let _ = writeln!(o, "{name}_count{{{labels}}} {total}");
}

/// Writes one pipeline-depth histogram series: bucket `i` holds reads of up to `2^i`
/// commands, the last every deeper one; the sum is the commands.
fn depth(o: &mut String, name: &str, labels: &str, buckets: &[u64], sum: u64) {
    let mut cum = 0;
    for (i, n) in buckets.iter().enumerate() {
        cum += n;
        let le = if i + 1 == buckets.len() {
            "+Inf".to_string()
        } else {
            (1u64 << i).to_string()
        };
        let _ = writeln!(o, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
    }
    let _ = writeln!(o, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(o, "{name}_count{{{labels}}} {cum}");
}

//! # respway-perf
//!
//! respway's traffic harness: it generates, records and replays Redis traffic and measures
//! it against respway, a plain redis-server and nutcracker (twemproxy) side by side. Its
//! figures, and those of the scripts in `perf/bench/`, are in `perf/RESULTS.md`.
//!
//! The modules, grouped by concern:
//!
//! Traffic
//! - [`workload`]: generated traffic from a described model (keyspace, uniform/zipf keys,
//!   hot keys under a prefix, command mix, value sizes), deterministic for a seed, encoded
//!   ahead of time into per-connection [`workload::RequestPool`]s.
//! - [`trace`], [`quote`], [`record`]: recorded traffic — `redis-cli MONITOR` captures and
//!   respway's own trace format, and live recording through `MONITOR`.
//! - [`replay`]: a trace as per-connection pools plus a schedule (recorded timing, scaled,
//!   or as fast as possible).
//!
//! Driving it
//! - [`closed`] and [`open`]: the drivers. Closed loop: N connections × pipeline depth, max
//!   throughput. Open loop: a fixed schedule, latency from the intended send time, so
//!   coordinated omission does not hide stalls.
//! - [`sink`]: a RESP null server that answers every command at once, to measure a client's
//!   own ceiling.
//!
//! Comparing targets
//! - [`topology`]: starts (and always stops) local redis-server shards, replicas,
//!   nutcracker and respway on free loopback ports; CPU and `INFO commandstats` probes.
//! - [`xds_admin`]: the client of a `respway-xds` management server's admin API
//!   (`GET /status`, `POST /apply`), for targets fed over xDS and pushed to during a run.
//! - [`scenario`] and [`compare`]: a scenario file (workload + load + topology) run against
//!   every target, interleaved over rounds.
//!
//! Results
//! - [`stats`]: hdrhistogram latencies (µs), errors by kind, a timeline.
//! - [`report`] and [`plot`]: the table on the terminal or as markdown, the JSON result and
//!   the SVG plots.
//!
//! Everything is bounded in time and request count and targets loopback addresses only
//! ([`check_loopback`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub mod closed;
pub mod compare;
pub mod open;
pub mod plot;
pub mod quote;
pub mod record;
pub mod replay;
pub mod report;
pub mod scenario;
pub mod sink;
pub mod stats;
pub mod topology;
pub mod trace;
pub mod workload;
pub mod xds_admin;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario, topology, workload or argument is invalid (every problem, one per line).
    #[error("{0}")]
    Config(String),
    /// A capture file could not be read.
    #[error("{0}")]
    Input(String),
    /// A process of the topology failed to start or died.
    #[error("{0}")]
    Process(String),
    /// A run could not be carried out (connection refused, protocol error, ...).
    #[error("{0}")]
    Run(String),
    /// An I/O error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Shared run control: a request counter for progress display and a stop flag (Ctrl-C).
#[derive(Debug, Clone, Default)]
pub struct Control {
    /// Requests completed so far in the current run (updated per batch).
    pub done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Control {
    /// A fresh control.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every driver to stop at its next batch.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether a stop was asked for.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Refuses any target that is not a loopback address: the harness only ever loads this
/// machine.
pub fn check_loopback(addr: SocketAddr) -> Result<(), Error> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{addr} is not a loopback address: respway-perf only targets 127.0.0.0/8 or ::1"
        )))
    }
}

/// Parses a duration: an integer or decimal and a unit (`us`, `ms`, `s`, `m`, `h`); a bare
/// number is seconds. `250ms`, `10s`, `1.5s`, `2m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("duration {s:?}: expected a number and a unit, e.g. 10s or 250ms"))?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "m" => 60.0,
        "h" => 3600.0,
        u => {
            return Err(format!(
                "duration {s:?}: unknown unit {u:?} (us, ms, s, m, h)"
            ))
        }
    };
    let secs = n * scale;
    if !secs.is_finite() || !(0.0..=1e7).contains(&secs) {
        return Err(format!("duration {s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_millis() == 0 && ms > 0 {
        format!("{}s", d.as_secs())
    } else if d.as_micros().is_multiple_of(1000) {
        format!("{ms}ms")
    } else {
        format!("{}us", d.as_micros())
    }
}

/// Serde helpers for durations written as `10s`, `250ms`.
pub mod serde_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `10s` / `250ms`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    /// Reads `10s` / `250ms` / a number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Num(f64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Num(n) if n >= 0.0 && n.is_finite() => Ok(Duration::from_secs_f64(n)),
            Repr::Num(n) => Err(serde::de::Error::custom(format!(
                "duration {n} is negative"
            ))),
            Repr::Text(t) => super::parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("s").is_err());
        assert_eq!(format_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn loopback_only() {
        assert!(check_loopback("127.0.0.1:1".parse().unwrap()).is_ok());
        assert!(check_loopback("[::1]:1".parse().unwrap()).is_ok());
        assert!(check_loopback("10.0.0.1:6379".parse().unwrap()).is_err());
    }
}

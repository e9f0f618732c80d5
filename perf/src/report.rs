//! Results: the JSON shapes written to disk, and the tables printed on the terminal (plain
//! text) or pasted into `perf/RESULTS-archive.md` (markdown).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::scenario::{Load, Mode};
use crate::stats::{RunSummary, TimePoint};
use crate::workload::Workload;

/// The machine a comparison ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Cores.
    pub nproc: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// 1-minute load average before the first run.
    pub load_before: Option<f64>,
    /// 1-minute load average after the last run.
    pub load_after: Option<f64>,
}

impl Machine {
    /// Reads the machine's description (load averages left empty).
    pub fn probe() -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            load_before: None,
            load_after: None,
        }
    }
}

/// A marker on the timeline plots (a config push).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// Seconds on the timeline.
    pub t_s: f64,
    /// What happened.
    pub label: String,
}

/// One configuration push to a `respway-xds` target during a measured run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushRecord {
    /// The target.
    pub target: String,
    /// The round, from 1.
    pub round: usize,
    /// What it changed (the push's label, else its fields).
    pub label: String,
    /// Seconds after the run started when the file was sent.
    pub at_s: f64,
    /// The management server's version after it (none when it failed).
    pub version: Option<u64>,
    /// From sending to the sidecar's ACK, ms (none when it failed or changed nothing).
    pub ack_ms: Option<f64>,
    /// Why it failed (refused, NACKed, not ACKed in time).
    pub error: Option<String>,
}

/// One measured run of one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundResult {
    /// Round number, from 1.
    pub round: usize,
    /// Replies per second.
    pub throughput: f64,
    /// p99 latency, µs.
    pub p99_us: u64,
    /// Replies.
    pub replies: u64,
    /// Errors of every kind.
    pub errors: u64,
    /// Seconds from the first request to the last reply.
    pub elapsed_s: f64,
    /// CPU seconds the proxy used during the run.
    pub proxy_cpu_s: Option<f64>,
    /// CPU seconds the redis-servers behind the target used during the run.
    pub server_cpu_s: Option<f64>,
    /// 1-minute load average before the run.
    pub load_before: Option<f64>,
    /// Cores used on average during the run by processes other than respway-perf and the
    /// topology it started (machine task time minus theirs): noise.
    pub other_cpu_cores: Option<f64>,
}

/// Everything measured for one target over all rounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetResult {
    /// Name in the report.
    pub name: String,
    /// `redis`, `nutcracker`, `respway`, `external`.
    pub kind: String,
    /// Where it listened.
    pub address: String,
    /// How it was started.
    pub command: String,
    /// Each measured run.
    pub rounds: Vec<RoundResult>,
    /// Median throughput over the rounds, replies/s.
    pub throughput: f64,
    /// Lowest round throughput.
    pub throughput_min: f64,
    /// Highest round throughput.
    pub throughput_max: f64,
    /// All rounds together (latency histograms merged; `timeline` is the rounds back to back).
    pub summary: RunSummary,
    /// Proxy CPU seconds per million replies, all rounds.
    pub proxy_cpu_s_per_m: Option<f64>,
    /// redis-servers' CPU seconds per million replies, all rounds.
    pub server_cpu_s_per_m: Option<f64>,
    /// Commands executed by each shard (primary + replicas) during the measured rounds.
    pub shard_commands: Vec<u64>,
    /// max / mean of `shard_commands` (1.00 = perfectly even).
    pub shard_balance: Option<f64>,
}

/// A whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareResult {
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub description: String,
    /// The workload.
    pub workload: Workload,
    /// The workload in one line.
    pub workload_summary: String,
    /// How it was driven.
    pub load: Load,
    /// Shards behind the proxies.
    pub shards: usize,
    /// Replicas per shard.
    pub replicas: usize,
    /// Measured rounds per target.
    pub rounds: usize,
    /// Keys written per target before measuring (0 = no preload).
    pub preloaded_keys: u64,
    /// Unix time of the start.
    pub started_unix: u64,
    /// The machine.
    pub machine: Machine,
    /// Per target, in the topology's order.
    pub targets: Vec<TargetResult>,
    /// Markers for the timeline plots.
    pub markers: Vec<Marker>,
    /// Configuration pushes made during the rounds (to `respway-xds` targets).
    #[serde(default)]
    pub pushes: Vec<PushRecord>,
    /// Anything that makes the figures less trustworthy (errors, load, ...).
    pub notes: Vec<String>,
}

/// Formats µs as milliseconds with three decimals (`0.052`).
pub fn ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}", a / b),
        _ => "–".into(),
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

impl CompareResult {
    fn baseline(&self, kind: &str) -> Option<f64> {
        self.targets
            .iter()
            .find(|t| t.kind == kind)
            .map(|t| t.throughput)
    }

    /// The comparison as rows of cells (header first).
    pub fn rows(&self) -> Vec<Vec<String>> {
        let redis = self.baseline("redis");
        let nut = self.baseline("nutcracker");
        let mut rows = vec![[
            "target",
            "req/s",
            "× redis",
            "× nutcracker",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "p99.9 ms",
            "p99.99 ms",
            "max ms",
            "errors",
            "proxy CPU-s/M",
            "redis CPU-s/M",
            "shard max/mean",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()];
        for t in &self.targets {
            let l = &t.summary.latency;
            rows.push(vec![
                t.name.clone(),
                format!("{:.0}", t.throughput),
                ratio(t.throughput, redis),
                ratio(t.throughput, nut),
                ms(l.p50),
                ms(l.p90),
                ms(l.p99),
                ms(l.p999),
                ms(l.p9999),
                ms(l.max),
                t.summary.error_total.to_string(),
                opt(t.proxy_cpu_s_per_m, 2),
                opt(t.server_cpu_s_per_m, 2),
                opt(t.shard_balance, 2),
            ]);
        }
        rows
    }

    /// Errors by kind, one line per target that had any.
    pub fn error_lines(&self) -> Vec<String> {
        self.targets
            .iter()
            .filter(|t| t.summary.error_total > 0)
            .map(|t| {
                let kinds: Vec<String> = t
                    .summary
                    .errors
                    .iter()
                    .map(|(k, n)| format!("{n} × {k:?}"))
                    .collect();
                format!("{}: {}", t.name, kinds.join(", "))
            })
            .collect()
    }

    /// A one-paragraph description of the run's conditions.
    pub fn conditions(&self) -> String {
        let l = &self.load;
        let mode = match l.mode {
            Mode::Closed => format!(
                "closed loop, {} connections × pipeline {}, {} driver thread(s)",
                l.connections, l.pipeline, l.threads
            ),
            Mode::Open => format!(
                "open loop, {:.0} req/s ({:?} arrivals) over {} connections",
                l.rate, l.arrival, l.connections
            ),
        };
        format!(
            "{mode}; {} per run, {} interleaved round(s) per target; {} shard(s) × {} replica(s); \
             workload: {}; preloaded keys: {}; machine: {} × {}, load {} → {}",
            crate::format_duration(l.duration),
            self.rounds,
            self.shards,
            self.replicas,
            self.workload_summary,
            self.preloaded_keys,
            self.machine.nproc,
            self.machine.cpu_model,
            opt(self.machine.load_before, 2),
            opt(self.machine.load_after, 2),
        )
    }

    /// The terminal table.
    pub fn text(&self) -> String {
        let rows = self.rows();
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut s = format!("{} — {}\n", self.scenario, self.conditions());
        for (i, r) in rows.iter().enumerate() {
            for (c, cell) in r.iter().enumerate() {
                let pad = widths[c] - cell.chars().count();
                if c == 0 {
                    let _ = write!(s, "{cell}{} ", " ".repeat(pad));
                } else {
                    let _ = write!(s, " {}{cell}", " ".repeat(pad));
                }
            }
            s.push('\n');
            if i == 0 {
                let total: usize = widths.iter().sum::<usize>() + widths.len() * 2;
                s.push_str(&"-".repeat(total));
                s.push('\n');
            }
        }
        for e in self.error_lines() {
            let _ = writeln!(s, "errors: {e}");
        }
        for p in self.push_lines() {
            let _ = writeln!(s, "push: {p}");
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }

    /// One line per configuration push: when, what, and how long to the sidecar's ACK.
    pub fn push_lines(&self) -> Vec<String> {
        self.pushes
            .iter()
            .map(|p| {
                let outcome = match (&p.error, p.version, p.ack_ms) {
                    (Some(e), _, _) => format!("FAILED: {e}"),
                    (None, Some(v), Some(ms)) => format!("version {v}, ACKed in {ms:.1} ms"),
                    (None, Some(v), None) => format!("version {v}, nothing changed"),
                    (None, None, _) => "no outcome".into(),
                };
                format!(
                    "{} round {} at {:.2} s: {} → {outcome}",
                    p.target, p.round, p.at_s, p.label
                )
            })
            .collect()
    }

    /// The markdown table (for `perf/RESULTS-archive.md`).
    pub fn markdown(&self) -> String {
        let rows = self.rows();
        let mut s = String::new();
        for (i, r) in rows.iter().enumerate() {
            let _ = writeln!(s, "| {} |", r.join(" | "));
            if i == 0 {
                let align: Vec<&str> = (0..r.len())
                    .map(|c| if c == 0 { "---" } else { "--:" })
                    .collect();
                let _ = writeln!(s, "|{}|", align.join("|"));
            }
        }
        s
    }
}

/// A single run's summary as text (for `run` and `replay`).
pub fn run_text(name: &str, s: &RunSummary) -> String {
    let l = &s.latency;
    let mut out = format!(
        "{name}: {} replies in {:.2} s = {:.0} req/s; errors {}\n\
         latency ms: p50 {} p90 {} p99 {} p99.9 {} p99.99 {} max {} mean {:.3}\n",
        s.replies,
        s.elapsed_s,
        s.throughput,
        s.error_total,
        ms(l.p50),
        ms(l.p90),
        ms(l.p99),
        ms(l.p999),
        ms(l.p9999),
        ms(l.max),
        l.mean / 1000.0
    );
    if let Some(sv) = &s.service_latency {
        let _ = writeln!(
            out,
            "from actual send (what a closed-loop tool would see) ms: p50 {} p99 {} p99.9 {} max {}",
            ms(sv.p50),
            ms(sv.p99),
            ms(sv.p999),
            ms(sv.max)
        );
    }
    for (k, n) in &s.errors {
        let _ = writeln!(out, "  error {n} × {k:?}");
    }
    if s.by_command.len() > 1 {
        for (name, c) in &s.by_command {
            let _ = writeln!(
                out,
                "  {name:<8} {:>10} replies  p50 {} p99 {} max {}",
                c.count,
                ms(c.latency.p50),
                ms(c.latency.p99),
                ms(c.latency.max)
            );
        }
    }
    out
}

/// Concatenates the rounds' timelines, each shifted to start where the previous ended.
pub fn concat_timelines(rounds: &[Vec<TimePoint>]) -> Vec<TimePoint> {
    let mut out = Vec::new();
    let mut offset = 0.0;
    for r in rounds {
        let mut last = 0.0;
        for p in r {
            out.push(TimePoint {
                t_s: p.t_s + offset,
                ..p.clone()
            });
            last = p.t_s;
        }
        offset += last;
    }
    out
}

/// Median of a non-empty list (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_timelines() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let p = |t| TimePoint {
            t_s: t,
            rps: 1.0,
            p99_us: None,
            errors: 0,
        };
        let c = concat_timelines(&[vec![p(1.0), p(2.0)], vec![p(1.0)]]);
        let ts: Vec<f64> = c.iter().map(|p| p.t_s).collect();
        assert_eq!(ts, vec![1.0, 2.0, 3.0]);
    }
}

//! The mover's lines read back: its progress, plan and summary lines, and the progress bar
//! (or plain line) shown from them.

use super::state::PlanFigures;

/// One `progress scanned=N sent=S kept=K absent=A failed=F big=B bytes=BYTES shard=I/N
/// elapsed_ms=MS` line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Keys scanned.
    pub scanned: u64,
    /// Keys sent in MIGRATEs that answered OK.
    pub sent: u64,
    /// Keys whose owner stays.
    pub kept: u64,
    /// Batches whose keys were gone.
    pub absent: u64,
    /// Batches that failed.
    pub failed: u64,
    /// Keys left out for their size.
    pub big: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// The shard being scanned, `I/N`.
    pub shard: String,
    /// Since the mover started.
    pub elapsed_ms: u64,
    /// Keys this run of the mover sent, in `elapsed_ms` (`sent` counts since the checkpoint
    /// began, runs before a kill included); `None` from a mover that does not say.
    pub run_sent: Option<u64>,
    /// The last line: every source shard walked (the keys the sidecars moved themselves were
    /// never the mover's to send, so `sent` may stay below the plan).
    pub done: bool,
}

/// `key=value` fields after `word`, by name.
fn fields<'a>(line: &'a str, word: &str) -> Option<Vec<(&'a str, &'a str)>> {
    let rest = line.strip_prefix(word)?.strip_prefix(' ')?;
    Some(
        rest.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .collect(),
    )
}

/// `name N` fields of a comma-separated line (`scanned 5, sent 3, ...`), by name.
fn counts(line: &str) -> Vec<(&str, u64)> {
    line.split(',')
        .filter_map(|part| {
            let mut words = part.split_whitespace();
            let name = words.next()?;
            let n = words.next()?.parse().ok()?;
            Some((name, n))
        })
        .collect()
}

fn get(c: &[(&str, u64)], name: &str) -> Option<u64> {
    c.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

impl Progress {
    /// Reads a progress line; `None` for any other line.
    pub fn parse(line: &str) -> Option<Progress> {
        let f = fields(line, "progress")?;
        let num = |k: &str| {
            f.iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0)
        };
        Some(Progress {
            scanned: num("scanned"),
            sent: num("sent"),
            kept: num("kept"),
            absent: num("absent"),
            failed: num("failed"),
            big: num("big"),
            bytes: num("bytes"),
            shard: f
                .iter()
                .find(|(n, _)| *n == "shard")
                .map(|(_, v)| (*v).to_string())
                .unwrap_or_default(),
            elapsed_ms: num("elapsed_ms"),
            run_sent: (f.iter())
                .find(|(n, _)| *n == "run_sent")
                .and_then(|(_, v)| v.parse().ok()),
            done: num("done") == 1,
        })
    }

    /// Keys sent per second by this run of the mover.
    pub fn rate(&self) -> u64 {
        let sent = self.run_sent.unwrap_or(self.sent);
        (sent * 1000).checked_div(self.elapsed_ms).unwrap_or(0)
    }

    /// Seconds left at the rate so far, when the plan says how many keys move.
    pub fn eta_s(&self, plan: Option<&PlanFigures>) -> Option<u64> {
        let plan = plan.filter(|p| p.keys > 0)?;
        if self.done {
            return Some(0);
        }
        let rate = self.rate();
        (rate > 0).then(|| plan.keys.saturating_sub(self.sent).div_ceil(rate))
    }

    /// The share of the plan's keys sent, in percent (at most 100; 100 once done).
    pub fn percent(&self, plan: Option<&PlanFigures>) -> Option<u64> {
        let plan = plan.filter(|p| p.keys > 0)?;
        if self.done {
            return Some(100);
        }
        Some((self.sent * 100 / plan.keys).min(100))
    }

    /// The figures after the bar: keys, bytes, rate, ETA, errors.
    fn figures(&self, plan: Option<&PlanFigures>) -> String {
        let keys = match plan.filter(|p| p.keys > 0) {
            Some(p) if self.done && self.sent < p.keys => format!(
                "{}/{} keys (the others moved by the sidecars, or gone)",
                thousands(self.sent),
                thousands(p.keys)
            ),
            Some(p) => format!("{}/{} keys", thousands(self.sent), thousands(p.keys)),
            None => format!("{} keys", thousands(self.sent)),
        };
        let eta = self
            .eta_s(plan)
            .map(|s| format!(", ETA {s} s"))
            .unwrap_or_default();
        format!(
            "{keys}, {}, {} keys/s{eta}, failed {}, shard {}",
            bytes(self.bytes),
            thousands(self.rate()),
            self.failed,
            if self.shard.is_empty() {
                "-"
            } else {
                &self.shard
            }
        )
    }

    /// A plain line, for logs.
    pub fn line(&self, plan: Option<&PlanFigures>) -> String {
        let pct = self
            .percent(plan)
            .map(|p| format!(" ({p}%)"))
            .unwrap_or_default();
        format!("moving{pct}: {}", self.figures(plan))
    }

    /// A progress bar, for a terminal (redrawn in place).
    pub fn bar(&self, plan: Option<&PlanFigures>) -> String {
        const WIDTH: u64 = 24;
        match self.percent(plan) {
            Some(p) => {
                let done = (p * WIDTH / 100) as usize;
                format!(
                    "[{}{}] {p:>3}% {}",
                    "#".repeat(done),
                    "-".repeat(WIDTH as usize - done),
                    self.figures(plan)
                )
            }
            None => self.line(plan),
        }
    }
}

/// The `plan: scanned N, move M, keep K, bytes B, big G, estimate S s` line's figures.
pub fn parse_plan(line: &str) -> Option<PlanFigures> {
    let rest = line.strip_prefix("plan: ")?;
    let c = counts(rest);
    Some(PlanFigures {
        keys: get(&c, "move")?,
        bytes: get(&c, "bytes").unwrap_or(0),
        estimate_s: get(&c, "estimate").unwrap_or(0),
    })
}

/// The `failed F` of the summary line `scanned N, sent S, kept K, absent A, failed F[, big B]`.
pub fn summary_failed(line: &str) -> Option<u64> {
    if !line.starts_with("scanned ") {
        return None;
    }
    let c = counts(line);
    get(&c, "sent")?;
    get(&c, "failed")
}

/// The `big B` of the summary line, when it has one.
pub fn summary_big(line: &str) -> Option<u64> {
    summary_failed(line)?;
    get(&counts(line), "big")
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Bytes in B, KiB, MiB or GiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43, item 6: after a resume the rate counts this run's keys only (`sent` counts
    /// the keys sent before the kill too); the last line ends at 100% though the sidecars
    /// moved some of the plan's keys themselves.
    #[test]
    fn a_resumed_run_rates_its_own_keys_and_the_last_line_says_100() {
        let plan = PlanFigures {
            keys: 10_000,
            bytes: 0,
            estimate_s: 2,
        };
        let resumed = Progress::parse(
            "progress scanned=9000 sent=4000 kept=4000 absent=0 failed=0 big=0 bytes=0 shard=2/2 elapsed_ms=1000 run_sent=800",
        )
        .unwrap();
        assert_eq!(resumed.rate(), 800);
        assert_eq!(resumed.eta_s(Some(&plan)), Some(8));
        let last = Progress::parse(
            "progress scanned=18000 sent=9000 kept=9000 absent=0 failed=0 big=0 bytes=0 shard=2/2 elapsed_ms=2000 run_sent=5800 done=1",
        )
        .unwrap();
        assert_eq!(last.percent(Some(&plan)), Some(100));
        assert_eq!(last.eta_s(Some(&plan)), Some(0));
        assert!(
            last.line(Some(&plan)).starts_with(
                "moving (100%): 9,000/10,000 keys (the others moved by the sidecars, or gone)"
            ),
            "{}",
            last.line(Some(&plan))
        );
    }

    #[test]
    fn progress_lines_become_a_bar_with_rate_and_eta() {
        let p = Progress::parse(
            "progress scanned=4000 sent=2000 kept=2000 absent=0 failed=0 big=0 bytes=3145728 shard=1/2 elapsed_ms=1000",
        )
        .unwrap();
        assert_eq!(p.rate(), 2000);
        let plan = PlanFigures {
            keys: 5000,
            bytes: 0,
            estimate_s: 3,
        };
        assert_eq!(p.eta_s(Some(&plan)), Some(2));
        assert_eq!(
            p.bar(Some(&plan)),
            "[#########---------------]  40% 2,000/5,000 keys, 3.0 MiB, 2,000 keys/s, ETA 2 s, failed 0, shard 1/2"
        );
        assert_eq!(
            p.line(None),
            "moving: 2,000 keys, 3.0 MiB, 2,000 keys/s, failed 0, shard 1/2"
        );
        assert!(Progress::parse("moving 5 keys").is_none());
    }

    #[test]
    fn plan_and_summary_lines_are_read() {
        assert_eq!(
            parse_plan("plan: scanned 10, move 4, keep 6, bytes 400, big 0, estimate 1 s"),
            Some(PlanFigures {
                keys: 4,
                bytes: 400,
                estimate_s: 1
            })
        );
        assert_eq!(
            parse_plan("plan shard a: scanned 10, move 4, keep 6, bytes 400"),
            None
        );
        assert_eq!(
            summary_failed("scanned 10, sent 4, kept 6, absent 0, failed 2, big 1"),
            Some(2)
        );
        assert_eq!(summary_failed("scanned 10, matched 10"), None);
        assert_eq!(
            summary_big("scanned 10, sent 4, kept 6, absent 0, failed 0, big 1"),
            Some(1)
        );
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}

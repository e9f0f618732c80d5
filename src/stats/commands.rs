//! Per-command counters and latency histograms, one set per worker and listener (written only
//! by that worker's sessions: relaxed atomics on cache lines no other worker touches), summed
//! when someone reads them (`INFO commandstats` / `latencystats`, the admin endpoint's
//! `/metrics` and `/stats`).
//!
//! Latency is measured from when the session dispatched the command to when its reply was
//! ready to write (time in respway plus time upstream); a command answered by the proxy itself
//! counts 0 µs. Histograms are log-linear: four buckets per power of two of microseconds
//! (each at most 25% wide, so a percentile read from them is within 25% of the exact value),
//! from 1 µs to about 60 s (slower ones all count in the last). A command's set is allocated the first time it is seen.
//!
//! Commands are counted by their top-level name (`client`, not `client|setname`), as the
//! command table knows them, or as they were learned from the shards (the first
//! `learned::COUNTED` learned names, in slots after `other`); a name neither knows is
//! counted as `other`. Each
//! command belongs to one [`family`] (`read`, `write`, `blocking`, `connection`, `other`),
//! by which `/metrics` groups latency histograms.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use respway_filters::command::{self, learned, CommandClass, CommandInfo};

use super::bump;

/// Buckets per histogram.
pub(crate) const BUCKETS: usize = 100;

/// The bucket of a latency in microseconds.
#[inline]
pub(crate) fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let e = 63 - us.leading_zeros() as usize; // >= 2
    let sub = ((us >> (e - 2)) & 3) as usize;
    ((e - 2) * 4 + sub + 4).min(BUCKETS - 1)
}

/// The largest latency (µs) bucket `i` holds (the last bucket holds everything above).
pub(crate) fn bucket_upper_us(i: usize) -> u64 {
    if i < 4 {
        return i as u64;
    }
    let e = (i - 4) / 4 + 2;
    let sub = ((i - 4) % 4) as u64;
    ((4 + sub) << (e - 2)) + (1u64 << (e - 2)) - 1
}

/// The families of commands, as `/metrics` labels them (see [`family`]).
pub(crate) const COMMAND_FAMILIES: [&str; 5] = ["read", "write", "blocking", "connection", "other"];

/// The family of a top-level command (`None`: a name the table does not know): `blocking`
/// (BLPOP, XREAD, WAIT...: their time is what the client asked to wait), `connection` (what
/// clients send to set up or check a connection: Redis's `@connection` category and CLIENT:
/// HELLO, AUTH, CLIENT, SELECT, READONLY, PING...), `write`, `read` (by the command's
/// flags), else `other` (scripts, transactions, pub/sub, server commands, unknown names).
pub(crate) fn family(c: Option<&CommandInfo>) -> &'static str {
    match c {
        None => "other",
        Some(c) if c.class == CommandClass::Blocking => "blocking",
        Some(c) if c.name == "client" || c.acl_categories.contains(&"@connection") => "connection",
        Some(c) if c.flags & command::WRITE != 0 => "write",
        Some(c) if c.flags & command::READONLY != 0 => "read",
        Some(_) => "other",
    }
}

/// One command's counters on one worker.
#[derive(Debug)]
pub(crate) struct CmdStat {
    calls: AtomicU64,
    failed: AtomicU64,
    usec: AtomicU64,
    hist: [AtomicU64; BUCKETS],
}

impl Default for CmdStat {
    fn default() -> Self {
        CmdStat {
            calls: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            usec: AtomicU64::new(0),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A command's counters summed over workers.
#[derive(Debug, Clone)]
pub(crate) struct CmdTotals {
    /// Lowercase command name (`other` for names the table does not know).
    pub(crate) name: &'static str,
    /// Its [`family`].
    pub(crate) family: &'static str,
    /// Commands answered.
    pub(crate) calls: u64,
    /// Of which answered with an error.
    pub(crate) failed: u64,
    /// Sum of latencies, µs.
    pub(crate) usec: u64,
    /// Latency histogram ([`bucket`]).
    pub(crate) hist: Vec<u64>,
}

impl CmdTotals {
    /// The latency (µs, a bucket's upper bound) below which `q` (0..=1) of the calls were.
    pub(crate) fn percentile_us(&self, q: f64) -> u64 {
        let total: u64 = self.hist.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &n) in self.hist.iter().enumerate() {
            seen += n;
            if seen >= want {
                return bucket_upper_us(i);
            }
        }
        bucket_upper_us(BUCKETS - 1)
    }

    /// The largest latency bucket with a call in it (upper bound, µs).
    pub(crate) fn max_us(&self) -> u64 {
        self.hist
            .iter()
            .rposition(|&n| n > 0)
            .map_or(0, bucket_upper_us)
    }
}

/// A latency histogram written by one worker (same buckets as the per-command ones): the
/// time Redis took per request on one endpoint, from the write of its batch to its reply.
#[derive(Debug)]
pub(crate) struct Latency {
    count: AtomicU64,
    sum_us: AtomicU64,
    hist: [AtomicU64; BUCKETS],
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Latency {
    /// Counts `n` latencies of `us` each.
    #[inline]
    pub(crate) fn record_n(&self, us: u64, n: u64) {
        bump(&self.count, n);
        bump(&self.sum_us, us.saturating_mul(n));
        bump(&self.hist[bucket(us)], n);
    }

    /// Adds this histogram into `t` (as a [`CmdTotals`] named `name`).
    pub(crate) fn add_into(&self, t: &mut CmdTotals) {
        t.calls += self.count.load(Ordering::Relaxed);
        t.usec += self.sum_us.load(Ordering::Relaxed);
        for (h, a) in t.hist.iter_mut().zip(&self.hist) {
            *h += a.load(Ordering::Relaxed);
        }
    }
}

impl CmdTotals {
    /// Empty totals named `name` (of family `other`).
    pub(crate) fn empty(name: &'static str) -> CmdTotals {
        CmdTotals {
            name,
            family: "other",
            calls: 0,
            failed: 0,
            usec: 0,
            hist: vec![0; BUCKETS],
        }
    }
}

/// One worker's per-command counters for one listener.
#[derive(Debug)]
pub(crate) struct CommandStats {
    /// Indexed by the command's position in [`command::all`], then `other`, then the
    /// learned commands' slots ([`learned::counted_name`]).
    per: Box<[OnceLock<Box<CmdStat>>]>,
}

impl Default for CommandStats {
    fn default() -> Self {
        CommandStats {
            per: (0..CommandStats::slots())
                .map(|_| OnceLock::new())
                .collect(),
        }
    }
}

/// The index under which `top` (a top-level command, or `None` for an unknown name) counts.
#[inline]
pub(crate) fn index_of(top: Option<&'static CommandInfo>) -> u16 {
    let all = command::all();
    let other = all.len() as u16;
    let Some(c) = top else { return other };
    let base = all.as_ptr() as usize;
    let at = c as *const CommandInfo as usize;
    let size = std::mem::size_of::<CommandInfo>();
    if at < base || at >= base + std::mem::size_of_val(all) {
        return learned_index(c);
    }
    ((at - base) / size) as u16
}

/// A learned command's index: its slot after `other`, or `other`.
#[cold]
fn learned_index(c: &CommandInfo) -> u16 {
    let other = command::all().len();
    learned::counted_slot(c).map_or(other, |s| other + 1 + s) as u16
}

/// The command counted at `index` (built-in or learned; `None`: `other`).
pub(crate) fn counted(index: usize) -> Option<&'static CommandInfo> {
    let all = command::all();
    match index.checked_sub(all.len() + 1) {
        None => all.get(index),
        Some(slot) => learned::counted_name(slot).and_then(learned_info),
    }
}

/// A learned command's entry by name (any endpoint's).
fn learned_info(name: &'static str) -> Option<&'static CommandInfo> {
    learned::interned_by_name(name)
}

impl CommandStats {
    /// Counts one answered command.
    #[inline]
    pub(crate) fn record(&self, index: u16, us: u64, failed: bool) {
        self.record_n(index, us, 1, u64::from(failed));
    }

    /// Counts `n` answered commands of one kind that took `us` each, `failed` of them with an
    /// error reply.
    #[inline]
    pub(crate) fn record_n(&self, index: u16, us: u64, n: u64, failed: u64) {
        let Some(slot) = self.per.get(usize::from(index)) else {
            return;
        };
        let s = slot.get_or_init(Box::default);
        // One worker writes these (see `stats::bump`).
        bump(&s.calls, n);
        bump(&s.usec, us.saturating_mul(n));
        if failed > 0 {
            bump(&s.failed, failed);
        }
        bump(&s.hist[bucket(us)], n);
    }

    /// Adds this worker's counters into `into` (indexed like `per`).
    pub(crate) fn add_into(&self, into: &mut [Option<CmdTotals>]) {
        for (i, slot) in self.per.iter().enumerate() {
            let Some(s) = slot.get() else { continue };
            let t = into[i].get_or_insert_with(|| CmdTotals {
                name: counted(i).map_or("other", |c| c.name),
                family: family(counted(i)),
                calls: 0,
                failed: 0,
                usec: 0,
                hist: vec![0; BUCKETS],
            });
            t.calls += s.calls.load(Ordering::Relaxed);
            t.failed += s.failed.load(Ordering::Relaxed);
            t.usec += s.usec.load(Ordering::Relaxed);
            for (h, a) in t.hist.iter_mut().zip(&s.hist) {
                *h += a.load(Ordering::Relaxed);
            }
        }
    }

    /// Slots, for [`add_into`](Self::add_into).
    pub(crate) fn slots() -> usize {
        command::all().len() + 1 + learned::COUNTED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_contiguous_and_at_most_a_quarter_wide() {
        let mut prev = None;
        for i in 0..BUCKETS - 1 {
            let hi = bucket_upper_us(i);
            let lo = prev.map_or(0, |p: u64| p + 1);
            assert_eq!(bucket(lo), i, "low end of {i}");
            assert_eq!(bucket(hi), i, "high end of {i}");
            if lo >= 4 {
                assert!((hi - lo + 1) * 4 <= lo, "bucket {i} [{lo}, {hi}] too wide");
            }
            prev = Some(hi);
        }
        assert!(bucket_upper_us(BUCKETS - 2) > 50_000_000);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_come_from_the_histogram() {
        let s = CommandStats::default();
        let get = index_of(command::lookup(b"get"));
        for _ in 0..990 {
            s.record(get, 100, false);
        }
        for _ in 0..10 {
            s.record(get, 5000, true);
        }
        let mut t = vec![None; CommandStats::slots()];
        s.add_into(&mut t);
        let g = t[usize::from(get)].clone().expect("get counted");
        assert_eq!((g.name, g.calls, g.failed), ("get", 1000, 10));
        assert!((100..=125).contains(&g.percentile_us(0.5)));
        assert!((100..=125).contains(&g.percentile_us(0.99)));
        assert!((5000..=6250).contains(&g.percentile_us(0.999)));
        assert_eq!(index_of(None) as usize, command::all().len());
    }

    #[test]
    fn families_follow_the_command_table() {
        let of = |n: &str| family(command::lookup(n.as_bytes()));
        for (name, want) in [
            ("get", "read"),
            ("mget", "read"),
            ("set", "write"),
            ("incr", "write"),
            ("blpop", "blocking"),
            ("wait", "blocking"),
            ("hello", "connection"),
            ("auth", "connection"),
            ("client", "connection"),
            ("select", "connection"),
            ("readonly", "connection"),
            ("eval", "other"),
            ("multi", "other"),
            ("info", "other"),
        ] {
            assert_eq!(of(name), want, "{name}");
            assert!(COMMAND_FAMILIES.contains(&want));
        }
        assert_eq!(family(None), "other");
    }
}

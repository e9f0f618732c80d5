//! The walk: every key of the source, its type, TTL and value compared with the target's.

use super::*;
use crate::diff::*;
use crate::report::*;

// === Compare ===

/// The comparison run: its settings and tallies.
pub(super) struct Compare {
    pub(super) report: Report,
    pub(super) sample_big: u64,
    /// Largest difference between the two sides' `PTTL`s that still matches, in ms.
    pub(super) ttl_tolerance: u64,
    /// With `--repair`: how many times a key is copied before it is listed as unsettled.
    pub(super) repair_rounds: Option<u32>,
    /// `--rate`: keys per second, scanned or copied.
    pub(super) rate: u64,
    /// When the run started, and keys scanned plus keys copied since: what `--rate` paces.
    pub(super) started: Instant,
    pub(super) work: u64,
}

/// One key as a comparison left it.
pub(super) struct Checked {
    pub(super) key: Bytes,
    /// Its type on the source; `none` when it was gone (deleted or expired) before `TYPE`.
    pub(super) kind: Bytes,
}

/// The comparison of one page of keys: each key, and its differences in the order found
/// (by index into `keys`; a key may have several, e.g. its value and its TTL).
pub(super) struct Checks {
    pub(super) keys: Vec<Checked>,
    pub(super) found: Vec<(usize, Kind, String)>,
}

impl Checks {
    /// Indices of the keys with at least one difference, each once, with its first one.
    pub(super) fn differing(&self) -> Vec<(usize, &str)> {
        let mut seen = HashSet::new();
        self.found
            .iter()
            .filter(|(i, _, _)| seen.insert(*i))
            .map(|(i, _, d)| (*i, d.as_str()))
            .collect()
    }
}

/// What one key looks like on both sides after `TYPE` and `PTTL`.
pub(super) struct KeyState {
    /// Its index in the page.
    pub(super) index: usize,
    pub(super) key: Bytes,
    pub(super) kind: Bytes,
    pub(super) source_pttl: i64,
    pub(super) target_pttl: i64,
    pub(super) target_shard: usize,
}

/// Value commands of one collection type.
pub(super) struct Collection {
    /// Its size command (`HLEN`, ...).
    pub(super) len: &'static [u8],
    /// What one element is called in details.
    pub(super) unit: &'static str,
}

pub(super) fn collection(kind: &[u8]) -> Option<Collection> {
    let (len, unit): (&'static [u8], _) = match kind {
        b"hash" => (b"HLEN", "fields"),
        b"list" => (b"LLEN", "elements"),
        b"set" => (b"SCARD", "members"),
        b"zset" => (b"ZCARD", "members"),
        b"stream" => (b"XLEN", "entries"),
        _ => return None,
    };
    Some(Collection { len, unit })
}

/// The command fetching a whole collection, or `None` for streams (compared by length).
pub(super) fn fetch_all(kind: &[u8], key: &Bytes) -> Option<Vec<Bytes>> {
    let s = Bytes::from_static;
    Some(match kind {
        b"hash" => vec![s(b"HGETALL"), key.clone()],
        b"list" => vec![s(b"LRANGE"), key.clone(), s(b"0"), s(b"-1")],
        b"set" => vec![s(b"SMEMBERS"), key.clone()],
        b"zset" => vec![
            s(b"ZRANGE"),
            key.clone(),
            s(b"0"),
            s(b"-1"),
            s(b"WITHSCORES"),
        ],
        _ => return None,
    })
}

impl Compare {
    /// Connects to both clusters, then scans every source shard in turn.
    pub(super) async fn run(
        &mut self,
        args: &Args,
        source: Plan,
        target: Plan,
    ) -> Result<(), String> {
        let (mut source, mut target) = tokio::try_join!(source.connect(), target.connect())?;
        eprintln!(
            "comparing cluster \"{}\" ({} shards) with \"{}\" ({} shards)",
            source.cluster.name,
            source.conns.len(),
            target.cluster.name,
            target.conns.len()
        );
        self.started = Instant::now();
        let count = Bytes::from(args.count.to_string());
        let mut done: u64 = 0;
        'shards: for shard in 0..source.conns.len() {
            eprintln!("scanning source shard {}", source.shard_label(shard));
            let mut cursor = Bytes::from_static(b"0");
            loop {
                if args.limit.is_some_and(|l| done >= l) {
                    break 'shards;
                }
                let (next, mut keys) = source.scan(shard, &cursor, &count).await?;
                if let Some(limit) = args.limit {
                    keys.truncate(usize::try_from(limit - done).unwrap_or(usize::MAX));
                }
                if !keys.is_empty() {
                    done += keys.len() as u64;
                    self.work += keys.len() as u64;
                    self.batch(&mut source, &mut target, shard, keys).await?;
                    self.pace().await;
                }
                if &next[..] == b"0" {
                    break;
                }
                cursor = next;
            }
        }
        if args.prune {
            self.prune(args, &mut source, &mut target).await?;
        }
        Ok(())
    }

    /// Waits until `work` keys may be done at `--rate` keys per second on average.
    pub(super) async fn pace(&self) {
        if self.rate == 0 {
            return; // --rate 0: no limit
        }
        let due = Duration::from_secs_f64(self.work as f64 / self.rate as f64);
        sleep_until(self.started + due).await;
    }

    /// Compares one page of keys found on shard `shard` of the source, reports what differs
    /// and, with `--repair`, repairs it.
    pub(super) async fn batch(
        &mut self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        keys: Vec<Bytes>,
    ) -> Result<(), String> {
        let scanned = keys.len() as u64;
        let checks = self.check(source, target, shard, keys).await?;
        for c in &checks.keys {
            if &c.kind[..] == b"none" {
                self.report.vanished += 1;
            }
        }
        for (i, kind, detail) in &checks.found {
            self.report.add(&checks.keys[*i].key, *kind, detail.clone());
        }
        self.report.scanned += scanned;
        self.report.end_batch();
        if let Some(rounds) = self.repair_rounds {
            let pending = checks
                .differing()
                .into_iter()
                .map(|(i, detail)| Pending {
                    key: checks.keys[i].key.clone(),
                    reason: detail.to_string(),
                })
                .collect();
            self.repair(source, target, shard, pending, rounds).await?;
        }
        Ok(())
    }

    /// Compares `keys` (all on source shard `shard`) with the target: type, value and TTL.
    /// Reports nothing: the caller decides what the differences mean.
    pub(super) async fn check(
        &self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        keys: Vec<Bytes>,
    ) -> Result<Checks, String> {
        let mut found = Vec::new();
        // 1. TYPE and PTTL on both sides.
        let targets: Vec<usize> = keys.iter().map(|k| target.picker.pick(k)).collect();
        let meta = |k: &Bytes, s: usize| {
            [
                (s, vec![Bytes::from_static(b"TYPE"), k.clone()]),
                (s, vec![Bytes::from_static(b"PTTL"), k.clone()]),
            ]
        };
        let src_cmds: Vec<_> = keys.iter().flat_map(|k| meta(k, shard)).collect();
        let tgt_cmds: Vec<_> = keys
            .iter()
            .zip(&targets)
            .flat_map(|(k, &s)| meta(k, s))
            .collect();
        let (src, tgt) = tokio::try_join!(source.run(&src_cmds), target.run(&tgt_cmds))?;
        let mut same = Vec::new();
        let mut checked = Vec::with_capacity(keys.len());
        for (i, key) in keys.into_iter().enumerate() {
            let src_type = type_reply(&src[2 * i]).map_err(|e| format!("TYPE on source: {e}"))?;
            let tgt_type = type_reply(&tgt[2 * i]).map_err(|e| format!("TYPE on target: {e}"))?;
            let src_pttl =
                int_reply(&src[2 * i + 1]).map_err(|e| format!("PTTL on source: {e}"))?;
            let tgt_pttl =
                int_reply(&tgt[2 * i + 1]).map_err(|e| format!("PTTL on target: {e}"))?;
            checked.push(Checked {
                key: key.clone(),
                kind: src_type.clone(),
            });
            if &src_type[..] == b"none" {
                // Gone from the source: nothing to compare.
            } else if &tgt_type[..] == b"none" {
                let detail = format!(
                    "{} on source, absent on target shard {}",
                    String::from_utf8_lossy(&src_type),
                    target.shard_label(targets[i])
                );
                found.push((i, Kind::MissingInTarget, detail));
            } else if src_type != tgt_type {
                let detail = format!(
                    "{} on source, {} on target",
                    String::from_utf8_lossy(&src_type),
                    String::from_utf8_lossy(&tgt_type)
                );
                found.push((i, Kind::TypeMismatch, detail));
            } else {
                same.push(KeyState {
                    index: i,
                    key,
                    kind: src_type,
                    source_pttl: src_pttl,
                    target_pttl: tgt_pttl,
                    target_shard: targets[i],
                });
            }
        }
        // 2. Strings by value; collections and streams by size first. Other types (modules)
        //    have no value command here: type and TTL only.
        let first = |k: &KeyState| -> Option<&'static [u8]> {
            match collection(&k.kind) {
                Some(c) => Some(c.len),
                None if &k.kind[..] == b"string" => Some(b"GET"),
                None => None,
            }
        };
        let valued: Vec<usize> = (0..same.len())
            .filter(|&i| first(&same[i]).is_some())
            .collect();
        let cmd = |i: usize, s: usize| {
            let k = &same[i];
            let name = first(k).unwrap_or(b"TYPE");
            (s, vec![Bytes::from_static(name), k.key.clone()])
        };
        let src_cmds: Vec<_> = valued.iter().map(|&i| cmd(i, shard)).collect();
        let tgt_cmds: Vec<_> = valued
            .iter()
            .map(|&i| cmd(i, same[i].target_shard))
            .collect();
        let (src, tgt) = tokio::try_join!(source.run(&src_cmds), target.run(&tgt_cmds))?;
        let mut fetch = Vec::new();
        for (j, &i) in valued.iter().enumerate() {
            let k = &same[i];
            let differs = match collection(&k.kind) {
                None => string_diff(&src[j], &tgt[j]),
                Some(c) => match (&src[j], &tgt[j]) {
                    (Frame::Integer(a), Frame::Integer(b)) if a != b => Some(format!(
                        "{}: {a} {} on source, {b} on target",
                        String::from_utf8_lossy(&k.kind),
                        c.unit
                    )),
                    (Frame::Integer(n), Frame::Integer(_)) => {
                        // Equal sizes: small collections are compared whole.
                        if u64::try_from(*n).unwrap_or(u64::MAX) <= self.sample_big {
                            if let Some(cmd) = fetch_all(&k.kind, &k.key) {
                                fetch.push((i, cmd));
                            }
                        }
                        None
                    }
                    (a, b) => Some(error_diff(a, b)),
                },
            };
            if let Some(detail) = differs {
                found.push((k.index, Kind::ValueMismatch, detail));
            }
        }
        for k in &same {
            if let Some(detail) = ttl_diff(k.source_pttl, k.target_pttl, self.ttl_tolerance) {
                found.push((k.index, Kind::TtlMismatch, detail));
            }
        }
        // 3. Whole values of the collections small enough.
        let src_cmds: Vec<_> = fetch.iter().map(|(_, c)| (shard, c.clone())).collect();
        let tgt_cmds: Vec<_> = fetch
            .iter()
            .map(|(i, c)| (same[*i].target_shard, c.clone()))
            .collect();
        let (src, tgt) = tokio::try_join!(source.run(&src_cmds), target.run(&tgt_cmds))?;
        for (j, (i, _)) in fetch.iter().enumerate() {
            let k = &same[*i];
            if let Some(detail) = collection_diff(&k.kind, &src[j], &tgt[j]) {
                found.push((k.index, Kind::ValueMismatch, detail));
            }
        }
        Ok(Checks {
            keys: checked,
            found,
        })
    }
}

/// A key to copy, and why (its last difference, or why its last copy failed).
pub(super) struct Pending {
    pub(super) key: Bytes,
    pub(super) reason: String,
}

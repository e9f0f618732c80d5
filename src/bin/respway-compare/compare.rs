//! The walk: every key of the source, its type, TTL and value compared with the target's.

use super::*;
use crate::diff::*;
use crate::report::*;

// === Compare ===

/// The comparison run: its settings and tallies.
pub(super) struct Compare {
    pub(super) report: Report,
    pub(super) sample_big: u64,
}

/// What one key looks like on both sides after `TYPE` and `PTTL`.
pub(super) struct KeyState {
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
        let started = Instant::now();
        let count = Bytes::from(args.count.to_string());
        let mut done: u64 = 0;
        'shards: for shard in 0..source.conns.len() {
            eprintln!("scanning source shard {}", source.shard_label(shard));
            let mut cursor = Bytes::from_static(b"0");
            loop {
                if args.limit.is_some_and(|l| done >= l) {
                    break 'shards;
                }
                let scan = vec![
                    Bytes::from_static(b"SCAN"),
                    cursor.clone(),
                    Bytes::from_static(b"COUNT"),
                    count.clone(),
                ];
                let reply = source.run(&[(shard, scan)]).await?;
                let (next, mut keys) = scan_reply(reply.into_iter().next())
                    .map_err(|e| format!("SCAN on {}: {e}", source.shard_label(shard)))?;
                if let Some(limit) = args.limit {
                    keys.truncate(usize::try_from(limit - done).unwrap_or(usize::MAX));
                }
                if !keys.is_empty() {
                    done += keys.len() as u64;
                    self.batch(&mut source, &mut target, shard, keys).await?;
                    // Pace: `done` keys may not be finished before `done / rate` seconds.
                    let due = Duration::from_secs_f64(done as f64 / args.rate as f64);
                    sleep_until(started + due).await;
                }
                if &next[..] == b"0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }

    /// Compares one page of keys found on shard `shard` of the source.
    pub(super) async fn batch(
        &mut self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        keys: Vec<Bytes>,
    ) -> Result<(), String> {
        let scanned = keys.len() as u64;
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
        for (i, key) in keys.into_iter().enumerate() {
            let src_type = type_reply(&src[2 * i]).map_err(|e| format!("TYPE on source: {e}"))?;
            let tgt_type = type_reply(&tgt[2 * i]).map_err(|e| format!("TYPE on target: {e}"))?;
            let src_pttl =
                int_reply(&src[2 * i + 1]).map_err(|e| format!("PTTL on source: {e}"))?;
            let tgt_pttl =
                int_reply(&tgt[2 * i + 1]).map_err(|e| format!("PTTL on target: {e}"))?;
            if &src_type[..] == b"none" {
                self.report.vanished += 1;
            } else if &tgt_type[..] == b"none" {
                let detail = format!(
                    "{} on source, absent on target shard {}",
                    String::from_utf8_lossy(&src_type),
                    target.shard_label(targets[i])
                );
                self.report.add(&key, Kind::MissingInTarget, detail);
            } else if src_type != tgt_type {
                let detail = format!(
                    "{} on source, {} on target",
                    String::from_utf8_lossy(&src_type),
                    String::from_utf8_lossy(&tgt_type)
                );
                self.report.add(&key, Kind::TypeMismatch, detail);
            } else {
                same.push(KeyState {
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
                self.report.add(&k.key, Kind::ValueMismatch, detail);
            }
        }
        for k in &same {
            if (k.source_pttl >= 0) != (k.target_pttl >= 0) {
                let detail = format!(
                    "{} on source, {} on target",
                    show_ttl(k.source_pttl),
                    show_ttl(k.target_pttl)
                );
                self.report.add(&k.key, Kind::TtlMismatch, detail);
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
                self.report.add(&k.key, Kind::ValueMismatch, detail);
            }
        }
        self.report.scanned += scanned;
        self.report.end_batch();
        Ok(())
    }
}

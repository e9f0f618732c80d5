//! `--repair`: each key that differs is copied from the source to the target, then compared
//! again; a key still different is copied again, up to `--repair-rounds` times.
//!
//! One copy of a page's keys:
//! 1. On the source, per key, `MULTI DUMP PTTL TIME EXEC`: the value, its TTL and the
//!    source's clock read at one instant. A key gone by then (`DUMP` nil) is not written: a
//!    delete on the source is never undone on the target.
//! 2. On the target, per key, `MULTI RESTORE key expiry payload REPLACE ABSTTL; DUMP EXEC`, the
//!    expiry absolute (the source's clock + PTTL, 0 for none). The `DUMP` keeps what was
//!    written, to recognise it later.
//! 3. When the target refuses `RESTORE` with the generic error code `ERR` (a payload from
//!    another server version, or a server without `RESTORE ... ABSTTL`), a type-aware copy:
//!    the type read first, then in one `MULTI` on the source its type, TTL, clock and value,
//!    and in one `MULTI` on the target `DEL`, the value rebuilt (`SET`, `HSET`, `RPUSH`,
//!    `SADD`, `ZADD`), `PEXPIREAT`, `DUMP`. Streams and module types have none: they stay
//!    unsettled. Any other error code (`OOM`, `NOPERM`, `READONLY`, ...) leaves the key
//!    unsettled with that reply as its reason (it is tried again in the next round).
//!
//! Then every written key is compared again ([`Compare::check`]). One that the source no
//! longer holds was deleted there while it was copied: if the target still holds exactly what
//! was written (`WATCH` + `DUMP`), it is deleted there (`MULTI DEL EXEC`, so a write that
//! reached the target meanwhile wins), so the copy does not resurrect it.

use super::*;
use crate::compare::{fetch_all, Compare, Pending};
use crate::diff::*;
use crate::report::*;

/// What copying one key did.
pub(super) enum Copy {
    /// Written; the target's `DUMP` of it right after.
    Written(Bytes),
    /// Gone from the source when read: the target was not touched.
    Gone,
    /// Not written, and why.
    Failed(String),
}

/// Most arguments of one command rebuilding a collection (several run in one `MULTI`).
const CHUNK: usize = 1024;

impl Compare {
    /// Copies and verifies the `pending` keys of source shard `shard`, up to `rounds` times;
    /// lists those still different.
    pub(super) async fn repair(
        &mut self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        mut pending: Vec<Pending>,
        rounds: u32,
    ) -> Result<(), String> {
        for _ in 0..rounds {
            if pending.is_empty() {
                break;
            }
            self.work += pending.len() as u64;
            let copies = self.copy(source, target, shard, &pending).await?;
            self.pace().await;
            let mut next = Vec::new();
            let mut written = Vec::new();
            for (p, c) in pending.into_iter().zip(copies) {
                match c {
                    Copy::Written(dump) => written.push((p.key, dump)),
                    Copy::Gone => self.report.gone_while_repaired += 1,
                    Copy::Failed(reason) => next.push(Pending { key: p.key, reason }),
                }
            }
            next.extend(self.verify(source, target, shard, written).await?);
            pending = next;
        }
        for p in pending {
            self.report.unsettled(&p.key, &p.reason);
        }
        Ok(())
    }

    /// Compares the keys just written again: the ones still different, to copy again.
    pub(super) async fn verify(
        &mut self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        written: Vec<(Bytes, Bytes)>,
    ) -> Result<Vec<Pending>, String> {
        let keys = written.iter().map(|(k, _)| k.clone()).collect();
        let checks = self.check(source, target, shard, keys).await?;
        let mut reasons: Vec<Option<String>> = vec![None; written.len()];
        for (i, detail) in checks.differing() {
            reasons[i] = Some(detail.to_string());
        }
        let mut next = Vec::new();
        for ((c, (key, dump)), reason) in checks.keys.iter().zip(written).zip(reasons) {
            if &c.kind[..] == b"none" {
                self.report.gone_while_repaired += 1;
                undo(source, target, shard, &key, &dump).await?;
            } else if let Some(reason) = reason {
                next.push(Pending { key, reason });
            } else {
                self.report.repaired += 1;
            }
        }
        Ok(next)
    }

    /// Copies each key of `pending` (on source shard `shard`) once.
    pub(super) async fn copy(
        &mut self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        pending: &[Pending],
    ) -> Result<Vec<Copy>, String> {
        let s = Bytes::from_static;
        // 1. The value, its TTL and the source's clock, read at one instant.
        let mut cmds = Vec::with_capacity(pending.len() * 5);
        for p in pending {
            cmds.extend(transaction(
                shard,
                vec![
                    vec![s(b"DUMP"), p.key.clone()],
                    vec![s(b"PTTL"), p.key.clone()],
                    vec![s(b"TIME")],
                ],
            ));
        }
        let replies = source.run(&cmds).await?;
        let mut out: Vec<Option<Copy>> = Vec::with_capacity(pending.len());
        let mut writes = Vec::new();
        let mut at = 0;
        for (i, p) in pending.iter().enumerate() {
            let (queued, exec) = split_transaction(&replies, &mut at, 3);
            let read = exec_items(queued, exec)
                .map_err(|f| format!("source: {}", show_frame(&f)))
                .and_then(|items| match items {
                    [Frame::Null | Frame::NullArray | Frame::Nil, ..] => Ok(None),
                    [Frame::Bulk(payload), pttl, time] => {
                        Ok(Some((payload.clone(), expiry(pttl, time)?)))
                    }
                    _ => Err(format!("DUMP on source: {}", show_frame(exec))),
                });
            match read {
                Ok(None) => out.push(Some(Copy::Gone)),
                Err(reason) => out.push(Some(Copy::Failed(reason))),
                Ok(Some((payload, expiry))) => {
                    out.push(None); // written below
                    let key = p.key.clone();
                    let restore = vec![
                        s(b"RESTORE"),
                        key.clone(),
                        Bytes::from(expiry.to_string()),
                        payload,
                        s(b"REPLACE"),
                        s(b"ABSTTL"),
                    ];
                    let t = target.picker.pick(&key);
                    writes.push((i, t, vec![restore, vec![s(b"DUMP"), key]]));
                }
            }
        }
        // 2. RESTORE on the target; the type-aware copy where the payload is refused.
        let results = write_all(target, &writes).await?;
        let mut refused = Vec::new();
        for ((i, _, _), result) in writes.iter().zip(results) {
            out[*i] = match result {
                Ok(Some(dump)) => Some(Copy::Written(dump)),
                // Expired on the source since it was read.
                Ok(None) => Some(Copy::Gone),
                Err(reply) if error_code(&reply) == Some(&b"ERR"[..]) => {
                    refused.push((*i, reply));
                    continue;
                }
                Err(reply) => Some(Copy::Failed(format!(
                    "RESTORE on target: {}",
                    show_frame(&reply)
                ))),
            };
        }
        for (i, reply) in refused {
            out[i] = Some(
                self.rebuild(source, target, shard, &pending[i].key, &reply)
                    .await?,
            );
        }
        Ok(out
            .into_iter()
            .map(|c| c.unwrap_or_else(|| Copy::Failed("not copied".to_string())))
            .collect())
    }

    /// The type-aware copy of `key`, after the target refused its `RESTORE` with `refusal`.
    pub(super) async fn rebuild(
        &mut self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        key: &Bytes,
        refusal: &Frame,
    ) -> Result<Copy, String> {
        let s = Bytes::from_static;
        let kind = source
            .run(&[(shard, vec![s(b"TYPE"), key.clone()])])
            .await?;
        let kind = type_reply(&kind[0]).map_err(|e| format!("TYPE on source: {e}"))?;
        let fetch = match &kind[..] {
            b"none" => return Ok(Copy::Gone),
            b"string" => vec![s(b"GET"), key.clone()],
            _ => match fetch_all(&kind, key) {
                Some(cmd) => cmd,
                None => {
                    let kind = String::from_utf8_lossy(&kind);
                    return Ok(Copy::Failed(format!(
                        "{kind}: not repaired: the target refused RESTORE ({}) and a {kind} has no type-aware copy",
                        show_frame(refusal)
                    )));
                }
            },
        };
        let cmds = transaction(
            shard,
            vec![
                vec![s(b"TYPE"), key.clone()],
                vec![s(b"PTTL"), key.clone()],
                vec![s(b"TIME")],
                fetch,
            ],
        );
        let replies = source.run(&cmds).await?;
        let (queued, exec) = split_transaction(&replies, &mut 0, 4);
        let items = match exec_items(queued, exec) {
            Ok(items) => items,
            Err(f) => return Ok(Copy::Failed(format!("source: {}", show_frame(&f)))),
        };
        let [now_kind, pttl, time, value] = items else {
            return Ok(Copy::Failed(format!("source: {}", show_frame(exec))));
        };
        match type_reply(now_kind) {
            Ok(k) if &k[..] == b"none" => return Ok(Copy::Gone),
            Ok(k) if k == kind => {}
            _ => {
                return Ok(Copy::Failed(format!(
                    "changed type on the source while it was copied ({})",
                    show_frame(now_kind)
                )))
            }
        }
        let expiry = match expiry(pttl, time) {
            Ok(e) => e,
            Err(reason) => return Ok(Copy::Failed(reason)),
        };
        let Some(mut build) = rebuild_commands(&kind, key, value) else {
            return Ok(Copy::Failed(format!(
                "unexpected value on the source: {}",
                show_frame(value)
            )));
        };
        build.insert(0, vec![s(b"DEL"), key.clone()]);
        if expiry > 0 {
            build.push(vec![
                s(b"PEXPIREAT"),
                key.clone(),
                Bytes::from(expiry.to_string()),
            ]);
        }
        build.push(vec![s(b"DUMP"), key.clone()]);
        let write = [(0, target.picker.pick(key), build)];
        let result = write_all(target, &write).await?.pop();
        Ok(match result {
            Some(Ok(Some(dump))) => Copy::Written(dump),
            Some(Ok(None)) => Copy::Gone,
            Some(Err(reply)) => {
                Copy::Failed(format!("type-aware copy on target: {}", show_frame(&reply)))
            }
            None => Copy::Failed("type-aware copy on target: no reply".to_string()),
        })
    }
}

/// `MULTI`, the commands, `EXEC`, all for `shard`.
fn transaction(shard: usize, cmds: Vec<Vec<Bytes>>) -> Vec<(usize, Vec<Bytes>)> {
    let mut out = Vec::with_capacity(cmds.len() + 2);
    out.push((shard, vec![Bytes::from_static(b"MULTI")]));
    out.extend(cmds.into_iter().map(|c| (shard, c)));
    out.push((shard, vec![Bytes::from_static(b"EXEC")]));
    out
}

/// The replies of one [`transaction`] of `n` commands starting at `*at`: the replies to the
/// queued commands and the `EXEC` reply. Advances `*at` past them.
fn split_transaction<'a>(
    replies: &'a [Frame],
    at: &mut usize,
    n: usize,
) -> (&'a [Frame], &'a Frame) {
    let queued = &replies[*at + 1..*at + 1 + n];
    let exec = &replies[*at + 1 + n];
    *at += n + 2;
    (queued, exec)
}

/// The results inside an `EXEC` reply; an error when a command was refused as it was queued
/// (the transaction was then discarded: that refusal is the reason) or `EXEC` failed.
fn exec_items<'a>(queued: &'a [Frame], exec: &'a Frame) -> Result<&'a [Frame], Frame> {
    if let Some(refusal) = queued.iter().find(|f| error_code(f).is_some()) {
        return Err(refusal.clone());
    }
    match exec {
        Frame::Array(items) if items.len() == queued.len() => Ok(items),
        other => Err(other.clone()),
    }
}

/// Runs each write (`(index, target shard, commands)`) in a transaction on its target shard;
/// per write, the final `DUMP`'s payload (`None`: the key is not there, written with an expiry
/// already past), or the first refusal (as queued, or inside `EXEC`).
async fn write_all(
    target: &mut Side,
    writes: &[(usize, usize, Vec<Vec<Bytes>>)],
) -> Result<Vec<Result<Option<Bytes>, Frame>>, String> {
    let cmds: Vec<_> = writes
        .iter()
        .flat_map(|(_, t, cmds)| transaction(*t, cmds.clone()))
        .collect();
    let replies = target.run(&cmds).await?;
    let mut at = 0;
    Ok(writes
        .iter()
        .map(|(_, _, cmds)| {
            let (queued, exec) = split_transaction(&replies, &mut at, cmds.len());
            let items = exec_items(queued, exec)?;
            if let Some(refusal) = items.iter().find(|f| error_code(f).is_some()) {
                return Err(refusal.clone());
            }
            match items.last() {
                Some(Frame::Bulk(dump)) => Ok(Some(dump.clone())),
                Some(Frame::Null) => Ok(None),
                Some(other) => Err(other.clone()),
                None => Err(Frame::Null),
            }
        })
        .collect())
}

/// The error code of an error reply: its first word (`ERR`, `OOM`, `NOPERM`, ...).
pub(super) fn error_code(f: &Frame) -> Option<&[u8]> {
    match f {
        Frame::Error(text) | Frame::BlobError(text) => text.split(|&b| b == b' ').next(),
        _ => None,
    }
}

/// The absolute expiry, in ms of the source's clock, from its `PTTL` and `TIME` replies
/// (0: no TTL).
fn expiry(pttl: &Frame, time: &Frame) -> Result<i64, String> {
    let pttl = int_reply(pttl).map_err(|e| format!("PTTL on source: {e}"))?;
    if pttl < 0 {
        return Ok(0);
    }
    let now = match bulks(time).as_deref() {
        Some([secs, micros]) => std::str::from_utf8(secs)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .zip(
                std::str::from_utf8(micros)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok()),
            )
            .map(|(s, us)| s * 1000 + us / 1000),
        _ => None,
    };
    now.map(|now| now + pttl)
        .ok_or_else(|| format!("TIME on source: {}", show_frame(time)))
}

/// The commands writing `value` (the reply to [`fetch_all`] or `GET`) as `key` of type
/// `kind`, collections in chunks of [`CHUNK`] arguments; `None` if the reply does not fit.
fn rebuild_commands(kind: &[u8], key: &Bytes, value: &Frame) -> Option<Vec<Vec<Bytes>>> {
    let s = Bytes::from_static;
    if kind == b"string" {
        let Frame::Bulk(v) = value else { return None };
        return Some(vec![vec![s(b"SET"), key.clone(), v.clone()]]);
    }
    let mut items = bulks(value)?;
    let (cmd, step): (&'static [u8], usize) = match kind {
        b"hash" => (b"HSET", 2),
        b"list" => (b"RPUSH", 1),
        b"set" => (b"SADD", 1),
        b"zset" => {
            // ZRANGE ... WITHSCORES gives member, score; ZADD takes score, member.
            for pair in items.chunks_mut(2) {
                pair.reverse();
            }
            (b"ZADD", 2)
        }
        _ => return None,
    };
    if items.is_empty() || items.len() % step != 0 {
        return None;
    }
    Some(
        items
            .chunks(CHUNK - CHUNK % step)
            .map(|chunk| {
                let mut c = Vec::with_capacity(chunk.len() + 2);
                c.push(s(cmd));
                c.push(key.clone());
                c.extend_from_slice(chunk);
                c
            })
            .collect(),
    )
}

/// `key` was written to the target, then found gone from the source (deleted there while it
/// was copied): deletes it from the target if the target still holds what was written
/// (`dump`) and the source still has no such key, so the copy does not resurrect it.
async fn undo(
    source: &mut Side,
    target: &mut Side,
    shard: usize,
    key: &Bytes,
    dump: &Bytes,
) -> Result<(), String> {
    let s = Bytes::from_static;
    let t = target.picker.pick(key);
    let watch = [s(b"WATCH"), key.clone()];
    let read = [s(b"DUMP"), key.clone()];
    let held = target.conns[t].pipeline(&[&watch, &read]).await?;
    let ours = matches!(held.get(1), Some(Frame::Bulk(b)) if b == dump);
    if ours {
        let exists = [s(b"EXISTS"), key.clone()];
        let on_source = source.conns[shard].pipeline(&[&exists]).await?;
        if matches!(on_source.first(), Some(Frame::Integer(0))) {
            let (multi, del, exec) = ([s(b"MULTI")], [s(b"DEL"), key.clone()], [s(b"EXEC")]);
            target.conns[t].pipeline(&[&multi, &del, &exec]).await?;
            return Ok(());
        }
    }
    target.conns[t].pipeline(&[&[s(b"UNWATCH")]]).await?;
    Ok(())
}

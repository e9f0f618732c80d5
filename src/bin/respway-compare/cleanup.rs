//! `--cleanup`: copy mode's last step. Once reads and writes go to the new placement (the
//! target) and dual write is off, the old placement (the source) still holds every key. This
//! walks every source shard (SCAN, paced by `--rate`) and, for each key whose owner in the
//! target is another Redis (another primary address, or another database; a key whose owner
//! is the same Redis is the same key, and stays), checks that the target holds it with the same
//! type, value and TTL ([`Compare::check`], the comparison of a plain run), and only then
//! deletes it from the source. A key missing on the target or different there is never
//! deleted: it is listed.
//!
//! Dry run by default: it lists the keys it would delete. With `--apply`, per page: `WATCH` of
//! the page's keys on the source, the comparison, then `MULTI UNLINK keys... EXEC`; when a key
//! changed on the source in between, `EXEC` does nothing and the keys that were deletable are
//! compared again (up to [`WATCH_ROUNDS`] times, then listed as differing), so a write that
//! reached the source after its comparison is never lost.

use super::*;
use crate::report::{quote, show_frame, Kind};

/// How many times a page's deletable keys are compared again when one changed on the source.
const WATCH_ROUNDS: u32 = 3;

/// What one `--cleanup` run found and did.
#[derive(Debug, Default)]
pub(super) struct Cleanup {
    pub(super) scanned: u64,
    /// Keys equal on their new owner: deleted with `--apply`, listed without.
    pub(super) deletable: u64,
    /// Keys whose owner is the same Redis in both placements.
    pub(super) kept: u64,
    pub(super) not_on_target: u64,
    /// Keys of another type, value or TTL on the target (or that kept changing on the source).
    pub(super) differ: u64,
    /// Keys `UNLINK` deleted.
    pub(super) deleted: u64,
    /// Lines printed: `would delete`, and `not_on_target`/`differ`.
    shown_deletable: usize,
    shown_kept: usize,
}

impl Cleanup {
    /// The summary line.
    pub(super) fn summary(&self, apply: bool) -> String {
        let deleted = if apply {
            self.deleted.to_string()
        } else {
            "0 (dry run; --apply deletes)".to_string()
        };
        format!(
            "cleanup: scanned {}, deletable {}, kept {}, not_on_target {}, differ {}, deleted {deleted}",
            self.scanned, self.deletable, self.kept, self.not_on_target, self.differ
        )
    }

    /// Lists a key left on the source (the first `max` of them).
    fn left(&mut self, max: usize, what: &str, key: &[u8], detail: &str) {
        if self.shown_kept < max {
            self.shown_kept += 1;
            println!("{what} {}: {detail}", quote(key));
        }
    }
}

impl Compare {
    /// Walks every source shard and deletes (or, without `--apply`, lists) the keys that are
    /// equal on their new owner.
    pub(super) async fn run_cleanup(
        &mut self,
        args: &Args,
        source: Plan,
        target: Plan,
    ) -> Result<Cleanup, String> {
        let (mut source, mut target) = tokio::try_join!(source.connect(), target.connect())?;
        self.started = Instant::now();
        let count = Bytes::from(args.count.to_string());
        let same_db = source.cluster.db == target.cluster.db;
        let mut c = Cleanup::default();
        for shard in 0..source.conns.len() {
            eprintln!("cleaning up source shard {}", source.shard_label(shard));
            let from = source.cluster.shards[shard].primary().address;
            let mut cursor = Bytes::from_static(b"0");
            loop {
                let (next, keys) = source.scan(shard, &cursor, &count).await?;
                c.scanned += keys.len() as u64;
                self.work += keys.len() as u64;
                let mut moved = Vec::with_capacity(keys.len());
                for key in keys {
                    let t = target.picker.pick(&key);
                    if same_db && target.cluster.shards[t].primary().address == from {
                        c.kept += 1;
                    } else {
                        moved.push(key);
                    }
                }
                if !moved.is_empty() {
                    self.clean(args, &mut source, &mut target, shard, moved, &mut c)
                        .await?;
                }
                self.pace().await;
                if &next[..] == b"0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(c)
    }

    /// Compares one page's keys (of source shard `shard`, owned by another Redis in the
    /// target) and deletes those equal there, or lists them without `--apply`.
    async fn clean(
        &self,
        args: &Args,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        mut keys: Vec<Bytes>,
        c: &mut Cleanup,
    ) -> Result<(), String> {
        let max = args.max_mismatches;
        for _ in 0..WATCH_ROUNDS {
            if args.apply {
                let mut watch = vec![Bytes::from_static(b"WATCH")];
                watch.extend(keys.iter().cloned());
                let reply = source.run(&[(shard, watch)]).await?;
                if !matches!(reply.first(), Some(Frame::Simple(_))) {
                    return Err(format!(
                        "WATCH on {}: {}",
                        source.shard_label(shard),
                        reply.first().map_or("no reply".into(), show_frame)
                    ));
                }
            }
            let checks = self.check(source, target, shard, keys).await?;
            let mut deletable = Vec::new();
            for (i, k) in checks.keys.iter().enumerate() {
                if &k.kind[..] == b"none" {
                    continue; // gone from the source since the SCAN: nothing to delete
                }
                match checks.found.iter().find(|f| f.0 == i) {
                    Some((_, Kind::MissingInTarget, detail)) => {
                        c.not_on_target += 1;
                        c.left(max, "not_on_target", &k.key, detail);
                    }
                    Some((_, _, detail)) => {
                        c.differ += 1;
                        c.left(max, "differ", &k.key, detail);
                    }
                    None => deletable.push(k.key.clone()),
                }
            }
            if !args.apply {
                c.deletable += deletable.len() as u64;
                for key in &deletable {
                    if c.shown_deletable < max {
                        c.shown_deletable += 1;
                        println!("would delete {}", quote(key));
                    }
                }
                return Ok(());
            }
            if deletable.is_empty() {
                source
                    .run(&[(shard, vec![Bytes::from_static(b"UNWATCH")])])
                    .await?;
                return Ok(());
            }
            let mut unlink = vec![Bytes::from_static(b"UNLINK")];
            unlink.extend(deletable.iter().cloned());
            let cmds = [
                (shard, vec![Bytes::from_static(b"MULTI")]),
                (shard, unlink),
                (shard, vec![Bytes::from_static(b"EXEC")]),
            ];
            let replies = source.run(&cmds).await?;
            match &replies[2] {
                Frame::Array(items) => {
                    let Some(Frame::Integer(n)) = items.first() else {
                        return Err(format!(
                            "UNLINK on {}: {}",
                            source.shard_label(shard),
                            items.first().map_or("no reply".into(), show_frame)
                        ));
                    };
                    c.deletable += deletable.len() as u64;
                    c.deleted += u64::try_from(*n).unwrap_or(0);
                    return Ok(());
                }
                // A key changed on the source since WATCH: compare the deletable ones again.
                Frame::Null | Frame::NullArray | Frame::Nil => keys = deletable,
                other => {
                    return Err(format!(
                        "MULTI UNLINK EXEC on {}: {}",
                        source.shard_label(shard),
                        show_frame(other)
                    ))
                }
            }
        }
        for key in &keys {
            c.differ += 1;
            let detail = format!("changed on the source while compared, {WATCH_ROUNDS} times");
            c.left(max, "differ", key, &detail);
        }
        Ok(())
    }
}

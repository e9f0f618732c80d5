//! `--cleanup`: copy mode's last step. Once the configuration sends nothing to the source (the
//! cut-over done and its mirror dropped: [`crate::sending_route`] finds no route that uses
//! it), the source's copies are obsolete whatever their value: writes
//! after the cut-over went to the target only. This walks every source shard (SCAN, paced by
//! `--rate`) and deletes (`UNLINK`) each key whose owner in the target is another Redis
//! (another primary address, or another database; a key whose owner is the same Redis is the
//! same key, and stays). Nothing is compared and nothing is ever copied to the target: the
//! target is authoritative.
//!
//! Dry run by default: it lists the keys it would delete (the first `--max-mismatches`) and
//! counts them. Resumable: a run stopped midway deleted only obsolete keys, and the next run
//! finds what is left.

use super::*;
use crate::report::{quote, show_frame};

/// What one `--cleanup` run found and did.
#[derive(Debug, Default)]
pub(super) struct Cleanup {
    pub(super) scanned: u64,
    /// Keys whose owner in the target is another Redis: deleted with `--apply`, listed
    /// without.
    pub(super) deletable: u64,
    /// Keys whose owner is the same Redis in both placements.
    pub(super) kept: u64,
    /// Keys `UNLINK` deleted.
    pub(super) deleted: u64,
    /// `would delete` lines printed.
    shown: usize,
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
            "cleanup: scanned {}, deletable {}, kept {}, deleted {deleted}",
            self.scanned, self.deletable, self.kept
        )
    }
}

impl Compare {
    /// Walks every source shard and deletes (or, without `--apply`, lists) the keys whose
    /// owner in the target is another Redis.
    pub(super) async fn run_cleanup(
        &mut self,
        args: &Args,
        source: Plan,
        target: Plan,
    ) -> Result<Cleanup, String> {
        let mut source = source.connect().await?;
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
                let mut obsolete = Vec::with_capacity(keys.len());
                for key in keys {
                    let t = target.picker.pick(&key);
                    if same_db && target.cluster.shards[t].primary().address == from {
                        c.kept += 1;
                    } else {
                        obsolete.push(key);
                    }
                }
                c.deletable += obsolete.len() as u64;
                if args.apply && !obsolete.is_empty() {
                    let mut unlink = vec![Bytes::from_static(b"UNLINK")];
                    unlink.extend(obsolete);
                    let reply = source.run(&[(shard, unlink)]).await?;
                    match reply.first() {
                        Some(Frame::Integer(n)) => c.deleted += u64::try_from(*n).unwrap_or(0),
                        other => {
                            return Err(format!(
                                "UNLINK on {}: {}",
                                source.shard_label(shard),
                                other.map_or("no reply".into(), show_frame)
                            ))
                        }
                    }
                } else if !args.apply {
                    for key in &obsolete {
                        if c.shown < args.max_mismatches {
                            c.shown += 1;
                            println!("would delete {}", quote(key));
                        }
                    }
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
}

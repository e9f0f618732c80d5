//! `--prune` (with `--repair`, during copy mode's write pause): after the comparison, every
//! target shard is SCANned and each key whose owner in the source does not hold it is
//! deleted from the target (`UNLINK`). Such a key is one the target should not have: a copy
//! that resurrected a key deleted on the source (a backfill killed between its copy and its
//! check leaves one; its rerun never sees it, since it walks the source), or a stray write.
//! The comparison itself is one-way and would not find it.

use super::*;

impl Compare {
    /// Deletes from the target the keys its source owner lacks; counts them in the report.
    pub(super) async fn prune(
        &mut self,
        args: &Args,
        source: &mut Side,
        target: &mut Side,
    ) -> Result<(), String> {
        let count = Bytes::from(args.count.to_string());
        for shard in 0..target.conns.len() {
            eprintln!("pruning target shard {}", target.shard_label(shard));
            let mut cursor = Bytes::from_static(b"0");
            loop {
                let (next, keys) = target.scan(shard, &cursor, &count).await?;
                self.work += keys.len() as u64;
                let exists: Vec<(usize, Vec<Bytes>)> = keys
                    .iter()
                    .map(|k| {
                        let s = source.picker.pick(k);
                        (s, vec![Bytes::from_static(b"EXISTS"), k.clone()])
                    })
                    .collect();
                let there = source.run(&exists).await?;
                let gone: Vec<(usize, Vec<Bytes>)> = keys
                    .into_iter()
                    .zip(there)
                    .filter(|(_, r)| matches!(r, Frame::Integer(0)))
                    .map(|(k, _)| (shard, vec![Bytes::from_static(b"UNLINK"), k]))
                    .collect();
                if !gone.is_empty() {
                    for r in target.run(&gone).await? {
                        if matches!(r, Frame::Integer(1)) {
                            self.report.pruned += 1;
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
        Ok(())
    }
}

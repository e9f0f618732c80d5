//! `--move`: the background mover of move mode. It walks every shard of the source (SCAN,
//! paced by `--rate`) and sends the keys whose owner in the target is another Redis (another
//! primary address, or another database) there with `MIGRATE ... KEYS`, one per target shard
//! and SCAN page, from the source shard itself. Redis moves each key with its TTL atomically
//! and deletes it from the source; a key already gone (moved by a command through respway in
//! move mode, deleted, expired) is skipped (`NOKEY` when none of a batch is there). Keys whose
//! owner stays are not touched. The target's credentials are passed to `MIGRATE`.

use super::*;
use crate::diff::scan_reply;
use crate::report::show_frame;

/// What one `--move` run did.
#[derive(Debug, Default)]
pub(super) struct Moves {
    /// Keys the SCANs returned.
    pub(super) scanned: u64,
    /// Keys whose owner is the same Redis in both placements: left where they are.
    pub(super) kept: u64,
    /// Keys sent in `MIGRATE`s that answered `OK`: each moved, unless it was gone already (a
    /// key SCAN returned twice, as it may while keys leave the shard).
    pub(super) sent: u64,
    /// `MIGRATE`s that found none of their keys (`NOKEY`).
    pub(super) absent: u64,
    /// `MIGRATE`s that failed (`BUSYKEY`: the target has one of the keys; `IOERR`, ...).
    /// Redis moves the batch's other keys; those the target refused stay on the source.
    pub(super) failed: u64,
}

impl Compare {
    /// Moves every key of `source` whose owner in `target` is another Redis.
    pub(super) async fn run_move(
        &mut self,
        args: &Args,
        source: Plan,
        target: Plan,
    ) -> Result<Moves, String> {
        let mut source = source.connect().await?;
        self.started = Instant::now();
        let count = Bytes::from(args.count.to_string());
        let mut m = Moves::default();
        for shard in 0..source.conns.len() {
            eprintln!("moving keys off source shard {}", source.shard_label(shard));
            let from = source.cluster.shards[shard].primary().address;
            let mut cursor = Bytes::from_static(b"0");
            loop {
                let scan = vec![
                    Bytes::from_static(b"SCAN"),
                    cursor.clone(),
                    Bytes::from_static(b"COUNT"),
                    count.clone(),
                ];
                let reply = source.run(&[(shard, scan)]).await?;
                let (next, keys) = scan_reply(reply.into_iter().next())
                    .map_err(|e| format!("SCAN on {}: {e}", source.shard_label(shard)))?;
                m.scanned += keys.len() as u64;
                let mut groups: Vec<(usize, Vec<Bytes>)> = Vec::new();
                for key in keys {
                    let t = target.picker.pick(&key);
                    let to = target.cluster.shards[t].primary().address;
                    if to == from && target.cluster.db == source.cluster.db {
                        m.kept += 1;
                        continue;
                    }
                    match groups.iter_mut().find(|g| g.0 == t) {
                        Some(g) => g.1.push(key),
                        None => groups.push((t, vec![key])),
                    }
                }
                for (t, keys) in groups {
                    let n = keys.len() as u64;
                    let cmd = migrate(&target.cluster, t, keys);
                    let reply = source.run(&[(shard, cmd)]).await?;
                    match reply.first() {
                        Some(Frame::Simple(s)) if &s[..] == b"NOKEY" => m.absent += 1,
                        Some(Frame::Simple(_)) => m.sent += n,
                        other => {
                            m.failed += 1;
                            eprintln!(
                                "MIGRATE of {n} keys from {} to {}: {}",
                                source.shard_label(shard),
                                target.cluster.shards[t].name,
                                other.map_or("no reply".into(), show_frame)
                            );
                        }
                    }
                    self.work += n;
                    self.pace().await;
                }
                if &next[..] == b"0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(m)
    }
}

/// `MIGRATE host port "" db timeout [AUTH ...] KEYS keys...` to shard `t` of `target`.
fn migrate(target: &Cluster, t: usize, keys: Vec<Bytes>) -> Vec<Bytes> {
    let to = target.shards[t].primary().address;
    let mut cmd = vec![
        Bytes::from_static(b"MIGRATE"),
        Bytes::from(to.ip().to_string()),
        Bytes::from(to.port().to_string()),
        Bytes::new(),
        Bytes::from(target.db.to_string()),
        Bytes::from(MIGRATE_TIMEOUT_MS.to_string()),
    ];
    if let Some(a) = target.auth_for(to) {
        match &a.username {
            Some(user) => cmd.extend([
                Bytes::from_static(b"AUTH2"),
                Bytes::from(user.clone()),
                Bytes::from(a.password.clone()),
            ]),
            None => cmd.extend([Bytes::from_static(b"AUTH"), Bytes::from(a.password.clone())]),
        }
    }
    cmd.push(Bytes::from_static(b"KEYS"));
    cmd.extend(keys);
    cmd
}

/// How long one `MIGRATE` may wait for the target (Redis's own timeout argument).
const MIGRATE_TIMEOUT_MS: u64 = 5_000;

//! `--move`: the background mover of move mode. It walks every shard of the source (SCAN,
//! paced by `--rate` keys and `--bytes-rate` bytes per second) and sends the keys whose owner
//! in the target is another Redis (another primary address, or another database) there with
//! `MIGRATE ... KEYS`, one per target shard and SCAN page, from the source shard itself. Redis
//! moves each key with its TTL atomically and deletes it from the source; a key already gone
//! (moved by a command through respway in move mode, deleted, expired) is skipped (`NOKEY` when
//! none of a batch is there). Keys whose owner stays are not touched. The target's
//! credentials are passed to `MIGRATE`.
//!
//! Sizes: the keys of a page that would move are measured with `MEMORY USAGE`, pipelined (one
//! round trip per page), when something needs them: `--max-key-bytes` (a key above it is not
//! sent: `MIGRATE` blocks the source while it serializes the key), `--bytes-rate`,
//! `--progress` or `--plan`. Where it is: [`checkpoint`](crate::checkpoint). `--plan` walks the
//! same way and moves nothing.

use super::*;
use crate::checkpoint::{Checkpoint, Cursor, Moves};
use crate::report::{quote, show_frame};

/// The keys of one page bound for one target shard, and their `MEMORY USAGE` total.
struct Group {
    target: usize,
    keys: Vec<Bytes>,
    bytes: u64,
}

/// What `--plan` counts, per source shard and in all.
#[derive(Default)]
struct Tally {
    scanned: u64,
    moving: u64,
    kept: u64,
    bytes: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.scanned += other.scanned;
        self.moving += other.moving;
        self.kept += other.kept;
        self.bytes += other.bytes;
    }
}

/// The mover: its connections, state and pacing.
struct Mover<'a> {
    args: &'a Args,
    source: Side,
    target: Plan,
    cp: Checkpoint,
    /// Whether keys are measured with `MEMORY USAGE`.
    measure: bool,
    /// This run's start, and the keys and bytes it sent: what `--rate`/`--bytes-rate` pace.
    started: Instant,
    keys_sent: u64,
    bytes_sent: u64,
    /// With `--progress`: when the next progress line is due.
    next_progress: Option<Instant>,
    /// The counts of the last progress line printed (the last line is not printed twice).
    last_progress: Option<(u64, u64, u64, u64, u64, u64, usize)>,
    /// The source shard walked now.
    shard: usize,
    /// When the checkpoint was last written.
    saved: Option<Instant>,
    /// Keys reported as big in this run (SCAN may return a key twice).
    big_seen: HashSet<Bytes>,
}

/// Runs `--move` (or `--plan`) from the state `cp`.
pub(super) async fn run(
    args: &Args,
    source: Plan,
    target: Plan,
    cp: Checkpoint,
) -> Result<Moves, String> {
    let source = source.connect().await?;
    let started = Instant::now();
    let mut mv = Mover {
        args,
        source,
        target,
        cp,
        measure: args.max_key_bytes > 0 || args.bytes_rate.is_some() || args.progress || args.plan,
        started,
        keys_sent: 0,
        bytes_sent: 0,
        next_progress: args.progress.then(|| started + PROGRESS_EVERY),
        last_progress: None,
        shard: 0,
        saved: None,
        big_seen: HashSet::new(),
    };
    let mut total = Tally::default();
    for shard in 0..mv.source.conns.len() {
        mv.shard = shard;
        let label = mv.source.shard_label(shard);
        let Cursor::At(cursor) = mv.cp.shards[shard].1.clone() else {
            eprintln!("source shard {label}: done (--checkpoint)");
            continue;
        };
        if args.plan {
            eprintln!("planning source shard {label}");
        } else {
            eprintln!("moving keys off source shard {label}");
        }
        let tally = match mv.walk(shard, cursor).await {
            Ok(t) => t,
            Err(e) => {
                // Where it got to, for the next run (its own failure is reported after).
                let _ = mv.cp.save();
                return Err(e);
            }
        };
        if args.plan {
            println!(
                "plan shard {label}: scanned {}, move {}, keep {}, bytes {}",
                tally.scanned, tally.moving, tally.kept, tally.bytes
            );
            total.add(&tally);
        }
    }
    // The last line: every source shard walked (`done=1`), unless the last one printed
    // already said all there is.
    mv.progress_end();
    if args.plan {
        let secs = |n: u64, rate: Option<u64>| rate.filter(|r| *r > 0).map_or(0, |r| n.div_ceil(r));
        let estimate = secs(total.moving, Some(args.rate)).max(secs(total.bytes, args.bytes_rate));
        println!(
            "plan: scanned {}, move {}, keep {}, bytes {}, big {}, estimate {estimate} s",
            total.scanned, total.moving, total.kept, total.bytes, mv.cp.moves.big
        );
    }
    Ok(mv.cp.moves)
}

/// Most time between two writes of the checkpoint while keys move.
const SAVE_EVERY: Duration = Duration::from_millis(200);

/// How often `--progress` prints.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

impl Mover<'_> {
    /// Walks source shard `shard` from `cursor` to its end.
    async fn walk(&mut self, shard: usize, mut cursor: Bytes) -> Result<Tally, String> {
        let count = Bytes::from(self.args.count.to_string());
        let mut tally = Tally::default();
        loop {
            let (next, keys) = self.source.scan(shard, &cursor, &count).await?;
            let kept_before = self.cp.moves.kept;
            self.cp.moves.scanned += keys.len() as u64;
            tally.scanned += keys.len() as u64;
            let groups = self.sort(shard, keys).await?;
            tally.kept += self.cp.moves.kept - kept_before;
            if self.args.plan {
                for g in &groups {
                    tally.moving += g.keys.len() as u64;
                    tally.bytes += g.bytes;
                }
            } else {
                for g in groups {
                    self.send(shard, g).await?;
                    self.save(false)?;
                    self.pace().await;
                }
            }
            let done = &next[..] == b"0";
            self.cp.shards[shard].1 = if done { Cursor::Done } else { Cursor::At(next) };
            if !self.args.plan {
                self.save(done)?;
            }
            self.tick();
            match &self.cp.shards[shard].1 {
                Cursor::At(next) => cursor = next.clone(),
                Cursor::Done => return Ok(tally),
            }
        }
    }

    /// Writes the checkpoint when `now` (a shard done) or when the last write is
    /// [`SAVE_EVERY`] old: a write replacing a file costs milliseconds on a journaling file
    /// system (measured: a run writing after every batch took twice as long), and a state
    /// some pages old only means those pages are read again.
    fn save(&mut self, now: bool) -> Result<(), String> {
        if now || self.saved.is_none_or(|at| at.elapsed() >= SAVE_EVERY) {
            self.cp.save()?;
            self.saved = Some(Instant::now());
        }
        Ok(())
    }

    /// Sorts one page's keys: those whose owner stays are counted as kept; the others are
    /// grouped by target shard, measured when sizes are needed, and those above
    /// `--max-key-bytes` left out (listed on stderr) — as are those gone since the SCAN.
    async fn sort(&mut self, shard: usize, keys: Vec<Bytes>) -> Result<Vec<Group>, String> {
        let from = self.source.cluster.shards[shard].primary().address;
        let same_db = self.target.cluster.db == self.source.cluster.db;
        let mut moving = Vec::with_capacity(keys.len());
        for key in keys {
            let t = self.target.picker.pick(&key);
            if same_db && self.target.cluster.shards[t].primary().address == from {
                self.cp.moves.kept += 1;
            } else {
                moving.push((t, key));
            }
        }
        let sizes: Vec<Option<u64>> = if self.measure && !moving.is_empty() {
            let cmds: Vec<_> = moving
                .iter()
                .map(|(_, k)| {
                    let memory = Bytes::from_static(b"MEMORY");
                    (shard, vec![memory, Bytes::from_static(b"USAGE"), k.clone()])
                })
                .collect();
            let replies = self.source.run(&cmds).await?;
            replies
                .iter()
                .map(|r| match r {
                    Frame::Integer(n) => Ok(Some(u64::try_from(*n).unwrap_or(0))),
                    Frame::Null | Frame::Nil => Ok(None),
                    other => Err(format!(
                        "MEMORY USAGE on {}: {} (sizes are needed by --max-key-bytes, \
                         --bytes-rate, --progress and --plan; --max-key-bytes 0 alone does not)",
                        self.source.shard_label(shard),
                        show_frame(other)
                    )),
                })
                .collect::<Result<_, _>>()?
        } else {
            vec![Some(0); moving.len()]
        };
        let max = self.args.max_key_bytes;
        let mut groups: Vec<Group> = Vec::new();
        for ((t, key), size) in moving.into_iter().zip(sizes) {
            let Some(size) = size else {
                continue; // gone since the SCAN
            };
            if max > 0 && size > max {
                if self.big_seen.insert(key.clone()) {
                    self.cp.moves.big += 1;
                    eprintln!("big {}: {size} bytes, not moved", quote(&key));
                }
                continue;
            }
            match groups.iter_mut().find(|g| g.target == t) {
                Some(g) => {
                    g.keys.push(key);
                    g.bytes += size;
                }
                None => groups.push(Group {
                    target: t,
                    keys: vec![key],
                    bytes: size,
                }),
            }
        }
        Ok(groups)
    }

    /// Sends one group with one `MIGRATE` and counts the outcome.
    async fn send(&mut self, shard: usize, g: Group) -> Result<(), String> {
        let n = g.keys.len() as u64;
        let cmd = migrate(&self.target.cluster, g.target, g.keys);
        let reply = self.source.run(&[(shard, cmd)]).await?;
        let m = &mut self.cp.moves;
        match reply.first() {
            Some(Frame::Simple(s)) if &s[..] == b"NOKEY" => m.absent += 1,
            Some(Frame::Simple(_)) => {
                m.sent += n;
                m.bytes += g.bytes;
            }
            other => {
                m.failed += 1;
                eprintln!(
                    "MIGRATE of {n} keys from {} to {}: {}",
                    self.source.shard_label(shard),
                    self.target.cluster.shards[g.target].name,
                    other.map_or("no reply".into(), show_frame)
                );
            }
        }
        self.keys_sent += n;
        self.bytes_sent += g.bytes;
        Ok(())
    }

    /// Waits until the keys and bytes sent may have been sent at `--rate` keys and
    /// `--bytes-rate` bytes per second on average; prints progress lines meanwhile.
    async fn pace(&mut self) {
        // --rate 0: no limit on keys.
        let keys = match self.args.rate {
            0 => 0.0,
            r => self.keys_sent as f64 / r as f64,
        };
        let bytes = self
            .args
            .bytes_rate
            .map_or(0.0, |r| self.bytes_sent as f64 / r as f64);
        let due = self.started + Duration::from_secs_f64(keys.max(bytes));
        loop {
            self.tick();
            if Instant::now() >= due {
                return;
            }
            sleep_until(self.next_progress.map_or(due, |p| p.min(due))).await;
        }
    }

    /// Prints a progress line when one is due.
    fn tick(&mut self) {
        if let Some(at) = self.next_progress {
            let now = Instant::now();
            if now >= at {
                self.progress_line();
                self.next_progress = Some(now + PROGRESS_EVERY);
            }
        }
    }

    /// With `--progress`: `progress scanned=N sent=S kept=K absent=A failed=F big=B bytes=BYTES
    /// shard=I/NSHARDS elapsed_ms=MS run_sent=R[ done=1]` (counts since the checkpoint began;
    /// `run_sent`: keys this run sent, in `elapsed_ms`; `done=1` on the last line, once every
    /// source shard is walked).
    fn progress_line(&mut self) {
        self.print_progress(false);
    }

    fn progress_end(&mut self) {
        self.print_progress(true);
    }

    fn print_progress(&mut self, done: bool) {
        if !self.args.progress {
            return;
        }
        let m = &self.cp.moves;
        let counts = (
            m.scanned, m.sent, m.kept, m.absent, m.failed, m.big, self.shard,
        );
        if self.last_progress == Some(counts) && !done {
            return;
        }
        self.last_progress = Some(counts);
        eprintln!(
            "progress scanned={} sent={} kept={} absent={} failed={} big={} bytes={} shard={}/{} elapsed_ms={} run_sent={}{}",
            m.scanned,
            m.sent,
            m.kept,
            m.absent,
            m.failed,
            m.big,
            m.bytes,
            self.shard + 1,
            self.source.conns.len(),
            self.started.elapsed().as_millis(),
            self.keys_sent,
            if done { " done=1" } else { "" }
        );
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

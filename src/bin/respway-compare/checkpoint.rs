//! `--checkpoint FILE`: where the mover is, so that a run killed mid-way resumes instead of
//! starting over. Written after a `MIGRATE` batch or a SCAN page when the last write is 200 ms
//! old, when a shard is done and when the mover stops on an error (`mover.rs` decides when),
//! atomically (a temporary file next to it, then a rename): a reader finds the old file or the
//! new one, never half.
//!
//! The file is text, one fact per line:
//!
//! ```text
//! respway-compare move checkpoint 1
//! source old
//! target new
//! scope prefix "p:", skip "p:x:"
//! counters scanned=N sent=S kept=K absent=A failed=F big=B bytes=BYTES
//! shard 127.0.0.1:7001 done
//! shard 127.0.0.1:7002 cursor 1234
//! ```
//!
//! the `scope` line only with `--prefix` or `--skip-prefix` (the keys the walk looks at, as
//! [`Scope::describe`] writes them), one `shard` line per source shard, in order, with its
//! primary's address and its SCAN cursor (the page to read next; `0` before the first) or
//! `done`. A run that finds the file resumes from it when it names the same source and target
//! clusters with the same shard addresses and the same scope (a cursor of another scope's walk
//! has skipped keys of this one):
//! finished shards are skipped, the others continue from their cursor, the counters continue.
//! A page interrupted between two batches is read again (its keys already moved are gone
//! from it; the others are counted again, as SCAN may return a key twice anyway).

use super::*;
use crate::scope::Scope;

/// The first line: what the file is, and the version of its format.
const HEADER: &str = "respway-compare move checkpoint 1";

/// Where one source shard's walk is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cursor {
    /// The SCAN cursor of the next page (`0`: not started).
    At(Bytes),
    /// Every page read.
    Done,
}

/// The mover's state, as written to and read from the file.
#[derive(Debug)]
pub(super) struct Checkpoint {
    /// The file; `None` without `--checkpoint` (the state is kept, not written).
    pub(super) path: Option<PathBuf>,
    source: String,
    target: String,
    /// [`Scope::describe`] of the walk's scope (empty: every key).
    scope: String,
    /// Each source shard's primary address and where its walk is.
    pub(super) shards: Vec<(SocketAddr, Cursor)>,
    pub(super) moves: Moves,
}

impl Checkpoint {
    /// The state at the start of a walk over `source`'s shards, of the keys in `scope`.
    pub(super) fn fresh(
        path: Option<PathBuf>,
        source: &Cluster,
        target: &Cluster,
        scope: &Scope,
    ) -> Checkpoint {
        Checkpoint {
            path,
            source: source.name.clone(),
            target: target.name.clone(),
            scope: scope.describe(),
            shards: source
                .shards
                .iter()
                .map(|s| (s.primary().address, Cursor::At(Bytes::from_static(b"0"))))
                .collect(),
            moves: Moves::default(),
        }
    }

    /// Reads `path` if it exists: `Ok(None)` when it does not, an error (usage: exit 2) when it
    /// cannot be read or names other clusters or shards than `source` and `target`, or
    /// another scope than `scope`.
    pub(super) fn load(
        path: &Path,
        source: &Cluster,
        target: &Cluster,
        scope: &Scope,
    ) -> Result<Option<Checkpoint>, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("--checkpoint {}: {e}", path.display())),
        };
        let bad = |what: &str| format!("--checkpoint {}: {what}", path.display());
        let cp = parse(path, &text).map_err(|e| bad(&e))?;
        if cp.source != source.name || cp.target != target.name {
            return Err(bad(&format!(
                "it is the checkpoint of --source {} --target {}, not --source {} --target {} \
                 (remove it to start over)",
                cp.source, cp.target, source.name, target.name
            )));
        }
        let scope = scope.describe();
        if cp.scope != scope {
            let show = |s: &str| {
                if s.is_empty() {
                    "every key".to_string()
                } else {
                    s.to_string()
                }
            };
            return Err(bad(&format!(
                "it is the checkpoint of a walk over {}, not over {} (--prefix, --skip-prefix, \
                 --ignore-case; remove it to start over)",
                show(&cp.scope),
                show(&scope)
            )));
        }
        let addrs: Vec<SocketAddr> = source.shards.iter().map(|s| s.primary().address).collect();
        let saved: Vec<SocketAddr> = cp.shards.iter().map(|s| s.0).collect();
        if addrs != saved {
            return Err(bad(&format!(
                "its source shards are not cluster \"{}\"'s: {} in the file, {} in the \
                 configuration (remove it to start over)",
                source.name,
                list(&saved),
                list(&addrs)
            )));
        }
        Ok(Some(cp))
    }

    /// Writes the state: to `FILE.tmp`, then renamed over `FILE`.
    pub(super) fn save(&self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let m = &self.moves;
        let mut text = format!("{HEADER}\nsource {}\ntarget {}\n", self.source, self.target);
        if !self.scope.is_empty() {
            let _ = writeln!(text, "scope {}", self.scope);
        }
        let _ = writeln!(
            text,
            "counters scanned={} sent={} kept={} absent={} failed={} big={} bytes={}",
            m.scanned, m.sent, m.kept, m.absent, m.failed, m.big, m.bytes
        );
        for (addr, cursor) in &self.shards {
            match cursor {
                Cursor::Done => {
                    let _ = writeln!(text, "shard {addr} done");
                }
                Cursor::At(c) => {
                    let _ = writeln!(text, "shard {addr} cursor {}", String::from_utf8_lossy(c));
                }
            }
        }
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("--checkpoint {}: {e}", path.display()))
    }
}

fn list(addrs: &[SocketAddr]) -> String {
    let all: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    all.join(", ")
}

/// Reads the file's text.
fn parse(path: &Path, text: &str) -> Result<Checkpoint, String> {
    let mut lines = text.lines().peekable();
    if lines.next() != Some(HEADER) {
        return Err(format!(
            "not a mover checkpoint (its first line is not \"{HEADER}\")"
        ));
    }
    let field = |lines: &mut std::iter::Peekable<std::str::Lines<'_>>, name: &str| {
        lines
            .next()
            .and_then(|l| l.strip_prefix(name))
            .and_then(|l| l.strip_prefix(' '))
            .map(str::to_string)
            .ok_or_else(|| format!("no \"{name}\" line"))
    };
    let source = field(&mut lines, "source")?;
    let target = field(&mut lines, "target")?;
    // Written only for a scoped walk (and absent from the files of before it).
    let scope = if lines.peek().is_some_and(|l| l.starts_with("scope ")) {
        field(&mut lines, "scope")?
    } else {
        String::new()
    };
    let counters = field(&mut lines, "counters")?;
    let mut moves = Moves::default();
    for pair in counters.split(' ') {
        let (name, value) = pair.split_once('=').ok_or("a counter without =")?;
        let value: u64 = value
            .parse()
            .map_err(|_| format!("counter {name}: not a number"))?;
        *match name {
            "scanned" => &mut moves.scanned,
            "sent" => &mut moves.sent,
            "kept" => &mut moves.kept,
            "absent" => &mut moves.absent,
            "failed" => &mut moves.failed,
            "big" => &mut moves.big,
            "bytes" => &mut moves.bytes,
            other => return Err(format!("unknown counter {other}")),
        } = value;
    }
    let mut shards = Vec::new();
    for line in lines {
        let words: Vec<&str> = line.split(' ').collect();
        let shard = match words[..] {
            ["shard", addr, "done"] => (addr, Cursor::Done),
            ["shard", addr, "cursor", c]
                if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (addr, Cursor::At(Bytes::from(c.to_string())))
            }
            _ => return Err(format!("unexpected line {line:?}")),
        };
        let addr = shard
            .0
            .parse()
            .map_err(|_| format!("not an address: {}", shard.0))?;
        shards.push((addr, shard.1));
    }
    Ok(Checkpoint {
        path: Some(path.to_path_buf()),
        source,
        target,
        scope,
        shards,
        moves,
    })
}

/// What one `--move` run did (with a checkpoint: every run on it so far).
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
    /// Keys above `--max-key-bytes`: not sent (each counted once per run).
    pub(super) big: u64,
    /// `MEMORY USAGE` of the keys sent (0 when sizes are not measured).
    pub(super) bytes: u64,
}

impl Moves {
    /// The summary line.
    pub(super) fn summary(&self) -> String {
        format!(
            "scanned {}, sent {}, kept {}, absent {}, failed {}, big {}",
            self.scanned, self.sent, self.kept, self.absent, self.failed, self.big
        )
    }
}

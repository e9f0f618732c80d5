//! `--keys FILE`: the comparison (or `--repair`) of the keys a file lists instead of every key
//! of the source. Copy mode's write pause needs only the keys written since dual write began,
//! which the sidecars report hex-encoded: checking those is much less than a walk of the whole
//! keyspace.
//!
//! FILE (`-`: stdin) lists one key per line, hex-encoded (either case; an empty line is
//! skipped; any other line that is not hex is a usage error naming its line number). A key
//! listed twice is checked once; keys out of the scope (`--prefix`, `--skip-prefix`) are left
//! out. The others are grouped by their source shard (the source picker) and compared in pages
//! of `--count`, each page as a SCAN page is ([`Compare::batch`]: counted as scanned, a key
//! absent from the source counted as vanished), paced by `--rate`.
//!
//! With `--prune`, no target shard is walked: after each page, each of its keys that its
//! source owner does not hold is deleted (`UNLINK`) from its target owner, and counted in
//! `pruned N` when it was there.

use super::*;

/// The keys of `--keys FILE` (`-`: stdin), in file order.
pub(super) fn read(path: &Path) -> Result<Vec<Bytes>, String> {
    let text = if path == Path::new("-") {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .map_err(|e| format!("--keys -: stdin: {e}"))?;
        buf
    } else {
        std::fs::read(path).map_err(|e| format!("--keys {}: {e}", path.display()))?
    };
    parse(&text).map_err(|e| format!("--keys {}: {e}", path.display()))
}

/// One key per line, hex-encoded: the keys, or which line is not hex. Spaces around a line
/// (and a `\r` before its `\n`) are ignored; an empty line is skipped.
pub(super) fn parse(text: &[u8]) -> Result<Vec<Bytes>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let key = hex(line).ok_or_else(|| {
            format!(
                "line {}: not a hex-encoded key ({}; one key per line, hex-encoded)",
                i + 1,
                crate::report::preview(line)
            )
        })?;
        keys.push(Bytes::from(key));
    }
    Ok(keys)
}

/// The bytes `text` encodes in hex (upper or lower case digits, two per byte).
pub(super) fn hex(text: &[u8]) -> Option<Vec<u8>> {
    fn digit(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

impl Compare {
    /// Compares (and with `--repair`, repairs; with `--prune`, prunes) the listed `keys`.
    pub(super) async fn run_listed(
        &mut self,
        args: &Args,
        keys: Vec<Bytes>,
        source: Plan,
        target: Plan,
    ) -> Result<(), String> {
        let (mut source, mut target) = tokio::try_join!(source.connect(), target.connect())?;
        let listed = keys.len();
        let mut seen = HashSet::new();
        let mut shards: Vec<Vec<Bytes>> = vec![Vec::new(); source.conns.len()];
        for key in keys {
            if source.scope.contains(&key) && seen.insert(key.clone()) {
                shards[source.picker.pick(&key)].push(key);
            }
        }
        eprintln!(
            "comparing {} keys of --keys ({listed} listed) of cluster \"{}\" with \"{}\"",
            seen.len(),
            source.cluster.name,
            target.cluster.name
        );
        self.started = Instant::now();
        let count = usize::try_from(args.count).unwrap_or(usize::MAX);
        for (shard, keys) in shards.into_iter().enumerate() {
            if keys.is_empty() {
                continue;
            }
            eprintln!(
                "checking {} listed keys of source shard {}",
                keys.len(),
                source.shard_label(shard)
            );
            for page in keys.chunks(count) {
                self.work += page.len() as u64;
                self.batch(&mut source, &mut target, shard, page.to_vec())
                    .await?;
                if args.prune {
                    self.prune_listed(&mut source, &mut target, shard, page)
                        .await?;
                }
                self.pace().await;
            }
        }
        Ok(())
    }

    /// `--prune` with `--keys`: deletes from the target each of `keys` (all on source shard
    /// `shard`) that the source does not hold; counts those that were there.
    async fn prune_listed(
        &mut self,
        source: &mut Side,
        target: &mut Side,
        shard: usize,
        keys: &[Bytes],
    ) -> Result<(), String> {
        let exists: Vec<(usize, Vec<Bytes>)> = keys
            .iter()
            .map(|k| (shard, vec![Bytes::from_static(b"EXISTS"), k.clone()]))
            .collect();
        let there = source.run(&exists).await?;
        let gone: Vec<(usize, Vec<Bytes>)> = keys
            .iter()
            .zip(there)
            .filter(|(_, r)| matches!(r, Frame::Integer(0)))
            .map(|(k, _)| {
                let t = target.picker.pick(k);
                (t, vec![Bytes::from_static(b"UNLINK"), k.clone()])
            })
            .collect();
        if !gone.is_empty() {
            for r in target.run(&gone).await? {
                if matches!(r, Frame::Integer(1)) {
                    self.report.pruned += 1;
                }
            }
        }
        Ok(())
    }
}

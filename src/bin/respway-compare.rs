//! `respway-compare`: checks that every key of one cluster is also, with the same type, value
//! and TTL presence, in another cluster — the "verify" step of an online migration (dual-write
//! → backfill → **compare** → switch reads → stop dual-write), run against the real shards,
//! not through the proxy.
//!
//! ```text
//! respway-compare --config respway.yaml --source old --target new [--rate 5000] [--limit N]
//! ```
//!
//! How it works:
//! - Loads the respway YAML config and builds both clusters' shard pickers exactly as the
//!   data plane does ([`build_picker`] over each cluster's hash policy, hashtag and shards).
//! - `SCAN`s every shard primary of the source cluster directly (plain TCP, `AUTH`/`SELECT`
//!   per the cluster's `auth`/`db`), one page of `--count` keys at a time.
//! - For each page, pipelined per shard and with source and target in parallel: `TYPE` and
//!   `PTTL` on both sides (the target shard is the target picker's choice for the key, its
//!   primary); then for keys present on both sides with the same type, the value:
//!   strings `GET`; hashes `HGETALL` (as a map); lists `LRANGE 0 -1`; sets `SMEMBERS` (as a
//!   set); sorted sets `ZRANGE 0 -1 WITHSCORES`; streams `XLEN`. Collections are first
//!   measured (`HLEN`/`LLEN`/`SCARD`/`ZCARD`); when either side has more than
//!   `--sample-big` elements only the sizes are compared. Other types (modules) are compared
//!   by type and TTL only. TTLs are compared by presence (`PTTL` ≥ 0 vs -1), not by value.
//! - Paces itself to at most `--rate` keys per second on average.
//!
//! It is one-way: keys that exist only in the target are not reported (swap `--source` and
//! `--target` to find them). On a live keyspace, SCAN may return a key twice (it is then
//! compared twice), and a key deleted or expired on the source between SCAN and TYPE is
//! counted as scanned but neither matched nor mismatched (a separate line says how many).
//!
//! Output (stdout): the first `--max-mismatches` mismatches as they are found, one per line
//! (`kind "key": detail`), then the summary line
//! `scanned N, matched M, missing_in_target X, type_mismatch Y, value_mismatch Z, ttl_mismatch W`.
//! Progress and errors go to stderr.
//!
//! Exit code: 0 when every scanned key matched, 1 when some did not, 2 on a usage or
//! configuration error, 3 when the comparison could not be completed (a shard unreachable,
//! refused `AUTH`, an error reply to `SCAN`/`TYPE`/`PTTL`, a timeout).

// A CLI whose report on stdout is its product: printing there is the point.
#![allow(
    clippy::print_stdout,
    reason = "a CLI whose report on stdout is its product"
)]

use std::collections::{BTreeMap, HashSet};
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use clap::Parser;
use respway_filters::codec_limits::Limits;
use respway_filters::hash::{cluster_picker, ShardPicker};
use respway_filters::model::{Cluster, Config, UpstreamAuth};
use respway_filters::resp::{encode_command, parse_reply, Frame, ReplyScanner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, timeout, Instant};

/// Compare the keys of one respway cluster with another (source → target).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// respway YAML configuration naming both clusters.
    #[arg(long)]
    config: PathBuf,
    /// Cluster whose keys are scanned.
    #[arg(long)]
    source: String,
    /// Cluster expected to hold the same keys.
    #[arg(long)]
    target: String,
    /// How many mismatches to print (all are counted).
    #[arg(long, default_value_t = 20)]
    max_mismatches: usize,
    /// Most keys compared per second, on average.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// Collections with more elements than this are compared by size only.
    #[arg(long, default_value_t = 1000)]
    sample_big: u64,
    /// SCAN COUNT: keys asked for per SCAN call (also the pipelining batch).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Stop after this many keys in total.
    #[arg(long)]
    limit: Option<u64>,
}

/// How long one read or write to a shard may make no progress.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Reply limits for upstream connections: as large as Redis itself allows.
const REPLY_LIMITS: Limits = Limits {
    max_bulk_len: 512 * 1024 * 1024,
    max_multibulk_len: usize::MAX,
    max_inline_len: 64 * 1024,
};

/// Longest value preview shown in a mismatch detail.
const PREVIEW: usize = 48;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = match respway_xds::load_file(&args.config) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    let (source, target) = match (
        Plan::new(&config, &args.source, "--source"),
        Plan::new(&config, &args.target, "--target"),
    ) {
        (Ok(s), Ok(t)) => (s, t),
        (s, t) => {
            for e in [s.err(), t.err()].into_iter().flatten() {
                eprintln!("respway-compare: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let mut cmp = Compare {
        report: Report::new(args.max_mismatches),
        sample_big: args.sample_big,
    };
    let result = cmp.run(&args, source, target).await;
    cmp.report.finish();
    match result {
        Err(e) => {
            eprintln!("respway-compare: {e}");
            ExitCode::from(3)
        }
        Ok(()) if cmp.report.bad_keys > 0 => ExitCode::from(1),
        Ok(()) => ExitCode::SUCCESS,
    }
}

// === Side ===

/// One cluster: its picker and a connection to each shard's primary.
struct Side {
    cluster: Cluster,
    picker: Arc<dyn ShardPicker>,
    conns: Vec<Conn>,
}

/// A side before it is connected: the cluster and its picker.
struct Plan {
    cluster: Cluster,
    picker: Arc<dyn ShardPicker>,
}

impl Plan {
    /// Finds `name` in `config` and builds its picker the way the data plane does
    /// (`routing.rs` `compile_cluster`). `flag` names the option in errors.
    fn new(config: &Config, name: &str, flag: &str) -> Result<Plan, String> {
        let Some(cluster) = config.cluster(name) else {
            let known: Vec<&str> = config.clusters.iter().map(|c| c.name.as_str()).collect();
            return Err(format!(
                "{flag}: no cluster \"{name}\" in the configuration (clusters: {})",
                known.join(", ")
            ));
        };
        let picker = cluster_picker(cluster).map_err(|e| format!("cluster \"{name}\": {e}"))?;
        Ok(Plan {
            cluster: cluster.clone(),
            picker,
        })
    }

    /// Connects to every shard primary.
    async fn connect(self) -> Result<Side, String> {
        let mut conns = Vec::with_capacity(self.cluster.shards.len());
        for shard in &self.cluster.shards {
            let conn = Conn::connect(
                shard.primary().address,
                self.cluster.connect_timeout,
                self.cluster.auth.as_ref(),
                self.cluster.db,
            )
            .await
            .map_err(|e| {
                format!(
                    "cluster \"{}\" shard \"{}\": {e}",
                    self.cluster.name, shard.name
                )
            })?;
            conns.push(conn);
        }
        Ok(Side {
            cluster: self.cluster,
            picker: self.picker,
            conns,
        })
    }
}

impl Side {
    /// `shard name (address)`, for messages.
    fn shard_label(&self, shard: usize) -> String {
        let s = &self.cluster.shards[shard];
        format!("{} ({})", s.name, s.primary().address)
    }

    /// Sends each command to its shard (pipelined per shard) and returns the replies in the
    /// order of `cmds`.
    async fn run(&mut self, cmds: &[(usize, Vec<Bytes>)]) -> Result<Vec<Frame>, String> {
        let mut out: Vec<Option<Frame>> = (0..cmds.len()).map(|_| None).collect();
        for (shard, conn) in self.conns.iter_mut().enumerate() {
            let idx: Vec<usize> = (0..cmds.len()).filter(|&i| cmds[i].0 == shard).collect();
            if idx.is_empty() {
                continue;
            }
            let batch: Vec<&[Bytes]> = idx.iter().map(|&i| cmds[i].1.as_slice()).collect();
            let replies = conn.pipeline(&batch).await.map_err(|e| {
                format!(
                    "cluster \"{}\" shard \"{}\": {e}",
                    self.cluster.name, self.cluster.shards[shard].name
                )
            })?;
            for (i, r) in idx.into_iter().zip(replies) {
                out[i] = Some(r);
            }
        }
        Ok(out.into_iter().map(|r| r.unwrap_or(Frame::Null)).collect())
    }
}

// === Conn ===

/// A plain RESP connection to one Redis server.
struct Conn {
    addr: SocketAddr,
    stream: TcpStream,
    buf: BytesMut,
    out: BytesMut,
    scanner: ReplyScanner,
}

impl Conn {
    /// Connects, then authenticates and selects the database as the proxy's pools do.
    async fn connect(
        addr: SocketAddr,
        connect_timeout: Duration,
        auth: Option<&UpstreamAuth>,
        db: u32,
    ) -> Result<Conn, String> {
        let stream = timeout(connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("{addr}: connect timed out after {connect_timeout:?}"))?
            .map_err(|e| format!("{addr}: connect: {e}"))?;
        stream.set_nodelay(true).ok();
        let mut conn = Conn {
            addr,
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            out: BytesMut::with_capacity(16 * 1024),
            scanner: ReplyScanner::new(),
        };
        if let Some(auth) = auth {
            let mut cmd = vec![Bytes::from_static(b"AUTH")];
            if let Some(user) = &auth.username {
                cmd.push(Bytes::from(user.clone()));
            }
            cmd.push(Bytes::from(auth.password.clone()));
            conn.expect_ok(&cmd, "AUTH").await?;
        }
        if db != 0 {
            let cmd = [Bytes::from_static(b"SELECT"), Bytes::from(db.to_string())];
            conn.expect_ok(&cmd, "SELECT").await?;
        }
        Ok(conn)
    }

    async fn expect_ok(&mut self, cmd: &[Bytes], what: &str) -> Result<(), String> {
        match self.pipeline(&[cmd]).await?.pop() {
            Some(Frame::Simple(s)) if &s[..] == b"OK" => Ok(()),
            Some(other) => Err(format!(
                "{}: {what} failed: {}",
                self.addr,
                show_frame(&other)
            )),
            None => Err(format!("{}: {what}: no reply", self.addr)),
        }
    }

    /// Writes every command in one write, then reads one reply per command.
    async fn pipeline(&mut self, cmds: &[&[Bytes]]) -> Result<Vec<Frame>, String> {
        self.out.clear();
        for cmd in cmds {
            encode_command(cmd, &mut self.out);
        }
        timeout(IO_TIMEOUT, self.stream.write_all(&self.out))
            .await
            .map_err(|_| format!("{}: write timed out", self.addr))?
            .map_err(|e| format!("{}: write: {e}", self.addr))?;
        let mut replies = Vec::with_capacity(cmds.len());
        while replies.len() < cmds.len() {
            replies.push(self.read_reply().await?);
        }
        Ok(replies)
    }

    async fn read_reply(&mut self) -> Result<Frame, String> {
        loop {
            let cut = self
                .scanner
                .scan(&self.buf, &REPLY_LIMITS)
                .map_err(|e| format!("{}: {e}", self.addr))?;
            if let Some(len) = cut {
                let reply = self.buf.split_to(len).freeze();
                return parse_reply(&reply).map_err(|e| format!("{}: {e}", self.addr));
            }
            self.buf.reserve(64 * 1024);
            let n = timeout(IO_TIMEOUT, self.stream.read_buf(&mut self.buf))
                .await
                .map_err(|_| format!("{}: no reply within {IO_TIMEOUT:?}", self.addr))?
                .map_err(|e| format!("{}: read: {e}", self.addr))?;
            if n == 0 {
                return Err(format!("{}: connection closed", self.addr));
            }
        }
    }
}

// === Compare ===

/// The comparison run: its settings and tallies.
struct Compare {
    report: Report,
    sample_big: u64,
}

/// What one key looks like on both sides after `TYPE` and `PTTL`.
struct KeyState {
    key: Bytes,
    kind: Bytes,
    source_pttl: i64,
    target_pttl: i64,
    target_shard: usize,
}

/// Value commands of one collection type.
struct Collection {
    /// Its size command (`HLEN`, ...).
    len: &'static [u8],
    /// What one element is called in details.
    unit: &'static str,
}

fn collection(kind: &[u8]) -> Option<Collection> {
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
fn fetch_all(kind: &[u8], key: &Bytes) -> Option<Vec<Bytes>> {
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
    async fn run(&mut self, args: &Args, source: Plan, target: Plan) -> Result<(), String> {
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
    async fn batch(
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

// === replies ===

fn scan_reply(reply: Option<Frame>) -> Result<(Bytes, Vec<Bytes>), String> {
    let Some(Frame::Array(mut parts)) = reply else {
        return Err(format!("unexpected reply {}", show_opt(reply.as_ref())));
    };
    match (parts.pop(), parts.pop(), parts.is_empty()) {
        (Some(Frame::Array(keys)), Some(Frame::Bulk(cursor)), true) => {
            let keys = keys
                .into_iter()
                .map(|k| match k {
                    Frame::Bulk(b) => Ok(b),
                    other => Err(format!("unexpected key {}", show_frame(&other))),
                })
                .collect::<Result<_, _>>()?;
            Ok((cursor, keys))
        }
        _ => Err("unexpected reply shape".to_string()),
    }
}

fn type_reply(f: &Frame) -> Result<Bytes, String> {
    match f {
        Frame::Simple(t) | Frame::Bulk(t) => Ok(t.clone()),
        other => Err(show_frame(other)),
    }
}

fn int_reply(f: &Frame) -> Result<i64, String> {
    match f {
        Frame::Integer(n) => Ok(*n),
        other => Err(show_frame(other)),
    }
}

fn string_diff(src: &Frame, tgt: &Frame) -> Option<String> {
    match (src, tgt) {
        (Frame::Bulk(a), Frame::Bulk(b)) if a == b => None,
        (Frame::Bulk(a), Frame::Bulk(b)) => Some(format!(
            "string: {} ({} bytes) on source, {} ({} bytes) on target",
            preview(a),
            a.len(),
            preview(b),
            b.len()
        )),
        (a, b) => Some(error_diff(a, b)),
    }
}

/// Detail for value replies that are not what the type promised (the key changed between
/// the TYPE and the value command, usually).
fn error_diff(src: &Frame, tgt: &Frame) -> String {
    format!(
        "unexpected replies: {} from source, {} from target",
        show_frame(src),
        show_frame(tgt)
    )
}

fn bulks(f: &Frame) -> Option<Vec<Bytes>> {
    match f {
        Frame::Array(items) => items
            .iter()
            .map(|i| match i {
                Frame::Bulk(b) => Some(b.clone()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// Compares two whole collections of type `kind`; a description of the first difference.
fn collection_diff(kind: &[u8], src: &Frame, tgt: &Frame) -> Option<String> {
    let (Some(a), Some(b)) = (bulks(src), bulks(tgt)) else {
        return Some(error_diff(src, tgt));
    };
    match kind {
        b"hash" => {
            let map = |v: Vec<Bytes>| -> BTreeMap<Bytes, Bytes> {
                v.chunks(2)
                    .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
                    .collect()
            };
            let (a, b) = (map(a), map(b));
            let field = a
                .iter()
                .find(|(f, v)| b.get(*f) != Some(*v))
                .map(|(f, _)| f)
                .or_else(|| b.keys().find(|f| !a.contains_key(*f)))?;
            Some(format!(
                "hash: field {} is {} on source, {} on target",
                preview(field),
                a.get(field).map_or("absent".to_string(), |v| preview(v)),
                b.get(field).map_or("absent".to_string(), |v| preview(v))
            ))
        }
        b"set" => {
            let (mut a, mut b) = (a, b);
            a.sort();
            b.sort();
            if a == b {
                return None;
            }
            let only_a = a.iter().find(|m| b.binary_search(m).is_err());
            let only_b = b.iter().find(|m| a.binary_search(m).is_err());
            Some(match (only_a, only_b) {
                (Some(m), _) => format!("set: member {} only on source", preview(m)),
                (None, Some(m)) => format!("set: member {} only on target", preview(m)),
                (None, None) => "set: members differ".to_string(),
            })
        }
        b"zset" => {
            let pairs = |v: &[Bytes]| -> Vec<(Bytes, Bytes)> {
                v.chunks(2)
                    .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
                    .collect()
            };
            let (a, b) = (pairs(&a), pairs(&b));
            let same_score = |x: &Bytes, y: &Bytes| {
                x == y || matches!((score(x), score(y)), (Some(p), Some(q)) if p == q)
            };
            let at = (0..a.len().max(b.len())).find(|&i| match (a.get(i), b.get(i)) {
                (Some((ma, sa)), Some((mb, sb))) => ma != mb || !same_score(sa, sb),
                _ => true,
            })?;
            let show = |p: Option<&(Bytes, Bytes)>| match p {
                Some((m, s)) => format!("{} (score {})", preview(m), String::from_utf8_lossy(s)),
                None => "nothing".to_string(),
            };
            Some(format!(
                "zset: rank {at} is {} on source, {} on target",
                show(a.get(at)),
                show(b.get(at))
            ))
        }
        _ => {
            // list: order matters.
            let at = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))?;
            let show = |x: Option<&Bytes>| x.map_or("nothing".to_string(), |v| preview(v));
            Some(format!(
                "{}: index {at} is {} on source, {} on target",
                String::from_utf8_lossy(kind),
                show(a.get(at)),
                show(b.get(at))
            ))
        }
    }
}

fn score(s: &[u8]) -> Option<f64> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

// === report ===

/// Kinds of mismatch, as the summary names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    MissingInTarget,
    TypeMismatch,
    ValueMismatch,
    TtlMismatch,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::MissingInTarget => "missing_in_target",
            Kind::TypeMismatch => "type_mismatch",
            Kind::ValueMismatch => "value_mismatch",
            Kind::TtlMismatch => "ttl_mismatch",
        })
    }
}

/// Tallies, and the mismatches printed so far.
struct Report {
    max_shown: usize,
    scanned: u64,
    vanished: u64,
    missing_in_target: u64,
    type_mismatch: u64,
    value_mismatch: u64,
    ttl_mismatch: u64,
    /// Keys with at least one mismatch (a key may have a value and a TTL mismatch).
    bad_keys: u64,
    /// Keys of the current batch with a mismatch, counted into `bad_keys` at its end.
    batch_bad: HashSet<Bytes>,
    shown: usize,
    total: u64,
}

impl Report {
    fn new(max_shown: usize) -> Self {
        Report {
            max_shown,
            scanned: 0,
            vanished: 0,
            missing_in_target: 0,
            type_mismatch: 0,
            value_mismatch: 0,
            ttl_mismatch: 0,
            bad_keys: 0,
            batch_bad: HashSet::new(),
            shown: 0,
            total: 0,
        }
    }

    fn add(&mut self, key: &Bytes, kind: Kind, detail: String) {
        *match kind {
            Kind::MissingInTarget => &mut self.missing_in_target,
            Kind::TypeMismatch => &mut self.type_mismatch,
            Kind::ValueMismatch => &mut self.value_mismatch,
            Kind::TtlMismatch => &mut self.ttl_mismatch,
        } += 1;
        self.batch_bad.insert(key.clone());
        self.total += 1;
        if self.shown < self.max_shown {
            self.shown += 1;
            println!("{kind} {}: {detail}", quote(key));
        }
    }

    /// Closes a batch: its mismatched keys join the total.
    fn end_batch(&mut self) {
        self.bad_keys += self.batch_bad.len() as u64;
        self.batch_bad.clear();
    }

    /// Prints what was not shown and the summary line.
    fn finish(&self) {
        if self.total > self.shown as u64 {
            println!(
                "... {} more mismatches not shown (--max-mismatches {})",
                self.total - self.shown as u64,
                self.max_shown
            );
        }
        if self.vanished > 0 {
            println!(
                "{} scanned keys were deleted or expired on the source before they were compared",
                self.vanished
            );
        }
        let matched = self.scanned.saturating_sub(self.vanished + self.bad_keys);
        println!(
            "scanned {}, matched {matched}, missing_in_target {}, type_mismatch {}, value_mismatch {}, ttl_mismatch {}",
            self.scanned, self.missing_in_target, self.type_mismatch, self.value_mismatch, self.ttl_mismatch
        );
    }
}

// === display helpers ===

/// `"..."` with printable ASCII as is, `"` and `\` escaped, other bytes as `\xHH`.
fn quote(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() + 2);
    s.push('"');
    for &c in b {
        match c {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(char::from(c)),
            _ => {
                let _ = write!(s, "\\x{c:02x}");
            }
        }
    }
    s.push('"');
    s
}

/// [`quote`] of at most [`PREVIEW`] bytes, with `...` when cut.
fn preview(b: &[u8]) -> String {
    if b.len() <= PREVIEW {
        quote(b)
    } else {
        format!("{}...", quote(&b[..PREVIEW]))
    }
}

fn show_frame(f: &Frame) -> String {
    match f {
        Frame::Simple(s) => format!("+{}", String::from_utf8_lossy(s)),
        Frame::Error(s) => format!("-{}", String::from_utf8_lossy(s)),
        Frame::Integer(n) => format!(":{n}"),
        Frame::Bulk(b) => preview(b),
        Frame::Null | Frame::NullArray | Frame::Nil => "nil".to_string(),
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => {
            format!("an array of {}", items.len())
        }
        Frame::Map(pairs) => format!("a map of {}", pairs.len()),
        Frame::Boolean(b) => format!("#{}", if *b { 't' } else { 'f' }),
        Frame::Double(t) | Frame::BigNumber(t) => String::from_utf8_lossy(t).into_owned(),
        Frame::BlobError(s) => format!("-{}", String::from_utf8_lossy(s)),
        Frame::Verbatim(b) => preview(b),
    }
}

fn show_opt(f: Option<&Frame>) -> String {
    f.map_or("none".to_string(), show_frame)
}

fn show_ttl(pttl: i64) -> String {
    if pttl >= 0 {
        format!("TTL {pttl} ms")
    } else {
        "no TTL".to_string()
    }
}

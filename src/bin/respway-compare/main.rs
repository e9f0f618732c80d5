//! `respway-compare`: checks that every key of one cluster is also, with the same type, value
//! and TTL, in another cluster — the "verify" step of an online migration (dual-write →
//! backfill → **compare** → switch reads → stop dual-write), run against the real shards,
//! not through the proxy. With `--repair` it is also the backfill: it copies each key that
//! differs from the source to the target and verifies it ([`repair`]).
//!
//! ```text
//! respway-compare --config respway.yaml --source old --target new [--rate 5000] [--limit N]
//!     [--ttl-tolerance 1000] [--repair [--repair-rounds 3] [--prune]]
//!     [--prefix P] [--skip-prefix P]... [--ignore-case] [--keys FILE]
//! respway-compare ... --move [...]        (move mode's background mover, below)
//! respway-compare ... --cleanup [--apply] (copy mode's cleanup, below)
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
//!   by type and TTL only. TTLs differ when one side has one and the other not (`PTTL` ≥ 0
//!   vs -1), or when both have one and they are more than `--ttl-tolerance` ms apart.
//! - With `--repair`, after each page: its differing keys are copied and compared again, up
//!   to `--repair-rounds` times ([`repair`] says how). With `--prune` too, afterwards: each
//!   target key its source owner lacks is deleted from the target ([`prune`]), and
//!   `pruned N` follows the summary.
//! - Paces itself to at most `--rate` keys per second on average (keys scanned plus keys
//!   copied).
//!
//! The scope, in every mode (compare, `--repair`, `--prune`, `--move`, `--plan`, `--cleanup`;
//! [`scope`]): with `--prefix P` (at most one) only the keys that start with P are looked at,
//! the SCANs asking for `MATCH <P>*` (P glob-escaped: `*`, `?`, `[`, `]`, `\` behind a
//! backslash) so that the shards skip the others; with `--skip-prefix P` (repeatable) the
//! keys that start with any such P are left out after the SCAN; `--ignore-case` matches both
//! ignoring ASCII case (a listener's `case_insensitive: true`). A key out of scope is not
//! counted as scanned, compared, copied, moved or deleted: `--prune`'s walk of the target and
//! the cleanup's of the source look at the keys in scope only too. `respway-xds reshard`
//! passes the route's prefix, and the longer prefixes of the listener's other routes, so that
//! the keys of other routes on the same cluster stay where they are.
//!
//! With `--keys FILE` (with a compare or `--repair [--prune]`, not with `--move`, `--cleanup`
//! or `--limit`; [`listed`]) the source is not SCANned: the keys FILE lists are checked, one
//! per line, hex-encoded in either case (an empty line is skipped; a line that is not hex:
//! exit 2, naming its number; `-`: stdin). Those in scope are grouped by their source shard
//! and compared (repaired) in pages of `--count`, each as a SCAN page is, paced by `--rate`;
//! a listed key on neither side counts as scanned and gone from the source. With `--prune`
//! no target shard is walked: each listed key its source owner lacks is deleted (`UNLINK`)
//! from its target owner (`pruned N`). Copy mode's write pause checks this way only the keys
//! written since dual write began, which the sidecars report hex-encoded. The summary and
//! exit codes are a compare's (a repair's).
//!
//! With `--move` it does not compare: it is move mode's background mover ([`mover`]),
//! which MIGRATEs every source key whose owner in the target is another Redis:
//!
//! ```text
//! respway-compare --config F --source old --target new --move [--rate N] [--count N]
//!     [--checkpoint FILE] [--bytes-rate N] [--max-key-bytes N] [--progress] [--plan]
//! ```
//!
//! - `--checkpoint FILE`: its state is written to FILE (after batches and pages, at most every
//!   200 ms, and when a shard is done), and a run that finds FILE resumes from it ([`checkpoint`]); FILE of another
//!   `--source`/`--target`, or of another scope: exit 2.
//! - `--bytes-rate N`: also at most N bytes (the keys' `MEMORY USAGE`) sent per second.
//! - `--max-key-bytes N` (default 8 MiB, 0: no bound): a larger key is not moved, it is
//!   listed on stderr as `big "key": N bytes, not moved` (`MIGRATE` blocks the source shard
//!   while it serializes a key).
//! - `--progress`: every second (when a counter moved) and at the end, on stderr, `progress
//!   scanned=N sent=S kept=K absent=A failed=F big=B bytes=BYTES shard=I/NSHARDS elapsed_ms=MS
//!   run_sent=R` (I: the source shard walked, from 1; bytes: `MEMORY USAGE` of the keys sent;
//!   R: keys this run sent, the others counting since the checkpoint began), the last with
//!   ` done=1`.
//! - Its summary (stdout): `scanned N, sent S, kept K, absent A, failed F, big B`; exit 0, or 1
//!   when F or B > 0.
//! - `--plan`: moves nothing; prints per source shard `plan shard LABEL: scanned N, move M,
//!   keep K, bytes B` (LABEL: `name (address)`), then `plan: scanned N, move M, keep K, bytes
//!   B, big G, estimate S s` (S: whole seconds at `--rate` and `--bytes-rate`); exit 0.
//!
//! With `--cleanup [--apply]` it is copy mode's last step ([`cleanup`]), after the cut-over:
//! refused (exit 2) while a route of the configuration that may handle a key of the scope
//! still sends commands to the source (as its cluster, or through a mirror that is not
//! `forward`); then
//! each source key whose owner in the target is another Redis (address or `db`) is obsolete,
//! whatever its value, and is deleted from the source (`UNLINK`; without `--apply`, listed as
//! `would delete "key"`, the first `--max-mismatches`); keys whose owner is the same Redis
//! stay. Nothing is copied to the target. Summary: `cleanup: scanned N, deletable D, kept K,
//! deleted 0 (dry run; --apply deletes)`, with `--apply` `... deleted D`; exit 0. Paced by
//! `--rate` keys scanned.
//!
//! `--repair` is refused (exit 2) once no route answers from the source and one answers from
//! the target: after the cut-over the source is the stale side.
//!
//! It is one-way: keys that exist only in the target are not reported (swap `--source` and
//! `--target` to find them). On a live keyspace, SCAN may return a key twice (it is then
//! compared twice), and a key deleted or expired on the source between SCAN and TYPE is
//! counted as scanned but neither matched nor mismatched (a separate line says how many).
//!
//! Output (stdout): the first `--max-mismatches` mismatches as they are found, one per line
//! (`kind "key": detail`), then the summary line
//! `scanned N, matched M, missing_in_target X, type_mismatch Y, value_mismatch Z, ttl_mismatch W`
//! (the mismatches found before any repair), with `--repair` followed by `, repaired R,
//! unsettled U`; before it, every key `--repair` could not make equal (`unsettled "key":
//! reason`). Progress and errors go to stderr.
//!
//! Exit code: 0 when every scanned key matched (with `--repair`: when no key is unsettled),
//! 1 when some did not, 2 on a usage or configuration error, 3 when the comparison could not
//! be completed (a shard unreachable, refused `AUTH`, an error reply to `SCAN`/`TYPE`/`PTTL`,
//! a timeout).

// A CLI whose report on stdout is its product: printing there is the point.
#![allow(
    clippy::print_stdout,
    reason = "a CLI whose report on stdout is its product"
)]

use std::collections::{BTreeMap, HashSet};
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
    /// Most keys per second, on average: keys scanned plus keys copied (a compare, --repair,
    /// --cleanup), or keys sent in MIGRATEs (--move). 0: no limit.
    #[arg(long, default_value_t = 5000)]
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
    /// Largest difference, in ms, between the source's and the target's PTTL of a key that
    /// still counts as the same TTL.
    #[arg(long, default_value_t = 1000)]
    ttl_tolerance: u64,
    /// Copy each key that differs from the source to the target, then verify it.
    #[arg(long)]
    repair: bool,
    /// With --repair: most copies of one key before it is listed as unsettled.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    repair_rounds: u32,
    /// With --repair, after it: delete (UNLINK) from the target every key its source owner
    /// does not hold (a copy that resurrected a key deleted on the source, e.g. by a backfill
    /// killed between its copy and its check). Only during copy mode's write pause: while
    /// writes and copies flow, a key may be on the target before the source's delete reaches
    /// it, and the target's cluster must hold nothing but the source's keys.
    #[arg(long, requires = "repair")]
    prune: bool,
    /// Move mode's background mover: instead of comparing, MIGRATE every key of the source
    /// whose owner in the target is another Redis (paced by --rate).
    #[arg(long = "move", conflicts_with = "repair")]
    move_keys: bool,
    /// With --move: keep the mover's state in FILE (written every 200 ms and when a shard is done) and
    /// resume from it when it exists.
    #[arg(long, value_name = "FILE", requires = "move_keys")]
    checkpoint: Option<PathBuf>,
    /// With --move: most bytes (MEMORY USAGE of the keys sent) moved per second, on average.
    #[arg(long, value_name = "N", requires = "move_keys",
          value_parser = clap::value_parser!(u64).range(1..))]
    bytes_rate: Option<u64>,
    /// With --move: keys larger than this (MEMORY USAGE, bytes) are not moved but listed;
    /// 0: no bound.
    #[arg(long, value_name = "N", default_value_t = 8 * 1024 * 1024)]
    max_key_bytes: u64,
    /// With --move: a progress line on stderr every second and at the end.
    #[arg(long, requires = "move_keys")]
    progress: bool,
    /// With --move: move nothing; count per source shard the keys that would move and their
    /// bytes, and estimate the time at --rate and --bytes-rate.
    #[arg(long, requires = "move_keys", conflicts_with = "checkpoint")]
    plan: bool,
    /// Copy mode's cleanup, after the cut-over (refused while a route answers from the
    /// source): delete from the source each key whose owner in the target is another Redis,
    /// whatever its value. A dry run without --apply.
    #[arg(long, conflicts_with_all = ["repair", "move_keys"])]
    cleanup: bool,
    /// With --cleanup: delete (UNLINK) instead of listing.
    #[arg(long, requires = "cleanup")]
    apply: bool,
    /// Only keys that start with P (in every mode): the SCANs ask for `MATCH <P>*`; other keys
    /// are not counted, compared, copied, moved or deleted.
    #[arg(long, value_name = "P")]
    prefix: Option<String>,
    /// Leave out the keys that start with P (repeatable; in every mode): e.g. the longer
    /// prefixes of other routes, whose keys are theirs.
    #[arg(long, value_name = "P")]
    skip_prefix: Vec<String>,
    /// --prefix and --skip-prefix match ignoring ASCII case (a listener's
    /// `case_insensitive: true`).
    #[arg(long)]
    ignore_case: bool,
    /// Instead of SCANning the source, compare (or --repair) the keys listed in FILE: one per
    /// line, hex-encoded (empty lines skipped); `-`: stdin. With --prune: each listed key its
    /// source owner lacks is deleted from the target, and no target shard is walked.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["move_keys", "cleanup", "limit"])]
    keys: Option<PathBuf>,
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
    let scope = Arc::new(Scope::new(
        args.prefix.as_deref(),
        &args.skip_prefix,
        args.ignore_case,
    ));
    if !scope.is_all() {
        eprintln!("keys in scope: {}", scope.describe());
    }
    let (source, target) = (source.scoped(scope.clone()), target.scoped(scope.clone()));
    // The listed keys are read before anything connects: a bad line is a usage error.
    let listed = match args.keys.as_deref().map(listed::read) {
        Some(Ok(keys)) => Some(keys),
        Some(Err(e)) => {
            eprintln!("respway-compare: {e}");
            return ExitCode::from(2);
        }
        None => None,
    };
    let mut cmp = Compare {
        report: Report::new(args.max_mismatches, args.repair),
        sample_big: args.sample_big,
        ttl_tolerance: args.ttl_tolerance,
        repair_rounds: args.repair.then_some(args.repair_rounds),
        rate: args.rate,
        started: Instant::now(),
        work: 0,
    };
    if args.move_keys {
        return run_move(&args, source, target).await;
    }
    if args.cleanup {
        // The cleanup deletes the source's keys: only once nothing is sent to it (after
        // the cut-over, dual write off: a move's keys not yet moved, or copies kept for a
        // rollback, are still the source's).
        if let Some(route) = sending_route(&config, &scope, &args.source) {
            eprintln!(
                "respway-compare: --cleanup refused: {route} of {} still sends commands to \
                 {:?}; the cleanup deletes {:?}'s keys once the configuration sends them only \
                 to {:?} (after the cut-over, with no mirror to the source)",
                args.config.display(),
                args.source,
                args.source,
                args.target
            );
            return ExitCode::from(2);
        }
        return match cmp.run_cleanup(&args, source, target).await {
            Err(e) => {
                eprintln!("respway-compare: {e}");
                ExitCode::from(3)
            }
            Ok(c) => {
                println!("{}", c.summary(args.apply));
                ExitCode::SUCCESS
            }
        };
    }
    // After the cut-over the source is the stale side: a copy to the target would overwrite
    // the writes it took since.
    if args.repair
        && answering_route(&config, &scope, &args.source).is_none()
        && answering_route(&config, &scope, &args.target).is_some()
    {
        eprintln!(
            "respway-compare: --repair refused: no route of {} answers from {:?} and {:?} \
             answers them: after the cut-over {:?} is the stale side, and copying it to {:?} \
             would overwrite newer writes; --cleanup removes {:?}'s keys",
            args.config.display(),
            args.source,
            args.target,
            args.source,
            args.target,
            args.source
        );
        return ExitCode::from(2);
    }
    let result = match listed {
        Some(keys) => cmp.run_listed(&args, keys, source, target).await,
        None => cmp.run(&args, source, target).await,
    };
    cmp.report.finish();
    if args.prune && result.is_ok() {
        println!("pruned {}", cmp.report.pruned);
    }
    match result {
        Err(e) => {
            eprintln!("respway-compare: {e}");
            ExitCode::from(3)
        }
        Ok(()) if cmp.report.repairing && cmp.report.unsettled > 0 => ExitCode::from(1),
        Ok(()) if !cmp.report.repairing && cmp.report.bad_keys > 0 => ExitCode::from(1),
        Ok(()) => ExitCode::SUCCESS,
    }
}

/// Every route of `config` (described as `listener "L" route "P"` or `... catch-all`) with its
/// cluster and mirrors that may handle a key of `scope`: a prefix route whose keys are not all
/// skipped and meet the scope's prefix (one starts with the other); the catch-all unless a
/// prefix route of its listener takes every key of the scope's prefix (the longest prefix
/// wins).
fn routes<'a>(
    config: &'a respway_filters::model::Config,
    scope: &'a Scope,
) -> impl Iterator<Item = (String, &'a str, &'a [respway_filters::model::MirrorPolicy])> {
    let starts = move |s: &[u8], p: &[u8]| {
        s.len() >= p.len()
            && if scope.ignore_case {
                s[..p.len()].eq_ignore_ascii_case(p)
            } else {
                s[..p.len()] == *p
            }
    };
    config.listeners.iter().flat_map(move |l| {
        let t = &l.routes;
        let covered = scope
            .prefix
            .as_deref()
            .is_some_and(|p| t.routes.iter().any(|r| starts(p, r.prefix.as_bytes())));
        let catch_all = (t.catch_all.iter())
            .filter(move |_| !covered)
            .map(move |c| {
                let what = format!("listener {:?} catch-all", l.name);
                (what, c.as_str(), t.catch_all_mirrors.as_slice())
            });
        let prefixes = t
            .routes
            .iter()
            .filter(move |r| {
                let q = r.prefix.as_bytes();
                !scope.skip.iter().any(|s| starts(q, s))
                    && scope
                        .prefix
                        .as_deref()
                        .is_none_or(|p| starts(q, p) || starts(p, q))
            })
            .map(move |r| {
                let what = format!("listener {:?} route {:?}", l.name, r.prefix);
                (what, r.cluster.as_str(), r.mirrors.as_slice())
            });
        catch_all.chain(prefixes)
    })
}

/// The first route of `config` that answers commands from cluster `name`: its own cluster,
/// unless a new-first dual write answers from the mirror instead; a mirror that answers
/// (new-first dual write; move, whose moved keys are read there, as the route's cluster still
/// answers for those not moved). `None`: no command is answered from it.
fn answering_route(
    config: &respway_filters::model::Config,
    scope: &Scope,
    name: &str,
) -> Option<String> {
    use respway_filters::model::MirrorMode;
    let new_first = |m: &respway_filters::model::MirrorPolicy| {
        m.mode
            == MirrorMode::DualWrite {
                target_is_primary: true,
            }
    };
    routes(config, scope)
        .find(|(_, cluster, mirrors)| {
            (*cluster == name && !mirrors.iter().any(new_first))
                || mirrors
                    .iter()
                    .any(|m| m.cluster == name && (new_first(m) || m.mode == MirrorMode::Move))
        })
        .map(|(what, _, _)| what)
}

/// The first route of `config` that sends any command to cluster `name`: as its cluster, or
/// as a mirror that is not `forward` (copies, a move, a read-only window). `None`: nothing
/// is sent to it, so what it holds is nobody's.
fn sending_route(
    config: &respway_filters::model::Config,
    scope: &Scope,
    name: &str,
) -> Option<String> {
    use respway_filters::model::MirrorMode;
    routes(config, scope)
        .find(|(_, cluster, mirrors)| {
            *cluster == name
                || mirrors
                    .iter()
                    .any(|m| m.cluster == name && m.mode != MirrorMode::Forward)
        })
        .map(|(what, _, _)| what)
}

/// `--move` (and `--plan`): from the checkpoint when there is one.
async fn run_move(args: &Args, source: Plan, target: Plan) -> ExitCode {
    let saved = match &args.checkpoint {
        Some(path) => match Checkpoint::load(path, &source.cluster, &target.cluster, &source.scope)
        {
            Ok(saved) => saved,
            Err(e) => {
                eprintln!("respway-compare: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let cp = match saved {
        Some(cp) => {
            let done = cp.shards.iter().filter(|s| s.1 == Cursor::Done).count();
            eprintln!(
                "resuming from --checkpoint {}: {done} of {} source shards done, {}",
                args.checkpoint
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .display(),
                cp.shards.len(),
                cp.moves.summary()
            );
            cp
        }
        None => Checkpoint::fresh(
            args.checkpoint.clone(),
            &source.cluster,
            &target.cluster,
            &source.scope,
        ),
    };
    match mover::run(args, source, target, cp).await {
        Err(e) => {
            eprintln!("respway-compare: {e}");
            ExitCode::from(3)
        }
        Ok(_) if args.plan => ExitCode::SUCCESS,
        Ok(m) => {
            println!("{}", m.summary());
            if m.failed > 0 || m.big > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}

mod checkpoint;
mod cleanup;
mod compare;
mod diff;
mod listed;
mod mover;
mod prune;
mod repair;
mod report;
mod scope;
mod side;

use checkpoint::{Checkpoint, Cursor};
use compare::Compare;
use report::Report;
use scope::Scope;
use side::{Plan, Side};

#[cfg(test)]
mod tests;

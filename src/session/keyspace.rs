//! Commands over the whole keyspace: `SCAN`, `KEYS`, `DBSIZE`, `RANDOMKEY`, `FLUSHDB`,
//! `FLUSHALL`.
//!
//! They go to the **shards**: every primary of every cluster a route of the listener sends to
//! (the catch-all's and the prefix routes' clusters, not their mirror clusters), in the fixed
//! order cluster index, then shard index ([`Routing::keyspace_clusters`]). Replicas are not
//! asked: they hold what their primary holds. Like the session's other commands they go over
//! its shared connections of its protocol and database.
//!
//! - `SCAN cursor [MATCH p] [COUNT n] [TYPE t]` walks the shards one after the other. The
//!   proxy's cursor is `shard_cursor << 16 | shard` ([`encode_cursor`]): the low 16 bits hold
//!   the shard's position in the list above, the rest the cursor that shard returned. Cursor 0
//!   is shard 0 from its start, and respway answers 0 only once the last shard has answered 0.
//!   `MATCH`, `COUNT` and `TYPE` go to the shard as given. When a shard's batch comes back empty
//!   respway goes on (to that shard's next cursor, or the next shard) within the same call, at
//!   most [`SCAN_STEPS`] shard calls, so a sparse shard costs the client fewer round trips.
//!   Redis's contract holds over the whole walk: a key present from start to end is returned
//!   at least once (each shard keeps it for its own part of the walk). A cursor that is not a
//!   number, or names a shard past the last one, is `-ERR invalid cursor`.
//! - `KEYS pattern` asks every shard and merges; more than the listener's `keys_max` keys is
//!   refused (each shard's whole reply is held before the merge).
//! - `DBSIZE` sums every shard's count (a hot key counts once per shard: it is stored there).
//! - `RANDOMKEY` asks a random shard, then the next ones in order while they answer nil.
//! - `FLUSHDB` / `FLUSHALL` go to every shard when the listener's `admin_commands` allows them;
//!   otherwise they are refused before anything is sent. Not being copied to a `dual_write`
//!   mirror, one that runs marks every record of write copies incomplete
//!   (`respway_filters::write_record`).
//!
//! On a connection to a node of an **emulated cluster** that owns some slots but not all
//! (`cluster_emulation` with announced sidecars: [`Call::owned`], from
//! `cluster_emulation::owned_slots`), `SCAN`, `KEYS`, `DBSIZE` and `RANDOMKEY` cover only the
//! keys whose Redis Cluster slot (CRC16 of the key as the client names it, or of its
//! `{hashtag}`) that node owns, so a client that walks the cluster node by node sees each key
//! once:
//!
//! - `SCAN` and `KEYS` drop the other keys from what the shards list (a `SCAN` page may come
//!   back emptier, its cursor is the same).
//! - `DBSIZE` counts: it walks every shard with `SCAN 0.. COUNT` [`COUNT_PAGE`] (the shards at
//!   once, each page with the listener's `op_timeout`) and counts the keys of the node's slots,
//!   as the `SCAN` walk would list them. It costs a read of every key name of every shard, and
//!   may run for [`COUNT_WALK`] or the listener's `op_timeout`, the longer (then an error).
//! - `RANDOMKEY` asks random shards up to [`RANDOM_TRIES`] times for a key of the node's
//!   slots, then walks the shards (from a random one) for the first page holding one; nil when
//!   none exists.
//!
//! `FLUSHDB` / `FLUSHALL` still empty every shard. Which slots a node owns is read once per
//! command: a walk that goes on while the live nodes change covers, page by page, the keys
//! of the slots the node owns when each page is read.
//!
//! (`emulated.rs` holds that `DBSIZE` and `RANDOMKEY`; `glob.rs` Redis's glob matching.)
//!
//! Two things change the keys listed:
//!
//! - **Prefix routes with `remove_prefix`**: the cluster stores keys without the prefix; the
//!   prefix is put back on every key listed from it. A `MATCH` / `KEYS` pattern is narrowed for
//!   such a cluster: a pattern that starts with the prefix as literal text is sent with the
//!   prefix cut off; a pattern whose literal start contradicts the prefix skips the cluster; any
//!   other pattern (`*x`) is sent as `*` and matched here, on the key with its prefix ([`glob`],
//!   Redis's `stringmatchlen` rules).
//! - **Hot keys** are stored on every shard of their cluster. Each is listed once: from the
//!   shard the cluster's picker maps it to (where the key would live if it were not hot).

use std::ops::ControlFlow::{Break, Continue};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::Rng;
use respway_filters::command::KeyspaceKind;
use respway_filters::error::{Answer, Failure, Kind};
use respway_filters::hash::slots::redis_cluster_slot;
use respway_filters::model::HashTag;
use respway_filters::request::{error_reply, Flavor, Reply};
use respway_filters::resp::{parse_reply, Frame};
use respway_filters::routing::Routing;
use tokio::time::Instant;

use crate::session::scatter::{self, BoxReply, Order, Sent};
use crate::stack::Parts;

mod emulated;
mod glob;

use emulated::{count_owned, random_owned_key};
use glob::glob;

/// Bits of the proxy's SCAN cursor that hold the shard's position.
const SHARD_BITS: u32 = 16;
/// Most shards a SCAN cursor can name.
const MAX_SHARDS: usize = 1 << SHARD_BITS;
/// Shard cursors from this value on do not fit in the proxy's cursor (a Redis table that
/// large would need petabytes of memory for its buckets alone).
const SHARD_CURSOR_LIMIT: u64 = 1 << (64 - SHARD_BITS);
/// Most shard calls one `SCAN` makes while the batches come back empty.
pub(crate) const SCAN_STEPS: usize = 16;
/// `COUNT` of each page of `DBSIZE`'s and `RANDOMKEY`'s walks on a node of an emulated
/// cluster.
pub(crate) const COUNT_PAGE: &str = "1000";
/// How long `DBSIZE`'s walk on a node of an emulated cluster may run at least (the
/// listener's `op_timeout` when longer).
pub(crate) const COUNT_WALK: Duration = Duration::from_secs(10);
/// `RANDOMKEY` calls on a node of an emulated cluster before it walks for a key of its slots.
pub(crate) const RANDOM_TRIES: usize = 16;

/// One keyspace-wide command as the session hands it over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) kind: KeyspaceKind,
    /// The session's protocol and database.
    pub(crate) flavor: Flavor,
    /// Which of each endpoint's shared connections the session uses.
    pub(crate) conn: usize,
    /// The upstream deadline (the listener's `op_timeout` from dispatch).
    pub(crate) deadline: Instant,
    /// The slots (first, last) of the connection's node in an emulated cluster, when it owns
    /// some but not all: only their keys are covered (`None`: every key).
    pub(crate) owned: Option<(u32, u32)>,
}

/// Whether `key` (as the client names it) is in `owned`'s slots.
#[inline]
fn owns(owned: (u32, u32), key: &[u8]) -> bool {
    let slot = redis_cluster_slot(key, Some(HashTag::default()));
    (owned.0..=owned.1).contains(&slot)
}

/// One primary the keyspace-wide commands ask.
#[derive(Debug, Clone)]
struct Shard {
    cluster: usize,
    shard: usize,
    primary: usize,
    /// Put back in front of every key listed from this shard (a `remove_prefix` route's).
    prefix: Option<Bytes>,
}

/// Sends `args` to the shards `c.kind` needs and merges the replies. The second value is the
/// deadline the command runs to when it is longer than `c.deadline` (`DBSIZE` counting a
/// node's keys: the session's backstop follows it).
pub(crate) fn call(c: Call, args: Vec<Bytes>, parts: &Parts) -> (BoxReply, Option<Instant>) {
    let shards = shards(parts);
    if shards.is_empty() {
        return (Box::pin(async { Err(Failure::new(Kind::NoTarget)) }), None);
    }
    let fut = match (c.kind, c.owned) {
        (KeyspaceKind::Scan, _) => scan(args, shards, parts, &c),
        (KeyspaceKind::Keys, _) => keys(args, shards, parts, &c),
        (KeyspaceKind::Dbsize, None) => dbsize(args, shards, parts, &c),
        (KeyspaceKind::Dbsize, Some(owned)) => {
            let op = parts.listener.op_timeout;
            let until = c.deadline + COUNT_WALK.saturating_sub(op);
            return (count_owned(shards, parts, &c, owned, until), Some(until));
        }
        (KeyspaceKind::RandomKey, None) => random_key(args, shards, parts, &c),
        (KeyspaceKind::RandomKey, Some(owned)) => random_owned_key(args, shards, parts, &c, owned),
        (KeyspaceKind::Flush, _) => flush(args, shards, parts, &c),
    };
    (fut, None)
}

/// An answer the proxy gives without asking a shard (an argument error, a refusal).
fn ready(r: Reply) -> BoxReply {
    Box::pin(async move { Ok(r) })
}

/// Every primary of every cluster a route sends to, in (cluster, shard) order, each Redis
/// once (clusters in a move share shards).
fn shards(parts: &Parts) -> Vec<Shard> {
    let mut out: Vec<Shard> = Vec::new();
    for k in parts.routing.keyspace_clusters() {
        let Some(eps) = parts.endpoints.0.get(k.cluster) else {
            continue;
        };
        let prefix = k.prefix.map(Bytes::from);
        for s in 0..eps.len() {
            let seen = out
                .iter()
                .any(|o| parts.routing.same_primary(o.cluster, o.shard, k.cluster, s));
            if seen {
                continue;
            }
            let primary = parts.primary_index(k.cluster, s);
            out.push(Shard {
                cluster: k.cluster,
                shard: s,
                primary,
                prefix: prefix.clone(),
            });
        }
    }
    out
}

/// `args` to the primary of each of `shards`, as the iterator is walked: what
/// [`scatter`]'s gatherers take.
fn each_primary<'a, P: std::borrow::Borrow<Parts> + 'a>(
    parts: P,
    shards: Vec<Shard>,
    args: Vec<Bytes>,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> impl Iterator<Item = (Shard, Sent)> + 'a {
    shards.into_iter().map(move |s| {
        let f = send(parts.borrow(), &s, args.clone(), flavor, conn, deadline);
        (s, f)
    })
}

/// Queues `args` on one shard's primary; when this worker has no handle for it, the answer
/// is an error naming the shard.
fn send(
    parts: &Parts,
    s: &Shard,
    args: Vec<Bytes>,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> Sent {
    match parts.endpoints.get(s.cluster, s.shard, s.primary) {
        Some(ep) => Sent::Left(ep.send(args, flavor, conn, deadline)),
        None => scatter::unsent(Failure::message(format!(
            "ERR respway: no connection to shard {}",
            shard_name(&parts.routing, s)
        ))),
    }
}

fn shard_name(routing: &Routing, s: &Shard) -> String {
    routing
        .clusters
        .get(s.cluster)
        .map(|c| {
            let shard = c
                .shards
                .get(s.shard)
                .map(|x| x.name.as_str())
                .unwrap_or("?");
            format!("{}/{shard}", c.name)
        })
        .unwrap_or_else(|| "?".into())
}

fn unexpected(cmd: &str, routing: &Routing, s: &Shard) -> Failure {
    Failure::message(format!(
        "ERR respway: unexpected {cmd} reply from shard {}",
        shard_name(routing, s)
    ))
}

/// Parses a shard's answer; `Err` holds the answer to give the client (the failure, the
/// shard's own error, or one naming the shard when the reply does not parse).
fn parse(r: &Answer, cmd: &str, routing: &Routing, s: &Shard) -> Result<Frame, Answer> {
    let r = r.as_ref().map_err(|f| Err(f.clone()))?;
    match parse_reply(r) {
        Ok(f) if f.is_error() => Err(Ok(r.clone())),
        Ok(f) => Ok(f),
        Err(_) => Err(Err(unexpected(cmd, routing, s))),
    }
}

// === keys as listed ===

/// How a client's pattern applies to one shard's stored keys.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Narrowed {
    /// Send this pattern; the keys it matches are what the client asked for.
    Exact(Bytes),
    /// Send `*` (or no `MATCH`) and match the client's pattern here, on the prefixed key.
    Local,
    /// No key of the shard can match.
    Nothing,
}

/// The pattern to send to a cluster whose keys are stored without `prefix`.
fn narrow(pattern: &Bytes, prefix: Option<&Bytes>) -> Narrowed {
    let Some(prefix) = prefix else {
        return Narrowed::Exact(pattern.clone());
    };
    // The pattern's literal start: each byte, and the offset in the pattern just past it.
    let p = &pattern[..];
    let mut i = 0;
    let mut matched = 0;
    while matched < prefix.len() {
        let (b, next) = match p.get(i) {
            None | Some(b'*' | b'?' | b'[') => break,
            Some(b'\\') if i + 1 < p.len() => (p[i + 1], i + 2),
            Some(&b) => (b, i + 1),
        };
        if b != prefix[matched] {
            return Narrowed::Nothing;
        }
        matched += 1;
        i = next;
    }
    if matched == prefix.len() {
        Narrowed::Exact(pattern.slice(i..))
    } else if i == p.len() {
        // The whole pattern is a literal shorter than the prefix.
        Narrowed::Nothing
    } else {
        Narrowed::Local
    }
}

/// What one shard's listed keys go through before they reach the client.
struct KeyFilter<'a> {
    routing: &'a Routing,
    /// The client's pattern, when it must be matched here.
    local: Option<&'a [u8]>,
    /// The slots of the connection's node in an emulated cluster ([`Call::owned`]).
    owned: Option<(u32, u32)>,
}

impl KeyFilter<'_> {
    /// Appends the keys of `items` (a shard's key array) that the client should see from
    /// shard `s`, as the client names them.
    fn push(&self, s: &Shard, items: Vec<Frame>, out: &mut Vec<Frame>) {
        let cluster = self.routing.clusters.get(s.cluster);
        let hot = cluster.filter(|c| !c.hot_keys.is_empty());
        for item in items {
            let key = match &item {
                Frame::Bulk(b) | Frame::Simple(b) => b.clone(),
                _ => {
                    out.push(item);
                    continue;
                }
            };
            if let Some(c) = hot {
                // A hot key is on every shard: list it from the one its picker names.
                if c.hot_keys.iter().any(|h| key.starts_with(&h.prefix))
                    && c.picker.pick(&key) != s.shard
                {
                    continue;
                }
            }
            let named = with_prefix(s.prefix.as_ref(), key);
            if let Some(pat) = self.local {
                if !glob(pat, &named) {
                    continue;
                }
            }
            if self.owned.is_some_and(|o| !owns(o, &named)) {
                continue;
            }
            out.push(Frame::Bulk(named));
        }
    }
}

// === SCAN ===

/// Bits of a SCAN cursor over a Redis Cluster that hold its slot map's tag ([`slot_map_tag`]):
/// the top ones; the shard's cursor then has 32 bits (a node's table of 4 billion buckets).
const TAG_BITS: u32 = 16;

/// Shard cursors from this value on do not fit in a cursor that carries a slot map's tag.
const TAGGED_CURSOR_LIMIT: u64 = 1 << (64 - SHARD_BITS - TAG_BITS);

/// The tag of the slot maps of the Redis Clusters among `shards` (never 0), or `None` when
/// none is a Redis Cluster.
fn slot_map_tag(routing: &respway_filters::routing::Routing, shards: &[Shard]) -> Option<u64> {
    let mut tag = None;
    let mut seen = Vec::new();
    for s in shards {
        let Some(c) = routing.clusters.get(s.cluster) else {
            continue;
        };
        if !c.redis_cluster || seen.contains(&s.cluster) {
            continue;
        }
        seen.push(s.cluster);
        tag = Some(tag.unwrap_or(0u64).rotate_left(5) ^ c.slot_map);
    }
    tag.map(|t| {
        let t = (t ^ (t >> 16) ^ (t >> 32) ^ (t >> 48)) & ((1 << TAG_BITS) - 1);
        t.max(1)
    })
}

/// The proxy's cursor for shard `shard` at that shard's cursor `sc`.
pub(crate) fn encode_cursor(shard: usize, sc: u64) -> u64 {
    (sc << SHARD_BITS) | shard as u64
}

/// The shard and shard cursor a proxy cursor names; `None` for text that is not a cursor.
pub(crate) fn decode_cursor(c: &[u8]) -> Option<(usize, u64)> {
    let v = parse_u64(c)?;
    Some(((v & (MAX_SHARDS as u64 - 1)) as usize, v >> SHARD_BITS))
}

/// A decimal `u64`, digits only (as Redis's `strtoull` reads cursors, without its sign and
/// space leniency).
fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// The positions of the `MATCH` values among SCAN's options (`args[2..]`), when they parse
/// as keyword/value pairs; else `None` (sent as given: the shard answers the syntax error).
fn match_positions(args: &[Bytes]) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    let mut i = 2;
    while i < args.len() {
        let kw = &args[i];
        if i + 1 >= args.len() {
            return None;
        }
        if kw.eq_ignore_ascii_case(b"match") {
            out.push(i + 1);
        } else if !kw.eq_ignore_ascii_case(b"count") && !kw.eq_ignore_ascii_case(b"type") {
            return None;
        }
        i += 2;
    }
    Some(out)
}

/// SCAN's arguments for one shard: its cursor, and the `MATCH` values narrowed for it.
/// `None` when no key of the shard can match. The second value is the client's pattern when
/// it must be matched here.
fn scan_args(
    args: &[Bytes],
    matches: Option<&[usize]>,
    s: &Shard,
    sc: u64,
) -> Option<(Vec<Bytes>, Option<Bytes>)> {
    let mut out = args.to_vec();
    out[1] = Bytes::from(sc.to_string());
    let mut local = None;
    if let (Some(m), Some(_)) = (matches, &s.prefix) {
        for &i in m {
            match narrow(&args[i], s.prefix.as_ref()) {
                Narrowed::Exact(p) => out[i] = p,
                Narrowed::Local => {
                    out[i] = Bytes::from_static(b"*");
                    local = Some(args[i].clone());
                }
                Narrowed::Nothing => return None,
            }
        }
    }
    Some((out, local))
}

fn scan(args: Vec<Bytes>, shards: Vec<Shard>, parts: &Parts, c: &Call) -> BoxReply {
    let (flavor, conn, deadline) = (c.flavor, c.conn, c.deadline);
    let Some((mut idx, mut sc)) = args.get(1).and_then(|c| decode_cursor(c)) else {
        return ready(error_reply("ERR invalid cursor"));
    };
    if idx >= shards.len() {
        return ready(error_reply("ERR invalid cursor"));
    }
    if shards.len() > MAX_SHARDS {
        return ready(error_reply(&format!(
            "ERR respway: SCAN covers at most {MAX_SHARDS} shards; this listener routes to {}",
            shards.len()
        )));
    }
    // A walk over a Redis Cluster carries its slot map: slots that moved between the shards
    // since it began (a reshard) would have their keys missed or listed twice, so such a
    // walk is refused, with a clear error, rather than silently incomplete.
    let tag = slot_map_tag(&parts.routing, &shards);
    if let Some(tag) = tag {
        let walked = sc >> (64 - SHARD_BITS - TAG_BITS);
        sc &= TAGGED_CURSOR_LIMIT - 1;
        if (idx, sc, walked) != (0, 0, 0) && walked != tag {
            return ready(error_reply(
                "ERR respway: the Redis Cluster's slot map changed during this SCAN walk \
                 (slots moved between nodes: a reshard), so keys could be missed; start the \
                 walk again from cursor 0",
            ));
        }
    }
    let cursor_limit = if tag.is_some() {
        TAGGED_CURSOR_LIMIT
    } else {
        SHARD_CURSOR_LIMIT
    };
    let tagged = move |c: u64| match tag {
        Some(t) if c != 0 => c | (t << (64 - TAG_BITS)),
        _ => c,
    };
    let parts = parts.clone();
    let owned = c.owned;
    Box::pin(async move {
        let matches = match_positions(&args);
        let mut keys = Vec::new();
        for _ in 0..SCAN_STEPS {
            let s = &shards[idx];
            let next = match scan_args(&args, matches.as_deref(), s, sc) {
                None => 0,
                Some((a, local)) => {
                    let r = send(&parts, s, a, flavor, conn, deadline).await;
                    let frame = match parse(&r, "SCAN", &parts.routing, s) {
                        Ok(f) => f,
                        Err(e) => return e,
                    };
                    let Some((next, items)) = scan_reply(frame) else {
                        return Err(unexpected("SCAN", &parts.routing, s));
                    };
                    if next >= cursor_limit {
                        return Err(Failure::message(format!(
                            "ERR respway: shard {} returned SCAN cursor {next}, too large for \
                             respway's cursor",
                            shard_name(&parts.routing, s)
                        )));
                    }
                    let filter = KeyFilter {
                        routing: &parts.routing,
                        local: local.as_deref(),
                        owned,
                    };
                    filter.push(s, items, &mut keys);
                    next
                }
            };
            if next == 0 {
                idx += 1;
                sc = 0;
                if idx == shards.len() {
                    return Ok(scan_frame(0, keys));
                }
            } else {
                sc = next;
            }
            if !keys.is_empty() {
                break;
            }
        }
        Ok(scan_frame(tagged(encode_cursor(idx, sc)), keys))
    })
}

/// A shard's SCAN reply: its next cursor and its keys.
fn scan_reply(frame: Frame) -> Option<(u64, Vec<Frame>)> {
    let Frame::Array(mut v) = frame else {
        return None;
    };
    if v.len() != 2 {
        return None;
    }
    let items = match v.pop()? {
        Frame::Array(items) | Frame::Set(items) => items,
        _ => return None,
    };
    let next = match v.pop()? {
        Frame::Bulk(c) | Frame::Simple(c) => parse_u64(&c)?,
        Frame::Integer(n) => u64::try_from(n).ok()?,
        _ => return None,
    };
    Some((next, items))
}

/// `[cursor, [keys...]]`, the same in RESP2 and RESP3.
fn scan_frame(cursor: u64, keys: Vec<Frame>) -> Reply {
    Frame::Array(vec![
        Frame::Bulk(Bytes::from(cursor.to_string())),
        Frame::Array(keys),
    ])
    .to_bytes()
}

// === KEYS ===

fn keys(args: Vec<Bytes>, shards: Vec<Shard>, parts: &Parts, c: &Call) -> BoxReply {
    let (flavor, conn, deadline) = (c.flavor, c.conn, c.deadline);
    let Some(pattern) = args.get(1).cloned() else {
        return ready(error_reply(
            "ERR wrong number of arguments for 'keys' command",
        ));
    };
    let max = parts.listener.client.keys_max;
    let routing = parts.routing.clone();
    let owned = c.owned;
    // Every shard's KEYS is queued now, so they run at once.
    let asked = shards.into_iter().filter_map(|s| {
        let (sent, local) = match narrow(&pattern, s.prefix.as_ref()) {
            Narrowed::Exact(p) => (p, None),
            Narrowed::Local => (Bytes::from_static(b"*"), Some(pattern.clone())),
            Narrowed::Nothing => return None,
        };
        let a = vec![args[0].clone(), sent];
        let f = send(parts, &s, a, flavor, conn, deadline);
        Some(((s, local), f))
    });
    scatter::gather(
        Order::Targets,
        asked,
        Vec::new(),
        move |keys, (s, local), r| {
            let items = match parse(&r, "KEYS", &routing, s) {
                Ok(Frame::Array(items) | Frame::Set(items)) => items,
                Ok(_) => return Break(Err(unexpected("KEYS", &routing, s))),
                Err(e) => return Break(e),
            };
            let filter = KeyFilter {
                routing: &routing,
                local: local.as_deref(),
                owned,
            };
            filter.push(s, items, keys);
            if keys.len() > max {
                return Break(Err(Failure::message(format!(
                    "ERR respway: KEYS matched more than {max} keys (the listener's keys_max); \
                     use SCAN"
                ))));
            }
            Continue(())
        },
        |keys| Ok(Frame::Array(keys).to_bytes()),
    )
}

// === DBSIZE ===

fn dbsize(args: Vec<Bytes>, shards: Vec<Shard>, parts: &Parts, c: &Call) -> BoxReply {
    let (flavor, conn, deadline) = (c.flavor, c.conn, c.deadline);
    let routing = parts.routing.clone();
    let asked = each_primary(parts, shards, args, flavor, conn, deadline);
    scatter::gather(
        Order::Targets,
        asked,
        0i64,
        move |sum, s, r| match parse(&r, "DBSIZE", &routing, s) {
            Ok(Frame::Integer(n)) => {
                *sum = sum.saturating_add(n);
                Continue(())
            }
            Ok(_) => Break(Err(unexpected("DBSIZE", &routing, s))),
            Err(e) => Break(e),
        },
        |sum| Ok(Frame::Integer(sum).to_bytes()),
    )
}

// === RANDOMKEY ===

fn random_key(args: Vec<Bytes>, mut shards: Vec<Shard>, parts: &Parts, c: &Call) -> BoxReply {
    let (flavor, conn, deadline) = (c.flavor, c.conn, c.deadline);
    // A random shard first, then the next ones in order.
    let start = rand::rng().random_range(0..shards.len());
    shards.rotate_left(start);
    let routing = parts.routing.clone();
    // Sent one after another, as the walk asks: the iterator keeps its own parts.
    let asked = each_primary(parts.clone(), shards, args, flavor, conn, deadline);
    scatter::in_turn(
        asked,
        (),
        move |_, s, r| match parse(&r, "RANDOMKEY", &routing, s) {
            Ok(Frame::Null | Frame::Nil) => Continue(()),
            Ok(Frame::Bulk(key)) => {
                let named = with_prefix(s.prefix.as_ref(), key);
                Break(Ok(Frame::Bulk(named).to_bytes()))
            }
            Ok(_) => Break(Err(unexpected("RANDOMKEY", &routing, s))),
            Err(e) => Break(e),
        },
        move |()| Ok(Frame::null(flavor.resp3).to_bytes()),
    )
}

// === FLUSHDB / FLUSHALL ===

fn flush(args: Vec<Bytes>, shards: Vec<Shard>, parts: &Parts, c: &Call) -> BoxReply {
    let (flavor, conn, deadline) = (c.flavor, c.conn, c.deadline);
    if !parts.listener.client.admin_commands {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        return ready(error_reply(&format!(
            "ERR respway: {name} is refused: it would empty every shard (the listener's \
             admin_commands allows it)"
        )));
    }
    // It empties the routes' clusters and is copied nowhere: during a dual write the two sides
    // now differ in keys no record of write copies names, so each record says it is incomplete
    // (its reader falls back to a full comparison).
    for part in parts.records.iter().flatten() {
        part.mark_incomplete();
    }
    let routing = parts.routing.clone();
    let asked = each_primary(parts, shards, args, flavor, conn, deadline);
    // Every shard's answer is awaited; the first error is the reply.
    scatter::gather(
        Order::Targets,
        asked,
        None,
        move |first_err, s, r| {
            if first_err.is_none() {
                match parse(&r, "FLUSH", &routing, s) {
                    Ok(Frame::Simple(_)) => {}
                    Ok(_) => *first_err = Some(Err(unexpected("FLUSH", &routing, s))),
                    Err(e) => *first_err = Some(e),
                }
            }
            Continue(())
        },
        |first_err| first_err.unwrap_or_else(|| Ok(Frame::ok().to_bytes())),
    )
}

/// `key` as the client names it: with the prefix its route removed put back.
fn with_prefix(prefix: Option<&Bytes>, key: Bytes) -> Bytes {
    match prefix {
        Some(p) => {
            let mut v = BytesMut::with_capacity(p.len() + key.len());
            v.extend_from_slice(p);
            v.extend_from_slice(&key);
            v.freeze()
        }
        None => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyspace_cursor_roundtrip_and_invalid() {
        assert_eq!(decode_cursor(b"0"), Some((0, 0)));
        for (shard, sc) in [(0, 0), (3, 0), (3, 17), (65535, SHARD_CURSOR_LIMIT - 1)] {
            let c = encode_cursor(shard, sc).to_string();
            assert_eq!(decode_cursor(c.as_bytes()), Some((shard, sc)));
        }
        for bad in [
            &b""[..],
            b"-1",
            b"abc",
            b"1 ",
            b"18446744073709551616",
            b"+1",
        ] {
            assert_eq!(decode_cursor(bad), None, "{bad:?}");
        }
        assert_eq!(
            decode_cursor(b"18446744073709551615"),
            Some((65535, SHARD_CURSOR_LIMIT - 1))
        );
    }

    #[test]
    fn keyspace_narrow_patterns_for_removed_prefixes() {
        let pre = Bytes::from_static(b"side:");
        let n = |p: &'static [u8]| narrow(&Bytes::from_static(p), Some(&pre));
        assert_eq!(n(b"side:*"), Narrowed::Exact(Bytes::from_static(b"*")));
        assert_eq!(n(b"side:k1"), Narrowed::Exact(Bytes::from_static(b"k1")));
        assert_eq!(n(b"sid\\e:a*"), Narrowed::Exact(Bytes::from_static(b"a*")));
        assert_eq!(n(b"user:*"), Narrowed::Nothing);
        assert_eq!(n(b"si"), Narrowed::Nothing);
        assert_eq!(n(b"*"), Narrowed::Local);
        assert_eq!(n(b"si*"), Narrowed::Local);
        assert_eq!(
            narrow(&Bytes::from_static(b"x*"), None),
            Narrowed::Exact(Bytes::from_static(b"x*"))
        );
    }
}

//! Key-less commands sent to several endpoints and merged: `SCRIPT LOAD | EXISTS | FLUSH` to
//! every endpoint of every cluster the listener routes to (so `EVALSHA` works wherever its
//! keys land, replicas included), `FUNCTION LOAD | DELETE | FLUSH | RESTORE` to every
//! primary, and one-endpoint forwards (`FUNCTION LIST | DUMP`, `COMMAND ...`) to the first
//! primary of the catch-all cluster. Also the shards' `INFO keyspace`, summed.
//!
//! These go over the session's shared connections of its protocol and database, like its
//! other commands, so they stay in order with them.

use std::collections::BTreeMap;
use std::ops::ControlFlow::{self, Break, Continue};

use bytes::{Bytes, BytesMut};
use respway_filters::command::FanoutKind;
use respway_filters::error::{failed, Answer, Failure, Kind};
use respway_filters::request::{is_error, Flavor, Reply};
use respway_filters::resp::{parse_reply, Frame};
use tokio::time::Instant;

use crate::session::scatter::{self, BoxReply, Order};
use crate::stack::Parts;
use crate::upstream::EndpointHandle;

/// Sends `args` to the endpoints `kind` names and merges the replies.
pub(crate) fn call(
    kind: FanoutKind,
    args: Vec<Bytes>,
    parts: &Parts,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> BoxReply {
    let replicas_too = matches!(
        kind,
        FanoutKind::ScriptLoad | FanoutKind::ScriptExists | FanoutKind::ScriptFlush
    );
    if kind == FanoutKind::FunctionRead {
        return one(args, parts, flavor, conn, deadline);
    }
    if kind == FanoutKind::Kill {
        return kill(args, parts, flavor, deadline);
    }
    let asked = endpoints(parts, replicas_too)
        .map(|ep| ((), ep.send(args.clone(), flavor, conn, deadline)));
    match kind {
        FanoutKind::ScriptExists => scatter::gather_ok(
            asked,
            None,
            |all, _, r| script_exists(all, &r),
            |all| Ok(script_exists_reply(all)),
        ),
        // The endpoints agree: the first one's reply.
        _ => scatter::gather_ok(
            asked,
            None,
            |first, _, r| {
                first.get_or_insert(r);
                Continue(())
            },
            |first| first.ok_or_else(|| Failure::new(Kind::NoTarget)),
        ),
    }
}

/// Sends `args` to the first primary of the catch-all (or first routed) cluster.
pub(crate) fn one(
    args: Vec<Bytes>,
    parts: &Parts,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> BoxReply {
    let first = parts.routing.routed_clusters().first().copied();
    let ep = first.and_then(|c| parts.primary(c, 0));
    match ep {
        Some(ep) => Box::pin(ep.send(args, flavor, conn, deadline)),
        None => Box::pin(async { Err(Failure::new(Kind::NoTarget)) }),
    }
}

/// `SCRIPT KILL` / `FUNCTION KILL` to every endpoint of every routed cluster (a script may
/// run on a replica too: `EVAL_RO`), each on a dedicated connection: the shared ones may be
/// waiting behind the very script to kill, and a busy Redis reads nothing else from them.
/// `OK` when one endpoint killed a script (Redis Cluster's `one_succeeded`); else the first
/// error other than `NOTBUSY`, else `NOTBUSY`.
fn kill(args: Vec<Bytes>, parts: &Parts, flavor: Flavor, deadline: Instant) -> BoxReply {
    let asked = endpoints(parts, true)
        .map(|ep| ((), scatter::dedicated(ep, flavor, args.clone(), deadline)));
    // Every answer is awaited; the first of the best rank is the reply: 0 a success, 1 an
    // error other than NOTBUSY, 2 NOTBUSY.
    scatter::gather(
        Order::Targets,
        asked,
        None,
        |best: &mut Option<(u8, Answer)>, _, r| {
            let notbusy = matches!(&r, Ok(r) if r.starts_with(b"-NOTBUSY"));
            let rank = match (failed(&r), notbusy) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            };
            if best.as_ref().is_none_or(|(b, _)| rank < *b) {
                *best = Some((rank, r));
            }
            Continue(())
        },
        |best| best.map_or_else(|| Err(Failure::new(Kind::NoTarget)), |(_, r)| r),
    )
}

/// `INFO` with the proxy's sections (`text`) and the shards' keyspace summed (a shard that
/// fails is left out).
pub(crate) fn info_with_keyspace(
    text: String,
    resp3: bool,
    parts: &Parts,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> BoxReply {
    let args = [Bytes::from_static(b"INFO"), Bytes::from_static(b"keyspace")];
    let asked =
        endpoints(parts, false).map(|ep| ((), ep.send(args.to_vec(), flavor, conn, deadline)));
    scatter::gather(
        Order::Targets,
        asked,
        BTreeMap::new(),
        |dbs, _, r| {
            if let Ok(r) = &r {
                if !is_error(r) {
                    add_keyspace(dbs, r);
                }
            }
            Continue(())
        },
        move |dbs| {
            let mut s = text;
            s.push_str(&keyspace_section(dbs));
            let mut out = BytesMut::new();
            Frame::text(resp3, s.as_bytes()).encode(&mut out);
            Ok(out.freeze())
        },
    )
}

/// Every endpoint of every routed cluster (primaries only unless `replicas_too`), in
/// (cluster, shard, endpoint) order.
fn endpoints(parts: &Parts, replicas_too: bool) -> impl Iterator<Item = &EndpointHandle> {
    parts
        .routing
        .routed_clusters()
        .into_iter()
        .filter_map(|c| Some((c, parts.endpoints.0.get(c)?)))
        .flat_map(move |(c, shards)| {
            shards.iter().enumerate().flat_map(move |(s, eps)| {
                let primary = parts.primary_index(c, s);
                eps.iter()
                    .enumerate()
                    .filter(move |(e, _)| replicas_too || *e == primary)
                    .map(|(_, ep)| ep)
            })
        })
}

/// Folds one endpoint's `SCRIPT EXISTS` reply: 1 for a script only where every endpoint
/// has it.
fn script_exists(all: &mut Option<Vec<i64>>, r: &Reply) -> ControlFlow<Answer> {
    let Ok(Frame::Array(items)) = parse_reply(r) else {
        return Break(Err(Failure::message(
            "ERR respway: unexpected SCRIPT EXISTS reply from a shard",
        )));
    };
    let v: Vec<i64> = items
        .iter()
        .map(|f| match f {
            Frame::Integer(n) => *n,
            _ => 0,
        })
        .collect();
    *all = Some(match all.take() {
        None => v,
        Some(a) => a.iter().zip(&v).map(|(x, y)| x & y).collect(),
    });
    Continue(())
}

/// The `SCRIPT EXISTS` reply folded by [`script_exists`].
fn script_exists_reply(all: Option<Vec<i64>>) -> Reply {
    let frame = Frame::Array(
        all.unwrap_or_default()
            .into_iter()
            .map(Frame::Integer)
            .collect(),
    );
    frame.to_bytes()
}

/// A database's keys, expires and avg_ttl, summed over the shards.
type KeyspaceSums = BTreeMap<u32, (u64, u64, u64)>;

/// Adds the `# Keyspace` section of a shard's `INFO keyspace` reply
/// (`db0:keys=3,expires=0,avg_ttl=0`): keys and expires summed, avg_ttl the largest.
fn add_keyspace(dbs: &mut KeyspaceSums, r: &Reply) {
    let Ok(frame) = parse_reply(r) else {
        return;
    };
    let text = match frame {
        Frame::Bulk(b) => b,
        Frame::Verbatim(b) => b.slice(4.min(b.len())..),
        _ => return,
    };
    for line in String::from_utf8_lossy(&text).lines() {
        let Some((db, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(n) = db.strip_prefix("db").and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let e = dbs.entry(n).or_default();
        for kv in rest.split(',') {
            let (k, v) = kv.split_once('=').unwrap_or((kv, "0"));
            let v: u64 = v.trim().parse().unwrap_or(0);
            match k {
                "keys" => e.0 += v,
                "expires" => e.1 += v,
                "avg_ttl" => e.2 = e.2.max(v),
                _ => {}
            }
        }
    }
}

/// The summed `# Keyspace` section.
fn keyspace_section(dbs: KeyspaceSums) -> String {
    let mut s = String::from("# Keyspace\r\n");
    for (db, (k, e, t)) in dbs {
        s.push_str(&format!("db{db}:keys={k},expires={e},avg_ttl={t}\r\n"));
    }
    s
}

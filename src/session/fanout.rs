//! Key-less commands sent to several endpoints and merged: `SCRIPT LOAD | EXISTS | FLUSH` to
//! every endpoint of every cluster the listener routes to (so `EVALSHA` works wherever its
//! keys land, replicas included), `FUNCTION LOAD | DELETE | FLUSH | RESTORE` to every
//! primary, and one-endpoint forwards (`FUNCTION LIST | DUMP`, `COMMAND ...`) to the first
//! primary of the catch-all cluster. Also the shards' `INFO keyspace`, summed.
//!
//! These go over the session's shared connections of its protocol and database, like its
//! other commands, so they stay in order with them.

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use respway_filters::command::FanoutKind;
use respway_filters::error::{failed, Answer, Failure, Kind};
use respway_filters::request::{is_error, Flavor, Reply};
use respway_filters::resp::{parse_reply, Frame};
use tokio::time::Instant;

use crate::stack::Parts;
use crate::upstream::UpstreamFuture;

/// A reply computed by a future of its own.
pub(crate) type BoxReply = Pin<Box<dyn Future<Output = Answer> + Send>>;

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
    let futs = targets(parts, replicas_too, &args, flavor, conn, deadline);
    Box::pin(async move {
        let replies = match join_ok(futs).await {
            Ok(r) => r,
            Err(e) => return e,
        };
        match kind {
            FanoutKind::ScriptExists => script_exists(&replies),
            _ => Ok(replies[0].clone()),
        }
    })
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
    let mut asks = Vec::new();
    for c in parts.routing.routed_clusters() {
        let Some(shards) = parts.endpoints.0.get(c) else {
            continue;
        };
        for ep in shards.iter().flatten() {
            match ep.take_dedicated(flavor) {
                Ok(conn) => {
                    let reply = conn.send(args.clone(), deadline);
                    asks.push(Ok((conn, reply)));
                }
                Err(e) => asks.push(Err(e.at(ep.label().clone()))),
            }
        }
    }
    Box::pin(async move {
        let mut replies = Vec::with_capacity(asks.len());
        for ask in asks {
            replies.push(match ask {
                // Answered by Redis: nothing is left in flight on the connection.
                Ok((conn, reply)) => {
                    let r = reply.await;
                    if r.is_ok() {
                        conn.give_back();
                    }
                    r
                }
                Err(e) => Err(e),
            });
        }
        let notbusy = |r: &Answer| matches!(r, Ok(r) if r.starts_with(b"-NOTBUSY"));
        replies
            .iter()
            .find(|r| !failed(r))
            .or_else(|| replies.iter().find(|r| !notbusy(r)))
            .or_else(|| replies.first())
            .cloned()
            .unwrap_or_else(|| Err(Failure::new(Kind::NoTarget)))
    })
}

/// `INFO` with the proxy's sections (`text`) and the shards' keyspace summed.
pub(crate) fn info_with_keyspace(
    text: String,
    resp3: bool,
    parts: &Parts,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> BoxReply {
    let args = vec![Bytes::from_static(b"INFO"), Bytes::from_static(b"keyspace")];
    let futs = targets(parts, false, &args, flavor, conn, deadline);
    Box::pin(async move {
        let replies = join(futs).await;
        let ok: Vec<Reply> = replies
            .into_iter()
            .filter_map(|r| r.ok().filter(|r| !is_error(r)))
            .collect();
        let mut s = text;
        s.push_str(&sum_keyspace(&ok));
        let mut out = BytesMut::new();
        Frame::text(resp3, s.as_bytes()).encode(&mut out);
        Ok(out.freeze())
    })
}

fn targets(
    parts: &Parts,
    replicas_too: bool,
    args: &[Bytes],
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> Vec<UpstreamFuture> {
    let mut futs = Vec::new();
    for c in parts.routing.routed_clusters() {
        let Some(shards) = parts.endpoints.0.get(c) else {
            continue;
        };
        for (s, eps) in shards.iter().enumerate() {
            let primary = parts.primary_index(c, s);
            for (e, ep) in eps.iter().enumerate() {
                if replicas_too || e == primary {
                    futs.push(ep.send(args.to_vec(), flavor, conn, deadline));
                }
            }
        }
    }
    futs
}

/// Every reply, or the answer for the client: the first failure or Redis error among them
/// (or "no shard" when there is none).
pub(crate) async fn join_ok(futs: Vec<UpstreamFuture>) -> Result<Vec<Reply>, Answer> {
    if futs.is_empty() {
        return Err(Err(Failure::new(Kind::NoTarget)));
    }
    let mut out = Vec::with_capacity(futs.len());
    let mut first_failed = None;
    for r in join(futs).await {
        match r {
            Ok(r) if !is_error(&r) => out.push(r),
            failed => {
                first_failed.get_or_insert(failed);
            }
        }
    }
    match first_failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

async fn join(futs: Vec<UpstreamFuture>) -> Vec<Answer> {
    let mut out = Vec::with_capacity(futs.len());
    for f in futs {
        out.push(f.await);
    }
    out
}

/// 1 for a script only where every endpoint has it.
fn script_exists(replies: &[Reply]) -> Answer {
    let mut all: Option<Vec<i64>> = None;
    for r in replies {
        let Ok(Frame::Array(items)) = parse_reply(r) else {
            return Err(Failure::message(
                "ERR respway: unexpected SCRIPT EXISTS reply from a shard",
            ));
        };
        let v: Vec<i64> = items
            .iter()
            .map(|f| match f {
                Frame::Integer(n) => *n,
                _ => 0,
            })
            .collect();
        all = Some(match all {
            None => v,
            Some(a) => a.iter().zip(&v).map(|(x, y)| x & y).collect(),
        });
    }
    let frame = Frame::Array(
        all.unwrap_or_default()
            .into_iter()
            .map(Frame::Integer)
            .collect(),
    );
    Ok(frame.to_bytes())
}

/// Adds up the `# Keyspace` sections of the shards' `INFO keyspace` replies
/// (`db0:keys=3,expires=0,avg_ttl=0`): keys and expires summed, avg_ttl the largest.
fn sum_keyspace(replies: &[Reply]) -> String {
    let mut dbs: std::collections::BTreeMap<u32, (u64, u64, u64)> = Default::default();
    for r in replies {
        let Ok(frame) = respway_filters::resp::parse_reply(r) else {
            continue;
        };
        let text = match frame {
            Frame::Bulk(b) => b,
            Frame::Verbatim(b) => b.slice(4.min(b.len())..),
            _ => continue,
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
    let mut s = String::from("# Keyspace\r\n");
    for (db, (k, e, t)) in dbs {
        s.push_str(&format!("db{db}:keys={k},expires={e},avg_ttl={t}\r\n"));
    }
    s
}

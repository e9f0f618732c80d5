//! `WAIT numreplicas timeout` and `WAITAOF numlocal numreplicas timeout`.
//!
//! Redis answers them for one connection: how many replicas acknowledged (or fsynced, for
//! `WAITAOF`) everything up to that connection's `woff`, the master's replication offset
//! right after its last command that propagated. A client's writes reach each shard over
//! respway's shared connections, whose offsets say nothing of this client (or cover other
//! clients' later writes), so respway asks on connections of its own:
//!
//! - for each primary the client wrote to since its last `WAIT` (see
//!   [`crate::upstream::track`]: every one when not known) of every cluster the listener's
//!   routes send to (the keyspace-wide commands' set, [`Routing::keyspace_clusters`]; not
//!   mirror clusters), a [`Dedicated`]
//!   connection from the pool blocking commands use (bounded by `dedicated_connections`);
//! - on it, pipelined, first [`NUDGE`] (`SPUBLISH` on a channel of respway's own, with an
//!   empty message), then the client's command unchanged. Redis propagates `SPUBLISH` to the
//!   replicas (outside cluster mode, `forceCommandPropagation`), which moves the master's
//!   offset, and sets the connection's `woff` to it (7.2+ sets `woff` after a command that
//!   propagated, 7.0 after every command), so the `WAIT` behind it covers every write the
//!   master had applied by then — all of this client's earlier writes, since the session
//!   sends a blocking-class command only once its earlier commands are answered. `SPUBLISH`
//!   touches no key and, unlike `PUBLISH`, is not delivered to pattern subscribers, so a
//!   client's `PSUBSCRIBE *` does not see the nudges;
//! - every shard is asked at once; the reply is the smallest count over the shards (for
//!   `WAITAOF` the element-wise minimum of the `[local, replicas]` pairs), as Redis Cluster's
//!   `agg_min` response policy for these commands says; a shard with fewer replicas among
//!   them caps the answer;
//! - the first error a shard answers is the reply at once (Redis's own text, e.g. a bad
//!   timeout or `WAITAOF` on a server before 7.2; respway's own errors name the shard), and
//!   the other shards' connections are closed, which unblocks them on Redis.
//!
//! The command's own timeout (milliseconds) decides how long respway waits, as for the
//! blocking commands: that timeout plus `op_timeout` plus [`MARGIN`], far in the future for
//! `0` (until enough replicas acknowledge). A client that leaves while waiting drops the
//! reply's future, and with it every dedicated connection, which closes them. A connection
//! Redis answered goes back to the pool.
//!
//! [`Dedicated`]: crate::upstream::Dedicated
//! [`Routing::keyspace_clusters`]: respway_filters::routing::Routing::keyspace_clusters

use std::ops::ControlFlow::{Break, Continue};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use respway_filters::command::CommandInfo;
use respway_filters::error::{Answer, Failure, Kind, UpstreamError};
use respway_filters::request::{Flavor, Reply};
use respway_filters::resp::{parse_reply, Frame};
use tokio::time::Instant;

use crate::session::scatter::{self, BoxReply, Order};
use crate::stack::Parts;

/// Sent before the client's command on each connection: a command that propagates to the
/// replicas without touching the keyspace, so the connection's `woff` becomes the master's
/// offset.
pub(crate) const NUDGE: [&[u8]; 3] = [b"SPUBLISH", b"__respway:wait", b""];

/// Added to the command's timeout (besides `op_timeout`) for the upstream deadline, as for
/// the blocking commands: Redis notices a blocked client's timeout on an event-loop turn.
const MARGIN: Duration = Duration::from_secs(1);

/// Added again past the upstream deadline for the session's backstop (the upstream answers
/// first, naming the shard).
const BACKSTOP: Duration = Duration::from_secs(1);

/// A timeout this long (or `0`) waits "forever": a year.
const FOREVER: Duration = Duration::from_secs(86400 * 365);

/// What the session does with a `WAIT` / `WAITAOF`.
pub(crate) enum Call {
    /// Wait for `fut`; the session gives up at `backstop`.
    Wait {
        /// The merged reply.
        fut: BoxReply,
        /// When the session answers with a timeout itself.
        backstop: Instant,
    },
    /// Refused before anything was sent.
    Refused(Failure),
}

/// One shard's answer: `[n]` for `WAIT`, `[local, replicas]` for `WAITAOF`.
type Counts = Vec<i64>;

/// Starts `args` (`WAIT` or `WAITAOF`, arity already checked) on the primaries in `written`
/// (see [`crate::upstream::track`]: those the client wrote to since its last `WAIT`).
pub(crate) fn call(
    cmd: &'static CommandInfo,
    args: Vec<Bytes>,
    parts: &Parts,
    flavor: Flavor,
    op_timeout: Duration,
    written: u64,
) -> Call {
    let aof = cmd.name == "waitaof";
    let now = Instant::now();
    let wait = match args.last().and_then(|a| millis(a)) {
        Some(d) if !d.is_zero() => d.saturating_add(op_timeout).saturating_add(MARGIN),
        // 0 waits until enough replicas acknowledge; a timeout respway cannot read, Redis
        // answers with its own error at once.
        _ => FOREVER,
    }
    .min(FOREVER);
    let deadline = now + wait;
    let backstop = deadline + op_timeout.min(FOREVER) + BACKSTOP;
    let nudge_deadline = now + op_timeout.min(FOREVER);

    let mut conns = Vec::new();
    let refuse = |conns: Vec<(crate::upstream::Dedicated, Arc<str>)>, r: Failure| {
        // Nothing was sent on them: idle again.
        for (c, _) in conns {
            c.give_back();
        }
        Call::Refused(r)
    };
    for k in parts.routing.keyspace_clusters() {
        let Some(shards) = parts.endpoints.0.get(k.cluster) else {
            continue;
        };
        for s in 0..shards.len() {
            if written & crate::upstream::track::bit(k.cluster, s) == 0 {
                continue;
            }
            let Some(ep) = parts.primary(k.cluster, s) else {
                return refuse(conns, UpstreamError::NoShard.at("".into()));
            };
            match ep.take_dedicated(flavor) {
                Ok(c) => conns.push((c, ep.label().clone())),
                Err(e) => return refuse(conns, e.at(ep.label().clone())),
            }
        }
    }
    if conns.is_empty() {
        return Call::Refused(Failure::new(Kind::NoTarget));
    }

    let name = if aof { "WAITAOF" } else { "WAIT" };
    let asked = conns.into_iter().map(|(conn, label)| {
        let nudge = conn.send(
            NUDGE.iter().map(|a| Bytes::from_static(a)).collect(),
            nudge_deadline,
        );
        let reply = conn.send(args.clone(), deadline);
        let one = async move {
            // On an error `conn` and `reply` are dropped: the connection is closed.
            nudged(&nudge.await.map_err(Err)?, &label, name)?;
            // Answered by Redis: nothing is left in flight or set on the connection. An
            // error of respway's own (timeout, connection lost) ends the connection instead.
            let r = reply.await.map_err(Err)?;
            conn.give_back();
            counts(&r, aof, &label, name)
        };
        ((), one)
    });
    Call::Wait {
        // The first error to arrive is the reply at once: the other shards' futures, and
        // their connections, are dropped.
        fut: scatter::gather(
            Order::Arrival,
            asked,
            None,
            |min, _, one| match one {
                Err(e) => Break(e),
                Ok(c) => {
                    *min = Some(merge(min.take(), c));
                    Continue(())
                }
            },
            move |min| Ok(reply_of(min.unwrap_or_default(), aof)),
        ),
        backstop,
    }
}

/// A timeout in whole milliseconds, as far as respway reads it (Redis checks it exactly).
fn millis(arg: &[u8]) -> Option<Duration> {
    std::str::from_utf8(arg)
        .ok()?
        .parse::<u64>()
        .ok()
        .map(Duration::from_millis)
}

/// Checks the nudge's reply (an integer: its receivers).
///
/// # Errors
/// The answer for the client: Redis's error (`NOPERM` for an upstream user without the
/// channel, ...) with the shard named (respway's own failures are the future's `Err`).
fn nudged(r: &Reply, label: &str, name: &str) -> Result<(), Answer> {
    match parse_reply(r) {
        Ok(Frame::Integer(_)) => Ok(()),
        Ok(Frame::Error(e)) | Ok(Frame::BlobError(e)) => Err(Err(Failure::message(format!(
            "ERR respway: {label}: SPUBLISH before {name} failed: {}",
            String::from_utf8_lossy(&e)
        )))),
        _ => Err(Err(Failure::message(format!(
            "ERR respway: {label}: unexpected SPUBLISH reply before {name}"
        )))),
    }
}

/// One shard's `WAIT` / `WAITAOF` reply as counts.
///
/// # Errors
/// The shard's own error as it is, or one naming the shard for a reply of another shape.
fn counts(r: &Reply, aof: bool, label: &str, name: &str) -> Result<Counts, Answer> {
    let frame = parse_reply(r);
    let got = match frame {
        Ok(f) if f.is_error() => return Err(Ok(r.clone())),
        Ok(Frame::Integer(n)) if !aof => Some(vec![n]),
        Ok(Frame::Array(items)) if aof && items.len() == 2 => items
            .iter()
            .map(|f| match f {
                Frame::Integer(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    };
    got.ok_or_else(|| {
        Err(Failure::message(format!(
            "ERR respway: {label}: unexpected {name} reply"
        )))
    })
}

/// The element-wise minimum of the counts so far and one shard's.
fn merge(min: Option<Counts>, c: Counts) -> Counts {
    match min {
        None => c,
        Some(m) => m.iter().zip(&c).map(|(a, b)| *a.min(b)).collect(),
    }
}

/// The client's reply: an integer for `WAIT`, a two-integer array for `WAITAOF` (the same
/// bytes in RESP2 and RESP3).
fn reply_of(c: Counts, aof: bool) -> Reply {
    let frame = if aof {
        Frame::Array(c.into_iter().map(Frame::Integer).collect())
    } else {
        Frame::Integer(c.first().copied().unwrap_or(0))
    };
    frame.to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(s: &str) -> Reply {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn the_smallest_count_over_the_shards() {
        let l = "shard s0 (127.0.0.1:1)";
        let shards = [":2\r\n", ":1\r\n", ":3\r\n"];
        let mut min = None;
        for s in shards {
            min = Some(merge(min, counts(&reply(s), false, l, "WAIT").unwrap()));
        }
        assert_eq!(reply_of(min.unwrap(), false), reply(":1\r\n"));

        // WAITAOF: element-wise.
        let shards = [
            "*2\r\n:1\r\n:3\r\n",
            "*2\r\n:0\r\n:4\r\n",
            "*2\r\n:1\r\n:2\r\n",
        ];
        let mut min = None;
        for s in shards {
            min = Some(merge(min, counts(&reply(s), true, l, "WAITAOF").unwrap()));
        }
        assert_eq!(reply_of(min.unwrap(), true), reply("*2\r\n:0\r\n:2\r\n"));
    }

    #[test]
    fn errors_and_odd_replies() {
        let l = "shard s0 (127.0.0.1:1)";
        let e = reply("-ERR timeout is negative\r\n");
        assert_eq!(counts(&e, false, l, "WAIT"), Err(Ok(e.clone())));
        assert_eq!(
            counts(&reply("$1\r\nx\r\n"), false, l, "WAIT").map_err(|a| a.unwrap_err().to_reply()),
            Err(reply(
                "-ERR respway: shard s0 (127.0.0.1:1): unexpected WAIT reply\r\n"
            ))
        );
        assert!(counts(&reply(":1\r\n"), true, l, "WAITAOF").is_err());
        assert!(counts(&reply("*2\r\n:1\r\n$1\r\nx\r\n"), true, l, "WAITAOF").is_err());
        assert!(counts(&reply("garbage"), false, l, "WAIT").is_err());

        assert_eq!(nudged(&reply(":0\r\n"), l, "WAIT"), Ok(()));
        // respway's own failures (a timeout, a lost connection) never reach it: they are the
        // upstream future's `Err`, passed on as they are.
        assert_eq!(
            nudged(&reply("-NOPERM no channel\r\n"), l, "WAIT")
                .map_err(|a| a.unwrap_err().to_reply()),
            Err(reply(
                "-ERR respway: shard s0 (127.0.0.1:1): SPUBLISH before WAIT failed: NOPERM no \
                 channel\r\n"
            ))
        );
    }

    #[test]
    fn timeouts() {
        assert_eq!(millis(b"250"), Some(Duration::from_millis(250)));
        assert_eq!(millis(b"0"), Some(Duration::ZERO));
        assert_eq!(millis(b"-1"), None);
        assert_eq!(millis(b"1.5"), None);
        assert_eq!(millis(b"\xff"), None);
    }
}

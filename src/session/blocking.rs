//! Blocking commands (`BLPOP`, `BRPOP`, `BLMOVE`, `BRPOPLPUSH`, `BLMPOP`, `BZPOPMIN`,
//! `BZPOPMAX`, `BZMPOP`, `XREAD`/`XREADGROUP` with `BLOCK`).
//!
//! Each runs alone on a [`Dedicated`] connection to the primary of the one shard all its
//! keys hash to (the same per-worker, per-endpoint pool transactions use, bounded by the
//! cluster's `dedicated_connections`), so a client blocked for minutes holds no shared
//! connection and delays nobody else's commands. Keys on several shards answer `CROSSSLOT`;
//! keys of a mirrored route or under a hot-key prefix are refused (a pop cannot be mirrored
//! or spread over shards consistently). On a route in move mode the command runs on the keys'
//! new owner, after the `MIGRATE`s of those whose owner changes (see
//! `respway_filters::moving`), sent on the old shards' shared connections.
//!
//! The command's own timeout decides how long respway waits: the upstream deadline is that
//! timeout plus the listener's `op_timeout` plus [`MARGIN`] (far in the future for `0`,
//! which blocks until an element arrives), so `op_timeout` never cuts a blocking command.
//!
//! A client that leaves while blocked ends its session at once; dropping the reply's future
//! makes the dedicated connection's task close the TCP connection (see `upstream::serve`),
//! and Redis unblocks that connection without popping anything. A command Redis answered
//! gives its connection back to the idle pool at once (no connect per `BLPOP`).
//!
//! `XREAD` and `XREADGROUP` without `BLOCK` are not blocking: the session forwards them like
//! any multi-key command.

use std::time::Duration;

use bytes::Bytes;
use respway_filters::command::CommandInfo;
use respway_filters::error::{Failure, UpstreamError};
use respway_filters::moving::{migrate_commands, move_failure, outcome};
use respway_filters::place::{Pinned, Purpose, Refusal};
use respway_filters::request::is_error;
use respway_filters::request::Flavor;
use respway_filters::routing::Routing;
use tokio::time::Instant;

use crate::session::scatter::BoxReply;
use crate::stack::Parts;
use crate::upstream::{self, Endpoints, RedisCluster, UpstreamFuture};
use respway_filters::error::Answer;

/// Added to the command's timeout (besides `op_timeout`) for the upstream deadline: Redis
/// notices a blocked client's timeout on its next event-loop turn, which can be late by up to
/// its cron period.
const MARGIN: Duration = Duration::from_secs(1);

/// Added again past the upstream deadline for the session's backstop (the upstream answers
/// first, naming the shard).
const BACKSTOP: Duration = Duration::from_secs(1);

/// A blocking command's timeout as long as this (or longer, or `0`) waits "forever": a year.
const FOREVER: Duration = Duration::from_secs(86400 * 365);

/// What the session does with a blocking command.
pub(crate) enum Call {
    /// Not blocking after all (`XREAD` without `BLOCK`): forward it as usual.
    Forward(Vec<Bytes>),
    /// Wait for `fut`; the session gives up at `backstop`.
    Wait {
        /// The reply.
        fut: BoxReply,
        /// When the session answers with a timeout itself.
        backstop: Instant,
    },
    /// Refused before anything was sent.
    Refused(Failure),
}

/// How long a command may block.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Block {
    /// Not a blocking call (`XREAD` without `BLOCK`).
    No,
    /// Until an element arrives (`0`), or a timeout respway cannot read: Redis answers an
    /// invalid one with its own error at once, and a valid one it reads otherwise is not cut.
    Forever,
    /// Up to this long.
    For(Duration),
}

/// Starts `args` (keys at `keys`).
pub(crate) fn call(
    cmd: &'static CommandInfo,
    mut args: Vec<Bytes>,
    keys: &[usize],
    parts: &Parts,
    flavor: Flavor,
    op_timeout: Duration,
) -> Call {
    let block = block_of(cmd.name, &args);
    if block == Block::No {
        return Call::Forward(args);
    }
    let Pinned {
        cluster,
        shard,
        from,
    } = match place(&parts.routing, &mut args, keys) {
        Ok(at) => at,
        Err(r) => return Call::Refused(r.into()),
    };
    let Some(ep) = parts.primary(cluster, shard) else {
        return Call::Refused(UpstreamError::NoShard.at("".into()));
    };
    let conn = match ep.take_dedicated(flavor) {
        Ok(c) => c,
        Err(e) => return Call::Refused(e.at(ep.label().clone())),
    };
    let wait = match block {
        Block::For(d) => d.saturating_add(op_timeout).saturating_add(MARGIN),
        Block::No | Block::Forever => FOREVER,
    }
    .min(FOREVER);
    let deadline = Instant::now() + wait;
    let backstop = deadline + op_timeout.min(FOREVER) + BACKSTOP;
    // Move mode: the keys whose owner changes move first (on the shared connections of
    // their old shards), and the command is sent only once they have.
    let migrate =
        match from.map(|from| moves(parts, &args, keys, from, cluster, flavor, op_timeout)) {
            None => Vec::new(),
            Some(Ok(m)) => m,
            Some(Err(f)) => return Call::Refused(f),
        };
    if !migrate.is_empty() {
        let (stats, moved) = (parts.mirror_stats.clone(), parts.moved.clone());
        return Call::Wait {
            fut: Box::pin(async move {
                for (m, answer) in migrate {
                    let answer = answer.await;
                    stats.record_move(cluster, outcome(&answer, &m, flavor.db, &moved));
                    if !matches!(&answer, Ok(r) if !is_error(r)) {
                        // Nothing was sent on the dedicated connection: it is idle.
                        conn.give_back();
                        return Err(move_failure(&answer));
                    }
                }
                let r = conn.send(args, deadline).await;
                if r.is_ok() {
                    conn.give_back();
                }
                r
            }),
            backstop,
        };
    }
    // A Redis Cluster's node may answer `MOVED`/`ASK`: the command is then sent again.
    let redis_cluster = parts
        .endpoints
        .1
        .get(cluster)
        .and_then(Option::as_ref)
        .map(|rc| (parts.endpoints.clone(), rc.clone(), args.clone()));
    let reply = conn.send(args, deadline);
    Call::Wait {
        fut: Box::pin(async move {
            // Answered by Redis: nothing is in flight on the connection and a blocking
            // command leaves no state, so it is idle again at once (the next blocking command
            // of this client finds it). An error of respway's own (timeout, connection lost)
            // ends the connection instead. Dropped before the reply (the client left), `conn`
            // and `reply` go with the future and the connection's task closes the connection.
            let r = reply.await;
            if r.is_ok() {
                conn.give_back();
            }
            match redis_cluster {
                Some((endpoints, rc, args)) => {
                    follow(r, &endpoints, cluster, &rc, args, flavor, deadline).await
                }
                None => r,
            }
        }),
        backstop,
    }
}

/// A Redis Cluster node answered the blocking command with `MOVED` or `ASK` (its slot moved
/// since the sidecar's last refresh): the topology is told, and the command goes again on a
/// dedicated connection to the node named (after `ASKING` on it for `ASK`), where it blocks;
/// at most [`MAX_HOPS`](crate::upstream::MAX_HOPS) times. A node this worker does not have
/// yet (it joined since the last refresh) is looked for again after a pause (10, 20, 40 ...
/// ms) while the topology is refreshed. The client never sees the redirection: it gets the
/// command's reply, or respway's error naming the node.
async fn follow(
    mut r: Answer,
    endpoints: &Endpoints,
    cluster: usize,
    rc: &RedisCluster,
    args: Vec<Bytes>,
    flavor: Flavor,
    deadline: Instant,
) -> Answer {
    let mut hops = 0;
    loop {
        let Some((ask, addr)) = r.as_ref().ok().and_then(|b| upstream::redirection(b)) else {
            return r;
        };
        hops += 1;
        if hops > upstream::MAX_HOPS {
            return r.and_then(|b| {
                Err(UpstreamError::Unavailable(
                    format!(
                        "Redis Cluster redirected the blocking command {} times (last: {})",
                        upstream::MAX_HOPS,
                        String::from_utf8_lossy(b.strip_suffix(b"\r\n").unwrap_or(&b))
                    )
                    .into(),
                )
                .at("".into()))
            });
        }
        upstream::followed(ask);
        rc.topology.redirected(!ask);
        let mut ep = upstream::node(endpoints, cluster, &rc.name, addr);
        let mut pause = Duration::from_millis(10);
        while ep.is_none() && Instant::now() + pause < deadline && pause < Duration::from_secs(1) {
            rc.topology.unknown_node();
            tokio::time::sleep(pause).await;
            pause *= 2;
            ep = upstream::node(endpoints, cluster, &rc.name, addr);
        }
        let Some(ep) = ep else {
            return Err(UpstreamError::Unavailable(
                format!(
                    "Redis Cluster moved the key's slot to {addr}, which the sidecar does not \
                     know yet (the topology is being refreshed)"
                )
                .into(),
            )
            .at("".into()));
        };
        let conn = match ep.take_dedicated(flavor) {
            Ok(c) => c,
            Err(e) => return Err(e.at(ep.label().clone())),
        };
        if ask {
            match conn.send(upstream::asking(), deadline).await {
                Ok(ok) if &ok[..] == b"+OK\r\n" => {}
                Ok(other) => return Ok(other),
                Err(e) => return Err(e),
            }
        }
        r = conn.send(args.clone(), deadline).await;
        if r.is_ok() {
            conn.give_back();
        }
    }
}

/// Reads the timeout of a blocking command (see [`Block`]).
fn block_of(name: &str, args: &[Bytes]) -> Block {
    match name {
        "xread" | "xreadgroup" => {
            // XREAD [COUNT n] [BLOCK ms] STREAMS ...;
            // XREADGROUP GROUP g c [COUNT n] [BLOCK ms] [NOACK] STREAMS ...
            let mut i = if name == "xreadgroup" { 4 } else { 1 };
            while let Some(a) = args.get(i) {
                if a.eq_ignore_ascii_case(b"BLOCK") {
                    return match args.get(i + 1).and_then(|v| parse_ms(v)) {
                        Some(d) if d.is_zero() => Block::Forever,
                        Some(d) => Block::For(d),
                        None => Block::Forever,
                    };
                }
                if a.eq_ignore_ascii_case(b"COUNT") {
                    i += 2;
                } else if a.eq_ignore_ascii_case(b"NOACK") {
                    i += 1;
                } else {
                    // STREAMS, or a syntax error Redis answers itself.
                    break;
                }
            }
            Block::No
        }
        "blmpop" | "bzmpop" => seconds(args.get(1)),
        _ => seconds(args.last()),
    }
}

/// A timeout in seconds (a float, as Redis reads it); `0` blocks forever.
fn seconds(arg: Option<&Bytes>) -> Block {
    let secs = arg
        .and_then(|a| std::str::from_utf8(a).ok())
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0);
    match secs {
        Some(0.0) => Block::Forever,
        Some(s) => Block::For(Duration::try_from_secs_f64(s).unwrap_or(FOREVER)),
        None => Block::Forever,
    }
}

/// A timeout in whole milliseconds (`XREAD ... BLOCK ms`).
fn parse_ms(arg: &[u8]) -> Option<Duration> {
    std::str::from_utf8(arg)
        .ok()?
        .parse::<u64>()
        .ok()
        .map(Duration::from_millis)
}

/// Where all keys of the command route to; applies the routes' prefix removal to `args`.
///
/// # Errors
/// Why it cannot run on one connection ([`Routing::place_moving`]), or a command without
/// keys.
fn place(routing: &Routing, args: &mut [Bytes], keys: &[usize]) -> Result<Pinned, Refusal> {
    routing
        .place_moving(args, keys, Purpose::Blocking)?
        .ok_or(Refusal::NeedsKey(Purpose::Blocking))
}

/// The `MIGRATE`s, sent now, that move the command's keys from cluster `from` to `to`, each
/// with its arguments and its answer's future; none sent when an old shard has no primary.
/// Transactions use it too.
pub(crate) fn moves(
    parts: &Parts,
    args: &[Bytes],
    keys: &[usize],
    from: usize,
    to: usize,
    flavor: Flavor,
    op_timeout: Duration,
) -> Result<Vec<(Vec<Bytes>, UpstreamFuture)>, Failure> {
    let timeout_ms = op_timeout.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
    let keys = keys.iter().filter_map(|&i| args.get(i));
    let deadline = Instant::now() + op_timeout;
    let cmds = migrate_commands(
        &parts.routing,
        keys,
        flavor.db,
        from,
        to,
        &parts.moved,
        || timeout_ms,
    );
    if cmds
        .iter()
        .any(|(shard, _)| parts.primary(from, *shard).is_none())
    {
        return Err(UpstreamError::NoShard.at("".into()));
    }
    Ok(cmds
        .into_iter()
        .filter_map(|(shard, m)| {
            let answer = parts
                .primary(from, shard)?
                .send(m.clone(), flavor, 0, deadline);
            Some((m, answer))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<Bytes> {
        s.split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    #[test]
    fn timeouts_are_read_where_each_command_has_them() {
        let b = |name: &str, s: &str| block_of(name, &args(s));
        assert_eq!(
            b("blpop", "BLPOP a b 0.25"),
            Block::For(Duration::from_millis(250))
        );
        assert_eq!(b("brpop", "BRPOP a 0"), Block::Forever);
        assert_eq!(
            b("blmove", "BLMOVE a b LEFT RIGHT 2"),
            Block::For(Duration::from_secs(2))
        );
        assert_eq!(
            b("blmpop", "BLMPOP 1.5 2 a b LEFT"),
            Block::For(Duration::from_millis(1500))
        );
        assert_eq!(b("bzmpop", "BZMPOP 0 1 a MIN"), Block::Forever);
        // Redis answers these itself, at once.
        assert_eq!(b("blpop", "BLPOP a -1"), Block::Forever);
        assert_eq!(b("blpop", "BLPOP a x"), Block::Forever);
        assert_eq!(b("blpop", "BLPOP a inf"), Block::Forever);
        assert_eq!(
            b("xread", "XREAD COUNT 2 BLOCK 100 STREAMS a 0"),
            Block::For(Duration::from_millis(100))
        );
        assert_eq!(b("xread", "XREAD block 0 STREAMS a 0"), Block::Forever);
        assert_eq!(b("xread", "XREAD COUNT 2 STREAMS a 0"), Block::No);
        assert_eq!(b("xread", "XREAD STREAMS BLOCK 0"), Block::No);
        assert_eq!(
            b(
                "xreadgroup",
                "XREADGROUP GROUP BLOCK c NOACK BLOCK 5 STREAMS a >"
            ),
            Block::For(Duration::from_millis(5))
        );
        assert_eq!(
            b("xreadgroup", "XREADGROUP GROUP g BLOCK STREAMS a >"),
            Block::No
        );
        assert_eq!(b("xread", "XREAD COUNT"), Block::No);
    }
}

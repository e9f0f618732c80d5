//! Publish/subscribe across shards.
//!
//! A channel lives on the shard its name hashes to: the listener's prefix routes pick the
//! cluster and the cluster's hasher (hashtags included) the shard, as for a key, but the name
//! is never stripped of a `remove_prefix`. `PUBLISH` / `SPUBLISH` go to that shard's primary
//! over the session's shared connections, so a message published through any sidecar reaches
//! the subscribers of every other.
//!
//! Subscriptions run on one upstream connection per worker and primary (a *link*), shared by
//! every subscriber of that worker: the link subscribes upstream once per channel (pattern,
//! shard channel) and fans each message out to its local subscribers. A pattern is subscribed
//! on every primary of every routed cluster; since a message is published at its channel's
//! shard only, each arrives once. A link that breaks reconnects and subscribes again to
//! everything its subscribers hold (messages published meanwhile are lost, as with Redis
//! Cluster failovers). A channel its node unsubscribes unasked (a Redis Cluster node that no
//! longer owns a shard channel's slot sends `sunsubscribe`), or whose node cannot be reached,
//! goes back to its subscribers ([`Msg::Moved`]), who subscribe again on the channel's owner
//! in the listener's newest parts (`Subscriber::rehome`).
//!
//! A subscriber's messages wait in a queue bounded by the listener's `pubsub_buffer_limit`
//! (bytes): a subscriber that does not keep up is disconnected when it would pass it, logged
//! and counted, like Redis's `client-output-buffer-limit pubsub`; the other subscribers are
//! not held up.
//!
//! RESP2 subscriber mode is exact: while subscribed, only `(P|S)SUBSCRIBE`,
//! `(P|S)UNSUBSCRIBE`, `PING`, `QUIT` and `RESET` are allowed, and `PING` answers
//! `["pong", message]`. RESP3 clients get messages as push frames and may run any command.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use respway_filters::codec_limits::Limits;
use respway_filters::command::PubSubKind;
use respway_filters::request::{error_reply, Flavor, Reply};
use respway_filters::resp::{encode_command, parse_reply, Frame, ReplyScanner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::session::scatter::BoxReply;
use crate::stack::{ListenerSlot, Parts};
use crate::upstream::{EndpointConfig, EndpointHandle, UpstreamFuture};
use respway_filters::error::{Answer, Failure};

/// What a subscription is to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Kind {
    /// `SUBSCRIBE channel`.
    Channel,
    /// `PSUBSCRIBE pattern`.
    Pattern,
    /// `SSUBSCRIBE shardchannel`.
    Shard,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Channel, Kind::Pattern, Kind::Shard];

    fn index(self) -> usize {
        self as usize
    }

    fn subscribe(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"SUBSCRIBE",
            Kind::Pattern => b"PSUBSCRIBE",
            Kind::Shard => b"SSUBSCRIBE",
        }
    }

    fn unsubscribe(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"UNSUBSCRIBE",
            Kind::Pattern => b"PUNSUBSCRIBE",
            Kind::Shard => b"SUNSUBSCRIBE",
        }
    }

    /// The confirmation's name, as Redis sends it.
    fn confirm(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"subscribe",
            Kind::Pattern => b"psubscribe",
            Kind::Shard => b"ssubscribe",
        }
    }

    fn unconfirm(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"unsubscribe",
            Kind::Pattern => b"punsubscribe",
            Kind::Shard => b"sunsubscribe",
        }
    }

    /// The kind a message of upstream type `t` (`message`, `pmessage`, `smessage`) is for.
    fn of_message(t: &[u8]) -> Option<Kind> {
        match t {
            b"message" => Some(Kind::Channel),
            b"pmessage" => Some(Kind::Pattern),
            b"smessage" => Some(Kind::Shard),
            _ => None,
        }
    }

    fn of_unconfirm(t: &[u8]) -> Option<Kind> {
        match t {
            b"unsubscribe" => Some(Kind::Channel),
            b"punsubscribe" => Some(Kind::Pattern),
            b"sunsubscribe" => Some(Kind::Shard),
            _ => None,
        }
    }

    fn of_confirm(t: &[u8]) -> Option<Kind> {
        match t {
            b"subscribe" => Some(Kind::Channel),
            b"psubscribe" => Some(Kind::Pattern),
            b"ssubscribe" => Some(Kind::Shard),
            _ => None,
        }
    }
}

/// What a link hands a subscriber.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A message for the subscription `name` of `kind`, encoded as Redis sent it (RESP2).
    Data {
        kind: Kind,
        name: Bytes,
        bytes: Bytes,
    },
    /// The subscriber's queue would pass its bound: it is disconnected.
    Overflow,
    /// The link of subscription `name` of `kind` lost it (a Redis Cluster node sent an
    /// unasked `sunsubscribe`: the channel's slot moved; or the node cannot be reached): the
    /// subscriber finds the channel's owner again ([`Subscriber::rehome`]); `tries` so far.
    Moved { kind: Kind, name: Bytes, tries: u32 },
}

mod introspect;
mod link;
mod subscriber;

use link::{link, LinkCmd};
use subscriber::confirmation;
pub(crate) use subscriber::Subscriber;

/// The `(cluster, shard)` channel `name` lives on ([`Routing::place_channel`]).
///
/// [`Routing::place_channel`]: respway_filters::routing::Routing::place_channel
fn shard_of(parts: &Parts, name: &[u8]) -> Option<(usize, usize)> {
    parts.routing.place_channel(name)
}

/// The primary of `(cluster, shard)`.
fn primary(parts: &Parts, cluster: usize, shard: usize) -> Option<&EndpointHandle> {
    parts.primary(cluster, shard)
}

/// Every primary of every routed cluster (those this worker has a handle of).
fn all_primaries(parts: &Parts) -> impl Iterator<Item = &EndpointHandle> {
    // The clusters routes send channels to: a mirror's target gets no PUBLISH.
    parts
        .routing
        .keyspace_clusters()
        .into_iter()
        .flat_map(move |k| {
            let n = parts.endpoints.0.get(k.cluster).map_or(0, Vec::len);
            (0..n).filter_map(move |s| primary(parts, k.cluster, s))
        })
}

const NO_SHARD: &str = "ERR respway: no shard to send the command to";

/// What the session does with a pub/sub command.
pub(crate) enum Outcome {
    /// Answered now.
    Ready(Reply),
    /// A future of its own (confirmations wait for the upstream; `confirms` tells the
    /// session that messages must wait for this reply).
    Wait { fut: BoxReply, confirms: bool },
}

/// Runs a pub/sub command for the session whose subscriptions are `sub` (created on the
/// first subscription).
#[allow(
    clippy::too_many_arguments,
    reason = "the session's state a pub/sub command reads, passed as it is"
)]
pub(crate) fn call(
    kind: PubSubKind,
    args: Vec<Bytes>,
    sub: &mut Option<Box<Subscriber>>,
    parts: &Parts,
    slot: &Arc<ListenerSlot>,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> Outcome {
    let resp3 = flavor.resp3;
    match kind {
        PubSubKind::Subscribe => subscribe(Kind::Channel, &args, sub, parts, slot, resp3, deadline),
        PubSubKind::Psubscribe => {
            subscribe(Kind::Pattern, &args, sub, parts, slot, resp3, deadline)
        }
        PubSubKind::Ssubscribe => subscribe(Kind::Shard, &args, sub, parts, slot, resp3, deadline),
        PubSubKind::Unsubscribe => unsubscribe(Kind::Channel, &args, sub, resp3),
        PubSubKind::Punsubscribe => unsubscribe(Kind::Pattern, &args, sub, resp3),
        PubSubKind::Sunsubscribe => unsubscribe(Kind::Shard, &args, sub, resp3),
        PubSubKind::Publish | PubSubKind::Spublish => {
            match shard_of(parts, &args[1]).and_then(|(c, s)| primary(parts, c, s)) {
                Some(ep) => {
                    let f = ep.send(args, flavor, conn, deadline);
                    Outcome::Wait {
                        fut: Box::pin(f),
                        confirms: false,
                    }
                }
                None => Outcome::Ready(error_reply(NO_SHARD)),
            }
        }
        PubSubKind::Channels | PubSubKind::ShardChannels => {
            introspect::channels(everywhere(parts, &args, flavor, conn, deadline))
        }
        PubSubKind::NumSub | PubSubKind::ShardNumSub => introspect::numsub(
            everywhere(parts, &args, flavor, conn, deadline),
            args[2..].to_vec(),
        ),
        PubSubKind::NumPat => introspect::numpat(everywhere(parts, &args, flavor, conn, deadline)),
    }
}

/// `(P|S)SUBSCRIBE`: each new name is subscribed on its link(s); the confirmations are
/// answered once the links acknowledged them (or at the deadline).
fn subscribe(
    k: Kind,
    args: &[Bytes],
    sub: &mut Option<Box<Subscriber>>,
    parts: &Parts,
    slot: &Arc<ListenerSlot>,
    resp3: bool,
    deadline: Instant,
) -> Outcome {
    let s = sub.get_or_insert_with(|| {
        Box::new(Subscriber::new(
            parts.listener.client.pubsub_buffer_limit,
            slot.clone(),
        ))
    });
    let mut out = BytesMut::new();
    let mut acks = Vec::new();
    for name in &args[1..] {
        if !s.names[k.index()].contains_key(name) {
            let eps: Vec<&EndpointHandle> = if k == Kind::Pattern {
                all_primaries(parts).collect()
            } else {
                shard_of(parts, name)
                    .and_then(|(c, sh)| primary(parts, c, sh))
                    .into_iter()
                    .collect()
            };
            if eps.is_empty() {
                return Outcome::Ready(error_reply(NO_SHARD));
            }
            let mut links = Vec::with_capacity(eps.len());
            for ep in eps {
                let l = (ep.config().address, link(ep));
                let (tx, rx) = oneshot::channel();
                let _ = l.1.send(LinkCmd::Sub {
                    kind: k,
                    name: name.clone(),
                    sub: s.tx.clone(),
                    ack: tx,
                });
                acks.push(rx);
                links.push(l);
            }
            s.names[k.index()].insert(name.clone(), links);
        }
        let n = if k == Kind::Shard {
            s.names[2].len()
        } else {
            s.count()
        };
        confirmation(&mut out, resp3, k.confirm(), Some(name), n);
    }
    let reply = out.freeze();
    Outcome::Wait {
        fut: Box::pin(async move {
            // A shard that is down: the subscription takes effect when it is back (the link
            // resubscribes); the client is answered at its deadline.
            let _ = tokio::time::timeout_at(deadline, async {
                for a in acks {
                    let _ = a.await;
                }
            })
            .await;
            Ok(reply)
        }),
        confirms: true,
    }
}

/// `(P|S)UNSUBSCRIBE`: answered at once (Redis confirms before it stops delivering too).
fn unsubscribe(k: Kind, args: &[Bytes], sub: &mut Option<Box<Subscriber>>, resp3: bool) -> Outcome {
    let mut out = BytesMut::new();
    let Some(s) = sub.as_mut() else {
        if args.len() == 1 {
            confirmation(&mut out, resp3, k.unconfirm(), None, 0);
        } else {
            for name in &args[1..] {
                confirmation(&mut out, resp3, k.unconfirm(), Some(name), 0);
            }
        }
        return Outcome::Ready(out.freeze());
    };
    let names: Vec<Bytes> = if args.len() == 1 {
        s.names[k.index()].keys().cloned().collect()
    } else {
        args[1..].to_vec()
    };
    if names.is_empty() {
        let n = if k == Kind::Shard { 0 } else { s.count() };
        confirmation(&mut out, resp3, k.unconfirm(), None, n);
    }
    for name in names {
        if let Some(links) = s.names[k.index()].remove(&name) {
            for (_, l) in links {
                let _ = l.send(LinkCmd::Unsub {
                    kind: k,
                    name: name.clone(),
                    id: s.id,
                });
            }
        }
        let n = if k == Kind::Shard {
            s.names[2].len()
        } else {
            s.count()
        };
        confirmation(&mut out, resp3, k.unconfirm(), Some(&name), n);
    }
    Outcome::Ready(out.freeze())
}

/// `args` sent now to every primary of every routed cluster.
fn everywhere<'a>(
    parts: &'a Parts,
    args: &'a [Bytes],
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> impl Iterator<Item = ((), UpstreamFuture)> + 'a {
    all_primaries(parts).map(move |ep| ((), ep.send(args.to_vec(), flavor, conn, deadline)))
}

/// The elements of an array reply.
fn items(r: &Reply) -> Result<Vec<Frame>, Answer> {
    match parse_reply(r) {
        Ok(Frame::Array(v) | Frame::Set(v)) => Ok(v),
        _ => Err(Err(Failure::message(
            "ERR respway: unexpected PUBSUB reply from a shard",
        ))),
    }
}

/// True for the commands RESP2 allows a subscribed client.
pub(crate) fn allowed_when_subscribed(cmd: &respway_filters::command::CommandInfo) -> bool {
    use respway_filters::command::{CommandClass, ProxyCommand};
    matches!(
        cmd.class,
        CommandClass::PubSub(
            PubSubKind::Subscribe
                | PubSubKind::Psubscribe
                | PubSubKind::Ssubscribe
                | PubSubKind::Unsubscribe
                | PubSubKind::Punsubscribe
                | PubSubKind::Sunsubscribe
        ) | CommandClass::Proxy(ProxyCommand::Ping | ProxyCommand::Quit | ProxyCommand::Reset)
    )
}

/// True when the command at metrics index `idx` answers with subscription confirmations.
pub(crate) fn confirms(idx: u16) -> bool {
    use respway_filters::command::CommandClass;
    respway_filters::command::all()
        .get(usize::from(idx))
        .is_some_and(|c| {
            matches!(
                c.class,
                CommandClass::PubSub(
                    PubSubKind::Subscribe | PubSubKind::Psubscribe | PubSubKind::Ssubscribe
                )
            )
        })
}

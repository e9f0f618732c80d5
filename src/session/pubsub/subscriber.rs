//! One session's subscriptions and its bounded queue of messages.

use super::link::{LinkTx, SubTx};
use super::*;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A session's subscriptions.
#[derive(Debug)]
pub(crate) struct Subscriber {
    pub(super) id: u64,
    pub(super) rx: mpsc::UnboundedReceiver<Msg>,
    pub(super) tx: SubTx,
    /// Subscriptions by kind: the links (with their node's address) each is held on.
    pub(super) names: [HashMap<Bytes, Vec<(SocketAddr, LinkTx)>>; 3],
    /// Confirmations (`SUBSCRIBE` replies) not yet written: messages wait for them.
    pub(crate) confirming: usize,
    /// The listener's parts as they are now: where a channel whose link lost it lives.
    slot: Arc<ListenerSlot>,
}

/// How often, and how many times, a subscription whose node lost it looks for the channel's
/// owner again while the topology still names the same node (a Redis Cluster refreshes its
/// map within a few hundred milliseconds of a failover or a slot move; a node that is only
/// restarting answers again): 20 × 100 ms, then it subscribes there again.
const REHOME_EVERY: Duration = Duration::from_millis(100);
const REHOME_TRIES: u32 = 20;

impl Subscriber {
    /// A subscriber whose queue holds at most `limit` bytes.
    pub(crate) fn new(limit: usize, slot: Arc<ListenerSlot>) -> Subscriber {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Subscriber {
            id,
            rx,
            tx: SubTx {
                id,
                tx,
                queued: Arc::default(),
                overflow: Arc::default(),
                limit,
            },
            names: Default::default(),
            confirming: 0,
            slot,
        }
    }

    /// Channels and patterns held (what Redis counts in `(P)SUBSCRIBE` replies).
    pub(super) fn count(&self) -> usize {
        self.names[0].len() + self.names[1].len()
    }

    /// True while any subscription is held (RESP2 subscriber mode).
    pub(crate) fn active(&self) -> bool {
        self.names.iter().any(|m| !m.is_empty())
    }

    /// Moves queued messages into `out` (RESP3 clients get push frames) while `out` holds
    /// less than `max` bytes. `Err` when the queue passed its bound.
    pub(crate) fn drain(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
        resp3: bool,
        max: usize,
    ) -> Result<bool, usize> {
        let mut moved = false;
        while out.len() < max {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(Msg::Data { kind, name, bytes })) => {
                    self.tx.queued.fetch_sub(bytes.len(), Ordering::Relaxed);
                    // Queued before this client unsubscribed: not delivered after.
                    if !self.names[kind.index()].contains_key(&name) {
                        continue;
                    }
                    let at = out.len();
                    out.extend_from_slice(&bytes);
                    if resp3 {
                        out[at] = b'>';
                    }
                    moved = true;
                }
                Poll::Ready(Some(Msg::Overflow)) => {
                    return Err(self.tx.queued.load(Ordering::Relaxed));
                }
                Poll::Ready(Some(Msg::Moved { kind, name, tries })) => {
                    if self.rehome(kind, name, tries, out, resp3) {
                        moved = true;
                    }
                }
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        Ok(moved)
    }

    /// Subscription `name` of `kind` was lost by its link ([`Msg::Moved`]): subscribed again
    /// on the link of the channel's owner in the listener's parts as they are now (the same
    /// link again for a shard that is not a Redis Cluster's: it resubscribes once the node is
    /// back). While a Redis Cluster's map still names the node that lost it, its topology is
    /// asked to be refreshed and it looks again every [`REHOME_EVERY`] (at most
    /// [`REHOME_TRIES`] times, then it subscribes there again: a node that restarts takes it
    /// back). When no shard
    /// has the channel any more, the client is told: an `unsubscribe` (`sunsubscribe`) for
    /// it is written to `out` (true), never a subscription to nothing.
    fn rehome(
        &mut self,
        kind: Kind,
        name: Bytes,
        tries: u32,
        out: &mut BytesMut,
        resp3: bool,
    ) -> bool {
        let Some(links) = self.names[kind.index()].get(&name) else {
            return false; // unsubscribed meanwhile
        };
        let old: Vec<SocketAddr> = links.iter().map(|(a, _)| *a).collect();
        let parts = self.slot.parts.load();
        let owner = shard_of(&parts, &name).and_then(|(c, s)| {
            let ep = primary(&parts, c, s)?;
            Some((c, ep.clone()))
        });
        let Some((cluster, ep)) = owner else {
            // Nowhere to subscribe: the client is told.
            if let Some(links) = self.names[kind.index()].remove(&name) {
                for (_, l) in links {
                    let _ = l.send(LinkCmd::Unsub {
                        kind,
                        name: name.clone(),
                        id: self.id,
                    });
                }
            }
            let n = if kind == Kind::Shard {
                self.names[2].len()
            } else {
                self.count()
            };
            confirmation(out, resp3, kind.unconfirm(), Some(&name), n);
            tracing::warn!(channel = %String::from_utf8_lossy(&name), "pub/sub: no shard has the channel any more; the client is unsubscribed");
            return true;
        };
        let addr = ep.config().address;
        let same = old.contains(&addr);
        let redis_cluster = parts.endpoints.1.get(cluster).and_then(Option::as_ref);
        if let (true, Some(rc), true) = (same, redis_cluster, tries < REHOME_TRIES) {
            // A Redis Cluster whose map still names the node that lost it: ask for a
            // refresh, look again.
            rc.topology.redirected(true);
            let tx = self.tx.tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REHOME_EVERY).await;
                let _ = tx.send(Msg::Moved {
                    kind,
                    name,
                    tries: tries + 1,
                });
            });
            return false;
        }
        let l = link(&ep);
        let (ack, _) = oneshot::channel();
        let _ = l.send(LinkCmd::Sub {
            kind,
            name: name.clone(),
            sub: self.tx.clone(),
            ack,
        });
        if let Some(links) = self.names[kind.index()].get_mut(&name) {
            for (a, old_link) in links.drain(..) {
                if a != addr {
                    let _ = old_link.send(LinkCmd::Unsub {
                        kind,
                        name: name.clone(),
                        id: self.id,
                    });
                }
            }
            links.push((addr, l));
        }
        if !same {
            tracing::info!(channel = %String::from_utf8_lossy(&name), node = %addr, "pub/sub: subscribed again on the channel's new owner");
        }
        false
    }

    /// Ends every subscription (the session ends or sent `RESET`).
    pub(super) fn leave(&mut self) {
        for kind in Kind::ALL {
            for (name, links) in self.names[kind.index()].drain() {
                for (_, l) in links {
                    let _ = l.send(LinkCmd::Unsub {
                        kind,
                        name: name.clone(),
                        id: self.id,
                    });
                }
            }
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.leave();
    }
}

/// `[kind-name, name, count]` as a RESP2 array or a RESP3 push.
pub(super) fn confirmation(
    out: &mut BytesMut,
    resp3: bool,
    what: &'static [u8],
    name: Option<&Bytes>,
    n: usize,
) {
    let items = vec![
        Frame::Bulk(Bytes::from_static(what)),
        name.map_or(Frame::Null, |n| Frame::Bulk(n.clone())),
        Frame::Integer(n as i64),
    ];
    if resp3 {
        Frame::Push(items).encode(out);
    } else {
        Frame::Array(items).encode(out);
    }
}

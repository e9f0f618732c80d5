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
    /// Subscriptions by kind: the links each is held on.
    pub(super) names: [HashMap<Bytes, Vec<LinkTx>>; 3],
    /// Confirmations (`SUBSCRIBE` replies) not yet written: messages wait for them.
    pub(crate) confirming: usize,
}

impl Subscriber {
    /// A subscriber whose queue holds at most `limit` bytes.
    pub(crate) fn new(limit: usize) -> Subscriber {
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
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        Ok(moved)
    }

    /// Ends every subscription (the session ends or sent `RESET`).
    pub(super) fn leave(&mut self) {
        for kind in Kind::ALL {
            for (name, links) in self.names[kind.index()].drain() {
                for l in links {
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

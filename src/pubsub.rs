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
//! Cluster failovers).
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

use crate::fanout::BoxReply;
use crate::stack::Parts;
use crate::upstream::{EndpointConfig, EndpointHandle, UpstreamFuture};

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
}

/// A subscriber as a link sees it.
#[derive(Debug, Clone)]
struct SubTx {
    id: u64,
    tx: mpsc::UnboundedSender<Msg>,
    queued: Arc<AtomicUsize>,
    overflow: Arc<AtomicBool>,
    limit: usize,
}

impl SubTx {
    fn deliver(&self, kind: Kind, name: &Bytes, bytes: &Bytes) {
        if self.overflow.load(Ordering::Relaxed) {
            return;
        }
        let q = self.queued.load(Ordering::Relaxed);
        if q + bytes.len() > self.limit {
            self.overflow.store(true, Ordering::Relaxed);
            let _ = self.tx.send(Msg::Overflow);
            return;
        }
        self.queued.fetch_add(bytes.len(), Ordering::Relaxed);
        let _ = self.tx.send(Msg::Data {
            kind,
            name: name.clone(),
            bytes: bytes.clone(),
        });
    }
}

/// A request to a link.
#[derive(Debug)]
enum LinkCmd {
    /// Add `sub` to `name`; `ack` once the upstream subscription is confirmed.
    Sub {
        kind: Kind,
        name: Bytes,
        sub: SubTx,
        ack: oneshot::Sender<()>,
    },
    /// Remove subscriber `id` from `name`.
    Unsub { kind: Kind, name: Bytes, id: u64 },
}

type LinkTx = mpsc::UnboundedSender<LinkCmd>;

thread_local! {
    /// This worker thread's links, by endpoint address.
    static LINKS: std::cell::RefCell<HashMap<SocketAddr, LinkTx>> =
        std::cell::RefCell::new(HashMap::new());
}

/// This worker's link to `ep` (spawned on first use).
fn link(ep: &EndpointHandle) -> LinkTx {
    let cfg = ep.config();
    LINKS.with(|l| {
        let mut l = l.borrow_mut();
        if let Some(tx) = l.get(&cfg.address).filter(|t| !t.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_link(cfg.clone(), rx));
        l.insert(cfg.address, tx.clone());
        tx
    })
}

/// One subscription of one upstream connection: its local subscribers, and whether the
/// upstream confirmed it (`acks` wait until then).
#[derive(Default)]
struct Entry {
    subs: Vec<SubTx>,
    confirmed: bool,
    acks: Vec<oneshot::Sender<()>>,
}

/// The link task: one upstream connection in subscriber mode (RESP2), reconnected as long as
/// subscribers remain.
async fn run_link(cfg: EndpointConfig, mut rx: mpsc::UnboundedReceiver<LinkCmd>) {
    let mut subs: [HashMap<Bytes, Entry>; 3] = Default::default();
    let mut backoff = Duration::from_millis(50);
    loop {
        // Connected only while something is subscribed: wait for the first request.
        if subs.iter().all(HashMap::is_empty) {
            match rx.recv().await {
                Some(cmd) => apply(&mut subs, cmd, None),
                None => return,
            }
            continue;
        }
        let stream = match crate::upstream::connect_plain(&cfg).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(endpoint = %cfg.label, error = %e, "pub/sub connect failed");
                // Requests keep being taken meanwhile.
                let until = Instant::now() + backoff;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                loop {
                    tokio::select! {
                        c = rx.recv() => match c {
                            Some(cmd) => apply(&mut subs, cmd, None),
                            None => return,
                        },
                        () = tokio::time::sleep_until(until) => break,
                    }
                }
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        // One link per worker and primary: a boxed stream costs nothing that matters here.
        type Rd = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
        type Wr = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;
        let (mut rd, mut wr): (Rd, Wr) = match stream {
            crate::upstream::Conn::Plain(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            crate::upstream::Conn::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(r), Box::new(w))
            }
        };
        let mut wbuf = BytesMut::new();
        for kind in Kind::ALL {
            let m = &mut subs[kind.index()];
            for e in m.values_mut() {
                e.confirmed = false;
            }
            if !m.is_empty() {
                let mut args = vec![Bytes::from_static(kind.subscribe())];
                args.extend(m.keys().cloned());
                encode_command(&args, &mut wbuf);
            }
        }
        let mut rbuf = BytesMut::with_capacity(16 * 1024);
        // Resumes inside a message that spans reads (a large payload, or a reply to a
        // subscribe of many channels) instead of scanning it again from its start.
        let mut scanner = ReplyScanner::new();
        let limits = Limits::REPLIES;
        let failed: String = 'conn: loop {
            if !wbuf.is_empty() {
                if let Err(e) = wr.write_all(&wbuf).await {
                    break 'conn e.to_string();
                }
                // TLS: the records rustls holds go out now (a no-op on TCP).
                if let Err(e) = wr.flush().await {
                    break 'conn e.to_string();
                }
                wbuf.clear();
            }
            tokio::select! {
                c = rx.recv() => match c {
                    Some(cmd) => apply(&mut subs, cmd, Some(&mut wbuf)),
                    None => return,
                },
                r = rd.read_buf(&mut rbuf) => {
                    match r {
                        Ok(0) => break 'conn "connection closed by server".into(),
                        Ok(_) => {}
                        Err(e) => break 'conn e.to_string(),
                    }
                    loop {
                        match scanner.scan(&rbuf, &limits) {
                            Ok(Some(n)) => {
                                let frame = rbuf.split_to(n).freeze();
                                on_frame(&mut subs, frame);
                            }
                            Ok(None) => break,
                            Err(e) => break 'conn e.to_string(),
                        }
                    }
                    if rbuf.capacity() < 4096 {
                        rbuf.reserve(16 * 1024);
                    }
                }
            }
        };
        tracing::warn!(endpoint = %cfg.label, error = %failed, "pub/sub connection lost; resubscribing");
    }
}

/// Applies a subscriber's request; upstream commands go to `wbuf` when connected.
fn apply(subs: &mut [HashMap<Bytes, Entry>; 3], cmd: LinkCmd, wbuf: Option<&mut BytesMut>) {
    match cmd {
        LinkCmd::Sub {
            kind,
            name,
            sub,
            ack,
        } => {
            let m = &mut subs[kind.index()];
            let fresh = !m.contains_key(&name);
            let e = m.entry(name.clone()).or_default();
            e.subs.retain(|s| s.id != sub.id && !s.tx.is_closed());
            e.subs.push(sub);
            if e.confirmed {
                let _ = ack.send(());
            } else {
                e.acks.push(ack);
            }
            if fresh {
                if let Some(w) = wbuf {
                    encode_command(&[Bytes::from_static(kind.subscribe()), name], w);
                }
            }
        }
        LinkCmd::Unsub { kind, name, id } => {
            let m = &mut subs[kind.index()];
            let Some(e) = m.get_mut(&name) else { return };
            e.subs.retain(|s| s.id != id && !s.tx.is_closed());
            if e.subs.is_empty() {
                m.remove(&name);
                if let Some(w) = wbuf {
                    encode_command(&[Bytes::from_static(kind.unsubscribe()), name], w);
                }
            }
        }
    }
}

/// Handles one frame from upstream: a message to fan out, or a confirmation.
fn on_frame(subs: &mut [HashMap<Bytes, Entry>; 3], frame: Bytes) {
    let Ok(Frame::Array(items) | Frame::Push(items)) = parse_reply(&frame) else {
        return;
    };
    let Some(Frame::Bulk(t)) = items.first() else {
        return;
    };
    if let Some(kind) = Kind::of_message(t) {
        let Some(Frame::Bulk(name)) = items.get(1) else {
            return;
        };
        if let Some(e) = subs[kind.index()].get_mut(name) {
            e.subs.retain(|s| !s.tx.is_closed());
            for s in &e.subs {
                s.deliver(kind, name, &frame);
            }
        }
    } else if let Some(kind) = Kind::of_confirm(t) {
        let Some(Frame::Bulk(name)) = items.get(1) else {
            return;
        };
        if let Some(e) = subs[kind.index()].get_mut(name) {
            e.confirmed = true;
            for a in e.acks.drain(..) {
                let _ = a.send(());
            }
        }
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A session's subscriptions.
#[derive(Debug)]
pub(crate) struct Subscriber {
    id: u64,
    rx: mpsc::UnboundedReceiver<Msg>,
    tx: SubTx,
    /// Subscriptions by kind: the links each is held on.
    names: [HashMap<Bytes, Vec<LinkTx>>; 3],
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
    fn count(&self) -> usize {
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
    fn leave(&mut self) {
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
fn confirmation(
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

/// Every primary of every routed cluster.
fn all_primaries(parts: &Parts) -> Vec<&EndpointHandle> {
    let mut v = Vec::new();
    // The clusters routes send channels to: a mirror's target gets no PUBLISH.
    for c in parts
        .routing
        .keyspace_clusters()
        .into_iter()
        .map(|k| k.cluster)
    {
        let n = parts.endpoints.0.get(c).map_or(0, Vec::len);
        for s in 0..n {
            if let Some(ep) = primary(parts, c, s) {
                v.push(ep);
            }
        }
    }
    v
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
pub(crate) fn call(
    kind: PubSubKind,
    args: Vec<Bytes>,
    sub: &mut Option<Box<Subscriber>>,
    parts: &Parts,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> Outcome {
    let resp3 = flavor.resp3;
    match kind {
        PubSubKind::Subscribe | PubSubKind::Psubscribe | PubSubKind::Ssubscribe => {
            let k = match kind {
                PubSubKind::Subscribe => Kind::Channel,
                PubSubKind::Psubscribe => Kind::Pattern,
                _ => Kind::Shard,
            };
            let s = sub.get_or_insert_with(|| {
                Box::new(Subscriber::new(parts.listener.client.pubsub_buffer_limit))
            });
            let mut out = BytesMut::new();
            let mut acks = Vec::new();
            for name in &args[1..] {
                if !s.names[k.index()].contains_key(name) {
                    let eps = if k == Kind::Pattern {
                        all_primaries(parts)
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
                        let l = link(ep);
                        let (tx, rx) = oneshot::channel();
                        let _ = l.send(LinkCmd::Sub {
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
                    // A shard that is down: the subscription takes effect when it is back
                    // (the link resubscribes); the client is answered at its deadline.
                    let _ = tokio::time::timeout_at(deadline, async {
                        for a in acks {
                            let _ = a.await;
                        }
                    })
                    .await;
                    reply
                }),
                confirms: true,
            }
        }
        PubSubKind::Unsubscribe | PubSubKind::Punsubscribe | PubSubKind::Sunsubscribe => {
            let k = match kind {
                PubSubKind::Unsubscribe => Kind::Channel,
                PubSubKind::Punsubscribe => Kind::Pattern,
                _ => Kind::Shard,
            };
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
                    for l in links {
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
        PubSubKind::Publish | PubSubKind::Spublish => {
            match shard_of(parts, &args[1]).and_then(|(c, s)| primary(parts, c, s)) {
                Some(ep) => {
                    let f = ep.send(args, flavor, conn, deadline);
                    Outcome::Wait {
                        fut: Box::pin(async move {
                            let Ok(r) = f.await;
                            r
                        }),
                        confirms: false,
                    }
                }
                None => Outcome::Ready(error_reply(NO_SHARD)),
            }
        }
        PubSubKind::Channels | PubSubKind::ShardChannels => {
            let futs = everywhere(parts, &args, flavor, conn, deadline);
            Outcome::Wait {
                fut: merged(async move {
                    let replies = crate::fanout::join_ok(futs).await?;
                    let mut seen = std::collections::HashSet::new();
                    let mut all = Vec::new();
                    for r in &replies {
                        for f in items(r)? {
                            if let Frame::Bulk(b) = &f {
                                if seen.insert(b.clone()) {
                                    all.push(f);
                                }
                            }
                        }
                    }
                    Ok(Frame::Array(all).to_bytes())
                }),
                confirms: false,
            }
        }
        PubSubKind::NumSub | PubSubKind::ShardNumSub => {
            let futs = everywhere(parts, &args, flavor, conn, deadline);
            let names: Vec<Bytes> = args[2..].to_vec();
            Outcome::Wait {
                fut: merged(async move {
                    let replies = crate::fanout::join_ok(futs).await?;
                    let mut counts = vec![0i64; names.len()];
                    for r in &replies {
                        let it = items(r)?;
                        let mut parts = Vec::new();
                        let mut it = it.into_iter();
                        while let (Some(_), Some(n)) = (it.next(), it.next()) {
                            parts.push(match n {
                                Frame::Integer(n) => n,
                                _ => 0,
                            });
                        }
                        for (c, n) in counts.iter_mut().zip(parts) {
                            *c += n;
                        }
                    }
                    let mut out = Vec::with_capacity(2 * names.len());
                    for (name, n) in names.into_iter().zip(counts) {
                        out.push(Frame::Bulk(name));
                        out.push(Frame::Integer(n));
                    }
                    Ok(Frame::Array(out).to_bytes())
                }),
                confirms: false,
            }
        }
        PubSubKind::NumPat => {
            let futs = everywhere(parts, &args, flavor, conn, deadline);
            Outcome::Wait {
                fut: merged(async move {
                    let replies = crate::fanout::join_ok(futs).await?;
                    let mut max = 0;
                    for r in &replies {
                        if let Ok(Frame::Integer(n)) = parse_reply(r) {
                            max = max.max(n);
                        }
                    }
                    Ok(Frame::Integer(max).to_bytes())
                }),
                confirms: false,
            }
        }
    }
}

/// A merge that may fail, as a reply future: the reply or the error.
fn merged(f: impl std::future::Future<Output = Result<Reply, Reply>> + Send + 'static) -> BoxReply {
    Box::pin(async move { f.await.unwrap_or_else(|e| e) })
}

fn everywhere(
    parts: &Parts,
    args: &[Bytes],
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> Vec<UpstreamFuture> {
    all_primaries(parts)
        .into_iter()
        .map(|ep| ep.send(args.to_vec(), flavor, conn, deadline))
        .collect()
}

/// The elements of an array reply.
fn items(r: &Reply) -> Result<Vec<Frame>, Reply> {
    match parse_reply(r) {
        Ok(Frame::Array(v) | Frame::Set(v)) => Ok(v),
        _ => Err(error_reply(
            "ERR respway: unexpected PUBSUB reply from a shard",
        )),
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

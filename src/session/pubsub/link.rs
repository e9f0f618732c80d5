//! Links: one upstream connection per worker and primary that subscribes once per name for
//! every local subscriber, fans messages out, and resubscribes after a reconnect.

use super::*;

/// A subscriber as a link sees it.
#[derive(Debug, Clone)]
pub(super) struct SubTx {
    pub(super) id: u64,
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) overflow: Arc<AtomicBool>,
    pub(super) limit: usize,
}

impl SubTx {
    pub(super) fn deliver(&self, kind: Kind, name: &Bytes, bytes: &Bytes) {
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
pub(super) enum LinkCmd {
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

pub(super) type LinkTx = mpsc::UnboundedSender<LinkCmd>;

thread_local! {
    /// This worker thread's links, by endpoint address.
    static LINKS: std::cell::RefCell<HashMap<SocketAddr, LinkTx>> =
        std::cell::RefCell::new(HashMap::new());
}

/// This worker's link to `ep` (spawned on first use).
pub(super) fn link(ep: &EndpointHandle) -> LinkTx {
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
pub(super) struct Entry {
    pub(super) subs: Vec<SubTx>,
    pub(super) confirmed: bool,
    pub(super) acks: Vec<oneshot::Sender<()>>,
}

/// The link task: one upstream connection in subscriber mode (RESP2), reconnected as long as
/// subscribers remain.
pub(super) async fn run_link(cfg: EndpointConfig, mut rx: mpsc::UnboundedReceiver<LinkCmd>) {
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
                // The node cannot be reached: its channels (not its patterns, which are
                // subscribed on every primary) go back to their subscribers, who subscribe
                // again on the channel's owner (a promoted replica), or here again once the
                // node is back.
                for kind in [Kind::Channel, Kind::Shard] {
                    for (name, e) in subs[kind.index()].drain() {
                        hand_back(kind, &name, e);
                    }
                }
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
pub(super) fn apply(
    subs: &mut [HashMap<Bytes, Entry>; 3],
    cmd: LinkCmd,
    wbuf: Option<&mut BytesMut>,
) {
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

/// Tells each subscriber of `e` (subscription `name` of `kind`) that this link lost it
/// ([`Msg::Moved`]).
fn hand_back(kind: Kind, name: &Bytes, e: Entry) {
    for s in e.subs {
        let _ = s.tx.send(Msg::Moved {
            kind,
            name: name.clone(),
            tries: 0,
        });
    }
}

/// Handles one frame from upstream: a message to fan out, or a confirmation.
pub(super) fn on_frame(subs: &mut [HashMap<Bytes, Entry>; 3], frame: Bytes) {
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
    } else if let Some(kind) = Kind::of_unconfirm(t) {
        // Unasked (the link removes a name before it unsubscribes): a Redis Cluster node
        // that no longer owns the channel's slot (moved, or the node was made a replica)
        // unsubscribed it. Its subscribers find the new owner.
        let Some(Frame::Bulk(name)) = items.get(1) else {
            return;
        };
        if let Some(e) = subs[kind.index()].remove(name) {
            hand_back(kind, name, e);
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

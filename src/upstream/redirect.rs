//! A Redis Cluster's redirections, followed for the client (who speaks plain Redis and never
//! sees one):
//! - `-MOVED <slot> <addr>`: the slot has another owner. The command goes once more, to that
//!   node when this worker has it among the cluster's endpoints; the redirection is counted
//!   towards a topology refresh ([`TopologyHints::redirected`]), after which the slot's keys
//!   go to the new owner directly.
//! - `-ASK <slot> <addr>`: the slot is being moved and this key is already on the importing
//!   node: `ASKING` and the command go there, in one piece on one connection; the map is not
//!   changed.
//! - `-TRYAGAIN`: a multi-key command whose keys are split between the two nodes of a slot
//!   being moved: sent again to the first node after a short pause (10 ms, then 20, 40, ...).
//!
//! At most [`MAX_HOPS`] redirections per command. A `MOVED` to a node this worker does not have
//! (a node that joined since the last refresh) has the topology refreshed at once, and the
//! command goes there after a pause once the worker has the node (else to where it went first,
//! again); after the last hop it fails with an error naming the node. Commands answered by a redirection are not run anywhere else
//! first: only the node that answered the redirection saw them, and it did not run them.
//! Redirections are followed for commands on the shared connections, and for blocking
//! commands on their dedicated ones (`session::blocking`, with [`redirection`] and [`node`]);
//! a transaction's redirection becomes respway's error saying the transaction is aborted
//! (`session::tx::moved_in_tx`); pub/sub subscriptions follow their channel's owner
//! (`session::pubsub`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use respway_filters::request::Flavor;
use tokio::time::Instant;

use super::{send_on, EndpointHandle, Endpoints, UpstreamError, UpstreamFuture};

/// Redirections followed for one command at most.
pub(crate) const MAX_HOPS: u8 = 5;

/// `ASKING`, encoded: what precedes a command sent after `-ASK`.
const ASKING: &[u8] = b"*1\r\n$6\r\nASKING\r\n";

/// What the upstream tells whoever follows a Redis Cluster's topology (discovery's watcher of
/// the cluster implements it; the upstream is handed one per Redis Cluster and knows no
/// watcher).
pub(crate) trait TopologyHints: Send + Sync + std::fmt::Debug {
    /// A `MOVED` (`moved`) or `ASK` was followed: a `MOVED` says the slot map is stale.
    fn redirected(&self, moved: bool);
    /// A `MOVED` named a node this sidecar does not know: refresh now.
    fn unknown_node(&self);
    /// A request to a node failed (the node may be gone).
    fn failed(&self);
}

/// A Redis Cluster of a worker's endpoints: its name and where its topology hints go.
#[derive(Debug, Clone)]
pub(crate) struct RedisCluster {
    pub(crate) name: Arc<str>,
    pub(crate) topology: Arc<dyn TopologyHints>,
}

/// What a command to a Redis Cluster keeps to be sent again.
#[derive(Debug)]
pub(crate) struct Redirect {
    endpoints: Arc<Endpoints>,
    cluster: usize,
    /// The cluster's name (its refresh is asked by it).
    pub(super) name: Arc<str>,
    args: Vec<Bytes>,
    /// The client's frame when there was one (then `args` is empty: the frame is sent).
    raw: Option<Bytes>,
    flavor: Flavor,
    conn: usize,
    /// Where it went first (`TRYAGAIN` goes there again).
    origin: EndpointHandle,
    hops: u8,
    /// A `MOVED` to a node this worker had no handle of: looked up again (in the worker's
    /// newest endpoints) after the pause.
    moved_to: Option<std::net::SocketAddr>,
}

/// What to do with a reply.
pub(super) enum Follow {
    /// It is the answer.
    Answer,
    /// Sent again: this is the new reply.
    Sent(UpstreamFuture),
    /// Send again to where it went first after this pause.
    Later(Duration),
    /// Give up with this error.
    Fail(UpstreamError),
}

impl Redirect {
    /// Where this cluster's topology hints go (looked up only when there is one to give; a
    /// `Redirect` exists only for a Redis Cluster, so there always is).
    pub(super) fn topology(&self) -> Option<&dyn TopologyHints> {
        Some(&*self.endpoints.1.get(self.cluster)?.as_ref()?.topology)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        endpoints: Arc<Endpoints>,
        cluster: usize,
        name: Arc<str>,
        args: Vec<Bytes>,
        raw: Option<Bytes>,
        flavor: Flavor,
        conn: usize,
        origin: EndpointHandle,
    ) -> Redirect {
        Redirect {
            endpoints,
            cluster,
            name,
            args,
            raw,
            flavor,
            conn,
            origin,
            hops: 0,
            moved_to: None,
        }
    }

    /// What `reply` asks for.
    pub(super) fn follow(&mut self, reply: &[u8], deadline: Instant) -> Follow {
        if reply.first() != Some(&b'-') {
            return Follow::Answer;
        }
        let (kind, target) = match parse(reply) {
            Some(r) => r,
            None => return Follow::Answer,
        };
        self.hops += 1;
        if self.hops > MAX_HOPS {
            return Follow::Fail(UpstreamError::Unavailable(
                format!(
                    "Redis Cluster redirected the command {MAX_HOPS} times (last: {})",
                    String::from_utf8_lossy(reply.strip_suffix(b"\r\n").unwrap_or(reply))
                )
                .into(),
            ));
        }
        REDIRECTS[kind as usize].fetch_add(1, Ordering::Relaxed);
        match kind {
            Kind::TryAgain => Follow::Later(Duration::from_millis(10 << (self.hops - 1).min(4))),
            Kind::Moved | Kind::Ask => {
                if let Some(t) = self.topology() {
                    t.redirected(kind == Kind::Moved);
                }
                match self.find(target) {
                    Some(ep) => {
                        if kind == Kind::Moved {
                            self.note_promoted(&ep);
                        }
                        Follow::Sent(self.send(&ep, kind == Kind::Ask, deadline))
                    }
                    // A node that joined since the last refresh: the topology is refreshed at
                    // once, and the command goes to the node once this worker has it (or, after
                    // the pause, to where it went first again).
                    None if self.hops < MAX_HOPS => {
                        if let Some(t) = self.topology() {
                            t.unknown_node();
                        }
                        self.moved_to = Some(target);
                        Follow::Later(Duration::from_millis(10 << (self.hops - 1).min(4)))
                    }
                    None => Follow::Fail(UpstreamError::Unavailable(
                        format!(
                            "Redis Cluster moved the key's slot to {target}, which the sidecar \
                             does not know yet (the topology is being refreshed)"
                        )
                        .into(),
                    )),
                }
            }
        }
    }

    /// Sends the command again after a pause: to the node a `MOVED` named if this worker has it
    /// now, else to where it went first.
    pub(super) fn again(&mut self, deadline: Instant) -> UpstreamFuture {
        let ep = match self.moved_to.take().and_then(|t| self.find(t)) {
            Some(ep) => ep,
            None => self.origin.clone(),
        };
        self.send(&ep, false, deadline)
    }

    fn send(&self, ep: &EndpointHandle, asking: bool, deadline: Instant) -> UpstreamFuture {
        let label = ep.label().clone();
        let Some(conns) = ep.shared(self.flavor) else {
            return UpstreamFuture::failed(UpstreamError::NoShard, label, deadline);
        };
        let pre = asking.then(|| (Bytes::from_static(ASKING), 1, Arc::default()));
        crate::stats::bump(&ep.inner.requests, 1);
        send_on(
            &conns[self.conn % conns.len()],
            self.args.clone(),
            self.raw.clone(),
            deadline,
            label,
            &ep.inner.stats,
            ep.inner.cfg.max_queue,
            (pre, None),
        )
    }

    /// A `MOVED` from a shard's primary to a node of the same shard (its replica, promoted
    /// by a failover): the shard's later commands go to that node at once
    /// ([`super::promoted::Promoted`]). A `MOVED` to another shard's node (a slot moved) changes
    /// nothing here: the refreshed topology places that slot.
    fn note_promoted(&self, to: &EndpointHandle) {
        let Some(shards) = self.endpoints.0.get(self.cluster) else {
            return;
        };
        let (from, to_addr) = (self.origin.config().address, to.config().address);
        let has = |eps: &[EndpointHandle], a| eps.iter().any(|e| e.config().address == a);
        if let Some(shard) = (from != to_addr)
            .then(|| {
                shards
                    .iter()
                    .position(|eps| has(eps, from) && has(eps, to_addr))
            })
            .flatten()
        {
            self.endpoints.2.set(self.cluster, shard, to.clone());
        }
    }

    /// This worker's handle of the cluster's node at `addr` ([`node`]).
    fn find(&self, addr: std::net::SocketAddr) -> Option<EndpointHandle> {
        node(&self.endpoints, self.cluster, &self.name, addr)
    }
}

/// This worker's handle of Redis Cluster `name`'s node at `addr` (a primary first): in
/// `endpoints` (those a command was routed with; the cluster at index `cluster`), else in the
/// worker's newest ones.
pub(crate) fn node(
    endpoints: &Endpoints,
    cluster: usize,
    name: &str,
    addr: std::net::SocketAddr,
) -> Option<EndpointHandle> {
    let in_cluster = |shards: &[Vec<EndpointHandle>]| {
        shards
            .iter()
            .flat_map(|s| s.first())
            .chain(shards.iter().flat_map(|s| s.iter().skip(1)))
            .find(|h| h.config().address == addr)
            .cloned()
    };
    if let Some(h) = endpoints.0.get(cluster).and_then(|s| in_cluster(s)) {
        return Some(h);
    }
    let latest = super::latest()?;
    let i = latest
        .1
        .iter()
        .position(|n| n.as_ref().is_some_and(|n| *n.name == *name))?;
    in_cluster(latest.0.get(i)?)
}

/// A `MOVED` or `ASK` reply: whether it is `ASK`, and the node it names.
pub(crate) fn redirection(reply: &[u8]) -> Option<(bool, std::net::SocketAddr)> {
    if reply.first() != Some(&b'-') {
        return None;
    }
    match parse(reply)? {
        (Kind::TryAgain, _) => None,
        (kind, addr) => Some((kind == Kind::Ask, addr)),
    }
}

/// Counts a `MOVED` (or, `ask`, an `ASK`) followed outside [`Redirect`] (a blocking command).
pub(crate) fn followed(ask: bool) {
    let kind = if ask { Kind::Ask } else { Kind::Moved };
    REDIRECTS[kind as usize].fetch_add(1, Ordering::Relaxed);
}

/// `ASKING`, as the arguments of a command.
pub(crate) fn asking() -> Vec<Bytes> {
    vec![Bytes::from_static(b"ASKING")]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Moved = 0,
    Ask = 1,
    TryAgain = 2,
}

/// Redirections followed, by kind (`MOVED`, `ASK`, `TRYAGAIN`), over the process.
pub(crate) use crate::stats::process::REDIS_CLUSTER_REDIRECTS as REDIRECTS;

/// A redirection error: its kind and target (`TRYAGAIN` has none: the unspecified address).
fn parse(reply: &[u8]) -> Option<(Kind, std::net::SocketAddr)> {
    let text = std::str::from_utf8(reply.get(1..)?).ok()?.trim_end();
    let mut words = text.split(' ');
    let kind = match words.next()? {
        "MOVED" => Kind::Moved,
        "ASK" => Kind::Ask,
        "TRYAGAIN" => return Some((Kind::TryAgain, respway_filters::model::NO_ENDPOINT)),
        _ => return None,
    };
    let _slot: u16 = words.next()?.parse().ok()?;
    let addr = words.next()?;
    // `:port` alone: the node that answered, on another port (a node that does not know its
    // own address).
    let addr = addr.parse().ok()?;
    Some((kind, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirections_are_recognised() {
        let a: std::net::SocketAddr = "127.0.0.1:7001".parse().unwrap();
        assert_eq!(
            parse(b"-MOVED 3999 127.0.0.1:7001\r\n"),
            Some((Kind::Moved, a))
        );
        assert_eq!(parse(b"-ASK 12 127.0.0.1:7001\r\n"), Some((Kind::Ask, a)));
        assert_eq!(
            parse(b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n").map(|(k, _)| k),
            Some(Kind::TryAgain)
        );
        assert_eq!(parse(b"-ERR MOVED 1 2\r\n"), None);
        assert_eq!(parse(b"-MOVED x 127.0.0.1:7001\r\n"), None);
    }
}

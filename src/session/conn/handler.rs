//! The session's handlers, all of one shape: `dispatch` asks [`stack::handler`] where a
//! command goes and calls [`Handle::handle`] on the answer, which is the handler table
//! (`impl Handle for Handler`). Each handler is given the same [`HandlerCall`] and returns
//! the command's [`Pending`] reply; what tells one command of a kind from another (which
//! fan-out, which pub/sub command, ...) is the handler's own value (`self`).

use super::dispatch::times;
use super::*;
use respway_filters::command::{FanoutKind, KeyspaceKind, PubSubKind};

/// What every handler is given.
pub(super) struct HandlerCall<'a> {
    /// The command, looked up and admitted.
    pub(super) cmd: &'static command::CommandInfo,
    /// Its arguments, its name first.
    pub(super) args: Vec<Bytes>,
    /// The session's view of its listener.
    pub(super) live: &'a mut Live,
    /// What the listener's sessions on this worker share.
    pub(super) ctx: &'a ListenerCtx,
    /// The session's protocol and database as the command was dispatched.
    pub(super) flavor: Flavor,
}

impl HandlerCall<'_> {
    /// The deadline of a command that goes upstream now, and the session's backstop after
    /// it (read only by the handlers that send one).
    pub(super) fn times(&self) -> (Instant, Instant) {
        times(self.live)
    }
}

/// A handler of the session, for one kind of command ([`Handler`]); `self` is the kind.
pub(super) trait Handle {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending;
}

/// The kinds of command whose handler needs no more than the kind.
pub(super) mod kind {
    /// Down the chain (`dispatch.rs`'s `forward`).
    pub(in crate::session::conn) struct Chain;
    /// The transaction lane (`tx_lane.rs`).
    pub(in crate::session::conn) struct Transaction;
    /// A dedicated connection that waits (`blocking.rs`).
    pub(in crate::session::conn) struct Blocking;
    /// `WAIT` / `WAITAOF` on every primary (`wait.rs`).
    pub(in crate::session::conn) struct Wait;
    /// `ACL ...`.
    pub(in crate::session::conn) struct Acl;
    /// Refused, or answered by the listener's cluster emulation.
    pub(in crate::session::conn) struct Unsupported;
}

/// The handler table: each kind [`stack::handler`] names, to its handler.
impl Handle for Handler {
    #[inline(always)]
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        // A write whose primaries the upstream does not see (a transaction, a blocking
        // command, a keyspace-wide or key-less one): a `WAIT` after it asks every primary.
        let unseen = matches!(
            self,
            Handler::Transaction | Handler::Blocking | Handler::Keyspace(_) | Handler::Fanout(_)
        );
        if unseen && !c.cmd.is_readonly() {
            c.live.track.wrote_anywhere();
        }
        match self {
            Handler::Chain => kind::Chain.handle(s, c),
            Handler::Transaction => kind::Transaction.handle(s, c),
            Handler::Blocking => kind::Blocking.handle(s, c),
            Handler::Wait => kind::Wait.handle(s, c),
            Handler::PubSub(k) => k.handle(s, c),
            Handler::Keyspace(k) => k.handle(s, c),
            Handler::Fanout(k) => k.handle(s, c),
            Handler::Local(p) => p.handle(s, c),
            Handler::Acl => kind::Acl.handle(s, c),
            Handler::Unsupported => kind::Unsupported.handle(s, c),
        }
    }
}

impl Handle for kind::Chain {
    #[inline(always)]
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        s.forward(c)
    }
}

impl Handle for kind::Transaction {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        s.dispatch_tx(c)
    }
}

impl Handle for ProxyCommand {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        s.dispatch_local(self, c)
    }
}

impl Handle for PubSubKind {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        s.dispatch_pubsub(self, c)
    }
}

/// Key-less fan-out (`fanout.rs`).
impl Handle for FanoutKind {
    fn handle(self, _: &mut Session, c: HandlerCall<'_>) -> Pending {
        let (deadline, backstop) = c.times();
        let fut = fanout::call(self, c.args, &c.live.parts, c.flavor, c.live.conn, deadline);
        Pending::other(fut, backstop)
    }
}

/// Every primary of every routed cluster (`keyspace.rs`); on a connection to a node of an
/// emulated cluster, the keys of the slots that node owns.
impl Handle for KeyspaceKind {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        let (deadline, backstop) = c.times();
        let parts = &c.live.parts;
        let owned = crate::session::cluster_emulation::owned_slots(
            &parts.listener,
            parts.announced.as_deref(),
            s.state.local,
        );
        let call = crate::session::keyspace::Call {
            kind: self,
            flavor: c.flavor,
            conn: c.live.conn,
            deadline,
            owned,
        };
        let (fut, longer) = crate::session::keyspace::call(call, c.args, parts);
        Pending::other(fut, longer.map_or(backstop, |d| d + (backstop - deadline)))
    }
}

impl Handle for kind::Wait {
    fn handle(self, _: &mut Session, c: HandlerCall<'_>) -> Pending {
        let parts = &c.live.parts;
        let op_timeout = parts.listener.op_timeout;
        let written = c.live.track.take_written();
        match crate::session::wait::call(c.cmd, c.args, parts, c.flavor, op_timeout, written) {
            crate::session::wait::Call::Wait { fut, backstop } => Pending::other(fut, backstop),
            crate::session::wait::Call::Refused(r) => Pending::Ready(r.to_reply()),
        }
    }
}

impl Handle for kind::Blocking {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        if let Err(e) = s.keys_found {
            return Pending::Ready(error_reply(&format!("ERR {e}")));
        }
        let parts = &c.live.parts;
        let op_timeout = parts.listener.op_timeout;
        match crate::session::blocking::call(c.cmd, c.args, &s.keys, parts, c.flavor, op_timeout) {
            // Not blocking after all (`XREAD` without `BLOCK`): down the chain.
            crate::session::blocking::Call::Forward(args) => {
                kind::Chain.handle(s, HandlerCall { args, ..c })
            }
            crate::session::blocking::Call::Wait { fut, backstop } => Pending::other(fut, backstop),
            crate::session::blocking::Call::Refused(r) => Pending::Ready(r.to_reply()),
        }
    }
}

impl Handle for kind::Acl {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        let acl = c.live.parts.acl.as_deref();
        Pending::Ready(local::acl(&c.args, &s.state, acl))
    }
}

impl Handle for kind::Unsupported {
    fn handle(self, s: &mut Session, c: HandlerCall<'_>) -> Pending {
        let listener = &c.live.parts.listener;
        if stack::emulated(c.cmd, listener) {
            return Pending::Ready(crate::session::cluster_emulation::answer(
                c.cmd,
                &c.args,
                listener,
                c.live.parts.announced.as_deref(),
                s.state.local,
                s.state.resp3,
            ));
        }
        c.ctx.stats.unsupported.inc();
        // A command learned from the shards says why it is refused.
        let why = c.live.parts.learned.refusal(c.cmd.name);
        Pending::Ready(error_reply(&format!(
            "ERR command '{}' is not supported by respway{}{}",
            String::from_utf8_lossy(&c.args[0]),
            if why.is_some() { ": " } else { "" },
            why.unwrap_or_default()
        )))
    }
}

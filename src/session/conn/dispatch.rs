//! Dispatch: where each decoded command goes (`stack::handler`, then one call: `handler.rs`),
//! the chain for commands with keys, pub/sub, and the slow log's entries.

use super::*;
use crate::stack::Handler;

/// The deadline of a command that goes upstream, and the session's backstop after it (the
/// clock is read only for such commands, once per client read: [`batch_now`]).
#[inline(always)]
pub(super) fn times(live: &Live) -> (Instant, Instant) {
    let op_timeout = live.parts.listener.op_timeout;
    let deadline = batch_now() + op_timeout;
    (deadline, backstop(deadline, op_timeout))
}

impl Session {
    /// Logs a slow reply (see [`record`]) with its upstream time, when the upstream noted it.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn log_slow_reply(
        &self,
        ctx: &ListenerCtx,
        live: &Live,
        idx: u16,
        us: u64,
        backstop: Instant,
        reply: &[u8],
        first: FirstArg,
    ) {
        let upstream = crate::stats::slowlog::take_upstream(reply, started(live, backstop));
        self.log_slow(ctx, live, idx, us, first, upstream);
    }

    /// Adds a slow command to the slow log, with the cluster and shard its key routes to.
    #[cold]
    pub(super) fn log_slow(
        &self,
        ctx: &ListenerCtx,
        live: &Live,
        idx: u16,
        us: u64,
        arg: FirstArg,
        upstream: Option<(std::net::SocketAddr, u64)>,
    ) {
        let first = arg.to_bytes();
        let top = crate::stats::counted(usize::from(idx));
        let name = top.map_or("other", |c| c.name);
        let keyed = top.is_some_and(|c| c.keys != command::KeySpec::None);
        let routing = &live.parts.routing;
        // Only a key kept whole can be routed (a longer one shows no target).
        let target = arg.whole().filter(|_| keyed).and_then(|k| {
            let p = routing.place_key(k)?;
            let c = routing.clusters.get(p.cluster)?;
            Some(format!(
                "{}/{}",
                c.name,
                c.shards.get(p.shard).map_or("?", |s| s.name.as_str())
            ))
        });
        ctx.stats.slow.push(crate::stats::slowlog::Entry {
            id: 0,
            time: 0,
            duration_us: us,
            args: crate::stats::slowlog::kept_args(name, first.as_ref()),
            client: self.state.peer,
            name: self.state.name.clone(),
            target,
            upstream,
        });
    }

    /// Where a decoded command goes: admitted first ([`Self::admit`]), then to the handler
    /// [`stack::handler`] names for its kind (one lookup, one call: `handler.rs`).
    pub(super) fn dispatch(
        &mut self,
        cmd: Option<&'static command::CommandInfo>,
        args: Vec<Bytes>,
        live: &mut Live,
        ctx: &ListenerCtx,
    ) -> Pending {
        let in_multi = self.tx.as_ref().is_some_and(|t| t.multi);
        let Some(cmd) = cmd else {
            self.mark_dirty();
            return Pending::Ready(local::unknown_command(&args));
        };
        // Key positions, found once for every use below (or named by a shard: `asked.rs`).
        self.keys_found = if self.asked.is_none() {
            cmd.key_indices(&args, &mut self.keys)
        } else {
            match self.take_asked() {
                Ok(()) => Ok(()),
                Err(reply) => return Pending::Ready(reply),
            }
        };
        if let Err(refused) = self.admit(cmd, &args, live) {
            return Pending::Ready(refused);
        }
        if let Some(marks) = live.parts.marks.as_deref() {
            let keys = self.keys_found.is_ok().then_some(self.keys.as_slice());
            self.touch =
                crate::cache::near_cache::dispatched(marks, &live.parts.routing, cmd, &args, keys);
        }
        // Client tracking: other sessions' writes are announced to the tracking ones; a
        // session's own tracking follows its commands. A read of a session that does not
        // track costs nothing.
        if self.state.tracking.is_some() || self.track_next {
            self.client_tracking(cmd, &args, in_multi);
        } else if cmd.flags & command::READONLY == 0 && crate::cache::near_cache::clients::any() {
            self.announce_write(cmd, &args);
        }
        // SORT's BY and GET patterns read keys on the sorted key's shard: refused when the
        // keys they form may live elsewhere (they would read as missing), as Redis Cluster
        // refuses them.
        if matches!(cmd.name, "sort" | "sort_ro") {
            if let Err(msg) = respway_filters::sort_patterns::check(&args, &live.parts.routing) {
                self.mark_dirty();
                return Pending::Ready(error_reply(msg));
            }
        }
        // FCALL with a numkeys that is not a count of its keys: Redis looks the function up
        // first, so only a shard can give its error (`Function not found`, or `Bad number of
        // keys provided`, ...). Nothing runs: the command has no keys to route by.
        if !in_multi && matches!(cmd.name, "fcall" | "fcall_ro") && self.keys_found.is_err() {
            let (deadline, backstop) = times(live);
            let flavor = self.state.flavor();
            return Pending::other(
                fanout::one(args, &live.parts, flavor, live.conn, deadline),
                backstop,
            );
        }
        let call = HandlerCall {
            cmd,
            args,
            live,
            ctx,
            flavor: self.state.flavor(),
        };
        stack::handler(cmd, in_multi).handle(self, call)
    }

    /// The checks every command passes before it goes anywhere (or is queued in `MULTI`):
    /// subscriber mode, arity, authentication, the user's permissions, the listener's
    /// protocol. The refusal is the reply; those Redis counts against a `MULTI` mark it.
    fn admit(
        &mut self,
        cmd: &'static command::CommandInfo,
        args: &[Bytes],
        live: &Live,
    ) -> Result<(), Reply> {
        if self.sub.as_ref().is_some_and(|s| s.active())
            && !self.state.resp3
            && !pubsub::allowed_when_subscribed(cmd)
        {
            return Err(error_reply(&format!(
                "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
                 RESET are allowed in this context",
                cmd.name
            )));
        }
        if !cmd.arity_ok(args.len()) {
            self.mark_dirty();
            return Err(error_reply(&format!(
                "ERR wrong number of arguments for '{}' command",
                cmd.name
            )));
        }
        // AUTH, HELLO and QUIT are served before authentication and before HELLO 3.
        let handshake = matches!(
            cmd.class,
            CommandClass::Proxy(ProxyCommand::Auth | ProxyCommand::Hello | ProxyCommand::Quit)
        );
        if !self.state.authenticated && !handshake {
            self.mark_dirty();
            return Err(error_reply("NOAUTH Authentication required."));
        }
        // Users with permissions to check (none without ACL users): before anything is
        // dispatched or queued in MULTI.
        if let Some(p) = &self.state.perms {
            let scripts = live.parts.listener.client.allow_restricted_scripts;
            let keys = self.keys_found.map(|()| self.keys.as_slice());
            let checked =
                p.check(cmd, args, keys)
                    .and_then(|()| match scripts || p.allows_script(cmd) {
                        true => Ok(()),
                        false => Err(Denied::Script),
                    });
            if let Err(d) = checked {
                self.mark_dirty();
                return Err(crate::stack::acl::denied(d, self.state.user_name(), cmd));
            }
        }
        if live.parts.listener.resp.protocol == ProtocolMode::Resp3
            && !self.state.resp3
            && !handshake
        {
            return Err(error_reply(
                "NOPROTO this listener speaks RESP3 only: send HELLO 3 first",
            ));
        }
        Ok(())
    }

    /// Commands the proxy answers itself (`local.rs`), or forwards as they are (the handler
    /// of [`ProxyCommand`]).
    pub(super) fn dispatch_local(&mut self, p: ProxyCommand, c: HandlerCall<'_>) -> Pending {
        let HandlerCall {
            cmd,
            args,
            live,
            ctx,
            flavor,
        } = c;
        let op_timeout = live.parts.listener.op_timeout;
        if p == ProxyCommand::Reset {
            self.tx = None;
            self.sub = None;
        }
        if p == ProxyCommand::Ping
            && !self.state.resp3
            && self.sub.as_ref().is_some_and(|s| s.active())
        {
            // Subscriber mode (RESP2): PING answers ["pong", message].
            let msg = args.get(1).cloned().unwrap_or_default();
            let f = respway_filters::resp::Frame::Array(vec![
                respway_filters::resp::Frame::Bulk(Bytes::from_static(b"pong")),
                respway_filters::resp::Frame::Bulk(msg),
            ]);
            return Pending::Ready(f.to_bytes());
        }
        if self.tx.is_some() && matches!(p, ProxyCommand::Select | ProxyCommand::Hello) {
            return Pending::Ready(error_reply(&format!(
                "ERR respway: {} is not allowed while a WATCH is active (the transaction's connection keeps its protocol and database)",
                cmd.name.to_ascii_uppercase()
            )));
        }
        let databases = live.parts.databases;
        let local = local::handle(
            p,
            &args,
            &mut self.state,
            ctx,
            &live.parts.listener,
            live.parts.acl.as_deref(),
            databases,
        );
        match local {
            Local::Reply(r) => Pending::Ready(r),
            Local::ReplyAndClose(r) => {
                self.closing = true;
                Pending::Ready(r)
            }
            Local::Late {
                reply,
                delay,
                close,
            } => {
                // Nothing more is read until it is answered (see `decode_all`).
                self.closing |= close;
                self.tarpit = true;
                let at = Instant::now() + delay;
                Pending::other(
                    Box::pin(async move {
                        tokio::time::sleep_until(at).await;
                        Ok(reply)
                    }),
                    backstop(at, op_timeout),
                )
            }
            Local::Forward => {
                let (deadline, backstop) = times(live);
                Pending::other(
                    fanout::one(args, &live.parts, flavor, live.conn, deadline),
                    backstop,
                )
            }
            Local::InfoWithKeyspace(text) => {
                let (deadline, backstop) = times(live);
                let fut = fanout::info_with_keyspace(
                    text,
                    self.state.resp3,
                    &live.parts,
                    flavor,
                    live.conn,
                    deadline,
                );
                Pending::other(fut, backstop)
            }
        }
    }

    /// After a configuration change: the session's user under the new ACL. False (and the
    /// session closes) when that user was removed or disabled.
    pub(super) fn rebind(&mut self, live: &mut Live) -> bool {
        if !std::mem::take(&mut live.fresh) {
            return true;
        }
        if self.state.rebind(live.parts.acl.as_deref()) {
            return true;
        }
        tracing::info!(
            client_id = self.state.id,
            user = self.state.user_name(),
            "ACL user removed or disabled by a configuration change: connection closed"
        );
        self.closing = true;
        false
    }

    /// Pub/sub commands (see `pubsub/`; the handler of [`command::PubSubKind`]).
    pub(super) fn dispatch_pubsub(
        &mut self,
        kind: command::PubSubKind,
        c: HandlerCall<'_>,
    ) -> Pending {
        let HandlerCall {
            args,
            live,
            flavor,
            ctx,
            ..
        } = c;
        let op_timeout = live.parts.listener.op_timeout;
        let deadline = Instant::now() + op_timeout;
        match pubsub::call(
            kind,
            args,
            &mut self.sub,
            &live.parts,
            &ctx.slot,
            flavor,
            live.conn,
            deadline,
        ) {
            pubsub::Outcome::Ready(r) => Pending::Ready(r),
            pubsub::Outcome::Wait { fut, confirms } => {
                if confirms {
                    if let Some(s) = self.sub.as_mut() {
                        s.confirming += 1;
                    }
                }
                Pending::other(fut, backstop(deadline, op_timeout))
            }
        }
    }

    /// A reply of command `idx` left `pending`: if it confirmed subscriptions, messages may
    /// follow it.
    pub(super) fn confirmed(&mut self, idx: u16) {
        if let Some(s) = self.sub.as_mut() {
            if s.confirming > 0 && pubsub::confirms(idx) {
                s.confirming -= 1;
            }
        }
    }

    /// Sends a command with keys down the chain (route, mirror, hot key, split, hash, zone,
    /// upstream): the handler of [`Handler::Chain`].
    pub(super) fn forward(&mut self, c: HandlerCall<'_>) -> Pending {
        let HandlerCall {
            cmd,
            args,
            live,
            ctx,
            flavor,
        } = c;
        let op_timeout = live.parts.listener.op_timeout;
        let times = || {
            let deadline = batch_now() + op_timeout;
            (deadline, backstop(deadline, op_timeout))
        };
        if let Err(e) = self.keys_found {
            return Pending::Ready(error_reply(&format!("ERR {e}")));
        }
        if self.keys.is_empty()
            && local::is_script(cmd.name)
            && !live.parts.listener.client.allow_keyless_scripts
        {
            return Pending::Ready(error_reply(&format!(
                "ERR respway: {} with no keys is refused: scripts are routed by their \
                 keys, and one that declares none would run on an arbitrary shard (the \
                 listener's allow_keyless_scripts allows it)",
                cmd.name.to_ascii_uppercase()
            )));
        }
        let key = self.keys.first().copied();
        if let Some(k) = key {
            if ctx.stats.hot.take() {
                self.sample_hot_key(&args[k], live, ctx);
            }
        }
        let (deadline, backstop) = times();
        let mut req = Request::new(cmd, args, &self.keys);
        req.raw = self.frame.take();
        req.deadline = Some(deadline.into_std());
        req.flavor = flavor;
        req.flavor.track = std::mem::take(&mut self.track_next);
        // Every layer is always ready (queues are bounded per session, above).
        let noop = std::task::Waker::noop();
        let _ = live.chain.poll_ready(&mut Context::from_waker(noop));
        Pending::Wait {
            fut: live.chain.call(req),
            // The upstream answers at `deadline` with an error naming the shard; this
            // is only a backstop for a request lost on the way.
            deadline: backstop,
            idx: 0,
            first: FirstArg::NONE,
            touch: crate::cache::near_cache::Touch::None,
        }
    }

    /// Client-side caching: a write of a session that does not track, told to the tracking
    /// ones.
    #[cold]
    fn announce_write(&self, cmd: &'static command::CommandInfo, args: &[Bytes]) {
        let keys = self.keys_found.is_ok().then_some(self.keys.as_slice());
        crate::cache::near_cache::clients::written(cmd, args, keys, self.state.id);
    }

    /// Client-side caching (see `near_cache::clients`): the other tracking sessions are told
    /// of a write; this session's own tracking decides whether the command's keys go to be
    /// followed upstream (`track_next`) and what is written right after its reply (`after`).
    #[cold]
    fn client_tracking(
        &mut self,
        cmd: &'static command::CommandInfo,
        args: &[Bytes],
        in_multi: bool,
    ) {
        let keys = self.keys_found.is_ok().then_some(self.keys.as_slice());
        if cmd.flags & command::READONLY == 0 {
            crate::cache::near_cache::clients::written(cmd, args, keys, self.state.id);
        }
        self.track_next = false;
        if let Some(t) = self.state.tracking.as_deref_mut() {
            let upstream = matches!(stack::handler(cmd, in_multi), Handler::Chain);
            let (track, after) = t.dispatched(cmd, args, keys.unwrap_or(&[]), upstream, in_multi);
            self.track_next = track;
            self.after = after;
        }
    }

    /// Client-side caching: moves the announcements waiting for this session behind the
    /// replies owed now. True when there were any.
    #[cold]
    pub(super) fn announce(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(push) = self
            .state
            .tracking
            .as_deref_mut()
            .and_then(|t| t.poll_announcements(cx))
        else {
            return false;
        };
        // A client back on RESP2 gets none (as from Redis without REDIRECT).
        if self.state.resp3 {
            if self.pending.is_empty() {
                self.wbuf.push(&push);
            } else {
                self.ready_bytes += push.len();
                self.pending.push_back(Pending::Ready(push));
            }
        }
        true
    }

    /// Counts a sampled key for hot-key detection, under the cluster it routes to (as
    /// forwarded, without a removed prefix).
    #[cold]
    pub(super) fn sample_hot_key(&self, key: &[u8], live: &Live, ctx: &ListenerCtx) {
        let routing = &live.parts.routing;
        if let Some(m) = routing.route(key) {
            if let Some(c) = routing.clusters.get(m.cluster) {
                ctx.stats.hot.record(
                    &c.name,
                    &key[m.strip.min(key.len())..],
                    batch_now().into_std(),
                );
            }
        }
    }
}

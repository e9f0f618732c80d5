//! The transaction lane: `MULTI` / `EXEC` / `DISCARD` / `WATCH` / `UNWATCH` and every command
//! queued inside `MULTI`, on the dedicated connection the transaction is pinned to (see
//! `crate::session::tx`).

use std::time::Duration;

use super::*;

impl Session {
    /// A command refused while a `MULTI` is queueing makes `EXEC` abort, as in Redis.
    pub(super) fn mark_dirty(&mut self) {
        if let Some(t) = self.tx.as_mut().filter(|t| t.multi) {
            t.dirty = true;
        }
    }

    /// Refuses a command inside `MULTI` (and marks the transaction).
    pub(super) fn refuse_in_tx(&mut self, reply: Reply) -> Pending {
        self.mark_dirty();
        Pending::Ready(reply)
    }

    /// Pins the transaction to the primary of `(cluster, shard)` and sends what was queued.
    pub(super) fn pin(
        &mut self,
        cluster: usize,
        shard: usize,
        live: &Live,
        deadline: Instant,
    ) -> Result<Vec<crate::upstream::UpstreamFuture>, Reply> {
        let parts = &live.parts;
        let ep = parts
            .primary(cluster, shard)
            .ok_or_else(|| error_reply("ERR respway: no such shard"))?;
        let conn = ep
            .take_dedicated(self.state.flavor())
            .map_err(|e| e.at(ep.label().clone()).to_reply())?;
        self.pins += 1;
        let tx = self.tx.as_mut().expect("pin inside a transaction");
        let sent = tx
            .queued
            .drain(..)
            .map(|args| conn.send(args, deadline))
            .collect();
        tx.pinned = Some(Pinned {
            cluster,
            shard,
            conn,
            redis_cluster: parts.endpoints.1.get(cluster).cloned().flatten(),
        });
        Ok(sent)
    }

    /// Sends `args` on the transaction's connection, after the replies of `before` (queued
    /// commands sent at pin time, whose replies the client already had): an error among
    /// those is the reply instead.
    pub(super) fn send_pinned(
        &mut self,
        args: Vec<Bytes>,
        before: Vec<crate::upstream::UpstreamFuture>,
        deadline: Instant,
        op_timeout: std::time::Duration,
    ) -> Pending {
        let Some(p) = self.tx.as_ref().and_then(|t| t.pinned.as_ref()) else {
            return Pending::Ready(error_reply("ERR respway: transaction has no connection"));
        };
        let f = p.conn.send(args, deadline);
        let rc = p.redis_cluster.clone();
        Pending::other(
            Box::pin(reply_after(before, f, rc)),
            backstop(deadline, op_timeout),
        )
    }

    /// Transaction commands, and every command while a `MULTI` is queueing (the handler of
    /// [`Handler::Transaction`]).
    pub(super) fn dispatch_tx(&mut self, c: HandlerCall<'_>) -> Pending {
        let deadline = c.times().0;
        let HandlerCall {
            cmd,
            args,
            live,
            ctx,
            ..
        } = c;
        let op_timeout = live.parts.listener.op_timeout;
        let in_multi = self.tx.as_ref().is_some_and(|t| t.multi);
        match cmd.name {
            "multi" if in_multi => Pending::Ready(error_reply("ERR MULTI calls can not be nested")),
            "multi" => self.tx_multi(args, deadline, op_timeout),
            "watch" if in_multi => {
                Pending::Ready(error_reply("ERR WATCH inside MULTI is not allowed"))
            }
            "exec" | "discard" if !in_multi => Pending::Ready(error_reply(&format!(
                "ERR {} without MULTI",
                cmd.name.to_ascii_uppercase()
            ))),
            "unwatch" if !in_multi => self.tx_unwatch(args, deadline, op_timeout),
            "exec" | "discard" => self.tx_end(cmd, args, live, deadline, op_timeout),
            _ => self.tx_queue(cmd, args, live, ctx, deadline),
        }
    }

    /// The shard the transaction is pinned to, once it is.
    fn tx_pinned(&self) -> Option<(usize, usize)> {
        self.tx
            .as_ref()
            .and_then(|t| t.pinned.as_ref())
            .map(|p| (p.cluster, p.shard))
    }

    /// `MULTI`: sent at once on a pinned connection (after `WATCH`), else held until the
    /// first key picks the shard.
    fn tx_multi(&mut self, args: Vec<Bytes>, deadline: Instant, op_timeout: Duration) -> Pending {
        let pinned = self.tx_pinned();
        let tx = self.tx.get_or_insert_with(|| Tx::new(op_timeout));
        tx.multi = true;
        if pinned.is_some() {
            return self.send_pinned(args, Vec::new(), deadline, op_timeout);
        }
        tx.queued.push(args);
        Pending::Ready(Bytes::from_static(b"+OK\r\n"))
    }

    /// `UNWATCH` outside `MULTI`: ends a `WATCH`.
    fn tx_unwatch(&mut self, args: Vec<Bytes>, deadline: Instant, op_timeout: Duration) -> Pending {
        let Some(tx) = self.tx.take() else {
            return Pending::Ready(Bytes::from_static(b"+OK\r\n"));
        };
        if tx.pinned.is_none() {
            return Pending::Ready(Bytes::from_static(b"+OK\r\n"));
        }
        self.tx = Some(tx);
        let p = self.send_pinned(args, Vec::new(), deadline, op_timeout);
        if let Some(tx) = self.tx.take() {
            tx.finish();
        }
        p
    }

    /// `EXEC` / `DISCARD` inside `MULTI`: a transaction marked by a refusal is discarded
    /// (`EXECABORT`); one that never got a key runs on the catch-all cluster's first shard.
    fn tx_end(
        &mut self,
        cmd: &'static command::CommandInfo,
        args: Vec<Bytes>,
        live: &Live,
        deadline: Instant,
        op_timeout: Duration,
    ) -> Pending {
        let mut tx = self.tx.take().expect("in MULTI");
        let discard = cmd.name == "discard";
        if tx.dirty || discard {
            let Some(p) = tx.pinned.as_ref() else {
                // Nothing reached Redis.
                return Pending::Ready(if discard {
                    Bytes::from_static(b"+OK\r\n")
                } else {
                    error_reply("EXECABORT Transaction discarded because of previous errors.")
                });
            };
            let f = p.conn.send(vec![Bytes::from_static(b"DISCARD")], deadline);
            tx.finish();
            return Pending::other(
                Box::pin(async move {
                    let r = f.await;
                    if discard || failed(&r) {
                        r
                    } else {
                        Ok(error_reply(
                            "EXECABORT Transaction discarded because of previous errors.",
                        ))
                    }
                }),
                backstop(deadline, op_timeout),
            );
        }
        let mut before = Vec::new();
        if tx.pinned.is_none() {
            if tx.queued.len() <= 1 {
                // MULTI then EXEC with nothing queued and nothing watched.
                return Pending::Ready(Bytes::from_static(b"*0\r\n"));
            }
            // Only key-less commands: they run on the catch-all cluster's first shard.
            let cluster = live
                .parts
                .routing
                .routed_clusters()
                .first()
                .copied()
                .unwrap_or(0);
            self.tx = Some(tx);
            match self.pin(cluster, 0, live, deadline) {
                Ok(b) => before = b,
                Err(e) => {
                    self.tx = None;
                    return Pending::Ready(e);
                }
            }
            tx = self.tx.take().expect("pinned");
        }
        if !tx.moves.is_empty() {
            let db = self.state.flavor().db;
            return exec_after_moves(tx, args, before, live, db, deadline, op_timeout);
        }
        self.tx = Some(tx);
        let p = self.send_pinned(args, before, deadline, op_timeout);
        if let Some(tx) = self.tx.take() {
            tx.finish();
        }
        p
    }

    /// `WATCH` (outside `MULTI`), or a command queued inside `MULTI`: placed on the
    /// transaction's shard (pinning it when it is the first key), held while no key decided
    /// it, or refused (marking the transaction).
    fn tx_queue(
        &mut self,
        cmd: &'static command::CommandInfo,
        mut args: Vec<Bytes>,
        live: &mut Live,
        ctx: &ListenerCtx,
        deadline: Instant,
    ) -> Pending {
        let op_timeout = live.parts.listener.op_timeout;
        let in_multi = self.tx.as_ref().is_some_and(|t| t.multi);
        let pinned = self.tx_pinned();
        // WATCH (outside MULTI), or a command queued inside MULTI.
        match cmd.class {
            CommandClass::Proxy(ProxyCommand::Ping | ProxyCommand::Echo | ProxyCommand::Time)
            | CommandClass::Transaction => {}
            CommandClass::Proxy(ProxyCommand::Quit) => {
                self.tx = None;
                self.closing = true;
                return Pending::Ready(Bytes::from_static(b"+OK\r\n"));
            }
            CommandClass::Proxy(ProxyCommand::Reset) => {
                self.tx = None;
                return self.dispatch(Some(cmd), args, live, ctx);
            }
            CommandClass::Single | CommandClass::SameShard | CommandClass::Split(_) => {}
            // Inside MULTI Redis runs them as if their timeout had passed: they never block,
            // so they are queued like any command of the transaction's shard.
            CommandClass::Blocking if in_multi && !crate::stack::is_wait(cmd) => {}
            _ => {
                return self.refuse_in_tx(error_reply(&format!(
                    "ERR respway: '{}' is not allowed inside a transaction",
                    cmd.name.to_ascii_uppercase()
                )))
            }
        }
        let keys = self.keys_found.map(|()| self.keys.as_slice());
        let place = tx::place(&live.parts.routing, cmd, &mut args, keys);
        let (here, from) = match place {
            Ok(h) => (h.map(|p| (p.cluster, p.shard)), h.and_then(|p| p.from)),
            Err(e) => return self.refuse_in_tx(e.reply()),
        };
        if cmd.name == "watch" && here.is_none() {
            return Pending::Ready(error_reply(
                "ERR wrong number of arguments for 'watch' command",
            ));
        }
        if self.tx.is_none() {
            self.tx = Some(Tx::new(op_timeout));
        }
        let mut before = Vec::new();
        match (here, pinned) {
            (Some(h), Some(p)) if h != p => {
                let why = match h.0 == p.0 {
                    true => Refusal::CrossSlot,
                    false => Refusal::CrossCluster,
                };
                return self.refuse_in_tx(why.reply());
            }
            (Some((c, sh)), None) => match self.pin(c, sh, live, deadline) {
                Ok(b) => before = b,
                Err(e) => {
                    if !in_multi {
                        self.tx = None;
                    }
                    return self.refuse_in_tx(e);
                }
            },
            (None, None) => {
                // A key-less command before the shard is known: held until it is, up to a
                // bound (this memory is the proxy's, not Redis's).
                let full = self
                    .tx
                    .as_ref()
                    .is_some_and(|t| t.queued.len() > tx::MAX_HELD);
                if full {
                    return self.refuse_in_tx(error_reply(&format!(
                        "ERR respway: more than {} commands without keys before the \
                         transaction's first key",
                        tx::MAX_HELD
                    )));
                }
                if let Some(t) = self.tx.as_mut() {
                    t.queued.push(args);
                }
                return Pending::Ready(Bytes::from_static(b"+QUEUED\r\n"));
            }
            _ => {}
        }
        // Move mode: this command's keys whose owner changes move now; EXEC waits for them.
        if let (Some(from), Some((to, _)), Ok(())) = (from, here, self.keys_found) {
            let flavor = self.state.flavor();
            let moves = crate::session::blocking::moves(
                &live.parts,
                &args,
                &self.keys,
                from,
                to,
                flavor,
                op_timeout,
            );
            match moves {
                Ok(m) => {
                    if let Some(t) = self.tx.as_mut() {
                        t.moves.extend(m);
                    }
                }
                Err(f) => return self.refuse_in_tx(f.to_reply()),
            }
        }
        self.send_pinned(args, before, deadline, op_timeout)
    }
}

/// `EXEC` of a transaction whose keys move (move mode): sent once every `MIGRATE` answered
/// `OK` or `NOKEY`; when one failed, `DISCARD` instead and `-EXECABORT` with its reason (the
/// queued commands ran nowhere). The transaction's connection goes back to the pool after.
fn exec_after_moves(
    mut tx: Tx,
    args: Vec<Bytes>,
    before: Vec<crate::upstream::UpstreamFuture>,
    live: &Live,
    db: u8,
    deadline: Instant,
    op_timeout: Duration,
) -> Pending {
    let moves = std::mem::take(&mut tx.moves);
    let (stats, moved) = (live.parts.mirror_stats.clone(), live.parts.moved.clone());
    let to = tx.pinned.as_ref().map_or(0, |p| p.cluster);
    Pending::other(
        Box::pin(async move {
            let mut refused = None;
            for (m, answer) in moves {
                let answer = answer.await;
                let outcome = respway_filters::moving::outcome(&answer, &m, db, &moved);
                stats.record_move(to, outcome);
                if refused.is_none() && outcome == respway_filters::mirror::MoveOutcome::Failed {
                    refused = Some(respway_filters::moving::move_failure(&answer));
                }
            }
            let Some(p) = tx.pinned.as_ref() else {
                return Ok(error_reply("ERR respway: transaction has no connection"));
            };
            let cmd = match refused {
                Some(_) => vec![Bytes::from_static(b"DISCARD")],
                None => args,
            };
            let rc = p.redis_cluster.clone();
            let r = reply_after(before, p.conn.send(cmd, deadline), rc).await;
            tx.finish();
            if let Some(why) = refused {
                let text = why.to_reply();
                let text = String::from_utf8_lossy(text.get(1..).unwrap_or_default());
                return Ok(error_reply(&format!(
                    "EXECABORT Transaction discarded: {}",
                    text.trim_end()
                )));
            }
            r
        }),
        backstop(deadline, op_timeout),
    )
}

/// The reply of `f`, sent after `before` (queued commands sent at pin time, whose replies the
/// client already had): the first error among those is the reply instead.
async fn reply_after(
    before: Vec<crate::upstream::UpstreamFuture>,
    f: crate::upstream::UpstreamFuture,
    rc: Option<crate::upstream::RedisCluster>,
) -> Result<Reply, respway_filters::error::Failure> {
    let mut first_err = None;
    for b in before {
        let r = b.await;
        if failed(&r) && first_err.is_none() {
            first_err = Some(r);
        }
    }
    let r = f.await;
    let r = first_err.unwrap_or(r);
    // A Redis Cluster's redirection is never passed on: the client cannot follow it.
    match (&rc, &r) {
        (Some(rc), Ok(reply)) => match crate::session::tx::moved_in_tx(rc, reply) {
            Some(e) => Ok(e),
            None => r,
        },
        _ => r,
    }
}

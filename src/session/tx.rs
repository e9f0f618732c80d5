//! Transactions: `MULTI` / `EXEC` / `DISCARD` / `WATCH` / `UNWATCH` when every key of the
//! transaction hashes to one shard, as in Redis Cluster.
//!
//! A session in a transaction is pinned to a [`Dedicated`] connection to that shard's
//! primary, taken from a per-worker, per-endpoint pool of idle ones (so a transaction costs
//! no connect). `WATCH` pins at once; after `MULTI` the first command with keys picks the
//! shard, and what was queued before it (`MULTI`, key-less commands such as `PING`) is sent
//! first. A command whose keys hash to another shard answers `-CROSSSLOT` and marks the
//! transaction: `EXEC` then sends `DISCARD` and answers `-EXECABORT`, so nothing is applied.
//! Keys under a mirrored route or a hot-key prefix are refused inside a transaction (their
//! writes would have to reach several clusters or shards, which one `EXEC` cannot make
//! atomic), and so are commands that would change the connection (`SELECT`, `HELLO`, ...).
//! A route in move mode is the exception: the transaction runs on the keys' new owner, each
//! command's keys whose owner changes are moved (`MIGRATE` on their old shards' shared
//! connections, sent as the command is queued), and `EXEC` is sent only once every move
//! answered; a move that failed makes `EXEC` send `DISCARD` and answer `-EXECABORT` with the
//! reason. A key that moves in after a `WATCH` of it counts as changed (Redis's `RESTORE`
//! touches it), so such an `EXEC` aborts and the client retries, as on any watched change.
//!
//! On a Redis Cluster, a command answered with `MOVED`/`ASK` (its slot moved since the last
//! refresh) gets respway's error saying the transaction is aborted ([`moved_in_tx`]); the
//! node has flagged the transaction, so `EXEC` answers `-EXECABORT`.
//!
//! When the transaction ends the connection goes back to the pool once a `PING` after
//! `EXEC`/`DISCARD`/`UNWATCH` is answered; a client that leaves mid-transaction has
//! `DISCARD` and `UNWATCH` sent for it first. A dedicated connection that breaks or answers
//! late is closed, never reconnected under the transaction.

use std::time::Duration;

use bytes::Bytes;
use respway_filters::command::{CommandClass, CommandInfo};
use respway_filters::place::{Purpose, Refusal};
use respway_filters::routing::Routing;

use crate::upstream::{Dedicated, UpstreamFuture};

/// Commands without keys a transaction may hold before its first key picks the shard
/// (beyond it they are refused and `EXEC` aborts): the proxy holds them, so they are bounded.
pub(crate) const MAX_HELD: usize = 1024;

/// A session's transaction state.
#[derive(Debug)]
pub(crate) struct Tx {
    /// `MULTI` was received: commands are queued until `EXEC` / `DISCARD`.
    pub(crate) multi: bool,
    /// A command was refused while queueing: `EXEC` aborts.
    pub(crate) dirty: bool,
    /// The shard and connection, once a key (or `EXEC`) decided them.
    pub(crate) pinned: Option<Pinned>,
    /// Commands accepted before the shard was known (`MULTI`, key-less commands).
    pub(crate) queued: Vec<Vec<Bytes>>,
    /// How long the cleanup after the transaction may take.
    pub(crate) timeout: Duration,
    /// Move mode: the `MIGRATE`s of the transaction's keys (arguments, answer), which `EXEC`
    /// waits for.
    pub(crate) moves: Vec<(Vec<Bytes>, UpstreamFuture)>,
}

/// The connection a transaction runs on.
#[derive(Debug)]
pub(crate) struct Pinned {
    /// Cluster index.
    pub(crate) cluster: usize,
    /// Shard index.
    pub(crate) shard: usize,
    /// The connection.
    pub(crate) conn: Dedicated,
    /// The Redis Cluster the shard is a node of: its redirections are answered with an
    /// error of respway's ([`moved_in_tx`]), never passed on.
    pub(crate) redis_cluster: Option<crate::upstream::RedisCluster>,
}

/// The reply to a command of a transaction that a Redis Cluster node answered with `MOVED`
/// or `ASK` (the key's slot moved, or is moving, since the sidecar's last refresh); `None`
/// for any other reply. The topology is told (refreshed at once); the node has flagged the
/// transaction (a `MULTI` in progress ends in `-EXECABORT`), so nothing of it runs, and the
/// client, who speaks plain Redis, is told why instead of getting a redirection it cannot
/// follow. Its retry goes to the slot's new owner.
pub(crate) fn moved_in_tx(rc: &crate::upstream::RedisCluster, reply: &[u8]) -> Option<Bytes> {
    let (ask, addr) = crate::upstream::redirection(reply)?;
    rc.topology.redirected(!ask);
    Some(Bytes::from(format!(
        "-ERR respway: Redis Cluster {} this key's slot to {addr} during the transaction \
         (a reshard or a failover): the transaction is aborted, nothing of it runs (EXEC \
         answers EXECABORT); retry it\r\n",
        if ask { "is moving" } else { "moved" }
    )))
}

impl Tx {
    /// A transaction state with nothing pinned yet.
    pub(crate) fn new(timeout: Duration) -> Tx {
        Tx {
            multi: false,
            dirty: false,
            pinned: None,
            queued: Vec::new(),
            timeout,
            moves: Vec::new(),
        }
    }

    /// The transaction ended normally (its last command is sent): the connection returns to
    /// the pool once it is idle.
    pub(crate) fn finish(mut self) {
        if let Some(p) = self.pinned.take() {
            p.conn.release(&[], self.timeout);
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        // Ended without EXEC/DISCARD/UNWATCH (the client left, RESET, QUIT): whatever is
        // open on the connection is discarded before it is reused.
        if let Some(p) = self.pinned.take() {
            p.conn.release(&[b"DISCARD", b"UNWATCH"], self.timeout);
        }
    }
}

/// Where the keys of a command inside a transaction live: `(cluster, shard)`, or `None` for
/// a command without keys. Applies the routes' prefix removal to `args`.
///
/// # Errors
/// Why the command cannot be part of the transaction ([`Routing::place_moving`]): keys on
/// several clusters or shards, keys of a mirrored route or under a hot-key prefix.
pub(crate) fn place(
    routing: &Routing,
    cmd: &CommandInfo,
    args: &mut [Bytes],
    keys: Result<&[usize], &'static str>,
) -> Result<Option<respway_filters::place::Pinned>, Refusal> {
    if !matches!(
        cmd.class,
        CommandClass::Single
            | CommandClass::SameShard
            | CommandClass::Split(_)
            | CommandClass::Transaction
            | CommandClass::Blocking
    ) {
        return Ok(None);
    }
    let keys = keys.map_err(|e| Refusal::Keys(e.to_string()))?;
    routing.place_moving(args, keys, Purpose::Transaction)
}

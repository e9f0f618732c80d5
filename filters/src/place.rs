//! Placement: where a request's keys live, decided in one place for every kind of command.
//!
//! - [`Routing::place_key`]: one key's route, cluster and shard (prefix removal applied
//!   before hashing), for the slow log's target and hot-key sampling;
//!   [`Routing::place_channel`] for pub/sub channels (whole names).
//! - [`Routing::route_keys`]: the route layer's step: every key of a request on one
//!   cluster, route prefixes removed.
//! - [`Routing::place_pinned`]: the one shard a command that needs a connection of its own
//!   (a transaction, a blocking command) runs on: one cluster, one shard, no mirrored route,
//!   no hot key; [`Routing::place_moving`] also takes a route in move mode (the keys' new
//!   cluster, and the cluster they move from).
//!
//! A request that cannot be placed gets a [`Refusal`]: one typed reason, one text each
//! ([`Refusal::reply`]), whichever kind of command asked.

use std::fmt;

use bytes::Bytes;

use crate::request::{error_reply, Reply};
use crate::routing::{RouteId, Routing};

/// The refusal of a write on a read-only route (without the leading `-` and CRLF).
pub const READ_ONLY: &str =
    "ERR respway: route is read-only (migration cut-over), writes are refused";

/// The refusal of a command naming a key whose owner changes, on a route in `prepare_move`
/// (without the leading `-` and CRLF).
pub const ABOUT_TO_MOVE: &str = "TRYAGAIN respway: a key of this command is about to move to \
     another shard (the migration is starting: not every sidecar moves keys yet); the command \
     was not run, retry";

/// The reply to a command (or transaction, or blocking command) whose keys hash to more than
/// one shard: Redis Cluster's text, which clients already know.
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// What needs its keys on one shard, for the refusals that name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `MULTI` ... `EXEC` and `WATCH`: one `EXEC` on one connection.
    Transaction,
    /// `BLPOP` and the other blocking commands: one connection that waits.
    Blocking,
}

/// Why a request cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No route matches the key and there is no catch-all.
    NoRoute(Bytes),
    /// A command without keys and no catch-all route.
    NoCatchAll,
    /// The keys route to different clusters.
    CrossCluster,
    /// The keys hash to different shards of one cluster.
    CrossSlot,
    /// A key of a route with mirrors, where the copy could not be part of the command.
    Mirrored(Purpose),
    /// A key under a hot-key prefix (written to every shard).
    HotKey(Purpose),
    /// A command that needs a key to be placed has none.
    NeedsKey(Purpose),
    /// The keys could not be found in the arguments (a bad count, ...): Redis's text.
    Keys(String),
    /// A write to a route in its read-only (cut-over) phase.
    ReadOnly,
    /// A hot key written together with other keys: the write would reach one copy only.
    HotKeyOneCopy(Bytes),
    /// A key whose owner changes, on a route in `prepare_move`.
    AboutToMove,
}

impl Refusal {
    /// The error reply for the client.
    pub fn reply(&self) -> Reply {
        error_reply(&self.to_string())
    }
}

/// The refusal's text, with its code, without `-` and CRLF.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoRoute(key) => write!(
                f,
                "ERR respway: no route for key '{}'",
                String::from_utf8_lossy(key)
            ),
            Refusal::NoCatchAll => {
                f.write_str("ERR respway: no catch-all route for a key-less command")
            }
            Refusal::CrossCluster => {
                f.write_str("ERR respway: keys in request route to different clusters")
            }
            Refusal::CrossSlot => f.write_str(CROSSSLOT),
            Refusal::Mirrored(Purpose::Transaction) => f.write_str(
                "ERR respway: keys of a mirrored route cannot be used in a transaction (the \
                 copy to the other cluster could not be part of it)",
            ),
            Refusal::Mirrored(Purpose::Blocking) => f.write_str(
                "ERR respway: blocking commands cannot use keys of a mirrored route (what \
                 they pop or read could not be mirrored consistently)",
            ),
            Refusal::HotKey(Purpose::Transaction) => f.write_str(
                "ERR respway: hot keys (written to every shard) cannot be used in a transaction",
            ),
            Refusal::HotKey(Purpose::Blocking) => f.write_str(
                "ERR respway: blocking commands cannot use hot keys (written to every shard, \
                 a pop could not be made on all of them consistently)",
            ),
            Refusal::NeedsKey(Purpose::Blocking) => {
                f.write_str("ERR respway: a blocking command needs a key")
            }
            Refusal::NeedsKey(Purpose::Transaction) => {
                f.write_str("ERR wrong number of arguments for 'watch' command")
            }
            Refusal::Keys(e) => write!(f, "ERR {e}"),
            Refusal::ReadOnly => f.write_str(READ_ONLY),
            Refusal::AboutToMove => f.write_str(ABOUT_TO_MOVE),
            Refusal::HotKeyOneCopy(key) => write!(
                f,
                "ERR respway: hot key {} is stored on every shard, and this write would reach \
                 one copy only: write it in a single-key command of its own (SET, DEL, HSET, \
                 ...)",
                String::from_utf8_lossy(key)
            ),
        }
    }
}

/// Where the keys of a command that runs on a connection of its own live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// Cluster index.
    pub cluster: usize,
    /// Shard index in the cluster.
    pub shard: usize,
    /// Move mode: the cluster the keys move from (their `MIGRATE`s come first).
    pub from: Option<usize>,
}

/// Where one key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPlace {
    /// Cluster index.
    pub cluster: usize,
    /// Shard index in the cluster.
    pub shard: usize,
    /// The route taken.
    pub route: RouteId,
    /// Bytes of route prefix removed before the key is stored (0 = none).
    pub strip: usize,
}

impl Routing {
    /// Where `key` lives: its route and cluster, and the shard its stored form (route
    /// prefix removed) hashes to. `None` when no route matches and there is no catch-all.
    pub fn place_key(&self, key: &[u8]) -> Option<KeyPlace> {
        let m = self.route(key)?;
        let c = self.clusters.get(m.cluster)?;
        Some(KeyPlace {
            cluster: m.cluster,
            shard: c.picker.pick(&key[m.strip.min(key.len())..]),
            route: m.route,
            strip: m.strip,
        })
    }

    /// Where channel `name` lives: its route's cluster and the shard its whole name hashes
    /// to. A channel is not a stored key, so a route's `remove_prefix` does not apply: the
    /// name publishers and subscribers use is the one sent.
    pub fn place_channel(&self, name: &[u8]) -> Option<(usize, usize)> {
        let m = self.route(name)?;
        let c = self.clusters.get(m.cluster)?;
        Some((m.cluster, c.picker.pick(name)))
    }

    /// Routes every key at `keys` (positions in `args`) to one cluster and removes route
    /// prefixes from them: `(cluster, route, whether a key was rewritten)`. Without keys, the
    /// catch-all route.
    ///
    /// # Errors
    /// [`Refusal::NoRoute`], [`Refusal::CrossCluster`], or [`Refusal::NoCatchAll`] for a
    /// command without keys.
    #[inline]
    pub fn route_keys(
        &self,
        args: &mut [Bytes],
        keys: impl Iterator<Item = usize>,
    ) -> Result<(usize, RouteId, bool), Refusal> {
        let mut at: Option<(usize, RouteId)> = None;
        let mut rewritten = false;
        for i in keys {
            let m = self
                .route(&args[i])
                .ok_or_else(|| Refusal::NoRoute(args[i].clone()))?;
            match at {
                None => at = Some((m.cluster, m.route)),
                Some((c, _)) if c != m.cluster => return Err(Refusal::CrossCluster),
                Some(_) => {}
            }
            if m.strip > 0 {
                args[i] = args[i].slice(m.strip.min(args[i].len())..);
                rewritten = true;
            }
        }
        match at {
            Some((cluster, route)) => Ok((cluster, route, rewritten)),
            None => {
                let m = self.catch_all().ok_or(Refusal::NoCatchAll)?;
                Ok((m.cluster, m.route, false))
            }
        }
    }

    /// The one `(cluster, shard)` every key at `keys` lives on, for a command that runs on
    /// a connection of its own (`why`); route prefixes are removed from `args`. `None` for
    /// a command without keys.
    ///
    /// # Errors
    /// [`Refusal::NoRoute`], [`Refusal::Mirrored`] (a key of a route with mirrors),
    /// [`Refusal::HotKey`] (a key under a hot-key prefix), [`Refusal::CrossCluster`],
    /// [`Refusal::CrossSlot`].
    pub fn place_pinned(
        &self,
        args: &mut [Bytes],
        keys: &[usize],
        why: Purpose,
    ) -> Result<Option<(usize, usize)>, Refusal> {
        Ok(self
            .pinned(args, keys, why, false)?
            .map(|p| (p.cluster, p.shard)))
    }

    /// [`place_pinned`](Self::place_pinned) for a blocking command or a transaction, which
    /// may also use the keys of a route in move mode: placed on the cluster they move to,
    /// with the cluster they move from (their `MIGRATE`s are the caller's).
    ///
    /// # Errors
    /// As [`place_pinned`](Self::place_pinned).
    pub fn place_moving(
        &self,
        args: &mut [Bytes],
        keys: &[usize],
        why: Purpose,
    ) -> Result<Option<Pinned>, Refusal> {
        self.pinned(args, keys, why, true)
    }

    fn pinned(
        &self,
        args: &mut [Bytes],
        keys: &[usize],
        why: Purpose,
        moves: bool,
    ) -> Result<Option<Pinned>, Refusal> {
        let mut at: Option<Pinned> = None;
        for &i in keys {
            let Some(key) = args.get(i) else {
                return Err(Refusal::Keys("syntax error".into()));
            };
            let m = self
                .route(key)
                .ok_or_else(|| Refusal::NoRoute(key.clone()))?;
            let (cluster, from) = match self.mirrors(m.route) {
                [] => (m.cluster, None),
                [p] if moves && p.mode == crate::model::MirrorMode::Move => {
                    (p.cluster, Some(m.cluster))
                }
                _ => return Err(Refusal::Mirrored(why)),
            };
            if m.strip > 0 {
                args[i] = args[i].slice(m.strip.min(args[i].len())..);
            }
            let Some(c) = self.clusters.get(cluster) else {
                return Err(Refusal::NoRoute(args[i].clone()));
            };
            if c.hot_keys.iter().any(|r| args[i].starts_with(&r.prefix)) {
                return Err(Refusal::HotKey(why));
            }
            let here = Pinned {
                cluster,
                shard: c.picker.pick(&args[i]),
                from,
            };
            match at {
                None => at = Some(here),
                Some(a) if a.cluster != here.cluster || a.from != here.from => {
                    return Err(Refusal::CrossCluster)
                }
                Some(a) if a.shard != here.shard => return Err(Refusal::CrossSlot),
                Some(_) => {}
            }
        }
        Ok(at)
    }
}

//! The request that flows through the chain, and the reply it produces.
//!
//! The session parses a command once (argv as zero-copy `Bytes`, looked up in the command
//! table), computes its key positions once ([`Keys`]) and wraps both in a [`Request`]. Layers
//! annotate it — the route layer sets the cluster, the split and hash layers pin the shard —
//! and read the carried positions instead of computing them again.
//!
//! A reply is an encoded RESP frame ([`Reply`] = `Bytes`): replies from Redis pass through
//! untouched, and errors made by the proxy are encoded once with [`error_reply`].

use bytes::{BufMut, Bytes, BytesMut};

use crate::command::CommandInfo;
use crate::routing::RouteId;

/// An encoded RESP reply frame, ready to be written to the client.
pub type Reply = Bytes;

/// One client command on its way through the chain.
#[derive(Debug, Clone)]
pub struct Request {
    /// The command-table entry (resolved to the subcommand for container commands).
    pub cmd: &'static CommandInfo,
    /// The arguments, `args[0]` being the command name as the client sent it.
    pub args: Vec<Bytes>,
    /// The command as the client sent it (a multibulk frame, byte for byte what encoding
    /// `args` gives), which the upstream copies instead of encoding `args` again (or, when
    /// large, writes without a copy). `None` for inline commands and requests made by a
    /// layer. **A layer that changes `args` sets it to `None`.**
    pub raw: Option<Bytes>,
    /// Positions in `args` of the keys, as the session computed them
    /// ([`CommandInfo::key_indices`]); a layer that rewrites `args` keeps them true.
    pub keys: Keys,
    /// Index of the target cluster in the routing table (set by the route layer).
    pub cluster: usize,
    /// Shard pinned by a layer (split, hot key); `None` lets the hash layer choose.
    /// (`u32`, and `u16` below, keep `Request` within 128 bytes: moved by value through every
    /// layer, a larger one costs a `memcpy` call per layer.)
    pub shard: Option<u32>,
    /// Endpoint index within the shard (set by the zone layer; `None` = the primary).
    pub endpoint: Option<u16>,
    /// Index of the shard's primary among its endpoints (set by the zone layer with
    /// `endpoint`, 0 before), so the upstream needs no table of its own.
    pub primary: u16,
    /// The route taken (set by the route layer).
    pub route: RouteId,
    /// When the client stops waiting for the reply (`op_timeout` after it was read); a
    /// request still queued at its deadline is answered with a timeout and never written.
    pub deadline: Option<std::time::Instant>,
    /// The client's protocol and database, which pick the upstream connections (replies
    /// come from Redis in the client's protocol).
    pub flavor: Flavor,
}

/// What an upstream connection is set up for: the RESP version it negotiated (`HELLO 3`) and
/// the client database it selected. Requests of one flavor go to connections of that flavor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Flavor {
    /// RESP3 (`HELLO 3`) instead of RESP2.
    pub resp3: bool,
    /// The client's database (`SELECT n`), below the cluster's `databases`.
    pub db: u8,
    /// The client tracks the keys it reads (`CLIENT TRACKING on`): the upstream has Redis
    /// follow a read's keys, or has them announced to the client after the reply. Not part
    /// of what picks a connection ([`Flavor::index`]); carried in the flavor because every
    /// layer that makes requests of its own copies the flavor to them.
    pub track: bool,
}

impl Flavor {
    /// Index among a cluster's flavors: `db * 2 + resp3`.
    pub fn index(self) -> usize {
        usize::from(self.db) * 2 + usize::from(self.resp3)
    }
}

impl Request {
    /// A request for `cmd` with its arguments and its key positions (as
    /// [`CommandInfo::key_indices`] gives them); the cluster and shard are filled in later.
    pub fn new(cmd: &'static CommandInfo, args: Vec<Bytes>, keys: &[usize]) -> Self {
        Request::with_keys(cmd, args, Keys::from_positions(keys))
    }

    /// [`Request::new`] with the positions already in a [`Keys`].
    pub fn with_keys(cmd: &'static CommandInfo, args: Vec<Bytes>, keys: Keys) -> Self {
        Request {
            cmd,
            args,
            raw: None,
            keys,
            cluster: 0,
            shard: None,
            endpoint: None,
            primary: 0,
            route: RouteId::CatchAll,
            deadline: None,
            flavor: Flavor::default(),
        }
    }

    /// True when the command only reads (Redis's `readonly` flag). Commands with neither
    /// flag (EVAL, FCALL, ...) count as writes, so they are never sent to a replica.
    pub fn is_read(&self) -> bool {
        self.cmd.flags & crate::command::READONLY != 0
    }

    /// Pins the request to shard `shard` of its cluster. (Shard counts are far below
    /// `u32::MAX`: a cluster's shards each hold connections.)
    pub fn pin_shard(&mut self, shard: usize) {
        self.shard = Some(shard as u32);
    }

    /// The pinned shard, as an index.
    pub fn shard_index(&self) -> Option<usize> {
        self.shard.map(|s| s as usize)
    }

    /// The first key, if any.
    pub fn first_key(&self) -> Option<&Bytes> {
        self.keys.first().and_then(|i| self.args.get(i))
    }
}

/// The positions in a request's `args` of its keys, in the command's order.
///
/// Almost every command's keys sit at evenly spaced positions (`GET k`: 1; `MGET a b c`: 1, 2,
/// 3; `MSET a 1 b 2`: 1, 3; `EVAL s 2 a b`: 3, 4), which are held as a start, a step and a
/// count: no heap allocation, whatever the number of keys, and a clone is a copy. Other
/// positions (`ZUNIONSTORE d 2 a b`: 1, 3, 4; `SORT ... STORE`) are held in a boxed slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// `count` positions: `first`, `first + step`, ... (`u32`s, and a thin box for the
    /// list, so that `Keys` is 16 bytes and `Request` stays small enough to be moved through
    /// the layers without a `memcpy` call).
    Step { first: u32, step: u32, count: u32 },
    /// Any other positions (a thin box: a `Box<[usize]>` or a `Vec` would make `Keys` 24
    /// bytes).
    #[allow(clippy::box_collection)]
    List(Box<Vec<usize>>),
}

impl Default for Keys {
    fn default() -> Self {
        Keys::step(0, 1, 0)
    }
}

impl Keys {
    /// `count` positions from `first`, `step` apart.
    pub fn step(first: usize, step: usize, count: usize) -> Self {
        match (
            u32::try_from(first),
            u32::try_from(step),
            u32::try_from(count),
        ) {
            (Ok(first), Ok(step), Ok(count)) => Keys(Repr::Step { first, step, count }),
            // Beyond 4 billion arguments (never, under the codec's limits): listed.
            _ => Keys(Repr::List(Box::new(
                (0..count)
                    .map(|i| first.saturating_add(step.saturating_mul(i)))
                    .collect(),
            ))),
        }
    }

    /// The positions `at` (allocates only when they are not evenly spaced).
    pub fn from_positions(at: &[usize]) -> Self {
        let (first, step) = match *at {
            [] => (0, 1),
            [a] => (a, 1),
            [a, b, ..] if b > a => (a, b - a),
            _ => return Keys(Repr::List(Box::new(at.to_vec()))),
        };
        let even = at
            .iter()
            .enumerate()
            .all(|(i, &p)| Some(p) == step.checked_mul(i).and_then(|d| d.checked_add(first)));
        if even {
            Keys::step(first, step, at.len())
        } else {
            Keys(Repr::List(Box::new(at.to_vec())))
        }
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Step { count, .. } => *count as usize,
            Repr::List(l) => l.len(),
        }
    }

    /// True for a command without keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The position of the `i`-th key.
    pub fn get(&self, i: usize) -> Option<usize> {
        match &self.0 {
            Repr::Step { first, step, count } => (i < *count as usize)
                .then(|| (*first as usize).saturating_add((*step as usize).saturating_mul(i))),
            Repr::List(l) => l.get(i).copied(),
        }
    }

    /// The position of the first key.
    pub fn first(&self) -> Option<usize> {
        self.get(0)
    }

    /// The positions, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        (0..self.len()).map(move |i| self.get(i).unwrap_or_default())
    }
}

/// Encodes `-<msg>\r\n`. `msg` must start with an error code (`ERR`, `CROSSSLOT`, ...);
/// CR and LF in it become spaces so the frame stays well formed.
pub fn error_reply(msg: &str) -> Reply {
    let mut out = BytesMut::with_capacity(msg.len() + 3);
    out.put_u8(b'-');
    for &b in msg.as_bytes() {
        out.put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
    }
    out.put_slice(b"\r\n");
    out.freeze()
}

/// True when the encoded reply is an error frame (RESP2 `-`, or RESP3 blob error `!`).
pub fn is_error(reply: &[u8]) -> bool {
    matches!(reply.first(), Some(b'-' | b'!'))
}

#[cfg(test)]
mod tests {

    /// Every layer takes the request by value; up to 128 bytes a move is a few register
    /// copies, past it a `memcpy` call per layer (callgrind at GET -P 16: ~45 instructions
    /// more per request at 144 bytes).
    #[test]
    fn a_request_stays_small_enough_to_move_inline() {
        assert!(
            std::mem::size_of::<Request>() <= 128,
            "{}",
            std::mem::size_of::<Request>()
        );
        assert_eq!(std::mem::size_of::<Keys>(), 16);
    }

    #[test]
    fn keys_past_u32_are_listed() {
        let k = Keys::step(1, 2, 3);
        assert_eq!(k.iter().collect::<Vec<_>>(), [1, 3, 5]);
        let big = Keys::step(usize::MAX - 4, 2, 2);
        assert_eq!(
            big.iter().collect::<Vec<_>>(),
            [usize::MAX - 4, usize::MAX - 2]
        );
        assert_eq!(
            Keys::from_positions(&[1, 3, 4]).iter().collect::<Vec<_>>(),
            [1, 3, 4]
        );
    }

    use super::*;

    fn roundtrip(at: &[usize]) -> Keys {
        let k = Keys::from_positions(at);
        assert_eq!(k.iter().collect::<Vec<_>>(), at, "{at:?}");
        assert_eq!(k.len(), at.len());
        assert_eq!(k.first(), at.first().copied());
        assert_eq!(k.get(at.len()), None);
        k
    }

    #[test]
    fn evenly_spaced_positions_are_held_inline() {
        for at in [&[][..], &[1], &[1, 2, 3], &[1, 3, 5, 7], &[3, 4]] {
            assert!(matches!(roundtrip(at).0, Repr::Step { .. }), "{at:?}");
        }
    }

    #[test]
    fn other_positions_are_listed() {
        for at in [&[1, 3, 4][..], &[2, 1], &[1, 1], &[1, 2, 4]] {
            assert!(matches!(roundtrip(at).0, Repr::List(_)), "{at:?}");
        }
    }
}

//! The request that flows through the chain, and the reply it produces.
//!
//! The session parses a command once (argv as zero-copy `Bytes`, looked up in the command
//! table) and wraps it in a [`Request`]. Layers annotate it — the route layer sets the
//! cluster, the split and hash layers pin the shard — instead of parsing it again.
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
    /// Index in `args` of the first key, if the command has keys.
    pub key: Option<usize>,
    /// Index of the target cluster in the routing table (set by the route layer).
    pub cluster: usize,
    /// Shard pinned by a layer (split, hot key); `None` lets the hash layer choose.
    pub shard: Option<usize>,
    /// Endpoint index within the shard (set by the zone layer; `None` = the primary).
    pub endpoint: Option<usize>,
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
}

impl Flavor {
    /// Index among a cluster's flavors: `db * 2 + resp3`.
    pub fn index(self) -> usize {
        usize::from(self.db) * 2 + usize::from(self.resp3)
    }
}

impl Request {
    /// A request for `cmd` with its arguments; the cluster and shard are filled in later.
    pub fn new(cmd: &'static CommandInfo, args: Vec<Bytes>, key: Option<usize>) -> Self {
        Request {
            cmd,
            args,
            key,
            cluster: 0,
            shard: None,
            endpoint: None,
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

    /// The first key, if any.
    pub fn first_key(&self) -> Option<&Bytes> {
        self.key.and_then(|i| self.args.get(i))
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

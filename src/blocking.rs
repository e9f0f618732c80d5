//! Blocking commands (`BLPOP`, `BRPOP`, `BLMOVE`, `BRPOPLPUSH`, `BLMPOP`, `BZPOPMIN`,
//! `BZPOPMAX`, `BZMPOP`, `XREAD`/`XREADGROUP` with `BLOCK`). Not built yet: refused.

use std::time::Duration;

use bytes::Bytes;
use respway_filters::command::CommandInfo;
use respway_filters::request::{error_reply, Flavor, Reply};
use tokio::time::Instant;

use crate::fanout::BoxReply;
use crate::stack::Parts;

/// What the session does with a blocking command.
#[allow(dead_code)] // built in the next commits
pub(crate) enum Call {
    /// Not blocking after all (`XREAD` without `BLOCK`): forward it as usual.
    Forward(Vec<Bytes>),
    /// Wait for `fut`; the session gives up at `backstop`.
    Wait {
        /// The reply.
        fut: BoxReply,
        /// When the session answers with a timeout itself.
        backstop: Instant,
    },
    /// Refused with this reply.
    Refused(Reply),
}

/// Starts `args` (keys at `keys`).
pub(crate) fn call(
    cmd: &'static CommandInfo,
    args: Vec<Bytes>,
    keys: &[usize],
    parts: &Parts,
    flavor: Flavor,
    op_timeout: Duration,
) -> Call {
    let _ = (args, keys, parts, flavor, op_timeout);
    Call::Refused(error_reply(&format!(
        "ERR command '{}' is not supported by respway yet",
        cmd.name
    )))
}

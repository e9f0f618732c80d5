//! Commands over the whole keyspace: `SCAN`, `KEYS`, `DBSIZE`, `RANDOMKEY`, `FLUSHDB`,
//! `FLUSHALL`. Not built yet: refused.

use bytes::Bytes;
use respway_filters::command::KeyspaceKind;
use respway_filters::request::{error_reply, Flavor};
use tokio::time::Instant;

use crate::fanout::BoxReply;
use crate::stack::Parts;

/// Sends `args` to the shards `kind` needs and merges the replies.
pub(crate) fn call(
    kind: KeyspaceKind,
    args: Vec<Bytes>,
    parts: &Parts,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> BoxReply {
    let _ = (parts, flavor, conn, deadline, kind);
    let r = error_reply(&format!(
        "ERR command '{}' is not supported by respway yet",
        String::from_utf8_lossy(&args[0]).to_ascii_lowercase()
    ));
    Box::pin(async move { r })
}

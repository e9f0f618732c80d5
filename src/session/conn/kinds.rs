//! The kinds a session's loop decides by: the lane its commands travel on, and why it ends
//! on its own.

use super::Flavor;

/// Which connections a command travels on. A session's commands on one lane keep their
/// order (one connection per endpoint); before a command goes on another lane, the session
/// waits until what it has in flight is answered, so it cannot pass them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// Answered by the proxy.
    Local,
    /// The shared connections of this protocol and database.
    Shared(Flavor),
    /// The dedicated connection of the session's n-th transaction.
    Dedicated(u64),
    /// A dedicated connection of a blocking command: a new one for each, so that each
    /// waits for every command before it, and every command after it waits for it.
    Blocking,
}

/// Why a session ends on its own.
#[derive(Debug)]
pub(super) enum Cut {
    /// More reply bytes held than the hard limit.
    HardLimit(usize),
    /// Held at the limit, nothing read by the client for the stall timeout.
    Stalled(usize),
    /// A subscriber's queued messages would pass `pubsub_buffer_limit`.
    Subscriber(usize),
}

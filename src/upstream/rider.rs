//! What a layer above may send along with a request and hear back about (the near cache's
//! fill is one): frames written just before the request on the connection it goes on, and
//! the reply or its loss. The upstream knows no feature: it calls these hooks and nothing
//! else.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;

/// See the module.
pub(crate) trait Rider: Send + std::fmt::Debug {
    /// Whether it writes frames before the request (then the connection's slot is made).
    fn wants_slot(&self) -> bool {
        false
    }

    /// The frames to write just before the request, and how many replies they add, given the
    /// slot of the shared connection it goes on (a value the rider keeps per connection, 0
    /// at first, reset to 0 by the connection when the frames fail) and the endpoint's
    /// connect count; `None`: none.
    fn before(&mut self, _slot: &Arc<AtomicU64>, _connects: u64) -> Option<(Bytes, u8)> {
        None
    }

    /// Frames to write just after the request, and how many replies they add: their replies
    /// are handed to [`after_replies`](Self::after_replies) before the request's reply is
    /// (the request's reply waits for them); `None`: none.
    fn after(&mut self) -> Option<(Bytes, u8)> {
        None
    }

    /// The replies of the frames [`after`](Self::after) gave, as they came, one after another.
    fn after_replies(&mut self, _replies: &[u8]) {}

    /// The request's reply.
    fn done(self: Box<Self>, reply: &Bytes);

    /// The request went elsewhere or failed: the reply will not come (a Redis Cluster's
    /// redirection, a replica read sent again to the primary).
    fn abandon(self: Box<Self>);
}

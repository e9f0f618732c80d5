//! Why an upstream request failed, and the kinds the counters count.

use super::*;

/// Why an upstream request failed. Rendered as `-ERR respway: shard NAME (ADDR) ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UpstreamError {
    /// The endpoint could not be reached (connect failed, or in backoff): not sent.
    Unavailable(Arc<str>),
    /// The connection broke while the request was in flight: it may have run.
    ConnectionLost(Arc<str>),
    /// The connection task is gone (the endpoint left the configuration): not sent.
    Closed,
    /// No reply by the deadline. It may have run if it was written.
    Timeout,
    /// The connection's queue was full: not sent.
    QueueFull(usize),
    /// The request named a shard or endpoint that does not exist: not sent.
    NoShard,
    /// Every dedicated connection this worker may open to the endpoint is in use: not sent.
    Busy(usize),
}

impl UpstreamError {
    /// True when the request certainly did not reach Redis, or broke on the way, so a read
    /// may be sent elsewhere.
    pub(crate) fn retryable_read(&self) -> bool {
        matches!(
            self,
            UpstreamError::Unavailable(_)
                | UpstreamError::ConnectionLost(_)
                | UpstreamError::Closed
                | UpstreamError::QueueFull(_)
                | UpstreamError::Busy(_)
        )
    }

    /// The error's kind, as counted in INFO.
    pub(crate) fn kind(&self) -> ErrorKind {
        match self {
            UpstreamError::Unavailable(_) => ErrorKind::Unavailable,
            UpstreamError::ConnectionLost(_) => ErrorKind::ConnectionLost,
            UpstreamError::Closed => ErrorKind::Closed,
            UpstreamError::Timeout => ErrorKind::Timeout,
            UpstreamError::QueueFull(_) => ErrorKind::QueueFull,
            UpstreamError::NoShard => ErrorKind::NoShard,
            UpstreamError::Busy(_) => ErrorKind::Busy,
        }
    }

    /// The RESP error frame for a client, naming the endpoint.
    pub(crate) fn to_reply(&self, label: &str) -> Reply {
        error_reply(&format!("ERR respway: {}", Shown(self, label)))
    }
}

pub(super) struct Shown<'a>(&'a UpstreamError, &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = self.1;
        match self.0 {
            UpstreamError::Unavailable(e) => write!(f, "{label} unavailable: {e}"),
            UpstreamError::ConnectionLost(e) => write!(f, "{label}: connection lost: {e}"),
            UpstreamError::Closed => write!(f, "{label}: connection closed"),
            UpstreamError::Timeout => write!(f, "{label}: upstream timeout"),
            UpstreamError::QueueFull(n) => {
                write!(f, "{label}: queue full ({n} requests waiting)")
            }
            UpstreamError::NoShard => write!(f, "no such shard"),
            UpstreamError::Busy(n) => write!(
                f,
                "{label}: all {n} dedicated connections (transactions and blocking commands) \
                 of this worker are in use"
            ),
        }
    }
}

/// Kinds of [`UpstreamError`], for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// [`UpstreamError::Unavailable`].
    Unavailable = 0,
    /// [`UpstreamError::ConnectionLost`].
    ConnectionLost,
    /// [`UpstreamError::Closed`].
    Closed,
    /// [`UpstreamError::Timeout`].
    Timeout,
    /// [`UpstreamError::QueueFull`].
    QueueFull,
    /// [`UpstreamError::NoShard`].
    NoShard,
    /// [`UpstreamError::Busy`].
    Busy,
}

impl ErrorKind {
    /// Every kind, in counter order.
    pub(crate) const ALL: [ErrorKind; 7] = [
        ErrorKind::Unavailable,
        ErrorKind::ConnectionLost,
        ErrorKind::Closed,
        ErrorKind::Timeout,
        ErrorKind::QueueFull,
        ErrorKind::NoShard,
        ErrorKind::Busy,
    ];

    /// The INFO field suffix.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ConnectionLost => "connection_lost",
            ErrorKind::Closed => "closed",
            ErrorKind::Timeout => "timeout",
            ErrorKind::QueueFull => "queue_full",
            ErrorKind::NoShard => "no_shard",
            ErrorKind::Busy => "busy",
        }
    }
}

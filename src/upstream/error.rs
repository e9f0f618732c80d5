//! Why an upstream request failed (the type lives in `respway_filters::error`, which carries
//! it to the session), and the kinds the counters count.

pub(crate) use respway_filters::error::UpstreamError;

/// The error's kind, as counted in INFO.
pub(crate) fn kind(e: &UpstreamError) -> ErrorKind {
    match e {
        UpstreamError::Unavailable(_) => ErrorKind::Unavailable,
        UpstreamError::ConnectionLost(_) => ErrorKind::ConnectionLost,
        UpstreamError::Closed => ErrorKind::Closed,
        UpstreamError::Timeout => ErrorKind::Timeout,
        UpstreamError::QueueFull(_) => ErrorKind::QueueFull,
        UpstreamError::NoShard => ErrorKind::NoShard,
        UpstreamError::Busy(_) => ErrorKind::Busy,
        UpstreamError::Demoted(_) => ErrorKind::Demoted,
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
    /// [`UpstreamError::Demoted`].
    Demoted,
}

impl ErrorKind {
    /// Every kind, in counter order.
    pub(crate) const ALL: [ErrorKind; 8] = [
        ErrorKind::Unavailable,
        ErrorKind::ConnectionLost,
        ErrorKind::Closed,
        ErrorKind::Timeout,
        ErrorKind::QueueFull,
        ErrorKind::NoShard,
        ErrorKind::Busy,
        ErrorKind::Demoted,
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
            ErrorKind::Demoted => "demoted",
        }
    }
}

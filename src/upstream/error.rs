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

pub(crate) use crate::stats::ErrorKind;

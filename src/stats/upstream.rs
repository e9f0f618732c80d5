//! What the upstream counts and shows, defined here so that the stats floor imports no
//! feature: the kinds of its errors, one worker's totals, and the views of an endpoint out of
//! rotation and of its health check.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Kinds of the upstream's errors (`respway_filters::error::UpstreamError`), for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// [`respway_filters::error::UpstreamError::Unavailable`].
    Unavailable = 0,
    /// [`respway_filters::error::UpstreamError::ConnectionLost`].
    ConnectionLost,
    /// [`respway_filters::error::UpstreamError::Closed`].
    Closed,
    /// [`respway_filters::error::UpstreamError::Timeout`].
    Timeout,
    /// [`respway_filters::error::UpstreamError::QueueFull`].
    QueueFull,
    /// [`respway_filters::error::UpstreamError::NoShard`].
    NoShard,
    /// [`respway_filters::error::UpstreamError::Busy`].
    Busy,
    /// [`respway_filters::error::UpstreamError::Demoted`].
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

/// One worker's upstream counters (kept across configuration changes).
#[derive(Debug, Default)]
pub(crate) struct UpstreamStats {
    pub(crate) errors: [AtomicU64; 8],
    /// Connections opened (first connects and reconnects).
    pub(crate) connects: AtomicU64,
    /// Connect attempts that failed.
    pub(crate) connect_failures: AtomicU64,
    /// Connections closed because requests on them stopped being answered.
    pub(crate) stuck: AtomicU64,
    /// Connections closed because the peer broke the protocol.
    pub(crate) protocol_errors: AtomicU64,
}

impl UpstreamStats {
    /// Counts one error of `kind`.
    pub(crate) fn count(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
    /// Errors of `kind` so far.
    pub(crate) fn errors(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }
}

/// Why and since when an endpoint is out (an endpoint the upstream took out of rotation).
#[derive(Debug, Clone)]
pub(crate) struct Down {
    /// When it went out.
    pub(crate) since: std::time::SystemTime,
    /// The last failure.
    pub(crate) reason: Arc<str>,
    /// Failed attempts since it went out.
    pub(crate) failures: u64,
}

/// One endpoint's check state as shown (`/clusters`, `/metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckView {
    /// `healthy`, `unhealthy`, `draining` or `demoted`.
    pub(crate) state: &'static str,
    /// In read rotation by the check.
    pub(crate) in_rotation: bool,
    /// Times the state changed.
    pub(crate) transitions: u64,
    /// The last failure's text (empty: none yet).
    pub(crate) last_error: String,
}

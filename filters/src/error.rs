//! What the proxy answers for, typed from where it happens to where the reply is written.
//!
//! Every layer, future and handler passes a [`Failure`] on as the `Err` of its result; only
//! the session, writing the reply, turns it into the error frame a client reads
//! ([`Failure::to_reply`]). Redis's own error replies are replies (`Ok`), not failures. So a
//! holder of a connection decides by the variant (was the request sent? may the connection
//! be reused?), never by an error's text.

use std::fmt;
use std::sync::Arc;

use crate::place::Refusal;
use crate::request::{error_reply, Reply};

/// Why an upstream request failed. Shown as `shard NAME (ADDR) ...` with the endpoint's label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamError {
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
    /// A write to a shard whose configured primary answers `ROLE` as a replica of this
    /// `HOST:PORT` (the active health check saw it): not sent.
    Demoted(Arc<str>),
}

impl UpstreamError {
    /// True when the request certainly did not reach Redis, or broke on the way, so a read
    /// may be sent elsewhere.
    pub fn retryable_read(&self) -> bool {
        matches!(
            self,
            UpstreamError::Unavailable(_)
                | UpstreamError::ConnectionLost(_)
                | UpstreamError::Closed
                | UpstreamError::QueueFull(_)
                | UpstreamError::Busy(_)
        )
    }

    /// This error of the endpoint labelled `label` (`shard NAME (ADDR)`) as a failure.
    pub fn at(self, label: Arc<str>) -> Failure {
        Failure::new(Kind::Upstream { label, error: self })
    }
}

/// What a request gets: Redis's reply (its errors included), or the proxy's failure.
pub type Answer = Result<Reply, Failure>;

/// A reply the proxy makes instead of Redis's. Boxed: a result carrying one stays as small
/// as a reply, and failures are the rare path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(Box<Kind>);

/// The kinds of [`Failure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// An upstream request failed; `label` names the shard and endpoint.
    Upstream {
        /// `shard NAME (ADDR)`.
        label: Arc<str>,
        /// What failed.
        error: UpstreamError,
    },
    /// The command was refused before anything was sent.
    Refused(Refusal),
    /// A sub-request was not sent because the inner service was not ready
    /// ([`Join`](crate::fanout::Join)).
    NotReady,
    /// A hot-key write failed on some shards (named); the others kept it. `first` is the
    /// first failure's text.
    HotKeyWrite {
        /// The failed shards' names, comma separated.
        shards: String,
        /// The first failure's text.
        first: String,
    },
    /// A shard's reply could not be merged with the others (its first bytes).
    Unmergeable(String),
    /// A future was polled after it answered (a caller's bug, answered, not a panic).
    PolledTwice,
    /// A command sent to every shard (or the first) found none to send it to.
    NoTarget,
    /// An error the proxy composed, with its final text (code included, no `-`).
    Message(String),
}

impl Failure {
    /// A failure of this kind.
    pub fn new(kind: Kind) -> Self {
        Failure(Box::new(kind))
    }

    /// What failed.
    pub fn kind(&self) -> &Kind {
        &self.0
    }

    /// The upstream error, when an upstream request failed.
    pub fn upstream(&self) -> Option<&UpstreamError> {
        match &*self.0 {
            Kind::Upstream { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The error frame a client reads.
    pub fn to_reply(&self) -> Reply {
        error_reply(&self.to_string())
    }
}

impl Failure {
    /// A composed error with its final text (`ERR respway: ...`).
    pub fn message(text: impl Into<String>) -> Self {
        Failure::new(Kind::Message(text.into()))
    }
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Self {
        Failure::new(Kind::Refused(r))
    }
}

/// The error's text, with its code (`ERR respway: ...`, `CROSSSLOT ...`), without `-`.
impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Kind::Upstream {
                label,
                error: UpstreamError::Demoted(of),
            } => write!(
                f,
                "READONLY respway: {label}: the configured primary answers ROLE as a replica \
                 of {of}; writes are refused until it is primary again or the configuration \
                 names another"
            ),
            Kind::Upstream { label, error } => {
                f.write_str("ERR respway: ")?;
                match error {
                    UpstreamError::Unavailable(e) => write!(f, "{label} unavailable: {e}"),
                    UpstreamError::ConnectionLost(e) => {
                        write!(f, "{label}: connection lost: {e}")
                    }
                    UpstreamError::Closed => write!(f, "{label}: connection closed"),
                    UpstreamError::Timeout => write!(f, "{label}: upstream timeout"),
                    UpstreamError::QueueFull(n) => {
                        write!(f, "{label}: queue full ({n} requests waiting)")
                    }
                    UpstreamError::NoShard => f.write_str("no such shard"),
                    UpstreamError::Demoted(_) => Ok(()),
                    UpstreamError::Busy(n) => write!(
                        f,
                        "{label}: all {n} dedicated connections (transactions and blocking \
                         commands) of this worker are in use"
                    ),
                }
            }
            Kind::Refused(r) => r.fmt(f),
            Kind::NotReady => f.write_str("ERR respway: shard not ready"),
            Kind::HotKeyWrite { shards, first } => write!(
                f,
                "ERR respway: hot-key write failed on shard(s) {shards}: {first}"
            ),
            Kind::Unmergeable(r) => write!(
                f,
                "ERR respway: unexpected reply from a shard while merging: {r}"
            ),
            Kind::PolledTwice => f.write_str("ERR respway: reply polled twice"),
            Kind::NoTarget => f.write_str("ERR respway: no shard to send the command to"),
            Kind::Message(m) => f.write_str(m),
        }
    }
}

/// The text of an error reply or failure, without `-` and CRLF (for messages that quote one).
pub fn error_text(r: &Answer) -> String {
    match r {
        Ok(reply) => String::from_utf8_lossy(reply.get(1..).unwrap_or_default())
            .trim_end_matches(['\r', '\n'])
            .to_string(),
        Err(f) => f.to_string(),
    }
}

/// True when the result is a failure or Redis's error reply.
pub fn failed(r: &Answer) -> bool {
    match r {
        Ok(reply) => crate::request::is_error(reply),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_with_a_failure_is_no_bigger_than_a_reply_and_a_word() {
        assert!(std::mem::size_of::<Result<Reply, Failure>>() <= 40);
    }

    #[test]
    fn upstream_failures_name_the_endpoint() {
        let f = UpstreamError::Timeout.at("shard s0 (127.0.0.1:1)".into());
        assert_eq!(
            f.to_reply(),
            bytes::Bytes::from_static(
                b"-ERR respway: shard s0 (127.0.0.1:1): upstream timeout\r\n"
            )
        );
        assert_eq!(f.upstream(), Some(&UpstreamError::Timeout));
    }
}

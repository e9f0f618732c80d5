//! Observability: every counter respway keeps, the registry that sums them, and the one table
//! of metric families that `/metrics` and `INFO` are both written from.
//!
//! Counters are per worker (no cache line shared by all connections): each worker writes its
//! own with relaxed atomics ([`bump`]), and a reader (a scrape, `INFO`) sums them over the
//! workers when it asks. The request path never takes a lock and never reads the table.
//!
//! - this file: [`bump`], [`Counter`], a worker's counters for one listener
//!   ([`ListenerStats`]) and failed `accept`s (process-wide);
//! - `commands`: per-command calls, errors and latency histograms, and per-endpoint latency;
//! - `registry`: every worker's counters, summed on demand ([`Registry`], [`Totals`]);
//! - `families`: the table of metric families (name, kind, help, labels, reader, `INFO` field);
//! - `info`: `INFO`'s counters written from the table, and the table as tests see it;
//! - `scrape`: what one scrape reads (gathered once) and the readers of the table's families.

use std::sync::atomic::{AtomicU64, Ordering};

mod commands;
mod families;
mod features;
pub mod hotkeys;
mod info;
pub(crate) mod process;
mod registry;
mod scrape;
pub mod slowlog;
mod upstream;

pub(crate) use commands::*;
pub(crate) use families::*;
pub(crate) use features::*;
pub(crate) use info::write_info;
pub use info::{family_docs, FamilyDoc};
pub(crate) use registry::*;
pub(crate) use scrape::*;
pub(crate) use upstream::*;

/// Adds `n` to a counter that only one thread writes (a worker's own): a plain load and
/// store, not a locked read-modify-write, since no other writer can interleave; readers on
/// other threads see the value a little late, never a torn or lost one.
#[inline]
pub(crate) fn bump(a: &AtomicU64, n: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// A monotonically increasing counter, written by one worker.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds one (see [`bump`]).
    pub(crate) fn inc(&self) {
        bump(&self.0, 1);
    }
    /// Current value.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Buckets of the pipeline-depth histogram: up to 1, 2, 4, … 1024 commands per read, more.
pub(crate) const PIPELINE_BUCKETS: usize = 12;

/// The pipeline-depth bucket of a read that held `n` (> 0) commands.
#[inline]
pub(crate) fn pipeline_bucket(n: usize) -> usize {
    ((usize::BITS - (n - 1).leading_zeros()) as usize).min(PIPELINE_BUCKETS - 1)
}

/// One worker's counters for one listener.
#[derive(Debug, Default)]
pub(crate) struct ListenerStats {
    /// Commands decoded.
    pub(crate) commands: Counter,
    /// Bytes read from clients.
    pub(crate) bytes_in: AtomicU64,
    /// Bytes written to clients.
    pub(crate) bytes_out: AtomicU64,
    /// Client connections accepted.
    pub(crate) connections: Counter,
    /// Client connections currently open (incremented and decremented by the same worker).
    pub(crate) active: AtomicU64,
    /// Streams closed for a protocol error.
    pub(crate) protocol_errors: Counter,
    /// Commands refused as unsupported.
    pub(crate) unsupported: Counter,
    /// Requests answered with an upstream timeout.
    pub(crate) timeouts: Counter,
    /// Client connections closed for holding too many reply bytes.
    pub(crate) output_limit_closes: Counter,
    /// Failed AUTH attempts.
    pub(crate) auth_failures: Counter,
    /// Failed AUTH attempts answered late (past the process's rate of failures).
    pub(crate) auth_tarpitted: Counter,
    /// TLS handshakes that failed or timed out (plaintext clients are counted apart).
    pub(crate) tls_handshake_failures: Counter,
    /// Connections to a TLS listener that did not start with a TLS record (plaintext
    /// clients), closed.
    pub(crate) tls_plaintext_refused: Counter,
    /// Reads from clients by the commands they held: bucket `i` counts reads of up to `2^i`
    /// commands (more than 2^(`PIPELINE_BUCKETS` − 2) in the last).
    pub(crate) pipeline: [AtomicU64; PIPELINE_BUCKETS],
    /// Per-command calls, errors and latency.
    pub(crate) cmds: CommandStats,
    /// Hot-key detection.
    pub(crate) hot: crate::stats::hotkeys::Tracker,
    /// Slow commands.
    pub(crate) slow: crate::stats::slowlog::SlowLog,
}

/// Which sockets an `accept` failed on (for [`accept_failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcceptSocket {
    /// The RESP listeners (every worker's).
    Listeners = 0,
    /// The admin endpoint.
    Admin = 1,
}

/// Reasons an `accept` failed, as exported (`reason` label).
pub(crate) const ACCEPT_REASONS: [&str; 3] = ["emfile", "enfile", "other"];

/// Failed `accept`s since start, by socket and reason: process-wide, as the file descriptors
/// that run out are. Written only when an accept fails, never per request.
static ACCEPT_ERRORS: [[AtomicU64; 3]; 2] = [
    [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
    [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
];

/// The `reason` of an accept error: `emfile` (the process is out of descriptors), `enfile`
/// (the system is), else `other`.
pub(crate) fn accept_reason(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) => ACCEPT_REASONS[0],
        Some(libc::ENFILE) => ACCEPT_REASONS[1],
        _ => ACCEPT_REASONS[2],
    }
}

/// Counts a failed `accept` on `socket`.
pub(crate) fn accept_failed(socket: AcceptSocket, e: &std::io::Error) {
    let reason = accept_reason(e);
    let i = ACCEPT_REASONS
        .iter()
        .position(|r| *r == reason)
        .unwrap_or(2);
    ACCEPT_ERRORS[socket as usize][i].fetch_add(1, Ordering::Relaxed);
}

/// Failed `accept`s on `socket` with `ACCEPT_REASONS[i]`, since start.
pub(crate) fn accept_errors(socket: AcceptSocket, i: usize) -> u64 {
    ACCEPT_ERRORS[socket as usize]
        .get(i)
        .map_or(0, |c| c.load(Ordering::Relaxed))
}

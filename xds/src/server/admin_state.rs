//! The admin port's limits and shared state (connection slots, counters): what the server
//! holds and reports without depending on the HTTP endpoint itself.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

/// The admin port's defences against connection floods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminLimits {
    /// Connections open at once; more wait in the kernel's accept queue (they hold no file
    /// descriptor of the process) until one closes.
    pub max_connections: usize,
    /// A connection with no byte in either direction for this long, and no request in
    /// progress, is closed; an HTTP/1.1 request's headers must arrive within it too.
    pub idle_timeout: Duration,
}

/// [`AdminLimits::max_connections`] by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// [`AdminLimits::idle_timeout`] by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// The admin port's connections and failed accepts, in `GET /status` (`admin`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminStats {
    /// Connections open now.
    pub open_connections: u64,
    /// [`AdminLimits::max_connections`].
    pub max_connections: u64,
    /// Accepts that failed (e.g. `EMFILE`: out of file descriptors) since the start; each is
    /// followed by a pause (10 ms, doubling up to 1 s while they go on).
    pub accept_errors: u64,
}

/// The admin port's shared state: its connection slots and counters.
#[derive(Debug)]
pub(crate) struct AdminState {
    pub(crate) limits: AdminLimits,
    pub(crate) slots: Arc<Semaphore>,
    /// Connections being served.
    pub(crate) open: Arc<AtomicUsize>,
    pub(crate) accept_errors: Arc<AtomicU64>,
}

impl AdminState {
    pub(crate) fn new(limits: AdminLimits) -> AdminState {
        let max = limits.max_connections.max(1);
        AdminState {
            limits: AdminLimits {
                max_connections: max,
                ..limits
            },
            slots: Arc::new(Semaphore::new(max)),
            open: Arc::new(AtomicUsize::new(0)),
            accept_errors: Arc::new(AtomicU64::new(0)),
        }
    }

    pub(crate) fn stats(&self) -> AdminStats {
        let max = self.limits.max_connections;
        AdminStats {
            open_connections: self.open.load(Ordering::Relaxed) as u64,
            max_connections: max as u64,
            accept_errors: self.accept_errors.load(Ordering::Relaxed),
        }
    }
}

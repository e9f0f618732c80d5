//! An active health check's verdict on one endpoint: flags on the upstream's host that the
//! checker (`discovery::health`) writes and the request path reads (one atomic load per
//! replica the zone layer considers, one per write to a primary). The upstream knows no
//! checker: it reads these flags only.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

pub(crate) use crate::stats::CheckView;

pub(crate) const HEALTHY: u8 = 0;
pub(crate) const UNHEALTHY: u8 = 1;
pub(crate) const DRAINING: u8 = 2;

/// What the active check says of one endpoint (shared by the checker and every worker).
#[derive(Debug, Default)]
pub(crate) struct EndpointCheck {
    /// [`HEALTHY`], [`UNHEALTHY`] or [`DRAINING`].
    pub(crate) state: AtomicU8,
    /// A configured primary that answers `ROLE` as a replica.
    pub(crate) demoted: AtomicBool,
    /// A configured replica that answers `ROLE` as a primary (logged once per change).
    pub(crate) promoted: AtomicBool,
    /// Times `state` or `demoted` changed.
    pub(crate) transitions: AtomicU64,
    /// Failures (or passes, while unhealthy) in a row.
    pub(crate) streak: AtomicU64,
    /// For the admin endpoint and the refusal text: the last failure, and the primary a
    /// demoted endpoint replicates from (`HOST:PORT`).
    pub(crate) detail: Mutex<Detail>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Detail {
    pub(crate) last_error: String,
    pub(crate) replica_of: String,
}

impl EndpointCheck {
    /// False while the check has the endpoint out of rotation (unhealthy or draining).
    pub(crate) fn in_rotation(&self) -> bool {
        self.state.load(Ordering::Relaxed) == HEALTHY
    }

    /// True while this configured primary answers `ROLE` as a replica.
    pub(crate) fn demoted(&self) -> bool {
        self.demoted.load(Ordering::Relaxed)
    }

    /// The primary a demoted endpoint says it replicates from (`HOST:PORT`).
    pub(crate) fn replica_of(&self) -> String {
        self.detail().replica_of.clone()
    }

    pub(crate) fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `/clusters` and `/metrics` show.
    pub(crate) fn view(&self) -> CheckView {
        let state = self.state.load(Ordering::Relaxed);
        CheckView {
            state: if self.demoted() {
                "demoted"
            } else {
                match state {
                    HEALTHY => "healthy",
                    DRAINING => "draining",
                    _ => "unhealthy",
                }
            },
            in_rotation: state == HEALTHY,
            transitions: self.transitions.load(Ordering::Relaxed),
            last_error: self.detail().last_error.clone(),
        }
    }

    pub(crate) fn set_state(&self, to: u8, label: &str) {
        let from = self.state.swap(to, Ordering::Relaxed);
        if from != to {
            self.transitions.fetch_add(1, Ordering::Relaxed);
            let name = |s| match s {
                HEALTHY => "healthy",
                DRAINING => "draining",
                _ => "unhealthy",
            };
            tracing::warn!(
                endpoint = %label,
                from = name(from),
                to = name(to),
                error = %self.detail().last_error,
                "health check: endpoint changed state"
            );
        }
    }
}

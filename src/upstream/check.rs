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

/// How a replica's refusal starts (see [`in_sync`]).
pub(crate) const NOT_IN_SYNC: &str = "replica not in sync";

/// Whether a replica's `INFO replication` (the reply's text) says it serves what its primary
/// holds: a primary (promoted) does; a replica does while linked to its primary with no sync
/// in progress, and once its link dropped only if it had been linked since it started (its
/// primary is gone: it holds the freshest data there is). A replica that never linked since
/// it started (restarted with an old dump, or still loading what its primary sends) does not.
///
/// # Errors
/// Why not, with the fields that say so.
pub(crate) fn in_sync(info: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(info);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    if field("role") != Some("slave") {
        return Ok(());
    }
    let link = field("master_link_status").unwrap_or("");
    let syncing = field("master_sync_in_progress") == Some("1");
    let down_since = field("master_link_down_since_seconds");
    if !syncing && (link == "up" || down_since.is_some_and(|s| s != "-1")) {
        return Ok(());
    }
    Err(format!(
        "{NOT_IN_SYNC}: master_link_status:{link} master_sync_in_progress:{} \
         master_link_down_since_seconds:{}",
        u8::from(syncing),
        down_since.unwrap_or("?")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(fields: &str) -> Vec<u8> {
        format!("# Replication\r\n{}\r\n", fields.replace(' ', "\r\n")).into_bytes()
    }

    #[test]
    fn a_replica_serves_while_linked_or_after_its_primary_died() {
        assert!(in_sync(&info("role:master connected_slaves:1")).is_ok());
        assert!(in_sync(&info(
            "role:slave master_link_status:up master_sync_in_progress:0"
        ))
        .is_ok());
        // Its primary died: it was linked, its data is the freshest there is.
        assert!(in_sync(&info(
            "role:slave master_link_status:down master_sync_in_progress:0 master_link_down_since_seconds:3"
        ))
        .is_ok());
        // Restarted with an old dump: never linked since.
        let e = in_sync(&info(
            "role:slave master_link_status:down master_sync_in_progress:0 master_link_down_since_seconds:-1",
        ))
        .unwrap_err();
        assert!(e.contains("master_link_down_since_seconds:-1"), "{e}");
        // Syncing.
        assert!(in_sync(&info(
            "role:slave master_link_status:down master_sync_in_progress:1 master_link_down_since_seconds:-1"
        ))
        .is_err());
    }
}

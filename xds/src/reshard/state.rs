//! STATE.json: what a reshard has done, written (atomically) after every step, so that any
//! later run continues where the last one stopped; and the files kept next to it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::edit::RouteRef;

/// The step reached. A reshard goes through them in order; an abort goes through them again,
/// in the other direction (see [`State::aborting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Nothing pushed yet (the plan was accepted).
    Planned,
    /// `prepare_move` applied; not yet ACKed by every sidecar.
    PreparePushed,
    /// Every sidecar ACKed `prepare_move`: none serves a key whose owner changes from its old
    /// placement any more, so move mode may start.
    PrepareAcked,
    /// Move mode applied; not yet ACKed by every sidecar.
    MovePushed,
    /// Every sidecar ACKed move mode: the mover may run.
    MoveAcked,
    /// The mover ended with nothing failed.
    Moved,
    /// The final configuration applied; not yet ACKed by every sidecar.
    FinalPushed,
    /// Every sidecar ACKed the final configuration.
    Done,
}

impl Phase {
    /// How `status` names it.
    pub fn describe(self) -> &'static str {
        match self {
            Phase::Planned => "0/4 planned (nothing pushed yet)",
            Phase::PreparePushed => "1/4 prepare_move pushed, waiting for every sidecar's ACK",
            Phase::PrepareAcked => "1/4 every sidecar in prepare_move; move mode not pushed yet",
            Phase::MovePushed => "2/4 move mode pushed, waiting for every sidecar's ACK",
            Phase::MoveAcked => "3/4 every sidecar in move mode; moving keys",
            Phase::Moved => "3/4 keys moved; final configuration not pushed yet",
            Phase::FinalPushed => "4/4 final configuration pushed, waiting for every sidecar's ACK",
            Phase::Done => "done",
        }
    }
}

/// How a reshard moves the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Move mode: `prepare_move`, `move` and the mover (`MIGRATE` between the shards).
    #[default]
    Move,
    /// Copy mode: dual write, a backfill, a short write pause, the cut-over and the cleanup
    /// ([`super::copy`]).
    Copy,
}

/// Copy mode's step reached ([`super::copy`]); an abort before the cut-over jumps to the
/// restore, after it runs the steps again in the other direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyPhase {
    /// Nothing pushed yet.
    #[default]
    Planned,
    /// Dual write applied (the route on `from`, copies to `to`); not yet ACKed by all.
    DualPushed,
    /// Every sidecar copies its writes to `to`: the backfill may run.
    DualAcked,
    /// The backfill ended: every key it saw is equal on both sides.
    Backfilled,
    /// The keys written during the backfill were checked again (catch-up rounds).
    CaughtUp,
    /// The write pause applied (writes refused, reads from `from`); not yet ACKed by all.
    PausePushed,
    /// Every sidecar refuses writes: the copies drain, then the written keys are checked.
    PauseAcked,
    /// Both sides equal, writes still refused: the cut-over may be pushed.
    Checked,
    /// The route on `to` (writes still refused); not yet ACKed by all.
    SwitchPushed,
    /// Every sidecar reads from `to`.
    SwitchAcked,
    /// Writes resumed on `to`, copied to `from` for a rollback; not yet ACKed by all.
    ResumePushed,
    /// The pause is over on every sidecar.
    ResumeAcked,
    /// The final configuration (or, aborting, the original files) applied.
    FinalPushed,
    /// Every sidecar holds it: the cleanup may run.
    FinalAcked,
    /// The cleanup ended.
    Done,
}

impl CopyPhase {
    /// How `status` names it.
    pub fn describe(self) -> &'static str {
        match self {
            CopyPhase::Planned => "0/7 planned (nothing pushed yet)",
            CopyPhase::DualPushed => "1/7 dual write pushed, waiting for every sidecar's ACK",
            CopyPhase::DualAcked => "2/7 every sidecar in dual write; backfilling",
            CopyPhase::Backfilled => "3/7 backfilled; checking the keys written meanwhile",
            CopyPhase::CaughtUp => "3/7 caught up; the write pause not pushed yet",
            CopyPhase::PausePushed => "4/7 write pause pushed, waiting for every sidecar's ACK",
            CopyPhase::PauseAcked => "4/7 writes paused; draining the copies and checking",
            CopyPhase::Checked => "4/7 writes paused, both sides equal; cut-over not pushed yet",
            CopyPhase::SwitchPushed => "5/7 cut-over pushed (writes paused), waiting for ACKs",
            CopyPhase::SwitchAcked => "5/7 every sidecar reads from the new side; writes paused",
            CopyPhase::ResumePushed => "5/7 writes resumed on the new side, waiting for ACKs",
            CopyPhase::ResumeAcked => "6/7 writes on the new side; final configuration not pushed",
            CopyPhase::FinalPushed => "6/7 final configuration pushed, waiting for ACKs",
            CopyPhase::FinalAcked => "7/7 every sidecar on the new side; cleaning up",
            CopyPhase::Done => "done",
        }
    }
}

/// Where one sidecar's record of the keys its copies wrote stood (its admin endpoint's
/// `/mirror/keys`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordMark {
    /// The sidecar's admin address.
    pub admin: String,
    /// The record's id: another id means the record was replaced (a restarted sidecar).
    pub id: String,
    /// The cursor the keys were checked up to; `None`: none yet (from the record's start).
    pub cursor: Option<String>,
}

/// What copy mode keeps between steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyState {
    /// The step reached.
    pub phase: CopyPhase,
    /// Per node, its record of the keys copied to the side receiving copies now.
    #[serde(default)]
    pub records: std::collections::BTreeMap<String, RecordMark>,
    /// The records taken when writes resumed on the new side (copies to the old side): an
    /// abort after the cut-over checks their keys.
    #[serde(default)]
    pub reverse_records: std::collections::BTreeMap<String, RecordMark>,
    /// A record could not be used (overflowed, replaced, a keyless write, a node without
    /// one): the pause compares the whole keyspace instead of the written keys.
    #[serde(default)]
    pub full_pass: bool,
    /// When the write pause was pushed (ms since the epoch).
    #[serde(default)]
    pub pause_started_ms: Option<u64>,
    /// How long the last write pause lasted, in ms (from its push to every sidecar's ACK
    /// of the resumed writes).
    #[serde(default)]
    pub pause_ms: Option<u64>,
    /// `--hold`: stop once writes resumed on the new side (still copied to the old one, so
    /// an abort can go back) until `resume` pushes the final configuration.
    #[serde(default)]
    pub hold: bool,
}

/// One configuration applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// `prepare`, `move`, `final`, or with an abort `reverse prepare`, `reverse move` and
    /// `restore`.
    pub step: String,
    /// The server's generation after it.
    pub version: u64,
    /// Whether every sidecar ACKed it.
    pub acked: bool,
}

/// The mover's figures from `--plan`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanFigures {
    /// Keys to move.
    pub keys: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The mover's time estimate, in seconds.
    pub estimate_s: u64,
}

/// One resource file a reshard edits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResFile {
    /// Where the operator keeps it.
    pub path: PathBuf,
    /// The name it is applied under in the server's directory (its file name).
    pub name: String,
    /// Its text when the reshard started: what an abort puts back.
    pub original: String,
}

/// Everything a later run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The management server's admin address.
    pub admin: String,
    /// The operator's resource files that hold the route: each is edited and applied in each
    /// phase.
    pub files: Vec<ResFile>,
    /// The route's listener.
    pub listener: String,
    /// The route's prefix; `None`: the catch-all route.
    pub route: Option<String>,
    /// The cluster keys leave.
    pub from: String,
    /// The cluster keys go to.
    pub to: String,
    /// The mover's `--rate`.
    pub rate: Option<u64>,
    /// The mover's `--bytes-rate`.
    pub bytes_rate: Option<u64>,
    /// The mover's `--max-key-bytes`.
    #[serde(default)]
    pub max_key_bytes: Option<u64>,
    /// How long a phase waits for every sidecar's ACK, in milliseconds.
    pub ack_timeout_ms: u64,
    /// Nodes not waited for.
    #[serde(default)]
    pub ignore_nodes: Vec<String>,
    /// The step reached.
    pub phase: Phase,
    /// Set by `abort`: the phases run again from `to` back to `from`, and end with
    /// [`State::original`] applied.
    #[serde(default)]
    pub aborting: bool,
    /// Every configuration applied, oldest first.
    #[serde(default)]
    pub applied: Vec<Applied>,
    /// The plan's figures, for the ETA.
    #[serde(default)]
    pub plan: Option<PlanFigures>,
    /// The process driving the phases, while one runs.
    #[serde(default)]
    pub driver_pid: Option<u32>,
    /// The mover, while one runs.
    #[serde(default)]
    pub mover_pid: Option<u32>,
    /// The mover's last progress line.
    #[serde(default)]
    pub progress: Option<String>,
    /// The mover's last summary line.
    #[serde(default)]
    pub summary: Option<String>,
    /// Why the last run stopped before the end.
    #[serde(default)]
    pub stopped: Option<String>,
    /// Move mode or copy mode.
    #[serde(default)]
    pub mode: Mode,
    /// Copy mode's steps.
    #[serde(default)]
    pub copy: CopyState,
}

impl State {
    /// The step reached, as `status` names it.
    pub fn describe(&self) -> &'static str {
        match self.mode {
            Mode::Move => self.phase.describe(),
            Mode::Copy => self.copy.phase.describe(),
        }
    }

    /// The route this reshard moves.
    pub fn route_ref(&self) -> RouteRef {
        RouteRef {
            listener: self.listener.clone(),
            prefix: self.route.clone(),
        }
    }

    /// The direction keys move in now: `(from, to)`, swapped while aborting.
    pub fn direction(&self) -> (&str, &str) {
        if self.aborting {
            (&self.to, &self.from)
        } else {
            (&self.from, &self.to)
        }
    }

    /// Reads STATE.
    ///
    /// # Errors
    /// It cannot be read or is not a state file.
    pub fn load(path: &Path) -> Result<State, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Writes STATE atomically (a temporary file renamed over it).
    ///
    /// # Errors
    /// It cannot be written.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        write_private(path, &format!("{text}\n"))
    }
}

/// Writes `text` to `path` through a temporary file renamed over it, readable by its owner
/// only (the files may carry the clusters' passwords).
///
/// # Errors
/// It cannot be written.
pub fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = sibling(path, ".tmp");
    let e = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(e)?;
    f.write_all(text.as_bytes()).map_err(e)?;
    f.sync_all().map_err(e)?;
    std::fs::rename(&tmp, path).map_err(e)
}

/// `path` with `suffix` appended to its file name: the files kept next to STATE.
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// The mover's checkpoint for the current direction.
pub fn checkpoint(path: &Path, aborting: bool) -> PathBuf {
    sibling(
        path,
        if aborting {
            ".reverse.checkpoint"
        } else {
            ".checkpoint"
        },
    )
}

/// The mover's configuration.
pub fn mover_config(path: &Path) -> PathBuf {
    sibling(path, ".mover.yaml")
}

/// The keys copy mode checks again (hex, one per line).
pub fn keys_file(path: &Path) -> PathBuf {
    sibling(path, ".keys")
}

/// The configuration copy mode's respway-compare runs read: both clusters, the route on
/// the side that answers at that step.
pub fn compare_config(path: &Path) -> PathBuf {
    sibling(path, ".compare.yaml")
}

/// The marker `pause` leaves for the driver: stop after the current step.
pub fn pause_marker(path: &Path) -> PathBuf {
    sibling(path, ".pause")
}

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
}

impl State {
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

/// The marker `pause` leaves for the driver: stop after the current step.
pub fn pause_marker(path: &Path) -> PathBuf {
    sibling(path, ".pause")
}

//! `respway-xds reshard`: an online move of a route's keys from one cluster to another in
//! move mode, driven phase by phase through the management server.
//!
//! ```text
//! 0 plan          the mover's --plan: keys and bytes that move, per shard; asks to go on
//! 1 prepare_move  RES.yaml with the route's mirror to `to` in prepare_move; every sidecar ACKs
//! 2 move mode     the same mirror in move; every sidecar ACKs
//! 3 move keys     respway-compare --move (checkpointed), to its end with nothing failed
//! 4 final         RES.yaml with the route on `to` and no mirror, applied; every sidecar ACKs
//! ```
//!
//! STATE.json ([`state`]) records the phase reached and the applied generations after every
//! step: a rerun continues there. A phase's ACK wait ([`acks`]) reads `GET /status`: every node
//! must have caught up with the applied generation and ACKed its listeners. An abort runs the
//! same phases from `to` back to `from` and ends with RES.yaml as it was.
//!
//! - `edit`: the files pushed, derived from RES.yaml's YAML value, and the mover's config;
//! - `state`: STATE.json and the files next to it (checkpoint, mover config, pause marker);
//! - `acks`: the gate between phases;
//! - `mover`: the mover as a child process (plan, run, progress);
//! - `copy`: copy mode's steps; `compare`: its respway-compare runs; `sidecars`: what it
//!   asks the sidecars' admin endpoints;
//! - `progress`: the mover's lines read back, and the progress bar;
//! - `metrics`: `--metrics ADDR`, the phase and the mover's counters in Prometheus's format
//!   while the run lasts.

pub mod acks;
mod compare;
mod copy;
mod edit;
mod metrics;
mod mover;
mod progress;
mod sidecars;
mod state;
mod verbs;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::admin::{self, AdminAuth, AdminError};
pub use edit::RouteRef;
pub use metrics::{Figures, Metrics};
pub use state::{CopyPhase, Mode, Phase, State};
pub use verbs::{abort, pause, status};

/// Where the command writes: results on stdout, the mover's complaints on stderr, and its
/// figures to the `--metrics` endpoint when one serves.
#[derive(Debug, Default)]
pub struct Out {
    metrics: Option<Metrics>,
}

impl Out {
    /// Serves `GET /metrics` on `addr` (`--metrics`) until this is dropped; the address bound.
    ///
    /// # Errors
    /// `addr` cannot be bound.
    pub async fn serve_metrics(&mut self, addr: &str) -> Result<std::net::SocketAddr, String> {
        let m = Metrics::serve(addr).await?;
        let bound = m.local_addr();
        self.metrics = Some(m);
        Ok(bound)
    }

    /// With `--metrics`: keeps serving the last figures for `d` (`--metrics-linger`), so that
    /// a scrape sees how the run ended.
    pub async fn linger(&self, d: Duration) {
        if self.metrics.is_some() && !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// Shows the figures of `st` on the metrics endpoint, if one serves.
    fn track(&self, st: &State) {
        if let Some(m) = &self.metrics {
            m.track(st);
        }
    }

    /// Copy mode's steps are not in the metrics: `--metrics` is refused for them.
    fn metrics_for(&self, mode: Mode) -> Result<(), Stop> {
        if self.metrics.is_some() && mode == Mode::Copy {
            return Err(Stop::Usage(
                "--metrics follows move mode's phases and mover; copy mode (--copy) has none \
                 of them: run it without --metrics"
                    .to_string(),
            ));
        }
        Ok(())
    }

    fn say(&mut self, line: &str) {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{line}");
        let _ = o.flush();
    }

    fn warn(&mut self, line: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every phase is done.
    Done,
    /// Paused (`pause`); a rerun continues.
    Paused,
}

/// Why a command stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// A wrong argument or file; nothing was done.
    Usage(String),
    /// A phase could not complete; STATE says why and a rerun continues.
    Failed(String),
}

/// `reshard start`'s arguments.
#[derive(Debug, Clone)]
pub struct Start {
    /// The management server's admin address.
    pub admin: String,
    /// Its credentials.
    pub auth: AdminAuth,
    /// The resource files: those defining the route's listener are edited and applied (each
    /// under its file name); the mover reads the clusters from any of them.
    pub files: Vec<PathBuf>,
    /// The route moved.
    pub route: RouteRef,
    /// From this cluster.
    pub from: String,
    /// To this one.
    pub to: String,
    /// STATE.json.
    pub state: PathBuf,
    /// The mover's keys per second.
    pub rate: Option<u64>,
    /// The mover's bytes per second.
    pub bytes_rate: Option<u64>,
    /// The mover's largest key moved.
    pub max_key_bytes: Option<u64>,
    /// Go on without asking after the plan.
    pub yes: bool,
    /// How long each phase waits for every ACK.
    pub ack_timeout: Duration,
    /// Nodes not waited for.
    pub ignore_nodes: Vec<String>,
    /// Move mode or copy mode.
    pub mode: Mode,
    /// Copy mode: stop once writes resumed on `to` (see [`state::CopyState::hold`]).
    pub hold: bool,
}

/// `reshard start`: a new reshard, or the one STATE records (when it is the same one).
///
/// # Errors
/// See [`Stop`].
pub async fn start(a: Start, out: &mut Out) -> Result<Outcome, Stop> {
    out.metrics_for(a.mode)?;
    if a.state.exists() {
        let st = State::load(&a.state).map_err(Stop::Usage)?;
        let same = st.from == a.from
            && st.to == a.to
            && st.mode == a.mode
            && st.listener == a.route.listener
            && st.route == a.route.prefix;
        if !same {
            return Err(Stop::Usage(format!(
                "{} records another reshard ({} from {} to {}); use another --state",
                a.state.display(),
                st.route_ref(),
                st.from,
                st.to
            )));
        }
        out.say(&format!(
            "resuming from {}: phase {}",
            a.state.display(),
            st.describe()
        ));
        return drive(st, &a.state, &a.auth, out).await;
    }
    let mut texts = Vec::new();
    let mut files = Vec::new();
    for path in &a.files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Stop::Usage(format!("{}: {e}", path.display())))?;
        if edit::has_listener(&text, &a.route.listener) {
            edit::check_start(&text, &a.route, &a.from, &a.to)
                .map_err(|e| Stop::Usage(format!("{}: {e}", path.display())))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if files.iter().any(|f: &state::ResFile| f.name == name) {
                return Err(Stop::Usage(format!(
                    "two --file are named {name}: the server's directory holds one"
                )));
            }
            files.push(state::ResFile {
                path: path.clone(),
                name,
                original: text.clone(),
            });
        }
        texts.push(text);
    }
    if files.is_empty() {
        return Err(Stop::Usage(format!(
            "no --file defines listener {:?}",
            a.route.listener
        )));
    }
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mover_config = edit::mover_config(&texts, &a.from, &a.to).map_err(Stop::Usage)?;
    state::write_private(&state::mover_config(&a.state), &mover_config).map_err(Stop::Usage)?;
    let mut st = State {
        admin: a.admin.clone(),
        files,
        listener: a.route.listener.clone(),
        route: a.route.prefix.clone(),
        from: a.from.clone(),
        to: a.to.clone(),
        rate: a.rate,
        bytes_rate: a.bytes_rate,
        max_key_bytes: a.max_key_bytes,
        ack_timeout_ms: u64::try_from(a.ack_timeout.as_millis()).unwrap_or(u64::MAX),
        ignore_nodes: a.ignore_nodes.clone(),
        phase: Phase::Planned,
        aborting: false,
        applied: Vec::new(),
        plan: None,
        driver_pid: None,
        mover_pid: None,
        progress: None,
        summary: None,
        stopped: None,
        mode: a.mode,
        copy: state::CopyState {
            hold: a.hold,
            ..Default::default()
        },
    };
    let program = mover::program();
    let flags = mover::Flags::probe(&program).await.map_err(Stop::Usage)?;
    out.track(&st);
    out.say(&format!(
        "phase 0/{}: plan of the {} of {} from {} to {}",
        if a.mode == Mode::Copy { 7 } else { 4 },
        if a.mode == Mode::Copy { "copy" } else { "move" },
        a.route,
        a.from,
        a.to
    ));
    st.plan = mover::plan(&program, flags, &st, &a.state, out)
        .await
        .map_err(Stop::Failed)?;
    if !a.yes && !confirm(a.mode).await? {
        return Err(Stop::Usage("not started: nothing was pushed".to_string()));
    }
    st.save(&a.state).map_err(Stop::Failed)?;
    drive(st, &a.state, &a.auth, out).await
}

/// Asks on the terminal whether to go on.
async fn confirm(mode: Mode) -> Result<bool, Stop> {
    use std::io::IsTerminal as _;
    if !std::io::stdin().is_terminal() {
        return Err(Stop::Usage(
            "stdin is not a terminal: pass --yes to start without asking".to_string(),
        ));
    }
    let mut o = std::io::stdout().lock();
    let _ = write!(
        o,
        "go on ({}, to every sidecar)? [y/N] ",
        if mode == Mode::Copy {
            "push dual write, backfill, pause writes briefly, cut over, clean up"
        } else {
            "push prepare_move, then move mode"
        }
    );
    let _ = o.flush();
    drop(o);
    let answer = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| Stop::Failed(e.to_string()))?
    .map_err(|e| Stop::Failed(e.to_string()))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// `reshard resume`: continues the reshard (or abort) STATE records.
///
/// # Errors
/// See [`Stop`].
pub async fn resume(path: &Path, auth: &AdminAuth, out: &mut Out) -> Result<Outcome, Stop> {
    let mut st = State::load(path).map_err(Stop::Usage)?;
    out.metrics_for(st.mode)?;
    // `--hold` stopped the run there: `resume` goes on to the end.
    if st.copy.phase == CopyPhase::ResumeAcked {
        st.copy.hold = false;
    }
    out.say(&format!(
        "resuming from {}: phase {}{}",
        path.display(),
        st.describe(),
        if st.aborting { " (aborting)" } else { "" }
    ));
    drive(st, path, auth, out).await
}

/// Runs the phases from the one STATE records; STATE says why when it stops.
async fn drive(
    mut st: State,
    path: &Path,
    auth: &AdminAuth,
    out: &mut Out,
) -> Result<Outcome, Stop> {
    if let Some(pid) = st.driver_pid.filter(|p| *p != std::process::id()) {
        if verbs::alive(pid, "respway-xds") {
            return Err(Stop::Usage(format!(
                "another reshard run (pid {pid}) drives {} now",
                path.display()
            )));
        }
    }
    if let Some(pid) = st.mover_pid.take() {
        verbs::stop_mover(pid, out).await;
    }
    let _ = std::fs::remove_file(state::pause_marker(path));
    st.driver_pid = Some(std::process::id());
    st.stopped = None;
    // The last push is pushed again and waited for again: the server may have restarted (its
    // generations too), and the mover never runs before the gate. Move mode may follow once
    // every sidecar had prepare_move (a sidecar restarted since gets what is served).
    st.phase = match st.phase {
        Phase::PreparePushed => Phase::Planned,
        Phase::MovePushed | Phase::MoveAcked => Phase::PrepareAcked,
        Phase::FinalPushed => Phase::Moved,
        p => p,
    };
    st.copy.phase = copy::rerun_from(st.copy.phase);
    st.save(path).map_err(Stop::Failed)?;
    out.track(&st);
    let result = match st.mode {
        Mode::Move => phases(&mut st, path, auth, out).await,
        Mode::Copy => copy::phases(&mut st, path, auth, out).await,
    };
    st.driver_pid = None;
    if let Err(Stop::Failed(why) | Stop::Usage(why)) = &result {
        st.stopped = Some(why.clone());
    }
    st.save(path).map_err(Stop::Failed)?;
    out.track(&st);
    if let Err(Stop::Failed(_)) = &result {
        out.say(&format!(
            "stopped; `respway-xds reshard resume --state {}` continues from here",
            path.display()
        ));
    }
    result
}

async fn phases(
    st: &mut State,
    path: &Path,
    auth: &AdminAuth,
    out: &mut Out,
) -> Result<Outcome, Stop> {
    let timeout = Duration::from_millis(st.ack_timeout_ms);
    let route = st.route_ref();
    loop {
        out.track(st);
        if state::pause_marker(path).exists() && st.phase != Phase::Done {
            out.say("paused");
            return Ok(Outcome::Paused);
        }
        let (from, to) = {
            let (f, t) = st.direction();
            (f.to_string(), t.to_string())
        };
        match st.phase {
            Phase::Planned | Phase::PrepareAcked => {
                let prepare = st.phase == Phase::Planned;
                let mode = if prepare { "prepare_move" } else { "move" };
                let mut texts = Vec::new();
                for f in &st.files {
                    let text = edit::with_route(&f.original, &route, &from, Some((&to, mode)))
                        .map_err(Stop::Failed)?;
                    texts.push((f.name.clone(), text));
                }
                let step = match (st.aborting, prepare) {
                    (false, true) => "prepare",
                    (false, false) => "move",
                    (true, true) => "reverse prepare",
                    (true, false) => "reverse move",
                };
                let v = apply(st, auth, step, texts).await?;
                out.say(&if prepare {
                    format!(
                        "phase 1/4: prepare_move pushed ({route}: {from}; commands on keys moving \
                         to {to} refused until every sidecar moves keys), serving version {v}"
                    )
                } else {
                    format!(
                        "phase 2/4: move mode pushed ({route}: {from}, keys moving to {to}), \
                         serving version {v}"
                    )
                });
                st.phase = if prepare {
                    Phase::PreparePushed
                } else {
                    Phase::MovePushed
                };
            }
            Phase::PreparePushed | Phase::MovePushed | Phase::FinalPushed => {
                let v = st.applied.last().map_or(0, |a| a.version);
                let acked = acks::wait(&st.admin, auth, v, timeout, &st.ignore_nodes).await;
                let n = match acked {
                    Ok(n) => n,
                    // Phase 1 not ACKed by every sidecar: those that did refuse every command
                    // on a moving key, and nothing has moved, so the push is taken back.
                    Err(e) if st.phase == Phase::PreparePushed && !st.aborting => {
                        return Err(roll_back_prepare(
                            st,
                            auth,
                            &route.to_string(),
                            &from,
                            &e.to_string(),
                            out,
                        )
                        .await);
                    }
                    Err(e) => return Err(Stop::Failed(e.to_string())),
                };
                if let Some(a) = st.applied.last_mut() {
                    a.acked = true;
                }
                out.say(&format!("every sidecar ACKed version {v} ({n} nodes)"));
                st.phase = match st.phase {
                    Phase::PreparePushed => Phase::PrepareAcked,
                    Phase::MovePushed => Phase::MoveAcked,
                    _ => Phase::Done,
                };
            }
            Phase::MoveAcked => {
                out.say(&format!("phase 3/4: moving the keys from {from} to {to}"));
                let program = mover::program();
                let flags = mover::Flags::probe(&program).await.map_err(Stop::Failed)?;
                match mover::run(&program, flags, st, path, out)
                    .await
                    .map_err(Stop::Failed)?
                {
                    mover::Ended::Done => st.phase = Phase::Moved,
                    mover::Ended::Paused => {
                        out.say("paused: the mover's checkpoint keeps its place");
                        return Ok(Outcome::Paused);
                    }
                    mover::Ended::Failed(why) => return Err(Stop::Failed(why)),
                }
            }
            Phase::Moved => {
                let mut texts = Vec::new();
                for f in &st.files {
                    let text = if st.aborting {
                        f.original.clone()
                    } else {
                        edit::with_route(&f.original, &route, &to, None).map_err(Stop::Failed)?
                    };
                    texts.push((f.name.clone(), text));
                }
                let step = if st.aborting { "restore" } else { "final" };
                let v = apply(st, auth, step, texts).await?;
                out.say(&format!(
                    "phase 4/4: {} pushed ({route} on {to}, no mirror), serving version {v}",
                    if st.aborting {
                        "the original files"
                    } else {
                        "the final configuration"
                    }
                ));
                st.phase = Phase::FinalPushed;
            }
            Phase::Done => {
                out.say(&if st.aborting {
                    format!("aborted: {route} is on {to} again, every key back on it")
                } else {
                    format!("done: {route} is on {to}, every key moved")
                });
                return Ok(Outcome::Done);
            }
        }
        st.save(path).map_err(Stop::Failed)?;
    }
}

/// Phase 1's gate failed (`why`): the files are served again as they were (the route on
/// `from`, no mirror), so the sidecars that ACKed `prepare_move` stop refusing the commands on
/// the keys that would move; the reshard goes back to its plan (`resume` pushes phase 1
/// again). The stop says so, or, when the files cannot be served again, that the sidecars
/// that ACKed still refuse those commands and what to run.
async fn roll_back_prepare(
    st: &mut State,
    auth: &AdminAuth,
    route: &str,
    from: &str,
    why: &str,
    out: &mut Out,
) -> Stop {
    let texts = st
        .files
        .iter()
        .map(|f| (f.name.clone(), f.original.clone()))
        .collect();
    match apply(st, auth, "roll back prepare", texts).await {
        Ok(v) => {
            st.phase = Phase::Planned;
            out.say(&format!(
                "phase 1/4 rolled back: the original files pushed again ({route} on {from}, no \
                 mirror), serving version {v}; no sidecar refuses commands for this reshard"
            ));
            Stop::Failed(format!(
                "{why}\nphase 1 was rolled back (version {v}: {route} on {from}, no mirror); \
                 once every sidecar is connected and takes the configuration, `respway-xds \
                 reshard resume` pushes phase 1 again"
            ))
        }
        Err(Stop::Failed(e) | Stop::Usage(e)) => Stop::Failed(format!(
            "{why}\nthe roll back of phase 1 failed ({e}): the sidecars that ACKed \
             prepare_move refuse (TRYAGAIN) every command on a key moving off {from} until \
             `respway-xds reshard abort` or `resume` runs"
        )),
    }
}

/// Applies each `(name, text)`, one after the other; records the last generation.
async fn apply(
    st: &mut State,
    auth: &AdminAuth,
    step: &str,
    texts: Vec<(String, String)>,
) -> Result<u64, Stop> {
    let mut v = 0;
    for (name, text) in texts {
        v = admin::apply(&st.admin, auth, &name, &text)
            .await
            .map_err(|e| match e {
                AdminError::Refused(errors) => Stop::Failed(format!(
                    "the server refused the {step} configuration of {name}:\n{}",
                    errors.join("\n")
                )),
                e => Stop::Failed(e.to_string()),
            })?;
    }
    st.applied.push(state::Applied {
        step: step.to_string(),
        version: v,
        acked: false,
    });
    Ok(v)
}

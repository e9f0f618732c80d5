//! `status`, `pause` and `abort`, and the processes STATE names (the driver, the mover).

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

use super::progress::Progress;
use super::state::{self, Phase, State};
use super::{acks, drive, Out, Outcome, Stop};
use crate::admin::{self, AdminAuth};

/// Whether process `pid` runs and is `name` (its command line names it): a pid in STATE may
/// have been reused since.
pub(super) fn alive(pid: u32, name: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(name))
}

fn signal(pid: u32) -> bool {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    kill_process(p, Signal::TERM).is_ok()
}

/// Waits until process `pid` (named `name`) is gone, for at most `limit`.
async fn gone(pid: u32, name: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid, name) {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// Stops a mover an earlier run left behind (its driver died), so that one mover runs.
pub(super) async fn stop_mover(pid: u32, out: &mut Out) {
    if alive(pid, "respway-compare") && signal(pid) {
        out.say(&format!(
            "stopping the mover an earlier run left (pid {pid})"
        ));
        gone(pid, "respway-compare", Duration::from_secs(30)).await;
    }
}

/// `reshard status`: the phase, the applied versions, the nodes' ACKs of the latest, and the
/// mover's last progress.
///
/// # Errors
/// STATE cannot be read.
pub async fn status(path: &Path, auth: &AdminAuth, out: &mut Out) -> Result<(), Stop> {
    let st = State::load(path).map_err(Stop::Usage)?;
    let (from, to) = st.direction();
    let names: Vec<&str> = st.files.iter().map(|f| f.name.as_str()).collect();
    out.say(&format!(
        "{}: {} from {from} to {to}{}",
        names.join(", "),
        st.route_ref(),
        if st.aborting {
            " (aborting: moving keys back)"
        } else {
            ""
        }
    ));
    out.say(&format!("phase {}", st.describe()));
    if let Some(ms) = st.copy.pause_ms {
        out.say(&format!("write pause: {ms} ms"));
    }
    for a in &st.applied {
        out.say(&format!(
            "applied {}: version {}{}",
            a.step,
            a.version,
            if a.acked {
                ", ACKed by every sidecar"
            } else {
                ""
            }
        ));
    }
    match st.driver_pid.filter(|p| alive(*p, "respway-xds")) {
        Some(pid) => out.say(&format!("running: pid {pid}")),
        None => out.say("running: no"),
    }
    if let Some(pid) = st.mover_pid.filter(|p| alive(*p, "respway-compare")) {
        out.say(&format!("mover running: pid {pid}"));
    }
    if let Some(p) = st.progress.as_deref().and_then(Progress::parse) {
        out.say(&format!("last progress: {}", p.line(st.plan.as_ref())));
    }
    if let Some(s) = &st.summary {
        out.say(&format!("last mover summary: {s}"));
    }
    if let Some(why) = &st.stopped {
        out.say(&format!("stopped: {why}"));
    }
    let Some(last) = st.applied.last() else {
        return Ok(());
    };
    match admin::fetch_status(&st.admin, auth).await {
        Ok(s) => {
            for (id, a) in acks::acks(&s, last.version, &st.ignore_nodes) {
                let what = match a {
                    acks::NodeAck::Acked => format!("ACKed version {}", last.version),
                    acks::NodeAck::Pending(why) => format!("waiting: {why}"),
                    acks::NodeAck::Nacked(m) => format!("NACKed: {m}"),
                };
                out.say(&format!("node {id}: {what}"));
            }
        }
        Err(e) => out.say(&format!("server: {e}")),
    }
    Ok(())
}

/// `reshard pause`: stops the running mover (its checkpoint keeps its place) and the run after
/// its current step.
///
/// # Errors
/// STATE cannot be read.
pub async fn pause(path: &Path, out: &mut Out) -> Result<(), Stop> {
    let st = State::load(path).map_err(Stop::Usage)?;
    state::write_private(&state::pause_marker(path), "pause\n").map_err(Stop::Failed)?;
    let driver = st.driver_pid.filter(|p| alive(*p, "respway-xds"));
    let mover = st.mover_pid.filter(|p| alive(*p, "respway-compare"));
    if let Some(pid) = mover {
        signal(pid);
        gone(pid, "respway-compare", Duration::from_secs(30)).await;
        out.say(&format!(
            "paused: the mover (pid {pid}) is stopped; its checkpoint keeps its place"
        ));
    } else if let Some(pid) = driver {
        out.say(&format!(
            "paused: the run (pid {pid}) stops after its current step"
        ));
    } else {
        out.say(&format!("nothing runs; phase {}", st.describe()));
    }
    if let Some(pid) = driver {
        gone(pid, "respway-xds", Duration::from_secs(60)).await;
    }
    out.say(&format!(
        "`respway-xds reshard resume --state {}` continues",
        path.display()
    ));
    Ok(())
}

/// `reshard abort`: stops a running reshard, then runs the phases back from `to` to `from`
/// (move mode towards `from`, the mover, then the original file), since keys already moved are
/// on `to`.
///
/// # Errors
/// See [`Stop`].
pub async fn abort(path: &Path, auth: &AdminAuth, out: &mut Out) -> Result<Outcome, Stop> {
    let st = State::load(path).map_err(Stop::Usage)?;
    out.metrics_for(st.mode)?;
    if st.aborting {
        return drive(st, path, auth, out).await;
    }
    if st.mode == state::Mode::Copy {
        if st.driver_pid.is_some_and(|p| alive(p, "respway-xds")) || st.mover_pid.is_some() {
            pause(path, out).await?;
        }
        let st = State::load(path).map_err(Stop::Usage)?;
        let _ = std::fs::remove_file(state::pause_marker(path));
        return super::copy::abort(st, path, auth, out).await;
    }
    let route = st.route_ref();
    if matches!(st.phase, Phase::Done) {
        return Err(Stop::Usage(format!(
            "the reshard is done: {route} is on {}. To move its keys back, start another one \
             from files with the route on {}: respway-xds reshard start --admin {} --file \
             FILE... --listener {}{} --from {} --to {} --state OTHER.json",
            st.to,
            st.to,
            st.admin,
            st.listener,
            st.route
                .as_ref()
                .map(|p| format!(" --route {p}"))
                .unwrap_or_default(),
            st.to,
            st.from
        )));
    }
    if st.driver_pid.is_some_and(|p| alive(p, "respway-xds")) || st.mover_pid.is_some() {
        pause(path, out).await?;
    }
    let mut st = State::load(path).map_err(Stop::Usage)?;
    let _ = std::fs::remove_file(state::pause_marker(path));
    if st.phase == Phase::Planned && st.applied.is_empty() {
        st.aborting = true;
        st.phase = Phase::Done;
        st.save(path).map_err(Stop::Failed)?;
        out.track(&st);
        out.say("aborted: nothing had been pushed");
        return Ok(Outcome::Done);
    }
    out.say(&format!(
        "aborting: keys already moved are on {to}; they move back to {from} (prepare_move, then \
         move mode from {to} to {from}, then `respway-compare --config {} --source {to} --target \
         {from} --move`), then {} pushed as they were",
        state::mover_config(path).display(),
        st.files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        from = st.from,
        to = st.to
    ));
    st.aborting = true;
    st.phase = Phase::Planned;
    st.summary = None;
    st.progress = None;
    st.save(path).map_err(Stop::Failed)?;
    drive(st, path, auth, out).await
}

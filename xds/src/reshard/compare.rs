//! The respway-compare runs of copy mode ([`super::copy`]): the backfill, the checks of the
//! written keys, the cleanup, each over the route's scope, with its stdout shown and (when it
//! may be paused) its pid in STATE.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

use super::state::{self, State};
use super::{mover, Out, Stop};

/// How a respway-compare run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ran {
    /// Its exit code (a signal counts as 3).
    Exit(i32),
    /// Stopped by `pause`.
    Paused,
}

/// `--rate` for the runs that walk keys: the reshard's, else no limit.
pub(super) fn rate_args(st: &State) -> Vec<String> {
    vec!["--rate".to_string(), st.rate.unwrap_or(0).to_string()]
}

/// The route's scope for respway-compare: only its keys ([`edit::scope`]).
fn scope_args(st: &State) -> Result<Vec<String>, Stop> {
    mover::scope(st).map(|s| s.args()).map_err(Stop::Failed)
}

/// Checks `keys` (hex) again: respway-compare `--keys STATE.keys` with `extra`.
pub(super) async fn check_keys(
    st: &mut State,
    path: &Path,
    out: &mut Out,
    label: &str,
    keys: &BTreeSet<String>,
    mut extra: Vec<String>,
    pausable: bool,
) -> Result<Ran, Stop> {
    let file = state::keys_file(path);
    let mut text = String::with_capacity(keys.len() * 16);
    for k in keys {
        text.push_str(k);
        text.push('\n');
    }
    state::write_private(&file, &text).map_err(Stop::Failed)?;
    extra.extend(["--keys".to_string(), file.display().to_string()]);
    compare(st, path, out, label, extra, pausable).await
}

/// Runs respway-compare over the direction's clusters (the route's scope) with `extra`; its
/// stdout is shown prefixed with `label`. `pausable`: its pid is kept in STATE, so `pause`
/// stops it.
pub(super) async fn compare(
    st: &mut State,
    path: &Path,
    out: &mut Out,
    label: &str,
    extra: Vec<String>,
    pausable: bool,
) -> Result<Ran, Stop> {
    let program = mover::program();
    let (from, to) = st.direction();
    // The configuration respway-compare checks its gates against: the route on the side
    // that answers now (the source; after the cut-over, for the cleanup, the target).
    let config = state::compare_config(path);
    let cleanup = extra.iter().any(|a| a == "--cleanup");
    write_compare_yaml(path, if cleanup { to } else { from }).map_err(Stop::Failed)?;
    let mut a = vec![
        "--config".to_string(),
        config.display().to_string(),
        "--source".to_string(),
        from.to_string(),
        "--target".to_string(),
        to.to_string(),
        "--max-mismatches".to_string(),
        "20".to_string(),
    ];
    a.extend(scope_args(st)?);
    a.extend(extra);
    out.say(&format!("{label}: {} {}", program.display(), a.join(" ")));
    let mut child = Command::new(&program)
        .args(&a)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| Stop::Failed(format!("cannot run {}: {e}", program.display())))?;
    if pausable {
        st.mover_pid = child.id();
        st.save(path).map_err(Stop::Failed)?;
    }
    if let Some(stdout) = child.stdout.take() {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            out.say(&format!("{label}: {l}"));
        }
    }
    let status = child
        .wait()
        .await
        .map_err(|e| Stop::Failed(format!("waiting for {}: {e}", program.display())))?;
    st.mover_pid = None;
    if status.signal().is_some() && state::pause_marker(path).exists() {
        out.say(&format!("paused: {label} stopped; `resume` runs it again"));
        return Ok(Ran::Paused);
    }
    Ok(Ran::Exit(status.code().unwrap_or(3)))
}

/// respway-compare's configuration: the mover's (both clusters) with the route on
/// `answering`. Its own gates read it: `--repair` is refused when the route answers from the
/// target, `--cleanup` while it sends to the source; the driver runs each at the step where
/// the served configuration agrees (the cleanup once the final one, which no longer sends to
/// the source, is ACKed by every sidecar).
fn write_compare_yaml(path: &Path, answering: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(state::mover_config(path))
        .map_err(|e| format!("{}: {e}", state::mover_config(path).display()))?;
    let mut doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    let routes = doc
        .get_mut("listeners")
        .and_then(|l| l.get_mut(0))
        .and_then(|l| l.get_mut("routes"))
        .and_then(serde_yaml_ng::Value::as_mapping_mut)
        .ok_or("the mover's configuration has no listener")?;
    routes.insert("catch_all".into(), answering.into());
    let text = serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string())?;
    state::write_private(&state::compare_config(path), &text)
}

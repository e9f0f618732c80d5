//! The background mover as a child process: `respway-compare --move`, found next to this
//! executable or on `PATH`. Its optional flags (`--plan`, `--checkpoint`, `--progress`,
//! `--bytes-rate`) are passed only when its `--help` lists them. The mover walks every key of
//! `--from`: when other routes of the listener send there too, it is told the route's scope
//! ([`edit::scope`]: `--prefix`, `--skip-prefix`, `--ignore-case`), and a mover without those
//! flags is not run (it would move the other routes' keys out of their reach).

use std::io::{IsTerminal as _, Write as _};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

use super::edit;
use super::progress::{self, Progress};
use super::state::{self, PlanFigures, State};
use super::Out;

/// The mover's program: `respway-compare` next to the current executable, else on `PATH`.
pub fn program() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("respway-compare")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("respway-compare"))
}

/// Which optional flags the mover has.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flags {
    plan: bool,
    checkpoint: bool,
    progress: bool,
    bytes_rate: bool,
    max_key_bytes: bool,
    prefix: bool,
    skip_prefix: bool,
    ignore_case: bool,
}

impl Flags {
    /// Asks the mover's `--help`.
    ///
    /// # Errors
    /// The mover cannot be run.
    pub async fn probe(program: &Path) -> Result<Flags, String> {
        let out = Command::new(program)
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("cannot run the mover {}: {e}", program.display()))?;
        let help = String::from_utf8_lossy(&out.stdout);
        let has = |flag: &str| help.split_whitespace().any(|w| w == flag);
        Ok(Flags {
            plan: has("--plan"),
            checkpoint: has("--checkpoint"),
            progress: has("--progress"),
            bytes_rate: has("--bytes-rate"),
            max_key_bytes: has("--max-key-bytes"),
            prefix: has("--prefix"),
            skip_prefix: has("--skip-prefix"),
            ignore_case: has("--ignore-case"),
        })
    }
}

/// The scope of the route `st` moves, read from its files as they were when the reshard
/// started (both directions move the same keys).
///
/// # Errors
/// A file cannot be read as YAML or does not scope the route ([`edit::scope`]).
pub(super) fn scope(st: &State) -> Result<edit::Scope, String> {
    let texts: Vec<&str> = st.files.iter().map(|f| f.original.as_str()).collect();
    edit::scope(&texts, &st.route_ref())
}

/// The mover's arguments for the current direction of `st`: `--plan` instead of
/// `--checkpoint` when `plan` (the plan moves nothing and must not start a checkpoint).
///
/// # Errors
/// The route has a scope ([`scope`]) and this mover cannot be told it.
fn args(st: &State, path: &Path, flags: Flags, plan: bool) -> Result<Vec<String>, String> {
    let (from, to) = st.direction();
    let mut a = vec![
        "--config".to_string(),
        state::mover_config(path).display().to_string(),
        "--source".to_string(),
        from.to_string(),
        "--target".to_string(),
        to.to_string(),
        "--move".to_string(),
    ];
    // The mover's own speed unless --rate slows it (the mover's default, 5,000 keys/s, is
    // a comparison's).
    a.extend(["--rate".to_string(), st.rate.unwrap_or(0).to_string()]);
    if let (Some(b), true) = (st.bytes_rate, flags.bytes_rate) {
        a.extend(["--bytes-rate".to_string(), b.to_string()]);
    }
    if let (Some(b), true) = (st.max_key_bytes, flags.max_key_bytes) {
        a.extend(["--max-key-bytes".to_string(), b.to_string()]);
    }
    let scope = scope(st)?;
    for (flag, needed, has) in [
        ("--prefix", scope.prefix.is_some(), flags.prefix),
        ("--skip-prefix", !scope.skip.is_empty(), flags.skip_prefix),
        (
            "--ignore-case",
            scope.ignore_case && !scope.is_all(),
            flags.ignore_case,
        ),
    ] {
        if needed && !has {
            return Err(format!(
                "the mover has no {flag}: it would move every key of {from:?}, the keys of the \
                 other routes of listener {:?} too, where those routes do not read them; \
                 install the respway-compare of this respway-xds",
                st.listener
            ));
        }
    }
    a.extend(scope.args());
    if plan {
        a.push("--plan".to_string());
    } else if flags.checkpoint {
        a.extend([
            "--checkpoint".to_string(),
            state::checkpoint(path, st.aborting).display().to_string(),
        ]);
    }
    Ok(a)
}

/// Runs the mover with `--plan`, printing its table; its figures, or `None` when this mover
/// has no `--plan`.
///
/// # Errors
/// The mover failed, or cannot be told the route's scope.
pub async fn plan(
    program: &Path,
    flags: Flags,
    st: &State,
    path: &Path,
    out: &mut Out,
) -> Result<Option<PlanFigures>, String> {
    // Before anything is pushed: a mover that cannot be told the route's scope never runs.
    let a = args(st, path, flags, true)?;
    let scope = scope(st)?;
    if !scope.is_all() {
        out.say(&format!(
            "scope: the mover moves only {} (the other routes' keys stay where they are)",
            scope.describe()
        ));
    }
    if !flags.plan {
        out.say("plan: this respway-compare has no --plan; no figures before the move");
        return Ok(None);
    }
    let output = Command::new(program)
        .args(&a)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run the mover {}: {e}", program.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut figures = None;
    for line in text.lines() {
        out.say(line);
        figures = progress::parse_plan(line).or(figures);
    }
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "the mover's plan failed ({}): {}",
            output.status,
            err.trim()
        ));
    }
    Ok(figures)
}

/// How a mover run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Exit 0 and `failed 0`.
    Done,
    /// Stopped by a signal after `pause` asked for it.
    Paused,
    /// Anything else, and why.
    Failed(String),
}

/// Runs the mover to its end, showing its progress, and keeping `st` (its pid, last progress
/// and summary lines) saved at `path`.
///
/// # Errors
/// The mover could not be started, or the state not written.
pub async fn run(
    program: &Path,
    flags: Flags,
    st: &mut State,
    path: &Path,
    out: &mut Out,
) -> Result<Ended, String> {
    let mut a = args(st, path, flags, false)?;
    if flags.progress {
        a.push("--progress".to_string());
    }
    out.say(&format!("mover: {} {}", program.display(), a.join(" ")));
    let mut child = Command::new(program)
        .args(&a)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the mover {}: {e}", program.display()))?;
    st.mover_pid = child.id();
    st.save(path)?;
    out.track(st);
    let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut stderr = BufReader::new(child.stderr.take().ok_or("no stderr")?).lines();
    let tty = std::io::stderr().is_terminal();
    let mut bar_shown = false;
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        tokio::select! {
            line = stdout.next_line(), if out_open => match line {
                Ok(Some(l)) => {
                    if progress::summary_failed(&l).is_some() {
                        st.summary = Some(l.clone());
                    }
                    end_bar(&mut bar_shown);
                    out.say(&format!("mover: {l}"));
                }
                _ => out_open = false,
            },
            line = stderr.next_line(), if err_open => match line {
                Ok(Some(l)) => match Progress::parse(&l) {
                    Some(p) => {
                        st.progress = Some(l.clone());
                        st.save(path)?;
                        out.track(st);
                        if tty {
                            let mut e = std::io::stderr().lock();
                            let _ = write!(e, "\r\x1b[2K{}", p.bar(st.plan.as_ref()));
                            let _ = e.flush();
                            bar_shown = true;
                        } else {
                            out.say(&p.line(st.plan.as_ref()));
                        }
                    }
                    None => {
                        end_bar(&mut bar_shown);
                        out.warn(&format!("mover: {l}"));
                    }
                },
                _ => err_open = false,
            },
        }
    }
    end_bar(&mut bar_shown);
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for the mover: {e}"))?;
    st.mover_pid = None;
    let paused = state::pause_marker(path).exists();
    let failed = st.summary.as_deref().and_then(progress::summary_failed);
    let big = st.summary.as_deref().and_then(progress::summary_big);
    let ended = match (status.code(), status.signal()) {
        (Some(0), _) if failed.unwrap_or(0) == 0 => Ended::Done,
        _ if paused => Ended::Paused,
        (Some(0), _) => Ended::Failed(format!("the mover exited 0 but reported {failed:?} failed")),
        (Some(1), _) if big.unwrap_or(0) > 0 && failed == Some(0) => Ended::Failed(format!(
            "the mover left {} keys above its --max-key-bytes where they are (listed above): \
             MIGRATE would block their shard while it sends them. Resume with a larger \
             --max-key-bytes at a quiet time (or delete them)",
            big.unwrap_or(0)
        )),
        (Some(1), _) => Ended::Failed(format!(
            "the mover could not move every key ({} failed batches, listed above); fix their \
             cause (BUSYKEY: the key is on both shards; IOERR: the shards cannot reach each \
             other), then resume",
            failed.map_or_else(|| "some".to_string(), |f| f.to_string())
        )),
        (Some(c), _) => Ended::Failed(format!(
            "the mover stopped with exit code {c} (2: usage or configuration, 3: a shard \
             could not be read or written); resume once its cause is fixed"
        )),
        (None, s) => Ended::Failed(format!(
            "the mover was killed (signal {})",
            s.map_or_else(|| "?".to_string(), |s| s.to_string())
        )),
    };
    st.save(path)?;
    out.track(st);
    Ok(ended)
}

fn end_bar(shown: &mut bool) {
    if std::mem::take(shown) {
        let _ = writeln!(std::io::stderr());
    }
}

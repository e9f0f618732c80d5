//! Copy mode driven end to end: a route's keys copied from cluster `from` to cluster `to`
//! (another deployment: nothing shared, no `MIGRATE` between them), each step an `apply`
//! waited for on every sidecar, as move mode's phases are.
//!
//! ```text
//! 1 dual write   the route on from, mirror { to, dual_write }: every write copied to `to`
//! 2 backfill     respway-compare --repair over the whole keyspace (the route's scope)
//! 3 catch up     the keys the sidecars' copies wrote since dual write began, checked again
//!                (respway-compare --keys), in rounds, until few are left
//! 4 write pause  mirror { to, read_only }: writes refused; every sidecar's copies drained
//!                (GET /mirror), then the keys written since the last round checked again,
//!                with --prune (a full pass when a record cannot say)
//! 5 cut-over     the route on to, mirror { from, read_only } (reads from `to`, writes still
//!                refused), then mirror { from, dual_write }: writes resume on `to`, copied
//!                to `from` for a rollback; the pause ends
//! 6 final        the route on to, no mirror
//! 7 cleanup      every copy drained, then respway-compare --cleanup --apply: each key of the
//!                scope left on `from` is deleted, whatever its value
//! ```
//!
//! The pause's length depends on the writes made during the last catch-up round, not on the
//! keyspace: each sidecar records the keys its copies wrote (its admin endpoint's
//! `/mirror/keys`, [`super::sidecars`]), and the driver keeps, per node, the record's id and
//! the cursor checked up to ([`RecordMark`]). A record replaced (a sidecar restarted), full
//! or missing a keyless write, or a node that announces no admin address, makes the pause
//! compare the whole keyspace instead.
//!
//! An abort before the cut-over pushes the original files (the route on `from`, which kept
//! every write) and deletes the copies from `to`; between the cut-over and the resumed writes
//! (nothing written since the check) it runs the cut-over back; once writes resumed on `to`
//! (copied to `from`) it runs steps 3 to 7 from `to` back to `from`. After the final
//! configuration it refuses: `from` no longer gets the writes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::compare::{check_keys, compare, rate_args, Ran};
use super::sidecars::{self, Written};
use super::state::{self, CopyPhase, RecordMark, State};
use super::{apply, edit, Out, Outcome, Stop};
use crate::admin::{self, AdminAuth};

/// Most catch-up rounds before the pause.
const CATCH_UP_ROUNDS: u32 = 5;

/// A catch-up round that finds at most this many written keys is the last: the pause checks
/// what is left.
const CATCH_UP_ENOUGH: usize = 1_000;

/// The configurations copy mode pushes, for the direction `(from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Dual,
    Pause,
    Switch,
    Resume,
    Final,
}

impl Step {
    fn name(self, aborting: bool) -> &'static str {
        match (self, aborting) {
            (Step::Dual, false) => "dual write",
            (Step::Pause, false) => "write pause",
            (Step::Switch, false) => "cut-over",
            (Step::Resume, false) => "resume writes",
            (Step::Final, false) => "final",
            (Step::Dual, true) => "reverse dual write",
            (Step::Pause, true) => "reverse write pause",
            (Step::Switch, true) => "reverse cut-over",
            (Step::Resume, true) => "reverse resume writes",
            (Step::Final, true) => "restore",
        }
    }
}

/// The files for `step`: each of STATE's files with the route (and its mirror) set.
fn texts(st: &State, step: Step) -> Result<Vec<(String, String)>, Stop> {
    let route = st.route_ref();
    let (from, to) = st.direction();
    let mut out = Vec::new();
    for f in &st.files {
        let text = match step {
            Step::Dual => edit::with_route(&f.original, &route, from, Some((to, "dual_write"))),
            Step::Pause => edit::with_route(&f.original, &route, from, Some((to, "read_only"))),
            Step::Switch => edit::with_route(&f.original, &route, to, Some((from, "read_only"))),
            Step::Resume => edit::with_route(&f.original, &route, to, Some((from, "dual_write"))),
            Step::Final if st.aborting => Ok(f.original.clone()),
            Step::Final => edit::with_route(&f.original, &route, to, None),
        }
        .map_err(Stop::Failed)?;
        out.push((f.name.clone(), text));
    }
    Ok(out)
}

/// Milliseconds since the epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `pause` may stop the run here: not while writes are refused.
fn may_pause(p: CopyPhase) -> bool {
    !matches!(
        p,
        CopyPhase::PausePushed
            | CopyPhase::PauseAcked
            | CopyPhase::Checked
            | CopyPhase::SwitchPushed
            | CopyPhase::SwitchAcked
            | CopyPhase::ResumePushed
    )
}

/// What a rerun does first: a push not known to be ACKed by every sidecar is pushed again.
pub(super) fn rerun_from(p: CopyPhase) -> CopyPhase {
    match p {
        CopyPhase::DualPushed => CopyPhase::Planned,
        CopyPhase::PausePushed | CopyPhase::PauseAcked => CopyPhase::CaughtUp,
        CopyPhase::SwitchPushed => CopyPhase::Checked,
        CopyPhase::ResumePushed => CopyPhase::SwitchAcked,
        CopyPhase::FinalPushed => CopyPhase::ResumeAcked,
        p => p,
    }
}

/// Copy mode's steps, from the one STATE records.
pub(super) async fn phases(
    st: &mut State,
    path: &Path,
    auth: &AdminAuth,
    out: &mut Out,
) -> Result<Outcome, Stop> {
    let timeout = Duration::from_millis(st.ack_timeout_ms);
    let route = st.route_ref();
    loop {
        let phase = st.copy.phase;
        if state::pause_marker(path).exists() && phase != CopyPhase::Done && may_pause(phase) {
            out.say("paused");
            return Ok(Outcome::Paused);
        }
        let (from, to) = {
            let (f, t) = st.direction();
            (f.to_string(), t.to_string())
        };
        let push = |step: Step| step.name(st.aborting);
        match phase {
            CopyPhase::Planned => {
                let v = apply(st, auth, push(Step::Dual), texts(st, Step::Dual)?).await?;
                out.say(&format!(
                    "phase 1/7: dual write pushed ({route} on {from}, every write copied to \
                     {to}), serving version {v}"
                ));
                st.copy.phase = CopyPhase::DualPushed;
            }
            CopyPhase::DualPushed
            | CopyPhase::PausePushed
            | CopyPhase::SwitchPushed
            | CopyPhase::ResumePushed
            | CopyPhase::FinalPushed => {
                let v = st.applied.last().map_or(0, |a| a.version);
                let acked = super::acks::wait(&st.admin, auth, v, timeout, &st.ignore_nodes).await;
                let n = match acked {
                    Ok(n) => n,
                    Err(e) => {
                        let why = e.to_string();
                        return Err(match phase {
                            // Writes are refused on the sidecars that ACKed, and both sides
                            // are equal: the pause is lifted.
                            CopyPhase::PausePushed | CopyPhase::SwitchPushed => {
                                unpause(st, path, auth, &why, out).await
                            }
                            _ => Stop::Failed(why),
                        });
                    }
                };
                if let Some(a) = st.applied.last_mut() {
                    a.acked = true;
                }
                out.say(&format!("every sidecar ACKed version {v} ({n} nodes)"));
                st.copy.phase = match phase {
                    CopyPhase::DualPushed => {
                        // From now on every write is copied and recorded.
                        match take_records(st, auth, &to, out).await? {
                            Some(marks) => st.copy.records = marks,
                            None => st.copy.full_pass = true,
                        }
                        CopyPhase::DualAcked
                    }
                    CopyPhase::PausePushed => CopyPhase::PauseAcked,
                    CopyPhase::SwitchPushed => CopyPhase::SwitchAcked,
                    CopyPhase::ResumePushed => {
                        let ms = st.copy.pause_started_ms.map(|s| now_ms().saturating_sub(s));
                        st.copy.pause_ms = ms;
                        out.say(&format!(
                            "write pause over: {} ms (from the pause's push to every sidecar's \
                             ACK of the resumed writes)",
                            ms.unwrap_or(0)
                        ));
                        if !st.aborting {
                            // Writes to `to` are copied to `from` now: an abort checks these.
                            st.copy.reverse_records = take_records(st, auth, &from, out)
                                .await
                                .ok()
                                .flatten()
                                .unwrap_or_default();
                        }
                        CopyPhase::ResumeAcked
                    }
                    _ => CopyPhase::FinalAcked,
                };
            }
            CopyPhase::DualAcked => {
                out.say(&format!(
                    "phase 2/7: backfill: every key of the scope copied from {from} to {to} \
                     where it differs"
                ));
                let mut a = vec!["--repair".to_string()];
                a.extend(rate_args(st));
                let code = compare(st, path, out, "backfill", a, true).await?;
                match code {
                    Ran::Paused => return Ok(Outcome::Paused),
                    // 1: keys that did not settle while written: they are in the records,
                    // checked again below.
                    Ran::Exit(0 | 1) => st.copy.phase = CopyPhase::Backfilled,
                    Ran::Exit(c) => {
                        return Err(Stop::Failed(format!(
                            "the backfill failed (respway-compare exit {c}, above)"
                        )))
                    }
                }
            }
            CopyPhase::Backfilled => {
                let mut round = 0;
                while round < CATCH_UP_ROUNDS && !st.copy.full_pass {
                    round += 1;
                    let Some((keys, marks)) = collect(st, auth, &to, out).await? else {
                        break;
                    };
                    out.say(&format!(
                        "phase 3/7: catch-up round {round}: {} keys written since the last check",
                        keys.len()
                    ));
                    if keys.len() <= CATCH_UP_ENOUGH {
                        break; // the pause checks these
                    }
                    // --prune: a listed key the source lacks is deleted from the target (a
                    // delete whose copy was dropped). A write racing with the check has a
                    // later place in the record than the cursor kept: the next round or the
                    // pause checks it again.
                    let mut a = vec!["--repair".to_string(), "--prune".to_string()];
                    a.extend(rate_args(st));
                    match check_keys(st, path, out, "catch-up", &keys, a, true).await? {
                        Ran::Paused => return Ok(Outcome::Paused),
                        Ran::Exit(0 | 1) => st.copy.records = marks,
                        Ran::Exit(c) => {
                            return Err(Stop::Failed(format!(
                                "a catch-up round failed (respway-compare exit {c}, above)"
                            )))
                        }
                    }
                    st.save(path).map_err(Stop::Failed)?;
                }
                st.copy.phase = CopyPhase::CaughtUp;
            }
            CopyPhase::CaughtUp => {
                // A rerun pushes the pause again: it began with the first push.
                st.copy.pause_started_ms.get_or_insert_with(now_ms);
                let v = apply(st, auth, push(Step::Pause), texts(st, Step::Pause)?).await?;
                out.say(&format!(
                    "phase 4/7: write pause pushed ({route} on {from}, writes refused, reads \
                     served), serving version {v}"
                ));
                st.copy.phase = CopyPhase::PausePushed;
            }
            CopyPhase::PauseAcked => {
                if let Err(why) = drain(st, auth, &to, timeout).await {
                    return Err(unpause(st, path, auth, &why, out).await);
                }
                out.say(&format!("every sidecar's copies to {to} applied"));
                let ran = match collect(st, auth, &to, out).await? {
                    Some((keys, _)) => {
                        out.say(&format!(
                            "checking the {} keys written since the last check",
                            keys.len()
                        ));
                        let a = vec!["--repair".to_string(), "--prune".to_string()];
                        check_keys(st, path, out, "pause check", &keys, a, false).await?
                    }
                    None => {
                        out.say("checking the whole keyspace (no usable record of the writes)");
                        let a = vec!["--repair".to_string(), "--prune".to_string()];
                        compare(st, path, out, "pause check", a, false).await?
                    }
                };
                if ran != Ran::Exit(0) {
                    let why = "the pause's check did not find both sides equal (above)";
                    return Err(unpause(st, path, auth, why, out).await);
                }
                st.copy.phase = CopyPhase::Checked;
            }
            CopyPhase::Checked => {
                let v = apply(st, auth, push(Step::Switch), texts(st, Step::Switch)?).await?;
                out.say(&format!(
                    "phase 5/7: cut-over pushed ({route} on {to}, writes still refused), \
                     serving version {v}"
                ));
                st.copy.phase = CopyPhase::SwitchPushed;
            }
            CopyPhase::SwitchAcked => {
                let v = apply(st, auth, push(Step::Resume), texts(st, Step::Resume)?).await?;
                out.say(&format!(
                    "phase 5/7: writes resumed ({route} on {to}, copied to {from} for a \
                     rollback), serving version {v}"
                ));
                st.copy.phase = CopyPhase::ResumePushed;
            }
            CopyPhase::ResumeAcked if st.copy.hold && !st.aborting => {
                out.say(&format!(
                    "held (--hold): writes go to {to} and are copied to {from}; `respway-xds \
                     reshard resume --state {}` pushes the final configuration and cleans up \
                     {from}, `abort` goes back to {from}",
                    path.display()
                ));
                return Ok(Outcome::Paused);
            }
            CopyPhase::ResumeAcked => {
                let v = apply(st, auth, push(Step::Final), texts(st, Step::Final)?).await?;
                out.say(&format!(
                    "phase 6/7: {} pushed ({route} on {to}, no mirror), serving version {v}",
                    if st.aborting {
                        "the original files"
                    } else {
                        "the final configuration"
                    }
                ));
                st.copy.phase = CopyPhase::FinalPushed;
            }
            CopyPhase::FinalAcked => {
                // Copies sent before the final push may still be on their way to `from`.
                drain(st, auth, &from, timeout)
                    .await
                    .map_err(Stop::Failed)?;
                out.say(&format!(
                    "phase 7/7: cleanup: every key of the scope left on {from} deleted"
                ));
                let mut a = vec!["--cleanup".to_string(), "--apply".to_string()];
                a.extend(rate_args(st));
                match compare(st, path, out, "cleanup", a, true).await? {
                    Ran::Paused => return Ok(Outcome::Paused),
                    Ran::Exit(0) => st.copy.phase = CopyPhase::Done,
                    Ran::Exit(c) => {
                        return Err(Stop::Failed(format!(
                            "the cleanup failed (respway-compare exit {c}, above); `resume` \
                             runs it again"
                        )))
                    }
                }
            }
            CopyPhase::Done => {
                out.say(&if st.aborting {
                    format!("aborted: {route} is on {to} again, its copies deleted from {from}")
                } else {
                    format!(
                        "done: {route} is on {to}, every key copied, none left on {from}{}",
                        st.copy
                            .pause_ms
                            .map(|ms| format!(" (write pause {ms} ms)"))
                            .unwrap_or_default()
                    )
                });
                return Ok(Outcome::Done);
            }
        }
        st.save(path).map_err(Stop::Failed)?;
    }
}

/// The pause failed before writes resumed anywhere (`why`): both sides are equal or `from`
/// holds every write, so dual write is pushed again and writes flow; a rerun catches up and
/// pauses again.
async fn unpause(st: &mut State, path: &Path, auth: &AdminAuth, why: &str, out: &mut Out) -> Stop {
    let (from, to) = {
        let (f, t) = st.direction();
        (f.to_string(), t.to_string())
    };
    let texts = match texts(st, Step::Dual) {
        Ok(t) => t,
        Err(Stop::Failed(e) | Stop::Usage(e)) => return Stop::Failed(format!("{why}\n{e}")),
    };
    match apply(st, auth, "lift the write pause", texts).await {
        Ok(v) => {
            st.copy.phase = CopyPhase::Backfilled;
            st.copy.pause_started_ms = None;
            let _ = st.save(path);
            out.say(&format!(
                "the write pause was lifted: dual write pushed again ({} on {from}, copies to \
                 {to}), serving version {v}",
                st.route_ref()
            ));
            Stop::Failed(format!(
                "{why}\nthe write pause was lifted (version {v}: writes served by {from}, copied \
                 to {to}); `respway-xds reshard resume` catches up and pauses again"
            ))
        }
        Err(Stop::Failed(e) | Stop::Usage(e)) => Stop::Failed(format!(
            "{why}\nlifting the write pause failed ({e}): the sidecars that took it refuse \
             writes on {} until `respway-xds reshard resume` or `abort` runs",
            st.route_ref()
        )),
    }
}

/// The nodes served by the server now (not ignored, not unserved): `(id, admin, connected)`.
async fn nodes(st: &State, auth: &AdminAuth) -> Result<Vec<(String, Option<String>, bool)>, Stop> {
    let s = admin::fetch_status(&st.admin, auth)
        .await
        .map_err(|e| Stop::Failed(e.to_string()))?;
    Ok(s.nodes
        .into_iter()
        .filter(|n| !st.ignore_nodes.contains(&n.id))
        .filter(|n| !(n.connected && n.unserved.is_some()))
        .map(|n| (n.id, n.admin, n.connected))
        .collect())
}

/// Each connected node's record of `cluster`, from its start; `None` when a node has none
/// (an older sidecar, a full record): its writes cannot be listed.
///
/// # Errors
/// A connected node announces no admin address: the pause could not count its copies still
/// in flight, so copy mode stops here, before the backfill, saying what to run.
async fn take_records(
    st: &State,
    auth: &AdminAuth,
    cluster: &str,
    out: &mut Out,
) -> Result<Option<BTreeMap<String, RecordMark>>, Stop> {
    let mut marks = BTreeMap::new();
    let mut complete = true;
    for (id, admin, connected) in nodes(st, auth).await? {
        if !connected {
            continue;
        }
        let line = match &admin {
            Some(a) => sidecars::mirror(a, cluster).await,
            None => {
                return Err(Stop::Failed(format!(
                    "copy mode needs every sidecar's admin endpoint (the write pause counts \
                     each sidecar's copies still in flight there): node {id} announces none; \
                     run it with --admin ADDR (and --admin-advertise ADDR when it binds a \
                     wildcard address), then `respway-xds reshard resume` (dual write stays \
                     on meanwhile: writes are served by {} and copied)",
                    st.direction().0
                )))
            }
        };
        match (line, admin) {
            (Ok(l), Some(a)) if l.record.is_some() && !l.unusable => {
                let rid = l.record.unwrap_or_default();
                marks.insert(
                    id,
                    RecordMark {
                        admin: a,
                        id: rid,
                        cursor: None,
                    },
                );
            }
            (r, _) => {
                let why = r.err().unwrap_or_else(|| {
                    format!("node {id} keeps no usable record of the keys copied to {cluster}")
                });
                out.warn(&format!("{why}: a write pause will compare every key"));
                complete = false;
            }
        }
    }
    Ok(complete.then_some(marks))
}

/// The keys the sidecars' copies wrote since the last check, and the marks after them;
/// `None` (and [`CopyState::full_pass`](state::CopyState) set) when a record cannot say.
async fn collect(
    st: &mut State,
    auth: &AdminAuth,
    cluster: &str,
    out: &mut Out,
) -> Result<Option<(BTreeSet<String>, BTreeMap<String, RecordMark>)>, Stop> {
    if st.copy.full_pass {
        return Ok(None);
    }
    let mut marks = st.copy.records.clone();
    let mut keys = BTreeSet::new();
    let mut unusable = None;
    // Nodes that came since dual write began record from their start.
    for (id, admin, connected) in nodes(st, auth).await? {
        if connected && !marks.contains_key(&id) {
            match admin {
                Some(a) => {
                    marks.insert(
                        id,
                        RecordMark {
                            admin: a,
                            id: String::new(),
                            cursor: None,
                        },
                    );
                }
                None => unusable = Some(format!("node {id} announces no admin address")),
            }
        }
    }
    if unusable.is_none() {
        let asks: Vec<_> = marks
            .iter()
            .map(|(node, m)| {
                (
                    node.clone(),
                    (m.admin.clone(), cluster.to_string(), m.cursor.clone()),
                )
            })
            .collect();
        let answers = sidecars::each(asks, |(admin, cluster, since)| async move {
            sidecars::written(&admin, &cluster, since.as_deref()).await
        })
        .await;
        for (node, answer) in answers {
            let Some(mark) = marks.get_mut(&node) else {
                continue;
            };
            match answer {
                Ok(Written::Keys {
                    id,
                    cursor,
                    keys: k,
                }) if mark.id.is_empty() || id == mark.id => {
                    mark.id = id;
                    mark.cursor = Some(cursor);
                    keys.extend(k);
                }
                Ok(Written::Keys { .. }) => {
                    unusable = Some(format!(
                        "node {node}'s record of the keys copied to {cluster} was replaced (the \
                         sidecar restarted?)"
                    ));
                }
                Ok(Written::Unusable(why)) => unusable = Some(format!("node {node}: {why}")),
                Err(e) => unusable = Some(format!("node {node}: {e}")),
            }
        }
    }
    if let Some(why) = unusable {
        out.warn(&format!("{why}: the write pause will compare every key"));
        st.copy.full_pass = true;
        return Ok(None);
    }
    Ok(Some((keys, marks)))
}

/// Waits until no served node has a copy to `cluster` queued or in flight.
async fn drain(
    st: &State,
    auth: &AdminAuth,
    cluster: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut waiting = Vec::new();
        let served = nodes(st, auth).await.map_err(|e| match e {
            Stop::Failed(e) | Stop::Usage(e) => e,
        })?;
        let mut asks = Vec::new();
        for (id, admin, _) in served {
            match admin {
                None => waiting.push(format!(
                    "{id}: announces no admin address, its copies cannot be counted"
                )),
                Some(a) => asks.push((id, (a, cluster.to_string()))),
            }
        }
        let answers = sidecars::each(asks, |(admin, cluster)| async move {
            sidecars::mirror(&admin, &cluster).await
        })
        .await;
        for (id, answer) in answers {
            match answer {
                Ok(l) if l.in_flight() == 0 => {}
                Ok(l) => waiting.push(format!("{id}: {} copies in flight", l.in_flight())),
                Err(e) => waiting.push(format!("{id}: {e}")),
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the copies to {cluster} did not drain in time; waiting for:\n  {}",
                waiting.join("\n  ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `reshard abort` of a copy-mode reshard: see the module's doc.
///
/// # Errors
/// See [`Stop`].
pub(super) async fn abort(
    mut st: State,
    path: &Path,
    auth: &AdminAuth,
    out: &mut Out,
) -> Result<Outcome, Stop> {
    let route = st.route_ref();
    let (from, to) = (st.from.clone(), st.to.clone());
    if st.aborting {
        return super::drive(st, path, auth, out).await;
    }
    if matches!(
        st.copy.phase,
        CopyPhase::FinalPushed | CopyPhase::FinalAcked | CopyPhase::Done
    ) {
        return Err(Stop::Usage(format!(
            "the final configuration was pushed: {route} is on {to} and {from} no longer gets              its writes. To copy its keys back, start another copy from files with the route              on {to}: respway-xds reshard start --copy --admin {} --file FILE... --listener              {}{} --from {to} --to {from} --state OTHER.json",
            st.admin,
            st.listener,
            st.route
                .as_ref()
                .map(|p| format!(" --route {p}"))
                .unwrap_or_default(),
        )));
    }
    if st.applied.is_empty() {
        st.aborting = true;
        st.copy.phase = CopyPhase::Done;
        st.save(path).map_err(Stop::Failed)?;
        out.say("aborted: nothing had been pushed");
        return Ok(Outcome::Done);
    }
    let phase = st.copy.phase;
    st.aborting = true;
    st.summary = None;
    st.progress = None;
    match phase {
        CopyPhase::SwitchPushed | CopyPhase::SwitchAcked => {
            // Writes were refused since the check: both sides are equal.
            out.say(&format!(
                "aborting: writes are still paused and both sides equal; the cut-over runs back \
                 ({route} on {from} again), writes resume there, then the original files are \
                 pushed and the copies deleted from {to}"
            ));
            st.copy.phase = CopyPhase::Checked;
        }
        CopyPhase::ResumePushed | CopyPhase::ResumeAcked => {
            out.say(&format!(
                "aborting: writes went to {to} since the cut-over and were copied to {from}: \
                 the keys they wrote are checked again, writes paused, {route} cut over to \
                 {from} again, then the original files pushed and the copies deleted from {to}"
            ));
            st.copy.records = std::mem::take(&mut st.copy.reverse_records);
            st.copy.full_pass = phase == CopyPhase::ResumePushed || st.copy.records.is_empty();
            st.copy.phase = CopyPhase::Backfilled;
        }
        _ => {
            out.say(&format!(
                "aborting: {from} kept every write; the original files are pushed ({route} on \
                 {from}, no mirror) and the copies deleted from {to}"
            ));
            st.copy.phase = CopyPhase::ResumeAcked;
        }
    }
    st.copy.pause_started_ms = None;
    st.save(path).map_err(Stop::Failed)?;
    super::drive(st, path, auth, out).await
}

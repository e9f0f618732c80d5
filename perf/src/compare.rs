//! One workload against several targets in one run, interleaved.
//!
//! 1. Start the scenario's topology ([`crate::topology::start`]); it is stopped when this
//!    returns, whatever happens.
//! 2. Generate the request pools once: every target gets exactly the same requests.
//! 3. Optionally preload the string keys through each target.
//! 4. One unmeasured warm-up run per target, then `rounds` rounds; each round runs every
//!    target once, the order rotated each round so no target always goes first (or right
//!    after the same neighbour).
//! 5. `respway-xds` targets are reset to their own configuration before each measured run
//!    and, during it, get the scenario's `config_pushes` at their times (each waits for the
//!    sidecar's ACK); the pushes are reported and marked on the timeline plot.
//! 6. Around each run: the proxy's and the redis-servers' CPU time (`/proc/PID/stat`) and
//!    each shard endpoint's executed commands (`INFO commandstats`), for CPU seconds per
//!    million requests and the per-shard balance (max / mean).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::report::{
    concat_timelines, median, CompareResult, Machine, Marker, PushRecord, RoundResult, TargetResult,
};
use crate::scenario::{drive, preload, ConfigPush, Scenario};
use crate::stats::Recorder;
use crate::topology::{
    self, commands_executed, cpu_seconds, load_average, machine_task_seconds, xds_push, Running,
    Target, XdsControl,
};
use crate::workload::kind_names;
use crate::{Control, Error};

/// Options of a comparison beyond the scenario.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Keep the topology's scratch directory (configs, logs).
    pub keep: bool,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
}

struct Probe {
    proxy: Option<f64>,
    servers: Option<f64>,
    shards: Vec<u64>,
}

fn probe(t: &Target) -> Probe {
    let servers: Option<f64> = if t.server_pids.is_empty() {
        None
    } else {
        t.server_pids.iter().map(|&p| cpu_seconds(p)).sum()
    };
    Probe {
        proxy: t.proxy_pid.and_then(cpu_seconds),
        servers,
        shards: t
            .shards
            .iter()
            .map(|s| s.iter().map(|&a| commands_executed(a).unwrap_or(0)).sum())
            .collect(),
    }
}

/// Runs the scenario's comparison (see the module docs).
pub fn compare(
    sc: &Scenario,
    opts: &CompareOptions,
    ctl: &Control,
) -> Result<CompareResult, Error> {
    sc.validate()?;
    let mut machine = Machine::probe();
    machine.load_before = load_average();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut run: Running = topology::start(&sc.topology)?;
    run.keep = opts.keep;
    if !sc.config_pushes.is_empty() {
        for t in &run.targets {
            if let Some(x) = &t.xds {
                let mut r = x.base.clone();
                for (i, p) in sc.config_pushes.iter().enumerate() {
                    r = p.apply_to(&r);
                    topology::check_respway(
                        &sc.topology,
                        &run,
                        &format!("{}-push{i}", t.name),
                        x,
                        &r,
                    )
                    .map_err(|e| Error::Config(format!("config_pushes[{i}]: {e}")))?;
                }
            }
        }
    }
    let mut pushes: Vec<PushRecord> = Vec::new();
    let pools = Arc::new(sc.load.pools(&sc.workload)?);
    let names = kind_names();

    let mut notes = Vec::new();
    let mut preloaded = 0;
    if sc.preload {
        for t in &run.targets {
            preloaded = preload(t.addr, &sc.workload, ctl)?;
        }
    }
    let n = run.targets.len();
    let per_run = sc.load.duration.as_millis() as u64;
    let warm_ms = sc.warmup.as_millis() as u64;
    let total_ms = n as u64 * (warm_ms + per_run * sc.rounds as u64);
    let pb = if opts.progress {
        ProgressBar::with_draw_target(Some(total_ms.max(1)), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {percent:>3}% {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut base = 0u64;

    // Warm-up: short, unmeasured.
    if !sc.warmup.is_zero() {
        let mut warm = sc.load.clone();
        warm.duration = sc.warmup;
        for t in &run.targets {
            let msg = format!("warm-up {}", t.name);
            with_progress(&pb, base, &msg, ctl, || {
                drive(t.addr, &warm, Arc::clone(&pools), sc.workload.seed, ctl)
            })?;
            base += warm_ms;
            if ctl.stopped() {
                return Err(Error::Run("stopped".into()));
            }
        }
    }

    let mut recs: Vec<Vec<Recorder>> = vec![Vec::new(); n];
    let mut rounds: Vec<Vec<RoundResult>> = vec![Vec::new(); n];
    let mut shard_total: Vec<Vec<u64>> = run
        .targets
        .iter()
        .map(|t| vec![0; t.shards.len()])
        .collect();
    let mut cpu_proxy = vec![Some(0.0f64); n];
    let mut cpu_servers = vec![Some(0.0f64); n];
    for round in 1..=sc.rounds {
        for i in 0..n {
            let ti = (i + round - 1) % n;
            let t = &run.targets[ti];
            let load_before = load_average();
            let before = probe(t);
            let ours = |run: &Running| -> Option<f64> {
                let mut c = cpu_seconds(std::process::id())?;
                for (_, pid) in run.processes() {
                    c += cpu_seconds(pid)?;
                }
                Some(c)
            };
            let pushing = t.xds.as_ref().filter(|_| !sc.config_pushes.is_empty());
            if let Some(x) = pushing {
                xds_push(x, &x.base, PUSH_TIMEOUT).map_err(|e| {
                    Error::Run(format!("resetting {} before round {round}: {e}", t.name))
                })?;
            }
            let (m0, o0, w0) = (machine_task_seconds(), ours(&run), Instant::now());
            let msg = format!("round {round}/{} {}", sc.rounds, t.name);
            let finished = AtomicBool::new(false);
            let (rec, pushed) = std::thread::scope(|s| {
                let pusher = pushing.map(|x| {
                    let finished = &finished;
                    s.spawn(move || run_pushes(x, &sc.config_pushes, w0, finished, ctl))
                });
                let rec = with_progress(&pb, base, &msg, ctl, || {
                    drive(t.addr, &sc.load, Arc::clone(&pools), sc.workload.seed, ctl)
                });
                finished.store(true, Ordering::Relaxed);
                // A panic in the push thread is a bug: report it, do not drop its pushes.
                let pushed = match pusher.map(|h| h.join()) {
                    None => Ok(Vec::new()),
                    Some(Ok(p)) => Ok(p),
                    Some(Err(_)) => Err(Error::Run(format!(
                        "the config-push thread for {} panicked in round {round}",
                        t.name
                    ))),
                };
                (rec, pushed)
            });
            let (rec, pushed) = (rec?, pushed?);
            for (push, at_s, outcome) in pushed {
                let (version, ack_ms, error) = match outcome {
                    Ok(o) => (Some(o.version), o.changed.then_some(o.ack_ms), None),
                    Err(e) => (None, None, Some(e.to_string())),
                };
                pushes.push(PushRecord {
                    target: t.name.clone(),
                    round,
                    label: push.describe(),
                    at_s,
                    version,
                    ack_ms,
                    error,
                });
            }
            let after = probe(t);
            let (m1, o1) = (machine_task_seconds(), ours(&run));
            let wall = w0.elapsed().as_secs_f64().max(1e-3);
            let other_cpu_cores = (|| Some(((m1? - m0?) - (o1? - o0?)).max(0.0) / wall))();
            base += per_run;
            run.check_alive()?;
            let summary = rec.summary(&names);
            let d = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
            let proxy = d(before.proxy, after.proxy);
            let servers = d(before.servers, after.servers);
            cpu_proxy[ti] = cpu_proxy[ti].zip(proxy).map(|(a, b)| a + b);
            cpu_servers[ti] = cpu_servers[ti].zip(servers).map(|(a, b)| a + b);
            for (s, (a, b)) in before.shards.iter().zip(&after.shards).enumerate() {
                shard_total[ti][s] += b.saturating_sub(*a);
            }
            rounds[ti].push(RoundResult {
                round,
                throughput: summary.throughput,
                p99_us: summary.latency.p99,
                replies: summary.replies,
                errors: summary.error_total,
                elapsed_s: summary.elapsed_s,
                proxy_cpu_s: proxy,
                server_cpu_s: servers,
                load_before,
                other_cpu_cores,
            });
            recs[ti].push(rec);
            if ctl.stopped() {
                return Err(Error::Run("stopped".into()));
            }
        }
    }
    pb.finish_and_clear();
    machine.load_after = load_average();

    let mut targets = Vec::new();
    let mut markers = Vec::new();
    for (ti, t) in run.targets.iter().enumerate() {
        let sums: Vec<_> = recs[ti].iter().map(|r| r.summary(&names)).collect();
        let mut merged = recs[ti][0].clone();
        for r in &recs[ti][1..] {
            merged.merge(r);
        }
        let mut summary = merged.summary(&names);
        let replies: u64 = sums.iter().map(|s| s.replies).sum();
        let elapsed: f64 = sums.iter().map(|s| s.elapsed_s).sum();
        summary.elapsed_s = elapsed;
        summary.throughput = if elapsed > 0.0 {
            replies as f64 / elapsed
        } else {
            0.0
        };
        summary.timeline =
            concat_timelines(&sums.iter().map(|s| s.timeline.clone()).collect::<Vec<_>>());
        if markers.is_empty() {
            // The first target that got pushes places the markers: each round's pushes at
            // their time within that round, the rounds back to back as on the plot.
            let mut offset = 0.0;
            for (k, s) in sums.iter().enumerate() {
                for p in pushes
                    .iter()
                    .filter(|p| p.target == t.name && p.round == k + 1)
                {
                    markers.push(Marker {
                        t_s: offset + p.at_s,
                        label: if p.error.is_some() {
                            format!("{} (failed)", p.label)
                        } else {
                            p.label.clone()
                        },
                    });
                }
                offset += s.timeline.last().map_or(0.0, |p| p.t_s);
            }
        }
        let tps: Vec<f64> = rounds[ti].iter().map(|r| r.throughput).collect();
        let per_m = |cpu: Option<f64>| {
            cpu.filter(|_| replies > 0)
                .map(|c| c / replies as f64 * 1e6)
        };
        let shards = shard_total[ti].clone();
        let balance = if shards.len() > 1 && shards.iter().sum::<u64>() > 0 {
            let mean = shards.iter().sum::<u64>() as f64 / shards.len() as f64;
            Some(*shards.iter().max().unwrap_or(&0) as f64 / mean)
        } else if shards.len() == 1 {
            Some(1.0)
        } else {
            None
        };
        if summary.error_total > 0 {
            notes.push(format!(
                "{}: {} errors over the rounds (see errors by kind)",
                t.name, summary.error_total
            ));
        }
        targets.push(TargetResult {
            name: t.name.clone(),
            kind: t.kind.clone(),
            address: t.addr.to_string(),
            command: t.command.clone(),
            rounds: rounds[ti].clone(),
            throughput: median(&tps),
            throughput_min: tps.iter().copied().fold(f64::INFINITY, f64::min),
            throughput_max: tps.iter().copied().fold(0.0, f64::max),
            summary,
            proxy_cpu_s_per_m: if t.proxy_pid.is_some() {
                per_m(cpu_proxy[ti])
            } else {
                None
            },
            server_cpu_s_per_m: if t.server_pids.is_empty() {
                None
            } else {
                per_m(cpu_servers[ti])
            },
            shard_commands: shards,
            shard_balance: balance,
        });
    }
    let others: Vec<f64> = targets
        .iter()
        .flat_map(|t| t.rounds.iter().filter_map(|r| r.other_cpu_cores))
        .collect();
    if let Some(max) = others.iter().copied().reduce(f64::max) {
        let mean = others.iter().sum::<f64>() / others.len() as f64;
        let line = format!(
            "other processes used {mean:.2} cores on average during the runs, {max:.2} at most"
        );
        notes.push(if max > 0.25 {
            format!("{line}: treat the figures as noisy")
        } else {
            line
        });
    }
    Ok(CompareResult {
        scenario: sc.name.clone(),
        description: sc.description.clone(),
        workload: sc.workload.clone(),
        workload_summary: sc.workload.describe(),
        load: sc.load.clone(),
        shards: sc.topology.shards,
        replicas: sc.topology.replicas,
        rounds: sc.rounds,
        preloaded_keys: preloaded,
        started_unix,
        machine,
        targets,
        markers,
        pushes,
        notes,
    })
}

/// How long a push may take to be ACKed.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

type Pushed<'a> = Vec<(&'a ConfigPush, f64, Result<topology::PushOutcome, Error>)>;

/// Makes `pushes` to `x` at their times after `t0`, each on top of the ones before, until
/// the run has `finished` or is stopped; returns each push made, when (s after `t0`), and
/// its outcome.
fn run_pushes<'a>(
    x: &XdsControl,
    pushes: &'a [ConfigPush],
    t0: Instant,
    finished: &AtomicBool,
    ctl: &Control,
) -> Pushed<'a> {
    let mut out = Vec::new();
    let mut spec = x.base.clone();
    for p in pushes {
        loop {
            if finished.load(Ordering::Relaxed) || ctl.stopped() {
                return out;
            }
            let now = t0.elapsed();
            if now >= p.at {
                break;
            }
            std::thread::sleep((p.at - now).min(Duration::from_millis(20)));
        }
        spec = p.apply_to(&spec);
        let at_s = t0.elapsed().as_secs_f64();
        out.push((p, at_s, xds_push(x, &spec, PUSH_TIMEOUT)));
    }
    out
}

/// Runs `f` while a thread moves the progress bar along with the clock and shows the live
/// request rate.
pub fn with_progress<T>(
    pb: &ProgressBar,
    base_ms: u64,
    msg: &str,
    ctl: &Control,
    f: impl FnOnce() -> T,
) -> T {
    let finished = AtomicBool::new(false);
    ctl.done.store(0, Ordering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| {
            let t0 = Instant::now();
            while !finished.load(Ordering::Relaxed) {
                let el = t0.elapsed();
                let done = ctl.done.load(Ordering::Relaxed);
                pb.set_position(base_ms + el.as_millis() as u64);
                pb.set_message(format!(
                    "{msg}: {:.0} req/s",
                    done as f64 / el.as_secs_f64().max(1e-3)
                ));
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let out = f();
        finished.store(true, Ordering::Relaxed);
        out
    })
}

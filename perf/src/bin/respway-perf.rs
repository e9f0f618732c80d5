//! `respway-perf`: generate, record and replay Redis traffic; compare respway, redis-server
//! and nutcracker side by side. See `perf/README.md`.
//!
//! ```text
//! respway-perf run      --target 127.0.0.1:6379 [--scenario F] [workload/load flags] [--json F] [--plot-dir D]
//! respway-perf compare  --scenario perf/scenarios/uniform.yaml [--out D] [--rounds N] [--markdown]
//! respway-perf replay   --target ADDR --input capture.txt [--speed 1|2|10|max] [--connections N]
//! respway-perf record   --target ADDR --duration 10s --out trace.rwt
//! respway-perf convert  --input monitor.txt --out trace.rwt
//! respway-perf generate [--scenario F] [workload flags] --requests N --out trace.rwt
//! respway-perf plot     --input result.json --out D
//! respway-perf sink     --listen 127.0.0.1:0 [--reply-size 3] [--duration 10m]
//! ```

// The tables this CLI prints on stdout are its product.
#![allow(
    clippy::print_stdout,
    reason = "a CLI whose report on stdout is its product"
)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use respway_perf::closed::{run_closed, ClosedConfig};
use respway_perf::compare::{compare, with_progress, CompareOptions};
use respway_perf::open::{run_open, Arrival, ListSchedule, OpenConfig};
use respway_perf::replay::{DbMode, ReplayPlan, Speed};
use respway_perf::report::{run_text, CompareResult};
use respway_perf::scenario::{drive, preload, Mode, Scenario};
use respway_perf::stats::RunSummary;
use respway_perf::topology::cpu_seconds;
use respway_perf::trace::{self, Event, Format, ReadOptions, Trace};
use respway_perf::workload::{kind_names, Cmd, Generator, HotKeys, KeyDistribution, ValueSize};
use respway_perf::{check_loopback, parse_duration, plot, Control, Error};

/// Generate, record and replay Redis traffic against respway, redis-server and nutcracker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd_,
}

#[derive(Debug, Subcommand)]
enum Cmd_ {
    /// Drive generated traffic against one target and print its throughput and latency.
    Run(RunArgs),
    /// Run a scenario against every target of its topology (started and stopped here),
    /// interleaved, and print the comparison table; write JSON and SVG plots with --out.
    Compare(CompareArgs),
    /// Replay a capture (redis-cli MONITOR output or a respway trace) against a target.
    Replay(ReplayArgs),
    /// Record live traffic from a Redis server with MONITOR into a respway trace.
    Record(RecordArgs),
    /// Convert redis-cli MONITOR output into a respway trace.
    Convert(ConvertArgs),
    /// Write a workload's generated commands as a respway trace (deterministic for a seed).
    Generate(GenerateArgs),
    /// Redraw the plots of a comparison's JSON result.
    Plot(PlotArgs),
    /// Serve a RESP "null server" that answers every command with the same bulk string, to
    /// measure the harness's own ceiling (not a Redis). Prints the bound address on stdout.
    Sink(SinkArgs),
}

/// Workload flags: each overrides the scenario's value.
#[derive(Debug, clap::Args)]
struct WorkloadArgs {
    /// Scenario file (workload, load, topology); the flags below override it.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Seed of every random choice.
    #[arg(long)]
    seed: Option<u64>,
    /// Distinct keys per data type.
    #[arg(long)]
    keyspace: Option<u64>,
    /// Prefix of every (non-hot) key.
    #[arg(long)]
    key_prefix: Option<String>,
    /// Key distribution: `uniform` or `zipf:EXPONENT` (e.g. zipf:0.99).
    #[arg(long)]
    distribution: Option<String>,
    /// Hot keys: `PREFIX:SHARE[:KEYS]` (e.g. HIGH_FREQ_:0.1:10).
    #[arg(long)]
    hot: Option<String>,
    /// Command mix: `get=9,set=1` (get set mget mset incr hset hget lpush lrange zadd zrange
    /// expire del exists ping).
    #[arg(long)]
    commands: Option<String>,
    /// Rescale the mix so reads are this fraction (0 to 1).
    #[arg(long)]
    read_ratio: Option<f64>,
    /// Value size: `N` bytes or `MIN-MAX` (uniform).
    #[arg(long)]
    value_size: Option<String>,
    /// Keys per MGET / pairs per MSET.
    #[arg(long)]
    multi_keys: Option<usize>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    Closed,
    Open,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ArrivalArg {
    Uniform,
    Poisson,
}

/// Load flags: each overrides the scenario's value.
#[derive(Debug, clap::Args)]
struct LoadArgs {
    /// closed (N connections × pipeline, max throughput) or open (fixed --rate).
    #[arg(long)]
    mode: Option<ModeArg>,
    /// Connections.
    #[arg(long, short = 'c')]
    connections: Option<usize>,
    /// Closed loop: requests per batch (like redis-benchmark -P).
    #[arg(long, short = 'P')]
    pipeline: Option<usize>,
    /// Closed loop: driver threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Open loop: requests per second.
    #[arg(long)]
    rate: Option<f64>,
    /// Open loop: uniform or poisson arrivals.
    #[arg(long)]
    arrival: Option<ArrivalArg>,
    /// Length of a run (10s, 500ms, 2m).
    #[arg(long, short = 'd', value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Most requests in a run.
    #[arg(long, short = 'n')]
    requests: Option<u64>,
    /// Timeline interval.
    #[arg(long, value_parser = parse_duration)]
    interval: Option<Duration>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Where to send (loopback only).
    #[arg(long, short = 't')]
    target: SocketAddr,
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    load: LoadArgs,
    /// SET every string key of the workload first.
    #[arg(long)]
    preload: bool,
    /// A process (e.g. the proxy) whose CPU seconds per million requests to report.
    #[arg(long)]
    pid: Option<u32>,
    /// Write the result as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write latency.svg and timeline.svg here.
    #[arg(long)]
    plot_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct CompareArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    load: LoadArgs,
    /// Measured rounds per target.
    #[arg(long)]
    rounds: Option<usize>,
    /// Unmeasured warm-up per target (0s for none).
    #[arg(long, value_parser = parse_duration)]
    warmup: Option<Duration>,
    /// Preload the string keys through each target (overrides the scenario).
    #[arg(long)]
    preload: Option<bool>,
    /// Write result.json, latency.svg and timeline.svg here.
    #[arg(long, short = 'o')]
    out: Option<PathBuf>,
    /// Print the table as markdown (for perf/RESULTS-archive.md).
    #[arg(long)]
    markdown: bool,
    /// Keep the topology's scratch directory (configs and logs).
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    Monitor,
    Trace,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DbArg {
    Ignore,
    Select,
}

#[derive(Debug, clap::Args)]
struct ReplayArgs {
    /// Where to send (loopback only).
    #[arg(long, short = 't')]
    target: SocketAddr,
    /// The capture.
    #[arg(long, short = 'i')]
    input: PathBuf,
    /// Its format (default: detected from the first line).
    #[arg(long)]
    format: Option<FormatArg>,
    /// Speed: 1 (as recorded), 2, 10 (× faster, open loop) or max (closed loop).
    #[arg(long, default_value = "1")]
    speed: Speed,
    /// Most connections (recorded clients beyond it share connections).
    #[arg(long, short = 'c', default_value_t = 64)]
    connections: usize,
    /// With --speed max: requests in flight per connection.
    #[arg(long, short = 'P', default_value_t = 1)]
    pipeline: usize,
    /// Recorded databases: ignore, or SELECT them.
    #[arg(long, default_value = "ignore")]
    db: DbArg,
    /// Replay commands that Lua scripts ran (normally left out: the EVAL runs them).
    #[arg(long)]
    include_lua: bool,
    /// Stop after this long.
    #[arg(long, short = 'd', default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Stop after this many commands.
    #[arg(long, short = 'n', default_value_t = 10_000_000)]
    requests: usize,
    /// Write the result as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write latency.svg and timeline.svg here.
    #[arg(long)]
    plot_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct RecordArgs {
    /// The Redis server to MONITOR (loopback only).
    #[arg(long, short = 't')]
    target: SocketAddr,
    /// How long to record.
    #[arg(long, short = 'd', default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Most commands to record.
    #[arg(long, short = 'n', default_value_t = 1_000_000)]
    max_commands: usize,
    /// Keep commands run by Lua scripts.
    #[arg(long)]
    include_lua: bool,
    /// The trace file to write.
    #[arg(long, short = 'o')]
    out: PathBuf,
}

#[derive(Debug, clap::Args)]
struct ConvertArgs {
    /// redis-cli MONITOR output.
    #[arg(long, short = 'i')]
    input: PathBuf,
    /// Keep commands run by Lua scripts.
    #[arg(long)]
    include_lua: bool,
    /// The trace file to write.
    #[arg(long, short = 'o')]
    out: PathBuf,
}

#[derive(Debug, clap::Args)]
struct GenerateArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Commands to write.
    #[arg(long, short = 'n', default_value_t = 1000)]
    requests: u64,
    /// Clients (streams) to spread them over, round-robin.
    #[arg(long, short = 'c', default_value_t = 1)]
    clients: u32,
    /// Offsets as if sent at this rate (requests/s); 0 writes every offset as 0.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// The trace file to write.
    #[arg(long, short = 'o')]
    out: PathBuf,
}

#[derive(Debug, clap::Args)]
struct PlotArgs {
    /// A comparison's result.json.
    #[arg(long, short = 'i')]
    input: PathBuf,
    /// Where to write the SVGs.
    #[arg(long, short = 'o')]
    out: PathBuf,
}

#[derive(Debug, clap::Args)]
struct SinkArgs {
    /// Where to listen (loopback only; port 0 picks a free port).
    #[arg(long, short = 'l')]
    listen: SocketAddr,
    /// Bytes of the bulk string sent as every reply.
    #[arg(long, default_value_t = 3)]
    reply_size: usize,
    /// Exit after this long.
    #[arg(long, short = 'd', default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ctl = Control::new();
    stop_on_signal(&ctl);
    let res = match cli.cmd {
        Cmd_::Run(a) => cmd_run(a, &ctl),
        Cmd_::Compare(a) => cmd_compare(a, &ctl),
        Cmd_::Replay(a) => cmd_replay(a, &ctl),
        Cmd_::Record(a) => cmd_record(a, &ctl),
        Cmd_::Convert(a) => cmd_convert(a),
        Cmd_::Generate(a) => cmd_generate(a),
        Cmd_::Plot(a) => cmd_plot(a),
        Cmd_::Sink(a) => cmd_sink(a, &ctl),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("respway-perf: {e}");
            match e {
                Error::Config(_) | Error::Input(_) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

/// Ctrl-C / SIGTERM ask the drivers to stop; the topology is then stopped on the way out.
fn stop_on_signal(ctl: &Control) {
    let ctl = ctl.clone();
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                #[cfg(unix)]
                {
                    use tokio::signal::unix::{signal, SignalKind};
                    let Ok(mut term) = signal(SignalKind::terminate()) else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => {}
                        _ = term.recv() => {}
                    }
                }
                #[cfg(not(unix))]
                let _ = tokio::signal::ctrl_c().await;
                eprintln!("respway-perf: stopping (the processes started are being stopped)");
                ctl.stop();
            });
        });
}

fn scenario_from(w: &WorkloadArgs, default_name: &str) -> Result<Scenario, Error> {
    let mut sc = match &w.scenario {
        Some(p) => Scenario::load(p)?,
        None => Scenario::new(default_name),
    };
    let wl = &mut sc.workload;
    let mut errs = Vec::new();
    if let Some(s) = w.seed {
        wl.seed = s;
    }
    if let Some(k) = w.keyspace {
        wl.keyspace = k;
    }
    if let Some(p) = &w.key_prefix {
        wl.key_prefix = p.clone();
    }
    if let Some(d) = &w.distribution {
        match d.split_once(':') {
            None if d == "uniform" => wl.distribution = KeyDistribution::Uniform,
            Some(("zipf", s)) => match s.parse() {
                Ok(s) => wl.distribution = KeyDistribution::Zipf(s),
                Err(_) => errs.push(format!("--distribution {d}: bad exponent")),
            },
            _ => errs.push(format!(
                "--distribution {d}: expected uniform or zipf:EXPONENT"
            )),
        }
    }
    if let Some(h) = &w.hot {
        let parts: Vec<&str> = h.split(':').collect();
        let share = parts.get(1).and_then(|s| s.parse().ok());
        let keys = parts.get(2).map_or(Some(10), |k| k.parse().ok());
        match (parts.len(), share, keys) {
            (2 | 3, Some(share), Some(keys)) => {
                wl.hot = Some(HotKeys {
                    prefix: parts[0].into(),
                    share,
                    keys,
                })
            }
            _ => errs.push(format!("--hot {h}: expected PREFIX:SHARE[:KEYS]")),
        }
    }
    if let Some(c) = &w.commands {
        let mut mix = BTreeMap::new();
        for part in c.split(',').filter(|p| !p.is_empty()) {
            let (name, weight) = part.split_once('=').unwrap_or((part, "1"));
            match (Cmd::parse(name.trim()), weight.trim().parse::<f64>()) {
                (Some(cmd), Ok(wt)) => {
                    mix.insert(cmd, wt);
                }
                _ => errs.push(format!("--commands: bad entry {part:?}")),
            }
        }
        wl.commands = mix;
    }
    if let Some(r) = w.read_ratio {
        wl.read_ratio = Some(r);
    }
    if let Some(v) = &w.value_size {
        let parsed = match v.split_once('-') {
            None => v.parse().ok().map(ValueSize::Fixed),
            Some((a, b)) => match (a.parse(), b.parse()) {
                (Ok(a), Ok(b)) => Some(ValueSize::Uniform { uniform: [a, b] }),
                _ => None,
            },
        };
        match parsed {
            Some(p) => wl.value_size = p,
            None => errs.push(format!("--value-size {v}: expected N or MIN-MAX")),
        }
    }
    if let Some(m) = w.multi_keys {
        wl.multi_keys = m;
    }
    if !errs.is_empty() {
        return Err(Error::Config(errs.join("\n")));
    }
    Ok(sc)
}

fn apply_load(sc: &mut Scenario, l: &LoadArgs) {
    let load = &mut sc.load;
    if let Some(m) = l.mode {
        load.mode = match m {
            ModeArg::Closed => Mode::Closed,
            ModeArg::Open => Mode::Open,
        };
    }
    if let Some(c) = l.connections {
        load.connections = c;
    }
    if let Some(p) = l.pipeline {
        load.pipeline = p;
    }
    if let Some(t) = l.threads {
        load.threads = t;
    }
    if let Some(r) = l.rate {
        load.rate = r;
    }
    if let Some(a) = l.arrival {
        load.arrival = match a {
            ArrivalArg::Uniform => Arrival::Uniform,
            ArrivalArg::Poisson => Arrival::Poisson,
        };
    }
    if let Some(d) = l.duration {
        load.duration = d;
    }
    if let Some(n) = l.requests {
        load.max_requests = n;
    }
    if let Some(i) = l.interval {
        load.interval = i;
    }
}

fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), Error> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d)?;
    }
    let text = serde_json::to_string_pretty(v).map_err(|e| Error::Run(format!("JSON: {e}")))?;
    std::fs::write(path, text + "\n")?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn single_plots(dir: &Path, name: &str, s: &RunSummary) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    plot::percentiles_svg(
        &dir.join("latency.svg"),
        &format!("{name}: latency by percentile"),
        &[(name.to_string(), s.percentiles.clone())],
    )?;
    plot::timeline_svg(
        &dir.join("timeline.svg"),
        &format!("{name}: throughput and p99 over time"),
        &[(name.to_string(), s.timeline.clone())],
        &[],
    )?;
    eprintln!("wrote {}/latency.svg and timeline.svg", dir.display());
    Ok(())
}

fn progress_bar(total_ms: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::with_draw_target(
        Some(total_ms.max(1)),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {percent:>3}% {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

#[derive(serde::Serialize)]
struct RunJson<'a> {
    target: String,
    scenario: &'a Scenario,
    proxy_cpu_s_per_m: Option<f64>,
    summary: &'a RunSummary,
}

fn cmd_run(a: RunArgs, ctl: &Control) -> Result<(), Error> {
    check_loopback(a.target)?;
    let mut sc = scenario_from(&a.workload, "run")?;
    apply_load(&mut sc, &a.load);
    sc.workload.validate()?;
    sc.load.validate()?;
    if a.preload {
        let n = preload(a.target, &sc.workload, ctl)?;
        eprintln!("preloaded {n} keys");
    }
    eprintln!("{}", sc.workload.describe());
    let pools = Arc::new(sc.load.pools(&sc.workload)?);
    let cpu0 = a.pid.and_then(cpu_seconds);
    let pb = progress_bar(sc.load.duration.as_millis() as u64);
    let rec = with_progress(&pb, 0, &a.target.to_string(), ctl, || {
        drive(a.target, &sc.load, pools, sc.workload.seed, ctl)
    })?;
    pb.finish_and_clear();
    let cpu = a.pid.and_then(cpu_seconds).zip(cpu0).map(|(b, a)| b - a);
    let s = rec.summary(&kind_names());
    print!("{}", run_text(&a.target.to_string(), &s));
    let per_m = cpu
        .filter(|_| s.replies > 0)
        .map(|c| c / s.replies as f64 * 1e6);
    if let Some(c) = per_m {
        println!(
            "process {}: {c:.2} CPU-s per million requests",
            a.pid.unwrap_or(0)
        );
    }
    if let Some(p) = &a.json {
        write_json(
            p,
            &RunJson {
                target: a.target.to_string(),
                scenario: &sc,
                proxy_cpu_s_per_m: per_m,
                summary: &s,
            },
        )?;
    }
    if let Some(d) = &a.plot_dir {
        single_plots(d, &a.target.to_string(), &s)?;
    }
    Ok(())
}

fn cmd_compare(a: CompareArgs, ctl: &Control) -> Result<(), Error> {
    if a.workload.scenario.is_none() {
        return Err(Error::Config(
            "compare needs --scenario (see perf/scenarios/); flags then override it".into(),
        ));
    }
    let mut sc = scenario_from(&a.workload, "compare")?;
    apply_load(&mut sc, &a.load);
    if let Some(r) = a.rounds {
        sc.rounds = r;
    }
    if let Some(w) = a.warmup {
        sc.warmup = w;
    }
    if let Some(p) = a.preload {
        sc.preload = p;
    }
    sc.validate()?;
    let r = compare(
        &sc,
        &CompareOptions {
            keep: a.keep,
            progress: true,
        },
        ctl,
    )?;
    if a.markdown {
        println!("{}\n", r.conditions());
        print!("{}", r.markdown());
        for e in r.error_lines() {
            println!("\nerrors: {e}");
        }
        for p in r.push_lines() {
            println!("\npush: {p}");
        }
        for n in &r.notes {
            println!("\nnote: {n}");
        }
    } else {
        print!("{}", r.text());
    }
    if let Some(dir) = &a.out {
        write_json(&dir.join("result.json"), &r)?;
        for p in plot::compare_plots(dir, &r)? {
            eprintln!("wrote {}", p.display());
        }
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct ReplayJson<'a> {
    target: String,
    input: String,
    speed: String,
    commands: usize,
    connections: usize,
    skipped: &'a BTreeMap<String, u64>,
    summary: &'a RunSummary,
}

fn cmd_replay(a: ReplayArgs, ctl: &Control) -> Result<(), Error> {
    check_loopback(a.target)?;
    let format = a.format.map(|f| match f {
        FormatArg::Monitor => Format::Monitor,
        FormatArg::Trace => Format::Trace,
    });
    let trace = trace::load(
        &a.input,
        format,
        &ReadOptions {
            include_lua: a.include_lua,
            max_events: a.requests,
        },
    )?;
    let db = match a.db {
        DbArg::Ignore => DbMode::Ignore,
        DbArg::Select => DbMode::Select,
    };
    let plan = ReplayPlan::new(&trace, a.connections, db);
    if plan.is_empty() {
        return Err(Error::Input(format!(
            "{}: no command to replay",
            a.input.display()
        )));
    }
    eprintln!(
        "replaying {} commands from {} clients over {} connections (recorded over {:.3} s), speed {:?}",
        plan.len(),
        trace.clients,
        plan.pools.len(),
        plan.recorded_secs(),
        a.speed
    );
    for (why, n) in &trace.skipped {
        eprintln!("  skipped {n}: {why}");
    }
    let names = plan.names.clone();
    let n = plan.len();
    let conns = plan.pools.len();
    let expected_ms = match a.speed {
        Speed::Scaled(f) => (plan.recorded_secs() / f * 1000.0) as u64,
        Speed::Max => a.duration.as_millis() as u64,
    };
    let pb = progress_bar(expected_ms.min(a.duration.as_millis() as u64));
    // At most 3600 timeline intervals, at least one second each.
    let interval = Duration::from_secs(1).max(a.duration / 3600);
    let rec = match a.speed {
        Speed::Scaled(f) => {
            let mut sched = ListSchedule::new(plan.timed(f));
            let pools = Arc::new(plan.pools);
            with_progress(&pb, 0, "replay", ctl, || {
                run_open(
                    &OpenConfig {
                        addr: a.target,
                        duration: a.duration,
                        max_requests: n as u64,
                        drain: Duration::from_secs(5),
                        interval,
                    },
                    pools,
                    &mut sched,
                    ctl,
                )
            })?
        }
        Speed::Max => {
            let pools = Arc::new(plan.pools);
            with_progress(&pb, 0, "replay", ctl, || {
                run_closed(
                    &ClosedConfig {
                        addr: a.target,
                        connections: conns,
                        pipeline: a.pipeline,
                        threads: 1,
                        duration: a.duration,
                        max_requests: n as u64,
                        cycle: false,
                        reply_timeout: Duration::from_secs(5),
                        interval,
                    },
                    pools,
                    ctl,
                )
            })?
        }
    };
    pb.finish_and_clear();
    let s = rec.summary(&names);
    print!("{}", run_text(&a.target.to_string(), &s));
    if let Some(p) = &a.json {
        write_json(
            p,
            &ReplayJson {
                target: a.target.to_string(),
                input: a.input.display().to_string(),
                speed: format!("{:?}", a.speed),
                commands: n,
                connections: conns,
                skipped: &trace.skipped,
                summary: &s,
            },
        )?;
    }
    if let Some(d) = &a.plot_dir {
        single_plots(d, &a.target.to_string(), &s)?;
    }
    Ok(())
}

fn write_trace_file(path: &Path, t: &Trace) -> Result<(), Error> {
    let f = std::fs::File::create(path)
        .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
    let mut w = std::io::BufWriter::new(f);
    trace::write_trace(&mut w, t)?;
    w.flush()?;
    Ok(())
}

fn cmd_record(a: RecordArgs, ctl: &Control) -> Result<(), Error> {
    let t = respway_perf::record::record(
        &respway_perf::record::RecordConfig {
            addr: a.target,
            duration: a.duration,
            max_commands: a.max_commands,
            include_lua: a.include_lua,
        },
        ctl,
    )?;
    write_trace_file(&a.out, &t)?;
    eprintln!(
        "recorded {} commands from {} clients into {}",
        t.events.len(),
        t.clients,
        a.out.display()
    );
    for (why, n) in &t.skipped {
        eprintln!("  skipped {n}: {why}");
    }
    Ok(())
}

fn cmd_convert(a: ConvertArgs) -> Result<(), Error> {
    let t = trace::load(
        &a.input,
        Some(Format::Monitor),
        &ReadOptions {
            include_lua: a.include_lua,
            ..ReadOptions::default()
        },
    )?;
    write_trace_file(&a.out, &t)?;
    eprintln!(
        "converted {} commands from {} clients into {}",
        t.events.len(),
        t.clients,
        a.out.display()
    );
    for (why, n) in &t.skipped {
        eprintln!("  skipped {n}: {why}");
    }
    Ok(())
}

fn cmd_generate(a: GenerateArgs) -> Result<(), Error> {
    let sc = scenario_from(&a.workload, "generate")?;
    let clients = a.clients.max(1);
    let mut gens = (0..clients)
        .map(|c| Generator::new(&sc.workload, u64::from(c)))
        .collect::<Result<Vec<_>, _>>()?;
    let f = std::fs::File::create(&a.out)
        .map_err(|e| Error::Input(format!("{}: {e}", a.out.display())))?;
    let mut w = std::io::BufWriter::new(f);
    trace::write_header(&mut w)?;
    let mut line = Vec::new();
    for i in 0..a.requests {
        let c = (i % u64::from(clients)) as u32;
        let (_, args) = gens[c as usize].next_args();
        let offset_us = if a.rate > 0.0 {
            (i as f64 * 1e6 / a.rate) as u64
        } else {
            0
        };
        line.clear();
        trace::write_event(
            &mut line,
            &Event {
                offset_us,
                client: c,
                db: 0,
                args,
            },
        );
        w.write_all(&line)?;
    }
    w.flush()?;
    eprintln!("wrote {} commands to {}", a.requests, a.out.display());
    Ok(())
}

fn cmd_plot(a: PlotArgs) -> Result<(), Error> {
    let text = std::fs::read_to_string(&a.input)
        .map_err(|e| Error::Input(format!("{}: {e}", a.input.display())))?;
    let r: CompareResult = serde_json::from_str(&text)
        .map_err(|e| Error::Input(format!("{}: {e}", a.input.display())))?;
    for p in plot::compare_plots(&a.out, &r)? {
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn cmd_sink(a: SinkArgs, ctl: &Control) -> Result<(), Error> {
    check_loopback(a.listen).map_err(|e| Error::Config(format!("--listen: {e}")))?;
    let cfg = respway_perf::sink::SinkConfig {
        reply_size: a.reply_size,
        duration: a.duration,
    };
    cfg.validate()?;
    let l = std::net::TcpListener::bind(a.listen)
        .map_err(|e| Error::Run(format!("sink: cannot listen on {}: {e}", a.listen)))?;
    let addr = l.local_addr()?;
    // The bound address, once, for scripts that asked for port 0.
    println!("{addr}");
    std::io::stdout().flush()?;
    let s = respway_perf::sink::run_sink(l, &cfg, ctl)?;
    eprintln!(
        "sink {addr}: {} commands answered over {} connections, {} protocol errors",
        s.commands, s.connections, s.protocol_errors
    );
    Ok(())
}

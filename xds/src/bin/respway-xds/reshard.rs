//! `respway-xds reshard`: its arguments, and the exit code of each verb
//! (`respway_xds::reshard` does the work).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use respway_xds::reshard::{self, Out, Outcome, Stop};

use crate::AdminClient;

#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "the arguments, parsed once per run"
)]
pub(crate) enum Reshard {
    /// Plan, then run every phase (or continue the reshard --state records).
    Start {
        /// The server's admin address.
        #[arg(long, default_value = "127.0.0.1:18001")]
        admin: String,
        /// A resource file (repeatable): each defining --listener is edited and applied
        /// under its file name in every phase (its route on --from, no mirror); the mover
        /// reads both clusters from whichever defines them.
        #[arg(long = "file", required = true)]
        files: Vec<PathBuf>,
        /// The route's listener.
        #[arg(long)]
        listener: String,
        /// The route's prefix (default: the catch-all route). The mover moves the route's keys
        /// only: those of its prefix but of no longer prefix of another route (the catch-all:
        /// of no prefix route). Refused for a route with `remove_prefix: true`, and while such
        /// a route uses --from or --to.
        #[arg(long)]
        route: Option<String>,
        /// The cluster the keys leave.
        #[arg(long)]
        from: String,
        /// The cluster the keys go to.
        #[arg(long)]
        to: String,
        /// The state file (written after every step).
        #[arg(long)]
        state: PathBuf,
        /// The mover's keys sent per second at most (default: no limit, the mover's own
        /// speed).
        #[arg(long)]
        rate: Option<u64>,
        /// The mover's bytes per second.
        #[arg(long)]
        bytes_rate: Option<u64>,
        /// The mover's largest key moved, in bytes (a bigger one is listed and stops the
        /// phase; the mover's default when left out).
        #[arg(long)]
        max_key_bytes: Option<u64>,
        /// Start without asking after the plan.
        #[arg(long)]
        yes: bool,
        /// How long each push waits for every sidecar's ACK, in seconds.
        #[arg(long, default_value_t = 30)]
        ack_timeout: u64,
        /// A node id not waited for (a sidecar gone for good); repeatable.
        #[arg(long)]
        ignore_node: Vec<String>,
        /// Copy mode (to another deployment: dual write, backfill, a short write pause,
        /// cut-over, cleanup) instead of move mode (MIGRATE between shards that reach each
        /// other).
        #[arg(long, conflicts_with_all = ["bytes_rate", "max_key_bytes"])]
        copy: bool,
        /// With --copy: stop once writes resumed on --to (still copied to --from, so `abort`
        /// can go back); `resume` then pushes the final configuration and cleans up.
        #[arg(long, requires = "copy")]
        hold: bool,
        #[command(flatten)]
        client: AdminClient,
        #[command(flatten)]
        metrics: MetricsArgs,
    },
    /// Print the phase, the versions applied, the sidecars' ACKs and the mover's progress.
    Status {
        #[arg(long)]
        state: PathBuf,
        #[command(flatten)]
        client: AdminClient,
    },
    /// Stop the running mover (its checkpoint keeps its place) and the run.
    Pause {
        #[arg(long)]
        state: PathBuf,
    },
    /// Continue from where --state stopped.
    Resume {
        #[arg(long)]
        state: PathBuf,
        #[command(flatten)]
        client: AdminClient,
        #[command(flatten)]
        metrics: MetricsArgs,
    },
    /// Move the keys back to --from and push the original file.
    Abort {
        #[arg(long)]
        state: PathBuf,
        #[command(flatten)]
        client: AdminClient,
        #[command(flatten)]
        metrics: MetricsArgs,
    },
}

/// The run's metrics endpoint (move mode).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MetricsArgs {
    /// Serve `GET /metrics` (Prometheus text format) on this IP:PORT while the run lasts:
    /// the phase, the plan's keys and the mover's counters (port 0: any free port; the
    /// address bound is printed on stderr as `metrics: http://ADDR/metrics`).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Keep serving /metrics this many seconds after the run ends (at least the scrape
    /// interval, so that Prometheus records how it ended).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 0,
        requires = "metrics"
    )]
    metrics_linger: u64,
}

/// Runs a `reshard` verb. Exit codes: 0 done, 1 stopped (the state says why; `resume`
/// continues), 2 usage (nothing done), 3 paused.
pub(crate) async fn run(action: Reshard) -> ExitCode {
    let mut out = Out::default();
    let metrics = match &action {
        Reshard::Start { metrics, .. }
        | Reshard::Resume { metrics, .. }
        | Reshard::Abort { metrics, .. } => Some(metrics.clone()),
        Reshard::Status { .. } | Reshard::Pause { .. } => None,
    };
    let linger = metrics.as_ref().map_or(0, |m| m.metrics_linger);
    if let Some(addr) = metrics.and_then(|m| m.metrics) {
        match out.serve_metrics(&addr).await {
            Ok(bound) => eprintln!("metrics: http://{bound}/metrics"),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        }
    }
    let auth = |c: &AdminClient| c.load().map_err(Stop::Usage);
    let result = match action {
        Reshard::Start {
            admin,
            files,
            listener,
            route,
            from,
            to,
            state,
            rate,
            bytes_rate,
            max_key_bytes,
            yes,
            ack_timeout,
            ignore_node,
            copy,
            hold,
            client,
            metrics: _,
        } => match auth(&client) {
            Ok(auth) => {
                let start = reshard::Start {
                    admin,
                    auth,
                    files,
                    route: reshard::RouteRef {
                        listener,
                        prefix: route,
                    },
                    from,
                    to,
                    state,
                    rate,
                    bytes_rate,
                    max_key_bytes,
                    yes,
                    ack_timeout: Duration::from_secs(ack_timeout),
                    ignore_nodes: ignore_node,
                    hold,
                    mode: if copy {
                        reshard::Mode::Copy
                    } else {
                        reshard::Mode::Move
                    },
                };
                reshard::start(start, &mut out).await
            }
            Err(e) => Err(e),
        },
        Reshard::Status { state, client } => match auth(&client) {
            Ok(auth) => reshard::status(&state, &auth, &mut out)
                .await
                .map(|()| Outcome::Done),
            Err(e) => Err(e),
        },
        Reshard::Pause { state } => reshard::pause(&state, &mut out)
            .await
            .map(|()| Outcome::Done),
        Reshard::Resume { state, client, .. } => match auth(&client) {
            Ok(auth) => reshard::resume(&state, &auth, &mut out).await,
            Err(e) => Err(e),
        },
        Reshard::Abort { state, client, .. } => match auth(&client) {
            Ok(auth) => reshard::abort(&state, &auth, &mut out).await,
            Err(e) => Err(e),
        },
    };
    let (code, usage) = match &result {
        Ok(Outcome::Done) => (ExitCode::SUCCESS, false),
        Ok(Outcome::Paused) => (ExitCode::from(3), false),
        Err(Stop::Failed(e)) => {
            eprintln!("{e}");
            (ExitCode::FAILURE, false)
        }
        Err(Stop::Usage(e)) => {
            eprintln!("{e}");
            (ExitCode::from(2), true)
        }
    };
    // A usage error did nothing: no figures worth a scrape.
    if !usage {
        out.linger(Duration::from_secs(linger)).await;
    }
    code
}

//! `respway --config FILE | --bootstrap FILE [--workers N] [--zone Z]`: the sidecar binary
//! (and its tools: `respway hotkeys`, `respway import-nutcracker FILE`).
//! Parses arguments, loads the configuration (a static file, the embedded default, or a
//! bootstrap with an xDS management server), starts the workers and waits for signals.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::Parser;
use respway::bootstrap::Bootstrap;
use respway::ConfigHandle;
use respway_filters::model::Config;

/// jemalloc, built with a background thread that returns freed memory to the system after
/// 1 s (`.cargo/config.toml`): connections that close give their memory back.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Set once the log subscriber is installed; the admin endpoint's `POST /logging` uses it.
static SET_LEVEL: OnceLock<SetLevel> = OnceLock::new();

/// Sets the log filter (`info`, `debug,respway::upstream=trace`, ...).
type SetLevel = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// `--version`: the package version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RESPWAY_GIT_COMMIT"),
    ")"
);

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// One human-readable line per event (colours only when stderr is a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

/// Tools that talk to a running respway.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Prints the hottest keys of a running respway (its `/hotkeys`), like
    /// `redis-cli --hotkeys`.
    Hotkeys {
        /// The running respway's --admin address.
        #[arg(long)]
        admin: std::net::SocketAddr,
    },
    /// Converts a nutcracker (twemproxy) configuration to respway's YAML, placement kept,
    /// and prints it (errors, each naming the pool and the key, go to stderr: exit 1).
    ImportNutcracker {
        /// The nutcracker YAML file.
        file: PathBuf,
    },
}

/// Fetches `/hotkeys` from `admin` and prints it as redis-cli `--hotkeys` does.
fn hotkeys(admin: std::net::SocketAddr) -> ExitCode {
    use std::io::Read as _;
    let fetch = || -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET /hotkeys HTTP/1.0\r\nHost: {admin}\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    };
    let body = match fetch() {
        Ok(r) => match r.split_once("\r\n\r\n") {
            Some((head, body))
                if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") =>
            {
                body.to_string()
            }
            _ => {
                eprintln!(
                    "respway hotkeys: {admin}: unexpected answer: {}",
                    r.lines().next().unwrap_or("")
                );
                return ExitCode::from(1);
            }
        },
        Err(e) => {
            eprintln!("respway hotkeys: {admin}: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n# Hot keys reported by respway's hot-key detection ({admin}).\n"
    );
    let _ = writeln!(out, "-------- summary -------\n");
    for line in body.lines() {
        if let Some(c) = line.strip_prefix("cluster ") {
            let _ = writeln!(out, "cluster {c}:");
        } else if let Some((n, key)) = line.split_once(' ') {
            let _ = writeln!(out, "hot key found with counter: {n}\tkeyname: {key}");
        }
    }
    ExitCode::SUCCESS
}

/// Prints `file` converted from nutcracker's YAML to respway's (exit 0), or every error (exit 1).
fn import_nutcracker(file: &std::path::Path) -> ExitCode {
    match respway_xds::nutcracker::import_file(file) {
        Ok(yaml) => {
            let _ = std::io::stdout().lock().write_all(yaml.as_bytes());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::from(1)
        }
    }
}

/// A Redis data plane: speak RESP to it, and it spreads keys over many Redis shards.
#[derive(Debug, Parser)]
#[command(version = VERSION)]
struct Args {
    /// Static configuration (YAML; a nutcracker file is converted first, see
    /// `import-nutcracker`). Without it (and without --bootstrap): listen on
    /// 127.0.0.1:6380, one upstream at 127.0.0.1:6379. SIGHUP reloads it.
    #[arg(long, short, conflicts_with = "bootstrap")]
    config: Option<PathBuf>,
    /// Bootstrap (YAML): node id and zone, the xDS management server, static resources.
    #[arg(long)]
    bootstrap: Option<PathBuf>,
    /// Worker threads (default: the number of cores).
    #[arg(long)]
    workers: Option<usize>,
    /// The zone this sidecar runs in, for zone-local reads (overrides the config's or the
    /// bootstrap's `node.zone`).
    #[arg(long, env = "RESPWAY_ZONE")]
    zone: Option<String>,
    /// Only validate the configuration, then exit (0 = valid, 2 = invalid).
    #[arg(long)]
    check: bool,
    /// On SIGTERM/SIGINT: stop accepting, answer every command already read, then exit 0;
    /// sessions still open after this many seconds are closed (Envoy's `--drain-time-s`).
    #[arg(long, default_value_t = 5.0)]
    drain_time_s: f64,
    /// Serve the admin endpoint (/metrics, /stats, /ready, /healthz) on this address, e.g.
    /// 127.0.0.1:9901. Off by default.
    #[arg(long, value_name = "ADDR")]
    admin: Option<std::net::SocketAddr>,
    /// Let --admin bind a non-loopback address (the admin endpoint has no authentication).
    #[arg(long)]
    admin_allow_non_loopback: bool,
    /// The admin endpoint's address as others reach it, sent to the xDS management server in
    /// `node.metadata` (`respway_admin`) instead of the bound one (which is useless to them
    /// when --admin binds 0.0.0.0).
    #[arg(long, value_name = "IP:PORT", requires = "admin")]
    admin_advertise: Option<std::net::SocketAddr>,
    /// Hot-key detection takes one key in this many (0 turns it off); see /hotkeys.
    #[arg(long, default_value_t = respway::hotkeys::DEFAULT_SAMPLE)]
    hot_key_sample: u64,
    /// Commands at least this slow (µs, dispatch to reply) go to the slow log (SLOWLOG GET,
    /// /slowlog), like Redis's slowlog-log-slower-than.
    #[arg(long, default_value_t = respway::slowlog::DEFAULT_THRESHOLD_US)]
    slowlog_threshold_us: u64,
    /// Slow-log entries kept per worker, like Redis's slowlog-max-len.
    #[arg(long, default_value_t = respway::slowlog::DEFAULT_MAX_LEN)]
    slowlog_max_len: usize,
    /// Do not learn from the shards the commands the built-in table lacks (no connection of
    /// its own per endpoint; such commands are then unknown).
    #[arg(long)]
    no_command_learning: bool,
    #[command(subcommand)]
    command: Option<Command>,
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log level (error, warn, info, debug, trace) or a tracing filter
    /// (`info,respway::upstream=debug`); RUST_LOG, when set, takes precedence.
    #[arg(long, default_value = "info")]
    log_level: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match &args.command {
        Some(Command::Hotkeys { admin }) => return hotkeys(*admin),
        Some(Command::ImportNutcracker { file }) => return import_nutcracker(file),
        None => {}
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log_level));
    let filter = match filter {
        Ok(f) => f,
        Err(e) => {
            eprintln!("respway: --log-level {}: {e}", args.log_level);
            return ExitCode::from(2);
        }
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // The admin endpoint's POST /logging changes the filter through a reload handle.
    fn setter<S: Send + Sync + 'static>(
        h: tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, S>,
    ) -> SetLevel {
        Arc::new(move |level: &str| {
            let f = tracing_subscriber::EnvFilter::try_new(level).map_err(|e| e.to_string())?;
            h.reload(f).map_err(|e| e.to_string())
        })
    }
    let set_level: SetLevel = match args.log_format {
        LogFormat::Text => {
            let b = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .with_filter_reloading();
            let h = b.reload_handle();
            b.init();
            setter(h)
        }
        LogFormat::Json => {
            let b = tracing_subscriber::fmt()
                .json()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .with_filter_reloading();
            let h = b.reload_handle();
            b.init();
            setter(h)
        }
    };
    let _ = SET_LEVEL.set(set_level);
    let bootstrap = match &args.bootstrap {
        Some(path) => match Bootstrap::load(path) {
            Ok(b) => Some(b),
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let static_config = match (&args.config, &bootstrap) {
        (Some(path), _) => match respway_xds::load_file(path) {
            Ok(c) => Some(c),
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        (None, Some(b)) => b.static_config.clone(),
        (None, None) => Some(respway_xds::default_config()),
    };
    let zone = args
        .zone
        .clone()
        .or_else(|| bootstrap.as_ref().and_then(|b| b.zone.clone()));
    if args.check {
        match &static_config {
            Some(c) => {
                let errors = respway::check_files(c);
                if !errors.is_empty() {
                    for e in &errors {
                        eprintln!("{e}");
                    }
                    return ExitCode::from(2);
                }
                let endpoints: usize = c
                    .clusters
                    .iter()
                    .flat_map(|c| &c.shards)
                    .map(|s| s.endpoints.len())
                    .sum();
                let n = |k: usize, one: &str, many: &str| {
                    format!("{k} {}", if k == 1 { one } else { many })
                };
                let _ = writeln!(
                    std::io::stdout().lock(),
                    "config OK: {}, {}, {}",
                    n(c.listeners.len(), "listener", "listeners"),
                    n(c.clusters.len(), "cluster", "clusters"),
                    n(endpoints, "endpoint", "endpoints")
                );
                for note in respway_filters::routing::shared_primary_notes(c) {
                    let _ = writeln!(std::io::stdout().lock(), "note: {note}");
                }
            }
            None => {
                let _ = writeln!(
                    std::io::stdout().lock(),
                    "bootstrap OK: resources come from the xDS management server"
                );
            }
        }
        return ExitCode::SUCCESS;
    }
    respway_xds::raise_open_files_limit();
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("respway: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(run(args, bootstrap, static_config, zone, workers))
}

async fn run(
    args: Args,
    bootstrap: Option<Bootstrap>,
    static_config: Option<Config>,
    zone: Option<String>,
    workers: usize,
) -> ExitCode {
    let with_zone = |c: Config| with_zone(c, &zone);
    // The xDS client runs on this (main) thread's runtime (respway::xds); it applies through
    // the server's config handle once the server runs. Without static resources the first
    // configuration it receives starts the server.
    let config_events = Arc::new(respway::admin::ConfigEvents::default());
    // The admin endpoint is bound first (served once the server runs), so that the xDS client
    // names its real address (port 0 resolved) to the management server from its first stream.
    let admin_socket = match args.admin {
        Some(addr) => match respway::admin::bind(addr, args.admin_allow_non_loopback) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("respway: --admin: {e}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let advertised = admin_socket
        .as_ref()
        .map(|s| args.admin_advertise.unwrap_or(s.local_addr()));
    if let Some(a) = advertised.filter(|a| a.ip().is_unspecified()) {
        tracing::warn!(admin = %a, "the admin endpoint is named to the xDS server by an unspecified address; pass --admin-advertise IP:PORT");
    }
    let xds_cfg = match bootstrap.as_ref() {
        Some(b) => match respway::xds::client_config(b, zone.clone()) {
            Ok(c) => c.map(|mut c| {
                c.admin = advertised.map(|a| a.to_string());
                c
            }),
            Err(e) => {
                eprintln!("respway: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let mut feed: Option<respway::xds::Feed> = None;
    let config = match static_config {
        Some(c) => with_zone(c),
        None => {
            let Some(cfg) = xds_cfg.clone() else {
                eprintln!("respway: no static resources and no xDS server");
                return ExitCode::from(2);
            };
            tracing::info!("no static resources: waiting for the first configuration from xDS");
            let f = feed.insert(respway::xds::Feed::spawn(cfg, config_events.clone(), None));
            match f.first().await {
                Some(c) => c,
                None => return ExitCode::from(1),
            }
        }
    };
    let server = match respway::start(
        config,
        respway::Options {
            workers,
            hot_key_sample: args.hot_key_sample,
            slowlog_threshold_us: args.slowlog_threshold_us,
            slowlog_max_len: args.slowlog_max_len,
            learn_commands: !args.no_command_learning,
        },
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("respway: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(f) = &feed {
        f.attach(server.config_handle());
    }
    let drain_requested = Arc::new(tokio::sync::Notify::new());
    let hooks = respway::admin::Hooks {
        config_events: Some(config_events.clone()),
        set_log_level: SET_LEVEL.get().cloned(),
        drain: Some({
            let n = drain_requested.clone();
            Arc::new(move || n.notify_one())
        }),
    };
    let _admin = match admin_socket {
        Some(socket) => match socket.serve(&server, hooks) {
            Ok(a) => Some(a),
            Err(e) => {
                eprintln!("respway: --admin: {e}");
                server.shutdown();
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    // Static resources are served first; xDS updates (if configured) follow. (The client
    // task runs on its own; the feed is kept for its status.)
    let _feed = feed.or_else(|| {
        let handle = Some(server.config_handle());
        xds_cfg.map(|cfg| respway::xds::Feed::spawn(cfg, config_events.clone(), handle))
    });
    for a in server.local_addrs() {
        tracing::info!(address = %a, workers, "listening");
    }
    signals(
        server.config_handle(),
        args.config.clone(),
        zone.clone(),
        drain_requested,
        config_events.clone(),
    )
    .await;
    let drain = Duration::from_secs_f64(args.drain_time_s.max(0.0));
    tracing::info!(?drain, "draining");
    let cut = tokio::task::spawn_blocking(move || server.drain(drain))
        .await
        .unwrap_or(0);
    if cut > 0 {
        tracing::warn!(sessions = cut, "sessions closed by the drain timeout");
    }
    ExitCode::SUCCESS
}

/// The sidecar's zone (`--zone`, else the bootstrap's `node.zone`), when it has one, over a
/// configuration from a file (static resources, `--config`, a SIGHUP reload); the one place
/// it is set — a configuration from xDS has it already, as the node's zone the client sends.
fn with_zone(mut c: Config, zone: &Option<String>) -> Config {
    if zone.is_some() {
        c.zone = zone.clone();
    }
    c
}

/// Waits for signals: SIGHUP reloads the static config file (every setting but the listener
/// set can change this way, without dropping a request); SIGINT/SIGTERM return.
async fn signals(
    handle: ConfigHandle,
    path: Option<PathBuf>,
    zone: Option<String>,
    drain_requested: Arc<tokio::sync::Notify>,
    events: Arc<respway::admin::ConfigEvents>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut hup), Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    loop {
        tokio::select! {
            _ = hup.recv() => {
                let Some(path) = &path else {
                    tracing::warn!("SIGHUP: no --config file to reload");
                    continue;
                };
                match respway_xds::load_file(path) {
                    Ok(config) => {
                        match handle.apply(with_zone(config, &zone)) {
                            Ok(v) => {
                                events.applied("file");
                                tracing::info!(version = v, "configuration reloaded");
                            }
                            Err(e) => {
                                events.refused("file");
                                tracing::error!(error = %e, "reload refused; the last good configuration stays");
                            }
                        }
                    }
                    Err(errors) => {
                        events.refused("file");
                        tracing::error!(%errors, "reload refused; the last good configuration stays");
                    }
                }
            }
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = drain_requested.notified() => return,
        }
    }
}

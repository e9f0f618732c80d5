//! `respway --config FILE [--workers N]`: the sidecar binary. Parses arguments, loads the
//! configuration (or the embedded default), starts the workers and waits for a signal.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// A Redis data plane: speak RESP to it, and it spreads keys over many Redis shards.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Static configuration (YAML). Without it: listen on 127.0.0.1:6380, one upstream at
    /// 127.0.0.1:6379.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Worker threads (default: the number of cores).
    #[arg(long)]
    workers: Option<usize>,
    /// The zone this sidecar runs in, for zone-local reads (overrides `RESPWAY_ZONE` and the
    /// config's `node.zone`).
    #[arg(long, env = "RESPWAY_ZONE")]
    zone: Option<String>,
    /// Only validate the configuration, then exit (0 = valid, 2 = invalid).
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut config = match &args.config {
        Some(path) => match respway_xds::load_file(path) {
            Ok(c) => c,
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        None => respway_xds::default_config(),
    };
    if args.zone.is_some() {
        config.zone = args.zone.clone();
    }
    if args.check {
        return ExitCode::SUCCESS;
    }
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let server = match respway::start(config, respway::Options { workers }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("respway: {e}");
            return ExitCode::from(1);
        }
    };
    for a in server.local_addrs() {
        tracing::info!(address = %a, workers, "listening");
    }
    // The main thread waits for signals: SIGHUP reloads the static config file (every
    // setting but the listener set can change this way, without dropping a request);
    // SIGINT/SIGTERM stop the workers.
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
    let handle = server.config_handle();
    let zone = args.zone.clone();
    let path = args.config.clone();
    rt.block_on(async move {
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
                        Ok(mut config) => {
                            if zone.is_some() {
                                config.zone = zone.clone();
                            }
                            match handle.apply(config) {
                                Ok(v) => tracing::info!(version = v, "configuration reloaded"),
                                Err(e) => tracing::error!(error = %e, "reload refused; the last good configuration stays"),
                            }
                        }
                        Err(errors) => tracing::error!(%errors, "reload refused; the last good configuration stays"),
                    }
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
    });
    server.shutdown();
    ExitCode::SUCCESS
}

//! The sidecar's admin HTTP endpoint (HTTP/1.1, hyper), like Envoy's admin: on its own
//! address, loopback unless explicitly allowed, served by a thread of its own so that it
//! never runs on a worker.
//!
//! - `GET /metrics`: Prometheus text format (`respway_*`).
//! - `GET /stats`: per listener and command, calls, errors and latency percentiles
//!   (p50/p90/p99/p99.9/p99.99/max), human-readable.
//! - `GET /hotkeys`: the hottest keys per cluster (hot-key detection, see
//!   [`crate::hotkeys`]): `cluster NAME` lines, then `COUNT KEY` lines, hottest first.
//! - `GET /slowlog`: the slow log of every listener, newest first: one line per command with
//!   its id, time, duration, cluster/shard, client, and the command with its first argument.
//! - `GET /clusters`: every cluster, shard and endpoint of the configuration served, with
//!   role, zone, how many workers see it healthy, dedicated connections open, requests,
//!   upstream latency, errors, and while it is out (see [`crate::upstream::EndpointStats`])
//!   since when and why.
//! - `GET /config_dump`: the configuration served, as the YAML file would say it
//!   ([`respway_xds::config_dump`]: the schema's keys and units, `# version: N` first, secrets
//!   shown as `<redacted>`); `?include_defaults` shows the settings at their default too,
//!   `?format=json` gives the same tree as JSON (`{"version": N, "config": ..., "notes": [...]}`).
//! - `GET /healthz`: 200 while the process serves.
//! - `POST /logging?level=LEVEL`: changes the log filter (`debug`, `info,respway=trace`, ...)
//!   when the process gave a way to ([`Hooks`]).
//! - `POST /drain`: drains and stops the process as SIGTERM does, when it gave a way to.
//! - `GET /ready`: 200 when a configuration is applied and, for every cluster a listener
//!   routes to, every shard's primary answers a `PING` (any reply but `-LOADING`) within
//!   500 ms; else 503 naming the unreachable shards. Probed at each request.
//!
//! At most [`MAX_CONNECTIONS`] connections are open at once (the oldest is closed for a new
//! one), and each must send a complete request head within [`HEADER_TIMEOUT`] of its accept or
//! of its previous response: idle clients cannot use up the process's file descriptors.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use respway_filters::model::Role;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

use crate::listener::AcceptBackoff;
use crate::metrics::{bucket_upper_us, AcceptSocket, ACCEPT_REASONS, BUCKETS};
use crate::stats::Registry;
use crate::ConfigHandle;

/// Keys per cluster `/hotkeys` lists.
const HOTKEYS_SHOWN: usize = 16;
/// Keys per cluster exported as metrics.
const HOTKEYS_METRICS: usize = 5;

/// How long `/ready` waits for each primary's `PING`.
const READY_PROBE: Duration = Duration::from_millis(500);

/// A running admin endpoint; dropping it stops it.
#[derive(Debug)]
pub struct Admin {
    addr: SocketAddr,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl Admin {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sets the log filter; an error names what is wrong with it.
pub type SetLogLevel = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Outcomes of configuration changes from one source (`xds` or `file`), for metrics.
#[derive(Debug, Default)]
pub struct ConfigEvents {
    sources: std::sync::Mutex<std::collections::BTreeMap<&'static str, SourceEvents>>,
}

#[derive(Debug, Default, Clone)]
struct SourceEvents {
    applied: u64,
    refused: u64,
    last_applied: Option<u64>,
    last_refused: Option<u64>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ConfigEvents {
    /// A configuration from `source` was applied (for xDS: ACKed).
    pub fn applied(&self, source: &'static str) {
        let mut m = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(source).or_default();
        e.applied += 1;
        e.last_applied = Some(unix_now());
    }

    /// A configuration from `source` was refused (for xDS: NACKed); the last good one stays.
    pub fn refused(&self, source: &'static str) {
        let mut m = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(source).or_default();
        e.refused += 1;
        e.last_refused = Some(unix_now());
    }
}

/// What the admin endpoint may do to the process beyond reading it (set by the binary).
#[derive(Clone, Default)]
pub struct Hooks {
    /// Configuration changes applied and refused, by source.
    pub config_events: Option<Arc<ConfigEvents>>,
    /// Sets the log filter; an error names what is wrong with it.
    pub set_log_level: Option<SetLogLevel>,
    /// Starts draining, as SIGTERM does.
    pub drain: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("set_log_level", &self.set_log_level.is_some())
            .field("drain", &self.drain.is_some())
            .finish()
    }
}

#[derive(Clone)]
struct State {
    registry: Arc<Registry>,
    config: ConfigHandle,
    workers: usize,
    hooks: Hooks,
}

/// Starts the admin endpoint on `addr`.
///
/// # Errors
/// A non-loopback `addr` without `allow_non_loopback` (the admin endpoint has no
/// authentication), or a bind failure; both name the address.
pub fn start(
    addr: SocketAddr,
    allow_non_loopback: bool,
    server: &crate::Server,
) -> io::Result<Admin> {
    start_with(addr, allow_non_loopback, server, Hooks::default())
}

/// [`start`], with what `POST /logging` and `POST /drain` do.
///
/// # Errors
/// As [`start`].
pub fn start_with(
    addr: SocketAddr,
    allow_non_loopback: bool,
    server: &crate::Server,
    hooks: Hooks,
) -> io::Result<Admin> {
    if !addr.ip().is_loopback() && !allow_non_loopback {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "admin address {addr} is not loopback: the admin endpoint has no \
                 authentication; pass --admin-allow-non-loopback to bind it anyway"
            ),
        ));
    }
    let std_listener = std::net::TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("admin address {addr}: {e}")))?;
    std_listener.set_nonblocking(true)?;
    let bound = std_listener.local_addr()?;
    let state = State {
        registry: server.registry().clone(),
        config: server.config_handle(),
        workers: server.workers(),
        hooks,
    };
    let (stop, stop_rx) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("respway-admin".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "admin runtime");
                    return;
                }
            };
            rt.block_on(async move {
                match TcpListener::from_std(std_listener) {
                    Ok(l) => serve(l, state, stop_rx).await,
                    Err(e) => tracing::error!(error = %e, "admin listener"),
                }
            });
        })?;
    tracing::info!(address = %bound, "admin endpoint listening");
    Ok(Admin {
        addr: bound,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// Admin connections open at once; past this, the oldest is closed to make room for the new
/// one, so idle or stalled clients can neither exhaust the process's file descriptors nor
/// lock out the next scrape.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection has to send a complete request head, counted from its accept or from
/// the end of its previous response (so it also closes idle keep-alive connections).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

async fn serve(listener: TcpListener, state: State, mut stop: watch::Receiver<bool>) {
    // Open connections by accept order (the oldest first), each with what closes it. Only
    // this thread's tasks touch it, on accept and on close.
    let open: Arc<Mutex<BTreeMap<u64, oneshot::Sender<()>>>> = Arc::default();
    let mut next_id = 0u64;
    let mut backoff = AcceptBackoff::new(AcceptSocket::Admin);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    loop {
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => {
                    backoff.accepted();
                    a
                }
                Err(e) => {
                    backoff.failed(&e).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let id = next_id;
        next_id += 1;
        let (close, closed) = oneshot::channel::<()>();
        {
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            if open.len() >= MAX_CONNECTIONS {
                // Dropping its sender closes the oldest connection (even mid-request: only
                // a flood of new connections gets here).
                open.pop_first();
                tracing::debug!(
                    max = MAX_CONNECTIONS,
                    "admin connections at the limit: closed the oldest"
                );
            }
            open.insert(id, close);
        }
        let state = state.clone();
        let mut stop = stop.clone();
        let open = open.clone();
        let conn = http.serve_connection(
            TokioIo::new(stream),
            hyper::service::service_fn(move |req| handle(state.clone(), req)),
        );
        tokio::spawn(async move {
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "admin connection closed");
                    }
                }
                _ = closed => {}
                _ = stop.changed() => {}
            }
            open.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        });
    }
}

fn text(status: StatusCode, content_type: &str, body: String) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

async fn handle(
    state: State,
    req: hyper::Request<Incoming>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let plain = "text/plain; charset=utf-8";
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics(&state),
        ),
        (&Method::GET, "/stats") => text(StatusCode::OK, plain, stats(&state)),
        (&Method::GET, "/healthz") => text(StatusCode::OK, plain, "ok\n".into()),
        (&Method::POST, "/logging") => {
            let level = req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .find_map(|kv| kv.strip_prefix("level="))
                .map(|v| v.replace("%2C", ",").replace("%3D", "="));
            match (level, &state.hooks.set_log_level) {
                (None, _) => text(
                    StatusCode::BAD_REQUEST,
                    plain,
                    "POST /logging needs ?level=LEVEL\n".into(),
                ),
                (_, None) => text(
                    StatusCode::NOT_IMPLEMENTED,
                    plain,
                    "this process cannot change its log level\n".into(),
                ),
                (Some(l), Some(set)) => match set(&l) {
                    Ok(()) => {
                        tracing::info!(level = %l, "log level changed through the admin endpoint");
                        text(StatusCode::OK, plain, format!("log level: {l}\n"))
                    }
                    Err(e) => text(StatusCode::BAD_REQUEST, plain, format!("level {l}: {e}\n")),
                },
            }
        }
        (&Method::POST, "/drain") => match &state.hooks.drain {
            Some(drain) => {
                tracing::info!("drain requested through the admin endpoint");
                drain();
                text(StatusCode::OK, plain, "draining\n".into())
            }
            None => text(
                StatusCode::NOT_IMPLEMENTED,
                plain,
                "this process cannot be drained from here\n".into(),
            ),
        },
        (&Method::GET, "/clusters") => text(StatusCode::OK, plain, clusters(&state)),
        (&Method::GET, "/config_dump") => {
            let (mut json, mut defaults, mut unknown) = (false, false, Vec::new());
            for param in req.uri().query().unwrap_or("").split('&') {
                match param {
                    "" | "format=yaml" => {}
                    "format=json" => json = true,
                    "include_defaults" | "include_defaults=true" | "include_defaults=1" => {
                        defaults = true
                    }
                    other => unknown.push(other),
                }
            }
            if unknown.is_empty() {
                let snap = state.config.current();
                let dump = respway_xds::config_dump(&snap.config, defaults);
                if json {
                    text(
                        StatusCode::OK,
                        "application/json",
                        dump.to_json(snap.version),
                    )
                } else {
                    text(
                        StatusCode::OK,
                        "application/yaml",
                        dump.to_yaml(snap.version),
                    )
                }
            } else {
                text(
                    StatusCode::BAD_REQUEST,
                    plain,
                    format!(
                        "unknown parameter {}: /config_dump takes format=yaml (the default), \
                         format=json and include_defaults\n",
                        unknown.join(", ")
                    ),
                )
            }
        }
        (&Method::GET, "/slowlog") => {
            let mut o = String::new();
            for l in state.registry.listener_names() {
                let _ = writeln!(o, "listener {l}");
                for e in state.registry.slowlog(&l, usize::MAX) {
                    let args: Vec<String> =
                        e.args.iter().map(|a| crate::hotkeys::quote(a)).collect();
                    let _ = writeln!(
                        o,
                        "id={} time={} duration_us={} target={} endpoint={} upstream_us={} \
                         respway_us={} client={} name={} command={}",
                        e.id,
                        e.time,
                        e.duration_us,
                        e.target.as_deref().unwrap_or("-"),
                        e.upstream.map_or("-".to_string(), |u| u.0.to_string()),
                        e.upstream.map_or("-".to_string(), |u| u.1.to_string()),
                        e.upstream.map_or("-".to_string(), |u| {
                            e.duration_us.saturating_sub(u.1).to_string()
                        }),
                        e.client.map_or("-".to_string(), |a| a.to_string()),
                        e.name
                            .as_deref()
                            .map_or("-".to_string(), crate::hotkeys::quote),
                        args.join(" ")
                    );
                }
            }
            text(StatusCode::OK, plain, o)
        }
        (&Method::GET, "/hotkeys") => {
            let mut o = String::new();
            for (cluster, keys) in state.registry.hot_keys(None, HOTKEYS_SHOWN) {
                let _ = writeln!(o, "cluster {cluster}");
                for (k, n) in keys {
                    let _ = writeln!(o, "{n} {}", crate::hotkeys::quote(&k));
                }
            }
            text(StatusCode::OK, plain, o)
        }
        (&Method::GET, "/ready") => {
            let down = unreachable_primaries(&state).await;
            if down.is_empty() {
                text(StatusCode::OK, plain, "ready\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    plain,
                    format!("not ready: no reachable primary for {}\n", down.join(", ")),
                )
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            plain,
            "not found; try GET /metrics, /stats, /ready, /hotkeys, /slowlog, /clusters, \
             /config_dump, /healthz or POST /logging?level=LEVEL, /drain\n"
                .into(),
        ),
    })
}

/// `cluster/shard` of every shard (of a routed cluster) whose primary does not answer.
async fn unreachable_primaries(state: &State) -> Vec<String> {
    let snap = state.config.current();
    let mut probes = Vec::new();
    let mut seen = Vec::new();
    for routing in &snap.routings {
        for c in routing.routed_clusters() {
            if seen.contains(&c) {
                continue;
            }
            seen.push(c);
            let Some(cluster) = snap.config.clusters.get(c) else {
                continue;
            };
            for shard in &cluster.shards {
                let primary = shard
                    .endpoints
                    .iter()
                    .find(|e| e.role == Role::Primary)
                    .or(shard.endpoints.first());
                let name = format!("{}/{}", cluster.name, shard.name);
                let addr = primary.map(|e| e.address);
                probes.push(async move {
                    match addr {
                        Some(a) if ping(a).await => None,
                        _ => Some(name),
                    }
                });
            }
        }
    }
    futures_util::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// True when `addr` answers a `PING` with anything but `-LOADING` within [`READY_PROBE`].
async fn ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"*1\r\n$4\r\nPING\r\n").await.ok()?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await.ok()?;
        (n > 0 && !buf[..n].starts_with(b"-LOADING")).then_some(())
    };
    matches!(
        tokio::time::timeout(READY_PROBE, attempt).await,
        Ok(Some(()))
    )
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition.
fn metrics(state: &State) -> String {
    let r = &state.registry;
    let mut o = String::with_capacity(16 * 1024);
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(&mut o, "respway_build_info", "gauge", "The running build.");
    let _ = writeln!(
        o,
        "respway_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    family(
        &mut o,
        "respway_config_version",
        "gauge",
        "Version of the configuration being served (1 = the first applied).",
    );
    let _ = writeln!(
        o,
        "respway_config_version {}",
        state.config.current().version
    );
    family(&mut o, "respway_workers", "gauge", "Worker threads.");
    let _ = writeln!(o, "respway_workers {}", state.workers);
    family(
        &mut o,
        "respway_tls_certificate_expiry_timestamp_seconds",
        "gauge",
        "notAfter (Unix time) of each certificate file in use by a listener or cluster, by the setting naming it (cert, ca, client_ca); for a file of several certificates, the earliest.",
    );
    {
        let snap = state.config.current();
        let listeners = snap
            .config
            .listeners
            .iter()
            .zip(&snap.certs.listeners)
            .filter_map(|(l, t)| Some(("listener", &l.name, t.as_ref()?.1.expiry())));
        let clusters = snap
            .config
            .clusters
            .iter()
            .zip(&snap.certs.clusters)
            .filter_map(|(c, t)| Some(("cluster", &c.name, t.as_ref()?.1.expiry())));
        for (kind, name, expiry) in listeners.chain(clusters) {
            for e in expiry {
                let _ = writeln!(
                    o,
                    "respway_tls_certificate_expiry_timestamp_seconds{{{kind}=\"{}\",certificate=\"{}\"}} {}",
                    label(name),
                    e.setting,
                    e.not_after
                );
            }
        }
    }
    family(
        &mut o,
        "respway_accept_errors_total",
        "counter",
        "Failed accepts since start, process-wide, by socket (listeners: the RESP listeners; admin) and reason (emfile: out of file descriptors; enfile: the system is; other).",
    );
    for (socket, label) in [
        (AcceptSocket::Listeners, "listeners"),
        (AcceptSocket::Admin, "admin"),
    ] {
        for (i, reason) in ACCEPT_REASONS.iter().enumerate() {
            let _ = writeln!(
                o,
                "respway_accept_errors_total{{socket=\"{label}\",reason=\"{reason}\"}} {}",
                crate::metrics::accept_errors(socket, i)
            );
        }
    }
    let listeners = r.listener_names();
    let per_listener: Vec<(String, crate::stats::Totals)> = listeners
        .iter()
        .map(|l| (l.clone(), r.listener_totals(l)))
        .collect();
    type Get = fn(&crate::stats::Totals) -> u64;
    let simple: [(&str, &str, &str, Get); 12] = [
        (
            "respway_downstream_connections_active",
            "gauge",
            "Client connections open.",
            |t| t.active,
        ),
        (
            "respway_downstream_connections_total",
            "counter",
            "Client connections accepted.",
            |t| t.connections,
        ),
        (
            "respway_downstream_received_bytes_total",
            "counter",
            "Bytes read from clients.",
            |t| t.bytes_in,
        ),
        (
            "respway_downstream_sent_bytes_total",
            "counter",
            "Bytes written to clients.",
            |t| t.bytes_out,
        ),
        (
            "respway_protocol_errors_total",
            "counter",
            "Client streams closed for a RESP protocol error.",
            |t| t.protocol_errors,
        ),
        (
            "respway_unsupported_commands_total",
            "counter",
            "Commands refused as not supported.",
            |t| t.unsupported,
        ),
        (
            "respway_session_timeouts_total",
            "counter",
            "Commands the session answered with a timeout itself.",
            |t| t.timeouts,
        ),
        (
            "respway_client_output_buffer_limit_disconnections_total",
            "counter",
            "Clients disconnected for holding too many reply bytes.",
            |t| t.output_limit_closes,
        ),
        (
            "respway_auth_failures_total",
            "counter",
            "Failed AUTH attempts.",
            |t| t.auth_failures,
        ),
        (
            "respway_auth_tarpitted_total",
            "counter",
            "Failed AUTH attempts answered late, past the process's rate of failures.",
            |t| t.auth_tarpitted,
        ),
        (
            "respway_tls_handshake_failures_total",
            "counter",
            "TLS handshakes with clients that failed or timed out.",
            |t| t.tls_handshake_failures,
        ),
        (
            "respway_tls_plaintext_refused_total",
            "counter",
            "Plaintext clients on a TLS listener, closed.",
            |t| t.tls_plaintext_refused,
        ),
    ];
    for (name, kind, help, get) in simple {
        family(&mut o, name, kind, help);
        for (l, t) in &per_listener {
            let _ = writeln!(o, "{name}{{listener=\"{}\"}} {}", label(l), get(t));
        }
    }
    family(
        &mut o,
        "respway_downstream_pipeline_depth",
        "histogram",
        "Reads from clients by the commands each held (pipeline depth).",
    );
    for (l, t) in &per_listener {
        let mut cum = 0;
        for (i, n) in t.pipeline.iter().enumerate() {
            cum += n;
            let le = if i + 1 == t.pipeline.len() {
                "+Inf".to_string()
            } else {
                (1u64 << i).to_string()
            };
            let _ = writeln!(
                o,
                "respway_downstream_pipeline_depth_bucket{{listener=\"{}\",le=\"{le}\"}} {cum}",
                label(l)
            );
        }
        let _ = writeln!(
            o,
            "respway_downstream_pipeline_depth_sum{{listener=\"{}\"}} {}",
            label(l),
            t.commands
        );
        let _ = writeln!(
            o,
            "respway_downstream_pipeline_depth_count{{listener=\"{}\"}} {cum}",
            label(l)
        );
    }
    let per_cmd: Vec<(String, Vec<crate::metrics::CmdTotals>)> = listeners
        .iter()
        .map(|l| (l.clone(), r.command_totals(Some(l))))
        .collect();
    family(
        &mut o,
        "respway_commands_total",
        "counter",
        "Commands answered, by top-level command (unknown names as `other`).",
    );
    for (l, cmds) in &per_cmd {
        for c in cmds {
            let _ = writeln!(
                o,
                "respway_commands_total{{listener=\"{}\",command=\"{}\"}} {}",
                label(l),
                c.name,
                c.calls
            );
        }
    }
    family(
        &mut o,
        "respway_command_errors_total",
        "counter",
        "Commands answered with an error reply.",
    );
    for (l, cmds) in &per_cmd {
        for c in cmds {
            let _ = writeln!(
                o,
                "respway_command_errors_total{{listener=\"{}\",command=\"{}\"}} {}",
                label(l),
                c.name,
                c.failed
            );
        }
    }
    family(
        &mut o,
        "respway_command_duration_seconds",
        "histogram",
        "Time from dispatch to reply ready (respway plus upstream).",
    );
    // Buckets from 16 µs to about 2 s: four per power of two.
    let bounds: Vec<usize> = (0..BUCKETS - 1)
        .filter(|&i| (15..=2_200_000).contains(&bucket_upper_us(i)))
        .collect();
    for (l, cmds) in &per_cmd {
        let l = label(l);
        for c in cmds {
            histogram(
                &mut o,
                "respway_command_duration_seconds",
                &format!("listener=\"{l}\",command=\"{}\"", c.name),
                c,
                &bounds,
            );
        }
    }
    if let Some(ev) = &state.hooks.config_events {
        let m = ev.sources.lock().unwrap_or_else(|e| e.into_inner()).clone();
        family(
            &mut o,
            "respway_config_changes_total",
            "counter",
            "Configuration changes by source (xds, file) and outcome (applied = ACK, refused = NACK: the last good configuration stays).",
        );
        for (src, e) in &m {
            let _ = writeln!(
                o,
                "respway_config_changes_total{{source=\"{src}\",outcome=\"applied\"}} {}",
                e.applied
            );
            let _ = writeln!(
                o,
                "respway_config_changes_total{{source=\"{src}\",outcome=\"refused\"}} {}",
                e.refused
            );
        }
        family(
            &mut o,
            "respway_config_last_change_timestamp_seconds",
            "gauge",
            "Unix time of the last applied and of the last refused configuration change, by source.",
        );
        for (src, e) in &m {
            for (outcome, t) in [("applied", e.last_applied), ("refused", e.last_refused)] {
                if let Some(t) = t {
                    let _ = writeln!(o, "respway_config_last_change_timestamp_seconds{{source=\"{src}\",outcome=\"{outcome}\"}} {t}");
                }
            }
        }
    }
    family(
        &mut o,
        "respway_mirror_copies_total",
        "counter",
        "Mirrored copies per receiving cluster: queued (mirrored), dropped (queue full), failed upstream; over configuration pushes.",
    );
    for (li, l) in listeners.iter().enumerate() {
        for (cluster, c) in r.mirror_totals(li) {
            for (outcome, n) in [
                ("mirrored", c.mirrored),
                ("dropped", c.dropped),
                ("failed", c.failed),
            ] {
                let _ = writeln!(
                    o,
                    "respway_mirror_copies_total{{listener=\"{}\",cluster=\"{}\",outcome=\"{outcome}\"}} {n}",
                    label(l),
                    label(&cluster)
                );
            }
        }
    }
    family(
        &mut o,
        "respway_hot_key_rule_writes_total",
        "counter",
        "Writes under a hot-key rule fanned out to every shard (outcome: all, or partial_failure when a shard failed).",
    );
    for (li, l) in listeners.iter().enumerate() {
        for h in r.hot_key_rule_totals(li) {
            for (outcome, n) in [
                ("all", h.fanned_out_writes),
                ("partial_failure", h.partial_failures),
            ] {
                let _ = writeln!(
                    o,
                    "respway_hot_key_rule_writes_total{{listener=\"{}\",cluster=\"{}\",prefix=\"{}\",outcome=\"{outcome}\"}} {n}",
                    label(l),
                    label(&h.cluster),
                    label(&h.prefix)
                );
            }
        }
    }
    family(
        &mut o,
        "respway_hot_key_requests",
        "gauge",
        "Estimated requests of the hottest keys per cluster over the last one to two minutes (hot-key detection).",
    );
    for (cluster, keys) in r.hot_keys(None, HOTKEYS_METRICS) {
        for (k, n) in keys {
            let _ = writeln!(
                o,
                "respway_hot_key_requests{{cluster=\"{}\",key=\"{}\"}} {n}",
                label(&cluster),
                label(&String::from_utf8_lossy(&k))
            );
        }
    }
    family(
        &mut o,
        "respway_upstream_requests_total",
        "counter",
        "Requests sent to each endpoint (per-shard load; counted from when its pools were created).",
    );
    let mut endpoints = Vec::new();
    for_each_endpoint(state, |c, s, e, v| {
        let labels = format!(
            "cluster=\"{}\",shard=\"{}\",endpoint=\"{}\"",
            label(&c.name),
            label(&s.name),
            e.address
        );
        endpoints.push((labels, v.clone()));
    });
    for (labels, v) in &endpoints {
        let _ = writeln!(
            o,
            "respway_upstream_requests_total{{{labels}}} {}",
            v.requests
        );
    }
    family(
        &mut o,
        "respway_upstream_queued_requests",
        "gauge",
        "Requests waiting now in the queues of each endpoint's shared connections (not yet written).",
    );
    for (labels, v) in &endpoints {
        let _ = writeln!(
            o,
            "respway_upstream_queued_requests{{{labels}}} {}",
            v.queued
        );
    }
    family(
        &mut o,
        "respway_upstream_duration_seconds",
        "histogram",
        "Time each endpoint took per request, from the write of its batch to its reply (compare with respway_command_duration_seconds: the difference is time in respway).",
    );
    for (labels, v) in &endpoints {
        if let Some(t) = &v.latency {
            histogram(
                &mut o,
                "respway_upstream_duration_seconds",
                labels,
                t,
                &bounds,
            );
        }
    }
    let u = r.upstream_totals();
    family(
        &mut o,
        "respway_upstream_errors_total",
        "counter",
        "Requests to each endpoint that failed in respway, by kind (counted from when its pools were created).",
    );
    for (labels, v) in &endpoints {
        for (kind, n) in crate::upstream::ErrorKind::ALL.iter().zip(v.errors) {
            let _ = writeln!(
                o,
                "respway_upstream_errors_total{{{labels},kind=\"{}\"}} {n}",
                kind.name()
            );
        }
    }
    family(
        &mut o,
        "respway_upstream_healthy",
        "gauge",
        "Share of workers that have the endpoint in (1: every worker can reach it; 0: every worker has it out after a failed connect).",
    );
    for (labels, v) in &endpoints {
        let share = if v.workers == 0 {
            1.0
        } else {
            v.healthy_workers as f64 / v.workers as f64
        };
        let _ = writeln!(o, "respway_upstream_healthy{{{labels}}} {share}");
    }
    family(
        &mut o,
        "respway_upstream_ejections_total",
        "counter",
        "Times a worker took the endpoint out (a failed connect, or a connection lost right after it opened).",
    );
    for (labels, v) in &endpoints {
        let _ = writeln!(
            o,
            "respway_upstream_ejections_total{{{labels}}} {}",
            v.ejections
        );
    }
    let up: [(&str, &str, u64); 4] = [
        (
            "respway_upstream_connects_total",
            "Upstream connections opened (first connects and reconnects).",
            u.connects,
        ),
        (
            "respway_upstream_connect_failures_total",
            "Failed upstream connect attempts.",
            u.connect_failures,
        ),
        (
            "respway_upstream_stuck_connections_total",
            "Upstream connections replaced because requests on them stopped being answered.",
            u.stuck,
        ),
        (
            "respway_upstream_protocol_errors_total",
            "Upstream connections closed because the peer broke the protocol.",
            u.protocol_errors,
        ),
    ];
    for (name, help, v) in up {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {v}");
    }
    o
}

/// Writes one histogram series: cumulative `_bucket`s at `bounds`, `+Inf`, `_sum`, `_count`.
fn histogram(
    o: &mut String,
    name: &str,
    labels: &str,
    t: &crate::metrics::CmdTotals,
    bounds: &[usize],
) {
    let mut cum = 0;
    let mut next = 0;
    for &i in bounds {
        while next <= i {
            cum += t.hist[next];
            next += 1;
        }
        let le = (bucket_upper_us(i) + 1) as f64 / 1e6;
        let _ = writeln!(o, "{name}_bucket{{{labels},le=\"{le}\"}} {cum}");
    }
    let total: u64 = t.hist.iter().sum();
    let _ = writeln!(o, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
    let _ = writeln!(o, "{name}_sum{{{labels}}} {}", t.usec as f64 / 1e6);
    let _ = writeln!(o, "{name}_count{{{labels}}} {total}");
}

/// `/clusters`: one line per endpoint.
fn clusters(state: &State) -> String {
    let mut o = String::new();
    let mut last: Option<String> = None;
    for_each_endpoint(state, |c, s, e, v| {
        if last.as_deref() != Some(c.name.as_str()) {
            let _ = writeln!(o, "cluster {} ({} shards)", c.name, c.shards.len());
            last = Some(c.name.clone());
        }
        let (up, of) = (v.healthy_workers, v.workers);
        let role = match e.role {
            Role::Primary => "primary",
            Role::Replica => "replica",
        };
        let _ = write!(
            o,
            "  shard {} endpoint {} role={role} zone={} healthy={} (workers {up}/{of}) dedicated_connections={} requests={} upstream_p50_us={} upstream_p99_us={}",
            s.name,
            e.address,
            e.zone.as_deref().unwrap_or("-"),
            if of > 0 && up == of { "yes" } else if up == 0 { "no" } else { "partly" },
            v.dedicated,
            v.requests,
            v.latency.as_ref().map_or(0, |t| t.percentile_us(0.5)),
            v.latency.as_ref().map_or(0, |t| t.percentile_us(0.99)),
        );
        let errors: u64 = v.errors.iter().sum();
        let _ = write!(o, " errors={errors} ejections={}", v.ejections);
        if let Some(d) = &v.down {
            let since = d
                .since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_secs());
            let ago = d.since.elapsed().map_or(0, |t| t.as_secs());
            let _ = write!(
                o,
                " out_since={since} ({ago} s ago) failed_attempts={} last_error=\"{}\"",
                d.failures,
                d.reason.replace('"', "'")
            );
        }
        o.push('\n');
    });
    o
}

/// Calls `f` for every endpoint of the configuration served, in model order, with what the
/// workers see of it (their views summed).
fn for_each_endpoint(
    state: &State,
    mut f: impl FnMut(
        &respway_filters::model::Cluster,
        &respway_filters::model::Shard,
        &respway_filters::model::Endpoint,
        &crate::stats::EndpointView,
    ),
) {
    let snap = state.config.current();
    let health = state.registry.endpoint_health();
    let none = crate::stats::EndpointView::default();
    for (ci, c) in snap.config.clusters.iter().enumerate() {
        for (si, s) in c.shards.iter().enumerate() {
            for (ei, e) in s.endpoints.iter().enumerate() {
                let v = health
                    .get(ci)
                    .and_then(|x| x.get(si))
                    .and_then(|x| x.get(ei))
                    .unwrap_or(&none);
                f(c, s, e, v);
            }
        }
    }
}

/// `/stats`: one table per listener.
fn stats(state: &State) -> String {
    let r = &state.registry;
    let mut o = String::new();
    for l in r.listener_names() {
        let t = r.listener_totals(&l);
        let _ = writeln!(
            o,
            "listener {l}: connections {} open, {} accepted; {} commands",
            t.active, t.connections, t.commands
        );
        let _ = writeln!(
            o,
            "{:<16} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "command",
            "calls",
            "errors",
            "p50_us",
            "p90_us",
            "p99_us",
            "p999_us",
            "p9999_us",
            "max_us"
        );
        for c in r.command_totals(Some(&l)) {
            let _ = writeln!(
                o,
                "{:<16} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
                c.name,
                c.calls,
                c.failed,
                c.percentile_us(0.5),
                c.percentile_us(0.9),
                c.percentile_us(0.99),
                c.percentile_us(0.999),
                c.percentile_us(0.9999),
                c.max_us()
            );
        }
        o.push('\n');
    }
    o
}

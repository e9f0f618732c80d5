//! The sidecar's admin HTTP endpoint (HTTP/1.1, hyper), like Envoy's admin: on its own
//! address, loopback unless explicitly allowed, served by a thread of its own so that it
//! never runs on a worker.
//!
//! - `GET /metrics`: Prometheus text format (`respway_*`, `process_*`; see `exposition`).
//! - `GET /stats`: per listener and command, calls, errors and latency percentiles
//!   (p50/p90/p99/p99.9/p99.99/max), human-readable.
//! - `GET /hotkeys`: the hottest keys per cluster (hot-key detection, see
//!   [`crate::stats::hotkeys`]): `cluster NAME` lines, then `COUNT KEY` lines, hottest first.
//! - `GET /slowlog`: the slow log of every listener, newest first: one line per command with
//!   its id, time, duration, cluster/shard, client, and the command with its first argument.
//! - `GET /clusters`: every cluster, shard and endpoint of the configuration served, with
//!   role, zone, how many workers see it healthy, dedicated connections open, requests,
//!   upstream latency, errors, and while it is out (see [`crate::upstream::EndpointStats`])
//!   since when and why; for clusters with a `health_check`, the active check's state
//!   (`check=healthy|unhealthy|draining|demoted`), transitions and last error. Then, per
//!   listener whose cluster emulation announces two sidecars or more, one line per announced
//!   address: `listener NAME cluster_emulation node ADDR state=up|out checked=yes|no
//!   changes=N since=UNIX (S s ago) last_error="..."` (see `discovery::peers`).
//! - `GET /config_dump`: the configuration served, as the YAML file would say it
//!   ([`respway_xds::config_dump`]: the schema's keys and units, `# version: N` first, secrets
//!   shown as `<redacted>`); `?include_defaults` shows the settings at their default too,
//!   `?format=json` gives the same tree as JSON (`{"version": N, "config": ..., "notes": [...]}`).
//! - `GET /mirror`: per cluster receiving mirrored copies, the copies' counters summed over
//!   listeners, workers and configurations (as `INFO mirror`), and when `dual_write` policies
//!   send it write copies, its record of the keys they touched
//!   ([`respway_filters::write_record`]): `cluster NAME mirrored=N applied=N failed=N
//!   dropped=N`, then ` record=ID keys=N overflowed=0|1 incomplete=0|1 cursor=CURSOR` (see
//!   `mirror::counts`).
//! - `GET /mirror/keys?cluster=NAME[&since=CURSOR]`: the keys of that record written past
//!   `since` (all without it), hex-encoded one per line after a `record ID cursor CURSOR
//!   overflowed 0|1 incomplete 0|1` line; 404 without a record, 409 when `since` is of a
//!   replaced record, 400 for a malformed cursor (see `mirror::keys`).
//! - `GET /healthz`: 200 while the process serves.
//! - `POST /logging?level=LEVEL`: changes the log filter (`debug`, `info,respway=trace`, ...)
//!   when the process gave a way to ([`Hooks`]).
//! - `POST /drain`: drains and stops the process as SIGTERM does, when it gave a way to.
//! - `GET /ready`: 200 when a configuration is applied and, for every cluster a listener
//!   routes to, every shard's primary answers a `PING` (any reply but `-LOADING`) within
//!   500 ms, and (clusters with a `health_check`) the active check has no shard's primary
//!   unhealthy or demoted; else 503 naming the shards. Probed at each request.
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

use crate::runtime::ConfigHandle;
use crate::session::listener::AcceptBackoff;
use crate::stats::AcceptSocket;
use crate::stats::{ChangeCounts, Registry};

mod commands;
mod exposition;
mod mirror;

pub use crate::stats::{family_docs, FamilyDoc};

/// Keys per cluster `/hotkeys` lists.
const HOTKEYS_SHOWN: usize = 16;

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
    sources: std::sync::Mutex<std::collections::BTreeMap<&'static str, ChangeCounts>>,
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

    /// The counts so far, by source.
    pub(crate) fn counts(&self) -> BTreeMap<&'static str, ChangeCounts> {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
    server: &crate::runtime::Server,
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
    server: &crate::runtime::Server,
    hooks: Hooks,
) -> io::Result<Admin> {
    bind(addr, allow_non_loopback)?.serve(server, hooks)
}

/// The admin endpoint's socket, bound (its address known, port 0 resolved) and not served
/// yet: the sidecar binds it before it starts, so that it can name the address to the xDS
/// server (`node.metadata`) before there is a server to serve. Connections wait in the
/// socket's backlog until [`AdminSocket::serve`].
#[derive(Debug)]
pub struct AdminSocket {
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

/// Binds the admin endpoint's address, as [`start`] does, without serving it yet.
///
/// # Errors
/// As [`start`].
pub fn bind(addr: SocketAddr, allow_non_loopback: bool) -> io::Result<AdminSocket> {
    if !addr.ip().is_loopback() && !allow_non_loopback {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "admin address {addr} is not loopback: the admin endpoint has no \
                 authentication; pass --admin-allow-non-loopback to bind it anyway"
            ),
        ));
    }
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("admin address {addr}: {e}")))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    Ok(AdminSocket { listener, addr })
}

impl AdminSocket {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the admin endpoint of `server` on this socket, with what `POST /logging` and
    /// `POST /drain` do.
    ///
    /// # Errors
    /// The admin thread cannot be started.
    pub fn serve(self, server: &crate::runtime::Server, hooks: Hooks) -> io::Result<Admin> {
        let (std_listener, bound) = (self.listener, self.addr);
        let state = State {
            registry: server.registry().clone(),
            config: server.config_handle(),
            workers: server.workers(),
            hooks,
        };
        let (stop, stop_rx) = watch::channel(false);
        let thread = crate::lifecycle::side_thread("respway-admin", move || async move {
            match TcpListener::from_std(std_listener) {
                Ok(l) => serve(l, state, stop_rx).await,
                Err(e) => tracing::error!(error = %e, "admin listener"),
            }
        })?;
        tracing::info!(address = %bound, "admin endpoint listening");
        Ok(Admin {
            addr: bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
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
            exposition::metrics(&state),
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
        (&Method::GET, "/commands") => text(StatusCode::OK, plain, commands::page(&state)),
        (&Method::GET, "/mirror") => text(StatusCode::OK, plain, mirror::counts(&state)),
        (&Method::GET, "/mirror/keys") => {
            let (status, body) = mirror::keys(&state, req.uri().query().unwrap_or(""));
            text(status, plain, body)
        }
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
                        e.args.iter().map(|a| crate::stats::hotkeys::quote(a)).collect();
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
                            .map_or("-".to_string(), crate::stats::hotkeys::quote),
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
                    let _ = writeln!(o, "{n} {}", crate::stats::hotkeys::quote(&k));
                }
            }
            text(StatusCode::OK, plain, o)
        }
        (&Method::GET, "/nearcache/hot") => {
            let mut o = String::new();
            for (cluster, keys) in state.registry.near_cache_hot_keys() {
                let _ = writeln!(o, "cluster {cluster}");
                for k in keys {
                    let _ = writeln!(o, "{}", crate::stats::hotkeys::quote(&k));
                }
            }
            text(StatusCode::OK, plain, o)
        }
        (&Method::GET, "/ready") => {
            let down = unreachable_primaries(&state).await;
            let checked = checked_primaries(&state);
            if down.is_empty() && checked.is_empty() {
                text(StatusCode::OK, plain, "ready\n".into())
            } else {
                let mut o = String::new();
                if !down.is_empty() {
                    let _ = writeln!(o, "not ready: no reachable primary for {}", down.join(", "));
                }
                for c in checked {
                    let _ = writeln!(o, "not ready: {c}");
                }
                text(StatusCode::SERVICE_UNAVAILABLE, plain, o)
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            plain,
            "not found; try GET /metrics, /stats, /ready, /hotkeys, /nearcache/hot, /slowlog, /clusters, \
             /commands, /config_dump, /mirror, /mirror/keys?cluster=NAME, /healthz or POST \
             /logging?level=LEVEL, /drain\n"
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

/// Every shard (of any cluster with a `health_check`) whose primary the active check finds
/// unhealthy or demoted, with why (a draining primary still takes the writes).
fn checked_primaries(state: &State) -> Vec<String> {
    let snap = state.config.current();
    let mut out = Vec::new();
    for c in snap
        .config
        .clusters
        .iter()
        .filter(|c| c.health_check.is_some())
    {
        for s in &c.shards {
            let p = s.primary();
            let v = state.config.shared.checks.get(&c.name, p.address).view();
            let why = match v.state {
                "healthy" | "draining" => continue,
                "demoted" => format!(
                    "answers ROLE as a replica of {}",
                    state
                        .config
                        .shared
                        .checks
                        .get(&c.name, p.address)
                        .replica_of()
                ),
                other => format!("is {other} by the active health check ({})", v.last_error),
            };
            out.push(format!(
                "{}/{}: primary {} {why}",
                c.name, s.name, p.address
            ));
        }
    }
    out
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

/// `/clusters`: one line per endpoint.
fn clusters(state: &State) -> String {
    let mut o = String::new();
    let mut last: Option<String> = None;
    let mut last_shard: Option<String> = None;
    let sentinels = (state.config.discovery()).statuses(&state.config.current().config);
    for_each_endpoint(state, |c, s, e, v| {
        if last.as_deref() != Some(c.name.as_str()) {
            let _ = writeln!(o, "cluster {} ({} shards)", c.name, c.shards.len());
            last = Some(c.name.clone());
            last_shard = None;
        }
        if last_shard.as_deref() != Some(s.name.as_str()) {
            last_shard = Some(s.name.clone());
            let found = sentinels
                .iter()
                .find(|(k, _, _)| k[0] == c.name && k[1] == s.name);
            if let Some((_, master, st)) = found {
                let _ = writeln!(
                    o,
                    "  shard {} sentinel master={master} sentinels_answering={}/{} epoch={} primary_changes={} failover_holds={} held_writes={}",
                    s.name, st.answering, st.sentinels, st.epoch, st.primary_changes, st.holds, st.held_writes
                );
            }
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
        if let Some(c) = &v.check {
            let _ = write!(
                o,
                " check={} check_transitions={} check_last_error=\"{}\"",
                c.state,
                c.transitions,
                c.last_error.replace('"', "'")
            );
        }
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
    // The sidecars cluster emulation announces, as this one's checks see them.
    let snapshot = state.config.current();
    for ([listener, node], st) in state.config.peers().statuses(&snapshot.config) {
        let _ = write!(
            o,
            "listener {listener} cluster_emulation node {node} state={} checked={} changes={}",
            if st.up { "up" } else { "out" },
            if st.checked { "yes" } else { "no" },
            st.changes,
        );
        if let Some(since) = st.since {
            let at = since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_secs());
            let ago = since.elapsed().map_or(0, |t| t.as_secs());
            let _ = write!(o, " since={at} ({ago} s ago)");
        }
        let _ = writeln!(o, " last_error=\"{}\"", st.last_error.replace('"', "'"));
    }
    o
}

/// Calls `f` for every endpoint of the configuration served, in model order, with what the
/// workers see of it (their views summed).
fn for_each_endpoint(
    state: &State,
    f: impl FnMut(
        &respway_filters::model::Cluster,
        &respway_filters::model::Shard,
        &respway_filters::model::Endpoint,
        &crate::stats::EndpointView,
    ),
) {
    crate::stats::each_endpoint(&*state.config.current(), &state.registry, f);
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

//! `GET /metrics`: the Prometheus text exposition (format 0.0.4) of the admin endpoint, one
//! function per group of families. Everything is read from the registry's per-worker
//! counters (summed here) and from the configuration served, on the admin thread.

use std::fmt::Write as _;

use super::{for_each_endpoint, State};
use crate::metrics::{bucket_upper_us, AcceptSocket, CmdTotals, ACCEPT_REASONS, BUCKETS, FAMILIES};
use crate::stats::{EndpointView, Registry, Totals};

/// Keys per cluster exported as metrics.
const HOTKEYS_METRICS: usize = 5;

/// A label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A family's `# HELP` and `# TYPE` lines.
fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The Prometheus text exposition.
pub(super) fn metrics(state: &State) -> String {
    let r = &state.registry;
    let mut o = String::with_capacity(16 * 1024);
    build_and_config(&mut o, state);
    process(&mut o);
    tls_certificates(&mut o, state);
    accept_errors(&mut o);
    let listeners = r.listener_names();
    downstream(&mut o, r, &listeners);
    commands(&mut o, r, &listeners);
    config_changes(&mut o, state);
    filters(&mut o, r, &listeners);
    upstream(&mut o, state);
    o
}

/// The build, the configuration version, the workers.
fn build_and_config(o: &mut String, state: &State) {
    family(
        o,
        "respway_build_info",
        "gauge",
        "The running build: its version and the git commit it was built from (as respway --version says).",
    );
    let _ = writeln!(
        o,
        "respway_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        label(env!("RESPWAY_GIT_COMMIT"))
    );
    family(
        o,
        "respway_config_version",
        "gauge",
        "Version of the configuration being served (1 = the first applied).",
    );
    let _ = writeln!(
        o,
        "respway_config_version {}",
        state.config.current().version
    );
    family(o, "respway_workers", "gauge", "Worker threads.");
    let _ = writeln!(o, "respway_workers {}", state.workers);
}

/// When each certificate in use expires.
fn tls_certificates(o: &mut String, state: &State) {
    family(
        o,
        "respway_tls_certificate_expiry_timestamp_seconds",
        "gauge",
        "notAfter (Unix time) of each certificate file in use by a listener or cluster, by the setting naming it (cert, ca, client_ca); for a file of several certificates, the earliest.",
    );
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

/// Failed accepts, process-wide.
fn accept_errors(o: &mut String) {
    family(
        o,
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
}

/// Per listener: client connections, bytes, client-side errors, pipeline depth.
fn downstream(o: &mut String, r: &Registry, listeners: &[String]) {
    let per_listener: Vec<(&String, Totals)> = listeners
        .iter()
        .map(|l| (l, r.listener_totals(l)))
        .collect();
    type Get = fn(&Totals) -> u64;
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
        family(o, name, kind, help);
        for (l, t) in &per_listener {
            let _ = writeln!(o, "{name}{{listener=\"{}\"}} {}", label(l), get(t));
        }
    }
    family(
        o,
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
}

/// The latency histograms' buckets: from 16 µs to about 2 s, four per power of two.
fn latency_bounds() -> Vec<usize> {
    (0..BUCKETS - 1)
        .filter(|&i| (15..=2_200_000).contains(&bucket_upper_us(i)))
        .collect()
}

/// Per listener and command: calls, errors, time; per listener and command family: latency
/// histograms (per-command percentiles are in /stats and INFO latencystats).
fn commands(o: &mut String, r: &Registry, listeners: &[String]) {
    let per_cmd: Vec<(&String, Vec<(String, CmdTotals)>)> = listeners
        .iter()
        .map(|l| {
            let cmds = r
                .command_totals(Some(l))
                .into_iter()
                .map(|c| {
                    let labels = format!(
                        "listener=\"{}\",command=\"{}\",family=\"{}\"",
                        label(l),
                        c.name,
                        c.family
                    );
                    (labels, c)
                })
                .collect();
            (l, cmds)
        })
        .collect();
    type Get = fn(&CmdTotals) -> String;
    let counters: [(&str, &str, Get); 3] = [
        (
            "respway_commands_total",
            "Commands answered, by top-level command (unknown names as `other`) and its family (read, write, blocking, connection, other).",
            |c| c.calls.to_string(),
        ),
        (
            "respway_command_errors_total",
            "Commands answered with an error reply (family connection: HELLO, AUTH, CLIENT, SELECT... which clients may send on connect and see refused).",
            |c| c.failed.to_string(),
        ),
        (
            "respway_command_seconds_total",
            "Time from dispatch to reply ready, summed over the commands answered (divided by respway_commands_total: the command's mean latency).",
            |c| (c.usec as f64 / 1e6).to_string(),
        ),
    ];
    for (name, help, get) in counters {
        family(o, name, "counter", help);
        for (_, cmds) in &per_cmd {
            for (labels, c) in cmds {
                let _ = writeln!(o, "{name}{{{labels}}} {}", get(c));
            }
        }
    }
    family(
        o,
        "respway_command_duration_seconds",
        "histogram",
        "Time from dispatch to reply ready (respway plus upstream), by listener and command family (read, write, blocking, connection, other).",
    );
    let bounds = latency_bounds();
    for (l, cmds) in &per_cmd {
        for fam in FAMILIES {
            let mut t = CmdTotals::empty(fam);
            let mut seen = false;
            for (_, c) in cmds.iter().filter(|(_, c)| c.family == fam) {
                seen = true;
                t.calls += c.calls;
                t.usec += c.usec;
                for (a, b) in t.hist.iter_mut().zip(&c.hist) {
                    *a += b;
                }
            }
            if seen {
                let labels = format!("listener=\"{}\",family=\"{fam}\"", label(l));
                histogram(o, "respway_command_duration_seconds", &labels, &t, &bounds);
            }
        }
    }
}

/// Configuration changes applied and refused, by source.
fn config_changes(o: &mut String, state: &State) {
    let Some(ev) = &state.hooks.config_events else {
        return;
    };
    let mut m = ev.sources.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Both sources from the start, at 0: a first change is an increase, not a new series.
    for src in ["file", "xds"] {
        m.entry(src).or_default();
    }
    family(
        o,
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
        o,
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

/// Mirroring, hot-key rules, and the hottest keys.
fn filters(o: &mut String, r: &Registry, listeners: &[String]) {
    family(
        o,
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
        o,
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
        o,
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
}

/// Per endpoint: load, queues, latency, errors, health; and the connection totals.
fn upstream(o: &mut String, state: &State) {
    family(
        o,
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
        o,
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
        o,
        "respway_upstream_inflight_requests",
        "gauge",
        "Requests sent on each endpoint's connections (shared and dedicated) and not yet answered, now: the queue in the shard and on the wire (respway_upstream_queued_requests: not yet sent).",
    );
    for (labels, v) in &endpoints {
        let _ = writeln!(
            o,
            "respway_upstream_inflight_requests{{{labels}}} {}",
            v.inflight
        );
    }
    family(
        o,
        "respway_upstream_connections",
        "gauge",
        "Connections open now to each endpoint (shared and dedicated, every worker).",
    );
    for (labels, v) in &endpoints {
        let _ = writeln!(
            o,
            "respway_upstream_connections{{{labels}}} {}",
            v.connections
        );
    }
    type Get = fn(&EndpointView) -> u64;
    let connects: [(&str, &str, Get); 2] = [
        (
            "respway_upstream_connects_total",
            "Connections opened to each endpoint (first connects and reconnects; counted from when its pools were created).",
            |v| v.connects,
        ),
        (
            "respway_upstream_connect_failures_total",
            "Failed connect attempts to each endpoint (counted from when its pools were created).",
            |v| v.connect_failures,
        ),
    ];
    for (name, help, get) in connects {
        family(o, name, "counter", help);
        for (labels, v) in &endpoints {
            let _ = writeln!(o, "{name}{{{labels}}} {}", get(v));
        }
    }
    family(
        o,
        "respway_upstream_duration_seconds",
        "histogram",
        "Time each endpoint took per request, from the write of its batch to its reply (compare with respway_command_duration_seconds: the difference is time in respway).",
    );
    let bounds = latency_bounds();
    for (labels, v) in &endpoints {
        if let Some(t) = &v.latency {
            histogram(o, "respway_upstream_duration_seconds", labels, t, &bounds);
        }
    }
    family(
        o,
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
        o,
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
        o,
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
    let u = state.registry.upstream_totals();
    let up: [(&str, &str, u64); 2] = [
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
        family(o, name, "counter", help);
        let _ = writeln!(o, "{name} {v}");
    }
}

/// Writes one histogram series: cumulative `_bucket`s at `bounds`, `+Inf`, `_sum`, `_count`.
fn histogram(o: &mut String, name: &str, labels: &str, t: &CmdTotals, bounds: &[usize]) {
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

/// The standard process metrics, with the names and meanings of Prometheus's client
/// libraries, read from /proc/self (Linux; elsewhere none): CPU time, memory, descriptors,
/// start time.
fn process(o: &mut String) {
    let Some(p) = ProcessStats::read() else {
        return;
    };
    let metrics: [(&str, &str, &str, Option<f64>); 6] = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            p.cpu_seconds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            p.resident_bytes,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            p.virtual_bytes,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            p.open_fds,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors (the soft RLIMIT_NOFILE).",
            p.max_fds,
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            p.start_time,
        ),
    ];
    for (name, kind, help, v) in metrics {
        if let Some(v) = v {
            family(o, name, kind, help);
            let _ = writeln!(o, "{name} {v}");
        }
    }
}

/// What /proc says of this process (each `None` when it cannot be read).
#[derive(Debug, Default)]
struct ProcessStats {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<f64>,
    virtual_bytes: Option<f64>,
    open_fds: Option<f64>,
    max_fds: Option<f64>,
    start_time: Option<f64>,
}

impl ProcessStats {
    #[cfg(target_os = "linux")]
    fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The fields after the command name, which is in parentheses and may hold anything.
        let rest = stat.get(stat.rfind(')')? + 1..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Field n of proc_pid_stat(5) (from 1, the pid) is fields[n - 3].
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let hz = rustix::param::clock_ticks_per_second() as f64;
        let page = rustix::param::page_size() as f64;
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64);
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        Some(ProcessStats {
            cpu_seconds: field(14).zip(field(15)).map(|(u, s)| (u + s) as f64 / hz),
            virtual_bytes: field(23).map(|v| v as f64),
            resident_bytes: field(24).map(|p| p as f64 * page),
            open_fds,
            max_fds: limit.current.map(|n| n as f64),
            start_time: boot.zip(field(22)).map(|(b, t)| b as f64 + t as f64 / hz),
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn read() -> Option<ProcessStats> {
        None
    }
}

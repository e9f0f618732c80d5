//! What one scrape reads, gathered once when `/metrics` is asked for (on the admin thread,
//! never on a worker), and the readers of the families whose series are not one per listener
//! or one for the process (see `families`).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use respway_filters::hot_key::HotKeyRuleStats;
use respway_filters::mirror::MirrorCounts;

use super::ErrorKind;
use super::{
    accept_errors, AcceptSocket, CmdTotals, EndpointView, Registry, Totals, UpstreamTotals,
    ACCEPT_REASONS, COMMAND_FAMILIES,
};

/// Keys per cluster exported as metrics.
const HOTKEYS_METRICS: usize = 5;

/// Process-wide values: what the families read by `Read::Process` and `INFO proxy` show.
#[derive(Debug, Default, Clone)]
pub(crate) struct Process {
    /// Worker threads.
    pub(crate) workers: u64,
    /// Version of the configuration served.
    pub(crate) config_version: u64,
    /// Every listener's counters, summed over workers (for a Redis section of `INFO`: the
    /// listener asked's).
    pub(crate) totals: Totals,
    /// Upstream counters summed over workers (since start).
    pub(crate) upstream: UpstreamTotals,
}

/// Configuration changes from one source, applied and refused.
#[derive(Debug, Default, Clone)]
pub(crate) struct ChangeCounts {
    pub(crate) applied: u64,
    pub(crate) refused: u64,
    /// Unix time of the last applied and of the last refused change.
    pub(crate) last_applied: Option<u64>,
    pub(crate) last_refused: Option<u64>,
}

/// One listener as a scrape sees it.
#[derive(Debug)]
pub(crate) struct ListenerScrape {
    /// Its name.
    pub(crate) name: String,
    /// Its counters summed over workers.
    pub(crate) totals: Totals,
    /// Its per-command counters (commands seen only).
    pub(crate) commands: Vec<CmdTotals>,
    /// Mirrored copies per receiving cluster.
    pub(crate) mirror: Vec<(String, MirrorCounts)>,
    /// Hot-key rule counters.
    pub(crate) hot_rules: Vec<HotKeyRuleStats>,
}

/// The configuration a scrape reports on (the runtime's compiled snapshot implements it).
pub(crate) trait Served: Send + Sync + std::fmt::Debug {
    /// Increases by one with every applied configuration.
    fn version(&self) -> u64;
    /// The model.
    fn config(&self) -> &respway_filters::model::Config;
    /// The TLS configurations loaded per listener and cluster.
    fn certs(&self) -> &crate::net::tls::Certs;
}

/// Everything one scrape reads, gathered once.
#[derive(Debug)]
pub(crate) struct Scrape {
    /// Process-wide values.
    pub(crate) process: Process,
    /// The listeners, in configuration order.
    pub(crate) listeners: Vec<ListenerScrape>,
    /// Every endpoint of the configuration served: (cluster, shard, address) and its view.
    pub(crate) endpoints: Vec<([String; 3], EndpointView)>,
    /// The hottest keys per cluster.
    pub(crate) hot_keys: Vec<(String, Vec<(Bytes, u64)>)>,
    /// The copy pass of every hot-key rule: (cluster, prefix, progress).
    pub(crate) hot_copies: Vec<(String, String, super::CopyProgress)>,
    /// The configuration served (for its certificates).
    pub(crate) snapshot: Arc<dyn Served>,
    /// Configuration changes by source, when the process counts them.
    pub(crate) config_changes: Option<BTreeMap<&'static str, ChangeCounts>>,
    /// What /proc says of the process (Linux).
    pub(crate) os: Option<ProcessStats>,
    /// Sentinel-managed shards, (cluster, shard), with their master's status.
    pub(crate) sentinels: Vec<([String; 2], String, super::SentinelStatus)>,
    /// The sidecars announced by cluster emulation, (listener, address), with their status.
    pub(crate) peers: Vec<([String; 2], super::PeerStatus)>,
    /// Near-cache counters of the clusters with a cache.
    pub(crate) near_cache: Vec<(String, super::CacheTotals)>,
}

impl Scrape {
    /// Reads `registry` and `snapshot` once.
    pub(crate) fn gather(
        registry: &Registry,
        snapshot: Arc<dyn Served>,
        workers: usize,
        config_changes: Option<BTreeMap<&'static str, ChangeCounts>>,
        sentinels: Vec<([String; 2], String, super::SentinelStatus)>,
        peers: Vec<([String; 2], super::PeerStatus)>,
    ) -> Scrape {
        let listeners = registry
            .listener_names()
            .into_iter()
            .enumerate()
            .map(|(i, name)| ListenerScrape {
                totals: registry.listener_totals(&name),
                commands: registry.command_totals(Some(&name)),
                mirror: registry.mirror_totals(i),
                hot_rules: registry.hot_key_rule_totals(i),
                name,
            })
            .collect();
        let mut endpoints = Vec::new();
        each_endpoint(&*snapshot, registry, |c, s, e, v| {
            let labels = [c.name.clone(), s.name.clone(), e.address.to_string()];
            endpoints.push((labels, v.clone()));
        });
        Scrape {
            process: Process {
                workers: workers as u64,
                config_version: snapshot.version(),
                totals: registry.totals(),
                upstream: registry.upstream_totals(),
            },
            listeners,
            endpoints,
            hot_keys: registry.hot_keys(None, HOTKEYS_METRICS),
            hot_copies: registry.copies(),
            sentinels,
            peers,
            near_cache: registry.cache_totals(
                &snapshot
                    .config()
                    .clusters
                    .iter()
                    .filter(|c| c.near_cache.is_some())
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>(),
            ),
            snapshot,
            config_changes,
            os: ProcessStats::read(),
        }
    }
}

/// Calls `f` with every endpoint of `snap` and its view summed over workers.
pub(crate) fn each_endpoint(
    snap: &dyn Served,
    registry: &Registry,
    mut f: impl FnMut(
        &respway_filters::model::Cluster,
        &respway_filters::model::Shard,
        &respway_filters::model::Endpoint,
        &EndpointView,
    ),
) {
    let health = registry.endpoint_health();
    let none = EndpointView::default();
    for (ci, c) in snap.config().clusters.iter().enumerate() {
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

/// One sample's value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    /// A count.
    Int(u64),
    /// A measure.
    Float(f64),
    /// A latency histogram (µs buckets, written in seconds).
    Latency(&'a CmdTotals),
    /// The pipeline-depth histogram: reads per bucket, and commands (its sum).
    Depth(&'a [u64], u64),
}

/// Where a reader puts its series: label pairs, in order, and the value.
pub(crate) type Sink<'s> = dyn FnMut(&[(&str, &str)], Value<'_>) + 's;

/// `respway_build_info`.
pub(super) fn build_info(_: &Scrape, out: &mut Sink<'_>) -> bool {
    let labels = [
        ("version", env!("CARGO_PKG_VERSION")),
        ("commit", env!("RESPWAY_GIT_COMMIT")),
    ];
    out(&labels, Value::Int(1));
    true
}

/// `respway_tls_certificate_expiry_timestamp_seconds`.
pub(super) fn certificate_expiry(s: &Scrape, out: &mut Sink<'_>) -> bool {
    let snap = &s.snapshot;
    let listeners = snap
        .config()
        .listeners
        .iter()
        .zip(&snap.certs().listeners)
        .filter_map(|(l, t)| Some(("listener", &l.name, t.as_ref()?.1.expiry())));
    let clusters = snap
        .config()
        .clusters
        .iter()
        .zip(&snap.certs().clusters)
        .filter_map(|(c, t)| Some(("cluster", &c.name, t.as_ref()?.1.expiry())));
    for (kind, name, expiry) in listeners.chain(clusters) {
        for e in expiry {
            let labels = [(kind, name.as_str()), ("certificate", e.setting)];
            out(&labels, Value::Float(e.not_after as f64));
        }
    }
    true
}

/// The near-cache families: one series per cluster with a cache, of the field `I` of
/// [`crate::cache::near_cache::CacheTotals::fields`].
pub(super) fn near_cache<const I: usize>(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for (c, t) in &s.near_cache {
        out(&[("cluster", c.as_str())], Value::Int(t.fields()[I].1));
    }
    true
}

/// `respway_sentinel_answering`: per Sentinel-managed shard.
pub(super) fn sentinel_answering(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for ([c, sh], _, st) in &s.sentinels {
        let labels = [("cluster", c.as_str()), ("shard", sh.as_str())];
        out(&labels, Value::Int(st.answering as u64));
    }
    true
}

/// `respway_sentinel_primary_changes_total`: per Sentinel-managed shard.
pub(super) fn sentinel_primary_changes(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for ([c, sh], _, st) in &s.sentinels {
        let labels = [("cluster", c.as_str()), ("shard", sh.as_str())];
        out(&labels, Value::Int(st.primary_changes));
    }
    true
}

/// `respway_sentinel_failover_holds_total`: per Sentinel-managed shard.
pub(super) fn sentinel_holds(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for ([c, sh], _, st) in &s.sentinels {
        let labels = [("cluster", c.as_str()), ("shard", sh.as_str())];
        out(&labels, Value::Int(st.holds));
    }
    true
}

/// `respway_sentinel_held_writes_total`: per Sentinel-managed shard.
pub(super) fn sentinel_held_writes(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for ([c, sh], _, st) in &s.sentinels {
        let labels = [("cluster", c.as_str()), ("shard", sh.as_str())];
        out(&labels, Value::Int(st.held_writes));
    }
    true
}

/// `respway_cluster_emulation_node_up`: per listener and announced sidecar.
pub(super) fn peer_up(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for ([l, n], st) in &s.peers {
        let labels = [("listener", l.as_str()), ("node", n.as_str())];
        out(&labels, Value::Int(u64::from(st.up)));
    }
    true
}

/// `respway_cluster_emulation_node_changes_total`: per listener and announced sidecar.
pub(super) fn peer_changes(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for ([l, n], st) in &s.peers {
        let labels = [("listener", l.as_str()), ("node", n.as_str())];
        out(&labels, Value::Int(st.changes));
    }
    true
}

/// `respway_accept_errors_total`: every socket and reason.
pub(super) fn accept_failures(_: &Scrape, out: &mut Sink<'_>) -> bool {
    for (socket, name) in [
        (AcceptSocket::Listeners, "listeners"),
        (AcceptSocket::Admin, "admin"),
    ] {
        for (i, reason) in ACCEPT_REASONS.iter().enumerate() {
            let labels = [("socket", name), ("reason", *reason)];
            out(&labels, Value::Int(accept_errors(socket, i)));
        }
    }
    true
}

/// `respway_downstream_pipeline_depth`, per listener.
pub(super) fn pipeline_depth(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for l in &s.listeners {
        let t = &l.totals;
        out(
            &[("listener", &l.name)],
            Value::Depth(&t.pipeline, t.commands),
        );
    }
    true
}

/// A per-command family: one series per listener and command seen.
fn per_command(s: &Scrape, out: &mut Sink<'_>, get: fn(&CmdTotals) -> Value<'static>) -> bool {
    for l in &s.listeners {
        for c in &l.commands {
            let labels = [
                ("listener", l.name.as_str()),
                ("command", c.name),
                ("family", c.family),
            ];
            out(&labels, get(c));
        }
    }
    true
}

/// `respway_commands_total`.
pub(super) fn command_calls(s: &Scrape, out: &mut Sink<'_>) -> bool {
    per_command(s, out, |c| Value::Int(c.calls))
}

/// `respway_command_errors_total`.
pub(super) fn command_errors(s: &Scrape, out: &mut Sink<'_>) -> bool {
    per_command(s, out, |c| Value::Int(c.failed))
}

/// `respway_command_seconds_total`.
pub(super) fn command_seconds(s: &Scrape, out: &mut Sink<'_>) -> bool {
    per_command(s, out, |c| Value::Float(c.usec as f64 / 1e6))
}

/// `respway_command_duration_seconds`: per listener and command family seen.
pub(super) fn command_duration(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for l in &s.listeners {
        for fam in COMMAND_FAMILIES {
            let mut t = CmdTotals::empty(fam);
            let mut seen = false;
            for c in l.commands.iter().filter(|c| c.family == fam) {
                seen = true;
                t.calls += c.calls;
                t.usec += c.usec;
                for (a, b) in t.hist.iter_mut().zip(&c.hist) {
                    *a += b;
                }
            }
            if seen {
                out(
                    &[("listener", &l.name), ("family", fam)],
                    Value::Latency(&t),
                );
            }
        }
    }
    true
}

/// Configuration changes by source, both sources from the start (at 0: a first change is an
/// increase, not a new series); `None` when the process does not count them.
fn changes(s: &Scrape) -> Option<BTreeMap<&'static str, ChangeCounts>> {
    let mut m = s.config_changes.clone()?;
    for src in ["file", "xds"] {
        m.entry(src).or_default();
    }
    Some(m)
}

/// `respway_config_changes_total`.
pub(super) fn config_changes(s: &Scrape, out: &mut Sink<'_>) -> bool {
    let Some(m) = changes(s) else { return false };
    for (src, e) in &m {
        out(
            &[("source", src), ("outcome", "applied")],
            Value::Int(e.applied),
        );
        out(
            &[("source", src), ("outcome", "refused")],
            Value::Int(e.refused),
        );
    }
    true
}

/// `respway_config_last_change_timestamp_seconds`.
pub(super) fn config_last_change(s: &Scrape, out: &mut Sink<'_>) -> bool {
    let Some(m) = changes(s) else { return false };
    for (src, e) in &m {
        for (outcome, t) in [("applied", e.last_applied), ("refused", e.last_refused)] {
            if let Some(t) = t {
                out(&[("source", src), ("outcome", outcome)], Value::Int(t));
            }
        }
    }
    true
}

/// `respway_mirror_copies_total`.
pub(super) fn mirror_copies(s: &Scrape, out: &mut Sink<'_>) -> bool {
    mirror_outcomes(s, out, |c| {
        [
            ("mirrored", c.mirrored),
            ("dropped", c.dropped),
            ("failed", c.failed),
            ("applied", c.applied),
        ]
    })
}

/// `respway_mirror_moves_total`.
pub(super) fn mirror_moves(s: &Scrape, out: &mut Sink<'_>) -> bool {
    mirror_outcomes(s, out, |c| {
        [
            ("moved", c.moved),
            ("absent", c.absent),
            ("failed", c.move_failed),
        ]
    })
}

/// One series per listener, receiving cluster and outcome of `outcomes`.
fn mirror_outcomes<const N: usize>(
    s: &Scrape,
    out: &mut Sink<'_>,
    outcomes: fn(&MirrorCounts) -> [(&'static str, u64); N],
) -> bool {
    for l in &s.listeners {
        for (cluster, c) in &l.mirror {
            for (outcome, n) in outcomes(c) {
                let labels = [
                    ("listener", l.name.as_str()),
                    ("cluster", cluster),
                    ("outcome", outcome),
                ];
                out(&labels, Value::Int(n));
            }
        }
    }
    true
}

/// `respway_hot_key_rule_writes_total`.
pub(super) fn hot_key_rule_writes(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for l in &s.listeners {
        for h in &l.hot_rules {
            for (outcome, n) in [
                ("all", h.fanned_out_writes),
                ("partial_failure", h.partial_failures),
            ] {
                let labels = [
                    ("listener", l.name.as_str()),
                    ("cluster", &h.cluster),
                    ("prefix", &h.prefix),
                    ("outcome", outcome),
                ];
                out(&labels, Value::Int(n));
            }
        }
    }
    true
}

/// `respway_hot_key_read_fallbacks_total`.
pub(super) fn hot_key_read_fallbacks(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for l in &s.listeners {
        for h in &l.hot_rules {
            let labels = [
                ("listener", l.name.as_str()),
                ("cluster", &h.cluster),
                ("prefix", &h.prefix),
            ];
            out(&labels, Value::Int(h.read_fallbacks));
        }
    }
    true
}

/// `respway_hot_key_copy_state`: 1 for each rule's current state, 0 for the others.
pub(super) fn hot_key_copy_state(s: &Scrape, out: &mut Sink<'_>) -> bool {
    use super::CopyState as State;
    for (cluster, prefix, p) in &s.hot_copies {
        for state in [State::Copying, State::Done, State::Failed] {
            let labels = [
                ("cluster", cluster.as_str()),
                ("prefix", prefix),
                ("state", state.name()),
            ];
            out(&labels, Value::Int(u64::from(p.state == state)));
        }
    }
    true
}

/// `respway_hot_key_copied_keys`.
pub(super) fn hot_key_copied_keys(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for (cluster, prefix, p) in &s.hot_copies {
        out(
            &[("cluster", cluster.as_str()), ("prefix", prefix)],
            Value::Int(p.keys),
        );
    }
    true
}

/// `respway_hot_key_requests`.
pub(super) fn hot_key_requests(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for (cluster, keys) in &s.hot_keys {
        for (k, n) in keys {
            let key = String::from_utf8_lossy(k);
            out(&[("cluster", cluster), ("key", &key)], Value::Int(*n));
        }
    }
    true
}

/// `respway_upstream_errors_total`: every kind for every endpoint.
pub(super) fn upstream_errors(s: &Scrape, out: &mut Sink<'_>) -> bool {
    for ([c, sh, e], v) in &s.endpoints {
        for (kind, n) in ErrorKind::ALL.iter().zip(v.errors) {
            let labels = [
                ("cluster", c.as_str()),
                ("shard", sh),
                ("endpoint", e),
                ("kind", kind.name()),
            ];
            out(&labels, Value::Int(n));
        }
    }
    true
}

/// The process's upstream errors by kind (`INFO proxy`: `upstream_errors_<kind>`), every
/// kind.
pub(super) fn upstream_errors_by_kind(p: &Process, out: &mut super::FieldSink<'_>) {
    for kind in ErrorKind::ALL {
        let n = p
            .upstream
            .errors
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n);
        out(kind.name(), n);
    }
}

/// A `process_*` family: one unlabelled series, or none when /proc cannot tell.
fn os(s: &Scrape, out: &mut Sink<'_>, get: fn(&ProcessStats) -> Option<f64>) -> bool {
    let Some(v) = s.os.as_ref().and_then(get) else {
        return false;
    };
    out(&[], Value::Float(v));
    true
}

pub(super) fn cpu_seconds(s: &Scrape, out: &mut Sink<'_>) -> bool {
    os(s, out, |p| p.cpu_seconds)
}
pub(super) fn resident_bytes(s: &Scrape, out: &mut Sink<'_>) -> bool {
    os(s, out, |p| p.resident_bytes)
}
pub(super) fn virtual_bytes(s: &Scrape, out: &mut Sink<'_>) -> bool {
    os(s, out, |p| p.virtual_bytes)
}
pub(super) fn open_fds(s: &Scrape, out: &mut Sink<'_>) -> bool {
    os(s, out, |p| p.open_fds)
}
pub(super) fn max_fds(s: &Scrape, out: &mut Sink<'_>) -> bool {
    os(s, out, |p| p.max_fds)
}
pub(super) fn start_time(s: &Scrape, out: &mut Sink<'_>) -> bool {
    os(s, out, |p| p.start_time)
}

/// What /proc says of this process (each `None` when it cannot be read): the standard
/// process metrics, with the names and meanings of Prometheus's client libraries.
#[derive(Debug, Default)]
pub(crate) struct ProcessStats {
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

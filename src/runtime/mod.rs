//! The runtime: the process around the data plane — [`start`] (the workers, the side threads,
//! the first configuration), [`Server`] and its [`ConfigHandle`] (hot swaps), the bootstrap file,
//! the xDS wiring and the admin HTTP endpoint. The top floor: it may use every folder below it,
//! and nothing below imports it.
//!
//! - [`bootstrap`]: the bootstrap file (`--bootstrap FILE`);
//! - [`xds`]: a bootstrap's management servers as an ADS client whose configurations are
//!   applied to the running server;
//! - `worker`: one worker thread (its runtime, its chain parts per config, accept loop, drain);
//! - [`admin`]: the admin HTTP endpoint (`/metrics`, `/stats`, `/hotkeys`, ...).

pub mod admin;
pub mod bootstrap;
pub(crate) mod worker;
pub mod xds;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use arc_swap::ArcSwap;
use respway_filters::model::Config;
use respway_filters::routing::Routing;
use respway_filters::write_record::WriteRecord;
use tokio::sync::watch;

use crate::runtime::worker::{Stop, Worker};
use crate::stats::Registry;
use crate::upstream::UpstreamStats;

/// How long a start waits for the copy passes of the hot-key rules it starts with.
const HOT_COPY_FIRST_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long [`start`] waits for the shards' commands to be learned (`discovery::commands`);
/// a shard that is down does not hold a start longer.
const LEARN_FIRST_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long [`start`] waits for the Sentinels of the configuration's Sentinel-managed shards
/// to name their primaries before it serves.
const SENTINEL_FIRST_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Options of the process, as opposed to the configuration it serves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Worker threads (Envoy's `--concurrency`).
    pub workers: usize,
    /// Hot-key detection takes one key in this many (0: off).
    pub hot_key_sample: u64,
    /// Commands at least this slow (µs) go to the slow log.
    pub slowlog_threshold_us: u64,
    /// Slow-log entries kept per worker and listener.
    pub slowlog_max_len: usize,
    /// Learn the commands the built-in table lacks from the shards (`discovery::commands`:
    /// one more connection per endpoint); off: such commands are unknown.
    pub learn_commands: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workers: 1,
            hot_key_sample: crate::stats::hotkeys::DEFAULT_SAMPLE,
            slowlog_threshold_us: crate::stats::slowlog::DEFAULT_THRESHOLD_US,
            slowlog_max_len: crate::stats::slowlog::DEFAULT_MAX_LEN,
            learn_commands: true,
        }
    }
}

/// One validated, compiled configuration.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Increases by one with every applied configuration (the first is 1).
    pub(crate) version: u64,
    /// The model.
    pub(crate) config: Arc<Config>,
    /// Compiled routing per listener, in listener order.
    pub(crate) routings: Vec<Arc<Routing>>,
    /// Compiled ACL users per listener (`None`: no users, no password).
    pub(crate) acls: Vec<Option<Arc<crate::stack::acl::Acl>>>,
    /// Loaded TLS configurations per listener and cluster.
    pub(crate) certs: crate::net::tls::Certs,
    /// Per cluster (indexed like `config.clusters`), the record of the keys the write copies
    /// it receives touched (`None`: no `dual_write` policy sends it write copies). The same
    /// record is carried from snapshot to snapshot while some policy keeps sending it copies
    /// ([`write_records`]); each worker's parts hold its part.
    pub(crate) records: Arc<Vec<Option<Arc<WriteRecord>>>>,
}

/// What every worker shares: the current snapshot and a way to hear of the next one.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) current: ArcSwap<Snapshot>,
    pub(crate) changed: watch::Sender<u64>,
    /// The configuration last applied, before the endpoints found from Sentinels are filled
    /// in; held while one is applied, which serializes `apply` (config changes are rare; the
    /// request path never takes it).
    pub(crate) base: std::sync::Mutex<Config>,
    /// The primaries and replicas of Sentinel-managed shards, as last found.
    pub(crate) discovery: crate::discovery::sentinel::Discovery,
    /// The shards of Redis Clusters, as last found.
    pub(crate) cluster_discovery: crate::discovery::redis_cluster::Discovery,
    /// Failed `AUTH` attempts per client address, over every listener and worker.
    pub(crate) auth_limiter: Arc<crate::stack::acl::AuthTarpit>,
    /// Active health-check state per endpoint (read by the workers through their handles).
    pub(crate) checks: crate::discovery::health::Checks,
    /// Whether each address announced by a listener's cluster emulation answers (read by
    /// the workers through their parts).
    pub(crate) peers: crate::discovery::peers::Peers,
    /// The commands learned from the shards (read by the sessions through their parts).
    pub(crate) learned: Arc<respway_filters::command::learned::Learned>,
    /// The copy passes of hot-key rules, whose flags each compiled rule gets.
    pub(crate) copies: Arc<crate::cache::hotcopy::Copies>,
    /// Worker threads (each record of write copies has one part per worker).
    pub(crate) workers: usize,
}

impl Shared {
    /// `config` with what discovery found filled in: the endpoints the Sentinels name, the
    /// shards of Redis Clusters.
    fn resolve(&self, config: Config) -> Config {
        self.cluster_discovery
            .resolve(self.discovery.resolve(config))
    }
}

/// A running data plane. Dropping it does not stop it; call [`Server::shutdown`].
#[derive(Debug)]
pub struct Server {
    addrs: Vec<SocketAddr>,
    stop: watch::Sender<Stop>,
    threads: Vec<JoinHandle<()>>,
    registry: Arc<Registry>,
    handle: ConfigHandle,
}

/// Applies configuration changes to a running [`Server`]; cheap to clone, usable from any
/// thread (the xDS client and the SIGHUP reload hold one).
#[derive(Debug, Clone)]
pub struct ConfigHandle {
    shared: Arc<Shared>,
}

impl ConfigHandle {
    /// Validates and compiles `config`, then publishes it to every worker.
    ///
    /// # Errors
    /// A message naming what is wrong; the running configuration is left unchanged. The set
    /// of listeners (names and addresses) cannot change without a restart.
    pub fn apply(&self, config: Config) -> Result<u64, String> {
        let mut base = self.shared.base.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.shared.current.load_full();
        let same_listeners = old.config.listeners.len() == config.listeners.len()
            && old
                .config
                .listeners
                .iter()
                .zip(&config.listeners)
                .all(|(a, b)| a.name == b.name && a.address == b.address);
        if !same_listeners {
            return Err(
                "listeners: adding, removing, renaming or moving a listener needs a restart"
                    .to_string(),
            );
        }
        let version = old.version + 1;
        let resolved = self.shared.resolve(config.clone());
        let snapshot = compile(resolved, version, Some(&old), &self.shared)?;
        *base = config;
        self.shared.current.store(Arc::new(snapshot));
        self.shared.changed.send_replace(version);
        Ok(version)
    }

    /// Compiles the configuration last applied again with the endpoints the Sentinels name
    /// now, and publishes it (the workers swap it in as any other change).
    pub(crate) fn rediscover(&self) -> Result<u64, String> {
        let base = self.shared.base.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.shared.current.load_full();
        let version = old.version + 1;
        let resolved = self.shared.resolve(base.clone());
        let snapshot = compile(resolved, version, Some(&old), &self.shared)?;
        self.shared.current.store(Arc::new(snapshot));
        self.shared.changed.send_replace(version);
        Ok(version)
    }

    /// Hears of each configuration published.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// What the Sentinels named last.
    pub(crate) fn discovery(&self) -> &crate::discovery::sentinel::Discovery {
        &self.shared.discovery
    }

    /// What the checks of the sidecars announced by cluster emulation found.
    pub(crate) fn peers(&self) -> &crate::discovery::peers::Peers {
        &self.shared.peers
    }

    /// What the Redis Clusters said last.
    pub(crate) fn cluster_discovery(&self) -> &crate::discovery::redis_cluster::Discovery {
        &self.shared.cluster_discovery
    }

    /// The snapshot being served.
    pub(crate) fn current(&self) -> Arc<Snapshot> {
        self.shared.current.load_full()
    }
}

impl Server {
    /// The bound address of each listener, in configuration order (resolves port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Worker threads.
    pub(crate) fn workers(&self) -> usize {
        self.threads.len()
    }

    /// Counters summed over workers.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A handle that applies configuration changes.
    pub fn config_handle(&self) -> ConfigHandle {
        self.handle.clone()
    }

    /// Shorthand for `config_handle().apply(config)`.
    ///
    /// # Errors
    /// As [`ConfigHandle::apply`].
    pub fn apply(&self, config: Config) -> Result<u64, String> {
        self.handle.apply(config)
    }

    /// Stops accepting, closes every connection and joins the workers.
    pub fn shutdown(self) {
        let _ = self.stop.send(Stop::Now);
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Graceful drain (Envoy's `--drain-time-s`): stops accepting, lets every session answer
    /// the commands it has already read (reading nothing more), closes each session once it
    /// owes nothing, and joins the workers when all are closed or `timeout` has passed
    /// (whatever is still open then is closed). Returns the sessions cut by the timeout.
    pub fn drain(self, timeout: std::time::Duration) -> u64 {
        let _ = self.stop.send(Stop::Drain(timeout));
        for t in self.threads {
            let _ = t.join();
        }
        self.registry.totals().active
    }

    /// Blocks until the workers end (they end on [`Server::shutdown`] from another handle
    /// or when the process is signalled).
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Compiles `config`; TLS configurations of `old` whose settings did not change are reused,
/// and so are its records of write copies for the clusters that still receive some.
fn compile(
    config: Config,
    version: u64,
    old: Option<&Snapshot>,
    shared: &Shared,
) -> Result<Snapshot, String> {
    compile_with(config, version, old, &shared.copies, shared.workers)
}

fn compile_with(
    config: Config,
    version: u64,
    old: Option<&Snapshot>,
    copies: &crate::cache::hotcopy::Copies,
    workers: usize,
) -> Result<Snapshot, String> {
    // Clusters (maglev tables, rings) are compiled once and shared by every listener.
    let mut clusters = Routing::compile_clusters(&config)?;
    if let Some(c) = Arc::get_mut(&mut clusters) {
        copies.adopt(c);
    }
    let routings = config
        .listeners
        .iter()
        .map(|l| Routing::with_clusters(clusters.clone(), &config, l).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let acls = config
        .listeners
        .iter()
        .map(crate::stack::acl::Acl::build)
        .collect();
    let certs = crate::net::tls::Certs::build(&config, old.map(|o| &o.certs))?;
    let records = write_records(&config, &routings, old, workers);
    Ok(Snapshot {
        version,
        config: Arc::new(config),
        routings,
        acls,
        certs,
        records,
    })
}

/// Per cluster of `config`, the record of the write copies it receives: for a cluster some
/// `dual_write` policy of some listener sends write copies to
/// ([`Routing::write_copy_targets`]), `old`'s record of the cluster of that name when it had
/// one (the same id and keys: a reader's cursor stays good across the push), else a new one
/// (a new id); a cluster some `read_only` policy names (copy mode's write pause,
/// [`Routing::paused_copy_targets`]) keeps `old`'s record, unchanged, so the pause can read
/// the keys written before it; `None` for the others, whose record, if any, is dropped
/// (sessions still on an older configuration record into it until they move, unread).
fn write_records(
    config: &Config,
    routings: &[Arc<Routing>],
    old: Option<&Snapshot>,
    workers: usize,
) -> Arc<Vec<Option<Arc<WriteRecord>>>> {
    let mut targets = vec![false; config.clusters.len()];
    for c in routings.iter().flat_map(|r| r.write_copy_targets()) {
        if let Some(t) = targets.get_mut(c) {
            *t = true;
        }
    }
    let mut paused = vec![false; config.clusters.len()];
    for c in routings.iter().flat_map(|r| r.paused_copy_targets()) {
        if let Some(t) = paused.get_mut(c) {
            *t = true;
        }
    }
    let kept = |name: &str| {
        let old = old?;
        let i = old.config.clusters.iter().position(|c| c.name == name)?;
        old.records.get(i)?.clone()
    };
    Arc::new(
        (config.clusters.iter().zip(targets).zip(paused))
            .map(|((c, receives), paused)| {
                if receives {
                    Some(kept(&c.name).unwrap_or_else(|| Arc::new(WriteRecord::new(workers))))
                } else if paused {
                    kept(&c.name)
                } else {
                    None
                }
            })
            .collect(),
    )
}

/// The compiled snapshot, as a scrape reports on it.
impl crate::stats::Served for Snapshot {
    fn version(&self) -> u64 {
        self.version
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn certs(&self) -> &crate::net::tls::Certs {
        &self.certs
    }
}

/// The compiled snapshot, as discovery and the side threads see it.
impl crate::discovery::Serving for Snapshot {
    fn upstream_tls(&self, cluster: usize) -> Option<crate::net::tls::UpstreamTlsConfig> {
        self.certs.upstream(cluster)
    }

    fn first_routing(&self) -> Option<&Arc<Routing>> {
        self.routings.first()
    }
}

/// The narrow handle discovery and the side threads get instead of the runtime itself.
impl crate::discovery::Running for ConfigHandle {
    fn serving(&self) -> Arc<dyn crate::discovery::Serving> {
        self.current()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        ConfigHandle::subscribe(self)
    }

    fn republish(&self) -> Result<u64, String> {
        self.rediscover()
    }

    fn sentinels(&self) -> &crate::discovery::sentinel::Discovery {
        self.discovery()
    }

    fn redis_clusters(&self) -> &crate::discovery::redis_cluster::Discovery {
        self.cluster_discovery()
    }

    fn checks(&self) -> &crate::discovery::health::Checks {
        &self.shared.checks
    }

    fn peers(&self) -> &crate::discovery::peers::Peers {
        &self.shared.peers
    }

    fn learned(&self) -> &Arc<respway_filters::command::learned::Learned> {
        &self.shared.learned
    }
}

/// Starts the data plane for `config`.
///
/// # Errors
/// When a listener cannot be bound or the routing table cannot be built.
/// Every TLS file `config` names, loaded as a start would load it: one error per listener or
/// cluster whose files are missing or do not load, naming it and the file (`--check`).
pub fn check_files(config: &Config) -> Vec<String> {
    crate::net::tls::check_files(config)
}

pub fn start(config: Config, opts: Options) -> io::Result<Server> {
    crate::session::local::mark_start();
    let workers = opts.workers.max(1);
    // A closed shared connection: tracking clients are told every key may have changed.
    crate::upstream::on_shared_close(|| crate::cache::near_cache::clients::flush(0));
    let registry = Arc::new(Registry::default());
    let copies = Arc::new(crate::cache::hotcopy::Copies::default());
    registry.set_copies(copies.clone());
    let snapshot =
        compile_with(config.clone(), 1, None, &copies, workers).map_err(io::Error::other)?;
    let with_sentinels = crate::discovery::sentinel::any(&config);
    let with_redis_clusters = crate::discovery::redis_cluster::any(&config);
    let (changed, _) = watch::channel(1);
    let shared = Arc::new(Shared {
        current: ArcSwap::from_pointee(snapshot),
        changed,
        base: std::sync::Mutex::new(config),
        discovery: crate::discovery::sentinel::Discovery::default(),
        cluster_discovery: crate::discovery::redis_cluster::Discovery::default(),
        auth_limiter: Arc::default(),
        checks: crate::discovery::health::Checks::default(),
        peers: crate::discovery::peers::Peers::default(),
        learned: Arc::default(),
        copies,
        workers,
    });
    let (stop, stop_rx) = watch::channel(Stop::Run);
    // Sentinel-managed shards: their first answers are awaited (a little) so that the first
    // clients find the primaries known.
    let running: crate::discovery::Handle = Arc::new(ConfigHandle {
        shared: shared.clone(),
    });
    crate::discovery::watchers::start::<crate::discovery::sentinel::Masters>(
        "respway-sentinel",
        running.clone(),
        stop_rx.clone(),
        if with_sentinels {
            SENTINEL_FIRST_WAIT
        } else {
            std::time::Duration::ZERO
        },
    )?;
    // Redis Clusters: the first topology is awaited (a little) for the same reason.
    crate::discovery::watchers::start::<crate::discovery::redis_cluster::Clusters>(
        "respway-cluster",
        running.clone(),
        stop_rx.clone(),
        if with_redis_clusters {
            SENTINEL_FIRST_WAIT
        } else {
            std::time::Duration::ZERO
        },
    )?;
    // The listeners' names and configured addresses.
    let named: Vec<(String, SocketAddr)> = shared
        .current
        .load()
        .config
        .listeners
        .iter()
        .map(|l| (l.name.clone(), l.address))
        .collect();
    crate::session::listener::check_free(&named)?;
    crate::discovery::health::start(running.clone(), stop_rx.clone())?;
    // The shards' commands the built-in table does not hold: the first clients wait (a
    // little) for them to be learned.
    if opts.learn_commands {
        crate::discovery::commands::start(running.clone(), stop_rx.clone(), LEARN_FIRST_WAIT)?;
    }
    // Hot-key rules copy the keys that exist under them; the first clients wait (a little)
    // for it, so that reads spread from the start over a small keyspace.
    crate::cache::hotcopy::start(
        running,
        shared.copies.clone(),
        stop_rx.clone(),
        HOT_COPY_FIRST_WAIT,
    )?;
    let mut threads = Vec::with_capacity(workers);
    // Worker 0 binds first (resolving port 0); the others bind the same addresses with
    // SO_REUSEPORT so the kernel spreads connections over them.
    let mut addrs: Option<Vec<SocketAddr>> = None;
    for w in 0..workers {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<Vec<SocketAddr>>>();
        let bind_to: Vec<(String, SocketAddr)> = match &addrs {
            Some(a) => named
                .iter()
                .map(|(n, _)| n.clone())
                .zip(a.iter().copied())
                .collect(),
            None => named.clone(),
        };
        let worker = Worker {
            id: w,
            shared: shared.clone(),
            registry: registry.clone(),
            workers,
            stop: stop_rx.clone(),
            pools: HashMap::new(),
            upstream_stats: Arc::new(UpstreamStats::default()),
            hot_key_sample: opts.hot_key_sample,
            slowlog: (opts.slowlog_threshold_us, opts.slowlog_max_len),
            cache_stats: HashMap::new(),
        };
        registry.add_upstream(worker.upstream_stats.clone());
        let t = std::thread::Builder::new()
            .name(format!("respway-worker-{w}"))
            .spawn(move || worker.run(bind_to, ready_tx))?;
        match ready_rx.recv() {
            Ok(Ok(bound)) => {
                if addrs.is_none() {
                    addrs = Some(bound);
                }
            }
            Ok(Err(e)) => {
                let _ = stop.send(Stop::Now);
                for t in threads {
                    let _ = JoinHandle::join(t);
                }
                return Err(e);
            }
            Err(_) => return Err(io::Error::other("worker thread died during start")),
        }
        threads.push(t);
    }
    Ok(Server {
        addrs: addrs.unwrap_or_default(),
        stop,
        threads,
        registry,
        handle: ConfigHandle { shared },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clusters of a configuration are compiled once, whatever the number of listeners.
    #[test]
    fn clusters_compile_once_per_snapshot() {
        let yaml = "listeners:\n  - name: a\n    address: 127.0.0.1:7001\n    routes: { catch_all: c }\n  - name: b\n    address: 127.0.0.1:7002\n    routes: { catch_all: c }\nclusters:\n  - name: c\n    shards:\n      - endpoints: [ { address: \"127.0.0.1:6379\" } ]\n";
        let config =
            respway_xds::translate(&respway_xds::parse_yaml(yaml).expect("yaml")).expect("config");
        let snap = compile_with(config, 1, None, &Default::default(), 1).expect("compiles");
        assert_eq!(snap.routings.len(), 2);
        assert!(Arc::ptr_eq(
            &snap.routings[0].clusters,
            &snap.routings[1].clusters
        ));
    }

    /// A record of write copies is kept from snapshot to snapshot while a `dual_write` still
    /// sends its cluster copies (whichever listener's) or a `read_only` policy names it (the
    /// write pause), dropped when none does, and a new one (another id) starts with the next
    /// dual write.
    #[test]
    fn records_of_write_copies_live_while_a_dual_write_sends_copies() {
        let yaml = |mode: &str| {
            format!(
                "listeners:\n  - name: a\n    address: 127.0.0.1:7001\n    routes:\n      catch_all: old\n      catch_all_mirrors: [ {{ cluster: new, mode: {mode} }} ]\nclusters:\n  - name: old\n    shards:\n      - endpoints: [ {{ address: \"127.0.0.1:6379\" }} ]\n  - name: new\n    shards:\n      - endpoints: [ {{ address: \"127.0.0.1:6380\" }} ]\n"
            )
        };
        let compile = |mode: &str, old: Option<&Snapshot>| {
            let config =
                respway_xds::translate(&respway_xds::parse_yaml(&yaml(mode)).expect("yaml"))
                    .expect("config");
            compile_with(config, 1, old, &Default::default(), 2).expect("compiles")
        };
        let first = compile("dual_write", None);
        assert!(first.records[0].is_none(), "old receives no copies");
        let record = first.records[1].clone().expect("new receives them");
        assert!(record.part(1).is_some() && record.part(2).is_none());
        let kept = compile("dual_write", Some(&first));
        assert!(Arc::ptr_eq(kept.records[1].as_ref().unwrap(), &record));
        // Copy mode's write pause: no write is copied, the record is kept for the pause to
        // read; a read_only policy never starts one.
        let paused = compile("read_only", Some(&kept));
        assert!(Arc::ptr_eq(paused.records[1].as_ref().unwrap(), &record));
        assert!(compile("read_only", None)
            .records
            .iter()
            .all(Option::is_none));
        let none = compile("forward", Some(&paused));
        assert!(none.records.iter().all(Option::is_none));
        let again = compile("dual_write", Some(&none));
        assert_ne!(again.records[1].as_ref().unwrap().id(), record.id());
    }
}

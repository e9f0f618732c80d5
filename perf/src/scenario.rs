//! Scenario files: a workload, how to drive it, and the topology to compare on.
//!
//! ```yaml
//! name: zipf-hot
//! description: zipf 0.99 reads with 10% on ten HIGH_FREQ_ keys
//! workload:                  # see workload::Workload
//!   keyspace: 100000
//!   distribution: { zipf: 0.99 }
//!   hot: { prefix: HIGH_FREQ_, share: 0.1, keys: 10 }
//!   commands: { get: 9, set: 1 }
//!   value_size: 64
//! load:                      # see Load
//!   mode: closed             # or open (with rate, arrival)
//!   connections: 50
//!   pipeline: 16
//!   duration: 10s
//! preload: true              # SET every string key through each target first
//! rounds: 3
//! topology:                  # see topology::TopologySpec
//!   shards: 3
//!   targets:
//!     - { kind: redis }
//!     - { kind: nutcracker }
//!     - { kind: respway, workers: 1 }
//!     - { kind: respway, workers: 1, name: respway-hot, hot_keys: [HIGH_FREQ_] }
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::closed::{run_closed, ClosedConfig};
use crate::open::{run_open, Arrival, OpenConfig, RateSchedule};
use crate::stats::Recorder;
use crate::topology::{RespwaySpec, TargetSpec, TopologySpec};
use crate::workload::{generate_pools, preload_pools, RequestPool, Workload};
use crate::{serde_duration, Control, Error};

/// Closed or open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// N connections × pipeline depth, as fast as the target answers.
    #[default]
    Closed,
    /// A fixed arrival rate; latency from the intended send time.
    Open,
}

/// How a workload is driven.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Load {
    /// Closed or open loop.
    pub mode: Mode,
    /// Connections.
    pub connections: usize,
    /// Closed loop: requests per batch (one write, then every reply).
    pub pipeline: usize,
    /// Closed loop: driver threads.
    pub threads: usize,
    /// Open loop: requests per second over all connections.
    pub rate: f64,
    /// Open loop: even or Poisson spacing.
    pub arrival: Arrival,
    /// Length of a run.
    #[serde(with = "serde_duration")]
    pub duration: Duration,
    /// Most requests in a run.
    pub max_requests: u64,
    /// Timeline interval.
    #[serde(with = "serde_duration")]
    pub interval: Duration,
    /// A request without reply after this long counts as a timeout (closed loop; open
    /// loop: the drain after the last send).
    #[serde(with = "serde_duration")]
    pub reply_timeout: Duration,
    /// Requests generated ahead of time, over all connections; each connection cycles
    /// through its share.
    pub pool_requests: usize,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            mode: Mode::Closed,
            connections: 50,
            pipeline: 16,
            threads: 1,
            rate: 10_000.0,
            arrival: Arrival::Uniform,
            duration: Duration::from_secs(10),
            max_requests: 50_000_000,
            interval: Duration::from_secs(1),
            reply_timeout: Duration::from_secs(5),
            pool_requests: 1_000_000,
        }
    }
}

impl Load {
    /// Checks every field; all problems at once.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errs = Vec::new();
        if self.connections == 0 || self.connections > 10_000 {
            errs.push("load.connections: must be between 1 and 10000".to_string());
        }
        if self.pipeline == 0 {
            errs.push("load.pipeline: must be at least 1".into());
        }
        if self.threads == 0 {
            errs.push("load.threads: must be at least 1".into());
        }
        if self.mode == Mode::Open && !(self.rate.is_finite() && self.rate > 0.0) {
            errs.push("load.rate: an open-loop run needs a rate > 0".into());
        }
        if self.mode == Mode::Open && self.connections > 512 {
            errs.push(
                "load.connections: open loop runs one reader thread per connection: at most 512"
                    .into(),
            );
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(24 * 3600) {
            errs.push("load.duration: must be more than 0 and at most 24h".into());
        }
        if self.max_requests == 0 {
            errs.push("load.max_requests: must be at least 1".into());
        }
        if self.pool_requests == 0 {
            errs.push("load.pool_requests: must be at least 1".into());
        }
        if self.interval < Duration::from_millis(10)
            || self.duration.as_secs_f64() / self.interval.as_secs_f64().max(1e-3) > 3600.0
        {
            errs.push(
                "load.interval: must be at least 10ms, and a run at most 3600 intervals long"
                    .into(),
            );
        }
        if self.reply_timeout.is_zero() {
            errs.push("load.reply_timeout: must be more than 0".into());
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(errs.join("\n")))
        }
    }

    /// The pools this load needs for `w`: one per connection, each with its share of
    /// `pool_requests` (but no more than the run can send), whole pipeline batches.
    pub fn pools(&self, w: &Workload) -> Result<Vec<RequestPool>, Error> {
        let conns = self.connections.max(1);
        let run_total = match self.mode {
            Mode::Closed => self.max_requests,
            Mode::Open => self
                .max_requests
                .min((self.rate * self.duration.as_secs_f64()).ceil() as u64 + 1),
        };
        let per_conn = (self.pool_requests / conns)
            .max(self.pipeline)
            .min(run_total.div_ceil(conns as u64) as usize)
            .max(1);
        let batch = if self.mode == Mode::Closed {
            self.pipeline
        } else {
            1
        };
        generate_pools(w, conns, per_conn, batch)
    }
}

/// A configuration push during each measured run of every `respway-xds` target: the fields
/// given replace the target's current ones (pushes add up within a run; every run starts
/// from the target's own configuration again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigPush {
    /// When, after the run starts.
    #[serde(with = "serde_duration")]
    pub at: Duration,
    /// What the marker on the plots says.
    #[serde(default)]
    pub label: String,
    /// New hot-key prefixes (`[]`: none).
    #[serde(default)]
    pub hot_keys: Option<Vec<String>>,
    /// New `read_policy` of the cluster.
    #[serde(default)]
    pub read_policy: Option<String>,
    /// New `connections_per_endpoint`.
    #[serde(default)]
    pub connections_per_endpoint: Option<usize>,
    /// Serve only the first N shards of the topology (shards added or removed on the fly).
    #[serde(default)]
    pub shards: Option<usize>,
}

impl ConfigPush {
    /// `r` with this push's changes.
    pub fn apply_to(&self, r: &RespwaySpec) -> RespwaySpec {
        let mut out = r.clone();
        if let Some(h) = &self.hot_keys {
            out.hot_keys = h.clone();
        }
        if let Some(p) = &self.read_policy {
            out.read_policy = Some(p.clone());
        }
        if let Some(c) = self.connections_per_endpoint {
            out.connections_per_endpoint = Some(c);
        }
        if let Some(n) = self.shards {
            out.shards = Some(n);
        }
        out
    }

    fn changes_nothing(&self) -> bool {
        self.hot_keys.is_none()
            && self.read_policy.is_none()
            && self.connections_per_endpoint.is_none()
            && self.shards.is_none()
    }

    /// The marker's text: the label, else what changes.
    pub fn describe(&self) -> String {
        if !self.label.is_empty() {
            return self.label.clone();
        }
        let mut parts = Vec::new();
        if let Some(h) = &self.hot_keys {
            parts.push(format!("hot_keys {h:?}"));
        }
        if let Some(p) = &self.read_policy {
            parts.push(format!("read_policy {p}"));
        }
        if let Some(c) = self.connections_per_endpoint {
            parts.push(format!("connections {c}"));
        }
        if let Some(n) = self.shards {
            parts.push(format!("{n} shards"));
        }
        parts.join(", ")
    }
}

fn default_rounds() -> usize {
    3
}

fn default_warmup() -> Duration {
    Duration::from_secs(1)
}

/// A scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (file names, report titles).
    pub name: String,
    /// What it shows.
    #[serde(default)]
    pub description: String,
    /// The traffic.
    #[serde(default)]
    pub workload: Workload,
    /// How it is driven.
    #[serde(default)]
    pub load: Load,
    /// Where (for `compare`).
    #[serde(default)]
    pub topology: TopologySpec,
    /// Measured runs per target, interleaved (the target order rotates each round).
    #[serde(default = "default_rounds")]
    pub rounds: usize,
    /// SET every string key through each target before measuring.
    #[serde(default)]
    pub preload: bool,
    /// An unmeasured run per target before the rounds.
    #[serde(default = "default_warmup", with = "serde_duration")]
    pub warmup: Duration,
    /// Config pushes to make during each run (marked on the plots).
    #[serde(default)]
    pub config_pushes: Vec<ConfigPush>,
}

impl Scenario {
    /// A scenario from flags alone.
    pub fn new(name: &str) -> Scenario {
        Scenario {
            name: name.into(),
            description: String::new(),
            workload: Workload::default(),
            load: Load::default(),
            topology: TopologySpec::default(),
            rounds: default_rounds(),
            preload: false,
            warmup: default_warmup(),
            config_pushes: Vec::new(),
        }
    }

    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let sc: Scenario = serde_yaml_ng::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        sc.validate()
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Ok(sc)
    }

    /// Checks the whole scenario; all problems at once.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errs = Vec::new();
        if let Err(e) = self.workload.validate() {
            errs.extend(e.to_string().lines().map(|l| format!("workload.{l}")));
        }
        if let Err(e) = self.load.validate() {
            errs.push(e.to_string());
        }
        if self.rounds == 0 || self.rounds > 100 {
            errs.push("rounds: must be between 1 and 100".into());
        }
        if !self.config_pushes.is_empty()
            && !self
                .topology
                .targets
                .iter()
                .any(|t| matches!(t, TargetSpec::RespwayXds(_)))
        {
            errs.push(
                "config_pushes: pushes go to respway-xds targets, and topology.targets has none \
                 (add `- { kind: respway-xds }`)"
                    .into(),
            );
        }
        let mut last = Duration::ZERO;
        for (i, p) in self.config_pushes.iter().enumerate() {
            if p.at >= self.load.duration {
                errs.push(format!(
                    "config_pushes[{i}].at: {:?} is not within the run's duration ({:?})",
                    p.at, self.load.duration
                ));
            }
            if p.at < last {
                errs.push(format!(
                    "config_pushes[{i}].at: pushes must be in time order ({:?} comes after {last:?})",
                    p.at
                ));
            }
            last = p.at;
            if p.changes_nothing() {
                errs.push(format!(
                    "config_pushes[{i}]: says nothing to change (hot_keys, read_policy, \
                     connections_per_endpoint or shards)"
                ));
            }
            if let Some(n) = p.shards {
                if n == 0 || n > self.topology.shards {
                    errs.push(format!(
                        "config_pushes[{i}].shards: {n} is not between 1 and the topology's {} \
                         shards",
                        self.topology.shards
                    ));
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(errs.join("\n")))
        }
    }
}

/// Runs `load` once against `addr` with pre-generated `pools`.
pub fn drive(
    addr: SocketAddr,
    load: &Load,
    pools: Arc<Vec<RequestPool>>,
    seed: u64,
    ctl: &Control,
) -> Result<Recorder, Error> {
    match load.mode {
        Mode::Closed => run_closed(
            &ClosedConfig {
                addr,
                connections: load.connections,
                pipeline: load.pipeline,
                threads: load.threads,
                duration: load.duration,
                max_requests: load.max_requests,
                cycle: true,
                reply_timeout: load.reply_timeout,
                interval: load.interval,
            },
            pools,
            ctl,
        ),
        Mode::Open => {
            let lens = pools.iter().map(RequestPool::len).collect();
            let mut sched = RateSchedule::new(load.rate, load.arrival, seed, lens);
            run_open(
                &OpenConfig {
                    addr,
                    duration: load.duration,
                    max_requests: load.max_requests,
                    drain: load.reply_timeout,
                    interval: load.interval,
                },
                pools,
                &mut sched,
                ctl,
            )
        }
    }
}

/// Writes every string key of `w` through `addr` (8 connections, pipelined). Returns the
/// number of keys written; fails if any write failed.
pub fn preload(addr: SocketAddr, w: &Workload, ctl: &Control) -> Result<u64, Error> {
    let pools = preload_pools(w, 8)?;
    let total: u64 = pools.iter().map(|p| p.len() as u64).sum();
    let rec = run_closed(
        &ClosedConfig {
            addr,
            connections: pools.len(),
            pipeline: 64,
            threads: 1,
            duration: Duration::from_secs(300),
            max_requests: total,
            cycle: false,
            reply_timeout: Duration::from_secs(10),
            interval: Duration::from_secs(1),
        },
        Arc::new(pools),
        ctl,
    )?;
    let errors: u64 = rec.errors.values().sum();
    if errors > 0 || rec.replies != total {
        return Err(Error::Run(format!(
            "preload through {addr}: {} of {total} keys written, errors {:?}",
            rec.replies - errors.min(rec.replies),
            rec.errors
        )));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_yaml_and_validation() {
        let sc: Scenario = serde_yaml_ng::from_str(
            "name: t\nload: { mode: open, rate: 0, duration: 2s }\nrounds: 0\n\
             config_pushes: [{ at: 1s }]\nworkload: { keyspace: 0 }\n",
        )
        .unwrap();
        assert_eq!(sc.load.duration, Duration::from_secs(2));
        assert_eq!(
            sc.validate().unwrap_err().to_string(),
            "workload.keyspace: must be at least 1\n\
             load.rate: an open-loop run needs a rate > 0\n\
             rounds: must be between 1 and 100\n\
             config_pushes: pushes go to respway-xds targets, and topology.targets has none \
             (add `- { kind: respway-xds }`)\n\
             config_pushes[0]: says nothing to change (hot_keys, read_policy, \
             connections_per_endpoint or shards)"
        );
        let sc: Scenario = serde_yaml_ng::from_str(
            "name: t\nload: { duration: 2s }\n\
             topology: { shards: 2, targets: [{ kind: respway-xds, hot_keys: [H_] }] }\n\
             config_pushes:\n\
             - { at: 1s, hot_keys: [] }\n\
             - { at: 500ms, shards: 3 }\n\
             - { at: 2s, label: late, read_policy: prefer_replica }\n",
        )
        .unwrap();
        assert_eq!(
            sc.validate().unwrap_err().to_string(),
            "config_pushes[1].at: pushes must be in time order (500ms comes after 1s)\n\
             config_pushes[1].shards: 3 is not between 1 and the topology's 2 shards\n\
             config_pushes[2].at: 2s is not within the run's duration (2s)"
        );
        let TargetSpec::RespwayXds(base) = &sc.topology.targets[0] else {
            panic!("{:?}", sc.topology.targets[0]);
        };
        assert_eq!(sc.topology.targets[0].name(), "respway-xds");
        let after = sc.config_pushes[0].apply_to(base);
        assert!(after.hot_keys.is_empty() && base.hot_keys == ["H_"]);
        let after = sc.config_pushes[1].apply_to(&after);
        assert_eq!(after.shards, Some(3));
        assert_eq!(sc.config_pushes[0].describe(), "hot_keys []");
        assert_eq!(sc.config_pushes[2].describe(), "late");
        let sc: Scenario = serde_yaml_ng::from_str(
            "name: t\ntopology: { shards: 2, targets: [{ kind: redis }, { kind: respway, workers: 2, hot_keys: [H_] }] }\n",
        )
        .unwrap();
        assert!(sc.validate().is_ok());
        assert_eq!(sc.topology.targets[1].name(), "respway-w2");
    }

    #[test]
    fn shipped_scenarios_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                let sc = Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(
                    p.file_stem().unwrap().to_str().unwrap(),
                    sc.name,
                    "file name = scenario name"
                );
                n += 1;
            }
        }
        assert!(n >= 5);
    }

    #[test]
    fn pools_are_sized_to_the_run() {
        let load = Load {
            connections: 4,
            pipeline: 16,
            max_requests: 100,
            ..Load::default()
        };
        let pools = load.pools(&Workload::default()).unwrap();
        assert_eq!(pools.len(), 4);
        // 25 per connection, rounded up to whole batches of 16
        assert_eq!(pools[0].len(), 32);
    }
}

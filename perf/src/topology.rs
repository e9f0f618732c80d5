//! Local topologies: redis-server shards (with replicas), a standalone redis-server,
//! nutcracker (twemproxy) and respway over the same shards — started from a described
//! [`TopologySpec`] on free loopback ports, and always stopped: every process is a child
//! killed when the [`Running`] topology is dropped (also on error or panic).
//!
//! Also the probes the comparison needs: a process's CPU time (`/proc/PID/stat`) and a
//! server's executed commands (`INFO commandstats`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use respway_filters::resp::{parse_reply, reply_len, Frame};
use serde::{Deserialize, Serialize};

use crate::closed::reply_limits;
use crate::xds_admin::{self, AdminToken};
use crate::Error;

/// A topology to start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopologySpec {
    /// Shard primaries behind the proxies.
    pub shards: usize,
    /// Replicas per shard (`--replicaof` its primary).
    pub replicas: usize,
    /// The redis-server binary.
    pub redis_server: String,
    /// The nutcracker binary (`nutcracker`, else `/usr/sbin/nutcracker`).
    pub nutcracker: Option<String>,
    /// The respway binary (default: `$RESPWAY_BIN`, else `target/release/respway` in the
    /// current directory or a parent).
    pub respway: Option<PathBuf>,
    /// The respway-xds binary, for `respway-xds` targets (default: `$RESPWAY_XDS_BIN`, else
    /// `target/release/respway-xds` in the current directory or a parent).
    pub respway_xds: Option<PathBuf>,
    /// What to measure, in order.
    pub targets: Vec<TargetSpec>,
}

impl Default for TopologySpec {
    fn default() -> Self {
        TopologySpec {
            shards: 3,
            replicas: 0,
            redis_server: "redis-server".into(),
            nutcracker: None,
            respway: None,
            respway_xds: None,
            targets: vec![
                TargetSpec::Redis { name: None },
                TargetSpec::Nutcracker { name: None },
                TargetSpec::Respway(RespwaySpec::default()),
            ],
        }
    }
}

/// One thing to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TargetSpec {
    /// A standalone redis-server (no proxy, no shards): the ceiling.
    Redis {
        /// Name in the report (default `redis`).
        #[serde(default)]
        name: Option<String>,
    },
    /// nutcracker over the shards: ketama, fnv1a_64, hash tag `{}`, one connection per server.
    Nutcracker {
        /// Name in the report (default `nutcracker`).
        #[serde(default)]
        name: Option<String>,
    },
    /// respway over the shards (the same ketama ring as nutcracker, so keys land alike).
    Respway(RespwaySpec),
    /// respway fed over ADS by its own respway-xds management server (started with a
    /// resources directory holding the same configuration as a `respway` target), so a
    /// scenario's `config_pushes` can change it during the runs.
    RespwayXds(RespwaySpec),
    /// Something started elsewhere (loopback only).
    External {
        /// Name in the report.
        name: String,
        /// Where it listens.
        address: SocketAddr,
        /// Its process, for CPU time.
        #[serde(default)]
        pid: Option<u32>,
        /// Its shards' primaries, for the per-shard load balance.
        #[serde(default)]
        shards: Vec<SocketAddr>,
    },
}

/// A respway target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RespwaySpec {
    /// Name in the report (default `respway-w<workers>`).
    pub name: Option<String>,
    /// `--workers`.
    pub workers: usize,
    /// Hot-key prefixes (`hot_keys: [{ prefix }]` on the cluster): writes fan out to every
    /// shard, reads pick one.
    pub hot_keys: Vec<String>,
    /// The cluster's `read_policy` (with replicas: e.g. `prefer_replica`).
    pub read_policy: Option<String>,
    /// The cluster's `connections_per_endpoint`.
    pub connections_per_endpoint: Option<usize>,
    /// Use only the first N of the topology's shards (default: all).
    pub shards: Option<usize>,
}

impl Default for RespwaySpec {
    fn default() -> Self {
        RespwaySpec {
            name: None,
            workers: 1,
            hot_keys: Vec::new(),
            read_policy: None,
            connections_per_endpoint: None,
            shards: None,
        }
    }
}

impl TargetSpec {
    /// The name in the report.
    pub fn name(&self) -> String {
        match self {
            TargetSpec::Redis { name } => name.clone().unwrap_or_else(|| "redis".into()),
            TargetSpec::Nutcracker { name } => name.clone().unwrap_or_else(|| "nutcracker".into()),
            TargetSpec::Respway(r) => r
                .name
                .clone()
                .unwrap_or_else(|| format!("respway-w{}", r.workers)),
            TargetSpec::RespwayXds(r) => r.name.clone().unwrap_or_else(|| "respway-xds".into()),
            TargetSpec::External { name, .. } => name.clone(),
        }
    }

    fn needs_shards(&self) -> bool {
        matches!(
            self,
            TargetSpec::Nutcracker { .. } | TargetSpec::Respway(_) | TargetSpec::RespwayXds(_)
        )
    }
}

/// A started (or external) target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// Name in the report.
    pub name: String,
    /// `redis`, `nutcracker`, `respway` or `external`.
    pub kind: String,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The proxy process (none for a plain redis-server).
    pub proxy_pid: Option<u32>,
    /// The redis-servers that serve this target's commands (one for `redis`).
    pub server_pids: Vec<u32>,
    /// Endpoints per shard (primary first), for `INFO commandstats`.
    pub shards: Vec<Vec<SocketAddr>>,
    /// How it was started.
    pub command: String,
    /// For a `respway-xds` target: how to change its configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xds: Option<XdsControl>,
}

/// How to push configuration to a `respway-xds` target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct XdsControl {
    /// The management server's admin endpoint (`POST /apply`, `GET /status`).
    pub admin: SocketAddr,
    /// Its admin credentials (a bearer token made for the run; never written to reports).
    #[serde(skip)]
    pub auth: AdminToken,
    /// The sidecar's node id.
    pub node: String,
    /// The sidecar's listener port.
    pub port: u16,
    /// The configuration it starts with (and is reset to before each run).
    pub base: RespwaySpec,
    /// Every shard of the topology (a configuration may use the first N).
    pub all_shards: Vec<Vec<SocketAddr>>,
}

/// A child process, killed and reaped on drop.
#[derive(Debug)]
pub struct Proc {
    /// What it is.
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running topology. Dropping it stops every process it started and removes its scratch
/// directory (kept when `keep` is set).
#[derive(Debug)]
pub struct Running {
    /// The targets, in the spec's order.
    pub targets: Vec<Target>,
    /// Shard endpoints (primary first, then replicas).
    pub shards: Vec<Vec<SocketAddr>>,
    procs: Vec<Proc>,
    dir: PathBuf,
    /// Keep the scratch directory (configs, logs) on drop.
    pub keep: bool,
}

impl Running {
    /// The scratch directory (configs and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every started process: `(name, pid)`.
    pub fn processes(&self) -> Vec<(String, u32)> {
        self.procs
            .iter()
            .map(|p| (p.name.clone(), p.pid()))
            .collect()
    }

    /// Checks that every started process still runs; names the first that does not.
    pub fn check_alive(&mut self) -> Result<(), Error> {
        for p in &mut self.procs {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(Error::Process(format!(
                    "{} exited ({status}); its log ends with:\n{}",
                    p.name,
                    p.log_tail()
                )));
            }
        }
        Ok(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Proxies first, then the servers behind them.
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A free loopback port (bound, then released for the process about to use it).
pub fn free_port() -> Result<u16, Error> {
    // Below Linux's ephemeral range (32768-60999 by default): a port there can be taken by
    // any outgoing connection on the machine between this check and the child's bind (seen in
    // CI: "Address already in use"). The start differs per process; the count moves on, so
    // one process never hands out the same port twice.
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: OnceLock<u32> = OnceLock::new();
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        (std::process::id().wrapping_mul(7919) ^ nanos) % SPAN
    });
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Starts everything `spec` describes. On any failure, whatever was started is stopped.
pub fn start(spec: &TopologySpec) -> Result<Running, Error> {
    let mut errs = Vec::new();
    if spec.targets.is_empty() {
        errs.push("targets: at least one target is needed".to_string());
    }
    let mut names = std::collections::BTreeSet::new();
    for t in &spec.targets {
        if !names.insert(t.name()) {
            errs.push(format!("targets: two targets are named {:?}", t.name()));
        }
        match t {
            TargetSpec::External { address, .. } if !address.ip().is_loopback() => {
                errs.push(format!(
                    "targets: {:?}: {address} is not a loopback address",
                    t.name()
                ))
            }
            TargetSpec::Respway(r) | TargetSpec::RespwayXds(r) => {
                if r.workers == 0 {
                    errs.push(format!(
                        "targets: {:?}: workers must be at least 1",
                        t.name()
                    ));
                }
                if let Some(n) = r.shards {
                    if n == 0 || n > spec.shards {
                        errs.push(format!(
                            "targets: {:?}: shards: {n} is not between 1 and the topology's {} shards",
                            t.name(),
                            spec.shards
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    let needs_shards = spec.targets.iter().any(TargetSpec::needs_shards);
    if needs_shards && spec.shards == 0 {
        errs.push("shards: at least one shard is needed for proxies".into());
    }
    if !errs.is_empty() {
        return Err(Error::Config(errs.join("\n")));
    }
    let dir = std::env::temp_dir().join(format!(
        "respway-perf-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir)?;
    let mut run = Running {
        targets: Vec::new(),
        shards: Vec::new(),
        procs: Vec::new(),
        dir,
        keep: false,
    };
    if needs_shards {
        for s in 0..spec.shards {
            let p = start_redis(&mut run, spec, &format!("shard{s}"), None)?;
            run.shards.push(vec![p]);
        }
        for s in 0..spec.shards {
            let primary = run.shards[s][0];
            for r in 0..spec.replicas {
                let a = start_redis(
                    &mut run,
                    spec,
                    &format!("shard{s}-replica{r}"),
                    Some(primary),
                )?;
                run.shards[s].push(a);
            }
        }
        if spec.replicas > 0 {
            for shard in run.shards.clone() {
                for &r in &shard[1..] {
                    wait_replica_synced(r)?;
                }
            }
        }
    }
    let shard_pids: Vec<u32> = run
        .procs
        .iter()
        .filter(|p| p.name.starts_with("shard"))
        .map(Proc::pid)
        .collect();
    for t in &spec.targets {
        let target = match t {
            TargetSpec::Redis { .. } => {
                let a = start_redis(&mut run, spec, &t.name(), None)?;
                let pid = run.procs.last().map(Proc::pid);
                Target {
                    name: t.name(),
                    kind: "redis".into(),
                    addr: a,
                    proxy_pid: None,
                    server_pids: pid.into_iter().collect(),
                    shards: vec![vec![a]],
                    command: format!(
                        "{} --port {} --save \"\" --appendonly no",
                        spec.redis_server,
                        a.port()
                    ),
                    xds: None,
                }
            }
            TargetSpec::Nutcracker { .. } => {
                start_nutcracker(&mut run, spec, &t.name(), &shard_pids)?
            }
            TargetSpec::Respway(r) => start_respway(&mut run, spec, r, &t.name(), &shard_pids)?,
            TargetSpec::RespwayXds(r) => {
                start_respway_xds(&mut run, spec, r, &t.name(), &shard_pids)?
            }
            TargetSpec::External {
                name,
                address,
                pid,
                shards,
            } => Target {
                name: name.clone(),
                kind: "external".into(),
                addr: *address,
                proxy_pid: *pid,
                server_pids: Vec::new(),
                shards: shards.iter().map(|&s| vec![s]).collect(),
                command: format!("(started elsewhere) {address}"),
                xds: None,
            },
        };
        run.targets.push(target);
    }
    Ok(run)
}

fn spawn(run: &mut Running, name: &str, cmd: &mut Command) -> Result<(), Error> {
    let log = run.dir.join(format!("{name}.log"));
    let out = std::fs::File::create(&log)?;
    let err = out.try_clone()?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| {
            Error::Process(format!(
                "{name}: could not start {:?}: {e}",
                cmd.get_program()
            ))
        })?;
    run.procs.push(Proc {
        name: name.to_string(),
        child,
        log,
    });
    Ok(())
}

/// Waits until `addr` answers PING with PONG, failing early if the last started process
/// exited.
fn wait_ready(run: &mut Running, addr: SocketAddr) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(p) = run.procs.last_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(Error::Process(format!(
                    "{} exited at start ({status}); its log ends with:\n{}",
                    p.name,
                    p.log_tail()
                )));
            }
        }
        if let Ok(Frame::Simple(s)) = command(addr, &[b"PING"]) {
            if &s[..] == b"PONG" {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            let name = run.procs.last().map_or("?", |p| p.name.as_str());
            return Err(Error::Process(format!(
                "{name} did not answer PING on {addr} within 15 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start_redis(
    run: &mut Running,
    spec: &TopologySpec,
    name: &str,
    replica_of: Option<SocketAddr>,
) -> Result<SocketAddr, Error> {
    let port = free_port()?;
    let mut cmd = Command::new(&spec.redis_server);
    cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--protected-mode", "no"])
        .arg("--dir")
        .arg(&run.dir)
        .args(["--dbfilename", &format!("{name}.rdb")]);
    if let Some(p) = replica_of {
        cmd.args(["--replicaof", "127.0.0.1", &p.port().to_string()]);
    }
    spawn(run, name, &mut cmd)?;
    let a = loopback(port);
    wait_ready(run, a)?;
    Ok(a)
}

fn wait_replica_synced(addr: SocketAddr) -> Result<(), Error> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Frame::Bulk(b)) = command(addr, &[b"INFO", b"replication"]) {
            if String::from_utf8_lossy(&b).contains("master_link_status:up") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(Error::Process(format!(
        "replica {addr} did not sync within 15 s"
    )))
}

fn nutcracker_bin(spec: &TopologySpec) -> String {
    if let Some(n) = &spec.nutcracker {
        return n.clone();
    }
    let in_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("nutcracker").is_file()));
    if in_path {
        "nutcracker".into()
    } else {
        "/usr/sbin/nutcracker".into()
    }
}

fn start_nutcracker(
    run: &mut Running,
    spec: &TopologySpec,
    name: &str,
    shard_pids: &[u32],
) -> Result<Target, Error> {
    let port = free_port()?;
    let stats = free_port()?;
    let mut yml = format!(
        "pool:\n  listen: 127.0.0.1:{port}\n  hash: fnv1a_64\n  distribution: ketama\n  \
         hash_tag: \"{{}}\"\n  redis: true\n  auto_eject_hosts: false\n  server_connections: 1\n  \
         preconnect: true\n  servers:\n"
    );
    for (i, s) in run.shards.iter().enumerate() {
        yml.push_str(&format!("   - 127.0.0.1:{}:1 s{i}\n", s[0].port()));
    }
    let conf = run.dir.join(format!("{name}.yml"));
    std::fs::write(&conf, yml)?;
    let bin = nutcracker_bin(spec);
    let mut cmd = Command::new(&bin);
    cmd.arg("-c")
        .arg(&conf)
        .args(["-s", &stats.to_string(), "-a", "127.0.0.1"]);
    spawn(run, name, &mut cmd)?;
    let addr = loopback(port);
    wait_ready(run, addr)?;
    Ok(Target {
        name: name.into(),
        kind: "nutcracker".into(),
        addr,
        proxy_pid: run.procs.last().map(Proc::pid),
        server_pids: shard_pids.to_vec(),
        shards: run.shards.iter().map(|s| vec![s[0]]).collect(),
        command: format!(
            "{bin} -c {name}.yml (ketama, fnv1a_64, hash_tag {{}}, {} shards)",
            run.shards.len()
        ),
        xds: None,
    })
}

/// Finds the respway binary: the spec's, `$RESPWAY_BIN`, or `target/release/respway` in the
/// current directory or one of its parents.
pub fn respway_bin(spec: &TopologySpec) -> Result<PathBuf, Error> {
    find_bin(spec.respway.as_ref(), "RESPWAY_BIN", "respway", "respway")
}

/// Finds the respway-xds binary: the spec's, `$RESPWAY_XDS_BIN`, or
/// `target/release/respway-xds` in the current directory or one of its parents.
pub fn respway_xds_bin(spec: &TopologySpec) -> Result<PathBuf, Error> {
    find_bin(
        spec.respway_xds.as_ref(),
        "RESPWAY_XDS_BIN",
        "respway-xds",
        "respway_xds",
    )
}

fn find_bin(given: Option<&PathBuf>, env: &str, name: &str, field: &str) -> Result<PathBuf, Error> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            Err(Error::Config(format!(
                "{field}: {} is not a file",
                p.display()
            )))
        };
    }
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let mut looked = Vec::new();
    let mut dir = std::env::current_dir().ok();
    while let Some(d) = dir {
        let p = d.join("target/release").join(name);
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p.display().to_string());
        dir = d.parent().map(Path::to_path_buf);
    }
    let package = if name == "respway-xds" {
        "respway-xds"
    } else {
        "respway"
    };
    Err(Error::Config(format!(
        "{name} binary not found (looked at {}): build it with `cargo build --release -p {package}`, \
         or set `{field}:` in the topology or {env}",
        looked
            .first()
            .map_or(format!("target/release/{name}"), String::clone)
    )))
}

/// The respway YAML for a respway target over `shards` (see `xds/SCHEMA.md`).
pub fn respway_config(port: u16, r: &RespwaySpec, shards: &[Vec<SocketAddr>]) -> String {
    let mut y = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:{port}\n    routes: {{ catch_all: main }}\n\
         clusters:\n  - name: main\n    hash: {{ policy: ketama, key_hash: fnv1a_64 }}\n    hashtag: \"{{}}\"\n"
    );
    if let Some(p) = &r.read_policy {
        y.push_str(&format!("    read_policy: {p}\n"));
    }
    if let Some(c) = r.connections_per_endpoint {
        y.push_str(&format!("    connections_per_endpoint: {c}\n"));
    }
    if !r.hot_keys.is_empty() {
        y.push_str("    hot_keys:\n");
        for h in &r.hot_keys {
            y.push_str(&format!("      - {{ prefix: {h:?} }}\n"));
        }
    }
    y.push_str("    shards:\n");
    let n = r.shards.unwrap_or(shards.len()).min(shards.len());
    for (i, s) in shards[..n].iter().enumerate() {
        y.push_str(&format!("      - name: s{i}\n        endpoints:\n"));
        for (j, e) in s.iter().enumerate() {
            let role = if j == 0 { "primary" } else { "replica" };
            y.push_str(&format!(
                "          - {{ address: \"{e}\", role: {role} }}\n"
            ));
        }
    }
    y
}

/// Runs `respway --config CONF --check`: a configuration respway refuses is reported with
/// its own words before anything starts.
fn check_respway_config(bin: &Path, conf: &Path, name: &str) -> Result<(), Error> {
    let check = Command::new(bin)
        .arg("--config")
        .arg(conf)
        .arg("--check")
        .output()
        .map_err(|e| Error::Process(format!("{name}: could not run {}: {e}", bin.display())))?;
    if check.status.success() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{name}: respway rejects its configuration:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        )))
    }
}

/// Checks, with `respway --check`, the configuration `r` that a push would serve to `x`.
pub fn check_respway(
    spec: &TopologySpec,
    run: &Running,
    name: &str,
    x: &XdsControl,
    r: &RespwaySpec,
) -> Result<(), Error> {
    let conf = run.dir.join(format!("{name}.yaml"));
    std::fs::write(&conf, respway_config(x.port, r, &x.all_shards))?;
    check_respway_config(&respway_bin(spec)?, &conf, name)
}

/// Writes respway's configuration for `r` over the topology's shards, listening on `port`,
/// as `NAME.yaml` in the scratch directory and checks it with `respway --check`: the file and
/// its text.
fn write_checked_config(
    run: &Running,
    bin: &Path,
    r: &RespwaySpec,
    name: &str,
    port: u16,
) -> Result<(PathBuf, String), Error> {
    let text = respway_config(port, r, &run.shards);
    let conf = run.dir.join(format!("{name}.yaml"));
    std::fs::write(&conf, &text)?;
    check_respway_config(bin, &conf, name)?;
    Ok((conf, text))
}

fn describe_respway(r: &RespwaySpec) -> String {
    let mut d = format!("--workers {} (ketama, fnv1a_64, hashtag {{}}", r.workers);
    if let Some(n) = r.shards {
        d.push_str(&format!(", first {n} shards"));
    }
    if !r.hot_keys.is_empty() {
        d.push_str(&format!(", hot_keys {:?}", r.hot_keys));
    }
    d.push(')');
    d
}

fn start_respway(
    run: &mut Running,
    spec: &TopologySpec,
    r: &RespwaySpec,
    name: &str,
    shard_pids: &[u32],
) -> Result<Target, Error> {
    let bin = respway_bin(spec)?;
    let port = free_port()?;
    let (conf, _) = write_checked_config(run, &bin, r, name, port)?;
    let addr = spawn_respway(run, &bin, name, "--config", &conf, r.workers, port)?;
    let used = r.shards.unwrap_or(run.shards.len()).min(run.shards.len());
    Ok(Target {
        name: name.into(),
        kind: "respway".into(),
        addr,
        proxy_pid: run.procs.last().map(Proc::pid),
        server_pids: shard_pids.to_vec(),
        shards: run.shards[..used].to_vec(),
        command: format!("respway --config {name}.yaml {}", describe_respway(r)),
        xds: None,
    })
}

/// Starts `respway FLAG FILE --workers N` (`--config` or `--bootstrap`) and waits until it
/// answers PING on `port`.
fn spawn_respway(
    run: &mut Running,
    bin: &Path,
    name: &str,
    flag: &str,
    file: &Path,
    workers: usize,
    port: u16,
) -> Result<SocketAddr, Error> {
    let mut cmd = Command::new(bin);
    cmd.arg(flag)
        .arg(file)
        .args(["--workers", &workers.to_string()])
        .env("RUST_LOG", "warn");
    spawn(run, name, &mut cmd)?;
    let addr = loopback(port);
    wait_ready(run, addr)?;
    Ok(addr)
}

/// The resource file a `respway-xds` target's management server serves.
pub const XDS_FILE: &str = "respway.yaml";

/// Starts a management server (`respway-xds serve`) over a resources directory holding the
/// target's configuration, then respway with a bootstrap naming that server and no static
/// resources, so everything it serves comes over ADS.
fn start_respway_xds(
    run: &mut Running,
    spec: &TopologySpec,
    r: &RespwaySpec,
    name: &str,
    shard_pids: &[u32],
) -> Result<Target, Error> {
    let bin = respway_bin(spec)?;
    let xds_bin = respway_xds_bin(spec)?;
    let port = free_port()?;
    let (_, text) = write_checked_config(run, &bin, r, name, port)?;
    let resources = run.dir.join(format!("{name}-resources"));
    std::fs::create_dir_all(&resources)?;
    std::fs::write(resources.join(XDS_FILE), &text)?;
    let (grpc, admin) = (loopback(free_port()?), loopback(free_port()?));
    let mgmt = format!("{name}-management");
    // `POST /apply` needs credentials: a token made for this run.
    let token: String = format!("{:032x}", rand::random::<u128>());
    let token_file = run.dir.join(format!("{name}-admin-token"));
    std::fs::write(&token_file, &token)?;
    let auth = AdminToken::new(token);
    let mut cmd = Command::new(&xds_bin);
    cmd.arg("serve")
        .arg("--resources")
        .arg(&resources)
        .args(["--listen", &grpc.to_string(), "--admin", &admin.to_string()])
        .arg("--admin-token-file")
        .arg(&token_file)
        .args(["--poll-ms", "100"])
        .env("RUST_LOG", "warn");
    spawn(run, &mgmt, &mut cmd)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = xds_status(admin, &auth) {
            if s.version > 0 && s.errors.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Process(format!(
                    "{mgmt} did not load {XDS_FILE} within 15 s: {:?}",
                    s.errors
                )));
            }
        }
        if let Some(p) = run.procs.last_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(Error::Process(format!(
                    "{mgmt} exited at start ({status}); its log ends with:\n{}",
                    p.log_tail()
                )));
            }
        }
        if Instant::now() > deadline {
            return Err(Error::Process(format!(
                "{mgmt} did not answer on {admin} within 15 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let bootstrap = run.dir.join(format!("{name}-bootstrap.yaml"));
    std::fs::write(
        &bootstrap,
        format!("node: {{ id: {name:?} }}\nxds: {{ server: \"http://{grpc}\" }}\n"),
    )?;
    let addr = spawn_respway(run, &bin, name, "--bootstrap", &bootstrap, r.workers, port)?;
    Ok(Target {
        name: name.into(),
        kind: "respway-xds".into(),
        addr,
        proxy_pid: run.procs.last().map(Proc::pid),
        server_pids: shard_pids.to_vec(),
        shards: run.shards.clone(),
        command: format!(
            "respway --bootstrap {name}-bootstrap.yaml {} fed by respway-xds serve \
             --resources {name}-resources",
            describe_respway(r)
        ),
        xds: Some(XdsControl {
            admin,
            auth,
            node: name.into(),
            port,
            base: r.clone(),
            all_shards: run.shards.clone(),
        }),
    })
}

/// The management server's `GET /status`.
pub fn xds_status(admin: SocketAddr, auth: &AdminToken) -> Result<xds_admin::Status, Error> {
    xds_admin::status(admin, auth)
}

/// What became of one configuration push.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushOutcome {
    /// The management server's version after the push (unchanged when the configuration
    /// was already in place).
    pub version: u64,
    /// Whether the configuration differed from what was served.
    pub changed: bool,
    /// From sending the file to the sidecar's ACK of every type the server sent it.
    pub ack_ms: f64,
}

/// Serves `r` to a `respway-xds` target (`POST /apply`) and waits (at most `timeout`) until
/// its sidecar has ACKed the new version of every type it was sent. A NACK is an error that
/// carries the sidecar's message.
pub fn xds_push(x: &XdsControl, r: &RespwaySpec, timeout: Duration) -> Result<PushOutcome, Error> {
    let text = respway_config(x.port, r, &x.all_shards);
    let t0 = Instant::now();
    let status = || xds_admin::status(x.admin, &x.auth);
    let before_status = status()?;
    let before = before_status.version;
    // `version_info` is a content hash: the push shows as a type sent something new.
    let sent_before: std::collections::BTreeMap<String, Option<String>> = before_status
        .nodes
        .iter()
        .find(|n| n.id == x.node)
        .map(|n| {
            n.types
                .iter()
                .map(|(url, t)| (url.clone(), t.sent.clone()))
                .collect()
        })
        .unwrap_or_default();
    let version = xds_admin::apply(x.admin, &x.auth, XDS_FILE, &text)
        .map_err(|e| Error::Run(format!("{}: push refused: {e}", x.node)))?;
    if version == before {
        return Ok(PushOutcome {
            version,
            changed: false,
            ack_ms: 0.0,
        });
    }
    let want = version.to_string();
    loop {
        let s = status()?;
        if let Some(n) = s.nodes.iter().find(|n| n.id == x.node) {
            if let Some(nack) = n.types.values().find_map(|t| t.nack.as_ref()) {
                return Err(Error::Run(format!(
                    "{}: NACK of version {want}: {}",
                    x.node, nack.message
                )));
            }
            let sent_new = n
                .types
                .iter()
                .any(|(url, t)| t.sent.is_some() && sent_before.get(url) != Some(&t.sent));
            if n.connected && sent_new && n.types.values().all(|t| t.acked == t.sent) {
                return Ok(PushOutcome {
                    version,
                    changed: true,
                    ack_ms: t0.elapsed().as_secs_f64() * 1e3,
                });
            }
        }
        if t0.elapsed() > timeout {
            return Err(Error::Run(format!(
                "{}: version {want} not ACKed within {timeout:?}",
                x.node
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends one command on a fresh connection and reads its reply (2 s timeout).
pub fn command(addr: SocketAddr, args: &[&[u8]]) -> Result<Frame, Error> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut out = bytes::BytesMut::new();
    respway_filters::resp::encode_command(args, &mut out);
    s.write_all(&out)?;
    let limits = reply_limits();
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(n) = reply_len(&buf, &limits).map_err(|e| Error::Run(e.to_string()))? {
            return parse_reply(&Bytes::copy_from_slice(&buf[..n]))
                .map_err(|e| Error::Run(e.to_string()));
        }
        let k = s.read(&mut chunk)?;
        if k == 0 {
            return Err(Error::Run(format!("{addr} closed the connection")));
        }
        buf.extend_from_slice(&chunk[..k]);
    }
}

/// Commands a redis-server has executed (the sum of `calls=` over `INFO commandstats`,
/// leaving out `INFO` itself, which the probe sends).
pub fn commands_executed(addr: SocketAddr) -> Result<u64, Error> {
    match command(addr, &[b"INFO", b"commandstats"])? {
        Frame::Bulk(b) => Ok(sum_calls(&String::from_utf8_lossy(&b))),
        other => Err(Error::Run(format!(
            "INFO commandstats on {addr}: unexpected reply {other:?}"
        ))),
    }
}

/// Sums `calls=` of every `cmdstat_*` line but `cmdstat_info`.
pub fn sum_calls(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            let calls = l.split_once("calls=")?.1;
            calls.split(',').next()?.trim().parse::<u64>().ok()
        })
        .sum()
}

fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .filter(|&t| t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU time (user + system, all threads) a process has used, seconds, from `/proc/PID/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / clk_tck())
}

/// CPU time the whole machine was busy (user + nice + system + irq + softirq of
/// `/proc/stat`), seconds over all cores. Interrupts are included because a process's own
/// system time (`/proc/PID/stat`) includes the soft interrupts served in its context, which
/// on loopback is most of the TCP work.
pub fn machine_task_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(7)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq
    let busy = f[0] + f[1] + f[2] + f[5] + f[6];
    Some(busy as f64 / clk_tck())
}

/// The machine's 1-minute load average (`/proc/loadavg`).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_never_repeat() {
        // A released port in the kernel's ephemeral range can be taken by any outgoing
        // connection before the child binds it.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let port = free_port().unwrap();
            assert!(port < 32_768, "{port} is in the ephemeral range");
            assert!(seen.insert(port), "{port} handed out twice");
        }
    }

    #[test]
    fn sums_commandstats() {
        let info = "# Commandstats\r\ncmdstat_get:calls=10,usec=5,usec_per_call=0.5\r\n\
                    cmdstat_info:calls=99,usec=1\r\ncmdstat_set:calls=5,usec=1\r\n";
        assert_eq!(sum_calls(info), 15);
    }

    #[test]
    fn own_cpu_time_is_readable() {
        assert!(cpu_seconds(std::process::id()).is_some());
        assert!(machine_task_seconds().is_some_and(|s| s > 0.0));
        assert!(load_average().is_some());
    }

    #[test]
    fn targets_shard_counts_are_checked() {
        let spec = TopologySpec {
            shards: 2,
            targets: vec![
                TargetSpec::RespwayXds(RespwaySpec {
                    shards: Some(3),
                    ..RespwaySpec::default()
                }),
                TargetSpec::Respway(RespwaySpec {
                    shards: Some(0),
                    workers: 0,
                    ..RespwaySpec::default()
                }),
            ],
            ..TopologySpec::default()
        };
        let e = start(&spec).unwrap_err().to_string();
        assert_eq!(
            e,
            "targets: \"respway-xds\": shards: 3 is not between 1 and the topology's 2 shards\n\
             targets: \"respway-w0\": workers must be at least 1\n\
             targets: \"respway-w0\": shards: 0 is not between 1 and the topology's 2 shards"
        );
    }

    #[test]
    fn respway_config_uses_the_first_shards() {
        let a: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        let r = RespwaySpec {
            shards: Some(1),
            ..RespwaySpec::default()
        };
        let y = respway_config(6390, &r, &[vec![a], vec![b]]);
        assert!(
            y.contains("127.0.0.1:7001") && !y.contains("127.0.0.1:7002"),
            "{y}"
        );
        let y = respway_config(6390, &RespwaySpec::default(), &[vec![a], vec![b]]);
        assert!(
            y.contains("127.0.0.1:7001") && y.contains("127.0.0.1:7002"),
            "{y}"
        );
    }

    #[test]
    fn respway_config_names_hot_keys_and_replicas() {
        let a: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        let y = respway_config(
            6390,
            &RespwaySpec {
                hot_keys: vec!["HIGH_FREQ_".into()],
                read_policy: Some("prefer_replica".into()),
                ..RespwaySpec::default()
            },
            &[vec![a, b]],
        );
        assert!(
            y.contains("hot_keys:\n      - { prefix: \"HIGH_FREQ_\" }"),
            "{y}"
        );
        assert!(
            y.contains("{ address: \"127.0.0.1:7002\", role: replica }"),
            "{y}"
        );
        assert!(y.contains("read_policy: prefer_replica"), "{y}");
    }
}

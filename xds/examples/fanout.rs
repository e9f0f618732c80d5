//! Push fan-out benchmark: one `respway-xds` server, N simulated ADS clients.
//!
//! ```text
//! cargo run --release -p respway-xds --example fanout -- --clients 1000 --rounds 3
//! ```
//!
//! The server runs in a child process (this binary, re-executed with `--serve-child DIR`), so
//! its memory and CPU are measured alone (VmRSS / VmHWM from `/proc/PID/status`, user + system
//! time from `/proc/PID/stat`). The parent opens N ADS streams, one HTTP/2 connection each,
//! built directly on envoy-types' client like any xDS consumer: CDS and LDS wildcard, EDS by
//! name, ACKing every response. Each round changes the resources through the admin endpoint
//! (`POST /apply`: validate, write, load; the push follows) and prints:
//! - the apply's time: from just before the POST until its reply is read, by a thread of its
//!   own (an operator's client is not in a process with N busy ADS clients);
//! - per client, from just before the POST until the client holds the new version of all three
//!   types: p50/p99/max over the clients;
//! - the server's CPU time over the round (from just before the POST to 300 ms after the last
//!   client holds the new version, so its ACKs are in), and this process's (the clients'), which
//!   shares the cores with it.
//!
//! The server's RSS per stream is (RSS with the N streams idle − RSS before the first stream)
//! / N, once after the initial sync and once after the rounds.
#![allow(
    clippy::print_stdout,
    reason = "a benchmark: its report goes to stdout"
)]

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use prost::Message;
use respway_xds::pb::envoy::config::cluster::v3::Cluster;
use respway_xds::pb::envoy::config::core::v3::Node;
use respway_xds::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use respway_xds::pb::envoy::service::discovery::v3::DiscoveryRequest;
use respway_xds::server::Server;
use respway_xds::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_stream::wrappers::ReceiverStream;

#[derive(Debug, Parser)]
struct Args {
    /// Simulated ADS clients.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Snapshot changes to time.
    #[arg(long, default_value_t = 5)]
    rounds: u64,
    /// Clusters in the served configuration (two shards each, a primary and a replica per shard).
    #[arg(long, default_value_t = 8)]
    clusters: usize,
    /// Serve the files from etcd (`etcd://HOST:PORT/PREFIX`, an empty prefix of a running etcd),
    /// as a replica of a shared store that also publishes its nodes there.
    #[arg(long)]
    store: Option<String>,
    /// Internal: run the server on this resource directory.
    #[arg(long, hide = true)]
    serve_child: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match args.serve_child.clone() {
        Some(dir) => runtime.block_on(serve_child(dir, args.store)),
        None => runtime.block_on(bench(args)),
    }
}

/// The admin token of the child's server (both ends are this program).
const ADMIN_TOKEN: &str = "fanout-example";

/// The child: serves `dir`, prints `READY <grpc> <admin>`, exits when stdin closes.
async fn serve_child(dir: PathBuf, store: Option<String>) {
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let line = format!(
        "READY {} {}\n",
        grpc.local_addr().expect("addr"),
        admin.local_addr().expect("addr")
    );
    let store = match store {
        None => None,
        Some(url) => {
            let url = respway_xds::store::EtcdUrl::parse(&url).expect("--store");
            Some(respway_xds::store::EtcdStore::open(url, &dir).await)
        }
    };
    let server = Server::new(dir).with_security(respway_xds::secure::Security {
        admin_token: Some(ADMIN_TOKEN.to_string()),
        ..Default::default()
    });
    if let Some(store) = store {
        server.cache().set_store(store.clone());
        tokio::spawn(store.clone().follow(server.cache().clone()));
        let fleet = respway_xds::store::fleet::FleetView::new(store, "fanout").expect("name");
        server.set_fleet(fleet.clone());
        tokio::spawn(fleet.run(server.clone()));
    }
    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
    });
    std::io::stdout()
        .write_all(line.as_bytes())
        .and_then(|()| std::io::stdout().flush())
        .expect("stdout");
    server
        .serve(grpc, Some(admin), async {
            let _ = stdin_closed.await;
        })
        .await
        .expect("serve");
}

fn config(clusters: usize, round: u64) -> String {
    let mut s = String::from("listeners:\n");
    s.push_str(&format!(
        "  - name: main\n    address: 127.0.0.1:16380\n    op_timeout: {}ms\n    routes:\n      catch_all: c0\n      prefixes:\n",
        250 + round
    ));
    for c in 0..clusters {
        s.push_str(&format!(
            "        - {{ prefix: \"p{c}:\", cluster: c{c} }}\n"
        ));
    }
    s.push_str("clusters:\n");
    for c in 0..clusters {
        // Cluster 0 changes every round: its connect timeout (CDS) and an address (EDS).
        let timeout = if c == 0 { 500 + round } else { 500 };
        let port = if c == 0 {
            20000 + round
        } else {
            7000 + c as u64 * 10
        };
        s.push_str(&format!(
            "  - name: c{c}\n    connect_timeout: {timeout}ms\n    read_policy: prefer_replica\n    shards:\n      - endpoints:\n          - {{ address: 127.0.0.1:{port}, role: primary, zone: z1 }}\n          - {{ address: 127.0.0.2:{port}, role: replica, zone: z2 }}\n      - endpoints:\n          - {{ address: 127.0.0.3:{port}, role: primary, zone: z2 }}\n          - {{ address: 127.0.0.4:{port}, role: replica, zone: z1 }}\n"
        ));
    }
    s
}

/// The user + system CPU time of process `pid` so far (every thread, living or ended), from
/// `/proc/PID/stat` in clock ticks of 10 ms (`USER_HZ` is 100 on Linux).
fn cpu_time(pid: u32) -> Duration {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces), from field 3 (state) on.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let field = |i: usize| -> u64 {
        rest.split_whitespace()
            .nth(i - 3)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((field(14) + field(15)) * 10)
}

/// `VmRSS` and `VmHWM` of `pid` (or self), in KiB.
fn memory(pid: Option<u32>) -> (u64, u64) {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// One simulated client: the SotW handshake, then ACK everything; reports `(client, version,
/// when)` each time it holds one version of all three types. `version_info` is a content hash,
/// so a type's version here counts the distinct versions it received (1 at the initial sync);
/// every round changes all three types, so after round `r` each type's count is the server's
/// generation `r + 1`.
async fn client(
    id: usize,
    grpc: SocketAddr,
    report: mpsc::UnboundedSender<(usize, u64, Instant)>,
    connecting: Arc<Semaphore>,
) {
    let permit = connecting.acquire().await.expect("semaphore");
    let mut ads = AggregatedDiscoveryServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect")
        .max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel(16);
    let node = Node {
        id: format!("sim-{id}"),
        ..Default::default()
    };
    let req = |type_url: &str, version: &str, nonce: &str, names: Vec<String>| DiscoveryRequest {
        version_info: version.to_string(),
        node: Some(node.clone()),
        resource_names: names,
        type_url: type_url.to_string(),
        response_nonce: nonce.to_string(),
        ..Default::default()
    };
    tx.send(req(CLUSTER_TYPE_URL, "", "", vec![]))
        .await
        .expect("send");
    tx.send(req(LISTENER_TYPE_URL, "", "", vec![]))
        .await
        .expect("send");
    let mut inbound = ads
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    drop(permit);
    let mut eds_names: Vec<String> = Vec::new();
    let mut versions = [0u64; 3];
    let mut last: [String; 3] = Default::default();
    let mut reported = 0;
    while let Ok(Some(resp)) = inbound.message().await {
        let at = Instant::now();
        let i = match resp.type_url.as_str() {
            CLUSTER_TYPE_URL => 0,
            ENDPOINT_TYPE_URL => 1,
            _ => 2,
        };
        if resp.version_info != last[i] {
            last[i] = resp.version_info.clone();
            versions[i] += 1;
        }
        let mut names = Vec::new();
        if i == 0 {
            let wanted: Vec<String> = resp
                .resources
                .iter()
                .filter_map(|a| Cluster::decode(a.value.as_slice()).ok())
                .map(|c| c.name)
                .collect();
            if wanted != eds_names {
                eds_names = wanted;
                let _ = tx
                    .send(req(ENDPOINT_TYPE_URL, "", "", eds_names.clone()))
                    .await;
            }
        } else if i == 1 {
            names = eds_names.clone();
        }
        let _ = tx
            .send(req(&resp.type_url, &resp.version_info, &resp.nonce, names))
            .await;
        let held = *versions.iter().min().unwrap_or(&0);
        if held > reported && versions.iter().all(|x| *x == versions[0]) {
            reported = held;
            let _ = report.send((id, held, at));
        }
    }
}

/// A thread with a runtime of its own that applies each text it is sent and answers with
/// `(version, when the POST started, how long until its reply was read)`.
fn applier(admin: String) -> std::sync::mpsc::Sender<(String, oneshot::Sender<Applied>)> {
    let (tx, rx) = std::sync::mpsc::channel::<(String, oneshot::Sender<Applied>)>();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        for (text, reply) in rx {
            let t0 = Instant::now();
            let version = runtime
                .block_on(respway_xds::admin::apply(
                    &admin,
                    &respway_xds::admin::AdminAuth::token(ADMIN_TOKEN),
                    "base.yaml",
                    &text,
                ))
                .expect("apply");
            let _ = reply.send((version, t0, t0.elapsed()));
        }
    });
    tx
}

/// What [`applier`] answers: the version, when the POST started, and the apply's time.
type Applied = (u64, Instant, Duration);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Min, median and max.
fn spread(mut d: Vec<Duration>) -> String {
    d.sort();
    format!(
        "{:.1} / {:.1} / {:.1} ms",
        ms(d[0]),
        ms(d[d.len() / 2]),
        ms(d[d.len() - 1])
    )
}

fn percentiles(mut d: Vec<Duration>) -> String {
    d.sort();
    let at = |p: f64| d[((d.len() as f64 * p).ceil() as usize).clamp(1, d.len()) - 1];
    format!(
        "p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms",
        at(0.50).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        d[d.len() - 1].as_secs_f64() * 1e3
    )
}

async fn collect(
    rx: &mut mpsc::UnboundedReceiver<(usize, u64, Instant)>,
    n: usize,
    version: u64,
    since: Instant,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while out.len() < n {
        let (_, v, at) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("every client in time")
            .expect("clients alive");
        if v == version {
            out.push(at.saturating_duration_since(since));
        }
    }
    out
}

async fn bench(args: Args) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("base.yaml"), config(args.clusters, 0)).expect("write");
    let mut child = Command::new(std::env::current_exe().expect("exe"));
    if let Some(url) = &args.store {
        // The first file goes to etcd: the replica's directory is a copy of it.
        let parsed = respway_xds::store::EtcdUrl::parse(url).expect("--store");
        let mut etcd = etcd_client::Client::connect(&parsed.endpoints, None)
            .await
            .expect("etcd");
        let key = format!("{}/files/base.yaml", parsed.prefix);
        etcd.put(key, config(args.clusters, 0), None)
            .await
            .expect("etcd put");
        child.args(["--store", url]);
    }
    let mut child = child
        .arg("--serve-child")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("READY line");
    let mut parts = line.split_whitespace().skip(1);
    let grpc: SocketAddr = parts.next().expect("grpc").parse().expect("addr");
    let admin = parts.next().expect("admin").to_string();
    let pid = child.id();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (rss0, _) = memory(Some(pid));
    let (self0, _) = memory(None);
    println!(
        "respway-xds fan-out: {} clients, {} clusters, {} rounds, {} cores",
        args.clients,
        args.clusters,
        args.rounds,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("server RSS idle: {}", mib(rss0));

    let (report, mut reports) = mpsc::unbounded_channel();
    // At most 64 connection handshakes at once (a sidecar fleet does not start in one instant).
    let connecting = Arc::new(Semaphore::new(64));
    let start = Instant::now();
    for id in 0..args.clients {
        tokio::spawn(client(id, grpc, report.clone(), connecting.clone()));
    }
    let initial = collect(&mut reports, args.clients, 1, start).await;
    println!(
        "initial sync of all clients: {:.2} s ({})",
        start.elapsed().as_secs_f64(),
        percentiles(initial)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss1, _) = memory(Some(pid));
    let per_stream = |rss: u64| rss.saturating_sub(rss0) as f64 / args.clients as f64;
    println!(
        "server RSS with {} idle streams: {} (+{}, {:.1} KiB per stream)",
        args.clients,
        mib(rss1),
        mib(rss1.saturating_sub(rss0)),
        per_stream(rss1)
    );

    let applier = applier(admin);
    let mut all = Vec::new();
    let mut applies = Vec::new();
    let mut cpus = Vec::new();
    for round in 1..=args.rounds {
        let text = config(args.clusters, round);
        let cpu0 = cpu_time(pid);
        let bench0 = cpu_time(std::process::id());
        let (reply, applied) = oneshot::channel();
        applier.send((text, reply)).expect("applier");
        let (version, t0, apply) = applied.await.expect("applied");
        // Each client counts the versions it got of every type (round r: r + 1), which is the
        // server's generation only without a shared store (there it is the store's revision).
        let lat = collect(&mut reports, args.clients, round + 1, t0).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cpu = cpu_time(pid).saturating_sub(cpu0);
        let bench = cpu_time(std::process::id()).saturating_sub(bench0);
        println!(
            "round {round}: version {version}: apply (validate+write+load) {:.1} ms; all {} clients hold it: {}; server CPU {:.0} ms (clients {:.0} ms)",
            ms(apply),
            args.clients,
            percentiles(lat.clone()),
            ms(cpu),
            ms(bench)
        );
        all.extend(lat);
        applies.push(apply);
        cpus.push(cpu);
    }
    let (rss2, hwm2) = memory(Some(pid));
    let (self2, _) = memory(None);
    println!("all rounds: {}", percentiles(all));
    println!(
        "apply min / median / max: {}; server CPU per round: {}",
        spread(applies),
        spread(cpus)
    );
    println!(
        "server RSS after the rounds: {} ({:.1} KiB per stream), peak (VmHWM) {}",
        mib(rss2),
        per_stream(rss2),
        mib(hwm2)
    );
    println!(
        "bench process (the simulated clients) RSS: {} -> {}",
        mib(self0),
        mib(self2)
    );
    drop(child.stdin.take());
    let _ = child.wait();
}

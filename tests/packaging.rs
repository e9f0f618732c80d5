//! The packaging and deployment files checked against respway itself: the Grafana dashboard's
//! queries name metrics a running respway exposes (and a real Prometheus evaluates every one
//! of them over a scrape of it); the Kubernetes manifests' embedded configs load, each
//! sidecar's arguments pass `respway --check`, its probes point at its admin port; the
//! Prometheus config parses (and passes `promtool check config`); the Dockerfile's shape and
//! CMD flags match the binary. Nothing here builds the image or talks to a cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;
use serde_yaml_ng::Value;

/// A file of the repository.
fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fresh scratch directory for this test process.
pub(crate) fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("respway-packaging-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

// ---------------------------------------------------------------------------------------------
// The Grafana dashboard

pub(crate) fn dashboard() -> serde_json::Value {
    serde_json::from_str(&repo_file("examples/observability/grafana-dashboard.json"))
        .expect("grafana-dashboard.json is JSON")
}

/// Every panel, rows' nested panels included.
fn panels(v: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
    for p in v["panels"].as_array().into_iter().flatten() {
        out.push(p.clone());
        panels(p, out);
    }
}

/// Every `expr` of every panel target.
pub(crate) fn dashboard_exprs() -> Vec<String> {
    let mut all = Vec::new();
    panels(&dashboard(), &mut all);
    all.iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect()
}

/// The metric names (`respway_[a-z_]+` and `process_[a-z_]+`, whole identifiers) in a PromQL
/// expression, each with what follows it.
fn metric_uses(expr: &str) -> Vec<(String, &str)> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    for prefix in ["respway_", "process_"] {
        let mut i = 0;
        while let Some(off) = expr[i..].find(prefix) {
            let start = i + off;
            let mut end = start + prefix.len();
            while end < b.len() && (b[end].is_ascii_lowercase() || b[end] == b'_') {
                end += 1;
            }
            let whole = (start == 0 || !ident(b[start - 1])) && (end == b.len() || !ident(b[end]));
            if whole && end > start + prefix.len() {
                out.push((expr[start..end].to_string(), &expr[end..]));
            }
            i = end;
        }
    }
    out
}

/// The metric names of [`metric_uses`].
pub(crate) fn metric_names(expr: &str) -> BTreeSet<String> {
    metric_uses(expr).into_iter().map(|(n, _)| n).collect()
}

#[test]
fn metric_names_are_whole_identifiers() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(respway_command_duration_seconds_bucket[1m]))) / x_respway_no + respway_workers and process_open_fds",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "process_open_fds",
            "respway_command_duration_seconds_bucket",
            "respway_workers"
        ]
    );
}

/// The dashboard's template variable: the instance (under Kubernetes, the pod: see
/// prometheus.yml), `.*` for all.
const INSTANCE: &str = "instance=~\"$instance\"";

/// `expr` with the dashboard's template variables replaced by `value`.
fn with_instance(expr: &str, value: &str) -> String {
    expr.replace("$instance", value)
}

/// The dashboard's variable for `respway-xds reshard --metrics` endpoints, which the reshard
/// panels filter by instead of [`INSTANCE`] (a reshard run is not a sidecar).
pub(crate) const RESHARD: &str = "instance=~\"$reshard\"";

/// Whether a dashboard metric comes from `respway-xds reshard --metrics`, not from a
/// sidecar: tests/reshard_metrics.rs checks those against a real reshard run's `/metrics`,
/// and has a real Prometheus that scraped the run evaluate their queries.
pub(crate) fn from_reshard(metric: &str) -> bool {
    metric.starts_with("respway_reshard_")
}

/// Whether a dashboard query reads a metric of a reshard run ([`from_reshard`]).
pub(crate) fn reads_reshard(expr: &str) -> bool {
    metric_names(expr).iter().any(|m| from_reshard(m))
}

/// The dashboard's shape: one `${DS_PROMETHEUS}` input used by every panel and target, unique
/// panel ids, and the panels the deployment docs promise.
#[test]
fn dashboard_is_an_importable_grafana_dashboard() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64().unwrap_or(0) >= 36,
        "schemaVersion"
    );
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let inputs = d["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs
            .iter()
            .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"),
        "a DS_PROMETHEUS datasource input: {inputs:?}"
    );
    let mut all = Vec::new();
    panels(&d, &mut all);
    let mut ids = BTreeSet::new();
    for p in &all {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate id: {title}"
        );
        assert!(p["gridPos"]["w"].as_u64().is_some(), "gridPos: {title}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
            assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()), "{title}");
        }
    }
    let exprs = dashboard_exprs();
    // Every metric a query reads is filtered by the instance variable (a reshard run's by
    // the reshard variable).
    for e in &exprs {
        for (name, after) in metric_uses(e) {
            let selector = after
                .strip_prefix('{')
                .and_then(|a| a.split('}').next())
                .unwrap_or_else(|| panic!("{name} without a selector in {e}"));
            let var = if from_reshard(&name) {
                RESHARD
            } else {
                INSTANCE
            };
            assert!(
                selector.split(',').any(|m| m == var),
                "{name} not filtered by {var} in {e}"
            );
        }
    }
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let instance = vars
        .iter()
        .find(|v| v["name"] == "instance")
        .expect("an instance template variable");
    assert_eq!(instance["type"], "query");
    assert_eq!(instance["datasource"]["uid"], "${DS_PROMETHEUS}");
    assert_eq!(
        instance["definition"],
        "label_values(respway_build_info, instance)"
    );
    assert_eq!(instance["query"]["query"], instance["definition"]);
    assert_eq!(
        (
            &instance["includeAll"],
            &instance["multi"],
            &instance["allValue"]
        ),
        (&true.into(), &true.into(), &".*".into())
    );
    let reshard = vars
        .iter()
        .find(|v| v["name"] == "reshard")
        .expect("a reshard template variable");
    assert_eq!(
        reshard["definition"],
        "label_values(respway_reshard_phase, instance)"
    );
    assert_eq!(reshard["query"]["query"], reshard["definition"]);
    assert_eq!(
        (&reshard["includeAll"], &reshard["allValue"]),
        (&true.into(), &".*".into())
    );
    let f = INSTANCE;
    let nb = format!("{f},family!=\"blocking\"");
    let mut wanted = vec![
        format!("sum by (listener) (rate(respway_commands_total{{{f}}}[1m]))"),
        format!("sum by (command) (rate(respway_commands_total{{{f}}}[1m]))"),
        format!("sum by (command) (rate(respway_command_errors_total{{{f}}}[1m]))"),
        format!("sum by (kind) (rate(respway_upstream_errors_total{{{f}}}[1m]))"),
        format!("sum by (listener) (respway_downstream_connections_active{{{f}}})"),
        format!("max(respway_config_version{{{f}}})"),
        // Which shard is hot: requests, errors, latency, queues, connections, health.
        format!("sum by (cluster, shard, endpoint) (rate(respway_upstream_requests_total{{{f}}}[1m]))"),
        format!("sum by (cluster, shard, endpoint, kind) (rate(respway_upstream_errors_total{{{f}}}[1m]))"),
        format!("sum by (cluster, shard, endpoint) (respway_upstream_inflight_requests{{{f}}})"),
        format!("sum by (cluster, shard, endpoint) (respway_upstream_queued_requests{{{f}}})"),
        format!("sum by (cluster, shard, endpoint) (respway_upstream_connections{{{f}}})"),
        format!("min by (cluster, shard, endpoint) (respway_upstream_healthy{{{f}}})"),
        format!("sum by (cluster, shard, endpoint) (rate(respway_upstream_connects_total{{{f}}}[1m]))"),
        format!("sum by (cluster, shard, endpoint) (rate(respway_upstream_connect_failures_total{{{f}}}[1m]))"),
        format!("topk by (cluster) (5, sum by (cluster, key) (respway_hot_key_requests{{{f}}}))"),
        // The error ratio leaves connection-setup commands out; they have a panel of their own.
        format!("sum by (command) (rate(respway_command_errors_total{{{f},family!=\"connection\"}}[1m])) / sum by (command) (rate(respway_commands_total{{{f},family!=\"connection\"}}[1m]))"),
        format!("sum by (command) (rate(respway_command_errors_total{{{f},family=\"connection\"}}[1m]))"),
        format!("rate(process_cpu_seconds_total{{{f}}}[1m]) and on (instance, job) respway_build_info{{{f}}}"),
        format!("process_resident_memory_bytes{{{f}}} and on (instance, job) respway_build_info{{{f}}}"),
    ];
    // The reshard's progress (respway-xds reshard --metrics): phase, sent of the plan, keys/s
    // and failed batches.
    let r = RESHARD;
    let by = "listener, route, from, to";
    wanted.extend([
        format!("max by ({by}) (respway_reshard_phase{{{r}}})"),
        format!("100 * clamp_max(sum by ({by}) (respway_reshard_keys_sent_total{{{r}}}) / clamp_min(sum by ({by}) (respway_reshard_keys_planned{{{r}}}), 1), 1)"),
        format!("sum by ({by}) (rate(respway_reshard_keys_sent_total{{{r}}}[1m]))"),
        format!("sum by ({by}) (respway_reshard_batches_failed_total{{{r}}})"),
    ]);
    for q in ["0.99", "0.999", "0.9999"] {
        wanted.push(format!(
            "histogram_quantile({q}, sum by (le) (rate(respway_command_duration_seconds_bucket{{{nb}}}[1m])))"
        ));
    }
    // Is it the proxy or Redis: end to end per listener against upstream per cluster.
    for q in ["0.5", "0.99", "0.999"] {
        wanted.push(format!(
            "histogram_quantile({q}, sum by (le, listener) (rate(respway_command_duration_seconds_bucket{{{nb}}}[1m])))"
        ));
        wanted.push(format!(
            "histogram_quantile({q}, sum by (le, cluster) (rate(respway_upstream_duration_seconds_bucket{{{f}}}[1m])))"
        ));
    }
    for wanted in wanted {
        assert!(exprs.contains(&wanted), "no panel queries {wanted}");
    }
}

/// Starts respway (hot-key detection sampling every key) with its admin endpoint over three
/// real shards and drives GETs, SETs, a failing command and a hot key, so that every series
/// the dashboard charts exists.
fn respway_with_traffic() -> (Vec<Proc>, respway::Server, respway::admin::Admin) {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let addrs: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let mut yaml = sharded_yaml(&addrs[..3], "{ policy: maglev }", true);
    // The features the dashboard has rows for: a near cache, a mirror cluster written to
    // (dual write), and a Sentinel-managed shard (its Sentinels do not answer: its series are
    // there, at 0). Redis Cluster series are the process's, always there.
    yaml = yaml.replace(
        "    connect_timeout: 500ms\n",
        "    connect_timeout: 500ms\n    near_cache: { mode: tracked }\n",
    );
    yaml = yaml.replace(
        "      catch_all: main\n",
        "      catch_all: main\n      catch_all_mirrors: [ { cluster: shadow, mode: dual_write } ]\n",
    );
    yaml.push_str(&format!(
        "  - name: shadow\n    shards:\n      - name: m0\n        endpoints: [ {{ address: \"{}\" }} ]\n  - name: watched\n    shards:\n      - name: w0\n        sentinel: {{ master: m9, sentinels: [\"127.0.0.1:{}\"] }}\n",
        addrs[3],
        free_port()
    ));

    let config =
        respway_xds::translate(&respway_xds::parse_yaml(&yaml).expect("yaml")).expect("config");
    let server = respway::start(
        config,
        respway::Options {
            workers: 1,
            hot_key_sample: 1,
            ..Default::default()
        },
    )
    .expect("respway start");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, &server).expect("admin");
    let mut c = RespConn::connect(server.local_addrs()[0]);
    for i in 0..300 {
        let k = format!("k{i}");
        assert_eq!(c.call(&["SET", &k, "v"]), Resp::Simple("OK".into()));
        assert_eq!(c.call(&["GET", &k]), Resp::bulk("v"));
        assert_eq!(c.call(&["GET", "hot:key"]), Resp::Bulk(None));
    }
    assert!(c.call(&["INCR", "k0"]).is_error());
    // Connection-setup commands a client may send and see refused.
    assert!(c.call(&["HELLO", "4"]).is_error());
    assert!(c.call(&["AUTH", "nobody-set-a-password"]).is_error());
    (shards, server, admin)
}

/// Every metric a dashboard query names is in respway's /metrics, as a sample name (a
/// histogram's `_bucket`, `_sum` and `_count` are sample names of their own); but those of
/// a reshard run ([`from_reshard`]), which tests/reshard_metrics.rs finds in a real run's.
#[test]
fn every_dashboard_metric_is_exposed() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let names: BTreeSet<String> = dashboard_exprs()
        .iter()
        .flat_map(|e| metric_names(e))
        .filter(|n| !from_reshard(n))
        .collect();
    assert!(names.len() >= 15, "metrics on the dashboard: {names:?}");
    let (_shards, server, admin) = respway_with_traffic();
    // Hot-key counts are published by a periodic tick: wait for the hot key to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (status, body) = http_get(admin.local_addr(), "/metrics");
        assert_eq!(status, 200);
        if body.contains("respway_hot_key_requests{") || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let samples: BTreeSet<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or(""))
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !samples.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "dashboard metrics missing from /metrics: {missing:?}\nexposed: {samples:?}"
    );
    server.shutdown();
}

/// `promtool check config` on examples/observability/prometheus.yml. A Prometheus built
/// without Kubernetes service discovery (Debian's package) rejects `kubernetes_sd_configs` as
/// an unknown field: then the file is checked without its Kubernetes jobs, and says so.
fn promtool_check_config() {
    let check = |path: &Path| {
        let out = Command::new("promtool")
            .args(["check", "config", "--syntax-only"])
            .arg(path)
            .output()
            .expect("promtool");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/observability/prometheus.yml");
    let (ok, text) = check(&example);
    if ok {
        return;
    }
    assert!(
        text.contains("field kubernetes_sd_configs not found"),
        "promtool check config: {text}"
    );
    let mut doc = yaml_documents("examples/observability/prometheus.yml").remove(0);
    let jobs = doc
        .get_mut("scrape_configs")
        .and_then(Value::as_sequence_mut)
        .expect("scrape_configs");
    jobs.retain(|j| j.get("kubernetes_sd_configs").is_none());
    let dir = scratch("promtool");
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    let (ok, text) = check(&path);
    assert!(
        ok,
        "promtool check config (without kubernetes_sd jobs): {text}"
    );
    eprintln!(
        "note: this promtool has no Kubernetes service discovery; prometheus.yml was checked without its kubernetes_sd jobs"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A real Prometheus scrapes respway and evaluates every dashboard query, with the instance
/// variable at "all" and at respway's instance: each parses (a bad one is a 400) and returns
/// at least one series; the variable's own query finds respway's instance; the error-ratio
/// panel leaves the refused HELLO and AUTH out (its own panel shows them). The example
/// prometheus.yml passes `promtool check config`. The queries of a reshard run's metrics,
/// and the reshard variable, are evaluated over a real reshard by tests/reshard_metrics.rs.
#[test]
fn prometheus_evaluates_every_dashboard_query() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    assert!(
        have("prometheus") && have("promtool"),
        "prometheus is not installed (apt-get install prometheus; .ci/run does)"
    );
    promtool_check_config();
    let (_shards, server, admin) = respway_with_traffic();
    let port = free_port();
    let dir = scratch("prometheus");
    let conf = dir.join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nscrape_configs:\n  - job_name: respway\n    static_configs: [ {{ targets: [\"{}\"] }} ]\n",
            admin.local_addr()
        ),
    )
    .unwrap();
    let _prom = Spawn::new("prometheus")
        .on_port(port)
        .arg(format!("--config.file={}", conf.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .start();
    let prom = loopback(port);
    let query = |q: &str| -> (u16, serde_json::Value) {
        let (status, body) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(q)));
        (status, serde_json::from_str(&body).unwrap_or_default())
    };
    // rate() needs two samples in its window: wait for three scrapes.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (_, v) = query("count_over_time(respway_workers[1m])");
        let n = v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0);
        if n >= 3.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped respway 3 times"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let instance = admin.local_addr().to_string();
    let mut failures = Vec::new();
    for e in dashboard_exprs().into_iter().filter(|e| !reads_reshard(e)) {
        for value in [".*", instance.as_str()] {
            let e = with_instance(&e, value);
            let (status, v) = query(&e);
            let n = v["data"]["result"].as_array().map_or(0, Vec::len);
            if status != 200 || v["status"] != "success" || n == 0 {
                failures.push(format!("{e}: HTTP {status}, {n} series, {v}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The variable's values: label_values(METRIC, LABEL) is `count by (LABEL) (METRIC)`.
    for var in dashboard()["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"] != "reshard")
    {
        let def = var["definition"].as_str().expect("definition");
        let (metric, label) = def
            .strip_prefix("label_values(")
            .and_then(|d| d.strip_suffix(')'))
            .and_then(|d| d.split_once(", "))
            .unwrap_or_else(|| panic!("{def}"));
        let (_, v) = query(&format!("count by ({label}) ({metric})"));
        let values: Vec<&str> = v["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["metric"][label].as_str())
            .collect();
        assert_eq!(values, [instance.as_str()], "{def}: {v}");
    }
    // Error ratio per command: no connection-setup command in it; they show on their own.
    let mut all = Vec::new();
    panels(&dashboard(), &mut all);
    let commands_of = |title: &str| -> BTreeSet<String> {
        let p = all
            .iter()
            .find(|p| p["title"].as_str().is_some_and(|t| t.starts_with(title)))
            .unwrap_or_else(|| panic!("no panel {title}"));
        let e = with_instance(p["targets"][0]["expr"].as_str().expect("expr"), ".*");
        let (_, v) = query(&e);
        v["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["metric"]["command"].as_str().map(str::to_string))
            .collect()
    };
    let ratio = commands_of("Error ratio");
    assert!(ratio.contains("incr"), "error ratio: {ratio:?}");
    assert!(
        !ratio.contains("hello") && !ratio.contains("auth"),
        "connection setup in the error ratio: {ratio:?}"
    );
    let setup = commands_of("Connection-setup refusals");
    assert!(
        setup.contains("hello") && setup.contains("auth"),
        "connection-setup refusals: {setup:?}"
    );
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// YAML: Kubernetes manifests and the Prometheus config

/// Every document of a multi-document YAML file. Documents are split on `---` lines and each
/// parsed alone; serde_yaml_ng's own document iterator must find as many.
fn yaml_documents(rel: &str) -> Vec<Value> {
    let text = repo_file(rel);
    let mut docs = Vec::new();
    let mut cur = String::new();
    let flush = |cur: &mut String, docs: &mut Vec<Value>| {
        if cur.lines().any(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#')
        }) {
            let v: Value = serde_yaml_ng::from_str(cur)
                .unwrap_or_else(|e| panic!("{rel}: document {}: {e}", docs.len() + 1));
            docs.push(v);
        }
        cur.clear();
    };
    for line in text.lines() {
        if line == "---" || line.starts_with("--- ") {
            flush(&mut cur, &mut docs);
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    flush(&mut cur, &mut docs);
    let counted = serde_yaml_ng::Deserializer::from_str(&text)
        .take(1000)
        .count();
    assert_eq!(docs.len(), counted, "{rel}: YAML documents");
    docs
}

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    get(v, path).and_then(Value::as_str)
}

fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn seq<'a>(v: &'a Value, path: &[&str]) -> Vec<&'a Value> {
    get(v, path)
        .and_then(Value::as_sequence)
        .map(|s| s.iter().collect())
        .unwrap_or_default()
}

fn strings(v: &Value, path: &[&str]) -> Vec<String> {
    seq(v, path)
        .into_iter()
        .map(|a| match a {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => panic!("{path:?}: not a string: {other:?}"),
        })
        .collect()
}

/// The value after `flag` in an argument list.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn port_of(addr: &str) -> u64 {
    addr.parse::<SocketAddr>()
        .unwrap_or_else(|e| panic!("{addr}: {e}"))
        .port()
        .into()
}

fn probe_port(probe: &Value) -> Option<u64> {
    get(probe, &["httpGet", "port"])
        .or_else(|| get(probe, &["tcpSocket", "port"]))
        .and_then(Value::as_u64)
}

/// The `--flags` of `respway --help` (or of a subcommand's help).
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_respway"))
        .args(args)
        .arg("--help")
        .output()
        .expect("respway --help");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
        .filter(|t| t.starts_with("--"))
        .map(|t| t.split('=').next().unwrap_or(t).to_string())
        .collect()
}

fn assert_flags_known(what: &str, args: &[String]) {
    let known = help_flags(&[]);
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let flag = a.split('=').next().unwrap_or(a);
        assert!(
            known.contains(flag),
            "{what}: {flag} is not a flag of respway --help ({known:?})"
        );
    }
}

/// A respway config (YAML text) parsed and translated as `respway --config` does.
fn valid_config(what: &str, yaml: &str) -> respway_filters::model::Config {
    let resources =
        respway_xds::parse_yaml(yaml).unwrap_or_else(|e| panic!("{what}: invalid config:\n{e}"));
    respway_xds::translate(&resources).unwrap_or_else(|e| panic!("{what}: invalid config:\n{e}"))
}

/// All the Kubernetes objects of examples/kubernetes, by file.
fn manifests() -> Vec<(String, Vec<Value>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kubernetes");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("examples/kubernetes")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    files
        .into_iter()
        .map(|f| {
            let rel = format!("examples/kubernetes/{f}");
            let docs = yaml_documents(&rel);
            for d in &docs {
                for k in ["apiVersion", "kind"] {
                    assert!(s(d, &[k]).is_some(), "{rel}: a document without {k}");
                }
                assert!(
                    s(d, &["metadata", "name"]).is_some(),
                    "{rel}: unnamed object"
                );
            }
            (rel, docs)
        })
        .collect()
}

/// The Dockerfile's `USER` (the uid the image runs as).
fn dockerfile_user() -> String {
    dockerfile_instructions()
        .into_iter()
        .filter(|(i, _)| i == "USER")
        .map(|(_, a)| a)
        .next_back()
        .expect("a USER line")
}

/// What a pod spec's sidecar container would find under each mount path: the ConfigMap's
/// files, written to a scratch directory. Returns (mount path, local directory).
fn materialize_mounts(
    what: &str,
    pod: &Value,
    c: &Value,
    config_maps: &BTreeMap<String, Value>,
) -> Vec<(String, PathBuf)> {
    let volumes: BTreeMap<&str, &Value> = seq(pod, &["volumes"])
        .into_iter()
        .map(|v| (s(v, &["name"]).expect("volume name"), v))
        .collect();
    let mut out = Vec::new();
    for m in seq(c, &["volumeMounts"]) {
        let name = s(m, &["name"]).expect("mount name");
        let mount = s(m, &["mountPath"]).expect("mountPath").to_string();
        let vol = volumes
            .get(name)
            .unwrap_or_else(|| panic!("{what}: volumeMount {name}: no such volume"));
        let cm = s(vol, &["configMap", "name"])
            .unwrap_or_else(|| panic!("{what}: volume {name}: not a configMap"));
        let data = config_maps
            .get(cm)
            .unwrap_or_else(|| panic!("{what}: ConfigMap {cm} is not in examples/kubernetes"));
        let dir = scratch(&format!("{}-{name}", s(c, &["name"]).unwrap_or("c")));
        for (k, v) in data.as_mapping().expect("ConfigMap data") {
            let (k, v) = (k.as_str().expect("key"), v.as_str().expect("value"));
            std::fs::write(dir.join(k), v).unwrap();
        }
        out.push((mount, dir));
    }
    out
}

/// Runs `respway ARGS --check` with the container's mounted files in place: every flag and
/// value parses and the config (or bootstrap) it names is valid.
fn respway_check(what: &str, args: &[String], mounts: &[(String, PathBuf)]) {
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            for (mount, dir) in mounts {
                if let Some(rest) = a.strip_prefix(&format!("{mount}/")) {
                    return dir.join(rest).display().to_string();
                }
            }
            a.clone()
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_respway"))
        .args(&args)
        .arg("--check")
        .output()
        .expect("respway --check");
    assert!(
        out.status.success(),
        "{what}: respway {args:?} --check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The Kubernetes manifests: every respway sidecar's probes, security context, resources,
/// grace period, arguments and mounted config, and the respway-xds server's resource files,
/// checked against respway itself.
#[test]
fn kubernetes_manifests_match_respway() {
    let files = manifests();
    let all: Vec<&Value> = files.iter().flat_map(|(_, d)| d).collect();
    let config_maps: BTreeMap<String, Value> = all
        .iter()
        .filter(|d| s(d, &["kind"]) == Some("ConfigMap"))
        .map(|d| {
            (
                s(d, &["metadata", "name"]).unwrap().to_string(),
                get(d, &["data"]).cloned().expect("ConfigMap data"),
            )
        })
        .collect();
    let services: Vec<&Value> = all
        .iter()
        .copied()
        .filter(|d| s(d, &["kind"]) == Some("Service"))
        .collect();
    let image_uid: u64 = dockerfile_user().parse().expect("numeric USER");
    let admin_port_name = prometheus_admin_port_name();
    let (mut static_sidecars, mut xds_sidecars, mut xds_servers) = (0, 0, 0);
    let mut node_ids = Vec::new();
    let mut xds_dirs = Vec::new();
    for (file, docs) in &files {
        for d in docs {
            if !matches!(
                s(d, &["kind"]),
                Some("Deployment" | "StatefulSet" | "DaemonSet")
            ) {
                continue;
            }
            let name = s(d, &["metadata", "name"]).unwrap();
            let pod = get(d, &["spec", "template", "spec"]).expect("pod spec");
            let pod_non_root = get(pod, &["securityContext", "runAsNonRoot"])
                .and_then(Value::as_bool)
                == Some(true);
            let containers: Vec<&Value> = seq(pod, &["initContainers"])
                .into_iter()
                .chain(seq(pod, &["containers"]))
                .collect();
            for c in containers {
                let cname = s(c, &["name"]).unwrap_or("?");
                let what = format!("{file}: {name}/{cname}");
                let non_root = get(c, &["securityContext", "runAsNonRoot"])
                    .and_then(Value::as_bool)
                    .unwrap_or(pod_non_root);
                assert!(non_root, "{what}: runAsNonRoot is not set");
                if let Some(uid) = get(c, &["securityContext", "runAsUser"]) {
                    assert_ne!(uid.as_u64(), Some(0), "{what}: runs as root");
                }
                if !s(c, &["image"]).is_some_and(|i| i.starts_with("respway")) {
                    continue;
                }
                // The respway image: its uid is the Dockerfile's.
                if let Some(uid) = get(c, &["securityContext", "runAsUser"]) {
                    assert_eq!(uid.as_u64(), Some(image_uid), "{what}: runAsUser");
                }
                for k in ["requests", "limits"] {
                    assert!(get(c, &["resources", k]).is_some(), "{what}: resources.{k}");
                }
                let command = strings(c, &["command"]);
                let args = strings(c, &["args"]);
                let mounts = materialize_mounts(&what, pod, c, &config_maps);
                if command.first().is_some_and(|c| c == "respway-xds") {
                    xds_servers += 1;
                    assert_eq!(args.first().map(String::as_str), Some("serve"), "{what}");
                    let listen = flag_value(&args, "--listen").expect("--listen");
                    for p in ["readinessProbe", "livenessProbe"] {
                        let probe = get(c, &[p]).unwrap_or_else(|| panic!("{what}: no {p}"));
                        assert_eq!(probe_port(probe), Some(port_of(listen)), "{what}: {p}");
                    }
                    let resources = flag_value(&args, "--resources").expect("--resources");
                    let (_, dir) = mounts
                        .iter()
                        .find(|(m, _)| m == resources)
                        .unwrap_or_else(|| panic!("{what}: --resources {resources} not mounted"));
                    xds_dirs.push(dir.clone());
                    continue;
                }
                assert!(
                    command.is_empty() || command == ["respway"],
                    "{what}: {command:?}"
                );
                assert_flags_known(&what, &args);
                respway_check(&what, &args, &mounts);
                let admin = flag_value(&args, "--admin").expect("--admin");
                let admin_port = port_of(admin);
                let admin_ip = admin.parse::<SocketAddr>().unwrap().ip();
                assert!(
                    admin_ip.is_loopback()
                        || args.iter().any(|a| a == "--admin-allow-non-loopback"),
                    "{what}: --admin {admin} needs --admin-allow-non-loopback"
                );
                for (p, path) in [
                    ("readinessProbe", "/ready"),
                    ("livenessProbe", "/healthz"),
                    ("startupProbe", "/healthz"),
                ] {
                    let Some(probe) = get(c, &[p]) else {
                        assert_ne!(p, "readinessProbe", "{what}: no readinessProbe");
                        assert_ne!(p, "livenessProbe", "{what}: no livenessProbe");
                        continue;
                    };
                    assert_eq!(s(probe, &["httpGet", "path"]), Some(path), "{what}: {p}");
                    assert_eq!(probe_port(probe), Some(admin_port), "{what}: {p} port");
                }
                let port = seq(c, &["ports"])
                    .into_iter()
                    .find(|p| {
                        get(p, &["containerPort"]).and_then(Value::as_u64) == Some(admin_port)
                    })
                    .unwrap_or_else(|| panic!("{what}: no containerPort {admin_port}"));
                assert_eq!(
                    s(port, &["name"]),
                    Some(admin_port_name.as_str()),
                    "{what}: the admin port's name is what prometheus.yml keeps"
                );
                let drain: f64 =
                    flag_value(&args, "--drain-time-s").map_or(5.0, |v| v.parse().unwrap());
                let grace = get(pod, &["terminationGracePeriodSeconds"])
                    .and_then(Value::as_f64)
                    .unwrap_or(30.0);
                assert!(grace > drain, "{what}: grace {grace} s <= drain {drain} s");
                if let Some(path) = flag_value(&args, "--config") {
                    static_sidecars += 1;
                    let (mount, dir) = mounts
                        .iter()
                        .find(|(m, _)| path.strip_prefix(&format!("{m}/")).is_some())
                        .unwrap_or_else(|| panic!("{what}: --config {path} is not mounted"));
                    let file = dir.join(path.strip_prefix(&format!("{mount}/")).unwrap());
                    let config = valid_config(&what, &std::fs::read_to_string(file).unwrap());
                    for l in &config.listeners {
                        assert!(
                            l.address.ip().is_loopback(),
                            "{what}: listener {} is pod-local",
                            l.name
                        );
                    }
                } else if let Some(path) = flag_value(&args, "--bootstrap") {
                    xds_sidecars += 1;
                    let (mount, dir) = mounts
                        .iter()
                        .find(|(m, _)| path.strip_prefix(&format!("{m}/")).is_some())
                        .unwrap_or_else(|| panic!("{what}: --bootstrap {path} is not mounted"));
                    let file = dir.join(path.strip_prefix(&format!("{mount}/")).unwrap());
                    let b = respway::bootstrap::Bootstrap::load(&file)
                        .unwrap_or_else(|e| panic!("{what}: bootstrap: {e}"));
                    assert!(!b.xds_servers.is_empty(), "{what}: xds.server");
                    for server in &b.xds_servers {
                        // http://NAME:PORT: a Service of these manifests.
                        let hostport = server.strip_prefix("http://").expect("http:// (h2c)");
                        let (host, port) = hostport.rsplit_once(':').expect("host:port");
                        let port: u64 = port.trim_end_matches('/').parse().expect("port");
                        assert!(
                            services
                                .iter()
                                .any(|svc| s(svc, &["metadata", "name"]) == Some(host)
                                    && seq(svc, &["spec", "ports"]).iter().any(|p| get(
                                        p,
                                        &["port"]
                                    )
                                    .and_then(Value::as_u64)
                                        == Some(port))),
                            "{what}: xds.server {server}: no Service {host} with port {port}"
                        );
                    }
                    node_ids.push(b.node_id.expect("node.id"));
                } else {
                    panic!("{what}: neither --config nor --bootstrap");
                }
                for (_, dir) in &mounts {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
    }
    assert!(static_sidecars >= 1, "no sidecar with --config");
    assert!(xds_sidecars >= 1, "no sidecar with --bootstrap");
    assert_eq!(xds_servers, 1, "respway-xds deployments");
    // respway-xds's own cache loads the resource files and has a snapshot for every sidecar.
    for dir in xds_dirs {
        let cache = respway_xds::cache::Cache::new(&dir);
        let reload = cache.reload();
        assert!(
            reload.errors.is_empty(),
            "respway-xds resources: {:?}",
            reload.errors
        );
        assert_eq!(reload.committed, Some(1));
        for id in &node_ids {
            let snap = cache.snapshot().for_node(id, None);
            assert!(snap.is_some(), "respway-xds serves nothing to node {id}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The ConfigMap uses IP placeholders because respway does not resolve host names: the same
/// config with a DNS name is refused (if respway learns DNS, revisit the comment there).
#[test]
fn shard_addresses_must_be_ips() {
    let docs = yaml_documents("examples/kubernetes/respway-configmap.yaml");
    let yaml = s(&docs[0], &["data", "respway.yaml"]).expect("respway.yaml");
    valid_config("respway-configmap.yaml", yaml);
    let first = yaml
        .split("address: \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a quoted shard address");
    let with_dns = yaml.replacen(first, "redis-0.redis:6379", 1);
    let err = respway_xds::parse_yaml(&with_dns)
        .and_then(|r| respway_xds::translate(&r))
        .expect_err("a host name is refused");
    assert!(
        err.to_string().contains("host names are not resolved"),
        "{err}"
    );
}

/// The name of the container port the kubernetes_sd job of prometheus.yml keeps.
fn prometheus_admin_port_name() -> String {
    let docs = yaml_documents("examples/observability/prometheus.yml");
    assert_eq!(docs.len(), 1);
    let jobs = seq(&docs[0], &["scrape_configs"]);
    let k8s = jobs
        .iter()
        .find(|j| get(j, &["kubernetes_sd_configs"]).is_some())
        .expect("a kubernetes_sd job");
    assert_eq!(
        s(seq(k8s, &["kubernetes_sd_configs"])[0], &["role"]),
        Some("pod")
    );
    let keep = seq(k8s, &["relabel_configs"])
        .into_iter()
        .find(|r| {
            s(r, &["action"]) == Some("keep")
                && strings(r, &["source_labels"]) == ["__meta_kubernetes_pod_container_port_name"]
        })
        .expect("a keep on the container port name");
    s(keep, &["regex"]).expect("regex").to_string()
}

/// prometheus.yml: a static job on :9901 and a pod job keeping the sidecar's admin port, its
/// instance label the pod's name.
#[test]
fn prometheus_config_scrapes_the_admin_port() {
    let docs = yaml_documents("examples/observability/prometheus.yml");
    let jobs = seq(&docs[0], &["scrape_configs"]);
    let targets: Vec<String> = jobs
        .iter()
        .flat_map(|j| seq(j, &["static_configs"]))
        .flat_map(|sc| strings(sc, &["targets"]))
        .collect();
    assert!(
        targets.iter().any(|t| t.ends_with(":9901")),
        "a static target on the admin port: {targets:?}"
    );
    for j in &jobs {
        assert_eq!(s(j, &["metrics_path"]).unwrap_or("/metrics"), "/metrics");
    }
    assert_eq!(prometheus_admin_port_name(), "respway-admin");
    // The dashboard's reshard panels: a job for a `respway-xds reshard --metrics` run.
    assert!(
        jobs.iter()
            .any(|j| s(j, &["job_name"]) == Some("respway-reshard")
                && !seq(j, &["static_configs"]).is_empty()),
        "a static respway-reshard job"
    );
    // The dashboard's instance variable lists pods by name: the pod job's instance label.
    let k8s = jobs
        .iter()
        .find(|j| get(j, &["kubernetes_sd_configs"]).is_some())
        .expect("a kubernetes_sd job");
    assert!(
        seq(k8s, &["relabel_configs"]).into_iter().any(|r| {
            strings(r, &["source_labels"]) == ["__meta_kubernetes_pod_name"]
                && s(r, &["target_label"]) == Some("instance")
        }),
        "the pod job sets instance to the pod name"
    );
}

// ---------------------------------------------------------------------------------------------
// The Dockerfile

/// The Dockerfile's instructions (continuation lines joined, comments dropped), upper-cased
/// keyword and arguments.
fn dockerfile_instructions() -> Vec<(String, String)> {
    let text = repo_file("Dockerfile");
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        let (k, rest) = cur.split_once(char::is_whitespace).unwrap_or((&cur, ""));
        out.push((k.to_uppercase(), rest.trim().to_string()));
        cur.clear();
    }
    out
}

/// A JSON-array (exec form) instruction's arguments.
fn exec_form(what: &str, args: &str) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(args).unwrap_or_else(|e| panic!("{what} is not exec form: {e}"));
    v.as_array()
        .unwrap_or_else(|| panic!("{what}: not an array"))
        .iter()
        .map(|a| a.as_str().expect("string").to_string())
        .collect()
}

#[test]
fn dockerfile_is_multi_stage_non_root_and_runs_respway() {
    let ins = dockerfile_instructions();
    let of =
        |k: &str| -> Vec<&String> { ins.iter().filter(|(i, _)| i == k).map(|(_, a)| a).collect() };
    let froms = of("FROM");
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    assert!(
        froms[0].to_lowercase().contains(" as "),
        "the builder stage is named: {}",
        froms[0]
    );
    assert!(
        of("COPY").iter().any(|c| c.starts_with("--from=")),
        "the runtime stage copies from the builder"
    );
    for bin in ["respway", "respway-xds"] {
        assert!(
            of("COPY").iter().any(|c| c.starts_with("--from=")
                && (c.contains(&format!("/{bin} ")) || c.ends_with(&format!("/{bin}")))),
            "the image has {bin}"
        );
    }
    let user = dockerfile_user();
    let uid = user.split(':').next().unwrap();
    assert!(
        !uid.is_empty() && uid != "root" && uid != "0",
        "USER {user} is root"
    );
    if let Ok(n) = uid.parse::<u32>() {
        assert!(n > 0);
    }
    let exposed: BTreeSet<&str> = of("EXPOSE")
        .into_iter()
        .flat_map(|e| e.split_whitespace())
        .map(|p| p.split('/').next().unwrap())
        .collect();
    for p in ["9901", "6380"] {
        assert!(exposed.contains(p), "EXPOSE {p}: {exposed:?}");
    }
    let entrypoint = exec_form("ENTRYPOINT", of("ENTRYPOINT").last().expect("ENTRYPOINT"));
    assert_eq!(entrypoint, ["respway"]);
    let cmd = exec_form("CMD", of("CMD").last().expect("CMD"));
    assert_flags_known("Dockerfile CMD", &cmd);
    let admin = flag_value(&cmd, "--admin").expect("CMD --admin");
    assert_eq!(port_of(admin).to_string(), "9901");
    assert!(cmd.iter().any(|a| a == "--admin-allow-non-loopback"));
    // The CMD, on the ConfigMap's config where the image expects it, passes --check.
    let config = flag_value(&cmd, "--config").expect("CMD --config");
    let (mount, file) = config.rsplit_once('/').unwrap();
    let docs = yaml_documents("examples/kubernetes/respway-configmap.yaml");
    let yaml = s(&docs[0], &["data", file]).expect("the ConfigMap has the CMD's file");
    let dir = scratch("dockerfile");
    std::fs::write(dir.join(file), yaml).unwrap();
    respway_check("Dockerfile CMD", &cmd, &[(mount.to_string(), dir.clone())]);
    let _ = std::fs::remove_dir_all(&dir);
    // The build context leaves out what the image does not need.
    let ignore = repo_file(".dockerignore");
    for p in ["target/", ".git", "tests/clients/node_modules"] {
        assert!(ignore.lines().any(|l| l.trim() == p), ".dockerignore: {p}");
    }
}

/// Builds the image. Not run by default (it needs a Docker daemon and the network for the
/// base images and crates, which CI does not have): `cargo test --test it packaging:: -- --ignored`
/// on a machine with both.
#[test]
#[ignore = "needs a Docker daemon and network access"]
fn docker_build_when_a_daemon_is_available() {
    let daemon = have("docker")
        && Command::new("docker")
            .arg("info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    assert!(daemon, "no Docker daemon answers `docker info`");
    let status = Command::new("docker")
        .args([
            "build",
            "-t",
            "respway:packaging-test",
            env!("CARGO_MANIFEST_DIR"),
        ])
        .status()
        .expect("docker build");
    assert!(status.success(), "docker build failed");
}

/// The README's test command works as root without sudo (containers, CI images) and as a
/// user: it is one script of the repository, not a command line that starts with `sudo`.
#[test]
fn the_readmes_test_command_needs_no_sudo() {
    let readme = repo_file("README.md");
    let after = readme
        .split("**Run the tests**")
        .nth(1)
        .expect("a 'Run the tests' paragraph");
    let command = after
        .lines()
        .find(|l| l.starts_with("    "))
        .expect("an indented command")
        .trim();
    assert!(!command.starts_with("sudo"), "{command}");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(command);
    let meta = std::fs::metadata(&script).unwrap_or_else(|e| panic!("{command}: {e}"));
    use std::os::unix::fs::PermissionsExt;
    assert!(
        meta.permissions().mode() & 0o111 != 0,
        "{command} is not executable"
    );
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .expect("bash");
    assert!(syntax.success(), "{command}: bash -n");
    // It uses sudo only when not root.
    let text = repo_file(command);
    assert!(
        text.contains("id -u"),
        "{command} checks whether it runs as root"
    );
}

//! `respway-xds reshard start --metrics ADDR` end to end: a real 2 -> 4 reshard (the harness
//! of tests/reshard.rs: real redis-server shards, two real sidecars fed by a real `respway-xds
//! serve`, the real mover) serves `GET /metrics` while it runs. Scraped while the mover runs,
//! it says phase 3, the mover running, the plan's keys and the keys sent so far; scraped once
//! the run printed `done:` (`--metrics-linger` keeps it up), phase 4, done, and the mover's
//! summary's figures; after the linger the endpoint is gone with the process. A real
//! Prometheus that scraped such a run returns data for every dashboard query on a reshard
//! metric. Failing before: `--metrics` was an unknown argument (exit 2, no endpoint).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use crate::packaging::{dashboard, dashboard_exprs, from_reshard, metric_names, reads_reshard};
use crate::reshard::{fill, Env};
use crate::support::*;

/// What `--metrics` exposes: each metric and its type.
const METRICS: &[(&str, &str)] = &[
    ("respway_reshard_phase", "gauge"),
    ("respway_reshard_done", "gauge"),
    ("respway_reshard_running", "gauge"),
    ("respway_reshard_keys_planned", "gauge"),
    ("respway_reshard_keys_scanned_total", "counter"),
    ("respway_reshard_keys_sent_total", "counter"),
    ("respway_reshard_keys_kept_total", "counter"),
    ("respway_reshard_bytes_sent_total", "counter"),
    ("respway_reshard_batches_failed_total", "counter"),
    ("respway_reshard_batches_absent_total", "counter"),
    ("respway_reshard_keys_big_total", "counter"),
];

/// A `respway-xds reshard` run whose stdout and stderr lines are read as they come.
struct Run {
    child: Child,
    lines: Receiver<(bool, String)>,
    stdout: Vec<String>,
    stderr: Vec<String>,
}

impl Run {
    fn start(env: &Env, args: &[String]) -> Run {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut child = env.reshard_cmd(&args).spawn().expect("start reshard");
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((true, l));
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send((false, l));
            }
        });
        Run {
            child,
            lines,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    /// Reads the lines that came so far.
    fn drain(&mut self) {
        while let Ok((out, l)) = self.lines.try_recv() {
            if out {
                &mut self.stdout
            } else {
                &mut self.stderr
            }
            .push(l);
        }
    }

    fn text(&self) -> String {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            self.stdout.join("\n"),
            self.stderr.join("\n")
        )
    }

    /// The first line (of stdout when `out`, else stderr) starting with `prefix`, waited for
    /// until `deadline`.
    fn line(&mut self, out: bool, prefix: &str, deadline: Instant) -> String {
        loop {
            self.drain();
            let lines = if out { &self.stdout } else { &self.stderr };
            if let Some(l) = lines.iter().find(|l| l.starts_with(prefix)) {
                return l.clone();
            }
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                std::thread::sleep(Duration::from_millis(200));
                self.drain();
                let lines = if out { &self.stdout } else { &self.stderr };
                if let Some(l) = lines.iter().find(|l| l.starts_with(prefix)) {
                    return l.clone();
                }
                panic!("ended ({status}) without {prefix:?}\n{}", self.text());
            }
            assert!(
                Instant::now() < deadline,
                "no {prefix:?} in time\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The metrics endpoint the run printed on stderr.
    fn metrics_addr(&mut self) -> SocketAddr {
        let l = self.line(false, "metrics: http://", Instant::now() + slack_secs(30));
        l.strip_prefix("metrics: http://")
            .and_then(|a| a.strip_suffix("/metrics"))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{l}"))
    }

    /// Waits for its exit (bounded); its exit code.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.drain();
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.drain();
                panic!("the run did not end within {limit:?}\n{}", self.text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn slack_secs(s: u64) -> Duration {
    slack(Duration::from_secs(s))
}

/// `name N` of a comma-separated line (`plan: scanned 3000, move 1669, ...`).
fn figure(line: &str, name: &str) -> u64 {
    line.split(',')
        .find_map(|part| {
            let mut w = part.split_whitespace().skip_while(|w| *w != name);
            w.next()?;
            w.next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

/// One scrape: each sample's value by metric name, with its labels; the body.
struct Scrape {
    values: BTreeMap<String, (BTreeMap<String, String>, f64)>,
    body: String,
}

impl Scrape {
    fn get(addr: SocketAddr) -> Scrape {
        let (status, body) = http_get(addr, "/metrics");
        assert_eq!(status, 200, "{body}");
        let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
            .expect("valid Prometheus text");
        let mut values = BTreeMap::new();
        for s in parsed.samples {
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                other => panic!("{}: {other:?}", s.metric),
            };
            let labels: BTreeMap<String, String> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert!(
                values.insert(s.metric.clone(), (labels, v)).is_none(),
                "{} twice\n{body}",
                s.metric
            );
        }
        Scrape { values, body }
    }

    fn n(&self, name: &str) -> u64 {
        let v = self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("no {name}\n{}", self.body))
            .1;
        v as u64
    }
}

/// Every metric of [`METRICS`] with its HELP and TYPE, labelled with the route and its
/// clusters; every dashboard metric of a reshard run is among them.
fn check_shape(s: &Scrape) {
    for (name, kind) in METRICS {
        assert!(
            s.body.contains(&format!("# HELP {name} ")),
            "no HELP for {name}\n{}",
            s.body
        );
        assert!(
            s.body.contains(&format!("# TYPE {name} {kind}\n")),
            "no TYPE {kind} for {name}\n{}",
            s.body
        );
        let labels = &s.values[*name].0;
        let want: BTreeMap<String, String> = [("listener", "main"), ("from", "old"), ("to", "new")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(labels, &want, "{name}");
    }
    let exposed: BTreeSet<&str> = METRICS.iter().map(|(n, _)| *n).collect();
    let on_dashboard: BTreeSet<String> = dashboard_exprs()
        .iter()
        .flat_map(|e| metric_names(e))
        .filter(|n| from_reshard(n))
        .collect();
    assert!(on_dashboard.len() >= 4, "{on_dashboard:?}");
    for n in &on_dashboard {
        assert!(
            exposed.contains(n.as_str()),
            "the dashboard reads {n}, which reshard --metrics does not expose"
        );
    }
}

/// The run's metrics while the mover runs (phase 3, running, the plan's keys, some sent) and
/// once it printed `done:` (phase 4, done, the summary's figures); the endpoint is gone when
/// the process exits after `--metrics-linger`.
#[test]
fn reshard_metrics_follow_the_mover_and_end_on_its_summary() {
    let env = Env::start(2, 4);
    fill(&env);
    let state = env.work.join("state.json");
    let args = env.start_args(
        &state,
        &[
            "--yes",
            "--rate",
            "500",
            "--metrics",
            "127.0.0.1:0",
            "--metrics-linger",
            "3",
        ],
    );
    let mut run = Run::start(&env, &args);
    let addr = run.metrics_addr();
    let plan = run.line(true, "plan: ", Instant::now() + slack_secs(60));
    let planned = figure(&plan, "move");
    assert!(planned > 500, "{plan}");
    // While the mover runs (about 3 s at --rate 500).
    let deadline = Instant::now() + slack_secs(60);
    let during = loop {
        let s = Scrape::get(addr);
        if s.values.get("respway_reshard_running").map(|v| v.1) == Some(1.0)
            && s.n("respway_reshard_keys_sent_total") > 0
        {
            break s;
        }
        run.drain();
        assert!(
            Instant::now() < deadline && !run.stdout.iter().any(|l| l.starts_with("done: ")),
            "never scraped the mover running with keys sent\n{}\n{}",
            s.body,
            run.text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    check_shape(&during);
    assert_eq!(during.n("respway_reshard_phase"), 3, "{}", during.body);
    assert_eq!(during.n("respway_reshard_done"), 0, "{}", during.body);
    assert_eq!(
        during.n("respway_reshard_keys_planned"),
        planned,
        "{}",
        during.body
    );
    assert!(
        during.n("respway_reshard_keys_sent_total") <= planned
            && during.n("respway_reshard_keys_scanned_total")
                >= during.n("respway_reshard_keys_sent_total"),
        "{}",
        during.body
    );
    // The end, while --metrics-linger keeps the endpoint up.
    run.line(true, "done: ", Instant::now() + slack_secs(60));
    let summary = run.line(true, "mover: scanned ", Instant::now());
    let end = Scrape::get(addr);
    check_shape(&end);
    for (name, want) in [
        ("respway_reshard_phase", 4),
        ("respway_reshard_done", 1),
        ("respway_reshard_running", 0),
        ("respway_reshard_keys_planned", planned),
        ("respway_reshard_keys_sent_total", figure(&summary, "sent")),
        (
            "respway_reshard_keys_scanned_total",
            figure(&summary, "scanned"),
        ),
        ("respway_reshard_keys_kept_total", figure(&summary, "kept")),
        ("respway_reshard_batches_failed_total", 0),
        ("respway_reshard_keys_big_total", 0),
    ] {
        assert_eq!(end.n(name), want, "{name}: {summary}\n{}", end.body);
    }
    // Nothing else moved the keys: the mover sent every planned key.
    assert_eq!(end.n("respway_reshard_keys_sent_total"), planned);
    assert!(
        end.n("respway_reshard_bytes_sent_total") > 0,
        "{}",
        end.body
    );
    assert_eq!(run.wait(slack_secs(30)), Some(0), "{}", run.text());
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "the metrics endpoint outlived the run"
    );
}

/// A real Prometheus scrapes a reshard run's `--metrics` every second: once it has the run's
/// end, every dashboard query on a reshard metric returns data (with the reshard variable at
/// "all" and at the run's instance), the variable's own query finds the run, the keys sent
/// are the summary's, and the mover was seen running.
#[test]
fn prometheus_scrapes_a_reshard_and_evaluates_its_dashboard_queries() {
    assert!(
        have("prometheus"),
        "prometheus is not installed (apt-get install prometheus; .ci/run does)"
    );
    let env = Env::start(2, 4);
    fill(&env);
    let metrics = loopback(free_port());
    let port = free_port();
    let dir = crate::packaging::scratch("reshard-prometheus");
    let conf = dir.join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nscrape_configs:\n  - job_name: respway-reshard\n    static_configs: [ {{ targets: [\"{metrics}\"] }} ]\n"
        ),
    )
    .unwrap();
    let prometheus = Spawn::new("prometheus")
        .on_port(port)
        .arg(format!("--config.file={}", conf.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .start();
    let prom = loopback(port);
    // Prometheus answers 503 while it starts: the waits below ask again.
    let ask = |q: &str| -> (u16, serde_json::Value) {
        let (status, body) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(q)));
        (status, serde_json::from_str(&body).unwrap_or_default())
    };
    let query = |q: &str| -> serde_json::Value {
        let (status, v) = ask(q);
        assert!(
            status == 200 && v["status"] == "success",
            "{q}: {status} {v}"
        );
        v
    };
    let value = |q: &str| -> Option<f64> {
        ask(q).1["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
    };
    // Prometheus scrapes the (not yet listening) target before the run starts, so that it
    // scrapes it every second from the run's start on.
    let deadline = Instant::now() + slack_secs(30);
    while value("count_over_time(up{job=\"respway-reshard\"}[1m])").unwrap_or(0.0) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "Prometheus never tried its target"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let state = env.work.join("state.json");
    // The linger outlasts the test's checks: the run is killed (on drop) once they are done.
    let args = env.start_args(
        &state,
        &[
            "--yes",
            "--rate",
            "300",
            "--metrics",
            &metrics.to_string(),
            "--metrics-linger",
            "120",
        ],
    );
    let mut run = Run::start(&env, &args);
    assert_eq!(run.metrics_addr(), metrics);
    run.line(true, "done: ", Instant::now() + slack_secs(90));
    let summary = run.line(true, "mover: scanned ", Instant::now());
    let plan = run.line(true, "plan: ", Instant::now());
    // The end scraped, and three scrapes for rate().
    let deadline = Instant::now() + slack_secs(40);
    while value("respway_reshard_done") != Some(1.0)
        || value("count_over_time(respway_reshard_phase[1m])").unwrap_or(0.0) < 3.0
    {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped the end of the run: {}",
            ask("up").1
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let instance = metrics.to_string();
    let mut failures = Vec::new();
    let exprs: Vec<String> = dashboard_exprs()
        .into_iter()
        .filter(|e| reads_reshard(e))
        .collect();
    assert!(exprs.len() >= 4, "{exprs:?}");
    for e in &exprs {
        for v in [".*", instance.as_str()] {
            let e = e.replace("$reshard", v);
            let r = query(&e);
            if r["data"]["result"].as_array().map_or(0, Vec::len) == 0 {
                failures.push(format!("{e}: no series: {r}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let var = dashboard()["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "reshard")
        .cloned()
        .expect("the reshard variable");
    assert_eq!(
        var["definition"],
        "label_values(respway_reshard_phase, instance)"
    );
    let r = query("count by (instance) (respway_reshard_phase)");
    assert_eq!(
        r["data"]["result"][0]["metric"]["instance"], instance,
        "{r}"
    );
    assert_eq!(
        value("respway_reshard_keys_sent_total"),
        Some(figure(&summary, "sent") as f64)
    );
    assert_eq!(
        value("respway_reshard_keys_planned"),
        Some(figure(&plan, "move") as f64)
    );
    assert_eq!(value("respway_reshard_phase"), Some(4.0));
    // The mover's progress was recorded while it ran, not only its end.
    assert_eq!(
        value("max_over_time(respway_reshard_running[5m])"),
        Some(1.0)
    );
    let first = value("min_over_time(respway_reshard_phase[5m])").expect("phases scraped");
    assert!(first <= 3.0, "the first phase scraped: {first}");
    drop(run);
    // Stopped first: a running Prometheus writes into its directory while it is removed.
    drop(prometheus);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--metrics` with copy mode (none of its phases) or with something that is not an address
/// is a usage error (exit 2), before anything is planned or pushed (no server is needed to
/// find out).
#[test]
fn metrics_are_refused_for_copy_mode_and_a_bad_address() {
    let work = std::env::temp_dir().join(format!("respway-reshard-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let file = work.join("res.yaml");
    std::fs::write(
        &file,
        "listeners:\n  - name: main\n    address: 127.0.0.1:1\n    routes: { catch_all: old }\n\
         clusters:\n  - name: old\n    shards: [ { endpoints: [ { address: 127.0.0.1:2 } ] } ]\n\
         \x20 - name: new\n    shards: [ { endpoints: [ { address: 127.0.0.1:3 } ] } ]\n",
    )
    .unwrap();
    let state = work.join("state.json");
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(respway_xds_bin())
            .args(["reshard", "start", "--admin", "127.0.0.1:1"])
            .env_remove("RESPWAY_XDS_ADMIN_TOKEN_FILE")
            .args([
                "--listener",
                "main",
                "--from",
                "old",
                "--to",
                "new",
                "--yes",
            ])
            .arg("--file")
            .arg(&file)
            .arg("--state")
            .arg(&state)
            .args(extra)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run respway-xds reshard");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[
        "--copy",
        "--metrics",
        "127.0.0.1:0",
        "--metrics-linger",
        "60",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("metrics: http://127.0.0.1:"), "{err}");
    assert!(
        err.contains("--metrics follows move mode's phases and mover; copy mode (--copy) has none"),
        "{err}"
    );
    let (code, err) = run(&["--metrics", "localhost"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--metrics localhost: not an IP:PORT address"),
        "{err}"
    );
    assert!(!state.exists(), "nothing started");
    let _ = std::fs::remove_dir_all(&work);
}

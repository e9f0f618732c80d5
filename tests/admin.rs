//! The admin endpoint: /metrics parsed by an independent Prometheus text parser and scraped
//! by a real Prometheus server, INFO commandstats / latencystats, /stats, /ready following
//! the shards, /healthz, and the loopback rule; file descriptors: the admin endpoint's
//! connection cap and header timeout, RLIMIT_NOFILE raised at start, EMFILE on accept.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;

fn with_admin(yaml: &str) -> (Respway, respway::admin::Admin) {
    let rw = respway(yaml, 2);
    let admin = respway::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        false,
        rw.server.as_ref().expect("server"),
    )
    .expect("admin");
    (rw, admin)
}

fn three_shards() -> (Vec<Proc>, Vec<SocketAddr>) {
    let shards: Vec<Proc> = (0..3).map(|_| redis()).collect();
    let addrs = shards.iter().map(|p| p.addr).collect();
    (shards, addrs)
}

/// Drives `n` GETs and `n` SETs and one failing command per 100, over a few connections.
fn drive(addr: SocketAddr, n: usize) {
    let mut c = RespConn::connect(addr);
    for i in 0..n {
        let k = format!("k{i}");
        assert_eq!(c.call(&["SET", &k, "v"]), Resp::Simple("OK".into()));
        assert_eq!(c.call(&["GET", &k]), Resp::bulk("v"));
        if i % 100 == 0 {
            assert!(c.call(&["INCR", &k]).is_error());
        }
    }
}

fn sample<'a>(
    scrape: &'a prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> Vec<&'a prometheus_parse::Sample> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect()
}

fn counter(scrape: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match sample(scrape, metric, labels).first().map(|s| &s.value) {
        Some(prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v)) => *v,
        Some(prometheus_parse::Value::Untyped(v)) => *v,
        other => panic!("{metric} {labels:?}: {other:?}"),
    }
}

/// The pipeline-depth histogram counts commands per read: 50 single commands land in the
/// le="1" bucket, one write of 10 commands in a bucket from le="16" on, not below.
#[test]
fn metrics_show_pipeline_depth() {
    let (_shards, addrs) = three_shards();
    let (rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    let mut c = RespConn::connect(rw.addr);
    for i in 0..50 {
        assert_eq!(
            c.call(&["SET", &format!("p{i}"), "v"]),
            Resp::Simple("OK".into())
        );
    }
    let cmds: Vec<Vec<String>> = (0..10)
        .map(|i| vec!["GET".into(), format!("p{i}")])
        .collect();
    c.send_pipeline(&cmds);
    for _ in 0..10 {
        assert_eq!(c.read().expect("reply"), Resp::bulk("v"));
    }
    let (_, body) = http_get(admin.local_addr(), "/metrics");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    let hist = sample(
        &scrape,
        "respway_downstream_pipeline_depth",
        &[("listener", "main")],
    );
    let Some(prometheus_parse::Value::Histogram(b)) = hist.first().map(|s| &s.value) else {
        panic!("histogram: {hist:?}\n{body}");
    };
    let at = |le: f64| {
        b.iter()
            .find(|x| x.less_than == le)
            .map(|x| x.count)
            .expect("bucket")
    };
    assert_eq!(at(1.0), 50.0, "{b:?}");
    assert_eq!(at(8.0), 50.0, "{b:?}");
    assert_eq!(at(16.0), 51.0, "{b:?}");
    assert_eq!(b.last().expect("+Inf").count, 51.0, "{b:?}");
}

/// /metrics parses with an independent parser and counts exactly the commands the test ran,
/// per command, with errors and a histogram whose count is the calls; INFO commandstats
/// agrees.
#[test]
fn metrics_count_the_load_per_command() {
    let (_shards, addrs) = three_shards();
    let (rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    drive(rw.addr, 500);
    let (status, body) = http_get(admin.local_addr(), "/metrics");
    assert_eq!(status, 200);
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    let l = ("listener", "main");
    assert_eq!(
        counter(&scrape, "respway_commands_total", &[l, ("command", "get")]),
        500.0
    );
    assert_eq!(
        counter(&scrape, "respway_commands_total", &[l, ("command", "set")]),
        500.0
    );
    assert_eq!(
        counter(&scrape, "respway_commands_total", &[l, ("command", "incr")]),
        5.0
    );
    assert_eq!(
        counter(
            &scrape,
            "respway_command_errors_total",
            &[l, ("command", "incr")]
        ),
        5.0
    );
    assert_eq!(
        counter(
            &scrape,
            "respway_command_errors_total",
            &[l, ("command", "get")]
        ),
        0.0
    );
    // Latency per command family: GET is the only read here.
    let hist = sample(
        &scrape,
        "respway_command_duration_seconds",
        &[l, ("family", "read")],
    );
    match hist.first().map(|s| &s.value) {
        Some(prometheus_parse::Value::Histogram(buckets)) => {
            let inf = buckets.last().expect("buckets");
            assert!(inf.less_than.is_infinite());
            assert_eq!(inf.count, 500.0);
            assert!(buckets.len() > 60, "fine buckets: {}", buckets.len());
            assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count));
        }
        other => panic!("histogram: {other:?}"),
    }
    assert!(counter(&scrape, "respway_downstream_connections_total", &[l]) >= 1.0);
    // 500 `+OK` (5 bytes) and 500 `$1 v` (7 bytes) replies at least; 1,005 commands of at
    // least 20 bytes each.
    assert!(counter(&scrape, "respway_downstream_sent_bytes_total", &[l]) >= 6000.0);
    assert!(counter(&scrape, "respway_downstream_received_bytes_total", &[l]) >= 20_100.0);
    assert_eq!(counter(&scrape, "respway_config_version", &[]), 1.0);
    let mut c = RespConn::connect(rw.addr);
    let info = c.call(&["INFO", "commandstats"]).text();
    assert!(info.contains("cmdstat_get:calls=500,"), "{info}");
    assert!(
        info.contains("cmdstat_incr:calls=5,") && info.contains("failed_calls=5"),
        "{info}"
    );
    let lat = c.call(&["INFO", "latencystats"]).text();
    assert!(lat.contains("latency_percentiles_usec_get:p50="), "{lat}");
    // The default INFO has neither (as in Redis).
    assert!(!c.call(&["INFO"]).text().contains("cmdstat_"));
    let (status, stats) = http_get(admin.local_addr(), "/stats");
    assert_eq!(status, 200);
    let get = stats
        .lines()
        .find(|l| l.starts_with("get "))
        .expect("get row");
    assert_eq!(get.split_whitespace().nth(1), Some("500"), "{stats}");
    assert_eq!(http_get(admin.local_addr(), "/healthz").0, 200);
    assert_eq!(http_get(admin.local_addr(), "/nope").0, 404);
    let (status, clusters) = http_get(admin.local_addr(), "/clusters");
    assert_eq!(status, 200);
    assert!(
        clusters.starts_with("cluster main (3 shards)\n"),
        "{clusters}"
    );
    for (i, a) in addrs.iter().enumerate() {
        assert!(
            clusters.contains(&format!(
                "  shard s{i} endpoint {a} role=primary zone=- healthy=yes (workers 2/2) dedicated_connections=0 requests="
            )),
            "{clusters}"
        );
    }
    // Per-shard load: every request the test sent reached one shard's endpoint.
    let per_shard: Vec<f64> = (0..3)
        .map(|i| {
            counter(
                &scrape,
                "respway_upstream_requests_total",
                &[("cluster", "main"), ("shard", &format!("s{i}"))],
            )
        })
        .collect();
    assert_eq!(per_shard.iter().sum::<f64>(), 1005.0, "{per_shard:?}");
    assert!(
        per_shard.iter().all(|&n| n > 100.0),
        "spread: {per_shard:?}"
    );
    // Time upstream, per shard: a histogram of every answered request.
    let mut answered = 0.0;
    for i in 0..3 {
        let shard = format!("s{i}");
        let h = sample(
            &scrape,
            "respway_upstream_duration_seconds",
            &[("cluster", "main"), ("shard", &shard)],
        );
        match h.first().map(|s| &s.value) {
            Some(prometheus_parse::Value::Histogram(b)) => {
                answered += b.last().expect("+Inf").count;
            }
            other => panic!("upstream histogram of {shard}: {other:?}"),
        }
    }
    assert_eq!(answered, 1005.0);
    // Nothing waits in a queue once every reply is in.
    for i in 0..3 {
        assert_eq!(
            counter(
                &scrape,
                "respway_upstream_queued_requests",
                &[("cluster", "main"), ("shard", &format!("s{i}"))],
            ),
            0.0
        );
    }
}

/// A path the admin endpoint does not serve gets a 404 that names every endpoint the
/// documentation lists in docs/operations-and-metrics.md (it named six of the ten: /clusters
/// and /config_dump were missing).
#[test]
fn admin_404_names_every_documented_endpoint() {
    let (_shards, addrs) = three_shards();
    let (_rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", false));
    let (status, body) = http_get(admin.local_addr(), "/nope");
    assert_eq!(status, 404);
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/operations-and-metrics.md"
    ))
    .expect("docs/operations-and-metrics.md");
    let documented: Vec<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter_map(|c| c.strip_prefix("GET ").or_else(|| c.strip_prefix("POST ")))
        .map(|p| p.split('?').next().unwrap_or(p))
        .collect();
    assert!(documented.len() >= 10, "{documented:?}");
    for path in documented {
        assert!(
            body.split([' ', ',', '?', '\n']).any(|w| w == path),
            "{path} missing from the 404: {body}"
        );
    }
}

/// /ready is 503 naming the shard while a shard's primary is down, 200 when it is back.
#[test]
fn ready_follows_the_shards() {
    let (mut shards, addrs) = three_shards();
    let (_rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    assert_eq!(
        http_get(admin.local_addr(), "/ready"),
        (200, "ready\n".into())
    );
    let port = addrs[1].port();
    shards[1].kill();
    let (status, body) = http_get(admin.local_addr(), "/ready");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("main/s1"), "{body}");
    shards[1] = redis_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(admin.local_addr(), "/ready").0 != 200 {
        assert!(Instant::now() < deadline, "not ready again");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A non-loopback admin address is refused unless explicitly allowed.
#[test]
fn admin_refuses_a_non_loopback_address() {
    let shard = redis();
    let rw = respway(&sharded_yaml(&[shard.addr], "{ policy: maglev }", true), 1);
    let err = respway::admin::start(
        "0.0.0.0:0".parse().unwrap(),
        false,
        rw.server.as_ref().expect("server"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("is not loopback"), "{err}");
    assert!(
        err.to_string().contains("--admin-allow-non-loopback"),
        "{err}"
    );
}

/// Prometheus's answer to an instant query: the first result's value.
fn prom_query(prom: SocketAddr, q: &str) -> Option<f64> {
    let (status, body) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(q)));
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let r = v["data"]["result"].as_array()?.first()?;
    r["value"][1].as_str()?.parse().ok()
}

/// A real Prometheus server scrapes /metrics: it finds the per-command counter the test drove
/// and a p99 from the read family's histogram (GET is the only read here) equal (within a
/// bucket) to respway's own for GET.
#[test]
fn prometheus_scrapes_respway() {
    assert!(
        have("prometheus"),
        "prometheus is not installed (apt-get install prometheus; .ci/run does)"
    );
    let (_shards, addrs) = three_shards();
    let (rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    drive(rw.addr, 2000);
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("respway-prom-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
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
    let q = "respway_commands_total{job=\"respway\",command=\"get\"}";
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if prom_query(prom, q) == Some(2000.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw 2000 GETs: {:?}",
            prom_query(prom, q)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let p99 = prom_query(
        prom,
        "histogram_quantile(0.99, sum by (le) (respway_command_duration_seconds_bucket{family=\"read\"}))",
    )
    .expect("p99 from Prometheus");
    let (_, stats) = http_get(admin.local_addr(), "/stats");
    let row: Vec<&str> = stats
        .lines()
        .find(|l| l.starts_with("get "))
        .expect("get row")
        .split_whitespace()
        .collect();
    let ours_us: f64 = row[5].parse().expect("p99_us");
    let theirs_us = p99 * 1e6;
    // Prometheus interpolates inside the bucket whose upper bound respway reports.
    assert!(
        theirs_us <= ours_us + 1.0 && theirs_us >= ours_us * 0.75 - 1.0,
        "Prometheus p99 {theirs_us} µs, respway's {ours_us} µs"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hot-key detection finds the 10 hottest keys of a zipf(1.2) workload over 100,000 keys, at
/// /hotkeys, in /metrics, and through `respway hotkeys --admin`.
#[test]
fn hot_key_detection_finds_the_zipf_heads() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    use rand::{Rng, SeedableRng};
    let (_shards, addrs) = three_shards();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true);
    let resources = respway_xds::parse_yaml(&yaml).expect("yaml");
    let config = respway_xds::translate(&resources).expect("config");
    let server = respway::start(
        config,
        respway::Options {
            workers: 2,
            hot_key_sample: 4,
            ..Default::default()
        },
    )
    .expect("start");
    let addr = server.local_addrs()[0];
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, &server).expect("admin");
    // Zipf(1.2) over 100,000 keys; rank r is key `z:{r * 7919 % 100000}` so the hot keys are
    // spread over the key space, not the first names.
    let n = 100_000usize;
    let (cdf, sum) = zipf_cdf(n, 1.2);
    let name = |r: usize| format!("z:{}", r * 7919 % n);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let cdf = cdf.clone();
            let mut rng = rand::rngs::StdRng::seed_from_u64(t);
            std::thread::spawn(move || {
                let mut c = RespConn::connect(addr);
                for _ in 0..50 {
                    let cmds: Vec<Vec<String>> = (0..1000)
                        .map(|_| {
                            let u = rng.random::<f64>() * sum;
                            let r = cdf.partition_point(|&c| c < u) + 1;
                            vec!["GET".to_string(), format!("z:{}", r * 7919 % n)]
                        })
                        .collect();
                    c.send_pipeline(&cmds);
                    for _ in 0..cmds.len() {
                        c.read().expect("reply");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("load");
    }
    let (status, body) = http_get(admin.local_addr(), "/hotkeys");
    assert_eq!(status, 200);
    let found: Vec<String> = body
        .lines()
        .skip_while(|l| !l.starts_with("cluster main"))
        .skip(1)
        .take(10)
        .map(|l| {
            l.split_once(' ')
                .expect("COUNT KEY")
                .1
                .trim_matches('"')
                .to_string()
        })
        .collect();
    let mut want: Vec<String> = (1..=10).map(name).collect();
    let mut got = found.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want, "/hotkeys:\n{body}");
    let (_, metrics) = http_get(admin.local_addr(), "/metrics");
    assert!(
        metrics.contains(&format!(
            "respway_hot_key_requests{{cluster=\"main\",key=\"{}\"}}",
            name(1)
        )),
        "the hottest key in /metrics"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_respway"))
        .args(["hotkeys", "--admin", &admin.local_addr().to_string()])
        .output()
        .expect("respway hotkeys");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("hot key found with counter: ")
            && text.contains(&format!("keyname: \"{}\"", name(1))),
        "{text}"
    );
    drop(admin);
    server.shutdown();
}

/// A command held up by its shard (`CLIENT PAUSE` sent to the shard directly) is in
/// `SLOWLOG GET` in Redis's format and in /slowlog with its cluster and shard; fast ones
/// are not; SLOWLOG LEN and RESET work.
#[test]
fn slow_log_names_the_shard_of_a_slow_command() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let (_shards, addrs) = three_shards();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true);
    let resources = respway_xds::parse_yaml(&yaml).expect("yaml");
    let config = respway_xds::translate(&resources).expect("config");
    let server = respway::start(
        config,
        respway::Options {
            slowlog_threshold_us: 100_000,
            ..Default::default()
        },
    )
    .expect("start");
    let addr = server.local_addrs()[0];
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, &server).expect("admin");
    let mut c = RespConn::connect(addr);
    c.call(&["CLIENT", "SETNAME", "slowpoke"]);
    assert_eq!(c.call(&["SET", "slow:key", "v"]), Resp::Simple("OK".into()));
    let shard = (0..3)
        .find(|&i| RespConn::connect(addrs[i]).call(&["EXISTS", "slow:key"]) == Resp::Int(1))
        .expect("key on a shard");
    // The shard holds every client's commands for 300 ms.
    assert_eq!(
        RespConn::connect(addrs[shard]).call(&["CLIENT", "PAUSE", "300", "ALL"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(c.call(&["GET", "slow:key"]), Resp::bulk("v"));
    let Resp::Array(Some(entries)) = c.call(&["SLOWLOG", "GET"]) else {
        panic!("SLOWLOG GET is an array");
    };
    assert_eq!(entries.len(), 1, "only the slow GET: {entries:?}");
    let Resp::Array(Some(e)) = &entries[0] else {
        panic!("entry")
    };
    assert_eq!(e.len(), 6, "Redis's six fields");
    let Resp::Int(us) = e[2] else {
        panic!("duration")
    };
    assert!(us >= 200_000, "{us} µs");
    assert_eq!(
        e[3],
        Resp::Array(Some(vec![Resp::bulk("GET"), Resp::bulk("slow:key")]))
    );
    assert_eq!(e[5], Resp::bulk("slowpoke"));
    let (_, body) = http_get(admin.local_addr(), "/slowlog");
    assert!(body.contains(&format!("target=main/s{shard} ")), "{body}");
    assert!(body.contains("command=\"GET\" \"slow:key\""), "{body}");
    // The endpoint that answered, and the time split: the shard's pause was upstream.
    assert!(
        body.contains(&format!(" endpoint={} ", addrs[shard])),
        "{body}"
    );
    let field = |name: &str| -> u64 {
        let at = body
            .find(&format!(" {name}="))
            .unwrap_or_else(|| panic!("{name} in {body}"));
        let rest = &body[at + name.len() + 2..];
        rest[..rest.find(' ').unwrap_or(rest.len())]
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e} in {body}"))
    };
    let (up, ours) = (field("upstream_us"), field("respway_us"));
    assert!(up >= 200_000, "upstream {up} µs: {body}");
    assert!(ours < up, "respway {ours} µs, upstream {up} µs: {body}");
    assert_eq!(up + ours, u64::try_from(us).unwrap(), "{body}");
    assert_eq!(c.call(&["SLOWLOG", "LEN"]), Resp::Int(1));
    assert_eq!(c.call(&["SLOWLOG", "RESET"]), Resp::Simple("OK".into()));
    assert_eq!(c.call(&["SLOWLOG", "LEN"]), Resp::Int(0));
    // AUTH's arguments are never kept.
    assert_eq!(
        respway::slowlog::kept_args("auth", Some(&bytes::Bytes::from_static(b"secret"))),
        vec![bytes::Bytes::from_static(b"AUTH")]
    );
    drop(admin);
    server.shutdown();
}

/// redis_exporter (Debian's prometheus-redis-exporter) scrapes respway through RESP with no
/// error: INFO's server/clients/stats/replication/keyspace fields, commandstats,
/// latencystats, SLOWLOG and LATENCY answer as it expects.
#[test]
fn redis_exporter_scrapes_respway_without_errors() {
    assert!(
        have("prometheus-redis-exporter"),
        "prometheus-redis-exporter is not installed (apt-get install prometheus-redis-exporter; .ci/run does)"
    );
    let (_shards, addrs) = three_shards();
    let (rw, _admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    drive(rw.addr, 100);
    let port = free_port();
    let exporter = Spawn::new("prometheus-redis-exporter")
        .on_port(port)
        .arg(format!("--redis.addr=redis://{}", rw.addr))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .start();
    let (status, body) = http_get(loopback(port), "/metrics");
    assert_eq!(status, 200);
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("exporter output");
    assert_eq!(counter(&scrape, "redis_up", &[]), 1.0, "{body}");
    assert_eq!(
        counter(&scrape, "redis_exporter_last_scrape_error", &[("err", "")]),
        0.0
    );
    assert_eq!(
        counter(&scrape, "redis_commands_total", &[("cmd", "get")]),
        100.0
    );
    assert!(counter(&scrape, "redis_connected_clients", &[]) >= 1.0);
    assert!(body.contains("role=\"master\""), "{body}");
    let log = exporter.log();
    assert!(!log.contains("level=error"), "{log}");
    // LATENCY HISTOGRAM in Redis 7's shape: command -> calls, histogram_usec.
    let mut c = RespConn::connect(rw.addr);
    let Resp::Array(Some(h)) = c.call(&["LATENCY", "HISTOGRAM", "get"]) else {
        panic!("LATENCY HISTOGRAM")
    };
    assert_eq!(h[0], Resp::bulk("get"));
    let Resp::Array(Some(fields)) = &h[1] else {
        panic!("fields")
    };
    assert_eq!(fields[0], Resp::bulk("calls"));
    assert_eq!(fields[1], Resp::Int(100));
    assert_eq!(fields[2], Resp::bulk("histogram_usec"));
    assert_eq!(c.call(&["LATENCY", "LATEST"]), Resp::Array(Some(vec![])));
}

/// /config_dump is the configuration served, as the YAML file says it, with passwords
/// redacted.
#[test]
fn config_dump_shows_the_served_config_without_secrets() {
    let shard = redis_with(&["--requirepass", "upstream-secret"]);
    let yaml = sharded_yaml(&[shard.addr], "{ policy: maglev }", true)
        .replace(
            "    op_timeout: 2s\n",
            "    op_timeout: 2s\n    downstream_auth_password: client-secret\n",
        )
        .replace(
            "    connect_timeout: 500ms\n",
            "    connect_timeout: 500ms\n    auth: { password: upstream-secret }\n",
        );
    let (_rw, admin) = with_admin(&yaml);
    let (status, body) = http_get(admin.local_addr(), "/config_dump");
    assert_eq!(status, 200);
    assert!(
        !body.contains("secret"),
        "a secret in /config_dump:\n{body}"
    );
    assert!(body.starts_with("# version: 1\n"), "{body}");
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&body).expect("YAML");
    let l = &v["listeners"][0];
    assert_eq!(l["name"].as_str(), Some("main"));
    assert_eq!(l["op_timeout"].as_str(), Some("2s"));
    assert_eq!(l["downstream_auth_password"].as_str(), Some("<redacted>"));
    let c = &v["clusters"][0];
    assert_eq!(c["connect_timeout"].as_str(), Some("500ms"));
    assert_eq!(c["auth"]["password"].as_str(), Some("<redacted>"));
    assert_eq!(
        c["shards"][0]["endpoints"][0]["address"].as_str(),
        Some(shard.addr.to_string().as_str())
    );
}

/// INFO's config_version is the version of the configuration served — the one /metrics
/// reports and `apply` returns — after many applies in a row. (It is now read from the parts
/// the worker built, not counted per worker: a worker that coalesced changes built fewer
/// parts than there were versions; this test does not force that.)
#[test]
fn info_config_version_is_the_applied_version() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let (_shards, addrs) = three_shards();
    let yaml = sharded_yaml(&addrs, "{ policy: maglev }", true);
    let resources = respway_xds::parse_yaml(&yaml).expect("yaml");
    let config = respway_xds::translate(&resources).expect("config");
    let server = respway::start(config.clone(), respway::Options::default()).expect("start");
    let addr = server.local_addrs()[0];
    let mut last = 0;
    for i in 0..20u64 {
        let mut c = config.clone();
        c.listeners[0].op_timeout = std::time::Duration::from_millis(500 + i);
        last = server.apply(c).expect("apply");
    }
    assert_eq!(last, 21);
    let mut conn = RespConn::connect(addr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let info = conn.call(&["INFO", "proxy"]).text();
        if info.contains("config_version:21\r\n") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{info}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.shutdown();
}

/// A killed shard's failures are counted on its own endpoint (kind by kind, none on the
/// others), the endpoint is shown out with why and since when (`/clusters`,
/// `respway_upstream_healthy`, `respway_upstream_ejections_total`), and it is back in once
/// the shard returns.
#[test]
fn upstream_errors_and_outliers_are_shown_per_endpoint() {
    let (mut shards, addrs) = three_shards();
    let (rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    let mut c = RespConn::connect(rw.addr);
    for i in 0..300 {
        assert_eq!(
            c.call(&["SET", &format!("k{i}"), "v"]),
            Resp::Simple("OK".into())
        );
    }
    let port = addrs[1].port();
    shards[1].kill();
    let mut failed = 0;
    for i in 0..300 {
        if c.call(&["GET", &format!("k{i}")]).is_error() {
            failed += 1;
        }
    }
    assert!(failed > 0, "some keys live on the killed shard");
    let scrape = |admin: &respway::admin::Admin| {
        let (status, body) = http_get(admin.local_addr(), "/metrics");
        assert_eq!(status, 200);
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
            .expect("valid Prometheus text")
    };
    let s = scrape(&admin);
    let errors = |s: &prometheus_parse::Scrape, shard: &str| -> f64 {
        sample(s, "respway_upstream_errors_total", &[("shard", shard)])
            .iter()
            .map(|x| match x.value {
                prometheus_parse::Value::Counter(v) => v,
                _ => panic!("counter"),
            })
            .sum()
    };
    let on_s1 = errors(&s, "s1");
    assert!(
        on_s1 >= 1.0 && on_s1 <= f64::from(failed),
        "s1 errors {on_s1}, client saw {failed}"
    );
    assert_eq!(errors(&s, "s0"), 0.0);
    assert_eq!(errors(&s, "s2"), 0.0);
    let ep = addrs[1].to_string();
    let s1 = [("shard", "s1"), ("endpoint", ep.as_str())];
    assert!(counter(&s, "respway_upstream_healthy", &s1) < 1.0);
    assert!(counter(&s, "respway_upstream_ejections_total", &s1) >= 1.0);
    assert_eq!(
        counter(&s, "respway_upstream_healthy", &[("shard", "s0")]),
        1.0
    );
    let (_, clusters) = http_get(admin.local_addr(), "/clusters");
    let line = clusters
        .lines()
        .find(|l| l.contains(&format!("shard s1 endpoint {ep}")))
        .unwrap_or_else(|| panic!("{clusters}"));
    assert!(line.contains(" out_since="), "{line}");
    assert!(line.contains("last_error=\""), "{line}");
    assert!(line.contains(&format!("errors={on_s1}")), "{line}");
    shards[1] = redis_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let back = (0..300).all(|i| !c.call(&["GET", &format!("k{i}")]).is_error());
        let (_, clusters) = http_get(admin.local_addr(), "/clusters");
        let line = clusters
            .lines()
            .find(|l| l.contains(&format!("shard s1 endpoint {ep}")))
            .unwrap_or_default()
            .to_string();
        if back && !line.contains("out_since") {
            break;
        }
        assert!(Instant::now() < deadline, "not back in: {line}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The slow log's threshold and length and the hot-key sampling come from the listener's
/// configuration and change with a push: nothing is logged or sampled before, and after the
/// push slow commands are logged (at most `slowlog_max_len`) and hot keys found.
#[test]
fn slow_log_and_hot_key_settings_follow_the_config() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let (_shards, addrs) = three_shards();
    let yaml = |extra: &str| {
        sharded_yaml(&addrs, "{ policy: maglev }", true).replace(
            "    op_timeout: 2s\n",
            &format!("    op_timeout: 2s\n{extra}"),
        )
    };
    let config = |y: &str| respway_xds::translate(&respway_xds::parse_yaml(y).unwrap()).unwrap();
    let server = respway::start(
        config(&yaml("    slowlog_threshold: 1h\n    hot_key_sample: 0\n")),
        respway::Options::default(),
    )
    .expect("start");
    let addr = server.local_addrs()[0];
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, &server).expect("admin");
    let mut c = RespConn::connect(addr);
    assert_eq!(c.call(&["SET", "slow:key", "v"]), Resp::Simple("OK".into()));
    let shard = (0..3)
        .find(|&i| RespConn::connect(addrs[i]).call(&["EXISTS", "slow:key"]) == Resp::Int(1))
        .expect("key on a shard");
    let slow_get = |c: &mut RespConn| {
        assert_eq!(
            RespConn::connect(addrs[shard]).call(&["CLIENT", "PAUSE", "150", "ALL"]),
            Resp::Simple("OK".into())
        );
        assert_eq!(c.call(&["GET", "slow:key"]), Resp::bulk("v"));
    };
    let hot_gets = |c: &mut RespConn| {
        for _ in 0..2000 {
            c.call(&["GET", "hot:one"]);
        }
    };
    slow_get(&mut c);
    hot_gets(&mut c);
    assert_eq!(c.call(&["SLOWLOG", "LEN"]), Resp::Int(0), "threshold 1h");
    let (_, hot) = http_get(admin.local_addr(), "/hotkeys");
    assert!(!hot.contains("hot:one"), "sampling off: {hot}");

    server
        .apply(config(&yaml(
            "    slowlog_threshold: 50ms\n    slowlog_max_len: 1\n    hot_key_sample: 1\n",
        )))
        .expect("apply");
    // The workers swap on their own; a new session after that uses the new settings.
    let mut logged = false;
    for _ in 0..30 {
        let mut c = RespConn::connect(addr);
        slow_get(&mut c);
        if c.call(&["SLOWLOG", "LEN"]) == Resp::Int(1) {
            logged = true;
            break;
        }
    }
    assert!(logged, "a slow GET logged after the push");
    let mut c = RespConn::connect(addr);
    slow_get(&mut c);
    slow_get(&mut c);
    assert_eq!(
        c.call(&["SLOWLOG", "LEN"]),
        Resp::Int(1),
        "slowlog_max_len 1"
    );
    hot_gets(&mut c);
    let (_, hot) = http_get(admin.local_addr(), "/hotkeys");
    assert!(hot.contains("hot:one"), "sampling every key: {hot}");
    drop(admin);
    server.shutdown();
}

// === file descriptors: the admin endpoint's limits, RLIMIT_NOFILE, EMFILE on accept ===

/// The `respway` binary (`--workers 1`, `--admin` on a free port) under
/// `prlimit --nofile=SOFT:HARD`, on `yaml` whose first `127.0.0.1:0` becomes its RESP port;
/// (process, admin address). Its config lives in a scratch directory removed on drop.
struct Limited {
    proc: Proc,
    admin: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Limited {
    fn drop(&mut self) {
        self.proc.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn respway_limited(nofile: &str, yaml: &str) -> Limited {
    let port = free_port();
    let admin = loopback(free_port());
    let dir = std::env::temp_dir().join(format!("respway-nofile-{port}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let config = dir.join("respway.yaml");
    std::fs::write(
        &config,
        yaml.replacen("127.0.0.1:0", &format!("127.0.0.1:{port}"), 1),
    )
    .expect("config");
    let proc = Spawn::new("prlimit")
        .on_port(port)
        .arg(format!("--nofile={nofile}"))
        .arg(env!("CARGO_BIN_EXE_respway"))
        .arg("--config")
        .arg(&config)
        .args(["--workers", "1", "--admin", &admin.to_string()])
        .start();
    wait_port(admin, "admin");
    Limited { proc, admin, dir }
}

/// `PING` on a new connection, answered within `wait`?
fn pings(addr: SocketAddr, wait: Duration) -> Option<std::net::TcpStream> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(wait)).ok()?;
    s.write_all(b"*1\r\n$4\r\nPING\r\n").ok()?;
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).ok()?;
    (&buf == b"+PONG\r\n").then_some(s)
}

/// CPU time (user + system) process `pid` has used, from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = f[11] + f[12];
    let hz = String::from_utf8(
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .expect("getconf")
            .stdout,
    )
    .ok()
    .and_then(|s| s.trim().parse::<u64>().ok())
    .unwrap_or(100);
    Duration::from_millis(ticks * 1000 / hz)
}

/// More idle admin connections than the cap (each never sends a byte), in a process whose
/// whole descriptor limit is below what they would take uncapped: a new `/metrics` is still
/// answered and RESP clients still work; a headerless connection is closed after the
/// timeout.
#[test]
fn idle_admin_connections_are_capped_and_timed_out() {
    use std::io::Read;
    let shard = redis();
    let rw = respway_limited(
        "200:200",
        &sharded_yaml(&[shard.addr], "{ policy: maglev }", true),
    );
    let mut idle = Vec::new();
    for _ in 0..300 {
        match std::net::TcpStream::connect_timeout(&rw.admin, Duration::from_secs(2)) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("admin connect {}: {e}", idle.len()),
        }
    }
    // The admin thread has accepted them once it has closed all but the cap: each one past
    // it closes the oldest open (which may have been wait_port's probe, hence one fewer).
    let closed = |s: &std::net::TcpStream| {
        s.set_nonblocking(true).expect("nonblocking");
        let eof = match s.peek(&mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        s.set_nonblocking(false).expect("blocking");
        eof
    };
    let past_cap = idle.len() - respway::admin::MAX_CONNECTIONS - 1;
    wait_until(
        Duration::from_secs(30),
        "the admin thread to accept the idle connections (and close the oldest)",
        || idle.iter().filter(|s| closed(s)).count() >= past_cap,
    );
    let metrics = std::thread::spawn({
        let admin = rw.admin;
        move || http_get(admin, "/metrics")
    });
    let resp = pings(rw.proc.addr, Duration::from_secs(3));
    assert!(
        resp.is_some(),
        "a RESP client got no PONG with 300 idle admin connections; log:\n{}",
        rw.proc.log()
    );
    let start = Instant::now();
    let (status, body) = metrics.join().expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("respway_workers 1"), "{body}");
    // Not stretched by slack(): past the header timeout (10 s) it would also pass were /metrics
    // served only once the idle connections are closed.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "/metrics waited {:?} behind idle connections",
        start.elapsed()
    );
    drop(idle);
    // A connection that sends nothing is closed by respway after the header timeout (10 s).
    let mut s = std::net::TcpStream::connect(rw.admin).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let opened = Instant::now();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf);
    assert!(
        matches!(n, Ok(0))
            || matches!(&n, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "a headerless admin connection was not closed: {n:?} after {:?}",
        opened.elapsed()
    );
    eprintln!(
        "headerless admin connection closed after {:?}",
        opened.elapsed()
    );
    assert!(
        opened.elapsed() >= Duration::from_secs(5),
        "{:?}",
        opened.elapsed()
    );
}

/// Started with a low soft RLIMIT_NOFILE under a higher hard one, respway raises the soft
/// limit to the hard one and logs it.
#[test]
fn the_descriptor_limit_is_raised_to_the_hard_limit() {
    let shard = redis();
    let rw = respway_limited(
        "256:4096",
        &sharded_yaml(&[shard.addr], "{ policy: maglev }", true),
    );
    let limits =
        std::fs::read_to_string(format!("/proc/{}/limits", rw.proc.pid())).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((f[3], f[4]), ("4096", "4096"), "{line}");
    let log = rw.proc.log();
    assert!(
        log.lines().any(|l| l.contains("file descriptor limit")
            && l.contains("4096")
            && l.contains("256")),
        "{log}"
    );
}

/// Out of descriptors (hard limit 64), accept fails with EMFILE: respway does not spin (its CPU
/// time over 2 s stays far below 0.5 s), counts the failures, and serves new clients once
/// others close.
#[test]
fn accept_out_of_descriptors_backs_off_and_is_counted() {
    let shard = redis();
    let rw = respway_limited(
        "64:64",
        &sharded_yaml(&[shard.addr], "{ policy: maglev }", true),
    );
    let mut clients = Vec::new();
    let mut exhausted = false;
    for _ in 0..100 {
        match pings(rw.proc.addr, Duration::from_millis(500)) {
            Some(s) => clients.push(s),
            None => {
                exhausted = true;
                break;
            }
        }
    }
    assert!(exhausted, "100 clients and still no EMFILE");
    // An admin request now waits in the admin socket's backlog too.
    let metrics = std::thread::spawn({
        let admin = rw.admin;
        move || http_get(admin, "/metrics")
    });
    let pid = rw.proc.pid();
    let before = cpu_time(pid);
    // The interval the CPU time is measured over (time passing is the test).
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_time(pid) - before;
    eprintln!("CPU used over 2 s while out of descriptors: {used:?}");
    assert!(
        used < Duration::from_millis(500),
        "respway used {used:?} of CPU in 2 s while out of descriptors"
    );
    drop(clients);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pings(rw.proc.addr, Duration::from_secs(1)).is_none() {
        assert!(
            Instant::now() < deadline,
            "no new client served after the others closed"
        );
    }
    let (status, body) = metrics.join().expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text");
    let resp = counter(
        &scrape,
        "respway_accept_errors_total",
        &[("socket", "listeners"), ("reason", "emfile")],
    );
    assert!(resp >= 1.0, "{body}");
    let admin = counter(
        &scrape,
        "respway_accept_errors_total",
        &[("socket", "admin"), ("reason", "emfile")],
    );
    assert!(admin >= 1.0, "{body}");
    assert!(
        rw.proc.log().contains("Too many open files"),
        "{}",
        rw.proc.log()
    );
}

/// /config_dump is rendered from the model served, not from a file (issue 27, item 7): a
/// server started from a model that no file holds, then changed by an apply, dumps each
/// version so that it reads back to the model applied; `?include_defaults` too. An unknown
/// parameter is a 400 naming it.
#[test]
fn config_dump_renders_the_model_served_without_a_file() {
    // respway::start: this test's sidecar shares the process (see sharing_process).
    let _sharing = sharing_process();
    let (_shards, addrs) = three_shards();
    let mut config = respway_xds::default_config();
    config.listeners[0].address = "127.0.0.1:0".parse().unwrap();
    let shard = &mut config.clusters[0].shards[0];
    shard.endpoints[0].address = addrs[0];
    shard.hash_key = addrs[0].to_string();
    let server = respway::start(config.clone(), respway::Options::default()).expect("start");
    let admin =
        respway::admin::start("127.0.0.1:0".parse().unwrap(), false, &server).expect("admin");
    let dump = |query: &str| {
        let (status, body) = http_get(admin.local_addr(), &format!("/config_dump{query}"));
        assert_eq!(status, 200, "{body}");
        body
    };
    let reread = |text: &str| {
        let resources = respway_xds::parse_yaml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        respway_xds::translate(&resources).expect("translate")
    };
    let first = dump("");
    assert!(first.starts_with("# version: 1\n"), "{first}");
    assert_eq!(reread(&first), config, "{first}");

    // The same listener, on three ketama shards with whole keys hashed.
    let yaml = sharded_yaml(&addrs, "{ policy: ketama }", false)
        .replace("name: main\n    address", "name: default\n    address");
    let mut changed = respway_xds::parse_yaml(&yaml)
        .and_then(|r| respway_xds::translate(&r))
        .expect("config");
    changed.listeners[0].op_timeout = Duration::from_millis(1500);
    changed.clusters[0].db = 3;
    assert_eq!(server.apply(changed.clone()), Ok(2));
    for query in [
        "",
        "?include_defaults",
        "?format=yaml&include_defaults=true",
    ] {
        let text = dump(query);
        assert!(text.starts_with("# version: 2\n"), "{text}");
        assert!(text.contains("op_timeout: 1500ms\n"), "{text}");
        assert!(text.contains("policy: ketama\n"), "{text}");
        assert_eq!(reread(&text), changed, "{query}: {text}");
    }
    assert!(!dump("").contains("databases:"), "a default shown");
    assert!(dump("?include_defaults").contains("databases: 16\n"));

    let (status, body) = http_get(admin.local_addr(), "/config_dump?format=xml");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("format=xml"), "{body}");
    server.shutdown();
}

/// GET /metrics at `admin`, parsed; (scrape, body).
fn scrape_metrics(admin: SocketAddr) -> (prometheus_parse::Scrape, String) {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "{body}");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text");
    (scrape, body)
}

/// The value of the sample of `metric` with `labels`, if there is one.
fn value_of(
    scrape: &prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    match sample(scrape, metric, labels).first().map(|s| &s.value) {
        Some(
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v),
        ) => Some(*v),
        _ => None,
    }
}

/// The running binary's /metrics has, from its start: `respway_build_info` with the version
/// and the commit `respway --version` prints; `respway_config_changes_total` at 0 for each
/// source and outcome (1 applied from the file after a SIGHUP); the standard process metrics
/// agreeing with what /proc says of the process (its descriptor limit is 2000 here).
#[test]
fn process_build_and_config_metrics_are_there_from_the_start() {
    let shard = redis();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let rw = respway_limited(
        "1000:2000",
        &sharded_yaml(&[shard.addr], "{ policy: maglev }", true),
    );
    let mut c = RespConn::connect(rw.proc.addr);
    for i in 0..200 {
        assert_eq!(
            c.call(&["SET", &format!("k{i}"), "v"]),
            Resp::Simple("OK".into())
        );
    }
    let pid = rw.proc.pid();
    let cpu_before = cpu_time(pid).as_secs_f64();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .count() as f64;
    let (scrape, body) = scrape_metrics(rw.admin);
    let cpu_after = cpu_time(pid).as_secs_f64();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();

    let version = std::process::Command::new(env!("CARGO_BIN_EXE_respway"))
        .arg("--version")
        .output()
        .expect("respway --version");
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    let commit = version
        .split("(commit ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no commit in {version:?}"));
    assert_eq!(
        value_of(
            &scrape,
            "respway_build_info",
            &[("version", env!("CARGO_PKG_VERSION")), ("commit", commit)]
        ),
        Some(1.0),
        "respway --version: {version}\n{body}"
    );

    for source in ["file", "xds"] {
        for outcome in ["applied", "refused"] {
            assert_eq!(
                value_of(
                    &scrape,
                    "respway_config_changes_total",
                    &[("source", source), ("outcome", outcome)]
                ),
                Some(0.0),
                "{source} {outcome}\n{body}"
            );
        }
    }

    let get =
        |name: &str| value_of(&scrape, name, &[]).unwrap_or_else(|| panic!("no {name}\n{body}"));
    assert_eq!(get("process_max_fds"), 2000.0, "{body}");
    let open = get("process_open_fds");
    assert!(
        (open - fds).abs() <= 4.0,
        "process_open_fds {open}, /proc/{pid}/fd has {fds}"
    );
    let rss = get("process_resident_memory_bytes");
    let statm = rss_of(pid) as f64;
    assert!(
        rss > statm / 2.0 && rss < statm * 2.0,
        "process_resident_memory_bytes {rss}, statm says {statm}"
    );
    assert!(get("process_virtual_memory_bytes") >= rss, "{body}");
    let cpu = get("process_cpu_seconds_total");
    assert!(
        cpu >= cpu_before - 0.011 && cpu <= cpu_after + 0.011,
        "process_cpu_seconds_total {cpu}, /proc says {cpu_before}..{cpu_after}"
    );
    let start = get("process_start_time_seconds");
    assert!(
        start >= started - 2.0 && start <= now + 1.0,
        "process_start_time_seconds {start}, test started at {started}, now {now}"
    );

    rw.proc.signal("-HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (scrape, body) = scrape_metrics(rw.admin);
        let applied = value_of(
            &scrape,
            "respway_config_changes_total",
            &[("source", "file"), ("outcome", "applied")],
        );
        if applied == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no applied reload counted\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Per endpoint: the connections open now (`respway_upstream_connections`), connects and
/// failed connects with the endpoint label, and the requests written but not yet answered
/// (`respway_upstream_inflight_requests`): 5 GETs to a frozen (SIGSTOP) shard show as 5 in
/// flight until it is resumed; a killed shard shows 0 connections and its failed connects,
/// the others none.
#[test]
fn upstream_connections_and_in_flight_requests_are_shown_per_endpoint() {
    let (mut shards, addrs) = three_shards();
    let (rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    drive(rw.addr, 100);
    let ep = |i: usize| {
        [
            ("cluster", "main".to_string()),
            ("shard", format!("s{i}")),
            ("endpoint", addrs[i].to_string()),
        ]
    };
    let val = |scrape: &prometheus_parse::Scrape, name: &str, i: usize| {
        let l = ep(i);
        let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
        value_of(scrape, name, &l)
    };
    let (scrape, body) = scrape_metrics(admin.local_addr());
    for i in 0..3 {
        let open = val(&scrape, "respway_upstream_connections", i)
            .unwrap_or_else(|| panic!("no respway_upstream_connections for s{i}\n{body}"));
        assert!(open >= 1.0, "s{i}: {open} open\n{body}");
        let connects = val(&scrape, "respway_upstream_connects_total", i)
            .unwrap_or_else(|| panic!("no connects for s{i}\n{body}"));
        assert!(connects >= open, "s{i}: {connects} connects, {open} open");
        assert_eq!(
            val(&scrape, "respway_upstream_connect_failures_total", i),
            Some(0.0),
            "s{i}\n{body}"
        );
        assert_eq!(
            val(&scrape, "respway_upstream_inflight_requests", i),
            Some(0.0),
            "s{i}\n{body}"
        );
    }

    // Five GETs in flight to a frozen shard (keys that landed on s1), sent on the client
    // connection that wrote them: its worker has a live connection to s1 to write them on (a
    // client on the other worker could need a connect, which a frozen shard never answers,
    // so its GETs would wait queued, not in flight).
    let mut c = RespConn::connect(rw.addr);
    let keys: Vec<String> = {
        let mut s1 = RespConn::connect(addrs[1]);
        let mut keys = Vec::new();
        for i in 0..200 {
            let k = format!("frozen{i}");
            assert_eq!(c.call(&["SET", &k, "v"]), Resp::Simple("OK".into()));
            if s1.call(&["EXISTS", &k]) == Resp::Int(1) {
                keys.push(k);
            }
            if keys.len() == 5 {
                break;
            }
        }
        keys
    };
    assert_eq!(keys.len(), 5, "keys of s1: {keys:?}");
    shards[1].signal("-STOP");
    let cmds: Vec<Vec<String>> = keys.iter().map(|k| vec!["GET".into(), k.clone()]).collect();
    c.send_pipeline(&cmds);
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut seen = None;
    while Instant::now() < deadline {
        seen = val(
            &scrape_metrics(admin.local_addr()).0,
            "respway_upstream_inflight_requests",
            1,
        );
        if seen == Some(5.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    shards[1].signal("-CONT");
    assert_eq!(seen, Some(5.0), "in flight to the frozen shard");
    for _ in 0..5 {
        c.read().expect("reply");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while val(
        &scrape_metrics(admin.local_addr()).0,
        "respway_upstream_inflight_requests",
        1,
    ) != Some(0.0)
    {
        assert!(
            Instant::now() < deadline,
            "still in flight after the shard resumed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A killed shard: no connection open, failed connects counted on its endpoint only.
    shards[2].kill();
    let mut c = RespConn::connect(rw.addr);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for i in 0..50 {
            let _ = c.call(&["GET", &format!("dead{i}")]);
        }
        let (scrape, body) = scrape_metrics(admin.local_addr());
        let open = val(&scrape, "respway_upstream_connections", 2);
        let failed = val(&scrape, "respway_upstream_connect_failures_total", 2).unwrap_or(0.0);
        if open == Some(0.0) && failed >= 1.0 {
            for i in 0..2 {
                assert_eq!(
                    val(&scrape, "respway_upstream_connect_failures_total", i),
                    Some(0.0),
                    "s{i}\n{body}"
                );
                assert!(
                    val(&scrape, "respway_upstream_connections", i) >= Some(1.0),
                    "s{i}\n{body}"
                );
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "s2 dead: {open:?} open, {failed} failed connects\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// /metrics stays small under a broad command mix (40 distinct commands): per command only
/// counters (calls, errors, time); latency histograms per listener and command family (read,
/// write, blocking, connection, other) with the fine buckets (p99.99 within a bucket of a
/// quarter of its value).
#[test]
fn metrics_stay_small_under_a_broad_command_mix() {
    let (_shards, addrs) = three_shards();
    let (rw, admin) = with_admin(&sharded_yaml(&addrs, "{ policy: maglev }", true));
    drive(rw.addr, 50);
    let mut c = RespConn::connect(rw.addr);
    let mix: &[&[&str]] = &[
        &["PING"],
        &["ECHO", "x"],
        &["HELLO", "2"],
        &["HELLO", "4"],
        &["CLIENT", "SETNAME", "n"],
        &["SELECT", "0"],
        &["EXISTS", "a"],
        &["DEL", "a"],
        &["EXPIRE", "a", "10"],
        &["TTL", "a"],
        &["TYPE", "a"],
        &["APPEND", "a", "b"],
        &["STRLEN", "a"],
        &["MGET", "a", "b"],
        &["MSET", "a", "1", "b", "2"],
        &["INCRBY", "c", "2"],
        &["DECR", "c"],
        &["HSET", "h", "f", "v"],
        &["HGET", "h", "f"],
        &["HGETALL", "h"],
        &["HDEL", "h", "f"],
        &["LPUSH", "l", "a"],
        &["RPUSH", "l", "b"],
        &["LRANGE", "l", "0", "-1"],
        &["LPOP", "l"],
        &["RPOP", "l"],
        &["SADD", "s", "a"],
        &["SMEMBERS", "s"],
        &["SREM", "s", "a"],
        &["ZADD", "z", "1", "a"],
        &["ZRANGE", "z", "0", "-1"],
        &["ZSCORE", "z", "a"],
        &["ZREM", "z", "a"],
        &["BLPOP", "bl", "0.01"],
        &["GETSET", "a", "b"],
        &["SETEX", "e", "10", "v"],
        &["PEXPIRE", "e", "10000"],
        &["INFO", "server"],
        &["EVAL", "return 1", "0"],
    ];
    for cmd in mix {
        for _ in 0..3 {
            c.call(cmd);
        }
    }
    let (scrape, body) = scrape_metrics(admin.local_addr());
    let seen = sample(&scrape, "respway_commands_total", &[("listener", "main")]).len();
    assert!(seen >= 40, "{seen} commands counted\n{body}");
    let lines = body.lines().count();
    eprintln!("/metrics: {lines} lines for {seen} commands seen");
    // Every command keeps its counters, with its family.
    assert_eq!(
        value_of(
            &scrape,
            "respway_commands_total",
            &[
                ("listener", "main"),
                ("command", "hget"),
                ("family", "read")
            ]
        ),
        Some(3.0),
        "{body}"
    );
    assert_eq!(
        value_of(
            &scrape,
            "respway_command_errors_total",
            &[
                ("listener", "main"),
                ("command", "hello"),
                ("family", "connection")
            ]
        ),
        Some(3.0),
        "HELLO 4 is refused\n{body}"
    );
    assert!(
        value_of(
            &scrape,
            "respway_command_seconds_total",
            &[
                ("listener", "main"),
                ("command", "blpop"),
                ("family", "blocking")
            ]
        )
        .is_some_and(|s| s >= 0.02),
        "{body}"
    );
    // No latency histogram per command; one per family, with fine buckets.
    assert!(
        sample(
            &scrape,
            "respway_command_duration_seconds",
            &[("command", "get")]
        )
        .is_empty(),
        "per-command histograms\n{body}"
    );
    for fam in ["read", "write", "blocking", "connection", "other"] {
        match sample(
            &scrape,
            "respway_command_duration_seconds",
            &[("listener", "main"), ("family", fam)],
        )
        .first()
        .map(|s| &s.value)
        {
            Some(prometheus_parse::Value::Histogram(b)) => {
                assert!(b.len() > 60, "{fam}: {} buckets", b.len());
            }
            other => panic!("{fam}: {other:?}\n{body}"),
        }
    }
    let latency_lines = body
        .lines()
        .filter(|l| l.starts_with("respway_command_duration_seconds"))
        .count();
    assert!(
        latency_lines <= 5 * 73,
        "{latency_lines} lines of command latency histograms"
    );
    // Before: 3,398 lines here (70 buckets for each of the 41 commands).
    assert!(lines < 1500, "/metrics has {lines} lines");
}

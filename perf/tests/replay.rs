//! Recorded and generated traffic against a real redis-server: MONITOR captures replay to
//! the expected keys and values (binary escapes included), live recording round-trips, and
//! both drivers run clean.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use respway_perf::closed::{run_closed, ClosedConfig};
use respway_perf::open::{run_open, Arrival, ListSchedule, OpenConfig, RateSchedule};
use respway_perf::record::{record, RecordConfig};
use respway_perf::replay::{DbMode, ReplayPlan};
use respway_perf::trace::{self, read_monitor, ReadOptions};
use respway_perf::workload::{generate_pools, kind_names, Cmd, Workload};
use respway_perf::Control;
use respway_testkit::{redis, slack, wait_until, FakeMode, FakeShard, Resp, RespConn};

use crate::support::starting_children;

/// A capture as `redis-cli MONITOR` prints it: quoting, binary escapes, several clients, a
/// Lua line (skipped: the EVAL would run it), a SUBSCRIBE (never replayed).
const CAPTURE: &str = r#"OK
1700000000.000100 [0 127.0.0.1:50001] "SET" "bin:key" "\x00\x01\xfe\xff\r\n\t\"quoted\" \\ end"
1700000000.000200 [0 127.0.0.1:50002] "HSET" "h:1" "field one" "va'lue"
1700000000.000300 [0 127.0.0.1:50001] "SET" "seq" "a"
1700000000.000400 [0 127.0.0.1:50001] "APPEND" "seq" "b"
1700000000.000450 [0 lua] "SET" "from:lua" "x"
1700000000.000500 [0 127.0.0.1:50003] "LPUSH" "list" "one"
1700000000.000600 [0 127.0.0.1:50003] "LPUSH" "list" "two"
1700000000.000700 [0 127.0.0.1:50001] "APPEND" "seq" "c"
1700000000.000800 [0 127.0.0.1:50002] "INCR" "ctr"
1700000000.000900 [0 127.0.0.1:50002] "INCR" "ctr"
1700000000.001000 [0 127.0.0.1:50004] "subscribe" "chan"
1700000000.001100 [0 127.0.0.1:50002] "set" "caf\xc3\xa9" "\xe2\x82\xac"
"#;

/// One command on a fresh connection, and its reply.
fn cmd(addr: SocketAddr, args: &[&[u8]]) -> Resp {
    RespConn::connect(addr).call_bytes(args)
}

/// `GET key` on a fresh connection (`None` for nil).
fn get(addr: SocketAddr, key: &[u8]) -> Option<Vec<u8>> {
    RespConn::connect(addr).get(key)
}

fn check_replayed(r: SocketAddr) {
    assert_eq!(
        get(r, b"bin:key").as_deref(),
        Some(&b"\x00\x01\xfe\xff\r\n\t\"quoted\" \\ end"[..])
    );
    assert_eq!(
        get(r, b"seq").as_deref(),
        Some(&b"abc"[..]),
        "per-client order kept"
    );
    assert_eq!(get(r, b"ctr").as_deref(), Some(&b"2"[..]));
    assert_eq!(get(r, "café".as_bytes()).as_deref(), Some("€".as_bytes()));
    assert_eq!(
        get(r, b"from:lua"),
        None,
        "Lua-run commands are not replayed"
    );
    assert_eq!(
        cmd(r, &[b"HGET", b"h:1", b"field one"]),
        Resp::bulk("va'lue")
    );
    assert_eq!(
        cmd(r, &[b"LRANGE", b"list", b"0", b"-1"]),
        Resp::Array(Some(vec![Resp::bulk("two"), Resp::bulk("one")]))
    );
}

#[test]
fn monitor_capture_replays_as_fast_as_possible() {
    // Starts redis-server children, which compare's tests may not see.
    let _children = starting_children();
    let t = read_monitor(CAPTURE.as_bytes(), &ReadOptions::default()).unwrap();
    assert_eq!(t.events.len(), 10);
    assert_eq!(t.clients, 3);
    assert_eq!(t.skipped["lua"], 1);
    assert_eq!(t.skipped["never replayed: subscribe"], 1);
    let plan = ReplayPlan::new(&t, 64, DbMode::Ignore);
    let r = redis();
    let rec = run_closed(
        &ClosedConfig {
            addr: r.addr,
            connections: plan.pools.len(),
            pipeline: 4,
            threads: 1,
            duration: Duration::from_secs(10),
            max_requests: plan.len() as u64,
            cycle: false,
            reply_timeout: Duration::from_secs(5),
            interval: Duration::from_millis(100),
        },
        Arc::new(plan.pools.clone()),
        &Control::new(),
    )
    .unwrap();
    assert_eq!(rec.replies, 10);
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    check_replayed(r.addr);
}

#[test]
fn monitor_capture_replays_with_its_timing_via_the_trace_format() {
    // Starts redis-server children, which compare's tests may not see.
    let _children = starting_children();
    // MONITOR text -> respway trace -> read back -> timed replay at 10x.
    let t = read_monitor(CAPTURE.as_bytes(), &ReadOptions::default()).unwrap();
    let mut text = Vec::new();
    trace::write_trace(&mut text, &t).unwrap();
    let back = trace::read_trace(&text[..], &ReadOptions::default()).unwrap();
    assert_eq!(back.events, t.events);
    let plan = ReplayPlan::new(&back, 2, DbMode::Ignore);
    assert_eq!(plan.pools.len(), 2);
    let r = redis();
    let mut sched = ListSchedule::new(plan.timed(10.0));
    let rec = run_open(
        &OpenConfig {
            addr: r.addr,
            duration: Duration::from_secs(5),
            max_requests: plan.len() as u64,
            drain: Duration::from_secs(2),
            interval: Duration::from_millis(100),
        },
        Arc::new(plan.pools.clone()),
        &mut sched,
        &Control::new(),
    )
    .unwrap();
    assert_eq!(rec.replies, 10);
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    check_replayed(r.addr);
}

#[test]
fn live_recording_replays_onto_another_server() {
    // Starts redis-server children, which compare's tests may not see.
    let _children = starting_children();
    let src = redis();
    let dst = redis();
    let addr = src.addr;
    let recorder = std::thread::spawn(move || {
        record(
            &RecordConfig {
                addr,
                duration: Duration::from_millis(1500),
                max_commands: 6,
                include_lua: false,
            },
            &Control::new(),
        )
    });
    // The recorder's MONITOR is attached before anything is sent.
    wait_until(Duration::from_secs(5), "the recorder's MONITOR", || {
        RespConn::connect(src.addr)
            .call(&["CLIENT", "LIST"])
            .text()
            .contains("cmd=monitor")
    });
    cmd(src.addr, &[b"SET", b"k1", b"v\x001"]);
    cmd(src.addr, &[b"SELECT", b"0"]);
    cmd(src.addr, &[b"RPUSH", b"l", b"a", b"b"]);
    cmd(src.addr, &[b"HSET", b"h", b"f", b"v"]);
    let t = recorder.join().unwrap().unwrap();
    let names: Vec<Vec<u8>> = t
        .events
        .iter()
        .map(|e| e.args[0].to_ascii_uppercase())
        .collect();
    assert_eq!(
        names,
        vec![
            b"SET".to_vec(),
            b"SELECT".to_vec(),
            b"RPUSH".to_vec(),
            b"HSET".to_vec()
        ]
    );
    let plan = ReplayPlan::new(&t, 8, DbMode::Ignore);
    let rec = run_closed(
        &ClosedConfig {
            addr: dst.addr,
            connections: plan.pools.len(),
            pipeline: 1,
            threads: 1,
            duration: Duration::from_secs(5),
            max_requests: plan.len() as u64,
            cycle: false,
            reply_timeout: Duration::from_secs(5),
            interval: Duration::from_millis(100),
        },
        Arc::new(plan.pools),
        &Control::new(),
    )
    .unwrap();
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    assert_eq!(get(dst.addr, b"k1").as_deref(), Some(&b"v\x001"[..]));
    assert_eq!(cmd(dst.addr, &[b"LLEN", b"l"]), Resp::Int(2));
    assert_eq!(cmd(dst.addr, &[b"HGET", b"h", b"f"]), Resp::bulk("v"));
}

#[test]
fn generated_traffic_runs_closed_and_open_loop_without_errors() {
    // Starts redis-server children, which compare's tests may not see.
    let _children = starting_children();
    let r = redis();
    let w = Workload {
        keyspace: 1000,
        commands: Cmd::ALL.iter().map(|&c| (c, 1.0)).collect(),
        ..Workload::default()
    };
    let pools = Arc::new(generate_pools(&w, 4, 256, 8).unwrap());
    let closed = run_closed(
        &ClosedConfig {
            addr: r.addr,
            connections: 4,
            pipeline: 8,
            threads: 2,
            duration: Duration::from_millis(500),
            max_requests: 20_000,
            cycle: true,
            reply_timeout: Duration::from_secs(5),
            interval: Duration::from_millis(100),
        },
        Arc::clone(&pools),
        &Control::new(),
    )
    .unwrap();
    assert!(closed.errors.is_empty(), "{:?}", closed.errors);
    assert!(closed.replies > 1000, "{}", closed.replies);
    assert_eq!(closed.replies, closed.sent);
    let s = closed.summary(&kind_names());
    assert_eq!(
        s.by_command.len(),
        Cmd::ALL.len(),
        "{:?}",
        s.by_command.keys()
    );

    let lens = pools.iter().map(|p| p.len()).collect();
    let mut sched = RateSchedule::new(2000.0, Arrival::Poisson, 1, lens);
    let open = run_open(
        &OpenConfig {
            addr: r.addr,
            duration: Duration::from_secs(1),
            max_requests: 1_000_000,
            drain: Duration::from_secs(2),
            interval: Duration::from_millis(100),
        },
        pools,
        &mut sched,
        &Control::new(),
    )
    .unwrap();
    assert!(open.errors.is_empty(), "{:?}", open.errors);
    assert!((1500..2500).contains(&open.replies), "{}", open.replies);
    assert_eq!(open.replies, open.sent);
    let s = open.summary(&kind_names());
    let service = s.service_latency.unwrap();
    assert!(
        s.latency.p50 >= service.p50,
        "latency counts from the intended send time"
    );
}

#[test]
fn a_silent_target_gives_timeouts_not_a_hang() {
    // Accepts connections, reads and never answers.
    let silent = FakeShard::start(|_| FakeMode::Silent);
    let addr = silent.addr;
    let pools = Arc::new(generate_pools(&Workload::default(), 2, 64, 4).unwrap());
    let t0 = std::time::Instant::now();
    let closed = run_closed(
        &ClosedConfig {
            addr,
            connections: 2,
            pipeline: 4,
            threads: 1,
            // A hang would last this long: stretched with the bound below, which tells it apart.
            duration: slack(Duration::from_secs(10)),
            max_requests: 1000,
            cycle: true,
            reply_timeout: Duration::from_millis(300),
            interval: Duration::from_millis(100),
        },
        Arc::clone(&pools),
        &Control::new(),
    )
    .unwrap();
    assert!(
        t0.elapsed() < slack(Duration::from_secs(3)),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(closed.replies, 0);
    assert_eq!(closed.sent, 8, "one batch per connection");
    assert_eq!(
        closed.errors.get(respway_perf::stats::ERR_TIMEOUT),
        Some(&8)
    );

    let lens = pools.iter().map(|p| p.len()).collect();
    let mut sched = RateSchedule::new(100.0, Arrival::Uniform, 1, lens);
    let open = run_open(
        &OpenConfig {
            addr,
            duration: Duration::from_millis(300),
            max_requests: 1000,
            drain: Duration::from_millis(300),
            interval: Duration::from_millis(100),
        },
        pools,
        &mut sched,
        &Control::new(),
    )
    .unwrap();
    assert_eq!(open.replies, 0);
    assert_eq!(open.sent, 30);
    assert_eq!(open.errors.get(respway_perf::stats::ERR_TIMEOUT), Some(&30));
    drop(silent);
}

//! `respway-xds reshard` end to end: the real `respway-xds` binary serving a resource directory,
//! two real sidecars fed by it (one listener file each, as two sidecars on one host need), real
//! redis-server shards, and the real mover (`respway-compare`, next to `respway-xds`). A 2 -> 4
//! move of keys written before; the same with the tool killed while the mover runs, then
//! resumed; and the gate: a sidecar that is not connected, or NACKs, stops the phase.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use respway_filters::hash::ShardPicker;
use respway_filters::routing::Routing;

const TOKEN: &str = "reshard-test-token";

/// One deployment: shards, a management server over `res/`, two sidecars (zones z1 and z2).
pub(crate) struct Env {
    shards: Vec<Proc>,
    pub(crate) work: PathBuf,
    admin: String,
    grpc: u16,
    /// Kept running until the test ends.
    _xds: Proc,
    sidecars: Vec<Option<Proc>>,
    ports: Vec<u16>,
    old: Arc<dyn ShardPicker>,
    new: Arc<dyn ShardPicker>,
}

pub(crate) fn shards_yaml(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| format!("      - endpoints: [{{ address: \"{a}\" }}]\n"))
        .collect()
}

fn clusters_yaml(old: &[SocketAddr], new: &[SocketAddr]) -> String {
    format!(
        "clusters:\n  - name: old\n    hash: {{ policy: ketama }}\n    shards:\n{}\
         \x20 - name: new\n    hash: {{ policy: ketama }}\n    shards:\n{}",
        shards_yaml(old),
        shards_yaml(new)
    )
}

/// The listener's routes in most tests: everything on `old`.
const CATCH_ALL: &str = "{ catch_all: old }";

fn listener_yaml(zone: &str, port: u16, routes: &str) -> String {
    format!(
        "targets: {{ zones: [{zone}] }}\nlisteners:\n  - name: main\n    address: 127.0.0.1:{port}\n    routes: {routes}\n"
    )
}

impl Env {
    /// `n_old` shards for `old`, `n_new` (the same first ones, then more) for `new`.
    pub(crate) fn start(n_old: usize, n_new: usize) -> Env {
        Env::start_routes(n_old, n_new, CATCH_ALL)
    }

    /// [`Env::start`] with the listener's `routes` (YAML).
    fn start_routes(n_old: usize, n_new: usize, routes: &str) -> Env {
        let shards: Vec<Proc> = (0..n_new).map(|_| redis()).collect();
        let addrs: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
        let work = std::env::temp_dir().join(format!(
            "respway-reshard-{}-{}",
            std::process::id(),
            addrs[0].port()
        ));
        let res = work.join("res");
        std::fs::create_dir_all(&res).unwrap();
        std::fs::write(work.join("token"), TOKEN).unwrap();
        let ports = vec![free_port(), free_port()];
        let files = [
            ("clusters.yaml", clusters_yaml(&addrs[..n_old], &addrs)),
            ("zone-z1.yaml", listener_yaml("z1", ports[0], routes)),
            ("zone-z2.yaml", listener_yaml("z2", ports[1], routes)),
        ];
        for (name, text) in &files {
            // The operator's copies (what `reshard --file` reads) and the served ones.
            std::fs::write(work.join(name), text).unwrap();
            std::fs::write(res.join(name), text).unwrap();
        }
        let (grpc, admin) = (free_port(), free_port());
        let xds = Spawn::new(respway_xds_bin())
            .args(["serve", "--resources", res.to_str().unwrap()])
            .args(["--listen", &format!("127.0.0.1:{grpc}")])
            .args(["--admin", &format!("127.0.0.1:{admin}"), "--poll-ms", "50"])
            .env("RESPWAY_XDS_ADMIN_TOKEN_FILE", work.join("token"))
            .on_port(grpc)
            .start();
        wait_port(loopback(admin), "respway-xds admin");
        let model = respway_xds::load_file(&write_static(&work, &files[0].1)).expect("valid");
        let routing = Routing::build(&model, &model.listeners[0]).expect("routing");
        let mut env = Env {
            shards,
            admin: format!("127.0.0.1:{admin}"),
            grpc,
            _xds: xds,
            sidecars: vec![None, None],
            ports,
            old: routing.clusters[0].picker.clone(),
            new: routing.clusters[1].picker.clone(),
            work,
        };
        env.start_sidecar(0);
        env.start_sidecar(1);
        env
    }

    fn start_sidecar(&mut self, i: usize) {
        let boot = self.work.join(format!("bootstrap-{i}.yaml"));
        std::fs::write(
            &boot,
            format!(
                "node: {{ id: sidecar-{}, zone: z{} }}\nxds: {{ server: \"http://127.0.0.1:{}\" }}\n",
                i + 1,
                i + 1,
                self.grpc
            ),
        )
        .unwrap();
        self.sidecars[i] = Some(
            Spawn::new(env!("CARGO_BIN_EXE_respway"))
                .args(["--bootstrap", boot.to_str().unwrap(), "--workers", "1"])
                .env("RUST_LOG", "warn")
                .on_port(self.ports[i])
                .start(),
        );
    }

    fn file(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    /// `respway-xds reshard ARGS` (with the admin token), to its end.
    fn reshard(&self, args: &[&str]) -> Output {
        let mut cmd = self.reshard_cmd(args);
        let child = cmd.spawn().expect("start respway-xds reshard");
        wait_bounded(child, Duration::from_secs(120))
    }

    pub(crate) fn reshard_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(respway_xds_bin());
        cmd.arg("reshard")
            .args(args)
            .env("RESPWAY_XDS_ADMIN_TOKEN_FILE", self.work.join("token"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// `reshard start` of the catch-all route from `old` to `new`, with every file.
    pub(crate) fn start_args(&self, state: &Path, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = ["start", "--admin", &self.admin, "--listener", "main"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for f in ["clusters.yaml", "zone-z1.yaml", "zone-z2.yaml"] {
            a.extend(["--file".to_string(), self.file(f).display().to_string()]);
        }
        a.extend(
            ["--from", "old", "--to", "new", "--state"]
                .iter()
                .map(|s| s.to_string()),
        );
        a.push(state.display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn status(&self) -> respway_xds::server::ServerStatus {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(respway_xds::admin::fetch_status(
            &self.admin,
            &respway_xds::admin::AdminAuth::token(TOKEN),
        ))
        .expect("GET /status")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// A static file holding the clusters (to build their pickers as the sidecar does).
fn write_static(work: &Path, clusters: &str) -> PathBuf {
    let p = work.join("static.yaml");
    std::fs::write(
        &p,
        format!(
            "listeners:\n  - name: main\n    address: 127.0.0.1:1\n    routes: {{ catch_all: old }}\n{clusters}"
        ),
    )
    .unwrap();
    p
}

pub(crate) fn wait_bounded(mut child: std::process::Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "respway-xds reshard ran over {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The test data: strings (every 5th with a TTL) and lists, written to their owners in `old`.
const KEYS: usize = 3000;

fn key(i: usize) -> String {
    if i % 10 == 9 {
        format!("list:{i}")
    } else {
        format!("k:{i}")
    }
}

pub(crate) fn fill(env: &Env) {
    let mut conns: Vec<RespConn> = env
        .shards
        .iter()
        .map(|s| RespConn::connect(s.addr))
        .collect();
    let mut batches: Vec<Vec<Vec<String>>> = vec![Vec::new(); conns.len()];
    for i in 0..KEYS {
        let k = key(i);
        let shard = env.old.pick(k.as_bytes());
        let cmd: Vec<String> = if k.starts_with("list:") {
            vec!["RPUSH".into(), k, format!("a{i}"), format!("b{i}")]
        } else if i % 5 == 0 {
            vec![
                "SET".into(),
                k,
                format!("v{i}"),
                "PX".into(),
                "600000".into(),
            ]
        } else {
            vec!["SET".into(), k, format!("v{i}")]
        };
        batches[shard].push(cmd);
    }
    for (c, batch) in conns.iter_mut().zip(&batches) {
        c.send_pipeline(batch);
        for _ in batch {
            let r = c.read().expect("reply");
            assert!(!r.is_error(), "{r:?}");
        }
    }
}

/// Every key on its owner in `new` only, with its value and TTL; reads through both sidecars.
fn check_moved(env: &Env) {
    check_placed(env, &env.new);
}

/// Every key on its owner by `picker` only, with its value and TTL; reads through both
/// sidecars.
fn check_placed(env: &Env, picker: &Arc<dyn ShardPicker>) {
    let mut conns: Vec<RespConn> = env
        .shards
        .iter()
        .map(|s| RespConn::connect(s.addr))
        .collect();
    let total: u64 = env.shards.iter().map(|s| dbsize(s.addr)).sum();
    assert_eq!(
        total, KEYS as u64,
        "keys on the shards (none twice, none lost)"
    );
    for i in 0..KEYS {
        let k = key(i);
        let owner = picker.pick(k.as_bytes());
        let c = &mut conns[owner];
        if k.starts_with("list:") {
            let r = c.call(&["LRANGE", &k, "0", "-1"]);
            assert_eq!(
                r,
                Resp::Array(Some(vec![
                    Resp::bulk(format!("a{i}")),
                    Resp::bulk(format!("b{i}"))
                ])),
                "{k} on shard {owner}"
            );
        } else {
            assert_eq!(
                c.get(&k),
                Some(format!("v{i}").into_bytes()),
                "{k} on shard {owner}"
            );
            let pttl = match c.call(&["PTTL", &k]) {
                Resp::Int(n) => n,
                r => panic!("PTTL {k}: {r:?}"),
            };
            if i % 5 == 0 {
                assert!(pttl > 500_000 && pttl <= 600_000, "{k}: PTTL {pttl}");
            } else {
                assert_eq!(pttl, -1, "{k}");
            }
        }
    }
    for s in env.sidecars.iter().flatten() {
        let mut c = RespConn::connect(s.addr);
        for i in (0..KEYS).step_by(7).filter(|i| i % 10 != 9) {
            assert_eq!(
                c.get(key(i)),
                Some(format!("v{i}").into_bytes()),
                "through {}",
                s.addr
            );
        }
    }
}

/// The final files served and ACKed by both sidecars: the route on `new`, no mirror.
fn check_final(env: &Env) {
    for z in ["zone-z1.yaml", "zone-z2.yaml"] {
        let served = std::fs::read_to_string(env.work.join("res").join(z)).unwrap();
        assert!(served.contains("catch_all: new"), "{z}:\n{served}");
        assert!(!served.contains("mirrors"), "{z}:\n{served}");
    }
    let s = env.status();
    for id in ["sidecar-1", "sidecar-2"] {
        let n = s.nodes.iter().find(|n| n.id == id).expect("node");
        let lds = &n.types[respway_xds::LISTENER_TYPE_URL];
        assert!(
            n.connected && n.generation == s.version && lds.sent.is_some() && lds.acked == lds.sent,
            "{id}: {n:?}"
        );
    }
}

/// `reshard start --yes`: plan, move mode, every key moved, the final route; both sidecars
/// ACK every phase.
#[test]
fn reshard_moves_every_key_to_its_new_owner_and_ends_on_the_new_cluster() {
    let env = Env::start(2, 4);
    fill(&env);
    let state = env.work.join("state.json");
    let args = env.start_args(&state, &["--yes"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.reshard(&args);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in [
        "phase 0/4: plan of the move of listener \"main\" catch_all from old to new",
        "phase 1/4: prepare_move pushed (listener \"main\" catch_all: old; commands on keys moving to new refused until every sidecar moves keys)",
        "phase 2/4: move mode pushed (listener \"main\" catch_all: old, keys moving to new)",
        "every sidecar ACKed version",
        "phase 3/4: moving the keys from old to new",
        "done: listener \"main\" catch_all is on new, every key moved",
    ] {
        assert!(stdout.contains(line), "{line}\n{}", text(&out));
    }
    check_moved(&env);
    check_final(&env);
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(st["phase"], "done");
    // Run again on the same state: nothing left to do.
    let again = env.reshard(&args);
    assert!(again.status.success(), "{}", text(&again));
    let status = env.reshard(&["status", "--state", state.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("phase done"),
        "{}",
        text(&status)
    );
}

/// The tool killed (SIGKILL) while the mover runs, then `resume`: the mover it left is
/// stopped, move mode is pushed and ACKed again before a new mover runs, and the end is the
/// same.
#[test]
fn reshard_killed_while_moving_resumes_to_the_same_end() {
    let env = Env::start(2, 4);
    fill(&env);
    let state = env.work.join("state.json");
    let args = env.start_args(&state, &["--yes", "--rate", "300"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = env.reshard_cmd(&args).spawn().expect("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = std::fs::read_to_string(&state).unwrap_or_default();
        if st.contains("\"move_acked\"")
            && st.contains("\"mover_pid\": ")
            && !st.contains("\"mover_pid\": null")
        {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended before the mover ran"
        );
        assert!(Instant::now() < deadline, "the mover never started: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Killed while moving: the mover runs 1.5 s first (the timeline of the scenario).
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    let _ = child.wait();
    let out = env.reshard(&["resume", "--state", state.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("resuming from"), "{}", text(&out));
    assert!(
        stdout.contains("phase 2/4: move mode pushed"),
        "{}",
        text(&out)
    );
    check_moved(&env);
    check_final(&env);
}

/// The gate: a sidecar that is not connected keeps the phase waiting until the timeout, which
/// names it; one that NACKs stops the phase at once with its message. The mover never runs.
#[test]
fn a_sidecar_not_connected_or_nacking_stops_the_phase_before_any_key_moves() {
    let mut env = Env::start(1, 2);
    fill(&env);
    // sidecar-2 gone: the timeout names it.
    env.sidecars[1] = None;
    let state = env.work.join("state.json");
    let args = env.start_args(&state, &["--yes", "--ack-timeout", "2"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.reshard(&args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("not every sidecar ACKed in time; waiting for:\n  sidecar-2: not connected"),
        "{}",
        text(&out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("phase 2/4"),
        "{}",
        text(&out)
    );
    let total: u64 = env.shards.iter().map(|s| dbsize(s.addr)).sum();
    assert_eq!(dbsize(env.shards[0].addr), total, "no key moved");
    // Issue 43, item 4: phase 1 is rolled back, so sidecar-1, which ACKed prepare_move, serves
    // every key again instead of refusing those that would move (TRYAGAIN) until someone
    // runs resume or abort; the stop says so.
    let mut c = RespConn::connect(SocketAddr::from(([127, 0, 0, 1], env.ports[0])));
    wait_until(
        slack(Duration::from_secs(5)),
        "sidecar-1 to serve every key again (no TRYAGAIN)",
        || {
            !(0..KEYS).any(|i| {
                matches!(c.call(&["TYPE", &key(i)]), Resp::Error(e) if e.starts_with("TRYAGAIN"))
            })
        },
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("phase 1/4 rolled back: the original files pushed again"),
        "{}",
        text(&out)
    );
    assert!(
        stderr.contains("phase 1 was rolled back (version ")
            && stderr.contains("`respway-xds reshard resume` pushes phase 1 again"),
        "{}",
        text(&out)
    );
    let status = env.reshard(&["status", "--state", state.to_str().unwrap()]);
    let st = String::from_utf8_lossy(&status.stdout);
    assert!(
        st.contains("node sidecar-2: waiting: not connected"),
        "{}",
        text(&status)
    );
    assert!(
        st.contains("stopped: not every sidecar ACKed in time"),
        "{}",
        text(&status)
    );
    // It comes back, but with a listener file it cannot take (a new listener: running
    // sidecars refuse a change to their set of listeners): it NACKs.
    env.start_sidecar(1);
    let extra = format!(
        "{}  - name: extra\n    address: 127.0.0.1:{}\n    routes: {{ catch_all: old }}\n",
        listener_yaml("z2", env.ports[1], CATCH_ALL),
        free_port()
    );
    std::fs::write(env.file("zone-z2.yaml"), &extra).unwrap();
    std::fs::write(env.work.join("res/zone-z2.yaml"), &extra).unwrap();
    let state2 = env.work.join("state2.json");
    let args = env.start_args(&state2, &["--yes", "--ack-timeout", "20"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let out = env.reshard(&args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // Not stretched by slack(): the ACK timeout (20 s) is what a NACK must not wait for.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a NACK stops at once"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sidecar sidecar-2 NACKed the configuration (it keeps its previous one): "),
        "{}",
        text(&out)
    );
    assert_eq!(dbsize(env.shards[0].addr), total, "no key moved");
}

/// `pause` stops the mover and the run (exit 3), `status` says where it is, and `abort` moves
/// the keys already moved back (move mode towards `old`, the mover from `new`), then serves
/// the original files: every key on its old owner, both sidecars on them.
#[test]
fn reshard_paused_then_aborted_ends_with_every_key_back_on_the_old_cluster() {
    let env = Env::start(2, 4);
    fill(&env);
    let state = env.work.join("state.json");
    let args = env.start_args(&state, &["--yes", "--rate", "300"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = env.reshard_cmd(&args).spawn().expect("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = std::fs::read_to_string(&state).unwrap_or_default();
        if st.contains("\"mover_pid\": ") && !st.contains("\"mover_pid\": null") {
            break;
        }
        assert!(Instant::now() < deadline, "the mover never started: {st}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Paused while moving: the mover runs 1 s first (the timeline of the scenario).
    std::thread::sleep(Duration::from_millis(1000));
    let path = state.to_str().unwrap();
    let paused = env.reshard(&["pause", "--state", path]);
    assert!(paused.status.success(), "{}", text(&paused));
    let run = wait_bounded(child, Duration::from_secs(30));
    assert_eq!(run.status.code(), Some(3), "{}", text(&run));
    let status = env.reshard(&["status", "--state", path]);
    let st = String::from_utf8_lossy(&status.stdout);
    assert!(
        st.contains("phase 3/4 every sidecar in move mode; moving keys")
            && st.contains("running: no")
            && st.contains("node sidecar-1: ACKed version"),
        "{}",
        text(&status)
    );
    let out = env.reshard(&["abort", "--state", path]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in [
        "phase 2/4: move mode pushed (listener \"main\" catch_all: new, keys moving to old)",
        "phase 3/4: moving the keys from new to old",
        "aborted: listener \"main\" catch_all is on old again, every key back on it",
    ] {
        assert!(stdout.contains(line), "{line}\n{}", text(&out));
    }
    check_placed(&env, &env.old);
    for z in ["zone-z1.yaml", "zone-z2.yaml"] {
        let served = std::fs::read_to_string(env.work.join("res").join(z)).unwrap();
        let original = std::fs::read_to_string(env.file(z)).unwrap();
        assert_eq!(served, original, "{z}");
    }
    let s = env.status();
    for n in &s.nodes {
        let lds = &n.types[respway_xds::LISTENER_TYPE_URL];
        assert!(n.generation == s.version && lds.acked == lds.sent, "{n:?}");
    }
}

/// Issue: the mover walks every key of `--from`, so moving a prefix route also moved the keys
/// of the listener's other routes on the same cluster (here the catch-all's) to `--to`, where
/// their route does not look: they vanished for clients. The reshard of `p:` now passes the
/// mover `--prefix p:` (and `--skip-prefix` for the longer prefixes of other routes: `p:x:`):
/// every `p:` key ends on its owner in `new`, every other key stays on its owner in `old`, and
/// both sidecars read all of them. Failing before: the catch-all's keys whose owner in `new`
/// is another shard were moved there, and the sidecars answered nil for them.
#[test]
fn reshard_of_a_prefix_route_moves_its_keys_only() {
    let routes = "{ catch_all: old, prefixes: [ { prefix: \"p:\", cluster: old }, \
                  { prefix: \"p:x:\", cluster: old } ] }";
    let env = Env::start_routes(2, 4, routes);
    // The route's keys, the catch-all's, and those of the longer prefix route `p:x:`.
    let keys: Vec<String> = (0..300)
        .map(|i| match i % 3 {
            0 => format!("p:{i}"),
            1 => format!("k:{i}"),
            _ => format!("p:x:{i}"),
        })
        .collect();
    let mut conns: Vec<RespConn> = env
        .shards
        .iter()
        .map(|s| RespConn::connect(s.addr))
        .collect();
    for k in &keys {
        let c = &mut conns[env.old.pick(k.as_bytes())];
        assert_eq!(
            c.call(&["SET", k, &format!("v-{k}")]),
            Resp::Simple("OK".into())
        );
    }
    let state = env.work.join("state.json");
    let args = env.start_args(&state, &["--route", "p:", "--yes"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = env.reshard(&args);
    assert!(out.status.success(), "{}", text(&out));
    let total: u64 = env.shards.iter().map(|s| dbsize(s.addr)).sum();
    assert_eq!(total, keys.len() as u64, "none lost, none doubled");
    let mut left = 0;
    for k in &keys {
        let picker = if is_route_key(k) { &env.new } else { &env.old };
        let owner = picker.pick(k.as_bytes());
        let there = conns[owner].get(k);
        left += usize::from(there.is_none());
        assert_eq!(
            there,
            Some(format!("v-{k}").into_bytes()),
            "{k} on shard {owner}"
        );
    }
    assert_eq!(left, 0);
    for s in env.sidecars.iter().flatten() {
        let mut c = RespConn::connect(s.addr);
        for k in &keys {
            assert_eq!(
                c.get(k),
                Some(format!("v-{k}").into_bytes()),
                "{k} through {}",
                s.addr
            );
        }
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("--move --rate 0 --prefix=p: --skip-prefix=p:x: --checkpoint "),
        "the mover's scope\n{}",
        text(&out)
    );
    assert!(
        stdout.contains(
            "scope: the mover moves only the keys starting with \"p:\", not with \"p:x:\""
        ),
        "{}",
        text(&out)
    );
    let moved = keys.iter().filter(|k| is_route_key(k)).count();
    assert!(
        stdout.contains(&format!("plan: scanned {moved}, ")),
        "the plan counts the route's keys only\n{}",
        text(&out)
    );
    for z in ["zone-z1.yaml", "zone-z2.yaml"] {
        let served = std::fs::read_to_string(env.work.join("res").join(z)).unwrap();
        assert!(served.contains("catch_all: old"), "{z}:\n{served}");
        assert!(!served.contains("mirrors"), "{z}:\n{served}");
    }
}

/// The keys of route `p:` (not those of `p:x:`).
fn is_route_key(k: &str) -> bool {
    k.starts_with("p:") && !k.starts_with("p:x:")
}

/// A route with `remove_prefix: true` keeps its keys without the prefix on its cluster: the
/// mover could not tell them from other routes' keys, so `reshard start` refuses it (exit 2)
/// before anything is pushed or planned (no server is needed to find out).
#[test]
fn reshard_of_a_route_that_removes_its_prefix_is_refused() {
    let work = std::env::temp_dir().join(format!("respway-reshard-strip-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let file = work.join("res.yaml");
    std::fs::write(
        &file,
        "listeners:\n  - name: main\n    address: 127.0.0.1:1\n    routes:\n      catch_all: old\n      \
         prefixes: [ { prefix: \"s:\", cluster: old, remove_prefix: true } ]\n\
         clusters:\n  - name: old\n    shards: [ { endpoints: [ { address: 127.0.0.1:2 } ] } ]\n\
         \x20 - name: new\n    shards: [ { endpoints: [ { address: 127.0.0.1:3 } ] } ]\n",
    )
    .unwrap();
    let state = work.join("state.json");
    let run = |extra: &[&str]| {
        let out = Command::new(respway_xds_bin())
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
            .stdin(Stdio::null())
            .output()
            .expect("run respway-xds reshard");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--route", "s:"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("listener \"main\" prefix \"s:\" has remove_prefix: true"),
        "{err}"
    );
    // The catch-all shares `old` with it: its keys there cannot be told apart either.
    let (code, err) = run(&[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("prefix \"s:\" has remove_prefix: true"),
        "{err}"
    );
    assert!(!state.exists(), "nothing started");
    let _ = std::fs::remove_dir_all(&work);
}

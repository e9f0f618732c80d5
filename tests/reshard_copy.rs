//! `respway-xds reshard start --copy` end to end (issue 43): the catch-all route copied from
//! cluster `old` (2 shards) to cluster `new` (3 other shards) by the command alone, under a
//! load of every type through two sidecars fed by a real `respway-xds`; afterwards every key
//! of `new` equals the model of the acknowledged writes (counters and lists exact, TTLs
//! within 1 s), the registers' history is linearizable, and `old` holds nothing. The same
//! with the command killed (SIGKILL) mid-way and resumed, and with an abort.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::move_mode::{load_thread, preload, verify, Model, Outcome};
use crate::reshard::{shards_yaml, text, wait_bounded};
use crate::support::*;
use respway_filters::hash::ShardPicker;
use respway_filters::routing::Routing;

const TOKEN: &str = "reshard-copy-test-token";
const KEYS: usize = 1_200;
const THREADS: usize = 4;

/// Shards, a management server over `res/`, two sidecars (zones z1, z2) with admin endpoints.
struct Env {
    shards: Vec<Proc>,
    work: PathBuf,
    admin: String,
    grpc: u16,
    _xds: Proc,
    sidecars: Vec<Proc>,
    new: Arc<dyn ShardPicker>,
    old: Arc<dyn ShardPicker>,
}

impl Env {
    fn start() -> Env {
        Env::start_with("{ catch_all: old }")
    }

    /// With the listener's `routes` as given (on `old`).
    fn start_with(routes: &str) -> Env {
        Env::start_admins(routes, 2)
    }

    /// With the listener's `routes`, and an admin endpoint on the first `admins` sidecars.
    fn start_admins(routes: &str, admins: usize) -> Env {
        let shards: Vec<Proc> = (0..5).map(|_| redis()).collect();
        let a: Vec<SocketAddr> = shards.iter().map(|s| s.addr).collect();
        let work = std::env::temp_dir().join(format!(
            "respway-reshard-copy-{}-{}",
            std::process::id(),
            a[0].port()
        ));
        let res = work.join("res");
        std::fs::create_dir_all(&res).unwrap();
        std::fs::write(work.join("token"), TOKEN).unwrap();
        let clusters = format!(
            "clusters:\n  - name: old\n    hash: {{ policy: ketama }}\n    shards:\n{}\
             \x20 - name: new\n    hash: {{ policy: ketama }}\n    shards:\n{}",
            shards_yaml(&a[..2]),
            shards_yaml(&a[2..])
        );
        let ports = [free_port(), free_port()];
        let listener = |zone: &str, port: u16| {
            format!(
                "targets: {{ zones: [{zone}] }}\nlisteners:\n  - name: main\n    address: \
                 127.0.0.1:{port}\n    routes: {routes}\n"
            )
        };
        let files = [
            ("clusters.yaml", clusters.clone()),
            ("zone-z1.yaml", listener("z1", ports[0])),
            ("zone-z2.yaml", listener("z2", ports[1])),
        ];
        for (name, text) in &files {
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
        let stat = work.join("static.yaml");
        std::fs::write(
            &stat,
            format!(
                "listeners:\n  - name: main\n    address: 127.0.0.1:1\n    routes: {{ catch_all: \
                 old }}\n{clusters}"
            ),
        )
        .unwrap();
        let model = respway_xds::load_file(&stat).expect("valid");
        let routing = Routing::build(&model, &model.listeners[0]).expect("routing");
        let mut env = Env {
            shards,
            admin: format!("127.0.0.1:{admin}"),
            grpc,
            _xds: xds,
            sidecars: Vec::new(),
            old: routing.clusters[0].picker.clone(),
            new: routing.clusters[1].picker.clone(),
            work,
        };
        for (i, port) in ports.iter().enumerate() {
            let boot = env.work.join(format!("bootstrap-{i}.yaml"));
            std::fs::write(
                &boot,
                format!(
                    "node: {{ id: sidecar-{}, zone: z{} }}\nxds: {{ server: \"http://127.0.0.1:{}\" }}\n",
                    i + 1,
                    i + 1,
                    env.grpc
                ),
            )
            .unwrap();
            let admin = format!("127.0.0.1:{}", free_port());
            let admin: &[&str] = if i < admins {
                &["--admin", &admin]
            } else {
                &[]
            };
            env.sidecars.push(
                Spawn::new(env!("CARGO_BIN_EXE_respway"))
                    .args(["--bootstrap", boot.to_str().unwrap(), "--workers", "2"])
                    .args(admin)
                    .env("RUST_LOG", "warn")
                    .on_port(*port)
                    .start(),
            );
        }
        env
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.shards.iter().map(|s| s.addr).collect()
    }

    fn cmd(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(respway_xds_bin());
        cmd.arg("reshard")
            .args(args)
            .env("RESPWAY_XDS_ADMIN_TOKEN_FILE", self.work.join("token"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// `reshard VERB --state STATE`.
    fn verb(&self, verb: &str, state: &std::path::Path) -> Output {
        self.run(&[verb.into(), "--state".into(), state.display().to_string()])
    }

    fn run(&self, args: &[String]) -> Output {
        let child = self.cmd(args).spawn().expect("start respway-xds reshard");
        wait_bounded(child, slack(Duration::from_secs(150)))
    }

    /// `reshard start --copy` of the catch-all from `old` to `new`, with every file.
    fn start_args(&self, state: &std::path::Path, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = [
            "start",
            "--copy",
            "--admin",
            &self.admin,
            "--listener",
            "main",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for f in ["clusters.yaml", "zone-z1.yaml", "zone-z2.yaml"] {
            a.extend([
                "--file".to_string(),
                self.work.join(f).display().to_string(),
            ]);
        }
        for s in ["--from", "old", "--to", "new", "--yes", "--state"] {
            a.push(s.to_string());
        }
        a.push(state.display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    /// `KEYS` indices preloaded through sidecar 1, then `THREADS` load threads over both
    /// sidecars.
    fn load(&self) -> Load {
        let mut c = sync_client(self.sidecars[0].addr);
        let mut models: Vec<std::collections::BTreeMap<usize, Model>> =
            vec![Default::default(); THREADS];
        let mut seq = 0;
        for i in 0..KEYS {
            let mut m = Model::default();
            preload(&mut c, i, &mut m, &mut seq);
            models[i % THREADS].insert(i, m);
        }
        let preloaded = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Progress::new(THREADS);
        let threads = models
            .into_iter()
            .enumerate()
            .map(|(t, m)| {
                let addr = self.sidecars[t % 2].addr;
                let (stop, counter) = (stop.clone(), progress.counter(t));
                std::thread::spawn(move || load_thread(addr, t, THREADS, KEYS, m, stop, counter))
            })
            .collect();
        Load {
            stop,
            threads,
            progress,
            preloaded,
        }
    }

    /// Keys on the shards of `old`.
    fn old_keys(&self) -> u64 {
        self.addrs()[..2].iter().map(|a| dbsize(*a)).sum()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Outcome>>,
    progress: Progress,
    preloaded: Instant,
}

impl Load {
    /// Every load thread runs `rounds` more rounds.
    fn rounds(&self, rounds: u64, what: &str) {
        self.progress
            .wait_each(rounds, Duration::from_secs(60), what);
    }

    fn finish(self) -> (Outcome, Instant) {
        self.rounds(200, "a last pause of load after the reshard");
        self.stop.store(true, Relaxed);
        let mut out: Outcome = Default::default();
        for h in self.threads {
            let (m, o, r, d) = h.join().expect("a load thread failed");
            out.0.extend(m);
            out.1.extend(o);
            out.2 += r;
            out.3 += d;
        }
        (out, self.preloaded)
    }
}

/// The pause the command printed, in ms.
fn pause_ms(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("write pause over: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no write pause line:\n{stdout}"))
}

/// The whole copy by the command alone, under load: every key exact on `new`, `old` empty.
#[test]
fn reshard_copy_moves_a_route_to_another_cluster_under_load_losing_nothing() {
    let env = Env::start();
    let load = env.load();
    load.rounds(100, "load before the reshard");
    let state = env.work.join("state.json");
    let out = env.run(&env.start_args(&state, &[]));
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    for line in [
        "phase 1/7: dual write pushed (listener \"main\" catch_all on old, every write copied to new)",
        "phase 2/7: backfill",
        "phase 4/7: write pause pushed",
        "every sidecar's copies to new applied",
        "phase 5/7: cut-over pushed",
        "phase 5/7: writes resumed",
        "phase 6/7: the final configuration pushed",
        "phase 7/7: cleanup",
        "done: listener \"main\" catch_all is on new, every key copied, none left on old",
    ] {
        assert!(stdout.contains(line), "{line}\n{}", text(&out));
    }
    assert!(
        !stdout.contains("checking the whole keyspace"),
        "the pause checked the written keys only: {}",
        text(&out)
    );
    let pause = pause_ms(&stdout);
    let ((models, ops, refused, done), preloaded) = load.finish();
    eprintln!("copy by reshard: {done} commands, {refused} refused during a {pause} ms pause");
    let a = env.addrs();
    verify(&a[2..], &env.new, &models, &ops, preloaded);
    assert_eq!(env.old_keys(), 0, "keys left on old");
    let _ = &env.old;
}

/// Waits until STATE's copy phase is `phase` and (with `compare`) a respway-compare runs.
fn wait_phase(
    state: &std::path::Path,
    child: &mut std::process::Child,
    phase: &str,
    compare: bool,
) {
    let deadline = Instant::now() + slack(Duration::from_secs(60));
    loop {
        let st = std::fs::read_to_string(state).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&st).unwrap_or_default();
        if v["copy"]["phase"] == phase && (!compare || v["mover_pid"].is_u64()) {
            return;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before {phase}: {st}"
        );
        assert!(Instant::now() < deadline, "never reached {phase}: {st}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Two sidecars under load and `reshard start --copy` slowed (`--rate 2000`) and caught in
/// its backfill, after 100 more rounds of load: the env, the load, the state file, the run.
fn during_the_backfill() -> (Env, Load, PathBuf, std::process::Child) {
    let env = Env::start();
    let load = env.load();
    let state = env.work.join("state.json");
    let mut child = env
        .cmd(&env.start_args(&state, &["--rate", "2000"]))
        .spawn()
        .expect("start");
    wait_phase(&state, &mut child, "dual_acked", true);
    load.rounds(100, "load during the backfill");
    (env, load, state, child)
}

/// The command killed (SIGKILL) during the backfill, then `resume`: the same end.
#[test]
fn reshard_copy_killed_during_the_backfill_resumes_to_the_same_end() {
    let (env, load, state, mut child) = during_the_backfill();
    child.kill().unwrap();
    let _ = child.wait();
    let out = env.run(&[
        "resume".into(),
        "--state".into(),
        state.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        stdout.contains("stopping the mover an earlier run left")
            || stdout.contains("phase 2/7: backfill"),
        "{}",
        text(&out)
    );
    let pause = pause_ms(&stdout);
    let ((models, ops, refused, done), preloaded) = load.finish();
    eprintln!("copy resumed: {done} commands, {refused} refused during a {pause} ms pause");
    let a = env.addrs();
    verify(&a[2..], &env.new, &models, &ops, preloaded);
    assert_eq!(env.old_keys(), 0, "keys left on old");
}

/// The end of an abort: the command says so, and every key of the model of acknowledged
/// writes is on `old` (nothing lost, nothing applied twice), none left on `new`.
fn check_aborted(env: &Env, out: &Output, load: Load) {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        stdout.contains(
            "aborted: listener \"main\" catch_all is on old again, its copies deleted from new"
        ),
        "{}",
        text(out)
    );
    let ((models, ops, _, _), preloaded) = load.finish();
    let a = env.addrs();
    verify(&a[..2], &env.old, &models, &ops, preloaded);
    let new_keys: u64 = a[2..].iter().map(|x| dbsize(*x)).sum();
    assert_eq!(new_keys, 0, "copies left on new");
}

/// `abort` during the backfill (before the cut-over): the original files again, every write
/// on `old`, the copies deleted from `new`.
#[test]
fn reshard_copy_aborted_before_the_cut_over_keeps_every_write_on_the_old_cluster() {
    let (env, load, state, child) = during_the_backfill();
    // `pause` stops the backfill and the run (exit 3); `abort` then goes back.
    let out = env.verb("pause", &state);
    assert!(out.status.success(), "{}", text(&out));
    let run = wait_bounded(child, slack(Duration::from_secs(60)));
    assert_eq!(run.status.code(), Some(3), "{}", text(&run));
    let out = env.verb("abort", &state);
    assert!(out.status.success(), "{}", text(&out));
    check_aborted(&env, &out, load);
}

/// `--hold` stops once writes resumed on `new` (copied to `old`); `abort` then checks the
/// keys written since, pauses writes, cuts back over to `old` and deletes the copies from
/// `new`: every write acknowledged on either side is on `old`.
#[test]
fn reshard_copy_aborted_after_the_cut_over_brings_every_write_back() {
    let env = Env::start();
    let load = env.load();
    let state = env.work.join("state.json");
    let out = env.run(&env.start_args(&state, &["--hold"]));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        stdout.contains("held (--hold): writes go to new and are copied to old"),
        "{}",
        text(&out)
    );
    load.rounds(200, "load on the new side");
    let status = env.verb("status", &state);
    let st = String::from_utf8_lossy(&status.stdout);
    assert!(
        st.contains("phase 6/7 writes on the new side; final configuration not pushed")
            && st.contains("write pause: "),
        "{}",
        text(&status)
    );
    let out = env.verb("abort", &state);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !stdout.contains("checking the whole keyspace"),
        "the pause checked the written keys only: {}",
        text(&out)
    );
    check_aborted(&env, &out, load);
}

/// The ad system's story: one prefix of a shared cluster copied to a cluster of its own by
/// `reshard --copy --route ads:`, under a load of increments through both sidecars on keys of
/// the prefix and outside it: the prefix's counters end on `new`, exact (each acknowledged
/// increment counted once), none left on `old`; the other keys never leave `old`.
#[test]
fn reshard_copy_of_a_prefix_moves_only_its_keys_under_load() {
    const N: usize = 300;
    let env =
        Env::start_with("{ catch_all: old, prefixes: [ { prefix: \"ads:\", cluster: old } ] }");
    let mut c = sync_client(env.sidecars[0].addr);
    for i in 0..N {
        let _: () = redis::pipe()
            .cmd("SET")
            .arg(format!("ads:{i}"))
            .arg(0)
            .cmd("SET")
            .arg(format!("other:{i}"))
            .arg(0)
            .query(&mut c)
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Progress::new(2);
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let addr = env.sidecars[t].addr;
            let (stop, counter) = (stop.clone(), progress.counter(t));
            std::thread::spawn(move || {
                use rand::{Rng, SeedableRng};
                let mut c = sync_client(addr);
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                let mut acked = vec![[0i64; 2]; N];
                let deadline = Instant::now() + Duration::from_secs(90);
                let mut done = 0u64;
                while !stop.load(Relaxed) && Instant::now() < deadline && done < 2_000_000 {
                    done += 1;
                    counter.tick();
                    let (i, side) = (rng.random_range(0..N), rng.random_range(0..2));
                    let key = format!("{}:{i}", ["ads", "other"][side]);
                    match redis::cmd("INCR").arg(&key).query::<i64>(&mut c) {
                        Ok(_) => acked[i][side] += 1,
                        Err(e) if e.to_string().contains("read-only") => {}
                        Err(e) => panic!("INCR {key}: {e}"),
                    }
                }
                acked
            })
        })
        .collect();
    progress.wait_each(100, Duration::from_secs(60), "load before the reshard");
    let state = env.work.join("state.json");
    let out = env.run(&env.start_args(&state, &["--route", "ads:"]));
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        stdout.contains(
            "done: listener \"main\" prefix \"ads:\" is on new, every key copied, none left on old"
        ),
        "{}",
        text(&out)
    );
    progress.wait_each(100, Duration::from_secs(60), "load after the reshard");
    stop.store(true, Relaxed);
    let mut model = vec![[0i64; 2]; N];
    for h in threads {
        for (m, a) in model
            .iter_mut()
            .zip(h.join().expect("a load thread failed"))
        {
            m[0] += a[0];
            m[1] += a[1];
        }
    }
    let a = env.addrs();
    let mut wrong = Vec::new();
    for (i, m) in model.iter().enumerate() {
        let sides = [(&env.new, &a[2..], &a[..2]), (&env.old, &a[..2], &a[2..])];
        for (side, (picker, shards, others)) in sides.into_iter().enumerate() {
            let key = format!("{}:{i}", ["ads", "other"][side]);
            let owner = shards[picker.pick(key.as_bytes())];
            let v: Option<i64> = redis::cmd("GET")
                .arg(&key)
                .query(&mut sync_client(owner))
                .unwrap();
            if v != Some(m[side]) {
                wrong.push(format!("{key}: {v:?}, model {}", m[side]));
            }
            for x in others {
                let n: i64 = redis::cmd("EXISTS")
                    .arg(&key)
                    .query(&mut sync_client(*x))
                    .unwrap();
                if n != 0 {
                    wrong.push(format!("{key} also on {x}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert_eq!(env.old_keys(), N as u64, "old holds the other keys only");
}

/// A sidecar without an admin endpoint: the pause could not count its copies in flight, so
/// the run stops once dual write is ACKed, before the backfill, naming the node and what to
/// run (the docs said such a pause compared the whole keyspace; it failed at the pause,
/// after the whole backfill, instead). Nothing was moved: every key is still on `old`.
#[test]
fn reshard_copy_needs_every_sidecars_admin_endpoint_and_says_so_before_the_backfill() {
    let env = Env::start_admins("{ catch_all: old }", 1);
    let mut c = sync_client(env.sidecars[0].addr);
    for i in 0..50 {
        let _: () = redis::cmd("SET")
            .arg(format!("k:{i}"))
            .arg(i)
            .query(&mut c)
            .unwrap();
    }
    let state = env.work.join("state.json");
    let out = env.run(&env.start_args(&state, &[]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("copy mode needs every sidecar's admin endpoint")
            && stderr.contains("node sidecar-2 announces none"),
        "{}",
        text(&out)
    );
    assert!(!stdout.contains("phase 2/7: backfill"), "{}", text(&out));
    assert_eq!(env.old_keys(), 50);
}

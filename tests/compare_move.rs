//! `respway-compare --move` (move mode's background mover) and `--cleanup` (copy mode's last
//! step) against real `redis-server`s, on the reshard issue 29 is about: ketama over two
//! shards `a`, `b` (cluster `old`) grown to four `a`, `b`, `c`, `d` (cluster `new`), the two old
//! ones reused, so a key either stays where it is (its owner is the same Redis) or moves to
//! `c` or `d`. The test places keys with the pickers the data plane builds (through `Routing`),
//! keeps a model of what it wrote (value, TTL or none) and checks every key against it.
//!
//! The servers come from the workspace's test harness (`respway-testkit`): free loopback
//! ports, killed on drop (also when an assertion fails).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use respway_filters::hash::ShardPicker;
use respway_filters::routing::Routing;
use respway_testkit::{redis_with, Proc, Resp, RespConn};

/// The four servers (`a`, `b`, `c`, `d`), a client to each, and both clusters' pickers.
struct Setup {
    _servers: Vec<Proc>,
    conns: Vec<RespConn>,
    config: PathBuf,
    /// Picks among `a`, `b` (index 0, 1 of `conns`).
    old: Arc<dyn ShardPicker>,
    /// Picks among `a`, `b`, `c`, `d`.
    new: Arc<dyn ShardPicker>,
    /// What was written: key → (value, with a TTL of an hour).
    model: BTreeMap<String, (String, bool)>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

fn setup() -> Setup {
    setup_with(&[])
}

/// [`setup`] with extra arguments for every server.
fn setup_with(args: &[&str]) -> Setup {
    let servers: Vec<Proc> = (0..4).map(|_| redis_with(args)).collect();
    let shard = |name: &str, p: &Proc| {
        format!(
            "      - name: {name}\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
            p.addr
        )
    };
    let names = ["a", "b", "c", "d"];
    let old: String = (0..2).map(|i| shard(names[i], &servers[i])).collect();
    let new: String = (0..4).map(|i| shard(names[i], &servers[i])).collect();
    let yaml = format!(
        "listeners:\n  - name: main\n    routes: {{ catch_all: old }}\n\
         clusters:\n  - name: old\n    hash: {{ policy: ketama }}\n    shards:\n{old}\
         \x20 - name: new\n    hash: {{ policy: ketama }}\n    shards:\n{new}"
    );
    let config = std::env::temp_dir().join(format!(
        "respway-compare-move-{}-{}.yaml",
        std::process::id(),
        servers[0].addr.port()
    ));
    std::fs::write(&config, yaml).expect("write config");
    let model = respway_xds::load_file(&config).expect("valid config");
    let routing = Routing::build(&model, &model.listeners[0]).expect("routing");
    assert_eq!(routing.clusters[0].name, "old");
    assert_eq!(routing.clusters[1].name, "new");
    Setup {
        conns: servers.iter().map(|p| RespConn::connect(p.addr)).collect(),
        _servers: servers,
        config,
        old: routing.clusters[0].picker.clone(),
        new: routing.clusters[1].picker.clone(),
        model: BTreeMap::new(),
    }
}

impl Setup {
    /// Writes `n` strings through the old placement, every fifth with a TTL of an hour.
    fn fill(&mut self, n: usize) {
        let mut pages: Vec<Vec<Vec<String>>> = vec![Vec::new(), Vec::new()];
        for i in 0..n {
            let (k, v) = (format!("key:{i}"), format!("value-{i}"));
            let ttl = i % 5 == 0;
            let mut cmd = vec!["SET".to_string(), k.clone(), v.clone()];
            if ttl {
                cmd.extend(["EX".to_string(), "3600".to_string()]);
            }
            pages[self.old.pick(k.as_bytes())].push(cmd);
            self.model.insert(k, (v, ttl));
        }
        for (shard, cmds) in pages.iter().enumerate() {
            for chunk in cmds.chunks(500) {
                self.conns[shard].send_pipeline(chunk);
                for _ in chunk {
                    let r = self.conns[shard].read().expect("reply");
                    assert_eq!(r, Resp::Simple("OK".into()));
                }
            }
        }
    }

    /// The index of the server owning `key` in the new placement.
    fn owner(&self, key: &str) -> usize {
        self.new.pick(key.as_bytes())
    }

    fn dbsize(&mut self, server: usize) -> i64 {
        match self.conns[server].call(&["DBSIZE"]) {
            Resp::Int(n) => n,
            other => panic!("DBSIZE: {other:?}"),
        }
    }

    /// Keys of the model whose owner changes (moves to `c` or `d`).
    fn moving(&self) -> usize {
        self.model
            .keys()
            .filter(|k| self.owner(k) != self.old.pick(k.as_bytes()))
            .count()
    }

    /// Every key of the model on its new owner with its value and TTL, and on no other server.
    fn assert_all_on_new_owners(&mut self) {
        let keys: Vec<(String, (String, bool))> = self
            .model
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, (v, ttl)) in &keys {
            let c = &mut self.conns[self.new.pick(k.as_bytes())];
            assert_eq!(c.call(&["GET", k]), Resp::bulk(v), "{k}");
            match c.call(&["PTTL", k]) {
                Resp::Int(p) if *ttl => assert!(p > 3_500_000, "{k}: PTTL {p}"),
                Resp::Int(p) => assert_eq!(p, -1, "{k}"),
                other => panic!("PTTL {k}: {other:?}"),
            }
        }
        let total: i64 = (0..4).map(|s| self.dbsize(s)).sum();
        assert_eq!(total, keys.len() as i64, "keys on all four servers");
    }

    /// The cut-over: the configuration answers every command from `new`.
    fn cut_over(&self) {
        let yaml = std::fs::read_to_string(&self.config).expect("read config");
        let cut = yaml.replace("routes: { catch_all: old }", "routes: { catch_all: new }");
        assert_ne!(yaml, cut);
        std::fs::write(&self.config, cut).expect("write config");
    }

    /// Runs the binary, `old` → `new`, with these extra arguments.
    fn run(&self, extra: &[&str]) -> Output {
        self.command(extra).output().expect("run respway-compare")
    }

    fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_respway-compare"));
        c.args(["--config", self.config.to_str().expect("utf-8 path")]);
        c.args(["--source", "old", "--target", "new"]);
        c.args(extra);
        c
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The number after `name` (`name N` or `name=N`) in `line`.
fn field(line: &str, name: &str) -> u64 {
    let at = line
        .find(&format!("{name} "))
        .or_else(|| line.find(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"));
    line[at + name.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {line:?}"))
}

fn temp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("respway-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

// === --checkpoint ===

/// Issue 29, item 1: the mover killed mid-way (SIGKILL, after the first source shard is done
/// and some of the second's keys moved) and run again on the same `--checkpoint` finishes the
/// move: every key on its new owner with its value and TTL, none lost or doubled; the second
/// run skips the finished shard (it scans fewer keys than a run from the start would), and the
/// counters continue. Failing before: the flag did not exist.
#[test]
fn move_resumes_from_its_checkpoint_after_being_killed() {
    let mut s = setup();
    s.fill(3000);
    let cp = temp("move-checkpoint");
    let cp_arg = cp.to_str().expect("utf-8 path");
    let mut child = s
        .command(&[
            "--move",
            "--rate",
            "500",
            "--count",
            "20",
            "--checkpoint",
            cp_arg,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Until shard a is done and shard b's walk has begun (its cursor moved on).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = read(&cp);
        let shards: Vec<&str> = text.lines().filter(|l| l.starts_with("shard ")).collect();
        let begun = |l: &str| l.contains(" cursor ") && !l.ends_with(" cursor 0");
        if shards.len() == 2 && shards[0].ends_with(" done") && begun(shards[1]) {
            break;
        }
        assert!(Instant::now() < deadline, "checkpoint: {text:?}");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "finished too soon"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
    let saved = read(&cp);
    let counters = saved
        .lines()
        .find(|l| l.starts_with("counters "))
        .expect("counters line")
        .to_string();
    let scanned_before = field(&counters, "scanned");
    let sent_before = field(&counters, "sent");
    assert!(sent_before > 0, "{saved}");
    // A run from the start would scan at least every key left on a and b.
    let left = s.dbsize(0) + s.dbsize(1);

    let out = s.run(&[
        "--move",
        "--rate",
        "100000",
        "--count",
        "20",
        "--checkpoint",
        cp_arg,
        "--progress",
    ]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    // Issue 43, item 6: the resumed run's progress counts since the checkpoint began
    // (`sent`), and apart, what this run sent (`run_sent`: what its keys/s is made of).
    let err = stderr(&out);
    let last = err
        .lines()
        .rfind(|l| l.starts_with("progress "))
        .unwrap_or_else(|| panic!("no progress line: {err}"));
    assert_eq!(
        field(last, "run_sent") + sent_before,
        field(last, "sent"),
        "{last}"
    );
    assert!(last.ends_with(" done=1"), "{last}");
    assert!(
        stderr(&out).contains(&format!("resuming from --checkpoint {cp_arg}: 1 of 2")),
        "{}",
        stderr(&out)
    );
    let summary = stdout(&out);
    let scanned = field(&summary, "scanned");
    assert!(
        scanned - scanned_before < left as u64,
        "the second run scanned {} keys, a full run {left}: {summary}",
        scanned - scanned_before
    );
    assert!(field(&summary, "sent") > sent_before, "{summary}");
    assert!(summary.ends_with(", failed 0, big 0\n"), "{summary}");
    s.assert_all_on_new_owners();
    assert!(read(&cp).lines().filter(|l| l.ends_with(" done")).count() == 2);

    // A third run on the finished checkpoint scans nothing more.
    let again = s.run(&["--move", "--checkpoint", cp_arg]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(field(&stdout(&again), "scanned"), scanned);

    // The same file with other clusters: a usage error naming it, nothing moved.
    let out = Command::new(env!("CARGO_BIN_EXE_respway-compare"))
        .args(["--config", s.config.to_str().expect("utf-8")])
        .args([
            "--source",
            "new",
            "--target",
            "old",
            "--move",
            "--checkpoint",
            cp_arg,
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(cp_arg), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--source old --target new"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_file(&cp);
}

// === sizes: --max-key-bytes, --bytes-rate, --progress ===

/// A key whose owner changes, `len` bytes long: written on its old owner, added to the model.
fn big_key(s: &mut Setup, len: usize) -> String {
    let k = (0..)
        .map(|i| format!("big:{i}"))
        .find(|k| s.owner(k) != s.old.pick(k.as_bytes()))
        .expect("a key that moves");
    let v = "x".repeat(len);
    let c = &mut s.conns[s.old.pick(k.as_bytes())];
    assert_eq!(c.call(&["SET", &k, &v]), Resp::Simple("OK".into()));
    s.model.insert(k.clone(), (v, false));
    k
}

/// Issue 29, items 3 and 4: a key above `--max-key-bytes` (its `MEMORY USAGE`) is not moved,
/// listed on stderr and counted (`big 1`, exit 1) while the others move; `--max-key-bytes 0`
/// moves it. `--progress` prints its line every second and at the end, `bytes` the sizes of
/// the keys sent. Failing before: the flags did not exist.
#[test]
fn move_leaves_keys_above_max_key_bytes_and_reports_progress() {
    let mut s = setup();
    s.fill(200);
    let big = big_key(&mut s, 200_000);
    let from = s.old.pick(big.as_bytes());
    let out = s.run(&[
        "--move",
        "--max-key-bytes",
        "100000",
        "--progress",
        "--rate",
        "50",
        "--count",
        "20",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let err = stderr(&out);
    let listed: Vec<&str> = err.lines().filter(|l| l.starts_with("big ")).collect();
    assert_eq!(listed.len(), 1, "{err}");
    assert!(
        listed[0].starts_with(&format!("big \"{big}\": 2"))
            && listed[0].ends_with(" bytes, not moved"),
        "{err}"
    );
    let summary = stdout(&out);
    assert!(summary.ends_with(", failed 0, big 1\n"), "{summary}");
    let moved = s.moving() as u64 - 1;
    assert_eq!(field(&summary, "sent"), moved, "{summary}");
    // Still on its old owner; the others on their new ones.
    assert_eq!(s.conns[from].call(&["EXISTS", &big]), Resp::Int(1));
    // About one progress line a second (the run takes moved / 50 s), then the last one.
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with("progress ")).collect();
    assert!(progress.len() >= 2, "{err}");
    let last = progress[progress.len() - 1];
    assert_eq!(field(last, "sent"), moved, "{last}");
    assert_eq!(field(last, "big"), 1, "{last}");
    assert_eq!(field(last, "scanned"), field(&summary, "scanned"), "{last}");
    assert!(field(last, "bytes") >= moved * 16, "{last}");
    assert!(last.contains(" shard=2/2 elapsed_ms="), "{last}");
    // One run from the start: it sent every key itself; the last line says it is done.
    assert_eq!(field(last, "run_sent"), moved, "{last}");
    assert!(last.ends_with(" done=1"), "{last}");
    assert!(!progress[..progress.len() - 1]
        .iter()
        .any(|l| l.contains("done=")));
    assert!(
        progress[0].starts_with("progress scanned=")
            && progress[0].contains(" kept=")
            && progress[0].contains(" absent=0 failed=0 big="),
        "{}",
        progress[0]
    );
    let out = s.run(&["--move", "--max-key-bytes", "0"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(!stderr(&out).contains("progress "), "{}", stderr(&out));
    s.assert_all_on_new_owners();
}

/// Issue 29, item 2: `--bytes-rate` paces by the bytes sent: 40 keys of 20 KB whose owner
/// changes take at least their size over the rate. Failing before: the flag did not exist.
#[test]
fn move_bytes_rate_paces_by_the_bytes_sent() {
    let mut s = setup();
    let v = "y".repeat(20_000);
    let mut n = 0;
    for i in 0.. {
        let k = format!("wide:{i}");
        if s.owner(&k) == s.old.pick(k.as_bytes()) {
            continue;
        }
        let c = &mut s.conns[s.old.pick(k.as_bytes())];
        assert_eq!(c.call(&["SET", &k, &v]), Resp::Simple("OK".into()));
        s.model.insert(k, (v.clone(), false));
        n += 1;
        if n == 40 {
            break;
        }
    }
    let started = Instant::now();
    let out = s.run(&[
        "--move",
        "--bytes-rate",
        "400000",
        "--count",
        "5",
        "--progress",
    ]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err
        .lines()
        .rfind(|l| l.starts_with("progress "))
        .expect("progress");
    let bytes = field(last, "bytes");
    assert!(bytes >= 40 * 20_000, "{last}");
    // The last batch is paced too: the run lasts at least bytes / rate.
    let floor = Duration::from_secs_f64(bytes as f64 / 400_000.0);
    assert!(
        took >= floor,
        "took {took:?}, {bytes} bytes at 400000/s: {floor:?}"
    );
    assert!(
        field(last, "elapsed_ms") as u128 >= floor.as_millis(),
        "{last}"
    );
    s.assert_all_on_new_owners();
}

/// A shard that refuses `MEMORY USAGE` (here: the command renamed away) stops the mover with
/// exit code 3 and a message naming the command, before it moves anything, since the default
/// `--max-key-bytes` needs sizes; `--max-key-bytes 0` needs none and moves every key.
#[test]
fn move_without_memory_usage_stops_unless_no_size_is_needed() {
    let mut s = setup_with(&["--rename-command", "MEMORY", ""]);
    s.fill(100);
    let out = s.run(&["--move"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("MEMORY USAGE on a ("),
        "{}",
        stderr(&out)
    );
    assert_eq!(s.dbsize(2) + s.dbsize(3), 0, "moved keys");
    let out = s.run(&["--move", "--max-key-bytes", "0"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    s.assert_all_on_new_owners();
}

// === --plan ===

/// Issue 29, item 5: `--plan` moves nothing and counts, per source shard and in all, the keys
/// that would move (not those above `--max-key-bytes`, counted as big), those that stay, their
/// bytes, and the time at `--rate`. Failing before: the flag did not exist.
#[test]
fn move_plan_counts_what_would_move_and_moves_nothing() {
    let mut s = setup();
    s.fill(1000);
    big_key(&mut s, 50_000);
    let before: Vec<i64> = (0..4).map(|i| s.dbsize(i)).collect();
    let out = s.run(&[
        "--move",
        "--plan",
        "--rate",
        "100",
        "--max-key-bytes",
        "40000",
    ]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(before, (0..4).map(|i| s.dbsize(i)).collect::<Vec<_>>());
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let moving = s.moving() as u64 - 1;
    let n = s.model.len() as u64;
    let mut sum = 0;
    for (i, l) in lines[..2].iter().enumerate() {
        let name = ["a", "b"][i];
        assert!(l.starts_with(&format!("plan shard {name} (")), "{l}");
        assert_eq!(field(l, "scanned"), before[i] as u64, "{l}");
        sum += field(l, "move");
    }
    assert_eq!(sum, moving, "{text}");
    let last = lines[2];
    assert!(last.starts_with("plan: scanned "), "{last}");
    assert_eq!(field(last, "scanned"), n, "{last}");
    assert_eq!(field(last, "move"), moving, "{last}");
    assert_eq!(field(last, "keep"), n - moving - 1, "{last}");
    assert!(field(last, "bytes") >= moving * 16, "{last}");
    assert_eq!(field(last, "big"), 1, "{last}");
    assert!(
        last.ends_with(&format!(", estimate {} s", moving.div_ceil(100))),
        "{last}"
    );
}

// === --cleanup ===

/// Issue 43, item 3: copy mode's cleanup, after the cut-over (the configuration answers from
/// `new`). The dry run lists what it would delete and deletes nothing; `--apply` deletes every
/// key whose owner is another Redis, whatever its value: a key changed on the old side after
/// the copy, and one deleted on the new side since, are obsolete too (writes after the
/// cut-over go to the new side only). Keys whose owner is the same Redis stay. Before the
/// cut-over the cleanup is refused and deletes nothing.
#[test]
fn cleanup_after_the_cut_over_deletes_every_obsolete_key_whatever_its_value() {
    let mut s = setup();
    s.fill(600);
    let out = s.run(&["--repair", "--rate", "100000"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let moving: Vec<String> = s
        .model
        .keys()
        .filter(|k| s.owner(k) != s.old.pick(k.as_bytes()))
        .cloned()
        .collect();
    let n = s.model.len() as u64;
    let (changed, missing) = (moving[0].clone(), moving[1].clone());
    let changed_from = s.old.pick(changed.as_bytes());
    let missing_to = s.owner(&missing);
    assert_eq!(
        s.conns[changed_from].call(&["SET", &changed, "stale"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(s.conns[missing_to].call(&["DEL", &missing]), Resp::Int(1));
    s.model.remove(&missing);
    let before: Vec<i64> = (0..4).map(|i| s.dbsize(i)).collect();

    // During move mode (keys not yet moved are still on the old side), or while the old
    // cluster still gets dual-write copies: refused, nothing deleted.
    for mirror in [
        "{ cluster: new, mode: move }",
        "{ cluster: new, mode: dual_write, primary: mirror }",
    ] {
        let yaml = std::fs::read_to_string(&s.config).expect("read config");
        let during = yaml.replace(
            "routes: { catch_all: old }",
            &format!("routes: {{ catch_all: old, catch_all_mirrors: [ {mirror} ] }}"),
        );
        assert_ne!(yaml, during);
        std::fs::write(&s.config, &during).expect("write config");
        let out = s.run(&["--cleanup", "--apply"]);
        std::fs::write(&s.config, &yaml).expect("write config");
        assert_eq!(out.status.code(), Some(2), "{mirror}: {}", stderr(&out));
        assert_eq!(
            before,
            (0..4).map(|i| s.dbsize(i)).collect::<Vec<_>>(),
            "{mirror}"
        );
    }
    // Before the cut-over: refused, nothing deleted.
    let early = s.run(&["--cleanup", "--apply"]);
    assert_eq!(early.status.code(), Some(2), "{}", stderr(&early));
    assert!(
        stderr(&early).contains("--cleanup refused: listener \"main\" catch-all of ")
            && stderr(&early).contains("still sends commands to \"old\""),
        "{}",
        stderr(&early)
    );
    assert_eq!(before, (0..4).map(|i| s.dbsize(i)).collect::<Vec<_>>());

    s.cut_over();
    let dry = s.run(&["--cleanup", "--max-mismatches", "5"]);
    assert!(dry.status.success(), "{}\n{}", stdout(&dry), stderr(&dry));
    assert_eq!(
        before,
        (0..4).map(|i| s.dbsize(i)).collect::<Vec<_>>(),
        "the dry run deleted"
    );
    let text = stdout(&dry);
    let deletable = moving.len() as u64;
    let kept = n - deletable;
    assert_eq!(
        text.lines().last(),
        Some(
            format!(
                "cleanup: scanned {n}, deletable {deletable}, kept {kept}, deleted 0 (dry run; \
                 --apply deletes)"
            )
            .as_str()
        ),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("would delete \"key:"))
            .count(),
        5,
        "{text}"
    );

    let out = s.run(&["--cleanup", "--apply", "--count", "50"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains("would delete"), "{text}");
    assert!(
        text.ends_with(&format!(
            "cleanup: scanned {n}, deletable {deletable}, kept {kept}, deleted {deletable}\n"
        )),
        "{text}"
    );
    // The new side is untouched (the stale value never reached it), and every key is on its
    // new owner only.
    let changed_to = s.owner(&changed);
    let (v, _) = s.model[&changed].clone();
    assert_eq!(s.conns[changed_to].call(&["GET", &changed]), Resp::bulk(&v));
    s.assert_all_on_new_owners();
    // A second run finds nothing left to delete.
    let again = s.run(&["--cleanup", "--apply"]);
    assert!(again.status.success(), "{}", stdout(&again));
    assert_eq!(
        stdout(&again),
        format!("cleanup: scanned {kept}, deletable 0, kept {kept}, deleted 0\n")
    );
}

/// Issue 43, item 1: after the cut-over the old cluster is the stale side. The documented
/// advice for a key that differs ("repair it with `--repair`, then run the cleanup again")
/// copied old → new and lost what the new cluster took since: a counter INCRed to 2 on the new
/// cluster went back to 1, a list RPUSHed to `[a, b]` back to `[a]`. `--repair` is refused
/// once the configuration answers from the target, and the cleanup removes the old copies
/// without touching the new ones.
#[test]
fn after_the_cut_over_repair_is_refused_and_the_cleanup_keeps_the_new_writes() {
    let old = respway_testkit::redis_with(&[]);
    let new = respway_testkit::redis_with(&[]);
    let yaml = |answering: &str| {
        format!(
            "listeners:\n  - name: main\n    routes: {{ catch_all: {answering} }}\n\
             clusters:\n  - name: old\n    shards:\n      - name: a\n        endpoints: \
             [ {{ address: \"{}\", role: primary }} ]\n  - name: new\n    shards:\n      \
             - name: a\n        endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
            old.addr, new.addr
        )
    };
    let config = std::env::temp_dir().join(format!(
        "respway-compare-cutover-{}-{}.yaml",
        std::process::id(),
        old.addr.port()
    ));
    std::fs::write(&config, yaml("new")).expect("write config");
    let (mut o, mut n) = (RespConn::connect(old.addr), RespConn::connect(new.addr));
    // Copied before the cut-over, then written on the new cluster only.
    assert_eq!(o.call(&["SET", "k", "1"]), Resp::Simple("OK".into()));
    assert_eq!(o.call(&["RPUSH", "l", "a"]), Resp::Int(1));
    assert_eq!(n.call(&["SET", "k", "1"]), Resp::Simple("OK".into()));
    assert_eq!(n.call(&["RPUSH", "l", "a"]), Resp::Int(1));
    assert_eq!(n.call(&["INCR", "k"]), Resp::Int(2));
    assert_eq!(n.call(&["RPUSH", "l", "b"]), Resp::Int(2));
    let run = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_respway-compare"));
        c.args(["--config", config.to_str().expect("utf-8 path")]);
        c.args(["--source", "old", "--target", "new"]);
        c.args(extra);
        c.output().expect("run respway-compare")
    };
    let repair = run(&["--repair"]);
    assert_eq!(repair.status.code(), Some(2), "{}", stderr(&repair));
    assert!(
        stderr(&repair).contains("--repair refused: no route of ")
            && stderr(&repair).contains("after the cut-over \"old\" is the stale side"),
        "{}",
        stderr(&repair)
    );
    let cleanup = run(&["--cleanup", "--apply"]);
    assert!(cleanup.status.success(), "{}", stderr(&cleanup));
    assert_eq!(
        stdout(&cleanup),
        "cleanup: scanned 2, deletable 2, kept 0, deleted 2\n"
    );
    assert_eq!(n.call(&["GET", "k"]), Resp::bulk("2"));
    assert_eq!(
        n.call(&["LRANGE", "l", "0", "-1"]),
        Resp::Array(Some(vec![Resp::bulk("a"), Resp::bulk("b")]))
    );
    assert_eq!(o.call(&["DBSIZE"]), Resp::Int(0));
    // Before the cut-over the same repair runs (the old cluster answers).
    std::fs::write(&config, yaml("old")).expect("write config");
    assert_eq!(o.call(&["SET", "k2", "v"]), Resp::Simple("OK".into()));
    let before = run(&["--repair"]);
    assert!(before.status.success(), "{}", stderr(&before));
    assert_eq!(n.call(&["GET", "k2"]), Resp::bulk("v"));
    let _ = std::fs::remove_file(&config);
}

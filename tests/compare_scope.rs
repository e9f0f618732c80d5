//! `respway-compare`'s scope (`--prefix`, `--skip-prefix`, `--ignore-case`) and `--keys FILE`
//! against real `redis-server`s: cluster `old` (two servers) and cluster `new` (two other
//! servers), both ketama, keys placed with the pickers the data plane builds. Each mode
//! (compare, `--repair`, `--prune`, `--move`, `--plan`, `--cleanup`) touches the keys in scope
//! and leaves every other key as it was; `--keys` checks only the keys it lists. Failing
//! before: the flags did not exist (exit 2).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use respway_filters::hash::ShardPicker;
use respway_filters::routing::Routing;
use respway_testkit::{redis, Proc, Resp, RespConn};

/// Four servers: `old` on the first two, `new` on the other two.
struct Setup {
    _servers: Vec<Proc>,
    conns: Vec<RespConn>,
    config: PathBuf,
    old: Arc<dyn ShardPicker>,
    new: Arc<dyn ShardPicker>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

fn setup() -> Setup {
    let servers: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let shards = |range: std::ops::Range<usize>| {
        range
            .map(|i| {
                format!(
                    "      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
                    servers[i].addr
                )
            })
            .collect::<String>()
    };
    let yaml = format!(
        "listeners:\n  - name: main\n    routes: {{ catch_all: old }}\n\
         clusters:\n  - name: old\n    hash: {{ policy: ketama }}\n    shards:\n{}\
         \x20 - name: new\n    hash: {{ policy: ketama }}\n    shards:\n{}",
        shards(0..2),
        shards(2..4)
    );
    let config = std::env::temp_dir().join(format!(
        "respway-compare-scope-{}-{}.yaml",
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
    }
}

impl Setup {
    /// The client of `key`'s owner in `old`.
    fn at_old(&mut self, key: &str) -> &mut RespConn {
        let i = self.old.pick(key.as_bytes());
        &mut self.conns[i]
    }

    /// The client of `key`'s owner in `new`.
    fn at_new(&mut self, key: &str) -> &mut RespConn {
        let i = 2 + self.new.pick(key.as_bytes());
        &mut self.conns[i]
    }

    fn set_old(&mut self, key: &str, value: &str) {
        assert_eq!(
            self.at_old(key).call(&["SET", key, value]),
            Resp::Simple("OK".into())
        );
    }

    fn set_new(&mut self, key: &str, value: &str) {
        assert_eq!(
            self.at_new(key).call(&["SET", key, value]),
            Resp::Simple("OK".into())
        );
    }

    /// Keys held by the servers of `old` (0, 1) or `new` (2, 3).
    fn count(&mut self, servers: std::ops::Range<usize>) -> i64 {
        servers
            .map(|i| match self.conns[i].call(&["DBSIZE"]) {
                Resp::Int(n) => n,
                other => panic!("DBSIZE: {other:?}"),
            })
            .sum()
    }

    /// The binary, `old` → `new`, with these extra arguments (unpaced).
    fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_respway-compare"));
        c.args(["--config", self.config.to_str().expect("utf-8 path")]);
        c.args([
            "--source", "old", "--target", "new", "--rate", "0", "--count", "7",
        ]);
        c.args(extra);
        c
    }

    fn run(&self, extra: &[&str]) -> Output {
        self.command(extra).output().expect("run respway-compare")
    }

    /// The cut-over: the configuration answers every command from `new`.
    fn cut_over(&self) {
        let yaml = std::fs::read_to_string(&self.config).expect("read config");
        let cut = yaml.replace("routes: { catch_all: old }", "routes: { catch_all: new }");
        assert_ne!(yaml, cut);
        std::fs::write(&self.config, cut).expect("write config");
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn text(o: &Output) -> String {
    format!("exit {:?}\n{}{}", o.status.code(), stdout(o), stderr(o))
}

/// The last line starting with `start`.
fn line(o: &Output, start: &str) -> String {
    stdout(o)
        .lines()
        .rfind(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no {start:?} line in {}", text(o)))
        .to_string()
}

/// `p:0..20` in scope, `p:x:0..8` skipped, `q:0..12` out of scope, on `old`; `P:up` is in
/// scope only with `--ignore-case`. How many in scope.
fn fill(s: &mut Setup) -> usize {
    for i in 0..20 {
        s.set_old(&format!("p:{i}"), &format!("v{i}"));
    }
    for i in 0..8 {
        s.set_old(&format!("p:x:{i}"), "skipped");
    }
    for i in 0..12 {
        s.set_old(&format!("q:{i}"), "other");
    }
    s.set_old("P:up", "case");
    20
}

const SCOPE: [&str; 4] = ["--prefix", "p:", "--skip-prefix", "p:x:"];

fn scoped<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = SCOPE.to_vec();
    a.extend(extra);
    a
}

/// A compare, `--repair` and `--repair --prune` with a scope look only at the keys that start
/// with `--prefix` and with no `--skip-prefix`: the others are not counted, not copied, and
/// not deleted from the target.
#[test]
fn scope_limits_compare_repair_and_prune() {
    let mut s = setup();
    let n = fill(&mut s);
    let out = s.run(&scoped(&[]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        line(&out, "scanned "),
        format!("scanned {n}, matched 0, missing_in_target {n}, type_mismatch 0, value_mismatch 0, ttl_mismatch 0")
    );
    assert!(
        stderr(&out).contains("keys in scope: prefix \"p:\", skip \"p:x:\""),
        "{}",
        text(&out)
    );
    // Keys only on the target: one in scope, one not.
    s.set_new("p:stray", "resurrected");
    s.set_new("q:stray", "someone else's");
    let out = s.run(&scoped(&["--repair", "--prune"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        line(&out, "scanned ").ends_with(&format!("repaired {n}, unsettled 0")),
        "{}",
        text(&out)
    );
    assert_eq!(line(&out, "pruned "), "pruned 1");
    for i in 0..20 {
        let k = format!("p:{i}");
        assert_eq!(
            s.at_new(&k).get(&k),
            Some(format!("v{i}").into_bytes()),
            "{k}"
        );
    }
    // Only the keys in scope were copied; the stray key out of scope is kept.
    assert_eq!(s.count(2..4), n as i64 + 1);
    assert_eq!(
        s.at_new("p:stray").call(&["EXISTS", "p:stray"]),
        Resp::Int(0)
    );
    assert_eq!(
        s.at_new("q:stray").get("q:stray"),
        Some(b"someone else's".to_vec())
    );
    for k in ["p:x:0", "q:0", "P:up"] {
        assert_eq!(s.at_new(k).call(&["EXISTS", k]), Resp::Int(0), "{k}");
    }
    // The same scope matches now; without it the other keys are missing.
    let out = s.run(&scoped(&[]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = s.run(&[]);
    assert!(
        line(&out, "scanned ").starts_with(&format!(
            "scanned {}, matched {n}, missing_in_target 21,",
            n + 21
        )),
        "{}",
        text(&out)
    );
    // --ignore-case: `P:up` starts with `p:` too; `--skip-prefix` alone leaves out its keys.
    let out = s.run(&scoped(&["--ignore-case"]));
    assert!(
        line(&out, "scanned ").starts_with(&format!(
            "scanned {}, matched {n}, missing_in_target 1,",
            n + 1
        )),
        "{}",
        text(&out)
    );
    let out = s.run(&["--skip-prefix", "p:", "--skip-prefix", "P:"]);
    assert!(
        line(&out, "scanned ").starts_with("scanned 12, matched 0, missing_in_target 12,"),
        "{}",
        text(&out)
    );
    // A glob character in the prefix is matched as itself.
    s.set_old("a*1", "star");
    s.set_old("ab1", "no star");
    let out = s.run(&["--prefix", "a*"]);
    assert!(
        line(&out, "scanned ").starts_with("scanned 1, matched 0, missing_in_target 1,"),
        "{}",
        text(&out)
    );
    assert!(
        stdout(&out).contains("missing_in_target \"a*1\""),
        "{}",
        text(&out)
    );
    // At most one --prefix.
    let out = s.run(&["--prefix", "p:", "--prefix", "q:"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// `--move` (and its `--plan`) with a scope moves the keys in scope only, and its checkpoint
/// refuses a run over another scope; `--cleanup` with a scope deletes only those keys.
#[test]
fn scope_limits_move_plan_and_cleanup() {
    let mut s = setup();
    let n = fill(&mut s);
    let out = s.run(&scoped(&["--move", "--plan"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        line(&out, "plan: ").starts_with(&format!("plan: scanned {n}, move {n}, keep 0,")),
        "{}",
        text(&out)
    );
    assert_eq!(s.count(2..4), 0, "the plan moves nothing");
    let cp = std::env::temp_dir().join(format!("respway-scope-cp-{}", std::process::id()));
    let _ = std::fs::remove_file(&cp);
    let cp_arg = cp.to_str().expect("utf-8 path");
    let out = s.run(&scoped(&["--move", "--checkpoint", cp_arg]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        stdout(&out),
        format!("scanned {n}, sent {n}, kept 0, absent 0, failed 0, big 0\n")
    );
    for i in 0..20 {
        let k = format!("p:{i}");
        assert_eq!(
            s.at_new(&k).get(&k),
            Some(format!("v{i}").into_bytes()),
            "{k}"
        );
        assert_eq!(s.at_old(&k).call(&["EXISTS", &k]), Resp::Int(0), "{k}");
    }
    // Every other key stays where it was.
    assert_eq!(s.count(0..2), 8 + 12 + 1);
    assert_eq!(s.count(2..4), n as i64);
    assert_eq!(s.at_old("q:3").get("q:3"), Some(b"other".to_vec()));
    assert_eq!(s.at_old("p:x:3").get("p:x:3"), Some(b"skipped".to_vec()));
    // The checkpoint is of this scope's walk: another scope starts over elsewhere.
    let out = s.run(&["--move", "--checkpoint", cp_arg]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains(
            "it is the checkpoint of a walk over prefix \"p:\", skip \"p:x:\", not over every key"
        ),
        "{}",
        text(&out)
    );
    assert_eq!(s.count(0..2), 8 + 12 + 1, "nothing moved");
    let _ = std::fs::remove_file(&cp);

    // The rest copied, then the cut-over: the cleanup deletes the keys in scope only.
    let out = s.run(&["--repair"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    s.cut_over();
    let out = s.run(&["--cleanup", "--prefix", "q:", "--skip-prefix", "q:1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // q:1 and q:10, q:11 are skipped: 9 of the 12.
    assert_eq!(
        line(&out, "cleanup: "),
        "cleanup: scanned 9, deletable 9, kept 0, deleted 0 (dry run; --apply deletes)"
    );
    let out = s.run(&[
        "--cleanup",
        "--apply",
        "--prefix",
        "q:",
        "--skip-prefix",
        "q:1",
    ]);
    assert_eq!(
        line(&out, "cleanup: "),
        "cleanup: scanned 9, deletable 9, kept 0, deleted 9"
    );
    for i in 0..12 {
        let k = format!("q:{i}");
        let left = i64::from(i == 1 || i >= 10);
        assert_eq!(s.at_old(&k).call(&["EXISTS", &k]), Resp::Int(left), "{k}");
        assert_eq!(s.at_new(&k).get(&k), Some(b"other".to_vec()), "{k}");
    }
    assert_eq!(s.count(0..2), 8 + 3 + 1);
}

fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// A `--keys` file in the temp folder.
struct KeysFile(PathBuf);

impl KeysFile {
    fn new(name: &str, text: &str) -> KeysFile {
        let p = std::env::temp_dir().join(format!("respway-keys-{name}-{}", std::process::id()));
        std::fs::write(&p, text).expect("write keys");
        KeysFile(p)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for KeysFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `--keys FILE` compares and repairs the listed keys only (an unlisted key that differs
/// stays different); with `--prune` it deletes a listed key the source lacks from the target,
/// not an unlisted one; a line that is not hex is a usage error naming it.
#[test]
fn listed_keys_are_the_only_ones_compared_repaired_and_pruned() {
    let mut s = setup();
    for i in 0..10 {
        let (k, v) = (format!("k:{i}"), format!("v{i}"));
        s.set_old(&k, &v);
        s.set_new(&k, &v);
    }
    s.set_new("k:2", "changed");
    s.set_new("k:9", "changed too");
    s.conns[2 + s.new.pick(b"k:3")].call(&["DEL", "k:3"]);
    s.set_old("skip:1", "listed but out of scope");
    // On the target only: a key deleted on the source while dual write copied it, listed,
    // and a stray one, not listed.
    s.set_new("gone", "resurrected");
    s.set_new("stray", "not listed");
    // Listed: k:1 (twice, in upper-case hex), k:2, k:3, gone, never (on neither side), skip:1.
    let listing = format!(
        "{}\n{}\n\n{}\r\n{}\n{}\n{}\n{}\n",
        hex("k:1"),
        hex("k:1").to_uppercase(),
        hex("k:2"),
        hex("k:3"),
        hex("gone"),
        hex("never"),
        hex("skip:1")
    );
    let file = KeysFile::new("listed", &listing);
    let keys = ["--keys", file.arg(), "--skip-prefix", "skip:"];
    let out = s.run(&keys);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        line(&out, "scanned "),
        "scanned 5, matched 1, missing_in_target 1, type_mismatch 0, value_mismatch 1, ttl_mismatch 0"
    );
    assert!(
        stdout(&out).contains("2 scanned keys were deleted or expired on the source"),
        "{}",
        text(&out)
    );
    assert!(!stdout(&out).contains("k:9"), "{}", text(&out));

    let mut repair = keys.to_vec();
    repair.extend(["--repair", "--prune"]);
    let out = s.run(&repair);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        line(&out, "scanned ").ends_with("repaired 2, unsettled 0"),
        "{}",
        text(&out)
    );
    assert_eq!(line(&out, "pruned "), "pruned 1");
    assert_eq!(s.at_new("k:2").get("k:2"), Some(b"v2".to_vec()));
    assert_eq!(s.at_new("k:3").get("k:3"), Some(b"v3".to_vec()));
    // Not listed: still different, still there.
    assert_eq!(s.at_new("k:9").get("k:9"), Some(b"changed too".to_vec()));
    assert_eq!(s.at_new("stray").get("stray"), Some(b"not listed".to_vec()));
    assert_eq!(s.at_new("gone").call(&["EXISTS", "gone"]), Resp::Int(0));
    assert_eq!(s.at_new("skip:1").call(&["EXISTS", "skip:1"]), Resp::Int(0));
    // A whole-keyspace compare still finds k:9 (and skip:1).
    let out = s.run(&[]);
    assert!(
        line(&out, "scanned ").starts_with(
            "scanned 11, matched 9, missing_in_target 1, type_mismatch 0, value_mismatch 1,"
        ),
        "{}",
        text(&out)
    );

    // `-`: the list on stdin.
    let mut child = s
        .command(&["--keys", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run respway-compare");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "{}\n{}", hex("k:9"), hex("k:4")).expect("write stdin");
    drop(stdin);
    let out = child.wait_with_output().expect("output");
    assert_eq!(
        line(&out, "scanned "),
        "scanned 2, matched 1, missing_in_target 0, type_mismatch 0, value_mismatch 1, ttl_mismatch 0"
    );

    // Not hex: exit 2, naming the line; nothing compared.
    let bad = KeysFile::new("bad", &format!("{}\n\nk:1\n", hex("k:1")));
    let out = s.run(&["--keys", bad.arg()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains(&format!(
            "--keys {}: line 3: not a hex-encoded key",
            bad.arg()
        )),
        "{}",
        text(&out)
    );
    assert!(stdout(&out).is_empty(), "{}", text(&out));
    // Not with --move, --cleanup or --limit.
    for other in [&["--move"][..], &["--cleanup"], &["--limit", "3"]] {
        let mut a = vec!["--keys", file.arg()];
        a.extend(other);
        let out = s.run(&a);
        assert_eq!(out.status.code(), Some(2), "{other:?}: {}", text(&out));
    }
}

/// A prefix moved to `new` while the catch-all stays on `old` (one business domain moved out
/// of a shared cluster): the cleanup of that prefix deletes its keys from `old` though the
/// catch-all still sends other keys there, and leaves the others; a cleanup of every key is
/// still refused, and so is the prefix's while its own route still sends to `old`. Failing
/// before: any route sending to `old` refused every cleanup (exit 2).
#[test]
fn a_prefix_is_cleaned_up_while_other_routes_still_use_the_source() {
    let mut s = setup();
    for i in 0..10 {
        s.set_old(&format!("p:{i}"), "moved");
        s.set_new(&format!("p:{i}"), "moved");
        s.set_old(&format!("q:{i}"), "stays");
    }
    let yaml = std::fs::read_to_string(&s.config).expect("read config");
    let routes = |p_on: &str| {
        yaml.replace(
            "routes: { catch_all: old }",
            &format!(
                "routes: {{ catch_all: old, prefixes: [ {{ prefix: \"p:\", cluster: {p_on} }} ] }}"
            ),
        )
    };
    // The prefix still on `old`: refused.
    std::fs::write(&s.config, routes("old")).expect("write config");
    let out = s.run(&["--cleanup", "--apply", "--prefix", "p:"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr(&out).contains("--cleanup refused: listener \"main\" route \"p:\""),
        "{}",
        text(&out)
    );
    // Cut over: the prefix's keys go, the catch-all's stay.
    std::fs::write(&s.config, routes("new")).expect("write config");
    let out = s.run(&["--cleanup", "--apply"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "every key: refused: {}",
        text(&out)
    );
    let out = s.run(&["--cleanup", "--apply", "--prefix", "p:"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        line(&out, "cleanup: "),
        "cleanup: scanned 10, deletable 10, kept 0, deleted 10"
    );
    assert_eq!(s.count(0..2), 10, "the catch-all's keys stay on old");
    assert_eq!(s.at_old("q:3").get("q:3"), Some(b"stays".to_vec()));
}

//! The repair's steps one at a time against real `redis-server`s, so that a delete on the
//! source can be placed exactly between them: between the comparison and the copy, and
//! between the copy and its verification.

use super::*;
use crate::compare::Pending;
use crate::repair::Copy;
use respway_testkit::{redis, Proc, Resp, RespConn};

struct Fixture {
    _servers: [Proc; 2],
    path: PathBuf,
    src: RespConn,
    dst: RespConn,
    source: Side,
    target: Side,
    cmp: Compare,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One shard each side.
async fn fixture() -> Fixture {
    let (a, b) = (redis(), redis());
    let shard = |p: &Proc| {
        format!(
            "    shards:\n      - endpoints: [ {{ address: \"{}\", role: primary }} ]\n",
            p.addr
        )
    };
    let yaml = format!(
        "listeners:\n  - name: main\n    routes: {{ catch_all: src }}\n\
         clusters:\n  - name: src\n{}  - name: dst\n{}",
        shard(&a),
        shard(&b)
    );
    let path = std::env::temp_dir().join(format!(
        "respway-compare-unit-{}-{}.yaml",
        std::process::id(),
        a.addr.port()
    ));
    std::fs::write(&path, yaml).expect("write config");
    let config = respway_xds::load_file(&path).expect("valid config");
    let source = Plan::new(&config, "src", "--source").expect("src");
    let target = Plan::new(&config, "dst", "--target").expect("dst");
    let (source, target) = tokio::try_join!(source.connect(), target.connect()).expect("connect");
    Fixture {
        src: RespConn::connect(a.addr),
        dst: RespConn::connect(b.addr),
        _servers: [a, b],
        path,
        source,
        target,
        cmp: Compare {
            report: Report::new(20, true),
            sample_big: 1000,
            ttl_tolerance: 1000,
            repair_rounds: Some(3),
            rate: 1_000_000,
            started: Instant::now(),
            work: 0,
        },
    }
}

fn key(k: &str) -> Bytes {
    Bytes::copy_from_slice(k.as_bytes())
}

fn pending(k: &str) -> Pending {
    Pending {
        key: key(k),
        reason: "test".to_string(),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_key_deleted_on_the_source_before_the_copy_is_not_written() {
    let mut f = fixture().await;
    f.src.call(&["SET", "gone", "v1"]);
    f.dst.call(&["SET", "gone", "stale"]);
    f.src.call(&["SET", "never", "v"]);
    let checks = f
        .cmp
        .check(
            &mut f.source,
            &mut f.target,
            0,
            vec![key("gone"), key("never")],
        )
        .await
        .expect("check");
    assert_eq!(checks.differing().len(), 2);
    // Deleted on the source between the comparison and the repair.
    f.src.call(&["DEL", "gone", "never"]);
    let pending = vec![pending("gone"), pending("never")];
    f.cmp
        .repair(&mut f.source, &mut f.target, 0, pending, 3)
        .await
        .expect("repair");
    // Not written: what the target holds is left to the writes that reach it.
    assert_eq!(f.dst.call(&["GET", "gone"]), Resp::bulk("stale"));
    assert_eq!(f.dst.call(&["EXISTS", "never"]), Resp::Int(0));
    let r = &f.cmp.report;
    assert_eq!((r.gone_while_repaired, r.repaired, r.unsettled), (2, 0, 0));
}

#[tokio::test(flavor = "current_thread")]
async fn a_key_deleted_on_the_source_after_its_copy_is_taken_back_unless_rewritten() {
    let mut f = fixture().await;
    f.src.call(&["SET", "late", "v"]);
    f.src.call(&["RPUSH", "raced", "a", "b"]);
    let copies = f
        .cmp
        .copy(
            &mut f.source,
            &mut f.target,
            0,
            &[pending("late"), pending("raced")],
        )
        .await
        .expect("copy");
    let dumps: Vec<Bytes> = copies
        .into_iter()
        .map(|c| match c {
            Copy::Written(dump) => dump,
            Copy::Gone => panic!("gone"),
            Copy::Failed(reason) => panic!("{reason}"),
        })
        .collect();
    assert_eq!(f.dst.call(&["GET", "late"]), Resp::bulk("v"));
    // Both deleted on the source after the copy; a newer write reached the target's `raced`.
    f.src.call(&["DEL", "late", "raced"]);
    f.dst.call(&["RPUSH", "raced", "c"]);
    let written = vec![
        (key("late"), dumps[0].clone()),
        (key("raced"), dumps[1].clone()),
    ];
    let next = f
        .cmp
        .verify(&mut f.source, &mut f.target, 0, written)
        .await
        .expect("verify");
    assert!(next.is_empty());
    // The copy is not left behind as a resurrected key; the newer write is kept.
    assert_eq!(f.dst.call(&["EXISTS", "late"]), Resp::Int(0));
    assert_eq!(f.dst.call(&["LLEN", "raced"]), Resp::Int(3));
    assert_eq!(f.cmp.report.gone_while_repaired, 2);
}

/// `--checkpoint`'s file: what is saved is what is loaded; a file of other clusters, or not a
/// checkpoint at all, is refused with its name.
#[tokio::test(flavor = "current_thread")]
async fn checkpoint_round_trips_and_refuses_other_clusters() {
    let f = fixture().await;
    let (src, dst) = (&f.source.cluster, &f.target.cluster);
    let path = std::env::temp_dir().join(format!("respway-cp-unit-{}", std::process::id()));
    let mut cp = Checkpoint::fresh(Some(path.clone()), src, dst, &Scope::default());
    assert!(Checkpoint::load(&path, src, dst, &Scope::default())
        .expect("none")
        .is_none());
    cp.moves.scanned = 12;
    cp.moves.sent = 7;
    cp.moves.big = 1;
    cp.moves.bytes = 900;
    cp.shards[0].1 = Cursor::At(Bytes::from_static(b"1234"));
    cp.save().expect("save");
    let back = Checkpoint::load(&path, src, dst, &Scope::default())
        .expect("load")
        .expect("some");
    assert_eq!(back.shards, cp.shards);
    assert_eq!(back.moves.summary(), cp.moves.summary());
    assert_eq!(back.moves.bytes, 900);
    cp.shards[0].1 = Cursor::Done;
    cp.save().expect("save");
    let back = Checkpoint::load(&path, src, dst, &Scope::default())
        .expect("load")
        .expect("some");
    assert_eq!(back.shards[0].1, Cursor::Done);
    let err = Checkpoint::load(&path, dst, src, &Scope::default()).expect_err("other clusters");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(err.contains("--source src --target dst"), "{err}");
    std::fs::write(&path, "something else\n").expect("write");
    let err = Checkpoint::load(&path, src, dst, &Scope::default()).expect_err("not a checkpoint");
    assert!(err.contains("not a mover checkpoint"), "{err}");
    let _ = std::fs::remove_file(&path);
}

/// `--prefix`'s SCAN pattern matches the prefix itself: the glob's special bytes are escaped,
/// and with `--ignore-case` each letter is the class of its two cases.
#[test]
fn a_prefix_becomes_a_glob_that_matches_only_itself() {
    assert_eq!(scope::glob(b"user:", false), b"user:".to_vec());
    assert_eq!(
        scope::glob(b"a*b?c[d]e\\f", false),
        b"a\\*b\\?c\\[d\\]e\\\\f".to_vec()
    );
    assert_eq!(scope::glob(b"", false), Vec::<u8>::new());
    assert_eq!(scope::glob(b"Ab:1*", true), b"[aA][bB]:1\\*".to_vec());
    let s = Scope::new(Some("p*:"), &[], false);
    assert_eq!(s.pattern(), Some(Bytes::from_static(b"p\\*:*")));
    assert_eq!(Scope::default().pattern(), None);
    assert_eq!(Scope::new(None, &["x".into()], false).pattern(), None);
}

/// A key is in scope when it starts with `--prefix` and with no `--skip-prefix`, byte for
/// byte, or ignoring ASCII case with `--ignore-case`.
#[test]
fn the_scope_keeps_the_prefix_and_leaves_out_the_skipped_ones() {
    let all = Scope::default();
    assert!(all.is_all() && all.contains(b"anything") && all.contains(b""));
    let s = Scope::new(Some("p:"), &["p:x:".into(), "p:y".into()], false);
    assert!(!s.is_all());
    for (key, inside) in [
        (&b"p:1"[..], true),
        (b"p:", true),
        (b"p:x", true),
        (b"p:x:1", false),
        (b"p:yz", false),
        (b"P:1", false),
        (b"q:1", false),
        (b"p", false),
    ] {
        assert_eq!(s.contains(key), inside, "{}", String::from_utf8_lossy(key));
    }
    let skip_only = Scope::new(None, &["a:".into()], false);
    assert!(skip_only.contains(b"b:1") && !skip_only.contains(b"a:1"));
    let nocase = Scope::new(Some("p:"), &["p:x:".into()], true);
    assert!(nocase.contains(b"P:1") && !nocase.contains(b"P:X:1") && !nocase.contains(b"q:1"));
    assert_eq!(s.describe(), "prefix \"p:\", skip \"p:x:\", skip \"p:y\"");
    assert_eq!(all.describe(), "");
}

/// `--keys`: hex in either case, empty lines skipped, spaces and `\r` around a line ignored; a
/// line that is not hex names its number.
#[test]
fn listed_keys_are_hex_one_per_line() {
    assert_eq!(listed::hex(b"703a31"), Some(b"p:1".to_vec()));
    assert_eq!(listed::hex(b"703A3F00fF"), Some(b"p:?\x00\xff".to_vec()));
    assert_eq!(listed::hex(b""), Some(Vec::new()));
    assert_eq!(listed::hex(b"7"), None);
    assert_eq!(listed::hex(b"7g"), None);
    assert_eq!(listed::hex(b"+1"), None);
    let keys = listed::parse(b"703a31\n\n  6B6579\r\n\r\n00\n").expect("valid");
    assert_eq!(
        keys,
        vec![
            Bytes::from_static(b"p:1"),
            Bytes::from_static(b"key"),
            Bytes::from_static(b"\x00")
        ]
    );
    assert_eq!(listed::parse(b"").expect("empty"), Vec::<Bytes>::new());
    let err = listed::parse(b"703a31\n\nkey:1\n").expect_err("not hex");
    assert!(
        err.starts_with("line 3: not a hex-encoded key (\"key:1\""),
        "{err}"
    );
    let err = listed::parse(b"abc\n").expect_err("odd");
    assert!(err.starts_with("line 1: "), "{err}");
}

/// A checkpoint remembers the walk's scope: resumed with the same scope it loads, with
/// another (or none) it is refused; a file without a scope line is a walk over every key.
#[tokio::test(flavor = "current_thread")]
async fn checkpoint_refuses_another_scope() {
    let f = fixture().await;
    let (src, dst) = (&f.source.cluster, &f.target.cluster);
    let path = std::env::temp_dir().join(format!("respway-cp-scope-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let scope = Scope::new(Some("p:"), &["p:x:".into()], false);
    let mut cp = Checkpoint::fresh(Some(path.clone()), src, dst, &scope);
    cp.shards[0].1 = Cursor::At(Bytes::from_static(b"17"));
    cp.save().expect("save");
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(
        text.contains("\nscope prefix \"p:\", skip \"p:x:\"\ncounters "),
        "{text}"
    );
    let back = Checkpoint::load(&path, src, dst, &scope)
        .expect("same scope")
        .expect("some");
    assert_eq!(back.shards, cp.shards);
    let err = Checkpoint::load(&path, src, dst, &Scope::default()).expect_err("no scope");
    assert!(
        err.contains("a walk over prefix \"p:\", skip \"p:x:\", not over every key"),
        "{err}"
    );
    let other = Scope::new(Some("q:"), &[], false);
    assert!(Checkpoint::load(&path, src, dst, &other).is_err());
    let unscoped = Checkpoint::fresh(Some(path.clone()), src, dst, &Scope::default());
    unscoped.save().expect("save");
    assert!(!std::fs::read_to_string(&path)
        .expect("read")
        .contains("scope"));
    assert!(Checkpoint::load(&path, src, dst, &scope).is_err());
    assert!(Checkpoint::load(&path, src, dst, &Scope::default())
        .expect("load")
        .is_some());
    let _ = std::fs::remove_file(&path);
}

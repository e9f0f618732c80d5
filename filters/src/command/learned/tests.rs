use super::*;
use crate::command::CommandClass;

fn b(s: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}
fn st(s: &str) -> Frame {
    Frame::Simple(Bytes::copy_from_slice(s.as_bytes()))
}
fn arr(items: Vec<Frame>) -> Frame {
    Frame::Array(items)
}
fn range(index: i64, lastkey: i64, keystep: i64, flags: &[&str]) -> Frame {
    arr(vec![
        b("flags"),
        arr(flags.iter().map(|f| st(f)).collect()),
        b("begin_search"),
        arr(vec![
            b("type"),
            b("index"),
            b("spec"),
            arr(vec![b("index"), Frame::Integer(index)]),
        ]),
        b("find_keys"),
        arr(vec![
            b("type"),
            b("range"),
            b("spec"),
            arr(vec![
                b("lastkey"),
                Frame::Integer(lastkey),
                b("keystep"),
                Frame::Integer(keystep),
                b("limit"),
                Frame::Integer(0),
            ]),
        ]),
    ])
}
fn keyword_keynum(keyword: &str, startfrom: i64, flags: &[&str]) -> Frame {
    arr(vec![
        b("flags"),
        arr(flags.iter().map(|f| st(f)).collect()),
        b("begin_search"),
        arr(vec![
            b("type"),
            b("keyword"),
            b("spec"),
            arr(vec![
                b("keyword"),
                b(keyword),
                b("startfrom"),
                Frame::Integer(startfrom),
            ]),
        ]),
        b("find_keys"),
        arr(vec![
            b("type"),
            b("keynum"),
            b("spec"),
            arr(vec![
                b("keynumidx"),
                Frame::Integer(0),
                b("firstkey"),
                Frame::Integer(1),
                b("keystep"),
                Frame::Integer(1),
            ]),
        ]),
    ])
}
fn command(name: &str, arity: i64, flags: &[&str], specs: Vec<Frame>) -> Frame {
    arr(vec![
        b(name),
        Frame::Integer(arity),
        arr(flags.iter().map(|f| st(f)).collect()),
        Frame::Integer(1),
        Frame::Integer(1),
        Frame::Integer(1),
        arr(vec![st("@write")]),
        arr(vec![]),
        arr(specs),
        arr(vec![]),
    ])
}
fn args(s: &str) -> Vec<Bytes> {
    s.split(' ')
        .map(|a| Bytes::copy_from_slice(a.as_bytes()))
        .collect()
}
fn keys(c: &CommandInfo, s: &str) -> Result<Vec<usize>, &'static str> {
    let mut out = Vec::new();
    c.key_indices(&args(s), &mut out).map(|()| out)
}

/// FT.ADD as RediSearch 1.2 on Redis 7.0.15 reports it: one key at 1.
#[test]
fn a_single_key_module_command() {
    let f = command(
        "FT.ADD",
        -1,
        &["write", "denyoom", "module"],
        vec![range(1, 0, 1, &["RW", "access", "update"])],
    );
    let c = parse_command(&f).unwrap();
    assert_eq!(c.refused, None);
    assert_eq!(c.info.name, "ft.add");
    assert_eq!(c.info.class, CommandClass::Single);
    assert!(c.info.is_write() && c.info.has_flag(MODULE));
    assert_eq!(c.info.acl_categories, ["@write", "@slow"]);
    assert_eq!(
        keys(c.info, "FT.ADD idx doc1 1.0 FIELDS t hello"),
        Ok(vec![1])
    );
    // The same reply gives the same entry.
    assert!(std::ptr::eq(parse_command(&f).unwrap().info, c.info));
}

#[test]
fn keynum_and_keyword_specs_find_every_key() {
    let f = command(
        "T.MSET",
        -3,
        &["write"],
        vec![keyword_keynum("KEYS", 1, &["OW", "update"])],
    );
    let c = parse_command(&f).unwrap();
    assert_eq!(c.info.class, CommandClass::SameShard);
    assert_eq!(keys(c.info, "T.MSET x KEYS 2 a b v"), Ok(vec![4, 5]));
    assert_eq!(keys(c.info, "T.MSET x keys 0"), Ok(vec![]));
    assert_eq!(keys(c.info, "T.MSET x nokeyword 1 a"), Ok(vec![]));
    assert_eq!(
        keys(c.info, "T.MSET x KEYS 3 a b"),
        Err("Number of keys can't be greater than number of args")
    );
    assert_eq!(
        keys(c.info, "T.MSET x KEYS z a"),
        Err("value is not an integer or out of range")
    );
    // A count the client made as large as it gets is too many keys, not an overflow.
    assert_eq!(
        keys(c.info, "T.MSET x KEYS 9223372036854775807 a"),
        Err("Number of keys can't be greater than number of args")
    );
    // A range to the end, every other argument (MSET's shape).
    let f = command("T.MSET2", -3, &["write"], vec![range(1, -1, 2, &["OW"])]);
    let c = parse_command(&f).unwrap();
    assert_eq!(c.info.class, CommandClass::SameShard);
    assert_eq!(keys(c.info, "T.MSET2 a 1 b 2"), Ok(vec![1, 3]));
    // Two specs: both keys, in order.
    let f = command(
        "T.COPY",
        3,
        &["write"],
        vec![range(1, 0, 1, &["RO"]), range(2, 0, 1, &["OW"])],
    );
    let c = parse_command(&f).unwrap();
    assert_eq!(c.info.class, CommandClass::SameShard);
    assert_eq!(keys(c.info, "T.COPY a b"), Ok(vec![1, 2]));
}

#[test]
fn commands_whose_keys_cannot_be_followed_are_asked_for_or_refused_with_the_reason() {
    let f = command(
        "T.ODD",
        -2,
        &["write", "movablekeys"],
        vec![range(1, 0, 1, &["RW", "incomplete"])],
    );
    // Incomplete specs: a shard names the keys (the session asks), all on one shard.
    let c = parse_command(&f).unwrap();
    assert_eq!(c.info.class, CommandClass::SameShard);
    assert_eq!(c.info.keys, KeySpec::Asked);
    assert_eq!(c.refused, None);
    assert_eq!(keys(c.info, "T.ODD a"), Err(crate::command::ASKED_KEYS));
    let f = command("T.NOKEYS", 1, &["readonly"], vec![]);
    assert_eq!(
        parse_command(&f).unwrap().refused,
        Some("it has no keys to route it by")
    );
    let f = command(
        "T.BLOCK",
        3,
        &["write", "blocking"],
        vec![range(1, 0, 1, &["RW"])],
    );
    assert!(parse_command(&f)
        .unwrap()
        .refused
        .unwrap()
        .contains("blocking"));
    // Refused with incomplete specs: never asked for its keys.
    let f = command(
        "T.BLOCKODD",
        -2,
        &["write", "blocking", "movablekeys"],
        vec![range(1, 0, 1, &["RW", "incomplete"])],
    );
    let c = parse_command(&f).unwrap();
    assert!(c.refused.unwrap().contains("blocking"));
    assert_eq!(c.info.keys, KeySpec::None);
    // A null entry (a name the server does not know) is no command.
    assert!(parse_command(&Frame::NullArray).is_none());
}

#[test]
fn the_registry_looks_names_up_ignoring_case_and_forgets_endpoints_that_left() {
    let f = command("T.GET1", 2, &["readonly"], vec![range(1, 0, 1, &["RO"])]);
    let c = parse_command(&f).unwrap();
    let learned = Learned::default();
    assert!(learned.lookup(b"t.get1").is_none());
    learned.set(
        "main",
        "127.0.0.1:1",
        EndpointTable {
            version: "7.0.15".into(),
            commands: vec![c],
            error: None,
        },
    );
    assert!(std::ptr::eq(learned.lookup(b"T.Get1").unwrap(), c.info));
    assert!(learned.lookup(b"t.get2").is_none());
    assert!(learned.lookup(&[b'x'; 200]).is_none());
    learned.failed("main", "127.0.0.1:1", "gone".into());
    assert!(
        learned.lookup(b"t.get1").is_some(),
        "a failure keeps the last table"
    );
    learned.retain(|_, e| e != "127.0.0.1:1");
    assert!(learned.lookup(b"t.get1").is_none());
}

/// A server before key specs (Redis 6: seven fields) is read by its legacy range.
#[test]
fn a_reply_without_key_specs_uses_the_legacy_range() {
    let f = arr(vec![
        b("old.mset"),
        Frame::Integer(-3),
        arr(vec![st("write")]),
        Frame::Integer(1),
        Frame::Integer(-1),
        Frame::Integer(2),
        arr(vec![]),
    ]);
    let c = parse_command(&f).unwrap();
    assert_eq!(c.info.class, CommandClass::SameShard);
    assert_eq!(keys(c.info, "OLD.MSET a 1 b 2"), Ok(vec![1, 3]));
    let f = arr(vec![
        b("old.get"),
        Frame::Integer(2),
        arr(vec![st("readonly")]),
        Frame::Integer(1),
        Frame::Integer(1),
        Frame::Integer(1),
        arr(vec![]),
    ]);
    let c = parse_command(&f).unwrap();
    assert_eq!(c.info.class, CommandClass::Single);
    assert_eq!(keys(c.info, "OLD.GET k"), Ok(vec![1]));
    let f = arr(vec![
        b("old.eval"),
        Frame::Integer(-3),
        arr(vec![st("write"), st("movablekeys")]),
        Frame::Integer(0),
        Frame::Integer(0),
        Frame::Integer(0),
        arr(vec![]),
    ]);
    assert_eq!(
        parse_command(&f).unwrap().refused,
        Some("its keys are movable and it has no key specs")
    );
}

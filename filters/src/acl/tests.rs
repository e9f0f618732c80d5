use super::*;

fn cmd(name: &str) -> &'static CommandInfo {
    command::lookup(name.as_bytes()).expect("command")
}

fn args(a: &[&str]) -> Vec<Bytes> {
    a.iter()
        .map(|s| Bytes::copy_from_slice(s.as_bytes()))
        .collect()
}

fn check(p: &Permissions, a: &[&str]) -> Result<(), Denied> {
    let a = args(a);
    let c = cmd(std::str::from_utf8(&a[0]).unwrap()).resolve(&a);
    let mut keys = Vec::new();
    let found = c.key_indices(&a, &mut keys);
    p.check(c, &a, found.map(|()| keys.as_slice()))
}

#[test]
fn glob_matches_as_redis_does() {
    let yes = [
        ("*", ""),
        ("*", "abc"),
        ("a*", "abc"),
        ("*c", "abc"),
        ("a?c", "abc"),
        ("a[bx]c", "abc"),
        ("a[^x]c", "abc"),
        ("a[a-c]c", "abc"),
        ("a[c-a]c", "abc"),
        ("a\\*c", "a*c"),
        ("a[\\]]c", "a]c"),
        ("user:*:name", "user:42:name"),
        ("*a*b*", "xxaxxbxx"),
        ("a\\", "a\\"),
    ];
    let no = [
        ("a*", "bac"),
        ("a?c", "ac"),
        ("a[^b]c", "abc"),
        ("a[x-z]c", "abc"),
        ("a\\*c", "abc"),
        ("user:*:name", "user:42:age"),
        ("abc", "ABC"),
        ("", "a"),
    ];
    for (p, s) in yes {
        assert!(glob_match(p.as_bytes(), s.as_bytes()), "{p} ~ {s}");
    }
    for (p, s) in no {
        assert!(!glob_match(p.as_bytes(), s.as_bytes()), "{p} !~ {s}");
    }
}

#[test]
fn digests_compare_and_read_hex() {
    let d = sha256(b"pw");
    let hex = digest_to_hex(&d);
    assert_eq!(
        hex,
        "30c952fab122c3f9759f02a6d95c3758b246b4fee239957b2d4fee46e26170c4"
    );
    assert_eq!(digest_from_hex(&hex.to_uppercase()), Some(d));
    assert_eq!(digest_from_hex("30c9"), None);
    assert_eq!(digest_from_hex(&"g".repeat(64)), None);
    assert!(password_matches(&[sha256(b"x"), d], b"pw"));
    assert!(!password_matches(&[d], b"pw2"));
    assert!(!password_matches(&[], b"pw"));
}

#[test]
fn rules_apply_left_to_right() {
    let p = Permissions::compile(&["+@all", "-@dangerous", "~app:*"], false).unwrap();
    assert_eq!(check(&p, &["GET", "app:1"]), Ok(()));
    assert_eq!(check(&p, &["GET", "other"]), Err(Denied::Key));
    assert_eq!(check(&p, &["FLUSHALL"]), Err(Denied::Command));
    assert_eq!(check(&p, &["KEYS", "*"]), Err(Denied::Command));
    assert_eq!(check(&p, &["MGET", "app:1", "x"]), Err(Denied::Key));
    assert_eq!(check(&p, &["MSET", "app:1", "v", "app:2", "v"]), Ok(()));
    assert_eq!(
        check(&p, &["MSET", "app:1", "v", "x", "v"]),
        Err(Denied::Key)
    );
    // Later rules win over earlier ones.
    let p = Permissions::compile(&["-@all", "+get", "allkeys", "-get"], false).unwrap();
    assert_eq!(check(&p, &["GET", "k"]), Err(Denied::Command));
    let p = Permissions::compile(&["allcommands", "allkeys", "resetkeys", "~a"], false).unwrap();
    assert_eq!(check(&p, &["GET", "b"]), Err(Denied::Key));
    assert_eq!(check(&p, &["GET", "a"]), Ok(()));
}

#[test]
fn subcommands_and_categories() {
    let p = Permissions::compile(&["allkeys", "+config", "-config|set"], false).unwrap();
    assert_eq!(check(&p, &["CONFIG", "GET", "x"]), Ok(()));
    assert_eq!(
        check(&p, &["CONFIG", "SET", "x", "y"]),
        Err(Denied::Command)
    );
    let p = Permissions::compile(&["allkeys", "+client|id"], false).unwrap();
    assert_eq!(check(&p, &["CLIENT", "ID"]), Ok(()));
    assert_eq!(check(&p, &["CLIENT", "LIST"]), Err(Denied::Command));
    let p = Permissions::compile(&["allkeys", "+@read"], false).unwrap();
    assert_eq!(check(&p, &["GET", "k"]), Ok(()));
    assert_eq!(check(&p, &["SET", "k", "v"]), Err(Denied::Command));
}

#[test]
fn read_only_takes_writes_away() {
    let p = Permissions::compile(&["allcommands", "allkeys"], true).unwrap();
    assert_eq!(check(&p, &["GET", "k"]), Ok(()));
    assert_eq!(check(&p, &["SET", "k", "v"]), Err(Denied::Command));
    assert_eq!(check(&p, &["DEL", "k"]), Err(Denied::Command));
    assert!(!p.unrestricted());
    let all = Permissions::compile(&["allcommands", "allkeys", "allchannels"], false);
    assert!(all.unwrap().unrestricted());
}

#[test]
fn auth_and_hello_are_always_allowed() {
    let p = Permissions::compile(&["nocommands"], false).unwrap();
    assert_eq!(check(&p, &["AUTH", "pw"]), Ok(()));
    assert_eq!(check(&p, &["HELLO", "3"]), Ok(()));
    assert_eq!(check(&p, &["PING"]), Err(Denied::Command));
}

#[test]
fn channels() {
    let p = Permissions::compile(&["allcommands", "&news.*"], false).unwrap();
    assert_eq!(check(&p, &["SUBSCRIBE", "news.a", "news.b"]), Ok(()));
    assert_eq!(
        check(&p, &["SUBSCRIBE", "news.a", "x"]),
        Err(Denied::Channel)
    );
    assert_eq!(check(&p, &["PUBLISH", "x", "m"]), Err(Denied::Channel));
    assert_eq!(check(&p, &["PSUBSCRIBE", "news.*"]), Ok(()));
    assert_eq!(check(&p, &["PSUBSCRIBE", "news.a*"]), Err(Denied::Channel));
}

#[test]
fn sort_patterns_need_allkeys() {
    let p = Permissions::compile(&["allcommands", "~l"], false).unwrap();
    assert_eq!(check(&p, &["SORT", "l"]), Ok(()));
    assert_eq!(check(&p, &["SORT", "l", "BY", "nosort"]), Ok(()));
    assert_eq!(check(&p, &["SORT", "l", "BY", "w_*"]), Err(Denied::SortBy));
    assert_eq!(check(&p, &["SORT", "l", "GET", "#"]), Err(Denied::SortGet));
}

#[test]
fn bad_rules_are_named() {
    for (r, want) in [
        ("+nosuch", "unknown command"),
        ("+@nosuch", "unknown category"),
        ("+get|x", "unknown command"),
        (">pw", "not a permission rule"),
        ("on", "not a permission rule"),
        ("%R~x", "not supported"),
        ("bogus", "unknown rule"),
    ] {
        let e = Permissions::check_rule(r).unwrap_err().to_string();
        assert!(e.contains(want), "{r}: {e}");
    }
}

#[test]
fn describe_lists_the_rules() {
    let p = Permissions::compile(&["~a*", "+get", "+@read"], false).unwrap();
    assert_eq!(p.describe(), "~a* resetchannels -@all +get +@read");
    let p = Permissions::compile(&["allcommands", "allkeys", "allchannels"], true).unwrap();
    assert_eq!(p.describe(), "~* &* +@all -@write");
}

//! Placement (`respway_filters::place`): one key's shard, a request's cluster, and the one
//! shard of a transaction or blocking command, with one typed refusal per reason.

use bytes::Bytes;

use crate::support::{cluster, routing_of, shard};
use respway_filters::model::{
    HashPolicy, HotKeyRead, HotKeyRule, MirrorMode, MirrorPolicy, PrefixRoute, RouteTable,
};
use respway_filters::place::{Purpose, Refusal, CROSSSLOT};
use respway_filters::routing::{RouteId, Routing};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// `main` (3 shards, hot prefix `HOT_`), `other` (1 shard, `o:` removed), `mirrored`
/// (`m:` into main, mirrored to other); the catch-all is main.
fn routing() -> std::sync::Arc<Routing> {
    let mut main = cluster(
        "main",
        HashPolicy::Crc16Slots,
        (0..3)
            .map(|i| shard(&format!("s{i}"), 7001 + i, None))
            .collect(),
    );
    main.hot_keys = vec![HotKeyRule {
        prefix: "HOT_".into(),
        read: HotKeyRead::RoundRobin,
    }];
    let other = cluster(
        "other",
        HashPolicy::Crc16Slots,
        vec![shard("o0", 7101, None)],
    );
    let routes = RouteTable {
        routes: vec![
            PrefixRoute {
                prefix: "o:".into(),
                remove_prefix: true,
                cluster: "other".into(),
                mirrors: Vec::new(),
            },
            PrefixRoute {
                prefix: "m:".into(),
                remove_prefix: false,
                cluster: "main".into(),
                mirrors: vec![MirrorPolicy {
                    cluster: "other".into(),
                    mode: MirrorMode::DualWrite {
                        target_is_primary: false,
                    },
                    include_reads: false,
                    fraction_ppm: 1_000_000,
                }],
            },
        ],
        case_insensitive: false,
        catch_all: Some("main".into()),
        catch_all_mirrors: Vec::new(),
    };
    routing_of(routes, vec![main, other], None)
}

/// Two keys of `main` on different shards (found, not assumed).
fn keys_apart(r: &Routing) -> (String, String) {
    let first = r.place_key(b"k0").unwrap().shard;
    let other = (1..1000)
        .map(|i| format!("k{i}"))
        .find(|k| r.place_key(k.as_bytes()).unwrap().shard != first)
        .unwrap();
    ("k0".into(), other)
}

#[test]
fn a_key_is_placed_by_its_stored_form() {
    let r = routing();
    let p = r.place_key(b"o:abc").unwrap();
    assert_eq!((p.cluster, p.shard, p.strip), (1, 0, 2));
    let p = r.place_key(b"{u}x").unwrap();
    assert_eq!(p.cluster, 0);
    assert_eq!(p.route, RouteId::CatchAll);
    assert_eq!(p.shard, r.place_key(b"{u}y").unwrap().shard, "same hashtag");
}

#[test]
fn route_keys_removes_prefixes_and_refuses_two_clusters() {
    let r = routing();
    let mut args = vec![b("MGET"), b("o:a"), b("o:b")];
    let (cluster, _, rewritten) = r.route_keys(&mut args, [1, 2].into_iter()).unwrap();
    assert_eq!((cluster, rewritten), (1, true));
    assert_eq!(args[1..], [b("a"), b("b")]);
    let mut args = vec![b("MGET"), b("a"), b("o:b")];
    assert_eq!(
        r.route_keys(&mut args, [1, 2].into_iter()),
        Err(Refusal::CrossCluster)
    );
    let mut args = vec![b("PING")];
    let (cluster, route, _) = r.route_keys(&mut args, std::iter::empty()).unwrap();
    assert_eq!((cluster, route), (0, RouteId::CatchAll));
}

#[test]
fn pinned_commands_need_one_shard_without_mirrors_or_hot_keys() {
    let r = routing();
    let (k0, k1) = keys_apart(&r);
    for why in [Purpose::Transaction, Purpose::Blocking] {
        let mut args = vec![b("BLPOP"), b(&k0), b(&k1), b("0")];
        assert_eq!(
            r.place_pinned(&mut args, &[1, 2], why),
            Err(Refusal::CrossSlot)
        );
        let mut args = vec![b("BLPOP"), b("a"), b("o:b"), b("0")];
        assert_eq!(
            r.place_pinned(&mut args, &[1, 2], why),
            Err(Refusal::CrossCluster)
        );
        let mut args = vec![b("SET"), b("m:x"), b("1")];
        assert_eq!(
            r.place_pinned(&mut args, &[1], why),
            Err(Refusal::Mirrored(why))
        );
        let mut args = vec![b("SET"), b("HOT_x"), b("1")];
        assert_eq!(
            r.place_pinned(&mut args, &[1], why),
            Err(Refusal::HotKey(why))
        );
        let mut args = vec![b("BLPOP"), b("o:{t}a"), b("o:{t}b"), b("0")];
        assert_eq!(r.place_pinned(&mut args, &[1, 2], why), Ok(Some((1, 0))));
        assert_eq!(args[1], b("{t}a"), "the route prefix is removed");
        assert_eq!(r.place_pinned(&mut [b("PING")], &[], why), Ok(None));
    }
}

#[test]
fn each_refusal_has_one_text() {
    let all = [
        Refusal::NoRoute(b("k")),
        Refusal::NoCatchAll,
        Refusal::CrossCluster,
        Refusal::CrossSlot,
        Refusal::Mirrored(Purpose::Transaction),
        Refusal::Mirrored(Purpose::Blocking),
        Refusal::HotKey(Purpose::Transaction),
        Refusal::HotKey(Purpose::Blocking),
        Refusal::NeedsKey(Purpose::Blocking),
        Refusal::Keys("syntax error".into()),
    ];
    let texts: std::collections::BTreeSet<Vec<u8>> =
        all.iter().map(|r| r.reply().to_vec()).collect();
    assert_eq!(texts.len(), all.len(), "two refusals share a text");
    assert_eq!(
        Refusal::CrossSlot.reply(),
        format!("-{CROSSSLOT}\r\n").as_bytes()
    );
}

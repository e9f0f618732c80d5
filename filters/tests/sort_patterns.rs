//! `SORT` / `SORT_RO` patterns: which may form keys away from the sorted key's shard.

use bytes::Bytes;

use crate::support::{cluster, routing_of, shard};
use respway_filters::model::{Cluster, HashPolicy, HashTag, PrefixRoute, RouteTable};
use respway_filters::routing::Routing;
use respway_filters::sort_patterns::{check, BY_DENIED, GET_DENIED};

fn catch_all(c: &str) -> RouteTable {
    RouteTable {
        catch_all: Some(c.to_string()),
        ..Default::default()
    }
}

/// Cluster `name` of three shards (ports `port`..`port + 2`), crc16 slots with `{}` hashtags.
fn three_tagged(name: &str, port: u16) -> Cluster {
    let mut c = cluster(
        name,
        HashPolicy::Crc16Slots,
        (0..3)
            .map(|i| shard(&format!("s{i}"), port + i, None))
            .collect(),
    );
    c.hashtag = Some(HashTag::default());
    c
}

/// Every key routed to [`three_tagged`] shards.
fn three() -> std::sync::Arc<Routing> {
    routing_of(catch_all("c"), vec![three_tagged("c", 7001)], None)
}

fn args(s: &str) -> Vec<Bytes> {
    s.split(' ')
        .map(|a| Bytes::copy_from_slice(a.as_bytes()))
        .collect()
}

#[test]
fn patterns_that_read_no_key_pass() {
    let r = three();
    for cmd in [
        "SORT a",
        "SORT a BY nosort",
        "SORT a BY w_fixed GET # GET o_fixed",
        "SORT a LIMIT 0 10 DESC ALPHA STORE {a}d",
        "SORT_RO a GET #",
    ] {
        assert_eq!(check(&args(cmd), &r), Ok(()), "{cmd}");
    }
}

#[test]
fn patterns_forming_keys_elsewhere_are_refused_in_option_order() {
    let r = three();
    assert_eq!(check(&args("SORT a BY w_*"), &r), Err(BY_DENIED));
    assert_eq!(check(&args("SORT a GET # GET o_*"), &r), Err(GET_DENIED));
    assert_eq!(check(&args("SORT a GET o_* BY w_*"), &r), Err(GET_DENIED));
    assert_eq!(
        check(&args("sort a limit 0 1 by w_*->f"), &r),
        Err(BY_DENIED)
    );
    // The `*` inside the tag, an unclosed tag, an empty tag, another shard's tag ("a" and
    // "b" are in different thirds of the slots).
    assert_eq!(check(&args("SORT a BY {w*}"), &r), Err(BY_DENIED));
    assert_eq!(check(&args("SORT {a}l BY {a*"), &r), Err(BY_DENIED));
    assert_eq!(check(&args("SORT {a}l BY {}a*"), &r), Err(BY_DENIED));
    assert_eq!(check(&args("SORT {a}l BY {b}w_*"), &r), Err(BY_DENIED));
    // An option Redis does not know ends the check: Redis refuses the command itself.
    assert_eq!(check(&args("SORT a BYE w_* BY w_*"), &r), Ok(()));
}

#[test]
fn a_tag_before_the_star_on_the_key_shard_passes() {
    let r = three();
    assert_eq!(
        check(&args("SORT {u}l BY {u}w_* GET {u}o_*->f GET #"), &r),
        Ok(())
    );
    assert_eq!(check(&args("SORT {u}l BY w_{u}_*"), &r), Ok(()));
}

#[test]
fn without_a_hashtag_rule_only_one_shard_passes() {
    let mut r3 = cluster(
        "c",
        HashPolicy::Crc16Slots,
        vec![shard("s0", 7001, None), shard("s1", 7002, None)],
    );
    r3.hashtag = None;
    let r = routing_of(catch_all("c"), vec![r3], None);
    assert_eq!(check(&args("SORT {u}l BY {u}w_*"), &r), Err(BY_DENIED));
}

#[test]
fn one_shard_passes_without_tags_but_not_across_routes() {
    let route = |prefix: &str, cluster: &str, remove_prefix: bool| PrefixRoute {
        prefix: prefix.to_string(),
        remove_prefix,
        cluster: cluster.to_string(),
        mirrors: Vec::new(),
    };
    let routes = RouteTable {
        routes: vec![route("w_b", "other", false), route("cut:", "one", true)],
        catch_all: Some("one".to_string()),
        ..Default::default()
    };
    let r = routing_of(
        routes,
        vec![
            cluster("one", HashPolicy::Crc16Slots, vec![shard("s0", 7001, None)]),
            cluster(
                "other",
                HashPolicy::Crc16Slots,
                vec![shard("s0", 7002, None)],
            ),
        ],
        None,
    );
    assert_eq!(check(&args("SORT a BY x_* GET x_*"), &r), Ok(()));
    // Keys that `w_*` forms may start with `w_b` and go to the other cluster.
    assert_eq!(check(&args("SORT a BY w_*"), &r), Err(BY_DENIED));
    assert_eq!(check(&args("SORT a BY w_b*"), &r), Err(BY_DENIED));
    // A removed prefix: the shard would look the pattern's keys up unstripped.
    assert_eq!(check(&args("SORT cut:a BY cut:w_*"), &r), Err(BY_DENIED));
}

#[test]
fn a_mirror_cluster_must_keep_the_keys_together_too() {
    use respway_filters::model::{MirrorMode, MirrorPolicy};
    // The route's cluster has one shard; its dual-write mirror has three, tags on.
    let routes = RouteTable {
        catch_all: Some("old".to_string()),
        catch_all_mirrors: vec![MirrorPolicy {
            cluster: "new".to_string(),
            mode: MirrorMode::DualWrite {
                target_is_primary: false,
            },
            include_reads: false,
            fraction_ppm: 1_000_000,
        }],
        ..Default::default()
    };
    let r = routing_of(
        routes,
        vec![
            cluster("old", HashPolicy::Crc16Slots, vec![shard("s0", 7001, None)]),
            three_tagged("new", 7101),
        ],
        None,
    );
    assert_eq!(check(&args("SORT a BY w_* STORE d"), &r), Err(BY_DENIED));
    assert_eq!(check(&args("SORT {u}a BY {u}w_* STORE {u}d"), &r), Ok(()));
}

#[test]
fn a_key_without_a_route_is_left_to_the_chain() {
    let route = PrefixRoute {
        prefix: "app:".to_string(),
        remove_prefix: false,
        cluster: "c".to_string(),
        mirrors: Vec::new(),
    };
    let routes = RouteTable {
        routes: vec![route],
        ..Default::default()
    };
    let r = routing_of(routes, vec![three_tagged("c", 7001)], None);
    // The chain answers `no route for key` for it; the pattern is not what is wrong.
    assert_eq!(check(&args("SORT other BY w_*"), &r), Ok(()));
    assert_eq!(check(&args("SORT app:l BY app:w_*"), &r), Err(BY_DENIED));
}

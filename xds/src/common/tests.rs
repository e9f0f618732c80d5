//! The shared checks' tests: names, hash policies, slots, durations, users.

use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
    assert!(parse_duration("1.5s").is_err());
    assert!(parse_duration("1").is_err());
    assert!(parse_duration("s").is_err());
    assert!(parse_duration("1d").is_err());
}

/// Sizes read as `redis.conf` reads them; written back in the largest exact 1024 unit.
#[test]
fn sizes() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("4096b"), Ok(4096));
    assert_eq!(parse_size("64kb"), Ok(64 << 10));
    assert_eq!(parse_size("64KB"), Ok(64 << 10));
    assert_eq!(parse_size("64mb"), Ok(64 << 20));
    assert_eq!(parse_size("1Gb"), Ok(1 << 30));
    assert_eq!(parse_size("10k"), Ok(10_000));
    assert_eq!(parse_size("2m"), Ok(2_000_000));
    assert_eq!(parse_size("1g"), Ok(1_000_000_000));
    for bad in [
        "",
        "mb",
        "1.5mb",
        "64 mb",
        "64mib",
        "-1",
        "1tb",
        "99999999999gb",
    ] {
        assert!(parse_size(bad).is_err(), "{bad:?}");
    }
    assert_eq!(size_string(64 << 20).as_deref(), Some("64mb"));
    assert_eq!(size_string(1536 << 10).as_deref(), Some("1536kb"));
    assert_eq!(size_string(3 << 30).as_deref(), Some("3gb"));
    assert_eq!(size_string(1000), None);
    assert_eq!(size_string(0), None);
    for n in [1u64, 1024, 1536 << 10, 5 << 30, u64::MAX] {
        let text = size_string(n).unwrap_or_else(|| n.to_string());
        assert_eq!(parse_size(&text), Ok(n), "{text}");
    }
}

#[test]
fn redis_versions() {
    for ok in ["7.2.4", "7", "6.2", "10.0.0.1"] {
        assert_eq!(redis_version_problem(ok), None, "{ok}");
    }
    for bad in ["", ".", "7.", ".7", "7..2", "7.2.4-rc1", "v7", " 7.2"] {
        assert!(redis_version_problem(bad).is_some(), "{bad:?}");
    }
}

#[test]
fn hashtags() {
    assert_eq!(parse_hashtag("{}"), Ok(Some(HashTag::default())));
    assert_eq!(parse_hashtag(""), Ok(None));
    assert!(parse_hashtag("{").is_err());
    assert!(parse_hashtag("{}}").is_err());
    assert!(parse_hashtag("é}").is_err());
    assert_eq!(hashtag_string(Some(HashTag::default())), "{}");
}

#[test]
fn slot_ranges() {
    assert_eq!(parse_slot_range("0-511"), Ok((0, 511)));
    assert_eq!(parse_slot_range("7"), Ok((7, 7)));
    assert!(parse_slot_range("9-3").is_err());
    assert!(parse_slot_range("a-3").is_err());
    assert!(parse_slot_range("").is_err());
}

#[test]
fn slot_tables() {
    assert_eq!(check_slots(8, &[&[], &[]]), vec![]);
    assert_eq!(check_slots(8, &[&[(0, 3)], &[(4, 7)]]), vec![]);
    assert_eq!(
        check_slots(8, &[&[(0, 3)], &[(4, 5)]]),
        vec![SlotProblem::Uncovered {
            reason: "slots 6-7 are assigned to no shard".into()
        }]
    );
    assert_eq!(
        check_slots(8, &[&[(0, 4)], &[(4, 8)], &[]]),
        vec![
            SlotProblem::OutOfBounds {
                shard: 1,
                range: 0,
                reason: "slot range \"4-8\" is out of bounds (slots are 0-7)".into()
            },
            SlotProblem::Missing { shard: 2 },
        ]
    );
    assert_eq!(
        check_slots(8, &[&[(0, 4)], &[(4, 7)]]),
        vec![SlotProblem::Overlap {
            shard: 1,
            range: 0,
            other: 0,
            slot: 4
        }]
    );
}

#[test]
fn hash_keys() {
    let ketama = HashPolicy::Ketama {
        key_hash: KeyHash::Fnv1a64,
    };
    let a: SocketAddr = "10.0.0.1:11211".parse().unwrap();
    let b: SocketAddr = "10.0.0.1:6379".parse().unwrap();
    assert_eq!(default_hash_key(&ketama, None, a), "10.0.0.1");
    assert_eq!(default_hash_key(&ketama, None, b), "10.0.0.1:6379");
    assert_eq!(default_hash_key(&ketama, Some("redis-1"), b), "redis-1");
    let maglev = HashPolicy::Maglev { table_size: 65537 };
    assert_eq!(
        default_hash_key(&maglev, Some("redis-1"), a),
        "10.0.0.1:11211"
    );
}

#[test]
fn mirror_rules() {
    let m = |cluster: &str, mode| MirrorPolicy {
        cluster: cluster.to_string(),
        mode,
        include_reads: false,
        fraction_ppm: FULL_FRACTION_PPM,
    };
    let dual = |target_is_primary| MirrorMode::DualWrite { target_is_primary };
    assert_eq!(
        check_mirrors(
            "r",
            &[
                m("a", dual(false)),
                m("b", MirrorMode::Forward),
                m("c", MirrorMode::ReadOnly)
            ]
        ),
        vec![]
    );
    assert_eq!(
        check_mirrors(
            "r",
            &[
                m("r", dual(false)),
                m("a", dual(true)),
                m("a", MirrorMode::ReadOnly),
                m("a", dual(true)),
                m("b", MirrorMode::ReadOnly),
                m("", dual(false)),
                m("", dual(false)),
            ]
        ),
        vec![
            MirrorProblem::OwnCluster { mirror: 0 },
            MirrorProblem::Duplicate {
                mirror: 2,
                first: 1
            },
            MirrorProblem::Duplicate {
                mirror: 3,
                first: 1
            },
            MirrorProblem::SecondPrimary {
                mirror: 3,
                first: 1
            },
            MirrorProblem::SecondReadOnly {
                mirror: 4,
                first: 2
            },
        ]
    );
    // A move is the route's only mirror: its keys live on one cluster at a time.
    assert_eq!(check_mirrors("r", &[m("a", MirrorMode::Move)]), vec![]);
    assert_eq!(
        check_mirrors("r", &[m("a", MirrorMode::Move), m("b", dual(false))]),
        vec![MirrorProblem::MoveNotAlone {
            mirror: 0,
            mode: MirrorMode::Move
        }]
    );
}

#[test]
fn hot_key_rules() {
    let rules: Vec<HotKeyRule> = ["A", "", "B", "A", "A"]
        .iter()
        .map(|p| HotKeyRule {
            prefix: p.to_string(),
            read: HotKeyRead::RoundRobin,
        })
        .collect();
    let problems = check_hot_keys(&rules);
    assert_eq!(
        problems,
        vec![
            HotKeyProblem::Empty { rule: 1 },
            HotKeyProblem::Duplicate { rule: 3, first: 0 },
            HotKeyProblem::Duplicate { rule: 4, first: 0 },
        ]
    );
    assert_eq!(
        hot_key_problem(&problems[1], &rules, |i| i + 10),
        (
            13,
            "duplicate hot-key prefix \"A\" (also hot_keys[10])".to_string()
        )
    );
}

#[test]
fn read_policy_names() {
    for name in READ_POLICIES {
        assert!(read_policy(name, ZoneFallback::Primary).is_some(), "{name}");
    }
    assert_eq!(
        read_policy("zone_local", ZoneFallback::AnyReplica),
        Some(ReadPolicy::ZoneLocal {
            fallback: ZoneFallback::AnyReplica
        })
    );
    assert_eq!(read_policy("replica", ZoneFallback::Primary), None);
}

#[test]
fn socket_addrs() {
    assert!(parse_socket_addr("127.0.0.1:6379").is_ok());
    assert!(parse_socket_addr("[::1]:6379").is_ok());
    assert_eq!(
        parse_socket_addr("127.0.0.1:99999"),
        Err("invalid socket address \"127.0.0.1:99999\"".into())
    );
    assert_eq!(
            parse_socket_addr("localhost:6379"),
            Err(
                "invalid socket address \"localhost:6379\": use an IP address, host names are not resolved"
                    .into()
            )
        );
}

//! Defaults, names and checks shared by both sources (the YAML reader and the Envoy
//! translator), so that a rule is written once even where the error paths differ.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use respway_filters::hash::cluster_picker;
use respway_filters::hash::maglev::is_prime;
use respway_filters::model::{
    Cluster, Endpoint, EndpointAuth, HashPolicy, HashTag, HotKeyRead, HotKeyRule, KeyHash,
    MirrorMode, MirrorPolicy, NearCache, NearCacheAdmit, NearCacheMode, ProtocolMode, ReadPolicy,
    Role, ZoneFallback,
};

/// Default listener address.
pub(crate) const DEFAULT_LISTENER_ADDRESS: &str = "127.0.0.1:6380";
/// Default per-command upstream timeout.
pub(crate) const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(1);
/// Default upstream connect timeout.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default cap on replies a client may have outstanding.
pub(crate) const DEFAULT_MAX_PENDING: usize = 1024;
/// Most slow-log entries a listener may keep per worker (an entry is a few hundred bytes).
pub(crate) const MAX_SLOWLOG_LEN: u64 = 100_000;
/// Default connections per worker and endpoint.
pub(crate) const DEFAULT_CONNECTIONS_PER_ENDPOINT: usize = 1;
/// Envoy's default maglev table size.
pub(crate) const DEFAULT_TABLE_SIZE: u64 = 65537;
/// Envoy's upper bound for the maglev table size.
pub(crate) const MAX_TABLE_SIZE: u64 = 5_000_011;
/// Envoy's default minimum ring size.
pub(crate) const DEFAULT_MIN_RING: u64 = 1024;
/// Envoy's default (and largest allowed) maximum ring size.
pub(crate) const MAX_RING: u64 = 8 * 1024 * 1024;
/// Codis's slot count, the default for crc32 slots.
pub(crate) const DEFAULT_CRC32_SLOTS: u32 = 1024;
/// Upper bound for crc32 slots (the slot table is allocated in full).
pub(crate) const MAX_CRC32_SLOTS: u32 = 1 << 20;
/// Redis Cluster's slot count.
pub(crate) const CRC16_SLOTS: u32 = 16384;
/// Most databases a cluster may offer its clients (`SELECT 0` to `SELECT 255`).
pub(crate) const MAX_DATABASES: u32 = 256;
/// Most dedicated (transaction) connections per worker and endpoint.
pub(crate) const MAX_DEDICATED_CONNECTIONS: u32 = 65535;
/// Twemproxy hashes `host` alone (no port) for servers on memcached's port.
const TWEMPROXY_DEFAULT_PORT: u16 = 11211;

/// YAML names of the twemproxy key hashes, in the order they are listed in errors.
pub(crate) const KEY_HASHES: &[(&str, KeyHash)] = &[
    ("fnv1a_64", KeyHash::Fnv1a64),
    ("fnv1a_32", KeyHash::Fnv1a32),
    ("fnv1_64", KeyHash::Fnv1_64),
    ("fnv1_32", KeyHash::Fnv1_32),
    ("md5", KeyHash::Md5),
    ("crc32", KeyHash::Crc32),
    ("crc32a", KeyHash::Crc32a),
    ("one_at_a_time", KeyHash::OneAtATime),
    ("murmur", KeyHash::Murmur),
];

/// YAML names of the near cache's invalidation modes.
pub(crate) const NEAR_CACHE_MODES: &[(&str, NearCacheMode)] = &[
    ("tracked", NearCacheMode::Tracked),
    ("bcast", NearCacheMode::Bcast),
    ("ttl", NearCacheMode::Ttl),
];

/// YAML names of the near cache's admission choices.
pub(crate) const NEAR_CACHE_ADMITS: &[(&str, NearCacheAdmit)] =
    &[("all", NearCacheAdmit::All), ("hot", NearCacheAdmit::Hot)];

/// Mirror policies copy every eligible command unless a fraction is given: 100%.
pub(crate) const FULL_FRACTION_PPM: u32 = 1_000_000;

/// YAML names of the read policies (`zone_local` takes its fallback from `zone_fallback`).
pub(crate) const READ_POLICIES: &[&str] = &["primary", "prefer_replica", "zone_local", "any"];

/// YAML names of the zone-local fallbacks.
pub(crate) const ZONE_FALLBACKS: &[(&str, ZoneFallback)] = &[
    ("primary", ZoneFallback::Primary),
    ("any_replica", ZoneFallback::AnyReplica),
];

/// YAML names of the hot-key read choices.
pub(crate) const HOT_KEY_READS: &[(&str, HotKeyRead)] = &[
    ("round_robin", HotKeyRead::RoundRobin),
    ("random", HotKeyRead::Random),
    ("same_zone", HotKeyRead::SameZone),
];

/// YAML names of the mirror modes (`dual_write` takes its primary side from `primary`).
pub(crate) const MIRROR_MODES: &[&str] =
    &["forward", "dual_write", "read_only", "prepare_move", "move"];

/// YAML names of the sides a dual-write mirror can make primary: `true` is the mirror.
pub(crate) const MIRROR_PRIMARIES: &[(&str, bool)] = &[("route", false), ("mirror", true)];

/// YAML names of the listener protocol modes.
pub(crate) const PROTOCOL_MODES: &[(&str, ProtocolMode)] = &[
    ("auto", ProtocolMode::Auto),
    ("resp2", ProtocolMode::Resp2),
    ("resp3", ProtocolMode::Resp3),
];

/// Why `s` cannot be the Redis version a listener advertises, if it cannot: it must be
/// groups of digits separated by dots, like `7.2.4` (clients compare it to pick features).
pub(crate) fn redis_version_problem(s: &str) -> Option<String> {
    let valid = s
        .split('.')
        .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
    (!valid).then(|| format!("invalid version {s:?} (expected digits and dots, e.g. \"7.2.4\")"))
}

/// The read policy named `name` (a [`READ_POLICIES`] entry) with this zone-local fallback.
pub(crate) fn read_policy(name: &str, fallback: ZoneFallback) -> Option<ReadPolicy> {
    match name {
        "primary" => Some(ReadPolicy::Primary),
        "prefer_replica" => Some(ReadPolicy::PreferReplica),
        "zone_local" => Some(ReadPolicy::ZoneLocal { fallback }),
        "any" => Some(ReadPolicy::Any),
        _ => None,
    }
}

/// A problem found by [`check_mirrors`], located by the mirror's index in its route.
#[derive(Debug, PartialEq)]
pub(crate) enum MirrorProblem {
    /// `mirror` mirrors the route onto the route's own cluster.
    OwnCluster { mirror: usize },
    /// `mirror` names the same cluster as the earlier `first`.
    Duplicate { mirror: usize, first: usize },
    /// `mirror` is a second dual-write mirror answering the client (after `first`).
    SecondPrimary { mirror: usize, first: usize },
    /// `mirror` is a second read-only mirror (after `first`).
    SecondReadOnly { mirror: usize, first: usize },
    /// `mirror` is a move (or its prepare phase, `mode`), and the route has other mirrors: a
    /// move must be the only one.
    MoveNotAlone { mirror: usize, mode: MirrorMode },
}

/// Checks the mirror policies of one route whose own cluster is `route_cluster`: each mirror
/// names another cluster, no cluster twice (the cluster identifies the mirror in Envoy
/// resources); at most one mirror answers the client instead of the route's cluster, and at
/// most one is read-only.
pub(crate) fn check_mirrors(route_cluster: &str, mirrors: &[MirrorPolicy]) -> Vec<MirrorProblem> {
    let mut out = Vec::new();
    let mut clusters: HashMap<&str, usize> = HashMap::new();
    let mut primary = None;
    let mut read_only = None;
    for (i, m) in mirrors.iter().enumerate() {
        if m.cluster == route_cluster {
            out.push(MirrorProblem::OwnCluster { mirror: i });
        } else if !m.cluster.is_empty() {
            // (An empty cluster is reported as required by the source.)
            let first = *clusters.entry(&m.cluster).or_insert(i);
            if first != i {
                out.push(MirrorProblem::Duplicate { mirror: i, first });
            }
        }
        match m.mode {
            MirrorMode::DualWrite {
                target_is_primary: true,
            } => match primary {
                Some(first) => out.push(MirrorProblem::SecondPrimary { mirror: i, first }),
                None => primary = Some(i),
            },
            MirrorMode::ReadOnly => match read_only {
                Some(first) => out.push(MirrorProblem::SecondReadOnly { mirror: i, first }),
                None => read_only = Some(i),
            },
            MirrorMode::Move | MirrorMode::PrepareMove if mirrors.len() > 1 => {
                out.push(MirrorProblem::MoveNotAlone {
                    mirror: i,
                    mode: m.mode,
                });
            }
            _ => {}
        }
    }
    out
}

/// A problem found by [`check_hot_keys`] in the `prefix` of the rule at index `rule`.
#[derive(Debug, PartialEq)]
pub(crate) enum HotKeyProblem {
    /// The prefix is empty.
    Empty { rule: usize },
    /// The prefix is also the one of the earlier rule `first`.
    Duplicate { rule: usize, first: usize },
}

/// Checks a cluster's hot-key rules: each prefix is not empty and unique.
pub(crate) fn check_hot_keys(rules: &[HotKeyRule]) -> Vec<HotKeyProblem> {
    let mut out = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, r) in rules.iter().enumerate() {
        if r.prefix.is_empty() {
            out.push(HotKeyProblem::Empty { rule: i });
        } else {
            let first = *seen.entry(&r.prefix).or_insert(i);
            if first != i {
                out.push(HotKeyProblem::Duplicate { rule: i, first });
            }
        }
    }
    out
}

/// The rule's `prefix` and the reason for a [`HotKeyProblem`]; `position` maps an index of the
/// checked rules to the index the source shows.
pub(crate) fn hot_key_problem(
    p: &HotKeyProblem,
    rules: &[HotKeyRule],
    position: impl Fn(usize) -> usize,
) -> (usize, String) {
    match *p {
        HotKeyProblem::Empty { rule } => (position(rule), "must not be empty".to_string()),
        HotKeyProblem::Duplicate { rule, first } => (
            position(rule),
            format!(
                "duplicate hot-key prefix {:?} (also hot_keys[{}])",
                rules[rule].prefix,
                position(first)
            ),
        ),
    }
}

/// `a, b, c` for an error message.
pub(crate) fn one_of<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names.into_iter().collect::<Vec<_>>().join(", ")
}

/// Number of slots of a slot policy, `None` for the other policies.
pub(crate) fn slot_count(policy: &HashPolicy) -> Option<u32> {
    match policy {
        HashPolicy::Crc32Slots { slots } => Some(*slots),
        HashPolicy::Crc16Slots => Some(CRC16_SLOTS),
        _ => None,
    }
}

/// Whether two shards of this policy must not share a hash key: Envoy's maglev and ring hash
/// and twemproxy's ketama place shards by it (modula only sorts shards by it, as twemproxy
/// does; the slot policies do not use it).
pub(crate) fn unique_hash_keys(policy: &HashPolicy) -> bool {
    matches!(
        policy,
        HashPolicy::Maglev { .. } | HashPolicy::RingHash { .. } | HashPolicy::Ketama { .. }
    )
}

/// Builds the cluster's shard picker, as the data plane will, and says why it cannot be built.
/// Run after every other check has passed: it catches what they do not (weight sums beyond
/// what the emulated system counts, ketama names too long for twemproxy's buffer, more shards
/// than slots), and it is the final word on what the data plane accepts.
pub(crate) fn picker_error(cluster: &Cluster) -> Option<String> {
    cluster_picker(cluster).err().map(|e| e.to_string())
}

/// Problems with the numbers of a hash policy, as `(field under the policy, reason)`.
/// The field names are Envoy's and respway's own, which the YAML schema shares.
pub(crate) fn check_hash_policy(policy: &HashPolicy) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    match policy {
        HashPolicy::Maglev { table_size } => {
            if !is_prime(*table_size) {
                out.push(("table_size", format!("{table_size} is not a prime number")));
            } else if *table_size > MAX_TABLE_SIZE {
                out.push((
                    "table_size",
                    format!("{table_size} is larger than {MAX_TABLE_SIZE}"),
                ));
            }
        }
        HashPolicy::RingHash {
            minimum_ring_size,
            maximum_ring_size,
            ..
        } => {
            if *minimum_ring_size == 0 {
                out.push(("minimum_ring_size", "must be greater than 0".to_string()));
            }
            if *maximum_ring_size > MAX_RING {
                out.push((
                    "maximum_ring_size",
                    format!("{maximum_ring_size} is larger than {MAX_RING}"),
                ));
            }
            if minimum_ring_size > maximum_ring_size {
                out.push((
                    "minimum_ring_size",
                    format!(
                        "{minimum_ring_size} is larger than maximum_ring_size {maximum_ring_size}"
                    ),
                ));
            }
        }
        HashPolicy::Crc32Slots { slots } => {
            if *slots == 0 || *slots > MAX_CRC32_SLOTS {
                out.push(("slots", format!("must be between 1 and {MAX_CRC32_SLOTS}")));
            }
        }
        HashPolicy::Ketama { .. } | HashPolicy::Modula { .. } | HashPolicy::Crc16Slots => {}
    }
    out
}

/// Parses hashtag delimiters: two ASCII characters, or the empty string for none.
pub(crate) fn parse_hashtag(s: &str) -> Result<Option<HashTag>, String> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Ok(None);
    }
    if b.len() == 2 && b.iter().all(|c| c.is_ascii() && !c.is_ascii_control()) {
        return Ok(Some(HashTag {
            open: b[0],
            close: b[1],
        }));
    }
    Err(format!(
        "must be exactly two ASCII characters such as \"{{}}\" (got {s:?})"
    ))
}

/// The delimiters as written in configuration, `""` for none.
pub(crate) fn hashtag_string(tag: Option<HashTag>) -> String {
    match tag {
        Some(t) => String::from_utf8_lossy(&[t.open, t.close]).into_owned(),
        None => String::new(),
    }
}

/// Parses a slot range: `"7"` or `"0-511"` (inclusive).
pub(crate) fn parse_slot_range(s: &str) -> Result<(u32, u32), String> {
    let num = |p: &str| p.trim().parse::<u32>().ok();
    let parsed = match s.split_once('-') {
        Some((a, b)) => num(a).zip(num(b)),
        None => num(s).map(|n| (n, n)),
    };
    match parsed {
        Some((a, b)) if a <= b => Ok((a, b)),
        Some(_) => Err(format!("slot range {s:?} ends before it starts")),
        None => Err(format!(
            "invalid slot range {s:?} (expected \"N\" or \"FIRST-LAST\")"
        )),
    }
}

/// A range as written in configuration.
pub(crate) fn slot_range_string((a, b): (u32, u32)) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// A problem found by [`check_slots`], located by shard index (and range index).
#[derive(Debug, PartialEq)]
pub(crate) enum SlotProblem {
    /// `shard`'s range `range` reaches past the last slot.
    OutOfBounds {
        shard: usize,
        range: usize,
        reason: String,
    },
    /// `shard`'s range `range` includes `slot`, already owned by `other`.
    Overlap {
        shard: usize,
        range: usize,
        other: usize,
        slot: u32,
    },
    /// Other shards list slots but `shard` lists none.
    Missing { shard: usize },
    /// No shard owns these slots.
    Uncovered { reason: String },
}

/// Checks the slot tables of a slot policy: either no shard lists slots (even split) or every
/// shard does, the ranges stay below `total`, do not overlap and cover every slot.
pub(crate) fn check_slots(total: u32, shards: &[&[(u32, u32)]]) -> Vec<SlotProblem> {
    let mut out = Vec::new();
    if shards.iter().all(|s| s.is_empty()) {
        return out;
    }
    let mut owner: Vec<Option<usize>> = vec![None; total as usize];
    for (si, ranges) in shards.iter().enumerate() {
        if ranges.is_empty() {
            out.push(SlotProblem::Missing { shard: si });
            continue;
        }
        for (ri, &(a, b)) in ranges.iter().enumerate() {
            if b >= total {
                out.push(SlotProblem::OutOfBounds {
                    shard: si,
                    range: ri,
                    reason: format!(
                        "slot range \"{}\" is out of bounds (slots are 0-{})",
                        slot_range_string((a, b)),
                        total - 1
                    ),
                });
                continue;
            }
            let mut reported = false;
            for slot in a..=b {
                match owner[slot as usize] {
                    Some(other) if !reported => {
                        out.push(SlotProblem::Overlap {
                            shard: si,
                            range: ri,
                            other,
                            slot,
                        });
                        reported = true;
                    }
                    Some(_) => {}
                    None => owner[slot as usize] = Some(si),
                }
            }
        }
    }
    if out.is_empty() {
        let mut missing = Vec::new();
        let mut i = 0usize;
        while i < owner.len() {
            if owner[i].is_none() {
                let start = i;
                while i < owner.len() && owner[i].is_none() {
                    i += 1;
                }
                missing.push(slot_range_string((start as u32, (i - 1) as u32)));
            } else {
                i += 1;
            }
        }
        if !missing.is_empty() {
            out.push(SlotProblem::Uncovered {
                reason: format!("slots {} are assigned to no shard", missing.join(", ")),
            });
        }
    }
    out
}

/// The key a shard is hashed by when no `hash_key` is given: the primary's `ip:port` for
/// Envoy's maglev and ring hash (and the slot policies, where it is unused); for twemproxy's
/// ketama and modula the server name when one was given, else `ip:port`, or just `ip` on port
/// 11211, as twemproxy does.
pub(crate) fn default_hash_key(
    policy: &HashPolicy,
    explicit_name: Option<&str>,
    primary: SocketAddr,
) -> String {
    match policy {
        HashPolicy::Ketama { .. } | HashPolicy::Modula { .. } => match explicit_name {
            Some(name) => name.to_string(),
            None if primary.port() == TWEMPROXY_DEFAULT_PORT => primary.ip().to_string(),
            None => primary.to_string(),
        },
        _ => primary.to_string(),
    }
}

/// The canonical order of a shard's endpoints: the primary first, then replicas by address.
/// Both sources produce it so that a model survives YAML → Envoy → model unchanged (Envoy
/// groups endpoints by locality, which loses the order they were written in).
pub(crate) fn normalize_endpoints(endpoints: &mut [Endpoint]) {
    endpoints.sort_by_key(|e| (e.role != Role::Primary, e.address));
}

/// The canonical order of a cluster's per-endpoint credentials: by address. They are looked
/// up by address; both sources produce this order so that the model does not depend on the
/// order endpoints were written in (a shard's are kept primary first, and a file written from
/// the model, `/config_dump`, lists them so), nor on the order of Envoy's `credentials`.
pub(crate) fn normalize_endpoint_auth(auth: &mut [EndpointAuth]) {
    auth.sort_by_key(|e| e.address);
}

/// Why the client buffer hard limit `hard` cannot go with the (soft) limit `limit`, both in
/// bytes, if it cannot: a client is disconnected past the hard limit, so it must be at least the
/// limit at which its reading pauses. `*_default` says the value was not given (the default).
/// The reason is reported against the hard limit's field.
pub(crate) fn client_buffer_problem(
    limit: usize,
    limit_default: bool,
    hard: usize,
    hard_default: bool,
) -> Option<String> {
    let default = |d: bool| if d { " (the default)" } else { "" };
    (hard < limit).then(|| {
        format!(
            "{hard}{} is less than client_buffer_limit {limit}{}",
            default(hard_default),
            default(limit_default)
        )
    })
}

/// Parses a human duration: an integer and a unit (`us`, `ms`, `s`, `m`, `h`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || {
        format!(
            "invalid duration {s:?} (expected an integer and a unit: us, ms, s, m or h, e.g. \"250ms\")"
        )
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| err())?;
    let d = match unit {
        "us" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => n.checked_mul(60).map(Duration::from_secs).ok_or_else(err)?,
        "h" => n
            .checked_mul(3600)
            .map(Duration::from_secs)
            .ok_or_else(err)?,
        _ => return Err(err()),
    };
    Ok(d)
}

/// The units of a size, as `redis.conf` reads them (case-insensitive): `kb`, `mb`, `gb` are
/// powers of 1024, `k`, `m`, `g` powers of 1000.
const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1_000),
    ("kb", 1 << 10),
    ("m", 1_000_000),
    ("mb", 1 << 20),
    ("g", 1_000_000_000),
    ("gb", 1 << 30),
];

/// Parses a size in bytes written as a string: an integer, alone or with a unit of
/// [`SIZE_UNITS`] (`64kb`, `64mb`, `1gb`).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let err = || {
        format!(
            "invalid size {s:?} (expected an integer of bytes, or an integer and a unit: kb, mb \
             or gb (powers of 1024), k, m or g (powers of 1000), e.g. \"64mb\")"
        )
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| err())?;
    let unit = unit.to_ascii_lowercase();
    let (_, scale) = SIZE_UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .ok_or_else(err)?;
    n.checked_mul(*scale).ok_or_else(err)
}

/// A size as a file writes it: in the largest power-of-1024 unit that writes it exactly
/// (`64mb`, `1536kb`), else as the integer of bytes.
pub(crate) fn size_string(n: u64) -> Option<String> {
    if n == 0 {
        return None;
    }
    [("gb", 1u64 << 30), ("mb", 1 << 20), ("kb", 1 << 10)]
        .iter()
        .find(|(_, size)| n.is_multiple_of(*size))
        .map(|(unit, size)| format!("{}{unit}", n / size))
}

/// A problem of a near cache's settings: the field (`prefixes[1]`, `max_entry_bytes`) and the
/// reason. The numbers are the ones in effect (defaults applied); zeros and durations are the
/// sources' own checks.
pub(crate) fn check_near_cache(n: &NearCache, defaults: &NearCache) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, p) in n.prefixes.iter().enumerate() {
        if p.is_empty() {
            out.push((format!("prefixes[{i}]"), "must not be empty".to_string()));
            continue;
        }
        let first = *seen.entry(p).or_insert(i);
        if first != i {
            out.push((
                format!("prefixes[{i}]"),
                format!("duplicate prefix {p:?} (also prefixes[{first}])"),
            ));
        }
    }
    if n.max_entry_bytes > n.max_bytes {
        let default = |d: bool| if d { " (the default)" } else { "" };
        out.push((
            "max_entry_bytes".to_string(),
            format!(
                "{}{} is more than max_bytes {}{}",
                n.max_entry_bytes,
                default(n.max_entry_bytes == defaults.max_entry_bytes),
                n.max_bytes,
                default(n.max_bytes == defaults.max_bytes)
            ),
        ));
    }
    out
}

/// Parses a socket address, with a hint for host names (which are not resolved).
pub(crate) fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        let host_like = s
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if host_like {
            format!("invalid socket address {s:?}: use an IP address, host names are not resolved")
        } else {
            format!("invalid socket address {s:?}")
        }
    })
}

/// A cluster emulation's `announce` list, parsed: the addresses, and each entry's problem (its
/// index and the reason): not an IP address and port, one no client can connect to (an
/// unspecified IP or port 0), or one listed before.
pub(crate) fn announce_addresses(list: &[String]) -> (Vec<SocketAddr>, Vec<(usize, String)>) {
    // Each address read, with its index in the list.
    let mut out: Vec<(usize, SocketAddr)> = Vec::new();
    let mut problems = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let a = match parse_socket_addr(s) {
            Ok(a) => a,
            Err(e) => {
                problems.push((i, e));
                continue;
            }
        };
        if a.ip().is_unspecified() || a.port() == 0 {
            problems.push((
                i,
                format!(
                    "{a} is not an address clients can connect to (give the sidecar's IP and port)"
                ),
            ));
        } else if let Some((first, _)) = out.iter().find(|(_, b)| *b == a) {
            problems.push((i, format!("duplicate address {a} (also announce[{first}])")));
        }
        out.push((i, a));
    }
    (out.into_iter().map(|(_, a)| a).collect(), problems)
}

/// The rules of a user defined without `rules`: every permission, as Redis's `default` user.
pub(crate) const DEFAULT_USER_RULES: &[&str] = &["allcommands", "allkeys", "allchannels"];

/// What is wrong with an ACL user name (Redis's own rule: not empty, no spaces).
pub(crate) fn user_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name
        .bytes()
        .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        Some("must not contain spaces or control characters")
    } else {
        None
    }
}

/// The problems of a listener's users (as `(index of the user, field, reason)`): a name
/// used twice, a `default` user next to `downstream_auth_password`, passwords together with
/// `nopass`, no way to authenticate at all, rules that do not compile.
pub(crate) fn user_problems(
    users: &[respway_filters::model::AclUser],
    has_downstream_password: bool,
    password_field: &str,
) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (i, u) in users.iter().enumerate() {
        if let Some(first) = users[..i].iter().position(|x| x.name == u.name) {
            out.push((
                i,
                "name".into(),
                format!("duplicate user {:?} (also users[{first}])", u.name),
            ));
        }
        if u.name == "default" && has_downstream_password {
            out.push((
                i,
                "name".into(),
                "the default user's password is already set by downstream_auth_password: set it in one place".into(),
            ));
        }
        if u.nopass && !u.passwords.is_empty() {
            out.push((
                i,
                "nopass".into(),
                format!("conflicts with {password_field}"),
            ));
        }
        if !u.nopass && u.passwords.is_empty() {
            out.push((
                i,
                password_field.into(),
                "required: a user needs a password or nopass".into(),
            ));
        }
        for (j, r) in u.rules.iter().enumerate() {
            if let Err(e) = respway_filters::acl::Permissions::check_rule(r) {
                out.push((i, format!("rules[{j}]"), e.to_string()));
            }
        }
    }
    out
}

/// Reads an upstream password kept outside the configuration: the file's contents without
/// its trailing newline (`\n` or `\r\n`), or the environment variable. The error says what
/// is missing, not the value.
pub(crate) fn read_password_file(path: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return Err(format!("{path:?} is empty"));
    }
    Ok(text.to_string())
}

/// As [`read_password_file`], for an environment variable.
pub(crate) fn read_password_env(name: &str) -> Result<String, String> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) => Err(format!("environment variable {name} is empty")),
        Err(std::env::VarError::NotPresent) => {
            Err(format!("environment variable {name} is not set"))
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("environment variable {name} is not UTF-8"))
        }
    }
}

/// An Envoy socket address.
pub(crate) fn socket(addr: SocketAddr) -> envoy_types::pb::envoy::config::core::v3::Address {
    use envoy_types::pb::envoy::config::core::v3::{
        address, socket_address, Address, SocketAddress,
    };
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: addr.ip().to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(addr.port().into())),
            ..Default::default()
        })),
    }
}

/// A protobuf duration.
pub(crate) fn duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: d.as_secs().try_into().unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

#[cfg(test)]
mod tests;

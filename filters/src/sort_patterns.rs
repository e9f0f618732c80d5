//! `SORT` / `SORT_RO` with `BY` or `GET` patterns: the keys a pattern forms are read by the
//! shard that runs the `SORT`, so they must all live there.
//!
//! Redis forms a key from a pattern by putting each element of the sorted key in place of the
//! pattern's first `*` (anything from a `->` after it names a hash field). A pattern without
//! a `*` reads no key (`BY nosort` and `BY constant` do not sort, `GET constant` gives nil), and
//! neither does `GET #`.
//!
//! Keys formed elsewhere would read as missing, silently: weights of 0, `GET`s of nil. Redis
//! Cluster refuses such patterns, and so does respway, with Redis Cluster's message. A pattern
//! is accepted when every key it can form goes to the sorted key's cluster and shard:
//! - the route of every such key is the sorted key's, and neither removes a prefix (Redis
//!   would look the pattern's key up under its unstripped name);
//! - the cluster has one shard, or the part before the `*` holds a complete hashtag that
//!   places it on the sorted key's shard (`SORT {u}list BY {u}w_*`);
//! - the same holds in each mirror cluster of the route, which runs the same `SORT`.

use bytes::Bytes;

use crate::hash::hashtag_slice;
use crate::routing::Routing;

/// The reply's message when a `BY` pattern may form keys on other shards (Redis Cluster's).
pub const BY_DENIED: &str = "ERR BY option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.";
/// The same for a `GET` pattern.
pub const GET_DENIED: &str = "ERR GET option of SORT denied in Cluster mode when keys formed by the pattern may be in different slots.";

/// Checks the patterns of `SORT key ...` / `SORT_RO key ...` (`args[0]` the command name)
/// under `routing`, left to right as Redis reads the options: the first pattern that may form
/// keys on another shard gives its error message. Stops at the first option it does not know
/// (Redis answers that command with a syntax error and runs nothing).
pub fn check(args: &[Bytes], routing: &Routing) -> Result<(), &'static str> {
    let Some(key) = args.get(1) else {
        return Ok(());
    };
    let mut i = 2;
    while i < args.len() {
        let opt = &args[i][..];
        // How many arguments the option takes, and the refusal if it is a pattern.
        let (skip, pattern_denied) = if opt.eq_ignore_ascii_case(b"by") {
            (1, Some(BY_DENIED))
        } else if opt.eq_ignore_ascii_case(b"get") {
            (1, Some(GET_DENIED))
        } else if opt.eq_ignore_ascii_case(b"limit") {
            (2, None)
        } else if opt.eq_ignore_ascii_case(b"store") {
            (1, None)
        } else if opt.eq_ignore_ascii_case(b"asc")
            || opt.eq_ignore_ascii_case(b"desc")
            || opt.eq_ignore_ascii_case(b"alpha")
        {
            (0, None)
        } else {
            return Ok(());
        };
        if let (Some(denied), Some(pattern)) = (pattern_denied, args.get(i + 1)) {
            if !stays_with(key, pattern, routing) {
                return Err(denied);
            }
        }
        i += 1 + skip;
    }
    Ok(())
}

/// True when every key `pattern` can form is routed where `key` is.
fn stays_with(key: &[u8], pattern: &[u8], routing: &Routing) -> bool {
    let Some(star) = pattern.iter().position(|&b| b == b'*') else {
        // No key is read (`GET #` has no `*` either).
        return true;
    };
    let fixed = &pattern[..star];
    let Some(k) = routing.route(key) else {
        // No route for the key: the chain answers that, not this check.
        return true;
    };
    let Some(p) = routing.route_of_every(fixed) else {
        return false;
    };
    if k.cluster != p.cluster || k.strip != 0 || p.strip != 0 {
        return false;
    }
    // The route's mirror clusters get the same SORT (a dual-write copy, or the reply when
    // the mirror is primary): the keys must stay with the sorted key there too.
    std::iter::once(k.cluster)
        .chain(routing.mirrors(k.route).iter().map(|m| m.cluster))
        .all(|c| same_shard(routing, c, key, fixed))
}

/// True when, in cluster `c`, every key starting with `fixed` is on `key`'s shard.
fn same_shard(routing: &Routing, c: usize, key: &[u8], fixed: &[u8]) -> bool {
    let Some(cluster) = routing.clusters.get(c) else {
        return false;
    };
    if cluster.shards.len() <= 1 {
        return true;
    }
    // The keys formed hash by a tag that lies wholly before the `*`; the fixed part hashes
    // by the same tag.
    let Some(tag) = cluster.hashtag else {
        return false;
    };
    hashtag_slice(fixed, tag, false).len() < fixed.len()
        && cluster.picker.pick(fixed) == cluster.picker.pick(key)
}

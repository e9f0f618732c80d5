//! Reading replies and describing how a source value and a target value differ.

use super::*;
use crate::report::*;

// === replies ===

pub(super) fn scan_reply(reply: Option<Frame>) -> Result<(Bytes, Vec<Bytes>), String> {
    let Some(Frame::Array(mut parts)) = reply else {
        return Err(format!("unexpected reply {}", show_opt(reply.as_ref())));
    };
    match (parts.pop(), parts.pop(), parts.is_empty()) {
        (Some(Frame::Array(keys)), Some(Frame::Bulk(cursor)), true) => {
            let keys = keys
                .into_iter()
                .map(|k| match k {
                    Frame::Bulk(b) => Ok(b),
                    other => Err(format!("unexpected key {}", show_frame(&other))),
                })
                .collect::<Result<_, _>>()?;
            Ok((cursor, keys))
        }
        _ => Err("unexpected reply shape".to_string()),
    }
}

pub(super) fn type_reply(f: &Frame) -> Result<Bytes, String> {
    match f {
        Frame::Simple(t) | Frame::Bulk(t) => Ok(t.clone()),
        other => Err(show_frame(other)),
    }
}

pub(super) fn int_reply(f: &Frame) -> Result<i64, String> {
    match f {
        Frame::Integer(n) => Ok(*n),
        other => Err(show_frame(other)),
    }
}

pub(super) fn string_diff(src: &Frame, tgt: &Frame) -> Option<String> {
    match (src, tgt) {
        (Frame::Bulk(a), Frame::Bulk(b)) if a == b => None,
        (Frame::Bulk(a), Frame::Bulk(b)) => Some(format!(
            "string: {} ({} bytes) on source, {} ({} bytes) on target",
            preview(a),
            a.len(),
            preview(b),
            b.len()
        )),
        (a, b) => Some(error_diff(a, b)),
    }
}

/// Detail for value replies that are not what the type promised (the key changed between
/// the TYPE and the value command, usually).
pub(super) fn error_diff(src: &Frame, tgt: &Frame) -> String {
    format!(
        "unexpected replies: {} from source, {} from target",
        show_frame(src),
        show_frame(tgt)
    )
}

pub(super) fn bulks(f: &Frame) -> Option<Vec<Bytes>> {
    match f {
        Frame::Array(items) => items
            .iter()
            .map(|i| match i {
                Frame::Bulk(b) => Some(b.clone()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// Compares two whole collections of type `kind`; a description of the first difference.
pub(super) fn collection_diff(kind: &[u8], src: &Frame, tgt: &Frame) -> Option<String> {
    let (Some(a), Some(b)) = (bulks(src), bulks(tgt)) else {
        return Some(error_diff(src, tgt));
    };
    match kind {
        b"hash" => {
            let map = |v: Vec<Bytes>| -> BTreeMap<Bytes, Bytes> {
                v.chunks(2)
                    .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
                    .collect()
            };
            let (a, b) = (map(a), map(b));
            let field = a
                .iter()
                .find(|(f, v)| b.get(*f) != Some(*v))
                .map(|(f, _)| f)
                .or_else(|| b.keys().find(|f| !a.contains_key(*f)))?;
            Some(format!(
                "hash: field {} is {} on source, {} on target",
                preview(field),
                a.get(field).map_or("absent".to_string(), |v| preview(v)),
                b.get(field).map_or("absent".to_string(), |v| preview(v))
            ))
        }
        b"set" => {
            let (mut a, mut b) = (a, b);
            a.sort();
            b.sort();
            if a == b {
                return None;
            }
            let only_a = a.iter().find(|m| b.binary_search(m).is_err());
            let only_b = b.iter().find(|m| a.binary_search(m).is_err());
            Some(match (only_a, only_b) {
                (Some(m), _) => format!("set: member {} only on source", preview(m)),
                (None, Some(m)) => format!("set: member {} only on target", preview(m)),
                (None, None) => "set: members differ".to_string(),
            })
        }
        b"zset" => {
            let pairs = |v: &[Bytes]| -> Vec<(Bytes, Bytes)> {
                v.chunks(2)
                    .filter_map(|p| Some((p.first()?.clone(), p.get(1)?.clone())))
                    .collect()
            };
            let (a, b) = (pairs(&a), pairs(&b));
            let same_score = |x: &Bytes, y: &Bytes| {
                x == y || matches!((score(x), score(y)), (Some(p), Some(q)) if p == q)
            };
            let at = (0..a.len().max(b.len())).find(|&i| match (a.get(i), b.get(i)) {
                (Some((ma, sa)), Some((mb, sb))) => ma != mb || !same_score(sa, sb),
                _ => true,
            })?;
            let show = |p: Option<&(Bytes, Bytes)>| match p {
                Some((m, s)) => format!("{} (score {})", preview(m), String::from_utf8_lossy(s)),
                None => "nothing".to_string(),
            };
            Some(format!(
                "zset: rank {at} is {} on source, {} on target",
                show(a.get(at)),
                show(b.get(at))
            ))
        }
        _ => {
            // list: order matters.
            let at = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i))?;
            let show = |x: Option<&Bytes>| x.map_or("nothing".to_string(), |v| preview(v));
            Some(format!(
                "{}: index {at} is {} on source, {} on target",
                String::from_utf8_lossy(kind),
                show(a.get(at)),
                show(b.get(at))
            ))
        }
    }
}

pub(super) fn score(s: &[u8]) -> Option<f64> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// Detail when two `PTTL`s (ms; negative: no TTL) differ: a TTL on one side only, or on both
/// and more than `tolerance` ms apart.
pub(super) fn ttl_diff(src: i64, tgt: i64, tolerance: u64) -> Option<String> {
    let sides = format!("{} on source, {} on target", show_ttl(src), show_ttl(tgt));
    match (src >= 0, tgt >= 0) {
        (true, true) => {
            let apart = src.abs_diff(tgt);
            (apart > tolerance)
                .then(|| format!("{sides}, {apart} ms apart (--ttl-tolerance {tolerance})"))
        }
        (a, b) => (a != b).then_some(sides),
    }
}

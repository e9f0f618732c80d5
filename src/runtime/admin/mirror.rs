//! `GET /mirror` and `GET /mirror/keys` of the admin endpoint: the counters of mirrored copies
//! per receiving cluster, and the record of the keys `dual_write` copies touched
//! ([`respway_filters::write_record`]), which a copy-mode migration's driver reads in its write
//! pause to know which keys to compare. Both read the records of the configuration served (a
//! record lives from snapshot to snapshot while a dual write keeps sending its cluster copies).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hyper::StatusCode;

use super::State;

/// `/mirror`: one line per cluster that received mirrored copies or has a record of write
/// copies, by name: `cluster NAME mirrored=N applied=N failed=N dropped=N` (summed over
/// listeners, workers and configurations; `mirrored - applied - failed` are still queued or
/// in flight), then, with a record, ` record=ID keys=N overflowed=0|1 incomplete=0|1
/// cursor=CURSOR` (the id as 16 hex digits; the distinct keys held now; the cursor
/// `ID:s0.s1...` as of this read, one number per worker).
pub(super) fn counts(state: &State) -> String {
    let r = &state.registry;
    let mut counts: BTreeMap<String, respway_filters::mirror::MirrorCounts> = BTreeMap::new();
    for l in 0..r.listener_names().len() {
        for (name, c) in r.mirror_totals(l) {
            counts.entry(name).or_default().add(&c);
        }
    }
    counts.retain(|_, c| c.mirrored + c.applied + c.failed + c.dropped > 0);
    let snap = state.config.current();
    let records: BTreeMap<&str, &respway_filters::write_record::WriteRecord> = (snap.config)
        .clusters
        .iter()
        .zip(snap.records.iter())
        .filter_map(|(c, r)| Some((c.name.as_str(), r.as_deref()?)))
        .collect();
    for name in records.keys() {
        counts.entry(name.to_string()).or_default();
    }
    let mut o = String::new();
    for (name, c) in counts {
        let _ = write!(
            o,
            "cluster {name} mirrored={} applied={} failed={} dropped={}",
            c.mirrored, c.applied, c.failed, c.dropped
        );
        if let Some(rec) = records.get(name.as_str()) {
            let v = rec.view();
            let _ = write!(
                o,
                " record={:016x} keys={} overflowed={} incomplete={} cursor={}",
                rec.id(),
                v.keys,
                u8::from(v.overflowed),
                u8::from(v.incomplete),
                v.cursor
            );
        }
        o.push('\n');
    }
    o
}

/// `/mirror/keys?cluster=NAME[&since=CURSOR]`: the status and body. 200: a `record ID cursor
/// CURSOR overflowed 0|1 incomplete 0|1` line (the cursor as of this read: each worker's part
/// read once, under its lock, with its keys), then one line per key of the record whose last
/// recorded write is past `since` (every key without it), hex-encoded (lowercase), each once
/// (a key written through two workers too), in no particular order. 404 when
/// the cluster has no record, 409 when `since` is of another record (this one replaced it:
/// compare everything again), 400 for a missing cluster or a malformed cursor.
pub(super) fn keys(state: &State, query: &str) -> (StatusCode, String) {
    use respway_filters::write_record::{Cursor, KeysSince, SinceError};
    let (mut cluster, mut since) = (None, None);
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "cluster" => cluster = Some(percent_decode(v)),
            "since" => since = Some(percent_decode(v)),
            other => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("unknown parameter {other}: /mirror/keys takes cluster and since\n"),
                )
            }
        }
    }
    let Some(cluster) = cluster else {
        return (
            StatusCode::BAD_REQUEST,
            "/mirror/keys needs ?cluster=NAME\n".into(),
        );
    };
    let snap = state.config.current();
    let record = (snap.config.clusters.iter())
        .position(|c| c.name == cluster)
        .and_then(|i| snap.records.get(i)?.clone());
    let Some(record) = record else {
        return (
            StatusCode::NOT_FOUND,
            format!(
                "cluster {cluster:?} has no record of write copies: no dual_write policy sends \
                 it copies in the configuration served\n"
            ),
        );
    };
    let since = match since.as_deref().map(str::parse::<Cursor>).transpose() {
        Ok(c) => c,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("since: {e}\n")),
    };
    match record.keys_since(since.as_ref()) {
        Ok(KeysSince { view: v, keys }) => {
            let mut o = format!(
                "record {:016x} cursor {} overflowed {} incomplete {}\n",
                record.id(),
                v.cursor,
                u8::from(v.overflowed),
                u8::from(v.incomplete)
            );
            o.reserve(keys.iter().map(|k| 2 * k.len() + 1).sum());
            for k in keys {
                for b in k.iter() {
                    let _ = write!(o, "{b:02x}");
                }
                o.push('\n');
            }
            (StatusCode::OK, o)
        }
        Err(e @ SinceError::Replaced { .. }) => (StatusCode::CONFLICT, format!("since: {e}\n")),
        Err(e @ SinceError::Parts { .. }) => (StatusCode::BAD_REQUEST, format!("since: {e}\n")),
    }
}

/// `s` with its `%XX` escapes decoded (an invalid one is kept as written).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b.get(i + 1..i + 3))
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

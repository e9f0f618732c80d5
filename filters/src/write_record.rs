//! The record of the keys dual-write copies touched, per receiving cluster: what a copy-mode
//! migration's write pause re-checks instead of the whole keyspace.
//!
//! Copy mode (`dual_write`) sends every write of a route to a second cluster through a bounded
//! queue ([`crate::mirror`]). Before the cut-over a driver pauses writes, waits until every
//! sidecar's queued copies are applied, and must then compare the keys written since dual
//! write began on both sides. This record tells it which keys those were: for each cluster
//! that receives write copies (the mirror cluster of an old-first `dual_write`, the route's
//! own cluster of a new-first one), the sidecar notes the keys of every write copy it makes
//! ([`RecordPart::record`], called by the mirror layer where the copy is made), including
//! copies then dropped because the queue was full (their keys differ: the reader must see
//! them). Reads copied with `include_reads`, commands the sampling fraction skips and
//! commands whose write reaches the receiving Redis itself (clusters sharing primaries) are
//! no copies and are not recorded.
//!
//! # Shape and cost
//!
//! One [`WriteRecord`] per receiving cluster name and process, made of one [`RecordPart`] per
//! worker, each behind that worker's own `Mutex`: the worker's connections take it once per
//! write copy (one hash-map insert; only the admin reader ever contends for it, as for
//! [`crate::moving::Moved`]). A route without a `dual_write` mirror never reaches it. A key is
//! held once per part with the sequence number of its last recorded write: each part counts
//! the writes it records (1, 2, ...), and its highest number so far is its part of a
//! [`Cursor`]. Keys are recorded as the copy names them (a `remove_prefix` route's without its
//! prefix), whatever the client database.
//!
//! # Reading
//!
//! A reader takes a [`Cursor`] with the keys ([`WriteRecord::keys_since`]): each part is read
//! under its lock once, its highest sequence number and its keys in the same critical section,
//! so a write recorded after the reader left a part has a number above the cursor's, and the
//! next read `since` that cursor returns it. A cursor names its record's random [`id`]: a
//! record created anew (the configuration dropped every `dual_write` to the cluster, then
//! another added one) has another id, and a cursor of the old one is refused
//! ([`SinceError::Replaced`]): the reader must compare everything again. A key written
//! through two workers is held by both parts; it is listed and counted once.
//!
//! # Bounds
//!
//! A record holds at most [`RECORD_KEYS_MAX`] distinct keys, split evenly over the parts
//! (`ceil(max / workers)` each). A part that is full records no new key and says so
//! (`overflowed`); a write copy without keys (a script called with no key) cannot be recorded
//! and marks the part `incomplete`. Either flag tells the reader that the keys listed are not
//! all that changed: it falls back to a full comparison.
//!
//! [`id`]: WriteRecord::id

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::request::Request;

/// Distinct keys one record holds at most, over all its parts.
pub const RECORD_KEYS_MAX: usize = 1_000_000;

/// Per cluster (indexed like `Routing::clusters`), this worker's part of the cluster's record,
/// `None` for a cluster that receives no write copies. What the mirror layer records into.
pub type RecordParts = Arc<[Option<Arc<RecordPart>>]>;

/// The keys the write copies to one cluster touched, one part per worker.
#[derive(Debug)]
pub struct WriteRecord {
    id: u64,
    parts: Vec<Arc<RecordPart>>,
}

/// One worker's part of a [`WriteRecord`].
#[derive(Debug)]
pub struct RecordPart {
    state: Mutex<PartState>,
    /// Distinct keys this part holds at most.
    max_keys: usize,
}

#[derive(Debug, Default)]
struct PartState {
    /// Each key with the number of its last recorded write.
    keys: HashMap<Box<[u8]>, u64>,
    /// Writes recorded (the number of the last one).
    seq: u64,
    /// A new key was not recorded: the part was full.
    overflowed: bool,
    /// A write copy had no keys to record.
    incomplete: bool,
}

/// Where a reader of a record is: the record's id and, per part, the highest sequence number
/// it has seen. Written `ID:s0.s1...` (the id as 16 lowercase hex digits, then each part's
/// number in decimal, in worker order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The record's [`WriteRecord::id`].
    pub id: u64,
    /// Per part, the highest sequence number seen.
    pub seqs: Vec<u64>,
}

/// A record as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView {
    /// Where the read left each part.
    pub cursor: Cursor,
    /// Distinct keys held ([`WriteRecord::view`]), or listed ([`WriteRecord::keys_since`]).
    pub keys: usize,
    /// Some part was full when a new key came: keys are missing.
    pub overflowed: bool,
    /// Some write copy had no keys: what it changed is not listed.
    pub incomplete: bool,
}

/// What [`WriteRecord::keys_since`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysSince {
    /// The record as read (its `keys`: how many are listed).
    pub view: RecordView,
    /// The keys written past the cursor, each once, in no particular order.
    pub keys: Vec<Box<[u8]>>,
}

/// Why [`WriteRecord::keys_since`] cannot answer from a cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinceError {
    /// The cursor is of another record (this one was created since): read everything again.
    Replaced {
        /// The cursor's id.
        since: u64,
        /// This record's id.
        id: u64,
    },
    /// The cursor has another number of parts than the record has workers.
    Parts {
        /// The cursor's.
        since: usize,
        /// The record's.
        parts: usize,
    },
}

impl fmt::Display for SinceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinceError::Replaced { since, id } => write!(
                f,
                "the cursor is of record {since:016x}, which was replaced by record {id:016x} \
                 (the dual-write copies to the cluster stopped in between): compare every key"
            ),
            SinceError::Parts { since, parts } => write!(
                f,
                "the cursor has {since} worker parts, the record has {parts}"
            ),
        }
    }
}

impl std::error::Error for SinceError {}

/// A cursor that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorError(String);

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cursor {:?}: expected ID:SEQ.SEQ... (ID: 16 hex digits; one decimal SEQ per worker)",
            self.0
        )
    }
}

impl std::error::Error for CursorError {}

// === impl WriteRecord ===

impl WriteRecord {
    /// A new, empty record with a random id and one part per worker, holding at most
    /// [`RECORD_KEYS_MAX`] keys in all.
    pub fn new(workers: usize) -> Self {
        WriteRecord::with_id(rand::random(), workers, RECORD_KEYS_MAX)
    }

    /// A new, empty record with id `id` and one part per worker (at least one), holding at
    /// most `max_keys` keys in all (`ceil(max_keys / workers)` per part).
    pub fn with_id(id: u64, workers: usize, max_keys: usize) -> Self {
        let workers = workers.max(1);
        let per_part = max_keys.div_ceil(workers);
        WriteRecord {
            id,
            parts: (0..workers)
                .map(|_| {
                    Arc::new(RecordPart {
                        state: Mutex::default(),
                        max_keys: per_part,
                    })
                })
                .collect(),
        }
    }

    /// The id chosen when the record was created.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The part of worker `worker`.
    pub fn part(&self, worker: usize) -> Option<Arc<RecordPart>> {
        self.parts.get(worker).cloned()
    }

    /// The record now: its cursor, distinct keys held and flags, each part read under its lock
    /// once. With several parts a key recorded by two workers is held by both: the count is
    /// then of distinct keys by their 64-bit hashes, taken under each lock and merged after (a
    /// collision, odds about n² / 2⁶⁵, would count two keys as one), so that no worker waits
    /// for more than its own part.
    pub fn view(&self) -> RecordView {
        let several = self.parts.len() > 1;
        let (mut held, mut hashes) = (0, Vec::new());
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        let mut view = self.read(|_, s| {
            if several {
                hashes.extend(s.keys.keys().map(|k| hasher.hash_one(k)));
            } else {
                held += s.keys.len();
            }
        });
        if several {
            hashes.sort_unstable();
            hashes.dedup();
            held = hashes.len();
        }
        view.keys = held;
        view
    }

    /// The keys whose last recorded write is past `since` (every key when `None`), each once,
    /// and the record as read (its `keys`: how many are listed). Each part's keys and its
    /// sequence number are read in one critical section, so a write recorded later is past the
    /// returned cursor; the keys are copied under the lock and merged after it.
    ///
    /// # Errors
    /// `since` is of another record, or has another number of parts.
    pub fn keys_since(&self, since: Option<&Cursor>) -> Result<KeysSince, SinceError> {
        if let Some(c) = since {
            if c.id != self.id {
                return Err(SinceError::Replaced {
                    since: c.id,
                    id: self.id,
                });
            }
            if c.seqs.len() != self.parts.len() {
                return Err(SinceError::Parts {
                    since: c.seqs.len(),
                    parts: self.parts.len(),
                });
            }
        }
        let mut keys: Vec<Box<[u8]>> = Vec::new();
        let mut view = self.read(|i, s| {
            // Every key recorded has a number from 1: past 0 is every key.
            let from = since.map_or(0, |c| c.seqs.get(i).copied().unwrap_or(0));
            if from < s.seq {
                let past = s.keys.iter().filter(|(_, &n)| n > from);
                keys.extend(past.map(|(k, _)| k.clone()));
            }
        });
        if self.parts.len() > 1 {
            keys.sort_unstable();
            keys.dedup();
        }
        view.keys = keys.len();
        Ok(KeysSince { view, keys })
    }

    /// Reads every part once, under its lock: its number and flags, and whatever `each` takes
    /// of it (called with the part's index). `keys` is left at 0.
    fn read(&self, mut each: impl FnMut(usize, &PartState)) -> RecordView {
        let mut view = RecordView {
            cursor: Cursor {
                id: self.id,
                seqs: Vec::with_capacity(self.parts.len()),
            },
            keys: 0,
            overflowed: false,
            incomplete: false,
        };
        for (i, p) in self.parts.iter().enumerate() {
            let s = p.lock();
            view.cursor.seqs.push(s.seq);
            view.overflowed |= s.overflowed;
            view.incomplete |= s.incomplete;
            each(i, &s);
        }
        view
    }
}

// === impl RecordPart ===

impl RecordPart {
    fn lock(&self) -> MutexGuard<'_, PartState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one write copy of `req`: its keys, under the next sequence number; a copy
    /// without keys marks the part incomplete.
    pub fn record(&self, req: &Request) {
        self.record_keys(
            req.keys
                .iter()
                .filter_map(|i| req.args.get(i))
                .map(|k| &k[..]),
        );
    }

    /// Records one write copy whose keys are `keys` (none: the part is marked incomplete).
    pub fn record_keys<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) {
        let mut s = self.lock();
        s.seq += 1;
        let (seq, mut any) = (s.seq, false);
        for k in keys {
            any = true;
            if let Some(n) = s.keys.get_mut(k) {
                *n = seq;
            } else if s.keys.len() < self.max_keys {
                s.keys.insert(Box::from(k), seq);
            } else {
                s.overflowed = true;
            }
        }
        if !any {
            s.incomplete = true;
        }
    }

    /// Marks the part incomplete: something changed the receiving cluster's keys (or the
    /// source's) in a way no key names.
    pub fn mark_incomplete(&self) {
        self.lock().incomplete = true;
    }
}

// === impl Cursor ===

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}:", self.id)?;
        for (i, s) in self.seqs.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

impl FromStr for Cursor {
    type Err = CursorError;

    fn from_str(s: &str) -> Result<Cursor, CursorError> {
        let bad = || CursorError(s.to_string());
        let (id, seqs) = s.split_once(':').ok_or_else(bad)?;
        if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let id = u64::from_str_radix(id, 16).map_err(|_| bad())?;
        let seqs = seqs
            .split('.')
            .map(|n| {
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse::<u64>().map_err(|_| bad())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Cursor { id, seqs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_since(r: &WriteRecord, since: Option<&Cursor>) -> (Vec<Vec<u8>>, RecordView) {
        let KeysSince { view, keys } = r.keys_since(since).expect("read");
        let mut out: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
        out.sort();
        (out, view)
    }

    #[test]
    fn a_cursor_round_trips_and_malformed_ones_are_refused() {
        let c = Cursor {
            id: 0x00ab_cdef_0123_4567,
            seqs: vec![0, 17, u64::MAX],
        };
        let text = c.to_string();
        assert_eq!(text, "00abcdef01234567:0.17.18446744073709551615");
        assert_eq!(text.parse::<Cursor>(), Ok(c));
        assert_eq!(
            "FFFFFFFFFFFFFFFF:3".parse::<Cursor>().map(|c| c.id),
            Ok(u64::MAX)
        );
        for bad in [
            "",
            "00abcdef01234567",
            "00abcdef01234567:",
            "00abcdef0123456:1",
            "00abcdef012345678:1",
            "00abcdef0123456g:1",
            "+0abcdef01234567:1",
            "00abcdef01234567:1..2",
            "00abcdef01234567:1.",
            "00abcdef01234567:+1",
            "00abcdef01234567:-1",
            "00abcdef01234567:18446744073709551616",
            "00abcdef01234567:1 ",
        ] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn keys_since_a_cursor_are_those_written_after_it() {
        let r = WriteRecord::with_id(7, 2, 100);
        let (w0, w1) = (r.part(0).unwrap(), r.part(1).unwrap());
        w0.record_keys([&b"a"[..], b"b"]);
        w1.record_keys([&b"c"[..]]);
        let (all, view) = keys_since(&r, None);
        assert_eq!(all, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(view.keys, 3);
        assert_eq!(r.view().keys, 3);
        assert_eq!(view.cursor.to_string(), "0000000000000007:1.1");
        // Written again (a) and new (d) after the cursor: only those.
        w0.record_keys([&b"a"[..]]);
        w1.record_keys([&b"d"[..]]);
        let (since, next) = keys_since(&r, Some(&view.cursor));
        assert_eq!(since, [b"a".to_vec(), b"d".to_vec()]);
        assert_eq!(next.cursor.seqs, [2, 2]);
        assert_eq!(next.keys, 2);
        assert_eq!(r.view().keys, 4);
        // A key both workers wrote is held by both parts, and counted and listed once.
        w1.record_keys([&b"a"[..]]);
        assert_eq!(r.view().keys, 4);
        let (since, _) = keys_since(&r, Some(&next.cursor));
        assert_eq!(since, [b"a".to_vec()]);
        let next = r.view();
        let (none, _) = keys_since(&r, Some(&next.cursor));
        assert!(none.is_empty());
        assert!(!next.overflowed && !next.incomplete);
    }

    #[test]
    fn a_cursor_of_another_record_or_shape_is_refused() {
        let r = WriteRecord::with_id(7, 2, 100);
        let other = Cursor {
            id: 8,
            seqs: vec![0, 0],
        };
        assert_eq!(
            r.keys_since(Some(&other)),
            Err(SinceError::Replaced { since: 8, id: 7 })
        );
        let short = Cursor {
            id: 7,
            seqs: vec![0],
        };
        assert_eq!(
            r.keys_since(Some(&short)),
            Err(SinceError::Parts { since: 1, parts: 2 })
        );
        assert!(WriteRecord::new(1).id() != WriteRecord::new(1).id());
    }

    #[test]
    fn a_full_part_records_no_new_key_and_says_so() {
        // 5 keys over 2 workers: 3 per part.
        let r = WriteRecord::with_id(1, 2, 5);
        let w0 = r.part(0).unwrap();
        w0.record_keys([&b"a"[..], b"b", b"c"]);
        assert!(!r.view().overflowed);
        w0.record_keys([&b"d"[..]]);
        let view = r.view();
        assert!(view.overflowed);
        assert_eq!(view.keys, 3);
        // A key it holds is still updated.
        let before = view.cursor.clone();
        w0.record_keys([&b"a"[..], b"e"]);
        let (since, _) = keys_since(&r, Some(&before));
        assert_eq!(since, [b"a".to_vec()]);
        assert_eq!(r.view().keys, 3);
        // The other worker's part has room of its own.
        r.part(1).unwrap().record_keys([&b"x"[..], b"y", b"z"]);
        assert_eq!(r.view().keys, 6);
        assert_eq!(
            WriteRecord::with_id(1, 3, RECORD_KEYS_MAX).parts[0].max_keys,
            333_334
        );
    }

    #[test]
    fn a_write_without_keys_marks_the_record_incomplete() {
        let r = WriteRecord::with_id(1, 1, 10);
        r.part(0).unwrap().record_keys([&b"a"[..]]);
        assert!(!r.view().incomplete);
        r.part(0).unwrap().record_keys(std::iter::empty());
        let view = r.view();
        assert!(view.incomplete);
        assert_eq!(view.keys, 1);
    }
}

//! The report: counts by kind of difference, examples, and how values are shown.

use super::*;

// === report ===

/// Kinds of mismatch, as the summary names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    MissingInTarget,
    TypeMismatch,
    ValueMismatch,
    TtlMismatch,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::MissingInTarget => "missing_in_target",
            Kind::TypeMismatch => "type_mismatch",
            Kind::ValueMismatch => "value_mismatch",
            Kind::TtlMismatch => "ttl_mismatch",
        })
    }
}

/// Tallies, and the mismatches printed so far.
pub(super) struct Report {
    pub(super) max_shown: usize,
    pub(super) scanned: u64,
    pub(super) vanished: u64,
    pub(super) missing_in_target: u64,
    pub(super) type_mismatch: u64,
    pub(super) value_mismatch: u64,
    pub(super) ttl_mismatch: u64,
    /// Keys with at least one mismatch (a key may have a value and a TTL mismatch).
    pub(super) bad_keys: u64,
    /// Keys of the current batch with a mismatch, counted into `bad_keys` at its end.
    pub(super) batch_bad: HashSet<Bytes>,
    pub(super) shown: usize,
    pub(super) total: u64,
    /// With `--repair`: its tallies (the summary names them only then).
    pub(super) repairing: bool,
    /// Keys copied and then found equal.
    pub(super) repaired: u64,
    /// Keys still different after the last round, or that could not be copied.
    pub(super) unsettled: u64,
    /// Keys deleted or expired on the source while they were repaired: not restored.
    pub(super) gone_while_repaired: u64,
    /// With `--prune`: keys deleted from the target because their source owner lacks them.
    pub(super) pruned: u64,
}

impl Report {
    pub(super) fn new(max_shown: usize, repairing: bool) -> Self {
        Report {
            max_shown,
            scanned: 0,
            vanished: 0,
            missing_in_target: 0,
            type_mismatch: 0,
            value_mismatch: 0,
            ttl_mismatch: 0,
            bad_keys: 0,
            batch_bad: HashSet::new(),
            shown: 0,
            total: 0,
            repairing,
            repaired: 0,
            unsettled: 0,
            gone_while_repaired: 0,
            pruned: 0,
        }
    }

    pub(super) fn add(&mut self, key: &Bytes, kind: Kind, detail: String) {
        *match kind {
            Kind::MissingInTarget => &mut self.missing_in_target,
            Kind::TypeMismatch => &mut self.type_mismatch,
            Kind::ValueMismatch => &mut self.value_mismatch,
            Kind::TtlMismatch => &mut self.ttl_mismatch,
        } += 1;
        self.batch_bad.insert(key.clone());
        self.total += 1;
        if self.shown < self.max_shown {
            self.shown += 1;
            println!("{kind} {}: {detail}", quote(key));
        }
    }

    /// A key `--repair` could not make equal: listed, every one.
    pub(super) fn unsettled(&mut self, key: &Bytes, reason: &str) {
        self.unsettled += 1;
        println!("unsettled {}: {reason}", quote(key));
    }

    /// Closes a batch: its mismatched keys join the total.
    pub(super) fn end_batch(&mut self) {
        self.bad_keys += self.batch_bad.len() as u64;
        self.batch_bad.clear();
    }

    /// Prints what was not shown and the summary line.
    pub(super) fn finish(&self) {
        if self.total > self.shown as u64 {
            println!(
                "... {} more mismatches not shown (--max-mismatches {})",
                self.total - self.shown as u64,
                self.max_shown
            );
        }
        if self.vanished > 0 {
            println!(
                "{} scanned keys were deleted or expired on the source before they were compared",
                self.vanished
            );
        }
        if self.gone_while_repaired > 0 {
            println!(
                "{} keys were deleted or expired on the source while they were repaired (not restored on the target)",
                self.gone_while_repaired
            );
        }
        let matched = self.scanned.saturating_sub(self.vanished + self.bad_keys);
        let repair = if self.repairing {
            format!(", repaired {}, unsettled {}", self.repaired, self.unsettled)
        } else {
            String::new()
        };
        println!(
            "scanned {}, matched {matched}, missing_in_target {}, type_mismatch {}, value_mismatch {}, ttl_mismatch {}{repair}",
            self.scanned, self.missing_in_target, self.type_mismatch, self.value_mismatch, self.ttl_mismatch
        );
    }
}

// === display helpers ===

/// `"..."` with printable ASCII as is, `"` and `\` escaped, other bytes as `\xHH`.
pub(super) fn quote(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() + 2);
    s.push('"');
    for &c in b {
        match c {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(char::from(c)),
            _ => {
                let _ = write!(s, "\\x{c:02x}");
            }
        }
    }
    s.push('"');
    s
}

/// [`quote`] of at most [`PREVIEW`] bytes, with `...` when cut.
pub(super) fn preview(b: &[u8]) -> String {
    if b.len() <= PREVIEW {
        quote(b)
    } else {
        format!("{}...", quote(&b[..PREVIEW]))
    }
}

pub(super) fn show_frame(f: &Frame) -> String {
    match f {
        Frame::Simple(s) => format!("+{}", String::from_utf8_lossy(s)),
        Frame::Error(s) => format!("-{}", String::from_utf8_lossy(s)),
        Frame::Integer(n) => format!(":{n}"),
        Frame::Bulk(b) => preview(b),
        Frame::Null | Frame::NullArray | Frame::Nil => "nil".to_string(),
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => {
            format!("an array of {}", items.len())
        }
        Frame::Map(pairs) => format!("a map of {}", pairs.len()),
        Frame::Boolean(b) => format!("#{}", if *b { 't' } else { 'f' }),
        Frame::Double(t) | Frame::BigNumber(t) => String::from_utf8_lossy(t).into_owned(),
        Frame::BlobError(s) => format!("-{}", String::from_utf8_lossy(s)),
        Frame::Verbatim(b) => preview(b),
    }
}

pub(super) fn show_opt(f: Option<&Frame>) -> String {
    f.map_or("none".to_string(), show_frame)
}

pub(super) fn show_ttl(pttl: i64) -> String {
    if pttl >= 0 {
        format!("TTL {pttl} ms")
    } else {
        "no TTL".to_string()
    }
}

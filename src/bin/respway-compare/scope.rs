//! `--prefix`, `--skip-prefix` and `--ignore-case`: the keys a run looks at. A key is in scope
//! when it starts with `--prefix` (any key without one) and with no `--skip-prefix`; every
//! walk (the source's SCAN, the target's with `--prune`, the cleanup's, the mover's) and the
//! keys of `--keys` leave out the others: they are not counted, compared, copied, moved or
//! deleted.
//!
//! With a prefix, the SCAN itself skips most other keys: `SCAN ... MATCH <prefix>*`, the
//! prefix glob-escaped ([`glob`]); what it returns is filtered again ([`Scope::contains`]), so
//! the pattern only has to let every key in scope through. The prefixes of a listener's routes
//! are what `respway-xds reshard` passes: the route's own, and the longer ones of other
//! routes, whose keys are theirs.

use super::*;
use crate::report::quote;

/// Which keys a run looks at; the default: every key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Scope {
    /// `--prefix`: only keys that start with it.
    pub(super) prefix: Option<Bytes>,
    /// `--skip-prefix`: keys that start with any of these are out.
    pub(super) skip: Vec<Bytes>,
    /// `--ignore-case`: prefixes match ignoring ASCII case (a listener's `case_insensitive`).
    pub(super) ignore_case: bool,
}

impl Scope {
    /// The scope of the command line.
    pub(super) fn new(prefix: Option<&str>, skip: &[String], ignore_case: bool) -> Scope {
        let bytes = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        Scope {
            prefix: prefix.map(bytes),
            skip: skip.iter().map(|s| bytes(s)).collect(),
            ignore_case,
        }
    }

    /// Whether every key is in scope.
    pub(super) fn is_all(&self) -> bool {
        self.prefix.is_none() && self.skip.is_empty()
    }

    /// Whether `key` is in scope.
    pub(super) fn contains(&self, key: &[u8]) -> bool {
        let starts = |p: &[u8]| {
            key.len() >= p.len()
                && if self.ignore_case {
                    key[..p.len()].eq_ignore_ascii_case(p)
                } else {
                    key[..p.len()] == *p
                }
        };
        self.prefix.as_deref().is_none_or(starts) && !self.skip.iter().any(|p| starts(p))
    }

    /// The `MATCH` pattern of the SCANs: `<prefix>*`, or `None` (no pattern) without
    /// `--prefix`.
    pub(super) fn pattern(&self) -> Option<Bytes> {
        let prefix = self.prefix.as_deref()?;
        let mut p = glob(prefix, self.ignore_case);
        p.push(b'*');
        Some(Bytes::from(p))
    }

    /// How the scope is written in messages and in the checkpoint: `prefix "p:", skip "p:x:"`,
    /// empty for every key.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = &self.prefix {
            parts.push(format!("prefix {}", quote(p)));
        }
        for p in &self.skip {
            parts.push(format!("skip {}", quote(p)));
        }
        if self.ignore_case && !parts.is_empty() {
            parts.push("ignore case".to_string());
        }
        parts.join(", ")
    }
}

/// `prefix` as a Redis glob pattern matching exactly itself: the glob's special bytes (`*`,
/// `?`, `[`, `]`, `\`) escaped with a backslash; with `ignore_case`, each ASCII letter as the
/// class of its two cases (`[pP]`; Redis's SCAN matches case-sensitively).
pub(super) fn glob(prefix: &[u8], ignore_case: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() * 2);
    for &b in prefix {
        if ignore_case && b.is_ascii_alphabetic() {
            out.extend([b'[', b.to_ascii_lowercase(), b.to_ascii_uppercase(), b']']);
        } else {
            if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
                out.push(b'\\');
            }
            out.push(b);
        }
    }
    out
}

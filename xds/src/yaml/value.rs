//! Reading YAML values: [`Map`], a checked mapping whose getters report wrong types.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_yaml_ng::{Mapping, Value};

use crate::common;
use crate::error::{index, join, Cx};

// === reading YAML values ===

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// A YAML mapping at `path` whose keys were checked against the schema. Getters report a
/// wrong type (or out-of-range number) and return `None`, so callers fall back to a default
/// and keep walking; the walk as a whole fails if any error was reported.
pub(super) struct Map<'v> {
    map: &'v Mapping,
    path: String,
}

impl<'v> Map<'v> {
    /// Checks that `v` is a mapping with only `known` keys (each unknown key is an error).
    pub(super) fn new(cx: &mut Cx, v: &'v Value, path: &str, known: &[&str]) -> Option<Map<'v>> {
        let Value::Mapping(map) = v else {
            cx.err(path, format!("expected a mapping, got {}", kind(v)));
            return None;
        };
        for k in map.keys() {
            match k.as_str() {
                Some(k) if known.contains(&k) => {}
                Some(k) => cx.err(
                    join(path, k),
                    format!("unknown field (expected one of: {})", known.join(", ")),
                ),
                None => cx.err(path, format!("keys must be strings, got {}", kind(k))),
            }
        }
        Some(Map {
            map,
            path: path.to_string(),
        })
    }

    /// The value, `Some(Null)` included.
    pub(super) fn raw(&self, key: &str) -> Option<&'v Value> {
        self.map.get(key)
    }

    /// The value; a null counts as absent.
    pub(super) fn get(&self, key: &str) -> Option<&'v Value> {
        self.raw(key).filter(|v| !v.is_null())
    }

    /// Path of `key`.
    pub(super) fn at(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub(super) fn string(&self, cx: &mut Cx, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                cx.err(
                    self.at(key),
                    format!("expected a string, got {}", kind(other)),
                );
                None
            }
        }
    }

    pub(super) fn non_empty_string(&self, cx: &mut Cx, key: &str) -> Option<String> {
        let s = self.string(cx, key)?;
        if s.is_empty() {
            cx.err(self.at(key), "must not be empty (leave it out or use null)");
            return None;
        }
        Some(s)
    }

    /// A file path: a non-empty string.
    pub(super) fn path(&self, cx: &mut Cx, key: &str) -> Option<PathBuf> {
        self.non_empty_string(cx, key).map(PathBuf::from)
    }

    /// A required file path.
    pub(super) fn required_path(&self, cx: &mut Cx, key: &str) -> Option<PathBuf> {
        if self.get(key).is_none() {
            cx.err(self.at(key), "required");
            return None;
        }
        self.path(cx, key)
    }

    pub(super) fn required_string(&self, cx: &mut Cx, key: &str) -> Option<String> {
        if self.get(key).is_none() {
            cx.err(self.at(key), "required");
            return None;
        }
        self.string(cx, key)
    }

    /// `name`, required and not empty.
    pub(super) fn required_name(&self, cx: &mut Cx) -> Option<String> {
        let name = self.required_string(cx, "name")?;
        if name.is_empty() {
            cx.err(self.at("name"), "must not be empty");
            return None;
        }
        Some(name)
    }

    /// A required string parsed by `parse`.
    pub(super) fn required<T>(
        &self,
        cx: &mut Cx,
        key: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        let s = self.required_string(cx, key)?;
        parse(&s).map_err(|e| cx.err(self.at(key), e)).ok()
    }

    pub(super) fn uint(&self, cx: &mut Cx, key: &str, max: u64) -> Option<u64> {
        let v = self.get(key)?;
        match v.as_u64() {
            Some(n) if n <= max => Some(n),
            Some(_) => {
                cx.err(self.at(key), format!("must be at most {max}"));
                None
            }
            None => {
                cx.err(
                    self.at(key),
                    format!("expected an unsigned integer, got {}", kind(v)),
                );
                None
            }
        }
    }

    pub(super) fn positive(&self, cx: &mut Cx, key: &str, max: u64) -> Option<u64> {
        let n = self.uint(cx, key, max)?;
        if n == 0 {
            cx.err(self.at(key), "must be greater than 0");
            return None;
        }
        Some(n)
    }

    /// A size in bytes greater than 0: an integer, or a string [`common::parse_size`] reads
    /// (`64mb`).
    pub(super) fn size(&self, cx: &mut Cx, key: &str) -> Option<u64> {
        let n = match self.get(key)? {
            Value::String(s) => common::parse_size(s)
                .map_err(|e| cx.err(self.at(key), e))
                .ok()?,
            Value::Number(_) => self.uint(cx, key, u64::MAX)?,
            other => {
                cx.err(
                    self.at(key),
                    format!(
                        "expected a size (an integer or a string such as \"64mb\"), got {}",
                        kind(other)
                    ),
                );
                return None;
            }
        };
        if n == 0 {
            cx.err(self.at(key), "must be greater than 0");
            return None;
        }
        Some(n)
    }

    pub(super) fn boolean(&self, cx: &mut Cx, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                cx.err(
                    self.at(key),
                    format!("expected true or false, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// A percentage from 0 to 100 (decimals allowed, down to 0.0001%) in parts per million.
    pub(super) fn fraction_ppm(&self, cx: &mut Cx, key: &str) -> Option<u32> {
        let v = self.get(key)?;
        let Some(percent) = v.as_f64() else {
            cx.err(
                self.at(key),
                format!("expected a percentage (a number), got {}", kind(v)),
            );
            return None;
        };
        if !(0.0..=100.0).contains(&percent) {
            cx.err(self.at(key), "must be between 0 and 100 (a percentage)");
            return None;
        }
        let scaled = percent * 10_000.0;
        let ppm = scaled.round();
        if (scaled - ppm).abs() > 1e-6 {
            cx.err(
                self.at(key),
                format!("{percent} has more than 4 decimal places (the resolution is 0.0001%)"),
            );
            return None;
        }
        Some(ppm as u32)
    }

    /// A duration string, zero allowed.
    pub(super) fn duration_or_zero(&self, cx: &mut Cx, key: &str) -> Option<Duration> {
        let s = self.string(cx, key)?;
        common::parse_duration(&s)
            .map_err(|e| cx.err(self.at(key), e))
            .ok()
    }

    pub(super) fn addr(&self, cx: &mut Cx, key: &str) -> Option<SocketAddr> {
        let s = self.string(cx, key)?;
        common::parse_socket_addr(&s)
            .map_err(|e| cx.err(self.at(key), e))
            .ok()
    }

    pub(super) fn seq(&self, cx: &mut Cx, key: &str) -> Option<&'v [Value]> {
        match self.get(key)? {
            Value::Sequence(s) => Some(s.as_slice()),
            other => {
                cx.err(
                    self.at(key),
                    format!("expected a list, got {}", kind(other)),
                );
                None
            }
        }
    }

    /// A string or a list of strings (each an error when it is not one).
    pub(super) fn strings(&self, cx: &mut Cx, key: &str) -> Vec<String> {
        match self.get(key) {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Sequence(list)) => {
                let mut out = Vec::new();
                for (i, v) in list.iter().enumerate() {
                    match v.as_str() {
                        Some(s) => out.push(s.to_string()),
                        None => cx.err(
                            index(&self.at(key), i),
                            format!("expected a string, got {}", kind(v)),
                        ),
                    }
                }
                out
            }
            Some(other) => {
                cx.err(
                    self.at(key),
                    format!(
                        "expected a string or a list of strings, got {}",
                        kind(other)
                    ),
                );
                Vec::new()
            }
        }
    }

    /// A required list with at least one element; empty when it is not.
    pub(super) fn non_empty_seq(&self, cx: &mut Cx, key: &str) -> &'v [Value] {
        if self.get(key).is_none() {
            cx.err(self.at(key), "required");
            return &[];
        }
        let s = self.seq(cx, key).unwrap_or_default();
        if s.is_empty() && self.get(key).is_some_and(Value::is_sequence) {
            cx.err(self.at(key), "must not be empty");
        }
        s
    }
}

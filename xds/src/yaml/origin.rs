//! Where each field of the resources read from a YAML file came from, so that the
//! translation's errors (in Envoy terms) are shown in the YAML's own terms.
//!
//! The reader notes, for every resource field it writes, the YAML resource and key path it
//! came from (`cluster_load_assignment "c"`, `endpoints[0].lb_endpoints[1].endpoint.address`
//! → `cluster "c"`, `shards[1].endpoints[0].address`), in the order it walks the document.
//! [`Origins::rewrite`] maps each error of the translation to the longest noted field path
//! it is under, and puts every error, the reader's and the translation's, in that order.

use std::collections::HashMap;

use crate::error::ConfigError;

/// The noted fields of the resources read from one document.
#[derive(Debug, Default, Clone)]
pub(crate) struct Origins {
    /// Envoy resource → (Envoy field path, index in `yaml`).
    fields: HashMap<String, Vec<(String, usize)>>,
    /// (YAML resource, YAML key path), in walk order.
    yaml: Vec<(String, String)>,
    /// The resource being read: (Envoy name, YAML name).
    current: (String, String),
}

/// The path `field` is under: `a.b` of `a.b.c` and of `a.b[0]`, `""` at the top.
fn parent_of(field: &str) -> &str {
    match field.rfind(['.', '[']) {
        Some(i) => &field[..i],
        None => "",
    }
}

/// `path` as seen from `from`: without the parents they share (`mirrors[0]` from
/// `routes.prefixes[1].mirrors[2].cluster` for `routes.prefixes[1].mirrors[0]`).
fn relative(path: &str, from: &str) -> String {
    let mut base = parent_of(path);
    while !base.is_empty() && (!under(from, base) || path[base.len()..].starts_with('[')) {
        base = parent_of(base);
    }
    if base.is_empty() {
        return path.to_string();
    }
    path[base.len()..].trim_start_matches('.').to_string()
}

/// Whether `field` is `prefix` or lies under it.
fn under(field: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || field == prefix
        || (field.starts_with(prefix) && matches!(field.as_bytes()[prefix.len()], b'.' | b'['))
}

/// Enum values the translation names in Envoy terms, as the YAML writes them.
const ENUM_WORDS: &[(&str, &str)] = &[
    ("MIRROR_MODE_DUAL_WRITE", "dual_write"),
    ("MIRROR_MODE_FORWARD", "forward"),
    ("MIRROR_MODE_READ_ONLY", "read_only"),
    ("MIRROR_MODE_MOVE", "move"),
    ("MIRROR_MODE_PREPARE_MOVE", "prepare_move"),
];

impl Origins {
    /// Enters a resource: named `envoy` by the translation and `yaml` by the reader. Its
    /// root is noted as the YAML resource's root.
    pub(crate) fn enter(&mut self, envoy: &str, yaml: &str) {
        self.current = (envoy.to_string(), yaml.to_string());
        self.note("", "");
    }

    /// Notes a top-level key of the document (resource `""`), for the order of its errors.
    pub(crate) fn top(&mut self, key: &str) {
        self.yaml.push((String::new(), key.to_string()));
    }

    /// YAML key path `yaml` of the current resource is read here: errors under it come
    /// after those above (for paths the reader checks before any field is written from them).
    pub(crate) fn mark(&mut self, yaml: impl Into<String>) {
        self.yaml.push((self.current.1.clone(), yaml.into()));
    }

    /// Field `envoy` of the current resource was written from YAML key path `yaml`.
    pub(crate) fn note(&mut self, envoy: impl Into<String>, yaml: impl Into<String>) {
        self.yaml.push((self.current.1.clone(), yaml.into()));
        let at = self.yaml.len() - 1;
        self.fields
            .entry(self.current.0.clone())
            .or_default()
            .push((envoy.into(), at));
    }

    /// The YAML (resource, field) of a translation error, if its resource was read here.
    fn to_yaml(&self, e: &ConfigError) -> Option<(String, String)> {
        let fields = self.fields.get(&e.resource)?;
        let (_, at) = fields
            .iter()
            .filter(|(f, _)| under(&e.field, f))
            .max_by_key(|(f, _)| f.len())?;
        Some(self.yaml[*at].clone())
    }

    /// `reason` of the translation's error at Envoy path `field` of `resource`, with the
    /// fields it names (`conflicts with password_sha256`, `also used by
    /// endpoints[0].lb_endpoints[1]`, `also routes[0]`) named as the YAML does: each field
    /// name outside quotes that is a noted field under the error's field or one of its
    /// parents becomes that field's YAML path, relative to the parent it shares with
    /// `yaml_field`.
    fn reason(&self, resource: &str, field: &str, yaml_field: &str, reason: &str) -> String {
        let Some(fields) = self.fields.get(resource) else {
            return reason.to_string();
        };
        let lookup = |word: &str| -> Option<String> {
            let mut parent = field;
            loop {
                let full = crate::error::join(parent, word);
                if let Some((_, at)) = fields.iter().rev().find(|(f, _)| *f == full) {
                    return Some(relative(&self.yaml[*at].1, yaml_field));
                }
                if parent.is_empty() {
                    return None;
                }
                parent = parent_of(parent);
            }
        };
        let part = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']');
        let mut out = String::new();
        let mut quoted = false;
        let mut rest = reason;
        while let Some(c) = rest.chars().next() {
            if c == '"' {
                quoted = !quoted;
            }
            if quoted || !part(c) {
                out.push(c);
                rest = &rest[c.len_utf8()..];
                continue;
            }
            let end = rest.find(|c: char| !part(c)).unwrap_or(rest.len());
            let word = &rest[..end];
            let bare = word.trim_end_matches('.');
            if let Some((_, yaml)) = ENUM_WORDS.iter().find(|(envoy, _)| *envoy == bare) {
                out.push_str(yaml);
                out.push_str(&word[bare.len()..]);
                rest = &rest[end..];
                continue;
            }
            // Plain words (`cluster`, `shard`) are words; field names have `_`, `.` or `[`.
            let named = bare.contains(['_', '.', '[']);
            match lookup(bare).filter(|_| named) {
                Some(yaml) => {
                    out.push_str(&yaml);
                    out.push_str(&word[bare.len()..]);
                }
                None => out.push_str(word),
            }
            rest = &rest[end..];
        }
        out
    }

    /// Where an error in YAML terms falls in the walk: the first noted path of its resource
    /// that it lies under, the longest of those.
    fn order(&self, resource: &str, field: &str) -> usize {
        self.yaml
            .iter()
            .enumerate()
            .filter(|(_, (r, f))| r == resource && under(field, f))
            .max_by_key(|(i, (_, f))| (f.len(), usize::MAX - i))
            .map_or(usize::MAX, |(i, _)| i)
    }

    /// The reader's errors (`shape`, in YAML terms) and the translation's (in Envoy terms)
    /// as one list in YAML terms, in document order. A translation error about a value the
    /// reader already reported (the same path, or one above or below it) is left out, as are
    /// repeats.
    pub(crate) fn rewrite(
        &self,
        shape: Vec<ConfigError>,
        translated: Vec<ConfigError>,
    ) -> Vec<ConfigError> {
        let mut all = shape.clone();
        for e in translated {
            let e = match self.to_yaml(&e) {
                Some((resource, field)) => ConfigError {
                    reason: self.reason(&e.resource, &e.field, &field, &e.reason),
                    resource,
                    field,
                },
                None => e,
            };
            let reported = shape.iter().any(|s| {
                s.resource == e.resource && (under(&s.field, &e.field) || under(&e.field, &s.field))
            });
            if !reported && !all.contains(&e) {
                all.push(e);
            }
        }
        // Stable: at one place, the reader's errors come first, then the translation's.
        all.sort_by_key(|e| self.order(&e.resource, &e.field));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_take_the_longest_noted_path_and_the_walk_order() {
        let mut o = Origins::default();
        o.top("listeners");
        o.enter("cluster_load_assignment \"c\"", "cluster \"c\"");
        o.note("endpoints", "shards");
        o.note("endpoints[0].lb_endpoints[0]", "shards[0].endpoints[0]");
        o.note(
            "endpoints[0].lb_endpoints[0].endpoint.address",
            "shards[0].endpoints[0].address",
        );
        let e = |r: &str, f: &str| ConfigError::new(r, f, "x");
        let got = o.rewrite(
            vec![e("", "listeners")],
            vec![
                e(
                    "cluster_load_assignment \"c\"",
                    "endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value",
                ),
                e(
                    "cluster_load_assignment \"c\"",
                    "endpoints[0].lb_endpoints[0].role",
                ),
                e("cluster_load_assignment \"c\"", "endpoints"),
                e("listener \"l\"", "address"),
            ],
        );
        let shown: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "listeners: x",
                "cluster \"c\": shards: x",
                "cluster \"c\": shards[0].endpoints[0]: x",
                "cluster \"c\": shards[0].endpoints[0].address: x",
                "listener \"l\": address: x",
            ]
        );
        assert!(under("a.b", "a") && under("a[0]", "a") && !under("ab", "a"));
    }

    #[test]
    fn field_names_in_reasons_are_named_as_the_yaml_does() {
        let mut o = Origins::default();
        o.enter("listener \"l\"", "listener \"l\"");
        o.note("s.users[1].password_sha256", "users[1].password");
        o.note("s.users[1].nopass", "users[1].nopass");
        o.note("p.routes[0]", "routes.prefixes[0]");
        o.note("p.routes[1].prefix", "routes.prefixes[1].prefix");
        o.note("p.catch_all_route", "routes.catch_all");
        let e = |f: &str, reason: &str| ConfigError::new("listener \"l\"", f, reason);
        let got = o.rewrite(
            Vec::new(),
            vec![
                e("s.users[1].nopass", "conflicts with password_sha256"),
                e(
                    "p.routes[1].prefix",
                    "duplicate prefix \"a\" (also routes[0])",
                ),
                e(
                    "p.routes[1].prefix",
                    "only as the sole route (use catch_all_route).",
                ),
                e(
                    "p.routes[1].prefix",
                    "\"routes[0]\" is quoted, nopass is a word",
                ),
            ],
        );
        let shown: Vec<String> = got.iter().map(|e| e.reason.clone()).collect();
        assert_eq!(
            shown,
            [
                "conflicts with password",
                "duplicate prefix \"a\" (also prefixes[0])",
                "only as the sole route (use catch_all).",
                "\"routes[0]\" is quoted, nopass is a word",
            ]
        );
        assert_eq!(
            relative("shards[0].endpoints[0]", "shards[1].endpoints[0].address"),
            "shards[0].endpoints[0]"
        );
        assert_eq!(
            relative("a.mirrors[0]", "a.mirrors[2].cluster"),
            "mirrors[0]"
        );
    }
}

//! The files a reshard pushes, each derived from the operator's resource file by editing one
//! route's YAML value (everything else of the file is kept as it is), and the static
//! configuration the mover reads.

use serde_yaml_ng::{Mapping, Value};

/// The route a reshard moves: the catch-all route of a listener, or one of its prefixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRef {
    /// The listener's `name`.
    pub listener: String,
    /// `None`: the catch-all route; `Some(p)`: the prefix route `p`.
    pub prefix: Option<String>,
}

impl std::fmt::Display for RouteRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.prefix {
            None => write!(f, "listener {:?} catch_all", self.listener),
            Some(p) => write!(f, "listener {:?} prefix {p:?}", self.listener),
        }
    }
}

fn key(k: &str) -> Value {
    Value::String(k.to_string())
}

fn parse(text: &str) -> Result<Mapping, String> {
    match serde_yaml_ng::from_str::<Value>(text) {
        Ok(Value::Mapping(m)) => Ok(m),
        Ok(_) => Err("the file is not a YAML mapping".to_string()),
        Err(e) => Err(format!("not YAML: {e}")),
    }
}

fn write(doc: &Mapping) -> Result<String, String> {
    serde_yaml_ng::to_string(doc).map_err(|e| e.to_string())
}

/// The route's mapping (for a prefix) or the `routes` mapping (for the catch-all).
fn route_mut<'a>(doc: &'a mut Mapping, r: &RouteRef) -> Result<&'a mut Mapping, String> {
    let listeners = doc
        .get_mut(key("listeners"))
        .and_then(Value::as_sequence_mut)
        .ok_or("the file has no `listeners` list")?;
    let listener = listeners
        .iter_mut()
        .filter_map(Value::as_mapping_mut)
        .find(|l| l.get(key("name")).and_then(Value::as_str) == Some(r.listener.as_str()))
        .ok_or_else(|| format!("the file has no listener named {:?}", r.listener))?;
    let routes = listener
        .get_mut(key("routes"))
        .and_then(Value::as_mapping_mut)
        .ok_or_else(|| format!("listener {:?} has no `routes` mapping", r.listener))?;
    match &r.prefix {
        None => Ok(routes),
        Some(p) => routes
            .get_mut(key("prefixes"))
            .and_then(Value::as_sequence_mut)
            .and_then(|ps| {
                ps.iter_mut()
                    .filter_map(Value::as_mapping_mut)
                    .find(|m| m.get(key("prefix")).and_then(Value::as_str) == Some(p.as_str()))
            })
            .ok_or_else(|| format!("listener {:?} has no prefix route {p:?}", r.listener)),
    }
}

/// The keys of the route's cluster and mirrors in the mapping [`route_mut`] returns.
fn keys(r: &RouteRef) -> (&'static str, &'static str) {
    match r.prefix {
        None => ("catch_all", "catch_all_mirrors"),
        Some(_) => ("cluster", "mirrors"),
    }
}

/// Whether `text` defines listener `name` (the files a reshard edits).
pub fn has_listener(text: &str, name: &str) -> bool {
    parse(text).is_ok_and(|doc| {
        doc.get(key("listeners"))
            .and_then(Value::as_sequence)
            .is_some_and(|ls| {
                ls.iter()
                    .any(|l| l.get("name").and_then(Value::as_str) == Some(name))
            })
    })
}

/// Checks that the route exists in `text`, sends to `from` and has no mirror (move mode must
/// be a route's only mirror), and that `to` is another cluster; and that the mover can tell
/// the route's keys from the other routes' ([`scope`]): neither the route nor another prefix
/// route of the listener on `from` or `to` has `remove_prefix: true` (such a route keeps its
/// keys without the prefix, so no prefix sets them apart).
///
/// # Errors
/// What is wrong, naming the route.
pub fn check_start(text: &str, r: &RouteRef, from: &str, to: &str) -> Result<(), String> {
    if from == to {
        return Err(format!("--from and --to are both {from:?}"));
    }
    let mut doc = parse(text)?;
    if let Some(table) = listener_routes(&doc, &r.listener) {
        for p in &table.prefixes {
            let q = RouteRef {
                listener: r.listener.clone(),
                prefix: Some(p.prefix.clone()),
            };
            if !p.remove_prefix {
                continue;
            }
            if r.prefix.as_deref() == Some(p.prefix.as_str()) {
                return Err(format!(
                    "{q} has remove_prefix: true: its keys are stored on its cluster without the \
                     prefix, so the mover cannot tell them from the other routes' keys there; \
                     a reshard moves a route whose keys keep their prefix (or the catch-all)"
                ));
            }
            if let Some(shared) = [from, to].into_iter().find(|c| p.cluster == *c) {
                return Err(format!(
                    "{q} has remove_prefix: true and sends to {shared:?}: its keys are stored \
                     there without the prefix, so the mover of {r} cannot tell them from that \
                     route's keys and would move them too"
                ));
            }
        }
    }
    let route = route_mut(&mut doc, r)?;
    let (cluster, mirrors) = keys(r);
    let now = route.get(key(cluster)).and_then(Value::as_str);
    if now != Some(from) {
        return Err(format!(
            "{r} sends to {}, not to --from {from:?}",
            now.map_or_else(|| "no cluster".to_string(), |c| format!("{c:?}"))
        ));
    }
    if route
        .get(key(mirrors))
        .and_then(Value::as_sequence)
        .is_some_and(|m| !m.is_empty())
    {
        return Err(format!(
            "{r} has mirrors already; move mode must be the route's only mirror"
        ));
    }
    Ok(())
}

/// `text` with the route sent to `cluster`, with a mirror `(cluster, mode)` when given
/// (`prepare_move` or `move`), and without mirrors otherwise.
///
/// # Errors
/// The file is not YAML or has no such route.
pub fn with_route(
    text: &str,
    r: &RouteRef,
    cluster: &str,
    mirror: Option<(&str, &str)>,
) -> Result<String, String> {
    let mut doc = parse(text)?;
    let route = route_mut(&mut doc, r)?;
    let (cluster_key, mirrors_key) = keys(r);
    route.insert(key(cluster_key), key(cluster));
    match mirror {
        Some((m, mode)) => {
            let mut policy = Mapping::new();
            policy.insert(key("cluster"), key(m));
            policy.insert(key("mode"), key(mode));
            route.insert(
                key(mirrors_key),
                Value::Sequence(vec![Value::Mapping(policy)]),
            );
        }
        None => {
            route.remove(key(mirrors_key));
        }
    }
    write(&doc)
}

/// The keys of one route on its clusters, as far as the mover can tell them apart: what
/// `respway-compare` is told with `--prefix`, `--skip-prefix` and `--ignore-case` ([`scope`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// The route's prefix; `None` for the catch-all (every key, less `skip`).
    pub prefix: Option<String>,
    /// The prefixes of the listener's other routes whose keys would otherwise be in scope:
    /// for a prefix route the longer ones that start with it, for the catch-all every one.
    pub skip: Vec<String>,
    /// The listener matches prefixes ignoring ASCII case (`case_insensitive: true`).
    pub ignore_case: bool,
}

impl Scope {
    /// Whether every key of the cluster is the route's (no flag to pass).
    pub fn is_all(&self) -> bool {
        self.prefix.is_none() && self.skip.is_empty()
    }

    /// The flags of `respway-compare` (`--prefix=P`, `--skip-prefix=Q`..., `--ignore-case`);
    /// none for every key. In the `=` form, so that a prefix starting with `-` is a value.
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = self
            .prefix
            .iter()
            .map(|p| format!("--prefix={p}"))
            .collect();
        a.extend(self.skip.iter().map(|q| format!("--skip-prefix={q}")));
        if self.ignore_case && !self.is_all() {
            a.push("--ignore-case".to_string());
        }
        a
    }

    /// `the keys starting with "p:", not with "p:x:"` (or `... with none of "p:", "q:"` for
    /// the catch-all, `every key`), for messages.
    pub fn describe(&self) -> String {
        let skip: Vec<String> = self.skip.iter().map(|q| format!("{q:?}")).collect();
        let mut s = match (&self.prefix, skip.is_empty()) {
            (None, true) => return "every key".to_string(),
            (Some(p), true) => format!("the keys starting with {p:?}"),
            (Some(p), false) => {
                format!(
                    "the keys starting with {p:?}, not with {}",
                    skip.join(" or ")
                )
            }
            (None, false) => format!("the keys starting with none of {}", skip.join(", ")),
        };
        if self.ignore_case {
            s.push_str(" (ignoring case)");
        }
        s
    }
}

/// One prefix route of a listener, as [`scope`] and [`check_start`] read it.
struct PrefixRoute {
    prefix: String,
    cluster: String,
    remove_prefix: bool,
}

/// A listener's `routes` as far as the scope needs them.
struct RouteTable {
    case_insensitive: bool,
    prefixes: Vec<PrefixRoute>,
}

/// The routes of listener `name` in `doc`, or `None` when the file does not define it.
fn listener_routes(doc: &Mapping, name: &str) -> Option<RouteTable> {
    let listener = doc
        .get(key("listeners"))
        .and_then(Value::as_sequence)?
        .iter()
        .find(|l| l.get("name").and_then(Value::as_str) == Some(name))?;
    let routes = listener.get("routes");
    let prefixes = routes
        .and_then(|r| r.get("prefixes"))
        .and_then(Value::as_sequence)
        .map(|ps| {
            ps.iter()
                .filter_map(|p| {
                    Some(PrefixRoute {
                        prefix: p.get("prefix").and_then(Value::as_str)?.to_string(),
                        cluster: p
                            .get("cluster")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                        remove_prefix: p
                            .get("remove_prefix")
                            .and_then(Value::as_bool)
                            .unwrap_or(false),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Some(RouteTable {
        case_insensitive: routes
            .and_then(|r| r.get("case_insensitive"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        prefixes,
    })
}

/// The scope of route `r` in the files `texts` (those that define its listener are read): the
/// keys the mover may touch on the route's clusters, when other routes of the listener send to
/// the same clusters. A key goes to the route whose prefix is its longest match, else to the
/// catch-all: so the keys of prefix route P are those that start with P and with none of the
/// longer prefixes that start with P; the catch-all's, those that start with no prefix of a
/// route. (Other listeners' keys on the same clusters cannot be told apart.)
///
/// # Errors
/// A file is not YAML, no file defines the listener, or the route has `remove_prefix: true`
/// (its keys are stored without the prefix: no scope sets them apart).
pub fn scope(texts: &[&str], r: &RouteRef) -> Result<Scope, String> {
    let mut tables = Vec::new();
    for text in texts {
        if let Some(t) = listener_routes(&parse(text)?, &r.listener) {
            tables.push(t);
        }
    }
    if tables.is_empty() {
        return Err(format!("no file defines listener {:?}", r.listener));
    }
    let ignore_case = tables.iter().any(|t| t.case_insensitive);
    let starts = |key: &str, p: &str| {
        key.len() >= p.len()
            && if ignore_case {
                key.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
            } else {
                key.as_bytes()[..p.len()] == *p.as_bytes()
            }
    };
    let routes = tables.iter().flat_map(|t| &t.prefixes);
    if let Some(p) = routes.clone().find(|p| {
        r.prefix
            .as_deref()
            .is_some_and(|own| own == p.prefix && p.remove_prefix)
    }) {
        return Err(format!(
            "{r} has remove_prefix: true: its keys are stored on {:?} without the prefix, so \
             no scope sets them apart",
            p.cluster
        ));
    }
    // The other routes' prefixes in scope, shortest first; one that starts with another
    // already skipped adds nothing.
    let mut others: Vec<&str> = routes
        .map(|p| p.prefix.as_str())
        .filter(|q| match r.prefix.as_deref() {
            Some(own) => q.len() > own.len() && starts(q, own),
            None => true,
        })
        .collect();
    others.sort_by_key(|q| (q.len(), *q));
    let mut skip: Vec<String> = Vec::new();
    for q in others {
        if !skip.iter().any(|s| starts(q, s)) {
            skip.push(q.to_string());
        }
    }
    Ok(Scope {
        prefix: r.prefix.clone(),
        skip,
        ignore_case,
    })
}

/// A static configuration for the mover: the files' clusters `from` and `to` as they are, and
/// a listener that only makes the file complete (the mover reads clusters only).
///
/// # Errors
/// The file does not define both clusters (the mover needs their shards).
pub fn mover_config(texts: &[&str], from: &str, to: &str) -> Result<String, String> {
    let mut clusters = Vec::new();
    for text in texts {
        let doc = parse(text)?;
        if let Some(Value::Sequence(cs)) = doc.get(key("clusters")) {
            clusters.extend(cs.iter().cloned());
        }
    }
    let mut picked = Vec::new();
    for name in [from, to] {
        let c = clusters
            .iter()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
            .ok_or_else(|| {
                format!(
                    "no --file defines cluster {name:?}: the mover reads the shards of both \
                     clusters from them"
                )
            })?;
        picked.push(c.clone());
    }
    let mut routes = Mapping::new();
    routes.insert(key("catch_all"), key(from));
    let mut listener = Mapping::new();
    listener.insert(key("name"), key("reshard-mover"));
    listener.insert(key("address"), key("127.0.0.1:1"));
    listener.insert(key("routes"), Value::Mapping(routes));
    let mut out = Mapping::new();
    out.insert(
        key("listeners"),
        Value::Sequence(vec![Value::Mapping(listener)]),
    );
    out.insert(key("clusters"), Value::Sequence(picked));
    write(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RES: &str = "
listeners:
  - name: main
    address: 127.0.0.1:6380
    routes:
      catch_all: old
      prefixes:
        - { prefix: 'fc:', cluster: old }
clusters:
  - name: old
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
  - name: new
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }, { endpoints: [{ address: 127.0.0.1:7002 }] }]
";

    fn catch_all() -> RouteRef {
        RouteRef {
            listener: "main".into(),
            prefix: None,
        }
    }

    fn routes(text: &str) -> Value {
        let v: Value = serde_yaml_ng::from_str(text).unwrap();
        v["listeners"][0]["routes"].clone()
    }

    #[test]
    fn the_catch_all_goes_through_move_mode_to_its_new_cluster() {
        check_start(RES, &catch_all(), "old", "new").unwrap();
        let prepare = with_route(RES, &catch_all(), "old", Some(("new", "prepare_move"))).unwrap();
        assert_eq!(
            routes(&prepare)["catch_all_mirrors"][0]["mode"],
            key("prepare_move")
        );
        crate::parse_yaml(&prepare).expect("a valid file");
        let moving = with_route(RES, &catch_all(), "old", Some(("new", "move"))).unwrap();
        let r = routes(&moving);
        assert_eq!(r["catch_all"], key("old"));
        assert_eq!(r["catch_all_mirrors"][0]["cluster"], key("new"));
        assert_eq!(r["catch_all_mirrors"][0]["mode"], key("move"));
        assert_eq!(r["prefixes"][0]["cluster"], key("old"), "other routes kept");
        crate::parse_yaml(&moving).expect("a valid file");
        let done = with_route(&moving, &catch_all(), "new", None).unwrap();
        let r = routes(&done);
        assert_eq!(r["catch_all"], key("new"));
        assert!(r.get("catch_all_mirrors").is_none());
        crate::parse_yaml(&done).expect("a valid file");
    }

    #[test]
    fn a_prefix_route_is_edited_alone() {
        let r = RouteRef {
            listener: "main".into(),
            prefix: Some("fc:".into()),
        };
        let moving = with_route(RES, &r, "old", Some(("new", "move"))).unwrap();
        let v = routes(&moving);
        assert_eq!(v["prefixes"][0]["mirrors"][0]["cluster"], key("new"));
        assert!(v.get("catch_all_mirrors").is_none());
        crate::parse_yaml(&moving).expect("a valid file");
    }

    #[test]
    fn what_cannot_start_is_named() {
        let err = |r: &RouteRef, from: &str, to: &str| check_start(RES, r, from, to).unwrap_err();
        assert_eq!(
            err(&catch_all(), "new", "old"),
            "listener \"main\" catch_all sends to \"old\", not to --from \"new\""
        );
        let nope = RouteRef {
            listener: "main".into(),
            prefix: Some("x:".into()),
        };
        assert_eq!(
            err(&nope, "old", "new"),
            "listener \"main\" has no prefix route \"x:\""
        );
        let other = RouteRef {
            listener: "other".into(),
            prefix: None,
        };
        assert_eq!(
            err(&other, "old", "new"),
            "the file has no listener named \"other\""
        );
        let moving = with_route(RES, &catch_all(), "old", Some(("new", "move"))).unwrap();
        assert!(check_start(&moving, &catch_all(), "old", "new")
            .unwrap_err()
            .contains("has mirrors already"));
    }

    /// The keys of a route are those of its prefix less the longer prefixes of other routes
    /// (the longest match wins); the catch-all's, those of no prefix. Redundant skips (a
    /// prefix under one already skipped) and the same route in two files count once.
    #[test]
    fn the_scope_of_a_route_leaves_out_the_other_routes_keys() {
        let text = "
listeners:
  - name: main
    routes:
      catch_all: old
      prefixes:
        - { prefix: 'p:', cluster: old }
        - { prefix: 'p:x:', cluster: old }
        - { prefix: 'p:x:y:', cluster: other }
        - { prefix: 'p', cluster: old }
        - { prefix: 'q:', cluster: other }
  - name: side
    routes: { catch_all: old, prefixes: [ { prefix: 'p:z:', cluster: old } ] }
";
        let route = |p: Option<&str>| RouteRef {
            listener: "main".into(),
            prefix: p.map(str::to_string),
        };
        let s = scope(&[RES, text], &route(Some("p:"))).unwrap();
        assert_eq!(
            s,
            Scope {
                prefix: Some("p:".into()),
                skip: vec!["p:x:".into()],
                ignore_case: false
            }
        );
        assert_eq!(s.args(), ["--prefix=p:", "--skip-prefix=p:x:"]);
        assert_eq!(
            s.describe(),
            "the keys starting with \"p:\", not with \"p:x:\""
        );
        let s = scope(&[text], &route(Some("p"))).unwrap();
        assert_eq!(s.skip, ["p:"]);
        let s = scope(&[text], &route(Some("p:x:y:"))).unwrap();
        assert!(s.skip.is_empty());
        assert_eq!(s.args(), ["--prefix=p:x:y:"]);
        let s = scope(&[text, text], &route(None)).unwrap();
        assert_eq!(s.prefix, None);
        assert_eq!(s.skip, ["p", "q:"]);
        assert_eq!(s.describe(), "the keys starting with none of \"p\", \"q:\"");
        // Only prefix routes: the catch-all's scope is every key.
        let all = scope(
            &["listeners: [ { name: main, routes: { catch_all: old } } ]"],
            &route(None),
        )
        .unwrap();
        assert!(all.is_all() && all.args().is_empty());
        assert_eq!(all.describe(), "every key");
        // A case-insensitive listener: so are the prefixes.
        let ci = "listeners: [ { name: main, routes: { case_insensitive: true, catch_all: old, \
                  prefixes: [ { prefix: 'P:', cluster: old }, { prefix: 'p:X:', cluster: old } ] } } ]";
        let s = scope(&[ci], &route(Some("P:"))).unwrap();
        assert_eq!(
            s.args(),
            ["--prefix=P:", "--skip-prefix=p:X:", "--ignore-case"]
        );
        assert!(scope(
            &[RES],
            &RouteRef {
                listener: "nope".into(),
                prefix: None
            }
        )
        .unwrap_err()
        .contains("no file defines listener \"nope\""));
    }

    /// A route that removes its prefix cannot be scoped; nor can the keys of a route moved on a
    /// cluster that such a route uses too.
    #[test]
    fn a_route_that_removes_its_prefix_is_refused() {
        let text = "
listeners:
  - name: main
    routes:
      catch_all: old
      prefixes:
        - { prefix: 's:', cluster: old, remove_prefix: true }
        - { prefix: 'p:', cluster: old }
        - { prefix: 't:', cluster: third, remove_prefix: true }
clusters: []
";
        let route = |p: Option<&str>| RouteRef {
            listener: "main".into(),
            prefix: p.map(str::to_string),
        };
        let err = check_start(text, &route(Some("s:")), "old", "new").unwrap_err();
        assert!(
            err.starts_with("listener \"main\" prefix \"s:\" has remove_prefix: true: its keys"),
            "{err}"
        );
        assert!(scope(&[text], &route(Some("s:"))).is_err());
        for r in [route(None), route(Some("p:"))] {
            let err = check_start(text, &r, "old", "new").unwrap_err();
            assert!(
                err.starts_with(
                    "listener \"main\" prefix \"s:\" has remove_prefix: true and sends to \"old\""
                ),
                "{err}"
            );
        }
        // On another cluster than --from and --to, it shares no key with the move.
        let other = text.replace("'s:', cluster: old", "'s:', cluster: third");
        check_start(&other, &route(Some("p:")), "old", "new").unwrap();
        let err = check_start(&other, &route(Some("p:")), "third", "new").unwrap_err();
        assert!(
            err.contains("has remove_prefix: true and sends to \"third\""),
            "{err}"
        );
    }

    #[test]
    fn the_mover_reads_both_clusters() {
        let text = mover_config(&["listeners: []", RES], "old", "new").unwrap();
        let doc = crate::parse_yaml(&text).expect("valid");
        crate::translate(&doc).expect("translates");
        assert!(has_listener(RES, "main") && !has_listener(RES, "other"));
        assert!(mover_config(&[RES], "old", "gone")
            .unwrap_err()
            .contains("cluster \"gone\""));
    }
}

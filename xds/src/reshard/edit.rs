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
/// be a route's only mirror), and that `to` is another cluster.
///
/// # Errors
/// What is wrong, naming the route.
pub fn check_start(text: &str, r: &RouteRef, from: &str, to: &str) -> Result<(), String> {
    if from == to {
        return Err(format!("--from and --to are both {from:?}"));
    }
    let mut doc = parse(text)?;
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

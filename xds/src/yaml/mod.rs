//! The static YAML schema (documented in `SCHEMA.md`), read straight into Envoy resources.
//!
//! The document is read as an untyped YAML tree and walked by hand rather than through
//! `#[derive(Deserialize)]`: serde stops at the first error and does not say where it was,
//! while this walk reports every error at once, each with its resource and key path. The walk
//! checks only the document's shape (unknown keys, wrong types, values that cannot be written
//! as a resource field) and writes [`Resources`]; what they mean (ranges, references between
//! routes and clusters, one primary per shard, ...) is checked by [`crate::translate`] alone,
//! as for the xDS stream. While it writes, the walk notes where each resource field came from
//! ([`origin`]), so that the translation's errors are shown with the YAML's own key paths.
//!
//! The walk is split like `translate/`: [`listener`], [`cluster`] and [`shards`] write their
//! resources, `value` holds the typed getters every part uses. [`reference`] documents every
//! key of every mapping (type, default, meaning): the known keys each mapping is checked
//! against are its tables' names, and the documentation's key tables are rendered from it.
//! [`dump`] is the inverse: a model written out in this schema (the sidecar's `/config_dump`).

use std::collections::HashMap;

use respway_filters::model::Config;
use serde_yaml_ng::Value;

use crate::error::{index, ConfigError, ConfigErrors, Cx};
use crate::Resources;

mod auth;
mod cluster;
pub(crate) mod dump;
mod listener;
pub(crate) mod origin;
mod redis_cluster;
mod reference;
mod shards;
mod value;

use origin::Origins;
use reference::{FRAGMENT_TOP_KEYS, NODE_KEYS, TARGETS_KEYS, TOP_KEYS};
use value::*;

/// Which sidecars a resource file is for (its top-level `targets`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    /// Node ids (the ADS request's `node.id`).
    pub node_ids: Vec<String>,
    /// Zones (the ADS request's `node.locality.zone`).
    pub zones: Vec<String>,
}

/// Reads the sidecar's static file into resources and translates them: the resources and
/// their model, or every error of either step in the YAML's own terms, in document order.
pub(crate) fn load(text: &str) -> Result<(Resources, Config), ConfigErrors> {
    let read = read(text, Mode::Static)?;
    let translated = crate::translate(&read.resources);
    read.finish(translated)
        .map(|config| (read.resources.clone(), config))
}

/// A resource file of the management server (`respway-xds serve --resources DIR`): the
/// schema's `listeners` and `clusters`, either of which may be left out, and `targets` naming
/// the sidecars it is for. Routes may name clusters of other files: those references are
/// checked once the files are merged into a node's snapshot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fragment {
    /// `None`: the file is for every node.
    pub(crate) targets: Option<Targets>,
    /// The file's listeners and clusters (`zone` is always `None`).
    pub(crate) config: Config,
    /// The same, as the resources read from the file.
    pub(crate) resources: Resources,
}

/// Reads a management-server resource file (see [`Fragment`]), reporting every error.
pub(crate) fn parse_fragment(text: &str) -> Result<Fragment, ConfigErrors> {
    let read = read(text, Mode::Fragment)?;
    let translated = crate::translate::translate_open(&read.resources);
    let config = read.finish(translated)?;
    Ok(Fragment {
        targets: read.targets,
        config,
        resources: read.resources,
    })
}

/// Which document [`read`] reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The sidecar's static file: `node`, and both lists required.
    Static,
    /// A management-server file: `targets`, lists optional, cross-file cluster references.
    Fragment,
}

/// A document read into resources, before the translation checks them.
struct Read {
    targets: Option<Targets>,
    resources: Resources,
    /// What the reader found wrong with the document's shape (in YAML terms).
    errors: Vec<ConfigError>,
    origins: Origins,
}

impl Read {
    /// The translation's result, with the reader's errors and the translation's in YAML
    /// terms.
    fn finish(&self, translated: Result<Config, ConfigErrors>) -> Result<Config, ConfigErrors> {
        match translated {
            Ok(config) if self.errors.is_empty() => Ok(config),
            result => {
                let translated = result.err().map(|e| e.0).unwrap_or_default();
                Err(ConfigErrors(
                    self.origins.rewrite(self.errors.clone(), translated),
                ))
            }
        }
    }
}

/// Reads a document into Envoy resources, checking only its shape (unknown keys, wrong
/// types, values that cannot be written as a resource field); the error when it is not a
/// document of this schema at all.
fn read(text: &str, mode: Mode) -> Result<Read, ConfigErrors> {
    let mut cx = Cx::default();
    let mut o = Origins::default();
    // Anchors are resolved by the parser; merge keys (`<<: *base`) are applied here.
    let doc = serde_yaml_ng::from_str::<Value>(text).and_then(|mut v| v.apply_merge().map(|()| v));
    let doc = match doc {
        Ok(v) => v,
        Err(e) => {
            cx.err("", format!("invalid YAML: {e}"));
            return Err(ConfigErrors(cx.errors));
        }
    };
    if doc.is_null() {
        let what = match mode {
            Mode::Static => "listeners and clusters are required",
            Mode::Fragment => "a resource file defines listeners, clusters or both",
        };
        cx.err("", format!("the document is empty: {what}"));
        return Err(ConfigErrors(cx.errors));
    }
    let keys = match mode {
        Mode::Static => TOP_KEYS,
        Mode::Fragment => FRAGMENT_TOP_KEYS,
    };
    let Some(top) = Map::new(&mut cx, &doc, "", keys) else {
        return Err(ConfigErrors(cx.errors));
    };

    let mut zone = None;
    let mut file_targets = None;
    o.top("");
    match mode {
        Mode::Static => {
            o.top("node");
            zone = top.get("node").and_then(|v| node(&mut cx, v));
        }
        Mode::Fragment => {
            o.top("node");
            o.top("targets");
            if top.raw("node").is_some() {
                cx.err(
                    "node",
                    "not used in a respway-xds resource file: a sidecar's own node is in its \
                     bootstrap; name the sidecars a file is for with `targets`",
                );
            }
            file_targets = top.raw("targets").and_then(|v| targets(&mut cx, v));
        }
    }

    // Whether each cluster of the file uses a hashtag, for the listeners' Envoy-wide flag.
    let mut hashtags: HashMap<&str, bool> = HashMap::new();
    if let Some(list) = top.get("clusters").and_then(Value::as_sequence) {
        for c in list {
            let Some(name) = c.get("name").and_then(Value::as_str) else {
                continue;
            };
            let on = match c.get("hashtag") {
                None => true,
                Some(Value::String(s)) => matches!(crate::common::parse_hashtag(s), Ok(Some(_))),
                Some(_) => false,
            };
            hashtags.entry(name).or_insert(on);
        }
    }
    let list = |cx: &mut Cx, key: &str| -> &[Value] {
        match mode {
            Mode::Static => top.non_empty_seq(cx, key),
            Mode::Fragment => top.seq(cx, key).unwrap_or_default(),
        }
    };

    o.top("listeners");
    let listener_values = list(&mut cx, "listeners");
    let mut resources = Resources {
        node_zone: zone,
        ..Default::default()
    };
    for (i, v) in listener_values.iter().enumerate() {
        resources
            .listeners
            .extend(listener::listener(&mut cx, &mut o, v, i, &hashtags));
        cx.resource.clear();
    }

    o.top("clusters");
    let cluster_values = list(&mut cx, "clusters");
    if mode == Mode::Fragment
        && listener_values.is_empty()
        && cluster_values.is_empty()
        && cx.count() == 0
    {
        cx.err(
            "",
            "defines no listeners and no clusters (a resource file defines either or both)",
        );
    }
    for (i, v) in cluster_values.iter().enumerate() {
        if let Some((c, cla)) = cluster::cluster(&mut cx, &mut o, v, i) {
            resources.clusters.push(c);
            resources.endpoints.extend(cla);
        }
        cx.resource.clear();
    }
    Ok(Read {
        targets: file_targets,
        resources,
        errors: cx.errors,
        origins: o,
    })
}

// === targets ===

/// `targets: { node_ids: [...], zones: [...] }`: at least one id or zone, none empty or
/// repeated.
fn targets(cx: &mut Cx, v: &Value) -> Option<Targets> {
    let before = cx.count();
    let m = Map::new(cx, v, "targets", TARGETS_KEYS)?;
    let mut out = Targets::default();
    for (key, into) in [("node_ids", &mut out.node_ids), ("zones", &mut out.zones)] {
        let at = m.at(key);
        for (i, item) in m.seq(cx, key).unwrap_or_default().iter().enumerate() {
            match item.as_str() {
                Some("") => cx.err(index(&at, i), "must not be empty"),
                Some(s) if into.iter().any(|x| x == s) => {
                    cx.err(index(&at, i), format!("duplicate {s:?}"))
                }
                Some(s) => into.push(s.to_string()),
                None => cx.err(
                    index(&at, i),
                    format!("expected a string, got {}", kind(item)),
                ),
            }
        }
    }
    if out.node_ids.is_empty() && out.zones.is_empty() && cx.count() == before {
        cx.err(
            "targets",
            "names no node id and no zone (leave `targets` out for a file for every node)",
        );
    }
    (cx.count() == before).then_some(out)
}

// === node ===

/// The sidecar's own node: `id` (accepted, unused for now) and `zone`.
fn node(cx: &mut Cx, v: &Value) -> Option<String> {
    let m = Map::new(cx, v, "node", NODE_KEYS)?;
    m.non_empty_string(cx, "id");
    m.non_empty_string(cx, "zone")
}

#[cfg(test)]
mod tests {
    /// The model read from YAML is the model its Envoy resources translate to, for the
    /// listener's client bounds and protocol settings and the cluster's upstream queue bound,
    /// databases and dedicated connections too.
    #[test]
    fn yaml_and_its_resources_give_the_same_model() {
        let text = r#"
listeners:
  - name: l
    client_buffer_limit: 1048576
    client_buffer_hard_limit: 4194304
    client_stall_timeout: 2m
    max_auth_failures: 1
    allow_keyless_scripts: true
    protocol: resp3
    advertised_redis_version: "7.2.4"
    routes: { catch_all: a }
clusters:
  - name: a
    max_queue_per_connection: 1
    databases: 2
    dedicated_connections: 3
    shards: [{ endpoints: [{ address: 127.0.0.1:7001 }] }]
"#;
        let (resources, direct) = super::load(text).unwrap();
        let client = &direct.listeners[0].client;
        assert_eq!(
            (client.buffer_limit, client.buffer_hard_limit),
            (1 << 20, 4 << 20)
        );
        assert_eq!(client.stall_timeout, std::time::Duration::from_secs(120));
        assert_eq!(client.max_auth_failures, 1);
        assert!(client.allow_keyless_scripts);
        let resp = &direct.listeners[0].resp;
        assert_eq!(
            (resp.protocol, resp.advertised_version.as_str()),
            (respway_filters::model::ProtocolMode::Resp3, "7.2.4")
        );
        let c = &direct.clusters[0];
        assert_eq!(c.max_queue_per_connection, 1);
        assert_eq!((c.databases, c.dedicated_connections), (2, 3));
        assert_eq!(crate::to_resources(&direct), resources);
    }
}

//! Building a generation: every class of nodes, its merged files, translated and checked
//! against the previous generation.

use super::*;

pub(super) fn class_key(files: &[Arc<LoadedFile>], id: &str, zone: Option<&str>) -> ClassKey {
    files
        .iter()
        .filter_map(|f| f.level(id, zone).map(|l| (f.name.clone(), l)))
        .collect()
}

/// The nodes a (named id, named zone) combination stands for, in words.
pub(super) fn describe_class(id: Option<&str>, zone: Option<&str>, any_zone_named: bool) -> String {
    match (id, zone) {
        (Some(id), Some(z)) => format!("node {id:?} in zone {z:?}"),
        (Some(id), None) if any_zone_named => format!("node {id:?} in other zones"),
        (Some(id), None) => format!("node {id:?}"),
        (None, Some(z)) => format!("other nodes in zone {z:?}"),
        (None, None) => "other nodes".to_string(),
    }
}

/// What [`build`] made of a set of files.
pub(super) struct Built {
    pub(super) snapshot: Snapshot,
    /// Whether some node is served differently than by `previous` (a new snapshot, or none).
    pub(super) changed: bool,
}

/// Builds the snapshot of every class of nodes from `files` as generation `version`, sharing
/// unchanged per-type resources with `previous`. Each class stands alone: one that fails keeps
/// serving its nodes their snapshot in `previous` (its errors, naming the file, resource and
/// field and the nodes, are in [`Snapshot::errors`]), and one whose files define no listener or
/// no cluster is served nothing ([`Snapshot::unserved`]); the other classes are served.
pub(super) fn build(files: Vec<Arc<LoadedFile>>, previous: &Snapshot, version: u64) -> Built {
    let named_ids: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.node_ids.iter().cloned())
        .collect();
    let named_zones: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.zones.iter().cloned())
        .collect();
    // Every distinct class: a node with a named id (or an unnamed one, which never equals a
    // named id since those are not empty) in a named zone (or another one).
    let mut classes: BTreeMap<ClassKey, (Vec<String>, Vec<Combo>)> = BTreeMap::new();
    for id in named_ids.iter().map(|s| Some(s.as_str())).chain([None]) {
        for zone in named_zones.iter().map(|s| Some(s.as_str())).chain([None]) {
            let key = class_key(&files, id.unwrap_or(""), zone);
            if !key.is_empty() {
                let (who, combos) = classes.entry(key).or_default();
                who.push(describe_class(id, zone, !named_zones.is_empty()));
                combos.push((id.map(str::to_string), zone.map(str::to_string)));
            }
        }
    }

    let mut nodes = HashMap::new();
    let mut interner = Interner::default();
    interner.seed(previous);
    // error text → the classes that have it, so an error in a file for every node is one line.
    let mut errors: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failed: Vec<ClassKey> = Vec::new();
    let mut unserved = BTreeMap::new();
    for (key, (who, _)) in &classes {
        match merge(&files, key) {
            Ok((resources, addrs)) => {
                let prev = previous.nodes.get(key).map(|n| n.as_ref());
                let snap = NodeSnapshot::from_resources(&resources, addrs, prev, &mut interner);
                nodes.insert(key.clone(), Arc::new(snap));
            }
            Err(MergeError::Incomplete(what)) => {
                unserved.insert(
                    key.clone(),
                    format!(
                        "{what}: nothing is served to {}, as to a node no file is for",
                        who.join(", ")
                    ),
                );
            }
            Err(MergeError::Invalid(errs)) => {
                for e in errs {
                    errors.entry(e).or_default().extend(who.iter().cloned());
                }
                failed.push(key.clone());
            }
        }
    }
    for (key, e, who) in moved_listeners(&files, &nodes, previous) {
        errors.entry(e).or_default().push(who);
        if nodes.remove(&key).is_some() {
            failed.push(key);
        }
    }
    // The nodes of a failed class keep what they were served.
    let mut held = HashMap::new();
    for key in &failed {
        for (id, zone) in classes.get(key).map(|c| c.1.as_slice()).unwrap_or_default() {
            if let Some(prev) = previous.for_node(id.as_deref().unwrap_or(""), zone.as_deref()) {
                held.insert((id.clone(), zone.clone()), prev);
            }
        }
    }
    let errors = errors
        .into_iter()
        .map(|(e, who)| format!("{e} (in the snapshot for {})", who.join(", ")))
        .collect();
    let snapshot = Snapshot {
        version,
        files,
        nodes,
        named_ids,
        named_zones,
        held,
        errors,
        unserved,
    };
    // Did the change reach anyone? Compared for every (named id, named zone) combination of
    // the old and the new files.
    let ids: BTreeSet<&str> = snapshot
        .named_ids
        .iter()
        .chain(&previous.named_ids)
        .map(String::as_str)
        .collect();
    let zones: BTreeSet<&str> = snapshot
        .named_zones
        .iter()
        .chain(&previous.named_zones)
        .map(String::as_str)
        .collect();
    let same = |a: Option<Arc<NodeSnapshot>>, b: Option<Arc<NodeSnapshot>>| match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            Arc::ptr_eq(&a, &b)
                || ResourceType::PUSH_ORDER
                    .into_iter()
                    .all(|t| a.get(t).resources == b.get(t).resources)
        }
        _ => false,
    };
    let changed = ids.iter().copied().chain([""]).any(|id| {
        zones
            .iter()
            .copied()
            .map(Some)
            .chain([None])
            .any(|zone| !same(snapshot.for_node(id, zone), previous.for_node(id, zone)))
    });
    Built { snapshot, changed }
}

/// A running sidecar cannot move a listener (it does not rebind, and NACKs a change of the
/// address of a listener it serves), so a change that gives an existing listener of some node
/// a new address is refused for those nodes, naming the listener and the field: they keep
/// their previous snapshot. Every (named id, named zone) combination of the old and the new
/// files stands for the nodes whose old and new snapshots are compared. A restarted
/// respway-xds starts afresh. Returns the new class, the error and the nodes, per move.
pub(super) fn moved_listeners(
    files: &[Arc<LoadedFile>],
    nodes: &HashMap<ClassKey, Arc<NodeSnapshot>>,
    previous: &Snapshot,
) -> Vec<(ClassKey, String, String)> {
    let mut out = Vec::new();
    if previous.nodes.is_empty() && previous.held.is_empty() {
        return out;
    }
    let all = || files.iter().chain(&previous.files);
    let ids: BTreeSet<&str> = all()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.node_ids.iter().map(String::as_str))
        .collect();
    let zones: BTreeSet<&str> = all()
        .filter_map(|f| f.targets.as_ref())
        .flat_map(|t| t.zones.iter().map(String::as_str))
        .collect();
    for id in ids.iter().copied().map(Some).chain([None]) {
        for zone in zones.iter().copied().map(Some).chain([None]) {
            let Some(old) = previous.for_node(id.unwrap_or(""), zone) else {
                continue;
            };
            let key = class_key(files, id.unwrap_or(""), zone);
            let Some(new) = nodes.get(&key) else {
                continue;
            };
            for (name, (addr, file)) in &new.listeners {
                let Some((was, _)) = old.listeners.get(name) else {
                    continue;
                };
                if was != addr {
                    let e = format!(
                        "{file}: listener {name:?}: address: changed from {was} to {addr}, which \
                         running sidecars refuse (a listener cannot move while respway runs); \
                         to move it, restart respway-xds with the new file, then the sidecars"
                    );
                    out.push((key.clone(), e, describe_class(id, zone, !zones.is_empty())));
                }
            }
        }
    }
    out
}

/// Why one class's files do not make a snapshot.
pub(super) enum MergeError {
    /// They define no listener or no cluster: not a configuration for anyone (what is missing).
    Incomplete(String),
    /// Conflicting definitions, or a merged snapshot that does not translate.
    Invalid(Vec<String>),
}

/// Merges the files of one class (see the module docs) and translates the result; also
/// returns where each listener is, and from which file.
pub(super) fn merge(
    files: &[Arc<LoadedFile>],
    key: &ClassKey,
) -> Result<(Resources, ListenerAddrs), MergeError> {
    let by_name: HashMap<&str, &LoadedFile> = files
        .iter()
        .map(|f| (f.name.as_str(), f.as_ref()))
        .collect();
    let mut errors = Vec::new();
    // Where each resource of the merged snapshot comes from, to put the file in front of the
    // translation's errors.
    let mut origin: HashMap<String, String> = HashMap::new();

    let mut listeners: BTreeMap<&str, Vec<(Level, &str, &model::Listener)>> = BTreeMap::new();
    let mut clusters: BTreeMap<&str, Vec<(Level, &str, &model::Cluster)>> = BTreeMap::new();
    for (name, level) in key {
        let f = by_name[name.as_str()];
        for l in &f.config.listeners {
            listeners
                .entry(&l.name)
                .or_default()
                .push((*level, &f.name, l));
        }
        for c in &f.config.clusters {
            clusters
                .entry(&c.name)
                .or_default()
                .push((*level, &f.name, c));
        }
    }
    pub(super) fn pick<'a, T>(
        kind: &str,
        name: &str,
        defs: &[(Level, &'a str, &'a T)],
        errors: &mut Vec<String>,
    ) -> Option<(&'a str, &'a T)> {
        let top = defs.iter().map(|d| d.0).max()?;
        let winners: Vec<_> = defs.iter().filter(|d| d.0 == top).collect();
        if winners.len() > 1 {
            let files: Vec<String> = winners.iter().map(|d| format!("{:?}", d.1)).collect();
            errors.push(format!(
                "{kind} {name:?} is defined by {} at the same precedence ({})",
                files.join(" and "),
                top.describe()
            ));
            return None;
        }
        Some((winners[0].1, winners[0].2))
    }
    let mut config = Config {
        zone: None,
        listeners: Vec::new(),
        clusters: Vec::new(),
    };
    for (name, defs) in &listeners {
        if let Some((file, l)) = pick("listener", name, defs, &mut errors) {
            origin.insert(format!("listener {name:?}"), file.to_string());
            config.listeners.push(l.clone());
        }
    }
    for (name, defs) in &clusters {
        if let Some((file, c)) = pick("cluster", name, defs, &mut errors) {
            origin.insert(format!("cluster {name:?}"), file.to_string());
            origin.insert(
                format!("cluster_load_assignment {name:?}"),
                file.to_string(),
            );
            config.clusters.push(c.clone());
        }
    }
    if !errors.is_empty() {
        return Err(MergeError::Invalid(errors));
    }
    match (config.listeners.is_empty(), config.clusters.is_empty()) {
        (false, false) => {}
        (true, true) => return Err(MergeError::Incomplete("no listener and no cluster".into())),
        (true, false) => return Err(MergeError::Incomplete("no listener".into())),
        (false, true) => return Err(MergeError::Incomplete("no cluster".into())),
    }
    // Routes may name clusters of other files, so they are checked here, once merged, and
    // reported by the file's own paths (`routes.prefixes[0].cluster`) rather than by the
    // Envoy paths the translation below would give.
    let known: HashSet<&str> = config.clusters.iter().map(|c| c.name.as_str()).collect();
    for l in &config.listeners {
        let resource = format!("listener {:?}", l.name);
        let file = origin
            .get(&resource)
            .map(String::as_str)
            .unwrap_or_default();
        for (field, reason) in unknown_clusters(l, &known) {
            errors.push(format!("{file}: {resource}: {field}: {reason}"));
        }
    }
    if !errors.is_empty() {
        return Err(MergeError::Invalid(errors));
    }
    let resources = to_resources(&config);
    match translate(&resources) {
        Ok(config) => {
            let addrs = config
                .listeners
                .iter()
                .map(|l| {
                    let file = origin
                        .get(&format!("listener {:?}", l.name))
                        .cloned()
                        .unwrap_or_default();
                    (l.name.clone(), (l.address, file))
                })
                .collect();
            Ok((resources, addrs))
        }
        Err(e) => Err(MergeError::Invalid(
            e.iter()
                .map(|e| match origin.get(&e.resource) {
                    Some(file) => format!("{file}: {e}"),
                    None => e.to_string(),
                })
                .collect(),
        )),
    }
}

// === Cache ===

/// The clusters a listener read from a resource file names that are not in `known` (the
/// clusters of a node's merged snapshot), as (YAML path, reason): `routes.catch_all`,
/// `routes.catch_all_mirrors[j].cluster`, `routes.prefixes[i].cluster`,
/// `routes.prefixes[i].mirrors[j].cluster`. A listener that parsed keeps every route and
/// mirror of its file, in order, so the indexes are the file's.
fn unknown_clusters(l: &model::Listener, known: &HashSet<&str>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut check = |path: String, cluster: &str| {
        if !known.contains(cluster) {
            out.push((path, format!("unknown cluster {cluster:?}")));
        }
    };
    let r = &l.routes;
    if let Some(c) = &r.catch_all {
        check("routes.catch_all".to_string(), c);
    }
    for (j, m) in r.catch_all_mirrors.iter().enumerate() {
        check(format!("routes.catch_all_mirrors[{j}].cluster"), &m.cluster);
    }
    for (i, p) in r.routes.iter().enumerate() {
        check(format!("routes.prefixes[{i}].cluster"), &p.cluster);
        for (j, m) in p.mirrors.iter().enumerate() {
            check(
                format!("routes.prefixes[{i}].mirrors[{j}].cluster"),
                &m.cluster,
            );
        }
    }
    out
}

//! Prefix routes and their mirror policies: Envoy's `prefix_routes` (and respway's mirror
//! modes from `ListenerSettings`) → the model's [`RouteTable`].

use std::collections::{HashMap, HashSet};

use envoy_types::pb::envoy::extensions::filters::network::redis_proxy::v3::redis_proxy::{
    prefix_routes::Route, PrefixRoutes,
};
use envoy_types::pb::envoy::r#type::v3::{fractional_percent::DenominatorType, FractionalPercent};
use respway_filters::model::{MirrorMode, MirrorPolicy, PrefixRoute, RouteTable};

use super::unsupported;
use crate::common::{self, MirrorProblem};
use crate::error::{index, join, Cx};
use crate::pb::respway::v1::{self as rw};

/// A route of the route table: `Some(index)` in `routes`, `None` for the catch-all.
type RouteId = Option<usize>;

pub(super) fn routes(
    cx: &mut Cx,
    at: &str,
    pr: &PrefixRoutes,
    clusters: &HashSet<&str>,
) -> RouteTable {
    let mut table = RouteTable {
        case_insensitive: pr.case_insensitive,
        ..Default::default()
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let list = join(at, "routes");
    for (i, r) in pr.routes.iter().enumerate() {
        let ra = index(&list, i);
        route_extras(cx, &ra, r);
        check_cluster(cx, &join(&ra, "cluster"), &r.cluster, clusters);
        let key = if pr.case_insensitive {
            r.prefix.to_ascii_lowercase()
        } else {
            r.prefix.clone()
        };
        if let Some(first) = seen.insert(key, i) {
            cx.err(
                join(&ra, "prefix"),
                format!("duplicate prefix {:?} (also routes[{first}])", r.prefix),
            );
        } else if r.prefix.is_empty() && pr.routes.len() > 1 {
            cx.err(
                join(&ra, "prefix"),
                "an empty prefix is allowed only as the sole route (use catch_all_route)",
            );
        }
        table.routes.push(PrefixRoute {
            mirrors: mirror_policies(cx, &ra, r, clusters),
            prefix: r.prefix.clone(),
            remove_prefix: r.remove_prefix,
            cluster: r.cluster.clone(),
        });
    }
    if let Some(r) = &pr.catch_all_route {
        let ca = join(at, "catch_all_route");
        route_extras(cx, &ca, r);
        if !r.prefix.is_empty() || r.remove_prefix {
            cx.err(
                &ca,
                "prefix and remove_prefix have no meaning on the catch-all route",
            );
        }
        check_cluster(cx, &join(&ca, "cluster"), &r.cluster, clusters);
        table.catch_all = Some(r.cluster.clone());
        table.catch_all_mirrors = mirror_policies(cx, &ca, r, clusters);
    }
    if pr.routes.is_empty() && pr.catch_all_route.is_none() {
        cx.err(at, "at least one route or a catch_all_route is required");
    }
    table
}

/// The route's `request_mirror_policy` entries, in Envoy's meaning until
/// `ListenerSettings.mirror_modes` says otherwise: dual-write, the route's cluster answering.
fn mirror_policies(
    cx: &mut Cx,
    at: &str,
    r: &Route,
    clusters: &HashSet<&str>,
) -> Vec<MirrorPolicy> {
    let list = join(at, "request_mirror_policy");
    let mut out = Vec::new();
    for (i, m) in r.request_mirror_policy.iter().enumerate() {
        let ma = index(&list, i);
        check_cluster(cx, &join(&ma, "cluster"), &m.cluster, clusters);
        // Envoy mirrors every command when runtime_fraction is unset.
        let mut fraction_ppm = common::FULL_FRACTION_PPM;
        if let Some(rf) = &m.runtime_fraction {
            let rfa = join(&ma, "runtime_fraction");
            if !rf.runtime_key.is_empty() {
                cx.err(
                    join(&rfa, "runtime_key"),
                    "not supported by respway (it has no runtime; use default_value)",
                );
            }
            match &rf.default_value {
                Some(fp) => fraction_ppm = parts_per_million(cx, &join(&rfa, "default_value"), fp),
                None => cx.err(join(&rfa, "default_value"), "required"),
            }
        }
        out.push(MirrorPolicy {
            cluster: m.cluster.clone(),
            mode: MirrorMode::DualWrite {
                target_is_primary: false,
            },
            include_reads: !m.exclude_read_commands,
            fraction_ppm,
        });
    }
    out
}

/// A `FractionalPercent` in parts per million; like Envoy, a numerator above the denominator
/// means 100%.
fn parts_per_million(cx: &mut Cx, at: &str, fp: &FractionalPercent) -> u32 {
    let scale: u64 = match DenominatorType::try_from(fp.denominator) {
        Ok(DenominatorType::Hundred) => 10_000,
        Ok(DenominatorType::TenThousand) => 100,
        Ok(DenominatorType::Million) => 1,
        Err(_) => {
            cx.err(
                join(at, "denominator"),
                format!("unknown value {}", fp.denominator),
            );
            return common::FULL_FRACTION_PPM;
        }
    };
    (u64::from(fp.numerator) * scale).min(common::FULL_FRACTION_PPM.into()) as u32
}

/// Applies `ListenerSettings.mirror_modes` (at `at`) to the routes' mirror policies. Returns
/// which entry set the mode of each mirror, as (route, mirror index) → entry index.
pub(super) fn mirror_modes(
    cx: &mut Cx,
    at: &str,
    modes: &[rw::RouteMirrorMode],
    table: &mut RouteTable,
) -> HashMap<(RouteId, usize), usize> {
    let mut set_by: HashMap<(RouteId, usize), usize> = HashMap::new();
    for (k, entry) in modes.iter().enumerate() {
        let ea = index(&join(at, "mirror_modes"), k);
        let before = cx.count();
        let (route, route_name, mirrors) = match &entry.prefix {
            Some(prefix) => match table.routes.iter().position(|r| r.prefix == *prefix) {
                Some(ri) => (
                    Some(ri),
                    format!("routes[{ri}]"),
                    &mut table.routes[ri].mirrors,
                ),
                None => {
                    cx.err(
                        join(&ea, "prefix"),
                        format!("no route has the prefix {prefix:?}"),
                    );
                    continue;
                }
            },
            None if table.catch_all.is_some() => (
                None,
                "catch_all_route".to_string(),
                &mut table.catch_all_mirrors,
            ),
            None => {
                cx.err(
                    join(&ea, "prefix"),
                    "unset, which names the catch_all_route, but there is none",
                );
                continue;
            }
        };
        let mode = match rw::MirrorMode::try_from(entry.mode) {
            Ok(rw::MirrorMode::DualWrite) => Some(MirrorMode::DualWrite {
                target_is_primary: entry.target_is_primary,
            }),
            Ok(rw::MirrorMode::Forward) => Some(MirrorMode::Forward),
            Ok(rw::MirrorMode::ReadOnly) => Some(MirrorMode::ReadOnly),
            Ok(rw::MirrorMode::Move) => Some(MirrorMode::Move),
            Ok(rw::MirrorMode::PrepareMove) => Some(MirrorMode::PrepareMove),
            Err(_) => {
                cx.err(join(&ea, "mode"), format!("unknown value {}", entry.mode));
                None
            }
        };
        if entry.target_is_primary && entry.mode != rw::MirrorMode::DualWrite as i32 {
            cx.err(
                join(&ea, "target_is_primary"),
                "only used with MIRROR_MODE_DUAL_WRITE",
            );
        }
        let targets: Vec<usize> = mirrors
            .iter()
            .enumerate()
            .filter(|(_, m)| m.cluster == entry.cluster)
            .map(|(i, _)| i)
            .collect();
        if targets.is_empty() {
            cx.err(
                join(&ea, "cluster"),
                format!(
                    "{route_name} has no request_mirror_policy for cluster {:?}",
                    entry.cluster
                ),
            );
        }
        for i in targets {
            if let Some(first) = set_by.insert((route, i), k) {
                cx.err(
                    &ea,
                    format!(
                        "another entry for {route_name} and cluster {:?} (also mirror_modes[{first}])",
                        entry.cluster
                    ),
                );
                break;
            }
            if let (Some(mode), true) = (mode, cx.count() == before) {
                mirrors[i].mode = mode;
            }
        }
    }
    set_by
}

/// The rules on a route's mirrors, once their modes are known. `settings` is where
/// `ListenerSettings` is, if present; `set_by` says which of its `mirror_modes` entries set
/// each mirror's mode.
pub(super) fn check_mirrors(
    cx: &mut Cx,
    at: &str,
    settings: Option<&str>,
    set_by: &HashMap<(RouteId, usize), usize>,
    table: &RouteTable,
) {
    let routes = table
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| (Some(i), r.cluster.as_str(), r.mirrors.as_slice()));
    let catch_all = table
        .catch_all
        .as_deref()
        .map(|c| (None, c, table.catch_all_mirrors.as_slice()));
    for (route, cluster, mirrors) in routes.chain(catch_all) {
        if cluster.is_empty() {
            continue; // already an error
        }
        let route_at = match route {
            Some(i) => index(&join(at, "routes"), i),
            None => join(at, "catch_all_route"),
        };
        let policy = |i: usize| index(&join(&route_at, "request_mirror_policy"), i);
        // Second primaries and read-only mirrors exist only through mirror_modes entries.
        let entry = |i: usize, field: &str| match (settings, set_by.get(&(route, i))) {
            (Some(s), Some(k)) => join(&index(&join(s, "mirror_modes"), *k), field),
            _ => policy(i),
        };
        let entry_name = |i: usize| match set_by.get(&(route, i)) {
            Some(k) => format!("mirror_modes[{k}]"),
            None => format!("request_mirror_policy[{i}]"),
        };
        for p in common::check_mirrors(cluster, mirrors) {
            match p {
                MirrorProblem::OwnCluster { mirror } => cx.err(
                    join(&policy(mirror), "cluster"),
                    format!("{cluster:?} is the route's own cluster"),
                ),
                MirrorProblem::Duplicate { mirror, first } => cx.err(
                    join(&policy(mirror), "cluster"),
                    format!(
                        "duplicate mirror cluster {:?} (also request_mirror_policy[{first}])",
                        mirrors[mirror].cluster
                    ),
                ),
                MirrorProblem::SecondPrimary { mirror, first } => cx.err(
                    entry(mirror, "target_is_primary"),
                    format!(
                        "only one mirror of a route may be primary (also {})",
                        entry_name(first)
                    ),
                ),
                MirrorProblem::SecondReadOnly { mirror, first } => cx.err(
                    entry(mirror, "mode"),
                    format!(
                        "only one MIRROR_MODE_READ_ONLY mirror per route (also {})",
                        entry_name(first)
                    ),
                ),
                MirrorProblem::MoveNotAlone { mirror, mode } => cx.err(
                    entry(mirror, "mode"),
                    format!(
                        "mode {} must be the route's only mirror: its keys live on one \
                         cluster at a time",
                        match mode {
                            MirrorMode::PrepareMove => "MIRROR_MODE_PREPARE_MOVE",
                            _ => "MIRROR_MODE_MOVE",
                        }
                    ),
                ),
            }
        }
    }
}

fn route_extras(cx: &mut Cx, at: &str, r: &Route) {
    unsupported(
        cx,
        at,
        &[
            ("key_formatter", !r.key_formatter.is_empty()),
            ("read_command_policy", r.read_command_policy.is_some()),
        ],
    );
}

fn check_cluster(cx: &mut Cx, at: &str, name: &str, clusters: &HashSet<&str>) {
    if name.is_empty() {
        cx.err(at, "required");
    } else if !clusters.contains(name) {
        cx.err(at, format!("unknown cluster {name:?}"));
    }
}

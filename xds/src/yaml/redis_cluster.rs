//! A cluster's `redis_cluster`: a Redis Cluster's seed nodes and refresh settings (Envoy's
//! `RedisClusterConfig`), read into the cluster's `cluster_type` and inline seeds.

use respway_filters::model::RedisClusterSource;
use serde_yaml_ng::Value;

use super::origin::Origins;
use super::reference::REDIS_CLUSTER_KEYS;
use super::value::{kind, Map};
use crate::common;
use crate::error::{join, Cx};

/// `redis_cluster`: the seeds and the refresh settings as written, the rest at Envoy's
/// defaults; `None` when it is not a mapping or has errors.
pub(super) fn redis_cluster(cx: &mut Cx, o: &mut Origins, v: &Value) -> Option<RedisClusterSource> {
    let path = "redis_cluster";
    let envoy = "cluster_type.typed_config";
    o.note("load_assignment", join(path, "seeds"));
    for key in &REDIS_CLUSTER_KEYS[1..] {
        o.note(format!("{envoy}.{key}"), join(path, key));
    }
    let before = cx.count();
    let m = Map::new(cx, v, path, REDIS_CLUSTER_KEYS)?;
    let d = RedisClusterSource::default();
    let mut seeds = Vec::new();
    for (k, v) in m.non_empty_seq(cx, "seeds").iter().enumerate() {
        let at = crate::error::index(&m.at("seeds"), k);
        match v {
            Value::String(text) => match common::parse_socket_addr(text) {
                Ok(a) if seeds.contains(&a) => cx.err(at, format!("{a} is listed twice")),
                Ok(a) => seeds.push(a),
                Err(e) => cx.err(at, e),
            },
            other => cx.err(
                at,
                format!(
                    "expected an address such as \"127.0.0.1:7000\", got {}",
                    kind(other)
                ),
            ),
        }
    }
    let duration = |cx: &mut Cx, key: &str, default| match m.get(key) {
        None => default,
        Some(_) => match m.duration_or_zero(cx, key) {
            Some(d) if d.is_zero() => {
                cx.err(m.at(key), "must be greater than 0");
                default
            }
            Some(d) => d,
            None => default,
        },
    };
    let count = |cx: &mut Cx, key: &str, default: u32| {
        m.uint(cx, key, u32::MAX.into())
            .map_or(default, |n| n as u32)
    };
    let src = RedisClusterSource {
        seeds,
        cluster_refresh_rate: duration(cx, "cluster_refresh_rate", d.cluster_refresh_rate),
        cluster_refresh_timeout: duration(cx, "cluster_refresh_timeout", d.cluster_refresh_timeout),
        redirect_refresh_interval: duration(
            cx,
            "redirect_refresh_interval",
            d.redirect_refresh_interval,
        ),
        redirect_refresh_threshold: count(
            cx,
            "redirect_refresh_threshold",
            d.redirect_refresh_threshold,
        ),
        failure_refresh_threshold: count(
            cx,
            "failure_refresh_threshold",
            d.failure_refresh_threshold,
        ),
        host_degraded_refresh_threshold: count(
            cx,
            "host_degraded_refresh_threshold",
            d.host_degraded_refresh_threshold,
        ),
    };
    (cx.count() == before).then_some(src)
}

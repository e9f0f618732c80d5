//! `Cluster.health_checks` → [`HealthCheck`]: one Envoy `HealthCheck` whose
//! `custom_health_check` is Envoy's Redis health checker (`envoy.health_checkers.redis`, its
//! `key` the drain key), with `timeout`, `interval` and the two thresholds. Every other field
//! of `HealthCheck` is refused by name.

use envoy_types::pb::envoy::config::core::v3::health_check::{
    custom_health_check::ConfigType, HealthChecker,
};
use envoy_types::pb::envoy::config::core::v3::HealthCheck as PbHealthCheck;
use envoy_types::pb::envoy::extensions::health_checkers::redis::v3::Redis;
use envoy_types::pb::google::protobuf::UInt32Value;
use respway_filters::model::HealthCheck;

use super::{positive_duration, unpack, unsupported};
use crate::error::{join, Cx};
use crate::names::REDIS_HEALTH_CHECKER;

/// The cluster's health check (`None`: none configured, or errors, which are in `cx`).
#[allow(deprecated)] // deprecated Envoy fields are read to refuse them
pub(super) fn health_check(cx: &mut Cx, checks: &[PbHealthCheck]) -> Option<HealthCheck> {
    let h = match checks {
        [] => return None,
        [h] => h,
        more => {
            cx.err(
                "health_checks",
                format!(
                    "respway runs one health check per cluster (got {})",
                    more.len()
                ),
            );
            return None;
        }
    };
    let at = "health_checks[0]";
    let f = |field: &str| join(at, field);
    unsupported(
        cx,
        at,
        &[
            ("initial_jitter", h.initial_jitter.is_some()),
            ("interval_jitter", h.interval_jitter.is_some()),
            ("interval_jitter_percent", h.interval_jitter_percent != 0),
            ("alt_port", h.alt_port.is_some()),
            ("reuse_connection", h.reuse_connection.is_some()),
            ("no_traffic_interval", h.no_traffic_interval.is_some()),
            (
                "no_traffic_healthy_interval",
                h.no_traffic_healthy_interval.is_some(),
            ),
            ("unhealthy_interval", h.unhealthy_interval.is_some()),
            (
                "unhealthy_edge_interval",
                h.unhealthy_edge_interval.is_some(),
            ),
            ("healthy_edge_interval", h.healthy_edge_interval.is_some()),
            ("event_log_path", !h.event_log_path.is_empty()),
            ("event_logger", !h.event_logger.is_empty()),
            ("event_service", h.event_service.is_some()),
            (
                "always_log_health_check_failures",
                h.always_log_health_check_failures,
            ),
            (
                "always_log_health_check_success",
                h.always_log_health_check_success,
            ),
            ("tls_options", h.tls_options.is_some()),
            (
                "transport_socket_match_criteria",
                h.transport_socket_match_criteria.is_some(),
            ),
        ],
    );
    let defaults = HealthCheck::default();
    let timeout = match &h.timeout {
        Some(d) => positive_duration(cx, &f("timeout"), d),
        None => Some(defaults.timeout),
    };
    let interval = match &h.interval {
        Some(d) => positive_duration(cx, &f("interval"), d),
        None => Some(defaults.interval),
    };
    let threshold = |cx: &mut Cx, field: &str, v: &Option<UInt32Value>, default: u32| match v {
        None => Some(default),
        Some(UInt32Value { value: 0 }) => {
            cx.err(f(field), "must be greater than 0");
            None
        }
        Some(UInt32Value { value }) => Some(*value),
    };
    let unhealthy_threshold = threshold(
        cx,
        "unhealthy_threshold",
        &h.unhealthy_threshold,
        defaults.unhealthy_threshold,
    );
    let healthy_threshold = threshold(
        cx,
        "healthy_threshold",
        &h.healthy_threshold,
        defaults.healthy_threshold,
    );
    let drain_key = match &h.health_checker {
        None => {
            cx.err(
                f("health_checker"),
                format!("required: a custom_health_check named {REDIS_HEALTH_CHECKER}"),
            );
            None
        }
        Some(HealthChecker::CustomHealthCheck(c)) if c.name == REDIS_HEALTH_CHECKER => {
            match &c.config_type {
                None => Some(None),
                Some(ConfigType::TypedConfig(any)) => {
                    let at = f("custom_health_check.typed_config");
                    match unpack::<Redis>(any) {
                        Ok(r) => {
                            unsupported(cx, &at, &[("aws_iam", r.aws_iam.is_some())]);
                            Some((!r.key.is_empty()).then_some(r.key))
                        }
                        Err(e) => {
                            cx.err(at, e);
                            None
                        }
                    }
                }
            }
        }
        Some(HealthChecker::CustomHealthCheck(c)) => {
            cx.err(
                f("custom_health_check.name"),
                format!(
                    "unsupported health checker {:?} (respway runs {REDIS_HEALTH_CHECKER})",
                    c.name
                ),
            );
            None
        }
        Some(other) => {
            let field = match other {
                HealthChecker::HttpHealthCheck(_) => "http_health_check",
                HealthChecker::TcpHealthCheck(_) => "tcp_health_check",
                HealthChecker::GrpcHealthCheck(_) => "grpc_health_check",
                HealthChecker::CustomHealthCheck(_) => "custom_health_check",
            };
            cx.err(
                f(field),
                format!(
                    "not supported by respway (use a custom_health_check named \
                     {REDIS_HEALTH_CHECKER})"
                ),
            );
            None
        }
    };
    Some(HealthCheck {
        interval: interval?,
        timeout: timeout?,
        unhealthy_threshold: unhealthy_threshold?,
        healthy_threshold: healthy_threshold?,
        drain_key: drain_key?,
    })
}

//! A shard's, an endpoint's or a cluster's `auth` block: the credentials respway sends to the
//! shards.

use respway_filters::model::UpstreamAuth;
use serde_yaml_ng::Value;

use super::reference::AUTH_KEYS;
use super::value::Map;
use crate::common;
use crate::error::Cx;

/// An `auth` block at `path`: `username`, and the password from exactly one of `password`,
/// `password_file` (read now, trailing newline trimmed) and `password_env`; also the key the
/// password came from.
pub(super) fn upstream_auth(
    cx: &mut Cx,
    v: &Value,
    path: &str,
) -> Option<(UpstreamAuth, &'static str)> {
    let before = cx.count();
    let a = Map::new(cx, v, path, AUTH_KEYS)?;
    let username = a.non_empty_string(cx, "username");
    let sources = ["password", "password_file", "password_env"];
    let given: Vec<&'static str> = sources
        .iter()
        .copied()
        .filter(|k| a.get(k).is_some())
        .collect();
    let password = match given.as_slice() {
        [] => {
            cx.err(
                a.at("password"),
                "required: one of password, password_file, password_env",
            );
            None
        }
        [key] => {
            let value = a.string(cx, key);
            match (*key, value) {
                (_, None) => None,
                (_, Some(v)) if v.is_empty() => {
                    cx.err(a.at(key), "must not be empty");
                    None
                }
                ("password", Some(v)) => Some(v),
                ("password_file", Some(f)) => common::read_password_file(&f)
                    .map_err(|e| cx.err(a.at(key), e))
                    .ok(),
                (_, Some(name)) => common::read_password_env(&name)
                    .map_err(|e| cx.err(a.at(key), e))
                    .ok(),
            }
        }
        more => {
            cx.err(
                a.at(more[1]),
                format!("conflicts with {}: give the password one way", more[0]),
            );
            None
        }
    };
    let key = given.first().copied().unwrap_or("password");
    (cx.count() == before).then_some((
        UpstreamAuth {
            username,
            password: password?,
        },
        key,
    ))
}

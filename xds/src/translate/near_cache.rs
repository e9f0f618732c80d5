//! `respway.v1.ClusterOptions.near_cache` → [`NearCache`]: zeros and unset fields are the
//! defaults; the prefixes and the entry cap are checked as the YAML's are
//! ([`common::check_near_cache`]).

use respway_filters::model::{NearCache, NearCacheAdmit, NearCacheMode};

use super::positive_duration;
use crate::common;
use crate::error::{join, Cx};
use crate::pb::respway::v1 as rw;

/// The cluster's near cache from its options at `options_at` (`None`: none, or errors, which
/// are in `cx`).
pub(super) fn near_cache(
    cx: &mut Cx,
    options_at: &str,
    n: Option<&rw::NearCache>,
) -> Option<NearCache> {
    let n = n?;
    let at = join(options_at, "near_cache");
    let before = cx.count();
    let d = NearCache::default();
    let mode = match rw::NearCacheMode::try_from(n.mode) {
        Ok(rw::NearCacheMode::Unspecified | rw::NearCacheMode::Tracked) => NearCacheMode::Tracked,
        Ok(rw::NearCacheMode::Bcast) => NearCacheMode::Bcast,
        Ok(rw::NearCacheMode::Ttl) => NearCacheMode::Ttl,
        Err(_) => {
            cx.err(join(&at, "mode"), format!("unknown value {}", n.mode));
            d.mode
        }
    };
    let admit = match rw::NearCacheAdmit::try_from(n.admit) {
        Ok(rw::NearCacheAdmit::Unspecified | rw::NearCacheAdmit::All) => NearCacheAdmit::All,
        Ok(rw::NearCacheAdmit::Hot) => NearCacheAdmit::Hot,
        Err(_) => {
            cx.err(join(&at, "admit"), format!("unknown value {}", n.admit));
            d.admit
        }
    };
    let or_default = |v: u64, default: u64| if v == 0 { default } else { v };
    let max_age = match &n.max_age {
        None => mode.default_max_age(),
        Some(age) => {
            positive_duration(cx, &join(&at, "max_age"), age).unwrap_or(mode.default_max_age())
        }
    };
    let out = NearCache {
        mode,
        prefixes: n.prefixes.clone(),
        admit,
        max_bytes: or_default(n.max_bytes, d.max_bytes),
        max_entry_bytes: or_default(n.max_entry_bytes, d.max_entry_bytes),
        max_age,
        hot_reads_per_sec: or_default(n.hot_reads_per_sec, d.hot_reads_per_sec),
    };
    for (field, reason) in common::check_near_cache(&out, &d) {
        cx.err(join(&at, &field), reason);
    }
    (cx.count() == before).then_some(out)
}

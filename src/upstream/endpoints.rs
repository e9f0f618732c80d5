//! One worker's endpoint handles ([`Endpoints`]): what its chains send through, what the
//! registry sums, and which endpoints its zone layer may pick.

use std::sync::Arc;

use respway_filters::zone::HealthView;

use super::{check, promoted, redirect, Down, EndpointHandle, ErrorKind};

thread_local! {
    /// This worker's endpoints of the newest configuration it built (a Redis Cluster's
    /// redirection to a node that joined looks there: see `redirect`).
    static LATEST: std::cell::RefCell<Option<Arc<Endpoints>>> = const { std::cell::RefCell::new(None) };
}

/// Records `e` as this worker's newest endpoints.
pub(crate) fn set_latest(e: &Arc<Endpoints>) {
    LATEST.with(|l| *l.borrow_mut() = Some(e.clone()));
}

/// This worker's newest endpoints.
pub(super) fn latest() -> Option<Arc<Endpoints>> {
    LATEST.with(|l| l.borrow().clone())
}

/// One worker's endpoint handles, `[cluster][shard][endpoint]` in model order.
#[derive(Debug, Default)]
pub(crate) struct Endpoints(
    pub(crate) Vec<Vec<Vec<EndpointHandle>>>,
    /// Per cluster, when it is a Redis Cluster (whose redirections are followed): its name
    /// and where its topology hints go.
    pub(crate) Vec<Option<redirect::RedisCluster>>,
    /// Redis Cluster shards whose primary a `MOVED` showed replaced by one of their replicas
    /// (a failover), until the refreshed topology replaces these endpoints.
    pub(crate) promoted::Promoted,
);

impl Endpoints {
    /// Adds this worker's view of each endpoint `[cluster][shard][endpoint]` into `out`
    /// (grown as needed): what the registry sums over workers.
    pub(crate) fn add_views(&self, out: &mut Vec<Vec<Vec<crate::stats::EndpointView>>>) {
        use crate::stats::{CmdTotals, EndpointView};
        for (c, shards) in self.0.iter().enumerate() {
            if out.len() <= c {
                out.resize_with(c + 1, Vec::new);
            }
            for (s, eps) in shards.iter().enumerate() {
                if out[c].len() <= s {
                    out[c].resize_with(s + 1, Vec::new);
                }
                for (e, h) in eps.iter().enumerate() {
                    if out[c][s].len() <= e {
                        out[c][s].resize(e + 1, EndpointView::default());
                    }
                    let v = &mut out[c][s][e];
                    v.healthy_workers += usize::from(h.is_healthy());
                    v.workers += 1;
                    v.dedicated += h.dedicated_open();
                    v.requests += h.requests();
                    v.queued += h.queued();
                    let st = h.stats();
                    for (n, k) in v.errors.iter_mut().zip(ErrorKind::ALL) {
                        *n += st.errors(k);
                    }
                    v.ejections += st.ejections();
                    if v.check.is_none() {
                        v.check = h.check().map(check::EndpointCheck::view);
                    }
                    let (open, inflight) = st.open();
                    v.connections += open;
                    v.inflight += inflight;
                    let (connects, failures) = st.connects();
                    v.connects += connects;
                    v.connect_failures += failures;
                    if let Some(d) = st.down() {
                        v.down = Some(match v.down.take() {
                            None => d,
                            Some(o) => Down {
                                since: o.since.min(d.since),
                                reason: if d.since >= o.since {
                                    d.reason
                                } else {
                                    o.reason
                                },
                                failures: o.failures.max(d.failures),
                            },
                        });
                    }
                    h.add_latency(
                        v.latency
                            .get_or_insert_with(|| CmdTotals::empty("upstream")),
                    );
                }
            }
        }
    }

    /// The handle of one endpoint.
    pub(crate) fn get(
        &self,
        cluster: usize,
        shard: usize,
        endpoint: usize,
    ) -> Option<&EndpointHandle> {
        self.0.get(cluster)?.get(shard)?.get(endpoint)
    }
}

/// Healthy: this worker's connections to it work, and the active check (when its cluster
/// has one) has it in rotation.
impl HealthView for Endpoints {
    fn healthy(&self, cluster: usize, shard: usize, endpoint: usize) -> bool {
        self.get(cluster, shard, endpoint).is_some_and(|h| {
            h.is_healthy() && h.check().is_none_or(check::EndpointCheck::in_rotation)
        })
    }
}

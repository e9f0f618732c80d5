//! Static endpoints: the connection settings of one endpoint of a configured shard (its
//! address, TLS, credentials, database, what to say while its primary is unknown), as every
//! user of an endpoint (workers, health checks, hot-key copies) builds them.

use std::net::SocketAddr;

use bytes::Bytes;
use respway_filters::model::{Cluster, Role, Shard};

use crate::upstream::EndpointConfig;

/// The settings of the endpoint at `address` of shard `s` of cluster `c`.
pub(crate) fn endpoint_config(
    c: &Cluster,
    s: &Shard,
    address: SocketAddr,
    tls: Option<crate::net::tls::UpstreamTlsConfig>,
) -> EndpointConfig {
    let shard = &s.name;
    let replica = (s.endpoints.iter()).any(|e| e.address == address && e.role == Role::Replica);
    let placeholder = address == respway_filters::model::NO_ENDPOINT;
    EndpointConfig {
        tls,
        address,
        label: match &s.sentinel {
            Some(_) if placeholder => format!("shard {shard}").into(),
            None if placeholder => format!("cluster {}", c.name).into(),
            _ => format!("shard {shard} ({address})").into(),
        },
        missing: match (&s.sentinel, &c.redis_cluster) {
            (Some(src), _) if placeholder => Some(
                format!(
                    "no primary known: no Sentinel has named one for master {:?} yet",
                    src.master
                )
                .into(),
            ),
            (_, Some(src)) if placeholder => {
                Some(crate::discovery::redis_cluster::missing(&s.name, src).into())
            }
            _ => None,
        },
        // A Redis Cluster replica serves reads only after READONLY.
        readonly: c.redis_cluster.is_some() && replica,
        replica,
        connect_timeout: c.connect_timeout,
        auth: c.auth_for(address).map(|a| {
            let mut v = Vec::new();
            if let Some(u) = &a.username {
                v.push(Bytes::from(u.clone()));
            }
            v.push(Bytes::from(a.password.clone()));
            v
        }),
        db: c.db,
        databases: c.databases,
        dedicated: c.dedicated_connections,
        max_queue: c.max_queue_per_connection,
    }
}

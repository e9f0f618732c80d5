//! # respway-xds
//!
//! respway's configuration plane. A static YAML file and the xDS stream both become
//! the same Envoy v3 resources, and one translation turns those into the filters'
//! [`respway_filters::model`]:
//!
//! ```text
//! YAML ──parse_yaml──▶ Resources (Listener, Cluster, ClusterLoadAssignment) ──translate──▶ model::Config
//!                        ▲
//! xDS (ADS) ─────────────┘
//! ```
//!
//! - [`parse_yaml`] reads the schema described in `xds/SCHEMA.md` straight into
//!   [`Resources`], checking only the document's shape; [`translate`] validates resources
//!   into the model, for a file as for the xDS stream (the one place a configuration's
//!   meaning is checked); [`load_file`] does both for a file, with the translation's errors
//!   named by the file's own key paths. Every error of a snapshot is reported at once, each
//!   naming the resource, the field path and the reason ([`ConfigError`]).
//! - [`config_dump`] writes a model back out in that schema, secrets redacted (the sidecar's
//!   `GET /config_dump`): read again, it gives the same model (what a file cannot say is
//!   listed in [`ConfigDump::notes`]).
//! - What Envoy's own messages cannot say travels in respway's extension messages
//!   ([`pb::respway::v1`]), carried the way Envoy carries extensions: a `typed_config` in the
//!   listener's filter chain, `typed_extension_protocol_options` and `load_balancing_policy` on
//!   the cluster, and `filter_metadata` on endpoints (see [`names`]).
//! - Envoy fields that respway does not implement are refused by name when set, never ignored.
//!
//! The xDS side (state-of-the-world ADS, `envoy.service.discovery.v3.AggregatedDiscoveryService`):
//!
//! ```text
//! DIR/*.yaml ──poll──▶ cache (merge per node, validate, version) ──watch──▶ server (one task per ADS stream)
//!                                                                            │ CDS → EDS → LDS, nonces, ACK/NACK
//! sidecar ◀──apply(&Resources)── client (warming, ACK/NACK, backoff) ◀───────┘
//! ```
//!
//! The modules, grouped by concern:
//!
//! From a source to the model (used by the sidecar and the server alike)
//! - `yaml`: the static YAML schema, read straight into resources ([`parse_yaml`]): the
//!   reader checks the document's shape and notes where each field came from, so that the
//!   translation's errors name the YAML's key paths;
//! - `emit`: a model written out as Envoy resources ([`to_resources`]), which the management
//!   server serves from its merged resource files;
//! - `translate`: Envoy resources validated into the model ([`translate`]);
//! - `redis_cluster`: a Redis Cluster as Envoy's resources say one (`cluster_type:
//!   envoy.clusters.redis`, its seeds inline), written by both `yaml` and `emit`;
//! - `common`: defaults, names and checks both sources share, so a rule is written once;
//! - `error`: configuration errors naming resource, field path and reason ([`ConfigErrors`]);
//! - [`pb`]: the protobuf types: Envoy's v3 API and respway's extension messages;
//! - [`names`]: the names respway's extensions and metadata travel under in Envoy resources;
//! - [`nutcracker`]: a twemproxy (nutcracker) file converted to the static YAML, keeping its
//!   placement (`respway import-nutcracker`, and `--config` of a nutcracker file).
//!
//! The sidecar's side
//! - [`client`]: the sidecar's ADS client: it keeps the last accepted resources, applies a
//!   set only once it is warm and valid, and NACKs what it cannot apply.
//!
//! The management server (`respway-xds serve`)
//! - [`cache`]: a directory of resource files as a versioned snapshot per node;
//! - [`server`]: the ADS server over the cache, with per-node ACK/NACK status (and, through
//!   its `Fleet` trait, the nodes of other replicas);
//! - [`store`]: the shared store of several replicas (etcd), above the cache and the server:
//!   the files, kept in each replica's directory and followed by a watch (applies go through
//!   it), and the fleet (each replica's connected nodes under its lease, the others' read back);
//! - `serving`: `Server::serve`, which runs ADS, the directory watcher and the admin endpoint
//!   together (above both, so that neither imports the other);
//! - [`admin`]: its HTTP admin (`GET /status`, `POST /apply`) and that API's client, used by
//!   `respway-xds apply` and `respway-xds status`;
//! - [`secure`]: TLS and mTLS on the ADS and admin ports, admin credentials, and secrets sent
//!   only to the node they are for.
//! - [`reshard`]: `respway-xds reshard`, an online move of a route's keys to another cluster
//!   driven phase by phase (move mode, the mover, the final route), each push gated on every
//!   sidecar's ACK, resumable from its state file.

#![warn(missing_docs)]

pub mod admin;
pub mod cache;
pub mod client;
mod common;
mod emit;
mod error;
pub mod names;
pub mod nutcracker;
pub mod pb;
mod redis_cluster;
pub mod reshard;
pub mod secure;
pub mod server;
mod serving;
pub mod store;
mod translate;
mod yaml;

use std::path::Path;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use respway_filters::codec_limits::Limits;
use respway_filters::model::{self, Config, Endpoint, HashPolicy, HashTag, Role, RouteTable};

pub use emit::to_resources;
pub use error::{ConfigError, ConfigErrors};
pub use translate::translate;
pub use yaml::dump::{config_dump, ConfigDump, REDACTED};

/// One snapshot of Envoy v3 resources: what a static file becomes and what an xDS stream
/// delivers (LDS, CDS and EDS).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    /// Listeners (LDS), each with one filter chain ending in `envoy.filters.network.redis_proxy`.
    pub listeners: Vec<Listener>,
    /// Clusters (CDS).
    pub clusters: Vec<Cluster>,
    /// Endpoints of the EDS clusters (EDS), one assignment per cluster.
    pub endpoints: Vec<ClusterLoadAssignment>,
    /// The sidecar's zone. Not an Envoy resource: Envoy takes it from its bootstrap's
    /// `node.locality.zone`, a YAML file from `node.zone`. [`translate`] copies it into
    /// [`Config::zone`]; `None` when the source says none.
    pub node_zone: Option<String>,
}

/// The xDS resource types respway serves and consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    /// CDS: `envoy.config.cluster.v3.Cluster`.
    Cluster,
    /// EDS: `envoy.config.endpoint.v3.ClusterLoadAssignment`.
    Endpoint,
    /// LDS: `envoy.config.listener.v3.Listener`.
    Listener,
}

impl ResourceType {
    /// Make-before-break push order: clusters, then their endpoints, then the listeners that
    /// use them.
    pub const PUSH_ORDER: [ResourceType; 3] = [
        ResourceType::Cluster,
        ResourceType::Endpoint,
        ResourceType::Listener,
    ];

    /// The type URL (`type.googleapis.com/...`).
    pub fn type_url(self) -> &'static str {
        match self {
            ResourceType::Cluster => crate::CLUSTER_TYPE_URL,
            ResourceType::Endpoint => crate::ENDPOINT_TYPE_URL,
            ResourceType::Listener => crate::LISTENER_TYPE_URL,
        }
    }

    /// The type with this type URL, if respway serves it.
    pub fn from_type_url(url: &str) -> Option<ResourceType> {
        Self::PUSH_ORDER.into_iter().find(|t| t.type_url() == url)
    }

    /// `CDS`, `EDS` or `LDS`.
    pub fn short_name(self) -> &'static str {
        match self {
            ResourceType::Cluster => "CDS",
            ResourceType::Endpoint => "EDS",
            ResourceType::Listener => "LDS",
        }
    }

    /// Position in [`Self::PUSH_ORDER`], for per-type arrays.
    pub fn index(self) -> usize {
        match self {
            ResourceType::Cluster => 0,
            ResourceType::Endpoint => 1,
            ResourceType::Listener => 2,
        }
    }
}

/// The xDS type URL of listeners (LDS).
pub const LISTENER_TYPE_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// The xDS type URL of clusters (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The xDS type URL of cluster load assignments (EDS).
pub const ENDPOINT_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// Reads a YAML configuration (schema in `xds/SCHEMA.md`) into Envoy v3 resources.
///
/// The reader checks the document's shape (unknown keys anywhere, wrong types, values that
/// cannot be written as a resource field); the result is then checked by [`translate`], whose
/// errors are shown in the YAML's own terms too (resource and key path, e.g.
/// `cluster "main": shards[1].endpoints[0].address: 127.0.0.1:7001 is already used by
/// shards[0].endpoints[0]`). [`translate`] of the result succeeds. The file's `node.zone` is
/// returned in [`Resources::node_zone`].
///
/// # Errors
/// Every problem found in the document, in document order.
pub fn parse_yaml(text: &str) -> Result<Resources, ConfigErrors> {
    yaml::load(text).map(|(resources, _)| resources)
}

/// Reads, parses and translates a YAML configuration file. The file's `node.zone` is the
/// result's [`Config::zone`].
///
/// # Errors
/// The file cannot be read, or [`parse_yaml`] / [`translate`] found problems; each error's
/// `resource` starts with the file path (`respway.yaml: cluster "main"`), so the display
/// shows the file name on every line.
pub fn load_file(path: &Path) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let in_file = |errors: ConfigErrors| errors.in_file(&file);
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError::new(
            file.clone(),
            "",
            format!("cannot read: {e}"),
        )])
    })?;
    // A nutcracker (twemproxy) file is converted to this schema first.
    let text = match nutcracker::convert_if_nutcracker(&text) {
        Some(converted) => converted.map_err(in_file)?,
        None => text,
    };
    // The zone travels outside the Envoy resources (in `node_zone`), and translate keeps it.
    yaml::load(&text).map(|(_, config)| config).map_err(in_file)
}

/// The configuration used when none is given: a listener `default` on 127.0.0.1:6380 whose
/// catch-all is the cluster `default`, one maglev shard whose primary is 127.0.0.1:6379.
pub fn default_config() -> Config {
    let upstream = "127.0.0.1:6379".parse().expect("valid address");
    Config {
        zone: None,
        listeners: vec![model::Listener {
            name: "default".to_string(),
            address: common::DEFAULT_LISTENER_ADDRESS
                .parse()
                .expect("valid address"),
            routes: RouteTable {
                catch_all_mirrors: Vec::new(),
                routes: Vec::new(),
                case_insensitive: false,
                catch_all: Some("default".to_string()),
            },
            downstream_password: None,
            users: Vec::new(),
            op_timeout: common::DEFAULT_OP_TIMEOUT,
            max_pending_per_client: common::DEFAULT_MAX_PENDING,
            resp: Default::default(),
            client: Default::default(),
            limits: Limits::default(),
            tls: None,
            observe: Default::default(),
            cluster_emulation: None,
        }],
        clusters: vec![model::Cluster {
            tls: None,
            health_check: None,
            near_cache: None,
            redis_cluster: None,
            hot_keys: Vec::new(),
            read_policy: model::ReadPolicy::Primary,
            name: "default".to_string(),
            hash: HashPolicy::Maglev {
                table_size: common::DEFAULT_TABLE_SIZE,
            },
            hashtag: Some(HashTag::default()),
            shards: vec![model::Shard {
                name: "shard-0".to_string(),
                hash_key: "127.0.0.1:6379".to_string(),
                weight: 1,
                slots: Vec::new(),
                endpoints: vec![Endpoint {
                    address: upstream,
                    role: Role::Primary,
                    zone: None,
                }],
                sentinel: None,
            }],
            connections_per_endpoint: common::DEFAULT_CONNECTIONS_PER_ENDPOINT,
            databases: respway_filters::model::DEFAULT_DATABASES,
            dedicated_connections: respway_filters::model::DEFAULT_DEDICATED_CONNECTIONS,
            max_queue_per_connection: respway_filters::model::DEFAULT_MAX_QUEUE_PER_CONNECTION,
            connect_timeout: common::DEFAULT_CONNECT_TIMEOUT,
            auth: None,
            endpoint_auth: Vec::new(),
            db: 0,
        }],
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit, as Envoy, nginx and redis-server do, and
/// logs the limit in force (`soft`, `hard`, and `was` before): a sidecar or a management
/// server holds a descriptor per connection, and the usual soft default (1024) is far below
/// what the hard limit allows. An unlimited hard limit stands for `fs.nr_open` (what Linux
/// lets the soft one reach). Used by both binaries.
pub fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
    let was = getrlimit(Resource::Nofile);
    let hard = was.maximum.or_else(|| {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    if let (Some(soft), Some(hard)) = (was.current, hard) {
        if soft < hard {
            let want = Rlimit {
                current: Some(hard),
                maximum: was.maximum,
            };
            if let Err(e) = setrlimit(Resource::Nofile, want) {
                tracing::warn!(
                    soft,
                    hard,
                    error = %e,
                    "file descriptor limit (RLIMIT_NOFILE) could not be raised to the hard limit"
                );
            }
        }
    }
    let now = getrlimit(Resource::Nofile);
    tracing::info!(
        soft = %show(now.current),
        hard = %show(now.maximum),
        was = %show(was.current),
        "file descriptor limit (RLIMIT_NOFILE)"
    );
}

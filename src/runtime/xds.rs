//! The sidecar's xDS wiring: a bootstrap's management servers become an ADS client
//! ([`respway_xds::client`]) whose accepted configurations are applied to a running server,
//! or, before one runs, handed over as the first configuration.
//!
//! ```text
//! Bootstrap ──client_config──▶ AdsClientConfig ──Feed::spawn──▶ ADS client task
//!                                                     │ first(): the first config (no static resources)
//!                                                     │ attach(handle): later ones go to ConfigHandle::apply
//! ```
//!
//! The client translates each response once and decides ACK/NACK on that same [`Config`];
//! the feed applies it as is (its zone is the node's, which the client sent).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use respway_filters::model::Config;
use respway_xds::client::{AdsClientConfig, ClientStatus};
use respway_xds::secure::{ClientTlsRef, RELOAD_PERIOD};
use tokio::sync::{oneshot, watch};

use crate::runtime::admin::ConfigEvents;
use crate::runtime::bootstrap::Bootstrap;
use crate::runtime::ConfigHandle;

/// The ADS client configuration of `bootstrap` with the sidecar's `zone`, or `None` without
/// management servers. Loads the bootstrap's TLS files (and watches them for changes).
///
/// # Errors
/// A TLS file does not load, naming `xds.tls` and the file.
pub fn client_config(
    bootstrap: &Bootstrap,
    zone: Option<String>,
) -> Result<Option<AdsClientConfig>, String> {
    let Some(node_id) = bootstrap.node_id.clone() else {
        return Ok(None);
    };
    if bootstrap.xds_servers.is_empty() {
        return Ok(None);
    }
    let tls = match &bootstrap.xds_tls {
        Some(files) => {
            let tls = respway_tls::ClientTls::client("xds", files, &[b"h2"])
                .map_err(|e| format!("xds.tls: {e}"))?;
            respway_tls::watch(&tls, RELOAD_PERIOD);
            Some(ClientTlsRef {
                tls,
                server_name: files.server_name.clone(),
            })
        }
        None => None,
    };
    let mut cfg = AdsClientConfig::with_servers(bootstrap.xds_servers.clone(), node_id);
    cfg.zone = zone;
    cfg.tls = tls;
    cfg.backoff_min = Duration::from_millis(100);
    cfg.backoff_max = Duration::from_secs(5);
    if let Some(t) = bootstrap.xds_initial_fetch_timeout {
        cfg.warm_timeout = t;
    }
    if let Some(t) = bootstrap.xds_keepalive_interval {
        cfg.keepalive_interval = t;
    }
    if let Some(t) = bootstrap.xds_keepalive_timeout {
        cfg.keepalive_timeout = t;
    }
    Ok(Some(cfg))
}

/// A running ADS client and where its configurations go.
pub struct Feed {
    handle: Arc<OnceLock<ConfigHandle>>,
    first: Option<oneshot::Receiver<Config>>,
    status: watch::Receiver<ClientStatus>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("attached", &self.handle.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Feed {
    /// Starts the ADS client on the current runtime, applying to `server` when given. Until
    /// a server is attached ([`Feed::attach`]), the first accepted configuration is kept for
    /// [`Feed::first`] and later ones are NACKed as "still starting"; after, each is applied.
    /// `events` counts applies and refusals.
    pub fn spawn(
        cfg: AdsClientConfig,
        events: Arc<ConfigEvents>,
        server: Option<ConfigHandle>,
    ) -> Feed {
        let handle: Arc<OnceLock<ConfigHandle>> = Arc::new(OnceLock::new());
        if let Some(s) = server {
            let _ = handle.set(s);
        }
        let (first_tx, first_rx) = oneshot::channel::<Config>();
        let mut first_tx = Some(first_tx);
        let (status_tx, status_rx) = watch::channel(ClientStatus::default());
        let h = handle.clone();
        tokio::spawn(respway_xds::client::run(
            cfg,
            move |_resources, config| {
                let result = match h.get() {
                    Some(h) => h.apply(config).map(|v| {
                        tracing::info!(version = v, "configuration from xDS applied");
                    }),
                    None => match first_tx.take() {
                        Some(tx) => tx
                            .send(config)
                            .map_err(|_| "the sidecar is shutting down".to_string()),
                        None => Err("the sidecar is still starting".to_string()),
                    },
                };
                match &result {
                    Ok(()) => events.applied("xds"),
                    Err(e) => {
                        tracing::warn!(error = %e, "configuration from xDS refused (NACK); the last good configuration stays");
                        events.refused("xds");
                    }
                }
                result
            },
            Some(status_tx),
        ));
        Feed {
            handle,
            first: Some(first_rx),
            status: status_rx,
        }
    }

    /// The first configuration the client accepted (waits for it). `None` when the client
    /// stopped first, or it was asked for already.
    pub async fn first(&mut self) -> Option<Config> {
        self.first.take()?.await.ok()
    }

    /// From now on, accepted configurations are applied to `handle`'s server.
    pub fn attach(&self, handle: ConfigHandle) {
        let _ = self.handle.set(handle);
    }

    /// What the client is doing (connected, last error, versions in use).
    pub fn status(&self) -> ClientStatus {
        self.status.borrow().clone()
    }
}

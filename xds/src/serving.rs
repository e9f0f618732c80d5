//! Running a [`Server`]: ADS over gRPC (plain or TLS), the resource directory's watcher and
//! the admin endpoint together, until shutdown. Here, above both the server and the admin
//! endpoint, so that neither imports the other's runner.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use tokio_stream::wrappers::ReceiverStream;

use crate::secure::{tcp_incoming, tls_incoming};
use crate::server::{AbortOnDrop, Server};

impl Server {
    /// Serves ADS on `grpc` (and the admin endpoint on `admin`) and scans the resource
    /// directory, until `shutdown` completes or the future is dropped. At shutdown every ADS
    /// stream is ended (clients see the stream close and reconnect) and the listeners close.
    ///
    /// # Errors
    /// The gRPC server failed.
    pub async fn serve(
        self,
        grpc: TcpListener,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        // Dropped (or set) when this future ends: every stream task and the admin loop stop.
        let (stop_tx, stop_rx) = watch::channel(false);
        let watcher = tokio::spawn(self.cache.clone().watch(self.poll_interval));
        let _abort_watcher = AbortOnDrop(watcher);
        if let Some(admin) = admin {
            spawn_admin(admin, self.clone(), stop_rx.clone());
        }
        let service = self.ads_server(stop_rx);
        let signal = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        };
        let builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)));
        match &self.security.tls {
            Some(tls) => {
                let incoming = ReceiverStream::new(tls_incoming(
                    grpc,
                    tls.clone(),
                    "ads",
                    None,
                    self.ads_accept_errors.clone(),
                ));
                builder
                    .serve_with_incoming_shutdown(service, incoming, signal)
                    .await
            }
            None => {
                let incoming =
                    ReceiverStream::new(tcp_incoming(grpc, "ads", self.ads_accept_errors.clone()));
                builder
                    .serve_with_incoming_shutdown(service, incoming, signal)
                    .await
            }
        }
    }
}

/// Runs the admin endpoint on a thread of its own, with a runtime of its own, until `stop`
/// changes or its sender is dropped. On the server's runtime, an apply's reply waited behind
/// the wake-up of every ADS stream its push woke (10,000 streams: hundreds of milliseconds);
/// here the push goes on beside it.
fn spawn_admin(listener: TcpListener, server: Server, stop: watch::Receiver<bool>) {
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "the admin endpoint cannot be served");
            return;
        }
    };
    let thread = std::thread::Builder::new()
        .name("respway-xds-admin".to_string())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "the admin endpoint cannot be served");
                    return;
                }
            };
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(l) => crate::admin::serve(l, server, stop).await,
                    Err(e) => tracing::error!(error = %e, "the admin endpoint cannot be served"),
                }
            });
        });
    if let Err(e) = thread {
        tracing::error!(error = %e, "the admin endpoint cannot be served");
    }
}

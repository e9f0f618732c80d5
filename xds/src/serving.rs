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
            let server = self.clone();
            let stop = stop_rx.clone();
            tokio::spawn(crate::admin::serve(admin, server, stop));
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

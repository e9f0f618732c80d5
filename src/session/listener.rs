//! One listener on one worker: the state its sessions share ([`ListenerCtx`]), the chain
//! parts a configuration change swaps ([`ListenerSlot`]), and binding its `SO_REUSEPORT`
//! socket ([`bind_all`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

use crate::stack::ListenerSlot;
use crate::stats::AcceptSocket;
use crate::stats::ListenerStats;

/// Shared state of the listener a session belongs to, on one worker.
#[derive(Debug)]
pub(crate) struct ListenerCtx {
    /// The current configuration of this listener on this worker (swapped on config change).
    pub(crate) slot: Arc<ListenerSlot>,
    /// Counters.
    pub(crate) stats: Arc<ListenerStats>,
    /// Every worker's counters (for INFO).
    pub(crate) registry: Arc<crate::stats::Registry>,
    /// Workers in this process (for INFO).
    pub(crate) workers: usize,
    /// Set when the process drains: sessions read nothing more, answer what they have read,
    /// and close.
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Wakes every session when draining starts.
    pub(crate) drain: tokio::sync::Notify,
    /// Failed `AUTH` attempts per client address (shared by every listener and worker).
    pub(crate) auth_limiter: Arc<crate::stack::acl::AuthTarpit>,
}

/// Binds every listener; an error names the listener and the address.
pub(crate) fn bind_all(addrs: &[(String, SocketAddr)]) -> io::Result<Vec<TcpListener>> {
    addrs
        .iter()
        .map(|(name, addr)| bind_one(*addr).map_err(|e| named(e, name, *addr, "")))
        .collect()
}

/// `e`, naming the listener and the address it could not listen on.
fn named(e: io::Error, name: &str, addr: SocketAddr, hint: &str) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("listener {name:?}: cannot listen on {addr}: {e}{hint}"),
    )
}

/// A socket for `addr`'s family that may bind where connections of an earlier process are in
/// TIME_WAIT.
fn socket_for(addr: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    Ok(socket)
}

/// Fails (`AddrInUse`, naming the listener and address) when something already listens on
/// one of `addrs`: another respway included. The workers bind with `SO_REUSEPORT` to share
/// their address among themselves, which would also let them join another process's sockets
/// on it (of the same user) and silently take part of its clients; a plain socket cannot
/// bind where anything listens, so it is tried first. Port 0 needs no check.
pub(crate) fn check_free(addrs: &[(String, SocketAddr)]) -> io::Result<()> {
    for (name, addr) in addrs.iter().filter(|(_, a)| a.port() != 0) {
        socket_for(*addr)?.bind(*addr).map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::AddrInUse => " (is another process listening on it?)",
                _ => "",
            };
            named(e, name, *addr, hint)
        })?;
    }
    Ok(())
}

fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = socket_for(addr)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Shortest and longest pause after a failed `accept`.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// What an accept loop does when `accept` fails: out of file descriptors (`EMFILE`), the
/// pending connection stays in the kernel's queue and the listening socket stays readable, so
/// retrying at once would spin. It counts the failure
/// ([`crate::stats::accept_failed`]), pauses (5 ms, doubling up to 1 s while failures go
/// on), and logs the first failure of a run at warn and the recovery at info.
#[derive(Debug)]
pub(crate) struct AcceptBackoff {
    socket: AcceptSocket,
    pause: Duration,
    failures: u64,
}

impl AcceptBackoff {
    pub(crate) fn new(socket: AcceptSocket) -> Self {
        AcceptBackoff {
            socket,
            pause: ACCEPT_BACKOFF.0,
            failures: 0,
        }
    }

    /// An accept succeeded.
    pub(crate) fn accepted(&mut self) {
        if self.failures > 0 {
            tracing::info!(
                socket = ?self.socket,
                failures = self.failures,
                "accepting connections again"
            );
            self.failures = 0;
            self.pause = ACCEPT_BACKOFF.0;
        }
    }

    /// An accept failed with `e`: counts it and pauses.
    pub(crate) async fn failed(&mut self, e: &io::Error) {
        crate::stats::accept_failed(self.socket, e);
        if self.failures == 0 {
            tracing::warn!(
                socket = ?self.socket,
                error = %e,
                reason = crate::stats::accept_reason(e),
                "accept failed; retrying with backoff (up to 1 s) until it succeeds"
            );
        } else {
            tracing::debug!(socket = ?self.socket, error = %e, "accept failed again");
        }
        self.failures += 1;
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(ACCEPT_BACKOFF.1);
    }
}

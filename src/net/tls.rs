//! TLS on the data path: client sessions on a TLS listener and connections to TLS shards.
//!
//! The handshake runs with tokio-rustls; the connection is then taken apart into its
//! `TcpStream` and rustls `Connection` ([`TlsStream`]), driven by the socket's readiness like a
//! plain stream: reads and writes go through rustls's buffers with the socket's non-blocking
//! `try_read`/`try_write`, so the session and the upstream task keep one readiness-driven
//! loop for both (generic over [`Io`]: the plaintext path is the same code as without TLS,
//! monomorphized for `TcpStream`).
//!
//! Configurations are built from files when a configuration is applied ([`Certs::build`]),
//! reusing the loaded configuration (and its file watcher) of any TLS setting that did not
//! change; [`respway_tls::watch`] swaps in new certificates when the files change.

use std::io::{self, BufRead, Read, Write};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use respway_filters::model::{Config, ListenerTls, UpstreamTls};
use respway_tls::rustls;
use respway_tls::{ClientFiles, ClientTls, ServerFiles, ServerTls};
use tokio::net::TcpStream;

/// How often the certificate files of every TLS setting are checked for changes.
pub(crate) const RELOAD_PERIOD: Duration = Duration::from_secs(2);

/// The loaded TLS configurations of one snapshot: per listener and per cluster, in
/// configuration order.
#[derive(Debug, Default)]
pub(crate) struct Certs {
    /// Per listener.
    pub(crate) listeners: Vec<Option<(ListenerTls, Arc<ServerTls>)>>,
    /// Per cluster.
    pub(crate) clusters: Vec<Option<(UpstreamTls, Arc<ClientTls>)>>,
}

/// What the TLS crate loads for a listener's settings.
fn server_files(t: &ListenerTls) -> ServerFiles {
    ServerFiles {
        cert: t.cert.clone(),
        key: t.key.clone(),
        client_ca: t.client_ca.clone(),
        require_client_cert: t.require_client_cert,
    }
}

/// What the TLS crate loads for a cluster's settings.
fn client_files(t: &UpstreamTls) -> ClientFiles {
    ClientFiles {
        ca: t.ca.clone(),
        cert: t.cert.clone(),
        key: t.key.clone(),
        server_name: t.server_name.clone(),
        insecure_skip_verify: t.insecure_skip_verify,
    }
}

/// Loads every TLS file `config` names (listeners' `cert`, `key`, `client_ca`; clusters'
/// `ca`, `cert`, `key`) as a start would, without keeping or watching them: one error per
/// listener or cluster whose files are missing or do not load (`--check`).
pub(crate) fn check_files(config: &Config) -> Vec<String> {
    let mut errors = Vec::new();
    // Each file by its field first: every missing or unreadable one is named.
    let unreadable =
        |errors: &mut Vec<String>, what: &str, files: &[(&str, Option<&std::path::Path>)]| {
            let before = errors.len();
            for (field, path) in files {
                let Some(path) = path else { continue };
                if let Err(e) = std::fs::File::open(path) {
                    errors.push(format!("{what}: tls.{field}: {}: {e}", path.display()));
                }
            }
            errors.len() > before
        };
    for l in &config.listeners {
        let Some(t) = &l.tls else { continue };
        let what = format!("listener {:?}", l.name);
        let named = [
            ("cert", Some(t.cert.as_path())),
            ("key", Some(t.key.as_path())),
            ("client_ca", t.client_ca.as_deref()),
        ];
        if unreadable(&mut errors, &what, &named) {
            continue;
        }
        let files = server_files(t);
        if let Err(e) = ServerTls::server(what.clone(), &files, &[]) {
            errors.push(format!("{what}: tls: {e}"));
        }
    }
    for c in &config.clusters {
        let Some(t) = &c.tls else { continue };
        let what = format!("cluster {:?}", c.name);
        let named = [
            ("ca", t.ca.as_deref()),
            ("cert", t.cert.as_deref()),
            ("key", t.key.as_deref()),
        ];
        if unreadable(&mut errors, &what, &named) {
            continue;
        }
        let files = client_files(t);
        if let Err(e) = ClientTls::client(what.clone(), &files, &[]) {
            errors.push(format!("{what}: tls: {e}"));
        }
    }
    errors
}

impl Certs {
    /// TLS to the endpoints of cluster `ci` (its shards, and its Sentinels), if it has any.
    pub(crate) fn upstream(&self, ci: usize) -> Option<UpstreamTlsConfig> {
        let (settings, tls) = self.clusters.get(ci)?.clone()?;
        Some(UpstreamTlsConfig { settings, tls })
    }

    /// Loads the TLS configuration of every listener and cluster of `config` that has one,
    /// reusing those of `old` whose settings are the same (their watcher goes on), and
    /// starting a watcher for each new one.
    ///
    /// # Errors
    /// A file that is missing or does not load, naming the listener or cluster.
    pub(crate) fn build(config: &Config, old: Option<&Certs>) -> Result<Certs, String> {
        let mut out = Certs::default();
        for l in &config.listeners {
            let Some(t) = &l.tls else {
                out.listeners.push(None);
                continue;
            };
            let reused = old
                .into_iter()
                .flat_map(|o| o.listeners.iter().flatten())
                .find(|(files, _)| files == t)
                .map(|(_, tls)| tls.clone());
            let tls = match reused {
                Some(tls) => tls,
                None => {
                    let files = server_files(t);
                    let what = format!("listener {:?}", l.name);
                    let tls = ServerTls::server(what.clone(), &files, &[])
                        .map_err(|e| format!("{what}: tls: {e}"))?;
                    respway_tls::watch(&tls, RELOAD_PERIOD);
                    tls
                }
            };
            out.listeners.push(Some((t.clone(), tls)));
        }
        for c in &config.clusters {
            let Some(t) = &c.tls else {
                out.clusters.push(None);
                continue;
            };
            let reused = old
                .into_iter()
                .flat_map(|o| o.clusters.iter().flatten())
                .find(|(files, _)| files == t)
                .map(|(_, tls)| tls.clone());
            let tls = match reused {
                Some(tls) => tls,
                None => {
                    let files = client_files(t);
                    let what = format!("cluster {:?}", c.name);
                    if t.insecure_skip_verify {
                        tracing::warn!(
                            cluster = %c.name,
                            "tls.insecure_skip_verify: the shards' certificates are NOT verified"
                        );
                    }
                    let tls = ClientTls::client(what.clone(), &files, &[])
                        .map_err(|e| format!("{what}: tls: {e}"))?;
                    respway_tls::watch(&tls, RELOAD_PERIOD);
                    tls
                }
            };
            out.clusters.push(Some((t.clone(), tls)));
        }
        Ok(out)
    }
}

/// TLS to one endpoint: the cluster's settings (what pools are keyed by) and its loaded
/// configuration.
#[derive(Clone)]
pub(crate) struct UpstreamTlsConfig {
    /// The cluster's settings.
    pub(crate) settings: UpstreamTls,
    /// Its configuration, following the files.
    pub(crate) tls: Arc<ClientTls>,
}

impl std::fmt::Debug for UpstreamTlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.settings.fmt(f)
    }
}

impl PartialEq for UpstreamTlsConfig {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings
    }
}

impl Eq for UpstreamTlsConfig {}

impl std::hash::Hash for UpstreamTlsConfig {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.settings.hash(state);
    }
}

/// The byte stream of a session or an upstream connection: plain TCP or TLS, read and
/// written when the socket is ready, without blocking.
pub(crate) trait Io {
    /// Ready when a read may return bytes (or EOF); registers the waker otherwise.
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Reads into `buf`: `Ok(0)` at EOF, `WouldBlock` when the socket has nothing more
    /// (its readiness is then cleared, and the next `poll_read_ready` waits for more).
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// As [`Io::try_read`], into the spare capacity of `buf`.
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize>;
    /// A read returned less than it could take: the socket is drained (plain TCP clears its
    /// readiness without the syscall that would only return `EAGAIN`; TLS does nothing, since
    /// rustls may hold more).
    fn drained(&mut self);
    /// Ready when a write may take bytes; registers the waker otherwise.
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Writes from `buf` (`buf` may be empty: only what is pending goes out). `WouldBlock`
    /// when the socket takes nothing (its readiness is then cleared).
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize>;
    /// Bytes taken by `try_write` wait to be written to the socket (TLS records the socket
    /// did not take yet); always false for plain TCP.
    fn pending_out(&self) -> bool;
    /// The TCP stream under it.
    fn tcp(&self) -> &TcpStream;
    /// Ends the stream: a TLS `close_notify`, written if the socket takes it now.
    fn close(&mut self);
}

impl Io for TcpStream {
    #[inline]
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_read_ready(self, cx)
    }
    #[inline]
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::try_read(self, buf)
    }
    #[inline]
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        TcpStream::try_read_buf(self, buf)
    }
    #[inline]
    fn drained(&mut self) {
        clear_read_readiness(self);
    }
    #[inline]
    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        TcpStream::poll_write_ready(self, cx)
    }
    #[inline]
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        TcpStream::try_write(self, buf)
    }
    #[inline]
    fn pending_out(&self) -> bool {
        false
    }
    #[inline]
    fn tcp(&self) -> &TcpStream {
        self
    }
    #[inline]
    fn close(&mut self) {}
}

/// `std::io` over a tokio socket's non-blocking calls, for rustls's `read_tls`/`write_tls`.
struct Sock<'a>(&'a TcpStream);

impl Read for Sock<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for Sock<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A TCP stream with an established rustls connection on it (see the module docs).
pub(crate) struct TlsStream {
    tcp: TcpStream,
    conn: rustls::Connection,
    /// rustls may hold plaintext not read yet: read before waiting for the socket.
    buffered: bool,
}

impl TlsStream {
    /// Wraps an established connection (bytes rustls already holds are read first).
    pub(crate) fn new(tcp: TcpStream, conn: impl Into<rustls::Connection>) -> TlsStream {
        TlsStream {
            tcp,
            conn: conn.into(),
            buffered: true,
        }
    }

    /// Reads plaintext, handing each chunk to `put` (which takes what it can and says how
    /// much): `Ok(0)` at EOF (with or without `close_notify`), `WouldBlock` when the socket
    /// has nothing more.
    fn read_with(&mut self, mut put: impl FnMut(&[u8]) -> usize) -> io::Result<usize> {
        loop {
            let mut r = self.conn.reader();
            match r.fill_buf() {
                Ok([]) => return Ok(0),
                Ok(chunk) => {
                    let n = put(chunk);
                    r.consume(n);
                    self.buffered = true;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The peer closed TCP without close_notify: Redis clients do.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            self.buffered = false;
            // WouldBlock here is the socket's: its readiness is cleared.
            self.conn.read_tls(&mut Sock(&self.tcp))?;
            if let Err(e) = self.conn.process_new_packets() {
                // The alert that says why goes out if the socket takes it.
                let _ = self.conn.write_tls(&mut Sock(&self.tcp));
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }

    /// Writes pending TLS records until the socket is full (`WouldBlock`) or none is left.
    fn flush_tls(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut Sock(&self.tcp))?;
        }
        Ok(())
    }
}

impl Io for TlsStream {
    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.buffered {
            return Poll::Ready(Ok(()));
        }
        self.tcp.poll_read_ready(cx)
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_with(|chunk| {
            let n = chunk.len().min(buf.len());
            buf[..n].copy_from_slice(&chunk[..n]);
            n
        })
    }

    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.read_with(|chunk| {
            let n = chunk.len().min(buf.capacity() - buf.len());
            buf.extend_from_slice(&chunk[..n]);
            n
        })
    }

    fn drained(&mut self) {}

    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp.poll_write_ready(cx)
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // What is pending goes first, so rustls holds at most one write's records.
        self.flush_tls()?;
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.conn.writer().write(buf)?;
        match self.flush_tls() {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            // What the socket did not take is pending.
            _ => Ok(n),
        }
    }

    fn pending_out(&self) -> bool {
        self.conn.wants_write()
    }

    fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush_tls();
    }
}

/// A reason from a failed handshake, for logs: rustls's error when there is one.
pub(crate) fn reason(e: &io::Error) -> String {
    match e.get_ref() {
        Some(inner) => inner.to_string(),
        None => e.to_string(),
    }
}

/// Marks the socket not readable without a syscall (see `upstream::serve::read_replies`). Safe against a
/// race with new data: tokio only clears the readiness event it observed, and new data raises
/// a new edge-triggered event.
pub(crate) fn clear_read_readiness(stream: &TcpStream) {
    let _ = stream.try_io(tokio::io::Interest::READABLE, || {
        Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
    });
}

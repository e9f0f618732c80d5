//! Connecting to a shard: TCP or TLS, the handshake (AUTH, HELLO, SELECT, PING), and what a
//! failed one says.

use super::*;

/// A failed connect attempt.
pub(super) struct ConnectError {
    pub(super) text: String,
    /// The TCP connect itself was refused: nothing listens (yet), so trying again soon is
    /// cheap and finds a restarted shard at once.
    pub(super) refused: bool,
    /// The shard answered that it is coming back (see [`coming_back`]).
    pub(super) coming_back: bool,
}

impl ConnectError {
    /// A request that arrives meanwhile waits for one more attempt instead of failing at
    /// once: the shard may be back by then.
    pub(super) fn retry_soon(&self) -> bool {
        self.refused || self.coming_back
    }
}

impl From<String> for ConnectError {
    fn from(text: String) -> Self {
        ConnectError {
            text,
            refused: false,
            coming_back: false,
        }
    }
}

/// What a handshake that the shard closed says.
pub(super) const CLOSED_DURING_HANDSHAKE: &str = "closed during handshake";

/// How often a shard that is coming back (loading, or closing connections while it restarts)
/// is probed while no request asks for it.
pub(super) const COMING_BACK_PROBE: Duration = Duration::from_millis(50);

/// An open, prepared connection to an endpoint: plain TCP, or TLS after its handshake.
pub(crate) enum Conn {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS (tokio-rustls, as the handshake left it).
    Tls(Box<respway_tls::client::TlsStream<TcpStream>>),
}

impl Conn {
    /// Serves requests on it (see [`serve`]): a TLS connection is driven as a [`TlsStream`].
    pub(super) async fn serve(
        self,
        carry: &mut Vec<UpstreamRequest>,
        lost: &mut Vec<ReplyTx>,
        rx: &mut queue::Receiver<UpstreamRequest>,
        stats: &EndpointStats,
        latency: &crate::stats::Latency,
        dedicated: bool,
    ) -> Result<(), Fail> {
        match self {
            Conn::Plain(s) => serve(s, carry, lost, rx, stats, latency, dedicated).await,
            Conn::Tls(s) => {
                let (tcp, conn) = s.into_inner();
                let s = TlsStream::new(tcp, conn);
                serve(s, carry, lost, rx, stats, latency, dedicated).await
            }
        }
    }
}

/// A RESP2 connection to `cfg` (authenticated, database selected), for a connection the
/// caller drives itself (pub/sub links).
pub(crate) async fn connect_plain(cfg: &EndpointConfig) -> Result<Conn, String> {
    connect(cfg, Flavor::default()).await.map_err(|e| e.text)
}

pub(super) async fn connect(cfg: &EndpointConfig, flavor: Flavor) -> Result<Conn, ConnectError> {
    if cfg.address == respway_filters::model::NO_ENDPOINT {
        let reason = cfg.missing.as_deref();
        return Err(reason
            .unwrap_or(respway_filters::model::NO_ENDPOINT_REASON)
            .to_string()
            .into());
    }
    let started = Instant::now();
    let timed_out = || {
        ConnectError::from(format!(
            "connect timeout after {:?} (no answer to PING)",
            cfg.connect_timeout
        ))
    };
    let stream =
        match tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(cfg.address)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(ConnectError {
                    refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                    coming_back: false,
                    text: e.to_string(),
                })
            }
            Err(_) => return Err(timed_out()),
        };
    if let Err(e) = stream.set_nodelay(true) {
        return Err(e.to_string().into());
    }
    let left = cfg.connect_timeout.saturating_sub(started.elapsed());
    let attempt = async {
        match &cfg.tls {
            None => {
                let mut s = stream;
                hello(&mut s, cfg, flavor).await?;
                Ok::<Conn, String>(Conn::Plain(s))
            }
            Some(t) => {
                let name = respway_tls::server_name(
                    t.settings.server_name.as_deref(),
                    &cfg.address.ip().to_string(),
                )
                .map_err(|e| format!("TLS: {e}"))?;
                let mut s = t.tls.connector().connect(name, stream).await.map_err(|e| {
                    format!("TLS handshake failed: {}", crate::net::tls::reason(&e))
                })?;
                hello(&mut s, cfg, flavor).await?;
                Ok(Conn::Tls(Box::new(s)))
            }
        }
    };
    match tokio::time::timeout(left, attempt).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(ConnectError {
            coming_back: coming_back(&e),
            refused: false,
            text: e,
        }),
        Err(_) => Err(timed_out()),
    }
}

/// Whether a failed handshake says the shard is coming back: it answered `-LOADING` (loading
/// its AOF or RDB), accepted the connection and closed it (a process restarting behind a
/// supervisor or a load balancer), or is a replica not in sync yet. It is probed again every [`COMING_BACK_PROBE`], without
/// a growing backoff, and a request waits for the next attempt rather than failing at once.
pub(super) fn coming_back(handshake_error: &str) -> bool {
    handshake_error.starts_with("handshake refused: LOADING")
        || handshake_error == CLOSED_DURING_HANDSHAKE
        || handshake_error.starts_with("Connection reset by peer")
        || handshake_error.starts_with("Broken pipe")
        || handshake_error.starts_with(check::NOT_IN_SYNC)
}

/// AUTH and SELECT when configured, and always a PING: a process that is frozen or not Redis
/// still accepts TCP connections, but does not answer it.
pub(super) async fn hello<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    cfg: &EndpointConfig,
    flavor: Flavor,
) -> Result<(), String> {
    let mut hello = Vec::new();
    if let Some(auth) = &cfg.auth {
        let mut args = vec![Bytes::from_static(b"AUTH")];
        args.extend(auth.iter().cloned());
        hello.push(args);
    }
    if flavor.resp3 {
        hello.push(vec![Bytes::from_static(b"HELLO"), Bytes::from_static(b"3")]);
    }
    let db = cfg.db.saturating_add(u32::from(flavor.db));
    if db != 0 {
        hello.push(vec![
            Bytes::from_static(b"SELECT"),
            Bytes::from(db.to_string()),
        ]);
    }
    if cfg.readonly {
        hello.push(vec![Bytes::from_static(b"READONLY")]);
    }
    hello.push(vec![Bytes::from_static(b"PING")]);
    // A replica serves only while it says it is in sync (a replica restarted with an old
    // dump answers reads at once, with what it held before).
    let info = cfg.replica.then_some(hello.len());
    if info.is_some() {
        hello.push(vec![
            Bytes::from_static(b"INFO"),
            Bytes::from_static(b"replication"),
        ]);
    }
    let mut out = BytesMut::new();
    for args in &hello {
        encode_command(args, &mut out);
    }
    stream.write_all(&out).await.map_err(|e| e.to_string())?;
    // TLS: the records rustls holds go out now.
    stream.flush().await.map_err(|e| e.to_string())?;
    let mut buf = BytesMut::with_capacity(256);
    let mut answered = 0;
    while answered < hello.len() {
        if stream.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err(CLOSED_DURING_HANDSHAKE.to_string());
        }
        while let Some(n) = reply_len(&buf, &Limits::default())
            .map_err(|e| format!("handshake: Protocol error: {e}"))?
        {
            let reply = buf.split_to(n);
            if info == Some(answered) {
                // Refused (an upstream user without `INFO`): not checked.
                if reply.first() != Some(&b'-') {
                    let text = reply.splitn(2, |&b| b == b'\n').nth(1).unwrap_or_default();
                    check::in_sync(text)?;
                }
                answered += 1;
                continue;
            }
            // A Redis running a long script answers the PING `-BUSY`: it is alive, and
            // `SCRIPT KILL` (allowed while busy) must be able to reach it.
            let ping = hello.len() - 1 - usize::from(info.is_some());
            let busy_ping = answered == ping && reply.starts_with(b"-BUSY");
            if reply.first() == Some(&b'-') && !busy_ping {
                let text = String::from_utf8_lossy(&reply[1..reply.len() - 2]);
                return Err(format!("handshake refused: {text}"));
            }
            answered += 1;
        }
    }
    if !buf.is_empty() {
        return Err("handshake: Protocol error: unexpected data".to_string());
    }
    Ok(())
}

//! Control connections: the sidecar's own connections to a Redis server, beside the pools,
//! driven by their owner one command (or one pipeline) at a time. Sentinel discovery, Redis
//! Cluster topology refreshes, the near cache's trackers, hot-key copy passes and health
//! checks each keep one (or a few) per server.
//!
//! A [`Control`] is opened and prepared as the pools open theirs ([`connect_plain`]: TCP or
//! TLS, `AUTH`, `SELECT`, `READONLY` and a `PING`, as the endpoint's configuration says,
//! within its connect timeout; RESP2). Its owner writes commands ([`Control::send`]) and reads
//! replies and pushed messages, parsed, in order ([`Control::next`]); timeouts, retries and
//! reconnecting are the owner's, since each feature has its own. Dropping it closes it.
//!
//! Costs: one read buffer and one write buffer per connection, both kept between commands;
//! a command costs its encoding into the write buffer and the parse of its reply, nothing
//! allocated beside the reply's frame.

use super::*;
use respway_filters::resp::{parse_reply, Frame};

/// The first capacity of a control connection's read buffer.
const READ_BUF: usize = 4096;

/// One control connection (see the module above).
pub(crate) struct Control {
    conn: Conn,
    /// Bytes read and not yet cut into frames.
    rbuf: BytesMut,
    /// Where [`Control::send`] encodes its commands (kept, so a command allocates nothing).
    wbuf: BytesMut,
    /// Resumes inside a reply that spans reads.
    scanner: ReplyScanner,
}

impl Control {
    /// Connects to `cfg` and prepares the connection (see [`connect_plain`]); the error is
    /// the connect's (`connect timeout after ...`, `handshake refused: ...`, `TLS handshake
    /// failed: ...`, or the socket's).
    pub(crate) async fn open(cfg: &EndpointConfig) -> Result<Control, String> {
        Ok(Control {
            conn: connect_plain(cfg).await?,
            rbuf: BytesMut::with_capacity(READ_BUF),
            wbuf: BytesMut::new(),
            scanner: ReplyScanner::new(),
        })
    }

    /// Writes `commands` in one piece (a pipeline) and flushes them (TLS: the records go out
    /// now).
    pub(crate) async fn send(&mut self, commands: &[&[&[u8]]]) -> Result<(), String> {
        self.wbuf.clear();
        for c in commands {
            encode_command(c, &mut self.wbuf);
        }
        self.write().await
    }

    /// Sends one command and reads the next frame (its reply, on a connection that has no
    /// pushed messages).
    pub(crate) async fn call<B: AsRef<[u8]>>(&mut self, args: &[B]) -> Result<Frame, String> {
        self.wbuf.clear();
        encode_command(args, &mut self.wbuf);
        self.write().await?;
        self.next().await
    }

    /// The next reply or pushed message (a subscriber's `message`, a RESP3 push). Cancel
    /// safe: what was read stays in the buffer for the next call, so it may be one branch of
    /// a `select!`.
    pub(crate) async fn next(&mut self) -> Result<Frame, String> {
        loop {
            match self.scanner.scan(&self.rbuf, &Limits::REPLIES) {
                Ok(Some(n)) => {
                    let frame = self.rbuf.split_to(n).freeze();
                    return parse_reply(&frame).map_err(|e| e.to_string());
                }
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
            if self.rbuf.capacity() - self.rbuf.len() < 1024 {
                self.rbuf.reserve(READ_BUF);
            }
            let read = match &mut self.conn {
                Conn::Plain(s) => s.read_buf(&mut self.rbuf).await,
                Conn::Tls(s) => s.read_buf(&mut self.rbuf).await,
            };
            match read {
                Ok(0) => return Err("connection closed by the server".into()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Writes and flushes the write buffer.
    async fn write(&mut self) -> Result<(), String> {
        let out = &self.wbuf[..];
        let r = match &mut self.conn {
            Conn::Plain(s) => match s.write_all(out).await {
                Ok(()) => s.flush().await,
                Err(e) => Err(e),
            },
            Conn::Tls(s) => match s.write_all(out).await {
                Ok(()) => s.flush().await,
                Err(e) => Err(e),
            },
        };
        r.map_err(|e| e.to_string())
    }
}

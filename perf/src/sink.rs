//! The sink: a minimal RESP "null server" for measuring the harness itself, not a Redis.
//!
//! Against one redis-server, a pipelined client soon meets the server's ceiling (one core
//! busy executing commands), so it cannot show how fast the *client* could go. The sink
//! answers every command it receives with the same bulk string (`$3\r\nxxx\r\n` by
//! default) and does nothing else, so it costs far less CPU per request than redis-server
//! and the client becomes the bottleneck.
//!
//! Built to be cheap per request, on one thread (a current-thread tokio runtime, so it uses
//! at most one core):
//!
//! - a [`Scanner`] only *counts* complete commands (RESP arrays `*N\r\n$len\r\n...\r\n` and
//!   inline commands ending in `\n`): no frame is built, no byte is copied, and its state is
//!   kept across reads, so a command split across reads is neither lost nor rescanned;
//! - one 64 KiB read buffer per connection, and for each read one write of all its replies,
//!   taken from a buffer of repeated replies prepared once at start;
//! - a malformed command gets `-ERR Protocol error\r\n` and the connection is closed.
//!
//! The sink listens on loopback addresses only and stops after its duration or when its
//! [`Control`] is stopped.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{check_loopback, Control, Error};

/// Bytes read per read system call.
pub const READ_BUF: usize = 64 * 1024;
/// The largest reply the sink sends (`--reply-size`).
pub const MAX_REPLY_SIZE: usize = 1 << 20;
/// What a malformed command gets before the connection is closed.
pub const PROTOCOL_ERROR: &[u8] = b"-ERR Protocol error\r\n";
/// The most elements of a command array (as Redis: `INT_MAX`).
const MAX_ARGS: u64 = i32::MAX as u64;
/// The longest bulk string of a command (Redis's default `proto-max-bulk-len`, 512 MiB).
const MAX_BULK: u64 = 512 << 20;
/// Replies prepared ahead, at least: the reply buffer holds about this many bytes.
const REPLY_BUF: usize = 64 * 1024;

/// How the sink runs.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// Bytes of the bulk string sent as every reply (0 to [`MAX_REPLY_SIZE`]).
    pub reply_size: usize,
    /// Stop after this long.
    pub duration: Duration,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            reply_size: 3,
            duration: Duration::from_secs(600),
        }
    }
}

impl SinkConfig {
    /// Checks the reply size.
    pub fn validate(&self) -> Result<(), Error> {
        if self.reply_size > MAX_REPLY_SIZE {
            return Err(Error::Config(format!(
                "--reply-size {}: at most {MAX_REPLY_SIZE} bytes",
                self.reply_size
            )));
        }
        Ok(())
    }

    /// The reply to every command: a bulk string of `reply_size` bytes `x`.
    pub fn reply(&self) -> Vec<u8> {
        let mut r = format!("${}\r\n", self.reply_size).into_bytes();
        r.resize(r.len() + self.reply_size, b'x');
        r.extend_from_slice(b"\r\n");
        r
    }
}

/// What the sink served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Connections accepted.
    pub connections: u64,
    /// Commands answered.
    pub commands: u64,
    /// Connections closed on a protocol error.
    pub protocol_errors: u64,
}

/// What one [`Scanner::feed`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scan {
    /// Commands completed by these bytes (each needs one reply).
    pub commands: u64,
    /// The bytes are not RESP: after `commands` complete commands a malformed one began.
    pub error: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a command.
    Start,
    /// In an inline command (a line); `content`: a byte other than blanks seen.
    Inline { content: bool },
    /// After `*`: the element count (`neg`: a leading `-`, `digits` read so far).
    ArrayLen { n: u64, digits: u32, neg: bool },
    /// The `\r` after the element count seen; `\n` expected.
    ArrayLf { n: u64, neg: bool },
    /// `$` expected (an element of the array).
    Dollar,
    /// After `$`: the bulk length.
    BulkLen { n: u64, digits: u32 },
    /// The `\r` after the bulk length seen; `\n` expected.
    BulkLf { n: u64 },
    /// Inside a bulk string, `left` bytes to go.
    Data { left: u64 },
    /// The `\r` after a bulk string expected.
    DataCr,
    /// The `\n` after a bulk string expected.
    DataLf,
    /// A protocol error was found: nothing more is read.
    Error,
}

/// Counts complete RESP commands in a byte stream fed in pieces of any size, without
/// building frames or keeping bytes: the state between two pieces is a few integers.
#[derive(Debug, Clone)]
pub struct Scanner {
    state: State,
    /// Elements of the current array still to come.
    args_left: u64,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    /// At the start of a stream.
    pub fn new() -> Self {
        Self {
            state: State::Start,
            args_left: 0,
        }
    }

    /// Whether a protocol error was found (every later feed finds no command).
    pub fn failed(&self) -> bool {
        self.state == State::Error
    }

    /// Scans the next bytes of the stream; counts the commands they complete. Empty
    /// commands (`*0\r\n`, `*-1\r\n`, blank lines) complete nothing, as in Redis.
    pub fn feed(&mut self, buf: &[u8]) -> Scan {
        let mut commands = 0u64;
        let mut i = 0usize;
        let len = buf.len();
        let mut state = self.state;
        let fail = |s: &mut Self, commands: u64| {
            s.state = State::Error;
            Scan {
                commands,
                error: true,
            }
        };
        while i < len {
            match state {
                State::Start => {
                    if buf[i] == b'*' {
                        i += 1;
                        state = State::ArrayLen {
                            n: 0,
                            digits: 0,
                            neg: false,
                        };
                    } else {
                        state = State::Inline { content: false };
                    }
                }
                State::Inline { content } => {
                    let rest = &buf[i..];
                    let (line, end) = match rest.iter().position(|&b| b == b'\n') {
                        Some(p) => (&rest[..p], Some(p)),
                        None => (rest, None),
                    };
                    let content =
                        content || line.iter().any(|&b| !matches!(b, b' ' | b'\t' | b'\r'));
                    match end {
                        Some(p) => {
                            commands += u64::from(content);
                            i += p + 1;
                            state = State::Start;
                        }
                        None => {
                            i = len;
                            state = State::Inline { content };
                        }
                    }
                }
                State::ArrayLen {
                    mut n,
                    mut digits,
                    mut neg,
                } => {
                    while i < len {
                        let b = buf[i];
                        match b {
                            b'0'..=b'9' => {
                                n = n * 10 + u64::from(b - b'0');
                                digits += 1;
                                if n > MAX_ARGS {
                                    return fail(self, commands);
                                }
                            }
                            b'-' if digits == 0 && !neg => neg = true,
                            b'\r' if digits > 0 => break,
                            _ => return fail(self, commands),
                        }
                        i += 1;
                    }
                    if i < len {
                        i += 1; // the '\r'
                        state = State::ArrayLf { n, neg };
                    } else {
                        state = State::ArrayLen { n, digits, neg };
                    }
                }
                State::ArrayLf { n, neg } => {
                    if buf[i] != b'\n' {
                        return fail(self, commands);
                    }
                    i += 1;
                    if neg || n == 0 {
                        state = State::Start;
                    } else {
                        self.args_left = n;
                        state = State::Dollar;
                    }
                }
                State::Dollar => {
                    if buf[i] != b'$' {
                        return fail(self, commands);
                    }
                    i += 1;
                    state = State::BulkLen { n: 0, digits: 0 };
                }
                State::BulkLen { mut n, mut digits } => {
                    while i < len {
                        let b = buf[i];
                        match b {
                            b'0'..=b'9' => {
                                n = n * 10 + u64::from(b - b'0');
                                digits += 1;
                                if n > MAX_BULK {
                                    return fail(self, commands);
                                }
                            }
                            b'\r' if digits > 0 => break,
                            _ => return fail(self, commands),
                        }
                        i += 1;
                    }
                    if i < len {
                        i += 1;
                        state = State::BulkLf { n };
                    } else {
                        state = State::BulkLen { n, digits };
                    }
                }
                State::BulkLf { n } => {
                    if buf[i] != b'\n' {
                        return fail(self, commands);
                    }
                    i += 1;
                    state = State::Data { left: n };
                }
                State::Data { left } => {
                    let take = left.min((len - i) as u64);
                    i += take as usize;
                    state = if take == left {
                        State::DataCr
                    } else {
                        State::Data { left: left - take }
                    };
                }
                State::DataCr => {
                    if buf[i] != b'\r' {
                        return fail(self, commands);
                    }
                    i += 1;
                    state = State::DataLf;
                }
                State::DataLf => {
                    if buf[i] != b'\n' {
                        return fail(self, commands);
                    }
                    i += 1;
                    self.args_left -= 1;
                    if self.args_left == 0 {
                        commands += 1;
                        state = State::Start;
                    } else {
                        state = State::Dollar;
                    }
                }
                State::Error => {
                    return Scan {
                        commands,
                        error: true,
                    }
                }
            }
        }
        self.state = state;
        Scan {
            commands,
            error: state == State::Error,
        }
    }
}

/// Counters shared by the connections of the (single-threaded) sink.
#[derive(Default)]
struct Counters {
    connections: Cell<u64>,
    commands: Cell<u64>,
    protocol_errors: Cell<u64>,
}

/// Serves `listener` (which must be bound to a loopback address) until `cfg.duration` has
/// passed or `ctl` is stopped, on the calling thread; then closes every connection and
/// returns what was served.
pub fn run_sink(
    listener: std::net::TcpListener,
    cfg: &SinkConfig,
    ctl: &Control,
) -> Result<SinkStats, Error> {
    cfg.validate()?;
    let addr: SocketAddr = listener.local_addr()?;
    check_loopback(addr)?;
    listener.set_nonblocking(true)?;
    let one = cfg.reply();
    let copies = (REPLY_BUF / one.len()).max(1);
    let replies: Rc<[u8]> = one.repeat(copies).into();
    let one_len = one.len();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let counters = Rc::new(Counters::default());
    let local = tokio::task::LocalSet::new();
    let res = local.block_on(&rt, {
        let counters = Rc::clone(&counters);
        async move {
            let l = tokio::net::TcpListener::from_std(listener)?;
            let deadline = tokio::time::Instant::now() + cfg.duration;
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    r = l.accept() => match r {
                        Ok((s, _)) => {
                            counters.connections.set(counters.connections.get() + 1);
                            let replies = Rc::clone(&replies);
                            let counters = Rc::clone(&counters);
                            tokio::task::spawn_local(async move {
                                serve(s, &replies, one_len, &counters).await;
                            });
                        }
                        // Out of file descriptors and the like: wait a little, go on.
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    },
                    _ = tick.tick() => {
                        if ctl.stopped() || tokio::time::Instant::now() >= deadline {
                            break;
                        }
                    }
                }
            }
            Ok::<(), Error>(())
        }
    });
    // Dropping the tasks closes their connections.
    drop(local);
    drop(rt);
    res?;
    Ok(SinkStats {
        connections: counters.connections.get(),
        commands: counters.commands.get(),
        protocol_errors: counters.protocol_errors.get(),
    })
}

/// One connection: read, count, answer, until EOF, an I/O error or a protocol error.
async fn serve(mut s: TcpStream, replies: &[u8], one: usize, counters: &Counters) {
    let _ = s.set_nodelay(true);
    let mut buf = vec![0u8; READ_BUF];
    let mut scanner = Scanner::new();
    let per_write = (replies.len() / one) as u64;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let scan = scanner.feed(&buf[..n]);
        let mut left = scan.commands;
        counters.commands.set(counters.commands.get() + left);
        while left > 0 {
            let k = left.min(per_write);
            if s.write_all(&replies[..k as usize * one]).await.is_err() {
                return;
            }
            left -= k;
        }
        if scan.error {
            counters
                .protocol_errors
                .set(counters.protocol_errors.get() + 1);
            let _ = s.write_all(PROTOCOL_ERROR).await;
            let _ = s.shutdown().await;
            // Read what the client still sends (briefly) so that closing does not reset
            // the connection before the client has read the error.
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
            return;
        }
    }
}

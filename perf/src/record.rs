//! Recording live traffic: `MONITOR` on a Redis server (loopback only), for a bounded time
//! and number of commands, into a [`Trace`].
//!
//! This is what `redis-cli MONITOR > capture.txt` does, without the text round trip: each
//! `MONITOR` line is parsed as it arrives ([`crate::trace::parse_monitor_line`]) and the
//! result is written in the respway trace format. Note that `MONITOR` itself costs the
//! server throughput while it runs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use respway_filters::resp::{parse_reply, reply_len, Frame};

use crate::closed::reply_limits;
use crate::trace::{parse_monitor_line, Trace, TraceBuilder};
use crate::{Control, Error};

/// What to record.
#[derive(Debug, Clone)]
pub struct RecordConfig {
    /// The Redis server to watch.
    pub addr: SocketAddr,
    /// Stop after this long.
    pub duration: Duration,
    /// Stop after this many commands.
    pub max_commands: usize,
    /// Keep commands run by Lua scripts.
    pub include_lua: bool,
}

/// Records until the duration or command count is reached (or `ctl` is stopped).
pub fn record(cfg: &RecordConfig, ctl: &Control) -> Result<Trace, Error> {
    crate::check_loopback(cfg.addr)?;
    let mut s = TcpStream::connect_timeout(&cfg.addr, Duration::from_secs(5))
        .map_err(|e| Error::Run(format!("could not connect to {}: {e}", cfg.addr)))?;
    s.write_all(b"*1\r\n$7\r\nMONITOR\r\n")?;
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    let limits = reply_limits();
    let deadline = Instant::now() + cfg.duration;
    let mut b = TraceBuilder::new(cfg.include_lua);
    let mut buf: Vec<u8> = vec![0; 64 * 1024];
    let mut len = 0;
    let mut first = true;
    while Instant::now() < deadline && b.len() < cfg.max_commands && !ctl.stopped() {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match s.read(&mut buf[len..]) {
            Ok(0) => {
                return Err(Error::Run(
                    "the server closed the MONITOR connection".into(),
                ))
            }
            Ok(k) => len += k,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e.into()),
        }
        let mut pos = 0;
        while let Some(rl) = reply_len(&buf[pos..len], &limits)
            .map_err(|e| Error::Run(format!("MONITOR stream: {e}")))?
        {
            let frame = parse_reply(&Bytes::copy_from_slice(&buf[pos..pos + rl]))
                .map_err(|e| Error::Run(format!("MONITOR stream: {e}")))?;
            pos += rl;
            match frame {
                Frame::Simple(line) if first && &line[..] == b"OK" => first = false,
                Frame::Simple(line) => match parse_monitor_line(&line) {
                    Ok(Some(m)) => {
                        if b.len() < cfg.max_commands {
                            b.push_monitor(m);
                        }
                    }
                    Ok(None) => b.skip("not a command line"),
                    Err(e) => b.skip(format!("malformed: {e}")),
                },
                Frame::Error(e) => {
                    return Err(Error::Run(format!(
                        "MONITOR refused: {}",
                        String::from_utf8_lossy(&e)
                    )))
                }
                _ => b.skip("unexpected reply type"),
            }
        }
        buf.copy_within(pos..len, 0);
        len -= pos;
    }
    Ok(b.finish())
}

//! The one raw RESP test client, and the parser it reads replies with (written for the
//! tests, independent of respway's own codec).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A RESP value as the test client reads it (RESP2 and the RESP3 types).
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    /// `+...`
    Simple(String),
    /// `-...`
    Error(String),
    /// `:n`
    Int(i64),
    /// `$n` (None = `$-1` or RESP3 `_`)
    Bulk(Option<Vec<u8>>),
    /// `*n` (None = `*-1`)
    Array(Option<Vec<Resp>>),
    /// RESP3 `%`, `~`, `>`, `,`, `#`, `(`, `=` kept as (type byte, parts).
    Other(u8, Vec<Resp>),
}

impl Resp {
    /// A bulk string.
    pub fn bulk(b: impl AsRef<[u8]>) -> Resp {
        Resp::Bulk(Some(b.as_ref().to_vec()))
    }
    /// The bulk or simple string as text (panics on other types).
    pub fn text(&self) -> String {
        match self {
            Resp::Simple(s) => s.clone(),
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }
    /// True for `-...`.
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
    /// The error text, if this is an error.
    pub fn error(&self) -> Option<&str> {
        match self {
            Resp::Error(e) => Some(e),
            _ => None,
        }
    }
}

/// Encodes one command as a RESP array of bulk strings.
pub fn encode_cmd(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Sends one command on a fresh connection (500 ms to connect, 5 s to answer) and returns the
/// text of the first read: a readiness probe, not a reply parser.
pub fn raw_command(addr: SocketAddr, args: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    let mut out = Vec::new();
    encode_cmd(&mut out, &a);
    s.write_all(&out)?;
    let mut buf = vec![0u8; 1 << 16];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The one raw RESP test client: a blocking socket, pipelines written as given, replies parsed
/// one at a time, or raw bytes read as they come. Every read has a timeout, so a test never
/// hangs on a missing reply.
pub struct RespConn {
    pub stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
}

/// The read timeout [`RespConn::connect`] sets.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

impl RespConn {
    /// Connects (2 s at most) with TCP_NODELAY and a 10 s read timeout; panics on failure.
    pub fn connect(addr: SocketAddr) -> RespConn {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("timeout");
        let _ = stream.set_nodelay(true);
        RespConn {
            stream,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Writes raw bytes.
    pub fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Writes one command.
    pub fn send(&mut self, args: &[&str]) {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send_bytes(&a);
    }

    /// Writes one command of binary arguments.
    pub fn send_bytes(&mut self, args: &[&[u8]]) {
        let mut out = Vec::new();
        encode_cmd(&mut out, args);
        self.write_raw(&out).expect("write");
    }

    /// Writes every command in one write.
    pub fn send_pipeline<S: AsRef<str>>(&mut self, cmds: &[Vec<S>]) {
        let mut out = Vec::new();
        for c in cmds {
            let a: Vec<&[u8]> = c.iter().map(|s| s.as_ref().as_bytes()).collect();
            encode_cmd(&mut out, &a);
        }
        self.write_raw(&out).expect("write");
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&str]) -> Resp {
        self.send(args);
        self.read().expect("reply")
    }

    /// Sends one command of binary arguments and reads its reply.
    pub fn call_bytes(&mut self, args: &[&[u8]]) -> Resp {
        self.send_bytes(args);
        self.read().expect("reply")
    }

    /// `GET key`: the value, `None` for nil; panics on any other reply.
    pub fn get(&mut self, key: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        let key = key.as_ref();
        match self.call_bytes(&[b"GET", key]) {
            Resp::Bulk(b) => b,
            other => panic!("GET {:?}: {other:?}", String::from_utf8_lossy(key)),
        }
    }

    /// Reads one reply (an error on EOF, timeout or a malformed reply).
    pub fn read(&mut self) -> std::io::Result<Resp> {
        loop {
            if let Some((v, n)) = parse_resp(&self.buf[self.pos..])? {
                self.pos += n;
                self.compact();
                return Ok(v);
            }
            if self.fill()? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ));
            }
        }
    }

    /// Bytes read from the socket and not consumed by a read yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Raw bytes as they come: what is buffered, else the next read of the socket (empty at
    /// EOF).
    pub fn read_raw(&mut self) -> std::io::Result<Vec<u8>> {
        if self.buffered().is_empty() {
            self.fill()?;
        }
        Ok(self.take_buffered())
    }

    /// Exactly `n` raw bytes (an error on EOF or timeout before that).
    pub fn read_exact_raw(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        let have = self.buffered().len().min(n);
        let mut out = self.buffered()[..have].to_vec();
        self.pos += have;
        self.compact();
        if out.len() < n {
            let at = out.len();
            out.resize(n, 0);
            self.stream.read_exact(&mut out[at..])?;
        }
        Ok(out)
    }

    /// Everything the peer writes until it closes the connection, read for at most `limit`
    /// (timeouts of single reads do not end it): the bytes, and how it ended — `Ok` at EOF,
    /// else the error (`TimedOut` when `limit` passed, a reset, ...). The socket's read
    /// timeout is restored afterwards.
    pub fn read_until_closed(&mut self, limit: Duration) -> (Vec<u8>, std::io::Result<()>) {
        let deadline = Instant::now() + limit;
        let timeout = self.stream.read_timeout().ok().flatten();
        let mut out = self.take_buffered();
        let mut chunk = [0u8; 16 * 1024];
        let end = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("not closed within {limit:?}"),
                ));
            }
            if let Err(e) = self.stream.set_read_timeout(Some(left)) {
                break Err(e);
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => break Ok(()),
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => break Err(e),
            }
        };
        let _ = self.stream.set_read_timeout(timeout);
        (out, end)
    }

    /// Reads the socket once into the buffer; the number of bytes read (0 at EOF).
    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 64 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    fn take_buffered(&mut self) -> Vec<u8> {
        let out = self.buf[self.pos..].to_vec();
        self.buf.clear();
        self.pos = 0;
        out
    }

    fn compact(&mut self) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }
}

/// Parses one RESP value from the start of `b`: `Ok(None)` when incomplete.
pub fn parse_resp(b: &[u8]) -> std::io::Result<Option<(Resp, usize)>> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if eol == 0 {
        return Err(bad("empty line"));
    }
    let line = std::str::from_utf8(&b[1..eol]).map_err(|_| bad("not utf8"))?;
    let head = eol + 2;
    let int = || line.parse::<i64>().map_err(|_| bad("bad length"));
    let agg = |n: i64, mult: i64, t: u8| -> std::io::Result<Option<(Resp, usize)>> {
        let mut at = head;
        let mut items = Vec::new();
        for _ in 0..n * mult {
            match parse_resp(&b[at..])? {
                Some((v, k)) => {
                    items.push(v);
                    at += k;
                }
                None => return Ok(None),
            }
        }
        Ok(Some((
            if t == b'*' {
                Resp::Array(Some(items))
            } else {
                Resp::Other(t, items)
            },
            at,
        )))
    };
    match b[0] {
        b'+' => Ok(Some((Resp::Simple(line.to_string()), head))),
        b'-' => Ok(Some((Resp::Error(line.to_string()), head))),
        b':' => Ok(Some((Resp::Int(int()?), head))),
        b'_' => Ok(Some((Resp::Bulk(None), head))),
        b',' | b'#' | b'(' => Ok(Some((
            Resp::Other(b[0], vec![Resp::Simple(line.to_string())]),
            head,
        ))),
        b'$' | b'=' | b'!' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Resp::Bulk(None), head)));
            }
            let n = n as usize;
            if b.len() < head + n + 2 {
                return Ok(None);
            }
            let data = b[head..head + n].to_vec();
            Ok(Some((
                match b[0] {
                    b'$' => Resp::Bulk(Some(data)),
                    t => Resp::Other(t, vec![Resp::Bulk(Some(data))]),
                },
                head + n + 2,
            )))
        }
        b'*' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Resp::Array(None), head)));
            }
            agg(n, 1, b'*')
        }
        b'~' | b'>' => agg(int()?, 1, b[0]),
        b'%' | b'|' => agg(int()?, 2, b[0]),
        _ => Err(bad("unknown type byte")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_type_and_waits_for_the_rest() {
        let mut out = Vec::new();
        encode_cmd(&mut out, &[b"SET", b"k", b"v\r\n"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n");
        let (v, n) = parse_resp(&out).unwrap().unwrap();
        assert_eq!(n, out.len());
        assert_eq!(
            v,
            Resp::Array(Some(vec![
                Resp::bulk("SET"),
                Resp::bulk("k"),
                Resp::bulk("v\r\n")
            ]))
        );
        for cut in 0..out.len() {
            assert!(parse_resp(&out[..cut]).unwrap().is_none(), "cut {cut}");
        }
        let cases: [(&[u8], Resp); 7] = [
            (b"+OK\r\n", Resp::Simple("OK".into())),
            (b"-ERR x\r\n", Resp::Error("ERR x".into())),
            (b":-7\r\n", Resp::Int(-7)),
            (b"$-1\r\n", Resp::Bulk(None)),
            (b"_\r\n", Resp::Bulk(None)),
            (b"*-1\r\n", Resp::Array(None)),
            (
                b"%1\r\n+a\r\n:1\r\n",
                Resp::Other(b'%', vec![Resp::Simple("a".into()), Resp::Int(1)]),
            ),
        ];
        for (wire, want) in cases {
            assert_eq!(parse_resp(wire).unwrap(), Some((want, wire.len())));
        }
        assert!(parse_resp(b"?\r\n").is_err());
        assert!(parse_resp(b"\r\n").is_err());
    }

    #[test]
    fn raw_and_parsed_reads_share_one_buffer() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"+OK\r\n:1\r\nrawbytes").unwrap();
            let mut b = [0u8; 64];
            let n = s.read(&mut b).unwrap();
            s.write_all(&b[..n]).unwrap();
            // then close
        });
        let mut c = RespConn::connect(addr);
        assert_eq!(c.read().unwrap(), Resp::Simple("OK".into()));
        // The rest may or may not have arrived with the first reply: either way it is read
        // in order.
        assert_eq!(c.read().unwrap(), Resp::Int(1));
        assert_eq!(c.read_exact_raw(3).unwrap(), b"raw");
        assert_eq!(c.read_exact_raw(5).unwrap(), b"bytes");
        assert!(c.buffered().is_empty());
        c.write_raw(b"echo").unwrap();
        let (back, end) = c.read_until_closed(Duration::from_secs(5));
        assert_eq!(back, b"echo");
        assert!(end.is_ok(), "{end:?}");
        assert!(c.read_raw().unwrap().is_empty(), "EOF");
        server.join().unwrap();
    }
}

//! Reply frames and RESP writers.

use bytes::{BufMut, Bytes, BytesMut};

/// A RESP2 or RESP3 reply, as the proxy builds or inspects it (merging `MGET`, summing
/// `DEL`, proxy-generated replies). Parsed frames hold zero-copy slices of the read buffer,
/// and encode back to exactly the bytes they were parsed from (RESP3 doubles and big numbers
/// keep their text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `+<text>\r\n` (text without CR/LF).
    Simple(Bytes),
    /// `-<text>\r\n` (text without the `-` and without CR/LF, e.g. `ERR unknown command`).
    Error(Bytes),
    /// `:<n>\r\n`.
    Integer(i64),
    /// `$<len>\r\n<bytes>\r\n`, binary safe.
    Bulk(Bytes),
    /// `$-1\r\n`, the null bulk string.
    Null,
    /// `*<n>\r\n` followed by `n` frames.
    Array(Vec<Frame>),
    /// `*-1\r\n`, the null array.
    NullArray,
    /// RESP3 `_\r\n`, the null.
    Nil,
    /// RESP3 `#t\r\n` / `#f\r\n`.
    Boolean(bool),
    /// RESP3 `,<text>\r\n` (the text as sent: `1.5`, `inf`, `-nan`).
    Double(Bytes),
    /// RESP3 `(<digits>\r\n`.
    BigNumber(Bytes),
    /// RESP3 `!<len>\r\n<msg>\r\n`, an error with a binary-safe message.
    BlobError(Bytes),
    /// RESP3 `=<len>\r\n<fmt>:<text>\r\n`; holds `<fmt>:<text>` (e.g. `txt:...`).
    Verbatim(Bytes),
    /// RESP3 `%<n>\r\n` followed by `n` key/value pairs.
    Map(Vec<(Frame, Frame)>),
    /// RESP3 `~<n>\r\n` followed by `n` frames.
    Set(Vec<Frame>),
    /// RESP3 `><n>\r\n` followed by `n` frames (out-of-band data such as pub/sub messages).
    Push(Vec<Frame>),
}

impl Frame {
    /// `+OK`.
    pub fn ok() -> Frame {
        Frame::Simple(Bytes::from_static(b"OK"))
    }

    /// `+PONG`.
    pub fn pong() -> Frame {
        Frame::Simple(Bytes::from_static(b"PONG"))
    }

    /// A simple string; CR and LF in `s` become spaces.
    pub fn simple(s: &str) -> Frame {
        Frame::Simple(sanitize_line(s))
    }

    /// An error reply. `msg` comes without the `-` and without CRLF, usually starting with an
    /// error code: `Frame::error("ERR unknown command 'FOO'")`. CR and LF become spaces.
    pub fn error(msg: &str) -> Frame {
        Frame::Error(sanitize_line(msg))
    }

    /// An integer reply.
    pub fn integer(n: i64) -> Frame {
        Frame::Integer(n)
    }

    /// A bulk string reply.
    pub fn bulk(data: impl Into<Bytes>) -> Frame {
        Frame::Bulk(data.into())
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Frame::Error(_) | Frame::BlobError(_))
    }

    /// The null of a protocol version: `$-1` in RESP2, `_` in RESP3.
    pub fn null(resp3: bool) -> Frame {
        if resp3 {
            Frame::Nil
        } else {
            Frame::Null
        }
    }

    /// A map: a RESP3 map, or in RESP2 the flat array of keys and values Redis sends.
    pub fn map(resp3: bool, pairs: Vec<(Frame, Frame)>) -> Frame {
        if resp3 {
            Frame::Map(pairs)
        } else {
            Frame::Array(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect())
        }
    }

    /// A set: a RESP3 set, or in RESP2 an array.
    pub fn set(resp3: bool, items: Vec<Frame>) -> Frame {
        if resp3 {
            Frame::Set(items)
        } else {
            Frame::Array(items)
        }
    }

    /// Text for a human (`INFO`, `CLIENT LIST`): a RESP3 verbatim string (`txt:`), or in RESP2
    /// a bulk string, as Redis sends it.
    pub fn text(resp3: bool, text: &[u8]) -> Frame {
        if resp3 {
            let mut v = Vec::with_capacity(text.len() + 4);
            v.extend_from_slice(b"txt:");
            v.extend_from_slice(text);
            Frame::Verbatim(Bytes::from(v))
        } else {
            Frame::Bulk(Bytes::copy_from_slice(text))
        }
    }

    /// Appends the RESP encoding of this frame to `out`. CR and LF inside `Simple` / `Error`
    /// text are written as spaces so a frame can never break the stream's framing.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Frame::Simple(s) => write_line(out, b'+', s),
            Frame::Error(s) => write_line(out, b'-', s),
            Frame::Integer(n) => write_integer(out, b':', *n),
            Frame::Bulk(b) => write_bulk(out, b),
            Frame::Null => out.extend_from_slice(b"$-1\r\n"),
            Frame::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Frame::Array(items) => {
                write_array_header(out, items.len());
                for item in items {
                    item.encode(out);
                }
            }
            Frame::Nil => out.extend_from_slice(b"_\r\n"),
            Frame::Boolean(b) => out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
            Frame::Double(t) => write_line(out, b',', t),
            Frame::BigNumber(t) => write_line(out, b'(', t),
            Frame::BlobError(b) => write_blob(out, b'!', b),
            Frame::Verbatim(b) => write_blob(out, b'=', b),
            Frame::Map(pairs) => {
                write_number(out, b'%', false, pairs.len() as u64);
                for (k, v) in pairs {
                    k.encode(out);
                    v.encode(out);
                }
            }
            Frame::Set(items) | Frame::Push(items) => {
                let prefix = if matches!(self, Frame::Set(_)) {
                    b'~'
                } else {
                    b'>'
                };
                write_number(out, prefix, false, items.len() as u64);
                for item in items {
                    item.encode(out);
                }
            }
        }
    }

    /// The RESP encoding of this frame as one buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.freeze()
    }
}

fn sanitize_line(s: &str) -> Bytes {
    if s.bytes().any(|b| b == b'\r' || b == b'\n') {
        Bytes::from(s.replace(['\r', '\n'], " "))
    } else {
        Bytes::copy_from_slice(s.as_bytes())
    }
}

fn write_line(out: &mut BytesMut, prefix: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.put_u8(prefix);
    if text.iter().any(|&b| b == b'\r' || b == b'\n') {
        out.extend(
            text.iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
    } else {
        out.extend_from_slice(text);
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes `<prefix><n>\r\n` (e.g. `write_integer(out, b':', 42)` gives `:42\r\n`) without
/// allocating anything but `out`'s growth.
pub fn write_integer(out: &mut BytesMut, prefix: u8, n: i64) {
    write_number(out, prefix, n < 0, n.unsigned_abs());
}

/// Writes a bulk header `$<len>\r\n`; follow it with `len` bytes and `\r\n`.
pub fn write_bulk_header(out: &mut BytesMut, len: usize) {
    write_number(out, b'$', false, len as u64);
}

/// Writes an array header `*<len>\r\n`; follow it with `len` frames.
pub fn write_array_header(out: &mut BytesMut, len: usize) {
    write_number(out, b'*', false, len as u64);
}

fn write_blob(out: &mut BytesMut, prefix: u8, data: &[u8]) {
    out.reserve(data.len() + 16);
    write_number(out, prefix, false, data.len() as u64);
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Writes a whole bulk string `$<len>\r\n<data>\r\n`.
pub fn write_bulk(out: &mut BytesMut, data: &[u8]) {
    out.reserve(data.len() + 16);
    write_bulk_header(out, data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Writes a simple string `+<text>\r\n`; CR and LF in `text` are written as spaces.
pub fn write_simple(out: &mut BytesMut, text: &[u8]) {
    write_line(out, b'+', text);
}

/// Writes an error `-<msg>\r\n` (`msg` without the `-`, e.g. `ERR no such key`); CR and LF in
/// `msg` are written as spaces.
pub fn write_error(out: &mut BytesMut, msg: &[u8]) {
    write_line(out, b'-', msg);
}

/// Appends `args` as a RESP multibulk command (`*N\r\n$len\r\narg\r\n...`) to `out`,
/// reserving the exact size first.
pub fn encode_command<B: AsRef<[u8]>>(args: &[B], out: &mut BytesMut) {
    let mut total = 1 + decimal_len(args.len() as u64) + 2;
    for a in args {
        let n = a.as_ref().len();
        total += 1 + decimal_len(n as u64) + 2 + n + 2;
    }
    out.reserve(total);
    write_array_header(out, args.len());
    for a in args {
        let a = a.as_ref();
        write_bulk_header(out, a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn decimal_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

fn write_number(out: &mut BytesMut, prefix: u8, negative: bool, mut v: u64) {
    // prefix + '-' + 20 digits + CRLF
    let mut tmp = [0u8; 24];
    let mut i = tmp.len() - 2;
    tmp[i] = b'\r';
    tmp[i + 1] = b'\n';
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if negative {
        i -= 1;
        tmp[i] = b'-';
    }
    i -= 1;
    tmp[i] = prefix;
    out.extend_from_slice(&tmp[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: &Frame) -> Vec<u8> {
        f.to_bytes().to_vec()
    }

    #[test]
    fn resp_frame_encodings() {
        assert_eq!(enc(&Frame::ok()), b"+OK\r\n");
        assert_eq!(enc(&Frame::pong()), b"+PONG\r\n");
        assert_eq!(enc(&Frame::simple("QUEUED")), b"+QUEUED\r\n");
        assert_eq!(enc(&Frame::integer(0)), b":0\r\n");
        assert_eq!(enc(&Frame::integer(-42)), b":-42\r\n");
        assert_eq!(enc(&Frame::integer(i64::MAX)), b":9223372036854775807\r\n");
        assert_eq!(enc(&Frame::integer(i64::MIN)), b":-9223372036854775808\r\n");
        assert_eq!(enc(&Frame::bulk(&b"a\r\nb"[..])), b"$4\r\na\r\nb\r\n");
        assert_eq!(enc(&Frame::bulk(Bytes::new())), b"$0\r\n\r\n");
        assert_eq!(enc(&Frame::Null), b"$-1\r\n");
        assert_eq!(enc(&Frame::NullArray), b"*-1\r\n");
        assert_eq!(enc(&Frame::Array(vec![])), b"*0\r\n");
        assert_eq!(
            enc(&Frame::Array(vec![
                Frame::integer(1),
                Frame::Array(vec![Frame::Null, Frame::bulk("x")]),
                Frame::error("ERR x"),
            ])),
            b"*3\r\n:1\r\n*2\r\n$-1\r\n$1\r\nx\r\n-ERR x\r\n"
        );
    }

    #[test]
    fn resp_frame_error_strips_crlf() {
        let f = Frame::error("ERR bad\r\nthing\n");
        assert_eq!(f, Frame::Error(Bytes::from_static(b"ERR bad  thing ")));
        assert!(f.is_error());
        assert_eq!(enc(&f), b"-ERR bad  thing \r\n");
        // hand-built frames are sanitized on encode too
        assert_eq!(
            enc(&Frame::Simple(Bytes::from_static(b"a\r\nb"))),
            b"+a  b\r\n"
        );
        assert!(!Frame::ok().is_error());
    }

    #[test]
    fn resp_write_helpers() {
        let mut out = BytesMut::new();
        write_integer(&mut out, b':', 7);
        write_bulk_header(&mut out, 1234567890);
        write_array_header(&mut out, 0);
        write_bulk(&mut out, b"hi");
        write_simple(&mut out, b"OK");
        write_error(&mut out, b"ERR e\r");
        assert_eq!(
            &out[..],
            b":7\r\n$1234567890\r\n*0\r\n$2\r\nhi\r\n+OK\r\n-ERR e \r\n"
        );
    }

    #[test]
    fn resp_encode_command_exact_size() {
        let mut out = BytesMut::new();
        encode_command(&["SET", "k", ""], &mut out);
        assert_eq!(&out[..], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
        let mut out = BytesMut::new();
        let args: Vec<Vec<u8>> = vec![vec![b'x'; 12345], b"\r\n".to_vec()];
        encode_command(&args, &mut out);
        let expect = out.len();
        assert_eq!(expect, 4 + 8 + 12345 + 2 + 4 + 2 + 2);
        let empty: [&[u8]; 0] = [];
        let mut out = BytesMut::new();
        encode_command(&empty, &mut out);
        assert_eq!(&out[..], b"*0\r\n");
        assert_eq!(decimal_len(0), 1);
        assert_eq!(decimal_len(9), 1);
        assert_eq!(decimal_len(10), 2);
        assert_eq!(decimal_len(u64::MAX), 20);
    }
}

//! Reply framing (where does the reply end?) and reply parsing.

use bytes::Bytes;

use super::{find_line_end, parse_i64, show_byte, Frame, LineEnd, ProtocolError, MAX_HEADER_LINE};
use crate::codec_limits::Limits;

/// Deepest nesting of arrays accepted in a reply (an array inside 63 others is fine, one
/// more level is `Protocol error: reply nested too deep`).
pub const MAX_REPLY_DEPTH: usize = 64;

/// Length in bytes of the complete RESP2 reply at the start of `buf` (types `+ - : $ *`),
/// or `Ok(None)` if it is not all there yet. Allocates nothing; bulk payloads are skipped by
/// their length, not scanned.
///
/// `limits.max_bulk_len` bounds bulk lengths and `+`/`-` line lengths,
/// `limits.max_multibulk_len` bounds array sizes (pass generous limits on upstream
/// connections: `KEYS` can legitimately return millions of elements). Arrays may nest
/// [`MAX_REPLY_DEPTH`] deep.
///
/// Each call starts from the beginning of `buf`; to cut huge or many-element replies that
/// arrive in many reads, keep a [`ReplyScanner`] per connection instead.
pub fn reply_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, ProtocolError> {
    // Most replies are not arrays: answer those without setting up a scanner's stack.
    let mut scanned = 0;
    match element(buf, 0, &mut scanned, limits)? {
        Step::Incomplete | Step::Short(_) => Ok(None),
        Step::Done(len) => Ok(Some(len)),
        Step::Open(..) => ReplyScanner::new().scan(buf, limits),
    }
}

/// The element count of the non-empty array (`*`) at the start of `buf`, and the offset of
/// its first element; `None` for anything else (another type, a null or empty array, a
/// header that is incomplete or invalid).
pub fn array_header(buf: &[u8]) -> Option<(usize, usize)> {
    if buf.first() != Some(&b'*') {
        return None;
    }
    match element(buf, 0, &mut 0, &Limits::REPLIES) {
        Ok(Step::Open(n, first)) => Some((n, first)),
        _ => None,
    }
}

/// What [`element`] found at a position.
enum Step {
    /// Not all there yet.
    Incomplete,
    /// A bulk string not all there yet, complete once the buffer is this long.
    Short(usize),
    /// A complete non-array element (or empty / null array) ending just before this offset.
    Done(usize),
    /// The header of an array of this many (> 0) elements, which start at this offset.
    Open(usize, usize),
}

/// Reads the element at `start`: a whole scalar, or the header of a non-empty array.
fn element(
    buf: &[u8],
    start: usize,
    scanned: &mut usize,
    limits: &Limits,
) -> Result<Step, ProtocolError> {
    let Some(&kind) = buf.get(start) else {
        return Ok(Step::Incomplete);
    };
    let (max_line, too_long) = match kind {
        b'+' | b'-' | b',' | b'(' => (limits.max_bulk_len, "too big reply line"),
        b':' | b'_' | b'#' => (MAX_HEADER_LINE, "too big integer string"),
        b'$' | b'!' | b'=' => (MAX_HEADER_LINE, "too big bulk count string"),
        b'*' | b'%' | b'~' | b'>' | b'|' => (MAX_HEADER_LINE, "too big mbulk count string"),
        other => {
            return Err(ProtocolError(format!(
                "invalid reply type byte '{}'",
                show_byte(other)
            )))
        }
    };
    let cr = match find_line_end(buf, start + 1, scanned, max_line, b'\r') {
        LineEnd::Found(i) => i,
        LineEnd::Incomplete => return Ok(Step::Incomplete),
        LineEnd::TooLong => return Err(ProtocolError::new(too_long)),
    };
    let Some(&lf) = buf.get(cr + 1) else {
        return Ok(Step::Incomplete);
    };
    let body = &buf[start + 1..cr];
    let next = cr + 2;
    if lf != b'\n' {
        return Err(ProtocolError::new(match kind {
            b':' => "invalid integer reply",
            b'$' | b'!' | b'=' => "invalid bulk length",
            b'*' | b'%' | b'~' | b'>' | b'|' => "invalid multibulk length",
            _ => "reply line not terminated by CRLF",
        }));
    }
    match kind {
        b'+' | b'-' | b',' | b'(' => Ok(Step::Done(next)),
        b'_' if body.is_empty() => Ok(Step::Done(next)),
        b'#' if body == b"t" || body == b"f" => Ok(Step::Done(next)),
        b'_' | b'#' => Err(ProtocolError::new("invalid RESP3 null or boolean")),
        b':' => {
            if parse_i64(body).is_none() {
                return Err(ProtocolError::new("invalid integer reply"));
            }
            Ok(Step::Done(next))
        }
        b'$' | b'!' | b'=' => match parse_i64(body) {
            Some(-1) if kind == b'$' => Ok(Step::Done(next)),
            Some(n) if n >= 0 && n as u64 <= limits.max_bulk_len as u64 => {
                let Some(end) = next
                    .checked_add(n as usize)
                    .filter(|e| e.checked_add(2).is_some())
                else {
                    return Err(ProtocolError::new("invalid bulk length"));
                };
                if buf.len() < end + 2 {
                    return Ok(Step::Short(end + 2));
                }
                if buf[end] != b'\r' || buf[end + 1] != b'\n' {
                    return Err(ProtocolError::new("bulk data not terminated by CRLF"));
                }
                Ok(Step::Done(end + 2))
            }
            _ => Err(ProtocolError::new("invalid bulk length")),
        },
        _ => match parse_i64(body) {
            Some(-1) if kind == b'*' => Ok(Step::Done(next)),
            Some(0) if kind != b'|' => Ok(Step::Done(next)),
            Some(n) if n > 0 && n as u64 <= limits.max_multibulk_len as u64 => {
                // A map holds n pairs; an attribute (n pairs) describes the element after it,
                // so it and that element are scanned as one aggregate of 2n + 1.
                let n = n as usize;
                Ok(Step::Open(
                    match kind {
                        b'%' => 2 * n,
                        b'|' => 2 * n + 1,
                        _ => n,
                    },
                    next,
                ))
            }
            _ => Err(ProtocolError::new("invalid multibulk length")),
        },
    }
}

/// Resumable [`reply_len`]: remembers how far it got in a partly received reply, so each
/// call costs only the new bytes' worth of headers. Between calls the buffer may only be
/// appended to; when [`scan`](Self::scan) returns `Some(len)` the scanner starts over, and
/// the caller removes those `len` bytes from the front of the buffer.
#[derive(Debug, Clone)]
pub struct ReplyScanner {
    /// Offset of the next element to read.
    pos: usize,
    /// Bytes after `pos` known to hold no CR.
    scanned: usize,
    /// Open arrays.
    depth: usize,
    /// Elements still to read in each open array.
    left: [usize; MAX_REPLY_DEPTH],
    /// When the last scan stopped inside a bulk string: the buffer length that completes it.
    short: Option<usize>,
}

impl Default for ReplyScanner {
    fn default() -> Self {
        ReplyScanner {
            pos: 0,
            scanned: 0,
            depth: 0,
            left: [0; MAX_REPLY_DEPTH],
            short: None,
        }
    }
}

impl ReplyScanner {
    /// A scanner at the start of a reply.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets progress (use when the buffer was replaced).
    pub fn reset(&mut self) {
        self.pos = 0;
        self.scanned = 0;
        self.depth = 0;
        self.short = None;
    }

    /// When the last [`scan`](Self::scan) stopped inside a bulk string whose length it read:
    /// the buffer length at which that string (with its CRLF) is complete. Lets the caller
    /// reserve the room for a large value in one go.
    pub fn bulk_end_hint(&self) -> Option<usize> {
        self.short
    }

    /// Same answer as [`reply_len`] on `buf`, resuming from the previous call's progress.
    pub fn scan(&mut self, buf: &[u8], limits: &Limits) -> Result<Option<usize>, ProtocolError> {
        if self.pos > buf.len() {
            self.reset();
        }
        self.short = None;
        loop {
            // Inside an array, most elements are short bulk strings: read those without the
            // general path's bounds and limit checks (same answer, several times faster).
            if self.depth > 0 {
                if let Some(next) = short_bulk(buf, self.pos, limits.max_bulk_len) {
                    self.pos = next;
                    self.scanned = 0;
                    if self.close_one() {
                        let len = self.pos;
                        self.reset();
                        return Ok(Some(len));
                    }
                    continue;
                }
            }
            let next = match element(buf, self.pos, &mut self.scanned, limits)? {
                Step::Incomplete => return Ok(None),
                Step::Short(end) => {
                    self.short = Some(end);
                    return Ok(None);
                }
                Step::Open(count, next) => {
                    if self.depth == MAX_REPLY_DEPTH {
                        return Err(ProtocolError::new("reply nested too deep"));
                    }
                    self.left[self.depth] = count;
                    self.depth += 1;
                    self.pos = next;
                    self.scanned = 0;
                    continue;
                }
                Step::Done(next) => next,
            };
            // One element complete: close every array it completes.
            self.pos = next;
            self.scanned = 0;
            if self.depth == 0 || self.close_one() {
                let len = self.pos;
                self.reset();
                return Ok(Some(len));
            }
        }
    }

    /// Counts one element of the innermost open array (`depth > 0`) and closes every array
    /// that completes; true when the outermost one did (the reply is complete).
    fn close_one(&mut self) -> bool {
        while self.depth > 0 {
            let left = &mut self.left[self.depth - 1];
            *left -= 1;
            if *left > 0 {
                return false;
            }
            self.depth -= 1;
        }
        true
    }
}

/// The end of the complete bulk string `$<n>\r\n<n bytes>\r\n` at `pos`, if that is what is
/// there, with `n` of 1 to 18 digits without a leading zero (or `0`) and at most `max`; `None`
/// for anything else — another type, an incomplete or malformed string — which the general
/// path ([`element`]) then reads and reports exactly.
#[inline]
fn short_bulk(buf: &[u8], pos: usize, max: usize) -> Option<usize> {
    let head = buf.get(pos..)?;
    if head.first() != Some(&b'$') {
        return None;
    }
    let mut n: usize = 0;
    let mut i = 1;
    loop {
        let d = *head.get(i)?;
        if d == b'\r' {
            break;
        }
        if !d.is_ascii_digit() || i > 18 || (i == 2 && head[1] == b'0') {
            return None;
        }
        n = n * 10 + usize::from(d - b'0');
        i += 1;
    }
    if i == 1 || head.get(i + 1) != Some(&b'\n') || n > max {
        return None;
    }
    let end = (i + 2).checked_add(n)?;
    if head.get(end..end.checked_add(2)?)? != b"\r\n" {
        return None;
    }
    Some(pos + end + 2)
}

/// Parses one complete reply (as cut by [`reply_len`]) into a [`Frame`] whose strings are
/// zero-copy slices of `buf`. `buf` must hold exactly one reply: an incomplete reply or
/// bytes after it are errors. Arrays may nest [`MAX_REPLY_DEPTH`] deep.
pub fn parse_reply(buf: &Bytes) -> Result<Frame, ProtocolError> {
    let (frame, end) = parse_at(buf, 0, 0)?;
    if end != buf.len() {
        return Err(ProtocolError::new("trailing bytes after reply"));
    }
    Ok(frame)
}

fn incomplete() -> ProtocolError {
    ProtocolError::new("incomplete reply")
}

/// Parses the frame at `pos`; returns it and the offset just past it.
fn parse_at(buf: &Bytes, pos: usize, depth: usize) -> Result<(Frame, usize), ProtocolError> {
    let kind = *buf.get(pos).ok_or_else(incomplete)?;
    if !matches!(
        kind,
        b'+' | b'-'
            | b':'
            | b'$'
            | b'*'
            | b'_'
            | b'#'
            | b','
            | b'('
            | b'!'
            | b'='
            | b'%'
            | b'~'
            | b'>'
            | b'|'
    ) {
        return Err(ProtocolError(format!(
            "invalid reply type byte '{}'",
            show_byte(kind)
        )));
    }
    let cr = buf[pos..]
        .iter()
        .position(|&b| b == b'\r')
        .map(|i| pos + i)
        .ok_or_else(incomplete)?;
    let lf = *buf.get(cr + 1).ok_or_else(incomplete)?;
    let body = &buf[pos + 1..cr];
    let next = cr + 2;
    let bad = |what: &str| ProtocolError::new(what);
    match kind {
        b'+' | b'-' | b',' | b'(' => {
            if lf != b'\n' {
                return Err(bad("reply line not terminated by CRLF"));
            }
            let text = buf.slice(pos + 1..cr);
            let frame = match kind {
                b'+' => Frame::Simple(text),
                b'-' => Frame::Error(text),
                b',' => Frame::Double(text),
                _ => Frame::BigNumber(text),
            };
            Ok((frame, next))
        }
        b'_' if lf == b'\n' && body.is_empty() => Ok((Frame::Nil, next)),
        b'#' if lf == b'\n' && (body == b"t" || body == b"f") => {
            Ok((Frame::Boolean(body == b"t"), next))
        }
        b'_' | b'#' => Err(bad("invalid RESP3 null or boolean")),
        b':' => match parse_i64(body) {
            Some(n) if lf == b'\n' => Ok((Frame::Integer(n), next)),
            _ => Err(bad("invalid integer reply")),
        },
        b'$' | b'!' | b'=' => match parse_i64(body) {
            Some(-1) if lf == b'\n' && kind == b'$' => Ok((Frame::Null, next)),
            Some(n) if lf == b'\n' && n >= 0 => {
                let avail = buf.len() - next;
                if n as u64 > avail as u64 || avail - (n as usize) < 2 {
                    return Err(incomplete());
                }
                let end = next + n as usize;
                if buf[end] != b'\r' || buf[end + 1] != b'\n' {
                    return Err(bad("bulk data not terminated by CRLF"));
                }
                let data = buf.slice(next..end);
                let frame = match kind {
                    b'$' => Frame::Bulk(data),
                    b'!' => Frame::BlobError(data),
                    _ => Frame::Verbatim(data),
                };
                Ok((frame, end + 2))
            }
            _ => Err(bad("invalid bulk length")),
        },
        _ => match parse_i64(body) {
            Some(-1) if lf == b'\n' && kind == b'*' => Ok((Frame::NullArray, next)),
            Some(n) if lf == b'\n' && n >= 0 => {
                if n > 0 && depth == MAX_REPLY_DEPTH {
                    return Err(bad("reply nested too deep"));
                }
                // Every element takes at least 3 bytes: don't trust a count the buffer
                // cannot hold (nor allocate for it).
                if n as u64 > ((buf.len() - next) / 3) as u64 {
                    return Err(incomplete());
                }
                let n = n as usize;
                let count = if matches!(kind, b'%' | b'|') {
                    2 * n
                } else {
                    n
                };
                let mut items = Vec::with_capacity(count.min(1024));
                let mut at = next;
                for _ in 0..count {
                    let (item, end) = parse_at(buf, at, depth + 1)?;
                    items.push(item);
                    at = end;
                }
                let frame = match kind {
                    b'*' => Frame::Array(items),
                    b'~' => Frame::Set(items),
                    b'>' => Frame::Push(items),
                    b'%' => {
                        let mut pairs = Vec::with_capacity(n);
                        let mut it = items.into_iter();
                        while let (Some(k), Some(v)) = (it.next(), it.next()) {
                            pairs.push((k, v));
                        }
                        Frame::Map(pairs)
                    }
                    // An attribute describes the element after it; the proxy has no use
                    // for it and hands on the element.
                    _ => return parse_at(buf, at, depth),
                };
                Ok((frame, at))
            }
            _ => Err(bad("invalid multibulk length")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn lim() -> Limits {
        Limits::default()
    }

    fn len_of(b: &[u8]) -> Result<Option<usize>, ProtocolError> {
        reply_len(b, &lim())
    }

    fn err_of(b: &[u8]) -> String {
        len_of(b).unwrap_err().to_string()
    }

    #[test]
    fn resp_reply_len_each_type() {
        let cases: &[&[u8]] = &[
            b"+OK\r\n",
            b"+\r\n",
            b"-ERR no\r\n",
            b":0\r\n",
            b":-12\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\na\r\nbc\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n$1\r\na\r\n:1\r\n",
            b"*2\r\n*1\r\n*0\r\n*2\r\n+a\r\n-b\r\n",
        ];
        for &c in cases {
            assert_eq!(
                len_of(c),
                Ok(Some(c.len())),
                "{:?}",
                String::from_utf8_lossy(c)
            );
            for cut in 0..c.len() {
                assert_eq!(len_of(&c[..cut]), Ok(None), "{:?} cut {cut}", c);
            }
            let mut more = c.to_vec();
            more.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(len_of(&more), Ok(Some(c.len())));
        }
    }

    #[test]
    fn resp_reply_len_errors() {
        assert_eq!(
            err_of(b"?x\r\n"),
            "Protocol error: invalid reply type byte '?'"
        );
        assert_eq!(
            len_of(b"%1\r\n"),
            Ok(None),
            "a RESP3 map waits for its pairs"
        );
        assert_eq!(
            err_of(b"_x\r\n"),
            "Protocol error: invalid RESP3 null or boolean"
        );
        assert_eq!(
            err_of(b"#x\r\n"),
            "Protocol error: invalid RESP3 null or boolean"
        );
        assert_eq!(err_of(b"=-1\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(
            err_of(b"~-1\r\n"),
            "Protocol error: invalid multibulk length"
        );
        assert_eq!(err_of(b":x\r\n"), "Protocol error: invalid integer reply");
        assert_eq!(err_of(b":1\rx"), "Protocol error: invalid integer reply");
        assert_eq!(
            err_of(b"+OK\rx"),
            "Protocol error: reply line not terminated by CRLF"
        );
        assert_eq!(err_of(b"$-2\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(err_of(b"$x\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(
            err_of(b"$1\r\nab\r\n"),
            "Protocol error: bulk data not terminated by CRLF"
        );
        assert_eq!(
            err_of(b"*-2\r\n"),
            "Protocol error: invalid multibulk length"
        );
        assert_eq!(
            err_of(b"*1\r\n?"),
            "Protocol error: invalid reply type byte '?'"
        );
        let small = Limits {
            max_bulk_len: 4,
            max_multibulk_len: 2,
            max_inline_len: 4,
        };
        assert_eq!(
            reply_len(b"$5\r\n", &small).unwrap_err().to_string(),
            "Protocol error: invalid bulk length"
        );
        assert_eq!(reply_len(b"$4\r\nabcd\r\n", &small), Ok(Some(10)));
        assert_eq!(
            reply_len(b"*3\r\n", &small).unwrap_err().to_string(),
            "Protocol error: invalid multibulk length"
        );
        assert_eq!(
            reply_len(b"+abcde", &small).unwrap_err().to_string(),
            "Protocol error: too big reply line"
        );
        assert_eq!(reply_len(b"+abcd\r\n", &small), Ok(Some(7)));
        let mut long = b"$".to_vec();
        long.extend(std::iter::repeat_n(b'1', MAX_HEADER_LINE + 1));
        assert_eq!(err_of(&long), "Protocol error: too big bulk count string");
    }

    #[test]
    fn resp_reply_depth_limit() {
        let nest = |levels: usize| {
            let mut v = b"*1\r\n".repeat(levels);
            v.extend_from_slice(b":1\r\n");
            v
        };
        let ok = nest(MAX_REPLY_DEPTH);
        assert_eq!(len_of(&ok), Ok(Some(ok.len())));
        assert!(parse_reply(&Bytes::from(ok)).is_ok());
        let deep = nest(MAX_REPLY_DEPTH + 1);
        assert_eq!(err_of(&deep), "Protocol error: reply nested too deep");
        assert_eq!(
            parse_reply(&Bytes::from(deep)).unwrap_err().to_string(),
            "Protocol error: reply nested too deep"
        );
    }

    #[test]
    fn resp_reply_scanner_resumes() {
        let mut all = BytesMut::new();
        let frame = Frame::Array(
            (0..10_000)
                .map(|i| {
                    if i % 3 == 0 {
                        Frame::Array(vec![Frame::bulk(format!("v{i}")), Frame::Null])
                    } else {
                        Frame::Integer(i)
                    }
                })
                .collect(),
        );
        frame.encode(&mut all);
        let one = all.len();
        Frame::ok().encode(&mut all);
        let mut sc = ReplyScanner::new();
        let mut lens = Vec::new();
        let mut have = 0;
        let mut base = 0;
        while have < all.len() {
            have = (have + 7).min(all.len());
            while let Some(n) = sc.scan(&all[base..have], &lim()).unwrap() {
                lens.push(n);
                base += n;
            }
        }
        assert_eq!(lens, vec![one, 5]);
        assert_eq!(parse_reply(&all.freeze().slice(..one)), Ok(frame));
    }

    /// Inside arrays, bulk strings take a fast path: it must give the general path's answer
    /// (length, incomplete, or the same error) for well-formed and malformed strings alike.
    #[test]
    fn resp_reply_fast_bulk_path_answers_like_the_general_one() {
        let cases: &[&[u8]] = &[
            b"$0\r\n\r\n",
            b"$1\r\na\r\n",
            b"$-1\r\n",
            b"$12\r\n*3\r\n$1\r\nab\r\n\r\n",
            b"$01\r\na\r\n",
            b"$00\r\n\r\n",
            b"$\r\n",
            b"$+1\r\na\r\n",
            b"$1\ra\r\n",
            b"$1\r\nab\r\n",
            b"$1\r\na\rx",
            b"$999999999999999999\r\n",
            b"$9999999999999999999\r\n",
            b"$99999999999999999999\r\n",
            b"$5\r\nabcde\r\n",
        ];
        let small = Limits {
            max_bulk_len: 4,
            max_multibulk_len: 8,
            max_inline_len: 4,
        };
        for &c in cases {
            for limits in [lim(), small] {
                // The general path's answer for the string alone, shifted by the header.
                let alone = reply_len(c, &limits).map(|r| r.map(|n| n + 4));
                let mut arr = b"*1\r\n".to_vec();
                arr.extend_from_slice(c);
                assert_eq!(
                    reply_len(&arr, &limits),
                    alone,
                    "{:?}",
                    String::from_utf8_lossy(c)
                );
                // Every prefix: incomplete, or the same error.
                for cut in 4..arr.len() {
                    let mut sc = ReplyScanner::new();
                    let got = sc.scan(&arr[..cut], &limits);
                    let want = reply_len(&c[..cut - 4], &limits);
                    assert_eq!(got.is_err(), want.is_err(), "{c:?} cut {cut}");
                    if let Ok(g) = got {
                        assert_eq!(g, None, "{c:?} cut {cut}");
                    }
                }
            }
        }
    }

    #[test]
    fn resp_reply_scanner_hints_where_a_bulk_ends() {
        let mut sc = ReplyScanner::new();
        let mut buf = b"*2\r\n$1\r\na\r\n$1000\r\nxyz".to_vec();
        assert_eq!(sc.scan(&buf, &lim()), Ok(None));
        assert_eq!(sc.bulk_end_hint(), Some(11 + 7 + 1000 + 2));
        buf.resize(11 + 7 + 1000, b'x');
        buf.extend_from_slice(b"\r\n");
        assert_eq!(sc.scan(&buf, &lim()), Ok(Some(buf.len())));
        assert_eq!(sc.bulk_end_hint(), None);
        assert_eq!(sc.scan(b"*1\r\n", &lim()), Ok(None));
        assert_eq!(sc.bulk_end_hint(), None);
    }

    #[test]
    fn resp_reply_big_bulk_is_skipped_by_length() {
        let mut buf = BytesMut::from(&b"$1048576\r\n"[..]);
        buf.extend_from_slice(&vec![b'\r'; 1 << 20]);
        assert_eq!(len_of(&buf), Ok(None));
        buf.extend_from_slice(b"\r\n");
        assert_eq!(len_of(&buf), Ok(Some(buf.len())));
    }

    #[test]
    fn resp_parse_reply_frames() {
        let p = |b: &'static [u8]| parse_reply(&Bytes::from_static(b));
        assert_eq!(p(b"+OK\r\n"), Ok(Frame::ok()));
        assert_eq!(p(b"-ERR x\r\n"), Ok(Frame::error("ERR x")));
        assert_eq!(p(b":-5\r\n"), Ok(Frame::Integer(-5)));
        assert_eq!(p(b"$-1\r\n"), Ok(Frame::Null));
        assert_eq!(p(b"*-1\r\n"), Ok(Frame::NullArray));
        assert_eq!(p(b"*0\r\n"), Ok(Frame::Array(vec![])));
        assert_eq!(p(b"$2\r\n\r\n\r\n"), Ok(Frame::bulk(&b"\r\n"[..])));
        assert_eq!(
            p(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n"),
            Ok(Frame::Array(vec![
                Frame::bulk("a"),
                Frame::Array(vec![Frame::Integer(1)])
            ]))
        );
        let e = |b: &'static [u8]| p(b).unwrap_err().to_string();
        assert_eq!(e(b"+OK\r\n+"), "Protocol error: trailing bytes after reply");
        assert_eq!(e(b"+OK"), "Protocol error: incomplete reply");
        assert_eq!(e(b""), "Protocol error: incomplete reply");
        assert_eq!(e(b"$3\r\nab\r\n"), "Protocol error: incomplete reply");
        assert_eq!(e(b"$3\r\nabc"), "Protocol error: incomplete reply");
        assert_eq!(e(b"*1000000\r\n:1\r\n"), "Protocol error: incomplete reply");
        assert_eq!(
            e(b"$1\r\nab\r\n"),
            "Protocol error: bulk data not terminated by CRLF"
        );
        assert_eq!(e(b"!x\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(e(b"?x\r\n"), "Protocol error: invalid reply type byte '?'");
    }

    #[test]
    fn resp_parse_reply_is_zero_copy() {
        let buf = Bytes::from_static(b"*2\r\n$3\r\nabc\r\n+OK\r\n");
        let base = buf.as_ptr() as usize;
        let Ok(Frame::Array(items)) = parse_reply(&buf) else {
            panic!("not an array")
        };
        let (Frame::Bulk(a), Frame::Simple(b)) = (&items[0], &items[1]) else {
            panic!("wrong items")
        };
        assert_eq!(a.as_ptr() as usize, base + 8);
        assert_eq!(b.as_ptr() as usize, base + 14);
    }

    #[test]
    fn resp3_frames_are_cut_parsed_and_encoded_back_exactly() {
        let cases: &[&[u8]] = &[
            b"_\r\n",
            b"#t\r\n",
            b"#f\r\n",
            b",1.5\r\n",
            b",-inf\r\n",
            b"(3492890328409238509324850943850943825024385\r\n",
            b"!21\r\nSYNTAX invalid syntax\r\n",
            b"=15\r\ntxt:Some string\r\n",
            b"%2\r\n+first\r\n:1\r\n+second\r\n_\r\n",
            b"~3\r\n:1\r\n$1\r\na\r\n#t\r\n",
            b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
            b"*2\r\n%1\r\n$1\r\nk\r\n~1\r\n,2\r\n*0\r\n",
            b"%0\r\n",
            b"~0\r\n",
        ];
        for &c in cases {
            assert_eq!(
                len_of(c),
                Ok(Some(c.len())),
                "{}",
                String::from_utf8_lossy(c)
            );
            // Byte by byte, the resumable scanner finds the same end.
            let mut sc = ReplyScanner::new();
            for i in 1..c.len() {
                assert_eq!(sc.scan(&c[..i], &lim()), Ok(None));
            }
            assert_eq!(sc.scan(c, &lim()), Ok(Some(c.len())));
            let b = Bytes::copy_from_slice(c);
            let f = parse_reply(&b).expect("parses");
            assert_eq!(&f.to_bytes()[..], c, "{f:?}");
        }
        // An attribute is scanned with the element it describes, and parsed away.
        let a = b"|1\r\n+ttl\r\n:3\r\n$2\r\nhi\r\n";
        assert_eq!(len_of(a), Ok(Some(a.len())));
        let f = parse_reply(&Bytes::from_static(a)).expect("parses");
        assert_eq!(f, Frame::Bulk(Bytes::from_static(b"hi")));
        assert!(Frame::BlobError(Bytes::from_static(b"x")).is_error());
    }
}

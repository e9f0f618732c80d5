//! Client request decoding: multibulk and inline commands.

use bytes::{Buf, Bytes, BytesMut};

use super::{find_line_end, parse_i64, show_byte, LineEnd, ProtocolError, MAX_HEADER_LINE};
use crate::codec_limits::Limits;

/// A client request: the command name and its arguments, as zero-copy slices of the read
/// buffer (inline arguments with quote escapes are the only copies).
pub type Args = Vec<Bytes>;

/// Argument vectors kept per thread for reuse, and the largest capacity kept: a pipelined
/// GET costs no heap allocation for its argv (the upstream connection gives it back once the
/// command is encoded, on the same worker thread). 1024 covers 50 clients × 16 commands in
/// flight, which one event-loop turn may decode before the connection task gives any back
/// (256 left 0.66 allocations per GET there: `cargo bench --bench allocs`). Bounded: at most
/// 1024 × 16 × 32 bytes (512 KiB) per thread, and only as many as the traffic needed.
const POOL_MAX: usize = 1024;
const POOLED_CAP_MAX: usize = 16;

thread_local! {
    static ARGV_POOL: std::cell::RefCell<Vec<Args>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty argument vector with room for `n`, from this thread's pool when it has one.
#[inline]
pub fn argv_with_capacity(n: usize) -> Args {
    match ARGV_POOL.with(|p| p.borrow_mut().pop()) {
        Some(mut v) => {
            v.reserve(n);
            v
        }
        None => Vec::with_capacity(n),
    }
}

/// Gives `args` back to this thread's pool (its `Bytes` are released now); a vector too
/// large to keep, or one more than the pool holds, is freed.
#[inline]
pub fn recycle_argv(mut args: Args) {
    let cap = args.capacity();
    if cap == 0 || cap > POOLED_CAP_MAX {
        return;
    }
    args.clear();
    ARGV_POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < POOL_MAX {
            p.push(args);
        }
    });
}

/// Where the decoder is inside the command at the front of the buffer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing of the current command looked at yet.
    #[default]
    Idle,
    /// An inline command: looking for its `\n`.
    Inline,
    /// A multibulk command: reading its `*<count>` line.
    Count,
    /// A multibulk command: reading its `$<len>` elements.
    Elements,
}

/// Incremental RESP request decoder for one client connection.
///
/// Call [`decode`](Self::decode) with the connection's read buffer after every read, until
/// it returns `Ok(None)`. Progress inside a partly received command is remembered (elements
/// already seen, where a bulk payload ends, how far a line was searched), so a 512 MiB bulk
/// arriving in 64 KiB reads costs O(1) per call, not O(payload). Between calls the buffer may
/// only be appended to; if it is replaced, call [`reset`](Self::reset). After an error the
/// stream is unusable: answer [`ProtocolError::to_frame`] and close.
#[derive(Debug, Default)]
pub struct RequestDecoder {
    limits: Limits,
    mode: Mode,
    /// Offset of the next unparsed byte (start of the current line or bulk payload).
    pos: usize,
    /// Bytes after `pos` known to hold no line terminator.
    scanned: usize,
    /// Multibulk elements still to read.
    left: usize,
    /// Length of the current element's payload, once its `$<len>` line has been read.
    bulk: Option<usize>,
    /// Ranges of the elements read so far (reused across commands).
    ranges: Vec<(usize, usize)>,
}

impl RequestDecoder {
    /// A decoder enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        RequestDecoder {
            limits,
            ..Default::default()
        }
    }

    /// The limits this decoder enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Forgets any progress on a partly received command (use when the buffer was replaced).
    pub fn reset(&mut self) {
        self.mode = Mode::Idle;
        self.pos = 0;
        self.scanned = 0;
        self.left = 0;
        self.bulk = None;
        self.ranges.clear();
    }

    /// When the decoder waits for a bulk payload: the buffer length at which that bulk
    /// (with its CRLF) is complete. Lets the caller reserve the room in one go.
    pub fn bulk_end_hint(&self) -> Option<usize> {
        match (self.mode, self.bulk) {
            (Mode::Elements, Some(len)) => self.pos.checked_add(len)?.checked_add(2),
            _ => None,
        }
    }

    /// Decodes the next complete command at the front of `buf`, splitting its bytes off
    /// (`split_to` + `freeze`; the args are slices of them).
    ///
    /// - `Ok(Some(args))`: one command; `args` is never empty.
    /// - `Ok(None)`: more bytes are needed. The buffer's content is untouched apart from
    ///   skipped empty commands (empty inline lines, `*0`, `*-1`), which are removed.
    /// - `Err(_)`: the stream violates the protocol or a [`Limits`] bound; the buffer's
    ///   content is then unspecified.
    ///
    /// A command starting with `*` is a multibulk; anything else is an inline command: one
    /// line (ending in `\r\n` or just `\n`) split on whitespace with `redis-cli`-style quoting
    /// (`"..."` with `\n \r \t \b \a \\ \" \xHH` escapes, `'...'` with `\'`). Like Redis, an
    /// inline line ends at its first NUL byte.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Args>, ProtocolError> {
        Ok(self.decode_frame(buf)?.map(|(args, _)| args))
    }

    /// [`decode`](Self::decode), and for a multibulk command its whole frame as received.
    /// The decoder accepts only canonical lengths (no sign, no leading zero), so the frame is
    /// byte for byte what encoding `args` again would give: it can be forwarded as it is.
    /// Inline commands have no such frame (`None`).
    pub fn decode_frame(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<(Args, Option<Bytes>)>, ProtocolError> {
        if self.pos > buf.len() {
            // The buffer shrank under us: it is not the one we were reading.
            self.reset();
        }
        loop {
            match self.mode {
                Mode::Idle => {
                    match buf.first() {
                        None => return Ok(None),
                        Some(b'*') => self.mode = Mode::Count,
                        Some(_) => self.mode = Mode::Inline,
                    }
                    self.pos = 0;
                    self.scanned = 0;
                }
                Mode::Inline => {
                    let nl = match find_line_end(
                        buf,
                        0,
                        &mut self.scanned,
                        self.limits.max_inline_len,
                        b'\n',
                    ) {
                        LineEnd::Found(i) => i,
                        LineEnd::Incomplete => return Ok(None),
                        LineEnd::TooLong => {
                            return Err(ProtocolError::new("too big inline request"))
                        }
                    };
                    let line = buf.split_to(nl + 1).freeze();
                    self.reset();
                    let mut end = nl;
                    if end > 0 && line[end - 1] == b'\r' {
                        end -= 1;
                    }
                    if let Some(nul) = line[..end].iter().position(|&b| b == 0) {
                        end = nul;
                    }
                    let args = split_inline(&line, end)?;
                    if !args.is_empty() {
                        return Ok(Some((args, None)));
                    }
                }
                Mode::Count => {
                    // `*<1 or 2 digits>\r\n` without the general search and parser (as for
                    // bulk headers, below).
                    let (count, cr) = match short_header(buf, b'*') {
                        Some((n, header)) => (n as i64, header - 2),
                        None => {
                            let cr = match find_line_end(
                                buf,
                                1,
                                &mut self.scanned,
                                MAX_HEADER_LINE,
                                b'\r',
                            ) {
                                LineEnd::Found(i) => i,
                                LineEnd::Incomplete => return Ok(None),
                                LineEnd::TooLong => {
                                    return Err(ProtocolError::new("too big mbulk count string"))
                                }
                            };
                            let Some(&lf) = buf.get(cr + 1) else {
                                return Ok(None);
                            };
                            match parse_i64(&buf[1..cr]) {
                                Some(n) if lf == b'\n' => (n, cr),
                                _ => return Err(ProtocolError::new("invalid multibulk length")),
                            }
                        }
                    };
                    if count > 0 && count as u64 > self.limits.max_multibulk_len as u64 {
                        return Err(ProtocolError::new("invalid multibulk length"));
                    }
                    if count <= 0 {
                        // `*0`, `*-1` (and any negative count, like Redis): no command.
                        buf.advance(cr + 2);
                        self.reset();
                        continue;
                    }
                    self.mode = Mode::Elements;
                    self.left = count as usize;
                    self.pos = cr + 2;
                    self.scanned = 0;
                    self.bulk = None;
                    self.ranges.clear();
                    // Grows with the elements actually received, not with the claimed count.
                    self.ranges.reserve(self.left.min(64));
                }
                Mode::Elements => return self.elements(buf),
            }
        }
    }

    /// Reads multibulk elements from `self.pos` on; returns the command once all are there.
    fn elements(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<(Args, Option<Bytes>)>, ProtocolError> {
        while self.left > 0 {
            let start = self.pos;
            let len = match self.bulk {
                Some(len) => len,
                // Most arguments are shorter than 100 bytes: `$<1 or 2 digits>\r\n`, read
                // without the general line search and number parser (same answer: a canonical
                // length within the limit; anything else takes the general path).
                None => match (self.scanned == 0)
                    .then(|| short_header(&buf[start..], b'$'))
                    .flatten()
                {
                    // Most arguments are shorter than 100 bytes: `$<1 or 2 digits>\r\n`, read
                    // without the general line search and number parser (same answer: a
                    // canonical length within the limit; anything else takes the general path).
                    Some((len, header)) => {
                        if len > self.limits.max_bulk_len {
                            return Err(ProtocolError::new("invalid bulk length"));
                        }
                        self.bulk = Some(len);
                        self.pos = start + header;
                        len
                    }
                    None => {
                        // Searched from the type byte itself, so that `\r` there is reported as
                        // "expected '$'" (as Redis does); the length limit still counts only the
                        // bytes after the type byte.
                        let cr = match find_line_end(
                            buf,
                            start,
                            &mut self.scanned,
                            MAX_HEADER_LINE + 1,
                            b'\r',
                        ) {
                            LineEnd::Found(i) => i,
                            LineEnd::Incomplete => return Ok(None),
                            LineEnd::TooLong => {
                                return Err(ProtocolError::new("too big bulk count string"))
                            }
                        };
                        let first = buf[start];
                        if first != b'$' {
                            return Err(ProtocolError(format!(
                                "expected '$', got '{}'",
                                show_byte(first)
                            )));
                        }
                        let Some(&lf) = buf.get(cr + 1) else {
                            return Ok(None);
                        };
                        let len = match parse_i64(&buf[start + 1..cr]) {
                            Some(n) if lf == b'\n' && n >= 0 => n as u64,
                            _ => return Err(ProtocolError::new("invalid bulk length")),
                        };
                        if len > self.limits.max_bulk_len as u64 {
                            return Err(ProtocolError::new("invalid bulk length"));
                        }
                        let len = len as usize;
                        self.bulk = Some(len);
                        self.pos = cr + 2;
                        self.scanned = 0;
                        len
                    }
                },
            };
            let data = self.pos;
            let Some(end) = data.checked_add(len).filter(|e| e.checked_add(2).is_some()) else {
                return Err(ProtocolError::new("invalid bulk length"));
            };
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if buf[end] != b'\r' || buf[end + 1] != b'\n' {
                return Err(ProtocolError::new("bulk data not terminated by CRLF"));
            }
            self.ranges.push((data, end));
            self.pos = end + 2;
            self.bulk = None;
            self.left -= 1;
        }
        let frame = buf.split_to(self.pos).freeze();
        let mut args = argv_with_capacity(self.ranges.len());
        args.extend(self.ranges.iter().map(|&(s, e)| frame.slice(s..e)));
        self.reset();
        Ok(Some((args, Some(frame))))
    }
}

/// The number in a complete `<type><d>\r\n` or `<type><d><d>\r\n` header at the start of
/// `b` (no leading zero, except `0` alone) and the header's length; `None` for anything else.
#[inline]
fn short_header(b: &[u8], ty: u8) -> Option<(usize, usize)> {
    match *b {
        [t, d, b'\r', b'\n', ..] if t == ty && d.is_ascii_digit() => {
            Some((usize::from(d - b'0'), 4))
        }
        [t, d1, d2, b'\r', b'\n', ..]
            if t == ty && (b'1'..=b'9').contains(&d1) && d2.is_ascii_digit() =>
        {
            Some((usize::from(d1 - b'0') * 10 + usize::from(d2 - b'0'), 5))
        }
        _ => None,
    }
}

/// `isspace` in the C locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// One inline argument being built: a slice of the line while its bytes are the line's own
/// contiguous bytes, a copy once an escape or a quote breaks that.
struct Token {
    range: Option<(usize, usize)>,
    owned: Option<Vec<u8>>,
}

impl Token {
    fn new() -> Self {
        Token {
            range: None,
            owned: None,
        }
    }

    /// Appends byte `v`, which stands at (or was decoded ending at) `line[at]`.
    fn push(&mut self, line: &[u8], at: usize, v: u8) {
        if let Some(owned) = &mut self.owned {
            owned.push(v);
            return;
        }
        let same = line.get(at) == Some(&v);
        match &mut self.range {
            None if same => self.range = Some((at, at + 1)),
            Some((_, e)) if same && *e == at => *e += 1,
            _ => {
                let mut owned = match self.range {
                    Some((s, e)) => line[s..e].to_vec(),
                    None => Vec::new(),
                };
                owned.push(v);
                self.owned = Some(owned);
            }
        }
    }

    fn finish(self, line: &Bytes) -> Bytes {
        match (self.owned, self.range) {
            (Some(v), _) => Bytes::from(v),
            (None, Some((s, e))) => line.slice(s..e),
            (None, None) => Bytes::new(),
        }
    }
}

/// Splits `line[..end]` into arguments with Redis's inline rules (`sdssplitargs`): blanks
/// separate arguments; `"..."` takes escapes; `'...'` takes `\'`; a closing quote must be
/// followed by a blank or the end of the line.
fn split_inline(line: &Bytes, end: usize) -> Result<Args, ProtocolError> {
    let s = &line[..end];
    // 0 stands for "end of line", as the C string's terminator does.
    let at = |k: usize| s.get(k).copied().unwrap_or(0);
    let unbalanced = || ProtocolError::new("unbalanced quotes in request");
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < s.len() && is_space(s[i]) {
            i += 1;
        }
        if i >= s.len() {
            return Ok(args);
        }
        let mut tok = Token::new();
        let (mut in_dq, mut in_sq) = (false, false);
        loop {
            let c = at(i);
            if in_dq {
                if c == 0 {
                    return Err(unbalanced());
                }
                if c == b'\\' && at(i + 1) == b'x' {
                    if let (Some(h), Some(l)) = (hex_val(at(i + 2)), hex_val(at(i + 3))) {
                        i += 3;
                        tok.push(s, i, h * 16 + l);
                        i += 1;
                        continue;
                    }
                }
                if c == b'\\' && at(i + 1) != 0 {
                    i += 1;
                    let v = match at(i) {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    };
                    tok.push(s, i, v);
                } else if c == b'"' {
                    if at(i + 1) != 0 && !is_space(at(i + 1)) {
                        return Err(unbalanced());
                    }
                    i += 1;
                    break;
                } else {
                    tok.push(s, i, c);
                }
            } else if in_sq {
                if c == 0 {
                    return Err(unbalanced());
                }
                if c == b'\\' && at(i + 1) == b'\'' {
                    i += 1;
                    tok.push(s, i, b'\'');
                } else if c == b'\'' {
                    if at(i + 1) != 0 && !is_space(at(i + 1)) {
                        return Err(unbalanced());
                    }
                    i += 1;
                    break;
                } else {
                    tok.push(s, i, c);
                }
            } else {
                match c {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => {
                        if c != 0 {
                            i += 1;
                        }
                        break;
                    }
                    b'"' => in_dq = true,
                    b'\'' => in_sq = true,
                    _ => tok.push(s, i, c),
                }
            }
            i += 1;
        }
        args.push(tok.finish(line));
    }
}

#[cfg(test)]
mod tests;

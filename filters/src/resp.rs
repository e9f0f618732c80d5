//! RESP2 codec: client requests (multibulk and inline), reply framing and reply parsing.
//!
//! Everything here works in two steps: first check that a whole frame is in the buffer
//! without allocating (bulk payloads are skipped by their length, never scanned), then cut it
//! off the buffer and hand out zero-copy [`Bytes`](bytes::Bytes) slices of it.
//!
//! - [`RequestDecoder`] turns the bytes a client sends into argv vectors ([`Args`]), with
//!   Redis's limits and error texts (`Protocol error: invalid bulk length`, ...).
//! - [`reply_len`] / [`ReplyScanner`] find where a reply ends in an upstream read buffer;
//!   [`parse_reply`] turns a cut reply into a [`Frame`] when the proxy must look inside it.
//! - [`Frame::encode`], [`encode_command`] and the `write_*` helpers produce RESP without
//!   allocating beyond the output buffer's growth.
//!
//! A decoder error is fatal for the stream: reply [`ProtocolError::to_frame`] and close.

mod frame;
mod reply;
mod request;

pub use frame::{
    encode_command, write_array_header, write_bulk, write_bulk_header, write_error, write_integer,
    write_simple, Frame,
};
pub use reply::{array_header, parse_reply, reply_len, ReplyScanner, MAX_REPLY_DEPTH};
pub use request::{argv_with_capacity, recycle_argv, Args, RequestDecoder};

/// Most bytes accepted between the `*` / `$` of a header line and its CR (Redis uses its
/// inline limit, 64 KiB, and answers `too big mbulk count string` / `too big bulk count
/// string`). Applies to request headers and to reply `:`, `$` and `*` lines.
pub const MAX_HEADER_LINE: usize = 64 * 1024;

/// A malformed or over-limit RESP stream. Holds the reason; `Display` adds the
/// `Protocol error: ` prefix, e.g. `Protocol error: invalid bulk length`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(reason: impl Into<String>) -> Self {
        ProtocolError(reason.into())
    }

    /// The reply Redis sends before closing the connection: `-ERR Protocol error: <reason>`.
    pub fn to_frame(&self) -> Frame {
        Frame::error(&format!("ERR {self}"))
    }
}

/// Result of looking for a line terminator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineEnd {
    /// Index (into the whole buffer) of the terminator byte.
    Found(usize),
    /// Not there yet, and the line is still within its limit.
    Incomplete,
    /// No terminator within `max` bytes of the line start.
    TooLong,
}

/// Finds `needle` in the line starting at `start`, at most `max` bytes after `start`
/// (so a terminator at `start + max` is still accepted). `scanned` counts bytes after `start`
/// already known not to hold `needle`; it is updated so a later call with more data resumes
/// where this one stopped. The answer depends only on the bytes, never on how they arrived.
fn find_line_end(buf: &[u8], start: usize, scanned: &mut usize, max: usize, needle: u8) -> LineEnd {
    let len = buf.len();
    if start > len {
        return LineEnd::Incomplete;
    }
    let limit = start.saturating_add(max).saturating_add(1).min(len);
    let from = start.saturating_add(*scanned).min(limit);
    match buf[from..limit].iter().position(|&b| b == needle) {
        Some(i) => {
            *scanned = from + i - start;
            LineEnd::Found(from + i)
        }
        None => {
            *scanned = limit - start;
            if len - start > max {
                LineEnd::TooLong
            } else {
                LineEnd::Incomplete
            }
        }
    }
}

/// Parses a decimal `i64` the way Redis's `string2ll` does: optional `-`, no `+`, no spaces,
/// no leading zeros (`0` alone is fine, `-0` is not), no overflow.
pub(crate) fn parse_i64(s: &[u8]) -> Option<i64> {
    if s == b"0" {
        return Some(0);
    }
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    if digits.len() > 19 {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        if v == 1u64 << 63 {
            Some(i64::MIN)
        } else {
            i64::try_from(v).ok().map(|x| -x)
        }
    } else {
        i64::try_from(v).ok()
    }
}

/// Shows a byte the way an error text can carry it: printable ASCII as itself, else `\xHH`.
fn show_byte(b: u8) -> String {
    if (0x20..0x7f).contains(&b) {
        char::from(b).to_string()
    } else {
        format!("\\x{b:02x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_parse_i64_follows_string2ll() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"12"), Some(12));
        assert_eq!(parse_i64(b"-1"), Some(-1));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"00",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1a",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"99999999999999999999",
            b"123456789012345678901",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn resp_find_line_end_is_bounded_and_resumable() {
        let mut scanned = 0;
        assert_eq!(
            find_line_end(b"abc", 0, &mut scanned, 10, b'\r'),
            LineEnd::Incomplete
        );
        assert_eq!(scanned, 3);
        assert_eq!(
            find_line_end(b"abc\r", 0, &mut scanned, 10, b'\r'),
            LineEnd::Found(3)
        );
        let mut scanned = 0;
        // terminator exactly at start + max is accepted, one further is too long
        assert_eq!(
            find_line_end(b"xxxx\r", 1, &mut scanned, 3, b'\r'),
            LineEnd::Found(4)
        );
        let mut scanned = 0;
        assert_eq!(
            find_line_end(b"xxxxx\r", 1, &mut scanned, 3, b'\r'),
            LineEnd::TooLong
        );
        let mut scanned = 0;
        assert_eq!(
            find_line_end(b"xxxxx", 1, &mut scanned, 3, b'\r'),
            LineEnd::TooLong
        );
        let mut scanned = 0;
        assert_eq!(
            find_line_end(b"xxxx", 1, &mut scanned, 3, b'\r'),
            LineEnd::Incomplete
        );
        let mut scanned = 0;
        assert_eq!(
            find_line_end(b"x", 5, &mut scanned, 3, b'\r'),
            LineEnd::Incomplete
        );
        let mut scanned = 0;
        assert_eq!(
            find_line_end(b"ab\rc", 0, &mut scanned, usize::MAX, b'\r'),
            LineEnd::Found(2)
        );
    }

    #[test]
    fn resp_protocol_error_texts() {
        let e = ProtocolError::new("invalid bulk length");
        assert_eq!(e.to_string(), "Protocol error: invalid bulk length");
        assert_eq!(
            e.to_frame(),
            Frame::Error(bytes::Bytes::from_static(
                b"ERR Protocol error: invalid bulk length"
            ))
        );
        assert_eq!(show_byte(b'x'), "x");
        assert_eq!(show_byte(b'\r'), "\\x0d");
    }
}

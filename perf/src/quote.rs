//! Redis's quoting of binary strings, both ways.
//!
//! `MONITOR` (and so `redis-cli MONITOR`) prints every argument the way Redis's `sdscatrepr`
//! does: inside double quotes, `\\`, `\"`, `\n`, `\r`, `\t`, `\a`, `\b` escaped, other
//! printable ASCII as itself and every other byte as `\xHH`. [`split_args`] reads such a line
//! back the way Redis's `sdssplitargs` does (also single quotes and bare words), and
//! [`write_quoted`] writes one argument the way `sdscatrepr` does. The respway trace format
//! ([`crate::trace`]) uses the same quoting, so a trace line is as readable as a MONITOR line.

use std::fmt;

/// A line that is not a valid sequence of quoted arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteError {
    /// Byte offset in the line where the problem was seen.
    pub at: usize,
    /// What is wrong.
    pub reason: &'static str,
}

impl fmt::Display for QuoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.reason, self.at)
    }
}

impl std::error::Error for QuoteError {}

/// Splits `line` into arguments like Redis's `sdssplitargs`: words separated by spaces;
/// `"..."` with backslash escapes (`\xHH`, `\n`, `\r`, `\t`, `\b`, `\a`, and `\c` for any other
/// `c`); `'...'` where only `\'` is an escape. A closing quote must be followed by a space or
/// the end of the line.
pub fn split_args(line: &[u8]) -> Result<Vec<Vec<u8>>, QuoteError> {
    let mut args = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= n {
            return Ok(args);
        }
        let mut cur = Vec::new();
        match line[i] {
            b'"' => {
                i += 1;
                loop {
                    let Some(&c) = line.get(i) else {
                        return Err(QuoteError {
                            at: i,
                            reason: "unbalanced double quote",
                        });
                    };
                    if c == b'\\' && i + 3 < n && line[i + 1] == b'x' {
                        if let (Some(h), Some(l)) = (hex(line[i + 2]), hex(line[i + 3])) {
                            cur.push(h << 4 | l);
                            i += 4;
                            continue;
                        }
                    }
                    if c == b'\\' && i + 1 < n {
                        cur.push(match line[i + 1] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                        i += 2;
                        continue;
                    }
                    if c == b'"' {
                        i += 1;
                        if i < n && !line[i].is_ascii_whitespace() {
                            return Err(QuoteError {
                                at: i,
                                reason: "closing quote must be followed by a space",
                            });
                        }
                        break;
                    }
                    cur.push(c);
                    i += 1;
                }
            }
            b'\'' => {
                i += 1;
                loop {
                    let Some(&c) = line.get(i) else {
                        return Err(QuoteError {
                            at: i,
                            reason: "unbalanced single quote",
                        });
                    };
                    if c == b'\\' && line.get(i + 1) == Some(&b'\'') {
                        cur.push(b'\'');
                        i += 2;
                        continue;
                    }
                    if c == b'\'' {
                        i += 1;
                        if i < n && !line[i].is_ascii_whitespace() {
                            return Err(QuoteError {
                                at: i,
                                reason: "closing quote must be followed by a space",
                            });
                        }
                        break;
                    }
                    cur.push(c);
                    i += 1;
                }
            }
            _ => {
                while i < n && !line[i].is_ascii_whitespace() {
                    cur.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(cur);
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Appends `arg` to `out` quoted the way Redis's `sdscatrepr` (and so `MONITOR`) does.
pub fn write_quoted(out: &mut Vec<u8>, arg: &[u8]) {
    out.push(b'"');
    for &b in arg {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x07 => out.extend_from_slice(b"\\a"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x20..=0x7e => out.push(b),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(&[
                    b'\\',
                    b'x',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 15)],
                ]);
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_args_reads_sdscatrepr_output() {
        let line = br#""SET" "k\"ey" "a\\b" "\x00\xff\r\n\t\a\b" bare 'it\'s' """#;
        let args = split_args(line).unwrap();
        assert_eq!(
            args,
            vec![
                b"SET".to_vec(),
                b"k\"ey".to_vec(),
                b"a\\b".to_vec(),
                vec![0, 0xff, b'\r', b'\n', b'\t', 7, 8],
                b"bare".to_vec(),
                b"it's".to_vec(),
                Vec::new(),
            ]
        );
    }

    #[test]
    fn split_args_rejects_broken_quoting() {
        assert_eq!(
            split_args(br#""abc"#).unwrap_err().reason,
            "unbalanced double quote"
        );
        assert_eq!(
            split_args(br#""abc"def"#).unwrap_err().reason,
            "closing quote must be followed by a space"
        );
        assert_eq!(
            split_args(b"'abc").unwrap_err().reason,
            "unbalanced single quote"
        );
        // an incomplete \x escape is taken literally, like sdssplitargs does
        assert_eq!(split_args(br#""\xZZ""#).unwrap(), vec![b"xZZ".to_vec()]);
    }

    #[test]
    fn write_quoted_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let mut out = Vec::new();
        write_quoted(&mut out, &all);
        assert!(out.iter().all(|b| (0x20..0x7f).contains(b)));
        assert_eq!(split_args(&out).unwrap(), vec![all]);
        let mut out = Vec::new();
        write_quoted(&mut out, b"a \"b\"\n");
        assert_eq!(out, br#""a \"b\"\n""#.to_vec());
    }
}

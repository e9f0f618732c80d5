//! Fuzz-style properties of the RESP codec: no input makes it panic or disagree with itself,
//! and everything it encodes it decodes back.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use respway_filters::codec_limits::Limits;
use respway_filters::resp::{
    encode_command, parse_reply, reply_len, Args, Frame, ProtocolError, ReplyScanner,
    RequestDecoder,
};

fn small_limits() -> Limits {
    Limits {
        max_bulk_len: 16,
        max_multibulk_len: 8,
        max_inline_len: 32,
    }
}

/// Commands then the error (if any) from decoding `input` fed in pieces of the given sizes
/// (the rest in one piece at the end). `sizes` empty = all at once.
fn decode_chunked(
    input: &[u8],
    sizes: &[usize],
    limits: Limits,
) -> (Vec<Args>, Option<ProtocolError>) {
    let mut d = RequestDecoder::new(limits);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut at = 0;
    let mut sizes = sizes.iter();
    while at < input.len() {
        let n = sizes
            .next()
            .copied()
            .unwrap_or(input.len())
            .clamp(1, input.len() - at);
        buf.extend_from_slice(&input[at..at + n]);
        at += n;
        loop {
            match d.decode(&mut buf) {
                Ok(Some(args)) => {
                    assert!(!args.is_empty(), "decode returned an empty command");
                    out.push(args);
                }
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

/// `ReplyScanner` fed in pieces: the lengths of the replies it cut, then the error if any.
fn scan_chunked(
    input: &[u8],
    sizes: &[usize],
    limits: &Limits,
) -> (Vec<usize>, Option<ProtocolError>) {
    let mut sc = ReplyScanner::new();
    let mut lens = Vec::new();
    let (mut base, mut have) = (0, 0);
    let mut sizes = sizes.iter();
    while have < input.len() {
        let n = sizes
            .next()
            .copied()
            .unwrap_or(input.len())
            .clamp(1, input.len() - have);
        have += n;
        loop {
            match sc.scan(&input[base..have], limits) {
                Ok(Some(len)) => {
                    assert!(len > 0 && base + len <= have);
                    lens.push(len);
                    base += len;
                }
                Ok(None) => break,
                Err(e) => return (lens, Some(e)),
            }
        }
    }
    (lens, None)
}

/// The same cuts made with `reply_len` on the whole input.
fn cut_whole(input: &[u8], limits: &Limits) -> (Vec<usize>, Option<ProtocolError>) {
    let mut lens = Vec::new();
    let mut base = 0;
    loop {
        match reply_len(&input[base..], limits) {
            Ok(Some(len)) => {
                assert!(len > 0 && base + len <= input.len());
                lens.push(len);
                base += len;
            }
            Ok(None) => return (lens, None),
            Err(e) => return (lens, Some(e)),
        }
    }
}

/// Bytes that look a lot like RESP, so the fuzzing reaches deep into the parsers.
fn resp_ish() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"*".to_vec()),
        Just(b"$".to_vec()),
        Just(b"+".to_vec()),
        Just(b"-".to_vec()),
        Just(b":".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"0".to_vec()),
        Just(b"1".to_vec()),
        Just(b"2".to_vec()),
        Just(b"3".to_vec()),
        Just(b"17".to_vec()),
        Just(b"99999999999999999999".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\t".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"'".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"\\x".to_vec()),
        Just(b"a".to_vec()),
        Just(b"\0".to_vec()),
        Just(b"*1\r\n$1\r\nx\r\n".to_vec()),
        Just(b"*2\r\n".to_vec()),
        Just(b"$3\r\nabc\r\n".to_vec()),
        any::<u8>().prop_map(|b| vec![b]),
    ];
    prop::collection::vec(piece, 0..64).prop_map(|v| v.concat())
}

fn any_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![prop::collection::vec(any::<u8>(), 0..256), resp_ish()]
}

fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..12, 0..64)
}

fn line_text() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(
        any::<u8>().prop_filter("no CR/LF", |b| *b != b'\r' && *b != b'\n'),
        0..12,
    )
    .prop_map(Bytes::from)
}

fn frame() -> impl Strategy<Value = Frame> {
    let leaf = prop_oneof![
        line_text().prop_map(Frame::Simple),
        line_text().prop_map(Frame::Error),
        any::<i64>().prop_map(Frame::Integer),
        prop::collection::vec(any::<u8>(), 0..24).prop_map(|v| Frame::Bulk(Bytes::from(v))),
        Just(Frame::Null),
        Just(Frame::NullArray),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop::collection::vec(inner, 0..8).prop_map(Frame::Array)
    })
}

/// Quotes `arg` the way `redis-cli` / `sdscatrepr` does, for an inline command.
fn quote(arg: &[u8]) -> String {
    let mut s = String::from("\"");
    for &b in arg {
        match b {
            b'\\' => s.push_str("\\\\"),
            b'"' => s.push_str("\\\""),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            b'\t' => s.push_str("\\t"),
            0x07 => s.push_str("\\a"),
            0x08 => s.push_str("\\b"),
            0x20..=0x7e => s.push(char::from(b)),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s.push('"');
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// (1) No byte string makes the decoder panic or loop, and the outcome does not depend on
    /// how the bytes were split into reads.
    #[test]
    fn decode_never_panics_and_ignores_chunking(input in any_input(), sizes in chunk_sizes()) {
        for limits in [small_limits(), Limits::default()] {
            let whole = decode_chunked(&input, &[], limits);
            let parts = decode_chunked(&input, &sizes, limits);
            prop_assert_eq!(&parts, &whole);
            let bytewise = decode_chunked(&input, &vec![1; input.len()], limits);
            prop_assert_eq!(&bytewise, &whole);
        }
    }

    /// (1) No byte string makes `reply_len`, `ReplyScanner` or `parse_reply` panic; the
    /// scanner agrees with `reply_len` however the bytes arrive, and every cut reply parses.
    #[test]
    fn replies_never_panic(input in any_input(), sizes in chunk_sizes()) {
        for limits in [small_limits(), Limits::default()] {
            let whole = cut_whole(&input, &limits);
            let parts = scan_chunked(&input, &sizes, &limits);
            prop_assert_eq!(&parts, &whole);
            let mut base = 0;
            for len in &whole.0 {
                let cut = Bytes::copy_from_slice(&input[base..base + len]);
                prop_assert!(parse_reply(&cut).is_ok(), "cut reply does not parse: {:?}", cut);
                base += len;
            }
        }
        let _ = parse_reply(&Bytes::from(input));
    }

    /// (2) encode_command then decode gives the args back, however the bytes are split.
    #[test]
    fn encoded_commands_round_trip(
        cmds in prop::collection::vec(
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..8),
            1..6,
        ),
        sizes in chunk_sizes(),
    ) {
        let mut wire = BytesMut::new();
        for c in &cmds {
            encode_command(c, &mut wire);
        }
        let expect: Vec<Args> = cmds
            .iter()
            .map(|c| c.iter().map(|a| Bytes::copy_from_slice(a)).collect())
            .collect();
        prop_assert_eq!(decode_chunked(&wire, &[], Limits::default()), (expect.clone(), None));
        prop_assert_eq!(decode_chunked(&wire, &sizes, Limits::default()), (expect.clone(), None));
        prop_assert_eq!(
            decode_chunked(&wire, &vec![1; wire.len()], Limits::default()),
            (expect, None)
        );
    }

    /// (2, inline) args quoted like `redis-cli` does come back from an inline command.
    #[test]
    fn quoted_inline_commands_round_trip(
        args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 1..6),
        crlf in any::<bool>(),
        sizes in chunk_sizes(),
    ) {
        let mut line = args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
        line.push_str(if crlf { "\r\n" } else { "\n" });
        let expect: Vec<Args> = vec![args.iter().map(|a| Bytes::copy_from_slice(a)).collect()];
        prop_assert_eq!(decode_chunked(line.as_bytes(), &sizes, Limits::default()), (expect, None));
    }

    /// (3) Frame::encode, then reply_len finds exactly its length (and nothing in any prefix),
    /// and parse_reply gives the frame back.
    #[test]
    fn frames_round_trip(f in frame(), sizes in chunk_sizes()) {
        let wire = f.to_bytes();
        let limits = Limits::default();
        prop_assert_eq!(reply_len(&wire, &limits), Ok(Some(wire.len())));
        for cut in 0..wire.len() {
            prop_assert_eq!(reply_len(&wire[..cut], &limits), Ok(None));
        }
        prop_assert_eq!(scan_chunked(&wire, &sizes, &limits), (vec![wire.len()], None));
        prop_assert_eq!(parse_reply(&wire), Ok(f));
    }
}

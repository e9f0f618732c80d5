//! The request decoder's tests: multibulk and inline commands, limits, partial reads.

use super::*;

fn lim(bulk: usize, mbulk: usize, inline: usize) -> Limits {
    Limits {
        max_bulk_len: bulk,
        max_multibulk_len: mbulk,
        max_inline_len: inline,
    }
}

/// Everything `decode` yields for `input` given at once: commands, then the error if any,
/// and the bytes left over.
fn all_at_once(input: &[u8], limits: Limits) -> (Vec<Args>, Option<ProtocolError>, usize) {
    let mut d = RequestDecoder::new(limits);
    let mut buf = BytesMut::from(input);
    let mut out = Vec::new();
    loop {
        match d.decode(&mut buf) {
            Ok(Some(a)) => out.push(a),
            Ok(None) => return (out, None, buf.len()),
            Err(e) => return (out, Some(e), buf.len()),
        }
    }
}

/// The same, fed in chunks of `step` bytes.
fn chunked(input: &[u8], limits: Limits, step: usize) -> (Vec<Args>, Option<ProtocolError>, usize) {
    let mut d = RequestDecoder::new(limits);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for chunk in input.chunks(step) {
        buf.extend_from_slice(chunk);
        loop {
            match d.decode(&mut buf) {
                Ok(Some(a)) => out.push(a),
                Ok(None) => break,
                Err(e) => return (out, Some(e), buf.len()),
            }
        }
    }
    (out, None, buf.len())
}

fn args(v: &[&[u8]]) -> Args {
    v.iter().map(|a| Bytes::copy_from_slice(a)).collect()
}

fn one(input: &[u8]) -> Args {
    let (cmds, err, rest) = all_at_once(input, Limits::default());
    assert_eq!(err, None, "{:?}", String::from_utf8_lossy(input));
    assert_eq!(cmds.len(), 1, "{:?}", String::from_utf8_lossy(input));
    assert_eq!(rest, 0);
    cmds.into_iter().next().unwrap()
}

fn err_of(input: &[u8], limits: Limits) -> String {
    let (_, err, _) = all_at_once(input, limits);
    err.unwrap_or_else(|| panic!("no error for {:?}", String::from_utf8_lossy(input)))
        .to_string()
}

fn err(input: &[u8]) -> String {
    err_of(input, Limits::default())
}

#[test]
fn short_bulk_headers_read_like_the_general_path() {
    for (input, want) in [
        (
            &b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n"[..],
            Ok(vec![&b"GET"[..], b""]),
        ),
        (b"*1\r\n$9\r\n123456789\r\n", Ok(vec![b"123456789"])),
        (b"*1\r\n$10\r\n1234567890\r\n", Ok(vec![b"1234567890"])),
        (b"*1\r\n$00\r\n\r\n", Err("invalid bulk length")),
        (b"*1\r\n$01\r\nx\r\n", Err("invalid bulk length")),
        (
            b"*1\r\n$3\r\nabcd\r\n",
            Err("bulk data not terminated by CRLF"),
        ),
        (b"*1\r\n$6\r\nabcdef\r\n", Err("invalid bulk length")),
        (b"*1\r\n$12\r\nabcdefghijkl\r\n", Err("invalid bulk length")),
        (b"*0\r\n*1\r\n$1\r\nx\r\n", Ok(vec![b"x"])),
        (b"*00\r\n", Err("invalid multibulk length")),
        (b"*17\r\n", Err("invalid multibulk length")),
        (b"*-1\r\n*1\r\n$1\r\ny\r\n", Ok(vec![b"y"])),
    ] {
        let mut d = RequestDecoder::new(lim(5, 16, 64));
        if input.windows(3).any(|w| w == b"$9\r" || w == b"$10") {
            d = RequestDecoder::new(lim(100, 16, 64));
        }
        let got = d.decode(&mut BytesMut::from(input));
        match want {
            Ok(args) => {
                let args: Vec<Bytes> = args.into_iter().map(Bytes::copy_from_slice).collect();
                assert_eq!(got.unwrap(), Some(args), "{input:?}");
            }
            Err(e) => assert_eq!(got.unwrap_err().0, e, "{input:?}"),
        }
    }
    // Arriving a byte at a time: the same command.
    let whole = b"*2\r\n$3\r\nGET\r\n$12\r\nabcdefghijkl\r\n";
    let mut d = RequestDecoder::default();
    let mut buf = BytesMut::new();
    let mut got = None;
    for &b in whole.iter() {
        buf.extend_from_slice(&[b]);
        if let Some(args) = d.decode(&mut buf).unwrap() {
            got = Some(args);
        }
    }
    assert_eq!(
        got.unwrap(),
        vec![
            Bytes::from_static(b"GET"),
            Bytes::from_static(b"abcdefghijkl")
        ]
    );
}

#[test]
fn a_multibulk_frame_is_what_encoding_its_args_gives() {
    let mut d = RequestDecoder::default();
    let mut buf = BytesMut::new();
    let cmds: Vec<Vec<&[u8]>> = vec![
        vec![b"GET", b"k"],
        vec![b"SET", b"key:1", &[b'v'; 300][..]],
        vec![b"set", b"", b"\r\n"],
        vec![b"PING"],
    ];
    for c in &cmds {
        crate::resp::encode_command(c, &mut buf);
    }
    // An empty command between them is skipped, and an inline one has no frame.
    buf.extend_from_slice(b"*0\r\nPING x\r\n");
    for c in &cmds {
        let (args, frame) = d.decode_frame(&mut buf).unwrap().unwrap();
        let mut again = BytesMut::new();
        crate::resp::encode_command(&args, &mut again);
        assert_eq!(frame.as_deref(), Some(&again[..]), "{c:?}");
    }
    let (args, frame) = d.decode_frame(&mut buf).unwrap().unwrap();
    assert_eq!(
        args,
        vec![Bytes::from_static(b"PING"), Bytes::from_static(b"x")]
    );
    assert_eq!(frame, None);
    // Lengths that are not canonical are refused, so a frame never differs from that.
    for bad in [
        &b"*2\r\n$03\r\nGET\r\n$1\r\nk\r\n"[..],
        b"*02\r\n$3\r\nGET\r\n$1\r\nk\r\n",
        b"*2\r\n$+3\r\nGET\r\n$1\r\nk\r\n",
    ] {
        let mut d = RequestDecoder::default();
        let mut b = BytesMut::from(bad);
        assert!(d.decode_frame(&mut b).is_err(), "{bad:?}");
    }
}

#[test]
fn resp_multibulk_basic() {
    assert_eq!(
        one(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"),
        args(&[b"SET", b"k", b""])
    );
    assert_eq!(one(b"*1\r\n$4\r\nPING\r\n"), args(&[b"PING"]));
}

#[test]
fn resp_multibulk_is_zero_copy() {
    let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"[..]);
    let base = buf.as_ptr() as usize;
    let a = RequestDecoder::default().decode(&mut buf).unwrap().unwrap();
    assert_eq!(a[0].as_ptr() as usize, base + 8);
    assert_eq!(a[1].as_ptr() as usize, base + 17);
    assert!(buf.is_empty());
}

#[test]
fn resp_binary_safe_bulk() {
    let a = one(b"*2\r\n$3\r\nSET\r\n$6\r\n\r\n\0*$\n\r\n");
    assert_eq!(a, args(&[b"SET", b"\r\n\0*$\n"]));
    let a = one(b"*1\r\n$2\r\n\r\n\r\n");
    assert_eq!(a, args(&[b"\r\n"]));
}

#[test]
fn resp_empty_commands_are_skipped() {
    let (cmds, e, rest) = all_at_once(
        b"*0\r\n*-1\r\n*-7\r\n\r\n\n   \r\n\t\n*1\r\n$1\r\nA\r\n",
        Limits::default(),
    );
    assert_eq!(e, None);
    assert_eq!(cmds, vec![args(&[b"A"])]);
    assert_eq!(rest, 0);
    // a lone skipped command leaves an empty buffer and no command
    let (cmds, e, rest) = all_at_once(b"*0\r\n", Limits::default());
    assert!(cmds.is_empty() && e.is_none() && rest == 0);
}

#[test]
fn resp_pipelined_1000() {
    let mut input = BytesMut::new();
    for i in 0..1000 {
        if i % 10 == 9 {
            input.extend_from_slice(format!("GET key:{i}\r\n").as_bytes());
        } else {
            let v = format!("value-{i}");
            super::super::encode_command(&["SET", &format!("key:{i}"), &v], &mut input);
        }
    }
    let (cmds, e, rest) = all_at_once(&input, Limits::default());
    assert_eq!(e, None);
    assert_eq!(rest, 0);
    assert_eq!(cmds.len(), 1000);
    for (i, c) in cmds.iter().enumerate() {
        if i % 10 == 9 {
            assert_eq!(c, &args(&[b"GET", format!("key:{i}").as_bytes()]));
        } else {
            assert_eq!(
                c,
                &args(&[
                    b"SET",
                    format!("key:{i}").as_bytes(),
                    format!("value-{i}").as_bytes()
                ])
            );
        }
    }
    for step in [1, 2, 3, 7, 64, 4096] {
        assert_eq!(
            chunked(&input, Limits::default(), step),
            (cmds.clone(), None, 0)
        );
    }
}

#[test]
fn resp_partial_input_matches_whole() {
    let small = lim(16, 4, 24);
    let cases: Vec<&[u8]> = vec![
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n\n*0\r\n*1\r\n$1\r\nx\r\n",
        b"set a \"b\\x41\\n\" 'c\\'d'\r\nget a\n",
        b"*2\r\n$3\r\nGET\r\n$3\r\nabcXY",
        b"*2\r\n$3\r\nGET\r\nx3\r\n",
        b"*2\r\n$3\r\nGET\r\n$-1\r\n",
        b"*2\r\n$3\r\nGET\r\n$17\r\n",
        b"*5\r\n",
        b"*x\r\n",
        b"*1\rx",
        b"echo \"unterminated\r\n",
        b"echo 0123456789012345678901234567890\r\n",
        b"echo 0123456789012345678\r\n",
        b"*1\r\n$3\r\nabc\r\necho 0123456789012345678901234567890",
    ];
    for input in cases {
        for limits in [Limits::default(), small] {
            let whole = all_at_once(input, limits);
            for step in 1..=input.len() {
                let parts = chunked(input, limits, step);
                assert_eq!(
                    (&parts.0, &parts.1),
                    (&whole.0, &whole.1),
                    "input {:?} step {step}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }
}

#[test]
fn resp_incomplete_leaves_buffer_alone() {
    let full = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n";
    for cut in 0..full.len() {
        let mut d = RequestDecoder::default();
        let mut buf = BytesMut::from(&full[..cut]);
        assert_eq!(d.decode(&mut buf), Ok(None), "cut {cut}");
        assert_eq!(&buf[..], &full[..cut]);
        assert_eq!(d.decode(&mut buf), Ok(None), "cut {cut} again");
        buf.extend_from_slice(&full[cut..]);
        assert_eq!(d.decode(&mut buf), Ok(Some(args(&[b"GET", b"key"]))));
        assert!(buf.is_empty());
    }
}

#[test]
fn resp_replaced_buffer_does_not_panic() {
    let mut d = RequestDecoder::default();
    let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$3\r\nke"[..]);
    assert_eq!(d.decode(&mut buf), Ok(None));
    let mut other = BytesMut::from(&b"PING\r\n"[..]);
    assert_eq!(d.decode(&mut other), Ok(Some(args(&[b"PING"]))));
    d.reset();
    let mut buf = BytesMut::from(&b"*1\r\n$4\r\nPING\r\n"[..]);
    assert_eq!(d.decode(&mut buf), Ok(Some(args(&[b"PING"]))));
}

#[test]
fn resp_multibulk_errors() {
    assert_eq!(err(b"*x\r\n"), "Protocol error: invalid multibulk length");
    assert_eq!(err(b"*\r\n"), "Protocol error: invalid multibulk length");
    assert_eq!(err(b"*01\r\n"), "Protocol error: invalid multibulk length");
    assert_eq!(err(b"*+1\r\n"), "Protocol error: invalid multibulk length");
    assert_eq!(err(b"*1 \r\n"), "Protocol error: invalid multibulk length");
    assert_eq!(err(b"*1\rX"), "Protocol error: invalid multibulk length");
    assert_eq!(
        err(b"*99999999999999999999\r\n"),
        "Protocol error: invalid multibulk length"
    );
    assert_eq!(
        err(b"*1048577\r\n"),
        "Protocol error: invalid multibulk length"
    );
    assert_eq!(all_at_once(b"*1048576\r\n", Limits::default()).1, None);
    assert_eq!(
        err_of(b"*5\r\n", lim(10, 4, 10)),
        "Protocol error: invalid multibulk length"
    );
    let mut long = b"*".to_vec();
    long.extend(std::iter::repeat_n(b'1', MAX_HEADER_LINE));
    assert_eq!(all_at_once(&long, Limits::default()).1, None);
    long.push(b'1');
    assert_eq!(err(&long), "Protocol error: too big mbulk count string");
}

#[test]
fn resp_bulk_errors() {
    assert_eq!(
        err(b"*1\r\nx3\r\nabc\r\n"),
        "Protocol error: expected '$', got 'x'"
    );
    assert_eq!(
        err(b"*1\r\n:3\r\nabc\r\n"),
        "Protocol error: expected '$', got ':'"
    );
    assert_eq!(
        err(b"*1\r\n\r\n"),
        "Protocol error: expected '$', got '\\x0d'"
    );
    assert_eq!(err(b"*1\r\n$-1\r\n"), "Protocol error: invalid bulk length");
    assert_eq!(err(b"*1\r\n$x\r\n"), "Protocol error: invalid bulk length");
    assert_eq!(err(b"*1\r\n$\r\n"), "Protocol error: invalid bulk length");
    assert_eq!(err(b"*1\r\n$3\rx"), "Protocol error: invalid bulk length");
    assert_eq!(
        err(b"*1\r\n$536870913\r\n"),
        "Protocol error: invalid bulk length"
    );
    assert_eq!(
        all_at_once(b"*1\r\n$536870912\r\n", Limits::default()).1,
        None
    );
    assert_eq!(
        err_of(b"*1\r\n$11\r\n", lim(10, 10, 10)),
        "Protocol error: invalid bulk length"
    );
    assert_eq!(
        err(b"*1\r\n$3\r\nabcd\r\n"),
        "Protocol error: bulk data not terminated by CRLF"
    );
    assert_eq!(
        err(b"*1\r\n$3\r\nabc\n\r"),
        "Protocol error: bulk data not terminated by CRLF"
    );
    let mut long = b"*1\r\n$".to_vec();
    long.extend(std::iter::repeat_n(b'1', MAX_HEADER_LINE));
    assert_eq!(all_at_once(&long, Limits::default()).1, None);
    long.push(b'1');
    assert_eq!(err(&long), "Protocol error: too big bulk count string");
}

#[test]
fn resp_inline_basic() {
    assert_eq!(one(b"PING\r\n"), args(&[b"PING"]));
    assert_eq!(one(b"PING\n"), args(&[b"PING"]));
    assert_eq!(
        one(b"  set\tkey   value \r\n"),
        args(&[b"set", b"key", b"value"])
    );
    assert_eq!(one(b"get a\rb\n"), args(&[b"get", b"a", b"b"]));
    // like Redis, an inline line ends at its first NUL
    assert_eq!(one(b"get a\0b c\r\n"), args(&[b"get", b"a"]));
    // \v and \f separate only before an argument, not inside one (sdssplitargs)
    assert_eq!(one(b"\x0bget a\x0bb\n"), args(&[b"get", b"a\x0bb"]));
    let (cmds, e, rest) = all_at_once(b"PING", Limits::default());
    assert!(cmds.is_empty() && e.is_none() && rest == 4);
}

#[test]
fn resp_inline_is_zero_copy_without_escapes() {
    let mut buf = BytesMut::from(&b"set \"k y\" 'v'\r\n"[..]);
    let base = buf.as_ptr() as usize;
    let a = RequestDecoder::default().decode(&mut buf).unwrap().unwrap();
    assert_eq!(a, args(&[b"set", b"k y", b"v"]));
    assert_eq!(a[0].as_ptr() as usize, base);
    assert_eq!(a[1].as_ptr() as usize, base + 5);
    assert_eq!(a[2].as_ptr() as usize, base + 11);
}

#[test]
fn resp_inline_quoting() {
    assert_eq!(
        one(b"set \"a b\" 'c d'\r\n"),
        args(&[b"set", b"a b", b"c d"])
    );
    assert_eq!(
        one(b"set k \"\\n\\r\\t\\b\\a\\\\\\\"\\x41\\xfF\\q\"\r\n"),
        args(&[b"set", b"k", b"\n\r\t\x08\x07\\\"A\xffq"])
    );
    assert_eq!(one(b"set k \"\\x4\"\r\n"), args(&[b"set", b"k", b"x4"]));
    assert_eq!(one(b"set k \"\\x4g\"\r\n"), args(&[b"set", b"k", b"x4g"]));
    assert_eq!(
        one(b"set k '\\'\\n\"'\r\n"),
        args(&[b"set", b"k", b"'\\n\""])
    );
    assert_eq!(one(b"set k \"\" ''\r\n"), args(&[b"set", b"k", b"", b""]));
    // quotes inside an argument open a quoted part
    assert_eq!(one(b"set a\"b c\" d\n"), args(&[b"set", b"ab c", b"d"]));
    assert_eq!(one(b"a'b c'\n"), args(&[b"ab c"]));
    // a closing quote may end the line or be followed by any blank
    assert_eq!(one(b"a \"b\"\tc\n"), args(&[b"a", b"b", b"c"]));
    assert_eq!(one(b"a \"b\"\x0bc\n"), args(&[b"a", b"b", b"c"]));
    assert_eq!(one(b"a \"b\"\n"), args(&[b"a", b"b"]));
    assert_eq!(one(b"a \"\\x00\"\n"), args(&[b"a", b"\0"]));
}

#[test]
fn resp_inline_errors() {
    let unb = "Protocol error: unbalanced quotes in request";
    assert_eq!(err(b"set \"a\r\n"), unb);
    assert_eq!(err(b"set 'a\n"), unb);
    assert_eq!(err(b"set \"a\"b\n"), unb);
    assert_eq!(err(b"set 'a'b\n"), unb);
    assert_eq!(err(b"set a\"b c\"d\n"), unb);
    assert_eq!(err(b"set \"a\\\"\n"), unb);
    assert_eq!(err(b"set 'a\\'\n"), unb);
    // the NUL cuts the line inside the quotes
    assert_eq!(err(b"set \"a\0\"\n"), unb);

    let small = lim(100, 100, 8);
    assert_eq!(
        all_at_once(b"12345678\n", small).0,
        vec![args(&[b"12345678"])]
    );
    assert_eq!(
        all_at_once(b"1234567\r\n", small).0,
        vec![args(&[b"1234567"])]
    );
    assert_eq!(
        err_of(b"123456789\n", small),
        "Protocol error: too big inline request"
    );
    assert_eq!(
        err_of(b"123456789", small),
        "Protocol error: too big inline request"
    );
    assert_eq!(all_at_once(b"12345678", small).1, None);
    let mut long = vec![b'a'; 64 * 1024 + 1];
    assert_eq!(err(&long), "Protocol error: too big inline request");
    long.pop();
    assert_eq!(all_at_once(&long, Limits::default()).1, None);
}

#[test]
fn resp_big_bulk_in_64k_reads() {
    const LEN: usize = 32 * 1024 * 1024;
    let mut header = BytesMut::new();
    header.extend_from_slice(format!("*2\r\n$3\r\nSET\r\n${LEN}\r\n").as_bytes());
    let mut d = RequestDecoder::default();
    let mut buf = BytesMut::with_capacity(LEN + 64);
    buf.extend_from_slice(&header);
    assert_eq!(d.decode(&mut buf), Ok(None));
    assert_eq!(d.bulk_end_hint(), Some(header.len() + LEN + 2));
    let chunk = vec![b'\r'; 64 * 1024];
    let mut left = LEN;
    let mut calls = 0;
    while left > 0 {
        let n = left.min(chunk.len());
        buf.extend_from_slice(&chunk[..n]);
        left -= n;
        calls += 1;
        assert_eq!(d.decode(&mut buf), Ok(None));
    }
    assert_eq!(calls, LEN / (64 * 1024));
    buf.extend_from_slice(b"\r");
    assert_eq!(d.decode(&mut buf), Ok(None));
    buf.extend_from_slice(b"\nPING\r\n");
    let a = d.decode(&mut buf).unwrap().unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(a[1].len(), LEN);
    assert_eq!(d.bulk_end_hint(), None);
    assert_eq!(d.decode(&mut buf), Ok(Some(args(&[b"PING"]))));
}

#[test]
fn resp_many_elements_resume() {
    // A 100k-element command fed in small pieces: each call resumes where the last one
    // stopped (this would be quadratic if every call re-scanned the earlier elements).
    let n = 100_000;
    let items: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let mut input = BytesMut::new();
    super::super::encode_command(&items, &mut input);
    let (cmds, e, _) = chunked(&input, Limits::default(), 16);
    assert_eq!(e, None);
    assert_eq!(cmds.len(), 1);
    assert_eq!(cmds[0].len(), n);
    assert_eq!(&cmds[0][n - 1][..], format!("{}", n - 1).as_bytes());
}

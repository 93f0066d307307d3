//! The RESP2 wire format: commands encoded as arrays of bulk strings, replies parsed from a
//! buffer that may hold less than one of them.

use super::Reply;

pub(super) fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    header(out, b'*', args.len());
    for a in args {
        header(out, b'$', a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes `<kind><n>\r\n` without going through `fmt`.
fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// Longest bulk string accepted: Redis's own `proto-max-bulk-len` default.
const MAX_BULK_LEN: usize = 512 * 1024 * 1024;
/// Deepest nesting of arrays accepted; lock replies nest one level.
const MAX_DEPTH: usize = 32;

/// Parses one reply from the front of `buf`: `Ok(None)` when it is not complete yet. Malformed
/// input (a bad type byte or number, a length beyond [`MAX_BULK_LEN`], nesting beyond
/// [`MAX_DEPTH`]) is an error, never a panic.
pub(super) fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    parse_at(buf, 0)
}

fn parse_at(buf: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if end == 0 {
        return Err("empty reply line".into());
    }
    let kind = buf[0];
    let line = &buf[1..end];
    let text = || String::from_utf8_lossy(line).into_owned();
    let number = || -> Result<i64, String> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad number {:?}", String::from_utf8_lossy(line)))
    };
    let after = end + 2;
    match kind {
        b'+' => Ok(Some((Reply::Simple(text()), after))),
        b'-' => Ok(Some((Reply::Error(text()), after))),
        b':' => Ok(Some((Reply::Int(number()?), after))),
        b'$' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some((Reply::Bulk(None), after)));
            }
            let n = usize::try_from(n)
                .ok()
                .filter(|n| *n <= MAX_BULK_LEN)
                .ok_or_else(|| format!("bulk length {n} is too large"))?;
            // `after + n + 2` cannot overflow: n is bounded and `after` is within `buf`.
            let total = after + n + 2;
            if buf.len() < total {
                return Ok(None);
            }
            if &buf[after + n..total] != b"\r\n" {
                return Err("bulk string not terminated by CRLF".into());
            }
            Ok(Some((
                Reply::Bulk(Some(buf[after..after + n].to_vec())),
                total,
            )))
        }
        b'*' => {
            let n = number()?;
            if n < 0 {
                return Ok(Some((Reply::Array(None), after)));
            }
            if depth >= MAX_DEPTH {
                return Err(format!("arrays nested deeper than {MAX_DEPTH}"));
            }
            let mut items = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(1024));
            let mut at = after;
            for _ in 0..n {
                match parse_at(&buf[at..], depth + 1)? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(Some(items)), at)))
        }
        other => Err(format!("unexpected reply type byte {other:#x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    #[test]
    fn parses_every_reply_type_and_waits_for_incomplete_input() {
        let input = b"*3\r\n:1\r\n$3\r\nabc\r\n$-1\r\n+OK\r\n-ERR x\r\n";
        let (r, used) = parse(input).unwrap().unwrap();
        assert_eq!(
            r,
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Bulk(None)
            ]))
        );
        let (r, used2) = parse(&input[used..]).unwrap().unwrap();
        assert_eq!(r, Reply::Simple("OK".into()));
        assert_eq!(
            parse(&input[used + used2..]).unwrap().unwrap().0,
            Reply::Error("ERR x".into())
        );
        for cut in 1..used {
            assert_eq!(parse(&input[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b":abc\r\n").is_err());
    }

    #[test]
    fn huge_or_malformed_lengths_are_errors_not_panics() {
        let max = format!("${}\r\nx", i64::MAX);
        assert!(parse(max.as_bytes()).is_err());
        let near = format!("${}\r\n", usize::MAX - 1);
        assert!(parse(near.as_bytes()).is_err());
        assert!(parse(b"$536870913\r\n").is_err());
        assert_eq!(
            parse(b"$536870912\r\n").unwrap(),
            None,
            "allowed, incomplete"
        );
        assert!(parse(b"\r\n").is_err());
        assert!(parse(b"$3\r\nabcXY").is_err());
        let deep = "*1\r\n".repeat(10_000) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
        let long = format!("*{}\r\n:1\r\n", i64::MAX);
        assert_eq!(parse(long.as_bytes()).unwrap(), None);
    }

    /// Encodes a reply the way a server does.
    fn wire(reply: &Reply, out: &mut Vec<u8>) {
        match reply {
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => {
                header(out, b'$', b.len());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(Some(items)) => {
                header(out, b'*', items.len());
                for i in items {
                    wire(i, out);
                }
            }
        }
    }

    fn reply_strategy() -> impl Strategy<Value = Reply> {
        let line = "[a-zA-Z0-9 :_-]{0,12}";
        let leaf = prop_oneof![
            any::<i64>().prop_map(Reply::Int),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(Reply::Bulk),
            line.prop_map(Reply::Simple),
            line.prop_map(Reply::Error),
            Just(Reply::Array(None)),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            proptest::collection::vec(inner, 0..6).prop_map(|v| Reply::Array(Some(v)))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Whatever the server (or a man in the middle) sends, the parser answers with a
        /// reply, "incomplete" or an error.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        #[test]
        fn bytes_shaped_like_replies_never_panic(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(b"\r\n".to_vec()),
                    "[-+:$*?]-?[0-9]{0,20}".prop_map(String::into_bytes),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ],
                0..24,
            )
        ) {
            let bytes = parts.concat();
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
        }

        #[test]
        fn valid_frames_split_anywhere_parse_back_whole(
            replies in proptest::collection::vec(reply_strategy(), 1..4),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut bytes = Vec::new();
            for r in &replies {
                wire(r, &mut bytes);
            }
            // Arbitrary split: the first part alone is incomplete or whole replies, never an
            // error; the rest completes it.
            let cut = cut.index(bytes.len() + 1);
            let mut at = 0;
            let mut parsed = Vec::new();
            while let Some((r, used)) = parse(&bytes[at..cut]).map_err(TestCaseError::fail)? {
                parsed.push(r);
                at += used;
            }
            while at < bytes.len() {
                let (r, used) = parse(&bytes[at..])
                    .map_err(TestCaseError::fail)?
                    .ok_or_else(|| TestCaseError::fail("complete input reported incomplete"))?;
                parsed.push(r);
                at += used;
            }
            prop_assert_eq!(parsed, replies);
        }
    }

    #[test]
    fn encodes_binary_safe_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"a\r\nb", b""]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$4\r\na\r\nb\r\n$0\r\n\r\n");
    }
}

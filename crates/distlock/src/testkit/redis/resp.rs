//! Just enough RESP for [`RedisServer::cli`](super::RedisServer::cli): commands out, replies
//! (RESP2, or RESP3 should a test switch with `HELLO 3`) in and rendered as text.

use std::io::{self, BufRead};

/// Appends `args` as a RESP array of bulk strings.
pub(super) fn encode_command(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// One decoded reply; RESP3 scalars are folded into `Text`.
#[derive(Debug, PartialEq)]
pub(super) enum Reply {
    Text(String),
    Error(String),
    Nil,
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// Reads one line without its `\r\n`.
pub(super) fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "redis closed the connection before replying",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(invalid("reply line does not end with CRLF"));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| invalid("reply line is not UTF-8"))
}

fn read_len(text: &str) -> io::Result<i64> {
    text.parse()
        .map_err(|_| invalid(format!("bad length {text:?}")))
}

fn read_bulk(reader: &mut impl BufRead, len: i64) -> io::Result<Option<Vec<u8>>> {
    let Ok(len) = usize::try_from(len) else {
        return Ok(None); // -1: nil
    };
    let mut data = vec![0; len + 2];
    reader.read_exact(&mut data)?;
    if !data.ends_with(b"\r\n") {
        return Err(invalid("bulk string does not end with CRLF"));
    }
    data.truncate(len);
    Ok(Some(data))
}

fn read_items(reader: &mut impl BufRead, count: i64) -> io::Result<Reply> {
    let Ok(count) = usize::try_from(count) else {
        return Ok(Reply::Nil); // -1: nil array
    };
    let items = (0..count)
        .map(|_| read_reply(reader))
        .collect::<io::Result<Vec<_>>>()?;
    Ok(Reply::Array(items))
}

/// Reads one RESP2 (or RESP3, should a test switch with `HELLO 3`) reply.
pub(super) fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let Some(kind) = line.chars().next() else {
        return Err(invalid("empty reply line"));
    };
    let rest = &line[kind.len_utf8()..];
    Ok(match kind {
        '+' | ':' | ',' | '(' => Reply::Text(rest.to_owned()),
        '#' => Reply::Text(if rest == "t" { "true" } else { "false" }.to_owned()),
        '-' => Reply::Error(rest.to_owned()),
        '_' => Reply::Nil,
        '$' => match read_bulk(reader, read_len(rest)?)? {
            Some(data) => Reply::Bulk(data),
            None => Reply::Nil,
        },
        '=' => {
            // Verbatim string: a three-letter format and ':' precede the text.
            let data = read_bulk(reader, read_len(rest)?)?.unwrap_or_default();
            Reply::Bulk(data.get(4..).unwrap_or_default().to_vec())
        }
        '!' => {
            let data = read_bulk(reader, read_len(rest)?)?.unwrap_or_default();
            Reply::Error(String::from_utf8_lossy(&data).into_owned())
        }
        '*' | '~' | '>' => read_items(reader, read_len(rest)?)?,
        '%' => read_items(reader, read_len(rest)?.saturating_mul(2))?,
        '|' => {
            // Attributes annotate the reply that follows; skip them.
            read_items(reader, read_len(rest)?.saturating_mul(2))?;
            read_reply(reader)?
        }
        other => return Err(invalid(format!("unknown reply type {other:?}"))),
    })
}

pub(super) fn render(reply: &Reply) -> String {
    match reply {
        Reply::Text(text) => text.clone(),
        Reply::Error(text) => format!("(error) {text}"),
        Reply::Nil => "(nil)".to_owned(),
        Reply::Bulk(data) => String::from_utf8_lossy(data).into_owned(),
        Reply::Array(items) => items.iter().map(render).collect::<Vec<_>>().join("\n"),
    }
}

//! `zk://` URLs, and the mapping of keys to ZooKeeper path components.

use super::*;
use crate::url::{parse_bool, parse_hosts, Decode, Params, RawUrl, UserInfo};

/// Characters ZooKeeper refuses in a path (`PathUtils.validatePath`, on Java's UTF-16 units:
/// surrogates cover every character beyond the Basic Multilingual Plane).
pub(super) fn forbidden_in_path(c: char) -> bool {
    // Rust chars are never surrogates, so U+D800..U+DFFF needs no test of its own.
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..)
}

/// Maps a key (or prefix) to one ZooKeeper path component: `/`, `%` and the characters
/// ZooKeeper forbids are percent-encoded (their UTF-8 bytes, upper-case hex), and `.` and `..`
/// become `%2E` and `%2E%2E`. Everything else is kept. Reversed by [`decode_key`].
///
/// ```
/// use distlock::backends::zookeeper::{decode_key, encode_key};
/// assert_eq!(encode_key("voucher:42"), "voucher:42");
/// assert_eq!(encode_key("a/b%c"), "a%2Fb%25c");
/// assert_eq!(encode_key(".."), "%2E%2E");
/// assert_eq!(decode_key("a%2Fb%25c").as_deref(), Some("a/b%c"));
/// ```
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c == '/' || c == '%' || forbidden_in_path(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    if out == "." || out == ".." {
        out = out.replace('.', "%2E");
    }
    out
}

/// Undoes [`encode_key`]; `None` when `component` is not valid percent-encoded UTF-8.
pub fn decode_key(component: &str) -> Option<String> {
    percent_decode(component)
}

/// `500ms`, `30s`, `2m` or plain seconds, and not zero.
pub(super) fn parse_duration(param: &str, value: &str) -> Result<Duration> {
    let d = crate::url::parse_duration("zk", param, value)?;
    if d.is_zero() {
        return Err(Error::config(format!(
            "zk URL: the query parameter '{param}' must not be zero"
        )));
    }
    Ok(d)
}

/// The TLS files of a `zks://` URL (paths as given).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TlsFiles {
    /// `ca_file`: PEM certificates of the authorities to verify the servers against.
    pub(super) ca_file: String,
    /// `cert_file` and `key_file`: the client's certificate chain and key (PEM).
    pub(super) identity: Option<(String, String)>,
}

/// What a `zk://` (or `zks://`) URL says.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ParsedUrl {
    pub(super) hosts: String,
    pub(super) auth: Option<(String, String)>,
    pub(super) options: ZooKeeperOptions,
    /// `Some` for `zks://`: every server is reached over TLS and verified.
    pub(super) tls: Option<TlsFiles>,
}

pub(super) fn parse_url(url: &str, mut options: ZooKeeperOptions) -> Result<ParsedUrl> {
    let shown = crate::redact(url);
    let err = |what: String| Error::config(format!("zk URL {shown:?}: {what}"));
    let raw = RawUrl::split(url);
    let scheme = raw.map(|r| r.scheme.to_ascii_lowercase());
    let (tls, raw) = match (scheme.as_deref(), raw) {
        (Some("zk" | "zookeeper"), Some(raw)) => (false, raw),
        (Some("zks"), Some(raw)) => (true, raw),
        _ => return Err(err("expected the scheme zk:// or zks:// (TLS)".into())),
    };
    let auth = match raw.userinfo {
        None => None,
        Some(ui) => {
            let ui = UserInfo::parse(ui, Decode::Strict).map_err(err)?;
            let pass = ui
                .password
                .ok_or_else(|| err("the password is missing (expected user:password@)".into()))?;
            Some((ui.user, pass))
        }
    };
    let hosts = parse_hosts(raw.hosts, DEFAULT_PORT).map_err(err)?;
    let root =
        percent_decode(raw.path).ok_or_else(|| err("the root path is badly encoded".into()))?;
    let root = root.trim_end_matches('/');
    if !root.is_empty() {
        for comp in root[1..].split('/') {
            if comp.is_empty() || comp == "." || comp == ".." || comp.chars().any(forbidden_in_path)
            {
                return Err(err(format!(
                    "the root path {root:?} is not a valid ZooKeeper path (component {comp:?})"
                )));
            }
        }
        if root == "/zookeeper" || root.starts_with("/zookeeper/") {
            return Err(err(
                "the root path /zookeeper is reserved by ZooKeeper".into()
            ));
        }
        options.root = Some(root.to_owned());
    }
    let mut params = Params::raw("zk", raw.query);
    let mut file = |name: &str| {
        let decoded = params
            .string(name)
            .map(|v| percent_decode(&v).filter(|f| !f.is_empty()));
        decoded
            .map(|f| f.ok_or_else(|| err(format!("{name}: expected a file name"))))
            .transpose()
    };
    let (ca_file, cert_file, key_file) = (file("ca_file")?, file("cert_file")?, file("key_file")?);
    for (name, field) in [
        ("session_timeout", &mut options.session_timeout),
        ("connect_timeout", &mut options.connect_timeout),
        ("request_timeout", &mut options.request_timeout),
        ("waiter_ttl", &mut options.waiter_ttl),
    ] {
        if let Some(v) = params.string(name) {
            *field = parse_duration(name, &v)?;
        }
    }
    // A bare `allow_insecure_auth` (or `spring`) is a yes.
    let mut flag = |name: &str| match params.string(name) {
        Some(v) => Ok::<_, Error>(v.is_empty() || parse_bool("zk", name, &v)?),
        None => Ok(false),
    };
    let (insecure_auth, spring) = (flag("allow_insecure_auth")?, flag("spring")?);
    params.finish(&[
        "session_timeout",
        "connect_timeout",
        "request_timeout",
        "waiter_ttl",
        "allow_insecure_auth",
        "spring",
        "ca_file",
        "cert_file",
        "key_file",
    ])?;
    // Spring's registry keeps its locks under its own root unless told otherwise: a user who
    // turns on Spring compatibility and sets nothing else meets an unchanged Spring service.
    if spring && options.root.is_none() {
        options.root = Some(SPRING_ROOT.to_owned());
    }
    if !tls && (ca_file.is_some() || cert_file.is_some() || key_file.is_some()) {
        return Err(err(
            "ca_file, cert_file and key_file need zks:// (TLS)".into()
        ));
    }
    let identity = match (cert_file, key_file) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err(err(
                "cert_file and key_file go together (the client certificate and its key)".into(),
            ))
        }
    };
    let tls =
        match (tls, ca_file) {
            (false, _) => None,
            (true, Some(ca_file)) => Some(TlsFiles { ca_file, identity }),
            // ZooKeeper servers carry certificates of a private CA as a rule; the client verifies
            // against the CA it is given, never against nothing.
            (true, None) => return Err(err(
                "zks:// needs ca_file=<PEM file of the CA that signed the servers' certificates>"
                    .into(),
            )),
        };
    // ZooKeeper's digest scheme sends the password itself; without TLS anybody on the path
    // reads it. Over zks:// the server is verified against the CA first.
    if auth.is_some() && tls.is_none() && !insecure_auth {
        return Err(err(
            "zk:// would send the password in clear: use zks:// (TLS) with ca_file=, or add \
             allow_insecure_auth=true to send it unencrypted anyway (only on a network you trust)"
                .into(),
        ));
    }
    Ok(ParsedUrl {
        hosts: hosts
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        auth,
        options,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_one_reversible_component() {
        for key in [
            "voucher:42",
            "a/b",
            "/",
            "%2F",
            "a b",
            "ünï cødé ✓",
            "emoji 🦀",
            "tab\tx",
            "\u{7f}\u{85}",
            "\u{e000}private",
            ".",
            "..",
            "...",
            "zookeeper",
        ] {
            let enc = encode_key(key);
            assert!(!enc.contains('/'), "{key:?} -> {enc:?}");
            assert!(!enc.chars().any(forbidden_in_path), "{key:?} -> {enc:?}");
            assert!(enc != "." && enc != "..", "{key:?} -> {enc:?}");
            assert_eq!(decode_key(&enc).as_deref(), Some(key), "{enc:?}");
        }
        assert_eq!(encode_key("voucher:42"), "voucher:42");
        assert_eq!(encode_key("a/b"), "a%2Fb");
        assert_eq!(encode_key("🦀"), "%F0%9F%A6%80");
        assert_eq!(encode_key("..."), "...");
        assert_ne!(encode_key("a/b"), encode_key("a%2Fb"));
    }

    #[test]
    fn urls_parse() {
        let p = parse_url(
            "zk://u%40x:p%3Ass@127.0.0.1:2181,[::1]:2182,zk3/SpringIntegration-LockRegistry?session_timeout=10s&request_timeout=500ms&allow_insecure_auth=true",
            ZooKeeperOptions::default(),
        )
        .unwrap();
        assert_eq!(p.hosts, "127.0.0.1:2181,[::1]:2182,zk3:2181");
        assert_eq!(p.auth, Some(("u@x".into(), "p:ss".into())));
        assert_eq!(
            p.options.root.as_deref(),
            Some("/SpringIntegration-LockRegistry")
        );
        assert_eq!(p.options.session_timeout, Duration::from_secs(10));
        assert_eq!(p.options.request_timeout, Duration::from_millis(500));
        let p = parse_url("zk://h:1/", ZooKeeperOptions::default()).unwrap();
        assert_eq!(p.options.root, None);
        assert_eq!(p.auth, None);
        for (bad, part) in [
            ("zk://", "host"),
            ("zk://h:x", "port"),
            ("zk://h:1,,h:2", "empty host"),
            ("zk://h:1/a//b", "root path"),
            ("zk://h:1/a/..", "root path"),
            ("zk://h:1/zookeeper", "reserved"),
            ("zk://h:1?foo=1", "unknown parameter"),
            ("zk://h:1?session_timeout=soon", "session_timeout"),
            ("zk://user@h:1", "password"),
            ("redis://h:1", "scheme"),
        ] {
            let e = parse_url(bad, ZooKeeperOptions::default()).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig(m) if m.contains(part)),
                "{bad}: {e}"
            );
        }
        let e = parse_url("zk://u:hunter2@h:x", ZooKeeperOptions::default()).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn spring_urls_default_to_springs_root() {
        let root = |url: &str, opts: ZooKeeperOptions| parse_url(url, opts).unwrap().options.root;
        let d = ZooKeeperOptions::default;
        assert_eq!(
            root("zk://h:1?spring=true", d()).as_deref(),
            Some(SPRING_ROOT)
        );
        assert_eq!(root("zk://h:1/?spring", d()).as_deref(), Some(SPRING_ROOT));
        assert_eq!(root("zk://h:1?spring=false", d()), None);
        // A root given explicitly (in the URL or the options) wins.
        assert_eq!(
            root("zk://h:1/mine?spring=true", d()).as_deref(),
            Some("/mine")
        );
        let mine = ZooKeeperOptions {
            root: Some("/opts".into()),
            ..d()
        };
        assert_eq!(root("zk://h:1?spring=true", mine).as_deref(), Some("/opts"));
        let e = parse_url("zk://h:1?spring=maybe", d()).unwrap_err();
        assert!(e.to_string().contains("spring"), "{e}");
    }

    #[test]
    fn tls_urls_parse() {
        let p = parse_url(
            "zks://u:p@zk1:2281,zk2:2281/locks?ca_file=/etc/zk/ca.pem&cert_file=/c%20d.pem&key_file=k.pem",
            ZooKeeperOptions::default(),
        )
        .unwrap();
        assert_eq!(p.hosts, "zk1:2281,zk2:2281");
        assert_eq!(
            p.tls,
            Some(TlsFiles {
                ca_file: "/etc/zk/ca.pem".into(),
                identity: Some(("/c d.pem".into(), "k.pem".into())),
            })
        );
        // Digest credentials need no allow_insecure_auth over verified TLS.
        assert_eq!(p.auth, Some(("u".into(), "p".into())));
        let p = parse_url("zks://h:1?ca_file=ca.pem", ZooKeeperOptions::default()).unwrap();
        assert_eq!(p.tls.unwrap().identity, None);
        assert_eq!(
            parse_url("zk://h:1", ZooKeeperOptions::default())
                .unwrap()
                .tls,
            None
        );
        for (bad, part) in [
            ("zks://h:1", "ca_file"),
            ("zk://h:1?ca_file=ca.pem", "need zks://"),
            ("zks://h:1?ca_file=ca.pem&cert_file=c.pem", "go together"),
            ("zks://h:1?ca_file=ca.pem&key_file=k.pem", "go together"),
            ("zks://h:1?ca_file=", "file name"),
            ("zk://u:p@h:1", "allow_insecure_auth"),
        ] {
            let e = parse_url(bad, ZooKeeperOptions::default()).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig(m) if m.contains(part)),
                "{bad}: {e}"
            );
        }
    }
}

//! The parts every backend URL is made of, parsed once for all backends: the scheme, user info
//! (percent-decoded user and password), host lists (`h1:p1,h2:p2`, IPv6 in brackets, default
//! ports), query parameters with typed values, and durations.
//!
//! Backends import this module; it imports no backend (the scheme → backend dispatch is
//! `connect.rs`). Every error is an [`Error::InvalidConfig`] that names the part or the
//! parameter, and never contains the password.

// Each helper serves some of the backends; a build with few backend features leaves some unused.
#![cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "zookeeper",
        feature = "etcd",
        feature = "redis"
    )),
    allow(dead_code)
)]

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// The URL with any password replaced by `***`, for messages: the user info's, and the value
/// of any query parameter whose name says it is one (`sentinel_password=…`).
pub fn redact(url: &str) -> String {
    let url = redact_user_info(url);
    let Some((base, query)) = url.split_once('?') else {
        return url;
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret_param(name) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

/// Whether a query parameter carries a secret, by its name.
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "passwd", "secret", "token"]
        .iter()
        .any(|s| name.contains(s))
}

fn redact_user_info(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => match (url.find("://"), url.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
            _ => url.to_owned(),
        },
    }
}

/// Decodes `%XX` escapes of a URL part; `None` for a broken escape or a result that is not
/// UTF-8. A `+` stays a `+`.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    // `percent_decode_str` keeps a broken escape as it is; here it is an error.
    let escapes_are_whole = s.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_are_whole {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(Into::into)
}

/// Decodes `%XX` escapes as the drivers of Redis and etcd do: a `%` that starts no valid escape
/// is kept as it is, bytes that are not UTF-8 become U+FFFD, and a `+` stays a `+`.
pub(crate) fn percent_decode_lenient(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// How the user info of a URL is percent-decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decode {
    /// A broken escape or a result that is not UTF-8 is an error ([`percent_decode`]).
    Strict,
    /// A broken escape is kept as it is ([`percent_decode_lenient`]).
    Lenient,
}

impl Decode {
    fn apply(self, s: &str) -> Option<String> {
        match self {
            Decode::Strict => percent_decode(s),
            Decode::Lenient => Some(percent_decode_lenient(s)),
        }
    }
}

/// A URL of the form `scheme://[userinfo@]hosts[/path][?query]`, cut into its raw (still
/// encoded) parts. Used where the `url` crate does not fit: host lists, and schemes whose
/// authority is not one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawUrl<'a> {
    /// The scheme as written (compare with `eq_ignore_ascii_case`).
    pub(crate) scheme: &'a str,
    /// What stands before the last `@` of the authority.
    pub(crate) userinfo: Option<&'a str>,
    /// The host list: everything between the user info and the path.
    pub(crate) hosts: &'a str,
    /// From the first `/` after the authority up to the query; empty when there is none.
    pub(crate) path: &'a str,
    /// What follows the first `?`.
    pub(crate) query: Option<&'a str>,
}

impl<'a> RawUrl<'a> {
    /// Cuts `url` into its parts; `None` when it has no `://`.
    pub(crate) fn split(url: &'a str) -> Option<Self> {
        let (scheme, rest) = url.split_once("://")?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        Some(RawUrl {
            scheme,
            userinfo,
            hosts,
            path,
            query,
        })
    }
}

/// The user info of a URL, percent-decoded.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct UserInfo {
    /// The user name; empty only from [`UserInfo::parse_any_user`].
    pub(crate) user: String,
    /// The password; `None` when the user info has no `:`.
    pub(crate) password: Option<String>,
}

impl fmt::Debug for UserInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserInfo")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl UserInfo {
    /// Parses `user[:password]` (split at the first `:`). The error says which part is wrong,
    /// for the caller to prefix with the URL it shows.
    pub(crate) fn parse(raw: &str, decode: Decode) -> std::result::Result<Self, String> {
        let info = Self::parse_any_user(raw, decode)?;
        if info.user.is_empty() {
            return Err("the user name is empty".into());
        }
        Ok(info)
    }

    /// As [`parse`](Self::parse), but an empty user name is kept (Redis: `:password@` logs in
    /// as the default user).
    pub(crate) fn parse_any_user(raw: &str, decode: Decode) -> std::result::Result<Self, String> {
        let (user, password) = match raw.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (raw, None),
        };
        let user = decode
            .apply(user)
            .ok_or("the user name is badly percent-encoded")?;
        let password = password
            .map(|p| {
                decode
                    .apply(p)
                    .ok_or("the password is badly percent-encoded")
            })
            .transpose()?;
        Ok(UserInfo { user, password })
    }
}

/// One entry of a host list. An IPv6 address is kept without its brackets; `Display` writes
/// them back (`[::1]:2181`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPort {
    /// Host name or address, without brackets.
    pub(crate) host: String,
    /// The port, never 0.
    pub(crate) port: u16,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Parses a host list `h1[:p1][,h2[:p2]…]`; an IPv6 address goes in brackets (`[::1]:2379`),
/// a missing port is `default_port`. The error says which entry is wrong, for the caller to
/// prefix with the URL it shows.
pub(crate) fn parse_hosts(
    list: &str,
    default_port: u16,
) -> std::result::Result<Vec<HostPort>, String> {
    if list.is_empty() {
        return Err("the host is missing".into());
    }
    let mut hosts = Vec::new();
    for h in list.split(',') {
        if h.is_empty() {
            return Err("an empty host in the host list".into());
        }
        let (host, port) = match h.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6
                    .split_once(']')
                    .ok_or_else(|| format!("host {h:?}: unclosed '['"))?;
                let port = match after {
                    "" => None,
                    a => Some(a.strip_prefix(':').ok_or_else(|| {
                        format!("host {h:?}: expected ':port' after ']', got {a:?}")
                    })?),
                };
                (host, port)
            }
            None if h.matches(':').count() > 1 => {
                return Err(format!(
                    "host {h:?}: an IPv6 address goes in brackets, as in [::1]:{default_port}"
                ))
            }
            None => match h.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (h, None),
            },
        };
        if host.is_empty() {
            return Err(format!("host {h:?}: the host name is empty"));
        }
        let port = match port {
            None => default_port,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("host {h:?}: the port {p:?} is not a port number"))?,
        };
        hosts.push(HostPort {
            host: host.to_owned(),
            port,
        });
    }
    Ok(hosts)
}

/// A boolean URL parameter: `true`, `1`, `yes`, `on` or `false`, `0`, `no`, `off`, in any case.
pub(crate) fn parse_bool(kind: &str, param: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::config(format!(
            "{kind} URL: the query parameter '{param}' must be true or false \
             (also 1/0, yes/no, on/off), got {value:?}"
        ))),
    }
}

/// A duration parameter of a `kind` URL, with the rule of [`crate::duration`] (`500ms`, `5s`,
/// `1h`, `1m30s`, or a number of seconds as libpq's `connect_timeout=10`).
pub(crate) fn parse_duration(kind: &str, param: &str, value: &str) -> Result<Duration> {
    crate::duration::parse_duration(value).map_err(|e| {
        Error::config(format!(
            "{kind} URL: the query parameter '{param}' must be a duration: {e}"
        ))
    })
}

/// The error for a query parameter that `kind` URLs do not know.
pub(crate) fn unknown_parameter(kind: &str, name: &str, known: &[&str]) -> Error {
    Error::config(format!(
        "{kind} URL: unknown query parameter {name:?} (known: {}; an unknown parameter is an \
         error, so that a misspelt one is not ignored)",
        known.join(", ")
    ))
}

/// The query parameters of a URL, taken out one by one with typed getters; what is left is
/// either refused ([`Params::finish`]) or handed on ([`Params::into_rest`]). A parameter given
/// twice counts with its last value unless [`Params::unique`] refuses repeats.
#[derive(Debug)]
pub(crate) struct Params<'k> {
    kind: &'k str,
    pairs: Vec<(String, String)>,
}

impl<'k> Params<'k> {
    /// `application/x-www-form-urlencoded` pairs, decoded as the `url` crate does (a `+` is a
    /// space, a broken escape is kept).
    pub(crate) fn form(kind: &'k str, query: Option<&str>) -> Self {
        let pairs = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Params { kind, pairs }
    }

    /// `name=value` pairs split at `&` and the first `=`, not decoded (see
    /// [`Params::decoded`]); empty pieces are skipped and a name without `=` has the value "".
    pub(crate) fn raw(kind: &'k str, query: Option<&str>) -> Self {
        let pairs = query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect();
        Params { kind, pairs }
    }

    /// Refuses a parameter given more than once.
    pub(crate) fn unique(self) -> Result<Self> {
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &self.pairs {
            if !seen.insert(name.as_str()) {
                return Err(Error::config(format!(
                    "{} URL: the query parameter '{name}' is repeated",
                    self.kind
                )));
            }
        }
        Ok(self)
    }

    /// Takes every occurrence of `name` out; the last value counts.
    pub(crate) fn string(&mut self, name: &str) -> Option<String> {
        let mut last = None;
        self.pairs.retain(|(k, v)| {
            if k == name {
                last = Some(v.clone());
                false
            } else {
                true
            }
        });
        last
    }

    /// Like [`Params::string`], percent-decoding the value strictly.
    pub(crate) fn decoded(&mut self, name: &str) -> Result<Option<String>> {
        self.string(name)
            .map(|v| {
                percent_decode(&v).ok_or_else(|| {
                    Error::config(format!(
                        "{} URL: the query parameter '{name}' has a malformed percent-escape",
                        self.kind
                    ))
                })
            })
            .transpose()
    }

    /// A boolean ([`parse_bool`]).
    pub(crate) fn bool(&mut self, name: &str) -> Result<Option<bool>> {
        self.string(name)
            .map(|v| parse_bool(self.kind, name, &v))
            .transpose()
    }

    /// A duration ([`parse_duration`]).
    pub(crate) fn duration(&mut self, name: &str) -> Result<Option<Duration>> {
        self.string(name)
            .map(|v| parse_duration(self.kind, name, &v))
            .transpose()
    }

    /// A whole number of type `T` (range checks are the caller's).
    pub(crate) fn integer<T: FromStr>(&mut self, name: &str) -> Result<Option<T>> {
        self.string(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    Error::config(format!(
                        "{} URL: the query parameter '{name}' must be a whole number, got {v:?}",
                        self.kind
                    ))
                })
            })
            .transpose()
    }

    /// Refuses whatever parameter is left, naming the first and the `known` ones.
    pub(crate) fn finish(self, known: &[&str]) -> Result<()> {
        match self.pairs.first() {
            Some((name, _)) => Err(unknown_parameter(self.kind, name, known)),
            None => Ok(()),
        }
    }

    /// The parameters left, in their order, for a driver to judge.
    pub(crate) fn into_rest(self) -> Vec<(String, String)> {
        self.pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("x", "p", "3").unwrap(),
            Duration::from_secs(3)
        );
        assert_eq!(
            parse_duration("x", "p", "2m").unwrap(),
            Duration::from_secs(120)
        );
        // The rule of the command line's `--lease 1h`, not a narrower one.
        assert_eq!(
            parse_duration("x", "p", "1h").unwrap(),
            Duration::from_secs(3600)
        );
        assert_eq!(
            parse_duration("x", "p", "1m30s").unwrap(),
            Duration::from_secs(90)
        );
        let e = parse_duration("x", "p", "").unwrap_err().to_string();
        assert!(e.contains("'p'") && e.contains("500ms"), "{e}");
        assert!(parse_duration("x", "p", "1M").is_err());
    }

    #[test]
    fn percent_decoding_strict_and_lenient() {
        assert_eq!(percent_decode("p%40ss+x").as_deref(), Some("p@ss+x"));
        assert_eq!(percent_decode("x%zz"), None);
        assert_eq!(percent_decode("x%4"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
        assert_eq!(percent_decode("x%"), None);
        assert_eq!(percent_decode("%%41"), None);
        assert_eq!(percent_decode("%41%42").as_deref(), Some("AB"));
        assert_eq!(percent_decode_lenient("p%40ss+x%zz%4"), "p@ss+x%zz%4");
        assert_eq!(percent_decode_lenient("%C3%BC"), "ü");
        assert_eq!(percent_decode_lenient("%ff%"), "\u{fffd}%");
    }

    #[test]
    fn raw_urls_are_cut_at_the_right_places() {
        let u = RawUrl::split("zk://u:p@ss@h1:1,[::1]:2/root/x?a=1&b").unwrap();
        assert_eq!(u.scheme, "zk");
        assert_eq!(u.userinfo, Some("u:p@ss"));
        assert_eq!(u.hosts, "h1:1,[::1]:2");
        assert_eq!(u.path, "/root/x");
        assert_eq!(u.query, Some("a=1&b"));
        let u = RawUrl::split("etcd://h").unwrap();
        assert_eq!(
            (u.userinfo, u.hosts, u.path, u.query),
            (None, "h", "", None)
        );
        assert_eq!(RawUrl::split("no-scheme"), None);
    }

    #[test]
    fn user_info_is_decoded_and_checked() {
        let u = UserInfo::parse("u%40x:p%3Ass:w", Decode::Strict).unwrap();
        assert_eq!(
            (u.user.as_str(), u.password.as_deref()),
            ("u@x", Some("p:ss:w"))
        );
        assert!(!format!("{u:?}").contains("p:ss"));
        assert_eq!(UserInfo::parse("u", Decode::Strict).unwrap().password, None);
        assert!(UserInfo::parse(":pw", Decode::Strict)
            .unwrap_err()
            .contains("user"));
        assert!(UserInfo::parse("u:%zz", Decode::Strict)
            .unwrap_err()
            .contains("password"));
        let u = UserInfo::parse("u:%zz+", Decode::Lenient).unwrap();
        assert_eq!(u.password.as_deref(), Some("%zz+"));
    }

    #[test]
    fn host_lists() {
        let hosts = parse_hosts("a:1,b,[::1]:3,[fe80::2]", 2181).unwrap();
        let shown: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["a:1", "b:2181", "[::1]:3", "[fe80::2]:2181"]);
        assert_eq!(hosts[2].host, "::1");
        for (bad, part) in [
            ("", "host is missing"),
            ("a:1,", "empty host"),
            ("a:1,,b", "empty host"),
            (":1", "host name is empty"),
            ("[]:1", "host name is empty"),
            ("[::1", "unclosed"),
            ("[::1]x", "':port'"),
            ("a:x", "port"),
            ("a:0", "port"),
            ("a:65536", "port"),
            ("::1", "brackets"),
            ("a:1:2", "brackets"),
        ] {
            let e = parse_hosts(bad, 1).unwrap_err();
            assert!(e.contains(part), "{bad:?}: {e}");
        }
    }

    #[test]
    fn query_parameters_are_typed() {
        let mut p = Params::form("x", Some("s=a+b%21&b=YES&f&d=250ms&n=7&n=8&t=%zz"));
        assert_eq!(p.string("s").as_deref(), Some("a b!"));
        assert_eq!(p.bool("b").unwrap(), Some(true));
        assert_eq!(
            p.string("f").as_deref(),
            Some(""),
            "a bare name has the value \"\""
        );
        assert_eq!(p.duration("d").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(
            p.integer::<u32>("n").unwrap(),
            Some(8),
            "the last one counts"
        );
        assert_eq!(p.string("missing"), None);
        assert_eq!(p.into_rest(), [("t".to_owned(), "%zz".to_owned())]);

        let mut p = Params::raw("x", Some("t=a%20b&&u=%zz&v"));
        assert_eq!(p.decoded("t").unwrap().as_deref(), Some("a b"));
        assert!(p.decoded("u").unwrap_err().to_string().contains("'u'"));
        assert_eq!(p.string("v").as_deref(), Some(""));
        p.finish(&[]).unwrap();

        for (query, part) in [
            ("b=maybe", "'b'"),
            ("b=", "'b'"),
            ("d=soon", "'d'"),
            ("n=-1", "'n'"),
        ] {
            let mut p = Params::form("x", Some(query));
            let e = match query.as_bytes()[0] {
                b'b' => p.bool("b").unwrap_err(),
                b'd' => p.duration("d").unwrap_err(),
                _ => p.integer::<u32>("n").unwrap_err(),
            };
            assert!(
                matches!(&e, Error::InvalidConfig(m) if m.contains(part)),
                "{query}: {e}"
            );
        }
        let e = Params::form("x", Some("a=1&a=2")).unique().unwrap_err();
        assert!(e.to_string().contains("'a' is repeated"), "{e}");
        let mut p = Params::form("x", Some("good=1&typo=2"));
        assert_eq!(p.string("good").as_deref(), Some("1"));
        let e = p.finish(&["good", "other"]).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidConfig(m)
                if m.contains("unknown query parameter \"typo\"") && m.contains("good, other")),
            "{e}"
        );
    }

    #[test]
    fn redact_hides_user_info_and_password_parameters() {
        assert_eq!(redact("redis://u:pw@h:1/0?a=1"), "redis://u:***@h:1/0?a=1");
        let sentinel = "redis+sentinel://:pw@h:1,h:2/m?sentinel_password=spw&min_replicas=1";
        let shown = redact(sentinel);
        assert!(!shown.contains("pw@") && !shown.contains("=spw"), "{shown}");
        assert!(
            shown.contains("sentinel_password=***&min_replicas=1"),
            "{shown}"
        );
        assert_eq!(redact("memory://"), "memory://");
    }

    #[test]
    fn booleans_have_four_spellings_each() {
        for v in ["true", "1", "yes", "on", "TRUE", "On"] {
            assert!(parse_bool("x", "p", v).unwrap(), "{v}");
        }
        for v in ["false", "0", "no", "off", "False"] {
            assert!(!parse_bool("x", "p", v).unwrap(), "{v}");
        }
        for v in ["", "maybe", "2", "y"] {
            assert!(parse_bool("x", "p", v).is_err(), "{v}");
        }
    }
}

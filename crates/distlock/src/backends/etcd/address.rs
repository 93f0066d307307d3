//! `etcd://` and `etcds://` URLs, and the TLS settings they lead to.

use super::client::TlsSettings;
use super::options::EtcdOptions;
use crate::error::{Error, Result};
use crate::url::{parse_hosts, Decode, Params, RawUrl, UserInfo};

/// A parsed `etcd://` / `etcds://` URL.
pub(super) struct ParsedUrl {
    pub(super) tls: bool,
    pub(super) user: Option<(String, String)>,
    pub(super) hosts: Vec<String>,
    pub(super) ca_file: Option<String>,
    pub(super) cert_file: Option<String>,
    pub(super) key_file: Option<String>,
    /// `allow_insecure_auth=true`: send a password over plain `etcd://` anyway.
    pub(super) allow_insecure_auth: bool,
    /// `waiter_ttl=<duration>`: [`EtcdOptions::waiter_ttl`] instead of the options' own.
    pub(super) waiter_ttl: Option<std::time::Duration>,
}

impl ParsedUrl {
    pub(super) fn parse(url: &str) -> Result<Self> {
        let shown = crate::redact(url);
        let bad = |what: &str| Error::config(format!("etcd URL {shown:?}: {what}"));
        let raw = RawUrl::split(url).ok_or_else(|| bad("expected etcd://host:port[,host:port]"))?;
        let tls = match raw.scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" => true,
            s => return Err(bad(&format!("scheme {s:?}: expected etcd or etcds (TLS)"))),
        };
        if !raw.path.is_empty() && raw.path != "/" {
            return Err(bad(&format!(
                "unexpected path {:?} (the key prefix is a registry option)",
                raw.path
            )));
        }
        let user = raw
            .userinfo
            .map(|u| UserInfo::parse(u, Decode::Lenient).map_err(|e| bad(&e)))
            .transpose()?
            .map(|u| (u.user, u.password.unwrap_or_default()));
        let hosts = parse_hosts(raw.hosts, 2379).map_err(|e| bad(&e))?;
        let mut params = Params::form("etcd", raw.query);
        let mut parsed = ParsedUrl {
            tls,
            user,
            hosts: hosts.iter().map(ToString::to_string).collect(),
            ca_file: params.string("ca_file"),
            cert_file: params.string("cert_file"),
            key_file: params.string("key_file"),
            allow_insecure_auth: false,
            waiter_ttl: params.duration("waiter_ttl")?,
        };
        if let Some(v) = params.bool("allow_insecure_auth")? {
            parsed.allow_insecure_auth = v;
        }
        params.finish(&[
            "ca_file",
            "cert_file",
            "key_file",
            "allow_insecure_auth",
            "waiter_ttl",
        ])?;

        if !tls && (parsed.ca_file.is_some() || parsed.cert_file.is_some()) {
            return Err(bad("ca_file and cert_file need etcds:// (TLS)"));
        }
        if parsed.cert_file.is_some() != parsed.key_file.is_some() {
            return Err(bad("cert_file and key_file go together"));
        }
        // etcd's Authenticate call carries the password as it is: over plain TCP anyone on the
        // path reads it, so that takes the URL's explicit word.
        if parsed.user.is_some() && !tls && !parsed.allow_insecure_auth {
            return Err(bad(
                "etcd:// would send the password in clear: use etcds:// (TLS), or add \
                 allow_insecure_auth=true to send it anyway on a network you trust",
            ));
        }
        Ok(parsed)
    }
}

/// The TLS material of an `etcds://` URL: the URL's files first, then the options'.
#[cfg(feature = "etcd-tls")]
pub(super) fn tls_settings(parsed: &ParsedUrl, options: &EtcdOptions) -> Result<TlsSettings> {
    let read = |path: &str| {
        std::fs::read(path)
            .map_err(|e| Error::config(format!("etcd URL: cannot read {path:?}: {e}")))
    };
    let ca_pem = match &parsed.ca_file {
        Some(f) => Some(read(f)?),
        None => options.tls_ca_pem.clone(),
    };
    let identity = match (&parsed.cert_file, &parsed.key_file) {
        (Some(c), Some(k)) => Some((read(c)?, read(k)?)),
        _ => options.tls_client_identity_pem.clone(),
    };
    Ok(TlsSettings { ca_pem, identity })
}

#[cfg(not(feature = "etcd-tls"))]
pub(super) fn tls_settings(_parsed: &ParsedUrl, _options: &EtcdOptions) -> Result<TlsSettings> {
    Err(Error::Unsupported {
        backend: super::options::KIND,
        what: "etcds:// (TLS) needs distlock's cargo feature `etcd-tls`".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let p = ParsedUrl::parse("etcd://127.0.0.1:2379").unwrap();
        assert!(!p.tls);
        assert_eq!(p.hosts, vec!["127.0.0.1:2379"]);
        assert!(p.user.is_none());
        let p =
            ParsedUrl::parse("etcd://root:p%40ss@a:1,b,[::1]:3/?allow_insecure_auth=true").unwrap();
        assert_eq!(p.hosts, vec!["a:1", "b:2379", "[::1]:3"]);
        assert_eq!(p.user, Some(("root".into(), "p@ss".into())));
        let p = ParsedUrl::parse("etcds://h:2379?ca_file=/x/ca.pem").unwrap();
        assert!(p.tls);
        assert_eq!(p.ca_file.as_deref(), Some("/x/ca.pem"));
        for (bad, part) in [
            ("etcd://", "host"),
            ("etcd://h:x", "port"),
            ("etcd://h:1,", "host"),
            ("etcd://h:1/prefix", "path"),
            ("etcd://h:1?foo=1", "foo"),
            ("etcd://:pw@h:1", "user"),
            ("etcdx://h:1", "scheme"),
        ] {
            let err = ParsedUrl::parse(bad).err().expect(bad).to_string();
            assert!(err.contains(part), "{bad}: {err}");
        }
        let err = ParsedUrl::parse("etcd://u:secret@h:x").err().unwrap();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn a_password_goes_over_plain_tcp_only_when_the_url_says_so() {
        let err = ParsedUrl::parse("etcd://u:secret@h:1")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("allow_insecure_auth=true"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        assert!(ParsedUrl::parse("etcd://u:secret@h:1?allow_insecure_auth=false").is_err());
        let p = ParsedUrl::parse("etcd://u:secret@h:1?allow_insecure_auth=true").unwrap();
        assert_eq!(p.user, Some(("u".into(), "secret".into())));
        // Over TLS, and without a password, nothing needs the opt-in.
        assert!(ParsedUrl::parse("etcds://u:secret@h:1").is_ok());
        assert!(ParsedUrl::parse("etcd://h:1").is_ok());
        assert!(ParsedUrl::parse("etcd://h:1?allow_insecure_auth=maybe").is_err());
    }
}

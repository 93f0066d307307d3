//! Requests from other sites. The service has no cookies, but a web page in the user's browser
//! can still send it requests: a form or `fetch` can change state (take, hold, release
//! locks), and a page whose name was rebound to this machine's address (DNS rebinding) can read
//! the answers as its own. So:
//!
//! - every request must name in `Host` an address the service listens on (the address the
//!   connection arrived at, with the port; `localhost` for a loopback connection) or a name
//!   given with `--allow-host` (any port: a proxy in front may use its own). A rebinding page
//!   names its own host, which is neither;
//! - a state-changing request (`POST`, `PUT`, `DELETE`, `PATCH`) that a browser marks as coming
//!   from another site (`Sec-Fetch-Site` other than `same-origin` or `none`), or whose `Origin`
//!   is not the `Host` it was sent to, is refused. Programs that send neither header (curl,
//!   scripts) are not browsers' pages, and pass;
//! - a state-changing request with a body must say `Content-Type: application/json`: a form
//!   cannot send that without the service's consent (which it never gives: no CORS).

use std::net::{IpAddr, SocketAddr};

use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};

use super::ApiError;

/// Which hosts requests may name.
#[derive(Debug)]
pub struct Sites {
    /// Names (lower case) given with `--allow-host`, accepted with any port.
    allowed: Vec<String>,
    /// The port a `Host` without one means: 443 with TLS, else 80.
    default_port: u16,
}

impl Sites {
    /// Checks the `--allow-host` names: a host name or IP address, without a port.
    pub fn new(allowed: &[String], tls: bool) -> Result<Sites, String> {
        let mut names = Vec::with_capacity(allowed.len());
        for name in allowed {
            let parsed = name.parse::<axum::http::uri::Authority>();
            match parsed {
                Ok(a) if a.port().is_none() && !a.as_str().contains('@') && !name.is_empty() => {
                    names.push(a.host().to_ascii_lowercase());
                }
                _ => {
                    return Err(format!(
                        "--allow-host {name:?}: give a host name or address without a port"
                    ))
                }
            }
        }
        Ok(Sites {
            allowed: names,
            default_port: if tls { 443 } else { 80 },
        })
    }

    /// `Ok` if the request may go on; else the answer (403, 400 or 415 with `{"error"}`).
    /// `arrived`: the local address the request's connection arrived at; `known`: the
    /// connection's last accepted `Host`.
    pub fn check<B>(
        &self,
        request: &Request<B>,
        arrived: SocketAddr,
        known: &KnownHost,
    ) -> Result<(), ApiError> {
        let headers = Read::of(request.headers());
        let host = request
            .uri()
            .authority()
            .map(|a| a.as_str())
            .or_else(|| headers.host.and_then(|h| h.to_str().ok()))
            .ok_or_else(|| forbidden("the request names no Host"))?;
        // Whether a host is allowed depends only on it and on `arrived`, which a connection
        // keeps: the same host as last time passes without its parsing again.
        let seen = known.0.borrow().as_deref() == Some(host);
        if !seen && !self.host_allowed(host, Some(arrived)) {
            return Err(forbidden(format!(
                "Host {host:?} is not an address this service listens on \
                 (name it with --allow-host to accept it)"
            )));
        }
        if !seen {
            *known.0.borrow_mut() = Some(host.into());
        }
        if changes_state(request.method()) {
            from_this_site(&headers, host)?;
            json_body(&headers)?;
        }
        valid_percent_encoding(request.uri().path())
    }

    fn host_allowed(&self, host: &str, arrived: Option<SocketAddr>) -> bool {
        let Ok(authority) = host.parse::<axum::http::uri::Authority>() else {
            return false;
        };
        if authority.as_str().contains('@') {
            return false;
        }
        let name = authority.host().to_ascii_lowercase();
        if self.allowed.contains(&name) {
            return true;
        }
        let Some(arrived) = arrived else {
            return false;
        };
        let local = arrived.ip().to_canonical();
        if authority.port_u16().unwrap_or(self.default_port) != arrived.port() {
            return false;
        }
        if name == "localhost" {
            return local.is_loopback();
        }
        let literal = name.trim_start_matches('[').trim_end_matches(']');
        literal
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical() == local)
    }
}

/// The last `Host` a connection named that was allowed (one per connection): a keep-alive
/// client names the same one in every request, and checking it again (parsing it as an
/// authority, lowercasing it) would cost more than the rest of the gate.
#[derive(Debug, Default)]
pub struct KnownHost(std::cell::RefCell<Option<Box<str>>>);

/// Compared with by a name made once rather than parsed from a string in each request.
static SEC_FETCH_SITE: header::HeaderName = header::HeaderName::from_static("sec-fetch-site");

/// The headers the checks read, each the first of its name (what `HeaderMap::get` answers),
/// found in one pass over the request's few headers instead of a hashed lookup for each.
#[derive(Default)]
struct Read<'a> {
    host: Option<&'a HeaderValue>,
    origin: Option<&'a HeaderValue>,
    fetch_site: Option<&'a HeaderValue>,
    content_type: Option<&'a HeaderValue>,
    content_length: Option<&'a HeaderValue>,
    transfer_encoding: bool,
}

impl<'a> Read<'a> {
    fn of(headers: &'a HeaderMap) -> Self {
        let mut read = Read::default();
        for (name, value) in headers {
            let slot = if *name == header::HOST {
                &mut read.host
            } else if *name == header::CONTENT_LENGTH {
                &mut read.content_length
            } else if *name == header::CONTENT_TYPE {
                &mut read.content_type
            } else if *name == header::ORIGIN {
                &mut read.origin
            } else if *name == SEC_FETCH_SITE {
                &mut read.fetch_site
            } else {
                read.transfer_encoding |= *name == header::TRANSFER_ENCODING;
                continue;
            };
            slot.get_or_insert(value);
        }
        read
    }
}

fn forbidden(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, message)
}

fn changes_state(method: &Method) -> bool {
    *method == Method::POST
        || *method == Method::DELETE
        || *method == Method::PUT
        || *method == Method::PATCH
}

/// Refuses what a browser marks as sent by a page of another site.
fn from_this_site(headers: &Read<'_>, host: &str) -> Result<(), ApiError> {
    if let Some(site) = headers.fetch_site {
        let site = site.to_str().unwrap_or("");
        if !matches!(site, "same-origin" | "none") {
            return Err(forbidden(format!(
                "cross-site request refused (Sec-Fetch-Site: {site})"
            )));
        }
    }
    if let Some(origin) = headers.origin {
        let origin = origin.to_str().unwrap_or("");
        let same = origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host));
        if !same {
            return Err(forbidden(format!(
                "cross-site request refused: Origin {origin:?} is not this service ({host})"
            )));
        }
    }
    Ok(())
}

/// A body, if any, must be JSON.
fn json_body(headers: &Read<'_>) -> Result<(), ApiError> {
    let has_body = headers.transfer_encoding
        || headers
            .content_length
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n.trim() != "0");
    if !has_body {
        return Ok(());
    }
    let media = headers
        .content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or("");
    if media.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a request body must be JSON, sent with Content-Type: application/json",
        ))
    }
}

/// Every `%` of the path starts two hex digits: a key is never taken literally when its
/// encoding is broken.
fn valid_percent_encoding(path: &str) -> Result<(), ApiError> {
    let bytes = path.as_bytes();
    let broken = bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if broken {
        Err(ApiError::bad_request(
            "invalid percent-encoding in the path (a % must start two hex digits)",
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addr: &str) -> Option<SocketAddr> {
        Some(addr.parse().unwrap())
    }

    #[test]
    fn a_connection_that_names_another_host_is_checked_again() {
        let sites = Sites::new(&[], false).unwrap();
        let arrived: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let known = KnownHost::default();
        let get = |host: &str| {
            Request::get("/v1/locks")
                .header(header::HOST, host)
                .body(())
                .unwrap()
        };
        for _ in 0..2 {
            assert!(sites.check(&get("127.0.0.1:7070"), arrived, &known).is_ok());
        }
        let refused = sites.check(&get("evil.example:7070"), arrived, &known);
        assert_eq!(refused.unwrap_err().status, StatusCode::FORBIDDEN);
        assert!(sites.check(&get("localhost:7070"), arrived, &known).is_ok());
        let refused = sites.check(&get("localhost:7071"), arrived, &known);
        assert_eq!(refused.unwrap_err().status, StatusCode::FORBIDDEN);
    }

    #[test]
    fn hosts_are_the_address_arrived_at_loopback_names_or_allowed_names() {
        let sites = Sites::new(&["Locks.Example".into()], false).unwrap();
        let local = at("127.0.0.1:7070");
        assert!(sites.host_allowed("127.0.0.1:7070", local));
        assert!(sites.host_allowed("localhost:7070", local));
        assert!(sites.host_allowed("LOCALHOST:7070", local));
        assert!(!sites.host_allowed("localhost:7071", local), "another port");
        assert!(!sites.host_allowed("localhost", local), "port 80 implied");
        assert!(
            !sites.host_allowed("[::1]:7070", local),
            "not the address arrived at"
        );
        assert!(!sites.host_allowed("evil.example:7070", local));
        assert!(!sites.host_allowed("user@127.0.0.1:7070", local));
        assert!(
            sites.host_allowed("locks.example", local),
            "allowed, any port"
        );
        assert!(sites.host_allowed("locks.example:443", local));
        let v6 = at("[::1]:7070");
        assert!(sites.host_allowed("[::1]:7070", v6));
        assert!(sites.host_allowed("localhost:7070", v6));
        // A dual-stack wildcard listener sees IPv4 clients as mapped addresses.
        let mapped = at("[::ffff:192.0.2.7]:7070");
        assert!(sites.host_allowed("192.0.2.7:7070", mapped));
        assert!(
            !sites.host_allowed("localhost:7070", mapped),
            "not loopback"
        );
        assert!(!sites.host_allowed("192.0.2.8:7070", mapped));
    }

    #[test]
    fn allowed_names_take_no_port() {
        assert!(Sites::new(&["a.example:80".into()], false).is_err());
        assert!(Sites::new(&["".into()], false).is_err());
        assert!(Sites::new(&["a/b".into()], false).is_err());
        assert!(Sites::new(&["[::1]".into(), "10.0.0.1".into()], true).is_ok());
    }

    #[test]
    fn percent_encodings_must_be_whole() {
        assert!(valid_percent_encoding("/v1/locks/a%2Fb").is_ok());
        assert!(valid_percent_encoding("/v1/locks/%ZZ").is_err());
        assert!(valid_percent_encoding("/v1/locks/a%2").is_err());
        assert!(valid_percent_encoding("/v1/locks/a%").is_err());
    }
}

//! Opening a backend: the URL and its TLS parameters (the password goes only to a verified
//! server unless the URL says otherwise), the driver's options, the first connection and the
//! lease table.

use std::sync::Arc;

use mysql_async::{OptsBuilder, SslOpts};

use super::doorbell::{Doorbells, HEAD_GRACE_MS};
use super::driver::{discard, SslMode};
use super::session::Failed;
use super::state::{MySql, KIND};
use super::{MySqlBackend, SCHEMES};
use crate::backend::detached;
use crate::backends::sql::dialect::My;
use crate::backends::sql::lease_table::{context, Common};
use crate::backends::sql::{parse_url, scrub, SqlOptions};
use crate::error::{Error, Result};

impl MySqlBackend {
    /// Connects with a URL: `mysql://[user[:password]@]host[:port][/database][?params]`
    /// (`mariadb://` too; see the [module docs](super) for the parameters). One connection is
    /// opened and checked at once, so that a wrong address or password is reported here.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, it closes the connections it opened; a lease table it already
    /// created stays (the next call would create it anyway).
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = parse_url(KIND, SCHEMES, url)?;
        let mut mode = None;
        let (mut ca, mut cert, mut key) = (None, None, None);
        for (name, value) in &parsed.rest {
            match name.as_str() {
                "ssl-mode" | "ssl_mode" | "sslmode" => mode = Some(value.to_ascii_lowercase()),
                "ssl-ca" | "ssl_ca" => ca = Some(value.clone()),
                "ssl-cert" | "ssl_cert" => cert = Some(value.clone()),
                "ssl-key" | "ssl_key" => key = Some(value.clone()),
                other => {
                    return Err(Error::config(format!(
                        "mysql URL: unknown query parameter {other:?} (known: table, schema, \
                         region, spring, layout, create_table, pool_size, connect_timeout, \
                         request_timeout, allow_insecure_auth, ssl-mode, ssl-ca, ssl-cert, \
                         ssl-key)"
                    )))
                }
            }
        }
        let secret = parsed.password.as_deref().is_some_and(|p| !p.is_empty());
        let mode = match &mode {
            Some(m) => SslMode::parse(m)?,
            // No password, nothing secret to protect: plain TCP, as MySQL's clients did before
            // 5.7 (an explicit `preferred` uses TLS when the server offers it).
            None if !secret => SslMode::Disabled,
            None => SslMode::Preferred,
        };
        let identity = match (cert, key) {
            (None, None) => None,
            (Some(c), Some(k)) => Some(mysql_async::ClientIdentity::new(
                std::path::PathBuf::from(c).into(),
                std::path::PathBuf::from(k).into(),
            )),
            _ => {
                return Err(Error::config(
                    "mysql URL: ssl-cert and ssl-key go together (the client certificate and \
                     its key)",
                ))
            }
        };
        let tls = |verify: bool, check_name: bool| {
            let mut s = SslOpts::default().with_client_identity(identity.clone());
            if !verify {
                s = s.with_danger_accept_invalid_certs(true);
            }
            if !verify || !check_name {
                s = s.with_danger_skip_domain_validation(true);
            }
            match &ca {
                Some(path) => s
                    .with_root_certs(vec![std::path::PathBuf::from(path).into()])
                    .with_disable_built_in_roots(true),
                None => s,
            }
        };
        // A password goes only to a verified server unless the URL says otherwise (see the
        // module docs): the server picks the authentication method, and some reveal the
        // password (`mysql_clear_password`; `caching_sha2_password`'s full authentication,
        // which sends it in clear over TLS, or encrypted with a key fetched from the server).
        let insecure_ok = !secret || parsed.options.allow_insecure_auth;
        let refuse = |why: &str| {
            Error::config(format!(
                "mysql URL: refusing to send the password to a server that is not verified: \
                 {why}. Use ssl-mode=verify_identity or verify_ca (with ssl-ca=<CA file> for a \
                 private CA), or add allow_insecure_auth=true to send it anyway"
            ))
        };
        let (ssl, verified) = match mode {
            SslMode::Disabled if !insecure_ok => return Err(refuse("ssl-mode=disabled")),
            SslMode::Required if !insecure_ok => {
                return Err(refuse(
                    "ssl-mode=required encrypts but does not check the certificate",
                ))
            }
            SslMode::Disabled => (None, false),
            SslMode::Required => (Some(tls(false, false)), false),
            SslMode::VerifyCa => (Some(tls(true, false)), true),
            SslMode::VerifyIdentity => (Some(tls(true, true)), true),
            // TLS when the server offers it: verified when a password is at stake.
            SslMode::Preferred => (Some(tls(!insecure_ok, true)), !insecure_ok),
        };
        let user = parsed.user.clone().unwrap_or_else(|| "root".to_owned());
        let port = parsed.port.unwrap_or(3306);
        let target = format!(
            "{}:{port}/{}",
            parsed.host,
            parsed.database.as_deref().unwrap_or("")
        );
        let mut builder = OptsBuilder::default()
            .ip_or_hostname(parsed.host.clone())
            .tcp_port(port)
            .user(Some(user.clone()))
            .pass(parsed.password.clone())
            .db_name(parsed.database.clone())
            .prefer_socket(false)
            .enable_cleartext_plugin(verified || parsed.options.allow_insecure_auth)
            .ssl_opts(ssl);
        if mode == SslMode::Preferred {
            // Does the server offer TLS? Asking costs one connection; without TLS the driver
            // stops before it sends anything of the password.
            let probe = mysql_async::Conn::new(mysql_async::Opts::from(builder.clone()));
            match tokio::time::timeout(parsed.options.connect_timeout, probe).await {
                Ok(Ok(conn)) => discard(conn),
                Ok(Err(mysql_async::Error::Driver(
                    mysql_async::DriverError::NoClientSslFlagFromServer,
                ))) => {
                    if !insecure_ok {
                        return Err(Error::backend(
                            KIND,
                            scrub(
                                format!(
                                    "connect to {target}: refusing to send the password of \
                                     user {user:?}: the server offers no TLS (ssl-mode=\
                                     preferred). Enable TLS on the server, or add \
                                     allow_insecure_auth=true to the URL to send it anyway"
                                ),
                                parsed.password.as_deref(),
                            ),
                        ));
                    }
                    builder = builder.ssl_opts(None);
                }
                // Other failures are reported by the first connection below.
                _ => {}
            }
        }
        Self::connect_with(builder, user, parsed.password, target, parsed.options).await
    }

    /// Connects with `mysql_async` options and explicit [`SqlOptions`]; the number of
    /// connections comes from `options`, and found-rows counting is set.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the connections it opened. Set-up it finished (a lock
    /// table, a root node) stays, as the next call would make it anyway.
    pub async fn connect_with_opts(builder: OptsBuilder, options: SqlOptions) -> Result<Self> {
        let opts = mysql_async::Opts::from(builder.clone());
        let user = opts.user().unwrap_or("").to_owned();
        let password = opts.pass().map(str::to_owned);
        let target = format!(
            "{}:{}/{}",
            opts.ip_or_hostname(),
            opts.tcp_port(),
            opts.db_name().unwrap_or("")
        );
        Self::connect_with(builder, user, password, target, options).await
    }

    async fn connect_with(
        builder: OptsBuilder,
        user: String,
        password: Option<String>,
        target: String,
        options: SqlOptions,
    ) -> Result<Self> {
        // With `zookeeper-tls` rustls has two providers, and `mysql_async` builds its TLS
        // configuration with the process default.
        #[cfg(feature = "zookeeper-tls")]
        crate::tls::ensure_default_provider();
        options.validate(KIND)?;
        let builder = builder
            .client_found_rows(true)
            .tcp_nodelay(true)
            .prefer_socket(false);
        let opts = mysql_async::Opts::from(builder.clone());
        let database = options
            .schema
            .clone()
            .or_else(|| opts.db_name().map(str::to_owned))
            .unwrap_or_default();
        let qualified_table = format!("{database}.{}", options.table);
        // The prepared statements are those of the native layout (Spring's are sent as text).
        let native = My::new(options.schema.as_deref(), &options.table, false);
        let backend = MySqlBackend {
            inner: Arc::new(MySql {
                qualified_table,
                // The statement connections (sessions), which also hold the doorbells.
                doorbells: Doorbells::new(
                    opts,
                    options.pool_size,
                    options.connect_timeout,
                    options.request_timeout,
                ),
                sql: if options.shedlock {
                    My::shedlock(options.schema.as_deref(), &options.table)
                } else {
                    My::new(options.schema.as_deref(), &options.table, options.spring)
                },
                acquire_prepared: native.acquire_existing_prepared(None),
                acquire_deferring: native.acquire_existing_prepared(Some(HEAD_GRACE_MS)),
                release_prepared: native.release_prepared(),
                acquire_lone: native.acquire_lone_prepared(),
                common: Common::new(target, user, password, options),
            }),
        };
        // Check one connection now (a wrong host or password is reported here) and create the
        // table unless it exists, so that the first lock operation does not pay for the DDL.
        let inner = backend.inner.clone();
        let limit = inner.common.options.connect_timeout + inner.common.options.request_timeout;
        detached(
            KIND,
            context(&backend.inner, "connect"),
            Some(limit),
            async move {
                match inner.ensure_table().await {
                    Ok(()) => Ok(()),
                    Err(Failed { error, sent: false }) => Err(inner.error("connect", &error)),
                    Err(Failed { error, .. }) => Err(inner.error("create table", &error)),
                }
            },
        )
        .await?;
        Ok(backend)
    }
}

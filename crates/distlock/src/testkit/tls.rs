//! A private certificate authority for TLS tests, made with the `openssl` command (Debian
//! package `openssl`; `scripts/test.sh` installs it): a CA, a server certificate for the names
//! a test chooses, and a client certificate, all signed by the CA.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::TempDir;

/// A throwaway CA and the certificates it signed, in a directory removed on drop: `ca.crt`,
/// `server.crt`/`server.key` (subject `localhost`, alternative names the server names given)
/// and `client.crt`/`client.key` (subject the client's name).
///
/// The directory and the files are readable by every user (the keys too), so that a server
/// running under its own account (the machine's PostgreSQL, say) can read them; a server that
/// insists on private keys gets a copy with the permissions it wants.
#[derive(Debug)]
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    /// Makes the CA and its certificates. The server certificate is valid for `server_names`
    /// (host names, or IP addresses such as `127.0.0.1`); `client_name` is the client
    /// certificate's common name (the user name where a server maps certificates to users).
    pub fn new(server_names: &[&str], client_name: &str) -> io::Result<TestCa> {
        let dir = TempDir::new("distlock-test-ca")?;
        let d = dir.path();
        let alt_names: Vec<String> = server_names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect();
        std::fs::write(
            d.join("server-ext"),
            format!(
                "subjectAltName={}\nbasicConstraints=CA:FALSE\n",
                alt_names.join(",")
            ),
        )?;
        std::fs::write(d.join("client-ext"), "basicConstraints=CA:FALSE\n")?;
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=distlock test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ],
        )?;
        let client_subject = format!("/CN={client_name}");
        for (name, subject, ext) in [
            ("server", "/CN=localhost", "server-ext"),
            ("client", client_subject.as_str(), "client-ext"),
        ] {
            let (key, csr, crt) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
            );
            openssl(
                d,
                &[
                    "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key,
                    "-out", &csr,
                ],
            )?;
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    ext,
                    "-out",
                    &crt,
                ],
            )?;
        }
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
        for name in [
            "ca.crt",
            "server.crt",
            "server.key",
            "client.crt",
            "client.key",
        ] {
            std::fs::set_permissions(d.join(name), std::fs::Permissions::from_mode(0o644))?;
        }
        Ok(TestCa { dir })
    }

    /// The directory that holds the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A file of the directory, e.g. `path("ca.crt")`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA's certificate (PEM): what a client trusts.
    pub fn ca_cert(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// The server's certificate and key (PEM).
    pub fn server_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (self.path("server.crt"), self.path("server.key"))
    }

    /// The client's certificate and key (PEM).
    pub fn client_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (self.path("client.crt"), self.path("client.key"))
    }
}

fn openssl(dir: &Path, args: &[&str]) -> io::Result<()> {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("openssl: {e} (install it with `apt-get install openssl`)"),
            )
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "openssl {args:?} failed: {status}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_and_client_certificates_verify_against_the_ca() {
        let ca = TestCa::new(&["localhost", "127.0.0.1"], "tester").expect("openssl");
        for name in ["server.crt", "client.crt"] {
            let out = Command::new("openssl")
                .args(["verify", "-CAfile", "ca.crt", name])
                .current_dir(ca.dir())
                .output()
                .unwrap();
            assert!(out.status.success(), "{name}: {out:?}");
        }
        let subject = Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-in", "client.crt"])
            .current_dir(ca.dir())
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&subject.stdout).contains("tester"));
        let names = Command::new("openssl")
            .args([
                "x509",
                "-noout",
                "-ext",
                "subjectAltName",
                "-in",
                "server.crt",
            ])
            .current_dir(ca.dir())
            .output()
            .unwrap();
        let names = String::from_utf8_lossy(&names.stdout);
        assert!(
            names.contains("DNS:localhost") && names.contains("IP Address:127.0.0.1"),
            "{names}"
        );
    }
}

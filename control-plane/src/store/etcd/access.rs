//! Where etcd is and how to reach it: `etcd://` and `etcds://` URLs (every
//! member, an optional key prefix) and the credential and TLS files, read
//! and checked before connecting.

use super::*;

/// Where the etcd store lives, as `--store etcd://host:2379,host:2379/prefix`
/// (or `etcds://` for TLS) gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAddress {
    /// `http://host:port` (or `https://` with [`tls`](Self::tls)) for each member.
    pub endpoints: Vec<String>,
    /// Key prefix, ending with `/`.
    pub prefix: String,
    /// TLS to etcd (`etcds://`): the members' certificates are checked
    /// against [`EtcdAccess::ca_pem`], which is then required.
    pub tls: bool,
}

/// Why an etcd store URL cannot be used ([`EtcdAddress::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdAddressError {
    /// Neither `etcd://` nor `etcds://`.
    #[error(
        "{url:?}: an etcd store is etcd://host:port[,host:port...][/prefix] (etcds:// for TLS)"
    )]
    NotEtcd {
        /// The URL as given.
        url: String,
    },
    /// A member that is not `host:port`.
    #[error("{host:?}: expected host:port")]
    NotHostPort {
        /// The member as given.
        host: String,
    },
    /// No member at all.
    #[error("{url:?}: no etcd member given")]
    NoMember {
        /// The URL as given.
        url: String,
    },
    /// A key prefix of only `/`.
    #[error("{url:?}: the key prefix must not be empty")]
    EmptyPrefix {
        /// The URL as given.
        url: String,
    },
}

impl EtcdAddress {
    /// Parses `etcd://host:port[,host:port...][/prefix]`, or the same with
    /// `etcds://` for TLS.
    pub fn parse(url: &str) -> Result<Self, EtcdAddressError> {
        let (rest, tls) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => return Err(EtcdAddressError::NotEtcd { url: url.into() }),
        };
        let scheme = if tls { "https" } else { "http" };
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/router"),
        };
        let mut endpoints = Vec::new();
        for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            let not_host_port = || EtcdAddressError::NotHostPort { host: host.into() };
            let Some((name, port)) = host.rsplit_once(':') else {
                return Err(not_host_port());
            };
            if name.is_empty() || port.parse::<u16>().is_err() {
                return Err(not_host_port());
            }
            endpoints.push(format!("{scheme}://{host}"));
        }
        if endpoints.is_empty() {
            return Err(EtcdAddressError::NoMember { url: url.into() });
        }
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(EtcdAddressError::EmptyPrefix { url: url.into() });
        }
        Ok(Self {
            endpoints,
            prefix: format!("{prefix}/"),
            tls,
        })
    }
}

/// How the control plane proves who it is to etcd, and checks etcd: the
/// CA for `etcds://`, a client certificate (etcd's `--client-cert-auth`),
/// a user and password (etcd's `auth enable`). Read from files by
/// [`EtcdAccess::load`]; `Debug` never shows the key or the password.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    /// CA certificates (PEM) the members' certificates must chain to.
    pub ca_pem: Option<String>,
    /// Client certificate chain and private key (PEM).
    pub identity: Option<(String, String)>,
    /// etcd user name and password.
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.identity.is_some())
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("password", &self.user.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The files [`EtcdAccess::load`] reads (the `--etcd-*` flags).
#[derive(Debug, Clone, Default)]
pub struct EtcdAccessFiles {
    /// `--etcd-ca-file`.
    pub ca: Option<PathBuf>,
    /// `--etcd-cert-file`.
    pub cert: Option<PathBuf>,
    /// `--etcd-key-file`.
    pub key: Option<PathBuf>,
    /// `--etcd-user`.
    pub user: Option<String>,
    /// `--etcd-password-file`.
    pub password: Option<PathBuf>,
}

impl EtcdAccessFiles {
    /// The first flag given, if any (they mean nothing without an etcd store).
    pub fn first_given(&self) -> Option<&'static str> {
        [
            (self.ca.is_some(), "--etcd-ca-file"),
            (self.cert.is_some(), "--etcd-cert-file"),
            (self.key.is_some(), "--etcd-key-file"),
            (self.user.is_some(), "--etcd-user"),
            (self.password.is_some(), "--etcd-password-file"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// Why the `--etcd-*` flags cannot be used. The password is never quoted.
#[derive(Debug, thiserror::Error)]
pub enum EtcdAccessError {
    /// A file could not be read.
    #[error("cannot read {flag} {path}: {error}")]
    Read {
        /// The flag that named it.
        flag: &'static str,
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// A certificate or key file holds no PEM block.
    #[error("{flag} {path} holds no PEM block (-----BEGIN ...)")]
    NotPem {
        /// The flag that named it.
        flag: &'static str,
        /// The file.
        path: String,
    },
    /// The password file is empty once trimmed.
    #[error("--etcd-password-file {0} is empty")]
    EmptyPassword(String),
    /// One of a pair without the other.
    #[error("{0} needs {1}")]
    Needs(&'static str, &'static str),
    /// TLS files for a plaintext store.
    #[error("{0} is for TLS to etcd: write the store as etcds://")]
    NotTls(&'static str),
    /// `etcds://` without a CA.
    #[error("an etcds:// store needs --etcd-ca-file (the CA that signed the etcd members' certificates)")]
    NoCa,
}

fn read_flag(flag: &'static str, path: &Path) -> Result<String, EtcdAccessError> {
    std::fs::read_to_string(path).map_err(|error| EtcdAccessError::Read {
        flag,
        path: path.display().to_string(),
        error,
    })
}

fn read_pem(flag: &'static str, path: &Path) -> Result<String, EtcdAccessError> {
    let text = read_flag(flag, path)?;
    if text.contains("-----BEGIN ") {
        Ok(text)
    } else {
        Err(EtcdAccessError::NotPem {
            flag,
            path: path.display().to_string(),
        })
    }
}

impl EtcdAccess {
    /// Reads and checks the files for a store at `address`: TLS files only
    /// with `etcds://`, which needs a CA; a certificate with its key; a
    /// user with a password (trimmed, as tokens are) and the other way round.
    pub fn load(address: &EtcdAddress, files: &EtcdAccessFiles) -> Result<Self, EtcdAccessError> {
        if !address.tls {
            for (given, flag) in [
                (files.ca.is_some(), "--etcd-ca-file"),
                (files.cert.is_some(), "--etcd-cert-file"),
                (files.key.is_some(), "--etcd-key-file"),
            ] {
                if given {
                    return Err(EtcdAccessError::NotTls(flag));
                }
            }
        }
        let ca_pem = match &files.ca {
            Some(path) => Some(read_pem("--etcd-ca-file", path)?),
            None if address.tls => return Err(EtcdAccessError::NoCa),
            None => None,
        };
        let identity = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => Some((
                read_pem("--etcd-cert-file", cert)?,
                read_pem("--etcd-key-file", key)?,
            )),
            (Some(_), None) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-cert-file",
                    "--etcd-key-file",
                ))
            }
            (None, Some(_)) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-key-file",
                    "--etcd-cert-file",
                ))
            }
            (None, None) => None,
        };
        let user = match (&files.user, &files.password) {
            (Some(name), Some(path)) => {
                let raw = read_flag("--etcd-password-file", path)?;
                let password = raw.trim();
                if password.is_empty() {
                    return Err(EtcdAccessError::EmptyPassword(path.display().to_string()));
                }
                Some((name.clone(), password.to_string()))
            }
            (Some(_), None) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-user",
                    "--etcd-password-file",
                ))
            }
            (None, Some(_)) => {
                return Err(EtcdAccessError::Needs(
                    "--etcd-password-file",
                    "--etcd-user",
                ))
            }
            (None, None) => None,
        };
        Ok(Self {
            ca_pem,
            identity,
            user,
        })
    }

    /// The client's options: TLS when the CA is given, the user when
    /// given (etcd's tokens expire, 5 min by default: the client gets a
    /// new one when etcd says so, instead of failing the call).
    pub(super) fn connect_options(&self) -> Options {
        Options {
            tls: self.ca_pem.as_ref().map(|ca| Tls {
                ca_pem: ca.clone(),
                identity: self.identity.clone(),
            }),
            user: self.user.clone(),
            connect_timeout: Some(Duration::from_secs(3)),
            // A silently dead member breaks the watch within seconds.
            keep_alive: Some((Duration::from_secs(5), Duration::from_secs(3))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_url_that_cannot_be_used_says_which_part_is_wrong() {
        let url = |u: &str| u.to_string();
        assert_eq!(
            EtcdAddress::parse("http://h:1"),
            Err(EtcdAddressError::NotEtcd {
                url: url("http://h:1")
            })
        );
        for (bad, host) in [
            ("etcd://h", "h"),
            ("etcd://h:x", "h:x"),
            ("etcd://:1", ":1"),
        ] {
            assert_eq!(
                EtcdAddress::parse(bad),
                Err(EtcdAddressError::NotHostPort { host: host.into() }),
                "{bad}"
            );
        }
        assert_eq!(
            EtcdAddress::parse("etcd://"),
            Err(EtcdAddressError::NoMember {
                url: url("etcd://")
            })
        );
        let err = EtcdAddress::parse("etcd://h:1/").unwrap_err();
        assert_eq!(
            err,
            EtcdAddressError::EmptyPrefix {
                url: url("etcd://h:1/")
            }
        );
        assert_eq!(
            err.to_string(),
            "\"etcd://h:1/\": the key prefix must not be empty"
        );
    }
}

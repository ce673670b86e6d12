//! What a policy may ask of the process that carries it out.
//!
//! A policy names environment variables (a pool's `api_key_env`) and
//! backend addresses. Whoever can write a policy (or call `set-backends`)
//! could otherwise make every proxy read any variable of its environment
//! and send it to an endpoint of their choosing (`api_key_env:
//! AWS_SECRET_ACCESS_KEY` beside an endpoint of their own), or make the
//! proxies reach the cloud's metadata service from inside the network.
//! The operator of the process decides what is allowed, not the policy:
//!
//! - [`EnvAllowList`]: the variables a pool's `api_key_env` may name. By
//!   default, names ending in `_API_KEY`; `CUSTOM_ROUTER_API_KEY_ENV_ALLOW`
//!   (names, or `PREFIX*`, comma-separated) adds more.
//! - [`HostAllowList`] and [`backend_refusal`]: backend addresses in the
//!   link-local ranges (`169.254.0.0/16`, `fe80::/10`: where cloud metadata
//!   services answer, `169.254.169.254`) and AWS's IPv6 metadata address
//!   `fd00:ec2::254` are refused unless `CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS`
//!   names the host. IPv4 addresses are also recognised in the other forms
//!   the system resolver reads as addresses (`2852039166`, `0xa9fea9fe`,
//!   `169.254.43518`), and inside IPv4-mapped, -compatible and NAT64 IPv6
//!   addresses. Names are not resolved here (this crate does no I/O): the
//!   proxy checks the addresses a name resolves to when it connects
//!   ([`refused_ip`]).
//!
//! Both are process settings, read from the environment by each program
//! (the proxy, the control plane, `routerctl`) with [`Guards::from_lookup`]
//! and handed to validation
//! ([`PolicyDocument::validate_with`](crate::document::PolicyDocument::validate_with)):
//! validation stays pure, and nothing in a policy can widen the rules it is
//! checked against. (A policy field such as `allow_link_local: true` would
//! let the very author the rule guards against switch it off.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::endpoint::Endpoint;

/// The variable extending [`EnvAllowList`].
pub const API_KEY_ENV_ALLOW_VAR: &str = "CUSTOM_ROUTER_API_KEY_ENV_ALLOW";
/// The variable filling [`HostAllowList`].
pub const ALLOW_BACKEND_HOSTS_VAR: &str = "CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS";
/// The suffix every API key variable may have without being listed.
pub const API_KEY_SUFFIX: &str = "_API_KEY";

/// A guard setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for {var}: {value:?}: {reason}")]
pub struct GuardError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: AllowListError,
}

/// Why an allow list ([`EnvAllowList`], [`HostAllowList`]) cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowListError {
    /// A bare `*` in an [`EnvAllowList`]: it would allow every variable.
    #[error("a bare \"*\" would allow every variable: list names or PREFIX* patterns")]
    BareStar,
    /// An [`EnvAllowList`] entry that is neither a name nor `PREFIX*`.
    #[error("{entry:?} is not a variable name or a PREFIX* pattern (letters, digits, '_')")]
    NotAVariable {
        /// The entry as written.
        entry: String,
    },
    /// A [`HostAllowList`] entry that is neither a host name nor an IP.
    #[error("{entry:?} is not a host name or an IP address")]
    NotAHost {
        /// The entry as written.
        entry: String,
    },
}

/// A variable that may not hold a pool's API key ([`EnvAllowList::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} may not hold an API key: the key is sent to the pool's endpoints, so \
     only variables whose names end in {API_KEY_SUFFIX} are allowed, or those \
     {API_KEY_ENV_ALLOW_VAR} lists on the proxies and the control plane"
)]
pub struct KeyEnvRefused {
    /// The variable named.
    pub name: String,
}

/// What this process allows a policy to ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guards {
    /// Variables a pool's `api_key_env` may name.
    pub api_key_env: EnvAllowList,
    /// Hosts allowed as backends despite the link-local rule.
    pub backend_hosts: HostAllowList,
}

impl Guards {
    /// Reads [`API_KEY_ENV_ALLOW_VAR`] and [`ALLOW_BACKEND_HOSTS_VAR`]
    /// through `lookup` (the environment, or a map in tests). Unset or
    /// blank means the defaults.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, GuardError> {
        let mut guards = Self::default();
        if let Some(v) = lookup(API_KEY_ENV_ALLOW_VAR) {
            guards.api_key_env = EnvAllowList::parse(&v).map_err(|reason| GuardError {
                var: API_KEY_ENV_ALLOW_VAR,
                value: v.clone(),
                reason,
            })?;
        }
        if let Some(v) = lookup(ALLOW_BACKEND_HOSTS_VAR) {
            guards.backend_hosts = HostAllowList::parse(&v).map_err(|reason| GuardError {
                var: ALLOW_BACKEND_HOSTS_VAR,
                value: v.clone(),
                reason,
            })?;
        }
        Ok(guards)
    }
}

/// The environment variables a pool's API key may come from: names ending
/// in [`API_KEY_SUFFIX`], plus those listed (exactly, or by a `PREFIX*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvAllowList {
    names: Vec<String>,
    prefixes: Vec<String>,
}

impl EnvAllowList {
    /// Parses `NAME,OTHER_NAME,PREFIX_*` (spaces around entries ignored).
    /// A bare `*` is refused: it would allow every variable of the process.
    pub fn parse(text: &str) -> Result<Self, AllowListError> {
        let mut list = Self::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, prefix) = match entry.strip_suffix('*') {
                Some(p) => (p, true),
                None => (entry, false),
            };
            if name.is_empty() {
                return Err(AllowListError::BareStar);
            }
            if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(AllowListError::NotAVariable {
                    entry: entry.to_string(),
                });
            }
            if prefix {
                list.prefixes.push(name.to_string());
            } else {
                list.names.push(name.to_string());
            }
        }
        Ok(list)
    }

    /// Whether `name` may hold a pool's API key.
    pub fn allows(&self, name: &str) -> bool {
        name.ends_with(API_KEY_SUFFIX)
            || self.names.iter().any(|n| n == name)
            || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }

    /// `Err` when `name` may not hold a pool's API key.
    pub fn check(&self, name: &str) -> Result<(), KeyEnvRefused> {
        if self.allows(name) {
            Ok(())
        } else {
            Err(KeyEnvRefused {
                name: name.to_string(),
            })
        }
    }
}

/// Hosts the operator allows as backends although they are link-local or
/// metadata addresses (compared as addresses when both are IPs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAllowList {
    names: Vec<String>,
    ips: Vec<IpAddr>,
}

impl HostAllowList {
    /// Parses `169.254.10.1,[fe80::1],gpu.local` (spaces ignored; IPv6
    /// with or without brackets).
    pub fn parse(text: &str) -> Result<Self, AllowListError> {
        let mut list = Self::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let host = normalise_host(entry);
            if let Some(ip) = host_ip(&host) {
                list.ips.push(ip);
            } else if host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
            {
                list.names.push(host);
            } else {
                return Err(AllowListError::NotAHost {
                    entry: entry.to_string(),
                });
            }
        }
        Ok(list)
    }

    /// Whether `host` (as an endpoint writes it) is listed.
    pub fn allows(&self, host: &str) -> bool {
        let host = normalise_host(host);
        match host_ip(&host) {
            Some(ip) => self.ips.contains(&ip) || self.names.contains(&host),
            None => self.names.contains(&host),
        }
    }
}

/// Why `endpoint` may not be a backend, if it may not: a link-local or
/// metadata address that `allow` does not name.
pub fn backend_refusal(endpoint: &Endpoint, allow: &HostAllowList) -> Option<String> {
    let host = endpoint.host();
    let ip = host_ip(&normalise_host(host))?;
    let what = refused_ip(ip)?;
    if allow.allows(host) {
        return None;
    }
    Some(format!(
        "{host} is {what}: refused as a backend (cloud metadata services answer there) \
         unless {ALLOW_BACKEND_HOSTS_VAR} names it"
    ))
}

/// What kind of refused address `ip` is, if it is one: link-local
/// (`169.254.0.0/16`, `fe80::/10`) or AWS's IPv6 metadata address,
/// including IPv4 addresses carried in IPv6 ones.
pub fn refused_ip(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => {
            if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                return Some("the cloud metadata address fd00:ec2::254");
            }
            if v6.segments()[0] & 0xffc0 == 0xfe80 {
                return Some("a link-local address (fe80::/10)");
            }
            // IPv4-mapped (::ffff:a.b.c.d), -compatible (::a.b.c.d) and
            // NAT64 (64:ff9b::a.b.c.d) addresses reach the IPv4 one.
            let s = v6.segments();
            let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
            let carried = if nat64 {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                Some(Ipv4Addr::new(a, b, c, d))
            } else {
                v6.to_ipv4()
            };
            carried.and_then(refused_v4)
        }
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    ip.is_link_local()
        .then_some("a link-local address (169.254.0.0/16)")
}

/// Lower case, without IPv6 brackets or a trailing dot.
fn normalise_host(host: &str) -> String {
    let host = host.trim();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// The address a host names, when it is an address: IPv6, or IPv4 in any
/// form the system resolver (`inet_aton`) reads as one.
fn host_ip(host: &str) -> Option<IpAddr> {
    if let Ok(v6) = host.parse::<Ipv6Addr>() {
        return Some(IpAddr::V6(v6));
    }
    loose_ipv4(host).map(IpAddr::V4)
}

/// `inet_aton`'s IPv4 forms: one to four parts, each decimal, octal
/// (leading `0`) or hex (`0x`); the last part fills the remaining bytes
/// (`169.254.43518`, `2852039166`).
fn loose_ipv4(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for p in &parts {
        values.push(inet_part(p)?);
    }
    let (last, leading) = values.split_last()?;
    let mut addr: u32 = 0;
    for (i, v) in leading.iter().enumerate() {
        if *v > 0xff {
            return None;
        }
        addr |= v << (24 - 8 * i);
    }
    let room = 32 - 8 * leading.len() as u32;
    if room < 32 && *last >> room != 0 {
        return None;
    }
    Some(Ipv4Addr::from(addr | last))
}

fn inet_part(p: &str) -> Option<u32> {
    let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
        (h, 16)
    } else if p.len() > 1 && p.starts_with('0') {
        (&p[1..], 8)
    } else {
        (p, 10)
    };
    if digits.is_empty() {
        // `0x` alone is 0 for inet_aton; an empty part is nothing.
        return (radix == 16).then_some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> Endpoint {
        Endpoint::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn api_key_variables_end_in_api_key_unless_listed() {
        let default = EnvAllowList::default();
        assert!(default.allows("OPENAI_API_KEY"));
        for refused in [
            "AWS_SECRET_ACCESS_KEY",
            "CUSTOM_ROUTER_ADMIN_TOKEN",
            "ROUTER_TOKEN",
            "HOME",
            "OPENAI_API_KEY_FILE",
            "openai_api_key",
        ] {
            let why = default.check(refused).unwrap_err();
            assert_eq!(why.name, refused);
            assert!(why.to_string().contains(API_KEY_ENV_ALLOW_VAR), "{why}");
        }
        let extended = EnvAllowList::parse(" HF_TOKEN , VAULT_* ,").unwrap();
        assert!(extended.allows("HF_TOKEN") && extended.allows("VAULT_OPENAI"));
        assert!(extended.allows("X_API_KEY"));
        assert!(!extended.allows("HF_TOKEN2") && !extended.allows("AWS_SECRET_ACCESS_KEY"));
        assert_eq!(EnvAllowList::parse(""), Ok(EnvAllowList::default()));
        assert_eq!(EnvAllowList::parse("*"), Err(AllowListError::BareStar));
        assert_eq!(EnvAllowList::parse("A,*"), Err(AllowListError::BareStar));
        for bad in ["BAD-NAME", "A*B"] {
            assert_eq!(
                EnvAllowList::parse(&format!("OK, {bad}")),
                Err(AllowListError::NotAVariable { entry: bad.into() })
            );
        }
    }

    #[test]
    fn link_local_and_metadata_addresses_are_refused() {
        let none = HostAllowList::default();
        for refused in [
            "169.254.169.254:80",
            "http://169.254.0.1:8080",
            "https://169.254.255.255",
            "http://[fe80::1]:80",
            "http://[febf:ffff::1]:80",
            "http://[fd00:ec2::254]:80",
            "http://[FD00:EC2:0:0::254]:80",
            "http://[::ffff:169.254.169.254]:80",
            "http://[64:ff9b::a9fe:a9fe]:80",
            // inet_aton's forms of 169.254.169.254.
            "http://2852039166:80",
            "http://0xa9fea9fe:80",
            "http://0251.0376.0251.0376:80",
            "http://169.254.43518:80",
            "http://169.16689662:80",
            "http://169.254.169.254.:80",
        ] {
            let why = backend_refusal(&ep(refused), &none)
                .unwrap_or_else(|| panic!("{refused} accepted"));
            assert!(why.contains(ALLOW_BACKEND_HOSTS_VAR), "{why}");
        }
        for fine in [
            "127.0.0.1:8000",
            "10.0.0.5:8000",
            "http://[::1]:80",
            "http://[fec0::1]:80",
            "http://[fd00:ec2::253]:80",
            "https://api.openai.com/v1",
            "http://169.255.0.1:80",
            "http://1.2.3.4.5:80",
            "http://gpu-1:8000",
            "http://0x:80",
        ] {
            assert_eq!(backend_refusal(&ep(fine), &none), None, "{fine}");
        }
    }

    #[test]
    fn the_allow_list_names_hosts() {
        let allow = HostAllowList::parse("169.254.10.1, [FE80::1] ,fd00:ec2::254").unwrap();
        assert_eq!(backend_refusal(&ep("http://169.254.10.1:80"), &allow), None);
        // The same address in another form is the same host.
        assert_eq!(backend_refusal(&ep("http://169.254.2561:80"), &allow), None);
        assert_eq!(backend_refusal(&ep("http://[fe80::1]:80"), &allow), None);
        assert_eq!(
            backend_refusal(&ep("http://[fd00:ec2::254]:80"), &allow),
            None
        );
        assert!(backend_refusal(&ep("http://169.254.169.254:80"), &allow).is_some());
        assert!(backend_refusal(&ep("http://[fe80::2]:80"), &allow).is_some());
        for bad in ["a b", "http://x"] {
            assert_eq!(
                HostAllowList::parse(bad),
                Err(AllowListError::NotAHost { entry: bad.into() })
            );
        }
    }

    #[test]
    fn guards_come_from_their_variables() {
        let g = Guards::from_lookup(|k| match k {
            API_KEY_ENV_ALLOW_VAR => Some("HF_TOKEN".into()),
            ALLOW_BACKEND_HOSTS_VAR => Some("169.254.1.1".into()),
            _ => None,
        })
        .unwrap();
        assert!(g.api_key_env.allows("HF_TOKEN"));
        assert!(g.backend_hosts.allows("169.254.1.1"));
        assert_eq!(Guards::from_lookup(|_| None), Ok(Guards::default()));
        let err =
            Guards::from_lookup(|k| (k == API_KEY_ENV_ALLOW_VAR).then(|| "*".into())).unwrap_err();
        assert_eq!(err.var, API_KEY_ENV_ALLOW_VAR);
        assert_eq!(err.reason, AllowListError::BareStar);
        assert!(err.to_string().contains(API_KEY_ENV_ALLOW_VAR), "{err}");
        let err = Guards::from_lookup(|k| (k == ALLOW_BACKEND_HOSTS_VAR).then(|| "a/b".into()))
            .unwrap_err();
        assert_eq!(err.var, ALLOW_BACKEND_HOSTS_VAR);
        assert_eq!(
            err.reason,
            AllowListError::NotAHost {
                entry: "a/b".into()
            }
        );
    }

    #[test]
    fn resolved_addresses_are_checked_too() {
        assert!(refused_ip("169.254.169.254".parse().unwrap()).is_some());
        assert!(refused_ip("fe80::1".parse().unwrap()).is_some());
        assert!(refused_ip("127.0.0.1".parse().unwrap()).is_none());
        assert!(refused_ip("::1".parse().unwrap()).is_none());
    }
}

//! Name resolution for upstream connections, refusing link-local and cloud
//! metadata addresses.
//!
//! Policy validation and `set-backends` refuse backends written as such
//! addresses (`router_policy::guard`), but a *name* can resolve to one: a
//! DNS record an attacker controls (`169.254.169.254.nip.io`), or a number
//! the system resolver reads as an IPv4 address that validation did not
//! recognise. So the connector resolves names through [`GuardedResolver`]:
//! the system resolver (as before), then every address
//! [`router_policy::guard::refused_ip`] refuses is dropped unless
//! `CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS` names the host or the address. A
//! name left with no address fails to connect with that reason.
//!
//! Addresses written as IP literals are not resolved (the connector dials
//! them directly); validation has checked them. Only new connections
//! resolve, so the request path does not pay for this.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use router_policy::guard::{refused_ip, ALLOW_BACKEND_HOSTS_VAR};
use router_policy::HostAllowList;
use tower_service::Service;

/// The system resolver, without link-local and metadata addresses.
#[derive(Clone)]
pub struct GuardedResolver {
    inner: GaiResolver,
    allow: Arc<HostAllowList>,
}

impl GuardedResolver {
    /// Resolves with the system resolver; `allow` names the exceptions.
    pub fn new(allow: HostAllowList) -> Self {
        Self {
            inner: GaiResolver::new(),
            allow: Arc::new(allow),
        }
    }
}

/// The addresses `host` may be dialled at, of those it resolved to.
fn keep_allowed(
    host: &str,
    addrs: impl Iterator<Item = SocketAddr>,
    allow: &HostAllowList,
) -> io::Result<std::vec::IntoIter<SocketAddr>> {
    let mut kept = Vec::new();
    let mut refused = None;
    for addr in addrs {
        match refused_ip(addr.ip()) {
            Some(what) if !allow.allows(host) && !allow.allows(&addr.ip().to_string()) => {
                refused = Some((addr.ip(), what));
            }
            _ => kept.push(addr),
        }
    }
    match (kept.is_empty(), refused) {
        (true, Some((ip, what))) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{host} resolves to {ip}, {what}: refused as a backend unless \
                 {ALLOW_BACKEND_HOSTS_VAR} names it"
            ),
        )),
        _ => Ok(kept.into_iter()),
    }
}

type Resolving = Pin<Box<dyn Future<Output = io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let host = name.as_str().to_string();
        let allow = Arc::clone(&self.allow);
        let resolving = self.inner.call(name);
        Box::pin(async move { keep_allowed(&host, resolving.await?, &allow) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter()
            .map(|a| SocketAddr::from_str(a).unwrap_or_else(|e| panic!("{a}: {e}")))
            .collect()
    }

    #[test]
    fn refused_addresses_are_dropped_and_a_name_left_with_none_fails() {
        let none = HostAllowList::default();
        let kept: Vec<_> = keep_allowed(
            "mixed.example",
            addrs(&["169.254.169.254:80", "10.0.0.1:80"]).into_iter(),
            &none,
        )
        .unwrap()
        .collect();
        assert_eq!(kept, addrs(&["10.0.0.1:80"]));
        let err = keep_allowed(
            "evil.example",
            addrs(&["169.254.169.254:80", "[fd00:ec2::254]:80"]).into_iter(),
            &none,
        )
        .unwrap_err();
        assert!(err.to_string().contains(ALLOW_BACKEND_HOSTS_VAR), "{err}");
        // Named by the operator: kept.
        let allow = HostAllowList::parse("metadata.internal").unwrap();
        let kept = keep_allowed(
            "metadata.internal",
            addrs(&["169.254.169.254:80"]).into_iter(),
            &allow,
        )
        .unwrap();
        assert_eq!(kept.len(), 1);
        let allow = HostAllowList::parse("169.254.169.254").unwrap();
        assert!(keep_allowed(
            "any.example",
            addrs(&["169.254.169.254:80"]).into_iter(),
            &allow
        )
        .is_ok());
    }

    #[tokio::test]
    async fn the_system_resolver_s_numeric_forms_are_caught() {
        // getaddrinfo reads "2852039166" as 169.254.169.254 (no DNS asked).
        let mut r = GuardedResolver::new(HostAllowList::default());
        let name = Name::from_str("2852039166").unwrap_or_else(|e| panic!("{e}"));
        let err = r.call(name).await.unwrap_err();
        assert!(err.to_string().contains("169.254.169.254"), "{err}");
        let name = Name::from_str("127.0.0.1").unwrap_or_else(|e| panic!("{e}"));
        assert!(r.call(name).await.is_ok());
    }
}

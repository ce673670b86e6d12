//! The shared store's URL, as configured: checked once at startup, kept
//! with its password, and shown without it.

/// A store URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{shown} is not a store URL: expected {}", SharedStore::EXPECTED)]
pub struct InvalidStoreUrl {
    /// The value as given, quoted, with any password removed.
    pub shown: String,
}

/// The shared store's address and credentials, checked at startup.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedStore {
    /// The URL as given (it may hold a password: never shown).
    url: String,
    /// A password given apart (`CUSTOM_ROUTER_SHARED_STORE_PASSWORD`),
    /// overriding the URL's.
    password: Option<String>,
    /// `host:port/db` as shown in logs.
    shown: String,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

impl SharedStore {
    /// What a store URL looks like, for error messages.
    pub const EXPECTED: &'static str =
        "redis://[user:password@]host:port[/db] (or rediss:// for TLS)";

    /// A store at `url` (`redis://`, `rediss://`, `valkey://`, `valkeys://`).
    pub fn new(url: &str) -> Result<Self, InvalidStoreUrl> {
        Self::parse(url, None)
    }

    /// A store at `value`, with `password` (if given and not blank) in
    /// place of the URL's.
    pub fn parse(value: &str, password: Option<String>) -> Result<Self, InvalidStoreUrl> {
        let url = value.trim().to_owned();
        let scheme_ok = ["redis://", "rediss://", "valkey://", "valkeys://"]
            .iter()
            .any(|s| url.starts_with(s));
        // The value may hold a password: shown with it removed.
        let shown = redact(&url);
        let invalid = || InvalidStoreUrl {
            shown: format!("{shown:?}"),
        };
        if !scheme_ok {
            return Err(invalid());
        }
        let store = Self {
            url,
            password: password
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty()),
            shown: shown.clone(),
        };
        store.client().map_err(|_| invalid())?;
        Ok(store)
    }

    /// A client for it (no connection yet).
    pub fn client(&self) -> redis::RedisResult<redis::Client> {
        use redis::IntoConnectionInfo;
        let mut info = self.url.as_str().into_connection_info()?;
        if let Some(p) = &self.password {
            info.redis.password = Some(p.clone());
        }
        redis::Client::open(info)
    }

    /// The address without credentials.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}

/// `scheme://host:port/db` of a store URL, without user or password.
pub(crate) fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let rest = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
            format!("{scheme}://{rest}")
        }
        None => "(not a URL)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_gives_the_database_and_a_password_given_apart_wins() {
        let store = SharedStore::new("redis://:hunter22@10.0.0.5:6379/2").unwrap();
        assert_eq!(store.shown(), "redis://10.0.0.5:6379/2");
        assert!(!format!("{store:?}").contains("hunter22"));
        let info = store.client().unwrap().get_connection_info().clone();
        assert_eq!(info.redis.db, 2);
        assert_eq!(info.redis.password.as_deref(), Some("hunter22"));
        let store =
            SharedStore::parse("rediss://cache.internal:6380", Some("from-env\n".into())).unwrap();
        let info = store.client().unwrap().get_connection_info().clone();
        assert_eq!(info.redis.password.as_deref(), Some("from-env"));
        for bad in [
            "localhost:6379",
            "http://x:1",
            "redis://:pw@host:notaport",
            "",
        ] {
            let err = SharedStore::new(bad).unwrap_err();
            assert!(!err.to_string().contains(":pw@"), "{err}");
            assert!(err.to_string().contains("expected redis://"), "{err}");
        }
    }
}

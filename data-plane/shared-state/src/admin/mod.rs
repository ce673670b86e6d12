//! The control plane's handle on the proxies' shared store: what an
//! operator reads and changes there (parked tasks, tenants' spend and
//! hourly rollups), through [`SharedStoreClient`], so that this crate
//! stays the only one that links `redis` and the key layout stays where
//! the proxies' side of it is (`router_policy::park::layout`,
//! `router_policy::rollup`, [`crate::spend`], `router_policy::store_epoch`).
//!
//! Unlike the proxies' [`crate::RedisStore`] (a connection per worker
//! thread, kept open, every call within [`crate::OP_TIMEOUT`]), the
//! control plane asks rarely and can wait a little longer: each call
//! opens a multiplexed connection (within [`ADMIN_TIMEOUT`]) and sends
//! its commands in one pipeline where it can (within [`ADMIN_TIMEOUT`]
//! again), so a store that is down or slow costs a page or an RPC at
//! most twice that, and nothing is held open between calls. Reads are
//! bounded in count ([`MAX_TASKS`], [`MAX_ROLLUP_READS`]).
//!
//! - [`tasks`]: list (by state and route), get one or many, and change a
//!   task (approve, drop) with the same compare-and-set script the
//!   proxies use, so an approval never races a claim into an illegal
//!   state: a change that lost the race is [`StoreError::Conflict`];
//! - [`tenants`]: a tenant's spend today and this month with the store's
//!   epoch (`routerctl tenants usage`), and the tenants page's spend and
//!   hourly rollups in one round trip.
//!
//! Failures are [`StoreError`]s: `Unavailable` and `Timeout` (the store),
//! `NotFound`, `Illegal` (a transition the task's rules refuse),
//! `Conflict` and `Malformed` (a stored task that is not a task record).

pub mod tasks;
pub mod tenants;

use std::future::Future;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::{InvalidStoreUrl, SharedStore, StoreError, PREFIX};

/// The longest the control plane waits for a connection, and then for
/// the answer to one call.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Tasks read in one listing at most (the oldest live ones).
pub const MAX_TASKS: usize = 1000;
/// Tenant hours (rollup hashes) read in one call at most: 20 tenants
/// over 31 days.
pub const MAX_ROLLUP_READS: usize = 20 * 31 * 24;

/// The control plane's handle on the proxies' shared store: its address
/// (with the proxies' URL and TLS rules, [`SharedStore`]) and the
/// prefix its keys are under. Cheap to clone; holds no connection.
#[derive(Clone)]
pub struct SharedStoreClient {
    client: redis::Client,
    shown: String,
    prefix: String,
    timeout: Duration,
}

impl std::fmt::Debug for SharedStoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStoreClient")
            .field("store", &self.shown)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl SharedStoreClient {
    /// A handle on the store at `url` (`redis://`, `rediss://`,
    /// `valkey://`, `valkeys://`), checked as the proxies check theirs;
    /// or at a Unix socket (`unix://`, `redis+unix://`), which the control
    /// plane has always taken (it may run beside the store the proxies
    /// reach over TCP).
    pub fn open(url: &str) -> Result<Self, InvalidStoreUrl> {
        let url = url.trim();
        if url.starts_with("unix://") || url.starts_with("redis+unix://") {
            // Its password, if any, is in the query (`?pass=`): not shown.
            let shown = crate::url::redact(url.split('?').next().unwrap_or(url));
            let client = redis::Client::open(url).map_err(|_| InvalidStoreUrl {
                shown: format!("{shown:?}"),
            })?;
            return Ok(Self {
                client,
                shown,
                prefix: PREFIX.to_string(),
                timeout: ADMIN_TIMEOUT,
            });
        }
        Self::new(&SharedStore::new(url)?)
    }

    /// A handle on `store`.
    pub fn new(store: &SharedStore) -> Result<Self, InvalidStoreUrl> {
        let client = store.client().map_err(|_| InvalidStoreUrl {
            shown: format!("{:?}", store.shown()),
        })?;
        Ok(Self {
            client,
            shown: store.shown().to_string(),
            prefix: PREFIX.to_string(),
            timeout: ADMIN_TIMEOUT,
        })
    }

    /// The same store with each wait bounded by `timeout` instead of
    /// [`ADMIN_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The address without credentials.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// How long each wait may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Drops the response cache's entries whose keys start with
    /// `key_prefix` (`router_policy::cache::route_prefix`,
    /// `partition_prefix`), as the proxies name them: `SCAN` and `UNLINK`
    /// in pages, the walk within [`crate::redis::PURGE_LIMIT`]. The
    /// number dropped.
    pub async fn purge_cache(&self, key_prefix: &str) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        let full = format!(
            "{}{}{key_prefix}",
            self.prefix,
            crate::redis::CACHE_NAMESPACE
        );
        crate::redis::unlink_prefix(&mut conn, &full, self.timeout).await
    }

    /// A connection, within the timeout.
    pub(crate) async fn conn(&self) -> Result<MultiplexedConnection, StoreError> {
        self.within(self.client.get_multiplexed_async_connection())
            .await
    }

    /// Runs one call within the timeout.
    pub(crate) async fn within<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        crate::redis::within(self.timeout, call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The control plane's `--shared-store` took a Unix socket before it
    /// shared the proxies' URL rules; it still does.
    #[test]
    fn a_unix_socket_is_still_taken_and_shown_without_its_password() {
        for url in [
            "unix:///run/redis/redis.sock",
            "redis+unix:///run/redis/redis.sock?pass=hunter22",
        ] {
            let c = SharedStoreClient::open(url).unwrap();
            assert!(
                c.shown().ends_with("/run/redis/redis.sock"),
                "{}",
                c.shown()
            );
            assert!(!format!("{c:?}").contains("hunter22"));
        }
        let c = SharedStoreClient::open("redis://:hunter22@127.0.0.1:6379/0").unwrap();
        assert!(!c.shown().contains("hunter22"));
        assert!(SharedStoreClient::open("localhost:6379").is_err());
    }
}

//! Tenants' rate limits, carried out: the decision is
//! [`router_policy::tenant::Gcra`]'s; this module keeps each tenant's
//! theoretical arrival time where the fleet can see it.
//!
//! - With a shared store (`CUSTOM_ROUTER_SHARED_STORE`), one server-side
//!   script call per request reads and advances the tenant's time with the
//!   store's own clock, so every proxy counts against one limit and clocks
//!   of the proxies do not matter ([`crate::RedisStore::gcra`]).
//! - Without one, each proxy keeps the times in memory: the limit is per
//!   proxy (`docs/tenants.md` says so). The map holds one entry per tenant
//!   named by the policy: bounded.
//!
//! Concurrency caps (`limits.concurrent_requests`) are kept the same way:
//! in the store, a sorted set per tenant of the requests in flight, each
//! with an expiry (its deadline, at most [`MAX_SLOT_HOLD`]), so that a
//! proxy that dies holding slots frees them when they expire; in the
//! process, a count per tenant. A slot is taken before the request is
//! sent and given back when it ends ([`ConcurrencyHold`]).
//!
//! A store that cannot be reached is reported as such; the tenant's
//! `on_store_down` decides (open by default).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use router_policy::tenant::Gcra;
use tokio::time::Instant;

use crate::RedisStore;

/// What the limit says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateVerdict {
    /// Within the limit.
    Pass,
    /// Over it: the next request would pass after this long.
    Wait(Duration),
    /// The shared store could not be asked.
    StoreDown,
}

/// The longest a request holds a concurrency slot in the shared store if
/// its proxy never gives it back.
pub const MAX_SLOT_HOLD: Duration = Duration::from_secs(600);

/// A concurrency slot held by a request until it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyHold {
    /// The tenant.
    pub tenant: Arc<str>,
    /// The request holding it (its member in the store's set).
    pub request_id: String,
}

/// Where the limits are kept.
pub enum RateLimits {
    /// In this process.
    Local {
        /// What the GCRA's times count from.
        epoch: Instant,
        /// Each key's theoretical arrival time, since `epoch`.
        tats: Mutex<HashMap<String, Duration>>,
        /// Each key's requests in flight.
        in_flight: Mutex<HashMap<String, u32>>,
    },
    /// In the shared store.
    Shared(Arc<RedisStore>),
}

impl RateLimits {
    /// Limits kept in this process.
    pub fn local() -> Self {
        Self::Local {
            epoch: Instant::now(),
            tats: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Checks (and, when it passes, counts) one request against the limit
    /// kept at `key` (`rate:<tenant>`, `tokens:<tenant>`).
    pub async fn check(&self, key: &str, limit: Gcra) -> RateVerdict {
        match self {
            Self::Local { epoch, tats, .. } => {
                let now = epoch.elapsed();
                let mut tats = tats.lock().unwrap_or_else(|e| e.into_inner());
                match limit.check(tats.get(key).copied(), now) {
                    Ok(tat) => {
                        tats.insert(key.to_string(), tat);
                        RateVerdict::Pass
                    }
                    Err(wait) => RateVerdict::Wait(wait),
                }
            }
            Self::Shared(store) => match store.gcra(key, limit).await {
                Ok(None) => RateVerdict::Pass,
                Ok(Some(wait)) => RateVerdict::Wait(wait),
                Err(e) => {
                    tracing::warn!(error = %e, key, "rate limit: the shared store cannot be reached");
                    RateVerdict::StoreDown
                }
            },
        }
    }

    /// Moves the limit kept at `key` by `delta` (a token limit settled to
    /// the tokens a call really used: negative gives time back).
    pub async fn adjust(&self, key: &str, delta: i64) {
        match self {
            Self::Local { tats, .. } => {
                let mut tats = tats.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(t) = tats.get_mut(key) {
                    let d = Duration::from_micros(delta.unsigned_abs());
                    *t = if delta < 0 {
                        t.saturating_sub(d)
                    } else {
                        t.saturating_add(d)
                    };
                }
            }
            Self::Shared(store) => {
                if let Err(e) = store.adjust_counter(key, delta).await {
                    tracing::warn!(error = %e, key, "token limit: a settlement was lost (the estimate stays counted)");
                }
            }
        }
    }
}

/// A token limit's draw, settled when the call ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenHold {
    /// Where the limit is kept.
    pub key: String,
    /// Tokens drawn (the call's worst case).
    pub tokens: u64,
    /// What one token is worth there, µs.
    pub per_token_micros: i64,
}

impl RateLimits {
    /// Takes one of `tenant`'s `cap` concurrency slots for `request_id`,
    /// held at most `hold` in the store: `Pass` with the hold, or `Wait`
    /// (a second: slots free as requests end) when all are taken.
    pub async fn take_slot(
        &self,
        tenant: &str,
        cap: u32,
        request_id: &str,
        hold: Duration,
    ) -> (RateVerdict, Option<ConcurrencyHold>) {
        let held = ConcurrencyHold {
            tenant: Arc::from(tenant),
            request_id: request_id.to_string(),
        };
        let busy = RateVerdict::Wait(Duration::from_secs(1));
        match self {
            Self::Local { in_flight, .. } => {
                let mut m = in_flight.lock().unwrap_or_else(|e| e.into_inner());
                let n = m.entry(tenant.to_string()).or_insert(0);
                if *n >= cap {
                    return (busy, None);
                }
                *n += 1;
                (RateVerdict::Pass, Some(held))
            }
            Self::Shared(store) => {
                let key = format!("inflight:{tenant}");
                match store
                    .take_slot(&key, request_id, cap, hold.min(MAX_SLOT_HOLD))
                    .await
                {
                    Ok(true) => (RateVerdict::Pass, Some(held)),
                    Ok(false) => (busy, None),
                    Err(e) => {
                        tracing::warn!(error = %e, tenant, "concurrency cap: the shared store cannot be reached");
                        (RateVerdict::StoreDown, None)
                    }
                }
            }
        }
    }

    /// Gives a slot back.
    pub async fn release_slot(&self, hold: &ConcurrencyHold) {
        match self {
            Self::Local { in_flight, .. } => {
                let mut m = in_flight.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(n) = m.get_mut(&*hold.tenant) {
                    *n = n.saturating_sub(1);
                }
            }
            Self::Shared(store) => {
                let key = format!("inflight:{}", hold.tenant);
                if let Err(e) = store.release_slot(&key, &hold.request_id).await {
                    tracing::warn!(error = %e, tenant = &*hold.tenant, "concurrency cap: a slot was not given back (it expires)");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_local_limit_counts_per_tenant_and_frees_with_time() {
        let limits = RateLimits::local();
        let g = Gcra::per_minute(2); // one per 30 s, no burst
        assert_eq!(limits.check("a", g).await, RateVerdict::Pass);
        assert_eq!(
            limits.check("a", g).await,
            RateVerdict::Wait(Duration::from_secs(30))
        );
        assert_eq!(limits.check("b", g).await, RateVerdict::Pass, "per tenant");
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(limits.check("a", g).await, RateVerdict::Pass);
        // A settlement gives time back.
        assert!(matches!(limits.check("a", g).await, RateVerdict::Wait(_)));
        limits.adjust("a", -30_000_000).await;
        assert_eq!(limits.check("a", g).await, RateVerdict::Pass);
    }

    #[tokio::test]
    async fn local_slots_are_taken_up_to_the_cap_and_given_back() {
        let limits = RateLimits::local();
        let hold = Duration::from_secs(60);
        let (v1, h1) = limits.take_slot("a", 2, "r1", hold).await;
        let (v2, _h2) = limits.take_slot("a", 2, "r2", hold).await;
        assert_eq!((v1, v2), (RateVerdict::Pass, RateVerdict::Pass));
        let (v3, h3) = limits.take_slot("a", 2, "r3", hold).await;
        assert_eq!(v3, RateVerdict::Wait(Duration::from_secs(1)));
        assert!(h3.is_none());
        limits.release_slot(&h1.unwrap()).await;
        assert_eq!(
            limits.take_slot("a", 2, "r4", hold).await.0,
            RateVerdict::Pass
        );
    }
}

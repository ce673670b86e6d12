//! Tenants' rate limits, carried out: the decision is
//! [`router_policy::tenant::Gcra`]'s; this module keeps each tenant's
//! theoretical arrival time where the fleet can see it.
//!
//! - With a shared store (`CUSTOM_ROUTER_SHARED_STORE`), one server-side
//!   script call per request reads and advances the tenant's time with the
//!   store's own clock, so every proxy counts against one limit and clocks
//!   of the proxies do not matter ([`crate::idempotency::RedisStore::gcra`]).
//! - Without one, each proxy keeps the times in memory: the limit is per
//!   proxy (`docs/tenants.md` says so). The map holds one entry per tenant
//!   named by the policy: bounded.
//!
//! A store that cannot be reached is reported as such; the tenant's
//! `on_store_down` decides (open by default).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use router_policy::tenant::Gcra;
use tokio::time::Instant;

use crate::idempotency::RedisStore;

/// What the limit says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateVerdict {
    /// Within the limit.
    Pass,
    /// Over it: the next request would pass after this long.
    Wait(Duration),
    /// The shared store could not be asked.
    StoreDown,
}

/// Where the limits are kept.
pub(crate) enum RateLimits {
    /// In this process.
    Local {
        epoch: Instant,
        tats: Mutex<HashMap<String, Duration>>,
    },
    /// In the shared store.
    Shared(Arc<RedisStore>),
}

impl RateLimits {
    /// Limits kept in this process.
    pub(crate) fn local() -> Self {
        Self::Local {
            epoch: Instant::now(),
            tats: Mutex::new(HashMap::new()),
        }
    }

    /// Checks (and, when it passes, counts) one request of `tenant`.
    pub(crate) async fn check(&self, tenant: &str, limit: Gcra) -> RateVerdict {
        match self {
            Self::Local { epoch, tats } => {
                let now = epoch.elapsed();
                let mut tats = tats.lock().unwrap_or_else(|e| e.into_inner());
                match limit.check(tats.get(tenant).copied(), now) {
                    Ok(tat) => {
                        tats.insert(tenant.to_string(), tat);
                        RateVerdict::Pass
                    }
                    Err(wait) => RateVerdict::Wait(wait),
                }
            }
            Self::Shared(store) => match store.gcra(&format!("rate:{tenant}"), limit).await {
                Ok(None) => RateVerdict::Pass,
                Ok(Some(wait)) => RateVerdict::Wait(wait),
                Err(e) => {
                    tracing::warn!(error = %e, tenant, "rate limit: the shared store cannot be reached");
                    RateVerdict::StoreDown
                }
            },
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
    }
}

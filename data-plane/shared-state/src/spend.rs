//! Tenants' spend budgets, carried out (the rules are
//! `router_policy::tenant`'s): a call's worst-case cost is reserved
//! against the tenant's day and month counters before it is sent, and
//! settled to its actual cost when it ends.
//!
//! - With a shared store, the reservation is one server-side script that
//!   checks both counters and adds to both, atomically: concurrent calls
//!   through any number of proxies cannot overshoot
//!   ([`crate::RedisStore::reserve_spend`]); a settlement adds
//!   the difference to both.
//! - Without one, the counters are this process's (a budget per proxy; the
//!   docs say so), one entry per tenant and period, older periods dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use router_policy::tenant::{periods, Budgets};

use crate::RedisStore;

/// A reservation held for a call until it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendHold {
    /// The tenant.
    pub tenant: Arc<str>,
    /// Reserved, micro-USD.
    pub micros: u64,
    /// The day's counter it was added to.
    pub day: String,
    /// The month's counter it was added to.
    pub month: String,
}

/// A budget's period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// The UTC day.
    Day,
    /// The UTC month.
    Month,
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Day => "day",
            Self::Month => "month",
        })
    }
}

/// Why a reservation was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpendRefusal {
    /// It does not fit: what is left of the budget that refused, which one
    /// (`day` or `month`), and when it resets (Unix seconds).
    Exceeded {
        /// What is left, micro-USD.
        left_micros: u64,
        /// The budget that refused.
        period: Period,
        /// When it resets, Unix seconds.
        resets_at: u64,
    },
    /// The shared store could not be asked.
    StoreDown,
}

/// Where the counters are kept.
pub enum SpendBudgets {
    /// In this process.
    Local(Mutex<HashMap<String, i64>>),
    /// In the shared store.
    Shared(Arc<RedisStore>),
}

/// The key of a tenant's spend counter for a period (`router:` is the
/// store's prefix): `spend:<tenant>:<YYYY-MM-DD or YYYY-MM>`.
pub fn counter(tenant: &str, period: &str) -> String {
    format!("spend:{tenant}:{period}")
}

/// The key of a tenant's reservations in flight today:
/// `spend_pending:<tenant>:<YYYY-MM-DD>`.
pub fn pending_counter(tenant: &str, day: &str) -> String {
    format!("spend_pending:{tenant}:{day}")
}

impl SpendBudgets {
    /// Counters kept in this process.
    pub fn local() -> Self {
        Self::Local(Mutex::new(HashMap::new()))
    }

    /// Reserves `micros` for a call of `tenant` at `unix_secs`.
    pub async fn reserve(
        &self,
        tenant: &str,
        budgets: Budgets,
        micros: u64,
        unix_secs: u64,
    ) -> Result<SpendHold, SpendRefusal> {
        let (day, day_end, month, month_end) = periods(unix_secs);
        let (day_key, month_key) = (counter(tenant, &day), counter(tenant, &month));
        let pending_key = pending_counter(tenant, &day);
        let limit = |b: Option<u64>| b.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
        let (day_limit, month_limit) = (limit(budgets.per_day), limit(budgets.per_month));
        let amount = i64::try_from(micros).unwrap_or(i64::MAX);
        let refused = match self {
            Self::Local(counters) => {
                let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
                // Only the current periods' counters of this tenant stay.
                let prefix = format!("spend:{tenant}:");
                let pending_prefix = format!("spend_pending:{tenant}:");
                c.retain(|k, _| {
                    !(k.starts_with(&prefix) || k.starts_with(&pending_prefix))
                        || *k == day_key
                        || *k == month_key
                        || *k == pending_key
                });
                let d = c.get(&day_key).copied().unwrap_or(0);
                let m = c.get(&month_key).copied().unwrap_or(0);
                // Saturating: counters never wrap (a wrapped one would
                // read as money left).
                if day_limit >= 0 && d.saturating_add(amount) > day_limit {
                    Some((day_limit.saturating_sub(d), Period::Day))
                } else if month_limit >= 0 && m.saturating_add(amount) > month_limit {
                    Some((month_limit.saturating_sub(m), Period::Month))
                } else {
                    for k in [&day_key, &month_key, &pending_key] {
                        let v = c.entry(k.clone()).or_insert(0);
                        *v = v.saturating_add(amount);
                    }
                    None
                }
            }
            Self::Shared(store) => {
                let ttl = |end: u64| (end.saturating_sub(unix_secs) + 86_400) * 1000;
                match store
                    .reserve_spend(
                        [&day_key, &month_key, &pending_key],
                        amount,
                        [day_limit, month_limit],
                        [ttl(day_end), ttl(month_end)],
                    )
                    .await
                {
                    Ok(None) => None,
                    Ok(Some((left, which))) => Some((
                        left,
                        if which == 1 {
                            Period::Day
                        } else {
                            Period::Month
                        },
                    )),
                    Err(e) => {
                        tracing::warn!(error = %e, tenant, "spend budget: the shared store cannot be reached");
                        return Err(SpendRefusal::StoreDown);
                    }
                }
            }
        };
        match refused {
            Some((left, period)) => Err(SpendRefusal::Exceeded {
                left_micros: u64::try_from(left.max(0)).unwrap_or(0),
                period,
                resets_at: match period {
                    Period::Day => day_end,
                    Period::Month => month_end,
                },
            }),
            None => Ok(SpendHold {
                tenant: Arc::from(tenant),
                micros,
                day,
                month,
            }),
        }
    }

    /// Settles a hold to `actual` micro-USD (`None`: keep the reservation,
    /// the cost is unknown; `Some(0)` for a call that got no answer).
    pub async fn settle(&self, hold: &SpendHold, actual: Option<u64>) {
        // Unknown: the reservation stays counted as spent.
        let actual = actual.unwrap_or(hold.micros);
        let reserved = i64::try_from(hold.micros).unwrap_or(i64::MAX);
        // Checked: an absurd usage must never wrap a counter to less.
        let delta = i64::try_from(actual)
            .unwrap_or(i64::MAX)
            .saturating_sub(reserved);
        let keys = [
            counter(&hold.tenant, &hold.day),
            counter(&hold.tenant, &hold.month),
            pending_counter(&hold.tenant, &hold.day),
        ];
        match self {
            Self::Local(counters) => {
                let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
                for (k, by) in keys.iter().zip([delta, delta, -reserved]) {
                    if let Some(v) = c.get_mut(k) {
                        *v = v.saturating_add(by);
                    }
                }
            }
            Self::Shared(store) => {
                let keys = [keys[0].as_str(), keys[1].as_str(), keys[2].as_str()];
                if let Err(e) = store.adjust_spend(keys, delta, reserved).await {
                    tracing::warn!(error = %e, tenant = &*hold.tenant, "spend budget: a settlement was lost (the reservation stays counted)");
                }
            }
        }
    }

    /// The spend counted for `tenant` today and this month (micro-USD;
    /// local counters only, for tests and status).
    #[cfg(test)]
    pub fn local_spend(&self, tenant: &str, unix_secs: u64) -> (i64, i64) {
        let (day, _, month, _) = periods(unix_secs);
        match self {
            Self::Local(c) => {
                let c = c.lock().unwrap_or_else(|e| e.into_inner());
                let get = |p: &str| c.get(&counter(tenant, p)).copied().unwrap_or(0);
                (get(&day), get(&month))
            }
            Self::Shared(_) => (0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_never_pass_the_budget_and_settle_to_the_actual_cost() {
        let s = SpendBudgets::local();
        let b = Budgets {
            per_day: Some(250),
            per_month: Some(1000),
        };
        let now = 1_796_148_000;
        let h1 = s.reserve("a", b, 100, now).await.unwrap();
        let h2 = s.reserve("a", b, 100, now).await.unwrap();
        let refused = s.reserve("a", b, 100, now).await.unwrap_err();
        assert_eq!(
            refused,
            SpendRefusal::Exceeded {
                left_micros: 50,
                period: Period::Day,
                resets_at: 1_796_169_600
            }
        );
        // The first cost 30, the second got no answer: 220 back.
        s.settle(&h1, Some(30)).await;
        s.settle(&h2, Some(0)).await;
        assert_eq!(s.local_spend("a", now), (30, 30));
        assert!(s.reserve("a", b, 200, now).await.is_ok());
        // Another tenant has its own counters; a new day starts at 0.
        assert!(s.reserve("b", b, 250, now).await.is_ok());
        assert!(s.reserve("a", b, 250, now + 86_400).await.is_ok());
    }
}

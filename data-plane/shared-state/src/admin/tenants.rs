//! Tenants' spend and hourly rollups as the control plane reads them:
//! the counters the proxies keep ([`crate::spend`]'s keys) and the hourly
//! hashes they write ([`router_policy::rollup`]'s keys).
//!
//! - **usage** (`routerctl tenants usage`): one `MGET` of the tenant's
//!   day and month counters, the day's reserved-in-flight counter and the
//!   store's epoch marker ([`router_policy::store_epoch`]), read together
//!   so the spend and the "since when" agree.
//! - **page** (the console's tenants page): one pipeline with an `MGET`
//!   per tenant for its spend and an `HMGET` per charted tenant and hour
//!   for its rollups; the rollup reads are bounded by
//!   [`MAX_ROLLUP_READS`] (tenants past it are not charted).
//!
//! A counter that is absent or not a number reads as 0; a reserved amount
//! below 0 (a settlement raced an expiry) as 0.

use router_policy::rollup::{self, Totals};
use router_policy::store_epoch::{self, Epoch};
use router_policy::tenant::periods;

use super::{SharedStoreClient, MAX_ROLLUP_READS};
use crate::spend::{counter, pending_counter};
use crate::StoreError;

/// A tenant's spend counters for the current UTC day and month, micro-USD,
/// as the proxies keep them: what was settled plus what is reserved for
/// calls in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpendCounters {
    /// The day's counter.
    pub day: i64,
    /// The month's counter.
    pub month: i64,
    /// Reserved today for calls in flight (never below 0).
    pub reserved: i64,
}

impl SpendCounters {
    /// Spent today, without what is reserved in flight.
    pub fn spent_today(&self) -> i64 {
        self.day.saturating_sub(self.reserved)
    }

    /// Spent this month, without what is reserved in flight.
    pub fn spent_month(&self) -> i64 {
        self.month.saturating_sub(self.reserved)
    }
}

/// A tenant's spend with the store's epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The UTC day (`YYYY-MM-DD`) the counters are for.
    pub day: String,
    /// The UTC month (`YYYY-MM`).
    pub month: String,
    /// The counters.
    pub spend: SpendCounters,
    /// The store's epoch marker, if one was written.
    pub epoch: Option<Epoch>,
}

/// What the tenants page reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantsRead {
    /// Per tenant asked for, in order: its spend counters.
    pub spend: Vec<SpendCounters>,
    /// Per charted tenant (the first ones), per hour asked for (in
    /// order): its totals.
    pub hours: Vec<Vec<Totals>>,
}

fn number(v: Option<&Option<String>>) -> i64 {
    v.and_then(|x| x.as_deref())
        .and_then(|x| x.parse::<i64>().ok())
        .unwrap_or(0)
}

fn counters(values: &[Option<String>]) -> SpendCounters {
    SpendCounters {
        day: number(values.first()),
        month: number(values.get(1)),
        reserved: number(values.get(2)).max(0),
    }
}

impl SharedStoreClient {
    /// The day, month and reserved keys of `tenant`'s counters.
    fn spend_keys(&self, tenant: &str, day: &str, month: &str) -> [String; 3] {
        let p = self.prefix();
        [
            format!("{p}{}", counter(tenant, day)),
            format!("{p}{}", counter(tenant, month)),
            format!("{p}{}", pending_counter(tenant, day)),
        ]
    }

    /// `tenant`'s spend for the UTC day and month of `now_s` (Unix
    /// seconds), and the store's epoch, in one round trip.
    pub async fn tenant_usage(&self, tenant: &str, now_s: u64) -> Result<Usage, StoreError> {
        let (day, _, month, _) = periods(now_s);
        let mut conn = self.conn().await?;
        let [d, m, r] = self.spend_keys(tenant, &day, &month);
        let epoch_key = format!("{}{}", self.prefix(), store_epoch::KEY);
        let values: Vec<Option<String>> = self
            .within(
                redis::cmd("MGET")
                    .arg(&[d, m, r, epoch_key])
                    .query_async(&mut conn),
            )
            .await?;
        let epoch = values
            .get(3)
            .and_then(|v| v.as_deref())
            .and_then(Epoch::parse);
        Ok(Usage {
            day,
            month,
            spend: counters(&values),
            epoch,
        })
    }

    /// For the tenants page: every tenant's spend at `now_s`, and the
    /// hourly totals of the first `charted` tenants over `hours` (their
    /// starts, Unix seconds), in one round trip. Tenants whose hours would
    /// pass [`MAX_ROLLUP_READS`] are not charted (`hours` is shorter).
    pub async fn tenants_page(
        &self,
        tenants: &[&str],
        charted: usize,
        hours: &[u64],
        now_s: u64,
    ) -> Result<TenantsRead, StoreError> {
        if tenants.is_empty() {
            return Ok(TenantsRead::default());
        }
        let (day, _, month, _) = periods(now_s);
        let charted = charted.min(tenants.len()).min(
            MAX_ROLLUP_READS
                .checked_div(hours.len())
                .unwrap_or(usize::MAX),
        );
        let mut pipe = redis::pipe();
        for t in tenants {
            pipe.cmd("MGET").arg(&self.spend_keys(t, &day, &month));
        }
        let names: Vec<String> = hours.iter().map(|h| rollup::hour(*h)).collect();
        for t in &tenants[..charted] {
            for h in &names {
                pipe.cmd("HMGET")
                    .arg(format!("{}{}", self.prefix(), rollup::key(t, h)))
                    .arg(&rollup::FIELDS[..]);
            }
        }
        let mut conn = self.conn().await?;
        let values: Vec<Vec<Option<String>>> = self.within(pipe.query_async(&mut conn)).await?;
        let mut values = values.into_iter();
        let spend = tenants
            .iter()
            .map(|_| counters(&values.next().unwrap_or_default()))
            .collect();
        let hours = (0..charted)
            .map(|_| {
                names
                    .iter()
                    .map(|_| Totals::from_fields(&values.next().unwrap_or_default()))
                    .collect()
            })
            .collect();
        Ok(TenantsRead { spend, hours })
    }
}

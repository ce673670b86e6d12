//! Tenants' hourly rollups (issue 33): what the proxies add up in the
//! shared store as they settle a tenant's request, and what the control
//! plane's console reads back to draw a tenant's last 24 hours and 30
//! days. The key names live here so that both sides agree.
//!
//! # Key layout
//!
//! One hash per tenant and UTC hour, under the store's prefix (`router:`):
//!
//! ```text
//! router:rollup:<tenant>:<YYYY-MM-DDTHH>      (a hash, TTL 31 days)
//!   requests   requests settled in that hour (by their arrival time)
//!   tokens     input plus output tokens the answers reported
//!   micros     spend the answers reported, micro-USD
//!   failed     requests whose outcome was not `ok`
//! ```
//!
//! A settled request adds to its hour's hash with one pipeline: `HINCRBY`
//! of each field it has something for (`requests` always; `tokens`,
//! `micros` and `failed` when not zero) and a `PEXPIRE` of
//! [`HOURLY_TTL`] (so an hour's hash lives 31 days after its last
//! request). No key lists the tenants: the control plane reads the
//! tenants its policy names, 24 hours for the day chart and 720 for the
//! 30 days (summed per day), with one pipelined `HMGET` per hour.
//!
//! Spend here is what the answers reported (as
//! `router_tenant_cost_usd_total` counts it), not the budget's counter: a
//! call whose usage could not be read keeps its reservation in the
//! budget and adds nothing here.

use std::time::Duration;

/// How long an hour's hash is kept after its last write.
pub const HOURLY_TTL: Duration = Duration::from_secs(31 * 86_400);

/// The fields of an hour's hash, in the order [`Totals`] has them.
pub const FIELDS: [&str; 4] = ["requests", "tokens", "micros", "failed"];

/// An hour's bucket name, UTC: `YYYY-MM-DDTHH`.
pub fn hour(unix_secs: u64) -> String {
    let (day, _, _, _) = crate::tenant::periods(unix_secs);
    format!("{day}T{:02}", (unix_secs % 86_400) / 3600)
}

/// The key of a tenant's hour (without the store's `router:` prefix):
/// `rollup:<tenant>:<YYYY-MM-DDTHH>`.
pub fn key(tenant: &str, hour: &str) -> String {
    format!("rollup:{tenant}:{hour}")
}

/// The starts (Unix seconds) of the `n` hours up to and including the
/// one `unix_secs` falls in, oldest first.
pub fn last_hours(unix_secs: u64, n: u64) -> Vec<u64> {
    let this = unix_secs - unix_secs % 3600;
    (0..n)
        .rev()
        .filter_map(|i| this.checked_sub(i * 3600))
        .collect()
}

/// What one hour (or one day, summed) holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Requests settled.
    pub requests: u64,
    /// Input plus output tokens.
    pub tokens: u64,
    /// Spend, micro-USD.
    pub micros: u64,
    /// Requests that did not end `ok`.
    pub failed: u64,
}

impl Totals {
    /// From an `HMGET` of [`FIELDS`] (absent or unreadable fields: 0).
    pub fn from_fields(values: &[Option<String>]) -> Self {
        let at = |i: usize| {
            values
                .get(i)
                .and_then(|v| v.as_deref())
                .and_then(|v| v.parse::<i64>().ok())
                .map_or(0, |v| u64::try_from(v).unwrap_or(0))
        };
        Self {
            requests: at(0),
            tokens: at(1),
            micros: at(2),
            failed: at(3),
        }
    }

    /// Both added (saturating).
    pub fn plus(self, o: Self) -> Self {
        Self {
            requests: self.requests.saturating_add(o.requests),
            tokens: self.tokens.saturating_add(o.tokens),
            micros: self.micros.saturating_add(o.micros),
            failed: self.failed.saturating_add(o.failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_are_named_in_utc_and_counted_back_oldest_first() {
        // 2024-02-29T23:59:59Z.
        let t = 1_709_251_199;
        assert_eq!(hour(t), "2024-02-29T23");
        assert_eq!(hour(t + 1), "2024-03-01T00");
        assert_eq!(key("acme", &hour(t)), "rollup:acme:2024-02-29T23");
        let hours = last_hours(t, 24);
        assert_eq!(hours.len(), 24);
        assert_eq!(hour(hours[23]), "2024-02-29T23");
        assert_eq!(hour(hours[0]), "2024-02-29T00");
        assert!(hours.windows(2).all(|w| w[1] - w[0] == 3600));
        assert_eq!(last_hours(7200, 24).len(), 3, "none before 1970");
    }

    #[test]
    fn totals_read_what_is_there_and_add_up() {
        let t = Totals::from_fields(&[
            Some("3".into()),
            None,
            Some("junk".into()),
            Some("-4".into()),
        ]);
        assert_eq!(
            t,
            Totals {
                requests: 3,
                ..Totals::default()
            }
        );
        let both = t.plus(Totals {
            requests: u64::MAX,
            tokens: 5,
            micros: 7,
            failed: 1,
        });
        assert_eq!(both.requests, u64::MAX);
        assert_eq!((both.tokens, both.micros, both.failed), (5, 7, 1));
    }
}

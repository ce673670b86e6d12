//! A retry budget: extra attempts (fallback retries and hedges) bounded to
//! a share of recent requests.
//!
//! Retrying is what turns a backend's brief trouble into an overload: when
//! every request fails once and is tried again, the load doubles at the
//! worst moment. Hedging (a second attempt started while the first is
//! still running) adds load by design. So both draw on one budget, in the
//! manner of Finagle's `RetryBudget` and tower's `retry::budget`:
//!
//! - every request that starts *deposits* one unit;
//! - every extra attempt (a retry after a failure, a hedge) must
//!   *withdraw* `1 / ratio` units, so with `ratio = 0.2` five requests
//!   pay for one extra attempt;
//! - a floor of `min_per_second` extra attempts is always allowed, so a
//!   quiet route (one request a minute) can still retry;
//! - deposits and withdrawals count for `window` only (kept in ten slots,
//!   a slot rolled out as time passes), so the budget follows recent
//!   traffic, not all-time totals.
//!
//! Extra attempts allowed in a window = `min_per_second × window +
//! ratio × requests in the window`. The defaults are tower's: 20% of
//! requests plus 10 per second, over 10 s.
//!
//! A shed (a full queue, a pool with no endpoint, a pool skipped for time)
//! is not a retry: the router sent nothing, so moving on costs no backend
//! anything. The proxy withdraws only before an attempt that follows one
//! that may have reached a backend, and before a hedge.
//!
//! Pure: the caller passes the time (as the time since any fixed point
//! of its own), so the tests below run without a clock. One budget per route per proxy (kept across policy reloads
//! while the route keeps its name).

use std::time::Duration;

/// How many slots the window is kept in.
const SLOTS: usize = 10;

/// A retry budget's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetSettings {
    /// Extra attempts allowed per request, in (0, 1] (0.2: one in five).
    pub ratio: f64,
    /// Extra attempts always allowed per second, whatever the traffic.
    pub min_per_second: u32,
    /// How long deposits and withdrawals count.
    pub window: Duration,
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            ratio: 0.2,
            min_per_second: 10,
            window: Duration::from_secs(10),
        }
    }
}

/// A route's retry budget (see the module docs).
#[derive(Debug, Clone)]
pub struct RetryBudget {
    settings: BudgetSettings,
    /// Deposits minus withdrawals per slot, in thousandths of a unit.
    slots: [i64; SLOTS],
    /// The slot `slots[current]` covers starts here.
    slot_start: Option<Duration>,
    current: usize,
}

/// Thousandths of a unit: deposits and withdrawals are kept as integers.
const MILLI: i64 = 1000;

impl RetryBudget {
    /// An empty budget (only the floor is available).
    pub fn new(settings: BudgetSettings) -> Self {
        Self {
            settings,
            slots: [0; SLOTS],
            slot_start: None,
            current: 0,
        }
    }

    /// The settings.
    pub fn settings(&self) -> BudgetSettings {
        self.settings
    }

    fn slot_len(&self) -> Duration {
        (self.settings.window / SLOTS as u32).max(Duration::from_millis(1))
    }

    /// Rolls the window forward to `now`, clearing slots that left it.
    fn roll(&mut self, now: Duration) {
        let len = self.slot_len();
        let Some(start) = self.slot_start else {
            self.slot_start = Some(now);
            return;
        };
        let elapsed = now.saturating_sub(start);
        // Most calls land in the current slot: no division for them.
        if elapsed < len {
            return;
        }
        let passed = (elapsed.as_nanos() / len.as_nanos().max(1)) as usize;
        for _ in 0..passed.min(SLOTS) {
            self.current = (self.current + 1) % SLOTS;
            self.slots[self.current] = 0;
        }
        let passed = u32::try_from(passed).unwrap_or(u32::MAX);
        self.slot_start = Some(start + len.saturating_mul(passed));
    }

    /// A request started: it pays into the budget.
    pub fn deposit(&mut self, now: Duration) {
        self.roll(now);
        self.slots[self.current] += MILLI;
    }

    /// What one extra attempt costs, in thousandths: rounded up, so that
    /// the attempts granted never exceed the ratio's share (rounded to
    /// nearest, a ratio of 0.03 cost 33 and granted 3.03%: the property
    /// test found it).
    fn cost(&self) -> i64 {
        let ratio = self.settings.ratio.clamp(0.001, 1.0);
        (MILLI as f64 / ratio).ceil() as i64
    }

    /// The balance as of `now`, floor included, in thousandths.
    fn balance(&mut self, now: Duration) -> i64 {
        self.roll(now);
        let floor = i64::from(self.settings.min_per_second)
            .saturating_mul(self.settings.window.as_millis() as i64)
            .saturating_mul(self.cost())
            / 1000;
        floor + self.slots.iter().sum::<i64>()
    }

    /// An extra attempt wants to start: `true` (and it is paid for) when
    /// the budget has room, `false` when it is exhausted.
    pub fn withdraw(&mut self, now: Duration) -> bool {
        let cost = self.cost();
        if self.balance(now) < cost {
            return false;
        }
        self.slots[self.current] -= cost;
        true
    }

    /// Extra attempts the budget allows now (for status and tests).
    pub fn available(&mut self, now: Duration) -> u64 {
        let cost = self.cost();
        (self.balance(now).max(0) / cost) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn budget(ratio: f64, min_per_second: u32) -> RetryBudget {
        RetryBudget::new(BudgetSettings {
            ratio,
            min_per_second,
            window: Duration::from_secs(10),
        })
    }

    #[test]
    fn the_floor_allows_a_few_retries_without_traffic() {
        let t0 = Duration::from_secs(1000);
        let mut b = budget(0.1, 1);
        // 1 per second over 10 s.
        assert_eq!(b.available(t0), 10);
        for _ in 0..10 {
            assert!(b.withdraw(t0));
        }
        assert!(!b.withdraw(t0), "the floor is spent");
    }

    #[test]
    fn requests_pay_for_a_share_of_retries() {
        let t0 = Duration::from_secs(1000);
        let mut b = budget(0.1, 0);
        for _ in 0..100 {
            b.deposit(t0);
        }
        let mut granted = 0;
        while b.withdraw(t0) {
            granted += 1;
        }
        assert_eq!(granted, 10, "10% of 100 requests");
    }

    #[test]
    fn deposits_leave_the_window() {
        let t0 = Duration::from_secs(1000);
        let mut b = budget(0.5, 0);
        for _ in 0..10 {
            b.deposit(t0);
        }
        assert_eq!(b.available(t0), 5);
        assert_eq!(b.available(t0 + Duration::from_secs(5)), 5);
        assert_eq!(b.available(t0 + Duration::from_secs(11)), 0);
        // Withdrawals leave it too: the budget recovers.
        let mut b = budget(0.5, 1);
        while b.withdraw(t0) {}
        assert_eq!(b.available(t0), 0);
        assert_eq!(b.available(t0 + Duration::from_secs(11)), 10);
    }

    proptest! {
        /// However requests and extra attempts interleave within one
        /// window, the extra attempts granted never exceed the floor plus
        /// the ratio's share of the requests.
        #[test]
        fn extra_attempts_stay_within_the_share(
            ops in proptest::collection::vec((any::<bool>(), 0u64..1000), 1..400),
            ratio_pct in 1u32..=100,
            floor in 0u32..5,
        ) {
            let ratio = f64::from(ratio_pct) / 100.0;
            let mut b = budget(ratio, floor);
            let t0 = Duration::from_secs(1000);
            let (mut requests, mut granted) = (0u64, 0u64);
            for (is_request, at_ms) in ops {
                // All inside the first slot's window: nothing expires.
                let now = t0 + Duration::from_millis(at_ms);
                if is_request {
                    b.deposit(now);
                    requests += 1;
                } else if b.withdraw(now) {
                    granted += 1;
                }
            }
            let allowed = f64::from(floor) * 10.0 + ratio * requests as f64;
            prop_assert!(granted as f64 <= allowed + 1e-9, "{granted} > {allowed}");
        }
    }
}

//! Active health checks, shared suspicion and outlier ejection: the three
//! ways an endpoint stops taking traffic before a client pays for it.
//!
//! The circuit breaker ([`crate::document::CircuitSettings`]) learns only
//! from real requests, one proxy at a time: it opens after N consecutive
//! failures *on this proxy*. In a fleet of ten proxies, an endpoint that
//! fails every request can take ten (or thirty) real requests before every
//! proxy has learnt it. The rules here stop that earlier, each from a
//! different signal:
//!
//! - **Active health checks** ([`HealthCheck`], [`CheckState`]): every
//!   proxy `GET`s each endpoint's health path every `interval` (jittered by
//!   ±10% so a fleet started at once does not check in step), each check
//!   bounded by `timeout`. An endpoint that fails `unhealthy_after` checks
//!   in a row takes no traffic until it passes `healthy_after` in a row. A
//!   *new* endpoint takes traffic only after its first passing check: a
//!   backend added while still loading its model is not sent requests to
//!   find out. One check per endpoint per interval: a bounded cost.
//! - **Shared suspicion** ([`Suspicion`]): a proxy that sees an endpoint
//!   fail (a failed check, or a failed first attempt on an endpoint it had
//!   never tried) tells the control plane at once, which pushes the mark to
//!   every proxy: no new traffic there until it ends. A mark raised by a
//!   check ends when a check passes; one raised by a failed request ends
//!   when a request there is answered (the probe: sent when every
//!   endpoint of the pool is marked, or by a proxy whose own view has
//!   expired), not when a check passes (a health page that answers 200
//!   says nothing about whether generation works: a model that failed to
//!   load often serves a fine `/health` and a 500 on every completion).
//!   Either way it expires on its own, so a lost "clear" never strands an
//!   endpoint. A proxy that rests a key because its provider said none of
//!   its quota is left ([`crate::quota`]) marks it the same way, until
//!   the reset: the other proxies stop sending to that key before their
//!   own next answer from it would tell them.
//! - **Outlier ejection** ([`OutlierEjection`], [`ejections`]): an endpoint
//!   whose error rate over a window is far above the rest of its pool's is
//!   ejected for a while, at most `max_ejection_percent` of the pool at
//!   once (Envoy's idea), so a bad day for the whole pool (every endpoint
//!   erring) ejects nobody: the pool's own rate is the yardstick.
//!
//! None of them ever empties a pool on its own: when every endpoint a
//! circuit and the drains would admit is suspect or ejected, the pool
//! ignores those two marks ([`admits`]) and serves as it would without them
//! (a suspicion is a hint; failing every request on a hint would be worse
//! than the hint). A failed health check is not a hint: it excludes.

use std::time::Duration;

use crate::document::Provider;

/// A pool's active health check, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// Path requested with `GET` on each endpoint, from the server's root.
    pub path: String,
    /// Time between two checks of one endpoint (before jitter).
    pub interval: Duration,
    /// Longest a check may take; longer is a failure.
    pub timeout: Duration,
    /// Failed checks in a row that make a healthy endpoint unhealthy.
    pub unhealthy_after: u32,
    /// Passed checks in a row that make an unhealthy endpoint healthy.
    pub healthy_after: u32,
}

/// Default interval between checks.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);
/// Default check timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default failures in a row before unhealthy (HAProxy's `fall`).
pub const DEFAULT_UNHEALTHY_AFTER: u32 = 3;
/// Default passes in a row before healthy again (HAProxy's `rise`).
pub const DEFAULT_HEALTHY_AFTER: u32 = 2;

/// The health path a provider's servers answer: `/health` for vLLM and
/// TGI, `/api/tags` for Ollama, `/v1/models` for any OpenAI-compatible API
/// and for Anthropic's, `/v1beta/models` for Gemini's, and Azure OpenAI's
/// model list (at the default `api-version`).
pub fn default_path(provider: Provider) -> &'static str {
    match provider {
        Provider::Vllm | Provider::Tgi => "/health",
        Provider::Ollama => "/api/tags",
        Provider::Openai | Provider::Anthropic => "/v1/models",
        Provider::AzureOpenai => "/openai/models?api-version=2024-10-21",
        Provider::Gemini => "/v1beta/models",
    }
}

/// Whether a pool of `provider` checks its endpoints when its policy says
/// nothing: local engines (vLLM, TGI, Ollama) yes; `openai`, which is how
/// cloud APIs are written, and the cloud APIs `anthropic`, `azure_openai`
/// and `gemini` (where a check costs quota), no.
pub fn on_by_default(provider: Provider) -> bool {
    matches!(provider, Provider::Vllm | Provider::Tgi | Provider::Ollama)
}

impl HealthCheck {
    /// The defaults for `provider`.
    pub fn defaults(provider: Provider) -> Self {
        Self {
            path: default_path(provider).to_string(),
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            unhealthy_after: DEFAULT_UNHEALTHY_AFTER,
            healthy_after: DEFAULT_HEALTHY_AFTER,
        }
    }

    /// The delay before the next check of one endpoint: `interval` moved by
    /// up to ±10% by `jitter` (any value; the caller draws it at random), so
    /// that checks started together spread out. Never below half the
    /// interval, never zero.
    pub fn next_delay(&self, jitter: u64) -> Duration {
        let base = self.interval.as_micros().min(u64::MAX as u128) as u64;
        let spread = base / 5; // the width of ±10%
        let offset = if spread == 0 {
            0
        } else {
            jitter % (spread + 1)
        };
        let micros = (base - base / 10).saturating_add(offset).max(1);
        Duration::from_micros(micros)
    }
}

/// What the checks say of one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Never checked yet, or no check passed since it was added: takes no
    /// traffic.
    Unknown,
    /// Takes traffic.
    Healthy,
    /// Failed `unhealthy_after` checks in a row: takes no traffic until
    /// `healthy_after` pass in a row.
    Unhealthy,
}

impl Health {
    /// Its name in health pages, metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// One endpoint's check history: a small state machine.
///
/// ```text
///   Unknown --pass--> Healthy --(unhealthy_after fails)--> Unhealthy
///      |                 ^                                    |
///      +--(unhealthy_after fails)--> Unhealthy --(healthy_after passes)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckState {
    health: Health,
    passes: u32,
    fails: u32,
    checked: bool,
}

impl Default for CheckState {
    fn default() -> Self {
        Self::new()
    }
}

impl CheckState {
    /// A new endpoint: unknown, takes no traffic until a check passes.
    pub const fn new() -> Self {
        Self {
            health: Health::Unknown,
            passes: 0,
            fails: 0,
            checked: false,
        }
    }

    /// The endpoint's health now.
    pub fn health(&self) -> Health {
        self.health
    }

    /// Whether the checks let the endpoint take traffic.
    pub fn admits(&self) -> bool {
        self.health == Health::Healthy
    }

    /// No check has ended yet (a new endpoint whose first check is under
    /// way): requests may wait for it in the pool's queue, rather than
    /// the pool count as down for the round trip it takes.
    pub fn awaiting_first(&self) -> bool {
        !self.checked
    }

    /// Failed checks in a row so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.fails
    }

    /// Folds one check's result in; returns the new health when it changed.
    pub fn record(&mut self, passed: bool, check: &HealthCheck) -> Option<Health> {
        let before = self.health;
        self.checked = true;
        if passed {
            self.fails = 0;
            self.passes = self.passes.saturating_add(1);
            let rises = match self.health {
                // The first pass is enough for a new endpoint.
                Health::Unknown => true,
                Health::Unhealthy => self.passes >= check.healthy_after.max(1),
                Health::Healthy => false,
            };
            if rises {
                self.health = Health::Healthy;
            }
        } else {
            self.passes = 0;
            self.fails = self.fails.saturating_add(1);
            if self.fails >= check.unhealthy_after.max(1) {
                self.health = Health::Unhealthy;
            }
        }
        (self.health != before).then_some(self.health)
    }
}

/// Why an endpoint is suspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SuspectCause {
    /// A proxy's health check failed there.
    Check,
    /// A proxy's first request there failed.
    Attempt,
    /// A proxy rests the key there: its provider said none of its quota is
    /// left until its reset ([`crate::quota`]). Ends at the reset, not on
    /// an answer.
    Quota,
}

impl SuspectCause {
    /// Its name on the wire and in status pages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Check => "check",
            Self::Attempt => "attempt",
            Self::Quota => "quota",
        }
    }

    /// Parses [`Self::as_str`]'s names.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "check" => Some(Self::Check),
            "attempt" => Some(Self::Attempt),
            "quota" => Some(Self::Quota),
            _ => None,
        }
    }
}

/// A fleet-wide suspicion mark on one endpoint, as a proxy holds it: the
/// latest expiry per cause (times are the caller's clock, any unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suspicion<T> {
    /// Raised by a failed check, until then.
    pub check_until: Option<T>,
    /// Raised by a failed first request, until then.
    pub attempt_until: Option<T>,
    /// Raised by a key out of quota, until its reset.
    pub quota_until: Option<T>,
}

impl<T> Suspicion<T> {
    /// No mark.
    pub const fn none() -> Self {
        Self {
            check_until: None,
            attempt_until: None,
            quota_until: None,
        }
    }
}

impl<T: Copy + Ord> Suspicion<T> {
    /// Whether a mark holds at `now`.
    pub fn holds(&self, now: T) -> bool {
        [self.check_until, self.attempt_until, self.quota_until]
            .into_iter()
            .flatten()
            .any(|u| u > now)
    }

    /// Whether a mark of `cause` holds at `now`. A passing check ends the
    /// `Check` mark only; an answer from the endpoint ends both (it is the
    /// probe that passed; see the module docs).
    pub fn held_for(&self, cause: SuspectCause, now: T) -> bool {
        self.slot(cause).is_some_and(|u| u > now)
    }

    /// Marks it for `cause` until `until`.
    pub fn set(&mut self, cause: SuspectCause, until: T) {
        *self.slot_mut(cause) = Some(until);
    }

    /// Ends the mark of `cause`.
    pub fn clear(&mut self, cause: SuspectCause) {
        *self.slot_mut(cause) = None;
    }

    fn slot(&self, cause: SuspectCause) -> Option<T> {
        match cause {
            SuspectCause::Check => self.check_until,
            SuspectCause::Attempt => self.attempt_until,
            SuspectCause::Quota => self.quota_until,
        }
    }

    fn slot_mut(&mut self, cause: SuspectCause) -> &mut Option<T> {
        match cause {
            SuspectCause::Check => &mut self.check_until,
            SuspectCause::Attempt => &mut self.attempt_until,
            SuspectCause::Quota => &mut self.quota_until,
        }
    }
}

/// Whether a proxy should report an attempt that ended on an endpoint as
/// suspect: a failure (a refused connection, a reset, a 5xx, a timeout; not
/// a rate limit, which is the provider's quota, nor a cancelled attempt) on
/// an endpoint this proxy had never had an answer from. An endpoint with a
/// track record failing once is noise for its circuit to weigh.
pub fn suspect_after_attempt(failed: bool, had_answered: bool) -> bool {
    failed && !had_answered
}

/// A pool's outlier ejection, resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutlierEjection {
    /// The window error rates are measured over.
    pub window: Duration,
    /// Requests an endpoint must have had in the window to be judged.
    pub min_requests: u32,
    /// An endpoint is an outlier when its error rate is at least this
    /// (0..=1) ...
    pub min_error_rate: f64,
    /// ... and at least this many times the rest of the pool's.
    pub ratio: f64,
    /// Largest share of the pool's endpoints ejected at once, percent. At
    /// least one endpoint of a pool of two or more may always be ejected.
    pub max_ejection_percent: u32,
    /// How long an ejection lasts (doubled for each ejection in a row, at
    /// most ten times).
    pub ejection: Duration,
}

impl Default for OutlierEjection {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            min_requests: 5,
            min_error_rate: 0.5,
            ratio: 3.0,
            max_ejection_percent: 50,
            ejection: Duration::from_secs(30),
        }
    }
}

impl OutlierEjection {
    /// How long the `times`-th ejection in a row lasts (1-based).
    pub fn duration(&self, times: u32) -> Duration {
        self.ejection.saturating_mul(times.clamp(1, 10))
    }

    /// How many of `endpoints` may be ejected at once.
    pub fn cap(&self, endpoints: usize) -> usize {
        if endpoints < 2 {
            return 0;
        }
        let share = endpoints * self.max_ejection_percent.min(100) as usize / 100;
        share.max(1).min(endpoints - 1)
    }
}

/// One endpoint's requests and errors in the window, and whether it is
/// ejected now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorCount {
    /// Requests that ended (answered or failed).
    pub requests: u32,
    /// Of which failed.
    pub errors: u32,
    /// Ejected now.
    pub ejected: bool,
}

impl ErrorCount {
    fn rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            f64::from(self.errors) / f64::from(self.requests)
        }
    }
}

/// Which endpoints (indices into `counts`) to eject now, worst first,
/// within the cap (those already ejected count against it).
///
/// An endpoint is an outlier when it had at least `min_requests` requests
/// in the window, an error rate of at least `min_error_rate`, and at least
/// `ratio` times the error rate of the rest of the pool (the others'
/// requests and errors summed; a rest with no errors counts as a tiny
/// rate, so any error rate above the floor is "far above" it). When every
/// endpoint errs alike, nobody is an outlier: the pool's own rate is the
/// yardstick.
pub fn ejections(counts: &[ErrorCount], rules: &OutlierEjection) -> Vec<usize> {
    let total_req: u64 = counts.iter().map(|c| u64::from(c.requests)).sum();
    let total_err: u64 = counts.iter().map(|c| u64::from(c.errors)).sum();
    let already = counts.iter().filter(|c| c.ejected).count();
    let room = rules.cap(counts.len()).saturating_sub(already);
    if room == 0 {
        return Vec::new();
    }
    let mut out: Vec<(usize, f64)> = counts
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.ejected && c.requests >= rules.min_requests.max(1))
        .filter_map(|(i, c)| {
            let rate = c.rate();
            let rest_req = total_req - u64::from(c.requests);
            let rest_err = total_err - u64::from(c.errors);
            let rest = if rest_req == 0 {
                // Nothing to compare with: not an outlier of anything.
                return None;
            } else {
                (rest_err as f64 / rest_req as f64).max(1e-9)
            };
            (rate >= rules.min_error_rate && rate >= rest * rules.ratio).then_some((i, rate))
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out.truncate(room);
    out.into_iter().map(|(i, _)| i).collect()
}

/// Whether a walk passes over a pool whose every endpoint that could take
/// the request is soft-marked (`only_marked`): the marks never empty a pool
/// that is the last that could answer, but when the route falls back
/// (`fallback`) and a later pool of the chain has an unmarked endpoint
/// ready (`clean_later`), the marked pool counts as down for this walk, so
/// a failing endpoint gets no traffic the chain can send elsewhere.
pub fn pass_over_marked_pool(only_marked: bool, fallback: bool, clean_later: bool) -> bool {
    only_marked && fallback && clean_later
}

/// Whether an endpoint may take traffic, given whether the circuit, the
/// drains, the probe and the health checks admit it (`usable`), whether it
/// carries a soft mark (suspect or ejected), and whether any endpoint of
/// its pool is usable without one (`any_clean`). See the module docs:
/// soft marks never empty a pool.
pub fn admits(usable: bool, soft_marked: bool, any_clean: bool) -> bool {
    usable && (!soft_marked || !any_clean)
}

/// When an open circuit's wait ends, given a passing active health check
/// at `now` (issue 30, "recovery in seconds"): a backend that came back
/// is found by its checks within an interval or two, while the circuit's
/// open period (a minute, say, doubled on each failed probe) would keep
/// it out far longer. So a passing check ends the wait at once: the
/// circuit's probe is due now, and the next request granted is that probe
/// (half-open), which closes the circuit if it is answered and reopens it
/// if not. The check does not close the circuit itself: a health page
/// that answers 200 says nothing about whether generation works (see the
/// module docs), so one real request still decides.
///
/// Two bounds: the wait never grows (`open_until` is the latest), and a
/// provider's `Retry-After` is still honoured (`not_before`, the instant
/// it named; `now` or earlier when there is none): a rate-limited
/// provider's health page answering 200 is no reason to come back before
/// it said. Generic over the clock so the proxy passes its own instants.
pub fn open_until_after_passing_check<T: Ord + Copy>(now: T, open_until: T, not_before: T) -> T {
    open_until.min(now.max(not_before))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(unhealthy_after: u32, healthy_after: u32) -> HealthCheck {
        HealthCheck {
            unhealthy_after,
            healthy_after,
            ..HealthCheck::defaults(Provider::Vllm)
        }
    }

    #[test]
    fn a_passing_check_makes_an_open_circuits_probe_due_now() {
        // Open until 60 (a minute), no Retry-After: the probe is due now.
        assert_eq!(open_until_after_passing_check(5, 60, 0), 5);
        // A provider's Retry-After until 30 still holds.
        assert_eq!(open_until_after_passing_check(5, 60, 30), 30);
        // The wait never grows: a Retry-After past the open period (which
        // the breaker folds into it) changes nothing, nor does a check
        // after the wait is over.
        assert_eq!(open_until_after_passing_check(5, 20, 30), 20);
        assert_eq!(open_until_after_passing_check(70, 60, 0), 60);
    }

    proptest! {
        #[test]
        fn a_passing_check_only_ever_shortens_the_wait(
            now in 0u64..1000, until in 0u64..1000, not_before in 0u64..1000,
        ) {
            let end = open_until_after_passing_check(now, until, not_before);
            prop_assert!(end <= until);
            prop_assert!(end >= now.min(until));
            prop_assert!(end >= not_before.min(until));
        }
    }

    #[test]
    fn defaults_follow_the_provider() {
        assert_eq!(HealthCheck::defaults(Provider::Vllm).path, "/health");
        assert_eq!(HealthCheck::defaults(Provider::Tgi).path, "/health");
        assert_eq!(HealthCheck::defaults(Provider::Ollama).path, "/api/tags");
        assert_eq!(HealthCheck::defaults(Provider::Openai).path, "/v1/models");
        assert!(on_by_default(Provider::Ollama));
        assert!(!on_by_default(Provider::Openai));
        assert!(!on_by_default(Provider::Anthropic));
        assert!(!on_by_default(Provider::AzureOpenai));
        assert!(!on_by_default(Provider::Gemini));
        assert_eq!(
            HealthCheck::defaults(Provider::Gemini).path,
            "/v1beta/models"
        );
        assert!(HealthCheck::defaults(Provider::AzureOpenai)
            .path
            .ends_with(&format!(
                "api-version={}",
                crate::document::DEFAULT_AZURE_API_VERSION
            )));
        assert_eq!(
            HealthCheck::defaults(Provider::Anthropic).path,
            "/v1/models"
        );
    }

    #[test]
    fn a_new_endpoint_takes_traffic_after_its_first_pass_only() {
        let c = check(3, 2);
        let mut s = CheckState::new();
        assert!(!s.admits() && s.awaiting_first());
        assert_eq!(s.record(true, &c), Some(Health::Healthy));
        assert!(s.admits() && !s.awaiting_first());
    }

    #[test]
    fn a_new_endpoint_that_fails_stays_out_and_becomes_unhealthy() {
        let c = check(2, 2);
        let mut s = CheckState::new();
        assert_eq!(s.record(false, &c), None);
        assert!(!s.admits() && !s.awaiting_first(), "checked, and failed");
        assert_eq!(s.record(false, &c), Some(Health::Unhealthy));
        // Recovering from unhealthy takes healthy_after passes.
        assert_eq!(s.record(true, &c), None);
        assert_eq!(s.record(true, &c), Some(Health::Healthy));
    }

    #[test]
    fn thresholds_count_in_a_row() {
        let c = check(3, 2);
        let mut s = CheckState::new();
        s.record(true, &c);
        s.record(false, &c);
        s.record(false, &c);
        s.record(true, &c); // breaks the run
        s.record(false, &c);
        s.record(false, &c);
        assert!(s.admits(), "two in a row is not three");
        assert_eq!(s.record(false, &c), Some(Health::Unhealthy));
        assert!(!s.admits());
        s.record(true, &c);
        s.record(false, &c); // breaks the rise
        assert_eq!(s.record(true, &c), None);
        assert_eq!(s.record(true, &c), Some(Health::Healthy));
    }

    #[test]
    fn jitter_spreads_within_ten_percent() {
        let c = HealthCheck::defaults(Provider::Vllm); // 2 s
        let lo = c.next_delay(0);
        let hi = c.next_delay(u64::MAX);
        assert_eq!(lo, Duration::from_millis(1800));
        assert!(hi >= lo && hi <= Duration::from_millis(2200));
        let many: std::collections::BTreeSet<_> = (0..1000u64)
            .map(|j| c.next_delay(j.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        assert!(many.len() > 100, "jitter spreads the checks");
    }

    #[test]
    fn suspicion_from_a_check_is_cleared_by_a_check_one_from_a_request_is_not() {
        let s = Suspicion {
            check_until: Some(10),
            attempt_until: None,
            quota_until: None,
        };
        assert!(s.holds(5) && s.held_for(SuspectCause::Check, 5));
        assert!(!s.holds(10), "expires on its own");
        let mut a = Suspicion {
            check_until: None,
            attempt_until: Some(10),
            quota_until: None,
        };
        assert!(a.holds(5) && !a.held_for(SuspectCause::Check, 5));
        a.clear(SuspectCause::Attempt);
        assert!(!a.holds(5));
        a.set(SuspectCause::Check, 7);
        assert!(a.held_for(SuspectCause::Check, 5) && !a.held_for(SuspectCause::Attempt, 5));
        // A key out of quota: its own slot, until the reset.
        let mut q = Suspicion::none();
        q.set(SuspectCause::Quota, 9);
        assert!(q.holds(5) && q.held_for(SuspectCause::Quota, 5) && !q.holds(9));
        assert_eq!(
            SuspectCause::parse(SuspectCause::Quota.as_str()),
            Some(SuspectCause::Quota)
        );
    }

    #[test]
    fn only_a_failed_first_request_raises_suspicion() {
        assert!(suspect_after_attempt(true, false));
        assert!(!suspect_after_attempt(true, true));
        assert!(!suspect_after_attempt(false, false));
    }

    fn counts(v: &[(u32, u32)]) -> Vec<ErrorCount> {
        v.iter()
            .map(|&(requests, errors)| ErrorCount {
                requests,
                errors,
                ejected: false,
            })
            .collect()
    }

    #[test]
    fn an_endpoint_far_above_its_pool_is_ejected() {
        let r = OutlierEjection::default();
        assert_eq!(
            ejections(&counts(&[(10, 9), (10, 0), (10, 1)]), &r),
            vec![0]
        );
        // Too few requests to judge.
        assert!(ejections(&counts(&[(4, 4), (10, 0)]), &r).is_empty());
    }

    #[test]
    fn a_bad_day_for_the_whole_pool_ejects_nobody() {
        let r = OutlierEjection::default();
        assert!(ejections(&counts(&[(10, 9), (10, 8), (10, 9)]), &r).is_empty());
    }

    #[test]
    fn the_cap_bounds_how_many_go_at_once() {
        let r = OutlierEjection {
            max_ejection_percent: 10,
            ..OutlierEjection::default()
        };
        // Two outliers in a pool of four: 10% rounds down, one may go.
        let got = ejections(&counts(&[(10, 10), (10, 9), (100, 0), (100, 0)]), &r);
        assert_eq!(got, vec![0]);
        let mut c = counts(&[(10, 10), (10, 9), (100, 0), (100, 0)]);
        c[0].ejected = true;
        assert!(
            ejections(&c, &r).is_empty(),
            "the ejected one fills the cap"
        );
        assert_eq!(r.cap(1), 0, "a pool of one is never ejected from");
        assert_eq!(OutlierEjection::default().cap(2), 1);
    }

    #[test]
    fn an_ejection_in_a_row_lasts_longer_up_to_ten_times() {
        let r = OutlierEjection::default();
        assert_eq!(r.duration(1), Duration::from_secs(30));
        assert_eq!(r.duration(2), Duration::from_secs(60));
        assert_eq!(r.duration(10), Duration::from_secs(300));
        assert_eq!(r.duration(50), Duration::from_secs(300));
    }

    #[test]
    fn a_marked_pool_is_passed_over_only_for_a_clean_later_one() {
        assert!(pass_over_marked_pool(true, true, true));
        // The last pool that could answer keeps its marked endpoints.
        assert!(!pass_over_marked_pool(true, true, false));
        // A route that does not fall back has nowhere else to go.
        assert!(!pass_over_marked_pool(true, false, true));
        assert!(!pass_over_marked_pool(false, true, true));
    }

    #[test]
    fn soft_marks_never_empty_a_pool() {
        assert!(!admits(true, true, true));
        assert!(admits(true, true, false), "every other one is marked too");
        assert!(!admits(false, false, false), "a failed check excludes");
        assert!(!admits(false, false, false));
    }

    proptest! {
        /// However the checks go, the state is the rule's: healthy after a
        /// pass from unknown or `healthy_after` from unhealthy, unhealthy
        /// after `unhealthy_after` failures in a row, and a failed check
        /// never makes an endpoint admit.
        #[test]
        fn checks_follow_the_thresholds(
            results in proptest::collection::vec(any::<bool>(), 0..60),
            fall in 1u32..5,
            rise in 1u32..5,
        ) {
            let c = check(fall, rise);
            let mut s = CheckState::new();
            let mut run_fail = 0u32;
            for (i, &passed) in results.iter().enumerate() {
                let before = s.health();
                s.record(passed, &c);
                if passed { run_fail = 0 } else { run_fail += 1 }
                if !passed && before != Health::Healthy {
                    prop_assert!(!s.admits(), "step {i}");
                }
                if run_fail >= fall {
                    prop_assert_eq!(s.health(), Health::Unhealthy);
                }
                if passed && before == Health::Unknown {
                    prop_assert_eq!(s.health(), Health::Healthy);
                }
            }
        }

        /// Ejections never pass the cap and never take every endpoint.
        #[test]
        fn ejections_stay_under_the_cap(
            v in proptest::collection::vec((0u32..50, 0u32..50, any::<bool>()), 0..12),
            pct in 0u32..=100,
        ) {
            let c: Vec<ErrorCount> = v.iter().map(|&(r, e, ej)| ErrorCount {
                requests: r, errors: e.min(r), ejected: ej,
            }).collect();
            let rules = OutlierEjection { max_ejection_percent: pct, ..OutlierEjection::default() };
            let out = ejections(&c, &rules);
            let already = c.iter().filter(|x| x.ejected).count();
            prop_assert!(out.len() + already <= rules.cap(c.len()).max(already));
            if !c.is_empty() {
                prop_assert!(out.len() + already < c.len() || out.is_empty());
            }
            for i in out { prop_assert!(!c[i].ejected); }
        }
    }
}

//! One route of `spec.routes`: chain, match, deadlines, retries, hedge,
//! retry budget and parking.

use super::*;

/// What a route is checked against: the rest of the document.
pub(super) struct RouteContext<'a> {
    /// Every pool name, including those of pools with errors.
    pub(super) pool_names: HashSet<&'a str>,
    /// `spec.defaults`, for routes that set no deadline of their own.
    pub(super) defaults: RequestDefaults,
}

/// One route: chain, match, cost ceiling, shadowing by an
/// `earlier` catch-all route, deadlines (inherited from `spec.defaults`),
/// retries.
pub(super) fn route(
    r: &RouteSpec,
    at: &str,
    earlier: &[Route],
    context: &RouteContext<'_>,
    errs: &mut Errors,
) -> Route {
    let chain = chain(&r.chain, at, &context.pool_names, errs);
    let matches = route_match(&r.matches, at, errs);
    if let Some(c) = r.cost_ceiling_per_call_usd {
        if !(c.is_finite() && c >= 0.0) {
            errs.push(
                format!("{at}.cost_ceiling_per_call_usd"),
                "must be a non-negative number",
            );
        }
    }
    if let Some(catch_all) = earlier.iter().find(|e| e.matches.is_catch_all()) {
        errs.push(
            format!("{at}.match"),
            format!(
                "can never match: route {:?} before it matches every request",
                catch_all.name
            ),
        );
    }
    let deadline =
        millis(r.deadline_ms, &format!("{at}.deadline_ms"), errs).or(context.defaults.deadline);
    let attempt_timeout = millis(
        r.attempt_timeout_ms,
        &format!("{at}.attempt_timeout_ms"),
        errs,
    )
    .or(context.defaults.attempt_timeout);
    let retry_on = retry_on(r.retry_on.as_deref(), at, errs);
    let hedge = r
        .hedge
        .as_ref()
        .and_then(|h| hedge(h, &matches, &format!("{at}.hedge"), errs));
    let cache = r
        .cache
        .as_ref()
        .and_then(|c| cache(c, &matches, &format!("{at}.cache"), errs));
    Route {
        name: r.name.clone(),
        matches,
        chain,
        deadline,
        attempt_timeout,
        retry_on,
        fallback: r.fallback.unwrap_or(true),
        requires_approval: r.requires_approval,
        allow_downgrade: r.allow_downgrade.unwrap_or(true),
        cost_ceiling_per_call_usd: r.cost_ceiling_per_call_usd,
        finish_on_client_gone: r.finish_on_client_gone.unwrap_or(true),
        first_token_timeout: millis(
            r.first_token_timeout_ms,
            &format!("{at}.first_token_timeout_ms"),
            errs,
        ),
        stall_timeout: millis(r.stall_timeout_ms, &format!("{at}.stall_timeout_ms"), errs),
        hedge,
        retry_budget: retry_budget(r.retry_budget.as_ref(), &format!("{at}.retry_budget"), errs),
        park: park(r, at, errs),
        cache,
    }
}

/// A route's response cache: a positive TTL (at most 30 days), an entry
/// cap in (0, 16 MiB], a known partition, on a route that takes READ or
/// DRAFT requests (a cached answer to a SEND request would be a silent
/// no-op).
fn cache(
    c: &CacheSpec,
    matches: &RouteMatch,
    at: &str,
    errs: &mut Errors,
) -> Option<crate::cache::CacheSettings> {
    use crate::cache::{CacheSettings, Partition};
    let ttl = match c.ttl_s {
        None => {
            errs.push(
                format!("{at}.ttl_s"),
                "is required (how long an entry is kept, in seconds)",
            );
            None
        }
        Some(0) => {
            errs.push(
                format!("{at}.ttl_s"),
                "must be a positive number of seconds",
            );
            None
        }
        Some(s) if Duration::from_secs(s) > CacheSettings::MAX_TTL => {
            errs.push(format!("{at}.ttl_s"), "must be at most 2592000 (30 days)");
            None
        }
        Some(s) => Some(Duration::from_secs(s)),
    };
    let max_entry_bytes = match c.max_entry_bytes {
        None => Some(CacheSettings::DEFAULT_MAX_ENTRY_BYTES),
        Some(n) if n == 0 || n > CacheSettings::MAX_ENTRY_BYTES as u64 => {
            errs.push(
                format!("{at}.max_entry_bytes"),
                "must be at least 1 and at most 16777216 (16 MiB)",
            );
            None
        }
        Some(n) => usize::try_from(n).ok(),
    };
    let partition = match c.partition.as_deref() {
        None | Some("tenant") => Some(Partition::Tenant),
        Some("route") => Some(Partition::Route),
        Some(p) => match p.strip_prefix("header:").map(str::trim) {
            Some(name) if http::HeaderName::from_bytes(name.as_bytes()).is_ok() => {
                Some(Partition::Header(name.to_ascii_lowercase()))
            }
            _ => {
                errs.push(
                    format!("{at}.partition"),
                    format!("{p:?} is not tenant, route or header:<name>"),
                );
                None
            }
        },
    };
    if !matches.risks.is_empty() && matches.risks.iter().all(|r| r.has_side_effects()) {
        errs.push(
            at,
            "this route only takes SEND or DESTRUCTIVE requests, which are never cached (a cached answer would act as a silent no-op)",
        );
        return None;
    }
    Some(CacheSettings {
        ttl: ttl?,
        max_entry_bytes: max_entry_bytes?,
        partition: partition?,
        sampled: c.sampled,
        rate_limit_hits: c.rate_limit_hits.unwrap_or(true),
    })
}

/// A route's safe mode: `park` bounds only with `on_all_down: park`; a
/// positive TTL, count cap and byte cap (every parked queue is bounded).
fn park(r: &RouteSpec, at: &str, errs: &mut Errors) -> Option<ParkSettings> {
    let spec = r.park.clone().unwrap_or_default();
    if r.on_all_down != Some(OnAllDown::Park) {
        if r.park.is_some() {
            errs.push(
                format!("{at}.park"),
                "has no effect without on_all_down: park",
            );
        }
        return None;
    }
    let ttl = match spec.ttl_s {
        Some(0) => {
            errs.push(
                format!("{at}.park.ttl_s"),
                "must be a positive number of seconds",
            );
            None
        }
        Some(s) => Some(Duration::from_secs(s)),
        None => Some(ParkSettings::DEFAULT_TTL),
    };
    let max_tasks = match spec.max_tasks {
        Some(0) => {
            errs.push(
                format!("{at}.park.max_tasks"),
                "must be at least 1 (a route that must not park says on_all_down: no_backend)",
            );
            None
        }
        Some(n) => Some(n),
        None => Some(ParkSettings::DEFAULT_MAX_TASKS),
    };
    let max_bytes = match spec.max_bytes {
        Some(0) => {
            errs.push(
                format!("{at}.park.max_bytes"),
                "must be at least 1 byte (a route that must not park says on_all_down: no_backend)",
            );
            None
        }
        Some(n) => Some(n),
        None => Some(ParkSettings::DEFAULT_MAX_BYTES),
    };
    Some(ParkSettings {
        ttl: ttl?,
        max_tasks: max_tasks?,
        max_bytes: max_bytes?,
    })
}

/// A route's hedge: exactly one of `after_ms` and `after`, on a route that
/// takes READ or DRAFT requests (a SEND or DESTRUCTIVE request is never
/// sent twice at once).
fn hedge(h: &HedgeSpec, matches: &RouteMatch, at: &str, errs: &mut Errors) -> Option<Hedge> {
    let after = match (h.after_ms, h.after) {
        (Some(_), Some(_)) => {
            errs.push(at, "give after_ms or after, not both");
            return None;
        }
        (None, None) => {
            errs.push(at, "needs after_ms (a delay) or after: p95");
            return None;
        }
        (Some(ms), None) => HedgeDelay::Fixed(millis(Some(ms), &format!("{at}.after_ms"), errs)?),
        (None, Some(HedgeQuantile::P95)) => HedgeDelay::PoolP95,
    };
    if !matches.risks.is_empty() && matches.risks.iter().all(|r| r.has_side_effects()) {
        errs.push(
            at,
            "this route only takes SEND or DESTRUCTIVE requests, which are never hedged (a second attempt could act twice)",
        );
        return None;
    }
    Some(Hedge {
        after,
        to: h.to.unwrap_or_default(),
    })
}

/// A route's retry budget: a ratio in (0, 1], a positive window.
fn retry_budget(b: Option<&RetryBudgetSpec>, at: &str, errs: &mut Errors) -> BudgetSettings {
    let mut settings = BudgetSettings::default();
    let Some(b) = b else {
        return settings;
    };
    if let Some(ratio) = b.ratio {
        if ratio.is_finite() && ratio > 0.0 && ratio <= 1.0 {
            settings.ratio = ratio;
        } else {
            errs.push(
                format!("{at}.ratio"),
                "must be more than 0 and at most 1 (0.2: one extra attempt per five requests)",
            );
        }
    }
    if let Some(min) = b.min_per_second {
        settings.min_per_second = min;
    }
    if let Some(window) = millis(b.window_ms, &format!("{at}.window_ms"), errs) {
        settings.window = window;
    }
    settings
}

/// A route's chain: not empty, each name a pool, no pool twice in the
/// whole chain (a split's sides count), each split valid ([`split`]).
fn chain(
    chain: &[ChainStepSpec],
    at: &str,
    pool_names: &HashSet<&str>,
    errs: &mut Errors,
) -> Vec<ChainStep> {
    if chain.is_empty() {
        errs.push(format!("{at}.chain"), "must name at least one pool");
    }
    let mut seen = HashSet::new();
    let mut name = |name: &str, field: String, errs: &mut Errors| {
        if !pool_names.contains(name) {
            errs.push(field, format!("unknown pool {name:?}"));
        } else if !seen.insert(name.to_owned()) {
            errs.push(field, format!("pool {name:?} appears twice"));
        }
    };
    let mut steps = Vec::with_capacity(chain.len());
    for (j, step) in chain.iter().enumerate() {
        let field = format!("{at}.chain[{j}]");
        match step {
            ChainStepSpec::Pool(pool) => {
                name(pool, field, errs);
                steps.push(ChainStep::Pool(pool.clone()));
            }
            ChainStepSpec::Split(s) => {
                for (k, side) in s.split.iter().enumerate() {
                    name(&side.pool, format!("{field}.split[{k}].pool"), errs);
                }
                if let Some(split) = split(s, &field, errs) {
                    steps.push(ChainStep::Split(split));
                }
            }
        }
    }
    steps
}

/// A split: at least two sides, weights with a positive sum (each a
/// non-negative integer: serde refuses the rest), a known `sticky`.
fn split(s: &SplitSpec, at: &str, errs: &mut Errors) -> Option<crate::split::Split> {
    use crate::split::{Split, SplitSide, Sticky};
    let mut ok = true;
    if s.split.len() < 2 {
        errs.push(
            format!("{at}.split"),
            "a split needs at least two sides (a single pool is written as its name)",
        );
        ok = false;
    } else if s.split.iter().all(|side| side.weight == 0) {
        errs.push(
            format!("{at}.split"),
            "the weights are all 0: at least one side must take traffic",
        );
        ok = false;
    }
    let sticky = match s.sticky.as_deref() {
        None => Sticky::RequestId,
        Some(text) => match Sticky::parse(text) {
            Some(sticky) => sticky,
            None => {
                errs.push(
                    format!("{at}.sticky"),
                    format!("{text:?} is not request_id, tenant or header:<name>"),
                );
                ok = false;
                Sticky::RequestId
            }
        },
    };
    let ramp = s.ramp.as_ref().and_then(|r| {
        let ramp = ramp(r, s, &format!("{at}.ramp"), errs);
        ok &= ramp.is_some();
        ramp
    });
    ok.then(|| Split {
        sides: s
            .split
            .iter()
            .map(|side| SplitSide {
                pool: side.pool.clone(),
                weight: side.weight,
            })
            .collect(),
        sticky,
        ramp,
    })
}

/// A split's ramp: two sides whose weights sum to 100 (it writes `new: w,
/// old: 100 - w`), steps strictly increasing in 1..=100, a positive step
/// time, a guard in range.
fn ramp(
    r: &crate::document::RampSpec,
    s: &SplitSpec,
    at: &str,
    errs: &mut Errors,
) -> Option<crate::ramp::Ramp> {
    use crate::ramp::{Guard, Ramp};
    let before = errs.0.len();
    if s.split.len() != 2 {
        errs.push(
            at,
            "a ramp needs a split of exactly two sides: the new one first, the old one second",
        );
    } else if s.split.iter().map(|x| u64::from(x.weight)).sum::<u64>() != 100 {
        errs.push(
            at,
            "a ramp's split has weights that sum to 100 (the new side's weight is its step)",
        );
    }
    if r.steps.is_empty() {
        errs.push(format!("{at}.steps"), "needs at least one step");
    }
    for (j, w) in r.steps.iter().enumerate() {
        if !(1..=100).contains(w) {
            errs.push(format!("{at}.steps[{j}]"), "must be in 1..=100 (percent)");
        } else if j > 0 && r.steps[j - 1] >= *w {
            errs.push(
                format!("{at}.steps[{j}]"),
                "steps must be strictly increasing",
            );
        }
    }
    if r.step_s == 0 {
        errs.push(
            format!("{at}.step_s"),
            "must be a positive number of seconds",
        );
    }
    let g = &r.guard;
    let max_error_rate = g.max_error_rate.unwrap_or(Guard::DEFAULT_MAX_ERROR_RATE);
    if !(0.0..=1.0).contains(&max_error_rate) {
        errs.push(format!("{at}.guard.max_error_rate"), "must be in [0, 1]");
    }
    let ratio = g.max_p95_ratio.unwrap_or(Guard::DEFAULT_MAX_P95_RATIO);
    if !(ratio == 0.0 || (ratio.is_finite() && ratio >= 1.0)) {
        errs.push(
            format!("{at}.guard.max_p95_ratio"),
            "must be at least 1 (or 0: latency not guarded)",
        );
    }
    let min_requests = g.min_requests.unwrap_or(Guard::DEFAULT_MIN_REQUESTS);
    if min_requests == 0 {
        errs.push(format!("{at}.guard.min_requests"), "must be at least 1");
    }
    (errs.0.len() == before).then(|| Ramp {
        steps: r.steps.clone(),
        step: Duration::from_secs(r.step_s),
        guard: Guard {
            max_error_rate,
            max_p95_ratio: (ratio > 0.0).then_some(ratio),
            min_requests,
        },
    })
}

/// A route's match: model patterns that say something, an absolute path
/// prefix.
fn route_match(m: &MatchSpec, at: &str, errs: &mut Errors) -> RouteMatch {
    for (j, pattern) in m.model.iter().enumerate() {
        if pattern.is_empty() || pattern == "*" {
            errs.push(
                format!("{at}.match.model[{j}]"),
                "empty or bare \"*\" pattern; leave model out to match any model",
            );
        }
    }
    if let Some(p) = &m.path_prefix {
        if !p.starts_with('/') {
            errs.push(format!("{at}.match.path_prefix"), "must start with '/'");
        }
    }
    RouteMatch {
        models: m.model.clone(),
        path_prefix: m.path_prefix.clone(),
        risks: m.risk.clone(),
    }
}

/// A route's `retry_on`: no failure listed twice (the default set when
/// left out).
fn retry_on(list: Option<&[RetryOn]>, at: &str, errs: &mut Errors) -> Vec<RetryOn> {
    let Some(list) = list else {
        return RetryOn::DEFAULT.to_vec();
    };
    let mut out: Vec<RetryOn> = Vec::new();
    for (j, f) in list.iter().enumerate() {
        if out.contains(f) {
            errs.push(format!("{at}.retry_on[{j}]"), "listed twice");
        } else {
            out.push(*f);
        }
    }
    out
}

// ---- Checks shared by several sections. ----

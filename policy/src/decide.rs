//! The route decision: which pools of which route may take a request, and
//! why the others may not.
//!
//! [`decide`] is a pure function of the policy and a [`Situation`] (the
//! request's risk, model, path, structured-output need, deadline, size, and
//! the live measurements of each pool). The same inputs always give the
//! same [`Decision`] and the same reason text. The proxy calls it with live
//! measurements for every request; `POST /_custom_router/explain` and
//! `routerctl route explain` call it with a situation a person wrote.
//!
//! 1. The first route whose `match` fits (risk, model, path) applies.
//! 2. Each pool of its chain is checked against its gates, in this order,
//!    and the first gate that fails is the pool's reason:
//!    - `healthy`: fails when the pool is unhealthy (every circuit open, or
//!      its capacity probe failing or stale);
//!    - `max_queue_depth`: fails when the queue depth is **greater than** it;
//!    - `max_latency_budget_fraction`: fails when the observed latency is
//!      **greater than** fraction × deadline;
//!    - `min_vram_free_mb`: fails when free VRAM is **at or below** it;
//!    - structured output: fails when the request asks for it
//!      (`response_format`) and the pool has `structured_output: false`, or
//!      is degraded for it after a malformed answer;
//!    - cost: fails when the estimated cost (prompt tokens × input price +
//!      `max_tokens` × output price) is above the route's ceiling.
//!
//!    A gate without a measurement holds (a pool the situation does not
//!    list is taken as healthy with no measurements); the proxy marks a pool
//!    unhealthy itself when a configured probe has no fresh data.
//! 3. The pools that pass, in chain order, are the candidates; the first
//!    is the route's answer. With `allow_downgrade: false` only the chain's
//!    first pool may ever be a candidate.
//! 4. No candidate: `budget_exceeded` when the cost ceiling is what ruled
//!    out every pool that passed the other gates, else `no_backend`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::document::{Policy, Pool, Risk, Route};

/// Output tokens assumed for the cost estimate when a request does not set
/// `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u64 = 1024;

/// Live (or hypothetical) measurements of one pool.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolMeasurements {
    /// Free VRAM, MB.
    #[serde(default)]
    pub vram_free_mb: Option<u64>,
    /// Requests waiting in the pool's queue.
    #[serde(default)]
    pub queue_depth: Option<u32>,
    /// Observed latency, ms.
    #[serde(default)]
    pub latency_ms: Option<f64>,
    /// Healthy (circuit closed, probe fresh and healthy); default true.
    #[serde(default)]
    pub healthy: Option<bool>,
    /// Degraded for structured output after a malformed answer.
    #[serde(default)]
    pub structured_degraded: bool,
    /// Why the pool is unhealthy, when the caller knows (shown in the
    /// reason instead of the generic text; not part of the situation JSON).
    #[serde(skip)]
    pub unhealthy_because: Option<&'static str>,
}

/// Everything the decision depends on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Situation {
    /// Risk class; the policy's default when absent.
    #[serde(default)]
    pub risk: Option<Risk>,
    /// The request's model.
    #[serde(default)]
    pub model: Option<String>,
    /// The request's path (default `/v1/chat/completions`).
    #[serde(default)]
    pub path: Option<String>,
    /// The request asks for structured output.
    #[serde(default)]
    pub structured_output: bool,
    /// The request's deadline; the route's default when absent.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Estimated prompt tokens.
    #[serde(default)]
    pub input_tokens: Option<u64>,
    /// The request's `max_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Measurements by pool name.
    #[serde(default)]
    pub pools: BTreeMap<String, PoolMeasurements>,
}

/// A pool passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Pool name.
    pub pool: String,
    /// The first gate that failed.
    pub why: String,
}

/// Why no pool can take the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// No route matches.
    NoRoute,
    /// Every pool of the chain is gated out.
    NoBackend,
    /// The cost ceiling rules out every pool the other gates allow.
    BudgetExceeded,
}

/// The decision for one request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The route that matched.
    pub route: Option<String>,
    /// The risk class used.
    pub risk: Risk,
    /// The route needs an approval token.
    pub requires_approval: bool,
    /// Pools that may take the request, in order.
    pub candidates: Vec<String>,
    /// Pools passed over, in chain order.
    pub skipped: Vec<Skipped>,
    /// Why nothing can take it, when so.
    pub refusal: Option<Refusal>,
    /// Estimated cost on each candidate, USD.
    pub estimated_cost_usd: BTreeMap<String, f64>,
    /// One line a person can read.
    pub reason: String,
}

/// The answer of `explain`: the decision as the contract shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// Chosen pool (`null` when none).
    pub pool: Option<String>,
    /// Model sent upstream.
    pub model: Option<String>,
    /// Provider of the chosen pool.
    pub provider: Option<String>,
    /// Whether an approval token is needed.
    pub requires_approval: bool,
    /// Why.
    pub reason: String,
    /// Pools passed over.
    pub skipped: Vec<Skipped>,
    /// The route that matched.
    pub route: Option<String>,
    /// Every pool that could take the request, in order.
    pub candidates: Vec<String>,
    /// `no_route`, `no_backend` or `budget_exceeded` when nothing fits.
    pub refusal: Option<Refusal>,
}

/// Decides. Never panics; the same inputs give the same output.
pub fn decide(policy: &Policy, situation: &Situation) -> Decision {
    let risk = situation.risk.unwrap_or(policy.default_risk);
    let path = situation.path.as_deref().unwrap_or("/v1/chat/completions");
    let model = situation.model.as_deref();
    let Some(route) = policy.route_for_risk(risk, model, path) else {
        return Decision {
            route: None,
            risk,
            requires_approval: false,
            candidates: Vec::new(),
            skipped: Vec::new(),
            refusal: Some(Refusal::NoRoute),
            estimated_cost_usd: BTreeMap::new(),
            reason: format!(
                "no route matches risk {}, model {model:?}, path {path:?}",
                risk.as_str()
            ),
        };
    };
    let deadline_ms = situation.deadline_ms.or_else(|| {
        route
            .deadline
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    });
    let mut candidates = Vec::new();
    let mut skipped = Vec::new();
    let mut costs = BTreeMap::new();
    let mut cost_only = 0;
    for (i, name) in route.chain.iter().enumerate() {
        let Some(pool) = policy.pool(name) else {
            skipped.push(Skipped {
                pool: name.clone(),
                why: "not in the policy".into(),
            });
            continue;
        };
        if !route.allow_downgrade && i > 0 {
            skipped.push(Skipped {
                pool: name.clone(),
                why: "allow_downgrade is false: only the first pool of the chain".into(),
            });
            continue;
        }
        let m = situation.pools.get(name).copied().unwrap_or_default();
        let cost = estimate_cost(pool, situation);
        match gate(
            pool,
            route,
            &m,
            situation.structured_output,
            deadline_ms,
            cost,
        ) {
            Ok(()) => {
                costs.insert(name.clone(), cost);
                candidates.push(name.clone());
            }
            Err(why) => {
                if why.starts_with("estimated cost") {
                    cost_only += 1;
                }
                skipped.push(Skipped {
                    pool: name.clone(),
                    why,
                });
            }
        }
    }
    let refusal = match (candidates.is_empty(), cost_only > 0) {
        (false, _) => None,
        (true, true) => Some(Refusal::BudgetExceeded),
        (true, false) => Some(Refusal::NoBackend),
    };
    let reason = reason_text(route, risk, &candidates, &skipped, refusal);
    Decision {
        route: Some(route.name.clone()),
        risk,
        requires_approval: route.requires_approval,
        candidates,
        skipped,
        refusal,
        estimated_cost_usd: costs,
        reason,
    }
}

/// The estimated cost of the request on `pool`.
pub fn estimate_cost(pool: &Pool, situation: &Situation) -> f64 {
    pool.price.cost(
        situation.input_tokens.unwrap_or(0),
        situation.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
    )
}

fn gate(
    pool: &Pool,
    route: &Route,
    m: &PoolMeasurements,
    structured: bool,
    deadline_ms: Option<u64>,
    cost: f64,
) -> Result<(), String> {
    let g = &pool.gates;
    if g.healthy && m.healthy == Some(false) {
        return Err(match m.unhealthy_because {
            Some(why) => why.to_string(),
            None => "unhealthy (circuit open or capacity probe failing)".into(),
        });
    }
    if let (Some(max), Some(depth)) = (g.max_queue_depth, m.queue_depth) {
        if depth > max {
            return Err(format!("queue depth {depth} > {max}"));
        }
    }
    if let (Some(f), Some(latency), Some(deadline)) =
        (g.max_latency_budget_fraction, m.latency_ms, deadline_ms)
    {
        let limit = f * deadline as f64;
        if latency > limit {
            return Err(format!(
                "latency {latency:.0} ms > {f} x {deadline} ms deadline ({limit:.0} ms)"
            ));
        }
    }
    if let (Some(min), Some(free)) = (g.min_vram_free_mb, m.vram_free_mb) {
        if free <= min {
            return Err(format!("free VRAM {free} MB <= {min} MB"));
        }
    }
    if structured && !pool.structured_output {
        return Err("no structured output".into());
    }
    if structured && m.structured_degraded {
        return Err("degraded for structured output (a recent malformed answer)".into());
    }
    if let Some(ceiling) = route.cost_ceiling_per_call_usd {
        if cost > ceiling {
            return Err(format!("estimated cost ${cost:.4} > ceiling ${ceiling:.4}"));
        }
    }
    Ok(())
}

/// Appends `s` as `{:?}` would write it.
fn push_debug_str(out: &mut String, s: &str) {
    if s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        let _ = write!(out, "{s:?}");
    }
}

fn reason_text(
    route: &Route,
    risk: Risk,
    candidates: &[String],
    skipped: &[Skipped],
    refusal: Option<Refusal>,
) -> String {
    // Built with pushes rather than `format!` (this runs for every
    // request); the same text.
    let mut out = String::with_capacity(64 + route.name.len());
    out.push_str("route ");
    push_debug_str(&mut out, &route.name);
    out.push_str(" (risk ");
    out.push_str(risk.as_str());
    out.push(')');
    for s in skipped {
        let _ = write!(out, "; {} skipped: {}", s.pool, s.why);
    }
    match (candidates.first(), refusal) {
        (Some(first), _) => {
            out.push_str("; ");
            out.push_str(first);
            out.push_str(" chosen");
        }
        (None, Some(Refusal::BudgetExceeded)) => {
            out.push_str("; every pool is over the cost ceiling")
        }
        (None, _) => out.push_str("; no pool can take it"),
    }
    out
}

/// The contract's `explain` answer for a situation.
pub fn explain(policy: &Policy, situation: &Situation) -> Explanation {
    let d = decide(policy, situation);
    let chosen = d.candidates.first().and_then(|n| policy.pool(n));
    Explanation {
        pool: chosen.map(|p| p.name.clone()),
        model: chosen
            .and_then(|p| p.model.clone())
            .or_else(|| situation.model.clone()),
        provider: chosen.map(|p| {
            serde_json::to_value(p.provider)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        }),
        requires_approval: d.requires_approval,
        reason: d.reason,
        skipped: d.skipped,
        route: d.route,
        candidates: d.candidates,
        refusal: d.refusal,
    }
}

#[cfg(test)]
mod reason_tests {
    use super::push_debug_str;

    #[test]
    fn debug_strings_match_the_formatter() {
        for s in [
            "default",
            "",
            "a b~",
            "quo\"te",
            "back\\slash",
            "tab\t",
            "é",
            "\u{7f}",
            "\u{301}x",
        ] {
            let mut out = String::new();
            push_debug_str(&mut out, s);
            assert_eq!(out, format!("{s:?}"));
        }
    }
}

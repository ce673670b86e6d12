//! The route decision: which pools of which route may take a request, and
//! why the others may not.
//!
//! Two entry points share one core (the gate loop, the cost estimate and
//! the reason text), so they can never disagree:
//!
//! - [`decide`] is a pure function of the policy and a [`Situation`] (the
//!   request's risk, model, path, structured-output need, deadline, size,
//!   and the live measurements of each pool). It finds the route itself and
//!   answers with an owned [`Decision`] (names, skipped pools, costs).
//!   `POST /_custom_router/explain`, `routerctl route explain` and the
//!   control plane call it with a situation a person wrote.
//! - [`decide_on_route`] is the per-request path of the proxy, which has
//!   already found the route (it needs it earlier, for the approval check
//!   and the deadline). It takes the request's facts borrowed
//!   ([`RequestFacts`]), asks for each pool's measurements through a
//!   closure as the gate loop reaches it, and answers with a [`Verdict`]:
//!   the candidates as indices into the route's chain, the refusal and the
//!   reason. It allocates only the candidates and the reason, where
//!   `decide` with its inputs costs a map node and a name clone per
//!   measured pool, a name clone per candidate and skipped pool, a cost
//!   map, and a second route lookup.
//!
//! The same inputs always give the same decision and the same reason text.
//! The rules (step 1 is `decide`'s; the caller of `decide_on_route` has
//! done it):
//!
//! 1. The first route whose `match` fits (risk, model, path) applies.
//! 2. Each pool of its chain is checked against its gates, in this order,
//!    and the first gate that fails is the pool's reason:
//!    - `healthy`: fails when the pool is unhealthy (every circuit open, or
//!      its capacity probe failing or stale);
//!    - `quota`: fails when no key of the pool has quota for the request
//!      until its reset ([`crate::quota`]): no request left, or fewer
//!      tokens left than its estimate (prompt tokens + `max_tokens`, else
//!      [`DEFAULT_MAX_TOKENS`]);
//!    - `max_queue_depth`: fails when the queue depth is **greater than** it;
//!    - `max_latency_budget_fraction`: fails when the observed latency is
//!      **greater than** fraction × deadline;
//!    - `min_vram_free_mb`: fails when free VRAM is **at or below** it;
//!    - `max_tpot_ms`: fails when the time per output token of the pool's
//!      fastest endpoint (EWMA over its streams) is **greater than** it;
//!    - structured output: fails when the request asks for it
//!      (`response_format`) and the pool has `structured_output: false`, or
//!      is degraded for it after a malformed answer;
//!    - cost: fails when the estimated cost (prompt tokens × input price +
//!      `max_tokens` × output price) is above the route's ceiling.
//!
//!    A gate without a measurement holds (a pool the situation does not
//!    list is taken as healthy with no measurements); the proxy marks a pool
//!    unhealthy itself when a configured probe has no fresh data.
//!
//!    The pools are checked in the request's order ([`crate::split`]): the
//!    chain's steps in order, a split as its chosen side (by the request's
//!    sticky key: [`RequestFacts::keys`]) then its other sides of non-zero
//!    weight, heaviest first. The reason says which side each split chose
//!    and why (`split: new (weight 10 of 100, by request_id)`).
//! 3. The pools that pass, in that order, are the candidates; the first
//!    is the route's answer. With `allow_downgrade: false` only the
//!    request's first pool (the chain's first, or a first split's chosen
//!    side) may ever be a candidate.
//! 4. No candidate: `budget_exceeded` when the cost ceiling is what ruled
//!    out every pool that passed the other gates, else `no_backend`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use crate::document::{FieldError, Policy, Pool, Risk, Route};
use crate::split::{ChainOrder, Headers, KeyKind, SplitChoice, SplitKeys};

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
    /// The lowest time per output token of its endpoints (EWMA over
    /// streams), ms; `None` before any stream measured one.
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    /// Why the pool is unhealthy, when the caller knows (shown in the
    /// reason instead of the generic text; not part of the situation JSON).
    #[serde(skip)]
    pub unhealthy_because: Option<&'static str>,
    /// Requests left on the pool's key with the most (its provider's
    /// rate-limit headers, [`crate::quota`]); `None`: not limited. At 0
    /// the pool is gated out (`quota`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_requests_remaining: Option<u64>,
    /// Tokens left on the pool's key with the most; `None`: not limited.
    /// Below the request's estimate the pool is gated out (`quota`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_tokens_remaining: Option<u64>,
    /// How soon, ms, the first key of the pool gets quota back (for the
    /// reason text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_reset_ms: Option<u64>,
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
    /// Endpoint measurements by pool name, for engine-aware pools (the
    /// explanation then says which endpoint and on what signals).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, Vec<crate::engine_aware::EndpointSituation>>,
    /// The request's prompt text as prefix affinity hashes it (each
    /// message's role and text, a line each:
    /// [`crate::prefix_cache::prompt_text`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// An endpoint (address) that holds the whole prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_last_served: Option<String>,
    /// The request's body (explain only), in the dialect its `path` says
    /// (`/v1/messages`: Anthropic's; otherwise OpenAI chat): a pool whose
    /// dialect cannot carry one of its fields is passed over, naming the
    /// field, as the proxy passes it over ([`explain`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<serde_json::Value>,
    /// The request's id (`X-Request-Id`), a split's default key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The request's `Idempotency-Key` (a split's key before the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The caller's tenant (a split's key with `sticky: tenant`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Request headers by name (a split's key with `sticky: header:NAME`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// A pool passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Pool name.
    pub pool: String,
    /// The first gate that failed.
    pub why: String,
}

/// A split's choice as `explain` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SplitExplained {
    /// The chosen side's pool.
    pub pool: String,
    /// Its weight.
    pub weight: u32,
    /// The split's total weight.
    pub total: u64,
    /// What the choice was keyed on (`request_id`, `idempotency_key`,
    /// `tenant`, `header`; `none`: no key given, the heaviest side).
    pub key: KeyKind,
    /// The split's sticky key (tenant or header) was missing: the request
    /// id was used.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub sticky_missing: bool,
}

impl SplitExplained {
    fn of(route: &Route, c: &SplitChoice) -> Self {
        Self {
            pool: route.pool_at(c.at).unwrap_or_default().to_owned(),
            weight: c.weight,
            total: c.total,
            key: c.key,
            sticky_missing: c.sticky_missing,
        }
    }
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
    /// No pool of the chain speaks a dialect that can carry the request's
    /// fields (explain only: the proxy answers 400 naming them).
    UncarriedFields,
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
    /// Each split of the chain: the side chosen and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<SplitExplained>,
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
    /// Each split of the route's chain: the side chosen and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<SplitExplained>,
    /// For an engine-aware chosen pool: the endpoint and the signals used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<crate::engine_aware::BalanceExplanation>,
    /// On a route with `on_all_down: park`: what happens when every pool
    /// is down (safe mode, `router_policy::park`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_all_down: Option<ParkExplanation>,
}

/// How a parking route treats this request when every pool is down.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParkExplanation {
    /// `park`.
    pub action: &'static str,
    /// Whether it applies now (every pool of the chain is down).
    pub parks_now: bool,
    /// The parked task's first state (from the risk).
    pub state: &'static str,
    /// How long a parked task waits, seconds.
    pub ttl_s: u64,
    /// Most live parked tasks of the route.
    pub max_tasks: u32,
    /// Most bytes the route's live parked tasks hold.
    pub max_bytes: u64,
    /// Why, in words.
    pub why: String,
}

/// The request's path when a situation does not give one.
const DEFAULT_PATH: &str = "/v1/chat/completions";

/// The request's facts, borrowed: what a [`Situation`] holds, minus the
/// pools' measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestFacts<'a> {
    /// Risk class, already resolved (the policy's default applied by the
    /// caller).
    pub risk: Risk,
    /// The request's model (for the route lookup).
    pub model: Option<&'a str>,
    /// The request's path (for the route lookup).
    pub path: &'a str,
    /// The request asks for structured output.
    pub structured_output: bool,
    /// The request's own deadline; the route's default applies when `None`.
    pub deadline_ms: Option<u64>,
    /// Estimated prompt tokens.
    pub input_tokens: Option<u64>,
    /// The request's `max_tokens` ([`DEFAULT_MAX_TOKENS`] when `None`).
    pub max_tokens: Option<u64>,
    /// What a split of the chain is keyed on (request id, idempotency
    /// key, tenant, headers).
    pub keys: SplitKeys<'a>,
}

impl Situation {
    /// The situation's request facts, with `default_risk` (the policy's)
    /// when it sets no risk and `/v1/chat/completions` when it sets no path:
    /// what [`decide`] uses.
    pub fn facts(&self, default_risk: Risk) -> RequestFacts<'_> {
        RequestFacts {
            risk: self.risk.unwrap_or(default_risk),
            model: self.model.as_deref(),
            path: self.path.as_deref().unwrap_or(DEFAULT_PATH),
            structured_output: self.structured_output,
            deadline_ms: self.deadline_ms,
            input_tokens: self.input_tokens,
            max_tokens: self.max_tokens,
            keys: SplitKeys {
                request_id: self.request_id.as_deref(),
                idempotency_key: self.idempotency_key.as_deref(),
                tenant: self.tenant.as_deref(),
                headers: Headers::Pairs(&self.headers),
            },
        }
    }
}

/// The decision for one request on a route already chosen, without copies
/// of names: what [`decide_on_route`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Chain positions ([`Route::pool_at`]) of the pools that may take the
    /// request, in the request's order; the first is the route's answer.
    pub candidates: Vec<usize>,
    /// The request's first pool before any gate (the chain's first, or a
    /// first split's chosen side): a walk that starts elsewhere passed it
    /// over.
    pub first: Option<usize>,
    /// Each split's choice, in chain order (empty, and not allocated,
    /// without a split).
    pub splits: Vec<SplitChoice>,
    /// Why nothing can take the request, when so (never
    /// [`Refusal::NoRoute`]: finding the route is the caller's business).
    pub refusal: Option<Refusal>,
    /// The same reason text [`decide`] gives for the same inputs.
    pub reason: String,
    /// The pools passed over, by chain index, and the gate that failed
    /// (typed; the reason says the same in words). Empty, and not
    /// allocated, when every pool passes.
    pub gated: Vec<(usize, Gated)>,
}

impl Verdict {
    /// The candidates' pool names, given the route the verdict is for (an
    /// index past that route's chain is left out rather than a panic).
    pub fn candidate_names<'r>(&'r self, route: &'r Route) -> impl Iterator<Item = &'r str> + 'r {
        self.candidates.iter().filter_map(|&i| route.pool_at(i))
    }
}

/// Decides. Never panics; the same inputs give the same output.
///
/// Finds the route for the situation's risk, model and path, then runs the
/// same gate loop as [`decide_on_route`].
pub fn decide(policy: &Policy, situation: &Situation) -> Decision {
    let facts = situation.facts(policy.default_risk);
    let (risk, model, path) = (facts.risk, facts.model, facts.path);
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
            splits: Vec::new(),
        };
    };
    let order = route.order(&facts.keys);
    let mut candidates = Vec::new();
    let mut skipped = Vec::new();
    let mut costs = BTreeMap::new();
    let (refusal, reason) = decide_core(
        policy,
        route,
        &order,
        &facts,
        |_, name| situation.pools.get(name).copied(),
        |_, name, outcome| match outcome {
            Ok(cost) => {
                costs.insert(name.to_owned(), cost);
                candidates.push(name.to_owned());
            }
            Err(gated) => skipped.push(Skipped {
                pool: name.to_owned(),
                why: gated.to_string(),
            }),
        },
    );
    Decision {
        route: Some(route.name.clone()),
        risk,
        requires_approval: route.requires_approval,
        candidates,
        skipped,
        refusal,
        estimated_cost_usd: costs,
        reason,
        splits: order
            .splits
            .iter()
            .map(|c| SplitExplained::of(route, c))
            .collect(),
    }
}

/// Decides for one request on `route`, the route the caller already found
/// for it (normally `policy.route_for_risk(facts.risk, facts.model,
/// facts.path)`; this function does not look it up again, so `facts.model`
/// and `facts.path` are not read). The proxy's per-request path.
///
/// The gate loop, cost estimate and reason text are [`decide`]'s own: for a
/// situation `s` and `route` the route `decide` matches,
/// `decide_on_route(policy, route, &s.facts(policy.default_risk), |_, name|
/// s.pools.get(name).copied())` gives the same candidates (as chain
/// indices), the same refusal and the same reason.
///
/// `measure(index, name)` gives the live measurements of the pool at
/// chain position `index` (`route.pool_at(index)`), or `None` when the
/// pool is not measured (taken as healthy with no measurements, as a pool
/// a [`Situation`] does not list). It is called at most once per chain
/// position, in the request's order ([`Route::order`] for `facts.keys`),
/// and only for pools that reach the gates: not for a name the policy
/// lacks, nor for any pool after the first when the route has
/// `allow_downgrade: false`, nor for a split's side of weight 0.
///
/// Allocates only [`Verdict::candidates`] (once, at the first candidate)
/// and [`Verdict::reason`]: no name is copied and no map is built. Whether
/// the route needs an approval token is `route.requires_approval`.
pub fn decide_on_route(
    policy: &Policy,
    route: &Route,
    facts: &RequestFacts<'_>,
    measure: impl FnMut(usize, &str) -> Option<PoolMeasurements>,
) -> Verdict {
    let mut candidates = Vec::new();
    let mut gated = Vec::new();
    let order = route.order(&facts.keys);
    let mut visited = 0;
    let (refusal, reason) = decide_core(policy, route, &order, facts, measure, |i, _, outcome| {
        if let Err(g) = outcome {
            gated.push((i, *g));
        } else {
            if candidates.capacity() == 0 {
                // Room for every pool that may still pass.
                let room = if route.allow_downgrade {
                    order.len() - visited
                } else {
                    1
                };
                candidates.reserve_exact(room);
            }
            candidates.push(i);
        }
        visited += 1;
    });
    Verdict {
        candidates,
        first: order.first(),
        refusal,
        reason,
        gated,
        splits: order.splits,
    }
}

/// The estimated cost of the request on `pool`: prompt tokens at the input
/// price, `max_tokens` (else [`DEFAULT_MAX_TOKENS`]) at the output price.
fn estimate_cost(pool: &Pool, facts: &RequestFacts<'_>) -> f64 {
    pool.price.cost(
        facts.input_tokens.unwrap_or(0),
        facts.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
    )
}

/// The one gate loop behind [`decide`] and [`decide_on_route`].
///
/// Walks the route's pools in the request's `order` and tells `visit`
/// about each pool: its chain position, its name, and `Ok(estimated
/// cost)` when it is a candidate or `Err` with the first gate that failed.
/// Returns the refusal and the reason text, written as the loop goes (each
/// split's choice first, then the skipped pools before the chosen one in
/// the text, and the chosen one is the first candidate).
fn decide_core<'p>(
    policy: &'p Policy,
    route: &'p Route,
    order: &ChainOrder,
    facts: &RequestFacts<'_>,
    mut measure: impl FnMut(usize, &str) -> Option<PoolMeasurements>,
    mut visit: impl FnMut(usize, &'p str, Result<f64, &Gated>),
) -> (Option<Refusal>, String) {
    let deadline_ms = facts.deadline_ms.or_else(|| {
        route
            .deadline
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    });
    // Built with pushes rather than `format!` (this runs for every
    // request).
    let mut reason = String::with_capacity(64 + route.name.len());
    reason.push_str("route ");
    push_debug_str(&mut reason, &route.name);
    reason.push_str(" (risk ");
    reason.push_str(facts.risk.as_str());
    reason.push(')');
    for c in &order.splits {
        write_split(&mut reason, route, c);
    }
    let mut chosen: Option<&str> = None;
    let mut over_ceiling = false;
    // Whether a pool was passed over for something else than its cost.
    let mut other_gates = false;
    for (k, i) in order.iter().enumerate() {
        let Some(name) = route.pool_at(i) else {
            continue;
        };
        let outcome = match policy.pool(name) {
            None => Err(Gated::NotInPolicy),
            Some(_) if !route.allow_downgrade && k > 0 => Err(Gated::NoDowngrade),
            Some(pool) => {
                let m = measure(i, name).unwrap_or_default();
                let cost = estimate_cost(pool, facts);
                gate(pool, route, &m, facts, deadline_ms, cost).map(|()| cost)
            }
        };
        match &outcome {
            Ok(_) => {
                chosen.get_or_insert(name);
            }
            Err(gated) => {
                let cost = matches!(gated, Gated::Cost { .. });
                over_ceiling |= cost;
                other_gates |= !cost;
                reason.push_str("; ");
                reason.push_str(name);
                reason.push_str(" skipped: ");
                gated.write_to(&mut reason);
            }
        }
        visit(i, name, outcome.as_ref().map(|&cost| cost));
    }
    let refusal = match (chosen, over_ceiling) {
        (Some(_), _) => None,
        (None, true) => Some(Refusal::BudgetExceeded),
        (None, false) => Some(Refusal::NoBackend),
    };
    match chosen {
        Some(first) => {
            reason.push_str("; ");
            reason.push_str(first);
            reason.push_str(" chosen");
        }
        None if over_ceiling && !other_gates => {
            reason.push_str("; every pool is over the cost ceiling");
        }
        // Each pool's own reason is above: say only that the ceiling
        // ruled out what the other gates left.
        None if over_ceiling => {
            reason.push_str("; the pools the other gates allow are over the cost ceiling");
        }
        None => reason.push_str("; no pool can take it"),
    }
    (refusal, reason)
}

/// Appends a split's choice to the reason: `; split: new (weight 10 of
/// 100, by request_id)`.
fn write_split(out: &mut String, route: &Route, c: &SplitChoice) {
    let pool = route.pool_at(c.at).unwrap_or_default();
    let by = match (c.key, c.sticky_missing) {
        (KeyKind::None, _) => "no key given: the heaviest side".to_owned(),
        (key, true) => format!("by {} (the sticky key is missing)", key.label()),
        (key, false) => format!("by {}", key.label()),
    };
    let _ = write!(
        out,
        "; split: {pool} (weight {} of {}, {by})",
        c.weight, c.total
    );
}

/// Why a pool of the chain is passed over: the first gate that failed.
/// Its text (`Display`) is the `why` of [`Skipped`] and the reason's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gated {
    /// The chain names a pool the policy lacks.
    NotInPolicy,
    /// `allow_downgrade: false` and not the chain's first pool.
    NoDowngrade,
    /// Unhealthy, with the caller's reason when it gave one.
    Unhealthy(Option<&'static str>),
    /// No key of the pool has quota for the request until its reset.
    Quota {
        /// Tokens left on the best key, when tokens are what is short
        /// (`None`: no request left).
        tokens_left: Option<u64>,
        /// The request's token estimate.
        need: u64,
        /// How soon the first key gets quota back, ms.
        reset_ms: Option<u64>,
    },
    /// Queue depth above `max_queue_depth`.
    QueueDepth {
        /// The pool's queue depth.
        depth: u32,
        /// The gate's limit.
        max: u32,
    },
    /// Latency above the fraction of the deadline.
    Latency {
        /// The pool's latency, ms.
        latency: f64,
        /// The route's fraction of the deadline.
        fraction: f64,
        /// The deadline, ms.
        deadline: u64,
        /// `fraction` of `deadline`, ms.
        limit: f64,
    },
    /// Free VRAM at or below `min_vram_free_mb`.
    Vram {
        /// Free VRAM, MB.
        free: u64,
        /// The gate's minimum, MB.
        min: u64,
    },
    /// Every endpoint's time per output token above `max_tpot_ms`.
    Tpot {
        /// The best endpoint's time per output token, ms.
        tpot: f64,
        /// The gate's limit, ms.
        max: f64,
    },
    /// Structured output asked of a pool without it.
    NoStructured,
    /// Structured output asked of a pool degraded for it.
    StructuredDegraded,
    /// Estimated cost above the route's ceiling.
    Cost {
        /// The estimate, USD.
        cost: f64,
        /// The route's ceiling, USD.
        ceiling: f64,
    },
}

impl Gated {
    /// The gate as a label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NotInPolicy => "not_in_policy",
            Self::NoDowngrade => "no_downgrade",
            Self::Unhealthy(_) => "unhealthy",
            Self::Quota { .. } => "quota",
            Self::QueueDepth { .. } => "queue_depth",
            Self::Latency { .. } => "latency",
            Self::Vram { .. } => "vram",
            Self::Tpot { .. } => "tpot",
            Self::NoStructured => "no_structured_output",
            Self::StructuredDegraded => "structured_degraded",
            Self::Cost { .. } => "cost",
        }
    }

    /// Appends the text to `out` (fixed texts without the formatter).
    fn write_to(&self, out: &mut String) {
        match self.fixed_text() {
            Some(text) => out.push_str(text),
            None => {
                let _ = write!(out, "{self}");
            }
        }
    }

    fn fixed_text(&self) -> Option<&'static str> {
        Some(match *self {
            Self::NotInPolicy => "not in the policy",
            Self::NoDowngrade => "allow_downgrade is false: only the first pool of the chain",
            Self::Unhealthy(Some(why)) => why,
            Self::Unhealthy(None) => "unhealthy (circuit open or capacity probe failing)",
            Self::NoStructured => "no structured output",
            Self::StructuredDegraded => {
                "degraded for structured output (a recent malformed answer)"
            }
            Self::QueueDepth { .. }
            | Self::Quota { .. }
            | Self::Latency { .. }
            | Self::Vram { .. }
            | Self::Tpot { .. }
            | Self::Cost { .. } => return None,
        })
    }
}

impl fmt::Display for Gated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(text) = self.fixed_text() {
            return f.write_str(text);
        }
        match *self {
            Self::QueueDepth { depth, max } => write!(f, "queue depth {depth} > {max}"),
            Self::Quota {
                tokens_left,
                need,
                reset_ms,
            } => {
                match tokens_left {
                    None => write!(f, "quota: no key has a request left")?,
                    Some(left) => write!(
                        f,
                        "quota: no key has the {need} tokens the request may use ({left} left)"
                    )?,
                }
                match reset_ms {
                    Some(ms) => write!(f, " until its reset in {ms} ms"),
                    None => write!(f, " until its reset"),
                }
            }
            Self::Latency {
                latency,
                fraction,
                deadline,
                limit,
            } => write!(
                f,
                "latency {latency:.0} ms > {fraction} x {deadline} ms deadline ({limit:.0} ms)"
            ),
            Self::Vram { free, min } => write!(f, "free VRAM {free} MB <= {min} MB"),
            Self::Tpot { tpot, max } => {
                write!(f, "time per output token {tpot:.1} ms > {max:.1} ms")
            }
            Self::Cost { cost, ceiling } => {
                write!(f, "estimated cost ${cost:.4} > ceiling ${ceiling:.4}")
            }
            _ => Ok(()),
        }
    }
}

fn gate(
    pool: &Pool,
    route: &Route,
    m: &PoolMeasurements,
    facts: &RequestFacts<'_>,
    deadline_ms: Option<u64>,
    cost: f64,
) -> Result<(), Gated> {
    let structured = facts.structured_output;
    let g = &pool.gates;
    if g.healthy && m.healthy == Some(false) {
        return Err(Gated::Unhealthy(m.unhealthy_because));
    }
    let need = facts
        .input_tokens
        .unwrap_or(0)
        .saturating_add(facts.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    if m.quota_requests_remaining == Some(0) {
        return Err(Gated::Quota {
            tokens_left: None,
            need,
            reset_ms: m.quota_reset_ms,
        });
    }
    if let Some(left) = m.quota_tokens_remaining.filter(|left| *left < need) {
        return Err(Gated::Quota {
            tokens_left: Some(left),
            need,
            reset_ms: m.quota_reset_ms,
        });
    }
    if let (Some(max), Some(depth)) = (g.max_queue_depth, m.queue_depth) {
        if depth > max {
            return Err(Gated::QueueDepth { depth, max });
        }
    }
    if let (Some(fraction), Some(latency), Some(deadline)) =
        (g.max_latency_budget_fraction, m.latency_ms, deadline_ms)
    {
        let limit = fraction * deadline as f64;
        if latency > limit {
            return Err(Gated::Latency {
                latency,
                fraction,
                deadline,
                limit,
            });
        }
    }
    if let (Some(min), Some(free)) = (g.min_vram_free_mb, m.vram_free_mb) {
        if free <= min {
            return Err(Gated::Vram { free, min });
        }
    }
    if let (Some(max), Some(tpot)) = (g.max_tpot, m.tpot_ms) {
        let max = max.as_secs_f64() * 1000.0;
        if tpot > max {
            return Err(Gated::Tpot { tpot, max });
        }
    }
    if structured && !pool.structured_output {
        return Err(Gated::NoStructured);
    }
    if structured && m.structured_degraded {
        return Err(Gated::StructuredDegraded);
    }
    if let Some(ceiling) = route.cost_ceiling_per_call_usd {
        if cost > ceiling {
            return Err(Gated::Cost { cost, ceiling });
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

/// Checks that `situation` names only pools of `policy`. A pool the
/// situation does not list is taken as healthy, so a misspelt name
/// (`local_medium` for `local-medium`) would silently answer as if the
/// pool it meant were healthy; it is refused instead, with the names the
/// policy has.
pub fn check_situation(policy: &Policy, situation: &Situation) -> Result<(), FieldError> {
    let Some(unknown) = situation
        .pools
        .keys()
        .find(|name| policy.pool(name).is_none())
    else {
        return Ok(());
    };
    let known: Vec<&str> = policy.pools.iter().map(|p| p.name.as_str()).collect();
    Err(FieldError {
        field: format!("pools.{unknown}"),
        reason: format!(
            "the policy has no pool {unknown:?}; its pools: {}",
            known.join(", ")
        ),
    })
}

/// The dialect a request to `path` is written in, the path read as the
/// proxy reads it (`crate::request_path`: `/v1/messages/`,
/// `/v1//messages` and `%6D`-escaped spellings are the same path).
fn client_dialect(path: Option<&str>) -> router_dialect::Dialect {
    let normal = path.and_then(|p| crate::request_path::normalize(p).ok());
    match normal.as_deref() {
        Some("/v1/messages") => router_dialect::Dialect::Anthropic,
        _ => router_dialect::Dialect::OpenAi,
    }
}

/// Passes over the candidates whose dialect cannot carry `request` (a
/// body in `client`'s dialect), as the proxy does once the pools are
/// known: each is skipped naming the fields, and with none left the
/// request is refused (400) naming them.
fn pass_over_uncarried(
    policy: &Policy,
    d: &mut Decision,
    client: router_dialect::Dialect,
    request: &serde_json::Value,
) {
    let body = request.to_string();
    let parsed = router_dialect::parse_request(client, body.as_bytes());
    let mut kept = Vec::with_capacity(d.candidates.len());
    let mut notes = Vec::new();
    for name in std::mem::take(&mut d.candidates) {
        let to = policy
            .pool(&name)
            .map_or(router_dialect::Dialect::OpenAi, |p| p.provider.dialect());
        let why = match &parsed {
            // The same dialect passes through as the client wrote it.
            _ if to == client => None,
            Err(e) => Some(format!(
                "the request cannot be read for dialect {}: {e}",
                to.as_str()
            )),
            Ok(req) => {
                let lost =
                    router_dialect::uncarried(req, to, &router_dialect::WriteOptions::default());
                (!lost.is_empty())
                    .then(|| router_dialect::DialectError::CannotCarry(lost).to_string())
            }
        };
        match why {
            None => kept.push(name),
            Some(why) => {
                notes.push(format!("{name}: skipped, {why}"));
                d.estimated_cost_usd.remove(&name);
                d.skipped.push(Skipped { pool: name, why });
            }
        }
    }
    d.candidates = kept;
    if notes.is_empty() {
        return;
    }
    d.reason.push_str("; ");
    d.reason.push_str(&notes.join("; "));
    if d.candidates.is_empty() && d.refusal.is_none() {
        d.refusal = Some(Refusal::UncarriedFields);
        d.reason
            .push_str("; no pool of this route can take this request (400 invalid_request)");
    }
}

/// The contract's `explain` answer for a situation.
pub fn explain(policy: &Policy, situation: &Situation) -> Explanation {
    let mut d = decide(policy, situation);
    if let Some(request) = &situation.request {
        let client = client_dialect(situation.path.as_deref());
        pass_over_uncarried(policy, &mut d, client, request);
    }
    let chosen = d.candidates.first().and_then(|n| policy.pool(n));
    let route = d
        .route
        .as_deref()
        .and_then(|n| policy.routes.iter().find(|r| r.name == n));
    let on_all_down = route.and_then(|r| r.park).map(|p| {
        let state = crate::park::initial_state(d.risk);
        let parks_now = d.refusal == Some(Refusal::NoBackend);
        let then = if d.risk.has_side_effects() {
            "it runs only after an operator approves it (routerctl tasks approve)"
        } else {
            "it runs by itself, oldest first, once a pool of the chain can take it"
        };
        let why = format!(
            "on_all_down: park: when every pool of the chain is down, the request is parked as a task ({}) for up to {} s (at most {} tasks and {} bytes on the route, then no_backend); {then}",
            state.as_str(),
            p.ttl.as_secs(),
            p.max_tasks,
            p.max_bytes
        );
        if parks_now {
            d.reason.push_str("; ");
            d.reason.push_str(&why);
        }
        ParkExplanation {
            action: "park",
            parks_now,
            state: state.as_str(),
            ttl_s: p.ttl.as_secs(),
            max_tasks: p.max_tasks,
            max_bytes: p.max_bytes,
            why,
        }
    });
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
        splits: d.splits,
        balance: chosen
            .filter(|p| p.queue.scoring == crate::balance::Scoring::EngineAware)
            .map(|p| {
                crate::engine_aware::explain(
                    &p.name,
                    &p.queue.engine,
                    situation.endpoints.get(&p.name).map_or(&[], Vec::as_slice),
                    situation.prompt.as_deref(),
                    situation.prefix_last_served.as_deref(),
                )
            }),
        on_all_down,
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

#[cfg(test)]
mod on_route_tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::document::load;
    use crate::QueueSettings;

    /// Three pools behind one catch-all route; `route` is appended to the
    /// route's lines.
    fn policy(route: &str) -> Policy {
        let text = format!(
            "apiVersion: router/v1
kind: RoutingPolicy
spec:
  defaults: {{deadline_ms: 10000}}
  pools:
    - name: local
      endpoints: [\"h1:1\"]
      gates: {{healthy: true, max_queue_depth: 4}}
    - name: small
      endpoints: [\"h2:1\"]
      price: {{input_per_1k_usd: 0.001, output_per_1k_usd: 0.002}}
    - name: cloud
      endpoints: [\"h3:1\"]
      price: {{input_per_1k_usd: 0.01, output_per_1k_usd: 0.03}}
  routes:
    - name: default
      chain: [local, small, cloud]
{route}"
        );
        load(&text, &QueueSettings::default()).unwrap()
    }

    fn facts() -> RequestFacts<'static> {
        RequestFacts {
            risk: Risk::Read,
            model: Some("llama3"),
            path: "/v1/chat/completions",
            structured_output: false,
            deadline_ms: None,
            input_tokens: Some(1000),
            max_tokens: Some(1000),
            keys: SplitKeys::default(),
        }
    }

    fn queue(depth: u32) -> PoolMeasurements {
        PoolMeasurements {
            queue_depth: Some(depth),
            healthy: Some(true),
            ..PoolMeasurements::default()
        }
    }

    /// `decide_on_route` with `depths` as each pool's queue depth, and the
    /// chain indices it asked measurements for.
    fn verdict(policy: &Policy, depths: [u32; 3]) -> (Verdict, Vec<usize>) {
        let route = &policy.routes[0];
        let mut asked = Vec::new();
        let v = decide_on_route(policy, route, &facts(), |i, name| {
            assert_eq!(Some(name), route.pool_at(i));
            asked.push(i);
            Some(queue(depths[i]))
        });
        (v, asked)
    }

    /// The same through `decide`, for comparison.
    fn decision(policy: &Policy, depths: [u32; 3]) -> Decision {
        let f = facts();
        let situation = Situation {
            risk: Some(f.risk),
            model: f.model.map(str::to_string),
            path: Some(f.path.to_string()),
            input_tokens: f.input_tokens,
            max_tokens: f.max_tokens,
            pools: ["local", "small", "cloud"]
                .iter()
                .zip(depths)
                .map(|(name, d)| (name.to_string(), queue(d)))
                .collect(),
            ..Situation::default()
        };
        decide(policy, &situation)
    }

    #[test]
    fn every_pool_passes() {
        let p = policy("");
        let (v, asked) = verdict(&p, [4, 0, 0]);
        assert_eq!(v.candidates, [0, 1, 2]);
        assert_eq!(v.refusal, None);
        assert_eq!(v.reason, "route \"default\" (risk READ); local chosen");
        assert_eq!(asked, [0, 1, 2]);
        assert!(v.gated.is_empty() && v.gated.capacity() == 0);
        let names: Vec<&str> = v.candidate_names(&p.routes[0]).collect();
        let d = decision(&p, [4, 0, 0]);
        assert_eq!(names, d.candidates);
        assert_eq!(v.reason, d.reason);
    }

    #[test]
    fn a_pool_gated_by_queue_depth_is_skipped() {
        let p = policy("");
        let (v, _) = verdict(&p, [5, 9, 9]);
        assert_eq!(v.candidates, [1, 2]);
        assert_eq!(v.refusal, None);
        assert_eq!(
            v.reason,
            "route \"default\" (risk READ); local skipped: queue depth 5 > 4; small chosen"
        );
        assert_eq!(v.reason, decision(&p, [5, 9, 9]).reason);
        // The same gate, typed: what the route log's `walk` list carries.
        assert_eq!(
            v.gated,
            [(0, Gated::QueueDepth { depth: 5, max: 4 })],
            "{v:?}"
        );
        assert_eq!(v.gated[0].1.label(), "queue_depth");
    }

    #[test]
    fn a_pool_whose_keys_have_no_quota_for_the_request_is_gated_out() {
        let p = policy("");
        let mut f = facts();
        let situation = |local: PoolMeasurements| Situation {
            input_tokens: f.input_tokens,
            max_tokens: f.max_tokens,
            pools: [("local".to_string(), local)].into_iter().collect(),
            ..Situation::default()
        };
        let out_of_requests = PoolMeasurements {
            quota_requests_remaining: Some(0),
            quota_reset_ms: Some(1500),
            ..PoolMeasurements::default()
        };
        let d = decide(&p, &situation(out_of_requests));
        assert_eq!(d.candidates, ["small", "cloud"]);
        assert_eq!(
            d.skipped[0].why,
            "quota: no key has a request left until its reset in 1500 ms"
        );
        // 1000 prompt + 1000 max_tokens against 1500 tokens left.
        let short = PoolMeasurements {
            quota_requests_remaining: Some(3),
            quota_tokens_remaining: Some(1500),
            ..PoolMeasurements::default()
        };
        let d = decide(&p, &situation(short));
        assert_eq!(
            d.skipped[0].why,
            "quota: no key has the 2000 tokens the request may use (1500 left) until its reset"
        );
        let v = decide_on_route(&p, &p.routes[0], &f, |i, _| (i == 0).then_some(short));
        assert_eq!(v.gated[0].1.label(), "quota");
        assert_eq!(v.candidates, [1, 2]);
        // A smaller request fits in what is left.
        f.max_tokens = Some(500);
        let v = decide_on_route(&p, &p.routes[0], &f, |i, _| (i == 0).then_some(short));
        assert_eq!(v.candidates, [0, 1, 2]);
        // The situation as JSON names the fields so.
        let m: PoolMeasurements = serde_json::from_str(
            r#"{"quota_requests_remaining": 0, "quota_tokens_remaining": 10, "quota_reset_ms": 5}"#,
        )
        .unwrap();
        assert_eq!(m.quota_requests_remaining, Some(0));
    }

    #[test]
    fn over_the_ceiling_everywhere_is_budget_exceeded() {
        // Costs: local 0, small $0.003, cloud $0.04. The queue rules out
        // local; the ceiling the other two.
        let p = policy("      cost_ceiling_per_call_usd: 0.002\n");
        let (v, _) = verdict(&p, [5, 0, 0]);
        assert_eq!(v.candidates, Vec::<usize>::new());
        assert_eq!(v.refusal, Some(Refusal::BudgetExceeded));
        assert_eq!(
            v.reason,
            "route \"default\" (risk READ); local skipped: queue depth 5 > 4; \
             small skipped: estimated cost $0.0030 > ceiling $0.0020; \
             cloud skipped: estimated cost $0.0400 > ceiling $0.0020; \
             the pools the other gates allow are over the cost ceiling"
        );
        let labels: Vec<&str> = v.gated.iter().map(|(_, g)| g.label()).collect();
        assert_eq!(labels, ["queue_depth", "cost", "cost"]);
        let d = decision(&p, [5, 0, 0]);
        assert_eq!(d.refusal, v.refusal);
        assert_eq!(d.reason, v.reason);

        // Under the ceiling, local is the answer again.
        let (v, _) = verdict(&p, [0, 0, 0]);
        assert_eq!(v.candidates, [0]);
        assert_eq!(v.refusal, None);
    }

    #[test]
    fn without_downgrade_only_the_first_pool_is_measured_or_chosen() {
        let p = policy("      allow_downgrade: false\n");
        let (v, asked) = verdict(&p, [0, 0, 0]);
        assert_eq!(v.candidates, [0]);
        assert_eq!(asked, [0]);
        let later = "allow_downgrade is false: only the first pool of the chain";
        assert_eq!(
            v.reason,
            format!(
                "route \"default\" (risk READ); small skipped: {later}; \
                 cloud skipped: {later}; local chosen"
            )
        );

        let (v, asked) = verdict(&p, [5, 0, 0]);
        assert_eq!(v.candidates, Vec::<usize>::new());
        assert_eq!(v.refusal, Some(Refusal::NoBackend));
        assert_eq!(asked, [0]);
        assert!(v.reason.ends_with("; no pool can take it"), "{}", v.reason);
        let d = decision(&p, [5, 0, 0]);
        assert_eq!((d.refusal, &d.reason), (v.refusal, &v.reason));
    }

    /// Issue 20, item 7: a situation naming a pool the policy lacks is
    /// refused with the known names (it used to be taken as healthy).
    #[test]
    fn a_situation_naming_an_unknown_pool_is_refused_with_the_known_names() {
        let p = policy("");
        let ok: Situation =
            serde_json::from_str(r#"{"pools": {"local": {"healthy": false}}}"#).unwrap();
        assert_eq!(check_situation(&p, &ok), Ok(()));
        let typo: Situation =
            serde_json::from_str(r#"{"pools": {"locall": {"healthy": false}}}"#).unwrap();
        let e = check_situation(&p, &typo).unwrap_err();
        assert_eq!(e.field, "pools.locall");
        assert_eq!(
            e.reason,
            "the policy has no pool \"locall\"; its pools: local, small, cloud"
        );
    }

    #[test]
    fn explain_passes_over_the_pools_that_cannot_carry_the_requests_fields() {
        let text = "apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - {name: claude, provider: anthropic, endpoints: [\"h1:1\"]}
    - {name: local, endpoints: [\"h2:1\"]}
  routes:
    - {name: agents, chain: [claude, local]}
";
        let policy = load(text, &QueueSettings::default()).unwrap();
        let situation = |path: &str, request: serde_json::Value| Situation {
            path: Some(path.into()),
            request: Some(request),
            ..Situation::default()
        };
        // Anthropic's `top_k`: the OpenAI pool is passed over, naming it
        // (the path spelled as a client may spell it).
        let e = explain(
            &policy,
            &situation(
                "/v1/%6Dessages/",
                serde_json::json!({"model": "m", "max_tokens": 8, "top_k": 5,
                    "messages": [{"role": "user", "content": "hi"}]}),
            ),
        );
        assert_eq!(e.candidates, vec!["claude".to_string()]);
        assert_eq!(e.skipped.len(), 1);
        assert_eq!(e.skipped[0].pool, "local");
        assert!(
            e.skipped[0]
                .why
                .starts_with("cannot carry field `top_k` to dialect openai"),
            "{:?}",
            e.skipped
        );
        assert!(
            e.reason
                .contains("local: skipped, cannot carry field `top_k`"),
            "{}",
            e.reason
        );
        // An OpenAI request without max_tokens cannot go to Anthropic, and
        // with only that pool nothing can take it.
        let only_claude = load(
            &text.replace("chain: [claude, local]", "chain: [claude]"),
            &QueueSettings::default(),
        )
        .unwrap();
        let e = explain(
            &only_claude,
            &situation(
                "/v1/chat/completions",
                serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            ),
        );
        assert!(e.candidates.is_empty());
        assert_eq!(e.refusal, Some(Refusal::UncarriedFields));
        assert!(e.skipped[0].why.contains("`max_tokens`"), "{:?}", e.skipped);
        assert_eq!(e.pool, None);
        // Without a body, nothing changes.
        let e = explain(&only_claude, &Situation::default());
        assert_eq!(e.candidates, vec!["claude".to_string()]);
    }
}

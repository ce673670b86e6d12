//! Validation: from the document as written to a [`Policy`].
//!
//! [`PolicyDocument::validate`] runs one validator per section of the
//! document, in this order:
//!
//! 1. the header (`apiVersion`, `kind`);
//! 2. `spec.queue`, the queue settings every pool inherits;
//! 3. `spec.defaults`, the deadlines every route inherits;
//! 4. `spec.circuit_breaker`;
//! 5. `spec.pools`, each pool on its own: endpoints (no link-local or
//!    metadata address the [`Guards`] do not allow), limits, gates, prices,
//!    API key (a variable the [`Guards`] allow), capacity probe (checked
//!    against the VRAM gate it feeds), queue;
//! 6. `spec.routes`, each route on its own: chain, match, cost ceiling,
//!    shadowing by an earlier catch-all route, deadlines, retries;
//! 7. `spec.structured_output_degrade_s`;
//! 8. `spec.approval`.
//!
//! Each validator pushes every problem it finds into one shared `Errors`
//! list, with the field's full path, and still returns its resolved value:
//! an error in one section does not stop the sections after it from being
//! checked (a route is checked against every pool name, even that of a pool
//! with a bad endpoint), so the operator sees every problem in one answer.
//! Only at the end does `validate` decide between a [`Policy`] and a
//! [`PolicyError`].
//!
//! A section that depends on another is handed what it needs and nothing
//! more: pools get the resolved `spec.queue`; routes get a `RouteContext`
//! with the pool names and the defaults of `spec.defaults`.
//!
//! The order of the errors is part of the contract, pinned by the tests:
//! sections in the order above, pools and routes in document order, and
//! within one pool or route its fields in the order the checks run.
//!
//! Files: this one runs the sections and holds the small ones; one pool
//! is checked in `validate/pool.rs`, one route in `validate/route.rs`,
//! `spec.tenants` in `validate/tenants.rs`.

use std::collections::HashSet;
use std::time::Duration;

use super::{
    positive_duration, ApprovalSpec, CacheSpec, ChainStep, ChainStepSpec, CircuitSettings,
    CircuitSpec, DefaultsSpec, EndpointSpec, FieldError, Gates, GatesSpec, Hedge, HedgeDelay,
    HedgeQuantile, HedgeSpec, MatchSpec, OnAllDown, ParkSettings, Policy, PolicyDocument,
    PolicyError, Pool, PoolSpec, Price, PriceSpec, Probe, ProbeKind, ProbeSpec, QueueSettings,
    QueueSpec, RetryBudgetSpec, RetryOn, Risk, Route, RouteMatch, RouteSpec, SessionAffinity,
    SessionAffinitySpec, SplitSpec, TenantSpec, API_VERSION, KIND,
};
use super::{AffinityKind, EngineAwareSpec};
use crate::balance::Scoring;
use crate::endpoint::Endpoint;
use crate::engine_aware::{EngineAware, PrefixAffinity};
use crate::guard::{backend_refusal, Guards};
use crate::retry_budget::BudgetSettings;
use crate::tenant::{Tenant, Tenants};

mod pool;
mod route;
mod tenants;

use pool::pool;
use route::{route, RouteContext};
use tenants::tenants;

impl PolicyDocument {
    /// Checks meaning and resolves defaults, with the default [`Guards`].
    /// Every problem is reported.
    pub fn validate(&self, defaults: &QueueSettings) -> Result<Policy, PolicyError> {
        self.validate_with(defaults, &Guards::default())
    }

    /// Checks meaning and resolves defaults; API key variables and backend
    /// addresses are checked against `guards`. Every problem is reported.
    pub fn validate_with(
        &self,
        defaults: &QueueSettings,
        guards: &Guards,
    ) -> Result<Policy, PolicyError> {
        let mut errs = Errors::default();
        let spec = &self.spec;
        header(self, &mut errs);
        let queue = resolve_queue(&spec.queue, defaults, "spec.queue", &mut errs);
        let request_defaults = request_defaults(&spec.defaults, &mut errs);
        let circuit = circuit_breaker(&spec.circuit_breaker, &mut errs);
        let pools = pools(&spec.pools, &queue, guards, &mut errs);
        let context = RouteContext {
            pool_names: pools.iter().map(|p| p.name.as_str()).collect(),
            defaults: request_defaults,
        };
        let routes = routes(&spec.routes, &context, &mut errs);
        let structured_degrade = structured_degrade(spec.structured_output_degrade_s, &mut errs);
        let approval_token_env = approval(spec.approval.as_ref(), &mut errs);
        let tenants = tenants(&spec.tenants, &routes, &mut errs);
        errs.finish(Policy {
            name: self.metadata.name.clone(),
            pools,
            routes,
            circuit,
            default_risk: spec.defaults.risk.unwrap_or(Risk::Read),
            approval_token_env,
            structured_degrade,
            tenants,
        })
    }
}

/// The problems found so far, in the order found.
#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            reason: reason.into(),
        });
    }

    fn finish<T>(self, value: T) -> Result<T, PolicyError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(PolicyError { errors: self.0 })
        }
    }
}

// ---- Sections of the document, in the order `validate` runs them. ----

/// `apiVersion` and `kind`: this crate reads one version of one kind.
fn header(doc: &PolicyDocument, errs: &mut Errors) {
    if doc.api_version != API_VERSION {
        errs.push("apiVersion", format!("must be {API_VERSION:?}"));
    }
    if doc.kind != KIND {
        errs.push("kind", format!("must be {KIND:?}"));
    }
}

/// `spec.defaults`, resolved: what a route without its own settings uses.
#[derive(Debug, Clone, Copy)]
struct RequestDefaults {
    deadline: Option<Duration>,
    attempt_timeout: Option<Duration>,
}

/// `spec.defaults`: the deadlines, each positive when given. (The default
/// risk needs no check: serde only reads the four classes.)
fn request_defaults(d: &DefaultsSpec, errs: &mut Errors) -> RequestDefaults {
    RequestDefaults {
        deadline: millis(d.deadline_ms, "spec.defaults.deadline_ms", errs),
        attempt_timeout: millis(
            d.attempt_timeout_ms,
            "spec.defaults.attempt_timeout_ms",
            errs,
        ),
    }
}

/// `spec.circuit_breaker`: at least one error to open, a positive open time.
fn circuit_breaker(c: &CircuitSpec, errs: &mut Errors) -> CircuitSettings {
    let mut circuit = CircuitSettings::default();
    if let Some(n) = c.consecutive_errors {
        if n == 0 {
            errs.push(
                "spec.circuit_breaker.consecutive_errors",
                "must be at least 1",
            );
        } else {
            circuit.consecutive_errors = n;
        }
    }
    if let Some(t) = c.open_duration_s {
        match positive_duration(t) {
            Some(d) => circuit.open_duration = d,
            None => errs.push(
                "spec.circuit_breaker.open_duration_s",
                "must be a positive number of seconds",
            ),
        }
    }
    circuit
}

/// `spec.pools`: at least one, names unique, then each pool on its own.
fn pools(
    specs: &[PoolSpec],
    queue: &QueueSettings,
    guards: &Guards,
    errs: &mut Errors,
) -> Vec<Pool> {
    if specs.is_empty() {
        errs.push("spec.pools", "at least one pool is required");
    }
    let mut names = HashSet::new();
    let mut pools = Vec::with_capacity(specs.len());
    for (i, p) in specs.iter().enumerate() {
        let at = format!("spec.pools[{i}]");
        unique_name(&p.name, &at, "pool", &mut names, errs);
        pools.push(pool(p, &at, queue, guards, errs));
    }
    pools
}

/// `spec.routes`: at least one, names unique, then each route on its own
/// (a route is also checked against the routes before it).
fn routes(specs: &[RouteSpec], context: &RouteContext<'_>, errs: &mut Errors) -> Vec<Route> {
    if specs.is_empty() {
        errs.push("spec.routes", "at least one route is required");
    }
    let mut names = HashSet::new();
    let mut routes = Vec::with_capacity(specs.len());
    for (i, r) in specs.iter().enumerate() {
        let at = format!("spec.routes[{i}]");
        unique_name(&r.name, &at, "route", &mut names, errs);
        let checked = route(r, &at, &routes, context, errs);
        routes.push(checked);
    }
    routes
}

/// `spec.structured_output_degrade_s`: positive seconds, default 60.
fn structured_degrade(seconds: Option<f64>, errs: &mut Errors) -> Duration {
    const DEFAULT: Duration = Duration::from_secs(60);
    match seconds {
        None => DEFAULT,
        Some(t) => positive_duration(t).unwrap_or_else(|| {
            errs.push(
                "spec.structured_output_degrade_s",
                "must be a positive number of seconds",
            );
            DEFAULT
        }),
    }
}

/// `spec.approval`: the static token's variable name, if the policy opts
/// in to the old form.
fn approval(approval: Option<&ApprovalSpec>, errs: &mut Errors) -> Option<String> {
    let approval = approval?;
    let env = &approval.token_env;
    check_env_name(env, "spec.approval.token_env", errs);
    if !approval.allow_static_token {
        errs.push(
            "spec.approval.token_env",
            "a static approval token approves every request until it is changed, so it is off by default: sign approvals per request with `routerctl approve` (proxies check them with CUSTOM_ROUTER_APPROVAL_KEY) and remove spec.approval, or set spec.approval.allow_static_token: true to keep the static token",
        );
    }
    Some(env.clone())
}

// ---- One pool. ----

/// A pool's or a route's name: well formed, and not taken by an earlier one.
fn unique_name<'a>(
    name: &'a str,
    at: &str,
    what: &str,
    seen: &mut HashSet<&'a str>,
    errs: &mut Errors,
) {
    let field = format!("{at}.name");
    check_name(name, &field, errs);
    if !seen.insert(name) {
        errs.push(field, format!("duplicate {what} name {name:?}"));
    }
}

fn check_name(name: &str, field: &str, errs: &mut Errors) {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if !ok {
        errs.push(
            field,
            "must be 1-63 characters of letters, digits, '-', '_' or '.'",
        );
    }
}

/// The name of an environment variable (the policy holds names of secrets,
/// never their values). False (and an error) when it is not one.
fn check_env_name(env: &str, field: impl Into<String>, errs: &mut Errors) -> bool {
    if env.is_empty() || !env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        errs.push(field, "must be an environment variable name");
        return false;
    }
    true
}

/// A queue section (`spec.queue` or a pool's `queue`) over its `base`:
/// each field given replaces the base's, if valid.
fn resolve_queue(
    q: &QueueSpec,
    base: &QueueSettings,
    at: &str,
    errs: &mut Errors,
) -> QueueSettings {
    let mut out = *base;
    if let Some(n) = q.max_size {
        if n == 0 {
            errs.push(format!("{at}.max_size"), "must be at least 1");
        } else {
            out.max_size = usize::try_from(n).unwrap_or(usize::MAX);
        }
    }
    if let Some(t) = q.timeout_s {
        match positive_duration(t) {
            Some(d) => out.timeout = d,
            None => errs.push(
                format!("{at}.timeout_s"),
                "must be a positive number of seconds",
            ),
        }
    }
    if let Some(t) = q.latency_threshold_s {
        if t.is_finite() && t > 0.0 {
            out.latency_threshold_s = t;
        } else {
            errs.push(
                format!("{at}.latency_threshold_s"),
                "must be a positive number of seconds",
            );
        }
    }
    if let Some(a) = q.ewma_alpha {
        if a > 0.0 && a <= 1.0 {
            out.ewma_alpha = a;
        } else {
            errs.push(format!("{at}.ewma_alpha"), "must be in (0, 1]");
        }
    }
    if let Some(s) = q.scoring {
        out.scoring = s;
    }
    out
}

/// Milliseconds as a duration; 0 is an error (leave the field out instead).
fn millis(value: Option<u64>, field: &str, errs: &mut Errors) -> Option<Duration> {
    match value {
        Some(0) => {
            errs.push(field, "must be a positive number of milliseconds");
            None
        }
        Some(ms) => Some(Duration::from_millis(ms)),
        None => None,
    }
}

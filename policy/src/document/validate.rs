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

use std::collections::HashSet;
use std::time::Duration;

use super::{
    positive_duration, ApprovalSpec, CircuitSettings, CircuitSpec, DefaultsSpec, EndpointSpec,
    FieldError, Gates, GatesSpec, Hedge, HedgeDelay, HedgeQuantile, HedgeSpec, MatchSpec,
    OnAllDown, ParkSettings, Policy, PolicyDocument, PolicyError, Pool, PoolSpec, Price, PriceSpec,
    Probe, ProbeKind, ProbeSpec, QueueSettings, QueueSpec, RetryBudgetSpec, RetryOn, Risk, Route,
    RouteMatch, RouteSpec, SessionAffinity, SessionAffinitySpec, TenantSpec, API_VERSION, KIND,
};
use super::{AffinityKind, EngineAwareSpec};
use crate::balance::Scoring;
use crate::endpoint::Endpoint;
use crate::engine_aware::{EngineAware, PrefixAffinity};
use crate::guard::{backend_refusal, Guards};
use crate::retry_budget::BudgetSettings;
use crate::tenant::{Tenant, Tenants};

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

/// A budget in USD, as micro-USD: finite and not negative.
fn budget(usd: Option<f64>, field: &str, errs: &mut Errors) -> Option<u64> {
    let usd = usd?;
    if !(usd.is_finite() && usd >= 0.0) {
        errs.push(field, "must be a non-negative number of USD");
        return None;
    }
    Some((usd * 1e6).floor() as u64)
}

/// `spec.tenants`: unique names, key hashes well formed and each given to
/// one tenant, routes that exist, at most one anonymous tenant. `None`
/// when the policy has none (tenancy off).
fn tenants(specs: &[TenantSpec], routes: &[Route], errs: &mut Errors) -> Option<Tenants> {
    if specs.is_empty() {
        return None;
    }
    let mut names = HashSet::new();
    let mut seen_keys = std::collections::HashMap::new();
    let mut list = Vec::new();
    let mut keys = Vec::new();
    let mut anonymous = None;
    for (i, t) in specs.iter().enumerate() {
        let at = format!("spec.tenants[{i}]");
        if t.name.trim().is_empty() {
            errs.push(format!("{at}.name"), "must not be empty");
        } else if !names.insert(t.name.as_str()) {
            errs.push(
                format!("{at}.name"),
                format!("tenant {:?} appears twice", t.name),
            );
        }
        let mut hashes = Vec::new();
        for (j, k) in t.keys.iter().enumerate() {
            match crate::tenant::parse_key_hash(k) {
                Some(h) => {
                    if let Some(other) = seen_keys.insert(h, i) {
                        errs.push(
                            format!("{at}.keys[{j}]"),
                            format!("the same key is already tenant #{other}'s"),
                        );
                    }
                    hashes.push(h);
                }
                None => errs.push(
                    format!("{at}.keys[{j}]"),
                    "must be sha256:<64 hex digits>, the hash of a key (`routerctl tenants keys create` mints one and keeps its hash in the control plane, outside the policy); a policy never holds keys",
                ),
            }
        }
        for (j, r) in t.routes.iter().enumerate() {
            if !routes.iter().any(|route| route.name == *r) {
                errs.push(format!("{at}.routes[{j}]"), format!("unknown route {r:?}"));
            }
        }
        if t.anonymous {
            if anonymous.is_some() {
                errs.push(
                    format!("{at}.anonymous"),
                    "only one tenant may be anonymous",
                );
            }
            anonymous = Some(i);
        }
        // A tenant without keys in the policy is valid: its keys may live
        // in the control plane's store (`routerctl tenants keys create`).
        let limits = t.limits.clone().unwrap_or_default();
        if limits.tokens_per_minute == Some(0) {
            errs.push(
                format!("{at}.limits.tokens_per_minute"),
                "must be at least 1 (leave it out for no limit)",
            );
        }
        if limits.concurrent_requests == Some(0) {
            errs.push(
                format!("{at}.limits.concurrent_requests"),
                "must be at least 1 (leave it out for no limit)",
            );
        }
        for (field, burst, limit) in [
            (
                "requests_burst",
                limits.requests_burst,
                limits.requests_per_minute,
            ),
            (
                "tokens_burst",
                limits.tokens_burst,
                limits.tokens_per_minute,
            ),
        ] {
            let Some(burst) = burst else { continue };
            let reason = match limit {
                None => Some("only used with its per-minute limit"),
                Some(_) if burst == 0 => Some("must be at least 1"),
                Some(l) if burst > l => Some("must be at most the per-minute limit"),
                Some(_) => None,
            };
            if let Some(reason) = reason {
                errs.push(format!("{at}.limits.{field}"), reason);
            }
        }
        if limits.requests_per_minute == Some(0) {
            errs.push(
                format!("{at}.limits.requests_per_minute"),
                "must be at least 1 (leave it out for no limit)",
            );
        }
        list.push(Tenant {
            name: t.name.clone(),
            routes: t.routes.clone(),
            max_risk: t.max_risk.unwrap_or(Risk::Destructive),
            rate: limits.requests_per_minute.filter(|n| *n > 0).map(|n| {
                let burst = limits
                    .requests_burst
                    .unwrap_or(crate::tenant::default_request_burst(n));
                crate::tenant::Gcra::per_minute_with_burst(n, burst)
            }),
            rate_fail_open: limits.on_store_down != Some(super::StoreDown::Closed),
            max_concurrent: limits.concurrent_requests,
            token_rate: limits.tokens_per_minute.filter(|n| *n > 0).map(|n| {
                let burst = limits.tokens_burst.unwrap_or(crate::tenant::burst_of(n));
                crate::tenant::Gcra::per_minute_with_burst(n, burst)
            }),
            budgets: crate::tenant::Budgets {
                per_day: budget(
                    limits.budget_usd_per_day,
                    &format!("{at}.limits.budget_usd_per_day"),
                    errs,
                ),
                per_month: budget(
                    limits.budget_usd_per_month,
                    &format!("{at}.limits.budget_usd_per_month"),
                    errs,
                ),
            },
            budget_fail_open: limits.budget_on_store_down == Some(super::StoreDown::Open),
        });
        keys.push(hashes);
    }
    Some(Tenants::new(list, keys, anonymous))
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

/// One pool: endpoints, limits, model, gates, prices, API key, capacity
/// probe, queue (inherited from `spec.queue`, field by field).
fn pool(
    p: &PoolSpec,
    at: &str,
    spec_queue: &QueueSettings,
    guards: &Guards,
    errs: &mut Errors,
) -> Pool {
    let (endpoints, drained) = endpoints(&p.endpoints, at, guards, errs);
    let attempt_timeout = millis(
        p.attempt_timeout_ms,
        &format!("{at}.attempt_timeout_ms"),
        errs,
    );
    if p.max_concurrency == Some(0) {
        errs.push(
            format!("{at}.max_concurrency"),
            "must be at least 1 (leave it out for no limit)",
        );
    }
    if let Some(m) = &p.model {
        if m.trim().is_empty() {
            errs.push(format!("{at}.model"), "must not be empty");
        }
    }
    let gates_spec = p.gates.clone().unwrap_or_default();
    let gates = gates(&gates_spec, at, errs);
    let price = price(p.price.as_ref(), at, errs);
    if let Some(env) = &p.api_key_env {
        let field = format!("{at}.api_key_env");
        if check_env_name(env, field.clone(), errs) {
            if let Err(why) = guards.api_key_env.check(env) {
                errs.push(field, why);
            }
        }
    }
    let probe = capacity_probe(p.capacity_probe.as_ref(), &gates_spec, at, errs);
    let mut queue = match &p.queue {
        Some(q) => resolve_queue(q, spec_queue, &format!("{at}.queue"), errs),
        None => *spec_queue,
    };
    if let Some(b) = p.balance {
        queue.scoring = b;
    }
    if let Some(e) = &p.engine_aware {
        if queue.scoring != Scoring::EngineAware {
            errs.push(
                format!("{at}.engine_aware"),
                "only used with balance: engine_aware",
            );
        }
        queue.engine = engine_aware(e, at, errs);
    }
    Pool {
        name: p.name.clone(),
        provider: p.provider,
        model: p.model.clone(),
        endpoints,
        max_concurrency: p.max_concurrency,
        queue,
        attempt_timeout,
        drain: p.drain,
        drained,
        gates,
        structured_output: p.structured_output.unwrap_or(true),
        price,
        api_key_env: p.api_key_env.clone(),
        probe,
        first_token_timeout: millis(
            p.first_token_timeout_ms,
            &format!("{at}.first_token_timeout_ms"),
            errs,
        ),
        stall_timeout: millis(p.stall_timeout_ms, &format!("{at}.stall_timeout_ms"), errs),
        stream_usage: p
            .stream_usage
            .unwrap_or(!matches!(p.provider, super::Provider::Tgi)),
        azure: azure_deployment(p, at, errs),
        health_check: health_check(p.health_check.as_ref(), p.provider, at, errs),
        outlier_ejection: p
            .outlier_ejection
            .as_ref()
            .map(|o| outlier_ejection(o, at, errs)),
        session_affinity: p
            .session_affinity
            .as_ref()
            .map(|s| session_affinity(s, at, errs)),
    }
}

/// A pool's session affinity: a header name (any case; kept lowercase)
/// and a load factor of at least 1.
fn session_affinity(s: &SessionAffinitySpec, at: &str, errs: &mut Errors) -> SessionAffinity {
    let at = format!("{at}.session_affinity");
    let header = s.header.trim().to_ascii_lowercase();
    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        errs.push(
            format!("{at}.header"),
            format!("{:?} is not a header name", s.header),
        );
    }
    let load_factor = s
        .load_factor
        .unwrap_or(crate::affinity::DEFAULT_SESSION_LOAD_FACTOR);
    if !(load_factor.is_finite() && load_factor >= 1.0) {
        errs.push(
            format!("{at}.load_factor"),
            "must be at least 1 (the pool's average load)",
        );
    }
    SessionAffinity {
        header,
        load_factor,
    }
}

/// An Azure OpenAI pool's `deployment` (required) and `api_version`
/// (default [`super::DEFAULT_AZURE_API_VERSION`]): each a name of
/// letters, digits, `.`, `_` and `-` (it goes in the URL). Either field
/// on a pool of another provider is refused: it would be ignored.
fn azure_deployment(p: &PoolSpec, at: &str, errs: &mut Errors) -> Option<super::AzureDeployment> {
    fn url_safe(s: &str) -> bool {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    }
    if p.provider != super::Provider::AzureOpenai {
        for (field, value) in [
            ("deployment", &p.deployment),
            ("api_version", &p.api_version),
        ] {
            if value.is_some() {
                errs.push(
                    format!("{at}.{field}"),
                    "only used with provider: azure_openai",
                );
            }
        }
        return None;
    }
    let api_version = p
        .api_version
        .clone()
        .unwrap_or_else(|| super::DEFAULT_AZURE_API_VERSION.to_owned());
    if !url_safe(&api_version) {
        errs.push(
            format!("{at}.api_version"),
            "must be an Azure OpenAI API version, like 2024-10-21",
        );
    }
    let Some(deployment) = p.deployment.clone() else {
        errs.push(
            format!("{at}.deployment"),
            "required with provider: azure_openai (the deployment the requests go to)",
        );
        return None;
    };
    if !url_safe(&deployment) {
        errs.push(
            format!("{at}.deployment"),
            "must be a deployment name: letters, digits, `.`, `_` and `-`",
        );
    }
    Some(super::AzureDeployment {
        deployment,
        api_version,
    })
}

/// A pool's health checks: the provider's defaults, each field replaced by
/// the one written; the interval and timeout positive, the timeout within
/// the interval (a check never overlaps the next), thresholds at least 1,
/// the path absolute.
fn health_check(
    spec: Option<&super::HealthCheckSpec>,
    provider: super::Provider,
    at: &str,
    errs: &mut Errors,
) -> Option<crate::health::HealthCheck> {
    use crate::health::{on_by_default, HealthCheck};
    let Some(s) = spec else {
        return on_by_default(provider).then(|| HealthCheck::defaults(provider));
    };
    if s.enabled == Some(false) {
        return None;
    }
    let at = format!("{at}.health_check");
    let mut c = HealthCheck::defaults(provider);
    if let Some(path) = &s.path {
        if !path.starts_with('/') || path.contains(char::is_whitespace) {
            errs.push(
                format!("{at}.path"),
                "must be an absolute path, like /health",
            );
        }
        c.path = path.clone();
    }
    for (field, value, slot) in [
        ("interval_ms", s.interval_ms, &mut c.interval),
        ("timeout_ms", s.timeout_ms, &mut c.timeout),
    ] {
        match value {
            Some(0) => errs.push(format!("{at}.{field}"), "must be positive"),
            Some(v) if v > 3_600_000 => {
                errs.push(format!("{at}.{field}"), "must be at most 3600000 (an hour)")
            }
            Some(v) => *slot = Duration::from_millis(v),
            None => {}
        }
    }
    if c.timeout > c.interval {
        errs.push(
            format!("{at}.timeout_ms"),
            format!(
                "must not exceed interval_ms ({} ms): a check would still run when the next starts",
                c.interval.as_millis()
            ),
        );
    }
    for (field, value, slot) in [
        ("unhealthy_after", s.unhealthy_after, &mut c.unhealthy_after),
        ("healthy_after", s.healthy_after, &mut c.healthy_after),
    ] {
        match value {
            Some(0) => errs.push(format!("{at}.{field}"), "must be at least 1"),
            Some(v) => *slot = v,
            None => {}
        }
    }
    Some(c)
}

/// A pool's outlier ejection: defaults, each field replaced by the one
/// written, each in its range.
fn outlier_ejection(
    s: &super::OutlierEjectionSpec,
    at: &str,
    errs: &mut Errors,
) -> crate::health::OutlierEjection {
    let at = format!("{at}.outlier_ejection");
    let mut o = crate::health::OutlierEjection::default();
    for (field, value, slot) in [
        ("window_ms", s.window_ms, &mut o.window),
        ("ejection_ms", s.ejection_ms, &mut o.ejection),
    ] {
        match value {
            Some(0) => errs.push(format!("{at}.{field}"), "must be positive"),
            Some(v) => *slot = Duration::from_millis(v),
            None => {}
        }
    }
    if let Some(n) = s.min_requests {
        o.min_requests = n.max(1);
        if n == 0 {
            errs.push(format!("{at}.min_requests"), "must be at least 1");
        }
    }
    if let Some(r) = s.min_error_rate {
        if !(r > 0.0 && r <= 1.0) {
            errs.push(format!("{at}.min_error_rate"), "must be in (0, 1]");
        }
        o.min_error_rate = r;
    }
    if let Some(r) = s.ratio {
        if !(r.is_finite() && r >= 1.0) {
            errs.push(format!("{at}.ratio"), "must be at least 1");
        }
        o.ratio = r;
    }
    if let Some(p) = s.max_ejection_percent {
        if p > 100 {
            errs.push(format!("{at}.max_ejection_percent"), "must be at most 100");
        }
        o.max_ejection_percent = p;
    }
    o
}

/// A pool's endpoints: each parses, is not a link-local or metadata
/// address the guards do not allow, and none appears twice. Returns all of
/// them and, apart, those drained one by one.
fn endpoints(
    specs: &[EndpointSpec],
    at: &str,
    guards: &Guards,
    errs: &mut Errors,
) -> (Vec<Endpoint>, Vec<Endpoint>) {
    let mut endpoints = Vec::new();
    let mut drained = Vec::new();
    for (j, e) in specs.iter().enumerate() {
        match Endpoint::parse(e.url()) {
            Ok(ep) if endpoints.contains(&ep) => errs.push(
                format!("{at}.endpoints[{j}]"),
                format!("duplicate endpoint {ep}"),
            ),
            Ok(ep) => {
                if let Some(why) = backend_refusal(&ep, &guards.backend_hosts) {
                    errs.push(format!("{at}.endpoints[{j}]"), why);
                    continue;
                }
                if e.drain() {
                    drained.push(ep.clone());
                }
                endpoints.push(ep);
            }
            Err(err) => errs.push(format!("{at}.endpoints[{j}]"), err.to_string()),
        }
    }
    (endpoints, drained)
}

/// A pool's gates: a latency fraction that can hold. (The VRAM gate is
/// checked with the capacity probe that measures it.)
fn gates(g: &GatesSpec, at: &str, errs: &mut Errors) -> Gates {
    if let Some(f) = g.max_latency_budget_fraction {
        if !(f.is_finite() && f > 0.0) {
            errs.push(
                format!("{at}.gates.max_latency_budget_fraction"),
                "must be a positive fraction: at 0 or below the gate can never hold",
            );
        }
    }
    Gates {
        healthy: g.healthy.unwrap_or(true),
        max_queue_depth: g.max_queue_depth,
        max_latency_budget_fraction: g.max_latency_budget_fraction,
        min_vram_free_mb: g.min_vram_free_mb,
        max_tpot: millis(g.max_tpot_ms, &format!("{at}.gates.max_tpot_ms"), errs),
    }
}

/// A pool's prices: finite and not negative (free when left out).
fn price(p: Option<&PriceSpec>, at: &str, errs: &mut Errors) -> Price {
    let price = p.map_or(Price::default(), |p| Price {
        input_per_1k_usd: p.input_per_1k_usd,
        output_per_1k_usd: p.output_per_1k_usd,
        cache_read_per_1k_usd: p.cache_read_per_1k_usd.unwrap_or(p.input_per_1k_usd),
        cache_write_per_1k_usd: p.cache_write_per_1k_usd.unwrap_or(p.input_per_1k_usd),
    });
    // The cache prices are checked when given (left out, they are the
    // input price, already checked).
    let given = |v: Option<f64>| v.unwrap_or(0.0);
    for (field, v) in [
        ("input_per_1k_usd", price.input_per_1k_usd),
        ("output_per_1k_usd", price.output_per_1k_usd),
        (
            "cache_read_per_1k_usd",
            given(p.and_then(|p| p.cache_read_per_1k_usd)),
        ),
        (
            "cache_write_per_1k_usd",
            given(p.and_then(|p| p.cache_write_per_1k_usd)),
        ),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            errs.push(
                format!("{at}.price.{field}"),
                "must be a non-negative number",
            );
        }
    }
    price
}

/// A pool's engine-aware settings over the defaults.
fn engine_aware(e: &EngineAwareSpec, at: &str, errs: &mut Errors) -> EngineAware {
    let at = format!("{at}.engine_aware");
    let mut out = EngineAware::default();
    if let Some(w) = e.max_waiting {
        out.max_waiting = w;
    }
    if let Some(kv) = e.max_kv_usage {
        if kv > 0.0 && kv <= 1.0 {
            out.max_kv_usage = kv;
        } else {
            errs.push(format!("{at}.max_kv_usage"), "must be in (0, 1]");
        }
    }
    let mut affinity = PrefixAffinity::default();
    if let Some(c) = e.load_factor {
        if c.is_finite() && c > 1.0 {
            affinity.load_factor = c;
        } else {
            errs.push(
                format!("{at}.load_factor"),
                "must be above 1 (1.25 is usual): at 1 a key could find no endpoint under the bound",
            );
        }
    }
    match e.prefix_block_bytes {
        Some(0) => errs.push(format!("{at}.prefix_block_bytes"), "must be at least 1"),
        Some(b) => affinity.block_bytes = b,
        None => {}
    }
    match e.prefix_max_blocks {
        Some(0) => errs.push(format!("{at}.prefix_max_blocks"), "must be at least 1"),
        Some(b) => affinity.max_blocks = b,
        None => {}
    }
    if e.affinity == Some(AffinityKind::Prefix) {
        out.affinity = Some(affinity);
    }
    out
}

/// A pool's capacity probe, checked against the VRAM gate it has to feed:
/// a gate on free VRAM needs a probe that reports it (an Ollama probe with
/// the total VRAM; a vLLM probe never does) and a floor below that total.
fn capacity_probe(
    probe: Option<&ProbeSpec>,
    g: &GatesSpec,
    at: &str,
    errs: &mut Errors,
) -> Option<Probe> {
    if let Some(c) = probe {
        if c.interval_ms == Some(0) {
            errs.push(
                format!("{at}.capacity_probe.interval_ms"),
                "must be positive",
            );
        }
        match c.timeout_ms {
            Some(0) => errs.push(
                format!("{at}.capacity_probe.timeout_ms"),
                "must be positive",
            ),
            Some(v) if v > 3_600_000 => errs.push(
                format!("{at}.capacity_probe.timeout_ms"),
                "must be at most 3600000 (an hour)",
            ),
            _ => {}
        }
        if c.unhealthy_after == Some(0) {
            errs.push(
                format!("{at}.capacity_probe.unhealthy_after"),
                "must be at least 1",
            );
        }
        if c.kind == ProbeKind::Ollama && c.vram_total_mb.is_none() && g.min_vram_free_mb.is_some()
        {
            errs.push(
                format!("{at}.capacity_probe.vram_total_mb"),
                "needed to derive free VRAM for gates.min_vram_free_mb",
            );
        }
        if c.kind != ProbeKind::Ollama && g.min_vram_free_mb.is_some() {
            errs.push(
                format!("{at}.gates.min_vram_free_mb"),
                format!(
                    "a {} probe does not report free VRAM: the gate could never be checked",
                    match c.kind {
                        ProbeKind::Sglang => "sglang",
                        ProbeKind::Tgi => "tgi",
                        _ => "vllm",
                    }
                ),
            );
        }
    }
    if let (Some(min), Some(total)) = (g.min_vram_free_mb, probe.and_then(|c| c.vram_total_mb)) {
        if min >= total {
            errs.push(
                format!("{at}.gates.min_vram_free_mb"),
                format!("{min} MB can never be free on {total} MB: the gate can never hold"),
            );
        }
    }
    if g.min_vram_free_mb.is_some() && probe.is_none() {
        errs.push(
            format!("{at}.gates.min_vram_free_mb"),
            "needs a capacity_probe to measure free VRAM",
        );
    }
    probe.map(|c| Probe {
        kind: c.kind,
        interval: c.interval_ms.map_or(crate::probe::DEFAULT_INTERVAL, |ms| {
            Duration::from_millis(ms.max(1))
        }),
        timeout: c.timeout_ms.map_or(crate::probe::DEFAULT_TIMEOUT, |ms| {
            Duration::from_millis(ms.clamp(1, 3_600_000))
        }),
        unhealthy_after: c
            .unhealthy_after
            .unwrap_or(crate::probe::DEFAULT_UNHEALTHY_AFTER)
            .max(1),
        vram_total_mb: c.vram_total_mb,
    })
}

// ---- One route. ----

/// What a route is checked against: the rest of the document.
struct RouteContext<'a> {
    /// Every pool name, including those of pools with errors.
    pool_names: HashSet<&'a str>,
    /// `spec.defaults`, for routes that set no deadline of their own.
    defaults: RequestDefaults,
}

/// One route: chain, match, cost ceiling, shadowing by an
/// `earlier` catch-all route, deadlines (inherited from `spec.defaults`),
/// retries.
fn route(
    r: &RouteSpec,
    at: &str,
    earlier: &[Route],
    context: &RouteContext<'_>,
    errs: &mut Errors,
) -> Route {
    chain(&r.chain, at, &context.pool_names, errs);
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
    Route {
        name: r.name.clone(),
        matches,
        chain: r.chain.clone(),
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
    }
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

/// A route's chain: not empty, each name a pool, no pool twice.
fn chain(chain: &[String], at: &str, pool_names: &HashSet<&str>, errs: &mut Errors) {
    if chain.is_empty() {
        errs.push(format!("{at}.chain"), "must name at least one pool");
    }
    let mut seen = HashSet::new();
    for (j, name) in chain.iter().enumerate() {
        if !pool_names.contains(name.as_str()) {
            errs.push(format!("{at}.chain[{j}]"), format!("unknown pool {name:?}"));
        } else if !seen.insert(name.as_str()) {
            errs.push(
                format!("{at}.chain[{j}]"),
                format!("pool {name:?} appears twice"),
            );
        }
    }
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

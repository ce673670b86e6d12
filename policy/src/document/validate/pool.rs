//! One pool of `spec.pools`: endpoints, limits, gates, prices, API key,
//! dialect, health checks, ejection, balancing and capacity probe, queue.

use super::*;
use crate::engine_aware::MAX_PREFIX_BLOCKS;

/// One pool: endpoints, limits, model, gates, prices, API key, capacity
/// probe, queue (inherited from `spec.queue`, field by field).
pub(super) fn pool(
    p: &PoolSpec,
    at: &str,
    spec_queue: &QueueSettings,
    guards: &Guards,
    errs: &mut Errors,
) -> Pool {
    let api_keys_env = api_keys(p, at, guards, errs);
    let (endpoints, drained) = endpoints(&p.endpoints, &api_keys_env, at, guards, errs);
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
                errs.push(field, why.to_string());
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
        api_keys_env,
        probe,
        first_token_timeout: millis(
            p.first_token_timeout_ms,
            &format!("{at}.first_token_timeout_ms"),
            errs,
        ),
        stall_timeout: millis(p.stall_timeout_ms, &format!("{at}.stall_timeout_ms"), errs),
        stream_usage: p
            .stream_usage
            .unwrap_or(!matches!(p.provider, super::super::Provider::Tgi)),
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

/// A pool's several keys (`api_keys_env`): at least one, each a variable
/// name the guards allow, none twice, and not with `api_key_env` too.
fn api_keys(p: &PoolSpec, at: &str, guards: &Guards, errs: &mut Errors) -> Vec<String> {
    let Some(names) = &p.api_keys_env else {
        return Vec::new();
    };
    let field = format!("{at}.api_keys_env");
    if p.api_key_env.is_some() {
        errs.push(
            field.clone(),
            "api_key_env and api_keys_env are both set: api_key_env names one key, api_keys_env several; keep one",
        );
    }
    if names.is_empty() {
        errs.push(
            field.clone(),
            "must name at least one variable (leave it out for no key)",
        );
    }
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for (j, env) in names.iter().enumerate() {
        let field = format!("{field}[{j}]");
        if !check_env_name(env, field.clone(), errs) {
            continue;
        }
        if let Err(why) = guards.api_key_env.check(env) {
            errs.push(field, why.to_string());
            continue;
        }
        if out.contains(env) {
            errs.push(field, format!("{env} is listed twice"));
            continue;
        }
        out.push(env.clone());
    }
    out
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
/// (default [`super::super::DEFAULT_AZURE_API_VERSION`]): each a name of
/// letters, digits, `.`, `_` and `-` (it goes in the URL). Either field
/// on a pool of another provider is refused: it would be ignored.
fn azure_deployment(
    p: &PoolSpec,
    at: &str,
    errs: &mut Errors,
) -> Option<super::super::AzureDeployment> {
    fn url_safe(s: &str) -> bool {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    }
    if p.provider != super::super::Provider::AzureOpenai {
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
        .unwrap_or_else(|| super::super::DEFAULT_AZURE_API_VERSION.to_owned());
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
    Some(super::super::AzureDeployment {
        deployment,
        api_version,
    })
}

/// A pool's health checks: the provider's defaults, each field replaced by
/// the one written; the interval and timeout positive, the timeout within
/// the interval (a check never overlaps the next), thresholds at least 1,
/// the path absolute.
fn health_check(
    spec: Option<&super::super::HealthCheckSpec>,
    provider: super::super::Provider,
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
    s: &super::super::OutlierEjectionSpec,
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
/// them and, apart, those drained one by one. With several keys (`keys`),
/// an endpoint that names none stands for one endpoint per key; one that
/// names a key (`https://h#A_API_KEY`) must name one of them (without
/// several keys, none may).
fn endpoints(
    specs: &[EndpointSpec],
    keys: &[String],
    at: &str,
    guards: &Guards,
    errs: &mut Errors,
) -> (Vec<Endpoint>, Vec<Endpoint>) {
    let mut endpoints = Vec::new();
    let mut drained = Vec::new();
    for (j, e) in specs.iter().enumerate() {
        match Endpoint::parse(e.url()) {
            Ok(ep) if ep.key().is_some_and(|k| !keys.iter().any(|x| x == k)) => errs.push(
                format!("{at}.endpoints[{j}]"),
                match keys.is_empty() {
                    true => format!(
                        "names the key {} but the pool has no api_keys_env",
                        ep.key().unwrap_or_default()
                    ),
                    false => format!(
                        "names the key {}, which api_keys_env does not list",
                        ep.key().unwrap_or_default()
                    ),
                },
            ),
            Ok(ep) => {
                if let Some(why) = backend_refusal(&ep, &guards.backend_hosts) {
                    errs.push(format!("{at}.endpoints[{j}]"), why);
                    continue;
                }
                let keyed: Vec<Endpoint> = match (ep.key(), keys.is_empty()) {
                    (None, false) => keys.iter().map(|k| ep.with_key(Some(k))).collect(),
                    _ => vec![ep],
                };
                if let Some(dup) = keyed.iter().find(|k| endpoints.contains(*k)) {
                    errs.push(
                        format!("{at}.endpoints[{j}]"),
                        format!("duplicate endpoint {dup}"),
                    );
                    continue;
                }
                if e.drain() {
                    drained.extend(keyed.iter().cloned());
                }
                endpoints.extend(keyed);
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
        Some(b) if b > MAX_PREFIX_BLOCKS => errs.push(
            format!("{at}.prefix_max_blocks"),
            format!("must be at most {MAX_PREFIX_BLOCKS} (each block is a hash per request per endpoint lookup)"),
        ),
        Some(b) => affinity.max_blocks = b,
        None => {}
    }
    match e.prefix_bytes_per_token {
        Some(r) if !(r.is_finite() && (0.5..=64.0).contains(&r)) => errs.push(
            format!("{at}.prefix_bytes_per_token"),
            "must be between 0.5 and 64 (about 4 for English text)",
        ),
        Some(r) => affinity.bytes_per_token = r,
        None => {}
    }
    match e.prefix_home_slack {
        Some(x) if !(x.is_finite() && (0.0..=10.0).contains(&x)) => errs.push(
            format!("{at}.prefix_home_slack"),
            "must be between 0 and 10 (a fraction of the request's own prefill)",
        ),
        Some(x) => affinity.new_prefix_slack = x,
        None => {}
    }
    match e.prefix_cache_tokens {
        Some(0) => errs.push(format!("{at}.prefix_cache_tokens"), "must be at least 1"),
        Some(t) => affinity.cache_tokens = Some(t),
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

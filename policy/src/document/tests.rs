//! The document's tests: parsing, resolution of defaults, and every
//! validation error with its field path.

use std::time::Duration;

use super::*;
use crate::balance::Scoring;
use crate::endpoint::Endpoint;

const GOOD: &str = r#"
apiVersion: router/v1
kind: RoutingPolicy
metadata: {name: demo}
spec:
  queue: {max_size: 10, timeout_s: 5}
  pools:
    - name: fast
      provider: vllm
      model: small
      endpoints: ["127.0.0.1:9001", "http://127.0.0.1:9002"]
      max_concurrency: 2
    - name: cloud
      endpoints: ["https://api.example.com/v1"]
      queue: {ewma_alpha: 0.5, scoring: lowest_ewma}
  routes:
    - name: chat
      match: {model: ["gpt-*"], path_prefix: /v1}
      chain: [fast, cloud]
    - name: default
      chain: [cloud]
"#;

#[test]
fn parses_and_resolves_defaults() {
    let p = load(GOOD, &QueueSettings::default()).unwrap();
    assert_eq!(p.name, "demo");
    assert_eq!(p.pools.len(), 2);
    let fast = p.pool("fast").unwrap();
    assert_eq!(fast.queue.max_size, 10);
    assert_eq!(fast.queue.timeout, Duration::from_secs(5));
    assert_eq!(fast.queue.ewma_alpha, 0.3);
    assert_eq!(fast.provider, Provider::Vllm);
    let cloud = p.pool("cloud").unwrap();
    assert_eq!(cloud.queue.ewma_alpha, 0.5);
    assert_eq!(cloud.queue.max_size, 10);
    assert_eq!(cloud.queue.scoring, Scoring::LowestEwma);
    assert_eq!(
        p.route_for(Some("gpt-4o"), "/v1/chat/completions")
            .unwrap()
            .name,
        "chat"
    );
    assert_eq!(
        p.route_for(Some("llama"), "/v1/chat/completions")
            .unwrap()
            .name,
        "default"
    );
    assert_eq!(p.route_for(None, "/health").unwrap().name, "default");
}

#[test]
fn json_is_accepted() {
    let doc = PolicyDocument::parse(GOOD).unwrap();
    let json = serde_json::to_string(&doc).unwrap();
    assert_eq!(PolicyDocument::parse(&json).unwrap(), doc);
}

#[test]
fn unknown_field_is_reported_with_its_path() {
    let text = GOOD.replace("max_concurrency: 2", "max_concurency: 2");
    let err = PolicyDocument::parse(&text).unwrap_err();
    assert_eq!(err.errors.len(), 1);
    assert_eq!(err.errors[0].field, "spec.pools[0].max_concurency");
    assert!(err.errors[0].reason.contains("max_concurency"), "{err}");
}

#[test]
fn every_error_at_once() {
    let text = r#"
apiVersion: router/v2
kind: RoutingPolicy
spec:
  queue: {ewma_alpha: 1.5}
  pools:
    - name: a
      endpoints: ["ftp://x:1", "h:1", "h:1"]
      max_concurrency: 0
    - name: a
  routes:
    - name: all
      chain: [a, b]
    - name: never
      match: {model: [x]}
      chain: []
"#;
    let err = load(text, &QueueSettings::default()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "apiVersion",
            "spec.queue.ewma_alpha",
            "spec.pools[0].endpoints[0]",
            "spec.pools[0].endpoints[2]",
            "spec.pools[0].max_concurrency",
            "spec.pools[1].name",
            "spec.routes[0].chain[1]",
            "spec.routes[1].chain",
            "spec.routes[1].match",
        ],
        "{err}"
    );
    assert!(err.to_string().contains("unknown pool \"b\""));
}

#[test]
fn deadlines_retries_and_draining() {
    let text = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  defaults: {deadline_ms: 8000, attempt_timeout_ms: 5000}
  circuit_breaker: {consecutive_errors: 2, open_duration_s: 10}
  pools:
    - name: a
      endpoints: ["h:1", {url: "h:2", drain: true}]
      attempt_timeout_ms: 3000
    - name: b
      endpoints: ["h:3"]
      drain: true
  routes:
    - name: s
      match: {model: [x]}
      chain: [b]
    - name: r
      chain: [a, b]
      retry_on: [timeout, status_429]
      fallback: false
"#;
    let p = load(text, &QueueSettings::default()).unwrap();
    let a = p.pool("a").unwrap();
    assert_eq!(a.attempt_timeout, Some(Duration::from_secs(3)));
    assert_eq!(a.drained, vec![Endpoint::parse("h:2").unwrap()]);
    assert!(p.pool("b").unwrap().drain);
    let r = &p.routes[1];
    assert_eq!(r.deadline, Some(Duration::from_secs(8)));
    assert_eq!(r.attempt_timeout, Some(Duration::from_secs(5)));
    assert_eq!(r.retry_on, vec![RetryOn::Timeout, RetryOn::Status429]);
    assert!(!r.fallback);
    assert!(
        !r.retries_on(RetryOn::Timeout),
        "fallback off: nothing retries"
    );
    assert_eq!(p.routes[0].retry_on, RetryOn::DEFAULT.to_vec());
    assert!(p.routes[0].retries_on(RetryOn::Status5xx));
    assert_eq!(p.circuit.consecutive_errors, 2);

    let bad = text
        .replace("status_429]", "status_418]")
        .replace("8000", "0");
    let err = load(&bad, &QueueSettings::default()).unwrap_err();
    assert_eq!(err.errors[0].field, "spec.routes[1].retry_on[1]");
    assert!(
        err.errors[0]
            .reason
            .starts_with("unknown variant `status_418`"),
        "{err}"
    );
}

/// Every check `validate` makes, each failing once: the field paths,
/// the reasons and their order are the operator-facing contract.
#[test]
fn every_check_reports_its_field_and_reason_in_order() {
    let text = r#"
apiVersion: router/v2
kind: Policy
spec:
  defaults: {deadline_ms: 0, attempt_timeout_ms: 0}
  queue: {max_size: 0, timeout_s: -1, latency_threshold_s: .nan, ewma_alpha: 0}
  circuit_breaker: {consecutive_errors: 0, open_duration_s: 0}
  approval: {token_env: "BAD-NAME", allow_static_token: true}
  structured_output_degrade_s: -5
  pools:
    - name: "bad name"
      model: " "
      endpoints: ["ftp://x:1", "h:1", {url: "h:1", drain: true}]
      attempt_timeout_ms: 0
      max_concurrency: 0
      gates: {max_latency_budget_fraction: 0, min_vram_free_mb: 100}
      price: {input_per_1k_usd: -1, output_per_1k_usd: .inf, cache_write_per_1k_usd: .nan}
      api_key_env: "a-b"
      queue: {max_size: 0, timeout_s: 0, latency_threshold_s: -1, ewma_alpha: 2}
    - name: "bad name"
      endpoints: ["h:2"]
      capacity_probe: {kind: ollama, interval_ms: 0}
      gates: {min_vram_free_mb: 1}
    - name: v
      capacity_probe: {kind: vllm, vram_total_mb: 8}
      gates: {min_vram_free_mb: 8}
    - name: o
      capacity_probe: {kind: ollama, vram_total_mb: 8}
      gates: {min_vram_free_mb: 9}
  routes:
    - name: ""
      match: {model: ["", "*"], path_prefix: "v1"}
      chain: [v, nope, v]
      deadline_ms: 0
      attempt_timeout_ms: 0
      retry_on: [timeout, timeout]
      cost_ceiling_per_call_usd: -0.5
      requires_approval: true
    - name: all
      chain: []
    - name: all
      chain: [o]
"#;
    let err = load(text, &QueueSettings::default()).unwrap_err();
    let got: Vec<(&str, &str)> = err
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.reason.as_str()))
        .collect();
    let want: Vec<(&str, &str)> = vec![
        ("apiVersion", "must be \"router/v1\""),
        ("kind", "must be \"RoutingPolicy\""),
        ("spec.queue.max_size", "must be at least 1"),
        (
            "spec.queue.timeout_s",
            "must be a positive number of seconds",
        ),
        (
            "spec.queue.latency_threshold_s",
            "must be a positive number of seconds",
        ),
        ("spec.queue.ewma_alpha", "must be in (0, 1]"),
        (
            "spec.defaults.deadline_ms",
            "must be a positive number of milliseconds",
        ),
        (
            "spec.defaults.attempt_timeout_ms",
            "must be a positive number of milliseconds",
        ),
        (
            "spec.circuit_breaker.consecutive_errors",
            "must be at least 1",
        ),
        (
            "spec.circuit_breaker.open_duration_s",
            "must be a positive number of seconds",
        ),
        (
            "spec.pools[0].name",
            "must be 1-63 characters of letters, digits, '-', '_' or '.'",
        ),
        (
            "spec.pools[0].endpoints[0]",
            "unsupported scheme \"ftp\" (use http or https)",
        ),
        (
            "spec.pools[0].endpoints[2]",
            "duplicate endpoint http://h:1",
        ),
        (
            "spec.pools[0].attempt_timeout_ms",
            "must be a positive number of milliseconds",
        ),
        (
            "spec.pools[0].max_concurrency",
            "must be at least 1 (leave it out for no limit)",
        ),
        ("spec.pools[0].model", "must not be empty"),
        (
            "spec.pools[0].gates.max_latency_budget_fraction",
            "must be a positive fraction: at 0 or below the gate can never hold",
        ),
        (
            "spec.pools[0].price.input_per_1k_usd",
            "must be a non-negative number",
        ),
        (
            "spec.pools[0].price.output_per_1k_usd",
            "must be a non-negative number",
        ),
        (
            "spec.pools[0].price.cache_write_per_1k_usd",
            "must be a non-negative number",
        ),
        (
            "spec.pools[0].api_key_env",
            "must be an environment variable name",
        ),
        (
            "spec.pools[0].gates.min_vram_free_mb",
            "needs a capacity_probe to measure free VRAM",
        ),
        ("spec.pools[0].queue.max_size", "must be at least 1"),
        (
            "spec.pools[0].queue.timeout_s",
            "must be a positive number of seconds",
        ),
        (
            "spec.pools[0].queue.latency_threshold_s",
            "must be a positive number of seconds",
        ),
        ("spec.pools[0].queue.ewma_alpha", "must be in (0, 1]"),
        (
            "spec.pools[1].name",
            "must be 1-63 characters of letters, digits, '-', '_' or '.'",
        ),
        ("spec.pools[1].name", "duplicate pool name \"bad name\""),
        (
            "spec.pools[1].capacity_probe.interval_ms",
            "must be positive",
        ),
        (
            "spec.pools[1].capacity_probe.vram_total_mb",
            "needed to derive free VRAM for gates.min_vram_free_mb",
        ),
        (
            "spec.pools[2].gates.min_vram_free_mb",
            "a vllm probe does not report free VRAM: the gate could never be checked",
        ),
        (
            "spec.pools[2].gates.min_vram_free_mb",
            "8 MB can never be free on 8 MB: the gate can never hold",
        ),
        (
            "spec.pools[3].gates.min_vram_free_mb",
            "9 MB can never be free on 8 MB: the gate can never hold",
        ),
        (
            "spec.routes[0].name",
            "must be 1-63 characters of letters, digits, '-', '_' or '.'",
        ),
        ("spec.routes[0].chain[1]", "unknown pool \"nope\""),
        ("spec.routes[0].chain[2]", "pool \"v\" appears twice"),
        (
            "spec.routes[0].match.model[0]",
            "empty or bare \"*\" pattern; leave model out to match any model",
        ),
        (
            "spec.routes[0].match.model[1]",
            "empty or bare \"*\" pattern; leave model out to match any model",
        ),
        ("spec.routes[0].match.path_prefix", "must start with '/'"),
        (
            "spec.routes[0].cost_ceiling_per_call_usd",
            "must be a non-negative number",
        ),
        (
            "spec.routes[0].deadline_ms",
            "must be a positive number of milliseconds",
        ),
        (
            "spec.routes[0].attempt_timeout_ms",
            "must be a positive number of milliseconds",
        ),
        ("spec.routes[0].retry_on[1]", "listed twice"),
        ("spec.routes[1].chain", "must name at least one pool"),
        ("spec.routes[2].name", "duplicate route name \"all\""),
        (
            "spec.routes[2].match",
            "can never match: route \"all\" before it matches every request",
        ),
        (
            "spec.structured_output_degrade_s",
            "must be a positive number of seconds",
        ),
        (
            "spec.approval.token_env",
            "must be an environment variable name",
        ),
    ];
    assert_eq!(got, want, "{err}");

    // The checks that need what the first document has: no pools or
    // routes at all; a static approval token without its opt-in.
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec: {}\n";
    let err = load(text, &QueueSettings::default()).unwrap_err();
    assert_eq!(
        err.errors,
        vec![
            FieldError {
                field: "spec.pools".into(),
                reason: "at least one pool is required".into(),
            },
            FieldError {
                field: "spec.routes".into(),
                reason: "at least one route is required".into(),
            },
        ]
    );
    let text = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  approval: {token_env: ROUTER_APPROVAL_TOKEN}
  pools: [{name: a}]
  routes: [{name: r, chain: [a], requires_approval: true}]
"#;
    let err = load(text, &QueueSettings::default()).unwrap_err();
    assert_eq!(err.errors.len(), 1, "{err}");
    assert_eq!(err.errors[0].field, "spec.approval.token_env");
    assert!(
        err.errors[0].reason.contains("routerctl approve")
            && err.errors[0].reason.contains("allow_static_token: true"),
        "{err}"
    );
    // An approval route needs no section: signed approvals are checked
    // with the proxy's key.
    let text = text.replace("  approval: {token_env: ROUTER_APPROVAL_TOKEN}\n", "");
    let policy = load(&text, &QueueSettings::default()).expect("valid");
    assert!(policy.routes[0].requires_approval);
    assert_eq!(policy.approval_token_env, None);
}

#[test]
fn sidecar_policy_has_one_default_route() {
    let p = Policy::sidecar(QueueSettings::default(), None);
    let route = p.route_for(Some("m"), "/x").unwrap();
    assert_eq!(route.pools().collect::<Vec<_>>(), vec!["default"]);
    assert!(p.pool("default").unwrap().endpoints.is_empty());
}

/// A pool asking for a variable the guards do not allow, beside an
/// endpoint of the author's own (the attack: the proxy would read the
/// variable and send it there).
const KEY_POOL: &str = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: exfil
      endpoints: ["https://collector.example.net/v1"]
      api_key_env: AWS_SECRET_ACCESS_KEY
  routes:
    - name: r
      chain: [exfil]
"#;

#[test]
fn an_api_key_variable_the_guards_do_not_allow_is_refused_with_field_and_reason() {
    let err = load(KEY_POOL, &QueueSettings::default()).unwrap_err();
    assert_eq!(err.errors.len(), 1, "{err}");
    assert_eq!(err.errors[0].field, "spec.pools[0].api_key_env");
    let reason = &err.errors[0].reason;
    assert!(
        reason.contains("AWS_SECRET_ACCESS_KEY") && reason.contains("_API_KEY"),
        "{reason}"
    );
    assert!(
        reason.contains(crate::guard::API_KEY_ENV_ALLOW_VAR),
        "{reason}"
    );
    // Names ending in _API_KEY pass by default.
    let ok = KEY_POOL.replace("AWS_SECRET_ACCESS_KEY", "COLLECTOR_API_KEY");
    assert!(load(&ok, &QueueSettings::default()).is_ok());
    // The operator's list extends the rule (names or PREFIX*).
    let guards = Guards {
        api_key_env: crate::guard::EnvAllowList::parse("AWS_*").unwrap(),
        ..Guards::default()
    };
    assert!(load_with(KEY_POOL, &QueueSettings::default(), &guards).is_ok());
}

#[test]
fn several_keys_make_each_endpoint_one_per_key() {
    let text = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: cloud
      endpoints:
        - https://api.openai.com/v1
        - {url: "https://eu.api.openai.com/v1", drain: true}
        - https://b.example.com#B_API_KEY
      api_keys_env: [A_API_KEY, B_API_KEY]
  routes:
    - name: r
      chain: [cloud]
"#;
    let p = load(text, &QueueSettings::default()).unwrap();
    let pool = &p.pools[0];
    assert_eq!(pool.api_keys_env, ["A_API_KEY", "B_API_KEY"]);
    let names: Vec<String> = pool.endpoints.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        names,
        [
            "https://api.openai.com/v1#A_API_KEY",
            "https://api.openai.com/v1#B_API_KEY",
            "https://eu.api.openai.com/v1#A_API_KEY",
            "https://eu.api.openai.com/v1#B_API_KEY",
            "https://b.example.com#B_API_KEY",
        ]
    );
    assert_eq!(pool.drained.len(), 2);
    assert!(pool.drained.iter().all(|e| e.host() == "eu.api.openai.com"));
    // set-backends' plain addresses are made one per key the same way.
    let plain = [Endpoint::parse("10.0.0.1:80").unwrap()];
    let keyed: Vec<String> = pool.keyed(&plain).iter().map(|e| e.to_string()).collect();
    assert_eq!(
        keyed,
        [
            "http://10.0.0.1:80#A_API_KEY",
            "http://10.0.0.1:80#B_API_KEY"
        ]
    );
}

#[test]
fn several_keys_errors_name_their_field_and_reason() {
    let text = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: both
      endpoints: ["https://api.openai.com"]
      api_key_env: A_API_KEY
      api_keys_env: [B_API_KEY]
    - name: empty
      api_keys_env: []
    - name: twice
      api_keys_env: [A_API_KEY, A_API_KEY, "not a name", AWS_SECRET_ACCESS_KEY]
    - name: stranger
      endpoints: ["https://h#C_API_KEY", "https://h2#X_API_KEY"]
      api_keys_env: [C_API_KEY]
    - name: one
      endpoints: ["https://h#C_API_KEY", "https://h3#bad-name"]
  routes:
    - name: r
      chain: [both]
"#;
    let err = load(text, &QueueSettings::default()).unwrap_err();
    let got: Vec<(&str, &str)> = err
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.reason.as_str()))
        .collect();
    let fields: Vec<&str> = got.iter().map(|(f, _)| *f).collect();
    assert_eq!(
        fields,
        [
            "spec.pools[0].api_keys_env",
            "spec.pools[1].api_keys_env",
            "spec.pools[2].api_keys_env[1]",
            "spec.pools[2].api_keys_env[2]",
            "spec.pools[2].api_keys_env[3]",
            "spec.pools[3].endpoints[1]",
            "spec.pools[4].endpoints[0]",
            "spec.pools[4].endpoints[1]",
        ],
        "{err}"
    );
    assert!(got[0].1.contains("both set"), "{}", got[0].1);
    assert!(got[1].1.contains("at least one"), "{}", got[1].1);
    assert!(got[2].1.contains("twice"), "{}", got[2].1);
    assert!(got[4].1.contains("AWS_SECRET_ACCESS_KEY"), "{}", got[4].1);
    assert!(
        got[5].1.contains("X_API_KEY") && got[5].1.contains("does not list"),
        "{}",
        got[5].1
    );
    assert!(got[6].1.contains("no api_keys_env"), "{}", got[6].1);
    assert!(got[7].1.contains("bad-name"), "{}", got[7].1);
}

#[test]
fn a_link_local_or_metadata_endpoint_is_refused_unless_the_guards_name_it() {
    let text = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: p
      endpoints: ["127.0.0.1:9001", "http://169.254.169.254/latest", "http://[fd00:ec2::254]:80",
                  "http://[fe80::1]:8000", "http://2852039166:80"]
  routes:
    - name: r
      chain: [p]
"#;
    let err = load(text, &QueueSettings::default()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.pools[0].endpoints[1]",
            "spec.pools[0].endpoints[2]",
            "spec.pools[0].endpoints[3]",
            "spec.pools[0].endpoints[4]",
        ]
    );
    assert!(
        err.errors[0]
            .reason
            .contains("169.254.169.254 is a link-local address"),
        "{err}"
    );
    assert!(
        err.errors[0]
            .reason
            .contains(crate::guard::ALLOW_BACKEND_HOSTS_VAR),
        "{err}"
    );
    let guards = Guards {
        backend_hosts: crate::guard::HostAllowList::parse("169.254.169.254,fd00:ec2::254,fe80::1")
            .unwrap(),
        ..Guards::default()
    };
    let p = load_with(text, &QueueSettings::default(), &guards).unwrap();
    assert_eq!(p.pools[0].endpoints.len(), 5);
}

/// Issue 20, item 4: shape errors come all at once (serde stops at the
/// first), each path once, a misspelt field with the name it resembles.
#[test]
fn every_shape_error_at_once_with_did_you_mean() {
    let text = "apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: a
      max_concurency: 4
      max_concurrency: lots
    - name: b
      modle: x
      colour: red
  routes:
    - name: r
      chain: [a, b]
      retry_onn: [timeout]
";
    let err = PolicyDocument::parse(text).unwrap_err();
    let got: Vec<(&str, &str)> = err
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "spec.pools[0].max_concurency",
                "unknown field `max_concurency`; did you mean `max_concurrency`? at line 6 column 7"
            ),
            (
                "spec.pools[0].max_concurrency",
                "invalid type: string \"lots\", expected u32"
            ),
            (
                "spec.pools[1].modle",
                "unknown field `modle`; did you mean `model`?"
            ),
            (
                "spec.pools[1].colour",
                "unknown field `colour`, expected one of `name`, `provider`, `model`, `endpoints`, `max_concurrency`, `attempt_timeout_ms`, `drain`, `gates`, `structured_output`, `price`, `api_key_env`, `api_keys_env`, `capacity_probe`, `queue`, `first_token_timeout_ms`, `stall_timeout_ms`, `stream_usage`, `deployment`, `api_version`, `balance`, `engine_aware`, `health_check`, `outlier_ejection`, `session_affinity`"
            ),
            (
                "spec.routes[0].retry_onn",
                "unknown field `retry_onn`; did you mean `retry_on`?"
            ),
        ],
        "{err}"
    );
    assert!(
        err.to_string().starts_with("invalid policy (5 errors): "),
        "{err}"
    );
    // No reason repeats its field's path.
    for e in &err.errors {
        assert!(!e.reason.contains("spec."), "{e}");
    }
}

/// A required field removed for its wrong type is not reported again as
/// missing; a JSON document gets the same treatment.
#[test]
fn a_removed_field_is_not_reported_missing_and_json_is_read_the_same_way() {
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: [not, a, name]\n      colour: red\n  routes: []\n";
    let err = PolicyDocument::parse(text).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.pools[0].name", "spec.pools[0].colour"],
        "{err}"
    );
    assert!(!err.to_string().contains("missing field"), "{err}");
    let json = r#"{"apiVersion": "router/v1", "kind": "RoutingPolicy", "spec": {"pools": [{"name": "a", "endpoitns": []}], "routes": [{"name": "r", "chian": ["a"]}]}}"#;
    let err = PolicyDocument::parse(json).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.pools[0].endpoitns", "spec.routes[0].chian"],
        "{err}"
    );
    assert!(
        err.errors[0].reason.contains("did you mean `endpoints`?"),
        "{err}"
    );
    assert!(
        err.errors[1].reason.contains("did you mean `chain`?"),
        "{err}"
    );
}

/// Misspelt fields and the rest of the document's problems come in one
/// answer: validation runs on the document without the unknown fields.
#[test]
fn misspelt_fields_and_validation_errors_come_together() {
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: a, max_concurency: 4}\n  routes:\n    - {name: r, chain: [b]}\n";
    let err = load(text, &QueueSettings::default()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.pools[0].max_concurency", "spec.routes[0].chain[0]"],
        "{err}"
    );
    // A wrong type is not repaired: what validation would say of the rest
    // could only be guessed.
    let text = text.replace("max_concurency: 4", "max_concurrency: lots");
    let err = load(&text, &QueueSettings::default()).unwrap_err();
    assert_eq!(err.errors.len(), 1, "{err}");
}

#[test]
fn balance_engine_aware_with_prefix_affinity_resolves_and_wins_over_queue_scoring() {
    use crate::engine_aware::{EngineAware, PrefixAffinity};
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  queue: {scoring: lowest_ewma}\n  pools:\n    - name: gpus\n      balance: engine_aware\n      engine_aware: {affinity: prefix, max_waiting: 3, load_factor: 1.5}\n      capacity_probe: {kind: sglang, interval_ms: 100}\n    - {name: plain, balance: round_robin}\n    - {name: default}\n  routes:\n    - {name: r, chain: [gpus, plain, default]}\n";
    let p = load(text, &QueueSettings::default()).unwrap();
    let gpus = p.pool("gpus").unwrap();
    assert_eq!(gpus.queue.scoring, Scoring::EngineAware);
    assert_eq!(
        gpus.queue.engine,
        EngineAware {
            max_waiting: 3,
            max_kv_usage: 0.8,
            affinity: Some(PrefixAffinity {
                load_factor: 1.5,
                ..PrefixAffinity::default()
            }),
        }
    );
    assert_eq!(gpus.probe.unwrap().kind, ProbeKind::Sglang);
    assert_eq!(p.pool("plain").unwrap().queue.scoring, Scoring::RoundRobin);
    assert_eq!(
        p.pool("default").unwrap().queue.scoring,
        Scoring::LowestEwma
    );
}

#[test]
fn engine_aware_errors_name_their_field() {
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: a\n      balance: engine_aware\n      engine_aware: {max_kv_usage: 1.5, load_factor: 1.0, prefix_block_bytes: 0, prefix_max_blocks: 0, prefix_bytes_per_token: 0.1, prefix_cache_tokens: 0, prefix_home_slack: -1}\n    - name: b\n      engine_aware: {affinity: prefix}\n  routes:\n    - {name: r, chain: [a, b]}\n";
    let err = load(text, &QueueSettings::default()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.pools[0].engine_aware.max_kv_usage",
            "spec.pools[0].engine_aware.load_factor",
            "spec.pools[0].engine_aware.prefix_block_bytes",
            "spec.pools[0].engine_aware.prefix_max_blocks",
            "spec.pools[0].engine_aware.prefix_bytes_per_token",
            "spec.pools[0].engine_aware.prefix_home_slack",
            "spec.pools[0].engine_aware.prefix_cache_tokens",
            "spec.pools[1].engine_aware",
        ],
        "{err}"
    );
    let bad = text.replace("balance: engine_aware", "balance: fastest");
    let err = load(&bad, &QueueSettings::default()).unwrap_err();
    assert!(err.errors[0].field.contains("balance"), "{err}");
    // A chain of more blocks than the fleet's messages carry is refused.
    let long = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: a\n      balance: engine_aware\n      engine_aware: {affinity: prefix, prefix_max_blocks: 4097}\n  routes:\n    - {name: r, chain: [a]}\n";
    let err = load(long, &QueueSettings::default()).unwrap_err();
    assert_eq!(
        err.errors[0].field, "spec.pools[0].engine_aware.prefix_max_blocks",
        "{err}"
    );
    assert!(err.errors[0].reason.contains("at most 4096"), "{err}");
}

#[test]
fn health_checks_default_by_provider_and_errors_name_their_field() {
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: local, provider: ollama}\n    - {name: cloud}\n    - {name: tuned, provider: vllm, health_check: {path: /ready, interval_ms: 500, timeout_ms: 100, unhealthy_after: 1, healthy_after: 4}, outlier_ejection: {max_ejection_percent: 30}}\n    - {name: quiet, provider: tgi, health_check: {enabled: false}}\n    - {name: asked, health_check: {}}\n  routes:\n    - {name: r, chain: [local, cloud, tuned, quiet, asked]}\n";
    let p = load(text, &QueueSettings::default()).expect("valid");
    let local = p.pool("local").unwrap().health_check.clone().unwrap();
    assert_eq!(local.path, "/api/tags");
    assert_eq!(local.interval, crate::health::DEFAULT_INTERVAL);
    assert!(
        p.pool("cloud").unwrap().health_check.is_none(),
        "openai: off unless set"
    );
    let tuned = p.pool("tuned").unwrap();
    let hc = tuned.health_check.clone().unwrap();
    assert_eq!(
        (
            hc.path.as_str(),
            hc.interval,
            hc.timeout,
            hc.unhealthy_after,
            hc.healthy_after
        ),
        (
            "/ready",
            Duration::from_millis(500),
            Duration::from_millis(100),
            1,
            4
        )
    );
    assert_eq!(tuned.outlier_ejection.unwrap().max_ejection_percent, 30);
    assert!(
        p.pool("local").unwrap().outlier_ejection.is_none(),
        "off unless set"
    );
    assert!(p.pool("quiet").unwrap().health_check.is_none());
    assert_eq!(
        p.pool("asked").unwrap().health_check.clone().unwrap().path,
        "/v1/models"
    );

    let bad = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: a, provider: vllm, health_check: {path: health, interval_ms: 100, timeout_ms: 200, unhealthy_after: 0}, outlier_ejection: {min_error_rate: 1.5, ratio: 0.5, max_ejection_percent: 101, window_ms: 0}}\n  routes:\n    - {name: r, chain: [a]}\n";
    let err = load(bad, &QueueSettings::default()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.pools[0].health_check.path",
            "spec.pools[0].health_check.timeout_ms",
            "spec.pools[0].health_check.unhealthy_after",
            "spec.pools[0].outlier_ejection.window_ms",
            "spec.pools[0].outlier_ejection.min_error_rate",
            "spec.pools[0].outlier_ejection.ratio",
            "spec.pools[0].outlier_ejection.max_ejection_percent",
        ],
        "{err}"
    );
}

/// Issue 28, item 17: a capacity probe's timeout is its own setting (1 s
/// by default, whatever the interval), and how many failures in a row make
/// an endpoint unusable is set beside it.
#[test]
fn a_capacity_probe_has_its_own_timeout_and_failure_count() {
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: fast, capacity_probe: {kind: vllm, interval_ms: 50}}\n    - {name: tuned, capacity_probe: {kind: sglang, interval_ms: 100, timeout_ms: 2500, unhealthy_after: 5}}\n    - {name: plain, capacity_probe: {kind: tgi}}\n  routes:\n    - {name: r, chain: [fast, tuned, plain]}\n";
    let p = load(text, &QueueSettings::default()).expect("valid");
    let probe = |name: &str| p.pool(name).unwrap().probe.unwrap();
    let fast = probe("fast");
    assert_eq!(fast.interval, Duration::from_millis(50));
    assert_eq!(fast.timeout, crate::probe::DEFAULT_TIMEOUT);
    assert_eq!(fast.timeout, Duration::from_secs(1), "not the interval");
    assert_eq!(fast.unhealthy_after, 3);
    let tuned = probe("tuned");
    assert_eq!(
        (tuned.interval, tuned.timeout, tuned.unhealthy_after),
        (Duration::from_millis(100), Duration::from_millis(2500), 5)
    );
    let plain = probe("plain");
    assert_eq!(
        (plain.interval, plain.timeout),
        (Duration::from_secs(1), Duration::from_secs(1))
    );

    let bad = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: a, capacity_probe: {kind: vllm, timeout_ms: 0, unhealthy_after: 0}}\n    - {name: b, capacity_probe: {kind: vllm, timeout_ms: 3600001}}\n  routes:\n    - {name: r, chain: [a, b]}\n";
    let err = load(bad, &QueueSettings::default()).unwrap_err();
    let fields: Vec<(&str, &str)> = err
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            (
                "spec.pools[0].capacity_probe.timeout_ms",
                "must be positive"
            ),
            (
                "spec.pools[0].capacity_probe.unhealthy_after",
                "must be at least 1"
            ),
            (
                "spec.pools[1].capacity_probe.timeout_ms",
                "must be at most 3600000 (an hour)"
            ),
        ],
        "{err}"
    );
}

const PARKING: &str = r#"
apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["127.0.0.1:9001"]
  routes:
    - name: governed
      match: {risk: [SEND, DESTRUCTIVE]}
      chain: [only]
      on_all_down: park
    - name: default
      chain: [only]
      on_all_down: park
      park: {ttl_s: 600, max_tasks: 5, max_bytes: 1000000}
"#;

#[test]
fn parking_routes_resolve_their_bounds_and_explain_when_they_park() {
    let p = load(PARKING, &QueueSettings::default()).unwrap();
    let governed = p.routes[0].park.unwrap();
    assert_eq!(governed.ttl, ParkSettings::DEFAULT_TTL);
    assert_eq!(governed.max_tasks, ParkSettings::DEFAULT_MAX_TASKS);
    assert_eq!(governed.max_bytes, 64 * 1024 * 1024);
    let default = p.routes[1].park.unwrap();
    assert_eq!(default.ttl, Duration::from_secs(600));
    assert_eq!(default.max_tasks, 5);
    assert_eq!(default.max_bytes, 1_000_000);
    // Every pool down: the explanation says the request parks, and how.
    let down = |risk: &str| {
        let s: crate::decide::Situation = serde_json::from_str(&format!(
            r#"{{"risk": "{risk}", "pools": {{"only": {{"healthy": false}}}}}}"#
        ))
        .unwrap();
        crate::decide::explain(&p, &s)
    };
    let read = down("READ");
    let park = read.on_all_down.as_ref().unwrap();
    assert!(park.parks_now);
    assert_eq!(park.state, "waiting_capacity");
    assert!(
        read.reason
            .contains("parked as a task (waiting_capacity) for up to 600 s"),
        "{}",
        read.reason
    );
    let send = down("SEND");
    assert_eq!(send.on_all_down.as_ref().unwrap().state, "waiting_approval");
    assert!(
        send.reason.contains("only after an operator approves it"),
        "{}",
        send.reason
    );
    // A healthy pool: the route would park, but does not now.
    let s: crate::decide::Situation = serde_json::from_str(r#"{"risk": "READ"}"#).unwrap();
    let up = crate::decide::explain(&p, &s);
    assert!(!up.on_all_down.unwrap().parks_now);
    assert!(!up.reason.contains("park"));
}

#[test]
fn parking_bounds_are_checked() {
    let text = PARKING
        .replace(
            "park: {ttl_s: 600, max_tasks: 5, max_bytes: 1000000}",
            "park: {ttl_s: 0, max_tasks: 0, max_bytes: 0}",
        )
        .replace(
            "      on_all_down: park\n    - name: default",
            "      park: {ttl_s: 5}\n    - name: default",
        );
    let err = load(&text, &QueueSettings::default()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.routes[0].park",
            "spec.routes[1].park.ttl_s",
            "spec.routes[1].park.max_tasks",
            "spec.routes[1].park.max_bytes"
        ],
        "{err}"
    );
    let unknown = PARKING.replace(
        "on_all_down: park\n      park",
        "on_all_down: queue\n      park",
    );
    assert!(PolicyDocument::parse(&unknown).is_err());
}

#[test]
fn the_served_models_are_the_names_routes_take_and_pools_serve() {
    let yaml = r#"
apiVersion: router/v1
kind: RoutingPolicy
metadata: {name: models}
spec:
  pools:
    - {name: claude, model: claude-sonnet-4-5, endpoints: ["127.0.0.1:9001"]}
    - {name: local, model: qwen3, endpoints: ["127.0.0.1:9002"]}
    - {name: other, model: llama3, endpoints: ["127.0.0.1:9003"]}
  routes:
    - name: agents
      match: {model: ["claude-sonnet-4-5", "claude-*", "claude-haiku-4-5"]}
      chain: [claude, local]
    - name: chat
      match: {model: ["gpt-4o"], path_prefix: /v1/chat}
      chain: [local]
    - name: only-llama
      match: {model: ["llama3"], path_prefix: /v1/embeddings}
      chain: [other]
"#;
    let p = load(yaml, &QueueSettings::default()).unwrap();
    // Exact names in order, then the chain's pool models; a pattern names
    // none; `qwen3` is a pool's model, but no route takes a request for it;
    // `llama3` is routed on /v1/embeddings only.
    assert_eq!(
        p.served_models("/v1/chat/completions", |_| true),
        vec!["claude-sonnet-4-5", "claude-haiku-4-5", "gpt-4o"]
    );
    assert_eq!(
        p.served_models("/v1/embeddings", |_| true),
        vec!["claude-sonnet-4-5", "claude-haiku-4-5", "llama3"]
    );
    // A tenant that may use `chat` only sees its models.
    assert_eq!(
        p.served_models("/v1/chat/completions", |r| r.name == "chat"),
        vec!["gpt-4o"]
    );
    // A catch-all route names its pools' models; the sidecar names none.
    let catch_all = yaml.replace(
        "match: {model: [\"llama3\"], path_prefix: /v1/embeddings}",
        "match: {}",
    );
    let p = load(&catch_all, &QueueSettings::default()).unwrap();
    assert_eq!(
        p.served_models("/v1/chat/completions", |_| true),
        vec![
            "claude-sonnet-4-5",
            "claude-haiku-4-5",
            "qwen3",
            "gpt-4o",
            "llama3"
        ]
    );
    let sidecar = Policy::sidecar(QueueSettings::default(), None);
    assert!(sidecar
        .served_models("/v1/chat/completions", |_| true)
        .is_empty());
}

#[test]
fn session_affinity_names_a_header_and_a_load_factor_of_at_least_one() {
    let text = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: a, session_affinity: {header: X-Claude-Code-Session-Id}}\n    - {name: b, session_affinity: {header: x-session, load_factor: 2}}\n    - {name: c}\n  routes:\n    - {name: r, chain: [a, b, c]}\n";
    let p = load(text, &QueueSettings::default()).expect("valid");
    let a = p.pool("a").unwrap().session_affinity.clone().unwrap();
    assert_eq!(a.header, "x-claude-code-session-id");
    assert_eq!(a.load_factor, crate::affinity::DEFAULT_SESSION_LOAD_FACTOR);
    assert_eq!(
        p.pool("b")
            .unwrap()
            .session_affinity
            .clone()
            .unwrap()
            .load_factor,
        2.0
    );
    assert!(p.pool("c").unwrap().session_affinity.is_none());
    let bad = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: a, session_affinity: {header: \"bad header\", load_factor: 0.5}}\n  routes:\n    - {name: r, chain: [a]}\n";
    let err = load(bad, &QueueSettings::default()).unwrap_err();
    let found: Vec<(&str, &str)> = err
        .errors
        .iter()
        .map(|e| (e.field.as_str(), e.reason.as_str()))
        .collect();
    assert!(
        found.contains(&(
            "spec.pools[0].session_affinity.header",
            "\"bad header\" is not a header name"
        )),
        "{found:?}"
    );
    assert!(
        found.contains(&(
            "spec.pools[0].session_affinity.load_factor",
            "must be at least 1 (the pool's average load)"
        )),
        "{found:?}"
    );
    // A missing header is a parse error naming the field.
    let missing = load(
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: b, session_affinity: {load_factor: 2}}\n  routes:\n    - {name: r, chain: [b]}\n",
        &QueueSettings::default(),
    )
    .unwrap_err();
    assert!(missing.to_string().contains("header"), "{missing}");
}

#[test]
fn an_azure_pool_needs_its_deployment_and_defaults_its_api_version() {
    let doc = |pools: &str| {
        format!("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n{pools}  routes:\n    - {{name: r, chain: [a]}}\n")
    };
    let p = load(
        &doc("    - {name: a, provider: azure_openai, deployment: gpt-4o-prod, endpoints: [\"https://x.openai.azure.com\"]}\n    - {name: g, provider: gemini}\n"),
        &QueueSettings::default(),
    )
    .expect("valid");
    let a = p.pool("a").unwrap();
    assert_eq!(a.provider, Provider::AzureOpenai);
    assert_eq!(
        a.azure,
        Some(AzureDeployment {
            deployment: "gpt-4o-prod".into(),
            api_version: DEFAULT_AZURE_API_VERSION.into(),
        })
    );
    assert!(a.provider.speaks_openai());
    assert_eq!(a.provider.as_str(), "azure_openai");
    let g = p.pool("g").unwrap();
    assert!(g.provider.is_gemini() && !g.provider.speaks_openai());
    assert_eq!(g.azure, None);
    let p = load(
        &doc("    - {name: a, provider: azure_openai, deployment: d, api_version: 2025-04-01-preview}\n"),
        &QueueSettings::default(),
    )
    .expect("valid");
    assert_eq!(
        p.pool("a").unwrap().azure.as_ref().unwrap().api_version,
        "2025-04-01-preview"
    );

    // Missing, not a name, or on another provider: refused, naming the field.
    let err = load(
        &doc("    - {name: a, provider: azure_openai}\n    - {name: b, provider: azure_openai, deployment: \"x/../y\", api_version: \"1?x=2\"}\n    - {name: c, deployment: d, api_version: v}\n"),
        &QueueSettings::default(),
    )
    .unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.pools[0].deployment",
            "spec.pools[1].api_version",
            "spec.pools[1].deployment",
            "spec.pools[2].deployment",
            "spec.pools[2].api_version",
        ],
        "{err}"
    );
    assert!(
        err.errors[0]
            .reason
            .contains("required with provider: azure_openai"),
        "{err}"
    );
}

/// Issue 34: a route's cache, resolved with its defaults, and every
/// mistake refused with its field (a SEND-only route may not cache).
#[test]
fn a_routes_cache_resolves_and_its_mistakes_are_refused_with_their_fields() {
    let base = PARKING.replace("      on_all_down: park\n", "");
    let text = base
        .replace("      park: {ttl_s: 600, max_tasks: 5, max_bytes: 1000000}\n", "")
        .replace(
            "    - name: default\n      chain: [only]\n",
            "    - name: default\n      chain: [only]\n      cache: {ttl_s: 300, partition: \"header:X-Team\"}\n",
        );
    let p = load(&text, &QueueSettings::default()).unwrap();
    let c = p.routes[1].cache.clone().unwrap();
    assert_eq!(c.ttl, Duration::from_secs(300));
    assert_eq!(
        c.max_entry_bytes,
        crate::cache::CacheSettings::DEFAULT_MAX_ENTRY_BYTES
    );
    assert_eq!(
        c.partition,
        crate::cache::Partition::Header("x-team".into())
    );
    assert!(!c.sampled);
    assert!(
        c.rate_limit_hits,
        "hits count against the request rate by default"
    );
    assert!(p.routes[0].cache.is_none(), "off by default");
    let bad = text
        .replace(
            "      match: {risk: [SEND, DESTRUCTIVE]}\n      chain: [only]\n",
            "      match: {risk: [SEND, DESTRUCTIVE]}\n      chain: [only]\n      cache: {ttl_s: 60}\n",
        )
        .replace(
            "cache: {ttl_s: 300, partition: \"header:X-Team\"}",
            "cache: {ttl_s: 0, max_entry_bytes: 0, partition: everyone}",
        );
    let err = load(&bad, &QueueSettings::default()).unwrap_err();
    let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.routes[0].cache",
            "spec.routes[1].cache.ttl_s",
            "spec.routes[1].cache.max_entry_bytes",
            "spec.routes[1].cache.partition",
        ],
        "{err}"
    );
    let missing = text.replace("ttl_s: 300, ", "");
    let err = load(&missing, &QueueSettings::default()).unwrap_err();
    assert_eq!(err.errors[0].field, "spec.routes[1].cache.ttl_s", "{err}");
    let unknown = text.replace("ttl_s: 300", "ttl_s: 300, semantic: true");
    assert!(load(&unknown, &QueueSettings::default()).is_err());
}

const SPLIT: &str = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: new}\n    - {name: old}\n    - {name: fallback}\n  routes:\n    - name: r\n      chain: [{split: [{pool: new, weight: 10}, {pool: old, weight: 90}], sticky: tenant}, fallback]\n";

#[test]
fn a_split_step_parses_validates_and_lists_its_pools() {
    let p = load(SPLIT, &QueueSettings::default()).unwrap();
    let r = &p.routes[0];
    assert_eq!(r.pools().collect::<Vec<_>>(), ["new", "old", "fallback"]);
    assert_eq!(r.pool_count(), 3);
    assert_eq!(r.pool_at(2), Some("fallback"));
    assert_eq!(r.pool_at(3), None);
    let ChainStep::Split(s) = &r.chain[0] else {
        panic!("{:?}", r.chain)
    };
    assert_eq!(s.sticky, crate::split::Sticky::Tenant);
    assert_eq!(s.total(), 100);
    assert_eq!(r.chain[1], ChainStep::Pool("fallback".into()));
    // The order of one request: its side, the other side, then the chain.
    let order = r.order(&crate::split::SplitKeys {
        tenant: Some("acme"),
        ..Default::default()
    });
    let positions: Vec<usize> = order.iter().collect();
    assert_eq!(positions.len(), 3);
    assert_eq!(positions[2], 2);
    assert_eq!(order.splits.len(), 1);
    assert_eq!(order.first(), Some(order.splits[0].at));
    assert_eq!(order.splits[0].key, crate::split::KeyKind::Tenant);
}

#[test]
fn a_chain_of_names_reads_and_writes_as_it_always_did() {
    let doc = PolicyDocument::parse(GOOD).unwrap();
    assert_eq!(
        doc.spec.routes[0].chain,
        [ChainStepSpec::from("fast"), ChainStepSpec::from("cloud")]
    );
    let json = serde_json::to_value(&doc.spec.routes[0]).unwrap();
    assert_eq!(json["chain"], serde_json::json!(["fast", "cloud"]));
    let yaml = serde_yaml_ng::to_string(&doc.spec.routes[1]).unwrap();
    assert!(yaml.contains("chain:\n- cloud\n"), "{yaml}");
    // A split writes back as written, and reads again to the same.
    let split = PolicyDocument::parse(SPLIT).unwrap();
    let text = serde_json::to_string(&split).unwrap();
    assert!(
        text.contains(r#""chain":[{"split":[{"pool":"new","weight":10},{"pool":"old","weight":90}],"sticky":"tenant"},"fallback"]"#),
        "{text}"
    );
    assert_eq!(PolicyDocument::parse(&text).unwrap(), split);
    // A pool whose name YAML reads as a number is still a name.
    let numbered = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{name: \"7\"}]\n  routes: [{name: r, chain: [7]}]\n";
    let p = load(numbered, &QueueSettings::default()).unwrap();
    assert_eq!(p.routes[0].first_pool(), Some("7"));
}

#[test]
fn every_split_error_names_its_field_and_reason() {
    let bad = |chain: &str| {
        let text = format!("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {{name: a}}\n    - {{name: b}}\n    - {{name: c}}\n  routes:\n    - name: r\n      chain: {chain}\n");
        load(&text, &QueueSettings::default())
            .unwrap_err()
            .errors
            .into_iter()
            .map(|e| (e.field, e.reason))
            .collect::<Vec<_>>()
    };
    let one = |field: &str, reason: &str| vec![(field.to_string(), reason.to_string())];
    assert_eq!(
        bad("[{split: [{pool: a, weight: 0}, {pool: b, weight: 0}]}]"),
        one(
            "spec.routes[0].chain[0].split",
            "the weights are all 0: at least one side must take traffic"
        )
    );
    assert_eq!(
        bad("[{split: [{pool: a, weight: 100}]}]"),
        one(
            "spec.routes[0].chain[0].split",
            "a split needs at least two sides (a single pool is written as its name)"
        )
    );
    assert_eq!(
        bad("[{split: [{pool: a, weight: 1}, {pool: b, weight: 1}], sticky: session}]"),
        one(
            "spec.routes[0].chain[0].sticky",
            "\"session\" is not request_id, tenant or header:<name>"
        )
    );
    // A pool twice in one chain, a split's side counting.
    assert_eq!(
        bad("[a, {split: [{pool: b, weight: 1}, {pool: a, weight: 1}]}]"),
        one(
            "spec.routes[0].chain[1].split[1].pool",
            "pool \"a\" appears twice"
        )
    );
    assert_eq!(
        bad("[{split: [{pool: a, weight: 1}, {pool: nope, weight: 1}]}, c]"),
        one(
            "spec.routes[0].chain[0].split[1].pool",
            "unknown pool \"nope\""
        )
    );
    // Weights are non-negative integers: the rest is a shape error.
    for weight in ["-1", "2.5", "ten"] {
        let errors = bad(&format!(
            "[{{split: [{{pool: a, weight: {weight}}}, {{pool: b, weight: 1}}]}}]"
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].0, "spec.routes[0].chain[0].split[0].weight",
            "{errors:?}"
        );
    }
    // A misspelt field inside a split: its path and a "did you mean".
    let errors = bad("[{split: [{pool: a, wieght: 1}, {pool: b, weight: 1}]}]");
    assert_eq!(
        errors[0].0, "spec.routes[0].chain[0].split[0].wieght",
        "{errors:?}"
    );
    assert!(errors[0].1.contains("did you mean `weight`?"), "{errors:?}");
}

#[test]
fn a_ramp_on_a_split_resolves_its_defaults_and_every_error_names_its_field() {
    let with = |ramp: &str, sides: &str| {
        format!("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {{name: a}}\n    - {{name: b}}\n    - {{name: c}}\n  routes:\n    - name: r\n      chain: [{{split: [{sides}], ramp: {ramp}}}]\n")
    };
    let two = "{pool: a, weight: 10}, {pool: b, weight: 90}";
    let p = load(
        &with("{steps: [10, 25, 50, 100], step_s: 600}", two),
        &QueueSettings::default(),
    )
    .unwrap();
    let ChainStep::Split(s) = &p.routes[0].chain[0] else {
        panic!()
    };
    let r = s.ramp.as_ref().unwrap();
    assert_eq!(r.steps, [10, 25, 50, 100]);
    assert_eq!(r.step, Duration::from_secs(600));
    assert_eq!(r.guard.max_error_rate, 0.01);
    assert_eq!(r.guard.max_p95_ratio, Some(1.5));
    assert_eq!(r.guard.min_requests, 100);
    let errors = |text: String| {
        load(&text, &QueueSettings::default())
            .unwrap_err()
            .errors
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.reason))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        errors(with(
            "{steps: [25, 10, 101], step_s: 0, guard: {max_error_rate: 2, max_p95_ratio: 0.5, min_requests: 0}}",
            two
        )),
        [
            "spec.routes[0].chain[0].ramp.steps[1]: steps must be strictly increasing",
            "spec.routes[0].chain[0].ramp.steps[2]: must be in 1..=100 (percent)",
            "spec.routes[0].chain[0].ramp.step_s: must be a positive number of seconds",
            "spec.routes[0].chain[0].ramp.guard.max_error_rate: must be in [0, 1]",
            "spec.routes[0].chain[0].ramp.guard.max_p95_ratio: must be at least 1 (or 0: latency not guarded)",
            "spec.routes[0].chain[0].ramp.guard.min_requests: must be at least 1",
        ]
    );
    assert_eq!(
        errors(with(
            "{steps: [10], step_s: 1}",
            "{pool: a, weight: 10}, {pool: b, weight: 80}, {pool: c, weight: 10}"
        )),
        ["spec.routes[0].chain[0].ramp: a ramp needs a split of exactly two sides: the new one first, the old one second"]
    );
    assert_eq!(
        errors(with("{steps: [10], step_s: 1}", "{pool: a, weight: 1}, {pool: b, weight: 1}")),
        ["spec.routes[0].chain[0].ramp: a ramp's split has weights that sum to 100 (the new side's weight is its step)"]
    );
}

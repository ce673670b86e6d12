//! `routerctl` commands that talk to the control plane over gRPC.
//!
//! `--server` (or `ROUTERCTL_SERVER`, default `http://127.0.0.1:50051`)
//! and the token `ROUTER_TOKEN`. Tables by default, `-o json|yaml`.
//! Exit codes as kubectl: 0 done, 1 refused or failed (with the reason),
//! and `policy diff` 0 when the same, 1 when different.

use std::path::Path;
use std::process::ExitCode;

use router_proto::v1 as pb;
use router_proto::v1::admin_client::AdminClient;
use router_proto::BearerToken;
use serde_json::{json, Value};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::policy_cmd::Output;

/// An admin client.
pub type Admin = AdminClient<InterceptedService<Channel, BearerToken>>;

/// Connects to the control plane.
pub async fn connect(
    server: &str,
    token: Option<String>,
    ca_pem: Option<&str>,
) -> Result<Admin, String> {
    // Checked before dialling: a token that cannot be sent is an error,
    // not a call without it.
    let bearer =
        BearerToken::new(token.as_deref(), "ROUTER_TOKEN (--token)").map_err(|e| e.to_string())?;
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    let channel = router_proxy::managed::grpc_endpoint(&url, ca_pem)?
        .connect()
        .await
        .map_err(|e| {
            router_proxy::managed::connect_failure(
                &url,
                &e,
                "--ca-file PATH (or ROUTERCTL_CA_FILE)",
            )
        })?;
    Ok(AdminClient::with_interceptor(channel, bearer))
}

/// A gRPC error as a person reads it: the control plane's own words and
/// what to do, without gRPC's code names.
pub fn explain_status(s: &tonic::Status) -> String {
    let message = s.message();
    match s.code() {
        tonic::Code::Unauthenticated => {
            "the control plane refused the token (set ROUTER_TOKEN)".into()
        }
        tonic::Code::PermissionDenied => {
            format!("permission denied: {message} (ROUTER_TOKEN must be the operator token)")
        }
        tonic::Code::Aborted => format!("{message} (get the current version and try again)"),
        tonic::Code::Unavailable => format!("the control plane is unavailable: {message}"),
        // The control plane itself never answers these codes (its errors
        // are typed, see its `service::status`): they come from the
        // transport, e.g. a TLS server called in clear.
        tonic::Code::Internal | tonic::Code::Unknown | tonic::Code::Cancelled => format!(
            "the connection to the control plane broke ({message}): if it serves TLS, use an https:// --server (with --ca-file)"
        ),
        _ if message.is_empty() => format!("the control plane failed the call ({:?})", s.code()),
        _ => message.to_string(),
    }
}

/// Prints `routerctl: MSG` on stderr; exit 1.
pub fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("routerctl: {msg}");
    ExitCode::FAILURE
}

pub(crate) fn print_value(v: &Value, output: Output) {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(v).unwrap_or_default()),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(v).unwrap_or_default()),
        Output::Table => println!("{v}"),
    }
}

pub(crate) fn when(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let t =
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

fn print_errors(errors: &[pb::FieldError]) {
    for e in errors {
        eprintln!("  {}: {}", e.field, e.reason);
    }
}

/// `policy apply -f FILE [--dry-run] [--expected-version N]` (no note).
pub async fn apply(
    admin: &mut Admin,
    file: &Path,
    dry_run: bool,
    expected_version: u64,
    output: Output,
) -> ExitCode {
    apply_noted(admin, file, dry_run, expected_version, "", output).await
}

/// `policy apply -f FILE [--dry-run] [--expected-version N] [--note TEXT]`.
pub async fn apply_noted(
    admin: &mut Admin,
    file: &Path,
    dry_run: bool,
    expected_version: u64,
    note: &str,
    output: Output,
) -> ExitCode {
    let document = match std::fs::read_to_string(file) {
        Ok(d) => without_get_header(&d).to_string(),
        Err(e) => return fail(format!("cannot read {}: {e}", file.display())),
    };
    let author = std::env::var("USER").unwrap_or_else(|_| "routerctl".into());
    let r = match admin
        .apply_policy(pb::ApplyPolicyRequest {
            document,
            dry_run,
            expected_version,
            author,
            note: note.to_string(),
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    if !r.errors.is_empty() {
        eprintln!(
            "routerctl: {}: refused ({} error{})",
            file.display(),
            r.errors.len(),
            if r.errors.len() == 1 { "" } else { "s" }
        );
        print_errors(&r.errors);
        return ExitCode::FAILURE;
    }
    match output {
        Output::Table if r.unchanged => println!(
            "unchanged: {} reads the same as policy version {} (no new version made)",
            file.display(),
            r.version
        ),
        Output::Table if dry_run => println!(
            "{}: valid; would become version {}",
            file.display(),
            r.version
        ),
        Output::Table => println!(
            "applied: policy version {} (revision {})",
            r.version, r.revision
        ),
        _ => print_value(
            &json!({"version": r.version, "revision": r.revision, "applied": r.applied, "unchanged": r.unchanged}),
            output,
        ),
    }
    ExitCode::SUCCESS
}

/// The document without the `# version N applied ...` lines `policy get`
/// puts on top, so that get, edit, apply does not stack them in the stored
/// document.
pub fn without_get_header(document: &str) -> &str {
    let mut rest = document;
    while rest.starts_with("# version ") {
        match rest.split_once('\n') {
            Some((line, after)) if line.contains(" applied ") => rest = after,
            _ => break,
        }
    }
    rest
}

/// A new tenant key: `rt_` and 32 random bytes, base64url.
pub(crate) fn mint_tenant_key() -> Result<String, String> {
    use base64::Engine;
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the system random source failed".to_string())?;
    Ok(format!(
        "rt_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// `routerctl tenants add-key NAME`: the old spelling of `tenants keys
/// create NAME` (the key is stored beside the policy, which is left as
/// written).
pub async fn tenant_add_key(admin: &mut Admin, tenant: &str) -> ExitCode {
    crate::keys_cmd::create(admin, tenant, "", None, Output::Table).await
}

/// `routerctl tenants list`: the applied policy's tenants and their
/// limits (keys as counts: those the policy lists and those stored).
pub async fn tenants_list(admin: &mut Admin, output: Output) -> ExitCode {
    let current = match admin.get_policy(pb::GetPolicyRequest { version: 0 }).await {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    let doc = match router_policy::document::PolicyDocument::parse(&current.document) {
        Ok(d) => d,
        Err(e) => return fail(format!("the applied policy does not parse: {e}")),
    };
    // Keys in the control plane's store count beside the policy's own (a
    // control plane from before stored keys has none to list).
    let stored = admin
        .list_keys(pb::ListKeysRequest::default())
        .await
        .map(|r| r.into_inner().keys)
        .unwrap_or_default();
    let rows: Vec<Value> = doc
        .spec
        .tenants
        .iter()
        .map(|t| {
            let l = t.limits.clone().unwrap_or_default();
            json!({
                "name": t.name,
                "keys": t.keys.len() + stored.iter().filter(|k| k.tenant == t.name).count(),
                "anonymous": t.anonymous,
                "routes": t.routes,
                "max_risk": t.max_risk.map(|r| r.as_str()),
                "requests_per_minute": l.requests_per_minute,
                "concurrent_requests": l.concurrent_requests,
                "budget_usd_per_day": l.budget_usd_per_day,
                "budget_usd_per_month": l.budget_usd_per_month,
            })
        })
        .collect();
    match output {
        Output::Table => {
            if rows.is_empty() {
                println!(
                    "no tenants: policy version {} lets anyone call",
                    current.version
                );
                return ExitCode::SUCCESS;
            }
            println!(
                "{:<20} {:>4} {:<12} {:<10} {:>8} {:>6} {:>12} {:>12}",
                "TENANT", "KEYS", "ROUTES", "MAX RISK", "RPM", "CONC", "USD/DAY", "USD/MONTH"
            );
            let show = |v: &Value| match v {
                Value::Null => "-".to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            for r in &rows {
                let routes = match r["routes"].as_array() {
                    Some(a) if !a.is_empty() => a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(","),
                    _ => "all".into(),
                };
                let name = if r["anonymous"] == true {
                    format!("{} (anonymous)", show(&r["name"]))
                } else {
                    show(&r["name"])
                };
                println!(
                    "{:<20} {:>4} {:<12} {:<10} {:>8} {:>6} {:>12} {:>12}",
                    name,
                    show(&r["keys"]),
                    routes,
                    if r["max_risk"].is_null() {
                        "any".into()
                    } else {
                        show(&r["max_risk"])
                    },
                    show(&r["requests_per_minute"]),
                    show(&r["concurrent_requests"]),
                    show(&r["budget_usd_per_day"]),
                    show(&r["budget_usd_per_month"]),
                );
            }
        }
        _ => print_value(&Value::Array(rows), output),
    }
    ExitCode::SUCCESS
}

/// `routerctl tenants usage NAME`: the tenant's spend today and this
/// month and its reservations in flight, as the proxies' shared store
/// counts them (the control plane reads it), beside its budgets.
pub async fn tenant_usage(admin: &mut Admin, tenant: &str, output: Output) -> ExitCode {
    let usage = match admin
        .tenant_usage(pb::TenantUsageRequest {
            tenant: tenant.to_string(),
        })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return fail(explain_status(&s)),
    };
    let limits = match admin.get_policy(pb::GetPolicyRequest { version: 0 }).await {
        Ok(r) => router_policy::document::PolicyDocument::parse(&r.into_inner().document)
            .ok()
            .and_then(|d| d.spec.tenants.into_iter().find(|t| t.name == tenant))
            .and_then(|t| t.limits),
        Err(s) => return fail(explain_status(&s)),
    };
    let usd = |micros: i64| micros as f64 / 1e6;
    let when = |ms: i64| {
        u64::try_from(ms)
            .ok()
            .filter(|ms| *ms > 0)
            .and_then(|ms| std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms)))
            .map(|t| humantime::format_rfc3339_seconds(t).to_string())
    };
    let since = when(usage.store_since_unix_ms);
    let lost_since = when(usage.store_lost_since_unix_ms);
    let v = json!({
        "tenant": tenant,
        "day": usage.day,
        "month": usage.month,
        "spent_today_usd": usd(usage.spent_today_micros),
        "spent_month_usd": usd(usage.spent_month_micros),
        "reserved_usd": usd(usage.reserved_micros),
        "budget_usd_per_day": limits.as_ref().and_then(|l| l.budget_usd_per_day),
        "budget_usd_per_month": limits.as_ref().and_then(|l| l.budget_usd_per_month),
        "store_data_since": since,
        "store_reset_seen": usage.store_reset_seen,
        "store_lost_data_since": lost_since,
    });
    match output {
        Output::Table => {
            let of = |b: &Value| match b.as_f64() {
                Some(b) => format!(" of ${b:.6}"),
                None => " (no budget)".into(),
            };
            println!("tenant {tenant:?}");
            println!(
                "  today ({}):      ${:.6}{}",
                usage.day,
                usd(usage.spent_today_micros),
                of(&v["budget_usd_per_day"])
            );
            println!(
                "  this month ({}):  ${:.6}{}",
                usage.month,
                usd(usage.spent_month_micros),
                of(&v["budget_usd_per_month"])
            );
            println!(
                "  reserved by calls in flight: ${:.6}",
                usd(usage.reserved_micros)
            );
            // The shared store's epoch (router_policy::store_epoch).
            match (&since, usage.store_reset_seen) {
                (None, _) => println!(
                    "  store data since: unknown (no epoch marker yet: no proxy has checked the shared store since it started or lost its data)"
                ),
                (Some(since), false) => println!("  store data since: {since}"),
                (Some(since), true) => println!(
                    "  store data since: {since}; a reset was seen: the store lost its data, spend since {} is gone",
                    lost_since.as_deref().unwrap_or("an unknown time")
                ),
            }
        }
        _ => print_value(&v, output),
    }
    ExitCode::SUCCESS
}

/// `policy get [--version N]`.
pub async fn get(admin: &mut Admin, version: u64, output: Output) -> ExitCode {
    match admin.get_policy(pb::GetPolicyRequest { version }).await {
        Ok(r) => {
            let p = r.into_inner();
            match output {
                Output::Table => {
                    println!(
                        "# version {} applied {} by {} ({})",
                        p.version,
                        when(p.applied_at_unix_ms),
                        p.author,
                        p.note
                    );
                    print!("{}", p.document);
                }
                _ => print_value(
                    &json!({"version": p.version, "applied_at": when(p.applied_at_unix_ms), "author": p.author, "note": p.note, "document": p.document}),
                    output,
                ),
            }
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

/// A line diff (Myers, via `similar`), `-`/`+` prefixed: the lines
/// removed from `old` and added in `new`, in order.
pub fn line_diff(old: &str, new: &str) -> Vec<String> {
    similar::TextDiff::from_lines(old, new)
        .iter_all_changes()
        .filter_map(|c| {
            let line = c.value().trim_end_matches(['\n', '\r']);
            match c.tag() {
                similar::ChangeTag::Equal => None,
                similar::ChangeTag::Delete => Some(format!("-{line}")),
                similar::ChangeTag::Insert => Some(format!("+{line}")),
            }
        })
        .collect()
}

/// `policy diff A [B]`: policy version A against version B (default: the
/// current one), as a unified diff with three lines of context; exit 0
/// when they mean the same (comments and layout aside), 1 otherwise.
pub async fn diff_versions(admin: &mut Admin, a: u64, b: u64) -> ExitCode {
    let mut versions = Vec::with_capacity(2);
    for version in [a, b] {
        match admin.get_policy(pb::GetPolicyRequest { version }).await {
            Ok(r) => versions.push(r.into_inner()),
            Err(s) => return fail(explain_status(&s)),
        }
    }
    let (Some(new), Some(old)) = (versions.pop(), versions.pop()) else {
        return fail("the control plane did not answer both versions");
    };
    let same_meaning = matches!(
        (
            router_policy::document::PolicyDocument::parse(&old.document),
            router_policy::document::PolicyDocument::parse(&new.document)
        ),
        (Ok(x), Ok(y)) if x == y
    );
    let label = |p: &pb::PolicyVersion| {
        format!(
            "version {} ({} by {}{})",
            p.version,
            when(p.applied_at_unix_ms),
            if p.operator.is_empty() {
                &p.author
            } else {
                &p.operator
            },
            if p.message.is_empty() {
                String::new()
            } else {
                format!(": {}", p.message)
            }
        )
    };
    let text = similar::TextDiff::from_lines(&old.document, &new.document);
    print!(
        "{}",
        text.unified_diff()
            .context_radius(3)
            .header(&label(&old), &label(&new))
    );
    if same_meaning {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `policy diff -f FILE`: 0 when the file is what is applied, 1 otherwise.
pub async fn diff(admin: &mut Admin, file: &Path) -> ExitCode {
    let local = match std::fs::read_to_string(file) {
        Ok(d) => without_get_header(&d).to_string(),
        Err(e) => return fail(format!("cannot read {}: {e}", file.display())),
    };
    let current = match admin.get_policy(pb::GetPolicyRequest { version: 0 }).await {
        Ok(r) => r.into_inner().document,
        Err(s) if s.code() == tonic::Code::NotFound => String::new(),
        Err(s) => return fail(explain_status(&s)),
    };
    let same_meaning = matches!(
        (
            router_policy::document::PolicyDocument::parse(&local),
            router_policy::document::PolicyDocument::parse(&current)
        ),
        (Ok(a), Ok(b)) if a == b
    );
    if same_meaning {
        return ExitCode::SUCCESS;
    }
    for l in line_diff(&current, &local) {
        println!("{l}");
    }
    ExitCode::FAILURE
}

/// `policy history`.
pub async fn history(admin: &mut Admin, output: Output) -> ExitCode {
    let versions = match admin.history(pb::HistoryRequest {}).await {
        Ok(r) => r.into_inner().versions,
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => {
            println!(
                "{:<8} {:<21} {:<16} {:<16} NOTE",
                "VERSION", "APPLIED", "AUTHOR", "OPERATOR"
            );
            for v in &versions {
                let note = if v.message.is_empty() {
                    v.note.clone()
                } else {
                    format!("{}: {}", v.note, v.message)
                };
                println!(
                    "{:<8} {:<21} {:<16} {:<16} {}",
                    v.version,
                    when(v.applied_at_unix_ms),
                    v.author,
                    if v.operator.is_empty() { "-" } else { &v.operator },
                    note
                );
            }
        }
        _ => print_value(
            &Value::Array(
                versions
                    .iter()
                    .map(|v| json!({"version": v.version, "applied_at": when(v.applied_at_unix_ms), "author": v.author, "operator": v.operator, "note": v.note, "message": v.message}))
                    .collect(),
            ),
            output,
        ),
    }
    ExitCode::SUCCESS
}

/// `policy rollback [--to N]`.
pub async fn rollback(admin: &mut Admin, to: u64, expected_version: u64) -> ExitCode {
    rollback_noted(admin, to, expected_version, "").await
}

/// `policy rollback [--to N] [--note TEXT]`.
pub async fn rollback_noted(
    admin: &mut Admin,
    to: u64,
    expected_version: u64,
    note: &str,
) -> ExitCode {
    match admin
        .rollback(pb::RollbackRequest {
            to_version: to,
            expected_version,
            note: note.to_string(),
            author: std::env::var("USER").unwrap_or_else(|_| "routerctl".into()),
        })
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            println!(
                "rolled back: policy version {} (revision {})",
                r.version, r.revision
            );
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

/// `backends list`.
pub async fn backends_list(admin: &mut Admin, output: Output) -> ExitCode {
    let mut pools = match admin.list_backends(pb::ListBackendsRequest {}).await {
        Ok(r) => r.into_inner().pools,
        Err(s) => return fail(explain_status(&s)),
    };
    // Pools without a backend set serve the endpoints their policy lists:
    // listed too, after the sets (a policy that does not parse lists none).
    let policy = match admin.get_policy(pb::GetPolicyRequest { version: 0 }).await {
        Ok(r) => router_policy::document::PolicyDocument::parse(&r.into_inner().document).ok(),
        Err(s) => return fail(explain_status(&s)),
    };
    let sets = pools.len();
    for p in policy.map(|d| d.spec.pools).unwrap_or_default() {
        if pools.iter().any(|b| b.pool == p.name) {
            continue;
        }
        let endpoints: Vec<String> = p.endpoints.iter().map(|e| e.url().to_string()).collect();
        let drained = endpoints
            .iter()
            .zip(&p.endpoints)
            .filter(|(_, e)| p.drain || e.drain())
            .map(|(u, _)| u.clone())
            .collect();
        pools.push(pb::PoolBackends {
            pool: p.name,
            endpoints,
            drained,
        });
    }
    let source = |i: usize| if i < sets { "backends set" } else { "policy" };
    // The fleet's marks on each endpoint: open circuits and suspicions
    // (router_policy::health), with the proxy that raised them.
    let circuits = match admin.list_circuits(pb::ListCircuitsRequest {}).await {
        Ok(r) => r.into_inner().circuits,
        Err(s) => return fail(explain_status(&s)),
    };
    let marks = |pool: &str, endpoint: &str| -> Vec<String> {
        circuits
            .iter()
            .filter(|c| {
                c.pool == pool
                    && (c.endpoint.is_empty()
                        || router_policy::Endpoint::same_address(&c.endpoint, endpoint))
            })
            .map(|c| match (c.suspect.as_str(), c.open) {
                ("", true) => format!("circuit open ({})", c.source),
                ("", false) => format!("circuit forced closed ({})", c.source),
                (cause, _) => format!("suspect: {cause} ({})", c.source),
            })
            .collect()
    };
    match output {
        Output::Table => {
            println!(
                "{:<20} {:<40} {:<9} {:<13} FLEET",
                "POOL", "ENDPOINT", "STATE", "FROM"
            );
            for (i, p) in pools.iter().enumerate() {
                for e in &p.endpoints {
                    let state = if p.drained.contains(e) {
                        "draining"
                    } else {
                        "active"
                    };
                    let m = marks(&p.pool, e);
                    let fleet = if m.is_empty() {
                        "-".to_string()
                    } else {
                        m.join(", ")
                    };
                    println!(
                        "{:<20} {:<40} {state:<9} {:<13} {fleet}",
                        p.pool,
                        e,
                        source(i)
                    );
                }
            }
        }
        _ => print_value(
            &Value::Array(
                pools
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let marks: serde_json::Map<String, Value> = p
                            .endpoints
                            .iter()
                            .map(|e| (e.clone(), json!(marks(&p.pool, e))))
                            .collect();
                        json!({"pool": p.pool, "endpoints": p.endpoints, "drained": p.drained, "fleet": marks, "source": source(i)})
                    })
                    .collect(),
            ),
            output,
        ),
    }
    ExitCode::SUCCESS
}

/// `backends set POOL ADDR...`.
pub async fn backends_set(admin: &mut Admin, pool: &str, endpoints: Vec<String>) -> ExitCode {
    match admin
        .set_backends(pb::SetBackendsRequest {
            pool: pool.to_string(),
            endpoints,
            drained: Vec::new(),
        })
        .await
    {
        Ok(r) => {
            println!(
                "backends of {pool} set (revision {})",
                r.into_inner().revision
            );
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

/// `backends drain POOL ADDR`.
pub async fn backends_drain(admin: &mut Admin, pool: &str, addr: &str) -> ExitCode {
    let pools = match admin.list_backends(pb::ListBackendsRequest {}).await {
        Ok(r) => r.into_inner().pools,
        Err(s) => return fail(explain_status(&s)),
    };
    let Some(current) = pools.into_iter().find(|p| p.pool == pool) else {
        return fail(format!(
            "no backend set for pool {pool} (routerctl backends set {pool} ...)"
        ));
    };
    // Compared as endpoints: health and metrics show `http://host:port`
    // for a backend set as `host:port`.
    let Some(addr) = current
        .endpoints
        .iter()
        .find(|e| router_policy::Endpoint::same_address(e, addr))
        .cloned()
    else {
        return fail(format!(
            "{addr} is not a backend of {pool} (its backends: {})",
            current.endpoints.join(", ")
        ));
    };
    let mut drained = current.drained;
    if !drained.contains(&addr) {
        drained.push(addr.clone());
    }
    match admin
        .set_backends(pb::SetBackendsRequest {
            pool: pool.to_string(),
            endpoints: current.endpoints,
            drained,
        })
        .await
    {
        Ok(r) => {
            println!(
                "{addr} of {pool} draining (revision {})",
                r.into_inner().revision
            );
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

/// `circuits list`.
pub async fn circuits_list(admin: &mut Admin, output: Output) -> ExitCode {
    let circuits = match admin.list_circuits(pb::ListCircuitsRequest {}).await {
        Ok(r) => r.into_inner().circuits,
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => {
            println!(
                "{:<16} {:<36} {:<16} {:<7} {:<21} SOURCE",
                "POOL", "ENDPOINT", "KIND", "STATE", "UNTIL"
            );
            for row in circuit_rows(&circuits) {
                println!(
                    "{:<16} {:<36} {:<16} {:<7} {:<21} {}",
                    row.pool,
                    row.endpoint,
                    row.kind,
                    row.state,
                    when(row.until_unix_ms),
                    row.sources.join(", ")
                );
            }
        }
        _ => print_value(
            &Value::Array(
                circuits
                    .iter()
                    .map(|c| json!({"pool": c.pool, "endpoint": c.endpoint, "open": c.open, "until": when(c.until_unix_ms), "source": c.source, "kind": circuit_kind(c)}))
                    .collect(),
            ),
            output,
        ),
    }
    ExitCode::SUCCESS
}

/// What an override is: a forced circuit, or a suspicion and its cause.
fn circuit_kind(c: &pb::CircuitOverride) -> String {
    if c.suspect.is_empty() {
        "circuit".into()
    } else {
        format!("suspect ({})", c.suspect)
    }
}

/// One line of `circuits list`: the overrides of one target, kind and
/// state, whoever reported them.
#[derive(Debug, PartialEq, Eq)]
pub struct CircuitRow {
    /// Pool.
    pub pool: String,
    /// Endpoint, or `(all)`.
    pub endpoint: String,
    /// `circuit` or `suspect (cause)`.
    pub kind: String,
    /// `open` or `closed`.
    pub state: &'static str,
    /// The latest expiry among them.
    pub until_unix_ms: i64,
    /// Who set or reported them (`operator`, node ids), sorted.
    pub sources: Vec<String>,
}

/// The table's rows: overrides of the same target, kind and state (each
/// proxy reports its own, and a circuit and two kinds of suspicion of one
/// endpoint are three records) are one row naming every source, instead
/// of rows that read as the same override two and three times.
pub fn circuit_rows(circuits: &[pb::CircuitOverride]) -> Vec<CircuitRow> {
    let mut rows: Vec<CircuitRow> = Vec::new();
    for c in circuits {
        let endpoint = if c.endpoint.is_empty() {
            "(all)".to_string()
        } else {
            c.endpoint.clone()
        };
        let kind = circuit_kind(c);
        let state = if c.open { "open" } else { "closed" };
        match rows.iter_mut().find(|r| {
            r.pool == c.pool && r.endpoint == endpoint && r.kind == kind && r.state == state
        }) {
            Some(row) => {
                row.until_unix_ms = row.until_unix_ms.max(c.until_unix_ms);
                if !row.sources.contains(&c.source) {
                    row.sources.push(c.source.clone());
                    row.sources.sort();
                }
            }
            None => rows.push(CircuitRow {
                pool: c.pool.clone(),
                endpoint,
                kind,
                state,
                until_unix_ms: c.until_unix_ms,
                sources: vec![c.source.clone()],
            }),
        }
    }
    rows
}

/// `circuits open|close POOL [ADDR] [--for DURATION]`.
pub async fn circuits_set(
    admin: &mut Admin,
    pool: &str,
    addr: Option<&str>,
    open: bool,
    for_secs: u64,
) -> ExitCode {
    match admin
        .set_circuit(pb::SetCircuitRequest {
            pool: pool.to_string(),
            endpoint: addr.unwrap_or("").to_string(),
            open,
            for_seconds: for_secs,
        })
        .await
    {
        Ok(r) => {
            let target = match addr {
                Some(a) => format!("{pool} {a}"),
                None => format!("every endpoint of {pool}"),
            };
            let what = match (open, for_secs) {
                (true, _) => "opened for",
                (false, 0) => "overrides cleared for",
                (false, _) => "forced closed for",
            };
            println!(
                "circuit {what} {target} (revision {})",
                r.into_inner().revision
            );
            ExitCode::SUCCESS
        }
        Err(s) => fail(explain_status(&s)),
    }
}

/// A proxy's state in `proxies list`: `gone` (not connected), `NACK` (it
/// refused the latest revision it was sent), `waiting` (connected, no
/// revision applied yet: no policy exists, or none has reached it), `ACK`.
fn proxy_state(p: &pb::ProxyStatus) -> &'static str {
    match (
        p.connected,
        p.nacked_revision > p.applied_revision,
        p.applied_revision,
    ) {
        (false, _, _) => "gone",
        (true, true, _) => "NACK",
        (true, false, 0) => "waiting",
        (true, false, _) => "ACK",
    }
}

/// `proxies list`.
pub async fn proxies_list(admin: &mut Admin, output: Output) -> ExitCode {
    let proxies = match admin.list_proxies(pb::ListProxiesRequest {}).await {
        Ok(r) => r.into_inner().proxies,
        Err(s) => return fail(explain_status(&s)),
    };
    match output {
        Output::Table => {
            println!(
                "{:<24} {:<16} {:<9} {:<10} {:<21} LAST NACK",
                "NODE", "CONTROL PLANE", "REVISION", "STATE", "LAST SEEN"
            );
            for p in &proxies {
                let state = proxy_state(p);
                println!(
                    "{:<24} {:<16} {:<9} {:<10} {:<21} {}",
                    p.node_id,
                    if p.control_plane.is_empty() { "-" } else { &p.control_plane },
                    p.applied_revision,
                    state,
                    when(p.last_seen_unix_ms),
                    p.last_nack
                );
            }
        }
        _ => print_value(
            &Value::Array(
                proxies
                    .iter()
                    .map(|p| {
                        json!({"node_id": p.node_id, "applied_revision": p.applied_revision, "nacked_revision": p.nacked_revision,
                               "last_nack": p.last_nack, "connected": p.connected, "control_plane": p.control_plane, "last_seen": when(p.last_seen_unix_ms),
                               "circuit_reports_dropped": p.circuit_reports_dropped})
                    })
                    .collect(),
            ),
            output,
        ),
    }
    ExitCode::SUCCESS
}

/// `route explain` against the control plane's current policy.
pub async fn explain(admin: &mut Admin, situation_json: String) -> Result<String, String> {
    admin
        .explain(pb::ExplainRequest { situation_json })
        .await
        .map(|r| r.into_inner().explanation_json)
        .map_err(|s| explain_status(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30, item 8: `circuits list` showed one endpoint's override
    /// two and three times (one record per reporting proxy, and a circuit
    /// and suspicions of it in the same columns).
    #[test]
    fn circuits_list_shows_each_override_once_with_its_kind_and_every_source() {
        let c = |endpoint: &str, suspect: &str, source: &str, until: i64| pb::CircuitOverride {
            pool: "gpu".into(),
            endpoint: endpoint.into(),
            open: true,
            until_unix_ms: until,
            source: source.into(),
            suspect: suspect.into(),
        };
        let rows = circuit_rows(&[
            c("10.0.0.1:8000", "", "proxy-b", 5),
            c("10.0.0.1:8000", "check", "proxy-a", 7),
            c("10.0.0.1:8000", "", "proxy-a", 9),
            c("10.0.0.1:8000", "attempt", "proxy-a", 3),
            c("", "", "operator", 1),
        ]);
        let view: Vec<(&str, &str, String, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.endpoint.as_str(),
                    r.kind.as_str(),
                    r.sources.join(","),
                    r.until_unix_ms,
                )
            })
            .collect();
        assert_eq!(
            view,
            vec![
                ("10.0.0.1:8000", "circuit", "proxy-a,proxy-b".to_string(), 9),
                ("10.0.0.1:8000", "suspect (check)", "proxy-a".to_string(), 7),
                (
                    "10.0.0.1:8000",
                    "suspect (attempt)",
                    "proxy-a".to_string(),
                    3
                ),
                ("(all)", "circuit", "operator".to_string(), 1),
            ]
        );
    }

    #[test]
    fn line_diff_marks_changes() {
        let d = line_diff("a\nb\nc\n", "a\nx\nc\nd\n");
        assert_eq!(d, vec!["-b", "+x", "+d"]);
        assert!(line_diff("same\n", "same\n").is_empty());
    }

    /// Issue 30, item 8: a proxy that has applied nothing yet is not
    /// `ACK` (there was nothing to acknowledge).
    #[test]
    fn a_proxy_with_no_revision_yet_is_waiting_not_acked() {
        let p = |connected, applied, nacked| pb::ProxyStatus {
            connected,
            applied_revision: applied,
            nacked_revision: nacked,
            ..Default::default()
        };
        assert_eq!(proxy_state(&p(true, 0, 0)), "waiting");
        assert_eq!(proxy_state(&p(true, 3, 0)), "ACK");
        assert_eq!(proxy_state(&p(true, 3, 4)), "NACK");
        assert_eq!(proxy_state(&p(true, 0, 1)), "NACK");
        assert_eq!(proxy_state(&p(false, 3, 0)), "gone");
    }
}

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

use crate::error::CliError;
use crate::policy_cmd::Output;

// The commands of each noun live in its own file; their old paths here
// keep working.
pub use crate::backends_cmd::*;
pub use crate::circuits_cmd::*;
pub use crate::proxies_cmd::*;
pub use crate::tenants_cmd::*;

/// An admin client.
pub type Admin = AdminClient<InterceptedService<Channel, BearerToken>>;

/// Connects to the control plane.
pub async fn connect(
    server: &str,
    token: Option<String>,
    ca_pem: Option<&str>,
) -> Result<Admin, CliError> {
    // Checked before dialling: a token that cannot be sent is an error,
    // not a call without it.
    let bearer = BearerToken::new(token.as_deref(), "ROUTER_TOKEN (--token)")?;
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    let channel = router_proxy::managed::grpc_endpoint(&url, ca_pem)?
        .connect()
        .await
        .map_err(|e| {
            CliError::Unreachable(router_proxy::managed::connect_failure(
                &url,
                &e,
                "--ca-file PATH (or ROUTERCTL_CA_FILE)",
            ))
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
    when_given(ms).unwrap_or_else(|| "-".into())
}

/// A Unix time in milliseconds as RFC 3339 (UTC, seconds); `None` for 0,
/// a negative time or one past year 9999 (a control plane's value is
/// never trusted to fit the clock).
pub(crate) fn when_given(ms: i64) -> Option<String> {
    const YEAR_10000_MS: u64 = 253_402_300_800_000;
    let ms = u64::try_from(ms)
        .ok()
        .filter(|ms| (1..YEAR_10000_MS).contains(ms))?;
    let t = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms))?;
    Some(humantime::format_rfc3339_seconds(t).to_string())
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
    let same_meaning = same_meaning(&old.document, &new.document);
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

/// Whether two policy documents mean the same (both parse, and equal
/// once parsed: comments and layout aside).
fn same_meaning(a: &str, b: &str) -> bool {
    use router_policy::document::PolicyDocument;
    matches!((PolicyDocument::parse(a), PolicyDocument::parse(b)), (Ok(x), Ok(y)) if x == y)
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
    let same_meaning = same_meaning(&local, &current);
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

/// `route explain` against the control plane's current policy.
pub async fn explain(admin: &mut Admin, situation_json: String) -> Result<String, CliError> {
    Ok(admin
        .explain(pb::ExplainRequest { situation_json })
        .await?
        .into_inner()
        .explanation_json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_diff_marks_changes() {
        let d = line_diff("a\nb\nc\n", "a\nx\nc\nd\n");
        assert_eq!(d, vec!["-b", "+x", "+d"]);
        assert!(line_diff("same\n", "same\n").is_empty());
    }
}

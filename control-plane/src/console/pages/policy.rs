//! `/policy`: the current document (as `routerctl policy get` prints it),
//! the history (who applied each version, when, and why), a side-by-side
//! line diff of any two versions; for operators, an editor whose dry run
//! shows the diff against the current version and every validation error
//! with its field, apply, and roll back to a version of the history after
//! a confirmation page.
//!
//! Every change goes through the hub's functions the gRPC `Admin` service
//! calls: [`crate::hub::Hub::apply_policy_by`] (dry run and apply, the same
//! validation) and [`crate::hub::Hub::rollback_by`]. The history records the console
//! as the author and the signed-in token's name (else its role) as the
//! operator, as `routerctl policy apply` records `$USER` and the token.

use std::time::{Duration, UNIX_EPOCH};

use askama::Template;
use http::StatusCode;
use similar::{DiffTag, TextDiff};

use super::super::session::Session;
use super::super::{redirect, Answer, Console, Form};
use super::{ago, error_page, render, Layout};
use crate::hub::{now_ms, Applier, HubError};
use crate::store::PolicyRecord;

/// Lines of context around each change of a diff.
const CONTEXT: usize = 3;
/// The longest a diff may compute before it settles for a coarser one.
const DIFF_TIME: Duration = Duration::from_millis(500);
/// The author the history records for the console's changes.
const AUTHOR: &str = "console";

/// One version of the history.
pub(super) struct VersionRow {
    version: u64,
    when: String,
    ago: String,
    author: String,
    operator: String,
    note: String,
    /// The note as a sentence says it: `applied`, `rolled back to 3`.
    did: String,
    message: String,
    current: bool,
}

impl VersionRow {
    fn of(p: &PolicyRecord, current: u64, now: i64) -> Self {
        Self {
            version: p.version,
            when: timestamp(p.applied_at_unix_ms),
            ago: ago(p.applied_at_unix_ms, now),
            author: p.author.clone(),
            operator: p.operator.clone(),
            note: p.note.clone(),
            did: match p.note.strip_prefix("rollback to ") {
                _ if p.note == "apply" => "applied".into(),
                Some(v) => format!("rolled back to {v}"),
                None => p.note.clone(),
            },
            message: p.message.clone(),
            current: p.version == current,
        }
    }
}

/// A Unix time in ms as RFC 3339 (UTC, seconds).
fn timestamp(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0);
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// One row of a side-by-side diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DiffRow {
    /// `same`, `del`, `add`, `change`, or `gap` (unchanged lines left out).
    kind: &'static str,
    left_no: String,
    left: String,
    right_no: String,
    right: String,
}

/// A side-by-side diff between two texts.
pub(super) struct Diff {
    /// What the left side is (`version 3`, `current (version 4)`).
    left: String,
    /// What the right side is.
    right: String,
    rows: Vec<DiffRow>,
    /// Lines removed and added.
    removed: usize,
    added: usize,
}

impl Diff {
    fn new(left: String, right: String, old: &str, new: &str) -> Self {
        let rows = side_by_side(old, new);
        let removed = rows
            .iter()
            .filter(|r| matches!(r.kind, "del" | "change") && !r.left_no.is_empty())
            .count();
        let added = rows
            .iter()
            .filter(|r| matches!(r.kind, "add" | "change") && !r.right_no.is_empty())
            .count();
        Self {
            left,
            right,
            rows,
            removed,
            added,
        }
    }
}

fn line(s: &str) -> String {
    s.trim_end_matches(['\n', '\r']).to_string()
}

/// The rows of a side-by-side line diff of `old` and `new`: the changed
/// lines with [`CONTEXT`] lines around them, a `gap` row where unchanged
/// lines are left out. Empty when the texts are the same.
pub(super) fn side_by_side(old: &str, new: &str) -> Vec<DiffRow> {
    let diff = TextDiff::configure()
        .timeout(DIFF_TIME)
        .diff_lines(old, new);
    let (o, n) = (diff.old_slices(), diff.new_slices());
    let mut rows = Vec::new();
    let at = |lines: &[&str], i: usize| lines.get(i).map(|l| line(l)).unwrap_or_default();
    let no = |i: usize| (i + 1).to_string();
    for (g, group) in diff.grouped_ops(CONTEXT).iter().enumerate() {
        let starts_late = group
            .first()
            .is_some_and(|op| op.old_range().start > 0 || op.new_range().start > 0);
        if g > 0 || starts_late {
            rows.push(DiffRow {
                kind: "gap",
                left_no: String::new(),
                left: "…".into(),
                right_no: String::new(),
                right: "…".into(),
            });
        }
        for op in group {
            let (tag, old, new) = op.as_tag_tuple();
            match tag {
                DiffTag::Equal => {
                    for (i, j) in old.zip(new) {
                        rows.push(DiffRow {
                            kind: "same",
                            left_no: no(i),
                            left: at(o, i),
                            right_no: no(j),
                            right: at(n, j),
                        });
                    }
                }
                DiffTag::Delete => {
                    for i in old {
                        rows.push(DiffRow {
                            kind: "del",
                            left_no: no(i),
                            left: at(o, i),
                            right_no: String::new(),
                            right: String::new(),
                        });
                    }
                }
                DiffTag::Insert => {
                    for j in new {
                        rows.push(DiffRow {
                            kind: "add",
                            left_no: String::new(),
                            left: String::new(),
                            right_no: no(j),
                            right: at(n, j),
                        });
                    }
                }
                DiffTag::Replace => {
                    let len = old.len().max(new.len());
                    for k in 0..len {
                        let i = (k < old.len()).then(|| old.start + k);
                        let j = (k < new.len()).then(|| new.start + k);
                        rows.push(DiffRow {
                            kind: "change",
                            left_no: i.map(no).unwrap_or_default(),
                            left: i.map(|i| at(o, i)).unwrap_or_default(),
                            right_no: j.map(no).unwrap_or_default(),
                            right: j.map(|j| at(n, j)).unwrap_or_default(),
                        });
                    }
                }
            }
        }
    }
    rows
}

#[derive(Template)]
#[template(path = "policy.html")]
struct PolicyPage {
    layout: Layout,
    /// The current version (0: none yet).
    current: u64,
    /// The version shown (the current one unless `?show=N`).
    shown: Option<VersionRow>,
    document: String,
    history: Vec<VersionRow>,
    /// Versions for the diff form, newest first.
    versions: Vec<u64>,
    diff_a: u64,
    diff_b: u64,
    diff: Option<Diff>,
    /// A line saying what the last change did.
    notice: String,
    problem: String,
    may_edit: bool,
}

/// One validation error, as the page lists it.
pub(super) struct FieldRow {
    field: String,
    reason: String,
}

#[derive(Template)]
#[template(path = "policy_edit.html")]
struct EditPage {
    layout: Layout,
    /// The version the edit started from (the apply's expected version).
    expected: u64,
    document: String,
    note: String,
    /// Set after a dry run or a refused apply.
    checked: bool,
    /// What the dry run found, when valid.
    outcome: String,
    errors: Vec<FieldRow>,
    problem: String,
    diff: Option<Diff>,
}

#[derive(Template)]
#[template(path = "policy_rollback.html")]
struct RollbackPage {
    layout: Layout,
    current: u64,
    target: VersionRow,
    diff: Diff,
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

fn query_u64(pairs: &[(String, String)], name: &str) -> Option<u64> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.trim().parse().ok())
}

fn shutting_down() -> Answer {
    error_page(
        StatusCode::SERVICE_UNAVAILABLE,
        "the control plane is shutting down",
    )
}

fn version_label(v: u64, current: u64) -> String {
    if v == current {
        format!("version {v} (current)")
    } else {
        format!("version {v}")
    }
}

/// `GET /policy[?show=N][&a=N&b=M][&applied=N|&rolled_back=N|&unchanged=N]`.
pub(in crate::console) async fn get(console: &Console, s: &Session, query: Option<&str>) -> Answer {
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let q = query_pairs(query);
    let history = hub.history();
    let current = hub.state().policy_version;
    let now = now_ms();
    let find = |v: u64| history.iter().find(|p| p.version == v);
    let mut problem = String::new();
    let shown_version = query_u64(&q, "show").unwrap_or(current);
    let shown = match find(shown_version) {
        Some(p) => Some(p),
        None if shown_version != current => {
            problem = format!("no policy version {shown_version} in the history");
            find(current)
        }
        None => None,
    };
    let (diff_a, diff_b) = (
        query_u64(&q, "a").unwrap_or(0),
        query_u64(&q, "b").unwrap_or(0),
    );
    let diff = if diff_a > 0 && diff_b > 0 {
        match (find(diff_a), find(diff_b)) {
            (Some(a), Some(b)) => Some(Diff::new(
                version_label(diff_a, current),
                version_label(diff_b, current),
                &a.document,
                &b.document,
            )),
            _ => {
                problem = format!("no policy version {diff_a} or {diff_b} in the history");
                None
            }
        }
    } else {
        None
    };
    let notice = match (
        query_u64(&q, "applied"),
        query_u64(&q, "rolled_back"),
        query_u64(&q, "unchanged"),
    ) {
        (Some(v), _, _) => format!("Applied: version {v} is current; the proxies get it now."),
        (_, Some(v), _) => {
            format!("Rolled back: version {v} is current; the proxies get it now.")
        }
        (_, _, Some(v)) => {
            format!("Nothing applied: the document reads the same as version {v}, the current one.")
        }
        _ => String::new(),
    };
    let versions: Vec<u64> = history.iter().rev().map(|p| p.version).collect();
    render(
        StatusCode::OK,
        &PolicyPage {
            layout: Layout::new("Policy", "policy", s, false),
            current,
            document: shown.map(|p| p.document.clone()).unwrap_or_default(),
            shown: shown.map(|p| VersionRow::of(p, current, now)),
            history: history
                .iter()
                .rev()
                .map(|p| VersionRow::of(p, current, now))
                .collect(),
            diff_a: if diff_a > 0 {
                diff_a
            } else {
                versions.get(1).copied().unwrap_or(current)
            },
            diff_b: if diff_b > 0 { diff_b } else { current },
            versions,
            diff,
            notice,
            problem,
            may_edit: s.role.may_operate(),
        },
    )
}

fn refuse(s: &Session, what: &str) -> Answer {
    tracing::warn!(who = %s.who(), what, "console: a policy change refused to a non-operator");
    error_page(
        StatusCode::FORBIDDEN,
        "only an operator may edit, apply or roll back the policy: sign in with an operator token",
    )
}

/// `GET /policy/edit`: the editor, with the current document.
pub(in crate::console) async fn edit(console: &Console, s: &Session) -> Answer {
    if !s.role.may_operate() {
        return refuse(s, "edit");
    }
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let current = hub.policy(0);
    render(
        StatusCode::OK,
        &EditPage {
            layout: Layout::new("Edit the policy", "policy", s, false),
            expected: current.as_ref().map_or(0, |p| p.version),
            document: current.map(|p| p.document).unwrap_or_default(),
            note: String::new(),
            checked: false,
            outcome: String::new(),
            errors: Vec::new(),
            problem: String::new(),
            diff: None,
        },
    )
}

/// Who the history records for a change made by `s`.
fn operator_of(s: &Session) -> String {
    s.role.token_name().unwrap_or(s.role.as_str()).to_string()
}

/// A textarea's text as the browser sent it (CRLF line breaks) with the
/// line breaks a document has.
fn unix_lines(text: &str) -> String {
    text.replace("\r\n", "\n")
}

/// `POST /policy/edit`: `action=dry-run` checks the document as `routerctl
/// policy apply --dry-run` does and shows the diff and every error;
/// `action=apply` applies it (nothing is applied when it has an error).
pub(in crate::console) async fn post_edit(console: &Console, s: &Session, form: &Form) -> Answer {
    if !s.role.may_operate() {
        return refuse(s, "apply");
    }
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let document = unix_lines(form.get("document").map_or("", String::as_str));
    let note = form.get("note").cloned().unwrap_or_default();
    let expected: u64 = form
        .get("expected")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let dry_run = match form.get("action").map(String::as_str) {
        Some("dry-run") => true,
        Some("apply") => false,
        _ => return error_page(StatusCode::BAD_REQUEST, "action: dry-run or apply"),
    };
    let operator = operator_of(s);
    let who = Applier {
        author: AUTHOR,
        operator: &operator,
        message: &note,
    };
    let result = hub
        .apply_policy_by(&document, dry_run, expected, &who)
        .await;
    let current = hub.policy(0);
    let diff = Some(Diff::new(
        current.as_ref().map_or_else(
            || "no policy yet".to_string(),
            |p| format!("current (version {})", p.version),
        ),
        "this document".into(),
        current.as_ref().map_or("", |p| p.document.as_str()),
        &document,
    ));
    let mut page = EditPage {
        layout: Layout::new("Edit the policy", "policy", s, false),
        expected,
        document,
        note,
        checked: true,
        outcome: String::new(),
        errors: Vec::new(),
        problem: String::new(),
        diff,
    };
    let status = match result {
        Ok(a) if !dry_run => {
            tracing::info!(who = %s.who(), version = a.version, changed = a.changed, "console: policy applied");
            return redirect(&if a.changed {
                format!("/policy?applied={}", a.version)
            } else {
                format!("/policy?unchanged={}", a.version)
            });
        }
        Ok(a) => {
            page.outcome = if a.changed {
                format!(
                    "Valid. Applying it makes version {} (nothing is applied yet).",
                    a.version
                )
            } else {
                format!(
                    "Valid, and it reads the same as version {}, the current one: applying it changes nothing.",
                    a.version
                )
            };
            StatusCode::OK
        }
        Err(HubError::Invalid(errors)) => {
            page.errors = errors
                .into_iter()
                .map(|e| FieldRow {
                    field: e.field,
                    reason: e.reason,
                })
                .collect();
            StatusCode::UNPROCESSABLE_ENTITY
        }
        Err(e @ HubError::Conflict { .. }) => {
            page.problem = format!(
                "{e}: someone applied another version since this editor opened; the diff below is against it. Check it, then apply again to replace it."
            );
            page.expected = current.as_ref().map_or(0, |p| p.version);
            StatusCode::CONFLICT
        }
        Err(e) => {
            page.problem = e.to_string();
            StatusCode::SERVICE_UNAVAILABLE
        }
    };
    render(status, &page)
}

/// `GET /policy/rollback?to=N`: what rolling back to N changes, and the
/// form that does it.
pub(in crate::console) async fn confirm_rollback(
    console: &Console,
    s: &Session,
    query: Option<&str>,
) -> Answer {
    if !s.role.may_operate() {
        return refuse(s, "rollback");
    }
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let q = query_pairs(query);
    let Some(to) = query_u64(&q, "to") else {
        return error_page(StatusCode::BAD_REQUEST, "to: the version to roll back to");
    };
    let Some(target) = hub.policy(to).filter(|_| to > 0) else {
        return error_page(
            StatusCode::NOT_FOUND,
            &format!("no policy version {to} in the history"),
        );
    };
    let current = hub.policy(0).unwrap_or_default();
    render(
        StatusCode::OK,
        &RollbackPage {
            layout: Layout::new("Roll back the policy", "policy", s, false),
            current: current.version,
            diff: Diff::new(
                format!("current (version {})", current.version),
                format!("version {to}"),
                &current.document,
                &target.document,
            ),
            target: VersionRow::of(&target, current.version, now_ms()),
        },
    )
}

/// `POST /policy/rollback` (`to`, `expected`, `note`): makes version `to`
/// current again, as a new version, through [`crate::hub::Hub::rollback_by`] (what
/// `routerctl policy rollback` calls).
pub(in crate::console) async fn rollback(console: &Console, s: &Session, form: &Form) -> Answer {
    if !s.role.may_operate() {
        return refuse(s, "rollback");
    }
    let Some(hub) = console.hub.upgrade() else {
        return shutting_down();
    };
    let num = |name: &str| form.get(name).and_then(|v| v.trim().parse::<u64>().ok());
    let Some(to) = num("to").filter(|v| *v > 0) else {
        return error_page(StatusCode::BAD_REQUEST, "to: the version to roll back to");
    };
    let note = form.get("note").cloned().unwrap_or_default();
    let operator = operator_of(s);
    let who = Applier {
        author: AUTHOR,
        operator: &operator,
        message: &note,
    };
    match hub
        .rollback_by(to, num("expected").unwrap_or(0), &who)
        .await
    {
        Ok((version, _)) => {
            tracing::info!(who = %s.who(), to, version, "console: policy rolled back");
            redirect(&format!("/policy?rolled_back={version}"))
        }
        Err(e @ HubError::Conflict { .. }) => error_page(
            StatusCode::CONFLICT,
            &format!(
                "{e}: the policy changed since the confirmation page; look at the history again"
            ),
        ),
        Err(e @ HubError::NotFound(_)) => error_page(StatusCode::NOT_FOUND, &e.to_string()),
        Err(HubError::Invalid(errors)) => error_page(
            StatusCode::UNPROCESSABLE_ENTITY,
            &errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.reason))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        Err(e) => error_page(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_by_side_diff_pairs_changes_and_leaves_out_far_unchanged_lines() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let new = "a\nb\nc\nd\ne\nF\ng\nh\ni\nj\nk\n";
        let rows = side_by_side(old, new);
        let kinds: Vec<&str> = rows.iter().map(|r| r.kind).collect();
        // Lines a and b are more than three lines from a change: a gap.
        assert_eq!(
            kinds,
            ["gap", "same", "same", "same", "change", "same", "same", "same", "same", "add"]
        );
        let change = &rows[4];
        assert_eq!((change.left_no.as_str(), change.left.as_str()), ("6", "f"));
        assert_eq!(
            (change.right_no.as_str(), change.right.as_str()),
            ("6", "F")
        );
        assert_eq!(rows[9].right, "k");
        assert!(rows[9].left_no.is_empty());
        let d = Diff::new("a".into(), "b".into(), old, new);
        assert_eq!((d.removed, d.added), (1, 2));
        assert!(side_by_side(old, old).is_empty());
    }

    #[test]
    fn a_replacement_of_unequal_length_pads_the_shorter_side() {
        let rows = side_by_side("x\ny\n", "z\n");
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.kind == "change"));
        assert_eq!(rows[1].left, "y");
        assert!(rows[1].right_no.is_empty());
    }

    #[test]
    fn textarea_line_breaks_become_newlines_and_times_read_as_utc() {
        assert_eq!(unix_lines("a\r\nb\r\n"), "a\nb\n");
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(86_400_000), "1970-01-02T00:00:00Z");
    }
}

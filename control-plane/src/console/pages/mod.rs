//! The console's pages, one file each; what they share: the layout (nav,
//! who is signed in, the sign-out form with its CSRF token), the error
//! page, times as people read them, and the dispatch by path.

pub(super) mod chart;
#[cfg(test)]
mod cost;
pub(super) mod decisions;
pub(super) mod explain;
pub(super) mod fleet;
pub(super) mod policy;
mod pool_load;
pub(super) mod pools;
pub(super) mod signin;
pub(super) mod tasks;
pub(super) mod tenants;

use askama::Template;
use http::StatusCode;

use super::session::{self, Session};
use super::{html, redirect, with_cookie, Answer, Console, Form};

/// The stylesheet, served as `/static/console.css`.
pub(super) const CSS: &str = include_str!("../../../static/console.css");
/// The live pages' refresh, served as `/static/console.js`.
pub(super) const JS: &str = include_str!("../../../static/console.js");

/// What every signed-in page shows around its content.
pub(super) struct Layout {
    /// The page's title.
    pub(super) title: &'static str,
    /// The nav entry to mark current.
    pub(super) current: &'static str,
    /// Who is signed in.
    pub(super) who: String,
    /// The session's CSRF token, for the page's forms.
    pub(super) csrf: String,
    /// Whether the page refreshes itself (`/static/console.js`).
    pub(super) live: bool,
    /// How often a live page refreshes, seconds.
    pub(super) refresh_seconds: u32,
}

/// How often a live page refreshes unless it says otherwise, seconds.
pub(super) const REFRESH_SECONDS: u32 = 5;
/// How often the Tenants page refreshes, seconds: each refresh reads up
/// to 720 hours of rollups for each of 20 tenants from the proxies'
/// shared store, and its numbers move by the hour and the day.
pub(super) const TENANTS_REFRESH_SECONDS: u32 = 30;

impl Layout {
    pub(super) fn new(title: &'static str, current: &'static str, s: &Session, live: bool) -> Self {
        Self {
            title,
            current,
            who: s.who(),
            csrf: s.csrf.clone(),
            live,
            refresh_seconds: REFRESH_SECONDS,
        }
    }

    /// A live page that refreshes every `seconds` instead (one whose
    /// reads cost more than a page's worth of freshness).
    pub(super) fn every(self, seconds: u32) -> Self {
        Self {
            refresh_seconds: seconds,
            ..self
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    reason: &'a str,
    message: &'a str,
}

/// A page saying what went wrong, with `status`.
pub(super) fn error_page(status: StatusCode, message: &str) -> Answer {
    render(
        status,
        &ErrorPage {
            status: status.as_u16(),
            reason: status.canonical_reason().unwrap_or(""),
            message,
        },
    )
}

/// Renders `t` as the answer's body.
pub(super) fn render(status: StatusCode, t: &impl Template) -> Answer {
    match t.render() {
        Ok(body) => html(status, body),
        Err(e) => {
            tracing::error!(error = %e, "console: a template failed to render");
            html(
                StatusCode::INTERNAL_SERVER_ERROR,
                "<!doctype html><title>error</title><p>the page failed to render".into(),
            )
        }
    }
}

/// A GET of a signed-in person.
pub(super) async fn get(console: &Console, s: &Session, path: &str, query: Option<&str>) -> Answer {
    match path {
        "/" => redirect("/fleet"),
        "/fleet" => fleet::get(console, s).await,
        "/tasks" => tasks::list(console, s, query).await,
        "/policy" => policy::get(console, s, query).await,
        "/policy/edit" => policy::edit(console, s).await,
        "/policy/rollback" => policy::confirm_rollback(console, s, query).await,
        "/pools" => pools::get(console, s).await,
        "/pools/confirm" => pools::confirm(console, s, query).await,
        "/explain" => explain::get(console, s, query).await,
        "/tenants" => tenants::get(console, s, query).await,
        "/decisions" => decisions::get(console, s, query).await,
        _ => match path.strip_prefix("/tasks/") {
            Some(id) if !id.is_empty() && !id.contains('/') => tasks::show(console, s, id).await,
            _ => error_page(StatusCode::NOT_FOUND, "no such page"),
        },
    }
}

/// A POST of a signed-in person whose CSRF token was checked.
pub(super) async fn post(
    console: &Console,
    session_id: &str,
    s: &Session,
    path: &str,
    form: &Form,
) -> Answer {
    if path == "/signout" {
        console.sessions.end(session_id);
        tracing::info!(who = %s.who(), "console: signed out");
        return with_cookie(
            redirect("/signin"),
            &session::cookie(session::COOKIE, "", 0, console.secure),
        );
    }
    match path {
        "/policy/edit" => return policy::post_edit(console, s, form).await,
        "/policy/rollback" => return policy::rollback(console, s, form).await,
        "/pools/act" => return pools::act(console, s, form).await,
        _ => {}
    }
    if let Some(rest) = path.strip_prefix("/tasks/") {
        if let Some((id, action)) = rest.split_once('/') {
            if !id.is_empty() && !id.contains('/') {
                return tasks::act(console, s, id, action, form).await;
            }
        }
    }
    error_page(StatusCode::NOT_FOUND, "no such action")
}

/// How long ago `then` was, from `now` (Unix ms), as people say it.
pub(super) fn ago(then_ms: i64, now_ms: i64) -> String {
    if then_ms <= 0 {
        return "never".into();
    }
    format!("{} ago", span(now_ms.saturating_sub(then_ms)))
}

/// How long until `then`, from `now` (Unix ms); `past` once it is over.
pub(super) fn left(then_ms: i64, now_ms: i64) -> String {
    let d = then_ms.saturating_sub(now_ms);
    if d <= 0 {
        "past".into()
    } else {
        span(d)
    }
}

/// A span of milliseconds: `850 ms`, `12 s`, `4 min 10 s`, `3 h 5 min`, `2 d 4 h`.
pub(super) fn span(ms: i64) -> String {
    let ms = ms.max(0);
    let s = ms / 1000;
    match s {
        0 => format!("{ms} ms"),
        1..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_as_people_say_them() {
        assert_eq!(span(850), "850 ms");
        assert_eq!(span(12_000), "12 s");
        assert_eq!(span(250_000), "4 min 10 s");
        assert_eq!(span(3 * 3_600_000 + 300_000), "3 h 5 min");
        assert_eq!(span(2 * 86_400_000 + 4 * 3_600_000), "2 d 4 h");
        assert_eq!(ago(0, 5), "never");
        assert_eq!(ago(1_000, 3_000), "2 s ago");
        assert_eq!(left(1_000, 3_000), "past");
        assert_eq!(left(63_000, 3_000), "1 min 0 s");
    }
}

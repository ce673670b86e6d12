//! `/signin`: the sign-in form (a token), and one-time links
//! (`/signin?once=ID`).

use askama::Template;
use http::StatusCode;

use super::super::session::{self, Session};
use super::super::{redirect, with_cookie, Answer, Console, Form};
use super::{error_page, render};
use crate::auth::Role;

/// How long the sign-in form's double-submit cookie lives.
const FORM_TTL_S: u64 = 600;

#[derive(Template)]
#[template(path = "signin.html")]
struct SigninPage<'a> {
    nonce: &'a str,
    error: &'a str,
    open: bool,
}

/// The form, with its double-submit value (the one the browser holds
/// already, so that a second tab or a stray request for the form does not
/// invalidate the first; else a fresh one), and `error` above it.
fn form(
    console: &Console,
    parts: &http::request::Parts,
    status: StatusCode,
    error: &str,
) -> Answer {
    let held = super::super::cookie(parts, session::SIGNIN_COOKIE)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string);
    let nonce = match held {
        Some(n) => n,
        None => match console.sessions.random() {
            Ok(n) => n,
            Err(_) => return error_page(StatusCode::INTERNAL_SERVER_ERROR, "no randomness"),
        },
    };
    let page = render(
        status,
        &SigninPage {
            nonce: &nonce,
            error,
            open: console.tokens.is_open(),
        },
    );
    with_cookie(
        page,
        &session::cookie(session::SIGNIN_COOKIE, &nonce, FORM_TTL_S, console.secure),
    )
}

/// Starts a session for `role` and sends them to the fleet page.
fn signed_in(console: &Console, role: Role, how: &str) -> Answer {
    match console.sessions.create(role) {
        Ok((id, s)) => {
            tracing::info!(who = %s.who(), how, "console: signed in");
            signed_in_answer(console, &id, &s)
        }
        Err(e) => error_page(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn signed_in_answer(console: &Console, id: &str, _s: &Session) -> Answer {
    let r = with_cookie(
        redirect("/fleet"),
        &session::session_cookie(id, console.sessions.ttl(), console.secure),
    );
    with_cookie(
        r,
        &session::cookie(session::SIGNIN_COOKIE, "", 0, console.secure),
    )
}

/// `GET /signin` and `GET /signin?once=ID`.
pub(in crate::console) fn get(console: &Console, parts: &http::request::Parts) -> Answer {
    let once = parts.uri.query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "once")
            .map(|(_, v)| v.into_owned())
    });
    match once {
        Some(id) => match console.sessions.take_link(&id) {
            Some(role) => signed_in(console, role, "one-time link"),
            None => {
                tracing::warn!("console: a used, expired or unknown sign-in link");
                error_page(
                    StatusCode::FORBIDDEN,
                    "this sign-in link was used already, has expired (5 minutes) or was never made",
                )
            }
        },
        None => form(console, parts, StatusCode::OK, ""),
    }
}

/// `POST /signin`: a token from the form.
pub(in crate::console) fn post(
    console: &Console,
    parts: &http::request::Parts,
    form_fields: &Form,
) -> Answer {
    let from_cookie = super::super::cookie(parts, session::SIGNIN_COOKIE);
    let from_form = form_fields.get("nonce").map(String::as_str);
    if !session::same_secret(from_cookie, from_form) {
        tracing::warn!("console: a sign-in without the form's own value refused");
        return error_page(
            StatusCode::FORBIDDEN,
            "this sign-in did not come from the console's own form: reload it and try again",
        );
    }
    if console.tokens.is_open() {
        return form(
            console,
            parts,
            StatusCode::FORBIDDEN,
            "this control plane has no tokens: sign in with the one-time link it printed",
        );
    }
    let token = form_fields
        .get("token")
        .map(|t| t.trim())
        .unwrap_or_default();
    if token.is_empty() {
        return form(console, parts, StatusCode::UNAUTHORIZED, "give a token");
    }
    match console.tokens.role(Some(token.as_bytes())) {
        Some(role) if role.console_rank().is_some() => signed_in(console, role, "token"),
        Some(_) => {
            tracing::warn!("console: a proxy token tried to sign in");
            form(
                console,
                parts,
                StatusCode::FORBIDDEN,
                "a proxy token does not sign in to the console",
            )
        }
        None => {
            tracing::warn!("console: a sign-in with an unknown token");
            form(console, parts, StatusCode::UNAUTHORIZED, "unknown token")
        }
    }
}

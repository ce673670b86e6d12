//! The router's own errors in the client's dialect, and what an upstream's
//! error answer means for the chain.
//!
//! # Answers
//!
//! [`render`] takes the router's error kind ([`ErrorKind`], named by the
//! same labels as the router's outcomes: `queue_full`, `rate_limited`,
//! ...) and gives the status and body a client of each dialect expects:
//!
//! - **OpenAI**: the router's own shape and statuses,
//!   `{"error": {"message", "type": label, "code": label}}`.
//! - **Anthropic**: `{"type": "error", "error": {"type", "message",
//!   "code": label}}` (the router's label kept in `code`). Sheds for
//!   capacity (`queue_full`, `queue_timeout`, `no_backend`, `overloaded`)
//!   are `529 overloaded_error`, which Anthropic clients retry with
//!   backoff; `rate_limited` is `429 rate_limit_error`; a spent budget is
//!   `402 billing_error`; timeouts are `504 timeout_error`; upstream
//!   failures `502 api_error`; the rest keep the router's status with the
//!   Anthropic type of that status (`invalid_request_error`,
//!   `authentication_error`, `permission_error`, `not_found_error`,
//!   `request_too_large`).
//! - **Gemini**: Google's shape, `{"error": {"code", "message",
//!   "status"}}` with the router's status and the matching canonical
//!   status name (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`, ...).
//!
//! `Retry-After` ([`ErrorAnswer::retry_after`]) is the caller's for a rate
//! limit and 1 second for a shed, as the router answers today.
//!
//! # Inside a stream
//!
//! After the first event the status is sent; a failure then is one
//! `event: error` in the client's dialect ([`stream_event`]), Anthropic's
//! `{"type": "error", "error": {...}}` or the router's OpenAI-shaped
//! `{"error": {...}}`, and nothing after it.
//!
//! # Upstream errors
//!
//! [`classify_upstream`] says what an upstream's error answer is for the
//! chain: Anthropic's `529` or an `overloaded_error` body (whatever the
//! status) is a server failure like a 503, retried on the next pool.

use serde_json::{json, Value};

use crate::Dialect;

/// The router's error kinds (the labels of its outcomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Evicted from a full queue.
    QueueFull,
    /// Waited past the queue timeout.
    QueueTimeout,
    /// No backend to send to.
    NoBackend,
    /// The router's own capacity limit.
    Overloaded,
    /// The request's deadline ran out.
    DeadlineExhausted,
    /// The tenant's rate limit.
    RateLimited,
    /// A cost ceiling or budget.
    BudgetExceeded,
    /// A malformed request.
    InvalidRequest,
    /// A request body over the limit.
    PayloadTooLarge,
    /// The client's body did not arrive in time.
    RequestTimeout,
    /// No or a bad key.
    Unauthorized,
    /// Not allowed for this tenant.
    Forbidden,
    /// The route needs approval.
    ApprovalRequired,
    /// Unknown path.
    NotFound,
    /// Wrong method.
    MethodNotAllowed,
    /// An `Idempotency-Key` reused for another request.
    IdempotencyMismatch,
    /// A replay whose answer was too large to keep.
    NotReplayable,
    /// A request that may already have been carried out.
    OutcomeUnknown,
    /// The shared idempotency store is down.
    SharedStoreUnavailable,
    /// Parked as a task while every pool is down.
    Parked,
    /// The backend failed.
    UpstreamError,
    /// The backend could not be reached.
    ConnectError,
    /// The backend timed out.
    Timeout,
    /// No first token in time.
    FirstTokenTimeout,
    /// The backend answered 429.
    Status429,
    /// The backend answered 5xx (or Anthropic's 529).
    Status5xx,
    /// The backend's answer was not JSON.
    MalformedJson,
    /// The backend broke the connection.
    UpstreamReset,
    /// The backend reported an error inside its stream.
    StreamError,
    /// The backend's stream stalled.
    StreamStalled,
}

const ALL: &[ErrorKind] = &[
    ErrorKind::QueueFull,
    ErrorKind::QueueTimeout,
    ErrorKind::NoBackend,
    ErrorKind::Overloaded,
    ErrorKind::DeadlineExhausted,
    ErrorKind::RateLimited,
    ErrorKind::BudgetExceeded,
    ErrorKind::InvalidRequest,
    ErrorKind::PayloadTooLarge,
    ErrorKind::RequestTimeout,
    ErrorKind::Unauthorized,
    ErrorKind::Forbidden,
    ErrorKind::ApprovalRequired,
    ErrorKind::NotFound,
    ErrorKind::MethodNotAllowed,
    ErrorKind::IdempotencyMismatch,
    ErrorKind::NotReplayable,
    ErrorKind::OutcomeUnknown,
    ErrorKind::SharedStoreUnavailable,
    ErrorKind::Parked,
    ErrorKind::UpstreamError,
    ErrorKind::ConnectError,
    ErrorKind::Timeout,
    ErrorKind::FirstTokenTimeout,
    ErrorKind::Status429,
    ErrorKind::Status5xx,
    ErrorKind::MalformedJson,
    ErrorKind::UpstreamReset,
    ErrorKind::StreamError,
    ErrorKind::StreamStalled,
];

impl ErrorKind {
    /// Every kind.
    pub const ALL: &'static [ErrorKind] = ALL;

    /// Its label (the router's outcome label).
    pub const fn label(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
            Self::NoBackend => "no_backend",
            Self::Overloaded => "overloaded",
            Self::DeadlineExhausted => "deadline_exhausted",
            Self::RateLimited => "rate_limited",
            Self::BudgetExceeded => "budget_exceeded",
            Self::InvalidRequest => "invalid_request",
            Self::PayloadTooLarge => "payload_too_large",
            Self::RequestTimeout => "request_timeout",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::ApprovalRequired => "approval_required",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::IdempotencyMismatch => "idempotency_mismatch",
            Self::NotReplayable => "not_replayable",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::SharedStoreUnavailable => "shared_store_unavailable",
            Self::Parked => "parked",
            Self::UpstreamError => "upstream_error",
            Self::ConnectError => "connect_error",
            Self::Timeout => "timeout",
            Self::FirstTokenTimeout => "first_token_timeout",
            Self::Status429 => "status_429",
            Self::Status5xx => "status_5xx",
            Self::MalformedJson => "malformed_json",
            Self::UpstreamReset => "upstream_reset",
            Self::StreamError => "stream_error",
            Self::StreamStalled => "stream_stalled",
        }
    }

    /// The kind of a label.
    pub fn from_label(label: &str) -> Option<Self> {
        ALL.iter().copied().find(|k| k.label() == label)
    }

    /// A shed for capacity: the client should retry after a while.
    pub const fn is_capacity_shed(self) -> bool {
        matches!(
            self,
            Self::QueueFull | Self::QueueTimeout | Self::NoBackend | Self::Overloaded
        )
    }

    /// The router's HTTP status for it (its OpenAI-shaped answers).
    pub const fn status(self) -> u16 {
        match self {
            Self::QueueFull
            | Self::QueueTimeout
            | Self::NoBackend
            | Self::Overloaded
            | Self::SharedStoreUnavailable
            | Self::Parked => 503,
            Self::DeadlineExhausted
            | Self::Timeout
            | Self::FirstTokenTimeout
            | Self::StreamStalled => 504,
            Self::NotReplayable | Self::OutcomeUnknown => 409,
            Self::IdempotencyMismatch => 422,
            Self::ApprovalRequired | Self::Forbidden => 403,
            Self::BudgetExceeded => 402,
            Self::RateLimited | Self::Status429 => 429,
            Self::InvalidRequest => 400,
            Self::PayloadTooLarge => 413,
            Self::RequestTimeout => 408,
            Self::Unauthorized => 401,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::UpstreamError
            | Self::ConnectError
            | Self::Status5xx
            | Self::MalformedJson
            | Self::UpstreamReset
            | Self::StreamError => 502,
        }
    }

    /// Anthropic's status and error type for it.
    pub const fn anthropic(self) -> (u16, &'static str) {
        if self.is_capacity_shed() {
            return (529, "overloaded_error");
        }
        match self.status() {
            429 => (429, "rate_limit_error"),
            402 => (402, "billing_error"),
            401 => (401, "authentication_error"),
            403 => (403, "permission_error"),
            404 => (404, "not_found_error"),
            413 => (413, "request_too_large"),
            504 | 408 => (self.status(), "timeout_error"),
            s @ (400 | 405 | 409 | 422) => (s, "invalid_request_error"),
            s => (s, "api_error"),
        }
    }

    /// Google's canonical status name for the router's status.
    pub const fn gemini_status(self) -> &'static str {
        match self.status() {
            400 | 413 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            402 => "FAILED_PRECONDITION",
            403 => "PERMISSION_DENIED",
            404 | 405 => "NOT_FOUND",
            408 | 504 => "DEADLINE_EXCEEDED",
            409 | 422 => "ABORTED",
            429 => "RESOURCE_EXHAUSTED",
            503 => "UNAVAILABLE",
            _ => "INTERNAL",
        }
    }
}

/// An error answer in a dialect.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorAnswer {
    /// HTTP status.
    pub status: u16,
    /// The JSON body (the caller may add fields, e.g. a request id).
    pub body: Value,
    /// Seconds for `Retry-After`, when one is sent.
    pub retry_after: Option<u64>,
}

/// The OpenAI error envelope, `{"error": {"message", "type", "code"}}`:
/// the one place it is written (the router's own errors, its stream
/// events, an upstream's error translated for an OpenAI client, the mock's
/// OpenAI-style errors). A caller may add fields to the error object
/// (`request_id`, a parked task's view); `serde_json` writes the keys
/// sorted, so the bytes do not depend on the order they were added in.
pub fn openai_envelope(message: &str, ty: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": ty, "code": code}})
}

/// The router's error `kind` (with its message) as an answer in
/// `dialect`. `retry_after` is the wait of a rate limit, in seconds.
pub fn render(
    dialect: Dialect,
    kind: ErrorKind,
    message: &str,
    retry_after: Option<u64>,
) -> ErrorAnswer {
    let label = kind.label();
    let (status, body) = match dialect {
        Dialect::OpenAi => (kind.status(), openai_envelope(message, label, Some(label))),
        Dialect::Anthropic => {
            let (status, ty) = kind.anthropic();
            (
                status,
                json!({"type": "error", "error": {"type": ty, "message": message, "code": label}}),
            )
        }
        Dialect::Gemini => (
            kind.status(),
            json!({"error": {"code": kind.status(), "message": message, "status": kind.gemini_status()}}),
        ),
    };
    let retry_after = match kind {
        ErrorKind::RateLimited => Some(retry_after.unwrap_or(1).max(1)),
        k if k.status() == 503 || k.is_capacity_shed() => Some(1),
        _ => None,
    };
    ErrorAnswer {
        status,
        body,
        retry_after,
    }
}

/// A failure inside a stream as one server-sent event in `dialect`.
/// `overloaded` marks an upstream that said it is overloaded (an Anthropic
/// client then gets `overloaded_error`, which it retries).
pub fn stream_event(dialect: Dialect, kind: ErrorKind, overloaded: bool, message: &str) -> Vec<u8> {
    let label = kind.label();
    let data = match dialect {
        Dialect::Anthropic => {
            let ty = if overloaded {
                "overloaded_error"
            } else {
                kind.anthropic().1
            };
            json!({"type": "error", "error": {"type": ty, "message": message, "code": label}})
        }
        Dialect::OpenAi => openai_envelope(message, label, Some(label)),
        Dialect::Gemini => {
            json!({"error": {"code": kind.status(), "message": message, "status": kind.gemini_status()}})
        }
    };
    let mut out = Vec::with_capacity(64 + message.len());
    if dialect != Dialect::Gemini {
        out.extend_from_slice(b"event: error\n");
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
    out
}

/// An upstream's error answer (`status`, `body`, in any dialect) as a
/// client of dialect `to` expects it, passed on when no pool of the chain
/// answered (the upstream's status is kept; its headers, `Retry-After`
/// among them, are the caller's).
///
/// The message is the upstream's `error.message` (OpenAI, Anthropic and
/// Gemini all put it there; older vLLM servers at the top level), cut to [`crate::stream::MAX_MESSAGE_CHARS`]
/// characters, else "the backend answered STATUS": a body that is not an
/// error object (an HTML page from a load balancer) is not passed on. An
/// Anthropic client gets the error type of the status (`529` and `503`
/// are `overloaded_error`, which its SDKs retry with backoff), or the
/// upstream's own type when the upstream spoke Anthropic; a Gemini client
/// Google's canonical status name; an OpenAI client the upstream's `type`
/// when it gave one.
pub fn from_upstream(to: Dialect, status: u16, body: &[u8]) -> ErrorAnswer {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let given = |key: &str| error.and_then(|e| e.get(key)).and_then(Value::as_str);
    // Older vLLM servers put the message at the top level.
    let top = parsed
        .as_ref()
        .and_then(|v| v.get("message"))
        .and_then(Value::as_str);
    let message = match given("message").or(top).filter(|m| !m.is_empty()) {
        Some(m) => crate::stream::cut_message(m),
        None => format!("the backend answered {status}"),
    };
    let anthropic_shaped = parsed
        .as_ref()
        .and_then(|v| v.get("type"))
        .and_then(Value::as_str)
        == Some("error");
    let body = match to {
        Dialect::Anthropic => {
            let ty = match given("type") {
                Some(t) if anthropic_shaped => t,
                _ => anthropic_type_of_status(status),
            };
            json!({"type": "error", "error": {"type": ty, "message": message}})
        }
        Dialect::OpenAi => {
            let ty = given("type").unwrap_or("upstream_error");
            openai_envelope(&message, ty, None)
        }
        Dialect::Gemini => json!({"error": {
            "code": status,
            "message": message,
            "status": gemini_status_of(status),
        }}),
    };
    ErrorAnswer {
        status,
        body,
        retry_after: None,
    }
}

/// Anthropic's error type for an HTTP status.
pub const fn anthropic_type_of_status(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 504 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

/// Google's canonical status name for an HTTP status.
const fn gemini_status_of(status: u16) -> &'static str {
    match status {
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        408 | 504 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        503 | 529 => "UNAVAILABLE",
        500..=599 => "INTERNAL",
        _ => "INVALID_ARGUMENT",
    }
}

/// What an upstream's error answer (`status`, `body`) of `dialect` is for
/// the chain: `Status5xx` (retried like a 503), `Status429`, or `None`
/// for an answer that is not a retryable failure.
pub fn classify_upstream(dialect: Dialect, status: u16, body: &[u8]) -> Option<ErrorKind> {
    if dialect == Dialect::Anthropic {
        let overloaded = status == 529
            || serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| {
                    v.get("error")
                        .and_then(|e| e.get("type"))
                        .and_then(Value::as_str)
                        .map(|t| t == "overloaded_error")
                })
                .unwrap_or(false);
        if overloaded {
            return Some(ErrorKind::Status5xx);
        }
    }
    match status {
        429 => Some(ErrorKind::Status429),
        500..=599 => Some(ErrorKind::Status5xx),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_sheds_are_529_overloaded_error_for_anthropic_clients() {
        for kind in [
            ErrorKind::QueueFull,
            ErrorKind::QueueTimeout,
            ErrorKind::NoBackend,
            ErrorKind::Overloaded,
        ] {
            let a = render(Dialect::Anthropic, kind, "pool p is full", None);
            assert_eq!(a.status, 529, "{kind:?}");
            assert_eq!(a.body["type"], "error");
            assert_eq!(a.body["error"]["type"], "overloaded_error");
            assert_eq!(a.body["error"]["message"], "pool p is full");
            assert_eq!(a.body["error"]["code"], kind.label());
            assert_eq!(a.retry_after, Some(1));
            // The router's own shape is unchanged for OpenAI clients.
            let o = render(Dialect::OpenAi, kind, "pool p is full", None);
            assert_eq!(o.status, 503);
            assert_eq!(o.body["error"]["type"], kind.label());
        }
    }

    #[test]
    fn rate_limiting_is_429_rate_limit_error_with_retry_after() {
        let a = render(
            Dialect::Anthropic,
            ErrorKind::RateLimited,
            "slow down",
            Some(7),
        );
        assert_eq!(a.status, 429);
        assert_eq!(a.body["error"]["type"], "rate_limit_error");
        assert_eq!(a.retry_after, Some(7));
        let g = render(
            Dialect::Gemini,
            ErrorKind::RateLimited,
            "slow down",
            Some(7),
        );
        assert_eq!(g.status, 429);
        assert_eq!(g.body["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(g.body["error"]["code"], 429);
    }

    #[test]
    fn other_kinds_keep_the_routers_status_with_the_anthropic_type_of_it() {
        let cases = [
            (ErrorKind::InvalidRequest, 400, "invalid_request_error"),
            (ErrorKind::Unauthorized, 401, "authentication_error"),
            (ErrorKind::BudgetExceeded, 402, "billing_error"),
            (ErrorKind::Forbidden, 403, "permission_error"),
            (ErrorKind::NotFound, 404, "not_found_error"),
            (ErrorKind::PayloadTooLarge, 413, "request_too_large"),
            (ErrorKind::DeadlineExhausted, 504, "timeout_error"),
            (ErrorKind::UpstreamError, 502, "api_error"),
        ];
        for (kind, status, ty) in cases {
            let a = render(Dialect::Anthropic, kind, "m", None);
            assert_eq!(
                (a.status, a.body["error"]["type"].as_str()),
                (status, Some(ty))
            );
        }
    }

    #[test]
    fn the_table_of_docs_dialects_md() {
        let rows = [
            (
                ErrorKind::QueueFull,
                503,
                (529, "overloaded_error"),
                "UNAVAILABLE",
            ),
            (
                ErrorKind::RateLimited,
                429,
                (429, "rate_limit_error"),
                "RESOURCE_EXHAUSTED",
            ),
            (
                ErrorKind::BudgetExceeded,
                402,
                (402, "billing_error"),
                "FAILED_PRECONDITION",
            ),
            (
                ErrorKind::InvalidRequest,
                400,
                (400, "invalid_request_error"),
                "INVALID_ARGUMENT",
            ),
            (
                ErrorKind::Unauthorized,
                401,
                (401, "authentication_error"),
                "UNAUTHENTICATED",
            ),
            (
                ErrorKind::Forbidden,
                403,
                (403, "permission_error"),
                "PERMISSION_DENIED",
            ),
            (
                ErrorKind::NotFound,
                404,
                (404, "not_found_error"),
                "NOT_FOUND",
            ),
            (
                ErrorKind::PayloadTooLarge,
                413,
                (413, "request_too_large"),
                "INVALID_ARGUMENT",
            ),
            (
                ErrorKind::DeadlineExhausted,
                504,
                (504, "timeout_error"),
                "DEADLINE_EXCEEDED",
            ),
            (
                ErrorKind::UpstreamError,
                502,
                (502, "api_error"),
                "INTERNAL",
            ),
        ];
        for (kind, openai, (astatus, atype), gstatus) in rows {
            let o = render(Dialect::OpenAi, kind, "m", None);
            assert_eq!(o.status, openai, "{kind:?}");
            assert_eq!(
                o.body,
                json!({"error": {"message": "m", "type": kind.label(), "code": kind.label()}})
            );
            let a = render(Dialect::Anthropic, kind, "m", None);
            assert_eq!(
                (a.status, a.body["error"]["type"].as_str()),
                (astatus, Some(atype))
            );
            let g = render(Dialect::Gemini, kind, "m", None);
            assert_eq!(g.status, openai);
            assert_eq!(g.body["error"]["status"], gstatus);
        }
    }

    #[test]
    fn every_label_names_one_kind() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_label(k.label()), Some(*k));
        }
        assert_eq!(ErrorKind::from_label("nope"), None);
    }

    #[test]
    fn stream_errors_are_one_error_event_in_the_clients_dialect() {
        let a = String::from_utf8(stream_event(
            Dialect::Anthropic,
            ErrorKind::StreamError,
            true,
            "Overloaded",
        ))
        .unwrap();
        let data = a
            .strip_prefix("event: error\ndata: ")
            .and_then(|d| d.strip_suffix("\n\n"))
            .unwrap();
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded", "code": "stream_error"}})
        );
        let o = stream_event(Dialect::OpenAi, ErrorKind::UpstreamReset, false, "cut");
        assert!(String::from_utf8(o)
            .unwrap()
            .starts_with("event: error\ndata: {\"error\":"));
    }

    #[test]
    fn an_upstreams_error_answer_reaches_the_client_in_its_dialect() {
        // vLLM's 400, an OpenAI-shaped body.
        let vllm = br#"{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}"#;
        let a = from_upstream(Dialect::Anthropic, 400, vllm);
        assert_eq!(a.status, 400);
        assert_eq!(
            a.body,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens is too large"}})
        );
        let openai = br#"{"error":{"message":"Rate limit reached","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#;
        let a = from_upstream(Dialect::Anthropic, 429, openai);
        assert_eq!(
            (
                a.status,
                a.body["error"]["type"].as_str(),
                a.body["error"]["message"].as_str()
            ),
            (429, Some("rate_limit_error"), Some("Rate limit reached"))
        );
        // 503 and 529 are overloaded (retried by Anthropic's SDKs), other 5xx api_error.
        assert_eq!(
            from_upstream(Dialect::Anthropic, 503, b"").body["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(
            from_upstream(Dialect::Anthropic, 500, b"<html>").body["error"]["message"],
            "the backend answered 500"
        );
        assert_eq!(
            from_upstream(Dialect::Anthropic, 502, b"").body["error"]["type"],
            "api_error"
        );
        // An Anthropic upstream keeps its own type for an Anthropic client.
        let anth =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let a = from_upstream(Dialect::Anthropic, 500, anth);
        assert_eq!(a.body["error"]["type"], "overloaded_error");
        // ... and reaches an OpenAI client as an OpenAI error.
        let o = from_upstream(Dialect::OpenAi, 529, anth);
        assert_eq!(o.status, 529);
        assert_eq!(o.body["error"]["message"], "Overloaded");
        assert_eq!(o.body["error"]["type"], "overloaded_error");
        let g = from_upstream(Dialect::Gemini, 429, openai);
        assert_eq!(g.body["error"]["status"], "RESOURCE_EXHAUSTED");
        // A long message is cut.
        let long = json!({"error": {"message": "x".repeat(5000)}}).to_string();
        let a = from_upstream(Dialect::Anthropic, 400, long.as_bytes());
        let m = a.body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(m.chars().count(), crate::stream::MAX_MESSAGE_CHARS);
    }

    #[test]
    fn an_anthropic_529_or_overloaded_error_is_a_retryable_server_failure() {
        let body =
            br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(
            classify_upstream(Dialect::Anthropic, 529, body),
            Some(ErrorKind::Status5xx)
        );
        assert_eq!(
            classify_upstream(Dialect::Anthropic, 400, body),
            Some(ErrorKind::Status5xx)
        );
        assert_eq!(
            classify_upstream(Dialect::Anthropic, 529, b""),
            Some(ErrorKind::Status5xx)
        );
        assert_eq!(
            classify_upstream(Dialect::OpenAi, 429, b""),
            Some(ErrorKind::Status429)
        );
        assert_eq!(classify_upstream(Dialect::Anthropic, 400, b"{}"), None);
        assert_eq!(
            classify_upstream(Dialect::Gemini, 503, b""),
            Some(ErrorKind::Status5xx)
        );
    }
}

//! The proxy's errors, classified by type.
//!
//! Every way a request can fail without a backend's answer is one variant
//! of [`ProxyError`]; the variant alone decides the HTTP status, the
//! OpenAI-shaped error `type`, the [`Outcome`] in metrics and logs, and
//! whether `Retry-After` is sent. Nothing downstream inspects message text.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use router_policy::Outcome;

/// Why a request was answered by the router itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// Evicted as the oldest waiter of a full queue.
    #[error("evicted from the full queue of pool {pool}")]
    QueueFull {
        /// Pool whose queue was full.
        pool: String,
    },
    /// Waited past the pool's queue timeout.
    #[error("waited {waited_ms} ms in the queue of pool {pool}, past its timeout")]
    QueueTimeout {
        /// Pool.
        pool: String,
        /// Time spent waiting.
        waited_ms: u64,
    },
    /// No pool of the route has a backend to send to.
    #[error("no backend available: {detail}")]
    NoBackend {
        /// Which pools were looked at and why each was passed over.
        detail: String,
    },
    /// The proxy's own cap on buffered request bytes or open connections
    /// is reached: try again shortly.
    #[error("the router is at its limit of {what}; retry shortly")]
    Overloaded {
        /// Which limit (`buffered request bytes`, `open connections`).
        what: &'static str,
    },
    /// No pool can answer inside what is left of the deadline, or it ran out.
    #[error("deadline exhausted: {detail}")]
    DeadlineExhausted {
        /// What was tried and skipped.
        detail: String,
    },
    /// A retry of a request whose answer cannot be replayed (it was
    /// streamed), or that is still streaming.
    #[error("request {0} was already answered as a stream or is still streaming; it is not generated twice")]
    DuplicateRequest(String),
    /// An `Idempotency-Key` reused with a different request.
    #[error("Idempotency-Key {0} was used for a different request")]
    IdempotencyMismatch(String),
    /// The route needs approval and no valid token was given.
    #[error("route {0} requires approval: send a valid X-Router-Approval token")]
    ApprovalRequired(String),
    /// A cost ceiling forbids every eligible pool.
    #[error("budget exceeded: {detail}")]
    BudgetExceeded {
        /// The decision's reason.
        detail: String,
    },
    /// The request body or a header is malformed.
    #[error("{0}")]
    InvalidRequest(String),
    /// The request body is over the limit.
    #[error("request body over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The client did not send its body in time.
    #[error("the request body did not arrive within {0:?}")]
    RequestTimeout(Duration),
    /// The backend could not be reached or broke the connection.
    #[error("upstream {endpoint} failed: {detail}")]
    Upstream {
        /// The endpoint tried.
        endpoint: String,
        /// What went wrong.
        detail: String,
    },
    /// An admin call without a valid bearer token.
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// Unknown admin path.
    #[error("not found")]
    NotFound,
    /// Known path, wrong method.
    #[error("method not allowed")]
    MethodNotAllowed,
}

impl ProxyError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::QueueFull { .. }
            | Self::QueueTimeout { .. }
            | Self::NoBackend { .. }
            | Self::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::DeadlineExhausted { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::DuplicateRequest(_) => StatusCode::CONFLICT,
            Self::IdempotencyMismatch(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::ApprovalRequired(_) => StatusCode::FORBIDDEN,
            Self::BudgetExceeded { .. } => StatusCode::PAYMENT_REQUIRED,
            Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The outcome this answer records: its label is the error `type` in
    /// the JSON body and the outcome in metrics and the route log.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::QueueFull { .. } => Outcome::QueueFull,
            Self::QueueTimeout { .. } => Outcome::QueueTimeout,
            Self::NoBackend { .. } => Outcome::NoBackend,
            Self::Overloaded { .. } => Outcome::Overloaded,
            Self::DeadlineExhausted { .. } => Outcome::DeadlineExhausted,
            Self::DuplicateRequest(_) => Outcome::DuplicateRequest,
            Self::IdempotencyMismatch(_) => Outcome::IdempotencyMismatch,
            Self::ApprovalRequired(_) => Outcome::ApprovalRequired,
            Self::BudgetExceeded { .. } => Outcome::BudgetExceeded,
            Self::InvalidRequest(_) => Outcome::InvalidRequest,
            Self::PayloadTooLarge { .. } => Outcome::PayloadTooLarge,
            Self::RequestTimeout(_) => Outcome::RequestTimeout,
            Self::Upstream { .. } => Outcome::UpstreamError,
            Self::Unauthorized => Outcome::Unauthorized,
            Self::NotFound => Outcome::NotFound,
            Self::MethodNotAllowed => Outcome::MethodNotAllowed,
        }
    }

    /// The error `type` in the JSON body ([`ProxyError::outcome`]'s label).
    pub fn kind(&self) -> &'static str {
        self.outcome().as_str()
    }

    /// True for the load-shedding answers (counted as sheds).
    pub fn is_shed(&self) -> bool {
        self.outcome().is_shed()
    }

    /// The OpenAI-shaped JSON answer.
    pub fn to_response(&self, request_id: Option<&str>) -> Response<Bytes> {
        let body = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.kind(),
                "code": self.kind(),
                "request_id": request_id,
            }
        });
        let mut resp = Response::new(Bytes::from(body.to_string()));
        *resp.status_mut() = self.status();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if matches!(self, Self::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shed_answers_are_typed_json_with_retry_after() {
        let e = ProxyError::QueueFull { pool: "p".into() };
        let resp = e.to_response(Some("r1"));
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        let v: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
        assert_eq!(v["error"]["type"], "queue_full");
        assert_eq!(v["error"]["request_id"], "r1");
        assert!(e.is_shed());
    }

    #[test]
    fn client_errors_have_no_retry_after() {
        let resp = ProxyError::PayloadTooLarge { limit: 1 }.to_response(None);
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
    }
}

//! The proxy's errors, classified by type.
//!
//! Every way a request can fail without a backend's answer is one variant
//! of [`ProxyError`]; the variant alone decides the HTTP status, the
//! OpenAI-shaped error `type`, the [`Outcome`] in metrics and logs, and
//! whether `Retry-After` is sent. Nothing downstream inspects message text.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use router_dialect::errors::ErrorKind;
use router_dialect::Dialect;
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
    /// A retry of a request whose answer was too large to store.
    #[error("request {0} was already answered and its answer was too large to keep for replay; it is not generated twice (use a new Idempotency-Key to try again)")]
    NotReplayable(String),
    /// A retry of a SEND/DESTRUCTIVE request whose first attempt may have
    /// reached a backend and ended without an answer.
    #[error("request {key} may already have been carried out (its first attempt ended without an answer); it is not sent again: use a new Idempotency-Key to try again")]
    OutcomeUnknown {
        /// The key.
        key: String,
        /// The first request's route record (JSON), for the client.
        route: Bytes,
    },
    /// The shared store is down and something this request needs lives
    /// there; the message names what ([`StoreNeed`]).
    #[error("the shared store is unavailable and {0}: retry shortly")]
    SharedStoreUnavailable(StoreNeed),
    /// An `Idempotency-Key` reused with a different request.
    #[error("Idempotency-Key {0} was used for a different request")]
    IdempotencyMismatch(String),
    /// The route needs approval and no valid token was given.
    #[error("route {route} requires approval: {why}")]
    ApprovalRequired {
        /// The route's name.
        route: String,
        /// What was wrong with the token, or that none can pass here.
        why: ApprovalRefusal,
    },
    /// A cost ceiling forbids every eligible pool.
    #[error("budget exceeded: {detail}")]
    BudgetExceeded {
        /// The decision's reason.
        detail: String,
    },
    /// The tenant's spend budget cannot take this call: the same answer as
    /// [`ProxyError::BudgetExceeded`] (402 `budget_exceeded`), but a
    /// refusal the tenant earned, not a shed (the router had capacity).
    #[error("budget exceeded: {detail}")]
    TenantBudgetExceeded {
        /// Which budget, what is left and when it resets.
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
    /// The backend could not be reached or broke the connection. The
    /// client's answer names the pool, not the endpoint (an internal
    /// address); the route log has the endpoint.
    #[error("a backend of pool {pool} failed: {detail}")]
    Upstream {
        /// The pool tried.
        pool: String,
        /// What went wrong.
        detail: String,
    },
    /// The tenant is over its rate limit or its concurrent requests
    /// (429, with the wait).
    #[error("tenant {tenant:?} is over its {limit}: retry in {} ms", retry_after.as_millis())]
    RateLimited {
        /// The tenant.
        tenant: String,
        /// Which limit: `rate limit` or `concurrent requests cap`.
        limit: &'static str,
        /// When the next request would pass.
        retry_after: Duration,
    },
    /// A request refused its tenant: no or an unknown key (401), or a
    /// route or risk class the tenant may not use (403).
    #[error("{0}")]
    Tenant(router_policy::tenant::TenantRefusal),
    /// An admin call without a valid bearer token.
    #[error(transparent)]
    Unauthorized(Unauthorized),
    /// An admin call this proxy does not take from this caller.
    #[error(transparent)]
    Forbidden(Forbidden),
    /// Unknown admin path.
    #[error("not found")]
    NotFound,
    /// Known path, wrong method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Every pool of a route with `on_all_down: park` was down: the
    /// request is stored as a task (202 with `Prefer: respond-async`,
    /// else 503 `parked`).
    #[error("every pool of route {route} is down: the request is parked as task {task} ({state}); its state and then its answer are at /v1/router/tasks/{task}")]
    Parked {
        /// The route.
        route: String,
        /// The task's id.
        task: String,
        /// Its state (`waiting_capacity`, `waiting_approval`, ...).
        state: &'static str,
        /// The client asked `Prefer: respond-async` (RFC 7240): 202.
        respond_async: bool,
    },
}

/// A keyed request's refusal (`router_shared_state::idempotency`), as the
/// client's error.
impl From<router_shared_state::idempotency::Refusal> for ProxyError {
    fn from(refusal: router_shared_state::idempotency::Refusal) -> Self {
        use router_shared_state::idempotency::Refusal;
        match refusal {
            Refusal::StoreUnavailable => Self::SharedStoreUnavailable(StoreNeed::Idempotency),
            Refusal::Mismatch(key) => Self::IdempotencyMismatch(key),
            Refusal::NotReplayable(key) => Self::NotReplayable(key),
            Refusal::OutcomeUnknown { key, route } => Self::OutcomeUnknown { key, route },
            Refusal::JoinTimedOut => Self::DeadlineExhausted {
                detail: "waited for the first request with this Idempotency-Key".into(),
            },
            Refusal::KeptEndingUnanswered => Self::DeadlineExhausted {
                detail:
                    "the first requests with this Idempotency-Key kept ending without an answer"
                        .into(),
            },
        }
    }
}

impl ProxyError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::QueueFull { .. }
            | Self::QueueTimeout { .. }
            | Self::NoBackend { .. }
            | Self::Overloaded { .. }
            | Self::SharedStoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::DeadlineExhausted { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::NotReplayable(_) | Self::OutcomeUnknown { .. } => StatusCode::CONFLICT,
            Self::IdempotencyMismatch(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::ApprovalRequired { .. } => StatusCode::FORBIDDEN,
            Self::BudgetExceeded { .. } | Self::TenantBudgetExceeded { .. } => {
                StatusCode::PAYMENT_REQUIRED
            }
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Tenant(why) if why.is_authentication() => StatusCode::UNAUTHORIZED,
            Self::Tenant(_) | Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Parked {
                respond_async: true,
                ..
            } => StatusCode::ACCEPTED,
            Self::Parked { .. } => StatusCode::SERVICE_UNAVAILABLE,
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
            Self::NotReplayable(_) => Outcome::NotReplayable,
            Self::OutcomeUnknown { .. } => Outcome::OutcomeUnknown,
            Self::SharedStoreUnavailable(_) => Outcome::SharedStoreUnavailable,
            Self::IdempotencyMismatch(_) => Outcome::IdempotencyMismatch,
            Self::ApprovalRequired { .. } => Outcome::ApprovalRequired,
            Self::BudgetExceeded { .. } | Self::TenantBudgetExceeded { .. } => {
                Outcome::BudgetExceeded
            }
            Self::RateLimited { .. } => Outcome::RateLimited,
            Self::InvalidRequest(_) => Outcome::InvalidRequest,
            Self::PayloadTooLarge { .. } => Outcome::PayloadTooLarge,
            Self::RequestTimeout(_) => Outcome::RequestTimeout,
            Self::Upstream { .. } => Outcome::UpstreamError,
            Self::Unauthorized(_) => Outcome::Unauthorized,
            Self::Tenant(why) if why.is_authentication() => Outcome::Unauthorized,
            Self::Tenant(_) | Self::Forbidden(_) => Outcome::Forbidden,
            Self::NotFound => Outcome::NotFound,
            Self::MethodNotAllowed => Outcome::MethodNotAllowed,
            Self::Parked { .. } => Outcome::Parked,
        }
    }

    /// The error `type` in the JSON body ([`ProxyError::outcome`]'s label).
    pub fn kind(&self) -> &'static str {
        self.outcome().as_str()
    }

    /// True for the load-shedding answers (counted as sheds): not a
    /// tenant's own budget refusal, which says nothing of the router's
    /// capacity.
    pub fn is_shed(&self) -> bool {
        !matches!(self, Self::TenantBudgetExceeded { .. }) && self.outcome().is_shed()
    }

    /// The answer in the client's dialect: OpenAI's shape
    /// ([`ProxyError::to_response`]) or, for an Anthropic client,
    /// `{"type": "error", "error": {"type", "message", "code"},
    /// "request_id"}` with the status and type
    /// `router_dialect::errors::render` gives (capacity sheds `529
    /// overloaded_error`, `rate_limited` `429 rate_limit_error`), the
    /// router's label in `code`. The headers are the same (`Retry-After`,
    /// `Location`, ...); a parked task's view and an unknown outcome's
    /// first request ride in the error object as they do in OpenAI's.
    pub fn to_response_in(&self, dialect: Dialect, request_id: Option<&str>) -> Response<Bytes> {
        let mut resp = self.to_response(request_id);
        if dialect == Dialect::OpenAi {
            return resp;
        }
        if let Self::Parked {
            respond_async: true,
            ..
        } = self
        {
            // 202 and the task's view: the same in every dialect.
            return resp;
        }
        let kind = ErrorKind::from_label(self.kind()).unwrap_or(ErrorKind::UpstreamError);
        let retry_after = match self {
            Self::RateLimited { retry_after, .. } => {
                Some(retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0))
            }
            _ => None,
        };
        let rendered =
            router_dialect::errors::render(dialect, kind, &self.to_string(), retry_after);
        let mut body = rendered.body;
        if let Ok(serde_json::Value::Object(old)) =
            serde_json::from_slice::<serde_json::Value>(resp.body())
        {
            let old_error = old.get("error");
            for extra in ["task", "first_request"] {
                if let Some(v) = old_error.and_then(|e| e.get(extra)) {
                    body["error"][extra] = v.clone();
                }
            }
        }
        if dialect == Dialect::Anthropic {
            body["request_id"] = request_id.into();
        }
        *resp.body_mut() = Bytes::from(body.to_string());
        if let Ok(status) = StatusCode::from_u16(rendered.status) {
            *resp.status_mut() = status;
        }
        if let Some(secs) = rendered.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }

    /// The OpenAI-shaped JSON answer.
    pub fn to_response(&self, request_id: Option<&str>) -> Response<Bytes> {
        let mut body = router_dialect::errors::openai_envelope(
            &self.to_string(),
            self.kind(),
            Some(self.kind()),
        );
        body["error"]["request_id"] = request_id.into();
        if let Self::Parked {
            task,
            state,
            respond_async,
            ..
        } = self
        {
            let location = format!("/v1/router/tasks/{task}");
            let view = serde_json::json!({
                "id": task,
                "object": "router.task",
                "state": state,
                "location": location,
            });
            if *respond_async {
                body = view;
            } else {
                body["error"]["task"] = view;
            }
        }
        if let Self::OutcomeUnknown { route, .. } = self {
            // The first request's route record, as stored.
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(route) {
                body["error"]["first_request"] = v;
            }
        }
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
        if let Self::Parked {
            task,
            respond_async,
            ..
        } = self
        {
            if let Ok(v) = HeaderValue::from_str(&format!("/v1/router/tasks/{task}")) {
                headers.insert(header::LOCATION, v);
            }
            if *respond_async {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                headers.insert(
                    "preference-applied",
                    HeaderValue::from_static("respond-async"),
                );
            }
        }
        if let Self::RateLimited { retry_after, .. } = self {
            // Whole seconds, rounded up: the next request then passes.
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        if self.status() == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// What needed the shared store when it was down: the cause a
/// `shared_store_unavailable` answer names, so an operator knows which
/// setting (or which feature) made the request wait for the store. The
/// status and outcome are the same for every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StoreNeed {
    /// A keyed SEND/DESTRUCTIVE request: another proxy may be sending it.
    #[error("this request's Idempotency-Key needs it (a request with side effects is not sent without it)")]
    Idempotency,
    /// The tenant's spend budget, which fails closed by default.
    #[error("the tenant's budget needs it (budget_on_store_down: closed)")]
    Budget,
    /// The tenant's rate limit with `on_store_down: closed`.
    #[error("the tenant's rate limit needs it (on_store_down: closed)")]
    RateLimit,
    /// The tenant's token limit with `on_store_down: closed`.
    #[error("the tenant's token limit needs it (on_store_down: closed)")]
    TokenLimit,
    /// The tenant's concurrent requests cap with `on_store_down: closed`.
    #[error("the tenant's concurrent requests cap needs it (on_store_down: closed)")]
    ConcurrencyLimit,
    /// Parked tasks are kept in the store.
    #[error("parked tasks are kept in it")]
    Task,
}

/// Why a request on a route that requires approval was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalRefusal {
    /// The proxy has no key to check signed approvals with (and the
    /// policy has no static token), so nothing can pass.
    #[error("this proxy has no approval key (CUSTOM_ROUTER_APPROVAL_KEY), so no request on this route can pass")]
    NotConfigured,
    /// The token given does not approve this request.
    #[error(transparent)]
    Token(#[from] router_policy::approval::Refusal),
}

/// Why an admin call needs a token it did not present. Each message says
/// what to set or send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthorized {
    /// A token is configured and the call did not carry it.
    #[error("missing or invalid bearer token: send Authorization: Bearer <the CUSTOM_ROUTER_ADMIN_TOKEN of this proxy>")]
    Token,
    /// Standalone, managed or inline mode without a token: admin calls are
    /// closed.
    #[error("admin calls are closed on this proxy: set CUSTOM_ROUTER_ADMIN_TOKEN and send Authorization: Bearer <token>")]
    NoTokenConfigured,
    /// Metrics from a peer that is not loopback, without a token that
    /// opens them.
    #[error("metrics (with backend addresses) are served to loopback peers, or with Authorization: Bearer <CUSTOM_ROUTER_METRICS_TOKEN or CUSTOM_ROUTER_ADMIN_TOKEN of this proxy>: set CUSTOM_ROUTER_METRICS_TOKEN and give it to the scraper")]
    Metrics,
}

/// Why an admin call is refused whatever it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Forbidden {
    /// A sidecar without a token takes admin calls from loopback only.
    #[error("admin calls are taken from loopback only (127.0.0.0/8, ::1) while CUSTOM_ROUTER_ADMIN_TOKEN is unset: set it and send Authorization: Bearer <token> to call from elsewhere")]
    NotLoopback,
    /// A managed proxy's backend sets belong to its control plane.
    #[error("this proxy is managed by a control plane, which owns the backend sets of every proxy: use `routerctl backends set POOL ADDR...`")]
    Managed,
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
        // Issue 30, item 5: a tenant out of money is not a shed; a route
        // whose cost ceiling rules out every pool is.
        let tenant = ProxyError::TenantBudgetExceeded { detail: "d".into() };
        let ceiling = ProxyError::BudgetExceeded { detail: "d".into() };
        assert_eq!(tenant.status(), ceiling.status());
        assert_eq!(tenant.kind(), "budget_exceeded");
        assert!(!tenant.is_shed());
        assert!(ceiling.is_shed());
    }

    #[test]
    fn upstream_failures_do_not_show_the_endpoint() {
        let e = ProxyError::Upstream {
            pool: "cloud".into(),
            detail: "connect error".into(),
        };
        let v: serde_json::Value = serde_json::from_slice(e.to_response(None).body()).unwrap();
        assert_eq!(
            v["error"]["message"],
            "a backend of pool cloud failed: connect error"
        );
    }

    #[test]
    fn admin_refusals_say_what_to_set() {
        for (e, status) in [
            (ProxyError::Unauthorized(Unauthorized::Token), 401),
            (
                ProxyError::Unauthorized(Unauthorized::NoTokenConfigured),
                401,
            ),
            (ProxyError::Forbidden(Forbidden::NotLoopback), 403),
        ] {
            let resp = e.to_response(None);
            assert_eq!(resp.status().as_u16(), status);
            let v: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(msg.contains("CUSTOM_ROUTER_ADMIN_TOKEN"), "{msg}");
        }
        let msg = ProxyError::Forbidden(Forbidden::Managed).to_string();
        assert!(msg.contains("routerctl backends set"), "{msg}");
    }

    #[test]
    fn an_anthropic_client_gets_the_routers_errors_in_its_shape() {
        let body = |r: &Response<Bytes>| -> serde_json::Value {
            serde_json::from_slice(r.body()).unwrap()
        };
        // Capacity sheds: 529 overloaded_error, which Anthropic's SDKs retry.
        for e in [
            ProxyError::QueueFull { pool: "p".into() },
            ProxyError::QueueTimeout {
                pool: "p".into(),
                waited_ms: 5,
            },
            ProxyError::NoBackend {
                detail: "none".into(),
            },
            ProxyError::Overloaded { what: "x" },
        ] {
            let r = e.to_response_in(Dialect::Anthropic, Some("r1"));
            assert_eq!(r.status().as_u16(), 529, "{e}");
            assert_eq!(r.headers()[header::RETRY_AFTER], "1");
            let v = body(&r);
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], "overloaded_error");
            assert_eq!(v["error"]["code"], e.kind());
            assert_eq!(v["error"]["message"], e.to_string());
            assert_eq!(v["request_id"], "r1");
        }
        // Rate limited: 429 rate_limit_error with the wait, rounded up.
        let e = ProxyError::RateLimited {
            tenant: "t".into(),
            limit: "rate limit",
            retry_after: Duration::from_millis(2500),
        };
        let r = e.to_response_in(Dialect::Anthropic, None);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        assert_eq!(body(&r)["error"]["type"], "rate_limit_error");
        // The rest keep the router's status with the Anthropic type of it.
        let r = ProxyError::InvalidRequest("bad".into()).to_response_in(Dialect::Anthropic, None);
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(body(&r)["error"]["type"], "invalid_request_error");
        let r = ProxyError::Tenant(router_policy::tenant::TenantRefusal::NoKey)
            .to_response_in(Dialect::Anthropic, None);
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(body(&r)["error"]["type"], "authentication_error");
        // An OpenAI client's answer is unchanged.
        let e = ProxyError::QueueFull { pool: "p".into() };
        let (a, b) = (
            e.to_response_in(Dialect::OpenAi, Some("r")),
            e.to_response(Some("r")),
        );
        assert_eq!((a.status(), a.body()), (b.status(), b.body()));
    }

    #[test]
    fn a_store_outage_names_what_needed_the_store() {
        for (need, names) in [
            (StoreNeed::Idempotency, "Idempotency-Key"),
            (StoreNeed::Budget, "budget_on_store_down"),
            (StoreNeed::RateLimit, "rate limit"),
            (StoreNeed::TokenLimit, "token limit"),
            (StoreNeed::ConcurrencyLimit, "concurrent requests cap"),
            (StoreNeed::Task, "parked tasks"),
        ] {
            let e = ProxyError::SharedStoreUnavailable(need);
            let resp = e.to_response(None);
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
            assert_eq!(e.kind(), "shared_store_unavailable");
            let msg = e.to_string();
            assert!(msg.contains(names), "{msg}");
            assert!(msg.starts_with("the shared store is unavailable"), "{msg}");
        }
    }

    #[test]
    fn client_errors_have_no_retry_after() {
        let resp = ProxyError::PayloadTooLarge { limit: 1 }.to_response(None);
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
    }
}

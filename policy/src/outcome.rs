//! How a request, or one attempt of it, ended: one type for every ending.
//!
//! Every place that records an ending (the route log, `router_*` metrics,
//! OpenTelemetry spans, the typed error body) writes [`Outcome::as_str`],
//! so the labels cannot drift apart, and every place that *decides* on an
//! ending asks the enum a question instead of comparing text:
//!
//! - [`Outcome::retry_class`]: which `retry_on` entry of a route covers it
//!   (`None`: it is not a backend failure a route can retry);
//! - [`Outcome::may_have_reached_backend`]: whether the backend may have
//!   started work on the request (the rule that keeps SEND and DESTRUCTIVE
//!   requests from being sent twice, [`crate::fallback`]);
//! - [`Outcome::is_shed`]: the router's own load-shedding answers, which
//!   never reached a backend and are counted as sheds.
//!
//! [`AttemptEnding`] classifies what the proxy saw of an attempt (a
//! status, a send error, a late first token...) into its outcome and the
//! latency sample it feeds, so those rules are not spread through I/O code.
//!
//! The labels are part of the contract (the route log and the
//! `router_requests_total{outcome}` label); [`Outcome::ALL`] lists them all
//! and the tests pin each one.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::document::RetryOn;

/// How a request, or one attempt of it, ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Outcome {
    /// A backend answered (2xx–4xx other than 429), passed on.
    #[default]
    Ok,
    /// An `Idempotency-Key` retry answered with the stored answer.
    Replayed,
    /// The endpoint could not be reached: refused, or the connection
    /// failed before the request was written.
    ConnectError,
    /// The connection broke after the request may have been written, or
    /// the answer's body could not be read.
    UpstreamError,
    /// No answer inside the attempt's timeout (queue wait included).
    Timeout,
    /// The endpoint answered 429 (it refused the work).
    Status429,
    /// The endpoint answered 5xx.
    Status5xx,
    /// A 2xx JSON answer that does not parse, or fails the requested
    /// structured-output schema.
    MalformedJson,
    /// A streamed answer the backend cut before its end.
    UpstreamReset,
    /// The client went away before its answer was complete.
    ClientCancelled,
    /// A streamed answer's first content did not come within the
    /// `first_token_timeout` (nothing had reached the client).
    FirstTokenTimeout,
    /// A streamed answer reported an error inside its 200 (an error event,
    /// an error chunk, a payload that is not JSON).
    StreamError,
    /// A stream sent nothing for `stall_timeout` after its first token: it
    /// was cut.
    StreamStalled,
    /// The losing attempt of a hedged request, cancelled when the other
    /// produced its first token.
    HedgeCancelled,
    /// No pool could answer inside the deadline, or a stream outlived it.
    DeadlineExhausted,
    /// Evicted as the oldest waiter of a full queue.
    QueueFull,
    /// Waited past the pool's queue timeout.
    QueueTimeout,
    /// No pool has an endpoint to send to.
    NoBackend,
    /// The proxy's own memory or connection cap was reached.
    Overloaded,
    /// An `Idempotency-Key` retry of a request whose answer was too large
    /// to store: it is not generated again.
    NotReplayable,
    /// An `Idempotency-Key` retry of a SEND/DESTRUCTIVE request whose
    /// first attempt may have reached a backend and ended without an
    /// answer: it is not sent again.
    OutcomeUnknown,
    /// A keyed SEND/DESTRUCTIVE request while the shared store cannot be
    /// reached (it fails closed).
    SharedStoreUnavailable,
    /// An `Idempotency-Key` reused with a different request.
    IdempotencyMismatch,
    /// The route needs approval and no valid token was given.
    ApprovalRequired,
    /// A cost ceiling forbids every eligible pool.
    BudgetExceeded,
    /// The tenant is over its rate limit.
    RateLimited,
    /// A malformed request (or an upstream request that could not be made).
    InvalidRequest,
    /// The request body is over the limit.
    PayloadTooLarge,
    /// The client did not send its body in time.
    RequestTimeout,
    /// An admin call without a valid token.
    Unauthorized,
    /// An admin call this proxy does not take from this caller (a
    /// sidecar's non-loopback peer without a token; `set-backends` on a
    /// managed proxy).
    Forbidden,
    /// Unknown admin path.
    NotFound,
    /// Known admin path, wrong method.
    MethodNotAllowed,
    /// Every pool of a parking route was down: the request was stored as
    /// a task (`202` with `Prefer: respond-async`, else `503 parked`).
    Parked,
}

impl Outcome {
    /// Every outcome, in declaration order.
    pub const ALL: [Outcome; 34] = [
        Outcome::Ok,
        Outcome::Replayed,
        Outcome::ConnectError,
        Outcome::UpstreamError,
        Outcome::Timeout,
        Outcome::Status429,
        Outcome::Status5xx,
        Outcome::MalformedJson,
        Outcome::UpstreamReset,
        Outcome::ClientCancelled,
        Outcome::FirstTokenTimeout,
        Outcome::StreamError,
        Outcome::StreamStalled,
        Outcome::HedgeCancelled,
        Outcome::DeadlineExhausted,
        Outcome::QueueFull,
        Outcome::QueueTimeout,
        Outcome::NoBackend,
        Outcome::Overloaded,
        Outcome::NotReplayable,
        Outcome::OutcomeUnknown,
        Outcome::SharedStoreUnavailable,
        Outcome::IdempotencyMismatch,
        Outcome::ApprovalRequired,
        Outcome::BudgetExceeded,
        Outcome::RateLimited,
        Outcome::InvalidRequest,
        Outcome::PayloadTooLarge,
        Outcome::RequestTimeout,
        Outcome::Unauthorized,
        Outcome::Forbidden,
        Outcome::NotFound,
        Outcome::MethodNotAllowed,
        Outcome::Parked,
    ];

    /// The label in logs, metrics, spans and error bodies.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Replayed => "replayed",
            Self::ConnectError => "connect_error",
            Self::UpstreamError => "upstream_error",
            Self::Timeout => "timeout",
            Self::Status429 => "status_429",
            Self::Status5xx => "status_5xx",
            Self::MalformedJson => "malformed_json",
            Self::UpstreamReset => "upstream_reset",
            Self::ClientCancelled => "client_cancelled",
            Self::FirstTokenTimeout => "first_token_timeout",
            Self::StreamError => "stream_error",
            Self::StreamStalled => "stream_stalled",
            Self::HedgeCancelled => "hedge_cancelled",
            Self::DeadlineExhausted => "deadline_exhausted",
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
            Self::NoBackend => "no_backend",
            Self::Overloaded => "overloaded",
            Self::NotReplayable => "not_replayable",
            Self::OutcomeUnknown => "outcome_unknown",
            Self::SharedStoreUnavailable => "shared_store_unavailable",
            Self::IdempotencyMismatch => "idempotency_mismatch",
            Self::ApprovalRequired => "approval_required",
            Self::BudgetExceeded => "budget_exceeded",
            Self::RateLimited => "rate_limited",
            Self::InvalidRequest => "invalid_request",
            Self::PayloadTooLarge => "payload_too_large",
            Self::RequestTimeout => "request_timeout",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::Parked => "parked",
        }
    }

    /// A backend's answer was passed on (or replayed).
    pub const fn is_success(self) -> bool {
        matches!(self, Self::Ok | Self::Replayed)
    }

    /// The `retry_on` entry of a route that covers this failure; `None` for
    /// answers and for endings that are not a backend's failure.
    ///
    /// A request that could not even be made for an endpoint
    /// ([`Outcome::InvalidRequest`] on an attempt) counts as a connect error:
    /// another pool's endpoint may work.
    pub const fn retry_class(self) -> Option<RetryOn> {
        match self {
            Self::ConnectError | Self::UpstreamError | Self::InvalidRequest => {
                Some(RetryOn::ConnectError)
            }
            // Nothing reached the client yet: a silent stream is a timeout,
            // an error inside a 200 a 5xx.
            Self::Timeout | Self::FirstTokenTimeout => Some(RetryOn::Timeout),
            Self::Status429 => Some(RetryOn::Status429),
            Self::Status5xx | Self::StreamError => Some(RetryOn::Status5xx),
            Self::MalformedJson => Some(RetryOn::MalformedJson),
            _ => None,
        }
    }

    /// False only when the backend provably did not start work on the
    /// request: the connection was refused, the backend refused it with
    /// 429, or the router never sent it (an upstream request that could not
    /// be made, a shed, any of the router's own answers). Everything else
    /// (a timeout, a 5xx, a connection broken after writing, a malformed
    /// answer) may have started a generation.
    ///
    /// As an attempt's ending, [`Outcome::DeadlineExhausted`] is the router
    /// giving a queued slot back unused because the answer could no longer
    /// come in time: nothing was sent.
    pub const fn may_have_reached_backend(self) -> bool {
        match self {
            Self::ConnectError | Self::Status429 | Self::InvalidRequest => false,
            Self::NotReplayable
            | Self::OutcomeUnknown
            | Self::SharedStoreUnavailable
            | Self::IdempotencyMismatch
            | Self::ApprovalRequired
            | Self::RateLimited
            | Self::PayloadTooLarge
            | Self::RequestTimeout
            | Self::Unauthorized
            | Self::Forbidden
            | Self::NotFound
            | Self::MethodNotAllowed
            | Self::Parked => false,
            other => !other.is_shed(),
        }
    }

    /// The router's own load-shedding answers.
    pub const fn is_shed(self) -> bool {
        matches!(
            self,
            Self::QueueFull
                | Self::QueueTimeout
                | Self::NoBackend
                | Self::Overloaded
                | Self::DeadlineExhausted
                | Self::BudgetExceeded
        )
    }
}

/// How one attempt ended, as the proxy saw it. Each ending is one
/// [`Outcome`] and feeds one latency sample ([`SampleKind`]): the proxy
/// names what happened, this says what it counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnding {
    /// An answer (a whole one, or a stream's first token).
    Answered,
    /// The upstream request could not be made: never sent.
    NotSent,
    /// The connection could not be made.
    ConnectFailed,
    /// The connection broke after the request may have been written, or
    /// the answer could not be read.
    Broken,
    /// No answer inside the attempt's time.
    TimedOut,
    /// The backend answered 429.
    RateLimited,
    /// The backend answered 5xx.
    ServerError,
    /// A stream's first token came too late.
    FirstTokenLate,
    /// A stream reported an error inside its 200 before its first token.
    ErrorInStream,
    /// A 2xx answer that is not JSON: the endpoint's failure.
    NotJson,
    /// JSON that is not the structure asked for: the endpoint did answer
    /// (the structured degrade's business, not the circuit's).
    OffSchema,
    /// An answer the client's dialect cannot take: the endpoint did answer.
    Untranslatable,
    /// The losing attempt of a hedge, cancelled by the router.
    Cancelled,
}

/// What an attempt's ending adds to its endpoint's latency and circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleKind {
    /// Answered: its latency counts, the circuit sees a success.
    Success,
    /// Failed: no latency, the circuit sees a failure.
    Failure,
    /// Timed out: its wait counts (at the timeout), the circuit sees a failure.
    Timeout,
    /// A 429: the circuit may rest the endpoint for its `Retry-After`.
    RateLimited,
    /// Cancelled by the router: a lower bound of its latency, no failure.
    Cancelled,
}

impl AttemptEnding {
    /// The ending of an answer with this HTTP status, when it is a failure
    /// (`None`: 2xx to 4xx other than 429, passed on).
    pub const fn of_status(status: u16) -> Option<Self> {
        match status {
            429 => Some(Self::RateLimited),
            500..=599 => Some(Self::ServerError),
            _ => None,
        }
    }

    /// The ending of a request that could not be sent or whose answer's
    /// head never came: `connect` when the connection itself failed.
    pub const fn of_send_error(connect: bool) -> Self {
        if connect {
            Self::ConnectFailed
        } else {
            Self::Broken
        }
    }

    /// The outcome the attempt records.
    pub const fn outcome(self) -> Outcome {
        match self {
            Self::Answered => Outcome::Ok,
            Self::NotSent => Outcome::InvalidRequest,
            Self::ConnectFailed => Outcome::ConnectError,
            Self::Broken => Outcome::UpstreamError,
            Self::TimedOut => Outcome::Timeout,
            Self::RateLimited => Outcome::Status429,
            Self::ServerError => Outcome::Status5xx,
            Self::FirstTokenLate => Outcome::FirstTokenTimeout,
            Self::ErrorInStream => Outcome::StreamError,
            Self::NotJson | Self::OffSchema | Self::Untranslatable => Outcome::MalformedJson,
            Self::Cancelled => Outcome::HedgeCancelled,
        }
    }

    /// The latency sample it feeds (`None`: nothing was sent).
    pub const fn sample(self) -> Option<SampleKind> {
        match self {
            Self::NotSent => None,
            Self::Answered | Self::OffSchema | Self::Untranslatable => Some(SampleKind::Success),
            Self::TimedOut | Self::FirstTokenLate => Some(SampleKind::Timeout),
            Self::RateLimited => Some(SampleKind::RateLimited),
            Self::Cancelled => Some(SampleKind::Cancelled),
            Self::ConnectFailed
            | Self::Broken
            | Self::ServerError
            | Self::ErrorInStream
            | Self::NotJson => Some(SampleKind::Failure),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Outcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_send_errors_are_classified() {
        assert_eq!(
            AttemptEnding::of_status(429),
            Some(AttemptEnding::RateLimited)
        );
        for s in [500, 502, 503, 529, 599] {
            assert_eq!(
                AttemptEnding::of_status(s),
                Some(AttemptEnding::ServerError)
            );
        }
        for s in [200, 201, 400, 404, 422, 499] {
            assert_eq!(AttemptEnding::of_status(s), None);
        }
        assert_eq!(
            AttemptEnding::of_send_error(true).outcome(),
            Outcome::ConnectError
        );
        assert_eq!(
            AttemptEnding::of_send_error(false).outcome(),
            Outcome::UpstreamError
        );
    }

    #[test]
    fn an_endpoint_that_answered_is_never_sampled_as_failed() {
        use AttemptEnding::*;
        for e in [Answered, OffSchema, Untranslatable] {
            assert_eq!(e.sample(), Some(SampleKind::Success), "{e:?}");
        }
        // The same outcome, two samples: the endpoint's fault or not.
        assert_eq!(NotJson.outcome(), OffSchema.outcome());
        assert_eq!(NotJson.sample(), Some(SampleKind::Failure));
        assert_eq!(NotSent.sample(), None);
        assert_eq!(FirstTokenLate.sample(), Some(SampleKind::Timeout));
        assert_eq!(Cancelled.sample(), Some(SampleKind::Cancelled));
    }

    #[test]
    fn labels_are_the_contract() {
        let labels: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            labels,
            [
                "ok",
                "replayed",
                "connect_error",
                "upstream_error",
                "timeout",
                "status_429",
                "status_5xx",
                "malformed_json",
                "upstream_reset",
                "client_cancelled",
                "first_token_timeout",
                "stream_error",
                "stream_stalled",
                "hedge_cancelled",
                "deadline_exhausted",
                "queue_full",
                "queue_timeout",
                "no_backend",
                "overloaded",
                "not_replayable",
                "outcome_unknown",
                "shared_store_unavailable",
                "idempotency_mismatch",
                "approval_required",
                "budget_exceeded",
                "rate_limited",
                "invalid_request",
                "payload_too_large",
                "request_timeout",
                "unauthorized",
                "forbidden",
                "not_found",
                "method_not_allowed",
                "parked",
            ]
        );
        // Distinct: a label names one outcome.
        let mut sorted = labels.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), labels.len());
    }

    #[test]
    fn each_backend_failure_has_its_retry_class() {
        assert_eq!(
            Outcome::ConnectError.retry_class(),
            Some(RetryOn::ConnectError)
        );
        assert_eq!(
            Outcome::UpstreamError.retry_class(),
            Some(RetryOn::ConnectError)
        );
        assert_eq!(Outcome::Timeout.retry_class(), Some(RetryOn::Timeout));
        assert_eq!(Outcome::Status429.retry_class(), Some(RetryOn::Status429));
        assert_eq!(Outcome::Status5xx.retry_class(), Some(RetryOn::Status5xx));
        assert_eq!(
            Outcome::MalformedJson.retry_class(),
            Some(RetryOn::MalformedJson)
        );
        for o in [
            Outcome::Ok,
            Outcome::Replayed,
            Outcome::ClientCancelled,
            Outcome::QueueFull,
            Outcome::UpstreamReset,
        ] {
            assert_eq!(o.retry_class(), None, "{o}");
        }
    }

    #[test]
    fn only_refusals_before_work_never_reached_the_backend() {
        let never: Vec<Outcome> = Outcome::ALL
            .into_iter()
            .filter(|o| o.retry_class().is_some() && !o.may_have_reached_backend())
            .collect();
        assert_eq!(
            never,
            [
                Outcome::ConnectError,
                Outcome::Status429,
                Outcome::InvalidRequest
            ]
        );
        // Sheds never left the router.
        for o in Outcome::ALL.into_iter().filter(|o| o.is_shed()) {
            assert!(!o.may_have_reached_backend(), "{o}");
        }
        // What may have started a generation.
        for o in [
            Outcome::UpstreamError,
            Outcome::Timeout,
            Outcome::Status5xx,
            Outcome::MalformedJson,
            Outcome::Ok,
        ] {
            assert!(o.may_have_reached_backend(), "{o}");
        }
    }

    #[test]
    fn serializes_as_its_label() {
        let s = serde_json::to_string(&Outcome::Status5xx).unwrap_or_default();
        assert_eq!(s, "\"status_5xx\"");
        assert_eq!(Outcome::QueueFull.to_string(), "queue_full");
    }
}

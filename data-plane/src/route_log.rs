//! The request's record: the route log's line (crate `router_route_log`,
//! re-exported here) and what the request carries beside it until it ends.
//!
//! [`RouteRecord`] derefs to the line ([`LogLine`]), so the request path
//! fills the line's fields as fields of the record; [`RouteRecord::emit`]
//! queues the line and drops the rest.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

pub(crate) use router_route_log::{
    AttemptRecord, HedgeRole, IdempotencyRole, PrefixRecord, RouteLog, Stopped, StreamRecord,
    Timestamp, UsageRecord, WalkNote, UPSTREAM_REQUEST_ID_MAX,
};

/// The line the route log writes for one request.
pub(crate) type LogLine = router_route_log::RouteRecord;

/// One request's record: the route log's line and, beside it, what the
/// request carries until it ends that is not logged.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteRecord {
    /// The line (its fields are the record's, through `Deref`).
    pub line: LogLine,
    /// The request's server span (when tracing is on); ended with the record.
    pub otel: Option<opentelemetry::Context>,
    /// The model the answer says it came from (a span attribute).
    pub response_model: Option<String>,
    /// What the tenant's limits hold for the request until it ends
    /// (boxed: tenancy is rare, the record is filled for every request).
    pub tenant_holds: Option<Box<crate::handler::tenancy::TenantHolds>>,
    /// The route's first pool, when the walk began past it (passed over
    /// by the decision or the walk): counted as a fallback from it.
    pub primary_passed_over: Option<Arc<str>>,
}

impl Deref for RouteRecord {
    type Target = LogLine;

    fn deref(&self) -> &LogLine {
        &self.line
    }
}

impl DerefMut for RouteRecord {
    fn deref_mut(&mut self) -> &mut LogLine {
        &mut self.line
    }
}

impl RouteRecord {
    /// Queues the line on `log`, in the box the record was built in (no
    /// copy): what else the record held is dropped here first (the span,
    /// the tenant's holds: their ends belong to the request's thread).
    pub(crate) fn emit(mut self: Box<Self>, log: &RouteLog) {
        self.otel = None;
        self.response_model = None;
        self.tenant_holds = None;
        self.primary_passed_over = None;
        log.emit(self);
    }
}

impl router_route_log::Line for RouteRecord {
    fn record(&self) -> &LogLine {
        &self.line
    }
}

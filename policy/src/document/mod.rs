//! The policy document and its validation.
//!
//! A policy is written in the style of a Kubernetes resource (YAML or JSON):
//!
//! ```yaml
//! apiVersion: router/v1
//! kind: RoutingPolicy
//! metadata: {name: demo}
//! spec:
//!   queue: {max_size: 1000, timeout_s: 1200, latency_threshold_s: 3.0, ewma_alpha: 0.3, scoring: peak_ewma}
//!   pools:
//!     - name: local
//!       provider: ollama
//!       model: qwen3:8b
//!       endpoints: ["http://127.0.0.1:11434"]
//!       max_concurrency: 4
//!   routes:
//!     - name: default
//!       match: {}
//!       chain: [local]
//! ```
//!
//! Parsing is two steps. [`PolicyDocument::parse`] turns text into the
//! document's shape (unknown fields are errors, reported with their path).
//! [`PolicyDocument::validate_with`] checks meaning and resolves defaults
//! into a [`Policy`], the only form the router acts on; it is given the
//! process's [`Guards`] (which API key variables and which backend
//! addresses a policy may name: [`crate::guard`]), and
//! [`PolicyDocument::validate`] is the same with the default guards. Validation collects every
//! problem before answering, each as a [`FieldError`] naming the field path
//! (`spec.pools[1].endpoints[0]`) and the reason, so an operator fixes a
//! document in one pass.
//!
//! Module map:
//! - `spec`: the document as written ([`PolicyDocument`] and its parts) and
//!   [`PolicyDocument::parse`].
//! - `shape`: every shape error at once (serde stops at the first), with a
//!   "did you mean" for misspelt fields.
//! - `validate`: [`PolicyDocument::validate`], one validator per section of
//!   the document, run in document order.
//! - `resolved`: the validated [`Policy`] and its parts.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::guard::Guards;

mod resolved;
mod shape;
mod spec;
mod validate;

#[cfg(test)]
mod tests;

pub use resolved::{
    AzureDeployment, ChainStep, CircuitSettings, Gates, Hedge, HedgeDelay, ParkSettings, Policy,
    Pool, Price, Probe, QueueSettings, Route, RouteMatch, SessionAffinity,
};
pub use spec::{
    AffinityKind, ApprovalSpec, CacheSpec, ChainStepSpec, CircuitSpec, DefaultsSpec,
    EndpointOptions, EndpointSpec, EngineAwareSpec, GatesSpec, HealthCheckSpec, HedgeQuantile,
    HedgeSpec, HedgeTarget, MatchSpec, Metadata, OnAllDown, OutlierEjectionSpec, ParkSpec,
    PolicyDocument, PoolSpec, PriceSpec, ProbeKind, ProbeSpec, Provider, QueueSpec, RampGuardSpec,
    RampSpec, RetryBudgetSpec, RetryOn, Risk, RouteSpec, SessionAffinitySpec, Spec, SplitSideSpec,
    SplitSpec, StoreDown, TenantLimitsSpec, TenantSpec, DEFAULT_AZURE_API_VERSION,
};

/// The API version this crate understands.
pub const API_VERSION: &str = "router/v1";
/// The resource kind of a policy document.
pub const KIND: &str = "RoutingPolicy";

/// One problem in a policy document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// Path of the offending field, e.g. `spec.routes[0].chain[1]`.
    pub field: String,
    /// Why it is wrong.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// A policy that cannot be used, with every reason found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PolicyError {
    /// All problems found, in document order.
    pub errors: Vec<FieldError>,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(
            f,
            "invalid policy ({n} error{}): ",
            if n == 1 { "" } else { "s" }
        )?;
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Parses and validates in one step, with the default [`Guards`].
pub fn load(text: &str, defaults: &QueueSettings) -> Result<Policy, PolicyError> {
    load_with(text, defaults, &Guards::default())
}

/// Parses and validates in one step, with this process's [`Guards`].
pub fn load_with(
    text: &str,
    defaults: &QueueSettings,
    guards: &Guards,
) -> Result<Policy, PolicyError> {
    match PolicyDocument::parse_repairing(text) {
        Ok(doc) => doc.validate_with(defaults, guards),
        // Misspelt fields, and what validation finds in the rest: one
        // answer with every problem.
        Err((mut shape, Some(repaired))) => {
            if let Err(more) = repaired.validate_with(defaults, guards) {
                shape.errors.extend(more.errors);
            }
            Err(shape)
        }
        Err((shape, None)) => Err(shape),
    }
}

/// A positive, finite number of seconds as a duration.
pub fn positive_duration(seconds: f64) -> Option<Duration> {
    if seconds.is_finite() && seconds > 0.0 && seconds < 1e9 {
        Some(Duration::from_secs_f64(seconds))
    } else {
        None
    }
}

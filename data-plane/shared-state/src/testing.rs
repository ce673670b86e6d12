//! Builders for tests, here and in the proxy's (feature `testing`).

use std::time::Duration;

use router_policy::park::{TaskRecord, TaskState, Times};
use router_policy::Risk;

/// A READ task `id` on `route`, parked at `at` (Unix ms) for a minute,
/// waiting for capacity.
pub fn task(id: &str, route: &str, at: u64) -> TaskRecord {
    let t = Times::new(at, Duration::from_secs(60), None);
    TaskRecord {
        id: id.into(),
        state: TaskState::WaitingCapacity,
        route: route.into(),
        risk: Risk::Read,
        approved: false,
        operator: None,
        operator_role: None,
        operator_token: None,
        request_id: id.into(),
        tenant: None,
        parked_at_ms: t.parked_at_ms,
        expires_at_ms: t.expires_at_ms,
        deadline_at_ms: None,
        not_before_ms: None,
        reason: String::new(),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        headers: Vec::new(),
        body_b64: String::new(),
        bytes: 100,
        claimed_by: None,
        lease_until_ms: None,
        runs: 0,
        run_request_id: None,
        answer: None,
        error: None,
    }
}

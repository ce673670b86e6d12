//! Safe mode: what happens to a request when every pool of its route is
//! down, on a route that opts in with `on_all_down: park`.
//!
//! The deterministic-policy seed's failure table says a router whose
//! backends are all down should not fail the agent that called it, but
//! fail open into a deterministic safe mode: keep the task, hand back a
//! handle, and ask a human before anything risky runs. So instead of
//! `503 no_backend`, such a request is *parked*: stored (in the fleet's
//! shared store, where any proxy can finish it) as a [`TaskRecord`], and
//! the client gets the task's id.
//!
//! A parked task is a small state machine ([`transition`]):
//!
//! ```text
//!                  approve
//!  waiting_approval ─────▶ waiting_capacity ── claim ──▶ running ── answer ──▶ done
//!  (SEND, DESTRUCTIVE)     (READ, DRAFT)  ◀── requeue ──┘   │  └── failure ──▶ failed
//!        │                      │                           └ lease lost (SEND/DESTRUCTIVE) ▶ failed
//!        └── ttl / deadline ────┴──▶ expired        operator drop (any live state) ──▶ dropped
//! ```
//!
//! - The first state comes from the request's risk ([`initial_state`]): a
//!   READ or DRAFT task waits for capacity and runs by itself once a pool
//!   of its chain recovers; a SEND or DESTRUCTIVE task waits for an
//!   operator's approval first, because nobody is there to ask when it
//!   finally runs. **A task with side effects never reaches `running`
//!   without approval**, and nothing leaves a terminal state (`done`,
//!   `failed`, `expired`, `dropped`); the property tests below check both
//!   over arbitrary event sequences.
//! - A task runs while it is alive: before its park TTL (`park.ttl_s`) and
//!   before its own deadline, if the request gave one
//!   ([`may_run`], [`is_expired`]).
//! - Exactly one proxy runs a task: it *claims* it (a compare-and-set on
//!   the task's revision) with a lease, which it renews while the run
//!   lasts. A proxy that dies holding the claim stops renewing it: its
//!   lease runs out and another proxy takes the task over
//!   ([`on_lease_lost`]). A READ or DRAFT task simply
//!   runs again (generating twice is safe); a SEND or DESTRUCTIVE task that
//!   may have reached its backend is marked `failed` with the outcome
//!   unknown, never sent twice (the same rule as an `Idempotency-Key`'s
//!   `outcome_unknown`).
//! - A run that the router itself shed before sending anything (every
//!   pool down again, a full queue) puts the task back in line
//!   ([`after_run`]); any answer from a backend ends it.
//! - A run shed with a `Retry-After` (a tenant's rate limit, say) waits
//!   that long before it is run again ([`Times::not_before_ms`]), so a
//!   limited task is not re-run on every poll.
//! - Runnable tasks go oldest first ([`pick_oldest`]'s order: park time,
//!   then id; the shared store lists them so).
//! - Parked tasks are bounded in number and in bytes ([`may_park`]): a
//!   route holds at most `park.max_tasks` live tasks and `park.max_bytes`
//!   of them, and the store as a whole at most the proxy's
//!   `CUSTOM_ROUTER_PARK_MAX_BYTES`; past any cap the request gets
//!   `no_backend` as before (every queue is bounded). A task's bytes are
//!   [`task_bytes`]: its body, path and kept headers.
//! - A task's body is stored apart from the rest of its record, which is
//!   all the dispatchers read on every poll ([`layout`]): a body is read
//!   only to run its task, and dropped from the store when the task ends.
//! - A task parked by a tenant keeps the tenant's name (never its key) and
//!   its run is admitted again under that tenant, as the live policy has
//!   it then: a tenant that is gone (or may no longer use the route or
//!   risk) fails the task; a rate or concurrency limit makes it wait
//!   (`rate_limited` is shed before send); a spent budget fails it
//!   (`budget_exceeded`: a budget's period is longer than a park TTL).
//!
//! Times are wall-clock Unix milliseconds: tasks are shared by proxies on
//! different machines, whose monotonic clocks mean nothing to each other.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::document::Risk;

/// A parked task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// READ/DRAFT (or approved): runs as soon as a pool of the chain can
    /// take it.
    WaitingCapacity,
    /// SEND/DESTRUCTIVE: nothing is sent until an operator approves.
    WaitingApproval,
    /// Claimed by one proxy, which is running it.
    Running,
    /// Ran and got an answer (stored with the task).
    Done,
    /// Ran and failed, or lost its runner where sending again could act
    /// twice.
    Failed,
    /// Its park TTL or its own deadline passed before it could run.
    Expired,
    /// An operator dropped it.
    Dropped,
}

impl TaskState {
    /// Every state, in the order of the docs.
    pub const ALL: [TaskState; 7] = [
        Self::WaitingCapacity,
        Self::WaitingApproval,
        Self::Running,
        Self::Done,
        Self::Failed,
        Self::Expired,
        Self::Dropped,
    ];

    /// The name in answers, logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::WaitingCapacity => "waiting_capacity",
            Self::WaitingApproval => "waiting_approval",
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Expired => "expired",
            Self::Dropped => "dropped",
        }
    }

    /// Parses a state's name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Nothing follows a terminal state.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Done | Self::Failed | Self::Expired | Self::Dropped
        )
    }
}

/// Something that happens to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An operator approved it.
    Approve,
    /// A proxy claims it to run it.
    Claim,
    /// The run got an answer from a backend (a success).
    Answered,
    /// The run ended with a failure that is final.
    RunFailed,
    /// The run was shed by the router before anything was sent: back in line.
    Requeue,
    /// Its runner's lease ran out (the proxy died holding it).
    LeaseLost,
    /// Its TTL or deadline passed.
    Expire,
    /// An operator dropped it.
    Drop,
}

/// Why an event cannot apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Illegal {
    /// The task has ended.
    #[error("the task is {0} already: nothing follows")]
    Terminal(&'static str),
    /// A task with side effects cannot run before an operator approves it.
    #[error("a SEND or DESTRUCTIVE task runs only after an operator approves it")]
    NotApproved,
    /// The event does not apply to this state.
    #[error("{event} does not apply to a task that is {state}")]
    Wrong {
        /// The event's name.
        event: &'static str,
        /// The state's name.
        state: &'static str,
    },
}

impl Event {
    /// The event's name, for errors.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Claim => "claim",
            Self::Answered => "answered",
            Self::RunFailed => "run failed",
            Self::Requeue => "requeue",
            Self::LeaseLost => "lease lost",
            Self::Expire => "expire",
            Self::Drop => "drop",
        }
    }
}

/// What a transition needs to know about the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Its state now.
    pub state: TaskState,
    /// The request's risk class.
    pub risk: Risk,
    /// Whether an operator approved it.
    pub approved: bool,
}

/// The state after `event`, or why it cannot happen. The only way into
/// `running` is a claim, and a claim of a SEND/DESTRUCTIVE task needs
/// approval; nothing leaves a terminal state.
pub fn transition(task: Facts, event: Event) -> Result<TaskState, Illegal> {
    use TaskState as S;
    if task.state.is_terminal() {
        return Err(Illegal::Terminal(task.state.as_str()));
    }
    let wrong = Err(Illegal::Wrong {
        event: event.as_str(),
        state: task.state.as_str(),
    });
    match (event, task.state) {
        (Event::Drop, _) => Ok(S::Dropped),
        (Event::Expire, S::WaitingCapacity | S::WaitingApproval) => Ok(S::Expired),
        (Event::Approve, S::WaitingApproval) => Ok(S::WaitingCapacity),
        (Event::Claim, S::WaitingCapacity) => {
            if task.risk.has_side_effects() && !task.approved {
                Err(Illegal::NotApproved)
            } else {
                Ok(S::Running)
            }
        }
        (Event::Claim, S::WaitingApproval) => Err(Illegal::NotApproved),
        (Event::Answered, S::Running) => Ok(S::Done),
        (Event::RunFailed, S::Running) => Ok(S::Failed),
        (Event::Requeue, S::Running) => Ok(S::WaitingCapacity),
        (Event::LeaseLost, S::Running) => Ok(on_lease_lost(task.risk)),
        _ => wrong,
    }
}

/// The state a parked request starts in.
pub fn initial_state(risk: Risk) -> TaskState {
    if risk.has_side_effects() {
        TaskState::WaitingApproval
    } else {
        TaskState::WaitingCapacity
    }
}

/// Where a task goes when its runner's lease ran out: READ/DRAFT run again;
/// SEND/DESTRUCTIVE may already have acted, so they fail (outcome
/// unknown) rather than be sent twice.
pub fn on_lease_lost(risk: Risk) -> TaskState {
    if risk.has_side_effects() {
        TaskState::Failed
    } else {
        TaskState::WaitingCapacity
    }
}

/// The times that bound a task (Unix milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    /// Parked at.
    pub parked_at_ms: u64,
    /// Park TTL: it expires at `parked_at + ttl`.
    pub expires_at_ms: u64,
    /// The request's own deadline, if it gave one.
    pub deadline_at_ms: Option<u64>,
    /// Not run before this (a shed run's `Retry-After`), if set.
    pub not_before_ms: Option<u64>,
}

impl Times {
    /// The times of a task parked `now` on a route with `ttl`, for a
    /// request whose deadline (if any) falls at `deadline_at_ms`.
    pub fn new(now_ms: u64, ttl: Duration, deadline_at_ms: Option<u64>) -> Self {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        Self {
            parked_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
            deadline_at_ms,
            not_before_ms: None,
        }
    }

    /// When the task stops being runnable: the earlier of its TTL and its
    /// deadline.
    pub fn ends_at_ms(&self) -> u64 {
        self.deadline_at_ms
            .map_or(self.expires_at_ms, |d| d.min(self.expires_at_ms))
    }
}

/// Whether a waiting task has outlived its TTL or its deadline at `now`.
/// A running or ended task never expires (a run ends by itself, inside
/// its own deadline).
pub fn is_expired(state: TaskState, times: Times, now_ms: u64) -> bool {
    matches!(
        state,
        TaskState::WaitingCapacity | TaskState::WaitingApproval
    ) && now_ms >= times.ends_at_ms()
}

/// Why a task may not run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// It may run.
    Run,
    /// Waiting for an operator.
    Approval,
    /// Not waiting at all (running or ended).
    NotWaiting,
    /// Its time is up: expire it.
    Expired,
    /// Its last run was shed with a `Retry-After` that has not passed.
    Later,
}

/// Whether a task may run at `now` (the caller also needs a pool of its
/// chain that can take work).
pub fn may_run(task: Facts, times: Times, now_ms: u64) -> Wait {
    if is_expired(task.state, times, now_ms) {
        return Wait::Expired;
    }
    match task.state {
        TaskState::WaitingApproval => Wait::Approval,
        TaskState::WaitingCapacity if task.risk.has_side_effects() && !task.approved => {
            Wait::Approval
        }
        TaskState::WaitingCapacity if times.not_before_ms.is_some_and(|t| now_ms < t) => {
            Wait::Later
        }
        TaskState::WaitingCapacity => Wait::Run,
        _ => Wait::NotWaiting,
    }
}

/// What parked tasks hold now, as a cap counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParkLoad {
    /// The route's live tasks.
    pub route_tasks: u64,
    /// Their bytes ([`task_bytes`]).
    pub route_bytes: u64,
    /// Every live task's bytes in the store (all routes).
    pub store_bytes: u64,
}

/// The caps a new task must fit under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParkCaps {
    /// The route's `park.max_tasks`.
    pub max_tasks: u32,
    /// The route's `park.max_bytes`.
    pub max_bytes: u64,
    /// The store's (`CUSTOM_ROUTER_PARK_MAX_BYTES`).
    pub store_max_bytes: u64,
}

/// Which cap a task did not fit under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParkRefusal {
    /// The route holds `park.max_tasks` live tasks.
    #[error("the route holds its cap of {0} parked tasks")]
    Tasks(u32),
    /// The task does not fit in the route's `park.max_bytes`.
    #[error("the route's parked tasks would pass its cap of {0} bytes (park.max_bytes)")]
    RouteBytes(u64),
    /// The task does not fit in the store's cap.
    #[error("parked tasks would pass the proxy's cap of {0} bytes (CUSTOM_ROUTER_PARK_MAX_BYTES)")]
    StoreBytes(u64),
}

/// Whether a task of `size` bytes may be parked on a route under `load`:
/// the route must hold fewer than `max_tasks`, and the task must fit in
/// what is left of the route's bytes and of the store's. (The shared
/// store's park script applies the same rule.)
pub fn may_park(load: ParkLoad, size: u64, caps: ParkCaps) -> Result<(), ParkRefusal> {
    if load.route_tasks >= u64::from(caps.max_tasks) {
        return Err(ParkRefusal::Tasks(caps.max_tasks));
    }
    if load.route_bytes.saturating_add(size) > caps.max_bytes {
        return Err(ParkRefusal::RouteBytes(caps.max_bytes));
    }
    if load.store_bytes.saturating_add(size) > caps.store_max_bytes {
        return Err(ParkRefusal::StoreBytes(caps.store_max_bytes));
    }
    Ok(())
}

/// The bytes a parked task counts against the caps: its body, its path
/// and its kept headers (names and values).
pub fn task_bytes<'a>(
    path: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body_len: usize,
) -> u64 {
    let headers: usize = headers.into_iter().map(|(n, v)| n.len() + v.len()).sum();
    u64::try_from(body_len.saturating_add(path.len()).saturating_add(headers)).unwrap_or(u64::MAX)
}

/// How a run ended, as far as the task cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The router answered `error_type` itself (no backend answered).
    Router {
        /// The typed error (`no_backend`, `queue_full`, ...).
        error_type: RouterError,
    },
    /// A backend's answer, with its status.
    Backend {
        /// The HTTP status.
        status: u16,
    },
}

/// The router's own answers to a run, as far as the task cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterError {
    /// Shed before any send (`no_backend`, `queue_full`, `queue_timeout`,
    /// `overloaded`, `parked`, a tenant's `rate_limited`): nothing
    /// reached a backend.
    ShedBeforeSend,
    /// Anything else (`deadline_exhausted` after attempts, an upstream
    /// failure, `outcome_unknown`, ...).
    Other,
}

/// The event a finished run is: a shed before any send puts the task back
/// in line, a backend's 2xx is done, anything else failed (its answer is
/// kept with the task).
pub fn after_run(end: RunEnd) -> Event {
    match end {
        RunEnd::Router {
            error_type: RouterError::ShedBeforeSend,
        } => Event::Requeue,
        RunEnd::Router { .. } => Event::RunFailed,
        RunEnd::Backend { status } if (200..300).contains(&status) => Event::Answered,
        RunEnd::Backend { .. } => Event::RunFailed,
    }
}

/// The oldest task among `(parked_at_ms, id)` pairs (ties by id), so
/// that every proxy walking the same list picks the same one first.
pub fn pick_oldest<'a, I>(tasks: I) -> Option<&'a str>
where
    I: IntoIterator<Item = (u64, &'a str)>,
{
    tasks.into_iter().min().map(|(_, id)| id)
}

/// A parked task as the shared store keeps it (JSON), read and written
/// by every proxy and by the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task's id (URL-safe).
    pub id: String,
    /// Its state.
    pub state: TaskState,
    /// The route it was parked on.
    pub route: String,
    /// The request's risk class.
    pub risk: Risk,
    /// Whether an operator approved it.
    #[serde(default)]
    pub approved: bool,
    /// Who approved or dropped it: the name they gave, else their
    /// token's name, else their role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// The role of the credential that approved or dropped it
    /// (`operator` for a control plane's operator token, `admin` for a
    /// proxy's admin token, `open` for an API without tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_role: Option<String>,
    /// The name that credential carries, if it carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_token: Option<String>,
    /// The request id of the request that parked it.
    pub request_id: String,
    /// The tenant's name, if tenancy was on (never its key): the run is
    /// admitted again under this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Parked at (Unix ms).
    pub parked_at_ms: u64,
    /// Expires at (Unix ms) unless it runs.
    pub expires_at_ms: u64,
    /// The request's own deadline (Unix ms), if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at_ms: Option<u64>,
    /// Not run again before (Unix ms): its last run was shed with a
    /// `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<u64>,
    /// Why it was parked (the chain walk's reason).
    pub reason: String,
    /// The request: method.
    pub method: String,
    /// The request: path and query.
    pub path: String,
    /// The client's request headers, as an attempt sends them: all but
    /// credentials, hop-by-hop and per-hop ones, and the router's own.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    /// The request body, base64, in records written before bodies were
    /// stored apart (see [`layout`]); empty in newer ones.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body_b64: String,
    /// The task's bytes as the caps count them ([`task_bytes`]).
    #[serde(default)]
    pub bytes: u64,
    /// The runner: its proxy's id, while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
    /// The runner's lease ends at (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<u64>,
    /// How many runs started.
    #[serde(default)]
    pub runs: u32,
    /// The request id of the last run (its route log line has
    /// `parked_task` = this task's id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_request_id: Option<String>,
    /// The answer, once ended with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<TaskAnswer>,
    /// What ended it, in words, when it ended without an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A run's answer as stored with its task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskAnswer {
    /// HTTP status.
    pub status: u16,
    /// End-to-end headers.
    pub headers: Vec<(String, String)>,
    /// The body, base64.
    pub body_b64: String,
}

impl TaskRecord {
    /// The facts a transition needs.
    pub fn facts(&self) -> Facts {
        Facts {
            state: self.state,
            risk: self.risk,
            approved: self.approved,
        }
    }

    /// Its times.
    pub fn times(&self) -> Times {
        Times {
            parked_at_ms: self.parked_at_ms,
            expires_at_ms: self.expires_at_ms,
            deadline_at_ms: self.deadline_at_ms,
            not_before_ms: self.not_before_ms,
        }
    }

    /// Applies `event`: the new state (and, for an approval, the flag), or
    /// why not. Leaves the record unchanged on error.
    pub fn apply(&mut self, event: Event) -> Result<TaskState, Illegal> {
        let next = transition(self.facts(), event)?;
        if event == Event::Approve {
            self.approved = true;
        }
        if next != TaskState::Running {
            self.claimed_by = None;
            self.lease_until_ms = None;
        }
        if next.is_terminal() {
            // An ended task never runs: its body (in an older record) goes.
            self.body_b64 = String::new();
            self.not_before_ms = None;
        }
        self.state = next;
        Ok(next)
    }

    /// The state the task shows at `now`: a waiting task past its time is
    /// shown `expired` even before a proxy has marked it so.
    pub fn state_at(&self, now_ms: u64) -> TaskState {
        if is_expired(self.state, self.times(), now_ms) {
            TaskState::Expired
        } else {
            self.state
        }
    }

    /// The view a client or an operator gets (no body, no headers).
    pub fn summary(&self, now_ms: u64) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "object": "router.task",
            "state": self.state_at(now_ms).as_str(),
            "route": self.route,
            "risk": self.risk.as_str(),
            "approved": self.approved,
            "tenant": self.tenant,
            "request_id": self.request_id,
            "parked_at_ms": self.parked_at_ms,
            "expires_at_ms": self.expires_at_ms,
            "deadline_at_ms": self.deadline_at_ms,
            "runs": self.runs,
            "run_request_id": self.run_request_id,
            "reason": self.reason,
            "error": self.error,
        })
    }
}

impl TaskRecord {
    /// The bytes the caps count for this task: [`TaskRecord::bytes`], or,
    /// in a record written before tasks counted their bytes, its body's
    /// and headers' sizes.
    pub fn counted_bytes(&self) -> u64 {
        if self.bytes > 0 {
            return self.bytes;
        }
        task_bytes(
            &self.path,
            self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            self.body_b64.len() / 4 * 3,
        )
    }
}

/// The shared store's layout for tasks: one definition for the proxies and
/// the control plane. `{p}` is the store's key prefix.
///
/// - `{p}task:{id}`: a hash, `rev` (a counter), `doc` (the [`TaskRecord`]
///   as JSON, without the body) and `body` (the request body, raw bytes;
///   absent in records written before bodies were stored apart, whose
///   `doc` carries it as `body_b64`). Every change is a compare-and-set on
///   `rev` ([`layout::CAS_SCRIPT`]), so two proxies never both claim a
///   task. The dispatchers read `rev` and `doc` only; `body` is read to
///   run the task, and deleted when it ends.
/// - `{p}tasks`: a sorted set of the live tasks' ids, scored by their
///   park time (oldest first, for the dispatchers and `tasks list`).
/// - `{p}tasks:route:{route}`: the same per route, for the cap.
/// - `{p}tasks:bytes` and `{p}tasks:route_bytes:{route}`: hashes of the
///   live tasks' bytes ([`task_bytes`]) by id, in the store and on the
///   route, for the byte caps.
///
/// A task that ends leaves the sets and the byte hashes, its body is
/// deleted, and its hash is kept for its TTL, so that the client can still
/// fetch the answer.
pub mod layout {
    /// The task's hash.
    pub fn task_key(prefix: &str, id: &str) -> String {
        format!("{}{id}", task_key_prefix(prefix))
    }
    /// What every task's key starts with.
    pub fn task_key_prefix(prefix: &str) -> String {
        format!("{prefix}task:")
    }
    /// The live tasks.
    pub fn live_key(prefix: &str) -> String {
        format!("{prefix}tasks")
    }
    /// A route's live tasks.
    pub fn route_key(prefix: &str, route: &str) -> String {
        format!("{prefix}tasks:route:{route}")
    }
    /// The live tasks' bytes, by id.
    pub fn bytes_key(prefix: &str) -> String {
        format!("{prefix}tasks:bytes")
    }
    /// A route's live tasks' bytes, by id.
    pub fn route_bytes_key(prefix: &str, route: &str) -> String {
        format!("{prefix}tasks:route_bytes:{route}")
    }
    /// The `KEYS` of [`PARK_SCRIPT`] and [`CAS_SCRIPT`] for task `id` on
    /// `route`.
    pub fn script_keys(prefix: &str, id: &str, route: &str) -> [String; 5] {
        [
            task_key(prefix, id),
            live_key(prefix),
            route_key(prefix, route),
            bytes_key(prefix),
            route_bytes_key(prefix, route),
        ]
    }

    /// Parks a task: `KEYS` = [`script_keys`], `ARGV = [doc, parked_at_ms,
    /// id, max_tasks, task key prefix, body, bytes, route max_bytes, store
    /// max_bytes]`. Returns 1 parked, 2 a task with this id exists already
    /// (a retry of the same keyed request), or which cap it does not fit
    /// under ([`super::may_park`]'s rule): 0 the route's count, 3 the
    /// route's bytes, 4 the store's bytes. Over a cap, ids whose task is
    /// gone (deleted or evicted by hand) are pruned first, so they never
    /// hold a cap.
    pub const PARK_SCRIPT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
local size = tonumber(ARGV[7])
local function sum(key)
  local s = 0
  for _, v in ipairs(redis.call('HVALS', key)) do s = s + tonumber(v) end
  return s
end
local function verdict()
  if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[4]) then return 0 end
  if sum(KEYS[5]) + size > tonumber(ARGV[8]) then return 3 end
  if sum(KEYS[4]) + size > tonumber(ARGV[9]) then return 4 end
  return 1
end
local v = verdict()
if v ~= 1 then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    if redis.call('EXISTS', ARGV[5] .. id) == 0 then
      redis.call('ZREM', KEYS[3], id)
      redis.call('ZREM', KEYS[2], id)
    end
  end
  for _, key in ipairs({KEYS[4], KEYS[5]}) do
    for _, id in ipairs(redis.call('HKEYS', key)) do
      if redis.call('EXISTS', ARGV[5] .. id) == 0 then
        redis.call('HDEL', key, id)
      end
    end
  end
  v = verdict()
  if v ~= 1 then return v end
end
redis.call('HSET', KEYS[1], 'rev', '1', 'doc', ARGV[1], 'body', ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[3], ARGV[7])
redis.call('HSET', KEYS[5], ARGV[3], ARGV[7])
return 1
";

    /// Compare-and-set of a task: `KEYS` = [`script_keys`], `ARGV =
    /// [expected rev, doc, id, live (1/0), keep_ms]`. Returns the new rev,
    /// or 0 when the task changed since it was read (or is gone). A task
    /// that is no longer live leaves the sets and the byte hashes, loses
    /// its body, and expires after `keep_ms`.
    pub const CAS_SCRIPT: &str = r"
local rev = redis.call('HGET', KEYS[1], 'rev')
if rev ~= ARGV[1] then return 0 end
local next = tonumber(rev) + 1
redis.call('HSET', KEYS[1], 'rev', tostring(next), 'doc', ARGV[2])
if ARGV[4] == '0' then
  redis.call('ZREM', KEYS[2], ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('HDEL', KEYS[4], ARGV[3])
  redis.call('HDEL', KEYS[5], ARGV[3])
  redis.call('HDEL', KEYS[1], 'body')
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return next
";
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn facts(state: TaskState, risk: Risk, approved: bool) -> Facts {
        Facts {
            state,
            risk,
            approved,
        }
    }

    #[test]
    fn the_first_state_comes_from_the_risk() {
        assert_eq!(initial_state(Risk::Read), TaskState::WaitingCapacity);
        assert_eq!(initial_state(Risk::Draft), TaskState::WaitingCapacity);
        assert_eq!(initial_state(Risk::Send), TaskState::WaitingApproval);
        assert_eq!(initial_state(Risk::Destructive), TaskState::WaitingApproval);
    }

    #[test]
    fn a_send_task_runs_only_after_approval() {
        let waiting = facts(TaskState::WaitingApproval, Risk::Send, false);
        assert_eq!(transition(waiting, Event::Claim), Err(Illegal::NotApproved));
        assert_eq!(
            transition(waiting, Event::Approve),
            Ok(TaskState::WaitingCapacity)
        );
        let approved = facts(TaskState::WaitingCapacity, Risk::Send, true);
        assert_eq!(transition(approved, Event::Claim), Ok(TaskState::Running));
    }

    #[test]
    fn a_lost_lease_reruns_reads_and_fails_sends() {
        let read = facts(TaskState::Running, Risk::Read, false);
        assert_eq!(
            transition(read, Event::LeaseLost),
            Ok(TaskState::WaitingCapacity)
        );
        let send = facts(TaskState::Running, Risk::Send, true);
        assert_eq!(transition(send, Event::LeaseLost), Ok(TaskState::Failed));
    }

    #[test]
    fn a_task_expires_at_the_earlier_of_its_ttl_and_deadline() {
        let t = Times::new(1_000, Duration::from_secs(10), Some(5_000));
        assert_eq!(t.ends_at_ms(), 5_000);
        assert!(!is_expired(TaskState::WaitingCapacity, t, 4_999));
        assert!(is_expired(TaskState::WaitingCapacity, t, 5_000));
        assert!(!is_expired(TaskState::Running, t, 50_000));
        let read = facts(TaskState::WaitingCapacity, Risk::Read, false);
        assert_eq!(may_run(read, t, 4_000), Wait::Run);
        assert_eq!(may_run(read, t, 6_000), Wait::Expired);
        let t = Times::new(1_000, Duration::from_secs(10), None);
        assert_eq!(t.ends_at_ms(), 11_000);
    }

    #[test]
    fn runs_shed_by_the_router_requeue_and_answers_end_the_task() {
        assert_eq!(
            after_run(RunEnd::Router {
                error_type: RouterError::ShedBeforeSend
            }),
            Event::Requeue
        );
        assert_eq!(
            after_run(RunEnd::Router {
                error_type: RouterError::Other
            }),
            Event::RunFailed
        );
        assert_eq!(after_run(RunEnd::Backend { status: 200 }), Event::Answered);
        assert_eq!(after_run(RunEnd::Backend { status: 500 }), Event::RunFailed);
    }

    #[test]
    fn the_cap_and_the_oldest_first() {
        let caps = ParkCaps {
            max_tasks: 1,
            max_bytes: u64::MAX,
            store_max_bytes: u64::MAX,
        };
        assert_eq!(may_park(ParkLoad::default(), 10, caps), Ok(()));
        let one = ParkLoad {
            route_tasks: 1,
            ..ParkLoad::default()
        };
        assert_eq!(may_park(one, 10, caps), Err(ParkRefusal::Tasks(1)));
        assert_eq!(pick_oldest([(3, "c"), (1, "b"), (1, "a")]), Some("a"));
        assert_eq!(pick_oldest(std::iter::empty()), None);
    }

    #[test]
    fn parked_bytes_are_capped_per_route_and_per_store() {
        let caps = ParkCaps {
            max_tasks: 100,
            max_bytes: 100,
            store_max_bytes: 150,
        };
        let load = |route_bytes, store_bytes| ParkLoad {
            route_tasks: 1,
            route_bytes,
            store_bytes,
        };
        // Up to the cap exactly, not a byte past it.
        assert_eq!(may_park(load(60, 60), 40, caps), Ok(()));
        assert_eq!(
            may_park(load(60, 60), 41, caps),
            Err(ParkRefusal::RouteBytes(100))
        );
        // The route has room, the store (other routes' tasks) has not.
        assert_eq!(
            may_park(load(10, 120), 40, caps),
            Err(ParkRefusal::StoreBytes(150))
        );
        // One task larger than the cap is refused on an empty route.
        assert_eq!(
            may_park(ParkLoad::default(), 101, caps),
            Err(ParkRefusal::RouteBytes(100))
        );
        // What counts: body, path, headers.
        assert_eq!(
            task_bytes("/v1/x", [("content-type", "a/b")], 1000),
            1000 + 5 + 12 + 3
        );
    }

    #[test]
    fn a_run_shed_with_retry_after_waits_for_it() {
        let mut t = Times::new(1_000, Duration::from_secs(60), None);
        t.not_before_ms = Some(5_000);
        let read = facts(TaskState::WaitingCapacity, Risk::Read, false);
        assert_eq!(may_run(read, t, 4_999), Wait::Later);
        assert_eq!(may_run(read, t, 5_000), Wait::Run);
        // Its TTL still ends it while it waits.
        assert_eq!(may_run(read, t, 61_000), Wait::Expired);
    }

    #[test]
    fn records_written_before_bodies_were_stored_apart_still_read() {
        // A record as an earlier version wrote it: the body in the doc, no
        // byte count, no tenant, no operator's role.
        let old = r#"{"id":"t1","state":"waiting_capacity","route":"r","risk":"READ",
            "request_id":"q","parked_at_ms":1,"expires_at_ms":2,"reason":"down",
            "method":"POST","path":"/v1/chat/completions",
            "headers":[["content-type","application/json"]],"body_b64":"AAAAAAAA"}"#;
        let t: TaskRecord = serde_json::from_str(old).unwrap();
        assert_eq!(t.body_b64, "AAAAAAAA");
        assert_eq!(t.bytes, 0);
        assert_eq!(t.counted_bytes(), 6 + 20 + 12 + 16);
        assert_eq!(t.operator_role, None);
        // A newer record leaves the body out of the doc.
        let mut new = t.clone();
        new.body_b64 = String::new();
        new.bytes = 42;
        let doc = serde_json::to_string(&new).unwrap();
        assert!(!doc.contains("body_b64"), "{doc}");
        assert_eq!(
            serde_json::from_str::<TaskRecord>(&doc)
                .unwrap()
                .counted_bytes(),
            42
        );
        // An ended task drops an older record's body.
        let mut ended = t;
        ended.apply(Event::Drop).unwrap();
        assert!(ended.body_b64.is_empty());
    }

    fn any_event() -> impl Strategy<Value = Event> {
        prop_oneof![
            Just(Event::Approve),
            Just(Event::Claim),
            Just(Event::Answered),
            Just(Event::RunFailed),
            Just(Event::Requeue),
            Just(Event::LeaseLost),
            Just(Event::Expire),
            Just(Event::Drop),
        ]
    }

    fn any_risk() -> impl Strategy<Value = Risk> {
        prop_oneof![
            Just(Risk::Read),
            Just(Risk::Draft),
            Just(Risk::Send),
            Just(Risk::Destructive),
        ]
    }

    proptest! {
        /// Whatever happens, a task with side effects is never running
        /// unless an approval came first, and nothing leaves a terminal
        /// state.
        #[test]
        fn side_effects_never_run_unapproved_and_terminal_states_stay(
            risk in any_risk(),
            events in proptest::collection::vec(any_event(), 0..40),
        ) {
            let mut task = TaskRecord {
                id: "t".into(),
                state: initial_state(risk),
                route: "r".into(),
                risk,
                approved: false,
                operator: None,
                operator_role: None,
                operator_token: None,
                request_id: "q".into(),
                tenant: None,
                parked_at_ms: 0,
                expires_at_ms: 1,
                deadline_at_ms: None,
                not_before_ms: None,
                reason: String::new(),
                method: "POST".into(),
                path: "/".into(),
                headers: Vec::new(),
                body_b64: String::new(),
                bytes: 0,
                claimed_by: None,
                lease_until_ms: None,
                runs: 0,
                run_request_id: None,
                answer: None,
                error: None,
            };
            let mut approved_before_running = false;
            for e in events {
                let before = task.state;
                let result = task.apply(e);
                if before.is_terminal() {
                    prop_assert!(result.is_err());
                    prop_assert_eq!(task.state, before);
                }
                if e == Event::Approve && result.is_ok() {
                    approved_before_running = true;
                }
                if task.state == TaskState::Running && risk.has_side_effects() {
                    prop_assert!(approved_before_running && task.approved);
                }
            }
        }
    }
}

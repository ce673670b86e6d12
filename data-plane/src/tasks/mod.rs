//! Parked tasks (`on_all_down: park`): requests that arrived while every
//! pool of their route was down, kept until a pool recovers (or an
//! operator approves them) and then run once.
//!
//! The rules (states, approval, TTL, leases, oldest first) are
//! [`router_policy::park`]'s; this module carries them out:
//!
//! - [`TaskStore`] (`router_shared_state::tasks`): where tasks live,
//!   `RedisTasks` in the fleet's shared store (`CUSTOM_ROUTER_SHARED_STORE`), so that any proxy can run
//!   a task another parked and a client can fetch it through any proxy;
//!   `LocalTasks` in this process, written through to
//!   `CUSTOM_ROUTER_TASKS_FILE` when set (one proxy). Every change is a
//!   compare-and-set on the task's revision: two proxies never both claim
//!   a task. A task's body is kept apart from its record: reading, listing
//!   and changing tasks (the dispatcher, every 250 ms) never copies a
//!   body; it is read only to run the task ([`Tasks::body`]). Parking is
//!   capped in count and in bytes per route, and in bytes for the whole
//!   store (`CUSTOM_ROUTER_PARK_MAX_BYTES`), by
//!   [`router_policy::park::may_park`].
//! - [`Tasks`]: the proxy's handle (the store, this proxy's id, the secret
//!   that marks its own runs, metrics).
//! - [`dispatch`]: the per-proxy loop that expires, takes over and runs
//!   tasks.
//!
//! A task runs as an ordinary request sent by the proxy to itself over
//! loopback, marked with `x-router-task-run: <secret> <task id>`: the same
//! ingress, decision, chain walk and route log line as any request (the
//! line carries `parked_task`), minus parking, the route's approval
//! token (the operator's approval stands for it) and the `Idempotency-Key`
//! bookkeeping (the task is the run's once-only guard). It carries the
//! client's own headers, as any attempt does (credentials excepted), so
//! its request id, `Idempotency-Key` and `Content-Type` are the parked
//! request's. A tenant's task names its tenant in the mark, and the run is
//! admitted under that tenant again (see `handler::tenancy`).

pub(crate) mod dispatch;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use router_policy::park::{initial_state, Event, ParkCaps, TaskRecord, TaskState, Times};
use router_policy::Risk;

use crate::metrics::Metrics;
use router_shared_state::idempotency::Fingerprint;
use router_shared_state::StoreError;

pub(crate) use router_shared_state::tasks::{ParkResult, TaskStore, Versioned};

/// The header that marks a proxy's run of a parked task.
pub(crate) const TASK_RUN: &str = "x-router-task-run";

/// The path prefix of the clients' task handles.
pub(crate) const TASKS_PATH: &str = "/v1/router/tasks/";

/// This proxy's parked tasks.
pub(crate) struct Tasks {
    pub(crate) store: Arc<dyn TaskStore>,
    /// This proxy's id in claims.
    pub(crate) proxy_id: String,
    /// Marks this proxy's own runs (random per process).
    secret: String,
    pub(crate) metrics: Arc<Metrics>,
    /// How long a claim holds without renewal.
    pub(crate) lease: Duration,
    /// Most bytes of live tasks in the store (`CUSTOM_ROUTER_PARK_MAX_BYTES`).
    pub(crate) max_bytes: u64,
}

/// A parked task's run, as its mark says ([`Tasks::run_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskRun {
    /// The task's id.
    pub(crate) id: String,
    /// The tenant that parked it, if any: the run is admitted under it.
    pub(crate) tenant: Option<String>,
}

/// What a parked request keeps: built when it parks
/// ([`ParkIntent::context`]).
pub(crate) struct ParkContext {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Bytes,
    pub(crate) risk: Risk,
    /// The request's own deadline (`X-Router-Deadline-Ms`), Unix ms.
    pub(crate) deadline_at_ms: Option<u64>,
    /// `Prefer: respond-async`.
    pub(crate) respond_async: bool,
    /// The `Idempotency-Key` and the request's fingerprint: the task's id
    /// comes from them, so that a retry finds its task.
    pub(crate) keyed: Option<(String, Fingerprint)>,
    /// A parked task's own run: never parked again; where it would be,
    /// it answers `no_backend` (its task then waits again).
    pub(crate) run: bool,
}

/// Headers kept with a parked task: what the client sent, as an attempt
/// passes it on (its `Idempotency-Key`, `X-Request-Id`, `Content-Type`,
/// trace context, its own headers), except credentials (never stored:
/// a pool sends its own key, a tenant's run is admitted by the tenant's
/// name), hop-by-hop headers and those named in `Connection`, those the
/// router sets per hop (`Host`, `Content-Length`, `Forwarded`,
/// `X-Forwarded-*`), the router's own `X-Router-*`, and `Prefer` (the
/// router itself answered `respond-async`).
fn kept_header(name: &str, connection_named: &[&str]) -> bool {
    !(name.starts_with("x-router-")
        || name.starts_with("x-forwarded-")
        || crate::hop_by_hop::is_hop_by_hop_name(name)
        || connection_named
            .iter()
            .any(|c| c.eq_ignore_ascii_case(name))
        || matches!(
            name,
            "authorization"
                | "x-api-key"
                | "api-key"
                | "cookie"
                | "host"
                | "content-length"
                | "forwarded"
                | "prefer"
        ))
}

/// Whether `headers` ask for an asynchronous answer (RFC 7240).
pub(crate) fn prefers_async(headers: &HeaderMap) -> bool {
    headers.get_all("prefer").iter().any(|v| {
        v.to_str().is_ok_and(|s| {
            s.split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
        })
    })
}

/// What a parking route notes of a request when it arrives: only what
/// cannot be had later (its own deadline as a wall-clock time, its key).
/// The request itself is copied into a [`ParkContext`] only if it parks
/// ([`Self::context`]), not for every request the route serves.
pub(crate) struct ParkIntent {
    /// The request's own deadline (`X-Router-Deadline-Ms`), Unix ms.
    deadline_at_ms: Option<u64>,
    /// `Prefer: respond-async`.
    pub(crate) respond_async: bool,
    /// The `Idempotency-Key` and the request's fingerprint.
    pub(crate) keyed: Option<(String, Fingerprint)>,
    /// A parked task's own run: never parked again.
    pub(crate) run: bool,
}

impl ParkIntent {
    /// A request arriving on a parking route.
    pub(crate) fn new(
        headers: &HeaderMap,
        header_deadline: Option<Duration>,
        keyed: Option<(String, Fingerprint)>,
    ) -> Box<Self> {
        Box::new(Self {
            deadline_at_ms: header_deadline.map(|d| {
                unix_ms().saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }),
            respond_async: prefers_async(headers),
            keyed,
            run: false,
        })
    }

    /// A parked task's own run (nothing is kept).
    pub(crate) fn run() -> Box<Self> {
        Box::new(Self {
            deadline_at_ms: None,
            respond_async: false,
            keyed: None,
            run: true,
        })
    }

    /// The task's id ([`task_id`]).
    pub(crate) fn task_id(&self) -> String {
        task_id(&self.keyed)
    }

    /// What parking keeps of the request: called when it parks.
    pub(crate) fn context(
        &self,
        method: &http::Method,
        path: &str,
        headers: &HeaderMap,
        body: &Bytes,
        risk: Risk,
    ) -> ParkContext {
        let connection: Vec<&str> = headers
            .get_all(http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let kept = headers
            .iter()
            .filter(|(n, _)| kept_header(n.as_str(), &connection))
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        ParkContext {
            method: method.as_str().to_string(),
            path: path.to_string(),
            headers: kept,
            body: body.clone(),
            risk,
            deadline_at_ms: self.deadline_at_ms,
            respond_async: self.respond_async,
            keyed: self.keyed.clone(),
            run: self.run,
        }
    }
}

impl ParkContext {
    /// The task's id ([`task_id`]).
    pub(crate) fn task_id(&self) -> String {
        task_id(&self.keyed)
    }
}

/// A task's id: from the key and fingerprint (a retry finds it; a
/// different request or caller with the same key gets another), else
/// random.
fn task_id(keyed: &Option<(String, Fingerprint)>) -> String {
    match keyed {
        Some((key, fp)) => keyed_task_id(key, *fp),
        None => hex(&crate::random::bytes::<16>()),
    }
}

/// A keyed request's task id.
pub(crate) fn keyed_task_id(key: &str, fp: Fingerprint) -> String {
    use ring::digest::{Context, SHA256};
    let mut c = Context::new(&SHA256);
    c.update(b"router-task\0");
    c.update(key.as_bytes());
    c.update(b"\0");
    c.update(&fp.0);
    let d = c.finish();
    hex(&d.as_ref()[..16])
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

use router_shared_state::tasks::hex;

/// Now, as Unix milliseconds (tasks are shared across machines: wall
/// time, not a monotonic clock).
pub(crate) use router_policy::wall_clock::unix_ms;

/// How long an ended task is kept for its client to fetch.
pub(crate) fn keep_for(task: &TaskRecord) -> Duration {
    Duration::from_millis(
        task.expires_at_ms
            .saturating_sub(task.parked_at_ms)
            .max(60_000),
    )
}

impl Tasks {
    /// Tasks in `store`; claims last `lease` unless renewed; the store
    /// holds at most `max_bytes` of live tasks.
    pub(crate) fn new(
        store: Arc<dyn TaskStore>,
        metrics: Arc<Metrics>,
        lease: Duration,
        max_bytes: u64,
    ) -> Self {
        Self {
            store,
            proxy_id: format!("proxy-{}", hex(&crate::random::bytes::<6>())),
            secret: hex(&crate::random::bytes::<16>()),
            metrics,
            lease,
            max_bytes,
        }
    }

    /// The header value that marks this proxy's run of `task`:
    /// `SECRET ID`, and the tenant's name (hex) when it has one.
    pub(crate) fn run_header(&self, task: &TaskRecord) -> Option<HeaderValue> {
        let mark = match &task.tenant {
            Some(t) => format!("{} {} {}", self.secret, task.id, hex(t.as_bytes())),
            None => format!("{} {}", self.secret, task.id),
        };
        HeaderValue::from_str(&mark).ok()
    }

    /// The task `headers` say this request is a run of, if the mark is
    /// this proxy's (compared in constant time).
    pub(crate) fn run_of(&self, headers: &HeaderMap) -> Option<TaskRun> {
        use subtle::ConstantTimeEq;
        let v = headers.get(TASK_RUN)?.to_str().ok()?;
        let mut fields = v.split(' ');
        let (secret, id) = (fields.next()?, fields.next()?);
        if !bool::from(secret.as_bytes().ct_eq(self.secret.as_bytes())) {
            return None;
        }
        let tenant = match fields.next() {
            None => None,
            Some(h) => Some(String::from_utf8(unhex(h)?).ok()?),
        };
        Some(TaskRun {
            id: id.to_string(),
            tenant,
        })
    }

    /// The body of task `task` (read only to run it): an older record's
    /// own, else the store's.
    pub(crate) async fn body(&self, task: &TaskRecord) -> Result<Option<Bytes>, RunError> {
        if !task.body_b64.is_empty() {
            return base64::engine::general_purpose::STANDARD
                .decode(&task.body_b64)
                .map(|b| Some(Bytes::from(b)))
                .map_err(RunError::BodyNotBase64);
        }
        self.store.body(&task.id).await.map_err(RunError::Store)
    }

    /// Parks the request of `ctx` on `route` (id `request_id`), or says
    /// why not.
    pub(crate) async fn park(
        &self,
        ctx: &ParkContext,
        route: &router_policy::Route,
        request_id: &str,
        tenant: Option<&str>,
        reason: String,
    ) -> Result<(ParkResult, TaskRecord), StoreError> {
        let settings = route.park.ok_or_else(|| {
            StoreError::Unavailable("the route does not park (a policy change)".into())
        })?;
        let now = unix_ms();
        let times = Times::new(now, settings.ttl, ctx.deadline_at_ms);
        let bytes = router_policy::park::task_bytes(
            &ctx.path,
            ctx.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            ctx.body.len(),
        );
        let task = TaskRecord {
            id: ctx.task_id(),
            state: initial_state(ctx.risk),
            route: route.name.clone(),
            risk: ctx.risk,
            approved: false,
            operator: None,
            operator_role: None,
            operator_token: None,
            request_id: request_id.to_string(),
            tenant: tenant.map(str::to_string),
            parked_at_ms: times.parked_at_ms,
            expires_at_ms: times.expires_at_ms,
            deadline_at_ms: times.deadline_at_ms,
            not_before_ms: None,
            reason,
            method: ctx.method.clone(),
            path: ctx.path.clone(),
            headers: ctx.headers.clone(),
            body_b64: String::new(),
            bytes,
            claimed_by: None,
            lease_until_ms: None,
            runs: 0,
            run_request_id: None,
            answer: None,
            error: None,
        };
        // A deadline already past: nothing to park.
        if times.ends_at_ms() <= now {
            return Ok((ParkResult::Late, task));
        }
        let caps = ParkCaps {
            max_tasks: settings.max_tasks,
            max_bytes: settings.max_bytes,
            store_max_bytes: self.max_bytes,
        };
        let r = self.store.park(&task, &ctx.body, caps).await?;
        if matches!(r, ParkResult::Parked) {
            self.metrics.parked_task(&task.route, task.state.as_str());
            tracing::info!(task = %task.id, route = %task.route, state = task.state.as_str(), request_id, "every pool of the route is down: request parked");
        }
        Ok((r, task))
    }

    /// Applies `event` to the task read as `v` and stores it: the new
    /// revision, `Ok(None)` when someone changed it first, or the rule
    /// that forbids it.
    pub(crate) async fn change(
        &self,
        v: &mut Versioned,
        event: Event,
        edit: impl FnOnce(&mut TaskRecord),
    ) -> Result<Option<u64>, ChangeError> {
        let mut next = v.task.clone();
        let state = next.apply(event).map_err(ChangeError::Illegal)?;
        edit(&mut next);
        let keep = keep_for(&next);
        match self.store.cas(v.rev, &next, keep).await {
            Ok(Some(rev)) => {
                self.metrics.parked_task(&next.route, state.as_str());
                v.rev = rev;
                v.task = next;
                Ok(Some(rev))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(ChangeError::Store(e)),
        }
    }
}

/// Why a parked task's run could not be sent (the task's `error`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    /// An older record's own body is not base64.
    #[error("the stored body is not base64: {0}")]
    BodyNotBase64(base64::DecodeError),
    /// The store failed to give the body.
    #[error("the task store: {0}")]
    Store(StoreError),
    /// The store no longer has the body.
    #[error("its body is gone from the task store")]
    BodyGone,
    /// The task's deadline passed before its run.
    #[error("its deadline passed")]
    DeadlinePassed,
    /// The stored method, path or headers do not make a request.
    #[error("the stored request cannot be sent: {0}")]
    Unsendable(http::Error),
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    /// The rules forbid it.
    #[error(transparent)]
    Illegal(router_policy::park::Illegal),
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

/// A task's answer for its client: the stored answer once ended with one,
/// else its state as JSON.
pub(crate) fn task_response(task: &TaskRecord, replay: bool) -> http::Response<Bytes> {
    let now = unix_ms();
    let state = task.state_at(now);
    if let (Some(a), TaskState::Done | TaskState::Failed) = (&task.answer, state) {
        let body = base64::engine::general_purpose::STANDARD
            .decode(&a.body_b64)
            .unwrap_or_default();
        let mut resp = http::Response::new(Bytes::from(body));
        *resp.status_mut() =
            http::StatusCode::from_u16(a.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
        for (n, v) in &a.headers {
            if let (Ok(n), Ok(v)) = (
                http::header::HeaderName::from_bytes(n.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                resp.headers_mut().append(n, v);
            }
        }
        stamp(&mut resp, task, state);
        if replay {
            resp.headers_mut()
                .insert("x-router-replayed", HeaderValue::from_static("true"));
        }
        return resp;
    }
    let mut resp = http::Response::new(Bytes::from(task.summary(now).to_string()));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if !state.is_terminal() {
        resp.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    stamp(&mut resp, task, state);
    resp
}

fn stamp(resp: &mut http::Response<Bytes>, task: &TaskRecord, state: TaskState) {
    if let Ok(v) = HeaderValue::from_str(&task.id) {
        resp.headers_mut().insert("x-router-task", v);
    }
    resp.headers_mut().insert(
        "x-router-task-state",
        HeaderValue::from_static(state.as_str()),
    );
}

/// `GET /v1/router/tasks/{id}`: the task's state, then its answer.
pub(crate) async fn view(tasks: &Tasks, path: &str) -> http::Response<Bytes> {
    let id = path.strip_prefix(TASKS_PATH).unwrap_or_default();
    let not_found = || crate::error::ProxyError::NotFound.to_response(None);
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return not_found();
    }
    match tasks.store.get(id).await {
        Ok(Some(v)) => task_response(&v.task, false),
        Ok(None) => not_found(),
        Err(e) => {
            tracing::warn!(error = %e, "task store: cannot read a task");
            crate::error::ProxyError::SharedStoreUnavailable(crate::error::StoreNeed::Task)
                .to_response(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_headers_are_kept_but_credentials_hops_and_router_headers() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("authorization", "Bearer s"),
            ("x-api-key", "s"),
            ("cookie", "s=1"),
            ("x-router-risk", "READ"),
            ("x-forwarded-for", "10.0.0.1"),
            ("host", "router"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("prefer", "respond-async, wait=5"),
            ("content-type", "application/json"),
            ("idempotency-key", "k-1"),
            ("x-request-id", "r-1"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("openai-beta", "assistants=v2"),
        ] {
            h.insert(
                http::header::HeaderName::from_static(n),
                HeaderValue::from_static(v),
            );
        }
        let ctx = ParkIntent::new(&h, None, None).context(
            &http::Method::POST,
            "/v1/chat/completions",
            &h,
            &Bytes::from_static(b"{}"),
            Risk::Read,
        );
        let mut kept: Vec<&str> = ctx.headers.iter().map(|(n, _)| n.as_str()).collect();
        kept.sort_unstable();
        assert_eq!(
            kept,
            [
                "content-type",
                "idempotency-key",
                "openai-beta",
                "traceparent",
                "x-request-id"
            ]
        );
        assert!(ctx.respond_async);
        assert_eq!(ctx.task_id().len(), 32);
    }

    #[test]
    fn a_runs_mark_names_its_task_and_tenant_and_only_this_proxys_counts() {
        let store: Arc<dyn TaskStore> =
            Arc::new(router_shared_state::tasks::LocalTasks::open(None).unwrap());
        let tasks = Tasks::new(
            store,
            Arc::new(Metrics::default()),
            Duration::from_secs(1),
            1,
        );
        let mut t = router_shared_state::testing::task("abc", "r", 1);
        t.tenant = Some("team a/é".into());
        let mut h = HeaderMap::new();
        h.insert(TASK_RUN, tasks.run_header(&t).unwrap());
        assert_eq!(
            tasks.run_of(&h),
            Some(TaskRun {
                id: "abc".into(),
                tenant: Some("team a/é".into())
            })
        );
        t.tenant = None;
        h.insert(TASK_RUN, tasks.run_header(&t).unwrap());
        assert_eq!(
            tasks.run_of(&h).map(|r| (r.id, r.tenant)),
            Some(("abc".into(), None))
        );
        // Another proxy's (or a client's) mark is nobody's run.
        h.insert(TASK_RUN, HeaderValue::from_static("0000 abc"));
        assert_eq!(tasks.run_of(&h), None);
    }

    #[tokio::test]
    async fn a_body_that_cannot_be_read_says_why() {
        let store: Arc<dyn TaskStore> =
            Arc::new(router_shared_state::tasks::LocalTasks::open(None).unwrap());
        let tasks = Tasks::new(
            store,
            Arc::new(Metrics::default()),
            Duration::from_secs(1),
            1,
        );
        let mut t = router_shared_state::testing::task("abc", "r", 1);
        assert!(matches!(tasks.body(&t).await, Ok(None)));
        t.body_b64 = "not base64!".into();
        let err = tasks.body(&t).await.unwrap_err();
        assert!(matches!(err, RunError::BodyNotBase64(_)), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("the stored body is not base64: "),
            "{err}"
        );
        t.body_b64 = "e30=".into();
        assert_eq!(
            tasks.body(&t).await.ok().flatten(),
            Some(Bytes::from_static(b"{}"))
        );
    }

    #[test]
    fn a_keyed_task_id_depends_on_the_key_and_the_request() {
        let a = keyed_task_id("k", Fingerprint([1; 16]));
        assert_eq!(a, keyed_task_id("k", Fingerprint([1; 16])));
        assert_ne!(a, keyed_task_id("k", Fingerprint([2; 16])));
        assert_ne!(a, keyed_task_id("k2", Fingerprint([1; 16])));
    }
}

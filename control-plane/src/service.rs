//! The gRPC services: `Admin` for routerctl, `ProxyConfig` for proxies.
//!
//! Every call must carry `authorization: Bearer <token>` when the control
//! plane has tokens; interceptors in front of both services check them
//! ([`crate::auth`], comparing digests in constant time as
//! `router_proto::token` does): `Admin` takes the operator token only, `ProxyConfig`
//! the operator token or a proxy token, and a proxy token pinned to a node
//! id opens the stream for that node id only. On the stream, a proxy's
//! circuit reports go through its rate limit before they reach the hub.

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use router_proto::v1 as pb;
use router_proto::v1::admin_server::Admin;
use router_proto::v1::proxy_config_server::ProxyConfig;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::auth::Role;
use crate::hub::{Hub, HubError};

/// How long a new stream has to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest node id a proxy may give (a DNS name's length).
const NODE_ID_MAX: usize = 253;
/// How long `backends list` waits for the proxies' quota readings.
const QUOTA_WAIT: Duration = Duration::from_secs(1);

fn status(e: HubError) -> Status {
    match e {
        HubError::Invalid(_) | HubError::TooLarge { .. } => Status::invalid_argument(e.to_string()),
        HubError::Conflict { .. } => Status::aborted(e.to_string()),
        HubError::NotFound(_) => Status::not_found(e.to_string()),
        HubError::TooManyProxies { .. } => Status::resource_exhausted(e.to_string()),
        HubError::Store(crate::store::StoreError::Conflict { .. }) => {
            Status::aborted(e.to_string())
        }
        HubError::Store(_) => Status::unavailable(e.to_string()),
    }
}

fn field_errors(errors: Vec<router_policy::FieldError>) -> Vec<pb::FieldError> {
    errors
        .into_iter()
        .map(|e| pb::FieldError {
            field: e.field,
            reason: e.reason,
        })
        .collect()
}

/// The node id a stream speaks for: the hello's, checked against the
/// token's pin (a pinned token with no node id in the hello takes the pin).
/// The caller's role, as the admin interceptor put it (an open API's when
/// the service is mounted without one, as in tests).
fn caller<T>(req: &Request<T>) -> Role {
    req.extensions()
        .get::<Role>()
        .cloned()
        .unwrap_or(Role::Open)
}

fn stream_node(role: &Role, hello_node: &str) -> Result<String, Status> {
    if hello_node.len() > NODE_ID_MAX || hello_node.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "node_id: at most {NODE_ID_MAX} bytes, without control characters"
        )));
    }
    match role {
        Role::Proxy { node: Some(pinned) } if hello_node.is_empty() => Ok(pinned.clone()),
        Role::Proxy { node: Some(pinned) } if pinned != hello_node => Err(
            Status::permission_denied("this proxy token is pinned to another node id"),
        ),
        _ if hello_node.is_empty() => Ok(format!("proxy-{}", uuid::Uuid::now_v7())),
        _ => Ok(hello_node.to_string()),
    }
}

/// The admin service. Services hold the hub weakly: the running control
/// plane owns it, so stopping it closes the store even while clients are
/// still connected (their calls then fail as unavailable).
pub struct AdminService {
    /// Shared state.
    pub hub: Weak<Hub>,
    /// The proxies' shared store, to read tenants' spend (`--shared-store`).
    pub shared_store: Option<router_shared_state::SharedStoreClient>,
}

impl AdminService {
    /// The proxies' shared store, where parked tasks live.
    fn task_store(&self) -> Result<&router_shared_state::SharedStoreClient, Status> {
        self.shared_store.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "parked tasks live in the proxies' shared store: start the control plane with --shared-store (ROUTER_SHARED_STORE) pointing at it",
            )
        })
    }
}

fn upgrade(hub: &Weak<Hub>) -> Result<Arc<Hub>, Status> {
    hub.upgrade()
        .ok_or_else(|| Status::unavailable("the control plane is shutting down"))
}

fn policy_version(p: crate::store::PolicyRecord) -> pb::PolicyVersion {
    pb::PolicyVersion {
        version: p.version,
        document: p.document,
        applied_at_unix_ms: p.applied_at_unix_ms,
        author: p.author,
        note: p.note,
        operator: p.operator,
        message: p.message,
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn apply_policy(
        &self,
        req: Request<pb::ApplyPolicyRequest>,
    ) -> Result<Response<pb::ApplyPolicyResponse>, Status> {
        let role = caller(&req);
        let operator = role.token_name().unwrap_or(role.as_str()).to_string();
        let r = req.into_inner();
        let who = crate::hub::Applier {
            author: &r.author,
            operator: &operator,
            message: &r.note,
        };
        match upgrade(&self.hub)?
            .apply_policy_by(&r.document, r.dry_run, r.expected_version, &who)
            .await
        {
            Ok(a) => Ok(Response::new(pb::ApplyPolicyResponse {
                version: a.version,
                applied: !r.dry_run && a.changed,
                unchanged: !a.changed,
                errors: Vec::new(),
                revision: a.revision,
            })),
            Err(HubError::Invalid(errors)) => Ok(Response::new(pb::ApplyPolicyResponse {
                version: 0,
                applied: false,
                unchanged: false,
                errors: field_errors(errors),
                revision: 0,
            })),
            Err(e) => Err(status(e)),
        }
    }

    async fn get_policy(
        &self,
        req: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::PolicyVersion>, Status> {
        let v = req.into_inner().version;
        upgrade(&self.hub)?
            .policy(v)
            .map(|p| Response::new(policy_version(p)))
            .ok_or_else(|| {
                Status::not_found(if v == 0 {
                    "no policy applied yet".to_string()
                } else {
                    format!("no policy version {v}")
                })
            })
    }

    async fn history(
        &self,
        _req: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        Ok(Response::new(pb::HistoryResponse {
            versions: upgrade(&self.hub)?
                .history()
                .into_iter()
                .map(policy_version)
                .collect(),
        }))
    }

    async fn rollback(
        &self,
        req: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::ApplyPolicyResponse>, Status> {
        let role = caller(&req);
        let operator = role.token_name().unwrap_or(role.as_str()).to_string();
        let r = req.into_inner();
        let who = crate::hub::Applier {
            author: &r.author,
            operator: &operator,
            message: &r.note,
        };
        let (version, revision) = upgrade(&self.hub)?
            .rollback_by(r.to_version, r.expected_version, &who)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ApplyPolicyResponse {
            version,
            applied: true,
            unchanged: false,
            errors: Vec::new(),
            revision,
        }))
    }

    async fn validate(
        &self,
        req: Request<pb::ValidateRequest>,
    ) -> Result<Response<pb::ValidateResponse>, Status> {
        let errors = upgrade(&self.hub)?
            .validate(&req.into_inner().document)
            .err()
            .unwrap_or_default();
        Ok(Response::new(pb::ValidateResponse {
            errors: field_errors(errors),
        }))
    }

    async fn list_backends(
        &self,
        req: Request<pb::ListBackendsRequest>,
    ) -> Result<Response<pb::ListBackendsResponse>, Status> {
        let hub = upgrade(&self.hub)?;
        let pools = hub
            .state()
            .backends
            .into_iter()
            .map(|(pool, b)| pb::PoolBackends {
                pool,
                endpoints: b.endpoints,
                drained: b.drained,
            })
            .collect();
        let mut answer = pb::ListBackendsResponse {
            pools,
            ..Default::default()
        };
        if req.into_inner().quota {
            // Every replica's proxies (the others' through the store).
            let loads = hub.fleet_load(QUOTA_WAIT).await.proxies;
            answer.proxies_asked = u32::try_from(loads.len()).unwrap_or(u32::MAX);
            answer.proxies_answered =
                u32::try_from(loads.iter().filter(|l| l.load.is_some()).count())
                    .unwrap_or(u32::MAX);
            answer.quota = crate::hub::endpoint_quotas(&loads);
        }
        Ok(Response::new(answer))
    }

    async fn set_backends(
        &self,
        req: Request<pb::SetBackendsRequest>,
    ) -> Result<Response<pb::ChangeResponse>, Status> {
        let r = req.into_inner();
        let revision = upgrade(&self.hub)?
            .set_backends(&r.pool, r.endpoints, r.drained)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ChangeResponse { revision }))
    }

    async fn list_circuits(
        &self,
        _req: Request<pb::ListCircuitsRequest>,
    ) -> Result<Response<pb::ListCircuitsResponse>, Status> {
        let now = crate::hub::now_ms();
        Ok(Response::new(pb::ListCircuitsResponse {
            circuits: upgrade(&self.hub)?
                .state()
                .circuits
                .into_iter()
                .filter(|c| c.until_unix_ms > now)
                .map(|c| pb::CircuitOverride {
                    pool: c.pool,
                    endpoint: c.endpoint,
                    open: c.open,
                    until_unix_ms: c.until_unix_ms,
                    source: c.source,
                    suspect: c.suspect,
                })
                .collect(),
        }))
    }

    async fn set_circuit(
        &self,
        req: Request<pb::SetCircuitRequest>,
    ) -> Result<Response<pb::ChangeResponse>, Status> {
        let r = req.into_inner();
        let revision = upgrade(&self.hub)?
            .set_circuit(&r.pool, &r.endpoint, r.open, r.for_seconds, "operator")
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ChangeResponse { revision }))
    }

    async fn list_proxies(
        &self,
        _req: Request<pb::ListProxiesRequest>,
    ) -> Result<Response<pb::ListProxiesResponse>, Status> {
        Ok(Response::new(pb::ListProxiesResponse {
            proxies: upgrade(&self.hub)?
                .fleet_proxies()
                .await
                .into_iter()
                .map(|(node_id, p)| pb::ProxyStatus {
                    node_id,
                    applied_revision: p.applied_revision,
                    last_nack: p.last_nack,
                    last_seen_unix_ms: p.last_seen_unix_ms,
                    connected: p.connected,
                    nacked_revision: p.nacked_revision,
                    control_plane: p.control_plane,
                    circuit_reports_dropped: p.circuit_reports_dropped,
                })
                .collect(),
        }))
    }

    async fn tenant_usage(
        &self,
        req: Request<pb::TenantUsageRequest>,
    ) -> Result<Response<pb::TenantUsageResponse>, Status> {
        let tenant = req.into_inner().tenant;
        let Some(client) = &self.shared_store else {
            return Err(Status::failed_precondition(
                "tenants' spend lives in the proxies' shared store: start the control plane with --shared-store (ROUTER_SHARED_STORE) pointing at it",
            ));
        };
        // A tenant the policy does not name has no spend to show: not
        // zeros (a typo would read as an idle tenant).
        upgrade(&self.hub)?
            .check_tenant(&tenant)
            .map_err(|e| Status::not_found(e.to_string()))?;
        // Budgets are per UTC day and month; the store's epoch marker
        // (`router_policy::store_epoch`) is read with the counters.
        let now = u64::try_from(crate::hub::now_ms() / 1000).unwrap_or(0);
        let usage = client
            .tenant_usage(&tenant, now)
            .await
            .map_err(crate::shared_store::status)?;
        let epoch = usage.epoch;
        let ms = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        Ok(Response::new(pb::TenantUsageResponse {
            day: usage.day,
            month: usage.month,
            spent_today_micros: usage.spend.spent_today(),
            spent_month_micros: usage.spend.spent_month(),
            reserved_micros: usage.spend.reserved,
            store_since_unix_ms: epoch.as_ref().map_or(0, |e| ms(e.since_unix_ms)),
            store_reset_seen: epoch.as_ref().is_some_and(|e| e.replaces.is_some()),
            store_lost_since_unix_ms: epoch
                .as_ref()
                .and_then(|e| e.replaces.as_ref())
                .map_or(0, |l| ms(l.since_unix_ms)),
        }))
    }

    async fn list_tasks(
        &self,
        req: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let r = req.into_inner();
        let tasks = crate::tasks::list(self.task_store()?, &r.state, &r.route).await?;
        Ok(Response::new(pb::ListTasksResponse { tasks }))
    }

    async fn get_task(
        &self,
        req: Request<pb::TaskRequest>,
    ) -> Result<Response<pb::TaskView>, Status> {
        let id = req.into_inner().id;
        Ok(Response::new(
            crate::tasks::get(self.task_store()?, &id).await?,
        ))
    }

    async fn create_key(
        &self,
        req: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::TenantKey>, Status> {
        let role = caller(&req);
        let by = role.token_name().unwrap_or(role.as_str()).to_string();
        let r = req.into_inner();
        upgrade(&self.hub)?
            .create_key(&r, &by)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn list_keys(
        &self,
        req: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        let tenant = req.into_inner().tenant;
        Ok(Response::new(pb::ListKeysResponse {
            keys: upgrade(&self.hub)?.list_keys(&tenant),
        }))
    }

    async fn purge_cache(
        &self,
        req: Request<pb::PurgeCacheRequest>,
    ) -> Result<Response<pb::PurgeCacheResponse>, Status> {
        let r = req.into_inner();
        let (revision, prefix) = upgrade(&self.hub)?
            .purge_cache(&r.route, &r.tenant)
            .await
            .map_err(status)?;
        // The proxies drop their own entries when they apply the mark; the
        // shared store's are dropped here, once for the fleet.
        let (shared_entries, shared_error) = match &self.shared_store {
            None => (None, String::new()),
            Some(client) => match client.purge_cache(&prefix).await {
                Ok(n) => (Some(n), String::new()),
                Err(e) => (None, crate::shared_store::message(&e)),
            },
        };
        Ok(Response::new(pb::PurgeCacheResponse {
            revision,
            prefix,
            shared_entries,
            shared_error,
        }))
    }

    async fn rollout(
        &self,
        req: Request<pb::RolloutRequest>,
    ) -> Result<Response<pb::RolloutResponse>, Status> {
        let r = req.into_inner();
        let action = crate::hub::RolloutAction::parse(&r.action).ok_or_else(|| {
            Status::invalid_argument(format!(
                "action: {:?} is not one of status, pause, resume, abort",
                r.action
            ))
        })?;
        upgrade(&self.hub)?
            .rollout(&r.route, action)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn revoke_key(
        &self,
        req: Request<pb::RevokeKeyRequest>,
    ) -> Result<Response<pb::TenantKey>, Status> {
        let id = req.into_inner().id;
        upgrade(&self.hub)?
            .revoke_key(&id)
            .await
            .map(Response::new)
            .map_err(status)
    }

    async fn approve_task(
        &self,
        req: Request<pb::TaskRequest>,
    ) -> Result<Response<pb::TaskView>, Status> {
        let role = caller(&req);
        let r = req.into_inner();
        let event = router_policy::park::Event::Approve;
        let who = crate::tasks::Actor::new(&role, &r.operator);
        Ok(Response::new(
            crate::tasks::change(self.task_store()?, &r.id, event, &who).await?,
        ))
    }

    async fn drop_task(
        &self,
        req: Request<pb::TaskRequest>,
    ) -> Result<Response<pb::TaskView>, Status> {
        let role = caller(&req);
        let r = req.into_inner();
        let event = router_policy::park::Event::Drop;
        let who = crate::tasks::Actor::new(&role, &r.operator);
        Ok(Response::new(
            crate::tasks::change(self.task_store()?, &r.id, event, &who).await?,
        ))
    }

    async fn explain(
        &self,
        req: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::ExplainResponse>, Status> {
        let explanation_json = upgrade(&self.hub)?
            .explain(&req.into_inner().situation_json)
            .map_err(status)?;
        Ok(Response::new(pb::ExplainResponse { explanation_json }))
    }
}

/// The proxies' config stream.
pub struct ProxyConfigService {
    /// Shared state.
    pub hub: Weak<Hub>,
}

type ControlStream = Pin<Box<dyn Stream<Item = Result<pb::ControlMessage, Status>> + Send>>;

#[tonic::async_trait]
impl ProxyConfig for ProxyConfigService {
    type StreamStream = ControlStream;

    async fn stream(
        &self,
        req: Request<Streaming<pb::ProxyMessage>>,
    ) -> Result<Response<ControlStream>, Status> {
        // Set by the interceptor; absent only if the service is mounted
        // without it, which then grants nothing beyond a proxy's rights.
        let role = req
            .extensions()
            .get::<Role>()
            .cloned()
            .unwrap_or(Role::Proxy { node: None });
        let mut inbound = req.into_inner();
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, inbound.next()).await {
            Ok(Some(Ok(pb::ProxyMessage {
                msg: Some(pb::proxy_message::Msg::Hello(h)),
            }))) => h,
            Ok(_) => {
                return Err(Status::invalid_argument(
                    "the first message must be a hello",
                ))
            }
            Err(_) => return Err(Status::deadline_exceeded("no hello")),
        };
        let node = match stream_node(&role, &hello.node_id) {
            Ok(node) => node,
            Err(e) => {
                let shown: String = hello.node_id.chars().take(64).collect();
                tracing::warn!(node = %shown.escape_debug(), error = %e.message(), "proxy stream refused");
                return Err(e);
            }
        };
        tracing::info!(node = %node, last_applied = hello.last_applied_revision, "proxy connected");
        if let Err(e) = upgrade(&self.hub)?.proxy_connected(&node, hello.last_applied_revision) {
            tracing::warn!(node = %node, error = %e, "proxy stream refused");
            return Err(status(e));
        }
        // Outbound: the current snapshot now, then each change. Bounded:
        // a slow proxy only ever needs the latest snapshot, which `watch`
        // keeps for it.
        let (tx, rx) = mpsc::channel::<Result<pb::ControlMessage, Status>>(4);
        let mut updates = upgrade(&self.hub)?.subscribe();
        // The stream's tasks hold the hub weakly: a stopped control plane
        // lets go of its store even while proxies are still connected.
        let hub = self.hub.clone();
        let out_node = node.clone();
        // The console's requests for this proxy's route records and load
        // go out on the same stream, between snapshots
        // (`Hub::fetch_decisions`, `Hub::fetch_load`).
        let (query_stream, mut queries) = upgrade(&self.hub)?.decision_stream_opened(&node);
        tokio::spawn(async move {
            let mut snapshot_due = true;
            loop {
                if snapshot_due {
                    let published = updates.borrow_and_update().clone();
                    let msg = pb::ControlMessage {
                        revision: published.revision,
                        nonce: uuid::Uuid::now_v7().to_string(),
                        snapshot: Some(published.snapshot.clone()),
                        store_id: published.store_id.clone(),
                        decisions: None,
                        load: None,
                    };
                    let push = tracing::info_span!("config.push", router.node = %out_node, router.revision = published.revision);
                    if tx.send(Ok(msg)).instrument(push).await.is_err() {
                        break;
                    }
                }
                tokio::select! {
                    changed = updates.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        snapshot_due = true;
                    }
                    Some(q) = queries.recv() => {
                        snapshot_due = false;
                        if tx.send(Ok(q.into_message())).await.is_err() {
                            break;
                        }
                    }
                }
            }
            tracing::debug!(node = %out_node, "stream writer ended");
        });
        // Inbound: ACKs, NACKs, circuit and load reports.
        tokio::spawn(async move {
            while let Some(Ok(m)) = inbound.next().await {
                let Some(hub) = hub.upgrade() else { break };
                match m.msg {
                    Some(pb::proxy_message::Msg::Ack(a)) => {
                        hub.proxy_seen(&node, |p| p.applied_revision = a.revision)
                    }
                    // A NACK without a nonce answers a console query (no
                    // snapshot: a proxy from before the query NACKs it),
                    // not a snapshot: it must not hide a real NACK.
                    Some(pb::proxy_message::Msg::Nack(n)) if n.nonce.is_empty() => {
                        hub.proxy_seen(&node, |_| {});
                    }
                    Some(pb::proxy_message::Msg::Nack(n)) => {
                        tracing::warn!(node = %node, revision = n.revision, error = %n.error, "proxy NACKed a snapshot");
                        hub.proxy_seen(&node, |p| {
                            p.nacked_revision = n.revision;
                            p.last_nack = n.error.clone();
                        });
                    }
                    Some(pb::proxy_message::Msg::Circuit(c)) => {
                        hub.proxy_seen(&node, |_| {});
                        if !hub.allow_circuit_report(&node) {
                            continue;
                        }
                        if let Err(e) = hub.report_circuit(&node, &c).await {
                            tracing::warn!(node = %node, error = %e, "circuit report not stored");
                        }
                    }
                    Some(pb::proxy_message::Msg::KeysUsed(k)) => {
                        hub.proxy_seen(&node, |_| {});
                        hub.keys_used(&k);
                    }
                    Some(pb::proxy_message::Msg::Decisions(d)) => {
                        hub.proxy_seen(&node, |_| {});
                        hub.decisions_received(&node, d);
                    }
                    Some(pb::proxy_message::Msg::LoadAnswer(l)) => {
                        hub.proxy_seen(&node, |_| {});
                        hub.load_received(&node, l);
                    }
                    Some(pb::proxy_message::Msg::Load(l)) => {
                        hub.proxy_seen(&node, |_| {});
                        hub.ramp_reported(&l.outcomes);
                    }
                    Some(pb::proxy_message::Msg::Hello(_)) | None => {
                        hub.proxy_seen(&node, |_| {});
                    }
                }
            }
            if let Some(hub) = hub.upgrade() {
                hub.decision_stream_closed(query_stream);
                hub.proxy_disconnected(&node);
            }
            tracing::info!(node = %node, "proxy disconnected");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

//! A small etcd v3 client: just what the control plane's etcd store and
//! its tests use, over tonic.
//!
//! **Why its own.** The `etcd-client` crate compiles etcd's `.proto` files
//! with `protoc` in its build script, so building the workspace needed a
//! program from outside crates.io. This crate holds its own subset of etcd's
//! public v3 API in `proto/` (packages `etcdserverpb`, `mvccpb`, `authpb`,
//! with etcd's message, field and service names and field numbers; etcd's
//! gogoproto and HTTP annotations left out) and compiles it with protox, the
//! pure-Rust compiler `router-proto` already uses.
//!
//! **What it speaks.** The generated messages are the API ([`pb`]), with a
//! few constructors for the common shapes; [`Client`] sends them:
//! key-value reads, writes and transactions, compaction, watches
//! ([`Watch`]), leases (grant, [`LeaseKeeper`], revoke), and the
//! authentication calls the tests make (enable, users, roles, permissions).
//!
//! **Endpoints.** Several members, `http://` or `https://`, are balanced by
//! tonic's own [`Channel::balance_list`]; connections are made lazily, so
//! an unreachable etcd fails the first call, not [`Client::connect`]. TLS is
//! tonic's rustls: the members' certificates must chain to the given CA,
//! and a client certificate may be presented (etcd's `--client-cert-auth`).
//!
//! **Signing in.** With a user and password, [`Client::connect`] trades
//! them for a token ([`Auth.Authenticate`]) and every call carries it as
//! the `token` metadata. etcd forgets idle tokens (`--auth-token-ttl`,
//! 300 s by default); when a call is refused because the token is invalid
//! (`Unauthenticated`), the client signs in again (once for concurrent
//! calls that hit the same stale token) and sends the call once more. A
//! watch refused for the same reason is answered in its stream (etcd 3.4
//! calls it "permission denied" there, 3.5 and later "invalid auth
//! token"): with a user, a watch whose creation is refused so is also
//! re-created once after signing in again.
//!
//! **Bounds.** Every call's answer is limited by tonic's decoding limit
//! (4 MiB); a lease keeper has one renewal in flight at a time; a watch
//! stream carries its one creation request. Calls carry no deadline of
//! their own: the caller bounds each (the store wraps every call in its
//! call timeout), and HTTP/2 keep-alives ([`Options::keep_alive`]) break
//! streams to a silently dead member.
//!
//! [`Auth.Authenticate`]: pb::etcdserverpb::auth_client::AuthClient::authenticate

#![forbid(unsafe_code)]

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status, Streaming};

use pb::etcdserverpb::{
    auth_client::AuthClient, kv_client::KvClient, lease_client::LeaseClient,
    watch_client::WatchClient, watch_request, AuthEnableRequest, AuthRoleAddRequest,
    AuthRoleGrantPermissionRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
    AuthenticateRequest, CompactionRequest, CompactionResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    PutRequest, PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
    WatchCreateRequest, WatchRequest, WatchResponse,
};

/// The generated etcd v3 API subset (see `proto/`), with constructors for
/// the shapes the router uses.
pub mod pb {
    /// Keys, values and watch events (etcd's `mvccpb`).
    #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// Users and permissions (etcd's `authpb`).
    #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
    pub mod authpb {
        tonic::include_proto!("authpb");
    }
    /// The services and their messages (etcd's `etcdserverpb`).
    #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }

    use authpb::{permission, Permission};
    use etcdserverpb::{
        compare, request_op, response_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest,
        RangeResponse, RequestOp, ResponseOp,
    };
    use mvccpb::KeyValue;

    /// The end of the range of every key starting with `prefix`: the
    /// prefix with its last byte below 0xff raised by one (what follows
    /// dropped); `"\0"` (every key from `prefix` on) when there is none.
    pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
        let mut end = prefix.to_vec();
        while let Some(last) = end.pop() {
            if last < 0xff {
                end.push(last + 1);
                return end;
            }
        }
        vec![0]
    }

    impl RangeRequest {
        /// Reads one key.
        pub fn key(key: impl Into<Vec<u8>>) -> Self {
            Self {
                key: key.into(),
                ..Self::default()
            }
        }

        /// Reads every key starting with `prefix`.
        pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
            let key = prefix.into();
            Self {
                range_end: prefix_end(&key),
                key,
                ..Self::default()
            }
        }
    }

    impl Compare {
        /// `mod_revision(key) <result> revision` (0 for a missing key).
        pub fn mod_revision(
            key: impl Into<Vec<u8>>,
            result: compare::CompareResult,
            revision: i64,
        ) -> Self {
            Self {
                result: result.into(),
                target: compare::CompareTarget::Mod.into(),
                key: key.into(),
                target_union: Some(compare::TargetUnion::ModRevision(revision)),
                range_end: Vec::new(),
            }
        }

        /// `create_revision(key) <result> revision` (0 for a missing key).
        pub fn create_revision(
            key: impl Into<Vec<u8>>,
            result: compare::CompareResult,
            revision: i64,
        ) -> Self {
            Self {
                result: result.into(),
                target: compare::CompareTarget::Create.into(),
                key: key.into(),
                target_union: Some(compare::TargetUnion::CreateRevision(revision)),
                range_end: Vec::new(),
            }
        }
    }

    impl RequestOp {
        /// Writes `key`, attached to `lease` (0: none).
        pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Self {
            Self {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key.into(),
                    value: value.into(),
                    lease,
                    ..PutRequest::default()
                })),
            }
        }

        /// Reads `key`.
        pub fn get(key: impl Into<Vec<u8>>) -> Self {
            Self {
                request: Some(request_op::Request::RequestRange(RangeRequest::key(key))),
            }
        }

        /// Deletes `key`.
        pub fn delete(key: impl Into<Vec<u8>>) -> Self {
            Self {
                request: Some(request_op::Request::RequestDeleteRange(
                    DeleteRangeRequest {
                        key: key.into(),
                        ..DeleteRangeRequest::default()
                    },
                )),
            }
        }
    }

    impl ResponseOp {
        /// The answer of a read in a transaction.
        pub fn as_range(&self) -> Option<&RangeResponse> {
            match &self.response {
                Some(response_op::Response::ResponseRange(r)) => Some(r),
                _ => None,
            }
        }
    }

    impl KeyValue {
        /// The key as text, if it is UTF-8.
        pub fn key_str(&self) -> Option<&str> {
            std::str::from_utf8(&self.key).ok()
        }

        /// The value as text, if it is UTF-8.
        pub fn value_str(&self) -> Option<&str> {
            std::str::from_utf8(&self.value).ok()
        }
    }

    impl Permission {
        /// Reading and writing every key starting with `prefix`.
        pub fn read_write_prefix(prefix: impl Into<Vec<u8>>) -> Self {
            let key = prefix.into();
            Self {
                perm_type: permission::Type::Readwrite.into(),
                range_end: prefix_end(&key),
                key,
            }
        }
    }
}

/// What a call to etcd could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An endpoint that is not `http://host:port` or `https://host:port`,
    /// or whose scheme does not match the TLS options.
    #[error("etcd endpoint {endpoint:?}: {why}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No endpoint given.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// The channel could not be set up (TLS material), with its causes.
    #[error("{}", chain(.0, .0.to_string()))]
    Transport(#[from] tonic::transport::Error),
    /// etcd answered with an error, or the connection failed: the code,
    /// etcd's message and the causes (a TLS failure names its reason).
    #[error("{}", chain(.0, format!("{:?}: {}", .0.code(), .0.message())))]
    Status(#[from] Status),
    /// etcd's token cannot be sent as metadata.
    #[error("etcd sent an auth token that is not ASCII metadata")]
    Token,
    /// etcd ended a stream without an answer.
    #[error("etcd closed the {0} stream")]
    Closed(&'static str),
}

impl Error {
    /// The gRPC status etcd answered with, if it answered.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Self::Status(s) => Some(s),
            _ => None,
        }
    }
}

/// `text`, followed by each cause of `error` it does not already contain.
fn chain(error: &dyn std::error::Error, mut text: String) -> String {
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// TLS to the members.
#[derive(Clone)]
pub struct Tls {
    /// CA certificates (PEM) the members' certificates must chain to.
    pub ca_pem: String,
    /// A client certificate chain and its private key (PEM).
    pub identity: Option<(String, String)>,
}

/// How to reach etcd. `Debug` never shows a key or the password.
#[derive(Clone, Default)]
pub struct Options {
    /// TLS, for `https://` endpoints (which need it).
    pub tls: Option<Tls>,
    /// A user name and password to sign in with.
    pub user: Option<(String, String)>,
    /// The longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Option<Duration>,
    /// HTTP/2 pings every `.0`, the connection dropped when one is not
    /// answered within `.1`; also while no call is open.
    pub keep_alive: Option<(Duration, Duration)>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("tls", &self.tls.is_some())
            .field(
                "client_cert",
                &self.tls.as_ref().is_some_and(|t| t.identity.is_some()),
            )
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("connect_timeout", &self.connect_timeout)
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}

/// The token every call carries, shared by the client's clones.
type Token = Arc<Mutex<Option<MetadataValue<Ascii>>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Puts the current token, if any, on each call as the `token` metadata.
#[derive(Clone)]
struct TokenInterceptor(Token);

impl tonic::service::Interceptor for TokenInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(token) = lock(&self.0).clone() {
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }
}

type Authed = InterceptedService<Channel, TokenInterceptor>;

/// Signing in: the user, the token, and one refresh at a time.
struct Auth {
    user: Option<(String, String)>,
    token: Token,
    refresh: tokio::sync::Mutex<()>,
}

impl Auth {
    fn current(&self) -> Option<MetadataValue<Ascii>> {
        lock(&self.token).clone()
    }
}

/// etcd's message for a token it does not know (expired, or from before a
/// restart of a member with `--auth-token simple`).
const INVALID_TOKEN: &str = "invalid auth token";

/// Whether etcd refused a call for its token.
fn is_invalid_token(status: &Status) -> bool {
    match status.code() {
        Code::Unauthenticated => true,
        Code::Unknown => status.message().contains(INVALID_TOKEN),
        _ => false,
    }
}

/// Whether etcd refused to create a watch in a way an expired token
/// explains: "invalid auth token" (etcd 3.5 and later), or "permission
/// denied", which etcd 3.4 answers for an invalid token too.
fn watch_refused_for_token(first: &WatchResponse) -> bool {
    first.canceled
        && (first.cancel_reason.contains(INVALID_TOKEN)
            || first.cancel_reason.contains("permission denied"))
}

/// A connection to an etcd cluster; clones share it (and its token).
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    auth: Arc<Auth>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("user", &self.auth.user.as_ref().map(|(name, _)| name))
            .finish_non_exhaustive()
    }
}

/// One endpoint, with the options' TLS and timeouts.
fn endpoint(url: &str, options: &Options) -> Result<Endpoint, Error> {
    let bad = |why| Error::Endpoint {
        endpoint: url.to_string(),
        why,
    };
    let https = if url.starts_with("https://") {
        true
    } else if url.starts_with("http://") {
        false
    } else {
        return Err(bad("expected http://host:port or https://host:port"));
    };
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|_| bad("not a URL"))?
        // etcd answers from its own thread pool; calls over one
        // connection need not wait for each other.
        .tcp_nodelay(true);
    match (https, &options.tls) {
        (true, Some(tls)) => {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(config)?;
        }
        (true, None) => return Err(bad("https:// needs the TLS options (a CA)")),
        (false, Some(_)) => return Err(bad("TLS options are for https:// endpoints")),
        (false, None) => {}
    }
    if let Some(timeout) = options.connect_timeout {
        endpoint = endpoint.connect_timeout(timeout);
    }
    if let Some((interval, timeout)) = options.keep_alive {
        endpoint = endpoint
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(timeout)
            .keep_alive_while_idle(true);
    }
    Ok(endpoint)
}

impl Client {
    /// A client of the members at `endpoints` (`http://host:port`, or
    /// `https://host:port` with [`Options::tls`]). Without a user nothing
    /// is sent yet; with one, this signs in.
    pub async fn connect(endpoints: &[String], options: Options) -> Result<Self, Error> {
        if endpoints.is_empty() {
            return Err(Error::NoEndpoint);
        }
        let endpoints = endpoints
            .iter()
            .map(|url| endpoint(url, &options))
            .collect::<Result<Vec<_>, _>>()?;
        let client = Self {
            channel: Channel::balance_list(endpoints.into_iter()),
            auth: Arc::new(Auth {
                user: options.user,
                token: Arc::default(),
                refresh: tokio::sync::Mutex::new(()),
            }),
        };
        client.sign_in().await?;
        Ok(client)
    }

    /// Trades the user and password for a new token (nothing without a user).
    async fn sign_in(&self) -> Result<(), Error> {
        let Some((name, password)) = &self.auth.user else {
            return Ok(());
        };
        let answer = AuthClient::new(self.channel.clone())
            .authenticate(AuthenticateRequest {
                name: name.clone(),
                password: password.clone(),
            })
            .await?
            .into_inner();
        let token = answer
            .token
            .parse::<MetadataValue<Ascii>>()
            .map_err(|_| Error::Token)?;
        *lock(&self.auth.token) = Some(token);
        Ok(())
    }

    /// Signs in again, unless another call already did since `stale` was
    /// the token.
    async fn refresh(&self, stale: Option<MetadataValue<Ascii>>) -> Result<(), Error> {
        let _one_at_a_time = self.auth.refresh.lock().await;
        if self.auth.current() != stale {
            return Ok(());
        }
        self.sign_in().await
    }

    fn authed(&self) -> Authed {
        InterceptedService::new(
            self.channel.clone(),
            TokenInterceptor(self.auth.token.clone()),
        )
    }

    /// Sends `request` with `send`; when etcd calls the token invalid (and
    /// there is a user), signs in again and sends it once more.
    async fn unary<Req, Resp, Fut>(
        &self,
        request: Req,
        send: impl Fn(Authed, Req) -> Fut,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let stale = self.auth.current();
        match send(self.authed(), request.clone()).await {
            Err(status) if self.auth.user.is_some() && is_invalid_token(&status) => {
                self.refresh(stale).await?;
                Ok(send(self.authed(), request).await?.into_inner())
            }
            answer => Ok(answer?.into_inner()),
        }
    }

    /// Reads a key or a range (`KV.Range`).
    pub async fn range(&self, request: RangeRequest) -> Result<RangeResponse, Error> {
        self.unary(request, |svc, r| async move {
            KvClient::new(svc).range(r).await
        })
        .await
    }

    /// Writes a key (`KV.Put`).
    pub async fn put(&self, request: PutRequest) -> Result<PutResponse, Error> {
        self.unary(
            request,
            |svc, r| async move { KvClient::new(svc).put(r).await },
        )
        .await
    }

    /// A transaction (`KV.Txn`).
    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, Error> {
        self.unary(
            request,
            |svc, r| async move { KvClient::new(svc).txn(r).await },
        )
        .await
    }

    /// Forgets the history before `revision` (`KV.Compact`); with
    /// `physical`, answers once that is done on disk.
    pub async fn compact(
        &self,
        revision: i64,
        physical: bool,
    ) -> Result<CompactionResponse, Error> {
        let request = CompactionRequest { revision, physical };
        self.unary(request, |svc, r| async move {
            KvClient::new(svc).compact(r).await
        })
        .await
    }

    /// Grants a lease of `ttl` seconds (`Lease.LeaseGrant`).
    pub async fn lease_grant(&self, ttl: i64) -> Result<LeaseGrantResponse, Error> {
        let request = LeaseGrantRequest { ttl, id: 0 };
        self.unary(request, |svc, r| async move {
            LeaseClient::new(svc).lease_grant(r).await
        })
        .await
    }

    /// Revokes a lease: the keys attached to it are deleted.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), Error> {
        let request = LeaseRevokeRequest { id };
        self.unary(request, |svc, r| async move {
            LeaseClient::new(svc).lease_revoke(r).await
        })
        .await?;
        Ok(())
    }

    /// Opens a renewal stream for lease `id` and renews it once; see
    /// [`LeaseKeeper::keep_alive`].
    pub async fn lease_keep_alive(&self, id: i64) -> Result<(LeaseKeeper, i64), Error> {
        let open = |svc: Authed, id: i64| async move {
            // One renewal in flight at a time: the first goes out with the
            // call (etcd answers its headers with the first answer).
            let (requests, receiver) = mpsc::channel(1);
            requests
                .try_send(LeaseKeepAliveRequest { id })
                .map_err(|_| Status::internal("lease keep-alive queue"))?;
            let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
            let answers = LeaseClient::new(svc).lease_keep_alive(stream).await?;
            Ok::<_, Status>(answers.map(|answers| (requests, answers)))
        };
        let (requests, mut answers) = self.unary(id, open).await?;
        let ttl = next_ttl(&mut answers).await?;
        Ok((
            LeaseKeeper {
                id,
                requests,
                answers,
            },
            ttl,
        ))
    }

    /// Watches what `create` names (`Watch.Watch`, one watch on its own
    /// stream), and waits for etcd's answer to the creation, which is the
    /// [`Watch`]'s first message.
    pub async fn watch(&self, create: WatchCreateRequest) -> Result<Watch, Error> {
        let stale = self.auth.current();
        let watch = self.unary(create.clone(), open_watch).await?;
        if self.auth.user.is_some() && watch.first.as_ref().is_some_and(watch_refused_for_token) {
            self.refresh(stale).await?;
            return self.unary(create, open_watch).await;
        }
        Ok(watch)
    }

    /// Turns authentication on (`Auth.AuthEnable`; needs a `root` user).
    pub async fn auth_enable(&self) -> Result<(), Error> {
        self.unary(AuthEnableRequest {}, |svc, r| async move {
            AuthClient::new(svc).auth_enable(r).await
        })
        .await?;
        Ok(())
    }

    /// Adds a user with a password.
    pub async fn user_add(&self, name: &str, password: &str) -> Result<(), Error> {
        let request = AuthUserAddRequest {
            name: name.to_string(),
            password: password.to_string(),
            ..AuthUserAddRequest::default()
        };
        self.unary(request, |svc, r| async move {
            AuthClient::new(svc).user_add(r).await
        })
        .await?;
        Ok(())
    }

    /// Gives `user` the role `role`.
    pub async fn user_grant_role(&self, user: &str, role: &str) -> Result<(), Error> {
        let request = AuthUserGrantRoleRequest {
            user: user.to_string(),
            role: role.to_string(),
        };
        self.unary(request, |svc, r| async move {
            AuthClient::new(svc).user_grant_role(r).await
        })
        .await?;
        Ok(())
    }

    /// Adds a role.
    pub async fn role_add(&self, name: &str) -> Result<(), Error> {
        let request = AuthRoleAddRequest {
            name: name.to_string(),
        };
        self.unary(request, |svc, r| async move {
            AuthClient::new(svc).role_add(r).await
        })
        .await?;
        Ok(())
    }

    /// Gives `role` a permission.
    pub async fn role_grant_permission(
        &self,
        role: &str,
        perm: pb::authpb::Permission,
    ) -> Result<(), Error> {
        let request = AuthRoleGrantPermissionRequest {
            name: role.to_string(),
            perm: Some(perm),
        };
        self.unary(request, |svc, r| async move {
            AuthClient::new(svc).role_grant_permission(r).await
        })
        .await?;
        Ok(())
    }
}

/// Opens a watch stream carrying one creation request (the stream stays
/// open after it, as etcd ends the watches of a stream the client closes),
/// and reads etcd's answer to it.
async fn open_watch(
    svc: Authed,
    create: WatchCreateRequest,
) -> Result<tonic::Response<Watch>, Status> {
    let request = WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
    };
    let requests = tokio_stream::once(request).chain(tokio_stream::pending());
    let answers = WatchClient::new(svc).watch(requests).await?;
    let (metadata, mut answers, extensions) = answers.into_parts();
    let first = answers.message().await?;
    if first.is_none() {
        return Err(Status::unavailable("etcd closed the watch stream at once"));
    }
    Ok(tonic::Response::from_parts(
        metadata,
        Watch { first, answers },
        extensions,
    ))
}

/// The time to live in the next keep-alive answer.
async fn next_ttl(answers: &mut Streaming<LeaseKeepAliveResponse>) -> Result<i64, Error> {
    match answers.message().await? {
        Some(answer) => Ok(answer.ttl),
        None => Err(Error::Closed("lease keep-alive")),
    }
}

/// One watch: etcd's answer to its creation, then its events.
pub struct Watch {
    first: Option<WatchResponse>,
    answers: Streaming<WatchResponse>,
}

impl Watch {
    /// The next answer: first the creation's (`created`; or `canceled` with
    /// `cancel_reason`, or `compact_revision` set when the start revision
    /// was compacted away), then events. `None` when etcd ends the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        Ok(self.answers.message().await?)
    }
}

/// The renewal stream of one lease.
pub struct LeaseKeeper {
    id: i64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    answers: Streaming<LeaseKeepAliveResponse>,
}

impl LeaseKeeper {
    /// The lease.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Renews the lease; the seconds it has left to live, 0 (or less) when
    /// it is gone (expired or revoked).
    pub async fn keep_alive(&mut self) -> Result<i64, Error> {
        self.requests
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Error::Closed("lease keep-alive"))?;
        next_ttl(&mut self.answers).await
    }
}

#[cfg(test)]
mod tests {
    use super::pb::etcdserverpb::{compare, RangeRequest, RequestOp, ResponseOp};
    use super::pb::*;
    use super::*;
    use prost::Message;

    #[test]
    fn a_prefix_range_ends_after_the_last_key_with_that_prefix() {
        assert_eq!(prefix_end(b"/router/"), b"/router0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
        let r = RangeRequest::prefix("/p/");
        assert_eq!(
            (r.key.as_slice(), r.range_end.as_slice()),
            (&b"/p/"[..], &b"/p0"[..])
        );
        assert!(RangeRequest::key("k").range_end.is_empty());
    }

    /// The bytes of a message as etcd's own definitions encode it: each
    /// field's number and wire type, written out by hand from etcd's API
    /// (`rpc.proto`, `kv.proto`), so a wrong number here fails.
    #[test]
    fn messages_encode_with_etcds_field_numbers() {
        // Compare{result=EQUAL(1:varint 0 omitted), target=MOD (2: 2), key (3), mod_revision (6: 7)}
        let c = etcdserverpb::Compare::mod_revision("k", compare::CompareResult::Equal, 7);
        assert_eq!(c.encode_to_vec(), [0x10, 2, 0x1a, 1, b'k', 0x30, 7]);
        let c = etcdserverpb::Compare::create_revision("k", compare::CompareResult::Greater, 0);
        assert_eq!(
            c.encode_to_vec(),
            [0x08, 1, 0x10, 1, 0x1a, 1, b'k', 0x28, 0]
        );
        // RequestOp{request_put (2): PutRequest{key (1), value (2), lease (3)}}
        let op = RequestOp::put("k", "v", 5);
        assert_eq!(
            op.encode_to_vec(),
            [0x12, 8, 0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 5]
        );
        // RequestOp{request_delete_range (3): {key (1)}}
        assert_eq!(
            RequestOp::delete("k").encode_to_vec(),
            [0x1a, 3, 0x0a, 1, b'k']
        );
        // RangeRequest{count_only (9)}
        let r = RangeRequest {
            count_only: true,
            ..RangeRequest::key("k")
        };
        assert_eq!(r.encode_to_vec(), [0x0a, 1, b'k', 0x48, 1]);
        // WatchCreateRequest{key (1), range_end (2), start_revision (3)} in
        // WatchRequest{create_request (1)}.
        let w = etcdserverpb::WatchRequest {
            request_union: Some(etcdserverpb::watch_request::RequestUnion::CreateRequest(
                etcdserverpb::WatchCreateRequest {
                    key: b"a".to_vec(),
                    range_end: b"b".to_vec(),
                    start_revision: 9,
                    ..Default::default()
                },
            )),
        };
        assert_eq!(
            w.encode_to_vec(),
            [0x0a, 8, 0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 9]
        );
        // Permission{permType (1) READWRITE=2, key (2), range_end (3)}
        let p = authpb::Permission::read_write_prefix("a");
        assert_eq!(p.encode_to_vec(), [0x08, 2, 0x12, 1, b'a', 0x1a, 1, b'b']);
    }

    #[test]
    fn etcd_answers_decode_with_etcds_field_numbers() {
        // WatchResponse{header (1){revision (3): 12}, canceled (4), compact_revision (5): 3,
        // cancel_reason (6), events (11): [Event{type (1) DELETE, kv (2){key (1), mod_revision (3): 12, lease (6): 4}}]}
        let bytes = [
            0x0a, 2, 0x18, 12, 0x20, 1, 0x28, 3, 0x32, 1, b'x', 0x5a, 11, 0x08, 1, 0x12, 7, 0x0a,
            1, b'k', 0x18, 12, 0x30, 4,
        ];
        let w = etcdserverpb::WatchResponse::decode(&bytes[..]).unwrap();
        assert_eq!(w.header.unwrap().revision, 12);
        assert!(w.canceled && w.compact_revision == 3 && w.cancel_reason == "x");
        let event = &w.events[0];
        assert_eq!(event.r#type(), mvccpb::event::EventType::Delete);
        let kv = event.kv.as_ref().unwrap();
        assert_eq!(
            (kv.key_str(), kv.mod_revision, kv.lease),
            (Some("k"), 12, 4)
        );
        // TxnResponse{succeeded (2): false, responses (3): [ResponseOp{response_range (1){kvs (2): [{key, mod_revision (3): 5}]}}]}
        let bytes = [0x10, 0, 0x1a, 9, 0x0a, 7, 0x12, 5, 0x0a, 1, b'k', 0x18, 5];
        let t = etcdserverpb::TxnResponse::decode(&bytes[..]).unwrap();
        let range = t.responses[0].as_range().unwrap();
        assert_eq!(range.kvs[0].mod_revision, 5);
        assert!(ResponseOp::default().as_range().is_none());
        // LeaseKeepAliveResponse{ID (2): 7, TTL (3): 10}
        let k = etcdserverpb::LeaseKeepAliveResponse::decode(&[0x10, 7, 0x18, 10][..]).unwrap();
        assert_eq!((k.id, k.ttl), (7, 10));
    }

    #[test]
    fn only_a_refused_token_signs_in_again() {
        assert!(is_invalid_token(&Status::unauthenticated(
            "etcdserver: invalid auth token"
        )));
        assert!(is_invalid_token(&Status::unknown(
            "etcdserver: invalid auth token"
        )));
        for other in [
            Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            Status::permission_denied("etcdserver: permission denied"),
            Status::unknown("something else"),
            Status::unavailable("etcdserver: invalid auth token"),
        ] {
            assert!(!is_invalid_token(&other), "{other:?}");
        }
        let refused = |reason: &str| etcdserverpb::WatchResponse {
            canceled: true,
            created: true,
            cancel_reason: reason.to_string(),
            ..Default::default()
        };
        assert!(watch_refused_for_token(&refused(
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
        )));
        assert!(watch_refused_for_token(&refused(
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
        )));
        assert!(!watch_refused_for_token(&refused(
            "etcdserver: mvcc: required revision has been compacted"
        )));
        assert!(!watch_refused_for_token(&etcdserverpb::WatchResponse {
            created: true,
            ..Default::default()
        }));
    }

    #[tokio::test]
    async fn endpoints_must_be_http_or_https_with_the_tls_options_to_match() {
        let tls = Options {
            tls: Some(Tls {
                ca_pem: String::new(),
                identity: None,
            }),
            ..Options::default()
        };
        for (url, options, says) in [
            ("127.0.0.1:2379", Options::default(), "expected http://"),
            (
                "https://127.0.0.1:2379",
                Options::default(),
                "needs the TLS options",
            ),
            ("http://127.0.0.1:2379", tls, "for https://"),
        ] {
            let err = Client::connect(&[url.to_string()], options)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
        assert!(matches!(
            Client::connect(&[], Options::default()).await,
            Err(Error::NoEndpoint)
        ));
        // Without a user, nothing is sent until the first call.
        assert!(
            Client::connect(&["http://127.0.0.1:1".to_string()], Options::default())
                .await
                .is_ok()
        );
    }

    #[test]
    fn debug_never_shows_the_password_or_the_key() {
        let options = Options {
            tls: Some(Tls {
                ca_pem: "CA".into(),
                identity: Some(("CERT".into(), "PRIVATE-KEY".into())),
            }),
            user: Some(("router".into(), "s3cret".into())),
            ..Options::default()
        };
        let shown = format!("{options:?}");
        assert!(shown.contains("router"), "{shown}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("PRIVATE-KEY"),
            "{shown}"
        );
    }

    #[test]
    fn a_status_shows_its_code_message_and_causes() {
        let cause = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let status = Status::from_error(Box::new(cause));
        let text = Error::Status(status).to_string();
        assert!(text.contains("UnknownIssuer"), "{text}");
    }
}

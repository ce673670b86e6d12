//! Helpers for tests that run control planes and managed proxies in-process.

use std::net::SocketAddr;
use std::time::Duration;

use router_proto::v1 as pb;
use router_proto::v1::admin_client::AdminClient;
use router_proto::v1::proxy_config_client::ProxyConfigClient;
use router_proxy::managed::ManagedOptions;
use router_proxy::{Mode, Settings};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::harness::TestProxy;

/// The bearer token the tests' control planes require.
pub const TOKEN: &str = "cp-test-token";

/// Adds (or not) the bearer token to each call.
pub type AddToken =
    Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;
/// An admin client, as `routerctl` has one.
pub type Admin = AdminClient<InterceptedService<Channel, AddToken>>;

/// An admin client of the control plane at `addr`, presenting `token`.
pub async fn admin(addr: SocketAddr, token: Option<&'static str>) -> Admin {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap_or_else(|e| panic!("{addr}: {e}"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{addr}: {e}"));
    let f: AddToken = Box::new(move |mut req: tonic::Request<()>| {
        if let Some(t) = token {
            if let Ok(v) = format!("Bearer {t}").parse() {
                req.metadata_mut().insert("authorization", v);
            }
        }
        Ok(req)
    });
    AdminClient::with_interceptor(channel, f)
}

/// Managed mode on the control plane at `url` (`http://…` or
/// `https://…`) with `token`, as node `node`: no cache, no extra CA.
pub fn managed(url: impl Into<String>, token: Option<&str>, node: &str) -> Mode {
    Mode::Managed(managed_options(url, token, node))
}

/// [`managed`]'s options, for a test that sets a cache or a CA too.
pub fn managed_options(url: impl Into<String>, token: Option<&str>, node: &str) -> ManagedOptions {
    ManagedOptions {
        addrs: vec![url.into()],
        token: token.map(str::to_string),
        node_id: node.into(),
        cache_dir: None,
        ca_pem: None,
        heartbeat: router_proxy::managed::HEARTBEAT,
    }
}

/// A managed proxy that tries the control planes in `cps`, in order.
pub async fn managed_proxy(
    cps: &[SocketAddr],
    node: &str,
    cache: Option<std::path::PathBuf>,
) -> TestProxy {
    TestProxy::start(
        Settings::default(),
        Mode::Managed(ManagedOptions {
            addrs: cps.iter().map(|a| format!("http://{a}")).collect(),
            cache_dir: cache,
            ..managed_options("", Some(TOKEN), node)
        }),
    )
    .await
}

/// A two-pool policy: `primary`, then `fallback`.
pub fn policy(primary: &str, fallback: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  circuit_breaker: {{consecutive_errors: 2, open_duration_s: 30}}
  pools:
    - name: primary
      endpoints: ["{primary}"]
    - name: fallback
      endpoints: ["{fallback}"]
  routes:
    - name: default
      chain: [primary, fallback]
"#
    )
}

/// The config version a proxy serves.
pub async fn version_of(p: &TestProxy) -> String {
    p.health().await["config_version"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits (3 s at most) until a proxy serves config version `want`.
pub async fn wait_version(p: &TestProxy, want: &str) {
    for _ in 0..300 {
        if version_of(p).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("proxy stuck at {}, wanted {want}", version_of(p).await);
}

/// Waits (5 s at most) until a proxy serves revision `revision` of the
/// control plane's store or a later one (proxies' reports move the
/// revision on, and a proxy may skip revisions).
pub async fn wait_revision(p: &TestProxy, revision: u64) {
    let mut applied = None;
    for _ in 0..500 {
        applied = revision_of(p).await;
        if applied >= Some(revision) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("proxy stuck at revision {applied:?}, wanted {revision} or later");
}

/// The control plane's revision a managed proxy applied last, runtime
/// marks included (health's `revision`; `config_version` names only the
/// config: `cp-<revision of its last policy, backends or keys change>`).
pub async fn revision_of(p: &TestProxy) -> Option<u64> {
    p.health().await["revision"].as_u64().filter(|r| *r > 0)
}

/// A control plane with the operator token [`TOKEN`] and `proxy_tokens`
/// (`(token, pinned node)`), its store in `dir`, on 127.0.0.1.
pub async fn control_plane_with(
    dir: &std::path::Path,
    proxy_tokens: &[(&str, Option<&str>)],
    limits: router_control_plane::Limits,
) -> router_control_plane::RunningControlPlane {
    router_control_plane::start(router_control_plane::ControlPlaneOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        store: router_control_plane::StoreLocation::Embedded(dir.to_path_buf()),
        token: Some(TOKEN.into()),
        proxy_tokens: proxy_tokens
            .iter()
            .map(|(token, node)| router_control_plane::auth::ProxyToken {
                token: (*token).to_string(),
                node: node.map(str::to_string),
            })
            .collect(),
        limits,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane: {e}"))
}

/// A raw config stream, as a proxy opens it: what to send, and what comes.
pub struct RawStream {
    /// Messages to the control plane (the hello is already sent).
    pub tx: tokio::sync::mpsc::Sender<pb::ProxyMessage>,
    /// Messages from it.
    pub rx: tonic::Streaming<pb::ControlMessage>,
}

impl RawStream {
    /// Opens `ProxyConfig.Stream` on `addr` with `token`, saying hello as `node`.
    pub async fn open(
        addr: SocketAddr,
        token: Option<&str>,
        node: &str,
    ) -> Result<Self, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap_or_else(|e| panic!("{addr}: {e}"))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{addr}: {e}"));
        let mut client = ProxyConfigClient::with_interceptor(
            channel,
            router_proto::BearerToken::new(token, "a test token").unwrap_or_else(|e| panic!("{e}")),
        );
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tx.send(pb::ProxyMessage {
            msg: Some(pb::proxy_message::Msg::Hello(pb::Hello {
                node_id: node.into(),
                last_applied_revision: 0,
            })),
        })
        .await
        .unwrap_or_else(|_| panic!("stream closed before the hello"));
        let rx = client
            .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    /// The next message from the control plane (5 s at most).
    pub async fn next(&mut self) -> pb::ControlMessage {
        match tokio::time::timeout(Duration::from_secs(5), self.rx.message()).await {
            Ok(Ok(Some(m))) => m,
            other => panic!("no control message: {other:?}"),
        }
    }

    /// Sends one message.
    pub async fn send(&self, msg: pb::proxy_message::Msg) {
        self.tx
            .send(pb::ProxyMessage { msg: Some(msg) })
            .await
            .unwrap_or_else(|_| panic!("stream closed"));
    }
}

/// A control plane faked in-process: the test decides each message it
/// sends on a proxy's stream and reads each answer (one stream at a time).
pub struct FakeControlPlane {
    addr: SocketAddr,
    streams: tokio::sync::mpsc::Receiver<FakeStream>,
    task: tokio::task::JoinHandle<()>,
}

/// One proxy stream on a [`FakeControlPlane`].
pub struct FakeStream {
    /// The proxy's hello.
    pub hello: pb::Hello,
    /// Messages to the proxy.
    pub tx: tokio::sync::mpsc::Sender<Result<pb::ControlMessage, tonic::Status>>,
    /// The proxy's messages after the hello.
    pub rx: tonic::Streaming<pb::ProxyMessage>,
}

impl FakeStream {
    /// Sends `msg` and returns the proxy's answer to it (ACK or NACK;
    /// circuit and load reports are skipped), 5 s at most.
    pub async fn exchange(&mut self, msg: pb::ControlMessage) -> pb::proxy_message::Msg {
        self.tx
            .send(Ok(msg))
            .await
            .unwrap_or_else(|_| panic!("the proxy's stream is gone"));
        loop {
            let m = tokio::time::timeout(Duration::from_secs(5), self.rx.message()).await;
            match m {
                Ok(Ok(Some(pb::ProxyMessage {
                    msg:
                        Some(m @ (pb::proxy_message::Msg::Ack(_) | pb::proxy_message::Msg::Nack(_))),
                }))) => return m,
                Ok(Ok(Some(_))) => {}
                other => panic!("no answer from the proxy: {other:?}"),
            }
        }
    }
}

struct FakeService(tokio::sync::mpsc::Sender<FakeStream>);

type FakeOut = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<pb::ControlMessage, tonic::Status>> + Send>,
>;

#[tonic::async_trait]
impl router_proto::v1::proxy_config_server::ProxyConfig for FakeService {
    type StreamStream = FakeOut;

    async fn stream(
        &self,
        req: tonic::Request<tonic::Streaming<pb::ProxyMessage>>,
    ) -> Result<tonic::Response<FakeOut>, tonic::Status> {
        let mut rx = req.into_inner();
        let hello = match rx.message().await? {
            Some(pb::ProxyMessage {
                msg: Some(pb::proxy_message::Msg::Hello(h)),
            }) => h,
            _ => return Err(tonic::Status::invalid_argument("hello first")),
        };
        let (tx, out) = tokio::sync::mpsc::channel(4);
        self.0
            .send(FakeStream { hello, tx, rx })
            .await
            .map_err(|_| tonic::Status::unavailable("test over"))?;
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }
}

impl FakeControlPlane {
    /// Serves on 127.0.0.1:0.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let (tx, streams) = tokio::sync::mpsc::channel(4);
        let server = tonic::transport::Server::builder()
            .add_service(
                router_proto::v1::proxy_config_server::ProxyConfigServer::new(FakeService(tx)),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        Self {
            addr,
            streams,
            task,
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next proxy stream (5 s at most).
    pub async fn accept(&mut self) -> FakeStream {
        match tokio::time::timeout(Duration::from_secs(5), self.streams.recv()).await {
            Ok(Some(s)) => s,
            _ => panic!("no proxy connected"),
        }
    }
}

impl Drop for FakeControlPlane {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A control plane in a fresh directory named after `name`, with
/// `document` applied (asserted), and an admin client of it.
pub async fn control_plane_applying(
    name: &str,
    document: &str,
) -> (router_control_plane::RunningControlPlane, Admin) {
    let dir = std::env::temp_dir().join(format!("router-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cp = control_plane_with(&dir, &[], router_control_plane::Limits::default()).await;
    let mut client = admin(cp.local_addr(), Some(TOKEN)).await;
    let applied = client
        .apply_policy(pb::ApplyPolicyRequest {
            document: document.to_string(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("apply: {e}"))
        .into_inner();
    assert!(applied.applied, "{applied:?}");
    (cp, client)
}

/// A managed proxy named `node` on the control plane at `cp`, sending its
/// heartbeat (load and ramp reports) every `heartbeat`; returned once it
/// serves its first policy.
pub async fn managed_proxy_reporting(cp: SocketAddr, node: &str, heartbeat: Duration) -> TestProxy {
    let proxy = TestProxy::start(
        Settings::default(),
        Mode::Managed(ManagedOptions {
            heartbeat,
            ..managed_options(format!("http://{cp}"), Some(TOKEN), node)
        }),
    )
    .await;
    proxy
        .wait_health("its first policy", |h| {
            h["revision"].as_u64().is_some_and(|r| r > 0)
        })
        .await;
    proxy
}

/// The new side's weight of the split that starts the first route's chain
/// in `cp`'s current policy (`None`: no policy, or not a split).
pub fn split_weight(cp: &router_control_plane::RunningControlPlane) -> Option<u32> {
    let policy = cp.hub().current_policy()?;
    match &policy.routes.first()?.chain.first()? {
        router_policy::ChainStep::Split(s) => s.sides.first().map(|side| side.weight),
        router_policy::ChainStep::Pool(_) => None,
    }
}

/// Waits (`secs` at most) until [`split_weight`] is `want`; panics with
/// the policy history's notes otherwise.
pub async fn wait_split_weight(
    cp: &router_control_plane::RunningControlPlane,
    want: u32,
    secs: u64,
) {
    for _ in 0..secs * 20 {
        if split_weight(cp) == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let notes: Vec<String> = cp.hub().history().into_iter().map(|h| h.message).collect();
    panic!(
        "the new side never reached {want}: at {:?}; history {notes:?}",
        split_weight(cp)
    );
}

/// The versions a ramp wrote: (author, note), oldest first.
pub fn ramp_versions(cp: &router_control_plane::RunningControlPlane) -> Vec<(String, String)> {
    cp.hub()
        .history()
        .into_iter()
        .filter(|h| h.author == router_control_plane::hub::RAMP_AUTHOR)
        .map(|h| (h.author, h.message))
        .collect()
}

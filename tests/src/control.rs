//! Helpers for tests that run control planes and managed proxies in-process.

use std::net::SocketAddr;
use std::time::Duration;

use router_proto::v1::admin_client::AdminClient;
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
            token: Some(TOKEN.into()),
            node_id: node.into(),
            cache_dir: cache,
            ca_pem: None,
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

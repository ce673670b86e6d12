//! `router-control-plane`: stores policy, backend sets and circuit state,
//! and streams them to proxies over gRPC.
//!
//! - [`store`]: persistence behind the [`store::Store`] trait (an embedded
//!   redb file by default; etcd for several replicas);
//! - [`hub`]: validated changes in, one published snapshot out;
//! - [`service`]: the `Admin` and `ProxyConfig` gRPC services;
//! - [`auth`]: operator, approver, viewer and proxy tokens, and which calls
//!   each may make;
//! - [`tasks`]: parked tasks in the proxies' shared store (list, approve, drop),
//!   through `router_shared_state::admin` (this crate does not link `redis`);
//! - [`console`]: the operator's console, web pages on a listener of its
//!   own (`--console-listen`).
//!
//! [`start`] runs a control plane in-process (what `main`, `routerctl up`
//! and the tests do). It is secure by default: it refuses to serve a
//! non-loopback address without an operator token unless told
//! [`ControlPlaneOptions::insecure`], and it bounds what proxies can make
//! it hold ([`Limits`]).

#![forbid(unsafe_code)]

pub mod auth;
pub mod console;
pub mod hub;
pub mod service;
mod shared_store;
pub mod store;
pub mod tasks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use router_proto::v1::admin_server::AdminServer;
use router_proto::v1::proxy_config_server::ProxyConfigServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use crate::auth::{OperatorToken, ProxyToken, Tokens};
pub use crate::console::ConsoleOptions;
use crate::hub::Hub;
use crate::service::{AdminService, ProxyConfigService};

/// What [`start`] needs.
#[derive(Clone)]
pub struct ControlPlaneOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where the state is kept.
    pub store: StoreLocation,
    /// The operator token (`--token-file`): every call. With no token at
    /// all the API is open.
    pub token: Option<String>,
    /// More operator tokens, each with the name it carries (`TOKEN NAME`
    /// lines of `--token-file`): every call, like `token`.
    pub operator_tokens: Vec<OperatorToken>,
    /// Proxy tokens (`--proxy-token-file`): the config stream only. They
    /// need an operator token beside them.
    pub proxy_tokens: Vec<ProxyToken>,
    /// Approver tokens (`--approver-token-file`): the console, reading and
    /// approving or dropping parked tasks. They need an operator token
    /// beside them.
    pub approver_tokens: Vec<OperatorToken>,
    /// Viewer tokens (`--viewer-token-file`): the console, reading only.
    /// They need an operator token beside them.
    pub viewer_tokens: Vec<OperatorToken>,
    /// The console (`--console-listen`; none by default here, the binary
    /// and `routerctl up` turn it on).
    pub console: ConsoleOptions,
    /// Serve an open API on a non-loopback address on purpose
    /// (`--insecure`); without it, [`start`] refuses.
    pub insecure: bool,
    /// TLS certificate chain and key (PEM); `None` serves plain HTTP/2.
    pub tls: Option<(String, String)>,
    /// What policies and backend sets may ask for: API key variables
    /// (`CUSTOM_ROUTER_API_KEY_ENV_ALLOW`) and link-local hosts
    /// (`CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS`), as the proxies read them.
    pub guards: router_policy::Guards,
    /// Bounds on what proxies can make the control plane hold.
    pub limits: Limits,
    /// The proxies' shared store (`redis://` or `rediss://`), where
    /// tenants' spend is read for `routerctl tenants usage`.
    pub shared_store: Option<String>,
}

impl Default for ControlPlaneOptions {
    /// Loopback port 50051, the embedded store in `router-data`, no token.
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            store: StoreLocation::Embedded(PathBuf::from("router-data")),
            token: None,
            operator_tokens: Vec::new(),
            proxy_tokens: Vec::new(),
            approver_tokens: Vec::new(),
            viewer_tokens: Vec::new(),
            console: ConsoleOptions::default(),
            insecure: false,
            tls: None,
            limits: Limits::default(),
            guards: router_policy::Guards::default(),
            shared_store: None,
        }
    }
}

impl std::fmt::Debug for ControlPlaneOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlaneOptions")
            .field("listen", &self.listen)
            .field("store", &self.store)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("operator_tokens", &self.operator_tokens)
            .field("proxy_tokens", &self.proxy_tokens)
            .field("approver_tokens", &self.approver_tokens)
            .field("viewer_tokens", &self.viewer_tokens)
            .field("console", &self.console)
            .field("insecure", &self.insecure)
            .field("tls", &self.tls.is_some())
            .field("limits", &self.limits)
            .field("guards", &self.guards)
            .finish()
    }
}

/// Bounds on what proxies can make the control plane hold or do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// How long the record of a proxy that went away is kept (and listed
    /// by `proxies list`) after it was last seen (`--proxy-record-ttl`).
    pub proxy_record_ttl: Duration,
    /// Circuit reports one proxy may send at once (`--circuit-report-burst`).
    pub circuit_report_burst: u32,
    /// Circuit reports per second one proxy may send in the long run
    /// (`--circuit-report-rate`); the excess is ignored and counted.
    pub circuit_reports_per_second: f64,
    /// Proxy records one replica keeps at most (`--max-proxy-records`). A
    /// new node id past it takes the place of the disconnected record seen
    /// longest ago; with every record connected, its stream is refused
    /// (`RESOURCE_EXHAUSTED`). So a proxy token that is not pinned to a
    /// node id cannot grow the control plane's memory by inventing ids.
    pub max_proxy_records: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            proxy_record_ttl: Duration::from_secs(3600),
            circuit_report_burst: 20,
            circuit_reports_per_second: 2.0,
            max_proxy_records: 10_000,
        }
    }
}

/// How long a starting replica waits for etcd to answer.
#[cfg(feature = "etcd")]
const ETCD_STARTUP_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the control plane keeps its state.
#[derive(Debug, Clone)]
pub enum StoreLocation {
    /// The embedded single-file store in this directory (one replica).
    Embedded(PathBuf),
    /// etcd, shared by several replicas.
    #[cfg(feature = "etcd")]
    Etcd {
        /// Members and key prefix.
        address: store::etcd::EtcdAddress,
        /// This replica's name (in the singleton lease and logs).
        node_id: String,
        /// TLS and user for etcd (`--etcd-*`).
        access: store::etcd::EtcdAccess,
    },
}

/// Errors that stop the control plane from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened.
    #[error(transparent)]
    Hub(#[from] hub::HubError),
    /// The listener could not be bound.
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    /// The TLS certificate or key is unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The token cannot be used (empty, or not a header value).
    #[error(transparent)]
    Token(#[from] router_proto::token::TokenError),
    /// An open API on an address other machines can reach.
    #[error(
        "refusing to serve {0} without a token: it is not a loopback address, so anyone who can \
         reach it could change the policy. Give an operator token (--token-file FILE, and \
         --proxy-token-file FILE for proxies), or pass --insecure to serve an open API on purpose"
    )]
    Insecure(SocketAddr),
    /// Proxy tokens without an operator token: nobody could administer it.
    #[error("proxy tokens (--proxy-token-file) need an operator token (--token-file) beside them")]
    ProxyTokensWithoutOperator,
    /// Approver or viewer tokens without an operator token.
    #[error("approver and viewer tokens (--approver-token-file, --viewer-token-file) need an operator token (--token-file) beside them")]
    ConsoleTokensWithoutOperator,
    /// The console on an address other machines can reach, without TLS.
    #[error(
        "refusing to serve the console on {0} without TLS: it is not a loopback address, so \
         session cookies and tokens would cross the network in clear. Give --tls-cert and \
         --tls-key, keep --console-listen on loopback (or `off`), or pass --insecure to serve \
         it in clear on purpose"
    )]
    ConsoleInsecure(SocketAddr),
    /// `--shared-store` is not a Redis URL.
    #[error("--shared-store: {0}")]
    SharedStore(String),
}

/// Refuses an open API on a non-loopback address unless `insecure`, a
/// console off loopback without TLS unless `insecure`, and proxy, approver
/// or viewer tokens without an operator token.
pub fn check_exposure(options: &ControlPlaneOptions) -> Result<(), StartError> {
    let operator = options.token.is_some() || !options.operator_tokens.is_empty();
    if !operator && !options.proxy_tokens.is_empty() {
        return Err(StartError::ProxyTokensWithoutOperator);
    }
    let console_tokens = !options.approver_tokens.is_empty() || !options.viewer_tokens.is_empty();
    if !operator && console_tokens {
        return Err(StartError::ConsoleTokensWithoutOperator);
    }
    if let Some(console) = options.console.listen {
        if options.tls.is_none() && !options.insecure && !console.ip().is_loopback() {
            return Err(StartError::ConsoleInsecure(console));
        }
    }
    if !operator && !options.insecure && !options.listen.ip().is_loopback() {
        return Err(StartError::Insecure(options.listen));
    }
    Ok(())
}

/// A control plane running in this process.
pub struct RunningControlPlane {
    addr: SocketAddr,
    hub: Arc<Hub>,
    tasks: Vec<JoinHandle<()>>,
    console: Option<(SocketAddr, Arc<console::Console>, bool)>,
}

impl RunningControlPlane {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its state.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The console's address, if it serves one.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console.as_ref().map(|(addr, _, _)| *addr)
    }

    /// The console's base URL (`http://` or `https://`, an unspecified
    /// address shown as loopback), if it serves one.
    pub fn console_url(&self) -> Option<String> {
        let (addr, _, tls) = self.console.as_ref()?;
        let mut shown = *addr;
        if shown.ip().is_unspecified() {
            shown.set_ip(if shown.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let scheme = if *tls { "https" } else { "http" };
        Some(format!("{scheme}://{shown}"))
    }

    /// A one-time sign-in link to the console, as the operator who started
    /// this control plane (what `routerctl up` prints): valid 5 minutes,
    /// used once. `None` without a console.
    pub fn console_signin_link(&self) -> Option<String> {
        let (_, console, _) = self.console.as_ref()?;
        Some(format!("{}{}", self.console_url()?, console.mint_link()?))
    }

    /// Stops serving: streams are cut, and the store is closed once every
    /// task let go of it (bounded wait), so it can be opened again.
    pub async fn shutdown(mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        self.hub.release_leases().await;
        for _ in 0..200 {
            if Arc::strong_count(&self.hub) == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RunningControlPlane {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Opens the store, binds, and serves in background tasks.
pub async fn start(options: ControlPlaneOptions) -> Result<RunningControlPlane, StartError> {
    check_exposure(&options)?;
    let operators: Vec<OperatorToken> = options
        .token
        .iter()
        .map(|t| OperatorToken {
            token: t.clone(),
            name: None,
        })
        .chain(options.operator_tokens.iter().cloned())
        .collect();
    let tokens = Arc::new(
        Tokens::new(&operators, &options.proxy_tokens)?
            .with_console_roles(&options.approver_tokens, &options.viewer_tokens)?,
    );
    if tokens.is_open() {
        tracing::warn!(listen = %options.listen, "no token: the admin and proxy APIs are open to anyone who can reach them");
    } else if options.tls.is_none() && !options.listen.ip().is_loopback() {
        tracing::warn!(listen = %options.listen, "no TLS: bearer tokens cross the network in clear (--tls-cert/--tls-key, or a mesh)");
    }
    // The console's port first: a port in use stops the start before
    // anything is opened (so a caller may start again without a console).
    let console_listener = match options.console.listen {
        None => None,
        Some(listen) => Some(
            TcpListener::bind(listen)
                .await
                .map_err(|e| StartError::Bind(listen, e))?,
        ),
    };
    let shared_store = match &options.shared_store {
        None => None,
        Some(url) => Some(shared_store::open(url)?),
    };
    let store: Box<dyn store::Store> = match &options.store {
        StoreLocation::Embedded(dir) => {
            Box::new(store::RedbStore::open(dir).map_err(hub::HubError::from)?)
        }
        #[cfg(feature = "etcd")]
        StoreLocation::Etcd {
            address,
            node_id,
            access,
        } => Box::new(
            store::etcd::EtcdStore::open(address, access, node_id, ETCD_STARTUP_WAIT)
                .await
                .map_err(hub::HubError::from)?,
        ),
    };
    let hub = Hub::open(store, options.guards.clone(), options.limits).await?;
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| StartError::Bind(options.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Bind(options.listen, e))?;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AdminServer<AdminService>>()
        .await;
    // HTTP/2 keep-alives: a proxy that vanished without closing its stream
    // is noticed (and its record marked gone) within seconds.
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some((cert, key)) = &options.tls {
        let tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key));
        builder = builder
            .tls_config(tls)
            .map_err(|e| StartError::Tls(e.to_string()))?;
    }
    let server = builder
        .add_service(health)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            AdminServer::new(AdminService {
                hub: Arc::downgrade(&hub),
                shared_store: shared_store.clone(),
            })
            // Policy documents; answers (history) are not capped.
            .max_decoding_message_size(router_proto::MAX_MESSAGE_BYTES),
            crate::auth::admin_check(Arc::clone(&tokens)),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            ProxyConfigServer::new(ProxyConfigService {
                hub: Arc::downgrade(&hub),
            })
            .max_decoding_message_size(router_proto::MAX_PROXY_MESSAGE_BYTES)
            .max_encoding_message_size(router_proto::MAX_MESSAGE_BYTES),
            crate::auth::stream_check(Arc::clone(&tokens)),
        ))
        .serve_with_incoming(TcpListenerStream::new(listener));
    let serve = tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "control plane server stopped");
        }
    });
    let maintenance = tokio::spawn(hub::maintenance_loop(Arc::downgrade(&hub)));
    let ramps = tokio::spawn(hub::ramp_loop(Arc::downgrade(&hub)));
    // Other replicas' questions (the console's pages), answered with this
    // replica's proxies; aborted with the rest, so a stopped replica is
    // silent.
    let answers = tokio::spawn(hub::answer_loop(Arc::downgrade(&hub)));
    let mut tasks = vec![serve, maintenance, ramps, answers];
    if let Some(client) = shared_store.clone() {
        tasks.push(tokio::spawn(hub::purge_on_pool_change(
            Arc::downgrade(&hub),
            client,
        )));
    }
    let console = match console_listener {
        None => None,
        Some(listener) => {
            let c = match console::serve(
                listener,
                &options.console,
                options.tls.as_ref(),
                Arc::downgrade(&hub),
                shared_store,
                tokens,
            )
            .await
            {
                Ok(c) => c,
                Err(e) => {
                    for t in &tasks {
                        t.abort();
                    }
                    return Err(e);
                }
            };
            tracing::info!(addr = %c.addr, tls = options.tls.is_some(), "console listening");
            tasks.push(c.task);
            Some((c.addr, c.console, options.tls.is_some()))
        }
    };
    Ok(RunningControlPlane {
        addr,
        hub,
        tasks,
        console,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33: the console off loopback needs TLS or --insecure, as the
    /// gRPC listener needs a token; the error names the flags.
    #[test]
    fn the_console_off_loopback_needs_tls_or_insecure() {
        let with_console = |console: &str| ControlPlaneOptions {
            token: Some("t".into()),
            console: ConsoleOptions {
                listen: Some(console.parse().unwrap_or_else(|e| panic!("{console}: {e}"))),
                ..ConsoleOptions::default()
            },
            ..ControlPlaneOptions::default()
        };
        for public in ["0.0.0.0:50052", "[::]:50052", "10.1.2.3:50052"] {
            let text = check_exposure(&with_console(public))
                .unwrap_err()
                .to_string();
            for flag in ["--tls-cert", "--console-listen", "--insecure"] {
                assert!(text.contains(flag), "{text}");
            }
            assert!(check_exposure(&ControlPlaneOptions {
                tls: Some(("cert".into(), "key".into())),
                ..with_console(public)
            })
            .is_ok());
            assert!(check_exposure(&ControlPlaneOptions {
                insecure: true,
                ..with_console(public)
            })
            .is_ok());
        }
        assert!(check_exposure(&with_console("127.0.0.1:50052")).is_ok());
        assert!(check_exposure(&ControlPlaneOptions::default()).is_ok());
    }

    #[test]
    fn an_open_api_is_refused_off_loopback_unless_insecure() {
        let at = |listen: &str| ControlPlaneOptions {
            listen: listen.parse().unwrap_or_else(|e| panic!("{listen}: {e}")),
            ..ControlPlaneOptions::default()
        };
        for public in ["0.0.0.0:50051", "[::]:50051", "10.1.2.3:50051"] {
            let err = check_exposure(&at(public)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("--token-file") && text.contains("--insecure"),
                "{text}"
            );
            assert!(check_exposure(&ControlPlaneOptions {
                insecure: true,
                ..at(public)
            })
            .is_ok());
            assert!(check_exposure(&ControlPlaneOptions {
                token: Some("t".into()),
                ..at(public)
            })
            .is_ok());
        }
        for loopback in ["127.0.0.1:50051", "[::1]:50051", "127.0.0.2:1"] {
            assert!(check_exposure(&at(loopback)).is_ok(), "{loopback}");
        }
        // Proxy tokens alone would leave nobody able to administer it.
        let proxies_only = ControlPlaneOptions {
            proxy_tokens: vec![ProxyToken {
                token: "p".into(),
                node: None,
            }],
            ..at("127.0.0.1:1")
        };
        assert!(matches!(
            check_exposure(&proxies_only),
            Err(StartError::ProxyTokensWithoutOperator)
        ));
        // Approver or viewer tokens alone: the same.
        assert!(matches!(
            check_exposure(&ControlPlaneOptions {
                viewer_tokens: vec![OperatorToken {
                    token: "v".into(),
                    name: None,
                }],
                ..at("127.0.0.1:1")
            }),
            Err(StartError::ConsoleTokensWithoutOperator)
        ));
        // Debug never shows a token.
        let shown = format!(
            "{:?}",
            ControlPlaneOptions {
                token: Some("operator-secret".into()),
                ..proxies_only
            }
        );
        assert!(
            !shown.contains("secret") && !shown.contains("\"p\""),
            "{shown}"
        );
    }
}

//! `router-control-plane`: stores policy, backend sets and circuit state,
//! and streams them to proxies over gRPC.
//!
//! - [`store`]: persistence behind the [`store::Store`] trait (an embedded
//!   redb file by default; etcd for several replicas);
//! - [`hub`]: validated changes in, one published snapshot out;
//! - [`service`]: the `Admin` and `ProxyConfig` gRPC services.
//!
//! [`start`] runs a control plane in-process (what `main`, `routerctl up`
//! and the tests do).

#![forbid(unsafe_code)]

pub mod hub;
pub mod service;
pub mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use router_proto::v1::admin_server::AdminServer;
use router_proto::v1::proxy_config_server::ProxyConfigServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use crate::hub::Hub;
use crate::service::{auth, AdminService, ProxyConfigService};

/// What [`start`] needs.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where the state is kept.
    pub store: StoreLocation,
    /// Bearer token required on every call; `None` leaves the API open.
    pub token: Option<String>,
    /// TLS certificate chain and key (PEM); `None` serves plain HTTP/2.
    pub tls: Option<(String, String)>,
    /// What policies and backend sets may ask for: API key variables
    /// (`CUSTOM_ROUTER_API_KEY_ENV_ALLOW`) and link-local hosts
    /// (`CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS`), as the proxies read them.
    pub guards: router_policy::Guards,
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
}

/// A control plane running in this process.
pub struct RunningControlPlane {
    addr: SocketAddr,
    hub: Arc<Hub>,
    tasks: Vec<JoinHandle<()>>,
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
    let store: Box<dyn store::Store> = match &options.store {
        StoreLocation::Embedded(dir) => {
            Box::new(store::RedbStore::open(dir).map_err(hub::HubError::from)?)
        }
        #[cfg(feature = "etcd")]
        StoreLocation::Etcd { address, node_id } => {
            let etcd = store::etcd::EtcdStore::connect(address, node_id)
                .await
                .map_err(hub::HubError::from)?;
            etcd.wait_ready(ETCD_STARTUP_WAIT)
                .await
                .map_err(hub::HubError::from)?;
            Box::new(etcd)
        }
    };
    let hub = Hub::open(store, options.guards.clone()).await?;
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| StartError::Bind(options.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| StartError::Bind(options.listen, e))?;
    let secret = options
        .token
        .as_deref()
        .map(|t| router_proto::token::Secret::new(t, "the control plane's token"))
        .transpose()?;
    let check = auth(secret);
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AdminServer<AdminService>>()
        .await;
    let mut builder = tonic::transport::Server::builder();
    if let Some((cert, key)) = &options.tls {
        let tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(cert, key));
        builder = builder
            .tls_config(tls)
            .map_err(|e| StartError::Tls(e.to_string()))?;
    }
    let server = builder
        .add_service(health)
        .add_service(AdminServer::with_interceptor(
            AdminService {
                hub: Arc::downgrade(&hub),
            },
            check.clone(),
        ))
        .add_service(ProxyConfigServer::with_interceptor(
            ProxyConfigService {
                hub: Arc::downgrade(&hub),
            },
            check,
        ))
        .serve_with_incoming(TcpListenerStream::new(listener));
    let serve = tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "control plane server stopped");
        }
    });
    let maintenance = tokio::spawn(hub::maintenance_loop(Arc::downgrade(&hub)));
    Ok(RunningControlPlane {
        addr,
        hub,
        tasks: vec![serve, maintenance],
    })
}

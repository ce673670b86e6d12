//! `router-control-plane`: run the control plane.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use router_control_plane::{start, ControlPlaneOptions, StoreLocation};

/// The LLM router's control plane.
#[derive(Parser, Debug)]
#[command(name = "router-control-plane", version, about)]
struct Args {
    /// gRPC address.
    #[arg(long, default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Directory of the embedded store (one replica).
    #[arg(long, default_value = "router-data")]
    data_dir: PathBuf,
    /// Share state with other replicas through etcd:
    /// `etcd://host:2379[,host:2379...][/prefix]` (instead of --data-dir).
    #[arg(long, env = "ROUTER_STORE")]
    store: Option<String>,
    /// This replica's name (etcd store): shown as the singleton lease holder.
    #[arg(long, env = "ROUTER_NODE_ID")]
    node_id: Option<String>,
    /// File holding the bearer token every call must present.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// TLS certificate chain (PEM); with --tls-key, serve over TLS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    router_process::init_logs();
    let token = match &args.token_file {
        None => None,
        Some(path) => match std::fs::read_to_string(path) {
            // Trimmed and checked as every token is (`router_proto::token`).
            Ok(t) => match router_proto::token::normalize(
                &t,
                &format!("--token-file {}", path.display()),
            ) {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("router-control-plane: {e}");
                    return ExitCode::from(2);
                }
            },
            Err(e) => {
                eprintln!(
                    "router-control-plane: cannot read --token-file {}: {e}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        },
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => match (std::fs::read_to_string(c), std::fs::read_to_string(k)) {
            (Ok(c), Ok(k)) => Some((c, k)),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("router-control-plane: cannot read the TLS files: {e}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    let store = match args.store.as_deref() {
        None => StoreLocation::Embedded(args.data_dir.clone()),
        Some(url) => match router_control_plane::store::etcd::EtcdAddress::parse(url) {
            Ok(address) => StoreLocation::Etcd {
                address,
                node_id: args.node_id.clone().unwrap_or_else(default_node_id),
            },
            Err(e) => {
                eprintln!("router-control-plane: --store (ROUTER_STORE): {e}");
                return ExitCode::from(2);
            }
        },
    };
    // The same variables the proxies read: the control plane refuses what
    // its own list does not allow; each proxy checks again with its own.
    let guards = match router_policy::Guards::from_lookup(|k| std::env::var(k).ok()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("router-control-plane: {e}");
            return ExitCode::from(2);
        }
    };
    let store_name = match &store {
        StoreLocation::Embedded(dir) => dir.display().to_string(),
        StoreLocation::Etcd { address, .. } => {
            format!("etcd {} {}", address.endpoints.join(","), address.prefix)
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("router-control-plane: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        if token.is_none() {
            tracing::warn!("no --token-file: the admin and proxy APIs are open to anyone who can reach them");
        }
        let cp = match start(ControlPlaneOptions {
            listen: args.listen,
            store,
            token,
            tls,
            guards,
        })
        .await
        {
            Ok(cp) => cp,
            Err(e) => {
                eprintln!("router-control-plane: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(addr = %cp.local_addr(), store = %store_name, "router-control-plane listening");
        router_process::shutdown_signal().await;
        tracing::info!("shutting down");
        cp.shutdown().await;
        ExitCode::SUCCESS
    })
}

/// The host name (a pod's name in Kubernetes), else a random id.
fn default_node_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("cp-{}", uuid::Uuid::now_v7()))
}

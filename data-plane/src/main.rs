//! `router-proxy`: run the data plane.
//!
//! No flags: sidecar mode (Hugging Face custom-router contract).
//! `--policy FILE`: standalone mode, the file watched and reloaded.

#![forbid(unsafe_code)]

use std::io::BufWriter;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use router_proxy::{Mode, ProxyOptions, Settings};

/// mimalloc: the request path allocates many small, short-lived buffers;
/// glibc's malloc was ~10% of the proxy's CPU under load.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `router-proxy --help`'s description: the modes and the variables.
const LONG_ABOUT: &str = "The LLM traffic router's data-plane proxy.

Modes:
  (no flags)              sidecar: the Hugging Face custom-router contract;
                          backends come from POST /_custom_router/set-backends
  --policy FILE           standalone: route by a policy file, reloaded on change
  --control-plane URL,..  managed: config streamed from router-control-plane
                          (ROUTER_TOKEN: a proxy or operator token)

Settings come from CUSTOM_ROUTER_* variables, among them:
  CUSTOM_ROUTER_PORT, CUSTOM_ROUTER_BIND        where to listen (3000, 0.0.0.0)
  CUSTOM_ROUTER_TLS_CERT_FILE, _TLS_KEY_FILE    serve TLS (ALPN h2, http/1.1);
                                                unset: HTTP/1.1 and h2c
  CUSTOM_ROUTER_ADMIN_TOKEN                     opens the admin calls
  CUSTOM_ROUTER_METRICS_TOKEN                   opens /metrics off loopback
  CUSTOM_ROUTER_APPROVAL_KEY                    checks signed approvals
  CUSTOM_ROUTER_QUEUE_MAX_SIZE, _QUEUE_TIMEOUT  the queue (1000, 1200 s)
  CUSTOM_ROUTER_MAX_CONCURRENCY                 per backend (0: no limit)
  CUSTOM_ROUTER_ATTEMPT_TIMEOUT                 per attempt (1800 s)
Every variable, its default and its meaning: docs/data-plane.md. An
invalid value stops the start and names the variable.";

/// The LLM traffic router's data-plane proxy.
#[derive(Parser, Debug)]
#[command(name = "router-proxy", version, about, long_about = LONG_ABOUT)]
struct Args {
    /// Standalone mode: route by this policy file (YAML or JSON), reloaded on change.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Port to listen on (overrides CUSTOM_ROUTER_PORT).
    #[arg(long)]
    port: Option<u16>,
    /// Address to listen on (overrides CUSTOM_ROUTER_BIND).
    #[arg(long)]
    bind: Option<IpAddr>,
    /// Managed mode: stream config from these control planes
    /// (comma-separated `http://host:port`); the token is `ROUTER_TOKEN`.
    #[arg(
        long,
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        conflicts_with = "policy"
    )]
    control_plane: Vec<String>,
    /// Managed mode: keep the last good config here, and start from it.
    #[arg(long, value_name = "DIR", requires = "control_plane")]
    cache_dir: Option<PathBuf>,
    /// Managed mode: this proxy's name (default: host name and pid).
    #[arg(long, requires = "control_plane")]
    node_id: Option<String>,
    /// Managed mode: a CA (PEM) to trust for `https://` control planes.
    #[arg(long, value_name = "FILE", requires = "control_plane")]
    control_plane_ca: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("router-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(p) = args.port {
        settings.port = p;
    }
    if let Some(b) = args.bind {
        settings.bind = b;
    }
    let mode = match (args.policy, args.control_plane.is_empty()) {
        (Some(policy), _) => Mode::Standalone { policy },
        (None, false) => {
            let addrs: Vec<String> = args
                .control_plane
                .iter()
                .map(|a| {
                    let a = a.trim();
                    if a.contains("://") {
                        a.to_string()
                    } else {
                        format!("http://{a}")
                    }
                })
                .collect();
            let node_id = args.node_id.unwrap_or_else(|| {
                let host = std::fs::read_to_string("/etc/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "proxy".into());
                format!("{host}-{}", std::process::id())
            });
            let ca_pem = match &args.control_plane_ca {
                None => None,
                Some(path) => match std::fs::read_to_string(path) {
                    Ok(pem) => Some(pem),
                    Err(e) => {
                        eprintln!(
                            "router-proxy: cannot read --control-plane-ca {}: {e}",
                            path.display()
                        );
                        return ExitCode::from(2);
                    }
                },
            };
            // Trimmed and checked as every token is: set but unusable
            // (empty, not a header value, not Unicode) stops the start
            // instead of connecting without it.
            let token = match router_proto::token::from_env("ROUTER_TOKEN") {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("router-proxy: {e}");
                    return ExitCode::from(2);
                }
            };
            Mode::Managed(router_proxy::managed::ManagedOptions {
                addrs,
                token,
                node_id,
                cache_dir: args.cache_dir,
                ca_pem,
                heartbeat: router_proxy::managed::HEARTBEAT,
            })
        }
        (None, true) => Mode::Sidecar,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("router-proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Tracing export needs the runtime; logs go to stderr either way.
        let provider = match router_proxy::telemetry::init("router-proxy") {
            Ok(p) => p,
            Err(e) => {
                eprintln!("router-proxy: OpenTelemetry: {e}");
                return ExitCode::from(2);
            }
        };
        init_logs(provider.as_ref());
        let code = run(settings, mode).await;
        if let Some(p) = provider {
            let _ = p.shutdown();
        }
        code
    })
}

fn init_logs(provider: Option<&opentelemetry_sdk::trace::SdkTracerProvider>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let otel = provider.map(router_proxy::telemetry::layer);
    tracing_subscriber::registry()
        .with(router_process::log_layer())
        .with(otel)
        .init();
}

async fn run(settings: Settings, mode: Mode) -> ExitCode {
    let options = ProxyOptions {
        settings,
        mode: mode.clone(),
        route_log: Box::new(BufWriter::new(std::io::stdout())),
    };
    let proxy = match router_proxy::start(options).await {
        Ok(p) => p,
        Err(e @ (router_proxy::StartError::Token(_) | router_proxy::StartError::Tls { .. })) => {
            eprintln!("router-proxy: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("router-proxy: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mode_text = match &mode {
        Mode::Sidecar => "sidecar".to_string(),
        Mode::Standalone { policy } => format!("standalone ({})", policy.display()),
        Mode::Inline(_) => "inline".to_string(),
        Mode::Managed(m) => format!("managed ({})", m.addrs.join(",")),
    };
    tracing::info!(
        addr = %proxy.local_addr(),
        mode = %mode_text,
        version = &*proxy.config().version(),
        "router-proxy listening"
    );
    // Exactly what the admin doors let through in this mode.
    tracing::info!(mode = %mode_text, "{}", proxy.admin_access());
    router_process::shutdown_signal().await;
    tracing::info!(
        timeout_s = DRAIN_TIMEOUT.as_secs(),
        "draining: finishing requests in flight"
    );
    if proxy.drain(DRAIN_TIMEOUT).await {
        tracing::info!("drained");
    } else {
        tracing::warn!("drain timed out; closing the remaining connections");
    }
    ExitCode::SUCCESS
}

/// How long a stopping proxy waits for requests in flight.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

//! `router-control-plane`: run the control plane.
//!
//! Flags in, [`start`] out. Secure by default: on an address other than
//! loopback it refuses to start without an operator token
//! (`--token-file`) unless told `--insecure`.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use router_control_plane::auth::OperatorToken;
use router_control_plane::auth::{parse_operator_tokens, parse_proxy_tokens};
use router_control_plane::store::etcd::{EtcdAccess, EtcdAccessFiles, EtcdAddress};
use router_control_plane::{
    check_exposure, start, ConsoleOptions, ControlPlaneOptions, Limits, StoreLocation,
};

/// `--console-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy)]
struct ConsoleListen(Option<SocketAddr>);

fn console_listen(s: &str) -> Result<ConsoleListen, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(ConsoleListen(None));
    }
    s.parse()
        .map(|a| ConsoleListen(Some(a)))
        .map_err(|e| format!("an address (HOST:PORT) or `off`: {e}"))
}

/// Reads a `TOKEN` / `TOKEN NAME` file (`--token-file`,
/// `--approver-token-file`, `--viewer-token-file`); the error names `flag`
/// and never a token.
fn named_tokens(path: &std::path::Path, flag: &str) -> Result<Vec<OperatorToken>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {flag} {}: {e}", path.display()))?;
    let tokens =
        parse_operator_tokens(&text).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    for o in &tokens {
        // Each checked as every token is (`router_proto::token`).
        router_proto::token::normalize(&o.token, &format!("{flag} {}", path.display()))
            .map_err(|e| e.to_string())?;
    }
    Ok(tokens)
}

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
    /// `etcd://host:2379[,host:2379...][/prefix]` (instead of --data-dir);
    /// `etcds://` for TLS (with --etcd-ca-file).
    #[arg(long, env = "ROUTER_STORE")]
    store: Option<String>,
    /// CA certificate(s) (PEM) that signed the etcd members' certificates;
    /// required by an `etcds://` store.
    #[arg(long, env = "ROUTER_ETCD_CA_FILE")]
    etcd_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth.
    #[arg(long, env = "ROUTER_ETCD_CERT_FILE")]
    etcd_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "ROUTER_ETCD_KEY_FILE")]
    etcd_key_file: Option<PathBuf>,
    /// etcd user (etcd authentication); needs --etcd-password-file.
    #[arg(long, env = "ROUTER_ETCD_USER")]
    etcd_user: Option<String>,
    /// File holding the etcd user's password (trimmed).
    #[arg(long, env = "ROUTER_ETCD_PASSWORD_FILE")]
    etcd_password_file: Option<PathBuf>,
    /// This replica's name (etcd store): shown as the singleton lease
    /// holder [default: $HOSTNAME, else a random id].
    #[arg(long, env = "ROUTER_NODE_ID")]
    node_id: Option<String>,
    /// File holding the operator token: every call (admin and stream).
    /// One token, or one per line as `TOKEN` or `TOKEN NAME` (the name is
    /// recorded with every approval or drop of a parked task). Required on
    /// a non-loopback --listen unless --insecure.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// File of proxy tokens, one per line, `TOKEN` or `TOKEN NODE_ID`: they
    /// open the config stream only (for NODE_ID only, when given).
    #[arg(long, requires = "token_file")]
    proxy_token_file: Option<PathBuf>,
    /// File of approver tokens, `TOKEN` or `TOKEN NAME` per line: they sign
    /// in to the console, read, and approve or drop parked tasks.
    #[arg(long, requires = "token_file")]
    approver_token_file: Option<PathBuf>,
    /// File of viewer tokens, `TOKEN` or `TOKEN NAME` per line: they sign
    /// in to the console and read.
    #[arg(long, requires = "token_file")]
    viewer_token_file: Option<PathBuf>,
    /// The console's address (web pages for people), or `off`. Off
    /// loopback it needs --tls-cert/--tls-key, or --insecure.
    #[arg(long, env = "ROUTER_CONSOLE_LISTEN", default_value = "127.0.0.1:50052", value_parser = console_listen)]
    console_listen: ConsoleListen,
    /// How long a console session lasts.
    #[arg(long, default_value = "8h", value_parser = humantime::parse_duration)]
    console_session_ttl: Duration,
    /// Console sessions kept at most (past it, the one closest to its
    /// expiry ends).
    #[arg(long, default_value_t = ConsoleOptions::default().max_sessions)]
    console_max_sessions: usize,
    /// Serve without a token on a non-loopback address, on purpose (anyone
    /// who reaches the port can change the policy).
    #[arg(long)]
    insecure: bool,
    /// How long the record of a proxy that went away is kept.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    proxy_record_ttl: Duration,
    /// Circuit reports one proxy may send at once.
    #[arg(long, default_value_t = Limits::default().circuit_report_burst)]
    circuit_report_burst: u32,
    /// Circuit reports per second one proxy may send in the long run (the
    /// excess is ignored and counted).
    #[arg(long, default_value_t = Limits::default().circuit_reports_per_second)]
    circuit_report_rate: f64,
    /// Proxy records kept at most; a new proxy past it replaces the
    /// disconnected one seen longest ago, or is refused.
    #[arg(long, default_value_t = Limits::default().max_proxy_records)]
    max_proxy_records: usize,
    /// TLS certificate chain (PEM); with --tls-key, serve over TLS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The proxies' shared store (redis://HOST:PORT or rediss://...), where
    /// `routerctl tenants usage` reads tenants' spend and `routerctl tasks`
    /// reads and changes parked tasks.
    #[arg(long, env = "ROUTER_SHARED_STORE", hide_env_values = true)]
    shared_store: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    router_process::init_logs();
    let mut named = Vec::new();
    for (path, flag) in [
        (&args.token_file, "--token-file"),
        (&args.approver_token_file, "--approver-token-file"),
        (&args.viewer_token_file, "--viewer-token-file"),
    ] {
        named.push(match path {
            None => Vec::new(),
            Some(path) => match named_tokens(path, flag) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("router-control-plane: {e}");
                    return ExitCode::from(2);
                }
            },
        });
    }
    let viewer_tokens = named.pop().unwrap_or_default();
    let approver_tokens = named.pop().unwrap_or_default();
    let operator_tokens = named.pop().unwrap_or_default();
    let proxy_tokens = match &args.proxy_token_file {
        None => Vec::new(),
        Some(path) => match std::fs::read_to_string(path).map(|t| parse_proxy_tokens(&t)) {
            Ok(Ok(tokens)) => tokens,
            Ok(Err(e)) => {
                eprintln!(
                    "router-control-plane: --proxy-token-file {}: {e}",
                    path.display()
                );
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!(
                    "router-control-plane: cannot read --proxy-token-file {}: {e}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        },
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => match (std::fs::read_to_string(c), std::fs::read_to_string(k)) {
            (Ok(c), Ok(k)) => Some((c, k)),
            (Err(e), _) => {
                eprintln!(
                    "router-control-plane: cannot read --tls-cert {}: {e}",
                    c.display()
                );
                return ExitCode::from(2);
            }
            (_, Err(e)) => {
                eprintln!(
                    "router-control-plane: cannot read --tls-key {}: {e}",
                    k.display()
                );
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    let store = match args.store.as_deref() {
        None => StoreLocation::Embedded(args.data_dir.clone()),
        Some(url) => match EtcdAddress::parse(url) {
            Ok(address) => match EtcdAccess::load(&address, &etcd_files(&args)) {
                Ok(access) => StoreLocation::Etcd {
                    address,
                    node_id: args.node_id.clone().unwrap_or_else(default_node_id),
                    access,
                },
                Err(e) => {
                    eprintln!("router-control-plane: {e}");
                    return ExitCode::from(2);
                }
            },
            Err(e) => {
                eprintln!("router-control-plane: --store (ROUTER_STORE): {e}");
                return ExitCode::from(2);
            }
        },
    };
    if args.store.is_none() {
        if let Some(flag) = etcd_files(&args).first_given() {
            eprintln!("router-control-plane: {flag} is for an etcd store (--store etcds://...)");
            return ExitCode::from(2);
        }
    }
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
        StoreLocation::Etcd {
            address, access, ..
        } => {
            format!(
                "etcd {} {} {access:?}",
                address.endpoints.join(","),
                address.prefix
            )
        }
    };
    let options = ControlPlaneOptions {
        listen: args.listen,
        store,
        token: None,
        operator_tokens,
        proxy_tokens,
        approver_tokens,
        viewer_tokens,
        console: ConsoleOptions {
            listen: args.console_listen.0,
            session_ttl: args.console_session_ttl,
            max_sessions: args.console_max_sessions.max(1),
        },
        insecure: args.insecure,
        tls,
        limits: Limits {
            proxy_record_ttl: args.proxy_record_ttl,
            circuit_report_burst: args.circuit_report_burst,
            circuit_reports_per_second: args.circuit_report_rate,
            max_proxy_records: args.max_proxy_records.max(1),
        },
        guards,
        shared_store: args.shared_store,
    };
    if let Err(e) = check_exposure(&options) {
        eprintln!("router-control-plane: {e}");
        return ExitCode::from(2);
    }
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
        let cp = match start(options).await {
            Ok(cp) => cp,
            Err(e) => {
                eprintln!("router-control-plane: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(addr = %cp.local_addr(), store = %store_name, "router-control-plane listening");
        if let Some(url) = cp.console_url() {
            tracing::info!(url = %url, "console: sign in with an operator, approver or viewer token");
        }
        router_process::shutdown_signal().await;
        tracing::info!("shutting down");
        cp.shutdown().await;
        ExitCode::SUCCESS
    })
}

fn etcd_files(args: &Args) -> EtcdAccessFiles {
    EtcdAccessFiles {
        ca: args.etcd_ca_file.clone(),
        cert: args.etcd_cert_file.clone(),
        key: args.etcd_key_file.clone(),
        user: args.etcd_user.clone(),
        password: args.etcd_password_file.clone(),
    }
}

/// The host name (a pod's name in Kubernetes), else a random id.
fn default_node_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("cp-{}", uuid::Uuid::now_v7()))
}

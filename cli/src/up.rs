//! `routerctl up`: the control plane (embedded store) and one managed proxy
//! in one process; with no policy, built-in demo endpoints, so that a new
//! user can send a request at once.

use crate::error::CliError;
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use router_control_plane::{start, ControlPlaneOptions};
use router_proxy::managed::ManagedOptions;
use router_proxy::{Mode, ProxyOptions, Settings};

use router_mock::{MockConfig, MockModel};

/// Flags of `routerctl up`.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Apply this policy instead of the built-in demo.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The proxy's address: loopback unless asked (in a container,
    /// `--bind 0.0.0.0` so that a published port reaches it). Its admin
    /// calls stay closed and its metrics loopback-only without tokens.
    #[arg(long, env = "CUSTOM_ROUTER_BIND", default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// The proxy's port.
    #[arg(long, default_value_t = 3000)]
    pub port: u16,
    /// The control plane's address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub grpc: SocketAddr,
    /// Where the control plane keeps its store and the proxy its cache.
    #[arg(long, default_value = "router-data")]
    pub data_dir: PathBuf,
    /// Apply the built-in demo even when the data dir holds a policy of
    /// your own (kept otherwise).
    #[arg(long)]
    pub reset: bool,
    /// The console's address (web pages: fleet, parked tasks), or `off`.
    /// `up` prints a one-time sign-in link to it.
    #[arg(long, default_value = "127.0.0.1:50052", value_parser = console_listen)]
    pub console_listen: ConsoleListen,
}

/// `--console-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy)]
pub struct ConsoleListen(pub Option<SocketAddr>);

fn console_listen(s: &str) -> Result<ConsoleListen, CliError> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(ConsoleListen(None));
    }
    s.parse()
        .map(|a| ConsoleListen(Some(a)))
        .map_err(|e| CliError::Value {
            expected: "an address (HOST:PORT) or `off`",
            reason: Some(e.to_string()),
        })
}

/// The demo policy's name: `up` replaces only a policy of that name (its
/// endpoints are new at every start).
const DEMO_NAME: &str = "routerctl-up-demo";

fn demo_policy(local: &str, cloud: &str) -> String {
    format!(
        r#"apiVersion: router/v1
kind: RoutingPolicy
metadata: {{name: {DEMO_NAME}}}
spec:
  defaults: {{deadline_ms: 5000, attempt_timeout_ms: 2000}}
  pools:
    - name: local-gpu
      provider: vllm
      model: demo-small
      endpoints: ["{local}"]
      max_concurrency: 4
    - name: cloud
      provider: openai
      model: demo-large
      endpoints: ["{cloud}"]
      price: {{input_per_1k_usd: 0.0005, output_per_1k_usd: 0.0015}}
  routes:
    - name: default
      chain: [local-gpu, cloud]
      cost_ceiling_per_call_usd: 0.05
"#
    )
}

/// Runs until Ctrl-C.
pub async fn run(args: UpArgs) -> ExitCode {
    let token = match router_proto::token::from_env("ROUTER_TOKEN") {
        Ok(t) => t,
        Err(e) => {
            eprintln!("routerctl up: {e}");
            return ExitCode::from(2);
        }
    };
    // The proxy reads the same variables (its settings).
    let guards = match router_policy::Guards::from_lookup(|k| std::env::var(k).ok()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("routerctl up: {e}");
            return ExitCode::from(2);
        }
    };
    let options = ControlPlaneOptions {
        listen: args.grpc,
        store: router_control_plane::StoreLocation::Embedded(args.data_dir.join("control-plane")),
        token: token.clone(),
        tls: None,
        guards,
        console: router_control_plane::ConsoleOptions {
            listen: args.console_listen.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let started = match start(options.clone()).await {
        // The console's port is taken (another `up`): go on without it.
        Err(router_control_plane::StartError::Bind(addr, e))
            if Some(addr) == args.console_listen.0 =>
        {
            eprintln!(
                "routerctl up: the console cannot listen on {addr} ({e}); going on without it \
                 (--console-listen ADDR to choose another address)"
            );
            start(ControlPlaneOptions {
                console: router_control_plane::ConsoleOptions::default(),
                ..options
            })
            .await
        }
        other => other,
    };
    let cp = match started {
        Ok(cp) => cp,
        Err(router_control_plane::StartError::ConsoleInsecure(addr)) => {
            eprintln!(
                "routerctl up: --console-listen {addr} is not a loopback address: the console \
                 would serve sessions in clear (keep the default 127.0.0.1:50052, or `off`)"
            );
            return ExitCode::from(2);
        }
        Err(router_control_plane::StartError::Insecure(addr)) => {
            eprintln!(
                "routerctl up: --grpc {addr} is not a loopback address: set ROUTER_TOKEN so the \
                 control plane requires it (or keep the default 127.0.0.1)"
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("routerctl up: control plane: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut mocks = Vec::new();
    // A policy the user applied before (not the demo) is kept.
    let kept = cp.hub().policy(0).filter(|p| {
        router_policy::document::PolicyDocument::parse(&p.document)
            .is_ok_and(|d| d.metadata.name != DEMO_NAME)
    });
    let document = match (&args.file, kept) {
        (Some(path), _) => match std::fs::read_to_string(path) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("routerctl up: cannot read {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        },
        (None, Some(kept)) if !args.reset => {
            eprintln!(
                "routerctl up: keeping policy version {} from {} (--reset applies the demo instead)",
                kept.version,
                args.data_dir.display()
            );
            None
        }
        (None, _) => {
            let local = MockModel::start(MockConfig {
                name: "local-gpu".into(),
                latency: Duration::from_millis(40),
                max_concurrency: Some(4),
                ..MockConfig::default()
            })
            .await;
            let cloud = MockModel::start(MockConfig {
                name: "cloud".into(),
                latency: Duration::from_millis(300),
                ..MockConfig::default()
            })
            .await;
            match (local, cloud) {
                (Ok(l), Ok(c)) => {
                    let doc = demo_policy(&l.url(), &c.url());
                    mocks.push(l);
                    mocks.push(c);
                    Some(doc)
                }
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("routerctl up: demo endpoints: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    if let Some(document) = document {
        match cp
            .hub()
            .apply_policy(&document, false, 0, "routerctl up")
            .await
        {
            Ok((version, _)) => tracing::info!(version, "policy applied"),
            Err(e) => {
                eprintln!("routerctl up: the policy was refused: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("routerctl up: {e}");
            return ExitCode::from(2);
        }
    };
    settings.bind = args.bind;
    settings.port = args.port;
    let proxy = match router_proxy::start(ProxyOptions {
        settings,
        mode: Mode::Managed(ManagedOptions {
            addrs: vec![format!("http://{}", cp.local_addr())],
            token,
            node_id: "routerctl-up".into(),
            cache_dir: Some(args.data_dir.join("proxy-cache")),
            ca_pem: None,
            heartbeat: router_proxy::managed::HEARTBEAT,
        }),
        route_log: Box::new(BufWriter::new(std::io::stdout())),
    })
    .await
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("routerctl up: proxy: {e}");
            return ExitCode::FAILURE;
        }
    };
    let proxy_addr = proxy.local_addr();
    eprintln!();
    eprintln!("router is up");
    eprintln!("  proxy:         http://{proxy_addr}   (route decisions: one JSON line per request on stdout)");
    eprintln!(
        "  control plane: http://{}   (data: {})",
        cp.local_addr(),
        args.data_dir.display()
    );
    eprintln!("  admin API:     {}", proxy.admin_access());
    if let Some(url) = cp.console_url() {
        eprintln!("  console:       {url}");
        if let Some(link) = cp.console_signin_link() {
            eprintln!("                 sign in (once, within 5 minutes): {link}");
        }
    }
    if !mocks.is_empty() {
        eprintln!("  demo endpoints: local-gpu (40 ms, 4 at a time) then cloud (300 ms)");
    }
    eprintln!();
    eprintln!("try:");
    eprintln!(
        "  curl -s http://{proxy_addr}/v1/chat/completions -H 'content-type: application/json' \\\n       -d '{{\"model\":\"demo\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'"
    );
    eprintln!("  curl -s http://{proxy_addr}/_custom_router/health");
    eprintln!("  routerctl proxies list      routerctl policy history      routerctl policy get");
    eprintln!();
    // SIGTERM (`docker stop`, Kubernetes) or Ctrl-C: drain as
    // router-proxy does (health turns 503, requests in flight finish),
    // then stop the control plane and the demo endpoints.
    router_process::shutdown_signal().await;
    let timeout = crate::mock_cmd::DRAIN_TIMEOUT;
    eprintln!(
        "routerctl up: draining: finishing requests in flight (at most {} s)",
        timeout.as_secs()
    );
    if !proxy.drain(timeout).await {
        eprintln!("routerctl up: drain timed out; closed the remaining connections");
    }
    cp.shutdown().await;
    for mock in mocks {
        mock.drain(Duration::from_secs(1)).await;
    }
    eprintln!("routerctl up: stopped");
    ExitCode::SUCCESS
}

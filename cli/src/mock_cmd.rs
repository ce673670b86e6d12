//! `routerctl mock`: runs one mock OpenAI-compatible model endpoint on
//! `127.0.0.1:PORT` (or `--bind ADDR`) until Ctrl-C, for trying the router
//! by hand and for the compose files' demo endpoints.

use crate::error::CliError;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use router_mock::{Behavior, MockConfig, MockModel, OverCap};

/// Runs a mock OpenAI-compatible model endpoint until Ctrl-C or SIGTERM
/// (then drains: the answers in flight finish).
#[derive(Args, Debug)]
pub struct MockArgs {
    /// Port to listen on.
    #[arg(long, default_value_t = 8001)]
    port: u16,
    /// Address to listen on (`0.0.0.0` to be reachable from other containers).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    bind: IpAddr,
    /// Name echoed in `x-mock-name` and `served_by`.
    #[arg(long, default_value = "mock")]
    name: String,
    /// Service time of each request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Requests served at once (unlimited when absent).
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// What happens past --max-concurrency.
    #[arg(long, value_enum, default_value_t = OverCapArg::Queue)]
    over_cap: OverCapArg,
    /// chat (the default: answers the request it reads, text or a tool
    /// call, plain or streamed as asked; embeddings too) | json (one fixed
    /// chat completion) | anthropic (chat's answers in Anthropic's Messages
    /// dialect) | gemini (the same, in Gemini's generateContent dialect) | sse | hang | status:<code> | malformed |
    /// redirect:<url> | engine (a simulated vLLM engine: continuous
    /// batching, a KV cache with prefix caching, vLLM's /metrics;
    /// docs/simulator.md)
    #[arg(long, default_value = "chat", value_parser = parse_behavior)]
    behavior: BehaviorArg,
    /// SSE events per answer (with --behavior sse).
    #[arg(long, default_value_t = 5)]
    sse_chunks: usize,
    /// Pause between SSE events, in milliseconds (with --behavior sse).
    #[arg(long, default_value_t = 50)]
    sse_interval_ms: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OverCapArg {
    /// Wait for a slot.
    Queue,
    /// Answer 429 with Retry-After at once.
    Reject429,
}

/// `--behavior` as parsed; `sse` is completed by the `--sse-*` flags.
#[derive(Clone, Debug)]
enum BehaviorArg {
    Sse,
    Other(Behavior),
}

fn parse_behavior(text: &str) -> Result<BehaviorArg, CliError> {
    let behavior = match text {
        "json" => Behavior::Json,
        "chat" => Behavior::Chat,
        "anthropic" => Behavior::Anthropic,
        "gemini" => Behavior::Gemini,
        "sse" => return Ok(BehaviorArg::Sse),
        "hang" => Behavior::Hang,
        "malformed" => Behavior::MalformedJson,
        "engine" => Behavior::Engine(router_mock::engine::EngineConfig::default()),
        _ => {
            if let Some(code) = text.strip_prefix("status:") {
                let code = code
                    .parse::<u16>()
                    .ok()
                    .filter(|code| (100..=999).contains(code))
                    .ok_or_else(|| CliError::Value {
                        expected: "status:<code>, an HTTP status code",
                        reason: Some(format!("{code:?} is not one")),
                    })?;
                Behavior::Status(code)
            } else if let Some(url) = text.strip_prefix("redirect:") {
                Behavior::Redirect(url.to_owned())
            } else {
                return Err(CliError::Value {
                    expected: "json, chat, anthropic, gemini, sse, hang, status:<code>, malformed, redirect:<url> or engine",
                    reason: None,
                });
            }
        }
    };
    Ok(BehaviorArg::Other(behavior))
}

/// Runs the mock until Ctrl-C.
pub async fn run(args: MockArgs) -> ExitCode {
    let behavior = match args.behavior {
        BehaviorArg::Sse => Behavior::Sse {
            chunks: args.sse_chunks,
            interval: Duration::from_millis(args.sse_interval_ms),
        },
        BehaviorArg::Other(behavior) => behavior,
    };
    let config = MockConfig {
        name: args.name,
        latency: Duration::from_millis(args.latency_ms),
        max_concurrency: args.max_concurrency,
        over_cap: match args.over_cap {
            OverCapArg::Queue => OverCap::Queue,
            OverCapArg::Reject429 => OverCap::Reject429,
        },
        behavior,
    };
    let addr = SocketAddr::new(args.bind, args.port);
    let mock = match MockModel::start_on(addr, config).await {
        Ok(mock) => mock,
        Err(error) => {
            eprintln!("routerctl mock: cannot start on {addr}: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("mock {} listening on {}", mock.name(), mock.url());
    // SIGTERM (`docker stop`, Kubernetes) or Ctrl-C: answer what is being
    // answered, then exit, as the proxy does.
    router_process::shutdown_signal().await;
    eprintln!(
        "routerctl mock: draining: finishing the answers in flight (at most {} s)",
        DRAIN_TIMEOUT.as_secs()
    );
    if !mock.drain(DRAIN_TIMEOUT).await {
        eprintln!("routerctl mock: drain timed out; closed the remaining connections");
    }
    ExitCode::SUCCESS
}

/// How long a stopping mock (or `routerctl up`) waits for answers in flight.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

//! `routerctl`: the LLM router's command line.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use routerctl::drill::{self, DrillConfig, Scenario};
use routerctl::mock_cmd::{self, MockArgs};
use routerctl::policy_cmd::{self, Output};

/// The LLM router's command line.
#[derive(Parser, Debug)]
#[command(name = "routerctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay the fallback drill and print a verdict per scenario.
    Drill(DrillArgs),
    /// Run a mock OpenAI-compatible model endpoint until Ctrl-C.
    Mock(MockArgs),
    /// Policy documents.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Routes.
    #[command(subcommand)]
    Route(RouteCommand),
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Check a policy file offline; every error with its field path.
    Validate {
        /// The policy file (YAML or JSON).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// table | json
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Subcommand, Debug)]
enum RouteCommand {
    /// Where would this situation (JSON on stdin) go, and why?
    Explain {
        /// Decide offline with this policy file instead of asking a router.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// The router to ask.
        #[arg(long, env = "ROUTERCTL_SERVER")]
        server: Option<String>,
        /// Bearer token for the router's admin calls.
        #[arg(long, env = "ROUTER_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// table | json | yaml
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// Flags of `routerctl drill`.
#[derive(Args, Debug)]
struct DrillArgs {
    /// baseline | baseline-long-attempt | fallback-degraded | primary-hang | drain | all
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Print the reports as JSON.
    #[arg(long)]
    json: bool,
    /// Send the load to this running router instead of a built-in one
    /// (route it to the mocks on --primary-port and --fallback-port; see --print-policy).
    #[arg(long, value_name = "URL")]
    target: Option<String>,
    /// Print the drill's policy for a router under --target, then exit.
    #[arg(long)]
    print_policy: bool,
    /// Port of the primary mock (0: any; 8001 with --target).
    #[arg(long)]
    primary_port: Option<u16>,
    /// Port of the fallback mock (0: any; 8002 with --target).
    #[arg(long)]
    fallback_port: Option<u16>,
    /// Requests per second.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Requests per scenario.
    #[arg(long, default_value_t = 40)]
    count: usize,
    /// Primary service time, ms.
    #[arg(long, default_value_t = 6000)]
    primary_ms: u64,
    /// Primary concurrency cap.
    #[arg(long, default_value_t = 2)]
    primary_cap: usize,
    /// Fallback service time, ms.
    #[arg(long, default_value_t = 400)]
    fallback_ms: u64,
    /// Fallback service time in fallback-degraded, ms.
    #[arg(long, default_value_t = 7000)]
    degraded_fallback_ms: u64,
    /// Request deadline, ms.
    #[arg(long, default_value_t = 8000)]
    deadline_ms: u64,
    /// Primary attempt timeout, ms.
    #[arg(long, default_value_t = 3000)]
    primary_attempt_ms: u64,
    /// Divide every duration by this (and multiply the rate).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("routerctl: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Mock(args) => runtime.block_on(mock_cmd::run(args)),
        Command::Drill(args) => runtime.block_on(run_drill(args)),
        Command::Policy(PolicyCommand::Validate { file, output }) => {
            policy_cmd::validate(&file, output)
        }
        Command::Route(RouteCommand::Explain {
            file,
            server,
            token,
            output,
        }) => runtime.block_on(policy_cmd::explain_cmd(
            file.as_deref(),
            server.as_deref(),
            token.as_deref(),
            output,
        )),
    }
}

async fn run_drill(args: DrillArgs) -> ExitCode {
    let scenarios: Vec<Scenario> = if args.scenario == "all" {
        Scenario::ALL.to_vec()
    } else {
        match Scenario::parse(&args.scenario) {
            Some(s) => vec![s],
            None => {
                eprintln!(
                    "routerctl drill: unknown scenario {:?} (baseline, baseline-long-attempt, fallback-degraded, primary-hang, drain, all)",
                    args.scenario
                );
                return ExitCode::from(2);
            }
        }
    };
    if !(args.rate > 0.0 && args.rate.is_finite()) || args.count == 0 || args.time_scale < 1.0 {
        eprintln!(
            "routerctl drill: --rate must be positive, --count at least 1, --time-scale at least 1"
        );
        return ExitCode::from(2);
    }
    let default_port =
        |p: Option<u16>, d: u16| p.unwrap_or(if args.target.is_some() { d } else { 0 });
    let cfg = DrillConfig {
        rate: args.rate,
        count: args.count,
        primary_service: Duration::from_millis(args.primary_ms),
        primary_cap: args.primary_cap.max(1),
        fallback_service: Duration::from_millis(args.fallback_ms),
        degraded_fallback_service: Duration::from_millis(args.degraded_fallback_ms),
        deadline: Duration::from_millis(args.deadline_ms.max(1)),
        primary_attempt: Duration::from_millis(args.primary_attempt_ms.max(1)),
        target: args.target.clone(),
        primary_port: default_port(args.primary_port, 8001),
        fallback_port: default_port(args.fallback_port, 8002),
        ..DrillConfig::default()
    }
    .scaled(args.time_scale);
    if args.print_policy {
        let p = format!("http://127.0.0.1:{}", cfg.primary_port);
        let f = format!("http://127.0.0.1:{}", cfg.fallback_port);
        print!(
            "{}",
            drill::drill_policy(&cfg, &p, &f, cfg.primary_attempt, false)
        );
        return ExitCode::SUCCESS;
    }
    let reports = match drill::run_all(&scenarios, &cfg).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("routerctl drill: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&reports) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("routerctl drill: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", drill::render_table(&reports));
    }
    if reports.iter().all(|r| r.pass) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

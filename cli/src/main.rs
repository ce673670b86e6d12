//! `routerctl`: the LLM router's command line.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use routerctl::admin_cmd;
use routerctl::approve_cmd::{self, ApproveArgs};
use routerctl::connection_flags;
use routerctl::drill::{self, DrillConfig, Scenario};
use routerctl::mock_cmd::{self, MockArgs};
use routerctl::policy_cmd::{self, Output};
use routerctl::tasks_cmd;
use routerctl::up::{self, UpArgs};

/// `routerctl -h`'s first line.
const ABOUT: &str =
    "The LLM router's command line: run it, operate it, drill it, mock its backends.";

/// `routerctl --help`'s description: what each group of commands is for.
const LONG_ABOUT: &str = "The LLM router's command line.

  up            the control plane and a proxy in one process (demo endpoints
                when no policy is given)
  policy, backends, circuits, cache, proxies, tenants, tasks, rollout,
  route explain operate a running control plane (--server, --token, -o:
                before or after the group's name)
  policy validate, route explain -f FILE
                offline: check a policy, explain a routing decision
  approve       offline: sign an approval for one request on one route
  drill         replay the fallback drill and print a verdict per scenario
  mock          run a mock OpenAI-compatible model endpoint";

/// The LLM router's command line.
#[derive(Parser, Debug)]
#[command(name = "routerctl", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How to reach the control plane: the flags of the commands that call it
/// (and only of those).
#[derive(Args, Debug)]
struct Connection {
    /// The control plane (`http://host:port`, `https://` for TLS).
    #[arg(
        long,
        global = true,
        env = "ROUTERCTL_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    server: String,
    /// Bearer token for the control plane.
    #[arg(long, global = true, env = "ROUTER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A CA (PEM) to trust for an `https://` control plane.
    #[arg(long, global = true, env = "ROUTERCTL_CA_FILE")]
    ca_file: Option<PathBuf>,
}

/// How to print: the flag of the commands that print data.
#[derive(Args, Debug)]
struct Printing {
    /// Output: table | json | yaml.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// A group of control-plane commands: its connection and output flags,
/// then the command.
#[derive(Args, Debug)]
struct Group<C: Subcommand> {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    printing: Printing,
    #[command(subcommand)]
    command: C,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the control plane (embedded store) and one proxy in this process.
    Up(UpArgs),
    /// Replay the fallback drill and print a verdict per scenario.
    Drill(DrillArgs),
    /// Run a mock OpenAI-compatible model endpoint until Ctrl-C.
    Mock(MockArgs),
    /// Policy documents.
    Policy(Group<PolicyCommand>),
    /// Backend sets.
    Backends(Group<BackendsCommand>),
    /// Circuit overrides.
    Circuits(Group<CircuitsCommand>),
    /// The response cache.
    Cache(Group<CacheCommand>),
    /// Connected proxies.
    Proxies(Group<ProxiesCommand>),
    /// Ramps (a split's new side moved up step by step).
    Rollout(Group<RolloutCommand>),
    /// Routes.
    Route(Group<RouteCommand>),
    /// Tenants (who may call).
    Tenants(Group<TenantsCommand>),
    /// Parked tasks (routes with on_all_down: park).
    Tasks(Group<TasksCommand>),
    /// Sign an approval for one request on one route (prints the
    /// X-Router-Approval token; the key from --key-file or
    /// CUSTOM_ROUTER_APPROVAL_KEY).
    Approve(ApproveArgs),
}

/// The connection flags of a group's offline command (`policy validate`):
/// accepted, as a script may pass them to every command of its group, but
/// not shown in its help, since it does not use them. Same ids as
/// [`Connection`]'s, so that the group's global flags are not added to it
/// a second time, shown.
#[derive(Args, Debug)]
struct Unused {
    #[arg(id = "server", long = "server", hide = true)]
    _server: Option<String>,
    #[arg(id = "token", long = "token", hide = true)]
    _token: Option<String>,
    #[arg(id = "ca_file", long = "ca-file", hide = true)]
    _ca_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Check a policy file offline; every error with its field path.
    Validate {
        /// The policy file (YAML or JSON).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[command(flatten)]
        _unused: Unused,
    },
    /// Validate and apply a policy on the control plane.
    Apply {
        /// The policy file.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Only validate on the control plane.
        #[arg(long)]
        dry_run: bool,
        /// Refuse unless this is the current version (compare-and-swap;
        /// 0: no check).
        #[arg(long, default_value_t = 0)]
        expected_version: u64,
        /// Why: kept with the version and shown by `policy history`.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Print the current (or a given) version.
    Get {
        /// Version (0: the current one).
        #[arg(long, default_value_t = 0)]
        version: u64,
    },
    /// Compare a file with the applied policy (`-f FILE`), or version A
    /// with version B (`diff A [B]`, B default: the current one): exit 0
    /// same meaning, 1 different.
    Diff {
        /// The policy file.
        #[arg(short = 'f', long = "file", conflicts_with = "versions")]
        file: Option<PathBuf>,
        /// Versions A and B.
        #[arg(num_args = 0..=2, required_unless_present = "file")]
        versions: Vec<u64>,
    },
    /// Every applied version.
    History,
    /// Make an earlier version current again.
    Rollback {
        /// Version to go back to (0: the one before the current).
        #[arg(long, default_value_t = 0)]
        to: u64,
        /// Refuse unless this is the current version (0: no check).
        #[arg(long, default_value_t = 0)]
        expected_version: u64,
        /// Why: kept with the new version and shown by `policy history`.
        #[arg(long, default_value = "")]
        note: String,
    },
}

#[derive(Subcommand, Debug)]
enum BackendsCommand {
    /// Backend sets by pool.
    List,
    /// Replace a pool's endpoints.
    Set {
        /// Pool.
        pool: String,
        /// Endpoints (`host:port` or URLs).
        #[arg(required = true)]
        addrs: Vec<String>,
    },
    /// Drain one endpoint: no new requests, in-flight ones finish.
    Drain {
        /// Pool.
        pool: String,
        /// Endpoint.
        addr: String,
    },
}

#[derive(Subcommand, Debug)]
enum CircuitsCommand {
    /// Overrides in force (operators' and proxies' reports).
    List,
    /// Force a circuit open (the whole pool without ADDR).
    Open {
        /// Pool.
        pool: String,
        /// Endpoint.
        addr: Option<String>,
        /// How long (e.g. 30s, 10m); default 5m.
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
    },
    /// Clear overrides (or force closed for a while with --for).
    Close {
        /// Pool.
        pool: String,
        /// Endpoint.
        addr: Option<String>,
        /// Force closed for this long.
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
    },
}

#[derive(Subcommand, Debug)]
enum CacheCommand {
    /// Drop a route's cached answers (every caller's, or one tenant's) on
    /// every proxy and in the shared store.
    Purge {
        /// The route.
        #[arg(long)]
        route: String,
        /// Only this tenant's entries (a route partitioned by tenant).
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum TenantsCommand {
    /// The applied policy's tenants and their limits.
    List,
    /// A tenant's spend today and this month, and its reservations in
    /// flight (the control plane reads the proxies' shared store).
    Usage {
        /// The tenant's name.
        name: String,
    },
    /// Tenants' keys, kept in the control plane beside the policy:
    /// create (printed once), list, revoke.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// The old spelling of `keys create NAME`: mint a key for a tenant of
    /// the applied policy, store its hash, and print the key once.
    AddKey {
        /// The tenant's name.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum KeysCommand {
    /// Mint a key for a tenant of the applied policy and print it once
    /// (only its hash is stored; proxies take it with their next snapshot).
    Create {
        /// The tenant's name.
        tenant: String,
        /// A name for the key, to recognise it in `keys list`.
        #[arg(long, default_value = "")]
        name: String,
        /// Stop working after this long (e.g. 30d, 12h); default: never.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires: Option<Duration>,
    },
    /// The stored keys (of one tenant, or all): id, name, prefix, created,
    /// expires, last used. Keys written in the policy are not listed.
    List {
        /// Only this tenant's.
        tenant: Option<String>,
    },
    /// Revoke a stored key: every proxy refuses it from its next snapshot.
    Revoke {
        /// The key's id (`key-...`, from `keys list`).
        id: String,
    },
}

#[derive(Subcommand, Debug)]
enum TasksCommand {
    /// The live parked tasks, oldest first.
    List {
        /// Only tasks in this state (waiting_capacity, waiting_approval, running).
        #[arg(long)]
        state: Option<String>,
        /// Only tasks of this route.
        #[arg(long)]
        route: Option<String>,
    },
    /// One task (also ended ones, while they are kept).
    Show {
        /// The task's id.
        id: String,
    },
    /// Approve a SEND/DESTRUCTIVE task: it runs once a pool of its route can take it.
    Approve {
        /// The task's id.
        id: String,
        /// Who approves (kept with the task).
        #[arg(long)]
        operator: Option<String>,
    },
    /// Drop a live task: it never runs.
    Drop {
        /// The task's id.
        id: String,
        /// Who drops it (kept with the task).
        #[arg(long)]
        operator: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum RolloutCommand {
    /// Each ramped split of the route: step, weight, window and verdict.
    Status {
        /// The route.
        route: String,
    },
    /// Keep the route's ramps from advancing (a rollback still happens).
    Pause {
        /// The route.
        route: String,
    },
    /// Let the route's ramps advance again.
    Resume {
        /// The route.
        route: String,
    },
    /// Set each new side's weight to 0 (a new policy version).
    Abort {
        /// The route.
        route: String,
    },
}

#[derive(Subcommand, Debug)]
enum ProxiesCommand {
    /// Each proxy: revision applied, ACK/NACK, last seen.
    List,
}

#[derive(Subcommand, Debug)]
enum RouteCommand {
    /// Where would this situation (JSON on stdin) go, and why?
    Explain {
        /// Decide offline with this policy file instead of asking the control plane.
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
    },
}

/// Flags of `routerctl drill`.
#[derive(Args, Debug)]
struct DrillArgs {
    /// baseline | baseline-long-attempt | fallback-degraded | primary-hang | drain |
    /// stream-first-token | stream-stall | stream-error | all-down | all
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
    /// Start this many proxies sharing --shared-store; each request's
    /// client retries go round robin over them (same Idempotency-Key).
    #[arg(long, default_value_t = 1)]
    proxies: usize,
    /// The proxies' shared store (redis://HOST:PORT[/DB]), needed with
    /// --proxies above 1.
    #[arg(long, value_name = "URL")]
    shared_store: Option<String>,
    /// With several proxies: how long the client waits before retrying on
    /// the next one, ms (default: a third of the deadline).
    #[arg(long)]
    client_timeout_ms: Option<u64>,
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
    // Connection flags before a group's name go after it (see
    // `connection_flags`): the earlier interface's spelling.
    let cli = Cli::parse_from(connection_flags::hoist(std::env::args_os().collect()));
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
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Up(args) => {
            router_process::init_logs();
            up::run(args).await
        }
        Command::Mock(args) => mock_cmd::run(args).await,
        Command::Approve(args) => approve_cmd::run(&args),
        Command::Drill(args) => run_drill(args).await,
        Command::Policy(g) => {
            let output = g.printing.output;
            match g.command {
                PolicyCommand::Validate { file, .. } => policy_cmd::validate(&file, output),
                command => {
                    let mut admin = match connect(&g.connection).await {
                        Ok(a) => a,
                        Err(code) => return code,
                    };
                    policy(&mut admin, command, output).await
                }
            }
        }
        Command::Route(g) => {
            let output = g.printing.output;
            match g.command {
                RouteCommand::Explain { file: Some(file) } => {
                    policy_cmd::explain_cmd(Some(&file), output).await
                }
                RouteCommand::Explain { file: None } => {
                    let mut input = String::new();
                    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)
                    {
                        eprintln!("routerctl: cannot read the situation from stdin: {e}");
                        return ExitCode::from(2);
                    }
                    let mut admin = match connect(&g.connection).await {
                        Ok(a) => a,
                        Err(code) => return code,
                    };
                    match admin_cmd::explain(&mut admin, input).await {
                        Ok(json) => policy_cmd::print_explanation_json(&json, output),
                        Err(e) => {
                            eprintln!("routerctl: {e}");
                            ExitCode::FAILURE
                        }
                    }
                }
            }
        }
        Command::Backends(g) => {
            let mut admin = match connect(&g.connection).await {
                Ok(a) => a,
                Err(code) => return code,
            };
            match g.command {
                BackendsCommand::List => {
                    admin_cmd::backends_list(&mut admin, g.printing.output).await
                }
                BackendsCommand::Set { pool, addrs } => {
                    admin_cmd::backends_set(&mut admin, &pool, addrs).await
                }
                BackendsCommand::Drain { pool, addr } => {
                    admin_cmd::backends_drain(&mut admin, &pool, &addr).await
                }
            }
        }
        Command::Circuits(g) => {
            let mut admin = match connect(&g.connection).await {
                Ok(a) => a,
                Err(code) => return code,
            };
            match g.command {
                CircuitsCommand::List => {
                    admin_cmd::circuits_list(&mut admin, g.printing.output).await
                }
                CircuitsCommand::Open {
                    pool,
                    addr,
                    duration,
                } => {
                    let secs = duration.map_or(0, |d| d.as_secs().max(1));
                    admin_cmd::circuits_set(&mut admin, &pool, addr.as_deref(), true, secs).await
                }
                CircuitsCommand::Close {
                    pool,
                    addr,
                    duration,
                } => {
                    let secs = duration.map_or(0, |d| d.as_secs().max(1));
                    admin_cmd::circuits_set(&mut admin, &pool, addr.as_deref(), false, secs).await
                }
            }
        }
        Command::Cache(g) => {
            let mut admin = match connect(&g.connection).await {
                Ok(a) => a,
                Err(code) => return code,
            };
            match g.command {
                CacheCommand::Purge { route, tenant } => {
                    routerctl::cache_cmd::cache_purge(
                        &mut admin,
                        &route,
                        tenant.as_deref(),
                        g.printing.output,
                    )
                    .await
                }
            }
        }
        Command::Rollout(g) => {
            let mut admin = match connect(&g.connection).await {
                Ok(a) => a,
                Err(code) => return code,
            };
            let (action, route) = match g.command {
                RolloutCommand::Status { route } => ("status", route),
                RolloutCommand::Pause { route } => ("pause", route),
                RolloutCommand::Resume { route } => ("resume", route),
                RolloutCommand::Abort { route } => ("abort", route),
            };
            routerctl::rollout_cmd::rollout(&mut admin, action, &route, g.printing.output).await
        }
        Command::Proxies(g) => {
            let mut admin = match connect(&g.connection).await {
                Ok(a) => a,
                Err(code) => return code,
            };
            match g.command {
                ProxiesCommand::List => {
                    admin_cmd::proxies_list(&mut admin, g.printing.output).await
                }
            }
        }
        Command::Tenants(g) => {
            let mut admin = match connect(&g.connection).await {
                Ok(a) => a,
                Err(code) => return code,
            };
            match g.command {
                TenantsCommand::AddKey { name } => {
                    admin_cmd::tenant_add_key(&mut admin, &name).await
                }
                TenantsCommand::Keys { command } => match command {
                    KeysCommand::Create {
                        tenant,
                        name,
                        expires,
                    } => {
                        routerctl::keys_cmd::create(
                            &mut admin,
                            &tenant,
                            &name,
                            expires,
                            g.printing.output,
                        )
                        .await
                    }
                    KeysCommand::List { tenant } => {
                        routerctl::keys_cmd::list(
                            &mut admin,
                            tenant.as_deref().unwrap_or(""),
                            g.printing.output,
                        )
                        .await
                    }
                    KeysCommand::Revoke { id } => {
                        routerctl::keys_cmd::revoke(&mut admin, &id, g.printing.output).await
                    }
                },
                TenantsCommand::List => {
                    admin_cmd::tenants_list(&mut admin, g.printing.output).await
                }
                TenantsCommand::Usage { name } => {
                    admin_cmd::tenant_usage(&mut admin, &name, g.printing.output).await
                }
            }
        }
        Command::Tasks(g) => {
            let mut admin = match connect(&g.connection).await {
                Ok(a) => a,
                Err(code) => return code,
            };
            let output = g.printing.output;
            match g.command {
                TasksCommand::List { state, route } => {
                    let (state, route) = (state.unwrap_or_default(), route.unwrap_or_default());
                    tasks_cmd::list(&mut admin, &state, &route, output).await
                }
                TasksCommand::Show { id } => tasks_cmd::show(&mut admin, &id, output).await,
                TasksCommand::Approve { id, operator } => {
                    let op = operator.unwrap_or_default();
                    tasks_cmd::act(&mut admin, tasks_cmd::Action::Approve, &id, &op, output).await
                }
                TasksCommand::Drop { id, operator } => {
                    let op = operator.unwrap_or_default();
                    tasks_cmd::act(&mut admin, tasks_cmd::Action::Drop, &id, &op, output).await
                }
            }
        }
    }
}

/// An admin client for `connection`; the exit code when it cannot be had.
async fn connect(connection: &Connection) -> Result<admin_cmd::Admin, ExitCode> {
    let ca_pem = match &connection.ca_file {
        None => None,
        Some(p) => match std::fs::read_to_string(p) {
            Ok(pem) => Some(pem),
            Err(e) => {
                eprintln!("routerctl: cannot read --ca-file {}: {e}", p.display());
                return Err(ExitCode::from(2));
            }
        },
    };
    admin_cmd::connect(
        &connection.server,
        connection.token.clone(),
        ca_pem.as_deref(),
    )
    .await
    .map_err(|e| {
        eprintln!("routerctl: {e}");
        ExitCode::FAILURE
    })
}

/// The `policy` commands that call the control plane.
async fn policy(admin: &mut admin_cmd::Admin, command: PolicyCommand, output: Output) -> ExitCode {
    match command {
        PolicyCommand::Apply {
            file,
            dry_run,
            expected_version,
            note,
        } => admin_cmd::apply_noted(admin, &file, dry_run, expected_version, &note, output).await,
        PolicyCommand::Get { version } => admin_cmd::get(admin, version, output).await,
        PolicyCommand::Diff { file, versions } => match (file, versions.as_slice()) {
            (Some(file), _) => admin_cmd::diff(admin, &file).await,
            (None, [a]) => admin_cmd::diff_versions(admin, *a, 0).await,
            (None, [a, b]) => admin_cmd::diff_versions(admin, *a, *b).await,
            (None, _) => admin_cmd::fail("policy diff: give -f FILE, or versions A [B]"),
        },
        PolicyCommand::History => admin_cmd::history(admin, output).await,
        PolicyCommand::Rollback {
            to,
            expected_version,
            note,
        } => admin_cmd::rollback_noted(admin, to, expected_version, &note).await,
        PolicyCommand::Validate { file, .. } => policy_cmd::validate(&file, output),
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
                    "routerctl drill: unknown scenario {:?} (baseline, baseline-long-attempt, fallback-degraded, primary-hang, drain, stream-first-token, stream-stall, stream-error, all-down, all)",
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
        proxies: args.proxies.max(1),
        shared_store: args.shared_store.clone(),
        client_timeout: args.client_timeout_ms.map(Duration::from_millis),
        ..DrillConfig::default()
    }
    .scaled(args.time_scale);
    // A single scenario: its policy is printed, and a router under
    // --target is taken to run it.
    let single = (scenarios.len() == 1).then(|| scenarios[0]);
    if args.print_policy {
        let scenario = single.unwrap_or(Scenario::Baseline);
        if single.is_none() {
            eprintln!(
                "routerctl drill: the policy of every scenario but baseline-long-attempt \
                 (--print-policy --scenario baseline-long-attempt for that one)"
            );
        }
        print!("{}", drill::target_policy(scenario, &cfg));
        return ExitCode::SUCCESS;
    }
    let cfg = drill::DrillConfig {
        target_scenario: single,
        ..cfg
    };
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

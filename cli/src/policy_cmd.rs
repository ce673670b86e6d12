//! `routerctl policy validate` and `routerctl route explain`.
//!
//! Both validate against the guards of this shell's environment
//! (`CUSTOM_ROUTER_API_KEY_ENV_ALLOW`, `CUSTOM_ROUTER_ALLOW_BACKEND_HOSTS`),
//! as a proxy started from it would.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use router_policy::decide::{check_situation, explain, Explanation, Situation};
use router_policy::{Guards, Policy, QueueSettings};

use crate::error::CliError;

/// The guards of this environment, as a proxy would read them.
fn guards() -> Result<Guards, CliError> {
    Ok(Guards::from_lookup(|k| std::env::var(k).ok())?)
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Human-readable.
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

fn read_policy(path: &Path) -> Result<Policy, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Read {
        what: "",
        path: path.to_owned(),
        source,
    })?;
    let guards = guards()?;
    router_policy::document::load_with(&text, &QueueSettings::default(), &guards).map_err(
        |source| CliError::InvalidPolicyFile {
            path: path.to_owned(),
            source,
        },
    )
}

/// `routerctl policy validate -f FILE`: exit 0 when valid, 1 with every
/// error otherwise.
pub fn validate(path: &Path, output: Output) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("routerctl: cannot read {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let guards = match guards() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("routerctl: {e}");
            return ExitCode::from(2);
        }
    };
    let result = router_policy::document::load_with(&text, &QueueSettings::default(), &guards);
    match (result, output) {
        (Ok(p), Output::Table) => {
            println!(
                "{}: valid ({}, {})",
                path.display(),
                count(p.pools.len(), "pool"),
                count(p.routes.len(), "route")
            );
            ExitCode::SUCCESS
        }
        (Ok(_), _) => {
            println!("{}", serde_json::json!({"valid": true, "errors": []}));
            ExitCode::SUCCESS
        }
        (Err(e), Output::Table) => {
            eprintln!(
                "{}: invalid policy ({})",
                path.display(),
                count(e.errors.len(), "error")
            );
            for f in &e.errors {
                eprintln!("  {}: {}", f.field, f.reason);
            }
            ExitCode::from(1)
        }
        (Err(e), Output::Json | Output::Yaml) => {
            println!(
                "{}",
                serde_json::json!({"valid": false, "errors": e.errors})
            );
            ExitCode::from(1)
        }
    }
}

fn print_explanation(e: &Explanation, output: Output) {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(e).unwrap_or_default()),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(e).unwrap_or_default()),
        Output::Table => {
            println!("pool:              {}", e.pool.as_deref().unwrap_or("-"));
            println!("model:             {}", e.model.as_deref().unwrap_or("-"));
            println!(
                "provider:          {}",
                e.provider.as_deref().unwrap_or("-")
            );
            println!("requires_approval: {}", e.requires_approval);
            println!("reason:            {}", e.reason);
            print_splits(&serde_json::to_value(&e.splits).unwrap_or_default());
            for s in &e.skipped {
                println!("skipped:           {}: {}", s.pool, s.why);
            }
            if let Some(b) = &e.balance {
                print_balance(&serde_json::to_value(b).unwrap_or_default());
            }
            if let Some(p) = &e.on_all_down {
                print_on_all_down(&serde_json::to_value(p).unwrap_or_default());
            }
        }
    }
}

/// A line per split of the route's chain: the side chosen and what on
/// (`split: new (weight 10 of 100, by request_id)`).
fn print_splits(splits: &serde_json::Value) {
    for s in splits.as_array().into_iter().flatten() {
        let key = s["key"].as_str().unwrap_or("?");
        let by = match (key, s["sticky_missing"] == true) {
            ("none", _) => "no key given: the heaviest side".to_string(),
            (key, true) => format!("by {key} (the sticky key is missing)"),
            (key, false) => format!("by {key}"),
        };
        println!(
            "split:             {} (weight {} of {}, {by})",
            s["pool"].as_str().unwrap_or("?"),
            s["weight"],
            s["total"]
        );
    }
}

/// A parking route's line: what happens when every pool is down.
fn print_on_all_down(p: &serde_json::Value) {
    println!(
        "on_all_down:       park as {} for up to {} s (at most {} tasks and {} bytes on the route); parks now: {}",
        p["state"].as_str().unwrap_or("?"),
        p["ttl_s"],
        p["max_tasks"],
        p["max_bytes"],
        if p["parks_now"] == true { "yes" } else { "no" }
    );
}

/// `routerctl route explain -f POLICY < situation.json`: offline.
pub async fn explain_cmd(policy: Option<&Path>, output: Output) -> ExitCode {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("routerctl: cannot read the situation from stdin: {e}");
        return ExitCode::from(2);
    }
    let situation: Situation = match serde_json::from_str(&input) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("routerctl: the situation is not valid: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(path) = policy else {
        eprintln!("routerctl: give -f POLICY");
        return ExitCode::from(2);
    };
    let policy = match read_policy(path) {
        Ok(p) => p,
        Err(e) => {
            eprint!("routerctl: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = check_situation(&policy, &situation) {
        eprintln!("routerctl: the situation is not valid: {e}");
        return ExitCode::from(2);
    }
    print_explanation(&explain(&policy, &situation), output);
    ExitCode::SUCCESS
}

/// Prints an explanation that came back from the control plane as JSON.
pub fn print_explanation_json(json: &str, output: Output) -> ExitCode {
    let v: serde_json::Value = match serde_json::from_str(json) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("routerctl: unexpected answer: {e}");
            return ExitCode::FAILURE;
        }
    };
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&v).unwrap_or_default()),
        Output::Table => {
            println!("pool:              {}", v["pool"].as_str().unwrap_or("-"));
            println!("model:             {}", v["model"].as_str().unwrap_or("-"));
            println!(
                "provider:          {}",
                v["provider"].as_str().unwrap_or("-")
            );
            println!("requires_approval: {}", v["requires_approval"]);
            println!("reason:            {}", v["reason"].as_str().unwrap_or(""));
            print_splits(&v["splits"]);
            if let Some(skipped) = v["skipped"].as_array() {
                for s in skipped {
                    println!(
                        "skipped:           {}: {}",
                        s["pool"].as_str().unwrap_or(""),
                        s["why"].as_str().unwrap_or("")
                    );
                }
            }
            if v["balance"].is_object() {
                print_balance(&v["balance"]);
            }
            if v["on_all_down"].is_object() {
                print_on_all_down(&v["on_all_down"]);
            }
        }
    }
    ExitCode::SUCCESS
}

/// The engine-aware part of an explanation: the endpoint, why, and the
/// signals of every endpoint.
fn print_balance(b: &serde_json::Value) {
    let opt = |v: &serde_json::Value| {
        if v.is_null() {
            "-".to_string()
        } else {
            v.to_string()
        }
    };
    println!(
        "balance:           {} -> {}",
        b["balance"].as_str().unwrap_or("-"),
        b["endpoint"].as_str().unwrap_or("(waits in the queue)")
    );
    println!("balance reason:    {}", b["why"].as_str().unwrap_or(""));
    if let Some(k) = b["prefix_key"].as_str() {
        println!("prefix key:        {k}");
    }
    if let Some(p) = b["placement"].as_str() {
        println!(
            "prefix placement:  {p} ({} blocks in the prompt)",
            opt(&b["prefix_blocks"])
        );
    }
    if let Some(r) = b["runner_up"].as_str() {
        println!(
            "runner-up:         {r} (expected TTFT {} s)",
            opt(&b["runner_up_ttft_s"])
        );
    }
    if let Some(signals) = b["signals"].as_array() {
        println!(
            "  {:<20} {:>9} {:>7} {:>7} {:>5} {:>5} {:>9} {:>13} {:>15} {:>7} {:>10}",
            "endpoint",
            "in_flight",
            "waiting",
            "running",
            "kv",
            "load",
            "saturated",
            "prefill s/tok",
            "pending prefill",
            "matched",
            "ttft s"
        );
        for s in signals {
            println!(
                "  {:<20} {:>9} {:>7} {:>7} {:>5} {:>5} {:>9} {:>13} {:>15} {:>7} {:>10}",
                s["addr"].as_str().unwrap_or(""),
                opt(&s["in_flight"]),
                opt(&s["waiting"]),
                opt(&s["running"]),
                opt(&s["kv_usage"]),
                opt(&s["estimated_load"]),
                opt(&s["saturated"]),
                opt(&s["prefill_s_per_token"]),
                opt(&s["pending_prefill_tokens"]),
                opt(&s["prefix_matched_blocks"]),
                opt(&s["expected_ttft_s"]),
            );
        }
    }
}

/// "1 pool", "2 pools".
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

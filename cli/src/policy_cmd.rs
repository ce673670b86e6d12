//! `routerctl policy validate` and `routerctl route explain`.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_policy::decide::{explain, Explanation, Situation};
use router_policy::document::PolicyDocument;
use router_policy::{Policy, QueueSettings};

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

fn read_policy(path: &Path) -> Result<Policy, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    PolicyDocument::parse(&text)
        .and_then(|d| d.validate(&QueueSettings::default()))
        .map_err(|e| {
            let mut out = format!("{}: invalid policy\n", path.display());
            for f in &e.errors {
                out.push_str(&format!("  {}: {}\n", f.field, f.reason));
            }
            out
        })
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
    let result = PolicyDocument::parse(&text).and_then(|d| d.validate(&QueueSettings::default()));
    match (result, output) {
        (Ok(p), Output::Table) => {
            println!(
                "{}: valid ({} pools, {} routes)",
                path.display(),
                p.pools.len(),
                p.routes.len()
            );
            ExitCode::SUCCESS
        }
        (Ok(_), _) => {
            println!("{}", serde_json::json!({"valid": true, "errors": []}));
            ExitCode::SUCCESS
        }
        (Err(e), Output::Table) => {
            eprintln!(
                "{}: invalid policy ({} errors)",
                path.display(),
                e.errors.len()
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
        Output::Json | Output::Yaml => {
            println!("{}", serde_json::to_string_pretty(e).unwrap_or_default());
        }
        Output::Table => {
            println!("pool:              {}", e.pool.as_deref().unwrap_or("-"));
            println!("model:             {}", e.model.as_deref().unwrap_or("-"));
            println!(
                "provider:          {}",
                e.provider.as_deref().unwrap_or("-")
            );
            println!("requires_approval: {}", e.requires_approval);
            println!("reason:            {}", e.reason);
            for s in &e.skipped {
                println!("skipped:           {}: {}", s.pool, s.why);
            }
        }
    }
}

/// `routerctl route explain [-f POLICY] < situation.json`: offline with a
/// policy file, else asks the router at `server`.
pub async fn explain_cmd(
    policy: Option<&Path>,
    server: Option<&str>,
    token: Option<&str>,
    output: Output,
) -> ExitCode {
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
    if let Some(path) = policy {
        let policy = match read_policy(path) {
            Ok(p) => p,
            Err(e) => {
                eprint!("routerctl: {e}");
                return ExitCode::from(1);
            }
        };
        print_explanation(&explain(&policy, &situation), output);
        return ExitCode::SUCCESS;
    }
    let Some(server) = server else {
        eprintln!(
            "routerctl: give -f POLICY, or --server URL (or ROUTERCTL_SERVER) of a running router"
        );
        return ExitCode::from(2);
    };
    let url = format!("{}/_custom_router/explain", server.trim_end_matches('/'));
    let mut req = http::Request::post(&url).header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = match req.body(Full::new(Bytes::from(input))) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("routerctl: bad server URL {url}: {e}");
            return ExitCode::from(2);
        }
    };
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("routerctl: cannot reach {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if status == http::StatusCode::UNAUTHORIZED {
        eprintln!("routerctl: the router refused the token (set ROUTER_TOKEN)");
        return ExitCode::FAILURE;
    }
    if !status.is_success() {
        eprintln!("routerctl: {status}: {}", String::from_utf8_lossy(&body));
        return ExitCode::FAILURE;
    }
    match output {
        Output::Table => match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(v) => {
                println!("pool:              {}", v["pool"].as_str().unwrap_or("-"));
                println!("model:             {}", v["model"].as_str().unwrap_or("-"));
                println!(
                    "provider:          {}",
                    v["provider"].as_str().unwrap_or("-")
                );
                println!("requires_approval: {}", v["requires_approval"]);
                println!("reason:            {}", v["reason"].as_str().unwrap_or(""));
            }
            Err(_) => println!("{}", String::from_utf8_lossy(&body)),
        },
        _ => println!("{}", String::from_utf8_lossy(&body)),
    }
    ExitCode::SUCCESS
}

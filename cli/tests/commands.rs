//! `routerctl` as an operator runs it, against a control plane started
//! in-process: exit codes, messages, tables and JSON.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use router_control_plane::{start, ControlPlaneOptions};

const BIN: &str = env!("CARGO_BIN_EXE_routerctl");

fn run(server: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("ROUTERCTL_SERVER", server)
        .env_remove("ROUTER_TOKEN");
    if let Some(t) = token {
        c.env("ROUTER_TOKEN", t);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `-h` and `--help` describe routerctl as it is: every subcommand listed,
/// no "(soon)" left from before the control plane existed.
#[test]
fn help_lists_the_real_subcommands() {
    for flag in ["-h", "--help"] {
        let o = Command::new(BIN).arg(flag).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(!help.contains("soon"), "{help}");
        assert!(help.contains("The LLM router's command line"), "{help}");
        let commands = help
            .split("Commands:")
            .nth(1)
            .and_then(|rest| rest.split("Options:").next())
            .unwrap_or_else(|| panic!("no Commands section: {help}"));
        let listed: Vec<&str> = commands
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .collect();
        for name in [
            "up", "drill", "mock", "policy", "backends", "circuits", "proxies", "route",
        ] {
            assert!(listed.contains(&name), "{name} missing from {listed:?}");
        }
    }
    let o = Command::new(BIN)
        .args(["route", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("explain"));
}

const GOOD: &str = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{name: a, endpoints: [\"127.0.0.1:9\"]}]\n  routes: [{name: r, chain: [a]}]\n";
const BAD: &str = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{name: a}, {name: a}]\n  routes: [{name: r, chain: [b]}]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_commands_against_a_control_plane() {
    let dir = std::env::temp_dir().join(format!("routerctl-cmd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.join("cp")),
        token: Some("tok".into()),
        tls: None,
        guards: Default::default(),
    })
    .await
    .unwrap();
    let server = format!("http://{}", cp.local_addr());
    let good = dir.join("good.yaml");
    let bad = dir.join("bad.yaml");
    std::fs::write(&good, GOOD).unwrap();
    std::fs::write(&bad, BAD).unwrap();
    let (g, b) = (good.to_str().unwrap(), bad.to_str().unwrap());
    let server = server.as_str();

    tokio::task::spawn_blocking({
        let server = server.to_string();
        let (g, b) = (g.to_string(), b.to_string());
        move || {
            let server = server.as_str();
            // Offline validation: every error, exit 1.
            let o = run(server, None, &["policy", "validate", "-f", &b]);
            assert_eq!(o.status.code(), Some(1), "{}", text(&o));
            assert!(
                text(&o).contains("spec.pools[1].name: duplicate pool name"),
                "{}",
                text(&o)
            );
            assert!(text(&o).contains("spec.routes[0].chain[0]: unknown pool \"b\""));
            assert_eq!(
                run(server, None, &["policy", "validate", "-f", &g])
                    .status
                    .code(),
                Some(0)
            );

            // No token: a clear message, exit 1.
            let o = run(server, None, &["policy", "history"]);
            assert_eq!(o.status.code(), Some(1));
            assert!(text(&o).contains("refused the token"), "{}", text(&o));

            // Apply: refused with the same field errors; then applied.
            let o = run(server, Some("tok"), &["policy", "apply", "-f", &b]);
            assert_eq!(o.status.code(), Some(1));
            assert!(text(&o).contains("spec.routes[0].chain[0]"), "{}", text(&o));
            let o = run(
                server,
                Some("tok"),
                &["policy", "apply", "-f", &g, "--dry-run"],
            );
            assert_eq!(o.status.code(), Some(0), "{}", text(&o));
            assert!(text(&o).contains("would become version 1"));
            let o = run(server, Some("tok"), &["policy", "apply", "-f", &g]);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o));
            assert!(text(&o).contains("policy version 1"));

            // Diff: 0 when the same, 1 (with the lines) when not.
            assert_eq!(
                run(server, Some("tok"), &["policy", "diff", "-f", &g])
                    .status
                    .code(),
                Some(0)
            );
            let o = run(server, Some("tok"), &["policy", "diff", "-f", &b]);
            assert_eq!(o.status.code(), Some(1));
            assert!(
                text(&o).contains("+  routes: [{name: r, chain: [b]}]"),
                "{}",
                text(&o)
            );

            // A stale expected version: a conflict, exit 1.
            let o = run(
                server,
                Some("tok"),
                &["policy", "apply", "-f", &g, "--expected-version", "9"],
            );
            assert_eq!(o.status.code(), Some(1));
            assert!(text(&o).contains("conflict"), "{}", text(&o));

            // History as JSON.
            let o = run(server, Some("tok"), &["-o", "json", "policy", "history"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v[0]["version"], 1);

            // Backends and circuits.
            let o = run(
                server,
                Some("tok"),
                &["backends", "set", "a", "127.0.0.1:9", "127.0.0.1:10"],
            );
            assert_eq!(o.status.code(), Some(0), "{}", text(&o));
            let o = run(
                server,
                Some("tok"),
                &["backends", "drain", "a", "127.0.0.1:10"],
            );
            assert_eq!(o.status.code(), Some(0), "{}", text(&o));
            let o = run(server, Some("tok"), &["backends", "list"]);
            assert!(
                text(&o).contains("127.0.0.1:10") && text(&o).contains("draining"),
                "{}",
                text(&o)
            );
            let o = run(
                server,
                Some("tok"),
                &["circuits", "open", "a", "127.0.0.1:9", "--for", "2m"],
            );
            assert_eq!(o.status.code(), Some(0), "{}", text(&o));
            let o = run(server, Some("tok"), &["-o", "yaml", "circuits", "list"]);
            assert!(text(&o).contains("source: operator"), "{}", text(&o));

            // Rollback needs an earlier version.
            let o = run(server, Some("tok"), &["policy", "rollback"]);
            assert_eq!(o.status.code(), Some(1));
            assert!(text(&o).contains("no earlier version"), "{}", text(&o));
        }
    })
    .await
    .unwrap();
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

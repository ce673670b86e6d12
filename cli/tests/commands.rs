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
            "up", "drill", "mock", "policy", "backends", "circuits", "proxies", "route", "approve",
            "tasks", "rollout",
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
        proxy_tokens: vec![router_control_plane::auth::ProxyToken {
            token: "proxy-tok".into(),
            node: None,
        }],
        tls: None,
        guards: Default::default(),
        ..Default::default()
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
            let o = run(server, Some("tok"), &["policy", "history", "-o", "json"]);
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
            let o = run(server, Some("tok"), &["circuits", "list", "-o", "yaml"]);
            assert!(text(&o).contains("source: operator"), "{}", text(&o));

            // A bad circuit override: refused (INVALID_ARGUMENT) with the
            // field and the reason, exit 1.
            for (args, field, why) in [
                (
                    ["circuits", "open", "a", "127.0.0.1"],
                    "endpoint: ",
                    "missing port",
                ),
                (
                    ["circuits", "open", "nope", "127.0.0.1:9"],
                    "pool: ",
                    "no pool \"nope\"",
                ),
                (
                    ["circuits", "open", "a", "127.0.0.1:11"],
                    "endpoint: ",
                    "is not an endpoint of pool a",
                ),
            ] {
                let o = run(server, Some("tok"), &args);
                assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
                let t = text(&o);
                // The control plane's words, not gRPC's code names.
                assert!(
                    !t.contains("InvalidArgument") && t.contains(field) && t.contains(why),
                    "{args:?}: {t}"
                );
            }

            // A proxy token cannot administer: permission denied, exit 1,
            // nothing applied.
            let o = run(server, Some("proxy-tok"), &["policy", "apply", "-f", &g]);
            assert_eq!(o.status.code(), Some(1), "{}", text(&o));
            assert!(text(&o).contains("permission denied"), "{}", text(&o));
            let o = run(server, Some("tok"), &["policy", "history", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");

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

/// Runs `routerctl up` with `args` and `ROUTER_TOKEN` until it prints that
/// it is up (then returns the proxy's address, the child still running) or
/// exits (then its code and stderr).
fn up(
    args: &[&str],
    token: Option<&str>,
) -> Result<(std::process::Child, String), (Option<i32>, String)> {
    up_with(args, token, &[])
}

/// [`up`] with more environment variables.
fn up_with(
    args: &[&str],
    token: Option<&str>,
    envs: &[(&str, &str)],
) -> Result<(std::process::Child, String), (Option<i32>, String)> {
    use std::io::{BufRead, BufReader};
    let mut c = Command::new(BIN);
    c.arg("up")
        .args(args)
        .env_remove("ROUTER_TOKEN")
        .env_remove("CUSTOM_ROUTER_BIND")
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(t) = token {
        c.env("ROUTER_TOKEN", t);
    }
    let mut child = c.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Read to the end even once nobody listens: `up` dies of a
        // closed stderr (eprintln panics), which would reset the
        // connections of a test still talking to it.
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let mut seen = String::new();
    loop {
        match rx.recv_timeout(std::time::Duration::from_secs(20)) {
            Ok(line) => {
                if let Some(rest) = line.trim().strip_prefix("proxy:") {
                    let addr = rest
                        .split_whitespace()
                        .next()
                        .unwrap()
                        .trim_start_matches("http://")
                        .to_string();
                    return Ok((child, addr));
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().unwrap();
                return Err((status.code(), seen));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                child.kill().unwrap();
                panic!("routerctl up neither up nor exited: {seen}");
            }
        }
    }
}

/// `GET /_custom_router/health` over a plain socket.
fn health(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /_custom_router/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// `routerctl up` binds loopback and works without a token; on another
/// address it wants ROUTER_TOKEN.
#[test]
fn up_works_on_loopback_without_a_token_and_wants_one_elsewhere() {
    let dir = std::env::temp_dir().join(format!("routerctl-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.to_str().unwrap();
    let (mut child, addr) = up(
        &["--port", "0", "--grpc", "127.0.0.1:0", "--data-dir", data],
        None,
    )
    .unwrap_or_else(|e| panic!("routerctl up did not start: {e:?}"));
    // The managed proxy gets the demo policy from the tokenless control plane.
    let mut answer = String::new();
    for _ in 0..100 {
        answer = health(&addr);
        if answer.contains("\"config_version\":\"cp-") {
            break;
        }
        // A plain test thread with no runtime to block or clock to pause.
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Started here; stopped by its own handle.
    child.kill().unwrap();
    let _ = child.wait();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"config_version\":\"cp-"), "{answer}");

    let refused = up(
        &["--port", "0", "--grpc", "0.0.0.0:0", "--data-dir", data],
        None,
    );
    match refused {
        Err((code, stderr)) => {
            assert_eq!(code, Some(2), "{stderr}");
            assert!(stderr.contains("ROUTER_TOKEN"), "{stderr}");
        }
        Ok((mut child, _)) => {
            child.kill().unwrap();
            panic!("routerctl up served 0.0.0.0 without a token");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 20, item 2: `routerctl up` binds loopback by default, and what
/// `--bind` or `CUSTOM_ROUTER_BIND` says when told (a container's
/// published port reaches nothing on loopback). It used to bind 127.0.0.1
/// whatever it was told.
#[test]
fn up_binds_loopback_unless_told_otherwise() {
    for (args, envs, want) in [
        (vec![], vec![], "127.0.0.1:"),
        (vec!["--bind", "0.0.0.0"], vec![], "0.0.0.0:"),
        (vec![], vec![("CUSTOM_ROUTER_BIND", "0.0.0.0")], "0.0.0.0:"),
    ] {
        let dir = std::env::temp_dir().join(format!(
            "routerctl-up-bind-{}-{}",
            std::process::id(),
            args.len() + 2 * envs.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let data = dir.to_str().unwrap();
        let mut all = vec!["--port", "0", "--grpc", "127.0.0.1:0", "--data-dir", data];
        all.extend(args.iter().copied());
        let (mut child, addr) = up_with(&all, None, &envs)
            .unwrap_or_else(|e| panic!("routerctl up did not start: {e:?}"));
        let port = addr.rsplit(':').next().unwrap().to_string();
        let answer = health(&format!("127.0.0.1:{port}"));
        child.kill().unwrap();
        let _ = child.wait();
        assert!(addr.starts_with(want), "{args:?} {envs:?}: {addr}");
        assert!(answer.contains("\"config_version\""), "{answer}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `routerctl approve` prints the token alone on stdout, one the proxies'
/// key accepts for that route and request id; the key comes from
/// `--key-file` or `CUSTOM_ROUTER_APPROVAL_KEY` and is never printed.
#[test]
fn approve_prints_a_token_the_key_verifies() {
    let key = "commands-test-approval-key-0123456789ab";
    let dir = std::env::temp_dir().join(format!("routerctl-approve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("approval.key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let from_file = Command::new(BIN)
        .args([
            "approve",
            "--route",
            "governed",
            "--request-id",
            "req-42",
            "--ttl",
            "10m",
        ])
        .arg("--key-file")
        .arg(&key_file)
        .env_remove("CUSTOM_ROUTER_APPROVAL_KEY")
        .output()
        .unwrap();
    assert_eq!(from_file.status.code(), Some(0), "{}", text(&from_file));
    let from_env = Command::new(BIN)
        .args(["approve", "--route", "governed", "--request-id", "req-42"])
        .env("CUSTOM_ROUTER_APPROVAL_KEY", key)
        .output()
        .unwrap();
    assert_eq!(from_env.status.code(), Some(0), "{}", text(&from_env));
    // The token's expiry is wall time.
    let now = router_policy::wall_clock::since_epoch().as_secs();
    let verifier = router_policy::ApprovalKey::new(key).unwrap();
    for o in [&from_file, &from_env] {
        let stdout = String::from_utf8(o.stdout.clone()).unwrap();
        let token = stdout.trim_end_matches('\n');
        assert_eq!(token.lines().count(), 1, "{stdout:?}");
        assert_eq!(
            verifier.verify(token.as_bytes(), "governed", "req-42", now),
            Ok(())
        );
        assert_eq!(
            verifier.verify(token.as_bytes(), "governed", "req-43", now),
            Err(router_policy::Refusal::Mismatch)
        );
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains("approves request req-42 on route governed until"),
            "{stderr}"
        );
        assert!(!text(o).contains(key));
    }
    // No key: exit 2 and what to set.
    let o = Command::new(BIN)
        .args(["approve", "--route", "governed", "--request-id", "req-42"])
        .env_remove("CUSTOM_ROUTER_APPROVAL_KEY")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("CUSTOM_ROUTER_APPROVAL_KEY"),
        "{}",
        text(&o)
    );
    assert!(o.stdout.is_empty());
    std::fs::remove_dir_all(&dir).ok();
}

/// A control plane on 127.0.0.1 with operator token `tok`, its store in
/// `dir/cp`.
async fn control_plane_in(dir: &std::path::Path) -> router_control_plane::RunningControlPlane {
    start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.join("cp")),
        token: Some("tok".into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Issue 20, items 5, 6 and 7, against a control plane: `backends drain`
/// compares endpoints, not strings (health shows `http://host:port` for a
/// backend set as `host:port`); `circuits close POOL` clears the
/// per-endpoint overrides too; a pool the policy lacks is refused by
/// `circuits open` and by `route explain`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_circuits_and_explain_compare_endpoints_and_know_the_pools() {
    let dir = std::env::temp_dir().join(format!("routerctl-ops-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = control_plane_in(&dir).await;
    let server = format!("http://{}", cp.local_addr());
    let good = dir.join("good.yaml");
    std::fs::write(&good, GOOD).unwrap();
    let good = good.to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        let ok = |args: &[&str]| {
            let o = run(&server, Some("tok"), args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
            text(&o)
        };
        ok(&["policy", "apply", "-f", &good]);
        // Before any backend set, the policy's endpoints are listed.
        let listed: serde_json::Value =
            serde_json::from_str(&ok(&["backends", "list", "-o", "json"])).unwrap();
        assert_eq!(listed[0]["pool"], "a", "{listed}");
        assert_eq!(listed[0]["endpoints"], serde_json::json!(["127.0.0.1:9"]));
        assert_eq!(listed[0]["source"], "policy", "{listed}");
        ok(&["backends", "set", "a", "127.0.0.1:8001", "127.0.0.1:8002"]);
        // The form health and metrics show.
        let said = ok(&["backends", "drain", "a", "http://127.0.0.1:8001"]);
        assert!(said.contains("127.0.0.1:8001 of a draining"), "{said}");
        let listed: serde_json::Value =
            serde_json::from_str(&ok(&["backends", "list", "-o", "json"])).unwrap();
        assert_eq!(
            listed[0]["drained"],
            serde_json::json!(["127.0.0.1:8001"]),
            "{listed}"
        );
        assert_eq!(listed[0]["source"], "backends set", "{listed}");
        assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
        let o = run(
            &server,
            Some("tok"),
            &["backends", "drain", "a", "127.0.0.1:9999"],
        );
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            text(&o).contains("its backends: 127.0.0.1:8001, 127.0.0.1:8002"),
            "{}",
            text(&o)
        );

        // Circuits: a pool-wide close clears the per-endpoint overrides.
        ok(&[
            "circuits",
            "open",
            "a",
            "http://127.0.0.1:8002",
            "--for",
            "10m",
        ]);
        assert!(ok(&["circuits", "list"]).contains("127.0.0.1:8002"));
        let said = ok(&["circuits", "close", "a"]);
        assert!(
            said.contains("overrides cleared for every endpoint of a"),
            "{said}"
        );
        let listed = ok(&["circuits", "list"]);
        assert!(!listed.contains("127.0.0.1:8002"), "{listed}");
        let o = run(&server, Some("tok"), &["circuits", "open", "nope"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("no pool \"nope\""), "{}", text(&o));

        // Explain: a misspelt pool is refused with the known names.
        let mut c = Command::new(BIN);
        c.args(["route", "explain"])
            .env("ROUTERCTL_SERVER", &server)
            .env("ROUTER_TOKEN", "tok")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin
                .write_all(br#"{"risk": "READ", "pools": {"b": {"healthy": false}}}"#)
                .unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert_ne!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            text(&o).contains("no pool \"b\"; its pools: a"),
            "{}",
            text(&o)
        );
    })
    .await
    .unwrap();

    // `backends list` shows the fleet's marks: a proxy's suspicion (issue
    // 21) and an operator's open circuit, each with who raised it.
    let until = router_control_plane::hub::now_ms() + 60_000;
    cp.hub()
        .report_circuit(
            "p9",
            &router_proto::v1::CircuitReport {
                pool: "a".into(),
                endpoint: "http://127.0.0.1:8002".into(),
                open: true,
                until_unix_ms: until,
                suspect: "check".into(),
            },
        )
        .await
        .unwrap();
    let server = format!("http://{}", cp.local_addr());
    tokio::task::spawn_blocking(move || {
        let o = run(
            &server,
            Some("tok"),
            &["circuits", "open", "a", "127.0.0.1:8002", "--for", "10m"],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = run(&server, Some("tok"), &["backends", "list"]);
        let table = text(&o);
        let line = table
            .lines()
            .find(|l| l.contains("127.0.0.1:8002"))
            .unwrap_or_default();
        assert!(line.contains("suspect: check (p9)"), "{table}");
        assert!(line.contains("circuit open (operator)"), "{table}");
        let other = table
            .lines()
            .find(|l| l.contains("127.0.0.1:8001"))
            .unwrap_or_default();
        assert!(other.trim_end().ends_with('-'), "{table}");
        let o = run(&server, Some("tok"), &["backends", "list", "-o", "json"]);
        let listed: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
        assert_eq!(
            listed[0]["fleet"]["127.0.0.1:8002"][0], "suspect: check (p9)",
            "{listed}"
        );
    })
    .await
    .unwrap();
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 20, item 8: get, edit, apply does not stack `policy get`'s header
/// in the stored document, and a document that reads the same as the
/// current one makes no new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_edit_apply_keeps_one_header_and_an_unchanged_document_makes_no_version() {
    let dir = std::env::temp_dir().join(format!("routerctl-loop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = control_plane_in(&dir).await;
    let server = format!("http://{}", cp.local_addr());
    let file = dir.join("p.yaml");
    std::fs::write(&file, GOOD).unwrap();
    let path = file.to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        let ok = |args: &[&str]| {
            let o = run(&server, Some("tok"), args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        assert!(ok(&["policy", "apply", "-f", &path]).contains("policy version 1"));
        for round in 0..3 {
            // get > file, apply the file as it is: unchanged.
            let got = ok(&["policy", "get"]);
            assert_eq!(got.matches("# version ").count(), 1, "round {round}: {got}");
            std::fs::write(&path, &got).unwrap();
            let said = ok(&["policy", "apply", "-f", &path]);
            assert!(said.starts_with("unchanged:"), "round {round}: {said}");
            assert_eq!(ok(&["policy", "diff", "-f", &path]), "");
        }
        let history = ok(&["policy", "history", "-o", "json"]);
        let history: serde_json::Value = serde_json::from_str(&history).unwrap();
        assert_eq!(history.as_array().unwrap().len(), 1, "{history}");
        // A real edit makes version 2, with one header when read back.
        let got = ok(&["policy", "get"]);
        std::fs::write(&path, got.replace("127.0.0.1:9", "127.0.0.1:10")).unwrap();
        assert!(ok(&["policy", "apply", "-f", &path]).contains("policy version 2"));
        let got = ok(&["policy", "get"]);
        assert_eq!(got.matches("# version ").count(), 1, "{got}");
        assert!(got.starts_with("# version 2 applied "), "{got}");
    })
    .await
    .unwrap();
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 20, item 8: `routerctl up` started again keeps a policy the user
/// applied (it used to put the demo back over it); `--reset` brings the
/// demo back.
#[test]
fn up_keeps_the_users_policy_unless_reset() {
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("routerctl-up-keep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data");
    let data = data.to_str().unwrap();
    let mine = dir.join("mine.yaml");
    std::fs::write(
        &mine,
        GOOD.replace(
            "kind: RoutingPolicy\n",
            "kind: RoutingPolicy\nmetadata: {name: mine}\n",
        ),
    )
    .unwrap();
    let mine = mine.to_str().unwrap();
    // Runs `up` until it prints the control plane's address; returns the
    // current policy's version and name there, and what `up` said.
    let current = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args([
            "up",
            "--port",
            "0",
            "--grpc",
            "127.0.0.1:0",
            "--data-dir",
            data,
        ])
        .args(args)
        .env_remove("ROUTER_TOKEN")
        .env_remove("CUSTOM_ROUTER_BIND")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut said = String::new();
        let mut server = None;
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            said.push_str(&line);
            said.push('\n');
            if let Some(rest) = line.trim().strip_prefix("control plane:") {
                server = rest.split_whitespace().next().map(str::to_string);
                break;
            }
        }
        // Keep reading: `up` dies of a closed stderr.
        std::thread::spawn(move || lines.for_each(drop));
        let server = server.unwrap_or_else(|| panic!("no control plane line: {said}"));
        let o = run(&server, None, &["policy", "get", "-o", "json"]);
        child.kill().unwrap();
        let _ = child.wait();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let name = router_policy::document::PolicyDocument::parse(v["document"].as_str().unwrap())
            .unwrap()
            .metadata
            .name;
        (v["version"].as_u64().unwrap(), name, said)
    };
    let (version, name, _) = current(&["-f", mine]);
    assert_eq!((version, name.as_str()), (1, "mine"));
    let (version, name, said) = current(&[]);
    assert_eq!((version, name.as_str()), (1, "mine"), "{said}");
    assert!(said.contains("keeping policy version 1"), "{said}");
    let (version, name, _) = current(&["--reset"]);
    assert_eq!((version, name.as_str()), (2, "routerctl-up-demo"));
    // The demo is replaced at every start (its endpoints are new).
    let (version, name, _) = current(&[]);
    assert_eq!((version, name.as_str()), (3, "routerctl-up-demo"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `routerctl tenants add-key`, `tenants keys create/list/revoke`, then
/// `tenants list`, as an operator runs them: a key is printed once on
/// stdout (only its hash is stored, beside the policy, which is left as
/// written), and the list shows the tenant with its key count and limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_add_key_prints_the_key_once_and_list_shows_the_limits() {
    let dir = std::env::temp_dir().join(format!("routerctl-tenants-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = control_plane_in(&dir).await;
    let server = format!("http://{}", cp.local_addr());
    let policy = dir.join("tenants.yaml");
    std::fs::write(
        &policy,
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: p\n      endpoints: [\"127.0.0.1:9\"]\n  routes:\n    - name: r\n      chain: [p]\n  tenants:\n    - name: team-a\n      anonymous: true\n      max_risk: DRAFT\n      limits: {requests_per_minute: 600, budget_usd_per_day: 25}\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        let o = run(&server, Some("tok"), &["policy", "apply", "-f", &policy]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        // The old spelling still mints a key; the policy is left as written.
        let o = run(&server, Some("tok"), &["tenants", "add-key", "team-a"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let key = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(key.starts_with("rt_"), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("shown once"));
        let o = run(&server, Some("tok"), &["policy", "get"]);
        let applied = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(!applied.contains(&key), "{applied}");
        assert!(!applied.contains("sha256:"), "{applied}");
        assert!(applied.starts_with("# version 1 "), "{applied}");
        // keys create / list / revoke, as scripts run them.
        let o = run(
            &server,
            Some("tok"),
            &[
                "tenants",
                "keys",
                "create",
                "team-a",
                "--name",
                "ci",
                "--expires",
                "30d",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let second = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert!(second.starts_with("rt_") && second != key, "{}", text(&o));
        assert!(text(&o).contains("expires 20"), "{}", text(&o));
        let o = run(&server, Some("tok"), &["tenants", "keys", "list", "team-a"]);
        let table = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(table.starts_with("ID "), "{table}");
        assert!(
            table.contains("LAST USED") && table.contains(" ci "),
            "{table}"
        );
        assert!(
            table.contains(&second[..7]) && !table.contains(&second),
            "{table}"
        );
        let o = run(
            &server,
            Some("tok"),
            &["tenants", "keys", "list", "-o", "json"],
        );
        let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let listed = listed.as_array().unwrap();
        assert_eq!(listed.len(), 2, "{listed:?}");
        let id = listed
            .iter()
            .find(|k| k["name"] == "ci")
            .and_then(|k| k["id"].as_str())
            .unwrap()
            .to_string();
        let o = run(&server, Some("tok"), &["tenants", "keys", "revoke", &id]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        assert!(
            text(&o).contains(&format!("revoked key {id}")),
            "{}",
            text(&o)
        );
        let o = run(&server, Some("tok"), &["tenants", "keys", "revoke", &id]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let o = run(&server, Some("tok"), &["tenants", "list"]);
        let table = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(table.contains("team-a (anonymous)"), "{table}");
        assert!(table.contains("DRAFT") && table.contains("600"), "{table}");
        let o = run(&server, Some("tok"), &["tenants", "list", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v[0]["keys"], 1);
        assert_eq!(v[0]["budget_usd_per_day"], 25.0);
        let o = run(&server, Some("tok"), &["tenants", "add-key", "nobody"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("no tenant \"nobody\""), "{}", text(&o));
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `routerctl tasks` against a control plane without `--shared-store`:
/// a clear refusal saying what to set, exit 1; without the token, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_commands_say_what_the_control_plane_needs() {
    let dir = std::env::temp_dir().join(format!("routerctl-tasks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.join("cp")),
        token: Some("tok".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let server = format!("http://{}", cp.local_addr());
    for args in [
        &["tasks", "list"][..],
        &["tasks", "show", "abc"],
        &["tasks", "approve", "abc"],
        &["tasks", "drop", "abc"],
    ] {
        let o = run(&server, Some("tok"), args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("--shared-store"),
            "{args:?}: {}",
            text(&o)
        );
    }
    let o = run(&server, None, &["tasks", "list"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 28, item 12: the connection flags work before the command group
/// (the earlier interface, kubectl's order), between the group and its
/// command, and after the command; commands that do not use them refuse
/// them and do not show them. `ROUTERCTL_SERVER` points nowhere, so only
/// the flag can reach the control plane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_flags_go_before_or_after_the_group() {
    let dir = std::env::temp_dir().join(format!("routerctl-flags-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = control_plane_in(&dir).await;
    let server = format!("http://{}", cp.local_addr());
    let good = dir.join("good.yaml");
    std::fs::write(&good, GOOD).unwrap();
    let good = good.to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        let nowhere = "http://127.0.0.1:9";
        let s = server.as_str();
        let with_equals = format!("--server={s}");
        let lines: [Vec<&str>; 4] = [
            vec![
                "--server", s, "--token", "tok", "policy", "apply", "-f", &good,
            ],
            vec![
                "policy", "--server", s, "--token", "tok", "apply", "-f", &good,
            ],
            vec![
                "policy", "apply", "-f", &good, "--server", s, "--token", "tok",
            ],
            vec![&with_equals, "--token=tok", "policy", "apply", "-f", &good],
        ];
        for args in &lines {
            let o = run(nowhere, None, args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
            assert!(
                text(&o).contains("policy version 1"),
                "{args:?}: {}",
                text(&o)
            );
        }
        // -o before the group, as scripts wrote `routerctl -o json policy
        // history`.
        let o = run(
            nowhere,
            Some("tok"),
            &["-o", "json", "--server", s, "policy", "history"],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v[0]["version"], 1, "{v}");
        // Without the flag, the variable's server is used (and is not
        // there): the flag above was what reached the control plane.
        let o = run(nowhere, Some("tok"), &["policy", "history"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        // Offline `policy validate` still takes them (a script may pass
        // them to every `policy` command) but does not show them.
        let o = run(
            nowhere,
            None,
            &["--server", s, "policy", "validate", "-f", &good],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = run(
            nowhere,
            None,
            &["policy", "validate", "-f", &good, "--server", s],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        for help in [
            &["policy", "validate", "--help"][..],
            &["up", "--help"],
            &["drill", "--help"],
            &["mock", "--help"],
            &["approve", "--help"],
        ] {
            let o = run(nowhere, None, help);
            assert_eq!(o.status.code(), Some(0), "{help:?}: {}", text(&o));
            for flag in ["--server", "--token", "--ca-file"] {
                assert!(
                    !text(&o).contains(flag),
                    "{help:?} shows {flag}: {}",
                    text(&o)
                );
            }
        }
        let o = run(nowhere, None, &["policy", "apply", "--help"]);
        assert!(text(&o).contains("--server"), "{}", text(&o));
        // Commands that do not use them refuse them, before or after.
        for args in [
            &["--server", s, "up"][..],
            &["mock", "--server", s],
            &["drill", "--server", s],
            &["--server", s, "approve"],
        ] {
            let o = run(nowhere, None, args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
            assert!(
                text(&o).contains("unexpected argument '--server'"),
                "{args:?}: {}",
                text(&o)
            );
        }
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 30, item 7: a policy's history is its own. `policy apply --note`
/// and `policy rollback --note` keep the note with the version; history
/// names the operator by the token's name; `policy diff A B` shows what
/// changed between two versions (exit 1), and nothing for two versions
/// that mean the same (exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_history_names_the_operator_and_the_note_and_diff_compares_versions() {
    let dir = std::env::temp_dir().join(format!("routerctl-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = start(ControlPlaneOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: router_control_plane::StoreLocation::Embedded(dir.join("cp")),
        operator_tokens: vec![router_control_plane::auth::OperatorToken {
            token: "alice-token".into(),
            name: Some("alice".into()),
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    let server = format!("http://{}", cp.local_addr());
    let doc = |rpm: u32| {
        format!("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: p\n      endpoints: [\"127.0.0.1:9\"]\n  routes:\n    - name: r\n      chain: [p]\n  tenants:\n    - name: team-a\n      limits: {{requests_per_minute: {rpm}}}\n")
    };
    let v1 = dir.join("v1.yaml");
    let v2 = dir.join("v2.yaml");
    std::fs::write(&v1, doc(60)).unwrap();
    std::fs::write(&v2, doc(600)).unwrap();
    let (v1, v2) = (
        v1.to_str().unwrap().to_string(),
        v2.to_str().unwrap().to_string(),
    );
    tokio::task::spawn_blocking(move || {
        let t = Some("alice-token");
        let o = run(&server, t, &["policy", "apply", "-f", &v1]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = run(
            &server,
            t,
            &[
                "policy",
                "apply",
                "-f",
                &v2,
                "--note",
                "team-a launches: 10x rate",
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = run(&server, t, &["policy", "rollback", "--note", "too hot"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = run(&server, t, &["policy", "history"]);
        let table = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            table.lines().next().unwrap().contains("OPERATOR"),
            "{table}"
        );
        let row = |v: &str| {
            table
                .lines()
                .find(|l| l.starts_with(v))
                .unwrap_or_else(|| panic!("{table}"))
                .to_string()
        };
        assert!(row("2 ").contains("alice"), "{table}");
        assert!(
            row("2 ").contains("apply: team-a launches: 10x rate"),
            "{table}"
        );
        assert!(row("3 ").contains("rollback to 1: too hot"), "{table}");
        let o = run(&server, t, &["policy", "history", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v[1]["operator"], "alice");
        assert_eq!(v[1]["message"], "team-a launches: 10x rate");
        assert_eq!(v[1]["note"], "apply");
        // Two versions: a unified diff naming both, exit 1.
        let o = run(&server, t, &["policy", "diff", "1", "2"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let d = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(d.starts_with("--- version 1 ("), "{d}");
        assert!(
            d.contains("+++ version 2 (") && d.contains("by alice: team-a launches"),
            "{d}"
        );
        assert!(
            d.contains("\n-      limits: {requests_per_minute: 60}\n"),
            "{d}"
        );
        assert!(
            d.contains("\n+      limits: {requests_per_minute: 600}\n"),
            "{d}"
        );
        assert!(d.contains("\n   tenants:\n"), "context lines: {d}");
        // Version 1 against the current one (3, its rollback): same, exit 0.
        let o = run(&server, t, &["policy", "diff", "1"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        let o = run(&server, t, &["policy", "diff", "1", "9"]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("no policy version 9"), "{}", text(&o));
        // The file form is as before.
        let o = run(&server, t, &["policy", "diff", "-f", &v1]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        // A note on two lines is refused, naming the field.
        let o = run(
            &server,
            t,
            &["policy", "apply", "-f", &v2, "--note", "a\nb"],
        );
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains("note: "), "{}", text(&o));
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

// Child processes run in real time: std's clock and sleep are the point.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
/// Starts `routerctl ARGS` with stderr read line by line; returns the child,
/// the first line `pick` maps to a value, and the lines read so far (the
/// rest are read in the background so the child never blocks on stderr).
fn spawn_until<T>(
    args: &[&str],
    pick: impl Fn(&str) -> Option<T>,
) -> (
    std::process::Child,
    T,
    std::sync::Arc<std::sync::Mutex<String>>,
) {
    use std::io::{BufRead, BufReader};
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("ROUTER_TOKEN")
        .env_remove("CUSTOM_ROUTER_BIND")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    for pipe in [
        Box::new(child.stderr.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stdout.take().unwrap()),
    ] {
        let said = std::sync::Arc::clone(&said);
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                said.lock().unwrap().push_str(&format!("{line}\n"));
                let _ = tx.send(line);
            }
        });
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(v) = pick(&line) {
                    return (child, v, said);
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("routerctl {args:?} never said it: {}", said.lock().unwrap());
            }
        }
    }
}

/// A chat completion over a raw HTTP/1.1 connection: the status line and
/// the body, read to the end.
fn chat_raw(addr: &str) -> String {
    use std::io::{Read, Write};
    let addr = addr.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

fn sigterm(child: &std::process::Child) {
    let o = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// Waits (10 s at most) for the child to exit; its exit code.
#[allow(clippy::disallowed_methods)] // a child process: real time
fn exit_code(child: &mut std::process::Child) -> Option<i32> {
    for _ in 0..1000 {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("still running 10 s after SIGTERM");
}

/// A chat request to `url` in flight, SIGTERM to `child` 0.5 s into it: the
/// answer arrives whole, the child says it drains and exits 0.
#[allow(clippy::disallowed_methods)] // a child process: real time
fn answers_in_flight_through_sigterm(
    child: &mut std::process::Child,
    url: &str,
    said: &std::sync::Mutex<String>,
) {
    let request = {
        let url = url.to_string();
        std::thread::spawn(move || chat_raw(&url))
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    sigterm(child);
    let answer = request.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"choices\""), "{answer}");
    assert_eq!(exit_code(child), Some(0), "{}", said.lock().unwrap());
    assert!(
        said.lock().unwrap().contains("draining"),
        "{}",
        said.lock().unwrap()
    );
}

/// Issue 32, item 6: `routerctl mock` and `routerctl up` drain on SIGTERM
/// as router-proxy does (`docker stop` used to kill them mid-answer): a
/// request in flight gets its whole answer, then the program exits 0.
#[test]
#[allow(clippy::disallowed_methods)] // child processes: real time
fn mock_and_up_finish_the_requests_in_flight_on_sigterm() {
    // The mock: an answer that takes 1.5 s, SIGTERM 0.5 s into it.
    let (mut mock, url, said) = spawn_until(
        &[
            "mock",
            "--port",
            "0",
            "--latency-ms",
            "1500",
            "--name",
            "slow",
        ],
        |l| {
            l.strip_prefix("mock slow listening on ")
                .map(str::to_string)
        },
    );
    answers_in_flight_through_sigterm(&mut mock, &url, &said);

    // `up`, serving a policy whose backend is a slow mock.
    let (mut backend, backend_url, _) = spawn_until(
        &[
            "mock",
            "--port",
            "0",
            "--latency-ms",
            "1500",
            "--name",
            "gpu",
        ],
        |l| l.strip_prefix("mock gpu listening on ").map(str::to_string),
    );
    let dir = std::env::temp_dir().join(format!("routerctl-up-drain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data");
    let policy = dir.join("p.yaml");
    std::fs::write(
        &policy,
        format!("apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{{name: a, endpoints: [\"{backend_url}\"]}}]\n  routes: [{{name: r, chain: [a]}}]\n"),
    )
    .unwrap();
    let (mut up, (proxy, server), said) = {
        let found = std::sync::Mutex::new((None::<String>, None::<String>));
        spawn_until(
            &[
                "up",
                "--port",
                "0",
                "--grpc",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().unwrap(),
            ],
            move |l| {
                let mut f = found.lock().unwrap();
                let l = l.trim();
                if let Some(rest) = l.strip_prefix("proxy:") {
                    f.0 = rest.split_whitespace().next().map(str::to_string);
                }
                if let Some(rest) = l.strip_prefix("control plane:") {
                    f.1 = rest.split_whitespace().next().map(str::to_string);
                }
                match (&f.0, &f.1) {
                    (Some(p), Some(c)) => Some((p.clone(), c.clone())),
                    _ => None,
                }
            },
        )
    };
    let o = run(
        &server,
        None,
        &["policy", "apply", "-f", policy.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Until the proxy serves the applied policy (the mock's name answers).
    let mut served = String::new();
    for _ in 0..100 {
        served = chat_raw(&proxy);
        if served.contains("x-mock-name: gpu") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(served.contains("x-mock-name: gpu"), "{served}");
    answers_in_flight_through_sigterm(&mut up, &proxy, &said);
    sigterm(&backend);
    let _ = exit_code(&mut backend);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 35: `route explain -f` offline on a route whose chain has a split
/// says which side the situation's request takes, and on what key.
#[test]
fn route_explain_says_which_side_of_a_split_a_request_takes() {
    let dir = std::env::temp_dir().join(format!("routerctl-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("policy.yaml");
    std::fs::write(
        &file,
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{name: new}, {name: old}, {name: last}]\n  routes:\n    - name: r\n      chain: [{split: [{pool: new, weight: 10}, {pool: old, weight: 90}], sticky: tenant}, last]\n",
    )
    .unwrap();
    let explain = |situation: &str| {
        let mut child = Command::new(BIN)
            .args(["route", "explain", "-f", file.to_str().unwrap()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(situation.as_bytes()).unwrap();
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        text(&o)
    };
    let said = explain("{}");
    assert!(said.contains("pool:              old\n"), "{said}");
    assert!(
        said.contains(
            "split:             old (weight 90 of 100, no key given: the heaviest side)\n"
        ),
        "{said}"
    );
    let said = explain(r#"{"request_id": "r-7"}"#);
    assert!(
        said.contains("by request_id (the sticky key is missing)"),
        "{said}"
    );
    let said = explain(r#"{"tenant": "acme"}"#);
    assert!(said.contains(" of 100, by tenant)\n"), "{said}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A pool with several keys (`api_keys_env`): `backends list` names each
/// (endpoint, key) as the proxies do (`url#KEY_VARIABLE`, never the key),
/// and a circuit can be opened for one key of an endpoint, not for a key
/// the pool does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_and_circuits_name_each_key_of_a_pool_with_several() {
    let dir = std::env::temp_dir().join(format!("routerctl-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cp = control_plane_in(&dir).await;
    let server = format!("http://{}", cp.local_addr());
    let file = dir.join("keys.yaml");
    std::fs::write(
        &file,
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{name: a, endpoints: [\"https://api.example.com/v1\"], api_keys_env: [A_API_KEY, B_API_KEY]}]\n  routes: [{name: r, chain: [a]}]\n",
    )
    .unwrap();
    let file = file.to_str().unwrap().to_string();
    tokio::task::spawn_blocking(move || {
        let ok = |args: &[&str]| {
            let o = run(&server, Some("tok"), args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
            text(&o)
        };
        ok(&["policy", "apply", "-f", &file]);
        let listed: serde_json::Value =
            serde_json::from_str(&ok(&["backends", "list", "-o", "json"])).unwrap();
        assert_eq!(
            listed[0]["endpoints"],
            serde_json::json!([
                "https://api.example.com/v1#A_API_KEY",
                "https://api.example.com/v1#B_API_KEY"
            ]),
            "{listed}"
        );
        ok(&[
            "circuits",
            "open",
            "a",
            "https://api.example.com/v1#B_API_KEY",
            "--for",
            "10m",
        ]);
        let circuits = ok(&["circuits", "list"]);
        assert!(circuits.contains("#B_API_KEY"), "{circuits}");
        let o = run(
            &server,
            Some("tok"),
            &[
                "circuits",
                "open",
                "a",
                "https://api.example.com/v1#C_API_KEY",
            ],
        );
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(
            text(&o).contains("not an endpoint of pool a"),
            "{}",
            text(&o)
        );
        // A backend set of plain addresses: each once per key.
        ok(&["backends", "set", "a", "127.0.0.1:8001"]);
        let listed: serde_json::Value =
            serde_json::from_str(&ok(&["backends", "list", "-o", "json"])).unwrap();
        assert_eq!(
            listed[0]["endpoints"],
            serde_json::json!([
                "http://127.0.0.1:8001#A_API_KEY",
                "http://127.0.0.1:8001#B_API_KEY"
            ]),
            "{listed}"
        );
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

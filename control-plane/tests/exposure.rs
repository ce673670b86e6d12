//! The `router-control-plane` binary, as an operator starts it: secure by
//! default. On an address other machines can reach it refuses to start
//! without an operator token unless told `--insecure`; on loopback it
//! starts without one.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_router-control-plane");

/// How a run ended.
#[derive(Debug)]
enum Ended {
    /// It exited by itself, with this code and stderr.
    Exited(Option<i32>, String),
    /// It said it is listening (then it was killed); its stderr so far.
    Listening(String),
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("router-cp-bin-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs the control plane with `args` until it exits or logs that it
/// listens (10 s at most).
fn run(args: &[&str]) -> Ended {
    let mut child: Child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("ROUTER_STORE")
        .env_remove("ROUTER_ETCD_CA_FILE")
        .env_remove("ROUTER_ETCD_CERT_FILE")
        .env_remove("ROUTER_ETCD_KEY_FILE")
        .env_remove("ROUTER_ETCD_USER")
        .env_remove("ROUTER_ETCD_PASSWORD_FILE")
        // Tests run at once: each console on a port of its own (a test
        // that gives --console-listen overrides it).
        .env("ROUTER_CONSOLE_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    for _ in 0..100 {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains("router-control-plane listening") {
                    // The child was started here; stop it by its own handle.
                    child.kill().unwrap();
                    let _ = child.wait();
                    return Ended::Listening(seen);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().unwrap();
                return Ended::Exited(status.code(), seen);
            }
        }
    }
    child.kill().unwrap();
    let _ = child.wait();
    panic!("neither exited nor listening within 10 s: {seen}");
}

#[test]
fn a_public_address_without_a_token_is_refused_unless_insecure() {
    let dir = temp("public");
    let data = dir.join("data");
    let data = data.to_str().unwrap();
    match run(&["--listen", "0.0.0.0:0", "--data-dir", data]) {
        Ended::Exited(code, stderr) => {
            assert_eq!(code, Some(2), "{stderr}");
            assert!(
                stderr.contains("--token-file") && stderr.contains("--insecure"),
                "the error names both ways out: {stderr}"
            );
            assert!(stderr.contains("0.0.0.0:0"), "{stderr}");
        }
        other => panic!("started without a token on 0.0.0.0: {other:?}"),
    }
    // Refused before anything was created.
    assert!(!dir.join("data").exists());

    // Told --insecure, it starts (and says the API is open).
    match run(&["--listen", "0.0.0.0:0", "--data-dir", data, "--insecure"]) {
        Ended::Listening(stderr) => assert!(stderr.contains("open"), "{stderr}"),
        other => panic!("--insecure did not start: {other:?}"),
    }

    // With an operator token (and proxy tokens), it starts.
    let token = dir.join("token");
    let proxy_tokens = dir.join("proxy-tokens");
    std::fs::write(&token, "operator-secret\n").unwrap();
    std::fs::write(&proxy_tokens, "# fleet\nfleet-secret\np1-secret p1\n").unwrap();
    match run(&[
        "--listen",
        "0.0.0.0:0",
        "--data-dir",
        data,
        "--token-file",
        token.to_str().unwrap(),
        "--proxy-token-file",
        proxy_tokens.to_str().unwrap(),
    ]) {
        Ended::Listening(stderr) => {
            assert!(!stderr.contains("secret"), "a token was logged: {stderr}");
        }
        other => panic!("did not start with a token: {other:?}"),
    }

    // On loopback, no token is needed (what `routerctl up` relies on).
    match run(&["--listen", "127.0.0.1:0", "--data-dir", data]) {
        Ended::Listening(_) => {}
        other => panic!("did not start on loopback: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 33: the console off loopback needs TLS or --insecure (the error
/// names the flags); approver and viewer tokens need an operator token;
/// `--console-listen off` serves none.
#[test]
fn the_console_off_loopback_is_refused_without_tls_and_its_tokens_need_an_operator() {
    let dir = temp("console");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data");
    let data = data.to_str().unwrap();
    let token = dir.join("token");
    let viewers = dir.join("viewers");
    std::fs::write(&token, "operator-secret olga\n").unwrap();
    std::fs::write(&viewers, "viewer-secret vera\n").unwrap();
    let token = token.to_str().unwrap();
    let viewers = viewers.to_str().unwrap();
    let base = ["--listen", "127.0.0.1:0", "--data-dir", data];
    match run(&[
        &base[..],
        &["--token-file", token, "--console-listen", "0.0.0.0:0"],
    ]
    .concat())
    {
        Ended::Exited(code, stderr) => {
            assert_eq!(code, Some(2), "{stderr}");
            for flag in ["--tls-cert", "--console-listen", "--insecure", "0.0.0.0:0"] {
                assert!(stderr.contains(flag), "{flag}: {stderr}");
            }
        }
        other => panic!("a console in clear on 0.0.0.0 started: {other:?}"),
    }
    // Viewer tokens alone: clap says they need --token-file.
    match run(&[&base[..], &["--viewer-token-file", viewers]].concat()) {
        Ended::Exited(code, stderr) => {
            assert_eq!(code, Some(2), "{stderr}");
            assert!(stderr.contains("--token-file"), "{stderr}");
        }
        other => panic!("viewer tokens alone started: {other:?}"),
    }
    // With an operator token beside them, it starts with a console, and
    // logs no token.
    match run(&[
        &base[..],
        &["--token-file", token, "--viewer-token-file", viewers],
    ]
    .concat())
    {
        Ended::Listening(stderr) => {
            assert!(stderr.contains("console listening"), "{stderr}");
            assert!(!stderr.contains("secret"), "a token was logged: {stderr}");
        }
        other => panic!("did not start: {other:?}"),
    }
    match run(&[&base[..], &["--console-listen", "off"]].concat()) {
        Ended::Listening(stderr) => assert!(!stderr.contains("console listening"), "{stderr}"),
        other => panic!("did not start: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn proxy_tokens_need_an_operator_token_and_a_well_formed_file() {
    let dir = temp("proxy-tokens");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data");
    let data = data.to_str().unwrap();
    let proxy_tokens = dir.join("proxy-tokens");
    std::fs::write(&proxy_tokens, "fleet-secret\n").unwrap();
    match run(&[
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--proxy-token-file",
        proxy_tokens.to_str().unwrap(),
    ]) {
        Ended::Exited(code, stderr) => {
            assert_eq!(code, Some(2), "{stderr}");
            assert!(stderr.contains("--token-file"), "{stderr}");
        }
        other => panic!("proxy tokens without an operator token: {other:?}"),
    }
    let token = dir.join("token");
    std::fs::write(&token, "operator-secret\n").unwrap();
    std::fs::write(&proxy_tokens, "fleet-secret node extra-field\n").unwrap();
    match run(&[
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--token-file",
        token.to_str().unwrap(),
        "--proxy-token-file",
        proxy_tokens.to_str().unwrap(),
    ]) {
        Ended::Exited(code, stderr) => {
            assert_eq!(code, Some(2), "{stderr}");
            assert!(stderr.contains("line 1"), "{stderr}");
            assert!(
                !stderr.contains("fleet-secret"),
                "the token was shown: {stderr}"
            );
        }
        other => panic!("a malformed proxy token file was accepted: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unusable_tls_and_etcd_flags_stop_startup_naming_the_flag() {
    let dir = temp("etcd-flags");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data");
    let data = data.to_str().unwrap();
    let missing = dir.join("missing.pem");
    let missing = missing.to_str().unwrap();
    let password = dir.join("password");
    std::fs::write(&password, "etcd-secret\n").unwrap();
    let password = password.to_str().unwrap();
    let base = ["--listen", "127.0.0.1:0", "--data-dir", data];
    for (args, says) in [
        (
            vec!["--tls-cert", missing, "--tls-key", missing],
            "cannot read --tls-cert",
        ),
        (
            vec!["--store", "etcds://127.0.0.1:1"],
            "needs --etcd-ca-file",
        ),
        (
            vec!["--store", "etcds://127.0.0.1:1", "--etcd-ca-file", missing],
            "cannot read --etcd-ca-file",
        ),
        (
            vec!["--store", "etcd://127.0.0.1:1", "--etcd-ca-file", missing],
            "write the store as etcds://",
        ),
        (
            vec!["--store", "etcd://127.0.0.1:1", "--etcd-user", "router"],
            "--etcd-user needs --etcd-password-file",
        ),
        (
            vec!["--etcd-user", "router", "--etcd-password-file", password],
            "--etcd-user is for an etcd store",
        ),
    ] {
        let all: Vec<&str> = base.iter().copied().chain(args.iter().copied()).collect();
        match run(&all) {
            Ended::Exited(code, stderr) => {
                assert_eq!(code, Some(2), "{args:?}: {stderr}");
                assert!(stderr.contains(says), "{args:?}: {stderr}");
                assert!(!stderr.contains("etcd-secret"), "{args:?}: {stderr}");
            }
            other => panic!("{args:?} started: {other:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

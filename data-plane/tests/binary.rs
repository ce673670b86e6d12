//! The `router-proxy` binary as an operator runs it: environment checks,
//! startup log, the periodic backend-state log, route lines on stdout.

#![allow(clippy::unwrap_used)]
// A child process lives on real time, and these waits are blocking
// receives on a std channel: std's clock is the right one here.
#![allow(clippy::disallowed_types)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_router-proxy");

#[test]
fn an_invalid_variable_stops_startup_and_is_named() {
    for (var, value) in [
        ("CUSTOM_ROUTER_EWMA_ALPHA", "fast"),
        ("CUSTOM_ROUTER_QUEUE_MAX_SIZE", "-3"),
        ("CUSTOM_ROUTER_PORT", "99999"),
    ] {
        let out = Command::new(BIN).env(var, value).output().unwrap();
        assert!(!out.status.success(), "{var}={value} must stop startup");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(var), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Issue 30, item 11: the listener's TLS variables come together, and a
/// file that cannot be used stops startup (exit code 2) naming the
/// variable and the reason.
#[test]
fn unusable_tls_variables_stop_startup_and_are_named() {
    let missing = std::env::temp_dir().join(format!("router-no-such-{}.pem", std::process::id()));
    let missing = missing.to_string_lossy().into_owned();
    /// The variables set, the one named, the reason given.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Case; 3] = [
        (
            &[("CUSTOM_ROUTER_TLS_CERT_FILE", "/x.pem")],
            "CUSTOM_ROUTER_TLS_KEY_FILE",
            "set together",
        ),
        (
            &[("CUSTOM_ROUTER_TLS_KEY_FILE", "/x.pem")],
            "CUSTOM_ROUTER_TLS_CERT_FILE",
            "set together",
        ),
        (
            &[
                ("CUSTOM_ROUTER_TLS_CERT_FILE", &missing),
                ("CUSTOM_ROUTER_TLS_KEY_FILE", &missing),
            ],
            "CUSTOM_ROUTER_TLS_CERT_FILE",
            "cannot read it",
        ),
    ];
    for (vars, named, reason) in cases {
        let out = Command::new(BIN)
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{vars:?}: {stderr}");
        assert!(
            stderr.contains(named) && stderr.contains(reason),
            "{stderr}"
        );
    }
}

/// Issue 20, item 10: `--help` names the modes and the variables, and a
/// managed-mode flag without `--control-plane` is refused, not ignored.
#[test]
fn help_names_the_modes_and_managed_flags_need_a_control_plane() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "sidecar",
        "--policy FILE",
        "--control-plane URL",
        "CUSTOM_ROUTER_ADMIN_TOKEN",
        "CUSTOM_ROUTER_METRICS_TOKEN",
        "docs/data-plane.md",
    ] {
        assert!(help.contains(want), "{want} missing from: {help}");
    }
    for args in [
        ["--cache-dir", "/tmp/router-cache"],
        ["--node-id", "p1"],
        ["--control-plane-ca", "/tmp/ca.pem"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--control-plane"), "{args:?}: {stderr}");
    }
}

#[test]
fn an_invalid_policy_file_stops_startup() {
    let dir = std::env::temp_dir().join(format!("router-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec: {pools: [], routes: []}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--policy")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("spec.pools: at least one pool is required"),
        "{stderr}"
    );
}

/// Issue 14, token details: a token that cannot be sent in a header, or
/// is not even Unicode, used to pass: a non-Unicode
/// `CUSTOM_ROUTER_ADMIN_TOKEN` read as unset (admin calls open), a bad
/// `ROUTER_TOKEN` was silently not sent. Now startup stops, naming the
/// variable and never showing the value.
#[test]
fn an_unusable_token_stops_startup_and_is_named() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let not_unicode = OsString::from_vec(b"adm\xffin".to_vec());
    let cases: [(&str, OsString, &[&str]); 4] = [
        ("CUSTOM_ROUTER_ADMIN_TOKEN", not_unicode.clone(), &[]),
        ("CUSTOM_ROUTER_ADMIN_TOKEN", "two words".into(), &[]),
        (
            "ROUTER_TOKEN",
            not_unicode,
            &["--control-plane", "http://127.0.0.1:9"],
        ),
        (
            "ROUTER_TOKEN",
            "t\u{f6}k".into(),
            &["--control-plane", "http://127.0.0.1:9"],
        ),
    ];
    for (var, value, args) in cases {
        let mut child = Command::new(BIN)
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(args)
            .env(var, &value)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Its stderr ends when it exits; a proxy that starts anyway never
        // exits on its own, so it is stopped and the case fails.
        let (tx, rx) = mpsc::channel::<String>();
        let mut pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            let _ = tx.send(text);
        });
        let Ok(stderr) = rx.recv_timeout(Duration::from_secs(10)) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{var}={value:?} did not stop startup");
        };
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(2), "{var}={value:?}: {stderr}");
        assert!(stderr.contains(var), "{stderr}");
        for shown in ["two words", "adm", "t\u{f6}k"] {
            assert!(
                !stderr.contains(shown),
                "{var}: the value is shown: {stderr}"
            );
        }
    }
}

/// Issue 14, doors: the startup log says exactly who may call the admin
/// endpoints, per mode.
#[test]
fn the_startup_log_says_who_may_call_the_admin_endpoints() {
    let dir = std::env::temp_dir().join(format!("router-bin-doors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("p.yaml");
    std::fs::write(
        &policy,
        "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{name: a, endpoints: [\"http://127.0.0.1:9\"]}]\n  routes: [{name: r, chain: [a]}]\n",
    )
    .unwrap();
    let policy = policy.to_string_lossy().into_owned();
    let cases: [(&[&str], Option<&str>, &str); 5] = [
        (&[], None, "taken from loopback peers only"),
        (&[], Some("t0ken"), "from any peer, loopback included"),
        (
            &["--policy", &policy],
            None,
            "are refused and health shows counts only",
        ),
        (
            &["--policy", &policy],
            Some("t0ken"),
            "health's backend list need Authorization",
        ),
        (
            &["--control-plane", "http://127.0.0.1:9"],
            None,
            "set-backends is refused (the control plane owns backend sets",
        ),
    ];
    for (args, token, expected) in cases {
        let mut cmd = Command::new(BIN);
        cmd.args(["--bind", "127.0.0.1", "--port", "0"])
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("CUSTOM_ROUTER_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(t) = token {
            cmd.env("CUSTOM_ROUTER_ADMIN_TOKEN", t);
        }
        let mut child = cmd.spawn().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        let found = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains(expected) => break true,
                Ok(l) => seen.push(l),
                Err(_) => break false,
            }
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            found,
            "{args:?} token={token:?}: no {expected:?} in {seen:#?}"
        );
        assert!(
            !seen.iter().any(|l| l.contains("t0ken")),
            "the token is logged: {seen:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn http(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn sidecar_logs_its_state_and_writes_route_lines_to_stdout() {
    let mut child = Command::new(BIN)
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .env("CUSTOM_ROUTER_STATE_LOG_INTERVAL", "0.2")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_line = |pred: &dyn Fn(&str) -> bool| -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if pred(&l) => return l,
                Ok(_) => continue,
                Err(_) => panic!("expected log line did not come"),
            }
        }
    };
    let listening = wait_line(&|l| l.contains("router-proxy listening"));
    let addr = listening
        .split("addr=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .to_string();
    wait_line(&|l| l.contains("taken from loopback peers only"));

    let resp = http(
        &addr,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 13\r\n\r\n{\"model\":\"m\"}",
    );
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    let state = wait_line(&|l| l.contains("backend state"));
    assert!(
        state.contains("pool=\"default\"") || state.contains("pool=default"),
        "{state}"
    );
    assert!(state.contains("queue_depth=0"), "{state}");

    let _ = child.kill();
    let _ = child.wait();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let line: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(line["outcome"], "no_backend");
    assert_eq!(line["status"], 503);
}

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
    wait_line(&|l| l.contains("admin endpoints") && l.contains("open"));

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

//! Issue 28, item 3, as the attack was made, on the `router-proxy`
//! binary: every backend down, a parking route, and 30 requests of 30 MiB
//! with `Prefer: respond-async`. Before, all 30 were parked (only their
//! count was capped), the proxy's RSS grew past a gigabyte, and it then
//! spent most of a core idling: its dispatcher copied every parked task,
//! body included, four times a second. Now the proxy's byte cap
//! (`CUSTOM_ROUTER_PARK_MAX_BYTES`, here 256 MiB) parks what fits and
//! answers the rest `503 no_backend` at once; idling over the parked
//! bodies costs almost nothing (the dispatcher reads task records, never
//! bodies), and the RSS stays under the cap plus a margin.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

const BIN: &str = env!("CARGO_BIN_EXE_router-proxy");
const MIB: usize = 1 << 20;
/// The proxy's cap on parked bytes.
const CAP: usize = 256 * MIB;
/// What the proxy may use beside the parked bodies: its runtime, the
/// request being read, the allocator's slack.
const MARGIN: usize = 160 * MIB;
const REQUESTS: usize = 30;
const BODY: usize = 30 * MIB;
/// How long the idle proxy is watched.
const IDLE: Duration = Duration::from_secs(3);

fn status_kb(pid: u32, field: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kb| kb * 1024)
        .unwrap()
}

/// The process's CPU time so far (user + system), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is the
    // 3rd field, utime the 14th, stime the 15th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`).
fn ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_parked_30_mib_bodies_stay_under_the_byte_cap_and_the_proxy_idles() {
    let dir = std::env::temp_dir().join(format!("router-park-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Every backend down: the only endpoint refuses connections.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - name: only
      endpoints: ["http://{down}"]
  routes:
    - name: agents
      chain: [only]
      on_all_down: park
      park: {{ttl_s: 600, max_tasks: 100, max_bytes: 2000000000}}
"#
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["--bind", "127.0.0.1", "--port", "0", "--policy"])
        .arg(&policy)
        .env("CUSTOM_ROUTER_PARK_MAX_BYTES", CAP.to_string())
        .env("CUSTOM_ROUTER_MAX_BODY_BYTES", (64 * MIB).to_string())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let addr = tokio::task::spawn_blocking(move || loop {
        let line = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        if let Some(rest) = line.split("addr=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    })
    .await
    .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let head = r#"{"model":"m","messages":[{"role":"user","content":""#;
    let body = Bytes::from(format!("{head}{}\"}}]}}", "a".repeat(BODY)));
    let (mut parked, mut refused) = (0usize, 0usize);
    for i in 0..REQUESTS {
        let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("prefer", "respond-async")
            .body(Full::new(body.clone()))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        let status = resp.status();
        let answer = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&answer);
        match status.as_u16() {
            202 => parked += 1,
            503 => {
                let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
                assert_eq!(v["error"]["type"], "no_backend", "{v}");
                assert!(text.contains("CUSTOM_ROUTER_PARK_MAX_BYTES"), "{text}");
                refused += 1;
            }
            other => panic!("request {i}: unexpected {other}: {text}"),
        }
    }
    // What fits under the cap parks (each task counts its body, path and
    // headers); the rest is refused at once.
    let per_task = body.len() + "/v1/chat/completions".len() + "content-type".len() + 16;
    assert_eq!(parked, CAP / per_task, "{parked} parked, {refused} refused");
    assert_eq!(parked + refused, REQUESTS);

    // Idle: the dispatcher polls every 250 ms over the parked tasks.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = cpu_ticks(pid);
    tokio::time::sleep(IDLE).await;
    let used = cpu_ticks(pid) - start;
    let rss = status_kb(pid, "VmRSS:");
    let peak = status_kb(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let share = used as f64 / (IDLE.as_secs_f64() * ticks_per_second() as f64);
    eprintln!(
        "parked {parked}, refused {refused}; idle CPU {:.2}% of a core; RSS {} MiB, peak {} MiB",
        share * 100.0,
        rss / MIB,
        peak / MIB
    );
    assert!(share < 0.05, "idle at {:.1}% of a core", share * 100.0);
    assert!(
        rss < CAP + MARGIN,
        "RSS {} MiB over the cap {} MiB + margin {} MiB",
        rss / MIB,
        CAP / MIB,
        MARGIN / MIB
    );
}

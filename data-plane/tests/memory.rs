//! Memory under a burst of large bodies, measured on the `router-proxy`
//! binary: 64 clients send a 30 MiB body each at once (1.9 GiB in all);
//! the proxy holds at most `CUSTOM_ROUTER_MAX_BUFFERED_BYTES` of them and
//! answers the rest `503 overloaded` at once. Its peak RSS stays under the
//! cap plus a fixed margin, and every request gets exactly one answer.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use router_mock::{MockConfig, MockModel};

const BIN: &str = env!("CARGO_BIN_EXE_router-proxy");
const MIB: usize = 1 << 20;
const CAP: usize = 128 * MIB;
/// What the proxy may use beside the buffered bodies: its runtime, 64
/// connections' buffers, the upstream side, the allocator's slack.
const MARGIN: usize = 128 * MIB;
const CLIENTS: usize = 64;
const BODY: usize = 30 * MIB;

static FILLER: [u8; 64 * 1024] = [b'a'; 64 * 1024];

/// A ~30 MiB chat request, streamed in 64 KiB frames (the test itself
/// never holds it).
fn big_body() -> (
    usize,
    StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>>>,
) {
    let head: &'static [u8] = br#"{"model":"m","messages":[{"role":"user","content":""#;
    let tail: &'static [u8] = br#""}]}"#;
    let chunks = BODY / FILLER.len();
    let len = head.len() + chunks * FILLER.len() + tail.len();
    let frames = std::iter::once(Bytes::from_static(head))
        .chain((0..chunks).map(|_| Bytes::from_static(&FILLER)))
        .chain(std::iter::once(Bytes::from_static(tail)))
        .map(|b| Ok(Frame::data(b)));
    (len, StreamBody::new(futures_util::stream::iter(frames)))
}

fn peak_rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kb| kb * 1024)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_large_bodies_stays_under_the_buffered_bytes_cap() {
    let backend = MockModel::start(MockConfig {
        name: "backend".into(),
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .env("CUSTOM_ROUTER_MAX_BUFFERED_BYTES", CAP.to_string())
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
        .pool_max_idle_per_host(0)
        .build_http::<StreamBody<_>>();
    let set = http::Request::post(format!("http://{addr}/_custom_router/set-backends"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(format!(
            r#"{{"backends":["{}"]}}"#,
            backend.url()
        ))))
        .unwrap();
    let admin = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<Bytes>>();
    assert!(admin.request(set).await.unwrap().status().is_success());

    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = client.clone();
        let url = format!("http://{addr}/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let (len, body) = big_body();
            let req = http::Request::post(url)
                .header("content-type", "application/json")
                .header("content-length", len)
                .body(body)
                .unwrap();
            let resp = client.request(req).await.unwrap();
            let status = resp.status();
            let answer = resp.into_body().collect().await.unwrap().to_bytes();
            (status, answer)
        }));
    }
    let (mut ok, mut overloaded) = (0, 0);
    for t in tasks {
        let (status, answer) = t.await.unwrap();
        match status.as_u16() {
            200 => ok += 1,
            503 => {
                let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
                assert_eq!(v["error"]["type"], "overloaded", "{v}");
                overloaded += 1;
            }
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&answer)),
        }
    }
    let peak = peak_rss(pid);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(ok + overloaded, CLIENTS, "every request answered once");
    assert!(ok >= 1, "some were served ({overloaded} overloaded)");
    assert!(overloaded >= 1, "the cap was reached ({ok} served)");
    assert!(
        peak < CAP + MARGIN,
        "peak RSS {} MiB over the cap {} MiB + margin {} MiB ({ok} served, {overloaded} overloaded)",
        peak / MIB,
        CAP / MIB,
        MARGIN / MIB
    );
    eprintln!(
        "peak RSS {} MiB, cap {} MiB; {ok} served, {overloaded} overloaded",
        peak / MIB,
        CAP / MIB
    );
}

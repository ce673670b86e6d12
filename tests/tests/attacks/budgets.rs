//! Items 4, 5, 6 and 15: ways a tenant spent past its budget. The mock
//! reports the usage the attackers' backends did; each proxy is the built
//! binary, settling against a real Redis where the spend itself is read.

use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;
use router_mock::{Behavior, StreamScript, UsageMode};
use router_tests::harness::eventually;
use router_tests::mocks::mock;
use router_tests::proxy_process::ProxyProcess;
use router_tests::redis::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{chat_body, micros, policy, send_as, tenant};

/// The input tokens the router estimates for `body` (bytes / 4).
fn input_estimate(body: &str) -> u64 {
    (body.len() as u64).div_ceil(4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_larger_output_cap_is_reserved() {
    // Item 4: `max_tokens: 1, max_completion_tokens: 4000`; the backend
    // honours the larger (as vLLM and SGLang do). Eight at once against a
    // budget of two and a half such calls: before, all eight were served
    // (each reserved one token of output).
    let backend = mock(
        "local",
        Behavior::JsonUsage(
            r#"{"prompt_tokens":20,"completion_tokens":4000,"total_tokens":4020}"#.into(),
        ),
    )
    .await;
    let body = chat_body(r#""max_tokens":1,"max_completion_tokens":4000,"#);
    let worst = micros(input_estimate(&body) + 4000);
    let budget = 2.5 * worst as f64 / 1e6;
    let doc = policy(
        &[("local", &backend.url(), "")],
        "",
        &[tenant(
            "team-a",
            "rt_a",
            &format!("budget_usd_per_day: {budget}"),
        )],
    );
    let proxy = ProxyProcess::start("budget-cap", &doc, &[]);
    let answers = join_all((0..8).map(|_| send_as(&proxy, "rt_a", &body))).await;
    let ok = answers
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    let refused = answers
        .iter()
        .filter(|r| r.status == StatusCode::PAYMENT_REQUIRED)
        .count();
    assert_eq!(
        (ok, refused),
        (2, 6),
        "{:?}",
        answers.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(backend.stats().received, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_usage_never_wraps_the_spend_to_money_left() {
    // Item 5: one answer claims 10^19 prompt tokens; before, the
    // in-process counter wrapped and every later call passed a budget of
    // three and a half calls.
    let backend = mock(
        "local",
        Behavior::JsonUsage(
            r#"{"prompt_tokens":10000000000000000000,"completion_tokens":5}"#.into(),
        ),
    )
    .await;
    let body = chat_body(r#""max_tokens":5,"#);
    let one = micros(input_estimate(&body) + 5);
    let budget = 3.5 * one as f64 / 1e6;
    let doc = policy(
        &[("local", &backend.url(), "")],
        "",
        &[tenant(
            "team-a",
            "rt_a",
            &format!("budget_usd_per_day: {budget}"),
        )],
    );
    let proxy = ProxyProcess::start("budget-absurd", &doc, &[]);
    assert_eq!(send_as(&proxy, "rt_a", &body).await.status, StatusCode::OK);
    // Honest answers from now on: each costs exactly its reservation.
    backend.set_behavior(Behavior::Json);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        statuses.push(send_as(&proxy, "rt_a", &body).await.status);
    }
    // The absurd answer counts as its reservation kept: two more fit.
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 2, "{statuses:?}");
    assert!(
        statuses[2..]
            .iter()
            .all(|s| *s == StatusCode::PAYMENT_REQUIRED),
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_usage_cannot_be_read_keeps_its_reservation() {
    // Item 6: usage of -5, 12.5, NaN, 1e308, "12" (plain) or -1 (in a
    // stream). Each tenant has a budget of one and a half calls: the first
    // call is answered in full, and since its reservation is kept, the
    // second is refused. Before, the reservation was refunded and the
    // answer was free.
    let backend = mock("local", Behavior::Json).await;
    let plain = chat_body(r#""max_tokens":5,"#);
    let streamed = chat_body(r#""max_tokens":5,"stream":true,"#);
    let one = micros(input_estimate(&streamed) + 5);
    let budget = format!("budget_usd_per_day: {}", 1.5 * one as f64 / 1e6);
    let shapes: [(&str, Behavior, &str); 6] = [
        (
            "t0",
            Behavior::JsonUsage(r#"{"prompt_tokens":-5,"completion_tokens":5}"#.into()),
            &plain,
        ),
        (
            "t1",
            Behavior::JsonUsage(r#"{"prompt_tokens":12.5,"completion_tokens":5}"#.into()),
            &plain,
        ),
        ("t2", Behavior::JsonUsage("NaN".into()), &plain),
        (
            "t3",
            Behavior::JsonUsage(r#"{"prompt_tokens":1e308,"completion_tokens":5}"#.into()),
            &plain,
        ),
        (
            "t4",
            Behavior::JsonUsage(r#"{"prompt_tokens":"12","completion_tokens":5}"#.into()),
            &plain,
        ),
        (
            "t5",
            Behavior::Stream(StreamScript {
                chunks: 3,
                usage: UsageMode::Always,
                usage_text: Some(r#"{"prompt_tokens":3,"completion_tokens":-1}"#.into()),
                ..StreamScript::default()
            }),
            &streamed,
        ),
    ];
    let tenants: Vec<String> = shapes
        .iter()
        .map(|(name, _, _)| tenant(name, &format!("rt_{name}"), &budget))
        .collect();
    // Malformed answers count against the endpoint's circuit: not here.
    let doc = policy(&[("local", &backend.url(), "")], "", &tenants).replace(
        "spec:\n",
        "spec:\n  circuit_breaker: {consecutive_errors: 100}\n",
    );
    let proxy = ProxyProcess::start("budget-unreadable", &doc, &[]);
    for (name, behavior, body) in shapes {
        backend.set_behavior(behavior);
        let key = format!("rt_{name}");
        let first = send_as(&proxy, &key, body).await;
        assert_eq!(first.status, StatusCode::OK, "{name}: {}", first.text());
        assert!(
            first.text().contains("hello from") || first.text().contains("tok2"),
            "{name}: the client got the whole answer: {}",
            first.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = send_as(&proxy, &key, body).await;
        assert_eq!(
            second.status,
            StatusCode::PAYMENT_REQUIRED,
            "{name}: the first answer must not have been free: {}",
            second.text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_its_client_leaves_is_paid_for_what_was_relayed() {
    // Item 15: the client reads part of a stream and disconnects before
    // the final usage chunk; before, its reservation was given back.
    let redis = RedisServer::start("attacks-stream-cut").await;
    let backend = router_tests::mocks::mock_stream(
        "local",
        StreamScript {
            chunks: 400,
            interval: Duration::from_millis(10),
            usage: UsageMode::Always,
            ..StreamScript::default()
        },
    )
    .await;
    let body = chat_body(r#""max_tokens":400,"stream":true,"#);
    let doc = policy(
        &[("local", &backend.url(), "")],
        "",
        &[tenant("team-a", "rt_a", "budget_usd_per_day: 100")],
    );
    let proxy = ProxyProcess::start(
        "budget-stream-cut",
        &doc,
        &[("CUSTOM_ROUTER_SHARED_STORE", redis.url().as_str())],
    );
    redis.wait_for_a_client().await;
    // A raw connection, closed for certain when the client leaves (a
    // pooled client may keep reading a dropped body).
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer rt_a\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut buf = [0u8; 4096];
    // A client of Redis is up before the store's connection is ready: the
    // budget (closed on a store down) refuses until then, with a 503 and
    // nothing reserved; sent again until it streams.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    let (mut conn, seen) = loop {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut seen = String::new();
        while seen.matches("tok").count() < 5 {
            let n = conn.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            if seen.starts_with("HTTP/1.1 503") && seen.contains("shared_store_unavailable") {
                break;
            }
        }
        if seen.matches("tok").count() >= 5 {
            break (conn, seen);
        }
        assert!(
            seen.contains("shared_store_unavailable") && tokio::time::Instant::now() < give_up,
            "the stream ended early: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    // The client leaves with most of the stream unsent.
    conn.shutdown().await.ok();
    drop(conn);
    let relayed = seen.matches("tok").count() as u64;
    let key = format!("router:spend:team-a:{}", super::today());
    let at_least = micros(input_estimate(&body) + relayed);
    let mut spent = 0;
    eventually(Duration::from_secs(10), "the cut stream settled", || {
        spent = redis
            .get(&key)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        // Settled (the pending reservation gone) at what was relayed, and
        // the request over (its route line written after it settled): a
        // slow machine could read the reservation in between.
        redis
            .get(&format!("router:spend_pending:team-a:{}", super::today()))
            .is_none_or(|p| p == "0")
            && spent > 0
            && proxy
                .route_lines()
                .iter()
                .any(|l| l["outcome"] == "client_cancelled")
    })
    .await;
    spent = redis
        .get(&key)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(
        spent >= at_least,
        "spent {spent} < {at_least} for {relayed} relayed tokens"
    );
    assert!(
        spent < micros(input_estimate(&body) + 400),
        "settled to the reservation: {spent}: {:?}",
        proxy.route_lines()
    );
}

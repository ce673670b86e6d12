//! The console's live pages in the browser: the Pools page shows the
//! proxies' load (requests in flight and queued at a slow endpoint) and
//! follows it back to zero without a reload; a proxy that never answers
//! a load request (as one from before them NACKs it) is named and does
//! not hold the page past its wait; the Decisions page refreshes itself
//! and leaves alone a filter field that has focus or holds typed text.

use std::time::Duration;

use http::{Method, StatusCode};
use router_proto::v1 as pb;
use router_tests::control::{wait_revision, RawStream, TOKEN};
use router_tests::harness::TestClient;
use router_tests::mocks::mock_latency;
use router_tests::webdriver::Browser;

use super::{browser, http_only, policy, shots, sign_in, Fleet, VIEWER};

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

/// The console's policy with one request at a time per endpoint: more
/// wait in the pool's queue.
fn one_at_a_time(url: &str) -> String {
    let endpoints = format!("      endpoints: [\"{url}\"]\n");
    policy(url).replace(
        &endpoints,
        &format!("{endpoints}      max_concurrency: 1\n"),
    )
}

/// A chat request through the proxy at `url`, on a task of its own.
fn chat_in_background(url: &str) -> tokio::task::JoinHandle<StatusCode> {
    let url = url.to_string();
    tokio::spawn(async move {
        TestClient::new()
            .send(
                Method::POST,
                &url,
                &[("content-type", "application/json")],
                CHAT,
            )
            .await
            .status
    })
}

/// The page's source, for a failure's message.
async fn page(b: &Browser) -> String {
    b.source().await.unwrap_or_default()
}

/// Waits for `selector`, or fails showing the page.
async fn wait_for(b: &Browser, selector: &str) {
    if let Err(e) = b.wait_for(selector).await {
        panic!("{e}\n{}", page(b).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_page_shows_requests_in_flight_and_queued_live_and_a_silent_proxy_does_not_hold_it(
) {
    let fleet = Fleet::start_with("load", one_at_a_time).await;
    let console = fleet.console();
    let hub = fleet.cp.hub();
    // A slow endpoint: each answer takes 4 s, one at a time.
    let slow = mock_latency("slow", 4_000).await;
    let revision = hub
        .set_backends("only", vec![slow.url()], vec![])
        .await
        .unwrap();
    for p in &fleet.proxies {
        wait_revision(p, revision).await;
    }
    let b = browser().await;
    sign_in(&b, &console, VIEWER).await;

    // Idle: every proxy answers, nothing in flight, nothing queued.
    b.goto(&format!("{console}/pools")).await.unwrap();
    let row = format!(
        "section[data-pool=\"only\"] tr.endpoint[data-endpoint=\"{}\"]",
        slow.url()
    );
    let queue = "section[data-pool=\"only\"] td.pool-load";
    wait_for(&b, &format!("{row}[data-in-flight=\"0\"]")).await;
    wait_for(&b, &format!("{queue}[data-queue-depth=\"0\"]")).await;
    wait_for(&b, "#load-note[data-asked=\"3\"][data-answered=\"3\"]").await;
    assert!(b.find_all("#load-silent").await.unwrap().is_empty());
    // Outside <main>: a reload would leave this reference stale.
    let who = b.find("#who").await.unwrap();
    let at = b.url().await.unwrap();

    // Four requests through edge-a at once: one in flight at the endpoint,
    // the others waiting in the pool's queue. The page follows by itself.
    let url = fleet.proxies[0].url("/v1/chat/completions");
    let requests: Vec<_> = (0..4).map(|_| chat_in_background(&url)).collect();
    wait_for(&b, &format!("{row}[data-in-flight=\"1\"]")).await;
    wait_for(
        &b,
        &format!("{queue}:not([data-queue-depth=\"0\"]):not([data-queue-depth=\"\"])"),
    )
    .await;
    let depth = b
        .text(&b.find(&format!("{queue} .queue-depth")).await.unwrap())
        .await
        .unwrap();
    assert!(
        ["1 waiting", "2 waiting", "3 waiting"].contains(&depth.as_str()),
        "{depth}"
    );
    b.screenshot_to(&shots().join("pools-load.png"))
        .await
        .unwrap();
    for r in requests {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }

    // Done: back to zero, still without a reload; edge-a measured them.
    wait_for(&b, &format!("{row}[data-in-flight=\"0\"]")).await;
    wait_for(&b, &format!("{queue}[data-queue-depth=\"0\"]")).await;
    assert_eq!(b.text(&who).await.unwrap(), "vera (viewer)", "reloaded");
    assert_eq!(b.url().await.unwrap(), at);
    for cell in ["td.ewma", "td.p95"] {
        let text = b
            .text(&b.find(&format!("{row} {cell}")).await.unwrap())
            .await
            .unwrap();
        assert!(text.ends_with(" s (edge-a)"), "{cell}: {text}");
    }
    b.quit().await.unwrap();

    // A proxy that never answers a load request (one from before them
    // NACKs it): the page waits its 1 s, no more, and names it.
    let mut old = RawStream::open(fleet.cp.local_addr(), Some(TOKEN), "edge-old")
        .await
        .unwrap();
    let nacks = tokio::spawn(async move {
        let mut nacked = 0;
        while let Ok(Some(m)) = old.rx.message().await {
            if m.load.is_some() {
                nacked += 1;
                old.send(pb::proxy_message::Msg::Nack(pb::Nack {
                    revision: m.revision,
                    nonce: m.nonce,
                    error: "a message without a snapshot".into(),
                }))
                .await;
            }
        }
        nacked
    });
    let client = TestClient::new();
    let cookie = http_only::sign_in(&client, &console, VIEWER).await;
    let header = format!("router_console={cookie}");
    let started = tokio::time::Instant::now();
    let r = client
        .send(
            Method::GET,
            &format!("{console}/pools"),
            &[("cookie", header.as_str())],
            "",
        )
        .await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let text = r.text();
    assert!(
        text.contains("data-asked=\"4\" data-answered=\"3\""),
        "{text}"
    );
    assert!(text.contains("id=\"load-silent\""), "{text}");
    assert!(text.contains("edge-old"), "{text}");
    assert!(
        text.contains("data-in-flight=\"0\""),
        "the others still count: {text}"
    );
    // Its NACK answered a query, not a snapshot: its record keeps none.
    let record = hub.proxies().remove("edge-old").unwrap();
    assert_eq!((record.nacked_revision, record.last_nack.as_str()), (0, ""));
    fleet.stop().await;
    assert!(nacks.await.unwrap() >= 1, "edge-old was asked");
}

/// Rows on the decisions page now.
async fn decisions(b: &Browser) -> usize {
    b.find_all("tr.decision").await.unwrap().len()
}

/// Waits ([`router_tests::webdriver::WAIT`] at most) until the decisions
/// page shows `n` rows.
async fn wait_decisions(b: &Browser, n: usize) {
    let until = tokio::time::Instant::now() + router_tests::webdriver::WAIT;
    while decisions(b).await != n {
        if tokio::time::Instant::now() > until {
            panic!("not {n} decisions: {}", page(b).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decisions_page_refreshes_itself_and_keeps_a_filter_being_typed() {
    let fleet = Fleet::start("live").await;
    let console = fleet.console();
    let chat = || async {
        let r = fleet.proxies[0].chat_with(&[], CHAT).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    };
    chat().await;
    let b = browser().await;
    sign_in(&b, &console, VIEWER).await;
    b.goto(&format!("{console}/decisions")).await.unwrap();
    wait_for(&b, "tr.decision").await;
    assert_eq!(decisions(&b).await, 1);
    assert!(page(&b).await.contains("data-refresh-seconds=\"5\""));
    let who = b.find("#who").await.unwrap();

    // Left alone, the page shows a new decision without a reload.
    chat().await;
    wait_decisions(&b, 2).await;

    // A filter field with focus: the page is left alone past a refresh
    // (a third decision it would show).
    let field = b.find("#filter-tenant").await.unwrap();
    b.click(&field).await.unwrap();
    chat().await;
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    assert_eq!(decisions(&b).await, 2, "refreshed under a focused field");

    // Typed into and left (focus elsewhere), not sent: still left alone,
    // and what was typed is still there.
    b.send_keys(&field, "acme").await.unwrap();
    b.click(&b.find("h1").await.unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    assert_eq!(
        b.value(&field).await.unwrap(),
        "acme",
        "the typing was thrown away"
    );
    assert_eq!(decisions(&b).await, 2, "refreshed over a typed field");

    // Emptied again: the refresh resumes, and shows the third.
    b.clear(&field).await.unwrap();
    b.click(&b.find("h1").await.unwrap()).await.unwrap();
    wait_decisions(&b, 3).await;
    assert_eq!(b.text(&who).await.unwrap(), "vera (viewer)", "reloaded");

    // The Tenants page is live too, at its slower pace.
    b.goto(&format!("{console}/tenants")).await.unwrap();
    wait_for(&b, "body[data-refresh-seconds=\"30\"]").await;

    b.quit().await.unwrap();
    fleet.stop().await;
}

//! Endpoint choice: the fast backend wins, untried ones are probed, ties
//! spread, dead ones do not attract traffic, bursts spread with peak-EWMA.

use std::collections::HashMap;

use futures_util::future::join_all;
use http::StatusCode;
use router_mock::{Behavior, MOCK_NAME_HEADER};
use router_policy::Scoring;
use router_tests::harness::{health_in_flight, TestProxy};
use router_tests::mocks::{mock, mock_latency};

use crate::settings;

async fn served_by(proxy: &TestProxy, n: usize, concurrency: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n / concurrency {
        let batch = join_all((0..concurrency).map(|_| proxy.chat("m"))).await;
        for r in batch {
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            let name = r.header(MOCK_NAME_HEADER).unwrap_or("?").to_string();
            *counts.entry(name).or_insert(0) += 1;
        }
    }
    counts
}

async fn fast_share(scoring: Scoring) -> f64 {
    let fast = mock_latency("fast", 20).await;
    let slow = mock_latency("slow", 200).await;
    let mut s = settings();
    s.queue.scoring = scoring;
    let proxy = TestProxy::sidecar(s).await;
    proxy
        .set_backends(&[slow.host_port(), fast.host_port()])
        .await;
    // Warm-up: both get probed and sampled.
    served_by(&proxy, 8, 2).await;
    let counts = served_by(&proxy, 100, 4).await;
    let fast_n = *counts.get("fast").unwrap_or(&0);
    fast_n as f64 / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmed_up_traffic_goes_to_the_fast_backend_with_peak_ewma() {
    let share = fast_share(Scoring::PeakEwma).await;
    assert!(share >= 0.8, "fast backend got {share}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmed_up_traffic_goes_to_the_fast_backend_with_lowest_ewma() {
    let share = fast_share(Scoring::LowestEwma).await;
    assert!(share >= 0.8, "fast backend got {share}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untried_backends_are_probed_first_and_ties_spread() {
    let mocks = [
        mock_latency("a", 5).await,
        mock_latency("b", 5).await,
        mock_latency("c", 5).await,
    ];
    let proxy = TestProxy::sidecar(settings()).await;
    proxy
        .set_backends(&mocks.iter().map(|m| m.host_port()).collect::<Vec<_>>())
        .await;
    // The first three sequential requests probe each backend once.
    let mut first = Vec::new();
    for _ in 0..3 {
        let r = proxy.chat("m").await;
        first.push(r.header(MOCK_NAME_HEADER).unwrap().to_string());
    }
    first.sort();
    assert_eq!(first, vec!["a", "b", "c"]);
    let counts = served_by(&proxy, 60, 3).await;
    for name in ["a", "b", "c"] {
        let n = *counts.get(name).unwrap_or(&0);
        assert!(n >= 5, "equal backends share traffic: {counts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_does_not_attract_traffic() {
    let live = mock_latency("live", 10).await;
    let dead = mock("dead", Behavior::Json).await;
    let dead_addr = dead.host_port();
    dead.stop().await; // connection refused from now on, in microseconds
    let proxy = TestProxy::sidecar(settings()).await;
    proxy.set_backends(&[dead_addr, live.host_port()]).await;
    let mut failures = 0;
    for _ in 0..40 {
        let r = proxy.chat("m").await;
        if r.status != StatusCode::OK {
            assert_eq!(r.status, StatusCode::BAD_GATEWAY);
            assert_eq!(r.error_type(), "upstream_error");
            failures += 1;
        }
    }
    assert!(
        failures <= 1,
        "the dead backend kept getting traffic: {failures} failures"
    );
    assert!(live.stats().received >= 39);
}

async fn burst_split(scoring: Scoring) -> (usize, usize) {
    let a = mock_latency("a", 150).await;
    let b = mock_latency("b", 150).await;
    let mut s = settings();
    s.queue.scoring = scoring;
    let proxy = TestProxy::sidecar(s).await;
    proxy.set_backends(&[a.host_port(), b.host_port()]).await;
    served_by(&proxy, 4, 1).await;
    let counts = served_by(&proxy, 20, 20).await;
    assert_eq!(health_in_flight(&proxy.health().await), 0);
    let na = *counts.get("a").unwrap_or(&0);
    let nb = *counts.get("b").unwrap_or(&0);
    (na.max(nb), na.min(nb))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spreads_with_peak_ewma_and_piles_up_with_lowest_ewma() {
    let (_, fewer) = burst_split(Scoring::PeakEwma).await;
    assert!(
        fewer >= 6,
        "peak-EWMA spreads a burst over equal backends: {fewer} of 20"
    );
    let (more, _) = burst_split(Scoring::LowestEwma).await;
    assert!(
        more >= 18,
        "lowest-EWMA sends the burst to one backend: {more} of 20"
    );
}

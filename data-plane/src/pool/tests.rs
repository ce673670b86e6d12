//! The pool as a whole: circuits, overrides and the wake timer seen
//! through acquire and status; helpers shared by the submodules' tests.

use std::sync::Arc;
use std::time::Duration;

use router_policy::{CircuitSettings, Endpoint, QueueSettings, Scoring};
use tokio::time::Instant;

use super::*;

pub(super) fn settings(
    max_size: usize,
    timeout_ms: u64,
    max_concurrency: Option<u32>,
) -> PoolSettings {
    PoolSettings::new(
        QueueSettings {
            max_size,
            timeout: Duration::from_millis(timeout_ms),
            latency_threshold_s: 3.0,
            ewma_alpha: 0.3,
            scoring: Scoring::PeakEwma,
        },
        max_concurrency,
    )
}

pub(super) fn eps(addrs: &[&str]) -> Vec<Endpoint> {
    addrs.iter().map(|a| Endpoint::parse(a).unwrap()).collect()
}

pub(super) fn pool(
    max_size: usize,
    timeout_ms: u64,
    cap: Option<u32>,
    addrs: &[&str],
) -> Arc<PoolRuntime> {
    PoolRuntime::new(
        "p",
        settings(max_size, timeout_ms, cap),
        &eps(addrs),
        PoolCounters::default(),
    )
}

pub(super) fn in_flight(p: &PoolRuntime) -> u32 {
    p.status().endpoints.iter().map(|e| e.in_flight).sum()
}

pub(super) fn with_breaker(addrs: &[&str], errors: u32, open_ms: u64) -> Arc<PoolRuntime> {
    let mut s = settings(10, 60_000, None);
    s.circuit = CircuitSettings {
        consecutive_errors: errors,
        open_duration: Duration::from_millis(open_ms),
    };
    PoolRuntime::new("p", s, &eps(addrs), PoolCounters::default())
}

#[tokio::test(start_paused = true)]
async fn the_circuit_opens_probes_once_and_backs_off() {
    let p = with_breaker(&["h:1"], 2, 1000);
    for _ in 0..2 {
        let l = p.acquire(None).await.unwrap();
        l.observe(Sample::Failure(Duration::from_millis(1)));
    }
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
    assert_eq!(p.availability(), Availability::Unhealthy);
    tokio::time::advance(Duration::from_millis(1000)).await;
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::HalfOpen);
    assert_eq!(p.availability(), Availability::Ready);
    // One probe; a second request waits for its verdict.
    let probe = p.acquire(None).await.unwrap();
    let second = tokio::spawn({
        let p = Arc::clone(&p);
        async move {
            p.acquire(Some(Instant::now() + Duration::from_millis(50)))
                .await
        }
    });
    assert_eq!(second.await.unwrap().unwrap_err(), Shed::AttemptTimeout);
    // The probe fails: open again, for twice as long.
    probe.observe(Sample::Failure(Duration::from_millis(1)));
    drop(probe);
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
    tokio::time::advance(Duration::from_millis(1999)).await;
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
    tokio::time::advance(Duration::from_millis(1)).await;
    let probe = p.acquire(None).await.unwrap();
    probe.observe(Sample::Success(Duration::from_millis(5)));
    drop(probe);
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_probe_finished_with_a_success_closes_the_circuit() {
    let p = with_breaker(&["h:1"], 1, 500);
    let l = p.acquire(None).await.unwrap();
    l.finish(Sample::Timeout(Duration::from_millis(100)), Instant::now());
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::Open);
    tokio::time::advance(Duration::from_millis(500)).await;
    let probe = p.acquire(None).await.unwrap();
    probe.finish(Sample::Success(Duration::from_millis(5)), Instant::now());
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::Closed);
    assert_eq!(in_flight(&p), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_when_the_circuit_admits_a_probe() {
    let p = with_breaker(&["h:1"], 1, 500);
    let l = p.acquire(None).await.unwrap();
    l.observe(Sample::Timeout(Duration::from_millis(100)));
    drop(l);
    let started = Instant::now();
    // Queued behind an open circuit: no release will ever come, only
    // the timer.
    let lease = p.acquire(None).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    drop(lease);
    // A probe that ends without a verdict lets the next one probe.
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::HalfOpen);
    let again = p.acquire(None).await.unwrap();
    drop(again);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_behind_a_forced_open_override_is_served_when_it_ends() {
    let p = pool(10, 60_000, None, &["h:1"]);
    let started = Instant::now();
    p.set_forced(&[(None, true, started + Duration::from_millis(300))]);
    // Queued after the override was set: only the timer can serve it.
    let lease = p.acquire(None).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert_eq!(lease.queue_wait(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn waiters_present_when_an_override_is_set_are_served_when_it_ends() {
    let p = with_breaker(&["h:1", "h:2"], 1, 60_000);
    let started = Instant::now();
    // One endpoint's own breaker opens for a minute.
    let l = p.acquire(None).await.unwrap();
    let first = l.endpoint().clone();
    l.finish(Sample::Failure(Duration::from_millis(1)), started);
    p.set_forced(&[(None, true, started + Duration::from_millis(1000))]);
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.acquire(None).await.map(|l| l.endpoint().clone()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(p.status().queue_depth, 1);
    // While it waits, the overrides change: that endpoint until 200 ms,
    // every one until 400 ms.
    p.set_forced(&[
        (
            Some(first.clone()),
            true,
            started + Duration::from_millis(200),
        ),
        (None, true, started + Duration::from_millis(400)),
    ]);
    // Of two open overrides the later one wins: both endpoints are forced
    // open until 400 ms, when the first one's own breaker (open for a
    // minute) takes over again and the other one serves.
    let served = waiter.await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(400));
    assert_ne!(served, first);
}

#[tokio::test(start_paused = true)]
async fn overrides_set_again_and_again_keep_one_timer() {
    let p = pool(10, 60_000, None, &["h:1"]);
    let metrics = tokio::runtime::Handle::current().metrics();
    let started = Instant::now();
    p.set_forced(&[(None, true, started + Duration::from_millis(1000))]);
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.acquire(None).await.map(|l| l.queue_wait()) }
    });
    tokio::task::yield_now().await;
    let tasks = metrics.num_alive_tasks();
    // The control plane streams the same overrides (the fleet's view)
    // again and again, each ending a little sooner.
    for i in 1..=50 {
        let until = started + Duration::from_millis(1000 - i);
        p.set_forced(&[(None, true, until)]);
    }
    assert_eq!(metrics.num_alive_tasks(), tasks);
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        Duration::from_millis(950),
        "served when the latest override ends"
    );
}

#[tokio::test(start_paused = true)]
async fn circuit_transitions_are_reported_to_the_control_plane() {
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let mut s = settings(10, 60_000, None);
    s.circuit = CircuitSettings {
        consecutive_errors: 1,
        open_duration: Duration::from_millis(100),
    };
    let counters = PoolCounters {
        events: Some(tx),
        ..PoolCounters::default()
    };
    let p = PoolRuntime::new("p", s, &eps(&["h:1"]), counters);
    let started = Instant::now();
    let l = p.acquire(None).await.unwrap();
    l.finish(
        Sample::RateLimited(Duration::from_millis(1), Some(Duration::from_secs(2))),
        started,
    );
    let opened = rx.try_recv().unwrap();
    assert!(opened.open);
    assert_eq!(opened.pool, "p");
    assert_eq!(opened.endpoint, "http://h:1");
    // Retry-After outlasts the open duration: it sets the time.
    assert_eq!(opened.until, Some(started + Duration::from_secs(2)));
    tokio::time::advance(Duration::from_secs(2)).await;
    let probe = p.acquire(None).await.unwrap();
    probe.finish(Sample::Success(Duration::from_millis(5)), Instant::now());
    let closed = rx.try_recv().unwrap();
    assert!(!closed.open);
    assert_eq!(closed.until, None);
    assert!(rx.try_recv().is_err(), "one event per transition");
}

#[test]
fn a_full_endpoint_past_its_open_period_waits_for_a_release_not_a_timer() {
    // A wake re-armed for an instant already past fires again and again:
    // the runtime never idles, paused time never advances, and the test
    // would hang. Run it on its own thread and fail after a wall-clock
    // bound instead.
    let (done, finished) = std::sync::mpsc::channel();
    let test = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(full_endpoint_past_its_open_period());
        let _ = done.send(());
    });
    if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
        finished.recv_timeout(Duration::from_secs(30))
    {
        panic!("the pool kept waking itself instead of waiting for a release");
    }
    if let Err(panic) = test.join() {
        std::panic::resume_unwind(panic);
    }
}

async fn full_endpoint_past_its_open_period() {
    let mut s = settings(10, 60_000, Some(2));
    s.circuit = CircuitSettings {
        consecutive_errors: 1,
        open_duration: Duration::from_millis(100),
    };
    let p = PoolRuntime::new("p", s, &eps(&["h:1"]), PoolCounters::default());
    let a = p.acquire(None).await.unwrap();
    a.observe(Sample::Success(Duration::from_millis(10)));
    let b = p.acquire(None).await.unwrap();
    // A failure opens the circuit with both slots still taken.
    b.observe(Sample::Failure(Duration::from_millis(1)));
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.acquire(None).await.map(|l| l.queue_wait()) }
    });
    // Past the open period the circuit would admit a probe, but the
    // endpoint is full: only a release can help.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(p.status().queue_depth, 1);
    drop((a, b));
    assert_eq!(waiter.await.unwrap().unwrap(), Duration::from_secs(1));
}

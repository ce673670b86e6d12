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
            engine: Default::default(),
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

/// An engine-aware pool of `addrs` with a vLLM probe (readings are given
/// by hand with [`reading`]) and the given prefix affinity.
fn engine_pool(addrs: &[&str], affinity: bool) -> Arc<PoolRuntime> {
    use router_policy::engine_aware::{EngineAware, PrefixAffinity};
    let mut s = settings(100, 60_000, None);
    s.queue.scoring = Scoring::EngineAware;
    s.queue.engine = EngineAware {
        affinity: affinity.then_some(PrefixAffinity {
            load_factor: 1.25,
            ..PrefixAffinity::default()
        }),
        ..EngineAware::default()
    };
    s.probe = Some(router_policy::Probe {
        kind: router_policy::ProbeKind::Vllm,
        interval: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        unhealthy_after: 3,
        vram_total_mb: None,
    });
    PoolRuntime::new("p", s, &eps(addrs), PoolCounters::default())
}

fn reading(waiting: u32, running: u32, kv: f64) -> Option<ProbeReading> {
    Some(ProbeReading {
        at: Instant::now(),
        record: router_policy::probe::ProbeRecord::default().after_answer(),
        vram_free_mb: None,
        resident: Vec::new(),
        waiting: Some(waiting),
        running: Some(running),
        kv_cache_usage: Some(kv),
        cache_tokens: None,
    })
}

#[tokio::test(start_paused = true)]
async fn a_saturated_pool_holds_requests_in_its_queue_and_binds_them_when_an_endpoint_frees() {
    let p = engine_pool(&["h:1", "h:2"], false);
    let [a, b] = [&eps(&["h:1"])[0], &eps(&["h:2"])[0]].map(Clone::clone);
    p.record_probe(&a, reading(0, 3, 0.5));
    p.record_probe(&b, reading(0, 3, 0.5));
    // One request each: the engines now hold 4 each, not saturated.
    let first = p.acquire(None).await.unwrap();
    let second = p.acquire(None).await.unwrap();
    assert_ne!(first.endpoint(), second.endpoint());
    // Both engines report full KV caches: saturated, so the next request
    // waits in the router's queue, not in an engine's.
    p.record_probe(&a, reading(0, 4, 0.95));
    p.record_probe(&b, reading(2, 4, 0.9));
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move {
            p.acquire(None)
                .await
                .map(|l| (l.endpoint().clone(), l.queue_wait()))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(p.status().queue_depth, 1);
    assert_eq!(in_flight(&p), 2);
    // One of this router's requests on the first engine ends: its blocks
    // are free, the request is bound there at once (late binding).
    let freed = first.endpoint().clone();
    drop(first);
    let (bound, waited) = waiter.await.unwrap().unwrap();
    assert_eq!(bound, freed);
    assert_eq!(waited, Duration::from_millis(300));
    assert_eq!(p.status().queue_depth, 0);
    drop(second);
}

#[tokio::test(start_paused = true)]
async fn a_scrape_showing_room_binds_a_waiting_request() {
    let p = engine_pool(&["h:1"], false);
    let a = eps(&["h:1"])[0].clone();
    p.record_probe(&a, reading(7, 10, 0.6));
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.acquire(None).await.map(|l| l.queue_wait()) }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(p.status().queue_depth, 1);
    p.record_probe(&a, reading(1, 10, 0.6));
    assert_eq!(waiter.await.unwrap().unwrap(), Duration::from_millis(800));
}

#[tokio::test(start_paused = true)]
async fn turns_and_conversations_go_where_their_prefix_is_held_until_it_is_loaded() {
    let names = ["h:1", "h:2", "h:3", "h:4"];
    let p = engine_pool(&names, true);
    // Each engine runs 2 requests (other clients').
    for a in eps(&names) {
        p.record_probe(&a, reading(0, 2, 0.1));
    }
    let system = "You are a careful assistant. ".repeat(40);
    let body = |turns: &[&str]| {
        let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
        for (i, t) in turns.iter().enumerate() {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            messages.push(serde_json::json!({"role": role, "content": t}));
        }
        serde_json::json!({"model": "m", "messages": messages}).to_string()
    };
    let shape = |b: &str| RequestShape {
        prefix: p.prefix_request(b.as_bytes()),
        ..RequestShape::default()
    };
    let wishes = "plan my trip to the coast, with a long list of wishes; ".repeat(6);
    let first = body(&[wishes.as_str()]);
    let first_shape = shape(&first);
    let chain = first_shape.prefix.clone().expect("a prompt chain");
    let home = p
        .acquire_at(None, Instant::now(), first_shape)
        .await
        .unwrap();
    assert_eq!(home.prefix().map(|x| x.placement), Some("prefix_home"));
    // Its prompt was all to prefill there; streaming now, none is left.
    assert_eq!(
        p.lock()
            .endpoints
            .iter()
            .map(|e| e.pending_prefill_tokens)
            .sum::<u64>(),
        chain.prompt_tokens
    );
    home.observe_first_token(Duration::from_millis(100));
    let owner = home.endpoint().clone();
    // Another conversation with the same system prompt: the system
    // prompt's blocks are held there, so it goes there too.
    let other = body(&["something else entirely"]);
    let l2 = p
        .acquire_at(None, Instant::now(), shape(&other))
        .await
        .unwrap();
    assert_eq!(l2.endpoint(), &owner);
    let placed = l2.prefix().expect("placed by prefix");
    assert_eq!(placed.placement, "prefix_matched");
    assert!(placed.matched >= system.len() / 256 && placed.matched < chain.chain.len());
    assert!(placed.runner_up.is_some());
    // Only the blocks it did not hold are to prefill.
    let pending: u64 = p
        .lock()
        .endpoints
        .iter()
        .map(|e| e.pending_prefill_tokens)
        .sum();
    assert!(
        pending > 0 && pending < shape(&other).prefix.unwrap().prompt_tokens,
        "{pending}"
    );
    l2.observe_first_token(Duration::from_millis(100));
    // The next turn of the first conversation matches all of its first
    // turn there, but the owner runs 4 of 10 now: over the bound
    // ceil(1.25 × 11 / 4) = 4, so the next best by the same score.
    let next = body(&[
        wishes.as_str(),
        "Here is a plan. ".repeat(30).as_str(),
        "and the hotel",
    ]);
    let next_shape = shape(&next);
    assert!(next_shape
        .prefix
        .as_ref()
        .unwrap()
        .chain
        .starts_with(&chain.chain));
    let spilled = p
        .acquire_at(None, Instant::now(), next_shape)
        .await
        .unwrap();
    assert_ne!(spilled.endpoint(), &owner);
    let spilled_to = spilled.endpoint().clone();
    drop((home, l2, spilled));
    // With room again, the turn goes where its longest prefix is: the
    // endpoint that got the whole turn, not the one that has its start.
    let again = p
        .acquire_at(None, Instant::now(), shape(&next))
        .await
        .unwrap();
    assert_eq!(again.endpoint(), &spilled_to);
    assert_eq!(
        again.prefix().map(|x| x.matched),
        Some(shape(&next).prefix.unwrap().chain.len())
    );
    drop(again);
    // What another proxy learned counts like what this one sent.
    let opening = "a conversation another proxy started, long enough to matter; ".repeat(30);
    let elsewhere = body(&[opening.as_str()]);
    let learned_shape = shape(&elsewhere);
    let target = names
        .iter()
        .map(|n| Endpoint::parse(n).unwrap())
        .find(|e| e != &owner && e != &spilled_to)
        .unwrap();
    p.learn(
        &target.to_string(),
        &learned_shape.prefix.as_ref().unwrap().chain,
        0,
    );
    let l5 = p
        .acquire_at(None, Instant::now(), learned_shape)
        .await
        .unwrap();
    assert_eq!(l5.endpoint(), &target);
    assert_eq!(l5.prefix().unwrap().placement, "prefix_matched");
    // What another proxy sends counts as the endpoint's pending prefill,
    // drained at the engine's rate (4,000 tokens a second unmeasured).
    let left = |p: &PoolRuntime| {
        p.lock()
            .endpoints
            .iter()
            .find(|e| *e.endpoint == target)
            .map(|e| e.peer_prefill_left(Instant::now()))
    };
    p.learn(&target.to_string(), &[1, 2, 3], 1000);
    assert_eq!(left(&p), Some(1000));
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(left(&p), Some(600));
    p.learn(&target.to_string(), &[1, 2, 3], 1000);
    assert_eq!(left(&p), Some(1600));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(left(&p), Some(0));
    // A pool without affinity computes no chain.
    assert!(engine_pool(&["h:1"], false)
        .prefix_request(first.as_bytes())
        .is_none());
}

#[tokio::test(start_paused = true)]
async fn first_tokens_are_measured_per_input_token() {
    let p = engine_pool(&["h:1"], false);
    p.record_probe(&eps(&["h:1"])[0], reading(0, 0, 0.0));
    let shape = RequestShape {
        input_tokens: 2000,
        ..RequestShape::default()
    };
    let l = p
        .acquire_at(None, Instant::now(), shape.clone())
        .await
        .unwrap();
    // Its prompt waits for its prefill there until the first token.
    assert_eq!(p.lock().endpoints[0].pending_prefill_tokens, 2000);
    l.observe_first_token(Duration::from_millis(500));
    assert_eq!(p.lock().endpoints[0].pending_prefill_tokens, 0);
    let t = p.lock().endpoints[0].tokens;
    assert_eq!(t.prefill_s_per_token, Some(0.00025));
    // A request that ends before its first token gives its prompt back too.
    let l = p.acquire_at(None, Instant::now(), shape).await.unwrap();
    drop(l);
    assert_eq!(p.lock().endpoints[0].pending_prefill_tokens, 0);
}

#[tokio::test(start_paused = true)]
async fn tenants_sharing_a_queue_are_served_in_turn_not_in_arrival_order() {
    let p = pool(100, 60_000, Some(1), &["h:1"]);
    let busy = p.acquire(None).await.unwrap();
    let shape = |t: u64| RequestShape {
        tenant: Some(t),
        ..RequestShape::default()
    };
    // The heavy tenant queues five requests, then the light one queues one.
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, tenant) in [1, 1, 1, 1, 1, 2].into_iter().enumerate() {
        let (p, order) = (Arc::clone(&p), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let lease = p
                .acquire_at(None, Instant::now(), shape(tenant))
                .await
                .unwrap();
            order.lock().unwrap().push((tenant, i));
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(lease);
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(busy);
    for w in waiters {
        w.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    // The heavy tenant's oldest first (neither served yet), then the light
    // tenant's one, then the rest of the heavy tenant's, in their order.
    assert_eq!(order, vec![(1, 0), (2, 5), (1, 1), (1, 2), (1, 3), (1, 4)]);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_attempt_is_a_latency_sample_and_never_a_failure() {
    // A hedge's losing attempt, cancelled: its time so far counts in the
    // EWMA and the p95 (a lower bound), and not against the circuit.
    let p = pool(10, 60_000, None, &["h:1"]);
    let lease = p.acquire(None).await.unwrap();
    let handle = lease.endpoint_handle();
    drop(lease);
    for _ in 0..10 {
        handle.observe(Sample::Cancelled(Duration::from_millis(400)));
    }
    let addr = p.status().endpoints[0].addr.to_string();
    assert_eq!(p.circuit_of(&addr), Some(CircuitState::Closed));
    assert_eq!(p.outlook().p95, Some(Duration::from_millis(400)));
    assert!(p.status().endpoints[0]
        .ewma_s
        .is_some_and(|e| (e - 0.4).abs() < 1e-9));
    // The same number of failures opens it.
    for _ in 0..10 {
        handle.observe(Sample::Failure(Duration::from_millis(400)));
    }
    assert_eq!(p.circuit_of(&addr), Some(CircuitState::Open));
}

/// The addresses the next `n` leases go to (each released at once, with a
/// success when `ok`).
async fn served(p: &Arc<PoolRuntime>, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let l = p.acquire(None).await.unwrap();
        out.push(l.addr().to_string());
        l.observe(Sample::Success(Duration::from_millis(5)));
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_failed_first_request_makes_an_endpoint_suspect_until_it_expires() {
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let mut s = settings(10, 60_000, None);
    s.queue.scoring = Scoring::RoundRobin;
    s.circuit.open_duration = Duration::from_secs(30);
    let p = PoolRuntime::new(
        "p",
        s,
        &eps(&["http://a:1", "http://b:1"]),
        PoolCounters {
            events: Some(tx),
            ..PoolCounters::default()
        },
    );
    // Find the lease on a, and fail it: its first request there.
    let mut leases = vec![
        p.acquire(None).await.unwrap(),
        p.acquire(None).await.unwrap(),
    ];
    leases.sort_by_key(|l| l.addr().to_string());
    let (a, b) = (leases.remove(0), leases.remove(0));
    a.observe(Sample::Failure(Duration::from_millis(1)));
    b.observe(Sample::Success(Duration::from_millis(5)));
    drop((a, b));
    let report = rx.try_recv().expect("reported to the fleet");
    assert_eq!(
        (report.endpoint.as_str(), report.open, report.suspect),
        ("http://a:1", true, Some(SuspectCause::Attempt))
    );
    assert_eq!(p.status().endpoints[0].suspect, Some(SuspectCause::Attempt));
    // No new traffic there while b can take it; the circuit (3 errors)
    // is still closed.
    assert!(served(&p, 10).await.iter().all(|a| a == "http://b:1"));
    assert_eq!(p.status().endpoints[0].circuit, CircuitState::Closed);
    // It expires on its own.
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(p.status().endpoints[0].suspect, None);
    assert!(served(&p, 10).await.iter().any(|a| a == "http://a:1"));
}

#[tokio::test(start_paused = true)]
async fn a_failure_after_an_answer_is_the_circuits_business_not_suspicion() {
    let p = pool(10, 60_000, None, &["http://a:1"]);
    let l = p.acquire(None).await.unwrap();
    l.observe(Sample::Success(Duration::from_millis(5)));
    drop(l);
    let l = p.acquire(None).await.unwrap();
    l.observe(Sample::Failure(Duration::from_millis(5)));
    drop(l);
    assert_eq!(p.status().endpoints[0].suspect, None);
}

#[tokio::test(start_paused = true)]
async fn the_fleets_marks_steer_traffic_but_never_empty_the_pool() {
    let mut s = settings(10, 60_000, None);
    s.queue.scoring = Scoring::RoundRobin;
    let p = PoolRuntime::new(
        "p",
        s,
        &eps(&["http://a:1", "http://b:1"]),
        PoolCounters::default(),
    );
    let later = Instant::now() + Duration::from_secs(60);
    let a = Endpoint::parse("http://a:1").unwrap();
    let b = Endpoint::parse("http://b:1").unwrap();
    p.set_suspects(&[(a.clone(), SuspectCause::Attempt, later)]);
    assert!(served(&p, 6).await.iter().all(|x| x == "http://b:1"));
    // Both suspect: the marks are ignored rather than fail every request.
    p.set_suspects(&[
        (a.clone(), SuspectCause::Attempt, later),
        (b.clone(), SuspectCause::Check, later),
    ]);
    assert_eq!(p.availability(), Availability::Ready);
    let first = served(&p, 1).await.remove(0);
    // Its answer ended its mark (the probe passed); the other keeps its.
    let st = p.status();
    let (answered, other) = if first == "http://a:1" {
        (&st.endpoints[0], &st.endpoints[1])
    } else {
        (&st.endpoints[1], &st.endpoints[0])
    };
    assert_eq!(answered.suspect, None);
    assert!(other.suspect.is_some());
    assert!(served(&p, 4).await.iter().all(|x| *x == first));
    // A forced-open circuit is not a soft mark: b takes nothing.
    p.set_suspects(&[(a.clone(), SuspectCause::Attempt, later)]);
    p.set_forced(&[(Some(b.clone()), true, later)]);
    assert!(served(&p, 4).await.iter().all(|x| x == "http://a:1"));
    // The snapshot without the marks lifts them.
    p.set_forced(&[]);
    p.set_suspects(&[]);
    let lifted = served(&p, 6).await;
    assert!(lifted.iter().any(|x| x == "http://a:1") && lifted.iter().any(|x| x == "http://b:1"));
}

#[tokio::test(start_paused = true)]
async fn an_outlier_is_ejected_within_the_cap_and_comes_back() {
    let mut s = settings(10, 60_000, None);
    // Round robin: every endpoint keeps getting its share, so error rates
    // (not latencies) are what tells them apart.
    s.queue.scoring = Scoring::RoundRobin;
    s.circuit.consecutive_errors = 1000;
    s.outlier = Some(router_policy::health::OutlierEjection {
        min_requests: 5,
        max_ejection_percent: 34,
        ejection: Duration::from_secs(10),
        ..Default::default()
    });
    let p = PoolRuntime::new(
        "p",
        s,
        &eps(&["http://a:1", "http://b:1", "http://c:1"]),
        PoolCounters::default(),
    );
    // a fails everything, b and c answer (a has answered once, so no
    // suspicion is in the way: this is the error rate's doing).
    let mut answered_once = false;
    let mut a_requests = 0;
    for _ in 0..60 {
        let l = p.acquire(None).await.unwrap();
        if &**l.addr() == "http://a:1" {
            a_requests += 1;
            if answered_once {
                l.observe(Sample::Failure(Duration::from_millis(1)));
            } else {
                answered_once = true;
                l.observe(Sample::Success(Duration::from_millis(1)));
            }
        } else {
            l.observe(Sample::Success(Duration::from_millis(5)));
        }
    }
    let st = p.status();
    assert!(st.endpoints[0].ejected, "a is ejected");
    assert!(!st.endpoints[1].ejected && !st.endpoints[2].ejected);
    assert!(a_requests <= 7, "{a_requests} requests reached a");
    assert!(served(&p, 10).await.iter().all(|x| x != "http://a:1"));
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(!p.status().endpoints[0].ejected, "back after its ejection");
}

#[tokio::test(start_paused = true)]
async fn a_bad_day_for_the_whole_pool_ejects_nobody() {
    let mut s = settings(10, 60_000, None);
    // Round robin: every endpoint keeps getting its share, so error rates
    // (not latencies) are what tells them apart.
    s.queue.scoring = Scoring::RoundRobin;
    s.circuit.consecutive_errors = 1000;
    s.outlier = Some(router_policy::health::OutlierEjection::default());
    let p = PoolRuntime::new(
        "p",
        s,
        &eps(&["http://a:1", "http://b:1"]),
        PoolCounters::default(),
    );
    for i in 0..40 {
        let l = p.acquire(None).await.unwrap();
        if i < 2 {
            l.observe(Sample::Success(Duration::from_millis(1)));
        } else {
            l.observe(Sample::Failure(Duration::from_millis(1)));
        }
    }
    assert!(p.status().endpoints.iter().all(|e| !e.ejected));
}

#[tokio::test(start_paused = true)]
async fn waiters_move_on_at_once_when_the_last_circuit_opens() {
    let mut s = settings(10, 60_000, Some(1));
    s.circuit = CircuitSettings {
        consecutive_errors: 1,
        open_duration: Duration::from_secs(30),
    };
    let p = PoolRuntime::new("p", s, &eps(&["h:1"]), PoolCounters::default());
    let first = p.acquire(None).await.unwrap();
    let started = Instant::now();
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.acquire(None).await.map(|_| ()) }
    });
    tokio::task::yield_now().await;
    assert_eq!(p.status().queue_depth, 1);
    // The only endpoint fails: its circuit opens, the pool is down, and
    // the waiter is answered now, not after its 60 s queue timeout.
    first.observe(Sample::Failure(Duration::from_millis(1)));
    drop(first);
    assert_eq!(waiter.await.unwrap().unwrap_err(), Shed::AllDown);
    assert_eq!(started.elapsed(), Duration::ZERO);
    // With another endpoint up, nobody is shed.
    let mut s = settings(10, 60_000, Some(1));
    s.circuit.consecutive_errors = 1;
    let p = PoolRuntime::new("p", s, &eps(&["h:1", "h:2"]), PoolCounters::default());
    let a = p.acquire(None).await.unwrap();
    let b = p.acquire(None).await.unwrap();
    let up = b.addr().to_string();
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.acquire(None).await.map(|l| l.addr().to_string()) }
    });
    tokio::task::yield_now().await;
    a.observe(Sample::Failure(Duration::from_millis(1)));
    drop(a);
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "the other is up: it waits for it");
    drop(b);
    assert_eq!(waiter.await.unwrap().unwrap(), up);
}

#[tokio::test(start_paused = true)]
async fn an_answer_ends_the_fleets_suspicion_and_says_so() {
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let p = PoolRuntime::new(
        "p",
        settings(10, 60_000, None),
        &eps(&["http://a:1"]),
        PoolCounters {
            events: Some(tx),
            ..PoolCounters::default()
        },
    );
    let a = Endpoint::parse("http://a:1").unwrap();
    let later = Instant::now() + Duration::from_secs(60);
    p.set_suspects(&[(a, SuspectCause::Attempt, later)]);
    assert_eq!(p.status().endpoints[0].suspect, Some(SuspectCause::Attempt));
    // The only endpoint: the mark is ignored, a request goes, it answers.
    let l = p.acquire(None).await.unwrap();
    l.observe(Sample::Success(Duration::from_millis(5)));
    drop(l);
    assert_eq!(p.status().endpoints[0].suspect, None);
    let report = rx.try_recv().expect("the clear is reported");
    assert_eq!(
        (report.open, report.suspect),
        (false, Some(SuspectCause::Attempt))
    );
}

#[tokio::test(start_paused = true)]
async fn new_pools_start_their_turn_at_random() {
    // A fleet of proxies started together: each pool's first lease among
    // equal endpoints is not always the first endpoint (with 64 pools,
    // all alike by chance has a probability of 2^-63).
    let mut first = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let p = pool(10, 60_000, None, &["http://a:1", "http://b:1"]);
        first.insert(p.acquire(None).await.unwrap().addr().to_string());
    }
    assert_eq!(first.len(), 2, "{first:?}");
}

/// A vLLM engine's `/metrics` on loopback; the n-th answer comes after
/// `delays[n]` (the last one repeats): a slow engine or a loaded machine.
async fn engine_answering_after(
    delays: Vec<Duration>,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let delays = Arc::new(delays);
    let served = Arc::new(AtomicUsize::new(0));
    let asked = Arc::clone(&served);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (delays, served) = (Arc::clone(&delays), Arc::clone(&served));
            let service = hyper::service::service_fn(move |_req| {
                let n = served.fetch_add(1, Ordering::SeqCst);
                let delay = delays.get(n).or(delays.last()).copied().unwrap_or_default();
                async move {
                    tokio::time::sleep(delay).await;
                    let page = "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\n";
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(page.as_bytes())),
                    ))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    (addr, asked)
}

/// A pool of the one endpoint at `addr` with a vLLM probe every 50 ms and
/// the default probe timeout (1 s) and failure count (3), its probe task
/// running.
fn probed_pool(addr: std::net::SocketAddr) -> Arc<PoolRuntime> {
    let probe = router_policy::Probe {
        kind: router_policy::ProbeKind::Vllm,
        interval: Duration::from_millis(50),
        timeout: router_policy::probe::DEFAULT_TIMEOUT,
        unhealthy_after: router_policy::probe::DEFAULT_UNHEALTHY_AFTER,
        vram_total_mb: None,
    };
    let mut s = settings(10, 60_000, None);
    s.probe = Some(probe);
    let p = PoolRuntime::new("p", s, &eps(&[&addr.to_string()]), PoolCounters::default());
    let client = router_upstream::forward::build_client(&router_upstream::forward::ClientConfig {
        connect_timeout: Duration::from_secs(5),
        ..Default::default()
    })
    .unwrap();
    p.ensure_probe(Some(probe), Some(&client));
    p
}

/// The pool's availability every 10 ms for `span`.
async fn watch(p: &PoolRuntime, span: Duration) -> Vec<Availability> {
    let mut seen = Vec::new();
    let end = Instant::now() + span;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen.push(p.availability());
    }
    seen
}

/// Issue 28, item 17: with a 50 ms interval, engines that answer their
/// probes in 200 ms (a loaded machine) stay usable: a probe's timeout is
/// its own (1 s), not the interval. Before, each probe timed out at 50 ms
/// and the endpoint was unusable (`503 no_backend`) though it was fine.
#[tokio::test(start_paused = true)]
async fn probes_slower_than_their_interval_keep_the_endpoint_usable() {
    let (addr, _) = engine_answering_after(vec![Duration::from_millis(200)]).await;
    let p = probed_pool(addr);
    // The first answer, then three seconds of 200 ms answers.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let seen = watch(&p, Duration::from_secs(3)).await;
    assert!(
        seen.iter().all(|a| *a == Availability::Ready),
        "{:?}",
        seen.iter().filter(|a| **a != Availability::Ready).count()
    );
    p.close();
}

/// Issue 28, item 17: one probe that times out marks nothing (the last
/// answer still counts); three in a row make the endpoint unusable; one
/// answer brings it back.
#[tokio::test(start_paused = true)]
async fn one_late_probe_marks_nothing_and_three_in_a_row_do() {
    use std::sync::atomic::Ordering;
    let fast = Duration::from_millis(5);
    let late = Duration::from_millis(1500); // past the 1 s timeout
    let mut delays = vec![fast; 10];
    delays.push(late);
    delays.extend([fast; 10]);
    let first_of_four = delays.len();
    delays.extend([late; 4]);
    delays.push(fast);
    let (addr, asked) = engine_answering_after(delays).await;
    let p = probed_pool(addr);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(p.availability(), Availability::Ready, "first answer");
    // Ten answers, the late one (timed out at 1 s), ten answers: never
    // out.
    let mut polls = 0;
    while asked.load(Ordering::SeqCst) <= first_of_four {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            p.availability(),
            Availability::Ready,
            "one late probe took the endpoint out ({} asked)",
            asked.load(Ordering::SeqCst)
        );
        polls += 1;
        assert!(polls < 1000, "the engine was not asked");
    }
    // Four late ones in a row: out once the third has timed out (about
    // 3 s), not before.
    let lates_began = Instant::now();
    while p.availability() == Availability::Ready {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(lates_began.elapsed() < Duration::from_secs(5), "never out");
    }
    let out_after = lates_began.elapsed();
    assert!(
        out_after >= Duration::from_millis(2900),
        "out after {out_after:?}: before the third failure"
    );
    // The answer after the fourth: back.
    let seen = watch(&p, Duration::from_millis(1500)).await;
    assert!(seen.contains(&Availability::Unhealthy), "{seen:?}");
    assert_eq!(seen.last(), Some(&Availability::Ready), "{seen:?}");
    p.close();
}

/// The log lines written while `f` runs (this thread's).
async fn logs_of<F: std::future::Future<Output = ()>>(f: F) -> String {
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    f.await;
    let bytes = lines.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Issue 30, item 8: only a managed proxy says it told the fleet.
#[tokio::test(start_paused = true)]
async fn a_standalone_proxy_does_not_say_it_told_a_fleet() {
    for managed in [false, true] {
        let (tx, _rx) = tokio::sync::mpsc::channel(8);
        let mut s = settings(10, 60_000, None);
        s.queue.scoring = Scoring::RoundRobin;
        let p = PoolRuntime::new(
            "p",
            s,
            &eps(&["http://a:1", "http://b:1"]),
            PoolCounters {
                events: managed.then_some(tx),
                ..PoolCounters::default()
            },
        );
        let logs = logs_of(async {
            let l = p.acquire(None).await.unwrap();
            l.observe(Sample::Failure(Duration::from_millis(1)));
        })
        .await;
        assert!(logs.contains("endpoint marked suspect"), "{logs}");
        assert_eq!(logs.contains("fleet"), managed, "{logs}");
    }
}

/// OpenAI-style rate-limit headers: `requests` left, reset in `reset`.
fn quota_headers(requests: u64, tokens: u64, reset: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("x-ratelimit-remaining-requests", requests.into());
    h.insert("x-ratelimit-remaining-tokens", tokens.into());
    h.insert("x-ratelimit-reset-requests", reset.parse().unwrap());
    h.insert("x-ratelimit-reset-tokens", reset.parse().unwrap());
    h
}

#[tokio::test(start_paused = true)]
async fn a_key_out_of_quota_is_rested_and_its_waiters_are_served_at_its_reset() {
    use router_policy::quota::Estimate;
    let p = pool(10, 60_000, None, &["h:1#A_API_KEY", "h:1#B_API_KEY"]);
    let a = p.acquire(None).await.unwrap();
    let rested = a.endpoint().clone();
    // Its answer says no request is left for a second.
    a.observe_quota(&quota_headers(0, 1000, "1s"), false);
    a.finish(Sample::Success(Duration::from_millis(10)), Instant::now());
    for _ in 0..3 {
        let l = p.acquire(None).await.unwrap();
        assert_ne!(l.endpoint(), &rested, "a rested key takes nothing");
        l.finish(Sample::Success(Duration::from_millis(10)), Instant::now());
    }
    let status = p.status();
    let q = status
        .endpoints
        .iter()
        .find(|e| *e.addr == *rested.to_string())
        .and_then(|e| e.quota)
        .unwrap();
    assert_eq!(
        (q.requests_remaining, q.resting),
        (Some(0), Some("requests"))
    );
    assert_eq!(&*status.endpoints[0].addr, "http://h:1#A_API_KEY");
    // The other key runs out too (for two seconds): the pool's gate says
    // quota, and a request waits in the queue.
    let b = p.acquire(None).await.unwrap();
    b.observe_quota(&quota_headers(0, 1000, "2s"), false);
    b.finish(Sample::Success(Duration::from_millis(10)), Instant::now());
    let m = p.measurements_for(Instant::now(), Estimate::default());
    assert_eq!(m.quota_requests_remaining, Some(0));
    assert_eq!(m.quota_reset_ms, Some(1000));
    let started = Instant::now();
    let waiter = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.acquire(None).await.map(|l| l.endpoint().clone()) }
    });
    // Woken by the pool's timer at the first reset, no polling.
    assert_eq!(waiter.await.unwrap().unwrap(), rested);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(
        p.measurements_for(Instant::now(), Estimate::default())
            .quota_requests_remaining,
        None
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_larger_than_a_keys_tokens_goes_to_a_key_with_room() {
    use router_policy::quota::Estimate;
    let p = pool(10, 60_000, None, &["h:1#A_API_KEY", "h:1#B_API_KEY"]);
    let (a, b) = (
        p.acquire(None).await.unwrap(),
        p.acquire(None).await.unwrap(),
    );
    a.observe_quota(&quota_headers(50, 100, "6m0s"), false);
    b.observe_quota(&quota_headers(50, 5000, "6m0s"), false);
    let roomy = b.endpoint().clone();
    drop((a, b));
    let big = RequestShape {
        quota: Estimate {
            input: 1000,
            output: 1000,
        },
        ..RequestShape::default()
    };
    for _ in 0..2 {
        let l = p
            .acquire_at(None, Instant::now(), big.clone())
            .await
            .unwrap();
        assert_eq!(l.endpoint(), &roomy);
    }
    // The gate: 3000 tokens left after those two (charged) is enough for
    // one more, not for a request of 4000.
    let m = p.measurements_for(
        Instant::now(),
        Estimate {
            input: 2000,
            output: 2000,
        },
    );
    assert_eq!(m.quota_tokens_remaining, Some(1000));
    let m = p.measurements_for(
        Instant::now(),
        Estimate {
            input: 10,
            output: 10,
        },
    );
    assert_eq!(m.quota_tokens_remaining, None);
    // Malformed headers change nothing.
    let mut bad = http::HeaderMap::new();
    bad.insert("x-ratelimit-remaining-requests", "lots".parse().unwrap());
    let c = p.acquire(None).await.unwrap();
    c.observe_quota(&bad, true);
    drop(c);
    assert_eq!(
        p.status()
            .endpoints
            .iter()
            .filter(|e| e.quota.is_some())
            .count(),
        2
    );
}

/// An answer that says a key has nothing left tells the fleet once per
/// window (a `quota` suspicion until the reset); the next answer of the
/// same window says nothing more, and the next window's does.
#[tokio::test(start_paused = true)]
async fn a_key_out_of_quota_is_reported_to_the_fleet_once_a_window() {
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let p = PoolRuntime::new(
        "p",
        settings(10, 60_000, None),
        &eps(&["h:1#A_API_KEY", "h:1#B_API_KEY"]),
        PoolCounters {
            events: Some(tx),
            ..PoolCounters::default()
        },
    );
    let a = p.acquire(None).await.unwrap();
    let rested = a.endpoint().to_string();
    // Some left: nothing said.
    a.observe_quota(&quota_headers(3, 1000, "1s"), false);
    assert!(rx.try_recv().is_err());
    a.observe_quota(&quota_headers(0, 1000, "1s"), false);
    let report = rx.try_recv().expect("reported to the fleet");
    assert_eq!(
        (report.endpoint.as_str(), report.open, report.suspect),
        (rested.as_str(), true, Some(SuspectCause::Quota))
    );
    let until = report.until.expect("until the reset");
    assert_eq!(until - Instant::now(), Duration::from_secs(1));
    a.observe_quota(&quota_headers(0, 1000, "900ms"), false);
    assert!(rx.try_recv().is_err(), "once a window");
    tokio::time::advance(Duration::from_secs(1)).await;
    a.observe_quota(&quota_headers(0, 1000, "1s"), false);
    assert!(rx.try_recv().is_ok(), "the next window's");
    a.finish(Sample::Success(Duration::from_millis(10)), Instant::now());
}

//! The seed's four-rule router, reimplemented from its text, against the
//! engine running `deploy/examples/agents.yaml`, on 10,000 random
//! situations; and one case per row of the seed's failure-modes table.

#![allow(clippy::unwrap_used)]

use router_policy::decide::{decide, explain, PoolMeasurements, Refusal, Situation};
use router_policy::document::load;
use router_policy::{Policy, QueueSettings, Risk};

fn agents() -> Policy {
    let text = include_str!("../../deploy/examples/agents.yaml");
    load(text, &QueueSettings::default()).unwrap()
}

/// The seed's `ModelRouter.route`, rule by rule, with its defaults:
/// latency budget 2000 ms.
fn seed_route(
    risk: Risk,
    healthy: bool,
    queue_depth: u32,
    last_latency_ms: f64,
    vram_free_mb: u64,
    structured: bool,
) -> (&'static str, bool) {
    let cloud_fallback = |structured: bool| {
        if structured {
            ("cloud-strong", false)
        } else {
            ("cloud-cheap", false)
        }
    };
    // 1. Hard safety gate
    if matches!(risk, Risk::Send | Risk::Destructive) {
        return ("cloud-strong", true);
    }
    // 2. Health and capacity gate
    if !healthy || queue_depth > 4 {
        return cloud_fallback(structured);
    }
    // 3. Latency budget gate
    if last_latency_ms > 2000.0 * 0.7 {
        return cloud_fallback(structured);
    }
    // 4. VRAM fit for medium model
    if vram_free_mb > 22_000 {
        return ("local-medium", false);
    }
    // 5. Degrade to small local model
    if vram_free_mb > 6_000 {
        return ("local-small", false);
    }
    // 6. No local capacity left
    cloud_fallback(structured)
}

/// A small deterministic generator (xorshift64*), so the test needs no
/// extra crate and fails the same way every time.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn local(healthy: bool, queue_depth: u32, latency_ms: f64, vram_free_mb: u64) -> PoolMeasurements {
    PoolMeasurements {
        vram_free_mb: Some(vram_free_mb),
        queue_depth: Some(queue_depth),
        latency_ms: Some(latency_ms),
        healthy: Some(healthy),
        ..PoolMeasurements::default()
    }
}

fn situation(risk: Risk, m: PoolMeasurements, structured: bool) -> Situation {
    let mut s = Situation {
        risk: Some(risk),
        structured_output: structured,
        ..Situation::default()
    };
    // One Ollama host serves both local pools: the same capacity.
    s.pools.insert("local-medium".into(), m);
    s.pools.insert("local-small".into(), m);
    s
}

#[test]
fn the_engine_answers_as_the_seed_on_10000_random_situations() {
    let policy = agents();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let interesting_vram = [0, 5_999, 6_000, 6_001, 21_999, 22_000, 22_001, 65_536];
    let interesting_latency = [0.0, 1_399.9, 1_400.0, 1_400.1, 5_000.0];
    for i in 0..10_000 {
        let risk = Risk::ALL[rng.below(4) as usize];
        let healthy = rng.below(5) != 0;
        let queue_depth = rng.below(8) as u32;
        let latency = if rng.below(2) == 0 {
            interesting_latency[rng.below(interesting_latency.len() as u64) as usize]
        } else {
            rng.below(3_000_000) as f64 / 1000.0
        };
        let vram = if rng.below(2) == 0 {
            interesting_vram[rng.below(interesting_vram.len() as u64) as usize]
        } else {
            rng.below(70_000)
        };
        let structured = rng.below(2) == 0;
        let (want_pool, want_approval) =
            seed_route(risk, healthy, queue_depth, latency, vram, structured);
        let s = situation(risk, local(healthy, queue_depth, latency, vram), structured);
        let got = explain(&policy, &s);
        assert_eq!(
            (got.pool.as_deref(), got.requires_approval),
            (Some(want_pool), want_approval),
            "case {i}: {s:?}\nreason: {}",
            got.reason
        );
    }
}

fn reason_of(policy: &Policy, s: &Situation) -> (Option<String>, Option<Refusal>, String) {
    let d = decide(policy, s);
    (d.candidates.first().cloned(), d.refusal, d.reason)
}

/// One row of the seed's failure-modes table per case.
#[test]
fn the_failure_modes_table() {
    let policy = agents();
    let healthy_local = local(true, 1, 300.0, 30_000);

    // Local GPU full: route to cloud cheap.
    let s = situation(Risk::Read, local(true, 1, 300.0, 4_000), false);
    let (pool, refusal, reason) = reason_of(&policy, &s);
    assert_eq!((pool.as_deref(), refusal), (Some("cloud-cheap"), None));
    assert_eq!(
        reason,
        "route \"default\" (risk READ); local-medium skipped: free VRAM 4000 MB <= 22000 MB; \
         local-small skipped: free VRAM 4000 MB <= 6000 MB; cloud-cheap chosen"
    );

    // Local model returns malformed JSON: degraded for structured output,
    // structured requests go to cloud strong.
    let mut degraded = healthy_local;
    degraded.structured_degraded = true;
    let s = situation(Risk::Draft, degraded, true);
    let (pool, _, reason) = reason_of(&policy, &s);
    assert_eq!(pool.as_deref(), Some("cloud-strong"));
    assert!(
        reason.contains("local-medium skipped: degraded for structured output"),
        "{reason}"
    );
    assert!(
        reason.contains("cloud-cheap skipped: no structured output"),
        "{reason}"
    );
    // ...while plain requests still use the local model.
    let s = situation(Risk::Draft, degraded, false);
    assert_eq!(reason_of(&policy, &s).0.as_deref(), Some("local-medium"));

    // Cloud provider 429: its circuit opens; the next provider takes it.
    let mut s = situation(Risk::Read, local(true, 9, 300.0, 30_000), false);
    s.pools.insert(
        "cloud-cheap".into(),
        PoolMeasurements {
            healthy: Some(false),
            ..PoolMeasurements::default()
        },
    );
    let (pool, _, reason) = reason_of(&policy, &s);
    assert_eq!(pool.as_deref(), Some("cloud-strong"));
    assert!(
        reason.contains("cloud-cheap skipped: unhealthy"),
        "{reason}"
    );

    // Cloud cost ceiling hit: a hard stop, budget_exceeded.
    let mut s = situation(Risk::Read, local(false, 0, 0.0, 30_000), false);
    s.input_tokens = Some(20_000);
    s.max_tokens = Some(4_000);
    // cheap: 20 x 0.0003 + 4 x 0.0007 = 0.0088 (fits); make it not fit:
    s.input_tokens = Some(300_000);
    let (pool, refusal, reason) = reason_of(&policy, &s);
    assert_eq!(
        (pool, refusal),
        (None, Some(Refusal::BudgetExceeded)),
        "{reason}"
    );
    assert!(
        reason.contains("cloud-cheap skipped: estimated cost $0.0928 > ceiling $0.0800"),
        "{reason}"
    );
    // The local pools were unhealthy, not over the ceiling: the reason
    // does not say every pool was.
    assert!(
        reason.contains("local-medium skipped: unhealthy")
            && reason.ends_with("the pools the other gates allow are over the cost ceiling"),
        "{reason}"
    );

    // Latency budget exceeded: local is too slow for 0.7 x 2000 ms.
    let s = situation(Risk::Read, local(true, 0, 1_500.0, 30_000), false);
    let (pool, _, reason) = reason_of(&policy, &s);
    assert_eq!(pool.as_deref(), Some("cloud-cheap"));
    assert!(
        reason.contains("local-medium skipped: latency 1500 ms > 0.7 x 2000 ms deadline (1400 ms)"),
        "{reason}"
    );
    // A tighter deadline from the request moves the limit.
    let mut s = situation(Risk::Read, local(true, 0, 500.0, 30_000), false);
    s.deadline_ms = Some(600);
    assert_eq!(reason_of(&policy, &s).0.as_deref(), Some("cloud-cheap"));

    // All backends down: no_backend, and the reason names each.
    let mut s = situation(Risk::Read, local(false, 0, 0.0, 30_000), false);
    for cloud in ["cloud-cheap", "cloud-strong"] {
        s.pools.insert(
            cloud.into(),
            PoolMeasurements {
                healthy: Some(false),
                ..PoolMeasurements::default()
            },
        );
    }
    let (pool, refusal, reason) = reason_of(&policy, &s);
    assert_eq!((pool, refusal), (None, Some(Refusal::NoBackend)));
    assert_eq!(reason.matches("skipped: unhealthy").count(), 4, "{reason}");

    // Governance: SEND goes to cloud strong with approval, never elsewhere.
    let mut s = situation(Risk::Send, healthy_local, false);
    let e = explain(&policy, &s);
    assert_eq!(e.pool.as_deref(), Some("cloud-strong"));
    assert!(e.requires_approval);
    assert_eq!(
        e.model.as_deref(),
        Some("anthropic/claude-sonnet-4-20250514")
    );
    assert_eq!(e.provider.as_deref(), Some("openai"));
    s.pools.insert(
        "cloud-strong".into(),
        PoolMeasurements {
            healthy: Some(false),
            ..PoolMeasurements::default()
        },
    );
    assert_eq!(reason_of(&policy, &s).1, Some(Refusal::NoBackend));
}

#[test]
fn boundaries_are_exactly_as_the_contract_states() {
    let policy = agents();
    // Queue depth 4 holds (> fails); VRAM 22000 fails (<= fails);
    // latency 1400 holds (> 0.7 x 2000 fails).
    let s = situation(Risk::Read, local(true, 4, 1_400.0, 22_001), false);
    assert_eq!(reason_of(&policy, &s).0.as_deref(), Some("local-medium"));
    let s = situation(Risk::Read, local(true, 4, 1_400.0, 22_000), false);
    assert_eq!(reason_of(&policy, &s).0.as_deref(), Some("local-small"));
    let s = situation(Risk::Read, local(true, 5, 1_400.0, 30_000), false);
    assert_eq!(reason_of(&policy, &s).0.as_deref(), Some("cloud-cheap"));
    let s = situation(Risk::Read, local(true, 4, 1_400.1, 30_000), false);
    assert_eq!(reason_of(&policy, &s).0.as_deref(), Some("cloud-cheap"));
}

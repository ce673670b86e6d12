//! The drill's scenarios at 1/20 of their durations.
//!
//! The drill judges latencies against bounds with 40 ms of slack, so its
//! tests run in a binary of their own (cargo runs test binaries one after
//! another) and one at a time ([`one_at_a_time`]): on two cores, sixty
//! other tests' proxies starve a 50 ms watchdog by more than its slack,
//! and the drill then reports the machine, not the router.

#![allow(clippy::unwrap_used)]

use routerctl::drill::{render_table, run_all, target_policy, DrillConfig, Scenario};

/// Held by each test for its whole run (each test has its own runtime;
/// tokio's mutex wakes a waiter on another one).
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Issue 20, item 3: against a router set up with `--print-policy`'s
/// policy, `--scenario all` skips, with the reason, the scenario that
/// needs another policy (it used to report a false FAIL), and the printed
/// policy is the one each scenario needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_target_a_scenario_needing_another_policy_is_skipped_not_failed() {
    let _serial = one_at_a_time().await;
    let mut cfg = DrillConfig {
        primary_port: router_tests::server_process::free_port(),
        fallback_port: router_tests::server_process::free_port(),
        ..DrillConfig::default()
    }
    .scaled(20.0);
    let long = target_policy(Scenario::BaselineLongAttempt, &cfg);
    let default = target_policy(Scenario::Baseline, &cfg);
    assert_ne!(
        long, default,
        "the long-attempt scenario has its own policy"
    );
    let router =
        router_tests::harness::TestProxy::with_policy(router_proxy::Settings::default(), &default)
            .await;
    cfg.target = Some(router.url(""));
    let reports = run_all(&Scenario::ALL, &cfg).await.unwrap();
    let table = render_table(&reports);
    for r in &reports {
        match r.scenario.as_str() {
            "baseline-long-attempt" => {
                let why = r.skipped.as_deref().unwrap_or_default();
                assert!(
                    why.contains("--print-policy --scenario baseline-long-attempt"),
                    "{table}"
                );
            }
            "drain" | "all-down" => assert!(r.skipped.is_some(), "{table}"),
            "stream-first-token" | "stream-stall" => {
                let why = r.skipped.as_deref().unwrap_or_default();
                assert!(why.contains("--print-policy --scenario stream-"), "{table}");
            }
            // Needs its own policy too (a first-token timeout).
            "stream-error" => assert!(r.skipped.is_some(), "{table}"),
            _ => assert!(r.skipped.is_none() && r.pass, "{table}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_drill_scenario_passes_at_one_twentieth_scale() {
    let _serial = one_at_a_time().await;
    let cfg = DrillConfig::default().scaled(20.0);
    let reports = run_all(&Scenario::ALL, &cfg).await.unwrap();
    let table = render_table(&reports);
    assert_eq!(reports.len(), 9);
    for r in &reports {
        assert!(r.skipped.is_none(), "{table}");
        assert!(r.pass, "{} failed:\n{table}", r.scenario);
        assert_eq!(r.duplicate_generations, 0, "{table}");
        assert_eq!(r.requests, 40);
    }
    let baseline = &reports[0];
    assert_eq!(baseline.routes.get("fallback"), Some(&40), "{table}");
    let long = &reports[1];
    assert!(
        (1..=3).contains(long.routes.get("primary").unwrap_or(&0)),
        "{table}"
    );
    let degraded = &reports[2];
    assert!(
        degraded.max_s <= (cfg.deadline + cfg.tolerance).as_secs_f64(),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_proxies_on_one_redis_with_round_robin_client_retries_never_generate_twice() {
    let _serial = one_at_a_time().await;
    let redis = router_tests::redis::RedisServer::start("drill").await;
    let cfg = DrillConfig {
        proxies: 3,
        shared_store: Some(redis.url()),
        ..DrillConfig::default()
    }
    .scaled(20.0);
    let reports = run_all(&Scenario::ALL, &cfg).await.unwrap();
    let table = render_table(&reports);
    for r in &reports {
        assert!(r.pass, "{} failed:\n{table}", r.scenario);
        assert_eq!(r.duplicate_generations, 0, "{table}");
    }
    // The client did retry on other proxies (the slow first requests time
    // out on the client's side), and those retries generated nothing.
    let retries: usize = reports.iter().map(|r| r.client_retries).sum();
    assert!(retries > 0, "no retry happened:\n{table}");
}

/// Issue 19: every pool down, the requests are parked (a handle each, at
/// once); when the pools return every READ task runs once and is fetched
/// through another proxy; no SEND task is sent without approval. Two
/// proxies on one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_down_scenario_parks_every_request_and_runs_each_read_task_once() {
    let _serial = one_at_a_time().await;
    let redis = router_tests::redis::RedisServer::start("drill-all-down").await;
    let cfg = DrillConfig {
        proxies: 2,
        shared_store: Some(redis.url()),
        ..DrillConfig::default()
    }
    .scaled(20.0);
    let reports = run_all(&[Scenario::AllDown], &cfg).await.unwrap();
    let table = render_table(&reports);
    println!("{table}");
    let r = &reports[0];
    assert!(r.pass, "{table}");
    assert_eq!(r.requests, 40);
    assert_eq!(r.sheds.get("parked"), Some(&40), "{table}");
    assert_eq!(r.routes.values().sum::<usize>(), 30, "{table}");
}

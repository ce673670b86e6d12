//! The drill's scenarios at 1/20 of their durations.

use routerctl::drill::{render_table, run_all, DrillConfig, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_drill_scenario_passes_at_one_twentieth_scale() {
    let cfg = DrillConfig::default().scaled(20.0);
    let reports = run_all(&Scenario::ALL, &cfg).await.unwrap();
    let table = render_table(&reports);
    assert_eq!(reports.len(), 5);
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

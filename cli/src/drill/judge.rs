//! Judging a scenario's run against what the seed promises: one check per
//! promise, each with what was expected and what was seen.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(super) fn judge(
    scenario: Scenario,
    cfg: &DrillConfig,
    primary_attempt: Duration,
    fallback_latency: Duration,
    outcomes: &[Outcome],
    primary: &MockModel,
    fallback: &MockModel,
    drained: Option<Instant>,
) -> ScenarioReport {
    let mut routes: BTreeMap<String, usize> = BTreeMap::new();
    let mut sheds: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes {
        let key = if o.status == 200 {
            o.route.clone().unwrap_or_else(|| "?".into())
        } else {
            "shed".into()
        };
        *routes.entry(key).or_default() += 1;
        if let Some(e) = &o.error {
            *sheds.entry(e.clone()).or_default() += 1;
        }
    }
    let mut generations: HashMap<String, Vec<Instant>> = HashMap::new();
    for g in primary
        .generations()
        .into_iter()
        .chain(fallback.generations())
    {
        if let Some(id) = g.request_id {
            generations.entry(id).or_default().push(g.at);
        }
    }
    let duplicates = generations.values().filter(|v| v.len() > 1).count();
    let retries: usize = outcomes.iter().map(|o| o.retries).sum();
    let mut elapsed: Vec<Duration> = outcomes.iter().map(|o| o.elapsed).collect();
    elapsed.sort_unstable();
    let (p50, p95, max) = (
        percentile(&elapsed, 0.50),
        percentile(&elapsed, 0.95),
        elapsed.last().copied().unwrap_or_default(),
    );
    let n = outcomes.len();
    let ok = outcomes.iter().filter(|o| o.status == 200).count();
    let by = |pool: &str| {
        outcomes
            .iter()
            .filter(|o| o.status == 200 && o.route.as_deref() == Some(pool))
            .count()
    };
    let scale = cfg.deadline.as_secs_f64() / 8.0;
    let tol = cfg.tolerance;
    let mut checks = Vec::new();
    check(
        &mut checks,
        "no duplicate generations",
        duplicates.to_string(),
        duplicates == 0,
    );
    if cfg.proxies > 1 {
        // Not a pass condition (how many time out depends on the
        // scenario): shows that retries did reach other proxies.
        check(
            &mut checks,
            format!("client retries spread over {} proxies", cfg.proxies),
            retries.to_string(),
            true,
        );
    }
    // How the streams ended (stream scenarios).
    let mut endings: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes.iter().filter_map(|o| o.ending.as_ref()) {
        *endings.entry(o.clone()).or_default() += 1;
    }
    let endings_seen = format!("{endings:?}");
    // Every scenario but the degraded fallback must answer everything.
    if scenario != Scenario::FallbackDegraded {
        check(
            &mut checks,
            format!("all {n} answered 200"),
            format!("{ok}/{n}"),
            ok == n,
        );
    }
    match scenario {
        Scenario::Baseline => {
            check(
                &mut checks,
                "none served by the primary",
                by("primary").to_string(),
                by("primary") == 0,
            );
            check(
                &mut checks,
                "no sheds",
                sheds.values().sum::<usize>().to_string(),
                sheds.is_empty(),
            );
            let p50_max = Duration::from_secs_f64(1.0 * scale);
            let p95_max = Duration::from_secs_f64(3.5 * scale);
            // Each proxy learns the primary's latency on its own: with N
            // proxies, N first requests probe it (one does with one
            // proxy); p95 is taken without the N-1 extra probes.
            let extra_probes = cfg.proxies.max(1) - 1;
            let p95 = percentile(&elapsed[..elapsed.len().saturating_sub(extra_probes)], 0.95);
            let p95_label = if extra_probes > 0 {
                format!(
                    "p95 under {} (without the {extra_probes} extra proxies' first probes)",
                    secs(p95_max)
                )
            } else {
                format!("p95 under {}", secs(p95_max))
            };
            check(
                &mut checks,
                format!("p50 under {}", secs(p50_max)),
                secs(p50),
                p50 < p50_max,
            );
            check(&mut checks, p95_label, secs(p95), p95 < p95_max);
        }
        Scenario::BaselineLongAttempt => {
            let p = by("primary");
            check(
                &mut checks,
                "1 to 3 served by the primary",
                p.to_string(),
                (1..=3).contains(&p),
            );
            check(
                &mut checks,
                "the rest by the fallback",
                by("fallback").to_string(),
                by("fallback") + p == n,
            );
            check(
                &mut checks,
                "no sheds",
                sheds.values().sum::<usize>().to_string(),
                sheds.is_empty(),
            );
        }
        Scenario::FallbackDegraded => {
            let limit = cfg.deadline + tol;
            check(
                &mut checks,
                format!("no answer after {}", secs(limit)),
                secs(max),
                max <= limit,
            );
            let bad: Vec<&String> = sheds
                .keys()
                .filter(|k| *k != "deadline_exhausted")
                .collect();
            check(
                &mut checks,
                "every non-200 is deadline_exhausted",
                if bad.is_empty() {
                    "yes".into()
                } else {
                    format!("{bad:?}")
                },
                bad.is_empty(),
            );
            let sent: HashMap<&str, Instant> = outcomes
                .iter()
                .map(|o| (o.id.as_str(), o.sent_at))
                .collect();
            let late = generations
                .iter()
                .filter(|(id, ats)| {
                    sent.get(id.as_str()).is_some_and(|s| {
                        ats.iter().any(|a| a.saturating_duration_since(*s) > limit)
                    })
                })
                .count();
            check(
                &mut checks,
                "no generation completes after its deadline",
                late.to_string(),
                late == 0,
            );
        }
        Scenario::PrimaryHang => {
            check(
                &mut checks,
                "all by the fallback",
                by("fallback").to_string(),
                by("fallback") == n,
            );
            // A retry that joined the first request sees its answer at the
            // next poll of the shared store (at most 50 ms later).
            let join_poll = if cfg.proxies > 1 {
                router_policy::idempotency::JoinBackoff::DEFAULT.max
            } else {
                Duration::ZERO
            };
            let limit = primary_attempt + fallback_latency + tol + join_poll;
            check(
                &mut checks,
                format!("none waits more than {}", secs(limit)),
                secs(max),
                max <= limit,
            );
            // After the first attempt was given up on, the primary is
            // skipped at once. The hung primary accepts and never answers,
            // so a request that tried it waited its whole attempt timeout
            // and then the fallback: that, not the fallback's time plus
            // scheduling noise, is what tells a later request that waited
            // on it from one that did not.
            let first_sent = outcomes.first().map(|o| o.sent_at);
            let later_slow = outcomes
                .iter()
                .filter(|o| first_sent.is_some_and(|f| o.sent_at > f + primary_attempt + tol))
                .filter(|o| o.elapsed >= primary_attempt)
                .count();
            check(
                &mut checks,
                "after the first timeout the primary is skipped at once",
                format!("{later_slow} later requests waited on it"),
                later_slow == 0,
            );
        }
        // Judged below, with the other stream checks.
        Scenario::StreamFirstToken
        | Scenario::StreamStall
        | Scenario::StreamError
        | Scenario::AllDown => {}
        Scenario::Drain => {
            // Judged by when the client sent each request: one sent before
            // the drain may still be on its way to the primary when the
            // drain lands, and that is allowed; one sent after must not.
            let at = drained.unwrap_or_else(Instant::now);
            let sent_after: std::collections::HashSet<&str> = outcomes
                .iter()
                .filter(|o| o.sent_at >= at)
                .map(|o| o.id.as_str())
                .collect();
            let at_primary = primary.requests();
            let after = at_primary
                .iter()
                .filter(|r| {
                    r.headers
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|id| sent_after.contains(id))
                })
                .count();
            let before = at_primary.len() - after;
            check(
                &mut checks,
                "the primary carried traffic before the drain",
                before.to_string(),
                before > 0,
            );
            check(
                &mut checks,
                "no request sent after the drain reaches the primary",
                after.to_string(),
                after == 0,
            );
        }
    }
    if scenario.streams() {
        // A request may wait for the primary's slots for its attempt
        // timeout, then be answered by the fallback, whose stream takes
        // its first token and its body; a stall adds its timeout. Without
        // the watchdogs a stream would end at the deadline instead.
        let (cut, extra) = match scenario {
            Scenario::StreamFirstToken => ("", Duration::ZERO),
            Scenario::StreamStall => ("stream_stalled", cfg.deadline / 8),
            _ => ("stream_error", Duration::ZERO),
        };
        let limit =
            primary_attempt + fallback_latency + stream_body(cfg) + extra + cfg.tolerance * 2;
        check(
            &mut checks,
            format!("none waits more than {}", secs(limit)),
            secs(max),
            max <= limit,
        );
        let ended = endings.get("done").copied().unwrap_or(0)
            + if cut.is_empty() {
                0
            } else {
                endings.get(cut).copied().unwrap_or(0)
            };
        let expect = if cut.is_empty() {
            format!("all {n} streams complete")
        } else {
            format!("every stream ends: [DONE] or one {cut} event")
        };
        check(&mut checks, expect, endings_seen.clone(), ended == n);
        match scenario {
            Scenario::StreamFirstToken => {
                check(
                    &mut checks,
                    "all by the fallback",
                    by("fallback").to_string(),
                    by("fallback") == n,
                );
                let done = primary.stats().completed;
                check(
                    &mut checks,
                    "no primary generation completes",
                    done.to_string(),
                    done == 0,
                );
            }
            _ => {
                let cuts = endings.get(cut).copied().unwrap_or(0);
                check(
                    &mut checks,
                    format!("at least one stream cut with {cut}"),
                    cuts.to_string(),
                    cuts > 0,
                );
                let leaked = outcomes.iter().filter(|o| o.leaked).count();
                check(
                    &mut checks,
                    "no backend error text reaches a client",
                    leaked.to_string(),
                    leaked == 0,
                );
            }
        }
    }
    let pass = checks.iter().all(|c| c.pass);
    ScenarioReport {
        scenario: scenario.name().into(),
        requests: n,
        routes,
        sheds,
        duplicate_generations: duplicates,
        abandoned: primary.stats().cancelled + fallback.stats().cancelled,
        p50_s: p50.as_secs_f64(),
        p95_s: p95.as_secs_f64(),
        max_s: max.as_secs_f64(),
        client_retries: retries,
        checks,
        pass,
        skipped: None,
    }
}

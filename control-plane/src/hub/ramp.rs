//! Ramps driven: each second, on the leading replica, every ramped split
//! of the current policy gets `router_policy::ramp::decide`'s verdict over
//! its step's window, and an advance or a rollback is applied as a new
//! policy version (docs/traffic.md "Ramps").
//!
//! **The window.** Proxies send, with each heartbeat, what each side of a
//! ramped split did since the last one (requests, errors, latency counts
//! in the ramp's fixed log buckets: `LoadReport.outcomes`). The hub adds
//! them into one window per (route, split): both sides' sums since the
//! step began. A step begins when the driver first sees the split at its
//! current weight (a new version that changes the weight, an operator's
//! apply, this replica taking the lead): the window is kept in memory
//! only, so a replica that takes over starts the step's window afresh,
//! and reports that arrive while no window is open are dropped. A report
//! sent within one heartbeat of a change may count in the next step.
//! Only the reports of the proxies connected to the leading replica count
//! (each proxy reports to the replica it is connected to).
//!
//! **The change.** An advance sets the split's weights to `new: to, old:
//! 100 - to`, a rollback to `new: 0, old: 100`: the current document is
//! parsed, the split's weights changed and the document serialized again
//! (its comments and layout are lost), then applied through
//! [`Hub::apply_policy_by`] as author `ramp` with the reason as the
//! version's note, expecting the current version (a concurrent apply wins;
//! the driver judges again on the next tick).
//!
//! **Operators.** `pause` keeps a route's ramps from advancing (the
//! windows keep counting, and a rollback still happens), `resume` lets
//! them advance again, `abort` sets the new
//! side to 0 with the note `ramp: aborted by operator`. Pauses are kept in
//! memory, like the windows.

use std::collections::BTreeSet;

use router_policy::document::ChainStepSpec;
use router_policy::ramp::{decide, LatencyBuckets, Ramp, SideWindow, Verdict};
use router_policy::ChainStep;

use super::*;

/// The author of the versions a ramp writes.
pub const RAMP_AUTHOR: &str = "ramp";

/// One side's sums over a window.
#[derive(Debug, Clone, Default)]
pub struct SideSums {
    /// Attempts.
    pub requests: u64,
    /// Of those, errors.
    pub errors: u64,
    /// Their latencies.
    pub latency: LatencyBuckets,
}

impl SideSums {
    fn add(&mut self, o: &pb::RampOutcomes) {
        self.requests = self.requests.saturating_add(o.requests);
        self.errors = self.errors.saturating_add(o.errors.min(o.requests));
        for (sum, c) in self.latency.counts.iter_mut().zip(&o.latency_buckets) {
            *sum = sum.saturating_add(*c);
        }
    }

    /// What `router_policy::ramp::decide` reads.
    pub fn window(&self) -> SideWindow {
        SideWindow {
            requests: self.requests,
            errors: self.errors,
            p95_ms: self.latency.quantile_ms(0.95),
        }
    }
}

/// One ramped split's step window.
#[derive(Debug, Clone)]
pub struct RampWindow {
    /// The route.
    pub route: String,
    /// The split's position in the route's chain.
    pub step: usize,
    /// The new side's pool.
    pub new_pool: String,
    /// The old side's pool.
    pub old_pool: String,
    /// The new side's weight the window is about.
    pub weight: u32,
    /// When the step began (for this replica).
    pub started: Instant,
    /// The new side's sums.
    pub new: SideSums,
    /// The old side's sums.
    pub old: SideSums,
    /// The ramp, as the policy has it.
    pub ramp: Ramp,
}

impl RampWindow {
    /// The verdict now.
    pub fn verdict(&self) -> Verdict {
        decide(
            &self.ramp,
            self.weight,
            self.started.elapsed(),
            &self.new.window(),
            &self.old.window(),
        )
    }
}

/// The driver's memory: windows and paused routes.
#[derive(Debug, Default)]
pub(super) struct Ramps {
    windows: Vec<RampWindow>,
    paused: BTreeSet<String>,
}

/// The ramped splits of `policy`: (route, chain position, new pool, old
/// pool, new weight, ramp).
fn ramped(policy: &Policy) -> Vec<(String, usize, String, String, u32, Ramp)> {
    let mut out = Vec::new();
    for route in &policy.routes {
        for (i, step) in route.chain.iter().enumerate() {
            let ChainStep::Split(split) = step else {
                continue;
            };
            let (Some(ramp), [new, old]) = (&split.ramp, split.sides.as_slice()) else {
                continue;
            };
            out.push((
                route.name.clone(),
                i,
                new.pool.clone(),
                old.pool.clone(),
                new.weight,
                ramp.clone(),
            ));
        }
    }
    out
}

/// `document` with the split at `step` of `route` weighted `new: weight,
/// old: 100 - weight`, serialized again (comments and layout are lost).
pub fn with_weight(
    document: &str,
    route: &str,
    step: usize,
    weight: u32,
) -> Result<String, HubError> {
    let invalid = |reason: String| {
        HubError::Invalid(vec![FieldError {
            field: format!("route {route}"),
            reason,
        }])
    };
    let mut doc = PolicyDocument::parse(document).map_err(|e| invalid(e.to_string()))?;
    let spec = doc
        .spec
        .routes
        .iter_mut()
        .find(|r| r.name == route)
        .ok_or_else(|| invalid("no such route".into()))?;
    let Some(ChainStepSpec::Split(split)) = spec.chain.get_mut(step) else {
        return Err(invalid(format!("chain step {step} is not a split")));
    };
    let [new, old] = split.split.as_mut_slice() else {
        return Err(invalid("the split does not have two sides".into()));
    };
    new.weight = weight.min(100);
    old.weight = 100 - new.weight;
    serde_yaml_ng::to_string(&doc).map_err(|e| invalid(e.to_string()))
}

impl Hub {
    /// Adds a proxy's heartbeat outcomes to the open windows.
    pub fn ramp_reported(&self, outcomes: &[pb::RampOutcomes]) {
        if outcomes.is_empty() {
            return;
        }
        let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
        for o in outcomes {
            for w in ramps.windows.iter_mut().filter(|w| w.route == o.route) {
                if w.new_pool == o.pool {
                    w.new.add(o);
                } else if w.old_pool == o.pool {
                    w.old.add(o);
                }
            }
        }
    }

    /// The open windows (a route's only with `route`).
    pub fn ramp_windows(&self, route: Option<&str>) -> Vec<RampWindow> {
        let ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
        ramps
            .windows
            .iter()
            .filter(|w| route.is_none_or(|r| w.route == r))
            .cloned()
            .collect()
    }

    /// Whether `route`'s ramps are paused.
    pub fn ramp_paused(&self, route: &str) -> bool {
        let ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
        ramps.paused.contains(route)
    }

    /// Pauses (or resumes) `route`'s ramps on this replica.
    pub fn pause_ramp(&self, route: &str, paused: bool) {
        let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
        if paused {
            ramps.paused.insert(route.to_string());
        } else {
            ramps.paused.remove(route);
        }
    }

    /// Sets the new side of `route`'s split at `step` to `weight` as a new
    /// policy version noted `note`.
    pub async fn set_ramp_weight(
        &self,
        route: &str,
        step: usize,
        weight: u32,
        note: &str,
    ) -> Result<PolicyApplied, HubError> {
        let (document, version) = {
            let inner = self.lock();
            let current = inner.state.policy_version;
            let record = inner
                .history
                .iter()
                .find(|p| p.version == current)
                .ok_or_else(|| HubError::NotFound("no policy applied yet".into()))?;
            (record.document.clone(), current)
        };
        let next = with_weight(&document, route, step, weight)?;
        let who = Applier {
            author: RAMP_AUTHOR,
            operator: RAMP_AUTHOR,
            message: note,
        };
        let applied = self.apply_policy_by(&next, false, version, &who).await?;
        // The next tick opens the new step's window.
        let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
        ramps
            .windows
            .retain(|w| !(w.route == route && w.step == step));
        Ok(applied)
    }

    /// One tick: windows opened for the current policy's ramped splits
    /// (and closed for the others), and, when leading, each verdict
    /// applied. Not leading: no windows are kept.
    pub async fn ramp_tick(&self) {
        if !self.leading() {
            let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
            ramps.windows.clear();
            return;
        }
        let splits = self.current_policy().map_or_else(Vec::new, |p| ramped(&p));
        let mut actions = Vec::new();
        {
            let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
            let mut kept = Vec::with_capacity(splits.len());
            for (route, step, new_pool, old_pool, weight, ramp) in splits {
                let found = ramps.windows.iter().position(|w| {
                    w.route == route
                        && w.step == step
                        && w.new_pool == new_pool
                        && w.old_pool == old_pool
                        && w.weight == weight
                });
                let window = match found {
                    Some(i) => {
                        let mut w = ramps.windows.swap_remove(i);
                        w.ramp = ramp;
                        w
                    }
                    None => RampWindow {
                        route,
                        step,
                        new_pool,
                        old_pool,
                        weight,
                        started: Instant::now(),
                        new: SideSums::default(),
                        old: SideSums::default(),
                        ramp,
                    },
                };
                // Paused: no advance; a rollback still protects.
                let paused = ramps.paused.contains(&window.route);
                match window.verdict() {
                    Verdict::Advance { from, to, why } if !paused => actions.push((
                        window.route.clone(),
                        step,
                        to,
                        format!("ramp: route {} new {from}% -> {to}% ({why})", window.route),
                    )),
                    Verdict::RollBack { from, why } => actions.push((
                        window.route.clone(),
                        step,
                        0,
                        format!(
                            "ramp: route {} rolled back to 0 from {from}%: {why}",
                            window.route
                        ),
                    )),
                    _ => {}
                }
                kept.push(window);
            }
            ramps.windows = kept;
        }
        for (route, step, weight, note) in actions {
            let mut note = note;
            while note.len() > MAX_NOTE {
                note.pop();
            }
            match self.set_ramp_weight(&route, step, weight, &note).await {
                Ok(a) => tracing::info!(route, weight, version = a.version, note, "ramp moved"),
                Err(e) => {
                    tracing::warn!(route, weight, error = %e, "ramp step not applied; judged again next tick")
                }
            }
        }
    }
}

/// The words of a verdict: its detail.
fn detail(v: &Verdict) -> String {
    use router_policy::ramp::Hold;
    match v {
        Verdict::Hold(Hold::InStep { left }) => {
            format!("the step has {} ms left", left.as_millis())
        }
        Verdict::Hold(Hold::TooFewRequests { side, have, need }) => {
            format!("the {side} side has {have} of {need} requests")
        }
        Verdict::Advance { from, to, why } => format!("{from}% -> {to}%: {why}"),
        Verdict::RollBack { from, why } => format!("{from}% -> 0: {why}"),
        Verdict::Done => "at the last step".into(),
        Verdict::Stopped => "at 0 (rolled back or aborted): apply a step to start again".into(),
    }
}

/// What `routerctl rollout` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutAction {
    /// Each ramp's step, weight, window and verdict.
    Status,
    /// Keep the route's ramps from advancing (a rollback still happens).
    Pause,
    /// Let them advance again.
    Resume,
    /// Set the new sides to 0 (`ramp: aborted by operator`).
    Abort,
}

impl RolloutAction {
    /// `status`, `pause`, `resume`, `abort`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "status" | "" => Some(Self::Status),
            "pause" => Some(Self::Pause),
            "resume" => Some(Self::Resume),
            "abort" => Some(Self::Abort),
            _ => None,
        }
    }
}

impl Hub {
    /// `routerctl rollout ACTION ROUTE`: the route's ramps after it.
    pub async fn rollout(
        &self,
        route: &str,
        action: RolloutAction,
    ) -> Result<pb::RolloutResponse, HubError> {
        let splits: Vec<_> = self
            .current_policy()
            .map_or_else(Vec::new, |p| ramped(&p))
            .into_iter()
            .filter(|s| s.0 == route)
            .collect();
        if splits.is_empty() {
            return Err(HubError::NotFound(format!(
                "route {route:?} has no ramped split in the current policy"
            )));
        }
        match action {
            RolloutAction::Status => {}
            RolloutAction::Pause => self.pause_ramp(route, true),
            RolloutAction::Resume => self.pause_ramp(route, false),
            RolloutAction::Abort => {
                for (_, step, _, _, weight, _) in &splits {
                    if *weight > 0 {
                        self.set_ramp_weight(route, *step, 0, "ramp: aborted by operator")
                            .await?;
                    }
                }
            }
        }
        let version = self.lock().state.policy_version;
        let splits = self
            .current_policy()
            .map_or_else(Vec::new, |p| ramped(&p))
            .into_iter()
            .filter(|s| s.0 == route);
        let windows = self.ramp_windows(Some(route));
        let paused = self.ramp_paused(route);
        let ramps = splits
            .map(|(route, step, new_pool, old_pool, weight, ramp)| {
                let w = windows
                    .iter()
                    .find(|w| w.step == step && w.weight == weight && w.new_pool == new_pool);
                let verdict = match w {
                    Some(w) => w.verdict(),
                    None => decide(
                        &ramp,
                        weight,
                        Duration::ZERO,
                        &SideWindow::default(),
                        &SideWindow::default(),
                    ),
                };
                let (new, old) = w.map_or_else(
                    || (SideWindow::default(), SideWindow::default()),
                    |w| (w.new.window(), w.old.window()),
                );
                pb::RampStatus {
                    route,
                    step: u32::try_from(step).unwrap_or(u32::MAX),
                    new_pool,
                    old_pool,
                    weight,
                    steps: ramp.steps.clone(),
                    step_seconds: ramp.step.as_secs(),
                    paused,
                    window: w.is_some(),
                    elapsed_ms: w.map_or(0, |w| {
                        u64::try_from(w.started.elapsed().as_millis()).unwrap_or(u64::MAX)
                    }),
                    new_requests: new.requests,
                    new_errors: new.errors,
                    new_p95_ms: new.p95_ms,
                    old_requests: old.requests,
                    old_errors: old.errors,
                    old_p95_ms: old.p95_ms,
                    verdict: verdict.label().into(),
                    detail: detail(&verdict),
                }
            })
            .collect();
        Ok(pb::RolloutResponse { ramps, version })
    }
}

/// Every second, until the hub is gone: [`Hub::ramp_tick`].
pub async fn ramp_loop(hub: Weak<Hub>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(h) = hub.upgrade() else { return };
        h.ramp_tick().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_weight_changes_only_the_split_and_the_document_stays_valid() {
        let doc = "apiVersion: router/v1\nkind: RoutingPolicy\n# a comment\nspec:\n  pools:\n    - {name: new, endpoints: [\"127.0.0.1:9\"]}\n    - {name: old, endpoints: [\"127.0.0.1:8\"]}\n  routes:\n    - name: r\n      chain: [{split: [{pool: new, weight: 10}, {pool: old, weight: 90}], ramp: {steps: [10, 50, 100], step_s: 1, guard: {min_requests: 20}}}]\n";
        let next = with_weight(doc, "r", 0, 50).unwrap();
        let policy = router_policy::document::load(&next, &QueueSettings::default())
            .unwrap_or_else(|e| panic!("{e:?}\n{next}"));
        let ChainStep::Split(s) = &policy.routes[0].chain[0] else {
            panic!("{next}")
        };
        assert_eq!(
            s.sides.iter().map(|x| x.weight).collect::<Vec<_>>(),
            [50, 50]
        );
        assert_eq!(
            s.ramp.as_ref().map(|r| r.steps.clone()),
            Some(vec![10, 50, 100])
        );
        let before = PolicyDocument::parse(doc).unwrap();
        let mut after = PolicyDocument::parse(&next).unwrap();
        if let ChainStepSpec::Split(s) = &mut after.spec.routes[0].chain[0] {
            s.split[0].weight = 10;
            s.split[1].weight = 90;
        }
        assert_eq!(before, after, "nothing else changed");
        assert!(with_weight(doc, "nope", 0, 50).is_err());
        assert!(with_weight(doc, "r", 1, 50).is_err());
    }

    fn outcomes(pool: &str, requests: u64, errors: u64) -> pb::RampOutcomes {
        let mut latency_buckets = vec![0; LatencyBuckets::LEN];
        latency_buckets[LatencyBuckets::bucket(20.0)] = requests;
        pb::RampOutcomes {
            route: "r".into(),
            pool: pool.into(),
            requests,
            errors,
            latency_buckets,
        }
    }

    /// Windows live on the leading replica only, in memory: a report with
    /// no window open is dropped, and a replica that loses and regains the
    /// lead starts the step afresh. A failing new side is rolled back as a
    /// new version authored `ramp` with its reason.
    #[tokio::test]
    async fn windows_are_the_leaders_and_a_failing_new_side_is_rolled_back() {
        let dir = std::env::temp_dir().join(format!("router-hub-ramp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::RedbStore::open(&dir).unwrap();
        let hub = Hub::open(Box::new(store), Guards::default(), Limits::default())
            .await
            .unwrap();
        let doc = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {name: new, endpoints: [\"127.0.0.1:9\"]}\n    - {name: old, endpoints: [\"127.0.0.1:8\"]}\n  routes:\n    - name: r\n      chain: [{split: [{pool: new, weight: 10}, {pool: old, weight: 90}], ramp: {steps: [10, 50, 100], step_s: 60, guard: {min_requests: 20}}}]\n";
        hub.apply_policy(doc, false, 0, "test").await.unwrap();
        let lead = |on: bool| hub.leading.store(on, std::sync::atomic::Ordering::Relaxed);
        hub.ramp_tick().await;
        assert!(hub.ramp_windows(None).is_empty(), "not leading");
        lead(true);
        hub.ramp_reported(&[outcomes("new", 5, 0)]);
        hub.ramp_tick().await;
        let w = hub.ramp_windows(Some("r"));
        assert_eq!(
            (w.len(), w[0].weight, w[0].new.requests),
            (1, 10, 0),
            "dropped"
        );
        hub.ramp_reported(&[outcomes("new", 30, 0), outcomes("old", 270, 1)]);
        hub.ramp_reported(&[outcomes("new", 10, 0)]);
        let w = &hub.ramp_windows(None)[0];
        assert_eq!((w.new.requests, w.old.requests, w.old.errors), (40, 270, 1));
        assert_eq!(
            w.new.window().p95_ms,
            Some(LatencyBuckets::upper_ms(LatencyBuckets::bucket(20.0)))
        );
        assert_eq!(w.verdict().label(), "hold", "the step lasts 60 s");
        // Lost and regained: afresh.
        lead(false);
        hub.ramp_tick().await;
        assert!(hub.ramp_windows(None).is_empty());
        lead(true);
        hub.ramp_tick().await;
        assert_eq!(hub.ramp_windows(None)[0].new.requests, 0);
        // Failing: rolled back at the next tick, without waiting for the step.
        hub.ramp_reported(&[outcomes("new", 10, 5), outcomes("old", 90, 0)]);
        hub.ramp_tick().await;
        let current = hub.policy(0).unwrap();
        assert_eq!(current.author, RAMP_AUTHOR);
        assert_eq!(
            current.message,
            "ramp: route r rolled back to 0 from 10%: error rate 50.0% > 1.0% + old 0.0% (5 of 10 requests)"
        );
        assert!(
            current.document.contains("weight: 0"),
            "{}",
            current.document
        );
        hub.ramp_tick().await;
        let w = &hub.ramp_windows(None)[0];
        assert_eq!((w.weight, w.verdict().label()), (0, "stopped"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

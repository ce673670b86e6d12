//! Ramps driven: each second, on the leading replica, every ramped split
//! of the current policy gets `router_policy::ramp::decide`'s verdict over
//! its step's window, and an advance or a rollback is applied as a new
//! policy version (docs/traffic.md "Ramps").
//!
//! **Totals.** Proxies send, with each heartbeat, what each side of a
//! ramped split did since the last one (requests, errors, latency counts
//! in the ramp's fixed log buckets: `LoadReport.outcomes`). Every replica
//! adds its own proxies' reports into running totals per (route, pool)
//! of the current policy's ramped splits (reports for other pairs are
//! dropped), and each second shares them with the other replicas through
//! the store ([`Store::publish_replica_value`], kind `ramp-totals`, with
//! a random id of this process so a restarted replica is told apart).
//!
//! **The window.** The leader reads every replica's totals each tick. A
//! step's window is, per (replica, process), what its totals grew by since
//! the leader first saw them in this step, summed over the fleet, so the
//! proxies on every replica count, whichever replica they talk to. A step
//! begins when the leader first sees the split at its current weight (a
//! new version that changes the weight, an operator's apply, this replica
//! taking the lead): a replica that takes over starts the step's window
//! afresh. A replica that goes away keeps, in the window, what it had
//! added; one seen for the first time mid-step counts from then on (at
//! most its last second of reports is not counted). A report sent within
//! one heartbeat of a change may count in the next step. The leader
//! shares its windows too (kind `ramp-windows`), so `routerctl rollout
//! status` through any replica shows them.
//!
//! **The change.** An advance sets the split's weights to `new: to, old:
//! 100 - to`, a rollback to `new: 0, old: 100`: the two numbers are
//! replaced in the current document's text, which keeps its comments and
//! layout, when a check shows the edit changes exactly those weights
//! ([`with_weight`]); otherwise the document is parsed, changed and
//! serialized again (comments and layout lost). Then it is applied through
//! [`Hub::apply_policy_by`] as author `ramp` with the reason as the
//! version's note, expecting the current version (a concurrent apply wins;
//! the driver judges again on the next tick).
//!
//! **Operators.** `pause` keeps a route's ramps from advancing (the
//! windows keep counting, and a rollback still happens), `resume` lets
//! them advance again, `abort` sets the new side to 0 with the note
//! `ramp: aborted by operator`. Pauses are stored in the state
//! ([`State::ramps_paused`]), so every replica and the next leader keep
//! them.
//!
//! Bounded: totals for at most [`MAX_PAIRS`] (route, pool) pairs, at most
//! [`MAX_SOURCES`] (replica, process) sources per window.

use std::collections::BTreeSet;

use router_policy::document::ChainStepSpec;
use router_policy::ramp::{decide, LatencyBuckets, Ramp, SideWindow, Verdict};
use router_policy::ChainStep;
use serde::{Deserialize, Serialize};

use super::*;

/// The author of the versions a ramp writes.
pub const RAMP_AUTHOR: &str = "ramp";
/// The store kind of a replica's totals.
const TOTALS_KIND: &str = "ramp-totals";
/// The store kind of the leader's windows.
const WINDOWS_KIND: &str = "ramp-windows";
/// (route, pool) pairs a replica keeps totals for, at most.
pub(super) const MAX_PAIRS: usize = 256;
/// (replica, process) sources a window sums, at most (more are ignored).
pub(super) const MAX_SOURCES: usize = 64;

/// One side's sums over a window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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

    fn plus(&mut self, other: &SideSums) {
        self.requests = self.requests.saturating_add(other.requests);
        self.errors = self.errors.saturating_add(other.errors);
        for (sum, c) in self.latency.counts.iter_mut().zip(&other.latency.counts) {
            *sum = sum.saturating_add(*c);
        }
    }

    /// `self - base`, when every count of `self` is at least `base`'s
    /// (totals only grow: `None` means they were started again).
    fn since(&self, base: &SideSums) -> Option<SideSums> {
        let mut out = SideSums {
            requests: self.requests.checked_sub(base.requests)?,
            errors: self.errors.checked_sub(base.errors)?,
            latency: LatencyBuckets::default(),
        };
        for ((o, now), then) in out
            .latency
            .counts
            .iter_mut()
            .zip(&self.latency.counts)
            .zip(&base.latency.counts)
        {
            *o = now.checked_sub(*then)?;
        }
        Some(out)
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

/// [`SideSums`] as replicas share them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SumsWire {
    requests: u64,
    errors: u64,
    /// Counts per latency bucket (extra ones ignored, missing ones 0).
    latency: Vec<u64>,
}

impl From<&SideSums> for SumsWire {
    fn from(s: &SideSums) -> Self {
        Self {
            requests: s.requests,
            errors: s.errors,
            latency: s.latency.counts.to_vec(),
        }
    }
}

impl From<&SumsWire> for SideSums {
    fn from(w: &SumsWire) -> Self {
        let mut latency = LatencyBuckets::default();
        for (c, v) in latency.counts.iter_mut().zip(&w.latency) {
            *c = *v;
        }
        Self {
            requests: w.requests,
            errors: w.errors.min(w.requests),
            latency,
        }
    }
}

/// A replica's totals as it shares them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct TotalsWire {
    /// This process (a restarted replica has another).
    process: String,
    /// (route, pool, totals).
    sides: Vec<(String, String, SumsWire)>,
}

/// A window as the leader shares it.
#[derive(Debug, Serialize, Deserialize)]
struct WindowWire {
    route: String,
    step: usize,
    new_pool: String,
    old_pool: String,
    weight: u32,
    /// How long the step had run when published.
    elapsed_ms: u64,
    new: SumsWire,
    old: SumsWire,
}

/// The leader's windows as it shares them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WindowsWire {
    at_unix_ms: i64,
    windows: Vec<WindowWire>,
}

/// A (route, pool) pair.
type Pair = (String, String);

/// One replica's totals, as the leader reads them.
#[derive(Debug, Clone)]
struct ReplicaTotals {
    replica: String,
    /// Its process (a restarted replica has another).
    process: String,
    totals: BTreeMap<Pair, SideSums>,
}

/// What one (replica, process) added to a window.
#[derive(Debug, Clone)]
struct Source {
    replica: String,
    process: String,
    /// Its totals when first seen in this step.
    base_new: SideSums,
    base_old: SideSums,
    /// What they grew by since.
    new: SideSums,
    old: SideSums,
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
    /// When the step began (for the leader).
    pub started: Instant,
    /// The new side's sums.
    pub new: SideSums,
    /// The old side's sums.
    pub old: SideSums,
    /// The ramp, as the policy has it.
    pub ramp: Ramp,
    sources: Vec<Source>,
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

    /// Takes every replica's totals in: each source's growth since first
    /// seen, summed.
    fn take_totals(&mut self, fleet: &[ReplicaTotals]) {
        let zero = SideSums::default();
        for ReplicaTotals {
            replica,
            process,
            totals,
        } in fleet
        {
            let side = |pool: &str| {
                totals
                    .get(&(self.route.clone(), pool.to_string()))
                    .unwrap_or(&zero)
                    .clone()
            };
            let (now_new, now_old) = (side(&self.new_pool), side(&self.old_pool));
            let known = self
                .sources
                .iter()
                .position(|s| &s.replica == replica && &s.process == process);
            if let Some(s) = known.and_then(|i| self.sources.get_mut(i)) {
                match (now_new.since(&s.base_new), now_old.since(&s.base_old)) {
                    (Some(new), Some(old)) => {
                        s.new = new;
                        s.old = old;
                    }
                    // Totals started again (the pair left the policy and
                    // came back): count from zero.
                    _ => {
                        s.base_new = SideSums::default();
                        s.base_old = SideSums::default();
                        s.new = now_new;
                        s.old = now_old;
                    }
                }
            } else if self.sources.len() < MAX_SOURCES {
                self.sources.push(Source {
                    replica: replica.clone(),
                    process: process.clone(),
                    base_new: now_new,
                    base_old: now_old,
                    new: SideSums::default(),
                    old: SideSums::default(),
                });
            }
        }
        let (mut new, mut old) = (SideSums::default(), SideSums::default());
        for s in &self.sources {
            new.plus(&s.new);
            old.plus(&s.old);
        }
        self.new = new;
        self.old = old;
    }
}

/// The driver's memory.
#[derive(Debug)]
pub(super) struct Ramps {
    /// This process, in the totals it shares.
    process: String,
    /// The (route, pool) pairs of the current policy's ramped splits.
    pairs: BTreeSet<Pair>,
    /// This replica's proxies' reports, summed per pair.
    totals: BTreeMap<Pair, SideSums>,
    /// Whether totals (and windows) were shared, to remove them when none.
    shared_totals: bool,
    shared_windows: bool,
    windows: Vec<RampWindow>,
}

impl Default for Ramps {
    fn default() -> Self {
        Self {
            process: uuid::Uuid::now_v7().to_string(),
            pairs: BTreeSet::new(),
            totals: BTreeMap::new(),
            shared_totals: false,
            shared_windows: false,
            windows: Vec::new(),
        }
    }
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
/// old: 100 - weight`: the two weights edited in the text when that can
/// be done safely (comments and layout kept), else the document parsed,
/// changed and serialized again (comments and layout lost).
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
    let split = split_at(&mut doc, route, step).map_err(invalid)?;
    let [new, old] = split.split.as_mut_slice() else {
        return Err(invalid("the split does not have two sides".into()));
    };
    new.weight = weight.min(100);
    old.weight = 100 - new.weight;
    let (new_weight, old_weight) = (new.weight, old.weight);
    if let Some(text) = edited_in_place(document, &doc, route, step, new_weight, old_weight) {
        return Ok(text);
    }
    serde_yaml_ng::to_string(&doc).map_err(|e| invalid(e.to_string()))
}

/// The split at `step` of `route` in `doc`.
fn split_at<'a>(
    doc: &'a mut PolicyDocument,
    route: &str,
    step: usize,
) -> Result<&'a mut router_policy::document::SplitSpec, String> {
    let spec = doc
        .spec
        .routes
        .iter_mut()
        .find(|r| r.name == route)
        .ok_or_else(|| "no such route".to_string())?;
    match spec.chain.get_mut(step) {
        Some(ChainStepSpec::Split(split)) => Ok(split),
        _ => Err(format!("chain step {step} is not a split")),
    }
}

/// `document` with the two weights of the split at `step` of `route`
/// replaced in the text, keeping everything else byte for byte; `None`
/// when that cannot be done safely.
///
/// Every number after a `weight:` key (quoted or not) is a candidate;
/// each is tried alone with a marker value, and the text parsed: the
/// candidate whose marker lands on the split's new side (or old side) is
/// that side's weight. Both are replaced, and the result is kept only if
/// it parses to exactly `want` (the document as the structured edit made
/// it). Anchors, merges, or a weight written any other way fail that
/// check and fall back to serializing.
fn edited_in_place(
    document: &str,
    want: &PolicyDocument,
    route: &str,
    step: usize,
    new_weight: u32,
    old_weight: u32,
) -> Option<String> {
    const MARKER: u32 = 987_654_321;
    const MAX_CANDIDATES: usize = 256;
    let candidates = weight_numbers(document);
    if candidates.len() > MAX_CANDIDATES {
        return None;
    }
    let (mut new_at, mut old_at) = (None, None);
    for range in &candidates {
        let mut text = document.to_string();
        text.replace_range(range.clone(), &MARKER.to_string());
        let Ok(mut doc) = PolicyDocument::parse(&text) else {
            continue;
        };
        let Ok(split) = split_at(&mut doc, route, step) else {
            continue;
        };
        let sides: Vec<u32> = split.split.iter().map(|s| s.weight).collect();
        match sides.as_slice() {
            [MARKER, _] if new_at.is_none() => new_at = Some(range.clone()),
            [_, MARKER] if old_at.is_none() => old_at = Some(range.clone()),
            _ => {}
        }
    }
    let (new_at, old_at) = (new_at?, old_at?);
    let mut text = document.to_string();
    // The later one first, so the earlier one's range still holds.
    let (first, second) = if new_at.start > old_at.start {
        ((new_at, new_weight), (old_at, old_weight))
    } else {
        ((old_at, old_weight), (new_at, new_weight))
    };
    text.replace_range(first.0, &first.1.to_string());
    text.replace_range(second.0, &second.1.to_string());
    let parsed = PolicyDocument::parse(&text).ok()?;
    (parsed == *want).then_some(text)
}

/// The byte ranges of the numbers written after a `weight` key
/// (`weight: 10`, `"weight": 10`, `'weight' : 10`).
fn weight_numbers(text: &str) -> Vec<std::ops::Range<usize>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = text.get(from..).and_then(|t| t.find("weight")) {
        let mut i = from + found + "weight".len();
        from = i;
        if matches!(bytes.get(i), Some(b'"' | b'\'')) {
            i += 1;
        }
        while matches!(bytes.get(i), Some(b' ' | b'\t')) {
            i += 1;
        }
        if bytes.get(i) != Some(&b':') {
            continue;
        }
        i += 1;
        while matches!(bytes.get(i), Some(b' ' | b'\t')) {
            i += 1;
        }
        let start = i;
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i > start {
            out.push(start..i);
        }
    }
    out
}

impl Hub {
    /// Adds a proxy's heartbeat outcomes to this replica's totals.
    pub fn ramp_reported(&self, outcomes: &[pb::RampOutcomes]) {
        if outcomes.is_empty() {
            return;
        }
        let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
        let ramps = &mut *ramps;
        for o in outcomes {
            let pair = (o.route.clone(), o.pool.clone());
            if !ramps.pairs.contains(&pair) {
                continue;
            }
            if let Some(t) = ramps.totals.get_mut(&pair) {
                t.add(o);
            } else if ramps.totals.len() < MAX_PAIRS {
                ramps.totals.entry(pair).or_default().add(o);
            }
        }
    }

    /// This replica's open windows (a route's only with `route`): the
    /// leader's; empty on the others.
    pub fn ramp_windows(&self, route: Option<&str>) -> Vec<RampWindow> {
        let ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
        ramps
            .windows
            .iter()
            .filter(|w| route.is_none_or(|r| w.route == r))
            .cloned()
            .collect()
    }

    /// The step windows as the leader keeps them: this replica's own when
    /// it leads, else the newest the leader shared (`rollout status`).
    pub async fn fleet_ramp_windows(&self, route: &str) -> Vec<RampWindow> {
        if self.leading() {
            // Up to now, not the last tick.
            let fleet = self.fleet_totals().await;
            let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
            for w in ramps.windows.iter_mut().filter(|w| w.route == route) {
                w.take_totals(&fleet);
            }
        }
        let own = self.ramp_windows(Some(route));
        if self.leading() || !own.is_empty() {
            return own;
        }
        let shared = match self.store.replica_values(WINDOWS_KIND).await {
            Ok(Some(v)) => v,
            Ok(None) => return own,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the leader's ramp windows");
                return own;
            }
        };
        let Some(newest) = shared
            .iter()
            .filter_map(|(_, v)| serde_json::from_slice::<WindowsWire>(v).ok())
            .max_by_key(|w| w.at_unix_ms)
        else {
            return own;
        };
        let since = u64::try_from(now_ms().saturating_sub(newest.at_unix_ms)).unwrap_or(0);
        let ramps: Vec<_> = self.current_policy().map_or_else(Vec::new, |p| ramped(&p));
        newest
            .windows
            .into_iter()
            .filter(|w| w.route == route)
            .filter_map(|w| {
                let ramp = ramps
                    .iter()
                    .find(|r| r.0 == w.route && r.1 == w.step)?
                    .5
                    .clone();
                let elapsed = Duration::from_millis(w.elapsed_ms.saturating_add(since));
                Some(RampWindow {
                    started: Instant::now()
                        .checked_sub(elapsed)
                        .unwrap_or_else(Instant::now),
                    new: SideSums::from(&w.new),
                    old: SideSums::from(&w.old),
                    route: w.route,
                    step: w.step,
                    new_pool: w.new_pool,
                    old_pool: w.old_pool,
                    weight: w.weight,
                    ramp,
                    sources: Vec::new(),
                })
            })
            .collect()
    }

    /// Whether `route`'s ramps are paused.
    pub fn ramp_paused(&self, route: &str) -> bool {
        self.lock()
            .state
            .ramps_paused
            .binary_search_by(|r| r.as_str().cmp(route))
            .is_ok()
    }

    /// Pauses (or resumes) `route`'s ramps: stored in the state, so every
    /// replica keeps it. Routes without a ramped split leave the list.
    pub async fn pause_ramp(&self, route: &str, paused: bool) -> Result<(), HubError> {
        let ramped_routes: BTreeSet<String> = self
            .current_policy()
            .map_or_else(Vec::new, |p| ramped(&p))
            .into_iter()
            .map(|r| r.0)
            .collect();
        self.change(|inner| {
            let mut list: BTreeSet<String> = inner
                .state
                .ramps_paused
                .iter()
                .filter(|r| ramped_routes.contains(*r))
                .cloned()
                .collect();
            if paused {
                list.insert(route.to_string());
            } else {
                list.remove(route);
            }
            let list: Vec<String> = list.into_iter().collect();
            if list == inner.state.ramps_paused {
                return Ok(None);
            }
            let mut next = inner.state.clone();
            next.ramps_paused = list;
            Ok(Some((next, None)))
        })
        .await?;
        Ok(())
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

    /// Shares this replica's totals (removes them when it has none).
    async fn share_totals(&self) {
        let (value, shared) = {
            let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
            let value = (!ramps.totals.is_empty()).then(|| TotalsWire {
                process: ramps.process.clone(),
                sides: ramps
                    .totals
                    .iter()
                    .map(|((route, pool), sums)| {
                        (route.clone(), pool.clone(), SumsWire::from(sums))
                    })
                    .collect(),
            });
            let shared = ramps.shared_totals;
            ramps.shared_totals = value.is_some();
            (value, shared)
        };
        if value.is_none() && !shared {
            return;
        }
        let bytes = value.and_then(|v| serde_json::to_vec(&v).ok());
        if let Err(e) = self.store.publish_replica_value(TOTALS_KIND, bytes).await {
            tracing::warn!(error = %e, "cannot share the ramp totals");
        }
    }

    /// Every replica's totals: this one's, and the others' as shared.
    async fn fleet_totals(&self) -> Vec<ReplicaTotals> {
        let me = self.store.replica().to_string();
        let mut fleet = {
            let ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
            vec![ReplicaTotals {
                replica: me.clone(),
                process: ramps.process.clone(),
                totals: ramps.totals.clone(),
            }]
        };
        let shared = match self.store.replica_values(TOTALS_KIND).await {
            Ok(v) => v.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the other replicas' ramp totals");
                Vec::new()
            }
        };
        for (replica, bytes) in shared {
            if replica == me {
                continue;
            }
            let Ok(wire) = serde_json::from_slice::<TotalsWire>(&bytes) else {
                tracing::warn!(replica, "undecodable ramp totals; ignored");
                continue;
            };
            let totals = wire
                .sides
                .iter()
                .take(MAX_PAIRS)
                .map(|(route, pool, sums)| ((route.clone(), pool.clone()), SideSums::from(sums)))
                .collect();
            fleet.push(ReplicaTotals {
                replica,
                process: wire.process,
                totals,
            });
        }
        fleet
    }

    /// Shares the leader's windows (removes them when `windows` is `None`).
    async fn share_windows(&self, windows: Option<WindowsWire>) {
        {
            let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
            if windows.is_none() && !ramps.shared_windows {
                return;
            }
            ramps.shared_windows = windows.is_some();
        }
        let bytes = windows.and_then(|w| serde_json::to_vec(&w).ok());
        if let Err(e) = self.store.publish_replica_value(WINDOWS_KIND, bytes).await {
            tracing::warn!(error = %e, "cannot share the ramp windows");
        }
    }

    /// One tick: this replica's totals kept to the current policy's
    /// ramped pairs and shared; on the leader, windows opened for the
    /// current policy's ramped splits (and closed for the others), the
    /// fleet's totals taken in, and each verdict applied. Not leading: no
    /// windows are kept.
    pub async fn ramp_tick(&self) {
        let splits = self.current_policy().map_or_else(Vec::new, |p| ramped(&p));
        {
            let mut ramps = self.ramps.lock().unwrap_or_else(|e| e.into_inner());
            ramps.pairs = splits
                .iter()
                .flat_map(|s| [(s.0.clone(), s.2.clone()), (s.0.clone(), s.3.clone())])
                .collect();
            let ramps = &mut *ramps;
            ramps.totals.retain(|pair, _| ramps.pairs.contains(pair));
        }
        self.share_totals().await;
        if !self.leading() {
            self.ramps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .windows
                .clear();
            self.share_windows(None).await;
            return;
        }
        let fleet = if splits.is_empty() {
            Vec::new()
        } else {
            self.fleet_totals().await
        };
        let paused: BTreeSet<String> = self.lock().state.ramps_paused.iter().cloned().collect();
        let mut actions = Vec::new();
        let shared = {
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
                let mut window = match found {
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
                        sources: Vec::new(),
                    },
                };
                window.take_totals(&fleet);
                // Paused: no advance; a rollback still protects.
                let paused = paused.contains(&window.route);
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
            (!ramps.windows.is_empty()).then(|| WindowsWire {
                at_unix_ms: now_ms(),
                windows: ramps
                    .windows
                    .iter()
                    .map(|w| WindowWire {
                        route: w.route.clone(),
                        step: w.step,
                        new_pool: w.new_pool.clone(),
                        old_pool: w.old_pool.clone(),
                        weight: w.weight,
                        elapsed_ms: u64::try_from(w.started.elapsed().as_millis())
                            .unwrap_or(u64::MAX),
                        new: SumsWire::from(&w.new),
                        old: SumsWire::from(&w.old),
                    })
                    .collect(),
            })
        };
        self.share_windows(shared).await;
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
            RolloutAction::Pause => self.pause_ramp(route, true).await?,
            RolloutAction::Resume => self.pause_ramp(route, false).await?,
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
        let windows = self.fleet_ramp_windows(route).await;
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
        // Edited in the text: the comment and the layout stay, only the
        // two numbers move.
        assert_eq!(
            next,
            doc.replace("weight: 10}", "weight: 50}")
                .replace("weight: 90}", "weight: 50}")
        );
    }

    /// The text edit finds the right split among several (block style,
    /// quoted keys, another route's split with the same weights), and a
    /// weight written through an anchor falls back to serializing, which
    /// still changes only the split.
    #[test]
    fn the_weights_are_edited_in_the_text_only_where_it_is_safe() {
        let doc = r#"apiVersion: router/v1
kind: RoutingPolicy
spec:
  pools:
    - {name: new, endpoints: ["127.0.0.1:9"]}
    - {name: old, endpoints: ["127.0.0.1:8"]}
  routes:
    # the first route: left alone
    - name: a
      chain: [{split: [{pool: new, weight: 10}, {pool: old, weight: 90}]}]
    - name: r
      chain:
        - old
        - split:
            - pool: new
              "weight": 10   # the canary
            - pool: old
              weight:   90
          ramp: {steps: [10, 50, 100], step_s: 1, guard: {min_requests: 20}}
"#;
        let next = with_weight(doc, "r", 1, 50).unwrap();
        assert_eq!(
            next,
            doc.replace("\"weight\": 10   #", "\"weight\": 50   #")
                .replace("weight:   90", "weight:   50")
        );
        let anchored = doc.replace("\"weight\": 10", "\"weight\": &w 10");
        let next = with_weight(&anchored, "r", 1, 25).unwrap();
        assert!(!next.contains("# the canary"), "serialized: {next}");
        let mut want = PolicyDocument::parse(doc).unwrap();
        if let Ok(split) = split_at(&mut want, "r", 1) {
            split.split[0].weight = 25;
            split.split[1].weight = 75;
        }
        assert_eq!(PolicyDocument::parse(&next).unwrap(), want);
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
        hub.ramp_tick().await;
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

    fn sums(requests: u64, errors: u64) -> SideSums {
        let mut s = SideSums::default();
        s.add(&outcomes("x", requests, errors));
        s
    }

    fn totals(new: SideSums, old: SideSums) -> BTreeMap<Pair, SideSums> {
        BTreeMap::from([
            (("r".to_string(), "new".to_string()), new),
            (("r".to_string(), "old".to_string()), old),
        ])
    }

    /// A window sums what each (replica, process)'s totals grew by since
    /// the leader first saw them: a replica's counts from before the step
    /// do not count, one that goes away keeps what it added, a restarted
    /// replica (another process) counts from its first sight, and totals
    /// that went down are counted from zero.
    #[test]
    fn a_window_sums_each_replicas_growth_since_it_was_first_seen() {
        let mut w = RampWindow {
            route: "r".into(),
            step: 0,
            new_pool: "new".into(),
            old_pool: "old".into(),
            weight: 10,
            started: Instant::now(),
            new: SideSums::default(),
            old: SideSums::default(),
            ramp: Ramp {
                steps: vec![10, 50, 100],
                step: Duration::from_secs(60),
                guard: router_policy::ramp::Guard {
                    max_error_rate: 0.01,
                    max_p95_ratio: None,
                    min_requests: 20,
                },
            },
            sources: Vec::new(),
        };
        let of = |replica: &str, n, o, p: &str| ReplicaTotals {
            replica: replica.into(),
            process: p.into(),
            totals: totals(n, o),
        };
        let a = |n, o, p: &str| of("a", n, o, p);
        let b = |n, o, p: &str| of("b", n, o, p);
        // First sight: the step starts from here.
        w.take_totals(&[
            a(sums(100, 5), sums(900, 0), "a1"),
            b(sums(7, 7), sums(70, 0), "b1"),
        ]);
        assert_eq!((w.new.requests, w.old.requests), (0, 0));
        // Both grow.
        w.take_totals(&[
            a(sums(110, 5), sums(990, 1), "a1"),
            b(sums(12, 8), sums(110, 0), "b1"),
        ]);
        assert_eq!((w.new.requests, w.new.errors), (15, 1));
        assert_eq!((w.old.requests, w.old.errors), (130, 1));
        // b goes away: what it added stays; b comes back as a new process
        // and counts from its first sight.
        w.take_totals(&[a(sums(120, 5), sums(1000, 1), "a1")]);
        assert_eq!(w.new.requests, 25);
        w.take_totals(&[
            a(sums(120, 5), sums(1000, 1), "a1"),
            b(sums(3, 0), sums(30, 0), "b2"),
        ]);
        assert_eq!(w.new.requests, 25);
        w.take_totals(&[
            a(sums(120, 5), sums(1000, 1), "a1"),
            b(sums(8, 4), sums(50, 0), "b2"),
        ]);
        assert_eq!((w.new.requests, w.new.errors, w.old.requests), (30, 5, 160));
        // a's totals started again: counted from zero.
        w.take_totals(&[
            a(sums(2, 2), sums(20, 0), "a1"),
            b(sums(8, 4), sums(50, 0), "b2"),
        ]);
        assert_eq!((w.new.requests, w.new.errors), (2 + 5 + 5, 2 + 1 + 4));
        assert!(w.sources.len() <= MAX_SOURCES);
    }
}

//! What each side of a ramped split did since the last heartbeat: the
//! proxy's part of a ramp (`router_policy::ramp`; docs/traffic.md "Ramps").
//!
//! For every (route, pool) that a route's ramped split names, the config
//! snapshot holds one [`SideTally`]: atomic counters of attempts, errors
//! (`router_policy::ramp::counts_as_error`) and latency counts in the
//! ramp's fixed log buckets, so the control plane can sum the tallies of
//! every proxy and read the fleet's p95. A finished request adds each of
//! its attempts on a tallied (route, pool) with relaxed atomic adds (no
//! lock); the managed stream's heartbeat takes the counts (swapping them
//! to 0) and sends them with the `LoadReport`.
//!
//! A policy without a ramped split has no tallies, and a request then pays
//! one look at the snapshot's empty list through an `arc_swap` guard
//! ([`crate::config::ConfigStore::ramped`]).
//! Tallies of a (route, pool) that stays ramped across a policy change are
//! kept (counts not yet reported are not lost); the others are dropped.
//! A proxy that is not managed tallies too (its policy may have a ramp),
//! but nothing takes the counts: no control plane drives its ramps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use router_policy::ramp::{counts_as_error, LatencyBuckets};
use router_policy::{ChainStep, Outcome, Policy};
use router_proto::v1 as pb;

/// One (route, pool)'s counts since the last take.
#[derive(Debug)]
pub(crate) struct SideTally {
    /// The route whose ramped split names the pool.
    pub route: Arc<str>,
    /// The pool (a side of the split).
    pub pool: Arc<str>,
    requests: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; LatencyBuckets::LEN],
}

impl SideTally {
    fn new(route: &str, pool: &str) -> Self {
        Self {
            route: Arc::from(route),
            pool: Arc::from(pool),
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Counts one attempt that ended `outcome` after `latency_ms`.
    pub(crate) fn note(&self, outcome: Outcome, latency_ms: f64) {
        let Some(error) = counts_as_error(outcome) else {
            return;
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        if error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.buckets[LatencyBuckets::bucket(latency_ms)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts since the last take, zeroed; `None` if there were none.
    pub(crate) fn take(&self) -> Option<pb::RampOutcomes> {
        let requests = self.requests.swap(0, Ordering::Relaxed);
        let errors = self.errors.swap(0, Ordering::Relaxed);
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect();
        if requests == 0 && buckets.iter().all(|&c| c == 0) {
            return None;
        }
        Some(pb::RampOutcomes {
            route: self.route.to_string(),
            pool: self.pool.to_string(),
            requests,
            errors,
            latency_buckets: buckets,
        })
    }
}

/// The tallies `policy` needs: one per (route, pool) its ramped splits
/// name, the ones of `old` kept where they still apply.
pub(crate) fn sides_of(policy: &Policy, old: &[Arc<SideTally>]) -> Vec<Arc<SideTally>> {
    let mut sides: Vec<Arc<SideTally>> = Vec::new();
    for route in &policy.routes {
        for step in &route.chain {
            let ChainStep::Split(split) = step else {
                continue;
            };
            if split.ramp.is_none() {
                continue;
            }
            for side in &split.sides {
                let found = |t: &&Arc<SideTally>| *t.route == *route.name && *t.pool == *side.pool;
                if sides.iter().any(|t| found(&t)) {
                    continue;
                }
                let tally = old
                    .iter()
                    .find(found)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(SideTally::new(&route.name, &side.pool)));
                sides.push(tally);
            }
        }
    }
    sides
}

/// Every tally's counts since the last take (those with any).
pub(crate) fn take_all(sides: &[Arc<SideTally>]) -> Vec<pb::RampOutcomes> {
    sides.iter().filter_map(|t| t.take()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once_and_only_what_a_ramp_judges_counts() {
        let t = SideTally::new("r", "new");
        t.note(Outcome::Ok, 10.0);
        t.note(Outcome::Status5xx, 100.0);
        t.note(Outcome::ClientCancelled, 5.0);
        let taken = t.take().unwrap_or_default();
        assert_eq!((taken.requests, taken.errors), (2, 1));
        assert_eq!(taken.latency_buckets.len(), LatencyBuckets::LEN);
        assert_eq!(taken.latency_buckets[LatencyBuckets::bucket(10.0)], 1);
        assert_eq!(taken.latency_buckets[LatencyBuckets::bucket(100.0)], 1);
        assert_eq!(t.take(), None, "taken once");
    }

    #[test]
    fn only_ramped_splits_sides_are_tallied_and_kept_across_changes() {
        let doc = |ramp: &str| {
            format!(
                "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - {{name: new, endpoints: [\"127.0.0.1:9\"]}}\n    - {{name: old, endpoints: [\"127.0.0.1:8\"]}}\n  routes:\n    - name: r\n      chain: [{{split: [{{pool: new, weight: 10}}, {{pool: old, weight: 90}}]{ramp}}}]\n"
            )
        };
        let load = |d: &str| {
            router_policy::document::load(d, &router_policy::QueueSettings::default())
                .unwrap_or_else(|e| panic!("{e:?}"))
        };
        assert!(sides_of(&load(&doc("")), &[]).is_empty());
        let ramped = load(&doc(", ramp: {steps: [10, 100], step_s: 1}"));
        let sides = sides_of(&ramped, &[]);
        let names: Vec<(&str, &str)> = sides.iter().map(|t| (&*t.route, &*t.pool)).collect();
        assert_eq!(names, [("r", "new"), ("r", "old")]);
        sides[0].note(Outcome::Ok, 1.0);
        let again = sides_of(&ramped, &sides);
        assert!(Arc::ptr_eq(&again[0], &sides[0]), "kept");
        assert_eq!(take_all(&again).len(), 1);
    }
}

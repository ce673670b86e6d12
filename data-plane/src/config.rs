//! The proxy's configuration: one immutable snapshot, swapped atomically.
//!
//! A [`Snapshot`] is everything a request needs to be routed: the validated
//! policy, the pools' runtimes, and the version that names it. Requests load
//! the current snapshot once (a lock-free [`ArcSwap`] read) and use it to
//! the end, so a change never shows a request half of the old config and
//! half of the new.
//!
//! Changes come from several places: the policy file (standalone mode), the
//! `set-backends` admin call, and later the control plane's stream. They all
//! go through [`ConfigStore`], which builds the next snapshot off to the
//! side from a validated [`Policy`] plus the backend sets `set-backends`
//! installed, reconciles the pool runtimes (pools that stay keep their
//! queue and EWMA state; removed pools shed their waiters), and only then
//! swaps it in. A change that fails validation never reaches this module:
//! the caller keeps serving the last good snapshot.

use std::collections::BTreeMap;

use fnv::FnvHashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::HeaderValue;
use router_policy::retry_budget::{BudgetSettings, RetryBudget};
use router_policy::{Endpoint, Policy};

use crate::forward::UpstreamClient;
use crate::metrics::Metrics;
use crate::pool::{PoolRuntime, PoolSettings, PoolStatus};
pub(crate) use router_endpoints::{PoolKey, PoolKeys};

/// The origin of a managed proxy's config before its first policy.
pub(crate) const BOOT_ORIGIN: &str = "boot";

/// Secrets named by the policy, read from the environment when the policy
/// is applied. Never printed: `Debug` shows only which are present.
#[derive(Default, Clone)]
pub(crate) struct Secrets {
    /// The approval token for `requires_approval` routes.
    pub approval_token: Option<String>,
    /// The key of each pool with `api_key_env`, or its keys with
    /// `api_keys_env`.
    pub api_keys: FnvHashMap<String, PoolKeys>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field(
                "approval_token",
                &self.approval_token.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "api_keys",
                &self
                    .api_keys
                    .iter()
                    .map(|(pool, k)| (pool, k.named.iter().map(|(n, _)| n).collect::<Vec<_>>()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Reads the secrets `policy` names; `policy` is the document's own, before
/// `set-backends` overrides (its endpoints are where pool keys may go).
fn read_secrets(policy: &Policy) -> Secrets {
    let mut secrets = Secrets::default();
    if let Some(var) = &policy.approval_token_env {
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => secrets.approval_token = Some(v.trim().to_string()),
            _ => tracing::warn!(
                variable = %var,
                "approval token variable is not set: routes that require approval refuse every request"
            ),
        }
    }
    for pool in &policy.pools {
        let mut keys = PoolKeys::default();
        if let Some(var) = &pool.api_key_env {
            keys.one = read_key(pool, var);
            if keys.one.is_none() {
                tracing::warn!(pool = %pool.name, variable = %var, "API key not set; requests go without a key");
            }
        }
        for var in &pool.api_keys_env {
            match read_key(pool, var) {
                Some(key) => keys.named.push((var.as_str().into(), key)),
                None => tracing::warn!(
                    pool = %pool.name,
                    variable = %var,
                    "API key not set; its endpoints take no traffic while another key of the pool is set"
                ),
            }
        }
        if !keys.is_empty() {
            secrets.api_keys.insert(pool.name.clone(), keys);
        }
    }
    secrets
}

/// The endpoints of a pool with several keys whose key's variable is not
/// set, while another key of the pool is: they take no new traffic, as
/// if drained (a request without a key would only earn the provider's
/// 401). With none of the keys set, nothing is held back: the pool works
/// as one without a key, as with an unset `api_key_env`.
fn unkeyed(pool: &router_policy::Pool, keys: Option<&PoolKeys>) -> Vec<router_policy::Endpoint> {
    let Some(keys) = keys.filter(|k| !k.named.is_empty()) else {
        return Vec::new();
    };
    pool.endpoints
        .iter()
        .filter(|e| {
            e.key()
                .is_some_and(|var| !keys.named.iter().any(|(n, _)| **n == *var))
        })
        .cloned()
        .collect()
}

/// The key in the variable `var` for `pool`'s endpoints (whose origins it
/// may go to); `None` when it is unset (the caller warns) or not a header
/// value (warned here, naming the variable, never its value).
fn read_key(pool: &router_policy::Pool, var: &str) -> Option<PoolKey> {
    match std::env::var(var).ok().filter(|v| !v.trim().is_empty()) {
        Some(key) => match pool_key_header(pool.provider, key.trim()) {
            Ok((name, mut header)) => {
                header.set_sensitive(true);
                Some(PoolKey {
                    name,
                    header,
                    origins: pool.endpoints.clone(),
                })
            }
            Err(_) => {
                tracing::warn!(pool = %pool.name, variable = %var, "API key is not a valid header value; not sent");
                None
            }
        },
        None => None,
    }
}

/// The header a pool's key goes in, and its value: the key alone in
/// `x-api-key` for Anthropic's API, in `api-key` for Azure OpenAI's, in
/// `x-goog-api-key` for Gemini's; `Authorization: Bearer <key>` for every
/// other.
fn pool_key_header(
    provider: router_policy::Provider,
    key: &str,
) -> Result<(http::header::HeaderName, HeaderValue), http::header::InvalidHeaderValue> {
    use http::header::HeaderName;
    use router_policy::Provider;
    let name = match provider {
        Provider::Anthropic => HeaderName::from_static("x-api-key"),
        Provider::AzureOpenai => HeaderName::from_static("api-key"),
        Provider::Gemini => HeaderName::from_static("x-goog-api-key"),
        Provider::Openai | Provider::Ollama | Provider::Vllm | Provider::Tgi => {
            return Ok((
                http::header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {key}"))?,
            ))
        }
    };
    Ok((name, HeaderValue::from_str(key)?))
}

/// Errors of config changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ConfigError {
    /// `set-backends` named a pool the policy does not have.
    #[error("unknown pool {0:?}")]
    UnknownPool(String),
}

/// A route's retry budget, shared by the requests it routes (one short
/// lock per request to pay in, one per extra attempt to draw).
pub(crate) struct RouteBudget {
    /// The budget's clock counts from here.
    epoch: tokio::time::Instant,
    budget: Mutex<RetryBudget>,
}

impl RouteBudget {
    fn new(settings: BudgetSettings) -> Self {
        Self {
            epoch: tokio::time::Instant::now(),
            budget: Mutex::new(RetryBudget::new(settings)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RetryBudget> {
        self.budget.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn settings(&self) -> BudgetSettings {
        self.lock().settings()
    }

    /// A request of the route started at `now` (the clock reading the
    /// request already has): it pays in.
    pub(crate) fn deposit(&self, now: tokio::time::Instant) {
        let at = now.saturating_duration_since(self.epoch);
        self.lock().deposit(at);
    }

    /// An extra attempt (a retry, a hedge) wants to start: `false` when
    /// the budget is spent.
    pub(crate) fn withdraw(&self) -> bool {
        let at = self.epoch.elapsed();
        self.lock().withdraw(at)
    }

    /// Draws one extra attempt from a route's budget, if it has one
    /// (always granted without): the walk's retries and the hedges alike.
    pub(crate) fn draw(budget: Option<&Self>) -> bool {
        budget.is_none_or(Self::withdraw)
    }
}

/// The config a request is routed by.
#[derive(Clone)]
pub(crate) struct Snapshot {
    /// Names this config (`x-router-config-version`, logs, metrics).
    pub version: Arc<str>,
    /// `version` as the `x-router-config-version` answer header.
    pub version_header: Option<HeaderValue>,
    /// The policy, with `set-backends` overrides applied to its pools.
    pub policy: Arc<Policy>,
    /// Runtime of each pool, by name. (FNV: looked up several times per
    /// request, with short trusted keys; SipHash cost more than the rest of
    /// the lookup.)
    pub pools: FnvHashMap<String, Arc<PoolRuntime>>,
    /// Secrets named by the policy.
    pub secrets: Secrets,
    /// Each route's retry budget, in `policy.routes` order (kept across
    /// changes while the route keeps its name and budget settings).
    pub budgets: Vec<Arc<RouteBudget>>,
    /// Each cached route's pools as the policy document has them (before
    /// `set-backends` overrides: a backend set changing is no policy
    /// change), for the cache's keys (`router_policy::cache::pools_text`).
    pub cache_pools: FnvHashMap<String, Arc<[u8]>>,
    /// False for a managed proxy's boot config (the empty sidecar pool it
    /// holds until a control plane, or its cache, gives it a policy).
    pub configured: bool,
    /// A pool speaks another dialect than OpenAI's (`provider: anthropic`
    /// or `gemini`): an OpenAI chat request may need translating (see
    /// `handler::dialect`).
    pub translating_pools: bool,
    /// One tally per (route, pool) a ramped split names; empty without a
    /// ramp ([`crate::ramp_tally`]).
    pub ramp_sides: Arc<[Arc<crate::ramp_tally::SideTally>]>,
}

/// Where a new snapshot finds the budgets of the routes it keeps.
trait BudgetOf {
    fn budget_named(&self, route: &str) -> Option<&Arc<RouteBudget>>;
}

/// The first snapshot keeps nothing.
struct NoBudgets;

impl BudgetOf for NoBudgets {
    fn budget_named(&self, _: &str) -> Option<&Arc<RouteBudget>> {
        None
    }
}

impl BudgetOf for Snapshot {
    fn budget_named(&self, route: &str) -> Option<&Arc<RouteBudget>> {
        let i = self.policy.routes.iter().position(|r| r.name == route)?;
        self.budgets.get(i)
    }
}

impl Snapshot {
    /// The retry budget of `route` (a route of this snapshot's policy,
    /// found by address: no name is hashed on the request path).
    pub(crate) fn budget_of(&self, route: &router_policy::Route) -> Option<&RouteBudget> {
        let i = self
            .policy
            .routes
            .iter()
            .position(|r| std::ptr::eq(r, route))?;
        self.budgets.get(i).map(|b| &**b)
    }

    /// Live status of every pool, in policy order.
    pub(crate) fn pool_status(&self) -> Vec<PoolStatus> {
        self.policy
            .pools
            .iter()
            .filter_map(|p| self.pools.get(&p.name))
            .map(|p| p.status())
            .collect()
    }
}

struct Source {
    /// The policy as last applied (file, sidecar default, control plane).
    policy: Policy,
    /// Endpoints installed by `set-backends`, by pool; they replace the
    /// policy's endpoints for that pool until the pool disappears.
    overrides: BTreeMap<String, Vec<Endpoint>>,
    /// Label of where the policy came from (`sidecar`, `file`, ...).
    origin: String,
    changes: u64,
    /// The version the next snapshot is named by, when the source names
    /// it (the control plane's revision).
    named_version: Option<String>,
}

/// Holds the current snapshot and serialises changes to it.
pub struct ConfigStore {
    current: ArcSwap<Snapshot>,
    source: Mutex<Source>,
    metrics: Arc<Metrics>,
    /// For capacity probes (none in unit tests).
    client: Option<UpstreamClient>,
    /// Where pools report circuit transitions (managed mode).
    events: Option<tokio::sync::mpsc::Sender<crate::pool::CircuitEvent>>,
    /// The control plane's revision last applied, runtime marks included
    /// (0: none; health shows it as `revision` in managed mode).
    revision: std::sync::atomic::AtomicU64,
    /// Prefix placements shared with the other proxies (with a shared
    /// store), given to every pool.
    prefix_share: std::sync::OnceLock<Arc<dyn router_endpoints::PlacementSink>>,
    /// The response cache's store: a route whose pools a change alters has
    /// its entries in this proxy's own store dropped (the shared store's
    /// are dropped by the control plane, once for the fleet).
    cache: std::sync::OnceLock<Arc<crate::idempotency::Keys>>,
}

/// Placements the fleet's other proxies made, learned by the pools they
/// name in the current snapshot (`router_shared_state::prefix_share`).
impl router_shared_state::prefix_share::PlacementTarget for ConfigStore {
    fn learned_elsewhere(&self, entries: Vec<router_shared_state::prefix_share::Learned>) {
        let snapshot = self.load();
        for e in entries {
            if let Some(pool) = snapshot.pools.get(&*e.pool) {
                pool.learn(&e.endpoint, &e.chain, u64::from(e.uncached));
            }
        }
    }
}

impl ConfigStore {
    /// A store serving `policy` from the start.
    pub(crate) fn new(
        policy: Policy,
        origin: &str,
        metrics: Arc<Metrics>,
        client: Option<UpstreamClient>,
        events: Option<tokio::sync::mpsc::Sender<crate::pool::CircuitEvent>>,
    ) -> Self {
        let mut source = Source {
            policy,
            overrides: BTreeMap::new(),
            origin: origin.to_string(),
            changes: 0,
            named_version: None,
        };
        let snapshot = build(
            &mut source,
            &FnvHashMap::default(),
            &NoBudgets,
            &[],
            &metrics,
            client.as_ref(),
            events.as_ref(),
        );
        metrics.config_change(Some(&snapshot.version));
        Self {
            current: ArcSwap::from_pointee(snapshot),
            source: Mutex::new(source),
            metrics,
            client,
            events,
            revision: std::sync::atomic::AtomicU64::new(0),
            prefix_share: std::sync::OnceLock::new(),
            cache: std::sync::OnceLock::new(),
        }
    }

    /// The response cache whose entries a change purges (see
    /// [`ConfigStore::purge_cache`]).
    pub(crate) fn purges_cache_of(&self, cache: Arc<crate::idempotency::Keys>) {
        let _ = self.cache.set(cache);
    }

    /// Drops the entries under `prefix` in this proxy's own cache store;
    /// the number dropped.
    pub(crate) fn purge_cache(&self, prefix: &str) -> u64 {
        let gone = self
            .cache
            .get()
            .map_or(0, |c| c.forget_local_prefix(prefix));
        tracing::info!(
            prefix,
            entries = gone,
            "response cache purged on this proxy"
        );
        gone
    }

    /// Shares every pool's prefix placements, now and after every change.
    pub(crate) fn share_prefixes(&self, share: Arc<dyn router_endpoints::PlacementSink>) {
        let _guard = self.source.lock();
        for pool in self.load().pools.values() {
            pool.share_prefixes(&share);
        }
        let _ = self.prefix_share.set(share);
    }

    /// Records the control plane's revision just applied.
    pub(crate) fn set_revision(&self, revision: u64) {
        self.revision
            .store(revision, std::sync::atomic::Ordering::Relaxed);
    }

    /// The control plane's revision last applied (0: none).
    pub(crate) fn revision(&self) -> u64 {
        self.revision.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The version of the config being served.
    pub fn version(&self) -> Arc<str> {
        Arc::clone(&self.load().version)
    }

    /// Whether the current policy has a ramped split whose sides are
    /// tallied: read from the snapshot through a guard (no reference count
    /// taken), what a request without a ramp pays.
    pub(crate) fn ramped(&self) -> bool {
        !self.current.load().ramp_sides.is_empty()
    }

    /// The snapshot to route by.
    pub(crate) fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Applies a validated policy; returns the new version.
    pub fn apply_policy(&self, policy: Policy, origin: &str) -> Arc<str> {
        self.change(|src| {
            src.overrides.retain(|pool, _| policy.pool(pool).is_some());
            src.policy = policy;
            src.origin = origin.to_string();
            Ok(())
        })
        .unwrap_or_else(|_: ConfigError| self.load().version.clone())
    }

    /// Applies a whole snapshot from the control plane: the policy, every
    /// backend set it streams (replacing local ones), named by its revision.
    pub(crate) fn apply_managed(
        &self,
        policy: Policy,
        backends: BTreeMap<String, Vec<Endpoint>>,
        revision: u64,
    ) -> Arc<str> {
        self.change(|src| {
            src.policy = policy;
            src.overrides = backends;
            src.origin = "cp".into();
            src.named_version = Some(format!("cp-{revision}"));
            Ok(())
        })
        .unwrap_or_else(|_: ConfigError| self.load().version.clone())
    }

    /// Names the current config after the control plane's `revision`
    /// without rebuilding it: for a snapshot whose policy and backend sets
    /// are the ones applied (only circuits or suspicions changed), so the
    /// fleet's marks reach every proxy without a policy parse.
    pub(crate) fn rename_managed(&self, revision: u64) -> Arc<str> {
        let name = format!("cp-{revision}");
        let mut src = self.source.lock().unwrap_or_else(|e| e.into_inner());
        src.named_version = Some(name.clone());
        let old = self.current.load_full();
        let version: Arc<str> = Arc::from(name);
        let next = Snapshot {
            version: Arc::clone(&version),
            version_header: HeaderValue::from_str(&version).ok(),
            ..(*old).clone()
        };
        self.current.store(Arc::new(next));
        drop(src);
        self.metrics.config_change(Some(&version));
        version
    }

    /// Replaces the endpoints of one pool (the `set-backends` call).
    pub(crate) fn set_backends(
        &self,
        pool: &str,
        endpoints: Vec<Endpoint>,
    ) -> Result<Arc<str>, ConfigError> {
        self.change(|src| {
            if src.policy.pool(pool).is_none() {
                return Err(ConfigError::UnknownPool(pool.to_string()));
            }
            src.overrides.insert(pool.to_string(), endpoints);
            Ok(())
        })
    }

    /// Counts circuit overrides of a managed snapshot that were skipped.
    pub(crate) fn circuit_overrides_skipped(&self, n: usize) {
        if n > 0 {
            self.metrics.circuit_overrides_skipped(n);
        }
    }

    /// Counts a change that was refused before it reached the store.
    pub(crate) fn rejected(&self) {
        self.metrics.config_change(None);
    }

    fn change(
        &self,
        edit: impl FnOnce(&mut Source) -> Result<(), ConfigError>,
    ) -> Result<Arc<str>, ConfigError> {
        let span = tracing::info_span!(
            "config.apply",
            router.config_origin = tracing::field::Empty,
            router.config_version = tracing::field::Empty
        );
        let _entered = span.enter();
        let mut src = self.source.lock().unwrap_or_else(|e| e.into_inner());
        edit(&mut src)?;
        span.record("router.config_origin", src.origin.as_str());
        let old = self.current.load_full();
        let next = build(
            &mut src,
            &old.pools,
            &*old,
            &old.ramp_sides,
            &self.metrics,
            self.client.as_ref(),
            self.events.as_ref(),
        );
        if let Some(share) = self.prefix_share.get() {
            for pool in next.pools.values() {
                pool.share_prefixes(share);
            }
        }
        for (name, pool) in &old.pools {
            if !next.pools.contains_key(name) {
                pool.close();
            }
        }
        // A cached route whose pools changed (or that is gone): its
        // entries are unreachable under the new key, and purged here so that
        // a change back does not serve them again.
        for (route, pools) in &old.cache_pools {
            if next.cache_pools.get(route) != Some(pools) {
                self.purge_cache(&router_policy::cache::route_prefix(route));
            }
        }
        let version = Arc::clone(&next.version);
        span.record("router.config_version", &*version);
        self.current.store(Arc::new(next));
        self.metrics.config_change(Some(&version));
        Ok(version)
    }
}

/// Builds the next snapshot, reusing the runtimes of pools that stay.
fn build(
    src: &mut Source,
    old: &FnvHashMap<String, Arc<PoolRuntime>>,
    old_budgets: &dyn BudgetOf,
    old_sides: &[Arc<crate::ramp_tally::SideTally>],
    metrics: &Metrics,
    client: Option<&UpstreamClient>,
    events: Option<&tokio::sync::mpsc::Sender<crate::pool::CircuitEvent>>,
) -> Snapshot {
    src.changes += 1;
    let secrets = read_secrets(&src.policy);
    let cache_pools = src
        .policy
        .routes
        .iter()
        .filter(|r| r.cache.is_some())
        .map(|r| {
            let text = router_policy::cache::pools_text(&src.policy, r);
            (r.name.clone(), Arc::from(text))
        })
        .collect();
    let mut policy = src.policy.clone();
    for pool in &mut policy.pools {
        if let Some(eps) = src.overrides.get(&pool.name) {
            // With several keys, each address once per key.
            pool.endpoints = pool.keyed(eps);
            if let Some(key) = secrets
                .api_keys
                .get(&pool.name)
                .and_then(|k| k.all().next())
            {
                for ep in eps.iter().filter(|ep| !key.sent_to(ep)) {
                    tracing::warn!(
                        pool = %pool.name,
                        endpoint = %ep,
                        "the pool's API key is not sent to this endpoint: the policy does not list its origin"
                    );
                }
            }
        }
    }
    let mut pools = FnvHashMap::with_capacity_and_hasher(policy.pools.len(), Default::default());
    for p in &policy.pools {
        let mut drained = p.drained.clone();
        drained.extend(unkeyed(p, secrets.api_keys.get(&p.name)));
        let settings = PoolSettings {
            queue: p.queue,
            max_concurrency: p.max_concurrency,
            circuit: policy.circuit,
            drain: p.drain,
            drained,
            probe: p.probe,
            model: p.model.clone(),
            health_check: p.health_check.clone(),
            outlier: p.outlier_ejection,
            session_affinity: p.session_affinity.as_ref().and_then(|s| {
                http::HeaderName::from_bytes(s.header.as_bytes())
                    .ok()
                    .map(|h| (h, s.load_factor))
            }),
        };
        let probe = p.probe;
        let runtime = match old.get(&p.name) {
            Some(rt) => {
                rt.update(settings, &p.endpoints);
                Arc::clone(rt)
            }
            None => {
                let mut counters = metrics.pool_counters(&p.name);
                counters.events = events.cloned();
                PoolRuntime::new(&p.name, settings, &p.endpoints, counters)
            }
        };
        runtime.ensure_probe(probe, client);
        runtime.ensure_checks(
            p.health_check.clone(),
            secrets.api_keys.get(&p.name),
            client,
        );
        pools.insert(p.name.clone(), runtime);
    }
    let budgets = policy
        .routes
        .iter()
        .map(|r| {
            let kept = old_budgets
                .budget_named(&r.name)
                .filter(|b| b.settings() == r.retry_budget);
            match kept {
                Some(b) => Arc::clone(b),
                None => Arc::new(RouteBudget::new(r.retry_budget)),
            }
        })
        .collect();
    let version: Arc<str> = src
        .named_version
        .take()
        .unwrap_or_else(|| format!("{}-{}", src.origin, src.changes))
        .into();
    let ramp_sides = crate::ramp_tally::sides_of(&policy, old_sides).into();
    Snapshot {
        ramp_sides,
        version_header: HeaderValue::from_str(&version).ok(),
        version,
        secrets,
        translating_pools: policy.pools.iter().any(|p| !p.provider.speaks_openai()),
        policy: Arc::new(policy),
        pools,
        budgets,
        cache_pools,
        configured: src.origin != BOOT_ORIGIN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_provider_gets_its_key_in_its_own_header() {
        use router_policy::Provider;
        for (provider, name, value) in [
            (Provider::Openai, "authorization", "Bearer k1"),
            (Provider::Vllm, "authorization", "Bearer k1"),
            (Provider::Anthropic, "x-api-key", "k1"),
            (Provider::AzureOpenai, "api-key", "k1"),
            (Provider::Gemini, "x-goog-api-key", "k1"),
        ] {
            let (n, v) = pool_key_header(provider, "k1").unwrap();
            assert_eq!(
                (n.as_str(), v.to_str().unwrap()),
                (name, value),
                "{provider:?}"
            );
        }
    }
    use router_policy::QueueSettings;

    #[tokio::test]
    async fn set_backends_and_reload_keep_pool_state() {
        let store = ConfigStore::new(
            Policy::sidecar(QueueSettings::default(), None),
            "sidecar",
            Arc::new(Metrics::new()),
            None,
            None,
        );
        let v1 = store.load().version.clone();
        assert_eq!(
            store.load().pools["default"].availability(),
            crate::pool::Availability::NoEndpoints
        );
        let ep = Endpoint::parse("127.0.0.1:9").unwrap();
        let v2 = store.set_backends("default", vec![ep.clone()]).unwrap();
        assert_ne!(v1, v2);
        let pool = Arc::clone(&store.load().pools["default"]);
        assert_eq!(pool.availability(), crate::pool::Availability::Ready);
        let lease = pool
            .acquire_at(None, tokio::time::Instant::now(), Default::default())
            .await
            .unwrap();
        // A policy reload keeps the set-backends endpoints and the runtime.
        store.apply_policy(
            Policy::sidecar(QueueSettings::default(), Some(2)),
            "sidecar",
        );
        let after = store.load();
        assert!(Arc::ptr_eq(&pool, &after.pools["default"]));
        assert_eq!(after.policy.pools[0].endpoints, vec![ep]);
        assert_eq!(after.pool_status()[0].endpoints[0].in_flight, 1);
        drop(lease);
        assert_eq!(
            store.set_backends("nope", vec![]),
            Err(ConfigError::UnknownPool("nope".into()))
        );
    }

    #[tokio::test]
    async fn a_routes_retry_budget_outlives_a_reload_unless_its_settings_change() {
        let store = ConfigStore::new(
            Policy::sidecar(QueueSettings::default(), None),
            "sidecar",
            Arc::new(Metrics::new()),
            None,
            None,
        );
        let route = |s: &Snapshot| Arc::clone(&s.budgets[0]);
        let before = route(&store.load());
        store.apply_policy(
            Policy::sidecar(QueueSettings::default(), Some(2)),
            "sidecar",
        );
        assert!(Arc::ptr_eq(&before, &route(&store.load())), "kept");
        let mut changed = Policy::sidecar(QueueSettings::default(), None);
        changed.routes[0].retry_budget.ratio = 0.5;
        store.apply_policy(changed, "sidecar");
        assert!(!Arc::ptr_eq(&before, &route(&store.load())), "new settings");
    }
}

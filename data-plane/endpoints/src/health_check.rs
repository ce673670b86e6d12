//! Active health checks: one task per pool that has them, `GET`ting each
//! endpoint's health path on its own jittered schedule.
//!
//! The rules (thresholds, the first passing check of a new endpoint, the
//! jitter, suspicion) are [`router_policy::health`]'s; this task only does
//! the I/O and hands each result to the pool ([`PoolRuntime::record_check`]).
//!
//! - **Bounded cost.** At most one check in flight per endpoint, each
//!   bounded by the check's timeout (which validation keeps within the
//!   interval); an answer's body is read up to 64 KiB and dropped.
//! - **A new endpoint is checked at once**: the pool wakes this task when
//!   its endpoints change, so an endpoint added by `set-backends` or a
//!   reload waits one round trip, not an interval, for its first check
//!   (it takes no traffic before).
//! - **Jitter.** Each endpoint's next check is `interval ± 10%` from the
//!   end of its last one, so checks started together (a fleet restarted
//!   at once) drift apart instead of arriving at the backends in step.
//! - **What passes**: a `2xx` answer within the timeout. A refused
//!   connection, a reset, a timeout, any other status is a failure.
//! - **The pool's API key** (`api_key_env`) goes with each check to the
//!   origins the policy lists for the pool, as it goes with requests (a
//!   cloud API's `/v1/models` answers 401 without it), never elsewhere.
//!   With several keys (`api_keys_env`) each (endpoint, key) is checked
//!   with its own key.
//!
//! The path is requested from the server's root (`http://host:port/health`),
//! whatever base path the endpoint has: health pages live at the root.

use std::collections::{HashMap, HashSet};
use std::sync::Weak;

use http_body_util::{BodyExt, Limited};
use router_policy::health::HealthCheck;
use router_policy::Endpoint;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::pool::PoolRuntime;
use crate::probe::Probed;
use crate::PoolKeys;
use router_upstream::forward::UpstreamClient;

/// Largest health answer read (then dropped).
const BODY_LIMIT: usize = 64 * 1024;

/// Checks every endpoint of `pool` on its schedule until the pool is gone
/// or the task is aborted (on a config change that alters the checks).
pub(crate) async fn run(
    pool: Weak<PoolRuntime>,
    client: UpstreamClient,
    check: HealthCheck,
    keys: Option<PoolKeys>,
) {
    let settings = check.clone();
    run_with(pool, settings, move |endpoint| {
        let (client, check) = (client.clone(), check.clone());
        // The pool's key, to the origins the policy lists for it only.
        let auth = keys
            .as_ref()
            .and_then(|k| k.for_endpoint(&endpoint))
            .filter(|k| k.sent_to(&endpoint))
            .map(|k| (k.name.clone(), k.header.clone()));
        async move { check_once(&client, &endpoint, &check, auth).await }
    })
    .await;
}

/// [`run`] with the check itself given (`probe`: one check of one
/// endpoint), so that the schedule can be tested without a network.
async fn run_with<F, Fut>(pool: Weak<PoolRuntime>, check: HealthCheck, probe: F)
where
    F: Fn(Endpoint) -> Fut,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let mut next: HashMap<Endpoint, Instant> = HashMap::new();
    let mut checking: HashSet<Endpoint> = HashSet::new();
    let mut in_flight: JoinSet<(Endpoint, bool, Instant)> = JoinSet::new();
    loop {
        let Some(p) = pool.upgrade() else { return };
        let now = Instant::now();
        let targets = p.probe_targets();
        next.retain(|e, _| targets.contains(e));
        for t in &targets {
            // A new endpoint is checked at once.
            next.entry(t.clone()).or_insert(now);
        }
        for (endpoint, at) in &next {
            if *at <= now && checking.insert(endpoint.clone()) {
                let endpoint = endpoint.clone();
                let one = probe(endpoint.clone());
                in_flight.spawn(async move {
                    let passed = one.await;
                    (endpoint, passed, Instant::now())
                });
            }
        }
        let wake = next
            .iter()
            .filter(|(e, _)| !checking.contains(*e))
            .map(|(_, at)| *at)
            .min()
            .unwrap_or(now + check.interval);
        tokio::select! {
            Some(done) = in_flight.join_next() => {
                if let Ok((endpoint, passed, at)) = done {
                    checking.remove(&endpoint);
                    if next.contains_key(&endpoint) {
                        p.record_check(&endpoint, passed, at);
                        next.insert(endpoint, at + check.next_delay(crate::random::u64()));
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
            _ = p.endpoints_changed() => {}
        }
        // The pool is held only while waiting (bounded by the interval): a
        // pool dropped meanwhile ends the task at the next turn.
        drop(p);
    }
}

/// Checks one endpoint once: a `2xx` within the timeout passes.
async fn check_once(
    client: &UpstreamClient,
    endpoint: &Endpoint,
    check: &HealthCheck,
    auth: Option<(http::header::HeaderName, http::HeaderValue)>,
) -> bool {
    let Ok(uri) = router_upstream::forward::root_uri(endpoint, &check.path) else {
        return false;
    };
    let mut req =
        http::Request::get(uri).header(http::header::USER_AGENT, "llm-router-health-check");
    if let Some((name, value)) = auth {
        req = req.header(name, value);
    }
    let Ok(req) = req.body(router_upstream::client::OutBody::default()) else {
        return false;
    };
    let work = async {
        let resp = client.request(req).await.ok()?;
        let ok = resp.status().is_success();
        // Read (a bounded part of) the body so the connection can be kept.
        let _ = Limited::new(resp.into_body(), BODY_LIMIT).collect().await;
        Some(ok)
    };
    match tokio::time::timeout(check.timeout, work).await {
        Ok(Some(ok)) => ok,
        Ok(None) | Err(_) => {
            tracing::debug!(endpoint = %endpoint, path = %check.path, "health check failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use router_policy::health::HealthCheck;
    use router_policy::{Endpoint, Provider, QueueSettings};
    use tokio::time::Instant;

    use super::run_with;
    use crate::pool::{Availability, PoolCounters, PoolRuntime, PoolSettings};

    /// Scripted check results per endpoint (pass when the script is
    /// spent), and when each check ran.
    #[derive(Clone, Default)]
    struct Script {
        results: Arc<Mutex<std::collections::HashMap<String, VecDeque<bool>>>>,
        log: Arc<Mutex<Vec<(String, Instant)>>>,
    }

    impl Script {
        fn set(&self, endpoint: &str, results: &[bool]) {
            self.results
                .lock()
                .unwrap()
                .insert(endpoint.to_string(), results.iter().copied().collect());
        }

        fn times(&self, endpoint: &str) -> Vec<Instant> {
            self.log
                .lock()
                .unwrap()
                .iter()
                .filter(|(e, _)| e == endpoint)
                .map(|(_, t)| *t)
                .collect()
        }

        fn start(
            &self,
            pool: &Arc<PoolRuntime>,
            check: HealthCheck,
        ) -> tokio::task::JoinHandle<()> {
            let script = self.clone();
            tokio::spawn(run_with(
                Arc::downgrade(pool),
                check,
                move |ep: Endpoint| {
                    let key = ep.to_string();
                    script
                        .log
                        .lock()
                        .unwrap()
                        .push((key.clone(), Instant::now()));
                    let passed = script
                        .results
                        .lock()
                        .unwrap()
                        .get_mut(&key)
                        .and_then(VecDeque::pop_front)
                        .unwrap_or(true);
                    async move {
                        // A check takes a little time, as a real one does.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        passed
                    }
                },
            ))
        }
    }

    fn check() -> HealthCheck {
        HealthCheck {
            interval: Duration::from_millis(1000),
            timeout: Duration::from_millis(100),
            unhealthy_after: 3,
            healthy_after: 2,
            ..HealthCheck::defaults(Provider::Vllm)
        }
    }

    fn pool_of(addrs: &[&str]) -> Arc<PoolRuntime> {
        let mut s = PoolSettings::new(QueueSettings::default(), None);
        s.health_check = Some(check());
        let eps: Vec<Endpoint> = addrs.iter().map(|a| Endpoint::parse(a).unwrap()).collect();
        PoolRuntime::new("p", s, &eps, PoolCounters::default())
    }

    fn health_of(pool: &PoolRuntime, addr: &str) -> &'static str {
        pool.status()
            .endpoints
            .iter()
            .find(|e| &*e.addr == addr)
            .and_then(|e| e.health)
            .map_or("none", |h| h.as_str())
    }

    const A: &str = "http://10.0.0.1:8000";
    const B: &str = "http://10.0.0.2:8000";

    #[tokio::test(start_paused = true)]
    async fn a_new_endpoint_takes_traffic_only_after_its_first_passing_check() {
        // A request arriving before the first check waits for it, and gets
        // its lease when it passes.
        let pool = pool_of(&[A]);
        assert_eq!(
            pool.availability(),
            Availability::Ready,
            "awaiting its first check"
        );
        let waiter = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.acquire(None).await.map(|l| l.addr().to_string()) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no lease before a check passed");
        let script = Script::default();
        let task = script.start(&pool, check());
        assert_eq!(waiter.await.unwrap().unwrap(), A);
        assert_eq!(health_of(&pool, A), "healthy");
        task.abort();

        // A first check that fails: the pool counts as down and those
        // waiting move on at once (no_backend: the chain tries the next
        // pool); one pass later it takes traffic.
        let pool = pool_of(&[A]);
        let waiter = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.acquire(None).await.map(|l| l.addr().to_string()) }
        });
        tokio::task::yield_now().await;
        let script = Script::default();
        script.set(A, &[false, true]);
        let task = script.start(&pool, check());
        assert_eq!(
            waiter.await.unwrap().unwrap_err(),
            crate::pool::Shed::AllDown
        );
        assert_eq!(script.times(A).len(), 1, "checked at once");
        assert_eq!(health_of(&pool, A), "unknown");
        assert_eq!(
            pool.availability(),
            Availability::Unhealthy,
            "a failed first check"
        );
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(health_of(&pool, A), "healthy", "one pass is enough");
        assert_eq!(pool.availability(), Availability::Ready);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn thresholds_take_an_endpoint_out_and_bring_it_back() {
        let pool = pool_of(&[A, B]);
        let script = Script::default();
        // Healthy, then three failures, then two passes.
        script.set(A, &[true, false, false, false, true, true]);
        let task = script.start(&pool, check());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(health_of(&pool, A), "healthy");
        let mut seen = Vec::new();
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(1100)).await;
            seen.push(health_of(&pool, A));
        }
        // After checks 2 and 3 (failures 1, 2): still healthy; after check 4
        // (failure 3): unhealthy; check 5 (pass 1): still out; check 6:
        // back.
        let checks = script.times(A).len();
        assert!(checks >= 6, "{checks} checks");
        assert!(seen.contains(&"unhealthy"), "{seen:?}");
        assert_eq!(*seen.last().unwrap(), "healthy", "{seen:?}");
        let first_out = seen.iter().position(|h| *h == "unhealthy").unwrap();
        // Two failures in a row were not enough.
        assert!(first_out >= 1, "{seen:?}");
        assert_eq!(health_of(&pool, B), "healthy", "B is unaffected");
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn checks_are_jittered_within_ten_percent_of_the_interval() {
        let pool = pool_of(&[A, B]);
        let script = Script::default();
        let task = script.start(&pool, check());
        tokio::time::sleep(Duration::from_secs(30)).await;
        task.abort();
        let mut gaps = Vec::new();
        for addr in [A, B] {
            let t = script.times(addr);
            assert!(t.len() >= 25, "{}", t.len());
            gaps.extend(t.windows(2).map(|w| w[1] - w[0]));
        }
        // Each gap: the check's own 5 ms, then interval ± 10%.
        for g in &gaps {
            assert!(
                *g >= Duration::from_millis(900) && *g <= Duration::from_millis(1106),
                "{g:?}"
            );
        }
        let distinct: std::collections::BTreeSet<_> = gaps.iter().collect();
        assert!(distinct.len() > gaps.len() / 2, "jittered: {distinct:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_endpoint_added_later_is_checked_at_once() {
        let pool = pool_of(&[A]);
        let script = Script::default();
        let task = script.start(&pool, check());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut s = PoolSettings::new(QueueSettings::default(), None);
        s.health_check = Some(check());
        let added_at = Instant::now();
        pool.update(
            s,
            &[Endpoint::parse(A).unwrap(), Endpoint::parse(B).unwrap()],
        );
        assert_eq!(health_of(&pool, B), "unknown");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = script.times(B);
        assert_eq!(t.len(), 1);
        assert!(
            t[0] - added_at < Duration::from_millis(5),
            "not an interval later"
        );
        assert_eq!(health_of(&pool, B), "healthy");
        task.abort();
    }
}

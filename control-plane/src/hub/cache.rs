//! The response cache's purges (`routerctl cache purge --route R
//! [--tenant T]`): a purge is a mark in the stored state, carried to every
//! proxy in its snapshot (`Snapshot.cache_purges`), so that each proxy
//! drops the entries of its own store under the mark's key prefix whichever
//! replica it is connected to, and one that reconnects later still gets it.
//! The shared store's entries are dropped by the Admin call itself
//! (`service.rs`, with `--shared-store`): one walk of the store, not one
//! per proxy.
//!
//! Bounded: the latest [`MAX_PURGES`] marks are kept, each at most
//! [`router_policy::cache::CacheSettings::MAX_TTL`] (an entry older than
//! that has expired anyway). A proxy disconnected while more than
//! `MAX_PURGES` purges were asked misses the oldest of them.

use super::*;

use crate::store::CachePurgeRecord;
use router_policy::cache::{self, Partition};

/// Purge marks kept at most.
pub const MAX_PURGES: usize = 64;

impl Hub {
    /// Marks the entries of `route` (of `tenant`'s partition when it is
    /// not empty) purged; the committed revision and the key prefix. The
    /// route must be in the current policy with a cache; a tenant only
    /// names a partition on a route partitioned by tenant.
    pub async fn purge_cache(&self, route: &str, tenant: &str) -> Result<(u64, String), HubError> {
        let invalid = |field: &str, reason: String| {
            HubError::Invalid(vec![FieldError {
                field: field.into(),
                reason,
            }])
        };
        let policy = self
            .current_policy()
            .ok_or_else(|| HubError::NotFound("no policy has been applied".into()))?;
        let Some(r) = policy.routes.iter().find(|r| r.name == route) else {
            return Err(invalid(
                "route",
                format!("no route {route:?} in the current policy"),
            ));
        };
        let Some(settings) = &r.cache else {
            return Err(invalid("route", format!("route {route:?} has no cache")));
        };
        let prefix = match (tenant.is_empty(), &settings.partition) {
            (true, _) => cache::route_prefix(route),
            (false, Partition::Tenant) => cache::partition_prefix(route, tenant),
            (false, Partition::Route) => {
                return Err(invalid(
                    "tenant",
                    format!("route {route:?} shares its cache among all callers (partition: route): purge the whole route"),
                ))
            }
            (false, Partition::Header(h)) => {
                return Err(invalid(
                    "tenant",
                    format!("route {route:?} partitions its cache by header {h}, not by tenant: purge the whole route"),
                ))
            }
        };
        let id = uuid::Uuid::now_v7().to_string();
        let at = now_ms();
        let max_age = i64::try_from(cache::CacheSettings::MAX_TTL.as_millis()).unwrap_or(i64::MAX);
        let committed = self
            .change(|inner| {
                let mut next = inner.state.clone();
                next.cache_purges
                    .retain(|p| at.saturating_sub(p.at_unix_ms) < max_age);
                next.cache_purges.push(CachePurgeRecord {
                    id: id.clone(),
                    route: route.to_string(),
                    prefix: prefix.clone(),
                    at_unix_ms: at,
                });
                let over = next.cache_purges.len().saturating_sub(MAX_PURGES);
                next.cache_purges.drain(..over);
                Ok(Some((next, None)))
            })
            .await?;
        tracing::info!(
            route,
            tenant,
            prefix,
            revision = committed.revision,
            "response cache purge marked"
        );
        Ok((committed.revision, prefix))
    }
}

/// The purge marks as a snapshot carries them.
pub(super) fn purges_of(state: &State) -> Vec<pb::CachePurge> {
    state
        .cache_purges
        .iter()
        .map(|p| pb::CachePurge {
            id: p.id.clone(),
            prefix: p.prefix.clone(),
        })
        .collect()
}

/// Each cached route's pools as `policy` has them
/// (`router_policy::cache::pools_text`, what the proxies key entries by).
fn cached_pools(policy: Option<&Policy>) -> BTreeMap<String, Vec<u8>> {
    policy.map_or_else(BTreeMap::new, |p| {
        p.routes
            .iter()
            .filter(|r| r.cache.is_some())
            .map(|r| (r.name.clone(), cache::pools_text(p, r)))
            .collect()
    })
}

/// With a shared store: drops a cached route's entries there when a new
/// policy version changes its pools or removes it (the proxies drop their
/// own when they apply it). The entries are unreachable already (the
/// pools are part of their key); purged, a change back does not serve
/// them again. Runs until the hub is gone; the first version seen is the
/// baseline (a change made while this replica was down is not purged
/// here: its entries stay unreachable until their TTL).
pub async fn purge_on_pool_change(
    hub: std::sync::Weak<Hub>,
    client: router_shared_state::SharedStoreClient,
) {
    let mut published = match hub.upgrade() {
        Some(h) => h.subscribe(),
        None => return,
    };
    let mut last: Option<(u64, BTreeMap<String, Vec<u8>>)> = None;
    loop {
        let version = published.borrow_and_update().snapshot.policy_version;
        if last.as_ref().map(|(v, _)| *v) != Some(version) {
            let Some(h) = hub.upgrade() else { return };
            let now = cached_pools(h.current_policy().as_deref());
            drop(h);
            if let Some((_, before)) = &last {
                for (route, pools) in before {
                    if now.get(route) == Some(pools) {
                        continue;
                    }
                    let prefix = cache::route_prefix(route);
                    match client.purge_cache(&prefix).await {
                        Ok(n) => tracing::info!(
                            route,
                            entries = n,
                            "the route's pools changed: its shared cache entries purged"
                        ),
                        Err(e) => {
                            tracing::warn!(route, error = %crate::shared_store::message(&e), "the route's pools changed: its shared cache entries could not be purged (they stay unreachable until their TTL)")
                        }
                    }
                }
            }
            last = Some((version, now));
        }
        if published.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_latest_purges_are_kept_at_most_and_each_names_its_prefix() {
        let dir = std::env::temp_dir().join(format!("router-hub-purge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::RedbStore::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        let hub = Hub::open(Box::new(store), Guards::default(), crate::Limits::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let doc = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: only\n      endpoints: [\"127.0.0.1:9\"]\n  routes:\n    - name: r\n      chain: [only]\n      cache: {ttl_s: 60}\n";
        hub.apply_policy(doc, false, 0, "test")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut first_id = String::new();
        for i in 0..MAX_PURGES + 6 {
            let tenant = if i % 2 == 0 { "" } else { "team-a" };
            let (_, prefix) = hub
                .purge_cache("r", tenant)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let want = if tenant.is_empty() {
                cache::route_prefix("r")
            } else {
                cache::partition_prefix("r", "team-a")
            };
            assert_eq!(prefix, want);
            if i == 0 {
                first_id = hub.state().cache_purges[0].id.clone();
            }
        }
        let state = hub.state();
        assert_eq!(state.cache_purges.len(), MAX_PURGES);
        assert!(
            state.cache_purges.iter().all(|p| p.id != first_id),
            "the oldest went first"
        );
        // Every mark reaches the proxies' snapshot.
        assert_eq!(purges_of(&state).len(), MAX_PURGES);
        // An unknown route is refused, as is no cache to purge.
        assert!(matches!(
            hub.purge_cache("nope", "").await,
            Err(HubError::Invalid(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

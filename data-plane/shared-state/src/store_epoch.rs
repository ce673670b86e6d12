//! Watching the shared store for a loss of its data, carried out (the
//! rules are `router_policy::store_epoch`'s): once the first connection is
//! made and then every `Settings::shared_store_check` (`CUSTOM_ROUTER_SHARED_STORE_CHECK`), one
//! `SET router:store:epoch <offer> NX GET`; a marker gone or replaced since
//! the last check is logged once at warn and counted in
//! `router_shared_store_resets_total`.
//!
//! The cost is one small command per interval per proxy, never one per
//! request. A check that fails (store down, timed out) is counted in
//! `router_shared_store_errors_total{op="epoch"}` and says nothing about
//! the data: the next one that answers does.

use std::sync::Arc;
use std::time::Duration;

use router_policy::store_epoch::{candidate, observe, Epoch, Seen};

use crate::idempotency::IdempotencyStore;
use crate::{RedisStore, StoreEvents};

/// How often to look whether the first connection has been made.
const UNTIL_CONNECTED: Duration = Duration::from_millis(100);

/// Runs the checks until the proxy stops (the caller aborts the task).
pub async fn watch(store: Arc<RedisStore>, events: Arc<dyn StoreEvents>, every: Duration) {
    let mut saw: Option<Epoch> = None;
    let mut unreadable_logged = false;
    loop {
        if !store.connected() {
            tokio::time::sleep(UNTIL_CONNECTED).await;
            continue;
        }
        let offered = candidate(
            uuid::Uuid::now_v7().to_string(),
            // The marker tells operators since when the data runs: a wall time.
            router_policy::wall_clock::unix_ms(),
            saw.as_ref(),
        );
        match store.offer_epoch(&offered.to_text()).await {
            Err(e) => {
                events.store_error("epoch");
                tracing::debug!(error = %e, "shared store: the epoch check failed");
            }
            Ok(reply) => match observe(saw.as_ref(), &offered, reply.as_deref()) {
                Seen::First(now) => {
                    tracing::info!(
                        since = %shown(now.since_unix_ms),
                        "shared store: its data runs since this time (epoch marker router:store:epoch)"
                    );
                    saw = Some(now);
                }
                Seen::Same => {}
                Seen::Lost { lost, now } => {
                    events.store_reset();
                    tracing::warn!(
                        lost_since = %shown(lost.since_unix_ms),
                        "the shared store lost its data: spend since {} is gone (tenants' budgets, rate-limit windows, idempotency records and parked tasks start again)",
                        shown(lost.since_unix_ms)
                    );
                    saw = Some(now);
                }
                Seen::Unreadable => {
                    if !unreadable_logged {
                        tracing::warn!("shared store: router:store:epoch holds something that is not an epoch marker; a loss of the store's data cannot be detected until it is deleted");
                        unreadable_logged = true;
                    }
                }
            },
        }
        tokio::time::sleep(every).await;
    }
}

/// A Unix time in milliseconds as RFC 3339 (UTC, seconds); the number
/// itself when no clock reaches it (the marker is read from the network).
fn shown(unix_ms: u64) -> String {
    match std::time::UNIX_EPOCH.checked_add(Duration::from_millis(unix_ms)) {
        Some(t) => humantime::format_rfc3339_seconds(t).to_string(),
        None => format!("{unix_ms} ms after 1970"),
    }
}

//! The proxies' records: who is connected, what each applied, when it was
//! last seen, and the rate limit on its circuit reports (a token bucket per
//! proxy); published so that every replica lists the whole fleet.

use super::*;

/// What the hub keeps per proxy beside its record (not stored).
pub(super) struct Link {
    /// Streams open with this node id (a record is `connected` while any is).
    streams: u32,
    /// Circuit reports it may still send.
    reports: TokenBucket,
    /// Whether its reports are being dropped now (to log once per burst).
    dropping: bool,
}

/// A token bucket: `burst` at once, `rate` per second in the long run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn full(burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            last: now,
        }
    }

    /// Takes one token if there is one (refilled for the time since the
    /// last call).
    pub(crate) fn take(&mut self, burst: u32, rate: f64, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.max(0.0)).min(f64::from(burst));
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Hub {
    /// Records what a proxy said.
    pub fn proxy_seen(&self, node: &str, update: impl FnOnce(&mut ProxyRecord)) {
        let mut inner = self.lock();
        Self::touch(&mut inner, self.store.replica(), node, update);
    }

    fn touch(inner: &mut Inner, replica: &str, node: &str, update: impl FnOnce(&mut ProxyRecord)) {
        let rec = inner.proxies.entry(node.to_string()).or_default();
        rec.last_seen_unix_ms = now_ms();
        replica.clone_into(&mut rec.control_plane);
        update(rec);
        inner.proxies_changed.insert(node.to_string());
        inner.proxies_removed.remove(node);
    }

    fn link<'a>(inner: &'a mut Inner, limits: &Limits, node: &str) -> &'a mut Link {
        inner.links.entry(node.to_string()).or_insert_with(|| Link {
            streams: 0,
            reports: TokenBucket::full(limits.circuit_report_burst, Instant::now()),
            dropping: false,
        })
    }

    /// A proxy opened a stream (it is `connected` until its last one closes).
    ///
    /// A node id not seen before, with [`Limits::max_proxy_records`]
    /// records held, takes the place of the disconnected record seen
    /// longest ago; when every record is connected, it is refused.
    pub fn proxy_connected(&self, node: &str, last_applied_revision: u64) -> Result<(), HubError> {
        let mut inner = self.lock();
        let limit = self.limits.max_proxy_records;
        if !inner.proxies.contains_key(node) && inner.proxies.len() >= limit {
            let oldest = inner
                .proxies
                .iter()
                .filter(|(n, _)| inner.links.get(*n).is_none_or(|l| l.streams == 0))
                .min_by_key(|(_, p)| p.last_seen_unix_ms)
                .map(|(n, _)| n.clone());
            let Some(oldest) = oldest else {
                return Err(HubError::TooManyProxies { limit });
            };
            inner.proxies.remove(&oldest);
            inner.proxies_changed.remove(&oldest);
            inner.links.remove(&oldest);
            tracing::info!(node = %oldest, "proxy record dropped for a new proxy (--max-proxy-records)");
            inner.proxies_removed.insert(oldest);
        }
        Self::link(&mut inner, &self.limits, node).streams += 1;
        Self::touch(&mut inner, self.store.replica(), node, |p| {
            p.connected = true;
            p.applied_revision = last_applied_revision;
        });
        Ok(())
    }

    /// A proxy's stream closed.
    pub fn proxy_disconnected(&self, node: &str) {
        let mut inner = self.lock();
        let link = Self::link(&mut inner, &self.limits, node);
        link.streams = link.streams.saturating_sub(1);
        let connected = link.streams > 0;
        Self::touch(&mut inner, self.store.replica(), node, |p| {
            p.connected = connected;
        });
    }

    /// Whether a circuit report from `node` may go through its token bucket
    /// now; one that may not is counted in its record, and the first of a
    /// burst is logged.
    pub fn allow_circuit_report(&self, node: &str) -> bool {
        let limits = self.limits;
        let mut inner = self.lock();
        let link = Self::link(&mut inner, &limits, node);
        let allowed = link.reports.take(
            limits.circuit_report_burst,
            limits.circuit_reports_per_second,
            Instant::now(),
        );
        let first_dropped = !allowed && !link.dropping;
        link.dropping = !allowed;
        if !allowed {
            let mut dropped = 0;
            Self::touch(&mut inner, self.store.replica(), node, |p| {
                p.circuit_reports_dropped += 1;
                dropped = p.circuit_reports_dropped;
            });
            if first_dropped {
                tracing::warn!(
                    node,
                    dropped,
                    burst = limits.circuit_report_burst,
                    per_second = limits.circuit_reports_per_second,
                    "circuit reports over the rate limit: ignoring the excess"
                );
            }
        }
        allowed
    }

    /// Drops the records of proxies gone for longer than the record TTL
    /// (every replica its own; the store forgets them at the next
    /// publication). Returns how many went.
    pub fn prune_proxies(&self) -> usize {
        let ttl = i64::try_from(self.limits.proxy_record_ttl.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(ttl);
        let mut inner = self.lock();
        let gone: Vec<String> = inner
            .proxies
            .iter()
            .filter(|(_, p)| !p.connected && p.last_seen_unix_ms < cutoff)
            .map(|(node, _)| node.clone())
            .collect();
        for node in &gone {
            inner.proxies.remove(node);
            inner.proxies_changed.remove(node);
            if inner.links.get(node).is_some_and(|l| l.streams == 0) {
                inner.links.remove(node);
            }
            inner.proxies_removed.insert(node.clone());
        }
        if !gone.is_empty() {
            tracing::info!(
                removed = gone.len(),
                "records of proxies gone for longer than the TTL dropped"
            );
        }
        gone.len()
    }

    /// Every proxy seen by this replica.
    pub fn proxies(&self) -> BTreeMap<String, ProxyRecord> {
        self.lock().proxies.clone()
    }

    /// Every proxy of the fleet: this replica's, and those the other
    /// replicas published (within a second of their change). A proxy that
    /// moved between replicas is shown where it is connected now, else
    /// where it was seen last.
    pub async fn fleet_proxies(&self) -> BTreeMap<String, ProxyRecord> {
        let mut fleet = self.proxies();
        let published = match self.store.fleet_proxies().await {
            Ok(Some(p)) => p,
            Ok(None) => return fleet,
            Err(e) => {
                tracing::warn!(error = %e, "other replicas' proxies unavailable; listing this replica's");
                return fleet;
            }
        };
        for (node, record) in published {
            let better = match fleet.get(&node) {
                None => true,
                Some(have) => {
                    (record.connected, record.last_seen_unix_ms)
                        > (have.connected, have.last_seen_unix_ms)
                }
            };
            if better {
                fleet.insert(node, record);
            }
        }
        fleet
    }

    /// Publishes the proxy records that changed (every second).
    pub(super) async fn publish_proxies(&self) {
        let (all, changed, removed) = {
            let mut inner = self.lock();
            let changed: Vec<String> = std::mem::take(&mut inner.proxies_changed)
                .into_iter()
                .collect();
            let removed: Vec<String> = std::mem::take(&mut inner.proxies_removed)
                .into_iter()
                .collect();
            (inner.proxies.clone(), changed, removed)
        };
        if let Err(e) = self.store.publish_proxies(&all, &changed, &removed).await {
            tracing::warn!(error = %e, "cannot publish this replica's proxies");
            // Try those again next time (unless they came back meanwhile).
            let mut inner = self.lock();
            inner.proxies_changed.extend(changed);
            let back: Vec<String> = removed
                .into_iter()
                .filter(|n| !inner.proxies.contains_key(n))
                .collect();
            inner.proxies_removed.extend(back);
        }
    }
}

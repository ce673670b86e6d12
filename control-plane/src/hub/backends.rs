//! Backend sets: a pool's endpoints replaced (`backends set`) or one
//! drained, for every proxy.

use super::*;

/// Refuses a backend set for a pool the current policy does not have.
fn check_pool_exists(inner: &Inner, pool: &str, guards: &Guards) -> Result<(), HubError> {
    let Some(p) = inner
        .history
        .iter()
        .find(|p| p.version == inner.state.policy_version)
    else {
        return Ok(());
    };
    match load(&p.document, guards) {
        Ok(policy) if policy.pool(pool).is_none() => Err(HubError::Invalid(vec![FieldError {
            field: "pool".into(),
            reason: format!("the current policy has no pool {pool:?}"),
        }])),
        _ => Ok(()),
    }
}

impl Hub {
    /// Replaces a pool's backend set.
    pub async fn set_backends(
        &self,
        pool: &str,
        endpoints: Vec<String>,
        drained: Vec<String>,
    ) -> Result<u64, HubError> {
        let mut errors = Vec::new();
        for (i, e) in endpoints.iter().enumerate() {
            let refused = match Endpoint::parse(e) {
                Ok(ep) => backend_refusal(&ep, &self.guards.backend_hosts),
                Err(err) => Some(err.to_string()),
            };
            if let Some(reason) = refused {
                errors.push(FieldError {
                    field: format!("endpoints[{i}]"),
                    reason,
                });
            }
        }
        // Drained entries are kept as their endpoint is written, so the
        // proxies match them exactly.
        let mut drained_as_written = Vec::with_capacity(drained.len());
        for (i, d) in drained.iter().enumerate() {
            match endpoints.iter().find(|e| Endpoint::same_address(e, d)) {
                Some(e) => drained_as_written.push(e.clone()),
                None => errors.push(FieldError {
                    field: format!("drained[{i}]"),
                    reason: format!("{d} is not one of the endpoints"),
                }),
            }
        }
        let drained = drained_as_written;
        if pool.is_empty() {
            errors.push(FieldError {
                field: "pool".into(),
                reason: "required".into(),
            });
        }
        if !errors.is_empty() {
            return Err(HubError::Invalid(errors));
        }
        let set = BackendSet { endpoints, drained };
        self.change(|inner| {
            check_pool_exists(inner, pool, &self.guards)?;
            let mut next = inner.state.clone();
            next.backends.insert(pool.to_string(), set.clone());
            retain_valid_circuits(
                &mut next,
                policy_of(inner, inner.state.policy_version, &self.guards).as_deref(),
            );
            Ok(Some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// Drains one endpoint of a pool's backend set.
    pub async fn drain(&self, pool: &str, endpoint: &str) -> Result<u64, HubError> {
        self.change(|inner| {
            let current = inner.state.backends.get(pool).ok_or_else(|| {
                HubError::NotFound(format!("no backend set for pool {pool:?} (set it first)"))
            })?;
            // Compared as endpoints: health and metrics show
            // `http://host:port` for a backend set as `host:port`.
            let Some(endpoint) = current
                .endpoints
                .iter()
                .find(|e| Endpoint::same_address(e, endpoint))
                .cloned()
            else {
                return Err(HubError::NotFound(format!(
                    "{endpoint} is not a backend of {pool} (its backends: {})",
                    current.endpoints.join(", ")
                )));
            };
            if current.drained.contains(&endpoint) {
                return Ok(None);
            }
            let mut next = inner.state.clone();
            if let Some(set) = next.backends.get_mut(pool) {
                set.drained.push(endpoint);
            }
            Ok(Some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }
}

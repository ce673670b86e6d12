//! Circuit overrides and suspicion marks: operators' (`circuits open`,
//! `close`) and proxies' reports, checked against the policy, shared with
//! every proxy until they expire. A change of marks only keeps the config's
//! name ([`crate::store::State::config_revision`]).

use super::*;

/// Checks a circuit override against `policy` and the backend sets of
/// `state`: the pool must exist, and a named endpoint must parse (with its
/// port) and be one of the pool's endpoints (its backend set when it has
/// one, else the policy's). Every problem, with its field.
pub fn check_circuit(
    state: &State,
    policy: Option<&Policy>,
    pool: &str,
    endpoint: &str,
) -> Result<(), Vec<FieldError>> {
    let field = |field: &str, reason: String| {
        vec![FieldError {
            field: field.into(),
            reason,
        }]
    };
    if pool.is_empty() {
        return Err(field("pool", "required".into()));
    }
    let Some(policy) = policy else {
        return Err(field("pool", "no policy applied yet".into()));
    };
    let Some(p) = policy.pool(pool) else {
        return Err(field(
            "pool",
            format!("the current policy has no pool {pool:?}"),
        ));
    };
    if endpoint.is_empty() {
        return Ok(());
    }
    let wanted = Endpoint::parse(endpoint).map_err(|e| field("endpoint", e.to_string()))?;
    // With several keys, each address once per key (`url#KEY_VARIABLE`),
    // as the proxies name them.
    let endpoints: Vec<Endpoint> = match state.backends.get(pool) {
        Some(set) => p.keyed(
            &set.endpoints
                .iter()
                .filter_map(|e| Endpoint::parse(e).ok())
                .collect::<Vec<_>>(),
        ),
        None => p.endpoints.clone(),
    };
    if endpoints.contains(&wanted) {
        return Ok(());
    }
    let known: Vec<String> = endpoints.iter().take(5).map(ToString::to_string).collect();
    Err(field(
        "endpoint",
        format!(
            "{endpoint} is not an endpoint of pool {pool} ({}{})",
            if known.is_empty() {
                "it has none".to_string()
            } else {
                format!("its endpoints: {}", known.join(", "))
            },
            if endpoints.len() > known.len() {
                ", ..."
            } else {
                ""
            }
        ),
    ))
}

/// Drops the circuit overrides `policy` and the backend sets of `state` no
/// longer allow (a pool removed, an endpoint no longer in its pool).
pub(super) fn retain_valid_circuits(state: &mut State, policy: Option<&Policy>) {
    let before = state.circuits.len();
    let circuits = std::mem::take(&mut state.circuits);
    state.circuits = circuits
        .into_iter()
        .filter(|c| check_circuit(state, policy, &c.pool, &c.endpoint).is_ok())
        .collect();
    if state.circuits.len() != before {
        tracing::info!(
            dropped = before - state.circuits.len(),
            "circuit overrides of pools or endpoints that are gone are dropped"
        );
    }
}

impl Hub {
    /// Forces a circuit open (or closed) for a while; `open: false` with no
    /// duration clears overrides of that target. A new override must name a
    /// pool of the current policy and, if any, one of its endpoints
    /// ([`check_circuit`]), or it is refused with the field; clearing is
    /// refused only when it matches no override and would be invalid (a
    /// typo), so an override left on a removed endpoint can still be cleared.
    pub async fn set_circuit(
        &self,
        pool: &str,
        endpoint: &str,
        open: bool,
        for_secs: u64,
        source: &str,
    ) -> Result<u64, HubError> {
        let secs = if for_secs == 0 {
            300
        } else {
            for_secs.min(86_400)
        };
        let until = now_ms() + i64::try_from(secs * 1000).unwrap_or(i64::MAX);
        let creates = open || for_secs > 0;
        self.change(|inner| {
            // A pool-wide change (no endpoint) replaces every override of
            // the pool, the per-endpoint ones too: `circuits close POOL`
            // clears them all, `circuits open POOL` opens the whole pool.
            // Opening replaces circuits only; closing clears the
            // suspicions too (an operator who closes says "send to it").
            let matches = |c: &CircuitRecord| {
                c.pool == pool
                    && (endpoint.is_empty() || Endpoint::same_address(&c.endpoint, endpoint))
                    && (c.source == source || source == "operator")
                    && (c.suspect.is_empty() || !open)
            };
            if creates || !inner.state.circuits.iter().any(matches) {
                let policy = policy_of(inner, inner.state.policy_version, &self.guards);
                check_circuit(&inner.state, policy.as_deref(), pool, endpoint)
                    .map_err(HubError::Invalid)?;
            }
            let mut next = inner.state.clone();
            next.circuits.retain(|c| !matches(c));
            if creates {
                next.circuits.push(CircuitRecord {
                    pool: pool.to_string(),
                    endpoint: endpoint.to_string(),
                    open,
                    until_unix_ms: until,
                    source: source.to_string(),
                    suspect: String::new(),
                });
            }
            Ok((next.circuits != inner.state.circuits).then_some((next, None)))
        })
        .await
        .map(|c| c.revision)
    }

    /// A proxy's circuit transition: an open circuit is shared with every
    /// proxy until its expiry; a closed one withdraws that proxy's report.
    /// A suspicion (`report.suspect`) is kept apart from circuits the same
    /// way, except that a cleared one (a check passed, an answer came)
    /// clears every proxy's of that cause.
    /// Reports through different replicas land in the one stored list, so
    /// the fleet has one view. An open report is checked as an operator's
    /// override is ([`check_circuit`]): a proxy of another version cannot
    /// plant an override the others would have to skip.
    pub async fn report_circuit(
        &self,
        node: &str,
        report: &pb::CircuitReport,
    ) -> Result<u64, HubError> {
        self.change_with(
            |inner| {
                let now = now_ms();
                if report.open {
                    let policy = policy_of(inner, inner.state.policy_version, &self.guards);
                    check_circuit(
                        &inner.state,
                        policy.as_deref(),
                        &report.pool,
                        &report.endpoint,
                    )
                    .map_err(HubError::Invalid)?;
                }
                if !report.suspect.is_empty() && SuspectCause::parse(&report.suspect).is_none() {
                    return Err(HubError::Invalid(vec![FieldError {
                        field: "suspect".into(),
                        reason: format!(
                            "unknown cause {:?} (check, attempt, quota)",
                            report.suspect
                        ),
                    }]));
                }
                let mut next = inner.state.clone();
                // A passing check or an answer clears that cause's suspicion
                // for every proxy (router_policy::health); anything else
                // replaces this proxy's own record of the same kind.
                let clears_all = !report.open && !report.suspect.is_empty();
                next.circuits.retain(|c| {
                    !(c.pool == report.pool
                        && c.endpoint == report.endpoint
                        && c.suspect == report.suspect
                        && (c.source == node || clears_all))
                });
                if report.open && report.until_unix_ms > now {
                    next.circuits.push(CircuitRecord {
                        pool: report.pool.clone(),
                        endpoint: report.endpoint.clone(),
                        open: true,
                        // A proxy may not hold the fleet's circuit open for long.
                        until_unix_ms: report.until_unix_ms.min(now + 600_000),
                        source: node.to_string(),
                        suspect: report.suspect.clone(),
                    });
                }
                Ok((next.circuits != inner.state.circuits).then_some((next, None)))
            },
            true,
        )
        .await
        .map(|c| c.revision)
    }

    /// Drops expired circuit overrides, and keys a day past their expiry
    /// (a change only when some expired).
    pub async fn prune_expired(&self) -> Result<(), HubError> {
        self.change(|inner| {
            let now = now_ms();
            let kept = |k: &KeyRecord| k.live(now - KEY_KEPT_AFTER_EXPIRY_MS);
            if inner.state.circuits.iter().all(|c| c.until_unix_ms > now)
                && inner.state.keys.iter().all(kept)
            {
                return Ok(None);
            }
            let mut next = inner.state.clone();
            next.circuits.retain(|c| c.until_unix_ms > now);
            next.keys.retain(kept);
            Ok(Some((next, None)))
        })
        .await
        .map(|_| ())
    }
}

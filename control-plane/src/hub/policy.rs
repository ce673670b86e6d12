//! Policy versions: apply (validated, compare-and-swap on the version, a
//! document that reads the same as the current one makes no version),
//! rollback (a new version with an earlier document), history and its
//! pruning, and what reads the current policy (tenant names, explain).
//! Each version records who applied it and why ([`Applier`]).

use super::*;

/// What applying a policy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyApplied {
    /// The version now current (the new one, or the unchanged current).
    pub version: u64,
    /// The store's revision.
    pub revision: u64,
    /// Whether a new version was made.
    pub changed: bool,
}

/// Who applies a policy (or rolls one back), and why, for its history.
#[derive(Debug, Clone, Copy, Default)]
pub struct Applier<'a> {
    /// Who, as the client said (`$USER`).
    pub author: &'a str,
    /// The caller's token: its name, else its role (`operator`, `open`).
    pub operator: &'a str,
    /// The operator's note (`policy apply --note`); may be empty.
    pub message: &'a str,
}

/// How many tenant names an error lists.
pub(super) const NAMES_SHOWN: usize = 10;

/// A tenant the current policy does not name ([`Hub::check_tenant`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownTenant {
    /// The current policy has no tenants (or there is no policy yet).
    #[error("no tenant {name:?}: the current policy has no tenants")]
    NoTenants {
        /// The tenant asked for.
        name: String,
    },
    /// The current policy names other tenants.
    #[error("no tenant {name:?} in the current policy; its tenants: {}", shown(.tenants))]
    NotNamed {
        /// The tenant asked for.
        name: String,
        /// Those the policy names (the text shows at most [`NAMES_SHOWN`]).
        tenants: Vec<String>,
    },
}

/// At most [`NAMES_SHOWN`] of `names`, and how many there are in all when
/// that is more: the text travels in a gRPC status, whose headers are
/// bounded.
fn shown(names: &[String]) -> String {
    let mut shown = names
        .iter()
        .take(NAMES_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMES_SHOWN {
        shown.push_str(&format!(
            ", ... ({} in all: routerctl tenants list)",
            names.len()
        ));
    }
    shown
}

/// The longest note a policy version may carry.
pub const MAX_NOTE: usize = 512;

/// How many policy versions the history keeps (the current one is always kept).
pub const HISTORY_LIMIT: usize = 100;

/// Refuses a note too long to show, or with control characters.
fn check_note(note: &str) -> Result<(), HubError> {
    if note.len() > MAX_NOTE || note.chars().any(char::is_control) {
        return Err(HubError::Invalid(vec![FieldError {
            field: "note".into(),
            reason: format!("at most {MAX_NOTE} bytes on one line, without control characters"),
        }]));
    }
    Ok(())
}

/// The next state with `document` current: backend sets of pools it no
/// longer has are dropped (proxies would refuse a snapshot with a backend
/// set for an unknown pool), and so are circuit overrides of pools or
/// endpoints it no longer has.
fn with_policy(inner: &Inner, document: &str, version: u64, guards: &Guards) -> State {
    let mut next = inner.state.clone();
    next.policy_version = version;
    if let Ok(policy) = load(document, guards) {
        let before = next.backends.len();
        next.backends.retain(|pool, _| policy.pool(pool).is_some());
        retain_valid_circuits(&mut next, Some(&policy));
        if next.backends.len() != before {
            tracing::info!(
                dropped = before - next.backends.len(),
                "backend sets of pools the new policy removes are dropped"
            );
        }
    }
    next
}

/// Validates a policy document with the same rules as `routerctl policy
/// validate`, against `guards`: every error at once, misspelt fields and
/// what validation finds in the rest ([`router_policy::document::load_with`]).
pub fn validate(document: &str, guards: &Guards) -> Result<(), Vec<FieldError>> {
    load_with(document, &QueueSettings::default(), guards)
        .map(|_| ())
        .map_err(|e| e.errors)
}

impl Hub {
    /// Applies (or with `dry_run` only validates) a policy. Returns the
    /// version it got (or would get) and the revision.
    pub async fn apply_policy(
        &self,
        document: &str,
        dry_run: bool,
        expected_version: u64,
        author: &str,
    ) -> Result<(u64, u64), HubError> {
        self.apply_policy_checked(document, dry_run, expected_version, author)
            .await
            .map(|a| (a.version, a.revision))
    }

    /// [`Hub::apply_policy_by`] with only the client's author name.
    pub async fn apply_policy_checked(
        &self,
        document: &str,
        dry_run: bool,
        expected_version: u64,
        author: &str,
    ) -> Result<PolicyApplied, HubError> {
        let who = Applier {
            author,
            ..Applier::default()
        };
        self.apply_policy_by(document, dry_run, expected_version, &who)
            .await
    }

    /// [`Hub::apply_policy`], saying whether a new version was made: a
    /// document that reads the same as the current one (comments and
    /// layout aside) is not applied again; the answer names the current
    /// version, `changed: false`. `who` goes into the version's record.
    pub async fn apply_policy_by(
        &self,
        document: &str,
        dry_run: bool,
        expected_version: u64,
        who: &Applier<'_>,
    ) -> Result<PolicyApplied, HubError> {
        check_note(who.message)?;
        let author = who.author;
        let span = tracing::info_span!(
            "policy.apply",
            dry_run,
            router.policy_version = tracing::field::Empty,
            router.revision = tracing::field::Empty
        );
        async {
            {
                let _validate = tracing::info_span!("policy.validate").entered();
                self.validate(document).map_err(HubError::Invalid)?;
            }
            let check = |inner: &Inner| {
                let current = inner.state.policy_version;
                if expected_version != 0 && expected_version != current {
                    return Err(HubError::Conflict {
                        expected: expected_version,
                        current,
                    });
                }
                Ok(inner.next_policy_version())
            };
            // The same document as the current one (parsed: comments and
            // layout do not count) makes no new version.
            let same_as_current = |inner: &Inner| {
                let current = inner
                    .history
                    .iter()
                    .find(|p| p.version == inner.state.policy_version)?;
                let same = PolicyDocument::parse(&current.document).ok()?
                    == PolicyDocument::parse(document).ok()?;
                same.then_some(current.version)
            };
            let too_large = |e: HubError| match e {
                HubError::TooLarge { .. } => HubError::Invalid(vec![FieldError {
                    field: "document".into(),
                    reason: e.to_string(),
                }]),
                e => e,
            };
            if dry_run {
                let inner = self.lock();
                let version = check(&inner)?;
                if let Some(current) = same_as_current(&inner) {
                    return Ok(PolicyApplied {
                        version: current,
                        revision: inner.state.revision,
                        changed: false,
                    });
                }
                let next = with_policy(&inner, document, version, &self.guards);
                check_fits(&next, document.len(), &self.store_id).map_err(too_large)?;
                return Ok(PolicyApplied {
                    version,
                    revision: inner.state.revision,
                    changed: true,
                });
            }
            let mut changed = true;
            let done = self
                .change(|inner| {
                    let version = check(inner)?;
                    if same_as_current(inner).is_some() {
                        changed = false;
                        return Ok(None);
                    }
                    changed = true;
                    let record = PolicyRecord {
                        version,
                        document: document.to_string(),
                        applied_at_unix_ms: now_ms(),
                        author: author.to_string(),
                        note: "apply".into(),
                        operator: who.operator.to_string(),
                        message: who.message.to_string(),
                    };
                    let next = with_policy(inner, document, version, &self.guards);
                    Ok(Some((next, Some(record))))
                })
                .await
                .map_err(too_large)?;
            let span = tracing::Span::current();
            span.record("router.policy_version", done.policy_version);
            span.record("router.revision", done.revision);
            if changed {
                tracing::info!(
                    version = done.policy_version,
                    revision = done.revision,
                    author,
                    "policy applied"
                );
            } else {
                tracing::info!(
                    version = done.policy_version,
                    author,
                    "policy unchanged: the same document as the current version"
                );
            }
            Ok(PolicyApplied {
                version: done.policy_version,
                revision: done.revision,
                changed,
            })
        }
        .instrument(span)
        .await
    }

    /// Makes an earlier version current again (as a new version).
    pub async fn rollback(
        &self,
        to_version: u64,
        expected_version: u64,
    ) -> Result<(u64, u64), HubError> {
        self.rollback_by(to_version, expected_version, &Applier::default())
            .await
    }

    /// [`Hub::rollback`], recording `who` with the new version.
    pub async fn rollback_by(
        &self,
        to_version: u64,
        expected_version: u64,
        who: &Applier<'_>,
    ) -> Result<(u64, u64), HubError> {
        check_note(who.message)?;
        let mut target = 0;
        let done = self
            .change(|inner| {
                let current = inner.state.policy_version;
                if expected_version != 0 && expected_version != current {
                    return Err(HubError::Conflict {
                        expected: expected_version,
                        current,
                    });
                }
                let wanted = if to_version == 0 {
                    inner
                        .history
                        .iter()
                        .filter(|p| p.version < current && p.note == "apply")
                        .map(|p| p.version)
                        .max()
                        .or_else(|| {
                            inner
                                .history
                                .iter()
                                .filter(|p| p.version < current)
                                .map(|p| p.version)
                                .max()
                        })
                } else {
                    Some(to_version)
                };
                let wanted = wanted.ok_or_else(|| {
                    HubError::NotFound("no earlier version to roll back to".into())
                })?;
                let document = inner
                    .history
                    .iter()
                    .find(|p| p.version == wanted)
                    .map(|p| p.document.clone())
                    .ok_or_else(|| HubError::NotFound(format!("no policy version {wanted}")))?;
                // Checked again: the guards may have narrowed since.
                self.validate(&document).map_err(HubError::Invalid)?;
                target = wanted;
                let version = inner.next_policy_version();
                let next = with_policy(inner, &document, version, &self.guards);
                let record = PolicyRecord {
                    version,
                    document,
                    applied_at_unix_ms: now_ms(),
                    author: if who.author.is_empty() {
                        "rollback".into()
                    } else {
                        who.author.to_string()
                    },
                    note: format!("rollback to {wanted}"),
                    operator: who.operator.to_string(),
                    message: who.message.to_string(),
                };
                Ok(Some((next, Some(record))))
            })
            .await?;
        tracing::info!(
            version = done.policy_version,
            target,
            revision = done.revision,
            "policy rolled back"
        );
        Ok((done.policy_version, done.revision))
    }

    /// A policy version (0: current).
    pub fn policy(&self, version: u64) -> Option<PolicyRecord> {
        let inner = self.lock();
        let v = if version == 0 {
            inner.state.policy_version
        } else {
            version
        };
        inner.history.iter().find(|p| p.version == v).cloned()
    }

    /// Every version, oldest first.
    pub fn history(&self) -> Vec<PolicyRecord> {
        self.lock().history.clone()
    }

    /// Removes all but the newest [`HISTORY_LIMIT`] policy versions (never
    /// the current one). Returns how many went.
    pub async fn prune_history(&self) -> Result<usize, HubError> {
        let old: Vec<u64> = {
            let inner = self.lock();
            let excess = inner.history.len().saturating_sub(HISTORY_LIMIT);
            inner
                .history
                .iter()
                .take(excess)
                .map(|p| p.version)
                .filter(|v| *v != inner.state.policy_version)
                .collect()
        };
        if old.is_empty() {
            return Ok(0);
        }
        self.store.remove_policies(&old).await?;
        self.lock().history.retain(|p| !old.contains(&p.version));
        tracing::info!(removed = old.len(), "old policy versions pruned");
        Ok(old.len())
    }

    /// `Err` saying why, when the current policy has no tenant `name`
    /// (naming at most [`NAMES_SHOWN`] of those it has: the reason travels
    /// in a gRPC status, whose headers are bounded).
    pub fn check_tenant(&self, name: &str) -> Result<(), UnknownTenant> {
        let names = self.tenant_names();
        if names.iter().any(|n| n == name) {
            return Ok(());
        }
        let name = name.to_string();
        Err(if names.is_empty() {
            UnknownTenant::NoTenants { name }
        } else {
            UnknownTenant::NotNamed {
                name,
                tenants: names,
            }
        })
    }

    /// The tenants the current policy names (none before a policy).
    pub fn tenant_names(&self) -> Vec<String> {
        let inner = self.lock();
        let version = inner.state.policy_version;
        policy_of(&inner, version, &self.guards)
            .and_then(|p| {
                p.tenants
                    .as_ref()
                    .map(|t| t.list().iter().map(|t| t.name.clone()).collect())
            })
            .unwrap_or_default()
    }

    /// The tenants the current policy names, with their limits (none
    /// before a policy).
    pub fn tenants(&self) -> Vec<router_policy::tenant::Tenant> {
        let inner = self.lock();
        let version = inner.state.policy_version;
        policy_of(&inner, version, &self.guards)
            .and_then(|p| p.tenants.as_ref().map(|t| t.list().to_vec()))
            .unwrap_or_default()
    }

    /// Explains a situation against the current policy.
    pub fn explain(&self, situation_json: &str) -> Result<String, HubError> {
        let situation: router_policy::decide::Situation = serde_json::from_str(situation_json)
            .map_err(|e| {
                HubError::Invalid(vec![FieldError {
                    field: "situation".into(),
                    reason: e.to_string(),
                }])
            })?;
        let record = self
            .policy(0)
            .ok_or_else(|| HubError::NotFound("no policy applied yet".into()))?;
        let policy =
            load(&record.document, &self.guards).map_err(|e| HubError::Invalid(e.errors))?;
        router_policy::decide::check_situation(&policy, &situation)
            .map_err(|e| HubError::Invalid(vec![e]))?;
        let answer = router_policy::decide::explain(&policy, &situation);
        serde_json::to_string(&answer).map_err(|e| {
            HubError::Invalid(vec![FieldError {
                field: "situation".into(),
                reason: e.to_string(),
            }])
        })
    }

    /// The current policy, resolved against this control plane's guards
    /// (`None` before one is applied), for the console's pools and explain
    /// pages.
    pub fn current_policy(&self) -> Option<Arc<Policy>> {
        let inner = self.lock();
        policy_of(&inner, inner.state.policy_version, &self.guards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Admin API's dry run (and the console's) reports a misspelt field
    /// and what validation finds in the rest in one answer, as `routerctl
    /// policy validate` does.
    #[test]
    fn validation_reports_a_misspelt_field_and_the_rest_at_once() {
        let document = "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools:\n    - name: a\n      endpoints: [\"127.0.0.1:9\"]\n      max_concurency: 4\n  routes:\n    - name: r\n      chain: [nowhere]\n";
        let errors = validate(document, &Guards::default()).unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields.len(), 2, "{errors:?}");
        assert_eq!(fields[0], "spec.pools[0].max_concurency");
        assert!(fields[1].starts_with("spec.routes[0].chain"), "{errors:?}");
    }

    #[tokio::test]
    async fn a_tenant_the_policy_does_not_name_is_refused_with_those_it_names() {
        let dir = std::env::temp_dir().join(format!("router-hub-tenants-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::store::RedbStore::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        let hub = Hub::open(Box::new(store), Guards::default(), Limits::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            hub.check_tenant("team-a"),
            Err(UnknownTenant::NoTenants {
                name: "team-a".into()
            })
        );
        let names: Vec<String> = (0..12).map(|i| format!("team-{i:02}")).collect();
        let tenants = names
            .iter()
            .map(|n| format!("{{name: {n}}}"))
            .collect::<Vec<_>>()
            .join(", ");
        let document = format!(
            "apiVersion: router/v1\nkind: RoutingPolicy\nspec:\n  pools: [{{name: a, endpoints: [\"127.0.0.1:9\"]}}]\n  routes: [{{name: r, chain: [a]}}]\n  tenants: [{tenants}]\n"
        );
        hub.apply_policy(&document, false, 0, "test")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(hub.check_tenant("team-03"), Ok(()));
        let err = hub.check_tenant("team-z").unwrap_err();
        assert!(
            matches!(&err, UnknownTenant::NotNamed { name, tenants } if name == "team-z" && *tenants == names),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with("no tenant \"team-z\" in the current policy; its tenants: team-00, ")
                && text.ends_with("team-09, ... (12 in all: routerctl tenants list)"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

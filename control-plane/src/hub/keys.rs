//! Tenants' keys, kept in the store beside the policy rather than in it.
//!
//! A key in a policy document made the document a place where keys are
//! managed: adding one rewrote the operator's file (comments and layout
//! gone), and applying the file from git again revoked it. Here a key is
//! a [`KeyRecord`] of the control plane's [`State`]: creating or revoking
//! one is a change like a circuit override, with its own revision, and
//! every proxy gets the live keys' hashes in its next snapshot. A policy's
//! tenants declare limits, routes and risk; keys a policy lists still work
//! (standalone proxies have no control plane).
//!
//! The control plane never sees a key: `routerctl` mints it and sends its
//! SHA-256 and its first characters (to recognise it in `keys list`).
//! Expiry is checked by each proxy as it admits a request (a key stops
//! working at its instant, not when the control plane next prunes); the
//! record is dropped a day later ([`KEY_KEPT_AFTER_EXPIRY_MS`]), so `keys
//! list` can still say it expired.
//!
//! "Last used" comes from the proxies: each reports the keys it admitted
//! requests with at most once per heartbeat, and the replica it talks to
//! keeps the latest instant per key in memory (not stored: a write per use
//! would make a revision per use).

use router_policy::FieldError;
use router_proto::v1 as pb;

use super::{now_ms, Hub, HubError, KeyRecord};

/// How many keys one tenant may have in the store.
pub const MAX_KEYS_PER_TENANT: usize = 100;

/// The longest name a key may be given.
pub const MAX_KEY_NAME: usize = 64;

/// How long an expired key's record is kept (so `keys list` shows it
/// expired) before it is pruned.
pub const KEY_KEPT_AFTER_EXPIRY_MS: i64 = 24 * 3600 * 1000;

/// The longest a prefix shown for recognition may be.
const MAX_PREFIX: usize = 12;

fn invalid(field: &str, reason: impl Into<String>) -> HubError {
    HubError::Invalid(vec![FieldError {
        field: field.into(),
        reason: reason.into(),
    }])
}

/// A stored key as the API shows it (`last_used`: 0 when unknown).
pub(super) fn key_view(k: &KeyRecord, last_used_unix_ms: i64) -> pb::TenantKey {
    pb::TenantKey {
        id: k.id.clone(),
        tenant: k.tenant.clone(),
        name: k.name.clone(),
        hash: k.hash.clone(),
        prefix: k.prefix.clone(),
        created_at_unix_ms: k.created_at_unix_ms,
        expires_at_unix_ms: k.expires_at_unix_ms,
        last_used_unix_ms,
        created_by: k.created_by.clone(),
    }
}

/// The id of the key with `hash` (checked well formed): `key-` and the
/// first 12 hex digits of the hash.
fn key_id(hash: &str) -> String {
    let hex = hash
        .strip_prefix(router_policy::tenant::HASH_PREFIX)
        .unwrap_or(hash);
    format!("key-{}", &hex[..12.min(hex.len())])
}

impl Hub {
    /// Stores a key for `tenant` (a tenant of the current policy) and
    /// returns it. `hash` is `sha256:<64 hex>`; `expires_at_unix_ms` 0 is
    /// never.
    pub async fn create_key(
        &self,
        req: &pb::CreateKeyRequest,
        created_by: &str,
    ) -> Result<pb::TenantKey, HubError> {
        let parsed = router_policy::tenant::parse_key_hash(&req.hash)
            .ok_or_else(|| invalid("hash", "must be sha256:<64 hex digits>, the hash of a key"))?;
        let hash = router_policy::tenant::hash_text(&parsed);
        if req.name.len() > MAX_KEY_NAME || req.name.chars().any(char::is_control) {
            return Err(invalid(
                "name",
                format!("at most {MAX_KEY_NAME} bytes, without control characters"),
            ));
        }
        if req.prefix.len() > MAX_PREFIX || req.prefix.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(invalid(
                "prefix",
                format!("at most {MAX_PREFIX} printable ASCII characters"),
            ));
        }
        let now = now_ms();
        if req.expires_at_unix_ms != 0 && req.expires_at_unix_ms <= now {
            return Err(invalid(
                "expires_at_unix_ms",
                "must be in the future (0: never)",
            ));
        }
        self.check_tenant(&req.tenant)
            .map_err(|reason| invalid("tenant", reason.to_string()))?;
        let id = key_id(&hash);
        let record = KeyRecord {
            id: id.clone(),
            tenant: req.tenant.clone(),
            name: req.name.clone(),
            hash: hash.clone(),
            prefix: req.prefix.clone(),
            created_at_unix_ms: now,
            expires_at_unix_ms: req.expires_at_unix_ms,
            created_by: created_by.to_string(),
        };
        let policy_keys = self.policy_key_hashes();
        self.change(|inner| {
            if inner
                .state
                .keys
                .iter()
                .any(|k| k.hash == hash || k.id == id)
                || policy_keys.contains(&parsed)
            {
                return Err(invalid("hash", "this key is already stored"));
            }
            let held = inner
                .state
                .keys
                .iter()
                .filter(|k| k.tenant == req.tenant)
                .count();
            if held >= MAX_KEYS_PER_TENANT {
                return Err(invalid(
                    "tenant",
                    format!(
                        "tenant {:?} already has {MAX_KEYS_PER_TENANT} keys: revoke one first",
                        req.tenant
                    ),
                ));
            }
            let mut next = inner.state.clone();
            next.keys.push(record.clone());
            Ok(Some((next, None)))
        })
        .await?;
        tracing::info!(key = %id, tenant = %req.tenant, by = created_by, "tenant key created");
        Ok(key_view(&record, 0))
    }

    /// Removes a key: every proxy stops admitting it with its next
    /// snapshot. Returns what was removed.
    pub async fn revoke_key(&self, id: &str) -> Result<pb::TenantKey, HubError> {
        let mut removed = None;
        self.change(|inner| {
            let Some(k) = inner.state.keys.iter().find(|k| k.id == id) else {
                return Err(HubError::NotFound(format!(
                    "no key {id:?} in the store (`routerctl tenants keys list` shows them; keys written in the policy are removed by editing it)"
                )));
            };
            removed = Some(k.clone());
            let mut next = inner.state.clone();
            next.keys.retain(|k| k.id != id);
            Ok(Some((next, None)))
        })
        .await?;
        let removed =
            removed.ok_or_else(|| HubError::NotFound(format!("no key {id:?} in the store")))?;
        self.lock().keys_used.remove(id);
        tracing::info!(key = %id, tenant = %removed.tenant, "tenant key revoked");
        Ok(key_view(&removed, 0))
    }

    /// The stored keys (of one tenant, or all), oldest first, with when
    /// proxies last reported using each.
    pub fn list_keys(&self, tenant: &str) -> Vec<pb::TenantKey> {
        let inner = self.lock();
        inner
            .state
            .keys
            .iter()
            .filter(|k| tenant.is_empty() || k.tenant == tenant)
            .map(|k| key_view(k, inner.keys_used.get(&k.id).copied().unwrap_or(0)))
            .collect()
    }

    /// A proxy's report of the keys it admitted requests with. Ids not in
    /// the store are ignored (so the map stays bounded by the keys stored);
    /// an instant in the future is taken as now.
    pub fn keys_used(&self, report: &pb::KeysUsed) {
        let now = now_ms();
        let mut inner = self.lock();
        let stored: std::collections::HashSet<String> =
            inner.state.keys.iter().map(|k| k.id.clone()).collect();
        for u in &report.keys {
            if !stored.contains(&u.id) {
                continue;
            }
            let at = u.last_used_unix_ms.min(now);
            let slot = inner.keys_used.entry(u.id.clone()).or_insert(at);
            *slot = (*slot).max(at);
        }
        inner.keys_used.retain(|id, _| stored.contains(id));
    }

    /// The key hashes the current policy lists (a stored key may not
    /// repeat one: it would name two tenants, or one twice).
    fn policy_key_hashes(&self) -> Vec<router_policy::tenant::KeyHash> {
        let inner = self.lock();
        let version = inner.state.policy_version;
        super::policy_of(&inner, version, &self.guards)
            .and_then(|p| p.tenants.as_ref().map(|t| t.hashes()))
            .unwrap_or_default()
    }
}

//! A tenant's request, carried out (the rules are `router_policy::tenant`'s):
//! who is calling, whether they may ask this, and what the request draws
//! on their limits until it ends.
//!
//! Admission runs before routing, in two parts. [`identify`]: the key
//! (`Authorization: Bearer`, or Anthropic's `x-api-key`) names the tenant
//! (401 when it names none), the route and risk class must be the
//! tenant's (403), and the request rate takes its part. Then, unless the
//! response cache answers (a hit draws on nothing else), [`hold`]: the
//! token rate (the call's worst case), a concurrency slot, the spend
//! budget (the worst-case cost, reserved). What was taken is kept in
//! [`TenantHolds`] on the request's record; [`settle`] gives it back or
//! settles it to the call's usage when the request ends, whichever way it
//! ends. A limit whose store is down fails open or closed as the tenant
//! says.
//!
//! A parked task's run carries no key (none is stored): it is admitted by
//! the name of the tenant that parked it ([`Caller::Task`]), under that
//! tenant's routes, risk, limits and budget as the live policy has them. A
//! tenant gone from the policy is refused (`403`, the task fails); a limit
//! answers `429 rate_limited` and the task waits.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use router_policy::tenant::{Charge, Tenant, Tenants};
use router_policy::{Risk, Route};

use crate::config::Snapshot;
use crate::error::{ProxyError, StoreNeed};
use crate::rate_limit::{ConcurrencyHold, RateVerdict, TokenHold, MAX_SLOT_HOLD};
use crate::route_log::RouteRecord;
use crate::spend::{SpendHold, SpendRefusal};
use crate::Shared;
use router_shared_state::StoreEvents as _;

/// What a tenant's request holds on its limits until it ends.
#[derive(Debug, Clone, Default)]
pub(crate) struct TenantHolds {
    /// Its draw on the token limit.
    token: Option<TokenHold>,
    /// Its concurrency slot.
    slot: Option<ConcurrencyHold>,
    /// Its spend reservation.
    spend: Option<SpendHold>,
}

/// What the request may use, estimated before it is sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct CallEstimate {
    /// Prompt tokens (body bytes / 4).
    pub(super) input_tokens: u64,
    /// The request's `max_tokens` (or its synonyms), if it gave one.
    pub(super) max_tokens: Option<u64>,
}

/// Who a request says it is.
#[derive(Debug, Clone, Copy)]
pub(super) enum Caller<'a> {
    /// A client: its `Authorization` and `x-api-key` headers, if any.
    Key(Option<&'a [u8]>, Option<&'a [u8]>),
    /// A parked task's run: the name of the tenant that parked it (`None`:
    /// a task parked without tenancy, admitted as a request without a key).
    Task(Option<&'a str>),
}

/// Admission's first part (see the module docs): who is calling, whether
/// the route and risk class are theirs, and the request rate. The tenant
/// goes into `rec`. A request answered from the response cache is
/// admitted by this part alone: it draws nothing else ([`hold`]).
pub(super) async fn identify<'t>(
    shared: &Shared,
    tenants: &'t Tenants,
    caller: Caller<'_>,
    route: &Route,
    risk: Risk,
    rec: &mut RouteRecord,
) -> Result<&'t Tenant, ProxyError> {
    let now = router_policy::wall_clock::unix_ms_i64();
    let tenant = match caller {
        Caller::Key(authorization, api_key) => tenants
            .identify_credentials(authorization, api_key, now)
            .map(|who| {
                if let Some(id) = who.key_id {
                    shared.key_use.note(id, now);
                }
                who.tenant
            }),
        Caller::Task(Some(name)) => tenants.by_name(name),
        Caller::Task(None) => tenants.identify(None, now).map(|who| who.tenant),
    }
    .map_err(ProxyError::Tenant)?;
    rec.tenant = Some(Arc::from(tenant.name.as_str()));
    tenant
        .admits(&route.name, risk)
        .map_err(ProxyError::Tenant)?;
    if route.cache.as_ref().is_none_or(|c| c.rate_limit_hits) {
        request_rate(shared, tenant).await?;
    }
    Ok(tenant)
}

/// The tenant's request rate limit: in [`identify`], or after the cache
/// on a route whose hits do not count (`cache.rate_limit_hits: false`).
pub(super) async fn request_rate(shared: &Shared, tenant: &Tenant) -> Result<(), ProxyError> {
    if let Some(limit) = tenant.rate {
        let verdict = shared
            .rate_limits
            .check(&format!("rate:{}", tenant.name), limit)
            .await;
        limit_verdict(shared, tenant, verdict, "rate limit", StoreNeed::RateLimit)?;
    }
    Ok(())
}

/// Admission's second part: what the call draws on `tenant`'s limits
/// until it ends (the token rate, a concurrency slot, the spend budget),
/// kept in `rec`'s holds; the error is the answer when one is refused.
pub(super) async fn hold(
    shared: &Shared,
    snapshot: &Snapshot,
    tenant: &Tenant,
    route: &Route,
    estimate: CallEstimate,
    deadline: Option<Duration>,
    rec: &mut RouteRecord,
) -> Result<(), ProxyError> {
    let mut holds = TenantHolds::default();
    if let Some(limit) = tenant.token_rate {
        // The call's worst case now, its actual tokens when it ends.
        let tokens = estimate.input_tokens.saturating_add(
            estimate
                .max_tokens
                .unwrap_or(router_policy::tenant::DEFAULT_OUTPUT_CAP),
        );
        let key = format!("tokens:{}", tenant.name);
        let verdict = shared.rate_limits.check(&key, limit.times(tokens)).await;
        if limit_verdict(
            shared,
            tenant,
            verdict,
            "token limit",
            StoreNeed::TokenLimit,
        )? {
            holds.token = Some(TokenHold {
                key,
                tokens,
                per_token_micros: i64::try_from(limit.interval.as_micros()).unwrap_or(i64::MAX),
            });
        }
    }
    if let Some(cap) = tenant.max_concurrent {
        // A slot until the request ends; in the store, one that expires
        // with its deadline if this proxy never gives it back.
        let member = uuid::Uuid::now_v7().to_string();
        let hold_for = deadline.unwrap_or(MAX_SLOT_HOLD);
        let (verdict, slot) = shared
            .rate_limits
            .take_slot(&tenant.name, cap, &member, hold_for)
            .await;
        limit_verdict(
            shared,
            tenant,
            verdict,
            "concurrent requests cap",
            StoreNeed::ConcurrencyLimit,
        )?;
        holds.slot = slot;
    }
    if tenant.budgets.any() {
        holds.spend = reserve_spend(shared, snapshot, tenant, route, estimate, rec).await?;
    }
    rec.tenant_holds = Some(Box::new(holds));
    Ok(())
}

/// Reserves the call's worst-case cost against the tenant's budgets.
async fn reserve_spend(
    shared: &Shared,
    snapshot: &Snapshot,
    tenant: &Tenant,
    route: &Route,
    estimate: CallEstimate,
    rec: &RouteRecord,
) -> Result<Option<SpendHold>, ProxyError> {
    let prices = route
        .pools()
        .filter_map(|name| snapshot.policy.pool(name))
        .map(|p| p.price);
    let amount = router_policy::tenant::worst_case_micros(
        prices,
        estimate.input_tokens,
        estimate.max_tokens,
    );
    let now = super::ingress::unix_seconds(rec.offered_at.0);
    match shared
        .spend
        .reserve(&tenant.name, tenant.budgets, amount, now)
        .await
    {
        Ok(hold) => Ok(Some(hold)),
        Err(SpendRefusal::Exceeded {
            left_micros,
            period,
            resets_at,
        }) => {
            let resets = humantime::format_rfc3339_seconds(
                SystemTime::UNIX_EPOCH + Duration::from_secs(resets_at),
            );
            Err(ProxyError::TenantBudgetExceeded {
                detail: format!(
                    "tenant {:?}: this call may cost up to ${:.6}; ${:.6} is left of its {period} budget, which resets at {resets}",
                    tenant.name,
                    amount as f64 / 1e6,
                    left_micros as f64 / 1e6
                ),
            })
        }
        Err(SpendRefusal::StoreDown) => {
            shared.metrics.store_error("spend");
            if tenant.budget_fail_open {
                Ok(None)
            } else {
                Err(ProxyError::SharedStoreUnavailable(StoreNeed::Budget))
            }
        }
    }
}

/// What a tenant's limit said: `Ok(true)` within it, `Ok(false)` not
/// asked (the store is down and the limit fails open), or the answer: 429
/// `rate_limited` with the wait, 503 when the store is down and the limit
/// fails closed.
fn limit_verdict(
    shared: &Shared,
    tenant: &Tenant,
    verdict: RateVerdict,
    limit: &'static str,
    need: StoreNeed,
) -> Result<bool, ProxyError> {
    match verdict {
        RateVerdict::Pass => Ok(true),
        RateVerdict::Wait(retry_after) => Err(ProxyError::RateLimited {
            tenant: tenant.name.clone(),
            limit,
            retry_after,
        }),
        RateVerdict::StoreDown => {
            shared.metrics.store_error("rate_limit");
            if tenant.rate_fail_open {
                Ok(false)
            } else {
                Err(ProxyError::SharedStoreUnavailable(need))
            }
        }
    }
}

/// Gives back or settles what a request held (see the module docs), off
/// the answer's path: `charge` is what its attempts generated
/// (`router_policy::tenant::Charge`: nothing, reported usage, or
/// unreadable, which keeps the reservation).
pub(super) fn settle(shared: &Shared, holds: TenantHolds, charge: Charge) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let (limits, spend) = (Arc::clone(&shared.rate_limits), Arc::clone(&shared.spend));
    rt.spawn(async move {
        if let Some(hold) = holds.token {
            let used = charge.tokens(hold.tokens);
            let delta = i64::try_from(used)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(hold.tokens).unwrap_or(i64::MAX))
                .saturating_mul(hold.per_token_micros);
            if delta != 0 {
                limits.adjust(&hold.key, delta).await;
            }
        }
        if let Some(slot) = holds.slot {
            limits.release_slot(&slot).await;
        }
        if let Some(hold) = holds.spend {
            let spent = charge.spend(hold.micros);
            spend.settle(&hold, Some(spent)).await;
        }
    });
}

//! Tenants: who is calling, and what they may ask for.
//!
//! A policy with `spec.tenants` routes only requests that name a tenant:
//! `Authorization: Bearer <key>` with a key of the tenant, or, when one
//! tenant is marked `anonymous`, no key at all. Keys live in the control
//! plane's store beside the policy (`routerctl tenants keys create` mints
//! one, prints it once and stores its hash; proxies receive the hashes
//! with their snapshot, [`Tenants::add_stored_keys`]), each with an
//! optional expiry; a policy may also list keys itself (for standalone
//! proxies). Either way only SHA-256 hashes (`sha256:<64 hex digits>`) are
//! kept, so a policy document, the control plane's store and every proxy's
//! cache can be read without revealing a key.
//!
//! [`Tenants::identify`] hashes the presented key and looks the hash up:
//! the lookup compares hashes, never keys, so its timing says nothing about
//! a key. [`Tenant::admits`] then checks the tenant's allowed routes and the
//! highest risk class it may claim (`X-Router-Risk`).
//!
//! [`Gcra`] is the rate limit (`limits.requests_per_minute`): the generic
//! cell rate algorithm keeps one number per tenant, the *theoretical
//! arrival time* of its next request, so a limit held fleet-wide is one
//! atomic read-modify-write of one key in the shared store (a server-side
//! script there, with the store's own clock), and a proxy alone keeps it in
//! memory. A tenant gets one request per `60 s / limit`, with bursts of up
//! to `requests_burst` at once (default [`default_request_burst`]: five, or
//! a twentieth of the limit when that is more, never more than the limit:
//! a newcomer's script at 10 a minute may send a few calls back to back),
//! so that no window of one minute ever passes more than the limit plus
//! that burst (for limits of 100 and more, within 5% by default). A token
//! limit's burst is `tokens_burst` (default a twentieth of it, at least
//! one). A refused request is told exactly when the next one would pass
//! (`Retry-After`).
//!
//! Spend budgets ([`Budgets`], USD per day and per month, UTC) are exact:
//! before a call is sent, its worst-case cost ([`worst_case_micros`]: the
//! prompt's estimated tokens at the highest input price of the route's
//! chain, plus `max_tokens` (else [`DEFAULT_OUTPUT_CAP`]) at the highest
//! output price) is *reserved*, atomically against the budget's counter;
//! a call that does not fit is refused. After the answer the reservation is
//! replaced by the actual cost from usage; a call that got no answer gives
//! it back; an answer without usage keeps it (a count is never guessed).
//! As every reservation is at least the call's actual cost, concurrent
//! calls (through any number of proxies sharing the counter) can never take
//! the recorded spend past the budget. Amounts are integers, in micro-USD,
//! so counters add exactly.

//!
//! Pure: the proxy passes the header it received.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::document::Risk;

/// The prefix of a key hash in a policy.
pub const HASH_PREFIX: &str = "sha256:";

/// A key's SHA-256.
pub type KeyHash = [u8; 32];

/// The SHA-256 of `key` (its bytes as given).
pub fn key_hash(key: &str) -> KeyHash {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// `sha256:<hex>` of `key`, as a policy lists it.
pub fn key_hash_text(key: &str) -> String {
    hash_text(&key_hash(key))
}

/// `sha256:<hex>`: a hash as a policy and the control plane write it.
pub fn hash_text(hash: &KeyHash) -> String {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HASH_PREFIX}{hex}")
}

/// Parses `sha256:<64 hex digits>`.
pub fn parse_key_hash(text: &str) -> Option<KeyHash> {
    let hex = text.strip_prefix(HASH_PREFIX)?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// One tenant, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Its name (route log, spans, metrics).
    pub name: String,
    /// Routes it may use; empty: every route.
    pub routes: Vec<String>,
    /// The highest risk class it may claim.
    pub max_risk: Risk,
    /// Its request rate limit, if any.
    pub rate: Option<Gcra>,
    /// Its token rate limit (input plus output tokens a minute), if any:
    /// a [`Gcra`] whose unit is one token.
    pub token_rate: Option<Gcra>,
    /// While the shared store cannot be reached, requests pass the rate
    /// limit (`true`, the default) or are refused.
    pub rate_fail_open: bool,
    /// Requests in flight at once, at most.
    pub max_concurrent: Option<u32>,
    /// Its spend budgets.
    pub budgets: Budgets,
    /// While the shared store cannot be reached, budgeted requests pass
    /// (`true`) or are refused (`false`, the default).
    pub budget_fail_open: bool,
}

/// A tenant's spend budgets, micro-USD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budgets {
    /// Per UTC day.
    pub per_day: Option<u64>,
    /// Per UTC month.
    pub per_month: Option<u64>,
}

impl Budgets {
    /// Whether there is a budget at all.
    pub fn any(&self) -> bool {
        self.per_day.is_some() || self.per_month.is_some()
    }
}

/// Output tokens assumed for a call without `max_tokens`.
pub const DEFAULT_OUTPUT_CAP: u64 = 1024;

/// USD as whole micro-USD (rounded up: a reservation never falls short).
pub fn micros(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1e6).ceil() as u64
    } else {
        0
    }
}

/// The worst-case cost of a call, micro-USD: `input_tokens` at the
/// highest price a prompt token has among `prices` (input, cache read or
/// cache write: a cache write usually costs more than a plain input
/// token), plus `max_tokens` (else [`DEFAULT_OUTPUT_CAP`]) at the highest
/// output price.
pub fn worst_case_micros(
    prices: impl Iterator<Item = crate::document::Price>,
    input_tokens: u64,
    max_tokens: Option<u64>,
) -> u64 {
    let (mut input, mut output) = (0.0f64, 0.0f64);
    for p in prices {
        input = input.max(p.max_prompt_per_1k_usd());
        output = output.max(p.output_per_1k_usd);
    }
    let worst = crate::document::Price {
        input_per_1k_usd: input,
        output_per_1k_usd: output,
        ..Default::default()
    };
    micros(worst.cost(input_tokens, max_tokens.unwrap_or(DEFAULT_OUTPUT_CAP)))
}

/// The output tokens a request may generate, as far as the router can
/// tell: the largest of the caps it gives (`max_tokens`,
/// `max_completion_tokens`, `max_output_tokens`). Engines differ in which
/// one they honour (vLLM and SGLang take `max_completion_tokens` over
/// `max_tokens`), so a reservation that took the smaller would let a
/// client spend far past it.
pub fn output_cap(caps: [Option<u64>; 3]) -> Option<u64> {
    caps.into_iter().flatten().max()
}

/// The most tokens one field of one answer's usage may report before the
/// router calls it absurd: no model's context is near a billion tokens.
/// An answer past it is settled as if its usage could not be read (its
/// reservation kept), never as less spend.
pub const MAX_USAGE_TOKENS: u64 = 1_000_000_000;

/// Whether a usage's counts are believable (each within
/// [`MAX_USAGE_TOKENS`]).
pub fn plausible_usage(input: Option<u64>, output: Option<u64>) -> bool {
    input.unwrap_or(0) <= MAX_USAGE_TOKENS && output.unwrap_or(0) <= MAX_USAGE_TOKENS
}

/// What a request's attempts generated, for its tenant's settlement.
///
/// Every attempt a backend answered with content (a 2xx body read whole,
/// whether the router then passed it on or not; a stream that relayed
/// content) adds to it: its usage's cost and tokens when the usage could
/// be read and is believable, else it is marked *unreadable*. A request
/// whose attempts generated nothing settles to zero (a shed, a failure, a
/// replay); one with an unreadable attempt keeps at least its reservation;
/// otherwise it settles to the sum of what its attempts reported. So an
/// answer the client got is never free, and every pool that generated for
/// a request is paid for, whichever answer won.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    micros: u64,
    tokens: u64,
    generated: bool,
    unreadable: bool,
}

impl Charge {
    /// An attempt that generated and reported its usage.
    pub fn reported(micros: u64, tokens: u64) -> Self {
        Self {
            micros,
            tokens,
            generated: true,
            unreadable: false,
        }
    }

    /// An attempt that generated but whose usage could not be read.
    pub fn unreadable() -> Self {
        Self {
            generated: true,
            unreadable: true,
            ..Self::default()
        }
    }

    /// Both attempts' charges (saturating: never wraps to less).
    pub fn plus(self, other: Self) -> Self {
        Self {
            micros: self.micros.saturating_add(other.micros),
            tokens: self.tokens.saturating_add(other.tokens),
            generated: self.generated || other.generated,
            unreadable: self.unreadable || other.unreadable,
        }
    }

    /// Whether any attempt generated.
    pub fn generated(&self) -> bool {
        self.generated
    }

    /// The spend to settle a reservation of `reserved` micro-USD to.
    pub fn spend(&self, reserved: u64) -> u64 {
        if self.unreadable {
            self.micros.max(reserved)
        } else {
            self.micros
        }
    }

    /// The tokens to settle a token-limit draw of `reserved` to.
    pub fn tokens(&self, reserved: u64) -> u64 {
        if self.unreadable {
            self.tokens.max(reserved)
        } else {
            self.tokens
        }
    }
}

/// The budget periods of an instant: `(day, day ends, month, month ends)`,
/// as `YYYY-MM-DD`, `YYYY-MM` and Unix seconds (UTC).
pub fn periods(unix_secs: u64) -> (String, u64, String, u64) {
    let days = unix_secs / 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    let day_end = (days + 1) * 86_400;
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    let month_end = days_from_civil(ny, nm, 1) as u64 * 86_400;
    (
        format!("{y:04}-{m:02}-{d:02}"),
        day_end,
        format!("{y:04}-{m:02}"),
        month_end,
    )
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 to (y, m, d).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Howard Hinnant's `days_from_civil`.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The generic cell rate algorithm: `limit` requests per minute, in
/// bursts of up to `limit / 20` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Time one request uses up: `period / limit`.
    pub interval: std::time::Duration,
    /// How far ahead of now the theoretical arrival time may run: the
    /// burst, `interval × (burst - 1)`.
    pub tolerance: std::time::Duration,
}

/// The burst of a token limit: a twentieth of it, at least one.
pub fn burst_of(limit: u32) -> u32 {
    (limit / 20).max(1)
}

/// The default burst of a request limit: five, or a twentieth of the
/// limit when that is more, never more than the limit.
pub fn default_request_burst(limit: u32) -> u32 {
    (limit / 20).max(limit.min(5)).max(1)
}

impl Gcra {
    /// `limit` units per minute (`limit` at least 1), in bursts of
    /// [`burst_of`] (a token limit's default).
    pub fn per_minute(limit: u32) -> Self {
        Self::per_minute_with_burst(limit, burst_of(limit))
    }

    /// `limit` units per minute in bursts of up to `burst` (both at least
    /// 1).
    pub fn per_minute_with_burst(limit: u32, burst: u32) -> Self {
        let limit = limit.max(1);
        let interval = std::time::Duration::from_secs(60) / limit;
        Self {
            interval,
            tolerance: interval * (burst.max(1) - 1),
        }
    }

    /// This limit, for a request that uses `units` of it at once (a token
    /// limit: its tokens). The request passes while the limit is not
    /// overdrawn beyond its burst, and then draws all its units: a long
    /// request may overdraw it once, and the next waits until that is
    /// paid back. So no minute passes more than the limit, its burst and
    /// one request.
    pub fn times(&self, units: u64) -> Self {
        let units = u32::try_from(units.max(1)).unwrap_or(u32::MAX);
        Self {
            interval: self.interval.saturating_mul(units),
            tolerance: self.tolerance,
        }
    }

    /// Decides a request at `now` given the key's theoretical arrival
    /// time `tat` (`None`: never seen), both as time since any fixed
    /// point. `Ok(new tat)` to store when it passes; `Err(wait)` until it
    /// would.
    pub fn check(
        &self,
        tat: Option<std::time::Duration>,
        now: std::time::Duration,
    ) -> Result<std::time::Duration, std::time::Duration> {
        let tat = tat.map_or(now, |t| t.max(now));
        let allowed_from = tat.saturating_sub(self.tolerance);
        if now < allowed_from {
            return Err(allowed_from - now);
        }
        Ok(tat + self.interval)
    }
}

/// Why a request is refused a tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantRefusal {
    /// No `Authorization: Bearer` key, and no anonymous tenant.
    NoKey,
    /// A key the policy does not list.
    UnknownKey,
    /// A credential that is not `Bearer <key>`.
    MalformedKey,
    /// An `x-api-key` header that is not a key (empty, or not text).
    MalformedApiKey,
    /// `Authorization` and `x-api-key` name different tenants (or one of
    /// them none).
    KeysDisagree,
    /// The tenant may not use this route.
    Route {
        /// The tenant.
        tenant: String,
        /// The route.
        route: String,
    },
    /// The request claims a risk class above the tenant's.
    Risk {
        /// The tenant.
        tenant: String,
        /// What the request claimed.
        claimed: Risk,
        /// The tenant's highest.
        max: Risk,
    },
    /// The key was created with an expiry, and it has passed.
    ExpiredKey,
    /// A parked task's tenant is no longer in the policy (its run is
    /// admitted by the tenant's name, [`Tenants::by_name`]).
    Gone {
        /// The tenant's name, as the task keeps it.
        tenant: String,
    },
}

impl TenantRefusal {
    /// A refusal of who is calling (401), as opposed to what they ask (403).
    pub fn is_authentication(&self) -> bool {
        matches!(
            self,
            Self::NoKey
                | Self::UnknownKey
                | Self::ExpiredKey
                | Self::MalformedKey
                | Self::MalformedApiKey
                | Self::KeysDisagree
        )
    }
}

impl fmt::Display for TenantRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoKey => f.write_str(
                "this router serves tenants: send Authorization: Bearer <your tenant key> (or x-api-key: <your tenant key>)",
            ),
            Self::MalformedApiKey => f.write_str(
                "the x-api-key header is not a tenant key: a credential that is present must be a valid key",
            ),
            Self::KeysDisagree => f.write_str(
                "Authorization and x-api-key do not name the same tenant: send one key",
            ),
            Self::UnknownKey => f.write_str("the tenant key is not known to this router"),
            Self::ExpiredKey => f.write_str(
                "the tenant key has expired: ask the operator for a new one (`routerctl tenants keys create`)",
            ),
            Self::MalformedKey => f.write_str(
                "the Authorization header is not Bearer <tenant key>: a credential that is present must be a valid key",
            ),
            Self::Gone { tenant } => write!(
                f,
                "tenant {tenant:?}, who parked this task, is no longer in the policy"
            ),
            Self::Route { tenant, route } => {
                write!(f, "tenant {tenant:?} may not use route {route:?}")
            }
            Self::Risk {
                tenant,
                claimed,
                max,
            } => write!(
                f,
                "tenant {tenant:?} may claim risk up to {}, not {}",
                max.as_str(),
                claimed.as_str()
            ),
        }
    }
}

/// The tenants of a policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tenants {
    list: Vec<Tenant>,
    by_key: HashMap<KeyHash, KeyEntry>,
    anonymous: Option<usize>,
}

/// What a key hash names: its tenant, and for a key from the control
/// plane's store its id and expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyEntry {
    tenant: usize,
    /// The store's id for it (`None`: a key the policy lists).
    id: Option<Arc<str>>,
    /// When it stops working (Unix ms; 0: never).
    expires_at_unix_ms: i64,
}

/// A key from the control plane's store, as a proxy receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    /// The store's id for it.
    pub id: String,
    /// The tenant it names.
    pub tenant: String,
    /// Its hash.
    pub hash: KeyHash,
    /// When it stops working (Unix ms; 0: never).
    pub expires_at_unix_ms: i64,
}

/// Who a request's credentials name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identified<'a> {
    /// The tenant.
    pub tenant: &'a Tenant,
    /// The id of the stored key it came with (`None`: a key of the
    /// policy, or no key).
    pub key_id: Option<&'a Arc<str>>,
}

impl Tenants {
    /// Tenants with their key hashes (`keys[i]` are `list[i]`'s) and the
    /// anonymous one, if any. Validation has checked them.
    pub fn new(list: Vec<Tenant>, keys: Vec<Vec<KeyHash>>, anonymous: Option<usize>) -> Self {
        let mut by_key = HashMap::new();
        for (i, hashes) in keys.into_iter().enumerate() {
            for h in hashes {
                by_key.insert(
                    h,
                    KeyEntry {
                        tenant: i,
                        id: None,
                        expires_at_unix_ms: 0,
                    },
                );
            }
        }
        Self {
            list,
            by_key,
            anonymous,
        }
    }

    /// Every tenant, in policy order.
    pub fn list(&self) -> &[Tenant] {
        &self.list
    }

    /// The hashes of the keys the policy lists and the stored keys added.
    pub fn hashes(&self) -> Vec<KeyHash> {
        self.by_key.keys().copied().collect()
    }

    /// Adds keys from the control plane's store. A key whose tenant the
    /// policy does not name, or whose hash is already taken (by the
    /// policy's keys or an earlier one), is not added: each comes back
    /// with why, for the proxy to log.
    pub fn add_stored_keys(&mut self, keys: Vec<StoredKey>) -> Vec<String> {
        let mut skipped = Vec::new();
        for k in keys {
            let Some(tenant) = self.list.iter().position(|t| t.name == k.tenant) else {
                skipped.push(format!(
                    "key {}: no tenant {:?} in the policy",
                    k.id, k.tenant
                ));
                continue;
            };
            if self.by_key.contains_key(&k.hash) {
                skipped.push(format!("key {}: the same key is already listed", k.id));
                continue;
            }
            self.by_key.insert(
                k.hash,
                KeyEntry {
                    tenant,
                    id: Some(Arc::from(k.id.as_str())),
                    expires_at_unix_ms: k.expires_at_unix_ms,
                },
            );
        }
        skipped
    }

    /// The tenant called `name`: a parked task's run is admitted again
    /// under the tenant that parked it, as the live policy has it.
    pub fn by_name(&self, name: &str) -> Result<&Tenant, TenantRefusal> {
        self.list
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| TenantRefusal::Gone {
                tenant: name.to_string(),
            })
    }

    /// The tenant a request's `Authorization` header names, at
    /// `now_unix_ms` (a stored key past its expiry is refused).
    ///
    /// Only a request with no credential at all is the anonymous tenant's
    /// (when the policy has one). A credential that is present but is not
    /// `Bearer <key>` (another scheme, an empty key, bytes that are not
    /// text) is refused like an unknown key: a client that meant to send a
    /// key is never served as somebody else.
    pub fn identify(
        &self,
        authorization: Option<&[u8]>,
        now_unix_ms: i64,
    ) -> Result<Identified<'_>, TenantRefusal> {
        let entry = self.entry_of(authorization, now_unix_ms)?;
        self.identified(entry)
    }

    /// The tenant a request's credentials name: `Authorization: Bearer
    /// <key>` or `x-api-key: <key>` (the header Anthropic's SDKs and Claude
    /// Code send), by the rules of [`Tenants::identify`]: each credential
    /// that is present must be a valid key (an empty or non-text
    /// `x-api-key` is refused like a malformed `Authorization`), and when
    /// both are present they must name the same tenant, or the request is
    /// refused (401): a key is never ignored because another one came
    /// along. Only a request with neither is the anonymous tenant's.
    pub fn identify_credentials(
        &self,
        authorization: Option<&[u8]>,
        api_key: Option<&[u8]>,
        now_unix_ms: i64,
    ) -> Result<Identified<'_>, TenantRefusal> {
        let Some(api_key) = api_key else {
            return self.identify(authorization, now_unix_ms);
        };
        let key = std::str::from_utf8(api_key)
            .ok()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or(TenantRefusal::MalformedApiKey)?;
        let by_api_key = self.lookup(key, now_unix_ms)?;
        if authorization.is_some() {
            let by_authorization = self
                .entry_of(authorization, now_unix_ms)
                .map_err(|_| TenantRefusal::KeysDisagree)?;
            if by_authorization.map(|e| e.tenant) != Some(by_api_key.tenant) {
                return Err(TenantRefusal::KeysDisagree);
            }
        }
        self.identified(Some(by_api_key))
    }

    /// The tenant an entry names (`None`: the anonymous tenant).
    fn identified<'a>(
        &'a self,
        entry: Option<&'a KeyEntry>,
    ) -> Result<Identified<'a>, TenantRefusal> {
        let index = match entry {
            Some(e) => e.tenant,
            None => self.anonymous.ok_or(TenantRefusal::NoKey)?,
        };
        let tenant = self.list.get(index).ok_or(TenantRefusal::UnknownKey)?;
        Ok(Identified {
            tenant,
            key_id: entry.and_then(|e| e.id.as_ref()),
        })
    }

    /// The key entry an `Authorization` header names (`None`: no header).
    fn entry_of(
        &self,
        authorization: Option<&[u8]>,
        now_unix_ms: i64,
    ) -> Result<Option<&KeyEntry>, TenantRefusal> {
        let Some(v) = authorization else {
            return Ok(None);
        };
        let key = std::str::from_utf8(v)
            .ok()
            .and_then(bearer)
            .ok_or(TenantRefusal::MalformedKey)?;
        self.lookup(key, now_unix_ms).map(Some)
    }

    /// The entry of `key`, refused when unknown or expired.
    fn lookup(&self, key: &str, now_unix_ms: i64) -> Result<&KeyEntry, TenantRefusal> {
        let entry = self
            .by_key
            .get(&key_hash(key))
            .ok_or(TenantRefusal::UnknownKey)?;
        if entry.expires_at_unix_ms != 0 && entry.expires_at_unix_ms <= now_unix_ms {
            return Err(TenantRefusal::ExpiredKey);
        }
        Ok(entry)
    }
}

impl Tenant {
    /// Whether the tenant may send a `risk` request on `route`.
    pub fn admits(&self, route: &str, risk: Risk) -> Result<(), TenantRefusal> {
        if !self.routes.is_empty() && !self.routes.iter().any(|r| r == route) {
            return Err(TenantRefusal::Route {
                tenant: self.name.clone(),
                route: route.to_string(),
            });
        }
        if risk > self.max_risk {
            return Err(TenantRefusal::Risk {
                tenant: self.name.clone(),
                claimed: risk,
                max: self.max_risk,
            });
        }
        Ok(())
    }
}

/// Which waiter of a pool's queue goes next when tenants share it: the
/// oldest waiter of the tenant served least recently. Round robin between
/// tenants, FIFO within each, so a tenant with many requests queued cannot
/// starve one with few: each tenant waits for at most one grant per other
/// tenant waiting. Requests without a tenant count as one tenant of their
/// own. `tenants`: each waiter's tenant, in queue order; `served`: when
/// each tenant was last served (a counter; absent: never, first).
pub fn fair_next(tenants: &[Option<u64>], served: &HashMap<Option<u64>, u64>) -> Option<usize> {
    let mut best: Option<(usize, u64)> = None;
    for (i, t) in tenants.iter().enumerate() {
        let stamp = served.get(t).copied().unwrap_or(0);
        if best.is_none_or(|(_, s)| stamp < s) {
            best = Some((i, stamp));
        }
    }
    best.map(|(i, _)| i)
}

/// The key of `Bearer <key>` (scheme in any case), if non-empty.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, key) = value.trim().split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tenants(anonymous: bool) -> Tenants {
        let a = Tenant {
            name: "team-a".into(),
            routes: vec!["chat".into()],
            max_risk: Risk::Draft,
            rate: None,
            token_rate: None,
            rate_fail_open: true,
            max_concurrent: None,
            budgets: Budgets::default(),
            budget_fail_open: false,
        };
        let b = Tenant {
            name: "guests".into(),
            routes: Vec::new(),
            max_risk: Risk::Read,
            rate: None,
            token_rate: None,
            rate_fail_open: true,
            max_concurrent: None,
            budgets: Budgets::default(),
            budget_fail_open: false,
        };
        Tenants::new(
            vec![a, b],
            vec![vec![key_hash("key-a")], Vec::new()],
            anonymous.then_some(1),
        )
    }

    #[test]
    fn a_listed_key_names_its_tenant_and_nothing_else_does() {
        let t = tenants(false);
        let id = |h: &str| {
            t.identify(Some(h.as_bytes()), 0)
                .map(|t| t.tenant.name.clone())
        };
        assert_eq!(id("Bearer key-a"), Ok("team-a".into()));
        assert_eq!(id("bearer   key-a "), Ok("team-a".into()));
        assert_eq!(id("Bearer key-b"), Err(TenantRefusal::UnknownKey));
        assert_eq!(id("Basic key-a"), Err(TenantRefusal::MalformedKey));
        assert_eq!(t.identify(None, 0), Err(TenantRefusal::NoKey));
        // With an anonymous tenant, no key is that tenant; a wrong key is
        // still refused.
        let t = tenants(true);
        assert_eq!(
            t.identify(None, 0).map(|t| t.tenant.name.as_str()),
            Ok("guests")
        );
        assert_eq!(
            t.identify(Some(b"Bearer nope"), 0),
            Err(TenantRefusal::UnknownKey)
        );
        // Any credential present that is not a valid key is refused, never
        // served as the anonymous tenant (issue 28, item 9).
        for shape in [
            &b"Basic a2V5LWE6"[..],
            b"Token key-a",
            b"Bearer \xff\xfe",
            b"Bearer ",
            b"Bearer",
            b"",
            b"key-a",
        ] {
            let refused = t.identify(Some(shape), 0);
            assert!(
                matches!(refused, Err(ref e) if e.is_authentication()),
                "{shape:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn stored_keys_name_their_tenant_until_they_expire() {
        let mut t = tenants(false);
        let skipped = t.add_stored_keys(vec![
            StoredKey {
                id: "key-1".into(),
                tenant: "guests".into(),
                hash: key_hash("stored"),
                expires_at_unix_ms: 0,
            },
            StoredKey {
                id: "key-2".into(),
                tenant: "team-a".into(),
                hash: key_hash("short-lived"),
                expires_at_unix_ms: 5_000,
            },
            // A tenant the policy does not name, and a hash already taken:
            // skipped, each with why.
            StoredKey {
                id: "key-3".into(),
                tenant: "team-z".into(),
                hash: key_hash("orphan"),
                expires_at_unix_ms: 0,
            },
            StoredKey {
                id: "key-4".into(),
                tenant: "guests".into(),
                hash: key_hash("key-a"),
                expires_at_unix_ms: 0,
            },
        ]);
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].contains("team-z") && skipped[1].contains("key-4"));
        let who = |key: &str, now: i64| {
            t.identify(Some(format!("Bearer {key}").as_bytes()), now)
                .map(|i| (i.tenant.name.clone(), i.key_id.map(|k| k.to_string())))
        };
        assert_eq!(
            who("stored", 1),
            Ok(("guests".into(), Some("key-1".into())))
        );
        // The policy's own key keeps its tenant and has no id.
        assert_eq!(who("key-a", 1), Ok(("team-a".into(), None)));
        assert_eq!(who("orphan", 1), Err(TenantRefusal::UnknownKey));
        // Working until its instant, refused (401) from it on.
        assert_eq!(
            who("short-lived", 4_999),
            Ok(("team-a".into(), Some("key-2".into())))
        );
        assert_eq!(who("short-lived", 5_000), Err(TenantRefusal::ExpiredKey));
        assert!(TenantRefusal::ExpiredKey.is_authentication());
        let by_api_key = t.identify_credentials(None, Some(b"short-lived"), 6_000);
        assert_eq!(by_api_key, Err(TenantRefusal::ExpiredKey));
    }

    #[test]
    fn a_key_may_come_as_x_api_key_and_two_keys_must_agree() {
        let t = tenants(true);
        let id = |auth: Option<&[u8]>, api: Option<&[u8]>| {
            t.identify_credentials(auth, api, 0)
                .map(|t| t.tenant.name.clone())
        };
        // Anthropic's header, the key alone (surrounding spaces trimmed).
        assert_eq!(id(None, Some(b"key-a")), Ok("team-a".into()));
        assert_eq!(id(None, Some(b" key-a ")), Ok("team-a".into()));
        // Without it, Authorization's rules as before; neither: anonymous.
        assert_eq!(id(Some(b"Bearer key-a"), None), Ok("team-a".into()));
        assert_eq!(id(None, None), Ok("guests".into()));
        // Both, naming the same tenant: that tenant.
        assert_eq!(
            id(Some(b"Bearer key-a"), Some(b"key-a")),
            Ok("team-a".into())
        );
        // A present x-api-key that is not a valid key is refused, never
        // served as the anonymous tenant.
        assert_eq!(id(None, Some(b"nope")), Err(TenantRefusal::UnknownKey));
        for bad in [&b""[..], b"   ", b"\xff\xfe"] {
            assert_eq!(id(None, Some(bad)), Err(TenantRefusal::MalformedApiKey));
        }
        // Two credentials that do not name the same tenant: refused, whichever is valid.
        for auth in [&b"Bearer other"[..], b"Basic a2V5LWE6", b""] {
            let refused = id(Some(auth), Some(b"key-a"));
            assert_eq!(refused, Err(TenantRefusal::KeysDisagree), "{auth:?}");
        }
        assert_eq!(
            id(Some(b"Bearer key-a"), Some(b"nope")),
            Err(TenantRefusal::UnknownKey)
        );
        for e in [TenantRefusal::MalformedApiKey, TenantRefusal::KeysDisagree] {
            assert!(e.is_authentication(), "{e}");
        }
    }

    #[test]
    fn the_output_cap_is_the_largest_given() {
        assert_eq!(output_cap([Some(1), Some(4000), None]), Some(4000));
        assert_eq!(output_cap([Some(50), None, Some(7)]), Some(50));
        assert_eq!(output_cap([None, None, None]), None);
    }

    #[test]
    fn a_charge_never_settles_an_answer_to_less_than_it_reported() {
        let reserved = 1_000;
        // Nothing generated: the reservation is given back.
        assert_eq!(Charge::default().spend(reserved), 0);
        assert!(!Charge::default().generated());
        // Reported usage: settled to it, above or below the reservation.
        assert_eq!(Charge::reported(300, 30).spend(reserved), 300);
        assert_eq!(Charge::reported(5_000, 30).spend(reserved), 5_000);
        // Unreadable usage keeps at least the reservation.
        assert_eq!(Charge::unreadable().spend(reserved), reserved);
        assert_eq!(Charge::unreadable().tokens(40), 40);
        let two = Charge::reported(2_500, 10).plus(Charge::unreadable());
        assert_eq!(two.spend(reserved), 2_500);
        // Every attempt that generated is paid for.
        let both = Charge::reported(300, 3).plus(Charge::reported(400, 4));
        assert_eq!((both.spend(reserved), both.tokens(0)), (700, 7));
        // Sums saturate instead of wrapping to a small number.
        let huge = Charge::reported(u64::MAX, u64::MAX).plus(Charge::reported(5, 5));
        assert_eq!(huge.spend(reserved), u64::MAX);
    }

    #[test]
    fn absurd_usage_is_not_believed() {
        assert!(plausible_usage(Some(120_000), Some(4_000)));
        assert!(plausible_usage(None, None));
        assert!(!plausible_usage(Some(10_000_000_000_000_000_000), Some(1)));
        assert!(!plausible_usage(Some(1), Some(MAX_USAGE_TOKENS + 1)));
    }

    #[test]
    fn a_parked_task_is_admitted_by_its_tenants_name_while_the_tenant_lasts() {
        let t = tenants(false);
        assert_eq!(t.by_name("team-a").map(|t| t.name.as_str()), Ok("team-a"));
        let gone = t.by_name("team-z").unwrap_err();
        assert_eq!(
            gone,
            TenantRefusal::Gone {
                tenant: "team-z".into()
            }
        );
        // Not a question of who is calling (401) but of what may run (403).
        assert!(!gone.is_authentication());
        assert!(gone.to_string().contains("no longer in the policy"));
    }

    #[test]
    fn routes_and_risk_are_checked() {
        let t = tenants(false);
        let a = t.identify(Some(b"Bearer key-a"), 0).unwrap().tenant;
        assert_eq!(a.admits("chat", Risk::Draft), Ok(()));
        assert!(matches!(
            a.admits("other", Risk::Read),
            Err(TenantRefusal::Route { .. })
        ));
        assert!(matches!(
            a.admits("chat", Risk::Send),
            Err(TenantRefusal::Risk { .. })
        ));
    }

    #[test]
    fn hashes_round_trip_and_bad_text_is_refused() {
        let text = key_hash_text("key-a");
        assert_eq!(parse_key_hash(&text), Some(key_hash("key-a")));
        for bad in ["key-a", "sha256:12", "sha256:zz", "md5:00"] {
            assert_eq!(parse_key_hash(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_small_burst_then_one_per_interval_with_the_exact_wait() {
        let s = std::time::Duration::from_secs;
        let g = Gcra::per_minute(120); // one per 0.5 s, bursts of 6
        let mut tat = None;
        for _ in 0..6 {
            tat = Some(g.check(tat, s(100)).expect("within the burst"));
        }
        let half = std::time::Duration::from_millis(500);
        assert_eq!(g.check(tat, s(100)), Err(half));
        let t = g.check(tat, s(100) + half).expect("one interval later");
        assert_eq!(g.check(Some(t), s(100) + half), Err(half));
        // A token limit under 20 a minute has no burst at all.
        let g = Gcra::per_minute(6);
        let t = g.check(None, s(0)).unwrap();
        assert_eq!(g.check(Some(t), s(0)), Err(s(10)));
        // A request limit of 10 a minute takes five at once by default
        // (a newcomer's script), then one per 6 s.
        let g = Gcra::per_minute_with_burst(10, default_request_burst(10));
        let mut tat = None;
        for _ in 0..5 {
            tat = Some(g.check(tat, s(0)).expect("within the burst"));
        }
        assert_eq!(g.check(tat, s(0)), Err(s(6)));
        assert_eq!(
            [1, 2, 10, 100, 200, 1000].map(default_request_burst),
            [1, 2, 5, 5, 10, 50]
        );
    }

    #[test]
    fn periods_are_utc_days_and_months() {
        // 2026-12-01T18:00:00Z
        let (day, day_end, month, month_end) = periods(1_796_148_000);
        assert_eq!((day.as_str(), month.as_str()), ("2026-12-01", "2026-12"));
        assert_eq!(day_end, 1_796_169_600); // 2026-12-02T00:00:00Z
        assert_eq!(month_end, 1_798_761_600); // 2027-01-01T00:00:00Z
        let (day, _, month, _) = periods(951_782_400); // 2000-02-29
        assert_eq!((day.as_str(), month.as_str()), ("2000-02-29", "2000-02"));
    }

    #[test]
    fn the_worst_case_takes_the_dearest_prices_and_the_output_cap() {
        let p = |i, o| crate::document::Price {
            input_per_1k_usd: i,
            output_per_1k_usd: o,
            cache_read_per_1k_usd: i,
            cache_write_per_1k_usd: i,
        };
        let prices = [p(1.0, 2.0), p(3.0, 1.0)];
        // 1000 input tokens at $3/1k, 500 output at $2/1k: $4.
        assert_eq!(
            worst_case_micros(prices.into_iter(), 1000, Some(500)),
            4_000_000
        );
        assert_eq!(
            worst_case_micros(prices.into_iter(), 0, None),
            micros(2.0 * DEFAULT_OUTPUT_CAP as f64 / 1000.0)
        );
        // A cache write dearer than the input is the prompt's worst case.
        let caching = crate::document::Price {
            cache_write_per_1k_usd: 3.75,
            ..p(3.0, 15.0)
        };
        assert_eq!(
            worst_case_micros([caching].into_iter(), 1000, Some(0)),
            3_750_000
        );
        assert_eq!(micros(f64::NAN), 0);
        assert_eq!(micros(0.000_000_1), 1, "rounded up");
    }

    #[test]
    fn a_light_tenant_is_served_next_whatever_a_heavy_one_queued() {
        let (heavy, light) = (Some(1), Some(2));
        let mut queue = vec![heavy; 10];
        queue.push(light);
        let mut served = HashMap::new();
        let mut order = Vec::new();
        let mut stamp = 0;
        while let Some(i) = fair_next(&queue, &served) {
            stamp += 1;
            let t = queue.remove(i);
            served.insert(t, stamp);
            order.push(t);
        }
        // heavy first (oldest, both never served), then light, then heavy.
        assert_eq!(order[0], heavy);
        assert_eq!(order[1], light);
        assert!(order[2..].iter().all(|t| *t == heavy));
        // Without tenants: plain FIFO.
        assert_eq!(fair_next(&[None, None], &HashMap::new()), Some(0));
    }

    proptest! {
        /// Each tenant's waiters leave in their own order, and a waiting
        /// tenant is never passed over more than once per other tenant.
        #[test]
        fn fair_next_is_fifo_per_tenant_and_round_robin_between(
            queue in proptest::collection::vec(0u64..4, 1..60),
        ) {
            let mut q: Vec<(Option<u64>, usize)> =
                queue.iter().enumerate().map(|(i, t)| (Some(*t), i)).collect();
            let mut served = HashMap::new();
            let mut last_pos: HashMap<Option<u64>, usize> = HashMap::new();
            let mut passed_over: HashMap<Option<u64>, usize> = HashMap::new();
            let mut stamp = 0;
            while !q.is_empty() {
                let tenants: Vec<Option<u64>> = q.iter().map(|(t, _)| *t).collect();
                let i = fair_next(&tenants, &served).expect("a waiter");
                stamp += 1;
                let (t, pos) = q.remove(i);
                if let Some(prev) = last_pos.insert(t, pos) {
                    prop_assert!(prev < pos, "FIFO within a tenant");
                }
                served.insert(t, stamp);
                passed_over.insert(t, 0);
                let waiting: std::collections::HashSet<Option<u64>> =
                    q.iter().map(|(t, _)| *t).collect();
                for w in &waiting {
                    let n = passed_over.entry(*w).or_insert(0);
                    *n += 1;
                    prop_assert!(*n <= 4, "tenant {w:?} passed over {n} times");
                }
            }
        }

        /// Days and months round-trip for any day of four centuries.
        #[test]
        fn civil_dates_round_trip(days in 0i64..146_097 * 4) {
            let (y, m, d) = civil_from_days(days);
            prop_assert_eq!(days_from_civil(y, m, d), days);
        }

        /// However requests arrive, no window of one minute passes more
        /// than the limit plus its burst, whatever the burst: with the
        /// default request burst, within 5% of the limit from 100 a
        /// minute (five requests more below).
        #[test]
        fn the_limit_holds_within_its_burst_over_any_minute(
            limit in 1u32..400,
            burst in proptest::option::of(1u32..50),
            gaps in proptest::collection::vec(0u64..2_000, 1..800),
        ) {
            let burst = burst.unwrap_or(default_request_burst(limit));
            let g = Gcra::per_minute_with_burst(limit, burst);
            let mut tat = None;
            let mut now = std::time::Duration::ZERO;
            let mut passed = Vec::new();
            for gap in gaps {
                now += std::time::Duration::from_millis(gap);
                if let Ok(t) = g.check(tat, now) {
                    tat = Some(t);
                    passed.push(now);
                }
            }
            let minute = std::time::Duration::from_secs(60);
            let bound = limit + burst;
            for (i, start) in passed.iter().enumerate() {
                let in_window = passed[i..].iter().take_while(|t| **t < *start + minute).count();
                prop_assert!(in_window as u32 <= bound, "{in_window} > {bound}");
            }
            let default = limit + default_request_burst(limit);
            prop_assert!(f64::from(default) <= f64::from(limit) * 1.05 + 5.0);
        }

        /// No key but the listed one names the tenant.
        #[test]
        fn only_the_listed_key_passes(key in "[ -~]{1,40}") {
            let t = tenants(false);
            let header = format!("Bearer {key}");
            let named = t.identify(Some(header.as_bytes()), 0).is_ok();
            prop_assert_eq!(named, key.trim() == "key-a");
        }
    }
}

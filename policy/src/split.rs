//! Weighted splits in a route's chain: which side of a split a request
//! takes, and the order in which the request then tries the route's pools.
//!
//! A chain step may be a split instead of a pool:
//!
//! ```yaml
//! chain: [{split: [{pool: new, weight: 10}, {pool: old, weight: 90}], sticky: tenant}, fallback]
//! ```
//!
//! **The choice** ([`pick`]). A request's sticky key ([`Sticky`]: its
//! request id by default, its tenant, or a header's value) is hashed to a
//! 64-bit point `h` with xxh3 (a fixed specification, as
//! [`crate::prefix_cache`] uses: every proxy of a fleet, before and after
//! a restart, computes the same point; `std`'s `RandomState` would not),
//! seeded by the route's name and the split's first pool, so that the
//! same tenants are not the canary of every split of every route. The
//! point is mapped onto `[0, total)` as `b = floor(h × total / 2^64)`
//! (a multiply-shift, no modulo bias), and the request takes the first
//! side, in the order written, whose cumulative weight is above `b`.
//!
//! Why this mapping: side 1 takes exactly the keys with
//! `h / 2^64 < w1 / total` (`floor(x) < w` for an integer `w` is `x < w`).
//! When its share grows (a ramp's `new` from 10 to 25 of 100) the keys it
//! had stay with it and the keys it gains come from the sides after it:
//! a ramp only ever moves requests from `old` to `new`, never back and
//! forth, so a session or tenant that saw the new side keeps seeing it as
//! the ramp advances. This holds for the split's first side; a ramp's new
//! side is therefore the first one written. A side of weight 0 owns an
//! empty interval and is never chosen.
//!
//! **The key** ([`SplitKeys`]): `sticky` absent: the request's
//! `Idempotency-Key` when it has one, else its request id (the proxy's
//! request id is already the client's `Idempotency-Key` or `X-Request-Id`,
//! else one it generates), so a retry of one request, with the same key or
//! id, lands on the same side. `sticky: tenant`: the tenant's name (with
//! tenancy off, there is none: the request id is used). `sticky:
//! header:NAME`: the header's value; a request without the header (or with
//! a value that is not text) falls back to the request id. With no key at
//! all (an `explain` situation that gives none), the heaviest side is
//! shown, ties to the first written.
//!
//! **The order** ([`ChainOrder`], `Route::order`): the chain's steps in
//! order, a split expanded as its chosen side first, then its other sides
//! of non-zero weight, heaviest first (ties in the order written), as the
//! split's own fallback, then the chain's next steps. A side of weight 0 is
//! not in the order at all: it takes no traffic, not even as a fallback
//! (a ramp rolled back to 0 means the new side is out). Positions are
//! indices into the route's pools as written ([`crate::Route::pool_at`]),
//! so a candidate's position names its pool whatever the order.
//!
//! Pure: no clock, no I/O, no randomness of its own.

use serde::Serialize;

/// Whose requests stay together on one side of a split.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Sticky {
    /// Each request on its own, by its `Idempotency-Key` or request id
    /// (the default).
    #[default]
    RequestId,
    /// Every request of a tenant on one side.
    Tenant,
    /// Every request with the same value of this header (lowercase) on
    /// one side.
    Header(String),
}

impl Sticky {
    /// Reads `sticky` as written: `tenant`, `request_id` or
    /// `header:NAME` (a valid header name). `None` when it is none of them.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "request_id" => Some(Self::RequestId),
            "tenant" => Some(Self::Tenant),
            _ => {
                let name = text.strip_prefix("header:")?.trim();
                http::HeaderName::from_bytes(name.as_bytes())
                    .ok()
                    .map(|n| Self::Header(n.as_str().to_owned()))
            }
        }
    }
}

/// One side of a split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitSide {
    /// The pool.
    pub pool: String,
    /// Its weight (a non-negative integer; the share is weight / sum).
    pub weight: u32,
}

/// A validated split: at least two sides, distinct pools, weights with a
/// positive sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// The sides, in the order written (a ramp's new side first).
    pub sides: Vec<SplitSide>,
    /// Whose requests stay together.
    pub sticky: Sticky,
    /// Its ramp, if any ([`crate::ramp`]): the first side is the new one.
    pub ramp: Option<crate::ramp::Ramp>,
}

impl Split {
    /// The sum of the weights.
    pub fn total(&self) -> u64 {
        self.sides.iter().map(|s| u64::from(s.weight)).sum()
    }
}

/// What a request offers as a split's key. Every field is optional: the
/// proxy gives the request id always, the rest when the request has them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SplitKeys<'a> {
    /// The request's id.
    pub request_id: Option<&'a str>,
    /// Its `Idempotency-Key`, when it has one (taken before the id).
    pub idempotency_key: Option<&'a str>,
    /// Its tenant's name (tenancy on).
    pub tenant: Option<&'a str>,
    /// Its headers, for `sticky: header:NAME`.
    pub headers: Headers<'a>,
}

/// The headers a split's `header:NAME` key is read from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Headers<'a> {
    /// None given.
    #[default]
    None,
    /// A request's headers (the proxy).
    Map(&'a http::HeaderMap),
    /// Names (lowercase) and values (an `explain` situation).
    Pairs(&'a std::collections::BTreeMap<String, String>),
}

impl<'a> Headers<'a> {
    /// The value of header `name` (lowercase), when present and text.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        match *self {
            Self::None => None,
            Self::Map(m) => m.get(name).and_then(|v| v.to_str().ok()),
            Self::Pairs(p) => p
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str()),
        }
    }
}

/// What a split's choice was keyed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// The request's `Idempotency-Key`.
    IdempotencyKey,
    /// The request's id.
    RequestId,
    /// The tenant's name.
    Tenant,
    /// The `sticky` header's value.
    Header,
    /// No key at all: the heaviest side.
    None,
}

impl KeyKind {
    /// A label for logs: `idempotency_key`, `request_id`, `tenant`,
    /// `header`, `none`.
    pub fn label(self) -> &'static str {
        match self {
            Self::IdempotencyKey => "idempotency_key",
            Self::RequestId => "request_id",
            Self::Tenant => "tenant",
            Self::Header => "header",
            Self::None => "none",
        }
    }
}

/// The key `split` takes from `keys`, and what it is: the sticky key when
/// the request has it, else its `Idempotency-Key`, else its request id.
pub fn key_of<'a>(sticky: &Sticky, keys: &SplitKeys<'a>) -> (Option<&'a str>, KeyKind) {
    let sticky_key = match sticky {
        Sticky::RequestId => None,
        Sticky::Tenant => keys.tenant.map(|t| (t, KeyKind::Tenant)),
        Sticky::Header(name) => keys
            .headers
            .get(name)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| (v, KeyKind::Header)),
    };
    let found = sticky_key
        .or_else(|| keys.idempotency_key.map(|k| (k, KeyKind::IdempotencyKey)))
        .or_else(|| keys.request_id.map(|k| (k, KeyKind::RequestId)));
    match found {
        Some((k, kind)) => (Some(k), kind),
        None => (None, KeyKind::None),
    }
}

/// The seed of a split's hash: its route and its first pool (stable when
/// the weights change, so a ramp keeps its mapping).
pub fn seed(route: &str, first_pool: &str) -> u64 {
    let mut salt = Vec::with_capacity(route.len() + 1 + first_pool.len());
    salt.extend_from_slice(route.as_bytes());
    salt.push(0);
    salt.extend_from_slice(first_pool.as_bytes());
    xxhash_rust::xxh3::xxh3_64(&salt)
}

/// The 64-bit point of `key` under `seed`.
pub fn point(seed: u64, key: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), seed)
}

/// The side (index into `weights`) that owns `point`: the first whose
/// cumulative weight is above `floor(point × total / 2^64)`. `None` when
/// the weights sum to 0.
pub fn pick(weights: &[u32], point: u64) -> Option<usize> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    // < total: point < 2^64.
    let bucket = ((u128::from(point) * u128::from(total)) >> 64) as u64;
    let mut cumulative = 0u64;
    for (i, &w) in weights.iter().enumerate() {
        cumulative += u64::from(w);
        if bucket < cumulative {
            return Some(i);
        }
    }
    None
}

/// The side of the heaviest weight (ties: the first written).
fn heaviest(split: &Split) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, s) in split.sides.iter().enumerate() {
        if s.weight > 0 && best.is_none_or(|b| s.weight > split.sides[b].weight) {
            best = Some(i);
        }
    }
    best
}

/// One split's choice for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitChoice {
    /// The chosen side's chain position (its pool: `Route::pool_at`).
    pub at: usize,
    /// The chosen side's index in the split.
    pub side: usize,
    /// Its weight.
    pub weight: u32,
    /// The split's total weight.
    pub total: u64,
    /// What the choice was keyed on.
    pub key: KeyKind,
    /// The sticky key (`tenant` or a header) was missing, so the request
    /// id was used.
    pub sticky_missing: bool,
}

/// Chooses the side of `split` for a request of `route` with `keys`.
/// `None` only for a split whose weights sum to 0 (validation refuses it).
pub fn choose(route: &str, split: &Split, keys: &SplitKeys<'_>) -> Option<(usize, KeyKind, bool)> {
    let (key, kind) = key_of(&split.sticky, keys);
    let sticky_missing = split.sticky != Sticky::RequestId
        && matches!(kind, KeyKind::RequestId | KeyKind::IdempotencyKey);
    let side = match key {
        Some(k) => {
            let first = split.sides.first().map_or("", |s| s.pool.as_str());
            let weights: Vec<u32> = split.sides.iter().map(|s| s.weight).collect();
            pick(&weights, point(seed(route, first), k))?
        }
        None => heaviest(split)?,
    };
    Some((side, kind, sticky_missing))
}

/// The order in which one request tries its route's pools: chain
/// positions (indices into the pools as written), and each split's choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainOrder {
    /// The positions in order; unused when `identity`.
    positions: Vec<usize>,
    /// No split: the positions are `0..len`, nothing allocated.
    identity: bool,
    len: usize,
    /// Each split's choice, in chain order.
    pub splits: Vec<SplitChoice>,
}

impl ChainOrder {
    /// `0..len`: a route without a split.
    pub fn identity(len: usize) -> Self {
        Self {
            positions: Vec::new(),
            identity: true,
            len,
            splits: Vec::new(),
        }
    }

    /// These positions, in this order.
    pub fn of(positions: Vec<usize>, splits: Vec<SplitChoice>) -> Self {
        Self {
            len: positions.len(),
            positions,
            identity: false,
            splits,
        }
    }

    /// The positions in the order the request tries them.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len).map(move |i| if self.identity { i } else { self.positions[i] })
    }

    /// How many positions the request may try.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the request may try no pool.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first position tried (the chain's first pool, or a first
    /// split's chosen side).
    pub fn first(&self) -> Option<usize> {
        self.iter().next()
    }
}

/// The order of a split's other sides after its chosen one: non-zero
/// weights, heaviest first, ties in the order written.
pub fn fallback_sides(split: &Split, chosen: usize) -> Vec<usize> {
    let mut rest: Vec<usize> = (0..split.sides.len())
        .filter(|&i| i != chosen && split.sides[i].weight > 0)
        .collect();
    rest.sort_by(|&a, &b| split.sides[b].weight.cmp(&split.sides[a].weight));
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(weights: &[u32]) -> Split {
        Split {
            sides: weights
                .iter()
                .enumerate()
                .map(|(i, &w)| SplitSide {
                    pool: format!("p{i}"),
                    weight: w,
                })
                .collect(),
            sticky: Sticky::RequestId,
            ramp: None,
        }
    }

    #[test]
    fn sticky_reads_the_three_forms_and_refuses_the_rest() {
        assert_eq!(Sticky::parse("tenant"), Some(Sticky::Tenant));
        assert_eq!(Sticky::parse("request_id"), Some(Sticky::RequestId));
        assert_eq!(
            Sticky::parse("header:X-Session-Id"),
            Some(Sticky::Header("x-session-id".into()))
        );
        assert_eq!(Sticky::parse("header:bad name"), None);
        assert_eq!(Sticky::parse("header:"), None);
        assert_eq!(Sticky::parse("session"), None);
    }

    #[test]
    fn the_ends_of_the_hash_space_land_on_the_first_and_last_sides() {
        assert_eq!(pick(&[10, 90], 0), Some(0));
        assert_eq!(pick(&[10, 90], u64::MAX), Some(1));
        assert_eq!(pick(&[0, 90], 0), Some(1));
        assert_eq!(pick(&[10, 0], u64::MAX), Some(0));
        assert_eq!(pick(&[0, 0], 7), None);
        assert_eq!(pick(&[], 7), None);
    }

    #[test]
    fn a_missing_sticky_key_falls_back_to_the_idempotency_key_then_the_request_id() {
        let headers = std::collections::BTreeMap::from([("x-s".to_string(), "abc".to_string())]);
        let keys = SplitKeys {
            request_id: Some("r"),
            idempotency_key: None,
            tenant: None,
            headers: Headers::Pairs(&headers),
        };
        fn by<'a>(s: Sticky, k: &SplitKeys<'a>) -> (Option<&'a str>, KeyKind) {
            key_of(&s, k)
        }
        assert_eq!(
            by(Sticky::Header("x-s".into()), &keys),
            (Some("abc"), KeyKind::Header)
        );
        assert_eq!(
            by(Sticky::Header("x-t".into()), &keys),
            (Some("r"), KeyKind::RequestId)
        );
        assert_eq!(by(Sticky::Tenant, &keys), (Some("r"), KeyKind::RequestId));
        let keyed = SplitKeys {
            idempotency_key: Some("k"),
            ..keys
        };
        assert_eq!(
            by(Sticky::RequestId, &keyed),
            (Some("k"), KeyKind::IdempotencyKey)
        );
        assert_eq!(
            by(Sticky::RequestId, &SplitKeys::default()),
            (None, KeyKind::None)
        );
    }

    #[test]
    fn without_a_key_the_heaviest_side_is_chosen() {
        let s = split(&[10, 90, 90]);
        assert_eq!(
            choose("r", &s, &SplitKeys::default()),
            Some((1, KeyKind::None, false))
        );
    }

    #[test]
    fn the_fallback_sides_are_the_others_heaviest_first_without_weight_zero() {
        let s = split(&[10, 30, 0, 60, 30]);
        assert_eq!(fallback_sides(&s, 0), vec![3, 1, 4]);
        assert_eq!(fallback_sides(&s, 3), vec![1, 4, 0]);
    }

    #[test]
    fn the_seed_is_pinned() {
        // Every proxy of a fleet, and every version, must agree: a change
        // of the hash or the seed moves sessions between sides.
        assert_eq!(
            pick(&[10, 90], point(seed("r", "new"), "req-1")),
            pick(&[10, 90], point(seed("r", "new"), "req-1"))
        );
        assert_eq!(point(0, ""), 0x2d06_8005_38d3_94c2);
    }
}

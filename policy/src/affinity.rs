//! Affinity by consistent hashing with bounded loads: where a key (a
//! session, or a prompt's first block) goes, alike on every proxy of a
//! fleet, unless that endpoint is overloaded.
//!
//! An engine with prefix caching (vLLM, SGLang) skips the prefill of prompt
//! blocks it already holds, so requests that share a prompt prefix belong
//! together. Longest-prefix matching ([`crate::prefix_cache`]) decides
//! where by what each endpoint likely holds; this module gives the parts
//! that need no memory at all:
//!
//! 1. **Keys**: a session header's value ([`session_key`]), or the hash of
//!    a prompt's first block (where a prefix no endpoint holds goes,
//!    [`crate::engine_aware::pick`]).
//! 2. **Consistent hashing** ([`Ring`]): each endpoint owns
//!    [`POINTS_PER_ENDPOINT`] points on a ring of 64-bit hashes; a key
//!    belongs to the first endpoint clockwise from its hash. Adding or
//!    removing an endpoint moves only the keys of the arcs it gains or
//!    loses, so caches stay warm when the pool changes.
//! 3. **Bounded loads** (Mirrokni, Thorup and Zadimoghaddam, "Consistent
//!    Hashing with Bounded Loads", SODA 2018): an endpoint takes a request
//!    only while its load after taking it is at most
//!    `ceil(c × (total + 1) / n)`; the walk goes on clockwise past full
//!    endpoints. With `c > 1` some endpoint always has room (they cannot all
//!    be above the average), so every key is placed, no endpoint carries
//!    more than `c` times the average, and a popular prefix spills over to
//!    its ring neighbours instead of piling onto one GPU.
//!
//! 4. **Memory** ([`LastServed`]): which endpoint served each session
//!    last, so that it goes back where its cache is.
//!
//! 5. **Sessions** ([`session_key`], [`choose_session`]): a pool with
//!    `session_affinity: {header: NAME}` keys a request by the value of
//!    that header instead (Claude Code sends `x-claude-code-session-id` on
//!    every request of a session), so a whole agent session stays where
//!    its prompt cache is, even when its prompt prefix changes (a new
//!    system reminder, a compacted history). The same ring and bound: a
//!    session goes back to the endpoint that served it last while that
//!    one is within the bound, else to the first endpoint within it
//!    clockwise from the key; a session never seen starts at its ring
//!    owner, so every proxy of a fleet places it alike without sharing
//!    any state. A spill is a visit: the caller remembers where a session
//!    was placed, not where it spilled, so it goes home once there is
//!    room. The value is hashed at once and never kept or logged
//!    (it may be as good as a credential), and a value longer than
//!    [`MAX_SESSION_VALUE_BYTES`] gives no key.
//!
//! Pure: no clock, no I/O; the loads are the caller's (in-flight requests,
//! or what the engines report).

use std::hash::Hasher;

/// Points on the ring per endpoint: enough that arcs are even (the share of
/// keys per endpoint is within a few percent of `1/n` for small pools).
pub const POINTS_PER_ENDPOINT: usize = 64;

/// FNV-1a, 64 bits: deterministic across processes and versions (unlike
/// `std`'s `DefaultHasher`), so every proxy of a fleet places a key the
/// same way.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    const fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        // A final mix (splitmix64's): FNV's low bits mix poorly, and the
        // ring orders by the whole value.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

fn hash(parts: &[&[u8]]) -> u64 {
    let mut h = Fnv::new();
    for p in parts {
        h.write(&(p.len() as u64).to_le_bytes());
        h.write(p);
    }
    h.finish()
}

/// Which endpoint served each key last: a bounded table, the oldest
/// key forgotten first when full. What "prefer the endpoint that served
/// that prefix last" remembers; pure bookkeeping (the caller names
/// endpoints by any stable id).
#[derive(Debug, Clone, Default)]
pub struct LastServed {
    map: std::collections::HashMap<u64, u64>,
    order: std::collections::VecDeque<u64>,
    capacity: usize,
}

impl LastServed {
    /// A table of at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            map: std::collections::HashMap::new(),
            order: std::collections::VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// The endpoint that served `key` last.
    pub fn get(&self, key: u64) -> Option<u64> {
        self.map.get(&key).copied()
    }

    /// `endpoint` served `key`.
    pub fn record(&mut self, key: u64, endpoint: u64) {
        if self.map.insert(key, endpoint).is_none() {
            self.order.push_back(key);
            while self.order.len() > self.capacity {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Nothing remembered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The longest session header value that gets a key.
pub const MAX_SESSION_VALUE_BYTES: usize = 512;

/// Default `session_affinity.load_factor`: the paper's usual 1.25.
pub const DEFAULT_SESSION_LOAD_FACTOR: f64 = 1.25;

/// The affinity key of a session header's value: `None` for an empty
/// value or one longer than [`MAX_SESSION_VALUE_BYTES`]. Domain-separated
/// from prefix keys (both may share one [`LastServed`]).
pub fn session_key(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > MAX_SESSION_VALUE_BYTES {
        return None;
    }
    Some(hash(&[b"session", value]))
}

/// Where [`choose_session`] put a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionPlacement {
    /// On the endpoint that served the session last.
    Kept,
    /// A new session (or one whose endpoint is gone), on its ring owner.
    Placed,
    /// Away from where it would have gone (that endpoint is over the
    /// bound or cannot take it): the first endpoint within the bound
    /// clockwise from the key.
    Spilled,
}

impl SessionPlacement {
    /// How the route log and explain name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kept => "session_kept",
            Self::Placed => "session_placed",
            Self::Spilled => "session_spilled",
        }
    }
}

/// The endpoint for a request of session `key`: `last` (the index of the
/// endpoint that served the session last, if it is still in the pool)
/// while it can take the request within the bound `ceil(c × (total + 1)
/// / m)` over the `m` endpoints that can take it (`loads[i]`: `None` for
/// one that cannot: unavailable or saturated); else the first within the
/// bound clockwise from the key on `ring` ([`Ring::choose_among`]).
/// `None` when no endpoint can take it.
pub fn choose_session(
    ring: &Ring,
    key: u64,
    last: Option<usize>,
    loads: &[Option<u32>],
    c: f64,
) -> Option<(usize, SessionPlacement)> {
    let m = loads.iter().flatten().count();
    if m == 0 || loads.len() != ring.endpoints {
        return None;
    }
    let c = if c.is_finite() { c.max(1.0) } else { 1.0 };
    let total: u64 = loads.iter().flatten().map(|l| u64::from(*l)).sum::<u64>() + 1;
    let bound = (c * total as f64 / m as f64).ceil() as u64;
    if let Some(l) = last {
        if loads
            .get(l)
            .copied()
            .flatten()
            .is_some_and(|x| u64::from(x) < bound)
        {
            return Some((l, SessionPlacement::Kept));
        }
    }
    let i = ring.choose_among(key, loads, c)?;
    let placement = if last.is_none() && ring.owner(key) == Some(i) {
        SessionPlacement::Placed
    } else {
        SessionPlacement::Spilled
    };
    Some((i, placement))
}

/// The ring of one pool's endpoints. Built when the pool's endpoints
/// change, consulted per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    /// (point, endpoint index), sorted by point.
    points: Vec<(u64, usize)>,
    /// How many endpoints.
    endpoints: usize,
}

impl Ring {
    /// The ring of `endpoints` (their names, e.g. addresses: a name's
    /// points do not depend on the others').
    pub fn new<S: AsRef<str>>(endpoints: &[S]) -> Self {
        let mut points = Vec::with_capacity(endpoints.len() * POINTS_PER_ENDPOINT);
        for (i, name) in endpoints.iter().enumerate() {
            for v in 0..POINTS_PER_ENDPOINT as u64 {
                points.push((hash(&[name.as_ref().as_bytes(), &v.to_le_bytes()]), i));
            }
        }
        points.sort_unstable();
        Self {
            points,
            endpoints: endpoints.len(),
        }
    }

    /// The endpoint for `key` given each endpoint's current `loads` (in
    /// ring order of [`Ring::new`]'s names) and the balance factor `c`
    /// (at least 1; 1.25 is the paper's usual choice): the first endpoint
    /// clockwise from the key's hash whose load after taking the request
    /// stays within `ceil(c × (total + 1) / n)`. `None` only for an empty
    /// ring or `loads` of the wrong length.
    pub fn choose(&self, key: u64, loads: &[u32], c: f64) -> Option<usize> {
        if self.endpoints == 0 || loads.len() != self.endpoints {
            return None;
        }
        let c = if c.is_finite() { c.max(1.0) } else { 1.0 };
        let total: u64 = loads.iter().map(|l| u64::from(*l)).sum::<u64>() + 1;
        let bound = (c * total as f64 / self.endpoints as f64).ceil() as u64;
        let start = self.points.partition_point(|(p, _)| *p < key);
        let n = self.points.len();
        (0..n)
            .map(|i| self.points[(start + i) % n].1)
            .find(|&e| u64::from(loads[e]) < bound)
    }

    /// [`Ring::choose`] among some endpoints only: `loads[i]` is `None`
    /// for an endpoint that cannot take the request (unavailable,
    /// saturated). The bound is taken over the others: `ceil(c × (total +
    /// 1) / m)` with `m` of them. `None` when none can take it.
    pub fn choose_among(&self, key: u64, loads: &[Option<u32>], c: f64) -> Option<usize> {
        if self.endpoints == 0 || loads.len() != self.endpoints {
            return None;
        }
        let m = loads.iter().flatten().count();
        if m == 0 {
            return None;
        }
        let c = if c.is_finite() { c.max(1.0) } else { 1.0 };
        let total: u64 = loads.iter().flatten().map(|l| u64::from(*l)).sum::<u64>() + 1;
        let bound = (c * total as f64 / m as f64).ceil() as u64;
        let start = self.points.partition_point(|(p, _)| *p < key);
        let n = self.points.len();
        (0..n)
            .map(|i| self.points[(start + i) % n].1)
            .find(|&e| loads[e].is_some_and(|l| u64::from(l) < bound))
    }

    /// The endpoint that owns `key` when loads do not matter.
    pub fn owner(&self, key: u64) -> Option<usize> {
        self.choose(key, &vec![0; self.endpoints], 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_owner_spills_to_its_ring_neighbour() {
        let ring = Ring::new(&["a", "b", "c"]);
        let key = hash(&[b"a long shared system prompt, block after block"]);
        let owner = ring.owner(key).expect("an owner");
        // The owner alone is loaded: bound ceil(1.25 × 7 / 3) = 3.
        let mut loads = vec![0; 3];
        loads[owner] = 6;
        let spilled = ring.choose(key, &loads, 1.25).expect("placed");
        assert_ne!(spilled, owner);
        // Loads even: bound ceil(1.25 × 4 / 3) = 2, and the owner keeps
        // its key.
        let loads = vec![1; 3];
        assert_eq!(ring.choose(key, &loads, 1.25), Some(owner));
    }

    #[test]
    fn a_session_key_is_bounded_and_apart_from_prefix_keys() {
        assert_eq!(session_key(b""), None);
        assert_eq!(session_key(&[b'a'; MAX_SESSION_VALUE_BYTES + 1]), None);
        assert!(session_key(&[b'a'; MAX_SESSION_VALUE_BYTES]).is_some());
        assert_eq!(session_key(b"s-1"), session_key(b"s-1"));
        assert_ne!(session_key(b"s-1"), session_key(b"s-2"));
        let block = [b'x'; 16];
        assert_ne!(session_key(&block), Some(hash(&[&block])));
    }

    #[test]
    fn a_session_stays_spills_when_full_and_comes_back() {
        let ring = Ring::new(&["a", "b", "c"]);
        let key = session_key(b"0f3c9a57-session").expect("a key");
        let owner = ring.owner(key).expect("an owner");
        // New: its ring owner.
        let (i, how) = choose_session(&ring, key, None, &[Some(0); 3], 1.25).unwrap();
        assert_eq!((i, how), (owner, SessionPlacement::Placed));
        // Served there: kept while within the bound.
        let mut loads = vec![Some(1); 3];
        let (i, how) = choose_session(&ring, key, Some(owner), &loads, 1.25).unwrap();
        assert_eq!((i, how), (owner, SessionPlacement::Kept));
        // Its endpoint saturated: spilled elsewhere...
        loads[owner] = None;
        let (i, how) = choose_session(&ring, key, Some(owner), &loads, 1.25).unwrap();
        assert_ne!(i, owner);
        assert_eq!(how, SessionPlacement::Spilled);
        // ... and back once it has room (the caller remembers where a
        // session was placed, not where it spilled).
        loads[owner] = Some(0);
        let (i, _) = choose_session(&ring, key, Some(owner), &loads, 1.25).unwrap();
        assert_eq!(i, owner);
        assert_eq!(
            choose_session(&ring, key, Some(owner), &[None; 3], 1.25),
            None
        );
    }

    proptest::proptest! {
        /// The bounded-load rule: a session is kept on its endpoint while
        /// that one is within the bound, spills only when it is not, and
        /// wherever it goes the load after taking it is within the bound.
        #[test]
        fn sessions_keep_their_endpoint_within_the_bound(
            loads in proptest::collection::vec(proptest::option::of(0u32..20), 1..6),
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..40),
            last in proptest::option::of(0usize..6),
            c in 1.0f64..3.0,
        ) {
            let names: Vec<String> = (0..loads.len()).map(|i| format!("e{i}")).collect();
            let ring = Ring::new(&names);
            let key = session_key(&value).unwrap();
            let last = last.filter(|l| *l < loads.len());
            let m = loads.iter().flatten().count();
            let total: u64 = loads.iter().flatten().map(|l| u64::from(*l)).sum::<u64>() + 1;
            let bound = if m == 0 { 0 } else { (c * total as f64 / m as f64).ceil() as u64 };
            match choose_session(&ring, key, last, &loads, c) {
                None => proptest::prop_assert_eq!(m, 0),
                Some((i, how)) => {
                    let load = loads[i].map(u64::from);
                    proptest::prop_assert!(load.is_some_and(|l| l < bound));
                    let last_fits = last
                        .and_then(|l| loads[l])
                        .is_some_and(|x| u64::from(x) < bound);
                    if last_fits {
                        proptest::prop_assert_eq!((Some(i), how), (last, SessionPlacement::Kept));
                    } else {
                        proptest::prop_assert_ne!(how, SessionPlacement::Kept);
                    }
                }
            }
        }

        /// Removing an endpoint moves only the sessions it owned.
        #[test]
        fn a_removed_endpoint_moves_only_its_own_sessions(
            values in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 1..24), 1..60),
            gone in 0usize..4,
        ) {
            let names = ["a", "b", "c", "d"];
            let before = Ring::new(&names);
            let rest: Vec<&str> = names.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, n)| *n).collect();
            let after = Ring::new(&rest);
            for v in &values {
                let key = session_key(v).unwrap();
                let was = names[before.owner(key).unwrap()];
                let now = rest[after.owner(key).unwrap()];
                if was != names[gone] {
                    proptest::prop_assert_eq!(was, now);
                }
            }
        }
    }

    #[test]
    fn last_served_remembers_the_latest_endpoint_and_forgets_the_oldest_key() {
        let mut t = LastServed::new(2);
        t.record(1, 10);
        t.record(1, 11);
        assert_eq!(t.get(1), Some(11));
        t.record(2, 20);
        t.record(3, 30);
        assert_eq!((t.get(1), t.get(2), t.get(3)), (None, Some(20), Some(30)));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn choosing_among_skips_endpoints_that_cannot_take_it() {
        let ring = Ring::new(&["a", "b", "c"]);
        let key = 42;
        let owner = ring.owner(key).expect("owner");
        let mut loads = vec![Some(0); 3];
        assert_eq!(ring.choose_among(key, &loads, 1.25), Some(owner));
        loads[owner] = None;
        let other = ring.choose_among(key, &loads, 1.25).expect("placed");
        assert_ne!(other, owner);
        assert_eq!(ring.choose_among(key, &[None, None, None], 1.25), None);
    }

    #[test]
    fn an_empty_ring_or_wrong_loads_place_nothing() {
        let empty = Ring::new::<&str>(&[]);
        assert_eq!(empty.choose(1, &[], 1.25), None);
        assert_eq!(Ring::new(&["a"]).choose(1, &[0, 0], 1.25), None);
    }
}

//! Telling that the shared store lost its data (issue 30, item 3).
//!
//! The proxies keep tenants' spend, rate-limit windows, idempotency records
//! and parked tasks in Redis. A Redis without persistence that restarts (or
//! a `FLUSHALL`, or a failover to an empty replica) forgets all of it, and
//! nothing in the data itself says so: a spend counter that is absent reads
//! as a tenant that spent nothing today.
//!
//! So the store carries a **marker**, `router:store:epoch`: a small JSON
//! document ([`Epoch`]) with a fresh id and the time it was written, without
//! a TTL (so `volatile-ttl` eviction never takes it). Each proxy, when its
//! connection is first made and then every few seconds, sends one
//! `SET router:store:epoch <candidate> NX GET`: the marker is written only
//! when it is absent, and the one already there comes back. [`observe`]
//! compares the answer with the epoch the proxy saw last:
//!
//! - nothing seen before: the proxy adopts what is there ([`Seen::First`]);
//! - the same id: nothing happened ([`Seen::Same`]);
//! - no marker (ours was just written) or another id: the data the proxy
//!   saw is gone ([`Seen::Lost`]).
//!
//! A candidate written after a loss names the epoch it replaces
//! ([`Epoch::replaces`]), so the control plane, reading the marker alone,
//! can say since when the store's data runs and that a reset was seen.
//!
//! Why not Redis's `run_id`: it changes on every restart, including one
//! that reloads its append-only file with nothing lost; the marker is lost
//! exactly when the data is. What it cannot see: a loss that no proxy was
//! connected across (the first proxy to connect afterwards finds no marker
//! and cannot tell an empty new store from an emptied one), and a loss
//! between two checks that a proxy's own write has already repaired (only
//! proxies write the marker, and each checks before it adopts).
//! Nothing here does I/O: the proxy makes the call, the control plane
//! reads the key.

use serde::{Deserialize, Serialize};

/// The marker's key after the proxies' `router:` prefix (so
/// `router:store:epoch` in Redis).
pub const KEY: &str = "store:epoch";

/// The epoch a marker names: since when the store's data runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Epoch {
    /// A fresh id per marker written.
    pub id: String,
    /// When it was written (Unix milliseconds, the writer's clock).
    pub since_unix_ms: u64,
    /// The epoch whose data was lost when this one was written, when the
    /// writer had seen it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<Lost>,
}

/// An epoch whose data was lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lost {
    /// Its id.
    pub id: String,
    /// Since when its data ran.
    pub since_unix_ms: u64,
}

impl Epoch {
    /// The marker's text (JSON).
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A marker's text, if it is one.
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }
}

/// The marker a proxy offers (written only if there is none): a fresh
/// `id` at `now_unix_ms`, naming the epoch it `saw` last as the one it
/// replaces (the offer is only written when that one is gone).
pub fn candidate(id: String, now_unix_ms: u64, saw: Option<&Epoch>) -> Epoch {
    Epoch {
        id,
        since_unix_ms: now_unix_ms,
        replaces: saw.map(|e| Lost {
            id: e.id.clone(),
            since_unix_ms: e.since_unix_ms,
        }),
    }
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The first epoch this proxy sees: adopt it.
    First(Epoch),
    /// The epoch seen last: nothing lost.
    Same,
    /// The data of `lost` is gone; `now` is the store's epoch from here.
    Lost {
        /// The epoch seen last.
        lost: Epoch,
        /// The store's epoch now.
        now: Epoch,
    },
    /// The key holds something that is not a marker (written by hand?):
    /// nothing can be said; keep what was seen.
    Unreadable,
}

/// Compares the answer of `SET KEY <offered> NX GET` (`None`: there was no
/// marker, `offered` was written) with the epoch seen last.
pub fn observe(saw: Option<&Epoch>, offered: &Epoch, reply: Option<&str>) -> Seen {
    let now = match reply {
        None => offered.clone(),
        Some(text) => match Epoch::parse(text) {
            Some(e) => e,
            None => return Seen::Unreadable,
        },
    };
    match saw {
        None => Seen::First(now),
        Some(s) if s.id == now.id => Seen::Same,
        Some(s) => Seen::Lost {
            lost: s.clone(),
            now,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(id: &str, since: u64) -> Epoch {
        Epoch {
            id: id.into(),
            since_unix_ms: since,
            replaces: None,
        }
    }

    #[test]
    fn a_first_check_adopts_the_marker_there_or_the_one_it_wrote() {
        let offered = candidate("b".into(), 20, None);
        assert_eq!(offered.replaces, None);
        let a = epoch("a", 10);
        assert_eq!(
            observe(None, &offered, Some(&a.to_text())),
            Seen::First(a.clone())
        );
        assert_eq!(observe(None, &offered, None), Seen::First(offered));
    }

    #[test]
    fn the_same_marker_is_nothing_and_a_missing_or_other_one_is_a_loss() {
        let a = epoch("a", 10);
        let offered = candidate("b".into(), 20, Some(&a));
        assert_eq!(observe(Some(&a), &offered, Some(&a.to_text())), Seen::Same);
        // No marker: ours was written, and it names the lost epoch.
        let Seen::Lost { lost, now } = observe(Some(&a), &offered, None) else {
            panic!("a missing marker is a loss");
        };
        assert_eq!(lost, a);
        assert_eq!(
            now.replaces,
            Some(Lost {
                id: "a".into(),
                since_unix_ms: 10
            })
        );
        // Another proxy wrote a new one first.
        let c = epoch("c", 15);
        assert_eq!(
            observe(Some(&a), &offered, Some(&c.to_text())),
            Seen::Lost {
                lost: a.clone(),
                now: c
            }
        );
    }

    #[test]
    fn a_key_that_is_not_a_marker_says_nothing() {
        let a = epoch("a", 10);
        let offered = candidate("b".into(), 20, Some(&a));
        assert_eq!(observe(Some(&a), &offered, Some("hello")), Seen::Unreadable);
        assert_eq!(observe(None, &offered, Some("")), Seen::Unreadable);
    }

    #[test]
    fn the_text_round_trips_and_omits_an_absent_replaces() {
        let a = epoch("a", 10);
        assert_eq!(a.to_text(), r#"{"id":"a","since_unix_ms":10}"#);
        let b = candidate("b".into(), 20, Some(&a));
        assert_eq!(Epoch::parse(&b.to_text()), Some(b));
    }
}

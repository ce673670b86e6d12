//! What to do with an `Idempotency-Key`: the rules that make "a retry
//! never pays twice" hold for a fleet of proxies sharing one store.
//!
//! A keyed request first *claims* its key in the store (one atomic
//! set-if-absent with a TTL, holding the claimant and the request's
//! fingerprint: a hash of the body and one of the caller's credential).
//! The store answers either "claimed" or the state it already holds, and
//! [`on_claim`] says what the request does:
//!
//! | stored state | same fingerprint | request does |
//! |---|---|---|
//! | nothing | | [`OnClaim::Lead`]: route it, settle the key at the end |
//! | anything | no | [`OnClaim::Mismatch`]: `422 idempotency_mismatch` |
//! | in flight | yes | [`OnClaim::Join`]: wait for the first one's answer |
//! | completed | yes | [`OnClaim::Replay`]: the stored bytes, marked as a replay |
//! | not replayable | yes | [`OnClaim::NotReplayable`]: `409 not_replayable` |
//! | outcome unknown | yes | [`OnClaim::OutcomeUnknown`]: `409 outcome_unknown` |
//!
//! The leader *settles* its key when it ends ([`settle`]): an answer is
//! stored if it fits the cap (else marked not replayable, so the retry is
//! told instead of generating again); a request the router shed before
//! any upstream send releases its key (a retry is a fresh try); an attempt
//! that may have reached a backend and ended without an answer releases
//! the key on READ/DRAFT routes (generating again is safe and the client
//! wants an answer) but is stored as *outcome unknown* on SEND/DESTRUCTIVE
//! routes, because a second send could act twice: the client's explicit
//! way to try again is a new key.
//!
//! When the store cannot be reached ([`when_store_down`]), keyed requests
//! with side effects fail closed (`503 shared_store_unavailable`): without
//! the shared record another proxy may be sending the same request right
//! now. READ/DRAFT requests fail open to the proxy's own in-process store:
//! at worst a retry on another proxy generates again, which costs money
//! but acts on nothing.
//!
//! With a key, the client has said it will retry, so a request whose
//! client goes away is finished and settled for that retry instead of
//! cancelled ([`finish_when_client_leaves`]), unless the route turns this
//! off. A request without a key never touches the store and is cancelled
//! at once, as before.
//!
//! A retry that joins a request in flight on another proxy polls the
//! store with [`JoinBackoff`] (short first, doubling to a cap) inside its
//! own deadline: the first answer usually comes within a few
//! milliseconds of a poll, and an idle wait costs a few reads a second.
//!
//! Everything here is pure: the proxy reads the store and the clock and
//! carries the answers out; the tests below check every row.

use std::time::Duration;

use crate::document::Risk;
use crate::outcome::Outcome;

/// The state a store holds for a key, as far as the decision cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Claimed by a request that has not ended.
    InFlight,
    /// Ended with an answer that is stored and can be replayed.
    Completed,
    /// Ended with an answer too large to store (or otherwise not kept).
    NotReplayable,
    /// A SEND/DESTRUCTIVE attempt may have reached a backend and ended
    /// without an answer: nobody knows whether it acted.
    OutcomeUnknown,
}

/// What a keyed request does after its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnClaim {
    /// The key was free and is now this request's: route it.
    Lead,
    /// The first request is still running: wait for its answer.
    Join,
    /// Answer with the stored answer.
    Replay,
    /// `409 not_replayable`.
    NotReplayable,
    /// `409 outcome_unknown`, with the first request's route record.
    OutcomeUnknown,
    /// `422 idempotency_mismatch`: the key was used for another request.
    Mismatch,
}

/// Decides on a claim: `found` is `None` when the claim succeeded, else
/// the state already stored and whether its fingerprint is this request's.
pub fn on_claim(found: Option<(Stored, bool)>) -> OnClaim {
    match found {
        None => OnClaim::Lead,
        Some((_, false)) => OnClaim::Mismatch,
        Some((Stored::InFlight, true)) => OnClaim::Join,
        Some((Stored::Completed, true)) => OnClaim::Replay,
        Some((Stored::NotReplayable, true)) => OnClaim::NotReplayable,
        Some((Stored::OutcomeUnknown, true)) => OnClaim::OutcomeUnknown,
    }
}

/// How a leader's request ended, as far as its key is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// An answer went (or would have gone) to the client: `bytes` long,
    /// `complete` when every byte of it was produced (a stream not cut).
    Answered {
        /// The answer's outcome (`Ok`, or a backend failure passed on).
        outcome: Outcome,
        /// Body size in bytes (a stream: its frames together).
        bytes: usize,
        /// Every byte was produced (a stream that was not cut or broken).
        complete: bool,
    },
    /// No answer from a backend: the router answered itself. `reached`
    /// says whether any attempt may have reached a backend
    /// ([`Outcome::may_have_reached_backend`] of some attempt).
    NoAnswer {
        /// Some attempt may have reached a backend.
        reached: bool,
    },
}

/// What the leader writes for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Store the answer for replay (TTL).
    Store,
    /// Record that it was answered and cannot be replayed (TTL).
    NotReplayable,
    /// Delete the key: a retry is a fresh try.
    Release,
    /// Record `outcome_unknown` with the route record (TTL).
    OutcomeUnknown,
}

/// Decides what the leader of a `risk` request writes when it ends as
/// `ending`, with answers stored up to `cap` bytes.
pub fn settle(risk: Risk, ending: Ending, cap: usize) -> Settle {
    match ending {
        Ending::Answered {
            outcome,
            bytes,
            complete,
        } => {
            if outcome.is_success() && complete {
                if bytes <= cap {
                    Settle::Store
                } else {
                    Settle::NotReplayable
                }
            } else if outcome.is_success() {
                // A stream broken or cut: part of an answer was produced.
                if risk.has_side_effects() {
                    Settle::OutcomeUnknown
                } else {
                    Settle::Release
                }
            } else {
                // A backend failure passed on (5xx, 429): nothing to keep.
                no_answer(risk, outcome.may_have_reached_backend())
            }
        }
        Ending::NoAnswer { reached } => no_answer(risk, reached),
    }
}

fn no_answer(risk: Risk, reached: bool) -> Settle {
    if reached && risk.has_side_effects() {
        Settle::OutcomeUnknown
    } else {
        Settle::Release
    }
}

/// What a keyed request does when the shared store cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenDown {
    /// `503 shared_store_unavailable` with `Retry-After`.
    FailClosed,
    /// Use this proxy's own in-process store (counted, logged once).
    FailOpenLocal,
}

/// Decides for a `risk` request when the shared store is down.
pub fn when_store_down(risk: Risk) -> WhenDown {
    if risk.has_side_effects() {
        WhenDown::FailClosed
    } else {
        WhenDown::FailOpenLocal
    }
}

/// Whether a request keeps generating after its client leaves: only a
/// keyed one (the client said it would retry), on a route that has not
/// turned it off (`finish_on_client_gone: false`).
pub fn finish_when_client_leaves(keyed: bool, route_allows: bool) -> bool {
    keyed && route_allows
}

/// The polling schedule of a join: the `n`th wait (0-based) is
/// `first × 2ⁿ`, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinBackoff {
    /// The first wait.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl JoinBackoff {
    /// 2 ms, doubling to 50 ms: an answer is seen within 50 ms of being
    /// stored, and a long wait costs 20 reads a second.
    pub const DEFAULT: Self = Self {
        first: Duration::from_millis(2),
        max: Duration::from_millis(50),
    };

    /// The wait before poll `n + 1`.
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RISKS: [Risk; 4] = [Risk::Read, Risk::Draft, Risk::Send, Risk::Destructive];

    #[test]
    fn every_row_of_the_claim_table() {
        assert_eq!(on_claim(None), OnClaim::Lead);
        for s in [
            Stored::InFlight,
            Stored::Completed,
            Stored::NotReplayable,
            Stored::OutcomeUnknown,
        ] {
            assert_eq!(on_claim(Some((s, false))), OnClaim::Mismatch, "{s:?}");
        }
        assert_eq!(on_claim(Some((Stored::InFlight, true))), OnClaim::Join);
        assert_eq!(on_claim(Some((Stored::Completed, true))), OnClaim::Replay);
        assert_eq!(
            on_claim(Some((Stored::NotReplayable, true))),
            OnClaim::NotReplayable
        );
        assert_eq!(
            on_claim(Some((Stored::OutcomeUnknown, true))),
            OnClaim::OutcomeUnknown
        );
    }

    #[test]
    fn answers_are_stored_up_to_the_cap() {
        let answered = |bytes| Ending::Answered {
            outcome: Outcome::Ok,
            bytes,
            complete: true,
        };
        for risk in RISKS {
            assert_eq!(settle(risk, answered(10), 10), Settle::Store);
            assert_eq!(settle(risk, answered(11), 10), Settle::NotReplayable);
        }
    }

    #[test]
    fn a_shed_before_any_send_releases_whatever_the_risk() {
        for risk in RISKS {
            assert_eq!(
                settle(risk, Ending::NoAnswer { reached: false }, 1),
                Settle::Release
            );
        }
    }

    #[test]
    fn without_an_answer_only_side_effects_are_kept_as_unknown() {
        let reached = Ending::NoAnswer { reached: true };
        assert_eq!(settle(Risk::Read, reached, 1), Settle::Release);
        assert_eq!(settle(Risk::Draft, reached, 1), Settle::Release);
        assert_eq!(settle(Risk::Send, reached, 1), Settle::OutcomeUnknown);
        assert_eq!(
            settle(Risk::Destructive, reached, 1),
            Settle::OutcomeUnknown
        );
        // A 5xx passed on may have acted; a 429 refused the work.
        let passed = |outcome| Ending::Answered {
            outcome,
            bytes: 5,
            complete: true,
        };
        assert_eq!(
            settle(Risk::Send, passed(Outcome::Status5xx), 100),
            Settle::OutcomeUnknown
        );
        assert_eq!(
            settle(Risk::Send, passed(Outcome::Status429), 100),
            Settle::Release
        );
        assert_eq!(
            settle(Risk::Read, passed(Outcome::Status5xx), 100),
            Settle::Release
        );
        // A stream cut half way.
        let cut = Ending::Answered {
            outcome: Outcome::Ok,
            bytes: 5,
            complete: false,
        };
        assert_eq!(settle(Risk::Read, cut, 100), Settle::Release);
        assert_eq!(settle(Risk::Send, cut, 100), Settle::OutcomeUnknown);
    }

    #[test]
    fn a_side_effect_is_never_settled_so_that_a_retry_sends_again() {
        // Property over every outcome, size and completeness: for a SEND or
        // DESTRUCTIVE request, a key is released only when no attempt may
        // have reached a backend (or the backend refused with a 429).
        for risk in [Risk::Send, Risk::Destructive] {
            for outcome in Outcome::ALL {
                for complete in [true, false] {
                    let s = settle(
                        risk,
                        Ending::Answered {
                            outcome,
                            bytes: 1,
                            complete,
                        },
                        10,
                    );
                    if s == Settle::Release {
                        assert!(
                            !outcome.is_success() && !outcome.may_have_reached_backend(),
                            "{risk:?} {outcome} {complete}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_store_outage_fails_closed_only_for_side_effects() {
        assert_eq!(when_store_down(Risk::Read), WhenDown::FailOpenLocal);
        assert_eq!(when_store_down(Risk::Draft), WhenDown::FailOpenLocal);
        assert_eq!(when_store_down(Risk::Send), WhenDown::FailClosed);
        assert_eq!(when_store_down(Risk::Destructive), WhenDown::FailClosed);
    }

    #[test]
    fn only_keyed_requests_outlive_their_client() {
        assert!(finish_when_client_leaves(true, true));
        assert!(!finish_when_client_leaves(true, false));
        assert!(!finish_when_client_leaves(false, true));
    }

    #[test]
    fn the_join_backoff_doubles_to_its_cap() {
        let b = JoinBackoff::DEFAULT;
        let waits: Vec<u64> = (0..8).map(|n| b.delay(n).as_millis() as u64).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 50, 50, 50]);
        assert_eq!(b.delay(u32::MAX), b.max);
    }
}

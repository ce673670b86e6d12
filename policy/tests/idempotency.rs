//! Properties of the `Idempotency-Key` rules over every risk and outcome
//! and random sizes: a key is only ever stored with an answer that fits,
//! released only when generating again is safe, and a request with side
//! effects that may have acted is never left for a second send.

use proptest::prelude::*;
use router_policy::idempotency::{settle, Ending, Settle};
use router_policy::{Outcome, Risk};

fn risk() -> impl Strategy<Value = Risk> {
    prop::sample::select(Risk::ALL.to_vec())
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop::sample::select(Outcome::ALL.to_vec())
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        (outcome(), 0usize..4096, any::<bool>()).prop_map(|(outcome, bytes, complete)| {
            Ending::Answered {
                outcome,
                bytes,
                complete,
            }
        }),
        any::<bool>().prop_map(|reached| Ending::NoAnswer { reached }),
    ]
}

proptest! {
    #[test]
    fn settling_is_safe(risk in risk(), ending in ending(), cap in 0usize..4096) {
        let s = settle(risk, ending, cap);
        match ending {
            Ending::Answered { outcome, bytes, complete } => {
                if s == Settle::Store {
                    // Only a complete answer that fits is kept for replay.
                    prop_assert!(outcome.is_success() && complete && bytes <= cap);
                }
                if outcome.is_success() && complete {
                    // A complete answer is never generated again.
                    prop_assert!(matches!(s, Settle::Store | Settle::NotReplayable));
                }
                if s == Settle::Release {
                    // Released: nothing complete was produced, and for a
                    // request with side effects nothing may have acted.
                    prop_assert!(!(outcome.is_success() && complete));
                    if risk.has_side_effects() {
                        prop_assert!(!outcome.is_success() && !outcome.may_have_reached_backend());
                    }
                }
            }
            Ending::NoAnswer { reached } => {
                prop_assert!(matches!(s, Settle::Release | Settle::OutcomeUnknown));
                prop_assert_eq!(s == Settle::OutcomeUnknown, reached && risk.has_side_effects());
            }
        }
    }
}

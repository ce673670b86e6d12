//! Properties of signed approval tokens: a minted token approves exactly
//! its own route and request id, and no change to its text keeps it valid.

use std::time::Duration;

use proptest::prelude::*;
use router_policy::approval::{ApprovalKey, Refusal};

const NOW: u64 = 1_800_000_000;

fn key() -> ApprovalKey {
    ApprovalKey::new("property-test-approval-key-0123456789").expect("key")
}

proptest! {
    #[test]
    fn a_minted_token_approves_its_pair_and_no_other(
        route in "[a-z0-9-]{1,12}",
        id in "[ -~]{1,40}",
        other_route in "[a-z0-9-]{1,12}",
        other_id in "[ -~]{1,40}",
        ttl in 1u64..=86_400,
    ) {
        let k = key();
        let (token, expires_at) = k.mint(&route, &id, Duration::from_secs(ttl), NOW).expect("mint");
        prop_assert_eq!(expires_at, NOW + ttl);
        prop_assert_eq!(k.verify(token.as_bytes(), &route, &id, NOW), Ok(()));
        if (other_route.as_str(), other_id.as_str()) != (route.as_str(), id.as_str()) {
            prop_assert_eq!(
                k.verify(token.as_bytes(), &other_route, &other_id, NOW),
                Err(Refusal::Mismatch)
            );
        }
        prop_assert_eq!(k.verify(token.as_bytes(), &route, &id, expires_at), Err(Refusal::Expired));
    }

    #[test]
    fn no_single_byte_change_keeps_a_token_valid(
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
    ) {
        let k = key();
        let (token, _) = k.mint("governed", "req-1", Duration::from_secs(600), NOW).expect("mint");
        let mut bytes = token.into_bytes();
        let i = at.index(bytes.len());
        prop_assume!(bytes[i] != to);
        bytes[i] = to;
        prop_assert!(k.verify(&bytes, "governed", "req-1", NOW).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_approve_and_never_panic(token in prop::collection::vec(any::<u8>(), 0..80)) {
        prop_assert!(key().verify(&token, "governed", "req-1", NOW).is_err());
    }
}

//! Signed approval tokens: one route, one request, until a time.
//!
//! A route with `requires_approval: true` answers `403 approval_required`
//! unless the request carries `X-Router-Approval` with a token that
//! approves *this* request. A token is minted by whoever holds the
//! approval key (`routerctl approve --route R --request-id ID --ttl 10m`)
//! and checked by every proxy that has the same key
//! (`CUSTOM_ROUTER_APPROVAL_KEY`):
//!
//! ```text
//! v1.<expiry, Unix seconds>.<HMAC-SHA256(key, route, request id, expiry), base64url>
//! ```
//!
//! - **One route, one request.** The MAC covers the route's name and the
//!   request id (`Idempotency-Key`/`X-Request-Id`), so a token seen once
//!   (in a log, a browser history) cannot approve another request or
//!   another route. The fields are length-prefixed, so no choice of names
//!   makes two different (route, id) pairs sign the same bytes.
//! - **Until a time.** The expiry is inside the MAC; a token past it is
//!   refused, and so is one that claims to last longer than
//!   [`MAX_TTL`] from now (a key holder who wants a standing approval
//!   should change the policy instead).
//! - **Checked in constant time.** The comparison is `ring::hmac::verify`,
//!   whose time does not depend on where the MAC differs.
//! - **Why a refusal.** [`Refusal`] says what was wrong (malformed, not
//!   signed by this key or not for this route and request, expired); the
//!   proxy puts it in the 403 so the caller can fix the right thing. A
//!   forged token and one minted for another request look the same: both
//!   are a MAC mismatch.
//!
//! This module reads no clock: callers pass "now" as Unix seconds.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::hmac;

/// The longest a token may last (a day): approvals are for one request,
/// given by a person or a workflow close to the time it is sent.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The shortest key accepted, in bytes (256 bits, HMAC-SHA256's own size).
pub const MIN_KEY_BYTES: usize = 32;

/// The version prefix of a token.
const VERSION: &str = "v1";

/// What the MAC covers first, so a tag made for something else with the
/// same key can never pass as an approval.
const DOMAIN: &[u8] = b"custom-router approval v1\0";

/// The key approvals are signed with. `Debug` never shows it; two keys
/// are equal when their secrets are (compared by SHA-256 digest).
#[derive(Clone)]
pub struct ApprovalKey {
    /// The HMAC key.
    key: hmac::Key,
    /// SHA-256 of the secret, for equality only.
    digest: [u8; 32],
}

impl PartialEq for ApprovalKey {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Eq for ApprovalKey {}

impl std::fmt::Debug for ApprovalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApprovalKey(<redacted>)")
    }
}

/// A key that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Fewer than [`MIN_KEY_BYTES`] bytes after trimming.
    #[error("is {0} bytes long: an approval key needs at least {MIN_KEY_BYTES} (e.g. `openssl rand -base64 32`)")]
    TooShort(usize),
}

/// A token that cannot be minted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MintError {
    /// The time to live is zero or longer than [`MAX_TTL`].
    #[error("the time to live must be more than 0 s and at most {} s", MAX_TTL.as_secs())]
    Ttl,
    /// The route name or the request id is empty.
    #[error("the {0} must not be empty")]
    Empty(&'static str),
}

/// Why a token does not approve a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No `X-Router-Approval` header.
    #[error("send an X-Router-Approval token (routerctl approve --route ROUTE --request-id ID)")]
    Missing,
    /// Not of the form `v1.<expiry>.<mac>`.
    #[error("the approval token is malformed")]
    Malformed,
    /// The MAC does not match: another key, another route or another
    /// request id (the request id is its Idempotency-Key or X-Request-Id).
    #[error("the approval token is not valid for this route and request id")]
    Mismatch,
    /// The expiry has passed.
    #[error("the approval token has expired")]
    Expired,
    /// The expiry is further ahead than [`MAX_TTL`].
    #[error("the approval token's expiry is more than a day ahead")]
    TooLong,
}

impl ApprovalKey {
    /// The key from its text (trimmed, as tokens are); `origin` is not
    /// needed here: callers name the variable or file in their error.
    pub fn new(secret: &str) -> Result<Self, KeyError> {
        let secret = secret.trim();
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort(secret.len()));
        }
        let mut digest = [0; 32];
        digest.copy_from_slice(
            ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref(),
        );
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes()),
            digest,
        })
    }

    /// A token approving `request_id` on `route` until `expires_at`
    /// (Unix seconds).
    pub fn sign(&self, route: &str, request_id: &str, expires_at: u64) -> String {
        let tag = hmac::sign(&self.key, &signed_bytes(route, request_id, expires_at));
        format!(
            "{VERSION}.{expires_at}.{}",
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// A token approving `request_id` on `route` for `ttl` from `now`
    /// (Unix seconds), with its expiry.
    pub fn mint(
        &self,
        route: &str,
        request_id: &str,
        ttl: Duration,
        now: u64,
    ) -> Result<(String, u64), MintError> {
        if ttl.is_zero() || ttl > MAX_TTL {
            return Err(MintError::Ttl);
        }
        if route.is_empty() {
            return Err(MintError::Empty("route"));
        }
        if request_id.is_empty() {
            return Err(MintError::Empty("request id"));
        }
        let expires_at = now.saturating_add(ttl.as_secs().max(1));
        Ok((self.sign(route, request_id, expires_at), expires_at))
    }

    /// Whether `token` approves `request_id` on `route` at `now` (Unix
    /// seconds). The MAC is checked before the expiry, so nothing about a
    /// token that was not signed with this key is judged.
    pub fn verify(
        &self,
        token: &[u8],
        route: &str,
        request_id: &str,
        now: u64,
    ) -> Result<(), Refusal> {
        let (expires_at, tag) = parse(token).ok_or(Refusal::Malformed)?;
        hmac::verify(
            &self.key,
            &signed_bytes(route, request_id, expires_at),
            &tag,
        )
        .map_err(|_| Refusal::Mismatch)?;
        if now >= expires_at {
            return Err(Refusal::Expired);
        }
        if expires_at - now > MAX_TTL.as_secs() {
            return Err(Refusal::TooLong);
        }
        Ok(())
    }
}

/// `v1.<digits>.<base64url>` → (expiry, tag); `None` for anything else.
fn parse(token: &[u8]) -> Option<(u64, Vec<u8>)> {
    let token = std::str::from_utf8(token).ok()?;
    let mut parts = token.split('.');
    let (version, expiry, tag) = (parts.next()?, parts.next()?, parts.next()?);
    if version != VERSION || parts.next().is_some() {
        return None;
    }
    if expiry.is_empty() || expiry.len() > 20 || !expiry.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let expires_at = expiry.parse().ok()?;
    // A SHA-256 tag is 32 bytes: 43 characters unpadded.
    if tag.len() != 43 {
        return None;
    }
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    Some((expires_at, tag))
}

/// What the MAC covers: the domain, then each field with its length.
fn signed_bytes(route: &str, request_id: &str, expires_at: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 24 + route.len() + request_id.len());
    m.extend_from_slice(DOMAIN);
    for field in [route.as_bytes(), request_id.as_bytes()] {
        m.extend_from_slice(&(field.len() as u64).to_be_bytes());
        m.extend_from_slice(field);
    }
    m.extend_from_slice(&expires_at.to_be_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;
    const TEN_MIN: Duration = Duration::from_secs(600);

    fn key() -> ApprovalKey {
        ApprovalKey::new("an-approval-key-of-at-least-32-bytes!").expect("key")
    }

    #[test]
    fn a_token_approves_its_route_and_request_until_it_expires() {
        let (token, expires_at) = key().mint("governed", "req-1", TEN_MIN, NOW).expect("mint");
        assert_eq!(expires_at, NOW + 600);
        assert!(token.starts_with(&format!("v1.{expires_at}.")), "{token}");
        let k = key();
        assert_eq!(k.verify(token.as_bytes(), "governed", "req-1", NOW), Ok(()));
        assert_eq!(
            k.verify(token.as_bytes(), "governed", "req-1", expires_at - 1),
            Ok(())
        );
        assert_eq!(
            k.verify(token.as_bytes(), "governed", "req-1", expires_at),
            Err(Refusal::Expired)
        );
    }

    #[test]
    fn another_route_request_or_key_is_a_mismatch() {
        let (token, _) = key().mint("governed", "req-1", TEN_MIN, NOW).expect("mint");
        let t = token.as_bytes();
        assert_eq!(
            key().verify(t, "other", "req-1", NOW),
            Err(Refusal::Mismatch)
        );
        assert_eq!(
            key().verify(t, "governed", "req-2", NOW),
            Err(Refusal::Mismatch)
        );
        let other = ApprovalKey::new("another-approval-key-of-32-bytes-or-more").expect("key");
        assert_eq!(
            other.verify(t, "governed", "req-1", NOW),
            Err(Refusal::Mismatch)
        );
    }

    #[test]
    fn the_expiry_is_signed_so_it_cannot_be_moved() {
        let (token, expires_at) = key().mint("governed", "req-1", TEN_MIN, NOW).expect("mint");
        let moved = token.replacen(&expires_at.to_string(), &(expires_at + 3600).to_string(), 1);
        assert_eq!(
            key().verify(moved.as_bytes(), "governed", "req-1", NOW),
            Err(Refusal::Mismatch)
        );
    }

    #[test]
    fn length_prefixes_keep_field_boundaries_apart() {
        // Without them, ("ab", "c") and ("a", "bc") would sign the same bytes.
        let token = key().sign("ab", "c", NOW + 60);
        assert_eq!(
            key().verify(token.as_bytes(), "a", "bc", NOW),
            Err(Refusal::Mismatch)
        );
    }

    #[test]
    fn a_token_lasting_more_than_a_day_is_refused_even_when_signed() {
        let token = key().sign("governed", "req-1", NOW + MAX_TTL.as_secs() + 1);
        assert_eq!(
            key().verify(token.as_bytes(), "governed", "req-1", NOW),
            Err(Refusal::TooLong)
        );
        assert_eq!(
            key().mint("governed", "req-1", MAX_TTL + Duration::from_secs(1), NOW),
            Err(MintError::Ttl)
        );
        assert_eq!(
            key().mint("governed", "req-1", Duration::ZERO, NOW),
            Err(MintError::Ttl)
        );
        assert!(key().mint("governed", "req-1", MAX_TTL, NOW).is_ok());
    }

    #[test]
    fn malformed_tokens_are_refused_as_such() {
        let (token, _) = key().mint("governed", "req-1", TEN_MIN, NOW).expect("mint");
        let k = key();
        for bad in [
            String::new(),
            "approval-secret-token".into(),
            token.replacen("v1.", "v2.", 1),
            format!("{token}.x"),
            token[..token.len() - 1].to_string(),
            format!("{token}A"),
            "v1.99999999999999999999999.AAAA".into(),
            "v1.-5.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            "v1..AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            "v1.1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into(),
        ] {
            assert_eq!(
                k.verify(bad.as_bytes(), "governed", "req-1", NOW),
                Err(Refusal::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            k.verify(&[0xff, 0xfe], "governed", "req-1", NOW),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn keys_are_trimmed_and_must_be_long_enough() {
        assert_eq!(ApprovalKey::new("short").err(), Some(KeyError::TooShort(5)));
        assert_eq!(
            ApprovalKey::new(&format!("  {}  \n", "k".repeat(31))).err(),
            Some(KeyError::TooShort(31))
        );
        let padded = ApprovalKey::new("\n an-approval-key-of-at-least-32-bytes! \n").expect("key");
        let token = key().sign("r", "id", NOW + 60);
        assert_eq!(padded.verify(token.as_bytes(), "r", "id", NOW), Ok(()));
        assert_eq!(format!("{padded:?}"), "ApprovalKey(<redacted>)");
    }
}

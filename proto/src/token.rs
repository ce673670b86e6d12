//! Bearer tokens: read, presented and checked the same way by every
//! program (the proxy's admin token, `ROUTER_TOKEN`, the control plane's
//! `--token-file`).
//!
//! - Reading ([`normalize`]): surrounding whitespace is trimmed (a token
//!   file's trailing newline, a padded variable), and what is left must be
//!   non-empty visible ASCII, because it travels in an `Authorization`
//!   header. Anything else is an error that names where the token came
//!   from, at startup: a token that silently turned into "no token" would
//!   leave a proxy unauthenticated or an API open.
//! - Presenting ([`BearerToken`]): the header value is built once, when the
//!   token is read, so a call can never go out without it.
//! - Checking ([`Secret::matches`], [`bearer`]): the scheme is matched
//!   case-insensitively and the credential trimmed as on reading; the
//!   comparison is of SHA-256 digests in constant time, so neither the
//!   content nor the length of the expected token shows in the time an
//!   answer takes.
//!
//! Tokens are never shown: errors say where a token came from and what is
//! wrong with it, never its value, and `Debug` is redacted.

use subtle::ConstantTimeEq;

/// A token that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {problem}")]
pub struct TokenError {
    /// Where it came from (a variable's name, a flag and its file).
    pub origin: String,
    /// What is wrong with it (never its value).
    pub problem: &'static str,
}

/// Trims `raw` and checks that it can travel in an `Authorization` header;
/// `origin` names where it came from, for the error.
pub fn normalize(raw: &str, origin: &str) -> Result<String, TokenError> {
    let token = raw.trim();
    let problem = if token.is_empty() {
        Some("is empty: set a token, or leave it unset")
    } else if !token.bytes().all(|b| b.is_ascii_graphic()) {
        Some("must be visible ASCII characters without spaces (it is sent in an Authorization header)")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(TokenError {
            origin: origin.to_string(),
            problem,
        }),
        None => Ok(token.to_string()),
    }
}

/// Reads the token in environment variable `var`: `None` when unset, an
/// error when set but unusable (not Unicode, empty, or not a header value).
pub fn from_env(var: &str) -> Result<Option<String>, TokenError> {
    match std::env::var_os(var) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Some(s) => normalize(s, var).map(Some),
            None => Err(TokenError {
                origin: var.to_string(),
                problem: "is not valid Unicode",
            }),
        },
    }
}

/// The credential of an `Authorization: Bearer <token>` value: the scheme
/// matched case-insensitively, the token trimmed as [`normalize`] trims.
/// `None` for another scheme or no token.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer";
    let value = value.trim_ascii();
    let (scheme, rest) = value.split_at_checked(SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME)
        || !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t')
    {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// An expected token, kept as its SHA-256 digest and compared in constant
/// time.
#[derive(Clone)]
pub struct Secret {
    digest: [u8; 32],
}

impl Secret {
    /// The secret for a token read from `origin` (checked with
    /// [`normalize`]).
    pub fn new(token: &str, origin: &str) -> Result<Self, TokenError> {
        let token = normalize(token, origin)?;
        Ok(Self {
            digest: sha256(token.as_bytes()),
        })
    }

    /// True when `presented` is the token. Both sides are hashed first, so
    /// the comparison takes the same time whatever the two lengths.
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(sha256(presented).ct_eq(&self.digest))
    }

    /// True when `authorization` (a whole `Authorization` header value, or
    /// none) carries the token as a bearer credential.
    pub fn authorizes(&self, authorization: Option<&[u8]>) -> bool {
        // A missing or malformed header is hashed too: every refusal costs
        // the same.
        self.matches(authorization.and_then(bearer).unwrap_or_default())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// Adds `authorization: Bearer <token>` to every call of a client (nothing
/// without a token): what proxies and `routerctl` present to the control
/// plane. The header value is made by [`BearerToken::new`], so a token
/// that cannot be sent is an error there, never a call without it.
#[derive(Clone, Default)]
pub struct BearerToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl BearerToken {
    /// Presents `token` (read from `origin`, named in the error).
    pub fn new(token: Option<&str>, origin: &str) -> Result<Self, TokenError> {
        let Some(token) = token else {
            return Ok(Self(None));
        };
        let token = normalize(token, origin)?;
        let mut value: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
            format!("Bearer {token}").parse().map_err(|_| TokenError {
                origin: origin.to_string(),
                problem: "cannot be sent in an Authorization header",
            })?;
        value.set_sensitive(true);
        Ok(Self(Some(value)))
    }

    /// True when a token is presented.
    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "BearerToken(<redacted>)"
        } else {
            "BearerToken(None)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_must_be_header_values() {
        assert_eq!(normalize("  tok-1\n", "V").unwrap(), "tok-1");
        for bad in ["", " \n", "tök", "two words", "tab\there", "nul\0"] {
            let err = normalize(bad, "ROUTER_TOKEN").unwrap_err();
            assert_eq!(err.origin, "ROUTER_TOKEN");
            assert!(err.to_string().starts_with("ROUTER_TOKEN: "), "{err}");
            if !bad.trim().is_empty() {
                assert!(
                    !err.to_string().contains(bad.trim()),
                    "the value is never shown: {err}"
                );
            }
        }
    }

    #[test]
    fn bearer_credentials_are_parsed_like_tokens_are_read() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc \t"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"BEARER\tabc"), Some(&b"abc"[..]));
        for bad in [
            &b"abc"[..],
            b"Bearer",
            b"Bearer ",
            b"Bearerabc",
            b"Basic abc",
            b"",
        ] {
            assert_eq!(bearer(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_secret_matches_only_its_token() {
        let s = Secret::new("s3cret\n", "V").unwrap();
        assert!(s.matches(b"s3cret"));
        for other in [&b""[..], b"s3cre", b"s3cret-x", b"S3CRET", b"s3cret\n"] {
            assert!(!s.matches(other));
        }
        assert!(s.authorizes(Some(b"Bearer s3cret")));
        assert!(s.authorizes(Some(b"bearer  s3cret ")));
        assert!(!s.authorizes(Some(b"s3cret")));
        assert!(!s.authorizes(None));
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    #[test]
    fn a_presented_token_is_trimmed_and_never_dropped() {
        use tonic::service::Interceptor;
        let mut t = BearerToken::new(Some("tok\n"), "ROUTER_TOKEN").unwrap();
        let req = t.call(tonic::Request::new(())).unwrap();
        assert_eq!(req.metadata().get("authorization").unwrap(), "Bearer tok");
        assert!(BearerToken::new(Some("tök"), "ROUTER_TOKEN").is_err());
        assert!(!BearerToken::new(None, "ROUTER_TOKEN").unwrap().is_set());
        assert_eq!(format!("{t:?}"), "BearerToken(<redacted>)");
    }
}

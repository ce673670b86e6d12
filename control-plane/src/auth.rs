//! Who may call what: operator tokens and proxy tokens.
//!
//! Two roles, each with its own bearer tokens:
//!
//! - **operator** (`--token-file`): every call, admin and stream. Also
//!   accepted on the config stream, so proxies deployed with the operator
//!   token keep working (separate secrets are recommended: a leaked proxy
//!   token then cannot change policy);
//! - **proxy** (`--proxy-token-file`, one token per line, optionally
//!   `TOKEN NODE_ID`): only the config stream, and the circuit reports on
//!   it. A token pinned to a node id opens the stream for that node id
//!   only, so one proxy's secret cannot speak (or report circuits) for
//!   another.
//!
//! With no token at all the API is open (every caller is an operator);
//! [`crate::start`] allows that only on a loopback address unless told
//! `--insecure`.
//!
//! Tokens are compared as SHA-256 digests in constant time
//! ([`router_proto::token::Secret`], as the proxy's admin token is): every
//! configured token is compared, each in constant time over 32 bytes, so
//! neither the content nor the length of a token leaks through timing. Only
//! the digests are kept in memory after start-up, and nothing here logs a
//! token.

use std::sync::Arc;

use router_proto::token::{Secret, TokenError};
use tonic::{Request, Status};

/// What a caller may do, as its token says. The interceptors put it in
/// the request's extensions for the services to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The operator token (or an open API): everything.
    Operator,
    /// A proxy token: the config stream only.
    Proxy {
        /// The node id the token is pinned to, if any.
        node: Option<String>,
    },
}

/// One line of `--proxy-token-file`.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyToken {
    /// The secret.
    pub token: String,
    /// The only node id it may open a stream for (`None`: any).
    pub node: Option<String>,
}

impl std::fmt::Debug for ProxyToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyToken")
            .field("token", &"<redacted>")
            .field("node", &self.node)
            .finish()
    }
}

/// Why a token file was refused. Never quotes a token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenFileError {
    /// No token in the file.
    #[error("no token in the file")]
    Empty,
    /// A line is not `TOKEN` or `TOKEN NODE_ID`.
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Parses `--proxy-token-file`: one `TOKEN` or `TOKEN NODE_ID` per line;
/// blank lines and lines starting with `#` are skipped.
pub fn parse_proxy_tokens(text: &str) -> Result<Vec<ProxyToken>, TokenFileError> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(token), node) = (fields.next(), fields.next()) else {
            continue;
        };
        if fields.next().is_some() {
            return Err(TokenFileError::Line {
                line: i + 1,
                reason: "expected TOKEN or TOKEN NODE_ID",
            });
        }
        tokens.push(ProxyToken {
            token: token.to_string(),
            node: node.map(str::to_string),
        });
    }
    if tokens.is_empty() {
        return Err(TokenFileError::Empty);
    }
    Ok(tokens)
}

/// The configured tokens, as [`Secret`]s (digests compared in constant
/// time, as the proxy compares its admin token).
#[derive(Default)]
pub struct Tokens {
    operator: Option<Secret>,
    proxies: Vec<(Secret, Option<String>)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("operator", &self.operator.is_some())
            .field("proxies", &self.proxies.len())
            .finish()
    }
}

impl Tokens {
    /// The operator token and the proxy tokens; an error for a token that
    /// cannot be one (empty, not visible ASCII).
    pub fn new(operator: Option<&str>, proxies: &[ProxyToken]) -> Result<Self, TokenError> {
        Ok(Self {
            operator: operator
                .map(|t| Secret::new(t, "the operator token (--token-file)"))
                .transpose()?,
            proxies: proxies
                .iter()
                .map(|p| {
                    Secret::new(&p.token, "a proxy token (--proxy-token-file)")
                        .map(|s| (s, p.node.clone()))
                })
                .collect::<Result<_, _>>()?,
        })
    }

    /// No token at all: every caller is an operator.
    pub fn is_open(&self) -> bool {
        self.operator.is_none() && self.proxies.is_empty()
    }

    /// The role `presented` (the bearer token, if any) grants; `None` when
    /// it matches no token. Every configured token is compared, each in
    /// constant time.
    pub fn role(&self, presented: Option<&[u8]>) -> Option<Role> {
        if self.is_open() {
            return Some(Role::Operator);
        }
        let given = presented.unwrap_or_default();
        let operator = self.operator.as_ref().is_some_and(|s| s.matches(given));
        let mut proxy = None;
        for (secret, node) in &self.proxies {
            if secret.matches(given) {
                proxy = Some(node);
            }
        }
        match (operator, proxy) {
            (true, _) => Some(Role::Operator),
            (false, Some(node)) => Some(Role::Proxy { node: node.clone() }),
            (false, None) => None,
        }
    }
}

/// The bearer credential of a call, parsed as everywhere else
/// ([`router_proto::token::bearer`]: any case of the scheme, trimmed).
fn bearer(req: &Request<()>) -> Option<&[u8]> {
    req.metadata()
        .get("authorization")
        .and_then(|v| router_proto::token::bearer(v.as_bytes()))
}

/// The interceptor in front of the `ProxyConfig` service: any known token
/// (or an open API); the [`Role`] goes into the request's extensions, for
/// the stream to check a pinned node id.
pub fn stream_check(
    tokens: Arc<Tokens>,
) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut req: Request<()>| {
        let role = tokens
            .role(bearer(&req))
            .ok_or_else(|| Status::unauthenticated("missing or invalid bearer token"))?;
        req.extensions_mut().insert(role);
        Ok(req)
    }
}

/// The interceptor in front of the `Admin` service: the operator token
/// only (or an open API); a proxy token is `PERMISSION_DENIED`.
pub fn admin_check(
    tokens: Arc<Tokens>,
) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut req: Request<()>| match tokens.role(bearer(&req)) {
        Some(Role::Operator) => {
            req.extensions_mut().insert(Role::Operator);
            Ok(req)
        }
        Some(Role::Proxy { .. }) => Err(Status::permission_denied(
            "a proxy token may only open the config stream; admin calls need the operator token",
        )),
        None => Err(Status::unauthenticated("missing or invalid bearer token")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        let t = Tokens::new(
            Some("operator-secret"),
            &[
                ProxyToken {
                    token: "fleet-secret".into(),
                    node: None,
                },
                ProxyToken {
                    token: "p1-secret".into(),
                    node: Some("p1".into()),
                },
            ],
        );
        t.unwrap()
    }

    #[test]
    fn each_token_grants_its_role_and_nothing_else_matches() {
        let t = tokens();
        assert_eq!(t.role(Some(b"operator-secret")), Some(Role::Operator));
        assert_eq!(
            t.role(Some(b"fleet-secret")),
            Some(Role::Proxy { node: None })
        );
        assert_eq!(
            t.role(Some(b"p1-secret")),
            Some(Role::Proxy {
                node: Some("p1".into())
            })
        );
        // Prefixes, extensions, other cases and nothing at all: refused.
        for wrong in [
            Some("operator-secre"),
            Some("operator-secret "),
            Some("operator-secretx"),
            Some("OPERATOR-SECRET"),
            Some(""),
            None,
        ] {
            assert_eq!(t.role(wrong.map(str::as_bytes)), None, "{wrong:?}");
        }
        // No token configured: open.
        assert_eq!(Tokens::default().role(None), Some(Role::Operator));
        // Only digests are kept, and Debug shows none of them.
        let shown = format!("{t:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn the_proxy_token_file_is_one_token_per_line_with_an_optional_node() {
        let parsed = parse_proxy_tokens("# fleet\nshared\n\n  p1-secret   p1  \n# done\n").unwrap();
        assert_eq!(
            parsed,
            vec![
                ProxyToken {
                    token: "shared".into(),
                    node: None
                },
                ProxyToken {
                    token: "p1-secret".into(),
                    node: Some("p1".into())
                },
            ]
        );
        assert_eq!(parse_proxy_tokens("# none\n\n"), Err(TokenFileError::Empty));
        let err = parse_proxy_tokens("ok\nsecret node extra\n").unwrap_err();
        assert_eq!(
            err,
            TokenFileError::Line {
                line: 2,
                reason: "expected TOKEN or TOKEN NODE_ID"
            }
        );
        // The error never quotes the secret.
        assert!(!err.to_string().contains("secret"));
        assert!(!format!("{:?}", parsed[1]).contains("p1-secret"));
    }
}

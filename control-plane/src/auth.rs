//! Who may call what: operator, approver, viewer and proxy tokens.
//!
//! Four roles, each with its own bearer tokens:
//!
//! - **operator** (`--token-file`): every call, admin and stream. Also
//!   accepted on the config stream, so proxies deployed with the operator
//!   token keep working (separate secrets are recommended: a leaked proxy
//!   token then cannot change policy). The file holds one token, or one
//!   per line as `TOKEN` or `TOKEN NAME` ([`parse_operator_tokens`]): a
//!   name says whose token it is, and every approval or drop of a parked
//!   task records the caller's role and token name;
//! - **approver** (`--approver-token-file`, the same line format): signs in
//!   to the console ([`crate::console`]), reads everything there but
//!   secrets, and approves or drops parked tasks; nothing else;
//! - **viewer** (`--viewer-token-file`, the same line format): signs in to
//!   the console and reads; changes nothing;
//! - **proxy** (`--proxy-token-file`, one token per line, optionally
//!   `TOKEN NODE_ID`): only the config stream, and the circuit reports on
//!   it. A token pinned to a node id opens the stream for that node id
//!   only, so one proxy's secret cannot speak (or report circuits) for
//!   another.
//!
//! Approver and viewer tokens are for people in the console: the gRPC
//! `Admin` API refuses them (`PERMISSION_DENIED`), and so does the config
//! stream. In the console the roles are ordered viewer < approver <
//! operator ([`Role::console_rank`]); a proxy token never signs in there.
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
    /// An operator token: everything.
    Operator {
        /// The name the token carries (`TOKEN NAME` in `--token-file`).
        name: Option<String>,
    },
    /// No token is configured: every caller may do everything.
    Open,
    /// A proxy token: the config stream only.
    Proxy {
        /// The node id the token is pinned to, if any.
        node: Option<String>,
    },
    /// An approver token: the console, reading, and approving or dropping
    /// parked tasks.
    Approver {
        /// The name the token carries (`TOKEN NAME` in `--approver-token-file`).
        name: Option<String>,
    },
    /// A viewer token: the console, reading only.
    Viewer {
        /// The name the token carries (`TOKEN NAME` in `--viewer-token-file`).
        name: Option<String>,
    },
}

impl Role {
    /// The role's name in records and logs: `operator`, `open`, `proxy`,
    /// `approver`, `viewer`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Operator { .. } => "operator",
            Self::Open => "open",
            Self::Proxy { .. } => "proxy",
            Self::Approver { .. } => "approver",
            Self::Viewer { .. } => "viewer",
        }
    }

    /// The role's rank in the console: viewer 1 < approver 2 < operator 3
    /// (an open API's caller is an operator); `None` for a proxy token,
    /// which never signs in there.
    pub fn console_rank(&self) -> Option<u8> {
        match self {
            Self::Viewer { .. } => Some(1),
            Self::Approver { .. } => Some(2),
            Self::Operator { .. } | Self::Open => Some(3),
            Self::Proxy { .. } => None,
        }
    }

    /// Whether the role may approve and drop parked tasks in the console
    /// (approver and operator).
    pub fn may_approve(&self) -> bool {
        self.console_rank() >= Some(2)
    }

    /// Whether the role may change the policy, backends and circuits in the
    /// console (operator).
    pub fn may_operate(&self) -> bool {
        self.console_rank() >= Some(3)
    }

    /// Whether the role may make admin calls.
    pub fn is_admin(&self) -> bool {
        matches!(self, Self::Operator { .. } | Self::Open)
    }

    /// The name the caller's token carries, if any.
    pub fn token_name(&self) -> Option<&str> {
        match self {
            Self::Operator { name } | Self::Approver { name } | Self::Viewer { name } => {
                name.as_deref()
            }
            Self::Open | Self::Proxy { .. } => None,
        }
    }
}

/// One line of `--token-file`.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorToken {
    /// The secret.
    pub token: String,
    /// Whose it is (`None`: an unnamed token, as a one-token file has).
    pub name: Option<String>,
}

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorToken")
            .field("token", &"<redacted>")
            .field("name", &self.name)
            .finish()
    }
}

/// Whether `name` may name a token: 1-63 letters, digits, `.`, `_`, `-`
/// or `@`.
fn valid_token_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'))
}

/// A token file's line: its 1-based number, the token, and the second
/// field (a name or a node id) if there is one.
type TokenLine<'a> = (usize, &'a str, Option<&'a str>);

/// The `TOKEN [SECOND]` lines of a token file (blank lines and lines
/// starting with `#` skipped), each with its 1-based line number; a line
/// with more is refused with `expected`. An empty file is refused.
fn token_lines<'a>(
    text: &'a str,
    expected: &'static str,
) -> Result<Vec<TokenLine<'a>>, TokenFileError> {
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(token), second) = (fields.next(), fields.next()) else {
            continue;
        };
        if fields.next().is_some() {
            return Err(TokenFileError::Line {
                line: i + 1,
                reason: expected,
            });
        }
        lines.push((i + 1, token, second));
    }
    if lines.is_empty() {
        return Err(TokenFileError::Empty);
    }
    Ok(lines)
}

/// Parses `--token-file`: one `TOKEN` or `TOKEN NAME` per line; blank
/// lines and lines starting with `#` are skipped. A file holding one bare
/// token (every earlier token file) is one unnamed token.
pub fn parse_operator_tokens(text: &str) -> Result<Vec<OperatorToken>, TokenFileError> {
    let mut tokens = Vec::new();
    for (line, token, name) in token_lines(text, "expected TOKEN or TOKEN NAME")? {
        if name.is_some_and(|n| !valid_token_name(n)) {
            return Err(TokenFileError::Line {
                line,
                reason: "a token's NAME is 1-63 letters, digits, '.', '_', '-' or '@'",
            });
        }
        tokens.push(OperatorToken {
            token: token.to_string(),
            name: name.map(str::to_string),
        });
    }
    Ok(tokens)
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
    /// A line is not `TOKEN` and one name (`NODE_ID`, `NAME`).
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
    Ok(token_lines(text, "expected TOKEN or TOKEN NODE_ID")?
        .into_iter()
        .map(|(_, token, node)| ProxyToken {
            token: token.to_string(),
            node: node.map(str::to_string),
        })
        .collect())
}

/// The configured tokens, as [`Secret`]s (digests compared in constant
/// time, as the proxy compares its admin token).
#[derive(Default)]
pub struct Tokens {
    operators: Vec<(Secret, Option<String>)>,
    proxies: Vec<(Secret, Option<String>)>,
    approvers: Vec<(Secret, Option<String>)>,
    viewers: Vec<(Secret, Option<String>)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("operators", &self.operators.len())
            .field("proxies", &self.proxies.len())
            .field("approvers", &self.approvers.len())
            .field("viewers", &self.viewers.len())
            .finish()
    }
}

fn named_secrets(
    tokens: &[OperatorToken],
    what: &'static str,
) -> Result<Vec<(Secret, Option<String>)>, TokenError> {
    tokens
        .iter()
        .map(|o| Secret::new(&o.token, what).map(|s| (s, o.name.clone())))
        .collect()
}

impl Tokens {
    /// The operator tokens and the proxy tokens; an error for a token that
    /// cannot be one (empty, not visible ASCII).
    pub fn new(operators: &[OperatorToken], proxies: &[ProxyToken]) -> Result<Self, TokenError> {
        Ok(Self {
            operators: named_secrets(operators, "an operator token (--token-file)")?,
            proxies: proxies
                .iter()
                .map(|p| {
                    Secret::new(&p.token, "a proxy token (--proxy-token-file)")
                        .map(|s| (s, p.node.clone()))
                })
                .collect::<Result<_, _>>()?,
            approvers: Vec::new(),
            viewers: Vec::new(),
        })
    }

    /// These tokens, and the console's approver and viewer tokens
    /// (`--approver-token-file`, `--viewer-token-file`).
    pub fn with_console_roles(
        mut self,
        approvers: &[OperatorToken],
        viewers: &[OperatorToken],
    ) -> Result<Self, TokenError> {
        self.approvers = named_secrets(approvers, "an approver token (--approver-token-file)")?;
        self.viewers = named_secrets(viewers, "a viewer token (--viewer-token-file)")?;
        Ok(self)
    }

    /// No token at all: every caller is an operator.
    pub fn is_open(&self) -> bool {
        self.operators.is_empty()
            && self.proxies.is_empty()
            && self.approvers.is_empty()
            && self.viewers.is_empty()
    }

    /// The role `presented` (the bearer token, if any) grants; `None` when
    /// it matches no token. Every configured token is compared, each in
    /// constant time. A token in several files takes the highest role:
    /// operator, approver, viewer, proxy.
    pub fn role(&self, presented: Option<&[u8]>) -> Option<Role> {
        if self.is_open() {
            return Some(Role::Open);
        }
        let given = presented.unwrap_or_default();
        let matching = |list: &[(Secret, Option<String>)]| {
            let mut found = None;
            for (secret, second) in list {
                if secret.matches(given) {
                    found = Some(second.clone());
                }
            }
            found
        };
        let operator = matching(&self.operators);
        let approver = matching(&self.approvers);
        let viewer = matching(&self.viewers);
        let proxy = matching(&self.proxies);
        if let Some(name) = operator {
            Some(Role::Operator { name })
        } else if let Some(name) = approver {
            Some(Role::Approver { name })
        } else if let Some(name) = viewer {
            Some(Role::Viewer { name })
        } else {
            proxy.map(|node| Role::Proxy { node })
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
        if matches!(role, Role::Approver { .. } | Role::Viewer { .. }) {
            return Err(Status::permission_denied(
                "approver and viewer tokens sign in to the console only; proxies need a proxy token",
            ));
        }
        req.extensions_mut().insert(role);
        Ok(req)
    }
}

/// The interceptor in front of the `Admin` service: the operator token
/// only (or an open API); a proxy token is `PERMISSION_DENIED`.
pub fn admin_check(
    tokens: Arc<Tokens>,
) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut req: Request<()>| {
        match tokens.role(bearer(&req)) {
        Some(role) if role.is_admin() => {
            req.extensions_mut().insert(role);
            Ok(req)
        }
        Some(Role::Approver { .. } | Role::Viewer { .. }) => Err(Status::permission_denied(
            "approver and viewer tokens sign in to the console only; admin calls need the operator token",
        )),
        Some(_) => Err(Status::permission_denied(
            "a proxy token may only open the config stream; admin calls need the operator token",
        )),
        None => Err(Status::unauthenticated("missing or invalid bearer token")),
    }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        let t = Tokens::new(
            &[OperatorToken {
                token: "operator-secret".into(),
                name: None,
            }],
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
        assert_eq!(
            t.role(Some(b"operator-secret")),
            Some(Role::Operator { name: None })
        );
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
        assert_eq!(Tokens::default().role(None), Some(Role::Open));
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

    /// Issue 28, item 14: an operator's token carries a name, which the
    /// role says (so an approval can record who made it); a one-token
    /// file, as every earlier one, is still one unnamed operator token.
    #[test]
    fn operator_tokens_carry_names_and_old_token_files_still_read() {
        let parsed =
            parse_operator_tokens("# ops\nalice-secret alice\n\nbob-secret bob@example.org\n")
                .unwrap();
        assert_eq!(parsed[0].name.as_deref(), Some("alice"));
        assert_eq!(parsed[1].name.as_deref(), Some("bob@example.org"));
        let t = Tokens::new(&parsed, &[]).unwrap();
        let alice = t.role(Some(b"alice-secret")).unwrap();
        assert_eq!(alice.as_str(), "operator");
        assert_eq!(alice.token_name(), Some("alice"));
        assert!(alice.is_admin());
        assert_eq!(
            t.role(Some(b"bob-secret")).unwrap().token_name(),
            Some("bob@example.org")
        );
        assert_eq!(t.role(Some(b"alice-secre")), None);
        // An earlier file: the token alone, with its newline.
        let old = parse_operator_tokens("only-secret\n").unwrap();
        assert_eq!(
            old,
            vec![OperatorToken {
                token: "only-secret".into(),
                name: None
            }]
        );
        let t = Tokens::new(&old, &[]).unwrap();
        assert_eq!(
            t.role(Some(b"only-secret")),
            Some(Role::Operator { name: None })
        );
        // Refused lines never quote the secret.
        for bad in ["s name extra\n", "s na/me\n"] {
            let err = parse_operator_tokens(bad).unwrap_err();
            assert!(matches!(err, TokenFileError::Line { line: 1, .. }), "{err}");
        }
        assert_eq!(
            parse_operator_tokens("# none\n"),
            Err(TokenFileError::Empty)
        );
        assert!(!format!("{:?}", parsed[0]).contains("alice-secret"));
        // Without any token the API is open, a role of its own.
        assert_eq!(
            Tokens::default().role(None).map(|r| r.as_str()),
            Some("open")
        );
    }

    /// Issue 33: approver and viewer tokens sign in to the console only;
    /// roles are ordered viewer < approver < operator, and a token in
    /// several files takes the highest.
    #[test]
    fn approver_and_viewer_tokens_are_console_roles_below_the_operator() {
        let named = |t: &str, n: &str| OperatorToken {
            token: t.into(),
            name: Some(n.into()),
        };
        let t = Tokens::new(
            &[named("op-secret", "olga")],
            &[ProxyToken {
                token: "proxy-secret".into(),
                node: None,
            }],
        )
        .unwrap()
        .with_console_roles(
            &[named("ap-secret", "abe"), named("both-secret", "bo")],
            &[named("view-secret", "vera"), named("both-secret", "bo")],
        )
        .unwrap();
        let approver = t.role(Some(b"ap-secret")).unwrap();
        assert_eq!(approver.as_str(), "approver");
        assert_eq!(approver.token_name(), Some("abe"));
        assert!(approver.may_approve() && !approver.may_operate() && !approver.is_admin());
        let viewer = t.role(Some(b"view-secret")).unwrap();
        assert_eq!(viewer.as_str(), "viewer");
        assert!(!viewer.may_approve() && !viewer.is_admin());
        assert_eq!(t.role(Some(b"both-secret")).unwrap().as_str(), "approver");
        let operator = t.role(Some(b"op-secret")).unwrap();
        assert!(operator.may_operate() && operator.may_approve());
        assert!(viewer.console_rank() < approver.console_rank());
        assert!(approver.console_rank() < operator.console_rank());
        assert_eq!(Role::Open.console_rank(), operator.console_rank());
        assert_eq!(t.role(Some(b"proxy-secret")).unwrap().console_rank(), None);
        assert_eq!(t.role(Some(b"view-secre")), None);
        // Neither opens the gRPC API nor the config stream.
        let tokens = Arc::new(t);
        let admin = admin_check(Arc::clone(&tokens));
        let stream = stream_check(tokens);
        for secret in ["ap-secret", "view-secret"] {
            let call = || {
                let mut r = Request::new(());
                r.metadata_mut()
                    .insert("authorization", format!("Bearer {secret}").parse().unwrap());
                r
            };
            assert_eq!(
                admin(call()).unwrap_err().code(),
                tonic::Code::PermissionDenied
            );
            assert_eq!(
                stream(call()).unwrap_err().code(),
                tonic::Code::PermissionDenied
            );
        }
    }
}

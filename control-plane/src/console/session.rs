//! Sign-in, cookie sessions and CSRF tokens.
//!
//! A person signs in with a token (or a one-time link the control plane
//! minted, [`Sessions::mint_link`]); the console then holds a session:
//!
//! - its id is 32 random bytes (`ring`'s system generator), sent once as
//!   the `router_console` cookie (`HttpOnly; SameSite=Strict; Path=/`,
//!   `Secure` under TLS, `Max-Age` the session's lifetime) and kept here
//!   only as its SHA-256 digest, so the table holds nothing a reader of
//!   memory could present;
//! - it expires after the TTL (`--console-session-ttl`, 8 h by default)
//!   whatever is done with it; signing out ends it at once;
//! - the table is bounded (`--console-max-sessions`): a new session past
//!   the bound first drops the expired ones, then the one closest to its
//!   expiry;
//! - each session has its own CSRF token (32 random bytes), put in a
//!   hidden field of every form and compared in constant time (`subtle`)
//!   on every POST ([`Sessions::check_csrf`]).
//!
//! The sign-in form itself is protected by a double-submit token: the
//! page sets a short-lived `router_console_signin` cookie and puts the same
//! value in the form; a POST whose two values differ is refused.
//!
//! One-time links: `/signin?once=ID`, single use, valid 5 minutes, at most
//! [`MAX_LINKS`] outstanding (the oldest goes first).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use crate::auth::Role;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "router_console";
/// The sign-in form's double-submit cookie.
pub(crate) const SIGNIN_COOKIE: &str = "router_console_signin";
/// How long a one-time sign-in link is valid.
pub(crate) const LINK_TTL: Duration = Duration::from_secs(300);
/// One-time links outstanding at most.
pub(crate) const MAX_LINKS: usize = 16;

/// A signed-in person.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// What their token (or link) grants.
    pub(crate) role: Role,
    /// The CSRF token of their forms.
    pub(crate) csrf: String,
    /// When it ends.
    pub(crate) expires: Instant,
}

impl Session {
    /// Who they are, as pages show it: the token's name, else the role.
    pub(crate) fn who(&self) -> String {
        match self.role.token_name() {
            Some(name) => format!("{name} ({})", self.role.as_str()),
            None => self.role.as_str().to_string(),
        }
    }
}

struct Link {
    role: Role,
    expires: Instant,
    /// Minted order (the oldest goes first past the bound).
    seq: u64,
}

#[derive(Default)]
struct Table {
    sessions: HashMap<[u8; 32], Session>,
    links: HashMap<[u8; 32], Link>,
    minted: u64,
}

/// The console's sessions and one-time links.
pub(crate) struct Sessions {
    table: Mutex<Table>,
    ttl: Duration,
    max: usize,
    rng: SystemRandom,
}

/// Why a session could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    /// The system's random generator failed.
    #[error("no randomness for a session id")]
    Random,
}

fn digest(id: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// A table of at most `max` sessions, each living `ttl`.
    pub(crate) fn new(ttl: Duration, max: usize) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            ttl,
            max: max.max(1),
            rng: SystemRandom::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// 32 random bytes, in hex.
    pub(crate) fn random(&self) -> Result<String, SessionError> {
        let mut b = [0u8; 32];
        self.rng.fill(&mut b).map_err(|_| SessionError::Random)?;
        Ok(hex(&b))
    }

    /// The session's lifetime.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Starts a session for `role`: its id (for the cookie) and the session.
    pub(crate) fn create(&self, role: Role) -> Result<(String, Session), SessionError> {
        let id = self.random()?;
        let session = Session {
            role,
            csrf: self.random()?,
            expires: Instant::now() + self.ttl,
        };
        let mut t = self.lock();
        let now = Instant::now();
        if t.sessions.len() >= self.max {
            t.sessions.retain(|_, s| s.expires > now);
        }
        while t.sessions.len() >= self.max {
            let Some(soonest) = t
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| *k)
            else {
                break;
            };
            t.sessions.remove(&soonest);
        }
        t.sessions.insert(digest(&id), session.clone());
        Ok((id, session))
    }

    /// The live session with cookie value `id`, if any (an expired one is
    /// dropped).
    pub(crate) fn get(&self, id: &str) -> Option<Session> {
        let key = digest(id);
        let mut t = self.lock();
        match t.sessions.get(&key) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                t.sessions.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the session with cookie value `id`.
    pub(crate) fn end(&self, id: &str) {
        self.lock().sessions.remove(&digest(id));
    }

    /// Sessions held now (expired ones included until they are dropped).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Whether `given` is `session`'s CSRF token (constant time).
    pub(crate) fn check_csrf(session: &Session, given: Option<&str>) -> bool {
        let Some(given) = given else { return false };
        let want = session.csrf.as_bytes();
        // Lengths are public (64 hex digits); the content is compared in
        // constant time.
        given.len() == want.len() && bool::from(given.as_bytes().ct_eq(want))
    }

    /// A one-time sign-in id for `role`, valid [`LINK_TTL`], used once.
    pub(crate) fn mint_link(&self, role: Role) -> Result<String, SessionError> {
        let id = self.random()?;
        let mut t = self.lock();
        let now = Instant::now();
        t.links.retain(|_, l| l.expires > now);
        while t.links.len() >= MAX_LINKS {
            let Some(oldest) = t.links.iter().min_by_key(|(_, l)| l.seq).map(|(k, _)| *k) else {
                break;
            };
            t.links.remove(&oldest);
        }
        t.minted += 1;
        let seq = t.minted;
        t.links.insert(
            digest(&id),
            Link {
                role,
                expires: now + LINK_TTL,
                seq,
            },
        );
        Ok(id)
    }

    /// Takes the one-time link `id`: its role if it is live (it is gone
    /// after this call either way).
    pub(crate) fn take_link(&self, id: &str) -> Option<Role> {
        let link = self.lock().links.remove(&digest(id))?;
        (link.expires > Instant::now()).then_some(link.role)
    }
}

/// Whether two double-submit values match (constant time).
pub(crate) fn same_secret(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) if !a.is_empty() => {
            a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
        }
        _ => false,
    }
}

/// The `Set-Cookie` value of session `id`, living `ttl`.
pub(crate) fn session_cookie(id: &str, ttl: Duration, secure: bool) -> String {
    cookie(COOKIE, id, ttl.as_secs(), secure)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, Path=/, Secure under
/// TLS, `Max-Age` seconds (0: remove it).
pub(crate) fn cookie(name: &str, value: &str, max_age_s: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age_s}{secure}")
}

/// The value of cookie `name` in a `Cookie` header.
pub(crate) fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn viewer() -> Role {
        Role::Viewer {
            name: Some("vera".into()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_lives_its_ttl_and_ends_when_signed_out() {
        let s = Sessions::new(Duration::from_secs(60), 10);
        let (id, session) = s.create(viewer()).unwrap();
        assert_eq!(id.len(), 64);
        assert_ne!(id, session.csrf);
        assert_eq!(s.get(&id).map(|x| x.role), Some(viewer()));
        assert!(s.get("not-an-id").is_none());
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(s.get(&id).is_none(), "expired");
        assert_eq!(s.len(), 0, "dropped when seen expired");
        let (id, _) = s.create(viewer()).unwrap();
        s.end(&id);
        assert!(s.get(&id).is_none(), "signed out");
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_drops_the_session_closest_to_expiry() {
        let s = Sessions::new(Duration::from_secs(60), 3);
        let (first, _) = s.create(viewer()).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let others: Vec<String> = (0..3).map(|_| s.create(viewer()).unwrap().0).collect();
        assert_eq!(s.len(), 3);
        assert!(s.get(&first).is_none(), "the oldest went");
        assert!(others.iter().all(|id| s.get(id).is_some()));
    }

    #[tokio::test(start_paused = true)]
    async fn csrf_tokens_must_match_exactly() {
        let s = Sessions::new(Duration::from_secs(60), 3);
        let (_, session) = s.create(viewer()).unwrap();
        assert!(Sessions::check_csrf(&session, Some(&session.csrf)));
        assert!(!Sessions::check_csrf(&session, None));
        assert!(!Sessions::check_csrf(&session, Some("")));
        assert!(!Sessions::check_csrf(&session, Some(&session.csrf[1..])));
        let mut wrong = session.csrf.clone();
        wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
        assert!(!Sessions::check_csrf(&session, Some(&wrong)));
        assert!(same_secret(Some("ab"), Some("ab")));
        assert!(!same_secret(Some(""), Some("")));
        assert!(!same_secret(Some("ab"), Some("ac")));
        assert!(!same_secret(None, Some("ab")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_link_signs_in_once_within_five_minutes() {
        let s = Sessions::new(Duration::from_secs(60), 3);
        let id = s.mint_link(Role::Open).unwrap();
        assert_eq!(s.take_link(&id), Some(Role::Open));
        assert_eq!(s.take_link(&id), None, "single use");
        let late = s.mint_link(Role::Open).unwrap();
        tokio::time::advance(LINK_TTL + Duration::from_secs(1)).await;
        assert_eq!(s.take_link(&late), None, "expired");
        let ids: Vec<String> = (0..=MAX_LINKS)
            .map(|_| s.mint_link(Role::Open).unwrap())
            .collect();
        assert_eq!(s.take_link(&ids[0]), None, "the oldest went past the bound");
        assert_eq!(s.take_link(&ids[MAX_LINKS]), Some(Role::Open));
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_under_tls() {
        let c = session_cookie("abc", Duration::from_secs(3600), false);
        assert_eq!(
            c,
            "router_console=abc; HttpOnly; SameSite=Strict; Path=/; Max-Age=3600"
        );
        let c = session_cookie("abc", Duration::from_secs(3600), true);
        assert!(c.ends_with("; Secure"), "{c}");
        assert_eq!(
            cookie_value("a=1; router_console=xyz; b=2", COOKIE),
            Some("xyz")
        );
        assert_eq!(cookie_value("router_console_signin=q", COOKIE), None);
    }
}

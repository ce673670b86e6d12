//! The shared store on Redis (or Valkey), through the `redis` crate's
//! `ConnectionManager`: one multiplexed connection per proxy, reconnected
//! on its own after a failure.
//!
//! - **claim**: `SET <prefix>idem:<key> <entry> NX GET PX <ttl>`, one round
//!   trip: either the key was free and is now ours (`nil`), or the entry
//!   already there comes back (Redis ≥ 7.0, Valkey ≥ 7.2).
//! - **settle**: a short script that replaces (or deletes) the entry only
//!   while it is still this owner's and in flight, so a leader whose claim
//!   expired never overwrites a later request's state.
//! - **get**: `GET`, for joiners polling with backoff.
//!
//! Every call is bounded by [`OP_TIMEOUT`]. The first connection is made
//! in the background, so a proxy starts while the store is down; until it
//! is up every call fails fast with [`StoreError::Unavailable`].
//!
//! Each worker thread (a single-threaded runtime serving connections)
//! then opens a connection of its own, so that a keyed request's two
//! round trips are driven by the thread serving it: through the shared
//! connection, each would cross to the thread that owns its socket and
//! back (two thread wake-ups per call, which a loaded machine turns into
//! a long tail). A worker whose own connection cannot be made uses the
//! shared one and tries again half a second later.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::idempotency::record::{self, Entry, Fingerprint, KeyState, Owner};
use crate::idempotency::{ClaimResult, IdempotencyStore};
use crate::StoreError;

/// The longest any one store call may take.
pub const OP_TIMEOUT: Duration = Duration::from_millis(500);

/// Replaces (ARGV[2] non-empty, TTL ARGV[3] ms) or deletes the entry at
/// KEYS[1] only if it is in flight and owned by ARGV[1]; 1 if it did.
const SETTLE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 4, 4) ~= 'F' or string.sub(v, 5, 36) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
";

/// GCRA (`router_policy::tenant::Gcra`) on KEYS[1] with the store's
/// clock, in microseconds: ARGV[1] the interval, ARGV[2] the tolerance.
/// 0 when the request passes (the time advanced), else the wait.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allowed_from = tat - tonumber(ARGV[2])
if now < allowed_from then return allowed_from - now end
local new = tat + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.floor((new - now) / 1000) + 1000)
return 0
";

/// Reserves ARGV[1] on the counters KEYS[1] (day) and KEYS[2] (month)
/// when both stay within their limits ARGV[2], ARGV[3] (-1: none), with
/// TTLs ARGV[4], ARGV[5] ms, and counts it in flight on KEYS[3]: `{1}`
/// when reserved, else `{0, left, which}` (1 the day, 2 the month).
const RESERVE: &str = r"
local d = tonumber(redis.call('GET', KEYS[1]) or '0')
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
local a = tonumber(ARGV[1])
local dl = tonumber(ARGV[2])
local ml = tonumber(ARGV[3])
if dl >= 0 and d + a > dl then return {0, dl - d, 1} end
if ml >= 0 and m + a > ml then return {0, ml - m, 2} end
redis.call('INCRBY', KEYS[1], a)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('INCRBY', KEYS[2], a)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('INCRBY', KEYS[3], a)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {1}
";

/// A concurrency slot: drops the expired members of the set KEYS[1]
/// (scores are expiry times, ms, Redis's clock), then adds ARGV[1] with
/// expiry now + ARGV[3] when fewer than ARGV[2] are left. 1 if taken.
const TAKE_SLOT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + 1000)
return 1
";

/// Tells stores apart in the per-thread connection lists.
static NEXT_STORE: AtomicUsize = AtomicUsize::new(1);

/// A worker thread's own connection to a store, or when to try again.
enum ThreadConn {
    Ready(ConnectionManager),
    RetryAt(Instant),
}

thread_local! {
    /// Per store id: this thread's connection.
    static THREAD_CONNS: RefCell<Vec<(usize, ThreadConn)>> = const { RefCell::new(Vec::new()) };
}

/// The Redis store.
pub struct RedisStore {
    id: usize,
    client: redis::Client,
    config: ConnectionManagerConfig,
    conn: Arc<OnceLock<ConnectionManager>>,
    prefix: String,
    /// What follows the prefix in the keys of [`IdempotencyStore`] calls:
    /// `idem:` for `Idempotency-Key`s, `cache:` for the response cache
    /// ([`RedisStore::namespaced`]).
    namespace: &'static str,
    settle: redis::Script,
    gcra: redis::Script,
    reserve: redis::Script,
    take_slot: redis::Script,
}

fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Duration::from_millis(250))
        .set_response_timeout(OP_TIMEOUT)
        .set_number_of_retries(2)
        .set_max_delay(200)
}

impl RedisStore {
    /// Connects to `client`'s server in the background (retrying every
    /// half second until it answers) and returns at once.
    pub fn connect(client: redis::Client, prefix: String) -> Self {
        let conn = Arc::new(OnceLock::new());
        let slot = Arc::clone(&conn);
        let background = client.clone();
        tokio::spawn(async move {
            let client = background;
            let config = manager_config();
            let mut logged = false;
            loop {
                match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
                    Ok(m) => {
                        let _ = slot.set(m);
                        if logged {
                            tracing::info!("shared store connected");
                        }
                        return;
                    }
                    Err(e) => {
                        if !logged {
                            tracing::warn!(error = %e, "shared store: cannot connect yet; retrying every 0.5 s");
                            logged = true;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        Self {
            id: NEXT_STORE.fetch_add(1, Ordering::Relaxed),
            client,
            config: manager_config(),
            conn,
            prefix,
            namespace: "idem:",
            settle: redis::Script::new(SETTLE),
            gcra: redis::Script::new(GCRA),
            reserve: redis::Script::new(RESERVE),
            take_slot: redis::Script::new(TAKE_SLOT),
        }
    }

    /// The prefix of every key of this store (parked tasks share it).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The same store and connections, its [`IdempotencyStore`] keys
    /// under `namespace` instead of `idem:` (the response cache's
    /// entries: a client's `Idempotency-Key` can never name one).
    pub fn namespaced(&self, namespace: &'static str) -> Self {
        Self {
            id: self.id,
            client: self.client.clone(),
            config: self.config.clone(),
            conn: Arc::clone(&self.conn),
            prefix: self.prefix.clone(),
            namespace,
            settle: redis::Script::new(SETTLE),
            gcra: redis::Script::new(GCRA),
            reserve: redis::Script::new(RESERVE),
            take_slot: redis::Script::new(TAKE_SLOT),
        }
    }

    fn key(&self, key: &str) -> String {
        format!("{}{}{key}", self.prefix, self.namespace)
    }

    /// The connection to use: this worker thread's own (made on first
    /// use), else the shared one.
    pub async fn conn(&self) -> Result<ConnectionManager, StoreError> {
        let shared = self
            .conn
            .get()
            .cloned()
            .ok_or_else(|| StoreError::Unavailable("not connected yet".into()))?;
        let on_worker = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if !on_worker {
            return Ok(shared);
        }
        let now = Instant::now();
        let mine = THREAD_CONNS.with(|c| {
            c.borrow()
                .iter()
                .find(|(id, _)| *id == self.id)
                .map(|(_, conn)| match conn {
                    ThreadConn::Ready(m) => Some(Ok(m.clone())),
                    ThreadConn::RetryAt(at) if *at > now => Some(Err(())),
                    ThreadConn::RetryAt(_) => None,
                })
        });
        match mine.flatten() {
            Some(Ok(m)) => return Ok(m),
            Some(Err(())) => return Ok(shared),
            None => {}
        }
        let made = tokio::time::timeout(
            OP_TIMEOUT,
            ConnectionManager::new_with_config(self.client.clone(), self.config.clone()),
        )
        .await;
        let entry = match made {
            Ok(Ok(m)) => ThreadConn::Ready(m),
            _ => ThreadConn::RetryAt(now + Duration::from_millis(500)),
        };
        let chosen = match &entry {
            ThreadConn::Ready(m) => m.clone(),
            ThreadConn::RetryAt(_) => shared,
        };
        THREAD_CONNS.with(|c| {
            let mut c = c.borrow_mut();
            c.retain(|(id, _)| *id != self.id);
            c.push((self.id, entry));
        });
        Ok(chosen)
    }
}

impl RedisStore {
    /// One request against the rate limit kept at `key`: `None` when it
    /// passes, else how long until one would (see `GCRA`).
    pub async fn gcra(
        &self,
        key: &str,
        limit: router_policy::tenant::Gcra,
    ) -> Result<Option<Duration>, StoreError> {
        let mut conn = self.conn().await?;
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let wait: u64 = bounded(
            self.gcra
                .key(format!("{}{key}", self.prefix))
                .arg(micros(limit.interval))
                .arg(micros(limit.tolerance))
                .invoke_async(&mut conn),
        )
        .await?;
        Ok((wait > 0).then(|| Duration::from_micros(wait)))
    }
}

impl RedisStore {
    /// Reserves `amount` on the day and month counters `keys` within
    /// `limits` (-1: none): `None` when reserved, else what is left of the
    /// budget that refused and which (1 the day, 2 the month). See
    /// `RESERVE`.
    pub async fn reserve_spend(
        &self,
        keys: [&str; 3],
        amount: i64,
        limits: [i64; 2],
        ttls_ms: [u64; 2],
    ) -> Result<Option<(i64, i64)>, StoreError> {
        let mut conn = self.conn().await?;
        let r: Vec<i64> = bounded(
            self.reserve
                .key(format!("{}{}", self.prefix, keys[0]))
                .key(format!("{}{}", self.prefix, keys[1]))
                .key(format!("{}{}", self.prefix, keys[2]))
                .arg(amount)
                .arg(limits[0])
                .arg(limits[1])
                .arg(ttls_ms[0])
                .arg(ttls_ms[1])
                .invoke_async(&mut conn),
        )
        .await?;
        Ok(match r.as_slice() {
            [1] => None,
            [0, left, which] => Some((*left, *which)),
            _ => {
                return Err(StoreError::Unavailable(
                    "unexpected reply to the reservation".into(),
                ))
            }
        })
    }

    /// Writes the store's epoch marker `text` if there is none (see
    /// [`router_policy::store_epoch`]); the marker already there, if any.
    pub async fn offer_epoch(&self, text: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn().await?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!(
            "{}{}",
            self.prefix,
            router_policy::store_epoch::KEY
        ))
        .arg(text)
        .arg("NX")
        .arg("GET");
        let old: Option<Vec<u8>> = bounded(cmd.query_async(&mut conn)).await?;
        Ok(old.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Adds `delta` to the integer at `key` (a token limit's settlement).
    pub async fn adjust_counter(&self, key: &str, delta: i64) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        bounded(
            redis::cmd("INCRBY")
                .arg(format!("{}{key}", self.prefix))
                .arg(delta)
                .query_async::<()>(&mut conn),
        )
        .await
    }

    /// Takes a slot of the set at `key` for `member` (see `TAKE_SLOT`).
    pub async fn take_slot(
        &self,
        key: &str,
        member: &str,
        cap: u32,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let taken: i64 = bounded(
            self.take_slot
                .key(format!("{}{key}", self.prefix))
                .arg(member)
                .arg(cap)
                .arg(millis(hold))
                .invoke_async(&mut conn),
        )
        .await?;
        Ok(taken == 1)
    }

    /// Gives `member`'s slot of the set at `key` back.
    pub async fn release_slot(&self, key: &str, member: &str) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        bounded(
            redis::cmd("ZREM")
                .arg(format!("{}{key}", self.prefix))
                .arg(member)
                .query_async::<()>(&mut conn),
        )
        .await
    }

    /// Adds `delta` to both counters and takes `reserved` off the
    /// in-flight one (a settlement), in one transaction.
    pub async fn adjust_spend(
        &self,
        keys: [&str; 3],
        delta: i64,
        reserved: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .incr(format!("{}{}", self.prefix, keys[0]), delta)
            .ignore()
            .incr(format!("{}{}", self.prefix, keys[1]), delta)
            .ignore()
            .incr(format!("{}{}", self.prefix, keys[2]), -reserved)
            .ignore();
        bounded(pipe.query_async::<()>(&mut conn)).await
    }
}

/// Runs a store call inside [`OP_TIMEOUT`] (the parked tasks' store
/// calls too).
pub async fn bounded<T>(
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    within(OP_TIMEOUT, call).await
}

/// Runs a store call inside `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Err(_) => Err(StoreError::Timeout),
        Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
        Ok(Ok(v)) => Ok(v),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// What follows the prefix in the response cache's keys
/// ([`RedisStore::namespaced`]).
pub const CACHE_NAMESPACE: &str = "cache:";

/// `text` matched literally by a Redis glob pattern (`SCAN MATCH`):
/// each of `* ? [ ] ^ - \\` escaped with a backslash, so that a route
/// name can never widen a purge.
pub fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '^' | '-' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Keys `UNLINK`ed per `SCAN` page at most.
const SCAN_PAGE: usize = 500;
/// The longest a purge walks the keyspace.
pub const PURGE_LIMIT: Duration = Duration::from_secs(30);

/// Unlinks every key starting with `prefix` (matched literally): `SCAN`
/// pages of [`SCAN_PAGE`], each page's keys unlinked at once, each call
/// within `op` and the whole walk within [`PURGE_LIMIT`]
/// ([`StoreError::Timeout`] past it: what was unlinked stays unlinked).
/// The number unlinked.
pub(crate) async fn unlink_prefix<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    prefix: &str,
    op: Duration,
) -> Result<u64, StoreError> {
    let pattern = format!("{}*", glob_escape(prefix));
    let until = tokio::time::Instant::now() + PURGE_LIMIT;
    let mut cursor: u64 = 0;
    let mut gone: u64 = 0;
    loop {
        if tokio::time::Instant::now() >= until {
            return Err(StoreError::Timeout);
        }
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_PAGE);
        let (next, keys): (u64, Vec<String>) = within(op, scan.query_async(conn)).await?;
        if !keys.is_empty() {
            let mut unlink = redis::cmd("UNLINK");
            for k in &keys {
                unlink.arg(k);
            }
            let n: u64 = within(op, unlink.query_async(conn)).await?;
            gone = gone.saturating_add(n);
        }
        if next == 0 {
            return Ok(gone);
        }
        cursor = next;
    }
}

impl IdempotencyStore for RedisStore {
    fn forget_prefix<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            unlink_prefix(&mut conn, &self.key(prefix), OP_TIMEOUT).await
        })
    }

    fn forget<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let mut cmd = redis::cmd("DEL");
            cmd.arg(self.key(key));
            bounded(cmd.query_async::<i64>(&mut conn)).await?;
            Ok(())
        })
    }

    fn claim<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        fp: Fingerprint,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<ClaimResult, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let value = record::encode(&Entry {
                owner,
                fingerprint: fp,
                state: KeyState::InFlight,
            });
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.key(key))
                .arg(&value[..])
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(millis(ttl));
            let old: Option<Vec<u8>> = bounded(cmd.query_async(&mut conn)).await?;
            match old {
                None => Ok(ClaimResult::Claimed),
                Some(bytes) => Ok(ClaimResult::Found(record::decode(&bytes)?)),
            }
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Entry>, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let mut cmd = redis::cmd("GET");
            cmd.arg(self.key(key));
            let v: Option<Vec<u8>> = bounded(cmd.query_async(&mut conn)).await?;
            match v {
                None => Ok(None),
                Some(b) => Ok(Some(record::decode(&b)?)),
            }
        })
    }

    fn settle<'a>(
        &'a self,
        key: &'a str,
        owner: Owner,
        fp: Fingerprint,
        state: Option<KeyState>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            // Empty: delete (release).
            let value = state.map_or_else(bytes::Bytes::new, |state| {
                record::encode(&Entry {
                    owner,
                    fingerprint: fp,
                    state,
                })
            });
            let done: i64 = bounded(
                self.settle
                    .key(self.key(key))
                    .arg(&record::owner_hex(owner)[..])
                    .arg(&value[..])
                    .arg(millis(ttl))
                    .invoke_async(&mut conn),
            )
            .await?;
            Ok(done == 1)
        })
    }

    fn changed<'a>(&'a self, _key: &'a str, wait: Duration) -> BoxFuture<'a, ()> {
        Box::pin(tokio::time::sleep(wait))
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn connected(&self) -> bool {
        self.conn.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_escaped_text_matches_only_itself() {
        assert_eq!(glob_escape("cache:a-b.c:"), "cache:a\\-b.c:");
        assert_eq!(glob_escape("*?[x]^\\"), "\\*\\?\\[x\\]\\^\\\\");
    }
}

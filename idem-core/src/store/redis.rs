//! The Redis store (feature `redis`): shared by many processes and machines.
//!
//! Every step (claim, complete, release, renew, forget) is one Lua script, so Redis runs it
//! atomically; nothing is read and then written from the client. Scripts are sent with EVALSHA
//! and loaded on the first `NOSCRIPT` answer (redis-rs [`redis::Script`]).
//!
//! # Keys
//! For an idempotency key `K` (64 hex digits) and the prefix `P` (default `idem`):
//! - `P:{K}:rec`: a hash with the record: `v` (schema version, [`SCHEMA_VERSION`]), `st`
//!   (`f` in flight, `d` done), `fence`, `fp` (fingerprint), `lu` (lease end, ms since the Unix
//!   epoch on the server's clock; read only while in flight), `ok` (`s` success, `f` failure, `u`
//!   unknown) and `p` (the JSON payload) once done, and `w` (`1` while someone waits on it).
//! - `P:{K}:fence`: the fence counter.
//! - `P:{K}:ev`: the pub/sub channel on which complete, release, takeover and forget publish.
//!
//! The `{K}` hash tag puts a record and its fence counter in one slot of a Redis Cluster, so a
//! script may touch both. The store itself connects to one server (a standalone Redis, a primary,
//! or a cluster proxy); it does not follow cluster redirections.
//!
//! # Time
//! Leases use the server's clock (`TIME` inside the scripts), so workers on machines with skewed
//! clocks agree on when a lease ends. Retention is `PEXPIRE` on the record: expiry removes the
//! whole hash at once. In-flight records have no expiry: a record whose owner vanished must stay to
//! answer [`Claim::Unknown`] to a `never` tool until an operator forgets it.
//!
//! # Fences
//! A new fence is above both the highest fence the key has had and the server's time in µs, so
//! fences look like timestamps (about 1.8e15 today; exact in Lua's doubles below 2^53, that is
//! until the year 2255). While a record exists it holds its key's highest fence, and a takeover
//! starts above it. When a record goes away its fence moves to the counter: complete writes it
//! with a TTL of the retention plus [`FENCE_COUNTER_GRACE`], release and forget with the grace. So
//! fences strictly increase across release, takeover, forget and retention expiry even if the
//! server's clock steps back. Once a key has been idle past that grace the counter is gone and the
//! next fence comes from the clock, which has moved on by at least the grace: fences still
//! increase, and no counter is kept forever for a key nobody uses. A claim of a new key reads the
//! counter but does not write it: the common path is one `HMGET`, one `GET` and one `HSET`.
//!
//! # Waiting
//! [`Store::wait`] subscribes to the key's channel on a dedicated RESP3 connection (one per
//! store, re-subscribed by itself after a reconnect), then re-checks the record and flags it as
//! waited on (field `w`) in one script; complete, release and takeover publish only on a flagged
//! record, so a call nobody waits for sends no message. It re-checks at least every second in case
//! a message was lost. When pub/sub is not available (a server without RESP3), it polls with
//! backoff from 20 ms to 500 ms. It never waits past `max` nor past the holder's lease end.
//!
//! # Failures
//! A server that cannot be reached or does not answer within the response timeout (default 1 s)
//! gives [`StoreError::Unavailable`] with the cause. The connection manager reconnects by itself:
//! calls work again once the server is back. A script whose answer timed out may still have run
//! (a hung server that resumes): a claim then leaves an in-flight record that nobody holds, which a
//! keyed or safe tool takes over when its lease ends and a `never` tool reports as
//! [`Claim::Unknown`]; complete, release and renew are fenced, so repeating them is harmless. A
//! record written by another schema version, or a key of another type, gives
//! [`StoreError::Incompatible`] and is never replayed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ProtocolVersion, PushInfo, PushKind, RedisError, Script, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Claim, ClaimRequest, Fence, OnExpired, Outcome, Record, Store, StoreError};
use crate::key::Key;

/// The version of the record layout written by this store. A record with another version is
/// refused with [`StoreError::Incompatible`].
pub const SCHEMA_VERSION: &str = "1";

/// How long a fence counter outlives its record: 7 days.
pub const FENCE_COUNTER_GRACE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Durations sent to Redis are capped at 100 years (in ms), far inside what `PEXPIRE` accepts.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// While subscribed, re-check the record at least this often in case a message was lost.
const SUBSCRIBED_RECHECK: Duration = Duration::from_secs(1);
/// Polling without pub/sub: first and largest interval.
const POLL_MIN: Duration = Duration::from_millis(20);
const POLL_MAX: Duration = Duration::from_millis(500);

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(MAX_MS)
}

// Shared by every script: `fmt` prints an integer-valued Lua number without an exponent (Lua's
// own tostring would print 1.7e+15); `clock` reads the server's clock once, and only in the steps
// that need it (a replay does not). `load` reads the record with one HMGET: a key of another type
// answers WRONGTYPE, caught by `pcall` so that the common path pays no TYPE lookup.
// Redis 3.2 to 4 replicate scripts verbatim unless told to replicate their effects, and refuse
// writes after `TIME` in verbatim mode; 5 and later replicate effects anyway.
const PRELUDE: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(n) return string.format('%d', n) end
local now_us, now_ms
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end
local function load(want)
  local r = redis.pcall('HMGET', KEYS[1], 'v', 'st', 'fence', 'fp', 'lu', 'ok', 'p', 'w')
  if r['err'] then
    return {'incompatible', 'key ' .. KEYS[1] .. ' holds a ' .. redis.call('TYPE', KEYS[1])['ok']}
  end
  if not r[1] and not r[2] and not r[3] then return nil end
  if r[1] ~= want then
    return {'incompatible', 'record ' .. KEYS[1] .. ' has schema version ' .. tostring(r[1])}
  end
  if r[2] ~= 'f' and r[2] ~= 'd' then
    return {'incompatible', 'record ' .. KEYS[1] .. ' has state ' .. tostring(r[2])}
  end
  return nil, r
end
local function owned(r) return r and r[2] == 'f' and r[3] == ARGV[2] end
"#;

// KEYS: rec, fence counter. ARGV: version, fingerprint, lease ms, on_expired (t|u), channel.
// A fresh record starts above the counter; a takeover above the record's own fence (a record's
// fence is never below the counter).
const CLAIM: &str = r#"
local bad, r = load(ARGV[1])
if bad then return bad end
if not r then
  clock()
  local f = math.max((tonumber(redis.call('GET', KEYS[2]) or '0') or 0) + 1, now_us)
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'st', 'f', 'fence', fmt(f), 'fp', ARGV[2],
    'lu', fmt(now_ms + tonumber(ARGV[3])))
  return {'acquired', f, 0}
end
if r[4] ~= ARGV[2] then return {'mismatch'} end
if r[2] == 'd' then return {'completed', r[6] or '', r[7] or ''} end
clock()
local lu = tonumber(r[5]) or 0
if lu > now_ms then return {'inflight', tonumber(r[3]) or 0, lu - now_ms} end
if ARGV[4] == 'u' then return {'unknown'} end
local f = math.max((tonumber(r[3]) or 0) + 1, now_us)
redis.call('HSET', KEYS[1], 'fence', fmt(f), 'lu', fmt(now_ms + tonumber(ARGV[3])), 'w', '0')
if r[8] == '1' then redis.call('PUBLISH', ARGV[5], 'takeover') end
return {'acquired', f, 1}
"#;

// KEYS: rec, fence counter. ARGV: version, fence, kind (s|f|u), payload, ttl ms, counter grace ms,
// channel. The counter takes the fence for as long as the record may live, plus the grace.
const COMPLETE: &str = r#"
local bad, r = load(ARGV[1])
if bad then return bad end
if not owned(r) then return {'lost'} end
redis.call('HSET', KEYS[1], 'st', 'd', 'ok', ARGV[3], 'p', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('SET', KEYS[2], ARGV[2], 'PX', fmt(tonumber(ARGV[5]) + tonumber(ARGV[6])))
if r[8] == '1' then redis.call('PUBLISH', ARGV[7], 'complete') end
return {'ok'}
"#;

// KEYS: rec, fence counter. ARGV: version, fence, counter grace ms, channel.
const RELEASE: &str = r#"
local bad, r = load(ARGV[1])
if bad then return bad end
if not owned(r) then return {'lost'} end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
if r[8] == '1' then redis.call('PUBLISH', ARGV[4], 'release') end
return {'ok'}
"#;

// KEYS: rec. ARGV: version, fence, lease ms.
const RENEW: &str = r#"
local bad, r = load(ARGV[1])
if bad then return bad end
if not owned(r) then return {'lost'} end
clock()
redis.call('HSET', KEYS[1], 'lu', fmt(now_ms + tonumber(ARGV[3])))
return {'ok'}
"#;

// KEYS: rec, fence counter. ARGV: channel, counter grace ms. Removes whatever is there (an
// operator's reconciliation); a record's fence goes to the counter first.
const FORGET: &str = r#"
local f = redis.pcall('HGET', KEYS[1], 'fence')
if type(f) == 'string' then redis.call('SET', KEYS[2], f, 'PX', ARGV[2]) end
local n = redis.call('DEL', KEYS[1])
if n > 0 then redis.call('PUBLISH', ARGV[1], 'forget') end
return {'ok', n}
"#;

// KEYS: rec. ARGV: version, fence, mark (1|0). The lease time left (ms) if the record is in
// flight under `fence`, else -1. With mark, flags the record as waited on (`w`), so that the
// steps that end or move the lease publish on its channel.
const WATCH: &str = r#"
local bad, r = load(ARGV[1])
if bad then return bad end
if not owned(r) then return {'ok', -1} end
clock()
local left = (tonumber(r[5]) or 0) - now_ms
if left <= 0 then return {'ok', -1} end
if ARGV[3] == '1' and r[8] ~= '1' then redis.call('HSET', KEYS[1], 'w', '1') end
return {'ok', left}
"#;

struct Scripts {
    claim: Script,
    complete: Script,
    release: Script,
    renew: Script,
    forget: Script,
    watch: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Scripts {
            claim: with_prelude(CLAIM),
            complete: with_prelude(COMPLETE),
            release: with_prelude(RELEASE),
            renew: with_prelude(RENEW),
            forget: Script::new(FORGET),
            watch: with_prelude(WATCH),
        }
    }
}

/// Builds a [`RedisStore`]: the URL, a key prefix and timeouts.
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    response_timeout: Duration,
    connection_timeout: Duration,
}

impl RedisStoreBuilder {
    /// The prefix of every Redis key and channel the store uses. Default `idem`. It must not
    /// contain `{` or `}` (they would change the keys' hash tag); `open` refuses it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a command may wait for its answer before the call fails with
    /// [`StoreError::Unavailable`]. Default 1 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take. Default 1 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects now: fails with [`StoreError::Unavailable`] if the server cannot be reached.
    pub async fn open(self) -> Result<RedisStore, StoreError> {
        let store = self.open_lazy()?;
        let mut conn = store.inner.conn.clone();
        redis::cmd("PING").query_async::<()>(&mut conn).await.map_err(unavailable)?;
        Ok(store)
    }

    /// Connects on first use, so a process can start while Redis is down (its calls fail closed
    /// until Redis is back). Fails only on a malformed URL.
    pub fn open_lazy(self) -> Result<RedisStore, StoreError> {
        if self.prefix.contains(['{', '}']) {
            // A brace would change the hash tag, splitting a record from its fence counter.
            return Err(StoreError::unavailable(format!(
                "invalid key prefix {:?}: it must not contain '{{' or '}}'",
                self.prefix
            )));
        }
        let client = Client::open(self.url.as_str()).map_err(unavailable)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            // One attempt per call: a call on a stopped server fails within the timeouts instead
            // of waiting out a backoff; the next call tries again.
            .set_number_of_retries(0);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(unavailable)?;
        let waiters = Arc::new(Waiters::default());
        let pubsub = pubsub_connection(&client, config, &waiters);
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix,
                scripts: Scripts::new(),
                waiters,
                pubsub,
                subscribed: tokio::sync::Mutex::new(HashSet::new()),
                pubsub_broken: AtomicBool::new(false),
            }),
        })
    }
}

/// The dedicated pub/sub connection: RESP3 with a push handler that wakes the waiters of a
/// channel, and re-subscription after a reconnect. `None` if it cannot be configured.
fn pubsub_connection(
    client: &Client,
    config: ConnectionManagerConfig,
    waiters: &Arc<Waiters>,
) -> Option<ConnectionManager> {
    let info = client.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
    let client = Client::open(info.set_redis_settings(settings)).ok()?;
    let waiters = Arc::clone(waiters);
    let on_push = move |push: PushInfo| -> Result<(), ()> {
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    waiters.wake(channel);
                }
            }
            // Messages may have been lost while disconnected: let every waiter re-check.
            PushKind::Disconnection => waiters.wake_all(),
            _ => {}
        }
        Ok(())
    };
    let config = config.set_push_sender(on_push).set_automatic_resubscription();
    ConnectionManager::new_lazy_with_config(client, config).ok()
}

/// The waiters of this process, by channel.
#[derive(Default)]
struct Waiters {
    channels: Mutex<HashMap<Vec<u8>, Channel>>,
}

struct Channel {
    refs: usize,
    notify: Arc<Notify>,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Channel>> {
        // Every update is a single insert, remove or counter step: a poisoned map is consistent.
        self.channels.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn wake(&self, channel: &[u8]) {
        if let Some(c) = self.lock().get(channel) {
            c.notify.notify_waiters();
        }
    }
    fn wake_all(&self) {
        for c in self.lock().values() {
            c.notify.notify_waiters();
        }
    }
    fn wanted(&self, channel: &[u8]) -> bool {
        self.lock().contains_key(channel)
    }
}

/// One waiter's interest in a channel; dropping it unsubscribes when it was the last.
struct Interest {
    inner: Arc<Inner>,
    channel: Vec<u8>,
    notify: Arc<Notify>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        let last = {
            let mut map = self.inner.waiters.lock();
            match map.get_mut(&self.channel) {
                Some(c) if c.refs > 1 => {
                    c.refs -= 1;
                    false
                }
                Some(_) => {
                    map.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if last && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let inner = Arc::clone(&self.inner);
            let channel = std::mem::take(&mut self.channel);
            rt.spawn(async move { inner.sync_subscription(&channel).await });
        }
    }
}

struct Inner {
    conn: ConnectionManager,
    prefix: String,
    scripts: Scripts,
    waiters: Arc<Waiters>,
    pubsub: Option<ConnectionManager>,
    /// Channels subscribed on the server; the lock also orders SUBSCRIBE and UNSUBSCRIBE.
    subscribed: tokio::sync::Mutex<HashSet<Vec<u8>>>,
    /// Set when the server refused pub/sub (no RESP3): wait by polling from then on.
    pubsub_broken: AtomicBool,
}

impl Inner {
    /// Brings the server's subscription of `channel` in line with whether anyone waits on it.
    /// Returns whether it is subscribed.
    async fn sync_subscription(&self, channel: &[u8]) -> bool {
        let Some(pubsub) = &self.pubsub else { return false };
        if self.pubsub_broken.load(Ordering::Relaxed) {
            return false;
        }
        let mut subscribed = self.subscribed.lock().await;
        let wanted = self.waiters.wanted(channel);
        let mut conn = pubsub.clone();
        match (wanted, subscribed.contains(channel)) {
            (true, false) => match conn.subscribe(channel).await {
                Ok(()) => {
                    subscribed.insert(channel.to_vec());
                }
                Err(e) => {
                    if !e.is_io_error() && !e.is_timeout() {
                        tracing::warn!(error = %e, "redis pub/sub unavailable; waiting by polling");
                        self.pubsub_broken.store(true, Ordering::Relaxed);
                    }
                }
            },
            (false, true) => {
                // Even if this fails the subscription is harmless: messages nobody waits for are
                // dropped.
                let _ = conn.unsubscribe(channel).await;
                subscribed.remove(channel);
            }
            _ => {}
        }
        subscribed.contains(channel)
    }
}

/// The Redis [`Store`]. Cheap to clone; share one per process.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_core::StoreError> {
/// use idem_core::{Idem, store::RedisStore};
/// let store = RedisStore::open("redis://127.0.0.1:6379/").await?;
/// let idem = Idem::new(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("prefix", &self.inner.prefix).finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the server at `url` (`redis://[user:password@]host[:port][/db]`, or
    /// `rediss://` with a TLS feature of redis-rs) with the default settings.
    ///
    /// Errors: [`StoreError::Unavailable`] for a malformed URL or a server that cannot be reached.
    pub async fn open(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).open().await
    }

    /// A builder with the default settings: prefix `idem`, 1 s response and connection timeouts.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: "idem".to_owned(),
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
        }
    }

    /// The Redis key of the record of `key` (a hash; see the module docs).
    pub fn record_key(&self, key: &Key) -> String {
        format!("{}:{{{}}}:rec", self.inner.prefix, key)
    }

    /// The Redis key of the fence counter of `key`.
    pub fn fence_key(&self, key: &Key) -> String {
        format!("{}:{{{}}}:fence", self.inner.prefix, key)
    }

    /// The pub/sub channel of `key`.
    pub fn channel(&self, key: &Key) -> String {
        format!("{}:{{{}}}:ev", self.inner.prefix, key)
    }

    async fn run(&self, inv: redis::ScriptInvocation<'_>) -> Result<Vec<Value>, StoreError> {
        let mut conn = self.inner.conn.clone();
        let reply: Value = inv.invoke_async(&mut conn).await.map_err(unavailable)?;
        let Value::Array(items) = reply else {
            return Err(StoreError::Incompatible(format!("unexpected script reply {reply:?}")));
        };
        match items.first().map(text).as_deref() {
            Some("incompatible") => Err(StoreError::Incompatible(
                items.get(1).map(text).unwrap_or_default().into_owned(),
            )),
            Some("lost") => Err(StoreError::LeaseLost),
            Some(_) => Ok(items),
            None => Err(StoreError::Incompatible("empty script reply".into())),
        }
    }

    /// The lease time left if `key` is in flight under `fence`; with `mark`, flags the record
    /// as waited on so that complete, release and takeover publish on its channel.
    async fn watch(
        &self,
        key: &Key,
        fence: Fence,
        mark: bool,
    ) -> Result<Option<Duration>, StoreError> {
        let mut inv = self.inner.scripts.watch.prepare_invoke();
        inv.key(self.record_key(key)).arg(SCHEMA_VERSION).arg(fence.0).arg(u8::from(mark));
        let items = self.run(inv).await?;
        let left = int(items.get(1))?;
        Ok(u64::try_from(left).ok().filter(|&l| l > 0).map(Duration::from_millis))
    }

    fn interest(&self, channel: Vec<u8>) -> Interest {
        let mut map = self.inner.waiters.lock();
        let entry = map
            .entry(channel.clone())
            .or_insert_with(|| Channel { refs: 0, notify: Arc::new(Notify::new()) });
        entry.refs += 1;
        let notify = Arc::clone(&entry.notify);
        drop(map);
        Interest { inner: Arc::clone(&self.inner), channel, notify }
    }
}

fn unavailable(e: RedisError) -> StoreError {
    StoreError::unavailable(e)
}

fn text(v: &Value) -> std::borrow::Cow<'_, str> {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b),
        Value::SimpleString(s) => s.as_str().into(),
        Value::Int(i) => i.to_string().into(),
        other => format!("{other:?}").into(),
    }
}

fn int(v: Option<&Value>) -> Result<i64, StoreError> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        other => Err(StoreError::Incompatible(format!("expected an integer, got {other:?}"))),
    }
}

fn bulk(v: Option<&Value>) -> Result<&[u8], StoreError> {
    match v {
        Some(Value::BulkString(b)) => Ok(b),
        other => Err(StoreError::Incompatible(format!("expected a string, got {other:?}"))),
    }
}

fn fence_of(v: Option<&Value>) -> Result<Fence, StoreError> {
    let n = int(v)?;
    u64::try_from(n).map(Fence).map_err(|_| StoreError::Incompatible(format!("negative fence {n}")))
}

fn outcome_of(kind: &[u8], payload: &[u8]) -> Result<Outcome, StoreError> {
    let json = || {
        String::from_utf8(payload.to_vec())
            .map_err(|_| StoreError::Incompatible("stored payload is not UTF-8".into()))
    };
    match kind {
        b"s" => Ok(Outcome::Success(json()?)),
        b"f" => Ok(Outcome::Failure(json()?)),
        b"u" => Ok(Outcome::Unknown),
        other => Err(StoreError::Incompatible(format!(
            "unknown outcome kind {:?}",
            String::from_utf8_lossy(other)
        ))),
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let on_expired = match req.on_expired {
            OnExpired::TakeOver => "t",
            OnExpired::Unknown => "u",
        };
        let mut inv = self.inner.scripts.claim.prepare_invoke();
        inv.key(self.record_key(req.key))
            .key(self.fence_key(req.key))
            .arg(SCHEMA_VERSION)
            .arg(req.fingerprint.as_str())
            .arg(ms(req.lease))
            .arg(on_expired)
            .arg(self.channel(req.key));
        let items = self.run(inv).await?;
        match items.first().map(text).as_deref().unwrap_or_default() {
            "acquired" => Ok(Claim::Acquired {
                fence: fence_of(items.get(1))?,
                takeover: int(items.get(2))? == 1,
            }),
            "inflight" => Ok(Claim::InFlight {
                fence: fence_of(items.get(1))?,
                lease_remaining: Duration::from_millis(
                    u64::try_from(int(items.get(2))?).unwrap_or(0),
                ),
            }),
            "completed" => Ok(Claim::Completed(Record {
                fingerprint: *req.fingerprint,
                outcome: outcome_of(bulk(items.get(1))?, bulk(items.get(2))?)?,
            })),
            "unknown" => Ok(Claim::Unknown),
            "mismatch" => Ok(Claim::Mismatch),
            other => Err(StoreError::Incompatible(format!("unexpected claim answer {other}"))),
        }
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let (kind, payload) = match outcome {
            Outcome::Success(json) => ("s", json.as_str()),
            Outcome::Failure(json) => ("f", json.as_str()),
            Outcome::Unknown => ("u", ""),
        };
        let mut inv = self.inner.scripts.complete.prepare_invoke();
        inv.key(self.record_key(key))
            .key(self.fence_key(key))
            .arg(SCHEMA_VERSION)
            .arg(fence.0)
            .arg(kind)
            .arg(payload)
            .arg(ms(ttl))
            .arg(ms(FENCE_COUNTER_GRACE))
            .arg(self.channel(key));
        self.run(inv).await.map(drop)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let mut inv = self.inner.scripts.release.prepare_invoke();
        inv.key(self.record_key(key))
            .key(self.fence_key(key))
            .arg(SCHEMA_VERSION)
            .arg(fence.0)
            .arg(ms(FENCE_COUNTER_GRACE))
            .arg(self.channel(key));
        self.run(inv).await.map(drop)
    }

    async fn renew(&self, key: &Key, fence: Fence, lease: Duration) -> Result<(), StoreError> {
        let mut inv = self.inner.scripts.renew.prepare_invoke();
        inv.key(self.record_key(key)).arg(SCHEMA_VERSION).arg(fence.0).arg(ms(lease));
        self.run(inv).await.map(drop)
    }

    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError> {
        let deadline = Instant::now() + max;
        let interest = self.interest(self.channel(key).into_bytes());
        let notified = interest.notify.notified();
        tokio::pin!(notified);
        // Registered before subscribing and before the re-check below, so a message that
        // arrives in between is not missed.
        notified.as_mut().enable();
        let subscribed =
            tokio::time::timeout_at(deadline, self.inner.sync_subscription(&interest.channel))
                .await
                .unwrap_or(false);
        let mut poll = if subscribed { SUBSCRIBED_RECHECK } else { POLL_MIN };
        loop {
            let watched = self.watch(key, fence, subscribed);
            let Ok(held) = tokio::time::timeout_at(deadline, watched).await else {
                return Ok(());
            };
            let Some(lease_left) = held? else { return Ok(()) };
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            // At lease end the caller must claim again (a takeover or `Unknown`).
            let until = deadline.min(now + lease_left).min(now + poll);
            tokio::select! {
                () = &mut notified => return Ok(()),
                () = tokio::time::sleep_until(until) => {}
            }
            if Instant::now() >= deadline {
                return Ok(());
            }
            if !subscribed {
                poll = (poll * 2).min(POLL_MAX);
            }
        }
    }

    async fn forget(&self, key: &Key) -> Result<bool, StoreError> {
        let mut inv = self.inner.scripts.forget.prepare_invoke();
        inv.key(self.record_key(key))
            .key(self.fence_key(key))
            .arg(self.channel(key))
            .arg(ms(FENCE_COUNTER_GRACE));
        let items = self.run(inv).await?;
        Ok(int(items.get(1))? > 0)
    }
}

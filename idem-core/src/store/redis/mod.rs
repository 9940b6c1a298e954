//! The Redis store (feature `redis`): shared by many processes and machines.
//!
//! On one server, the common claim, a fresh one or a replay, is one native command: `SET rec
//! <in-flight record> NX GET` (Redis 7.0 or later), pipelined with a `GET` of the fence counter, so
//! the server runs no script for it (see `native.rs`: the fence and lease end come from the
//! client's estimate of the server's clock, and a fence not above the counter is raised by the
//! claim script before anyone sees it). Every other step (complete, release, renew, forget, the
//! re-check of a wait, and the claims the native command cannot answer: a record in flight, a
//! takeover, a version 1 record) is one Lua script, so Redis runs it atomically; nothing is read
//! and then written from the client. Scripts are sent with EVALSHA, and with EVAL (which
//! caches them) on a `NOSCRIPT` answer. Redis runs one script at a time and each command a script makes costs it
//! microseconds, so the scripts make few: a claim `GET`, `TIME`, `GET`, `SET`; a complete `GET`,
//! `TIME`, `SET`, `SET`, its common case (the owner's record in flight) answered before the
//! script's shared helpers are even set up. Claims are scripts only on a Redis Cluster (each
//! master has its own clock), with a replica wait (the claim's `WAIT` goes with its script), with
//! [`RedisStoreBuilder::native_claims`] off, and on a server before 7.0 (it refuses `NX` with
//! `GET`). A claim of a key this store saw completed lately is first a plain `GET` of the record
//! (`recent.rs`; [`RedisStoreBuilder::replay_reads`]): a repeat in the same process, the usual
//! replay, costs one read.
//!
//! # Keys
//! For an idempotency key `K` (64 hex digits) and the prefix `P` (default `idem`):
//! - `P:{K}:rec`: the record, one string `V|st|fence|w|lu|fp|ok|since|origin|payload`: `V` the
//!   schema version
//!   ([`SCHEMA_VERSION`]), `st` the state (`f` in flight, `d` done), `fence` in decimal, `w` `1`
//!   while someone waits on it (else `0`), `lu` the lease end in ms since the Unix epoch on the
//!   server's clock (empty once done), `fp` the fingerprint (64 hex digits), `ok` the outcome (`s`
//!   success, `f` failure, `u` unknown) once done and the claim's owner token in flight (32 hex
//!   digits, after a `t` when the claim took the record over from an owner whose lease ended;
//!   empty in records written before owner tokens, which no claim matches), `since` the
//!   time the record entered its state (claimed, taken over, completed or resolved) in ms since
//!   the epoch on the server's clock, `origin` the tool, tenant and run of the claim
//!   (`o<tool>,<tenant>,<run>`, each percent-escaped for `%`, `|` and `,`; see
//!   `reply::encode_origin`), and last the JSON payload, which may itself contain `|` (empty in
//!   flight and for unknown). Version 2 records (`V|st|fence|w|lu|fp|ok|payload`, no since nor
//!   origin) are read and written on as they are met: a step that rewrites one writes version 3
//!   with since and origin empty (unknown), so they list with an unknown origin and age. The
//!   operator's side (listing by `SCAN`, inspect, resolve, stats) is in `admin.rs`. A script reads the header with one
//!   pattern match and never looks into the payload. A claim of a completed record returns the
//!   string as it is and the client checks and decodes it: a completed record does not change
//!   until it expires or is forgotten, so this is not a read followed by a write, and a replay
//!   costs the server no parsing.
//! - `P:{K}:fence`: the fence counter.
//! - `P:{K}:ev`: the pub/sub channel on which complete, release, takeover and forget publish
//!   (the scripts derive it from the record's key, and only when they publish).
//!
//! The `{K}` hash tag puts a record, its fence counter and its channel in one slot of a Redis
//! Cluster, so a script may touch both keys and publish on the channel.
//!
//! # Redis Cluster
//! `redis+cluster://host1:port1,host2:port2/` (or `rediss+cluster://`) opens the store on a
//! Redis Cluster through the redis crate's async cluster client, which finds every node from any
//! of those listed (`conn.rs`). Each script runs on the master of its record's slot; the store
//! follows `MOVED` and `ASK` itself and sends again what a node refused without running it
//! (`TRYAGAIN` while a slot moves, `CLUSTERDOWN` during a failover), for a bounded time
//! (`route.rs`). Waiters subscribe on a second cluster connection (RESP3), on the node that serves
//! the channel's slot; a cluster forwards every `PUBLISH` to all its nodes, and the client
//! subscribes again after a reconnect or a change of topology.
//!
//! # Replication
//! Redis replicates asynchronously: a master acknowledges a write before any replica has it. If
//! the master dies before its replicas received a claim, the replica promoted in its place has no
//! record, and a second caller acquires the key: the tool runs twice. A completion lost that way
//! brings the record back in flight; the next caller waits for its lease to end and then takes it
//! over (a `keyed` tool runs again) or answers `Unknown` (a `never` tool).
//!
//! With [`RedisStoreBuilder::wait_for_replicas`] (or `?wait_replicas=N&wait_timeout_ms=T` in the
//! URL), a claim that acquires and a completion are followed by `WAIT N T` on the same connection.
//! A claim fewer than `N` replicas acknowledged is not trusted: it answers
//! [`StoreError::Unavailable`] and its record is released in the background, so its tool does not
//! run. A completion fewer replicas acknowledged answers [`StoreError::Unavailable`]. So a claim a
//! tool runs under is on `N` replicas, and when Redis promotes one of them (it prefers the replica
//! with the most data; with one replica per master, that one), the record is there and no second
//! owner acquires it. `WAIT` does not make Redis strongly consistent: a failover may still promote
//! a replica that did not acknowledge (with several replicas per master), and a master that
//! restarts empty without persistence loses what it held. Renewals, releases and waiter flags are
//! not waited for: a lost renewal shortens a lease back to its previous end (a takeover may then
//! come sooner, under a higher fence), a lost release keeps a key in flight until its lease ends.
//! While a master has fewer than `N` replicas online (a failover just promoted its only replica),
//! every claim on its slots fails closed until a replica is back.
//!
//! Schema version 1 stored the record as a hash (fields `v`, `st`, `fence`, `fp`, `lu`, `ok`,
//! `p`, `w`). A script that meets one (its `GET` answers `WRONGTYPE`) rewrites it as a version 3
//! string with the same content and expiry (since and origin unknown), then goes on as usual, so records written by an older
//! idem keep their fences, leases and outcomes across an upgrade (forget removes one directly).
//! Only that path looks at the key's type; the common path pays nothing for it. A hash that is not
//! a valid version 1 record is left as it is and refused. Version 1 does not read strings: while
//! both versions run against one server, a version 1 process fails closed
//! ([`StoreError::Incompatible`]) on every key a later version has touched; likewise a version 2
//! process on every record a version 3 process wrote. So upgrade all processes together.
//!
//! # Time
//! Leases use the server's clock (`TIME` inside the scripts), so workers on machines with skewed
//! clocks agree on when a lease ends. A native claim writes a lease end from its estimate of that
//! clock (a `TIME` sample at most 60 s old, corrected by the sample's round trip), never earlier
//! than the server's time plus the lease except by the drift of the two clocks since the sample
//! (a sample is set aside when the machine slept since, or the connection was made again);
//! whether a lease has ended is still decided by the scripts, on the server's clock. Retention is the expiry of the record, set by the same `SET
//! .. PX` that completes it: expiry removes the whole record at once. In-flight records have no
//! expiry: a record whose owner vanished must stay to answer [`Claim::Unknown`] to a `never` tool
//! until an operator forgets it.
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
//! counter but does not write it; a native claim reads it right after its `SET .. NX`, and if the
//! fence it wrote is not above it, the claim script raises that fence (`native.rs`).
//!
//! # Waiting
//! [`Store::wait`] subscribes to the key's channel on a dedicated RESP3 connection (one per
//! store, re-subscribed by itself after a reconnect), then re-checks the record and flags it as
//! waited on (`w`) in one script; complete, release and takeover publish only on a flagged record,
//! so a call nobody waits for sends no message. It re-checks at least every second in case a
//! message was lost. When pub/sub is not available (a server without RESP3), it polls with
//! backoff from 20 ms to 500 ms. It never waits past `max` nor past the holder's lease end.
//!
//! # Failures
//! A server that cannot be reached or does not answer within the response timeout (default 1 s;
//! plus the replica wait's timeout when set) gives [`StoreError::Unavailable`] with the cause.
//! The connection manager (or the cluster client) reconnects by itself: calls work again once the
//! server is back, on a cluster once a replica has been promoted in place of a failed master. On
//! one server, a write refused with `READONLY` (a master demoted to a replica behind the same
//! address, which keeps the connection open) makes the store connect again and send it again,
//! for up to 5 s (`route.rs`); so does a response timeout, since a connection that went silent
//! (a NAT or load balancer that forgot the flow) is otherwise closed only by the kernel, after
//! about 15 minutes. A script whose reply was lost (the connection reset
//! after the command, a response timeout on a hung server that resumes) may have run: every step
//! is sent again with backoff (see `store/resend.rs`). A claim carries an owner token unique to
//! the call, so its resend finds its own record and acquires it with the same fence (a takeover
//! answers a takeover again); a resent
//! completion that finds the record completed under its fence succeeds; a resent release that
//! finds the record no longer held under its fence succeeds; renew is idempotent. A claim that
//! gives up releases in the background the record it may have created, by owner token; not one it
//! may have taken over (its token is marked), which is left to its lease so that the dead owner's
//! attempt is not erased. Records
//! written before owner tokens (an empty seventh field) read as before. A
//! record of another schema version (other than a version 1 hash, migrated as above), a malformed
//! record, a string that is not a record, or a key of another type gives
//! [`StoreError::Incompatible`] and is never replayed; forget removes whatever is there.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use async_trait::async_trait;

use super::admin::Forgot;
use super::resend::{self, Failed, GiveUp, Owner};
use super::wait::{self, WaiterMap};
use super::{
    Claim, ClaimRequest, Fence, ListPage, ListQuery, OnExpired, Outcome, RecordInfo, Resolution,
    Stats, Store, StoreError,
};
use crate::clock::ms;
use crate::key::{Fingerprint, Key};

mod admin;
mod builder;
mod conn;
mod eviction;
mod native;
mod persistence;
mod pubsub;
mod recent;
mod reply;
mod route;

pub use builder::RedisStoreBuilder;
use pubsub::PubSub;
use reply::{Answer, answer, encode_origin, fence, int, text};
pub use reply::{decode_answer, decode_record};
pub use route::Replicas;
use route::{Conn, Invocation};

/// The version of the record layout written by this store. A record with another version is
/// refused with [`StoreError::Incompatible`].
pub const SCHEMA_VERSION: &str = "3";

/// How long a fence counter outlives its record: 7 days.
pub const FENCE_COUNTER_GRACE: Duration = Duration::from_secs(7 * 24 * 3600);

/// While subscribed, re-check the record at least this often in case a message was lost.
const SUBSCRIBED_RECHECK: Duration = Duration::from_secs(1);
/// Polling without pub/sub: first and largest interval.
const POLL_MIN: Duration = Duration::from_millis(20);
const POLL_MAX: Duration = Duration::from_millis(500);

mod scripts;

use scripts::Scripts;

struct Inner {
    conn: Conn,
    /// Replicas to wait for after a claim that acquires and after a completion.
    wait: Option<Replicas>,
    prefix: String,
    scripts: Scripts,
    waiters: Arc<WaiterMap<Vec<u8>>>,
    pubsub: Option<PubSub>,
    /// Channels subscribed on the server; the lock also orders SUBSCRIBE and UNSUBSCRIBE.
    subscribed: tokio::sync::Mutex<HashSet<Vec<u8>>>,
    /// Set when the server refused pub/sub (no RESP3): wait by polling from then on.
    pubsub_broken: AtomicBool,
    /// The server's clock as estimated here, for claims in native commands.
    clock: native::ServerClock,
    /// Whether claims may be native commands.
    native: native::Support,
    /// Keys seen completed here lately: their claims read first (see `recent.rs`).
    recent: recent::Recent,
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
    /// `rediss://…[?ca=/path/ca.pem]` with the feature `redis-tls`: TLS checked against the PEM
    /// roots `ca` names, else the system's roots), or to the Redis Cluster at
    /// `redis+cluster://host1:port1,host2:port2/` (`rediss+cluster://` with TLS), with the default
    /// settings. Query options: `ca`, `wait_replicas`, `wait_timeout_ms` (see
    /// [`RedisStoreBuilder::wait_for_replicas`]), `protocol`, `prefix` (the key prefix, see
    /// [`RedisStoreBuilder::prefix`]; percent-decoded), so that one URL names an application's
    /// records for the `idem` command line too.
    ///
    /// Errors: [`StoreError::InvalidConfig`] for a malformed URL, an unknown scheme or option, an
    /// unreadable CA file or TLS without `redis-tls`; [`StoreError::Unavailable`] for a server
    /// that cannot be reached or a TLS check that fails.
    pub async fn open(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).open().await
    }

    /// A builder with the default settings: prefix `idem` (or the URL's `prefix`), 1 s response
    /// and connection timeouts.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: crate::store::redact::SecretUrl::new(url),
            prefix: None,
            response_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(1),
            wait: None,
            native_claims: true,
            replay_reads: true,
            allow_eviction: None,
            replica_ok: false,
        }
    }

    /// The Redis key of the record of `key` (a string; see the module docs).
    pub fn record_key(&self, key: &Key) -> String {
        self.key_name(key, "rec")
    }

    /// The Redis key of the fence counter of `key`.
    pub fn fence_key(&self, key: &Key) -> String {
        self.key_name(key, "fence")
    }

    /// `P:{K}:suffix`, built in one allocation of the right size (every claim builds two).
    fn key_name(&self, key: &Key, suffix: &str) -> String {
        let prefix = &self.inner.prefix;
        let mut name = String::with_capacity(prefix.len() + key.as_str().len() + suffix.len() + 4);
        for part in [prefix.as_str(), ":{", key.as_str(), "}:", suffix] {
            name.push_str(part);
        }
        name
    }

    /// Whether claims now take the native path (`store/redis/native.rs`): one server that takes
    /// `SET .. NX GET`, no replica wait, and a recent sample of the server's clock (taken in the
    /// background by the first claims). For tests, not an API.
    #[doc(hidden)]
    pub fn native_ready(&self) -> bool {
        let route::Conn::One(conn) = &self.inner.conn else { return false };
        self.inner.native.usable() && self.inner.clock.now_us(conn.manager().0).0.is_some()
    }

    /// How many pub/sub channels this store's waits in this process are registered on (each gone
    /// with the last wait on its key, also one dropped mid-wait). For tests, not an API.
    #[doc(hidden)]
    pub fn waiting_keys(&self) -> usize {
        self.inner.waiters.keys()
    }

    /// The pub/sub channel of `key`.
    pub fn channel(&self, key: &Key) -> String {
        format!("{}:{{{}}}:ev", self.inner.prefix, key)
    }

    async fn run(&self, inv: Invocation<'_>) -> Result<Answer, StoreError> {
        self.send(&inv, false)
            .await
            .map(|(answer, _)| answer)
            .map_err(|(Failed::Lost(e) | Failed::Answered(e))| e)
    }

    /// A script whose second run changes nothing the first did not (inspect, whose migration
    /// of a version 1 hash writes the same content again; forget, which deletes what is there),
    /// sent again when its reply may have been lost, as a step is: a long-lived process's first
    /// command after a pause may find its connection closed by the server's idle `timeout`.
    async fn run_resent(&self, inv: Invocation<'_>) -> Result<Answer, StoreError> {
        resend::resend(|_| async { self.send(&inv, false).await.map(|(answer, _)| answer) }).await
    }

    /// One send of a script; [`Failed::Lost`] when its reply may have been lost after the server
    /// ran it (an I/O error, a dropped connection, a response timeout). With `acked` and a
    /// replica wait set, the script is followed by `WAIT`, and the answer comes with how many
    /// replicas acknowledged.
    async fn send(
        &self,
        inv: &Invocation<'_>,
        acked: bool,
    ) -> Result<(Answer, Option<i64>), Failed> {
        let wait = if acked { self.inner.wait } else { None };
        match self.inner.conn.eval(inv, wait).await {
            Ok((reply, acks)) => Ok((answer(reply).map_err(Failed::Answered)?, acks)),
            Err(e) => Err(reply::failed(e)),
        }
    }

    /// `Unavailable` when fewer replicas than the store waits for acknowledged `what`.
    fn replicated(&self, acks: Option<i64>, what: &str) -> Result<(), StoreError> {
        match (self.inner.wait, acks) {
            (Some(w), Some(n)) if n < i64::from(w.count) => Err(StoreError::unavailable(format!(
                "{what} acknowledged by {n} of {} replicas within {} ms; not trusted",
                w.count,
                w.timeout.as_millis()
            ))),
            _ => Ok(()),
        }
    }

    /// Releases the record of `key` if `owner` holds it (a claim that gave up); whether it did.
    async fn release_owned(&self, key: &Key, owner: &Owner) -> Result<bool, StoreError> {
        let mut inv = self.inner.scripts.release_owned.prepare_invoke();
        inv.key(self.record_key(key))
            .key(self.fence_key(key))
            .arg(owner.as_str())
            .arg(ms(FENCE_COUNTER_GRACE));
        Ok(self.run(inv).await?.int()? == 1)
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
        inv.key(self.record_key(key)).arg(fence.0).arg(u8::from(mark));
        let left = self.run(inv).await?.int()?;
        Ok(u64::try_from(left).ok().filter(|&l| l > 0).map(Duration::from_millis))
    }

    /// Decodes a completed record, which the claim script returns as it is stored
    /// (`V|d|<fence>|<w>|<lu>|<fp>|<ok>|<payload>`, see the module docs). The script looked only at
    /// its first bytes, so every field is checked here: anything but a well-formed completed record
    /// of this version is `Incompatible`, and it is never replayed.
    /// `record` is the record's Redis key, named in errors.
    fn replay(
        &self,
        key: &Key,
        record: &str,
        raw: &[u8],
        fingerprint: &Fingerprint,
    ) -> Result<Claim, StoreError> {
        let claim = decode_record(record, raw, fingerprint)?;
        if matches!(claim, Claim::Completed(_)) {
            self.inner.recent.saw(key);
        }
        Ok(claim)
    }

    /// The claim's answer when `record` is completed, read with one `GET` (see `recent.rs`);
    /// `None` when it is anything else (absent, in flight, of another type), for the claim to
    /// decide. Nothing is written, so an error is just that: the store is unavailable.
    async fn read_completed(
        &self,
        record: &str,
        fingerprint: &Fingerprint,
    ) -> Result<Option<Claim>, StoreError> {
        // A read: sent again like any step whose reply may have been lost. The first command
        // after a pause may go out on a connection the server has closed meanwhile (its idle
        // `timeout`, a proxy's), which the connection manager learns of only from that command;
        // it then connects again, and a repeat must not fail closed for it.
        let reply =
            resend::resend(|_| async { self.inner.conn.get(record).await.map_err(reply::failed) })
                .await;
        let raw = match reply? {
            redis::Value::BulkString(raw) => raw,
            // Absent, or not a string (a version 1 hash: WRONGTYPE): the claim's to handle.
            _ => return Ok(None),
        };
        if !reply::is_completed(&raw) {
            // In flight, or a record of an earlier version: the claim's to handle.
            return Ok(None);
        }
        decode_record(record, &raw, fingerprint).map(Some)
    }

    /// Sends complete, release or renew until answered (see `store/resend.rs`); `build` makes
    /// the invocation, told whether this is a resend. With `acked`, the step must be acknowledged
    /// by the replicas the store waits for.
    async fn step<'s>(
        &'s self,
        acked: bool,
        build: impl Fn(bool) -> Invocation<'s>,
    ) -> Result<(), StoreError> {
        resend::resend(|again| {
            let inv = build(again);
            async move {
                let (answer, acks) = self.send(&inv, acked).await?;
                answer.int().map_err(Failed::Answered)?;
                self.replicated(acks, "completion").map_err(Failed::Answered)
            }
        })
        .await
    }
}

#[async_trait]
impl Store for RedisStore {
    fn uses_tokio_io(&self) -> bool {
        true
    }

    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        ready()?;
        let on_expired = match req.on_expired {
            OnExpired::TakeOver => "t",
            OnExpired::Unknown => "u",
        };
        let record = self.record_key(req.key);
        // Most likely a replay: one read first (see `recent.rs`). Nothing below (the owner
        // token, the counter's name) is made for it.
        if self.inner.recent.likely(req.key) {
            match self.read_completed(&record, req.fingerprint).await {
                Ok(Some(claim)) => return Ok(claim),
                Ok(None) => self.inner.recent.drop_key(req.key),
                Err(e) => return Err(e),
            }
        }
        let owner = Owner::new();
        let counter = self.fence_key(req.key);
        let give_up = GiveUp::arm({
            let (store, key) = (self.clone(), *req.key);
            move || {
                Box::pin(async move {
                    resend::release_eventually(|| store.release_owned(&key, &owner)).await;
                })
            }
        });
        // The common claim (a fresh one, or a replay) in native commands; the rest by script.
        match self.native_claim(&req, &owner, &record, &counter).await {
            None | Some(Ok(native::Native::Script)) => {}
            Some(Ok(native::Native::Answer(claim))) => {
                give_up.answered();
                return Ok(claim);
            }
            Some(Ok(native::Native::Completed(raw))) => {
                give_up.answered();
                return self.replay(req.key, &record, &raw, req.fingerprint);
            }
            Some(Err(e)) => {
                // Only a claim whose every send may have been lost may have left a record.
                if !matches!(e, StoreError::Unavailable(_)) {
                    give_up.answered();
                }
                return Err(e);
            }
        }
        let mut inv = self.inner.scripts.claim.prepare_invoke();
        inv.key(&record)
            .key(&counter)
            .arg(req.fingerprint.as_str())
            .arg(ms(req.lease))
            .arg(on_expired)
            .arg(owner.as_str())
            .arg(encode_origin(&req.origin));
        let answered =
            resend::resend(|_| self.send(&inv, true)).await.and_then(|(answer, acks)| {
                // A record this claim wrote must reach the replicas, or it is not trusted.
                let acquired = match &answer {
                    Answer::Int(_) => true,
                    Answer::Table(items) => items.first().map(text).as_deref() == Some("takeover"),
                    Answer::Record(_) => false,
                };
                if acquired {
                    self.replicated(acks, "claim")?;
                }
                Ok(answer)
            });
        // Only a claim whose every send may have been lost, or whose record the replicas did not
        // acknowledge, may have left a record behind.
        if !matches!(answered, Err(StoreError::Unavailable(_))) {
            give_up.answered();
        }
        let items = match answered? {
            // A fresh record: its fence.
            Answer::Int(f) => return Ok(Claim::Acquired { fence: fence(f)?, takeover: false }),
            // A completed record, as it is stored.
            Answer::Record(raw) => {
                return self.replay(req.key, &record, &raw, req.fingerprint);
            }
            Answer::Table(items) => items,
        };
        match items.first().map(text).as_deref().unwrap_or_default() {
            "takeover" => Ok(Claim::Acquired { fence: fence(int(items.get(1))?)?, takeover: true }),
            "inflight" => Ok(Claim::InFlight {
                fence: fence(int(items.get(1))?)?,
                lease_remaining: Duration::from_millis(
                    u64::try_from(int(items.get(2))?).unwrap_or(0),
                ),
            }),
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
        ready()?;
        let (kind, payload) = match outcome {
            Outcome::Success(json) => ("s", json.as_str()),
            Outcome::Failure(json) => ("f", json.as_str()),
            Outcome::Unknown => ("u", ""),
            Outcome::NotStorable(reason) => ("n", reason.as_str()),
        };
        let (record, counter) = (self.record_key(key), self.fence_key(key));
        let done = self
            .step(true, |again| {
                let mut inv = self.inner.scripts.complete.prepare_invoke();
                inv.key(&record)
                    .key(&counter)
                    .arg(fence.0)
                    .arg(kind)
                    .arg(payload)
                    .arg(ms(ttl))
                    .arg(ms(FENCE_COUNTER_GRACE))
                    .arg(u8::from(again));
                inv
            })
            .await;
        if done.is_ok() {
            self.inner.recent.saw(key);
        }
        done
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        ready()?;
        let (record, counter) = (self.record_key(key), self.fence_key(key));
        self.step(false, |again| {
            let mut inv = self.inner.scripts.release.prepare_invoke();
            inv.key(&record)
                .key(&counter)
                .arg(fence.0)
                .arg(ms(FENCE_COUNTER_GRACE))
                .arg(u8::from(again));
            inv
        })
        .await
    }

    async fn renew(&self, key: &Key, fence: Fence, lease: Duration) -> Result<(), StoreError> {
        ready()?;
        let record = self.record_key(key);
        // Renewing twice renews: a resend needs no flag.
        self.step(false, |_| {
            let mut inv = self.inner.scripts.renew.prepare_invoke();
            inv.key(&record).arg(fence.0).arg(ms(lease));
            inv
        })
        .await
    }

    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError> {
        // Its timeout is Tokio's timer, its subscription a connection.
        crate::tokio_ready::store_step(true)?;
        let interest = self.interest(self.channel(key).into_bytes());
        // The deadline bounds everything, subscribing included.
        let waited = tokio::time::timeout(max, async {
            // In a task of its own, which runs to its end: this wait dropped halfway (its
            // caller gave up, or `max` ran out) with its `SUBSCRIBE` sent would leave the server
            // subscribed while the store's own list says otherwise, and no later wait's end
            // would unsubscribe the channel.
            let (inner, channel) = (Arc::clone(&self.inner), interest.channel.clone());
            let subscribed =
                tokio::spawn(async move { inner.sync_subscription(&channel).await }).await;
            let subscribed = subscribed.unwrap_or(false);
            let (first, cap) = if subscribed {
                (SUBSCRIBED_RECHECK, SUBSCRIBED_RECHECK)
            } else {
                (POLL_MIN, POLL_MAX)
            };
            // Flagged as waited on only when subscribed: a flag makes writers publish.
            wait::poll_with_backoff(
                &interest.notify,
                first,
                || cap,
                |_| self.watch(key, fence, subscribed),
            )
            .await
        });
        waited.await.unwrap_or(Ok(()))
    }

    async fn forget(&self, key: &Key) -> Result<bool, StoreError> {
        ready()?;
        self.inner.recent.drop_key(key);
        let mut inv = self.inner.scripts.forget.prepare_invoke();
        inv.key(self.record_key(key)).key(self.fence_key(key)).arg(ms(FENCE_COUNTER_GRACE));
        // A resend after a reply lost once the record was removed answers that there was none.
        Ok(self.run_resent(inv).await?.int()? > 0)
    }

    async fn forget_seen(&self, key: &Key, fence: Fence, done: bool) -> Result<bool, StoreError> {
        ready()?;
        let mut inv = self.inner.scripts.forget_seen.prepare_invoke();
        inv.key(self.record_key(key))
            .key(self.fence_key(key))
            .arg(ms(FENCE_COUNTER_GRACE))
            .arg(fence.0)
            .arg(if done { "d" } else { "f" });
        let found = match self.run_resent(inv).await?.int()? {
            1 => Forgot::Removed,
            0 => Forgot::Absent,
            _ => Forgot::Changed,
        };
        if found == Forgot::Removed {
            self.inner.recent.drop_key(key);
        }
        found.answer()
    }

    /// Lists by `SCAN`, on a Redis Cluster every master in turn; each record is read on the node
    /// holding it, following `MOVED` and `ASK` (`store/redis/admin.rs`). On a Redis Cluster, a
    /// record whose slot stays on its master(s) for the whole listing, including a slot half
    /// migrated before it began, is listed exactly once. A record whose slot moves to another
    /// master while the listing runs (from its first page to its last) may be **listed twice**
    /// (scanned on the old master, then again on the new one, scanned later) or **missed** (the
    /// new master scanned before the record arrived, the old one after it left); list again once
    /// the migration has ended for a complete view.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        ready()?;
        self.list_records(query).await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        ready()?;
        self.inspect_record(key).await
    }

    async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: &Resolution,
    ) -> Result<(), StoreError> {
        ready()?;
        self.inner.recent.drop_key(key);
        self.resolve_record(key, fence, resolution).await
    }

    /// Redis removes a record itself when its retention ends (the expiry set by the write that
    /// completed it): nothing is left to purge, and this answers 0 without a command.
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        ready()?;
        self.count_records().await
    }
}

/// Every step but a wait (which checks timers and I/O itself, first): outside a runtime, or on
/// one without timers or I/O, a connection or a resend's pause would be Tokio's panic (a store
/// used directly, from a `static`, under another executor).
fn ready() -> Result<(), StoreError> {
    crate::tokio_ready::store_step(true)
}

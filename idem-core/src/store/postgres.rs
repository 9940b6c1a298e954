//! The PostgreSQL store (feature `postgres`): shared by many processes and machines.
//!
//! A claim is one call of the function `idem_claim` (created with the schema): it reads the row
//! and answers from it when the claim cannot take it (a replay, a live lease, a mismatch, an
//! unknown outcome), so the common repeat costs one indexed read and writes nothing; otherwise it
//! runs `INSERT .. ON CONFLICT (key) DO UPDATE .. WHERE <free or expired> RETURNING ..`, whose
//! conflict check re-decides on the newest row, so nothing is read and then written unchecked.
//! When that check sees a row newer than the read (a concurrent claim), the upsert changes nothing
//! and the function reads again (each statement in it takes a new snapshot under READ
//! COMMITTED). complete, release and renew are conditional on the fence in one statement.
//!
//! A statement whose reply was lost (the connection broke after the server ran it) is sent again
//! on a new connection, and answers as the first send would have (see `store/resend.rs`): a
//! claim carries an owner token unique to the call, stored in the row (`owner`), so its resend
//! finds its own row and acquires it with the same fence; a resent completion that finds the row
//! completed under its fence succeeds; a resent release that finds nothing to release succeeds;
//! renew is idempotent. A claim that gives up releases in the background the row it may have
//! created, by owner token.
//!
//! Leases and retention are measured on the server's clock (`now()`); fences come from the
//! sequence `idem_fence`, so they increase across release, takeover, forget and retention expiry.
//! Waiters are woken across processes by `LISTEN/NOTIFY` on the channel `idem_wake` (only records
//! someone waits on send a notification, so the common path pays nothing for it), with bounded
//! polling as the fallback, and never past the caller's `max`.
//!
//! Connections: a fixed set (4 by default) of pipelined tokio-postgres connections plus one
//! listener connection, opened on demand and re-opened after a failure, so the store works again
//! by itself once the server is back. TLS (feature `postgres-tls`) follows the connection string's
//! `sslmode` and `sslrootcert` as libpq does: see [`PostgresStore::connect`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, Config, Statement};

use super::codec::{self, encode, fence_param, ms, now_ms};
use super::resend::{self, Failed, GiveUp, Owner};
use super::sweep::SweepClock;
use super::{Claim, ClaimRequest, Fence, OnExpired, Outcome, Record, Store, StoreError};
use crate::key::{Fingerprint, Key};

mod pool;
mod tls;
#[cfg(feature = "postgres-tls")]
mod verify;

use pool::PgClient;
use tls::Target;

/// The schema this version reads and writes; stored in `idem_meta` as `schema_version`.
///
/// History: 1, the tables; 2, adds the `idem_claim` function (a database at version 1 is migrated
/// when a store of this version connects). Changes that stores of the same version keep working
/// with are revisions ([`SCHEMA_REVISION`]).
pub const SCHEMA_VERSION: i64 = 2;

/// The revision of [`SCHEMA_VERSION`] this store writes; stored in `idem_meta` as
/// `schema_revision` (absent: 0). Stores of an older revision of the same version keep working on
/// a database of a newer one, so processes can be upgraded one by one.
///
/// History: 1 adds the `owner` column and `idem_claim(k, fp, lease_ms, take, own)` (the owner
/// token); the function of revision 0, which older stores call, becomes the new one with no
/// token.
pub const SCHEMA_REVISION: i64 = 1;

/// The `LISTEN/NOTIFY` channel; the payload is the key.
const CHANNEL: &str = "idem_wake";

/// Serializes schema creation across processes (`pg_advisory_xact_lock`).
const SCHEMA_LOCK: i64 = 0x6964_656d_0001;

const SCHEMA: &str = "
CREATE SEQUENCE idem_fence AS bigint;
CREATE TABLE idem_records (
    key         text PRIMARY KEY,
    fingerprint text NOT NULL,
    fence       bigint NOT NULL,
    -- 0: in flight until lease_until; 1: done, kept until expires_at.
    state       smallint NOT NULL,
    lease_until timestamptz,
    expires_at  timestamptz,
    -- Outcome kind when done: 1 success, 2 failure, 3 unknown; payload is its JSON text.
    kind        smallint,
    payload     text,
    -- Whether the last acquisition took over an expired lease (read by RETURNING).
    takeover    boolean NOT NULL DEFAULT false,
    -- Whether someone waits on this holder: complete and release then NOTIFY.
    waited      boolean NOT NULL DEFAULT false,
    owner       text
);
CREATE INDEX idem_records_expiry ON idem_records (expires_at) WHERE state = 1;
";

/// The claim, as a function so that the common answers cost one indexed read: it reads the row
/// and returns it when the claim cannot take it (a replay, a live lease, a mismatch, an unknown
/// outcome), writing nothing; otherwise it upserts. The upsert acquires when the key is absent,
/// its retention ended, or its lease expired with the same fingerprint and the request takes over
/// (`take`). When the upsert's conflict check sees a newer row than the read did (a concurrent
/// claim), it changes nothing and the loop reads again: each statement inside takes a new
/// snapshot under READ COMMITTED. One row: acquired, fence, takeover, fingerprint, state, alive
/// (the lease or the retention has not ended), lease remaining (ms), outcome kind, payload; all
/// NULL after 16 rounds of racing writers. Not a set-returning function: no tuplestore per call.
///
/// `own` is the claim's owner token (see `store/resend.rs`), stored in the row it acquires. A row
/// in flight under the same token was created by an earlier send of this very claim whose reply
/// was lost: the upsert then keeps its fence and answers acquired again, with a fresh lease.
const CLAIM_FUNCTION: &str = "
CREATE OR REPLACE FUNCTION idem_claim(k text, fp text, lease_ms bigint, take boolean, own text,
    OUT o_acquired boolean, OUT o_fence bigint, OUT o_takeover boolean, OUT o_fingerprint text,
    OUT o_state smallint, OUT o_alive boolean, OUT o_remaining_ms bigint, OUT o_kind smallint,
    OUT o_payload text)
LANGUAGE plpgsql AS $fn$
DECLARE
    mine boolean;
BEGIN
    FOR round IN 1..16 LOOP
        -- One statement and one test on the common path: every plpgsql expression costs.
        SELECT false, fence, takeover, fingerprint, state,
               CASE WHEN state = 0 THEN lease_until > now() ELSE expires_at > now() END,
               (extract(epoch FROM lease_until - now()) * 1000)::bigint, kind, payload,
               (state = 0 AND owner = own) IS TRUE
        INTO o_acquired, o_fence, o_takeover, o_fingerprint, o_state, o_alive, o_remaining_ms,
             o_kind, o_payload, mine
        FROM idem_records WHERE key = k;
        -- Takeable: retention ended, or lease ended and this claim takes over, or the row is this
        -- claim's own. Anything else, a row of an unknown state included, is the answer (the
        -- client judges it).
        IF FOUND AND NOT (mine OR (o_alive IS FALSE
                          AND (o_state = 1 OR (o_state = 0 AND o_fingerprint = fp AND take)))) THEN
            RETURN;
        END IF;
        -- Claims that may write take the key's lock first, so fences are drawn in the order
        -- owners acquire: a fence drawn before waiting on another claim's row would otherwise
        -- land below that claim's (held until this call's transaction ends).
        PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
        INSERT INTO idem_records AS x
            (key, fingerprint, fence, state, lease_until, takeover, owner)
        VALUES (k, fp, nextval('idem_fence'), 0, now() + lease_ms * interval '1 millisecond', false,
                own)
        ON CONFLICT (key) DO UPDATE SET
            fingerprint = EXCLUDED.fingerprint,
            fence = CASE WHEN x.owner = own THEN x.fence ELSE EXCLUDED.fence END,
            takeover = CASE WHEN x.owner = own THEN x.takeover ELSE x.state = 0 END,
            state = 0,
            lease_until = EXCLUDED.lease_until,
            expires_at = NULL,
            kind = NULL,
            payload = NULL,
            waited = CASE WHEN x.owner = own THEN x.waited ELSE false END,
            owner = own
        WHERE (x.state = 1 AND x.expires_at <= now())
           OR (x.state = 0 AND x.lease_until <= now() AND x.fingerprint = EXCLUDED.fingerprint
               AND take)
           OR (x.state = 0 AND x.owner = own)
        RETURNING true, x.fence, x.takeover, NULL, NULL, NULL, NULL, NULL, NULL
        INTO o_acquired, o_fence, o_takeover, o_fingerprint, o_state, o_alive, o_remaining_ms,
             o_kind, o_payload;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    -- Gave up racing: o_acquired NULL, which the client reads as 'send again'.
    o_acquired := NULL;
END
$fn$";

/// The function of revision 0 (no owner token), which stores of that revision call, is the new one
/// with no token, so their takeovers clear the previous owner's token too (a token left on a row
/// another owner took would let the first owner's resend acquire it).
const CLAIM_FUNCTION_REV0: &str = "
CREATE OR REPLACE FUNCTION idem_claim(k text, fp text, lease_ms bigint, take boolean,
    OUT o_acquired boolean, OUT o_fence bigint, OUT o_takeover boolean, OUT o_fingerprint text,
    OUT o_state smallint, OUT o_alive boolean, OUT o_remaining_ms bigint, OUT o_kind smallint,
    OUT o_payload text)
LANGUAGE sql AS $fn$ SELECT * FROM idem_claim(k, fp, lease_ms, take, NULL::text) $fn$";

const CLAIM: &str =
    "SELECT * FROM idem_claim($1::text, $2::text, $3::bigint, $4::boolean, $5::text)";

const COMPLETE: &str = "
WITH u AS (
    UPDATE idem_records
    SET state = 1, lease_until = NULL, kind = $4, payload = $5,
        expires_at = now() + $3::bigint * interval '1 millisecond'
    WHERE key = $1 AND fence = $2 AND state = 0
    RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM u";

const RELEASE: &str = "
WITH d AS (
    DELETE FROM idem_records WHERE key = $1 AND fence = $2 AND state = 0 RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d";

/// A resent completion that changed nothing: was the record completed under the fence (by the
/// first send)?
const COMPLETED: &str = "SELECT 1 FROM idem_records WHERE key = $1 AND fence = $2 AND state = 1";

/// A claim that gave up releases the record it may have created, by owner token.
const RELEASE_OWNED: &str = "
WITH d AS (
    DELETE FROM idem_records WHERE key = $1 AND owner = $2 AND state = 0 RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d";

const RENEW: &str = "
UPDATE idem_records SET lease_until = now() + $3::bigint * interval '1 millisecond'
WHERE key = $1 AND fence = $2 AND state = 0";

/// Marks the holder as waited on, if still in flight under the fence with a live lease; returns
/// the lease remaining (ms).
const MARK_WAITED: &str = "
UPDATE idem_records SET waited = true
WHERE key = $1 AND fence = $2 AND state = 0 AND lease_until > now()
RETURNING (extract(epoch FROM lease_until - now()) * 1000)::bigint";

const HELD: &str = "
SELECT (extract(epoch FROM lease_until - now()) * 1000)::bigint FROM idem_records
WHERE key = $1 AND fence = $2 AND state = 0 AND lease_until > now()";

const FORGET: &str = "
WITH d AS (DELETE FROM idem_records WHERE key = $1 RETURNING key)
SELECT pg_notify('idem_wake', key) FROM d";

const SWEEP: &str = "
DELETE FROM idem_records WHERE key IN (
    SELECT key FROM idem_records WHERE state = 1 AND expires_at <= now() LIMIT 1000)";

/// Connections opened by [`PostgresStore::connect`].
pub const DEFAULT_CONNECTIONS: usize = 4;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_FIRST: Duration = Duration::from_millis(2);
/// Polling cap while the listener is down (polling is then the only wake-up).
const POLL_MAX_UNLISTENED: Duration = Duration::from_millis(50);
/// Polling cap while notifications flow (polling only covers a lost notification).
const POLL_MAX_LISTENED: Duration = Duration::from_millis(500);
/// How many times a claim is sent again when the function gave up racing concurrent writers.
const CLAIM_RUNS: usize = 4;

/// One connection with its prepared statements.
struct Conn {
    client: PgClient,
    claim: Statement,
    complete: Statement,
    release: Statement,
    renew: Statement,
    mark_waited: Statement,
    held: Statement,
    forget: Statement,
    sweep: Statement,
}

/// One call's use of a connection.
struct Held<'a> {
    conn: Arc<Conn>,
    _busy: Busy<'a>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

/// Counts a call in [`Inner::busy`] until dropped.
struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// In-process waiters by key, woken by notifications and by this store's own writes.
#[derive(Default)]
struct Waiters {
    map: Mutex<HashMap<Key, Arc<Notify>>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Notify>>> {
        crate::sync::lock(&self.map)
    }
    fn register(&self, key: Key) -> Arc<Notify> {
        Arc::clone(self.lock().entry(key).or_default())
    }
    fn unregister(&self, key: &Key, notify: Arc<Notify>) {
        let mut map = self.lock();
        // Ours and the map's: nobody else waits on this key.
        if Arc::strong_count(&notify) == 2 {
            map.remove(key);
        }
    }
    fn wake(&self, key: &Key) {
        if let Some(n) = self.lock().get(key) {
            n.notify_waiters();
        }
    }
    fn wake_all(&self) {
        for n in self.lock().values() {
            n.notify_waiters();
        }
    }
}

struct Inner {
    /// Where the slots connect and the listener listens (`None`: a pool without a listener).
    target: Option<Target>,
    /// The application's pool ([`PostgresStore::from_pool`]), used instead of the slots.
    pool: Option<deadpool_postgres::Pool>,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Conn>>>>,
    /// Calls using a connection now: a call takes slot `busy % slots`, so connections beyond the
    /// first open only under concurrency.
    busy: AtomicUsize,
    waiters: Arc<Waiters>,
    listening: Arc<AtomicBool>,
    listener: Mutex<Option<JoinHandle<()>>>,
    sweeps: SweepClock,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.listener.get_mut().ok().and_then(Option::take) {
            task.abort();
        }
    }
}

/// The PostgreSQL [`Store`]. Cheap to clone (clones share the connections).
///
/// Errors: [`StoreError::Unavailable`] with the cause when the server cannot be reached or a
/// statement fails (the next call reconnects); [`StoreError::Incompatible`] for a database with
/// another schema version or a record this version cannot decode.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("connections", &self.inner.slots.len())
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects with a libpq-style connection string (`host=127.0.0.1 user=postgres dbname=app`)
    /// or URL (`postgresql://user@host:5432/app?sslmode=verify-full`), with
    /// [`DEFAULT_CONNECTIONS`] connections, and creates or checks the schema. Must run inside a
    /// tokio runtime.
    ///
    /// TLS (feature `postgres-tls`, rustls) follows libpq's `sslmode`: `disable`, `prefer` (the
    /// default: TLS when the server offers it), `require` (encrypted, certificate unchecked),
    /// `verify-ca` (the chain must lead to a trusted root) and `verify-full` (and the host name
    /// must match). The roots are the PEM file `sslrootcert` names, else the system's roots; with
    /// `sslrootcert`, `prefer` and `require` check the chain as `verify-ca` does.
    ///
    /// Fails with [`StoreError::InvalidConfig`] for a malformed string, an unknown `sslmode`, an
    /// unreadable `sslrootcert`, or a TLS mode without the `postgres-tls` feature;
    /// [`StoreError::Unavailable`] when the server cannot be reached (5 s connect timeout unless
    /// the string sets `connect_timeout`) or a TLS check fails (the message says which); and
    /// [`StoreError::Incompatible`] when the schema is from another version.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::open_target(Target::parse(url)?, DEFAULT_CONNECTIONS).await
    }

    /// Connects with a parsed [`Config`] (e.g. to set `options`, such as a `search_path` for
    /// another schema) and `connections` connections (at least 1). Its `ssl_mode` applies
    /// (`require`: encrypted, certificate unchecked); use [`connect`](Self::connect) for
    /// `verify-ca` and `verify-full`.
    pub async fn connect_with(config: Config, connections: usize) -> Result<Self, StoreError> {
        Self::open_target(Target::from_config(config)?, connections).await
    }

    async fn open_target(target: Target, connections: usize) -> Result<Self, StoreError> {
        let store = Self::assemble(Some(target), None, connections);
        // Opens the first connection now, so a wrong address or schema fails here.
        store.conn().await?;
        Ok(store)
    }

    /// The store around its connection source; the listener starts when there is a target.
    fn assemble(
        target: Option<Target>,
        pool: Option<deadpool_postgres::Pool>,
        connections: usize,
    ) -> Self {
        let waiters = Arc::new(Waiters::default());
        let listening = Arc::new(AtomicBool::new(false));
        let listener = target.clone().map(|target| {
            tokio::spawn(listen(target, Arc::clone(&waiters), Arc::clone(&listening)))
        });
        PostgresStore {
            inner: Arc::new(Inner {
                target,
                pool,
                slots: (0..connections.max(1)).map(|_| tokio::sync::Mutex::new(None)).collect(),
                busy: AtomicUsize::new(0),
                waiters,
                listening,
                listener: Mutex::new(listener),
                sweeps: SweepClock::new(),
            }),
        }
    }

    /// Removes every record whose retention ended (at most 1000 per call); returns how many.
    /// Claims already treat them as absent; this only reclaims space. Runs on its own every 60 s
    /// during claims.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let conn = self.conn().await?;
        let swept = conn.client.execute(&conn.sweep, &[]).await;
        swept.map_err(pg)
    }

    /// A connection, opened (or re-opened after a failure) on demand, held until the returned
    /// guard is dropped.
    async fn conn(&self) -> Result<Held<'_>, StoreError> {
        let busy = Busy(&self.inner.busy);
        if let Some(pool) = &self.inner.pool {
            let conn = pool::checkout(pool, CONNECT_TIMEOUT).await?;
            return Ok(Held { conn: Arc::new(conn), _busy: busy });
        }
        let i = busy.0.fetch_add(1, Ordering::Relaxed) % self.inner.slots.len();
        let mut slot = self.inner.slots[i].lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(Held { conn: Arc::clone(conn), _busy: busy });
        }
        *slot = None;
        let Some(target) = &self.inner.target else {
            return Err(StoreError::unavailable("the PostgreSQL store has no connection source"));
        };
        let conn = Arc::new(open(target).await?);
        *slot = Some(Arc::clone(&conn));
        Ok(Held { conn, _busy: busy })
    }

    async fn wait_inner(&self, key: &Key, fence: Fence, notify: &Notify) -> Result<(), StoreError> {
        let mut pause = POLL_FIRST;
        let mut first = true;
        loop {
            // Registered before the check, so a wake-up in between is not missed.
            let woken = notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let row = {
                let conn = self.conn().await?;
                let stmt = if first { &conn.mark_waited } else { &conn.held };
                conn.client.query_opt(stmt, &[&key.as_str(), &fence_param(fence)]).await
            };
            first = false;
            let Some(row) = row.map_err(pg)? else { return Ok(()) };
            let remaining: Option<i64> = row.try_get(0).map_err(pg)?;
            let cap = if self.inner.listening.load(Ordering::Relaxed) {
                POLL_MAX_LISTENED
            } else {
                POLL_MAX_UNLISTENED
            };
            // Wake at lease expiry at the latest: a takeover needs a claim to happen.
            let lease_left = Duration::from_millis(remaining.unwrap_or(0).max(1) as u64);
            let _ = tokio::time::timeout(pause.min(lease_left), woken).await;
            pause = (pause * 2).min(cap);
        }
    }
}

/// Opens one connection, checks or creates the schema, and prepares the statements.
async fn open(target: &Target) -> Result<Conn, StoreError> {
    let (mut client, connection) = target.connect().await?;
    tokio::spawn(async move {
        // Ends when the client is dropped or the connection breaks; the error resurfaces as
        // the next statement's error.
        let _ = connection.await;
    });
    ensure_schema(&mut client).await?;
    let prepare = |sql| client.prepare(sql);
    let (claim, complete, release, renew) =
        tokio::try_join!(prepare(CLAIM), prepare(COMPLETE), prepare(RELEASE), prepare(RENEW))
            .map_err(|e| match e.code() {
                // E.g. the tables were restored without their functions.
                Some(&SqlState::UNDEFINED_FUNCTION) => StoreError::Incompatible(format!(
                    "the PostgreSQL database is at idem schema version {SCHEMA_VERSION} but \
                     lacks the function idem_claim ({}); re-create the schema or restore it \
                     whole",
                    PgError(e)
                )),
                _ => pg(e),
            })?;
    let (mark_waited, held, forget, sweep) =
        tokio::try_join!(prepare(MARK_WAITED), prepare(HELD), prepare(FORGET), prepare(SWEEP))
            .map_err(pg)?;
    Ok(Conn {
        client: PgClient::Own(client),
        claim,
        complete,
        release,
        renew,
        mark_waited,
        held,
        forget,
        sweep,
    })
}

const VERSION: &str = "
SELECT max(value) FILTER (WHERE name = 'schema_version'),
       coalesce(max(value) FILTER (WHERE name = 'schema_revision'), 0)
FROM idem_meta";

fn incompatible_version(v: i64) -> StoreError {
    StoreError::Incompatible(format!(
        "the PostgreSQL database has idem schema version {v}; this idem reads version \
         {SCHEMA_VERSION}"
    ))
}

/// The schema version and revision recorded in `idem_meta` (version `None` when not recorded).
async fn version_of(
    client: &impl tokio_postgres::GenericClient,
) -> Result<(Option<i64>, i64), tokio_postgres::Error> {
    let row = client.query_one(VERSION, &[]).await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

async fn ensure_schema(client: &mut Client) -> Result<(), StoreError> {
    // The common case, one round trip: the schema exists at our version and revision.
    match version_of(client).await {
        Ok((Some(SCHEMA_VERSION), r)) if r >= SCHEMA_REVISION => return Ok(()),
        Ok((Some(1 | SCHEMA_VERSION) | None, _)) => {}
        Ok((Some(v), _)) => return Err(incompatible_version(v)),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => {}
        Err(e) => return Err(pg(e)),
    }
    let tx = client.transaction().await.map_err(pg)?;
    let found = async {
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK]).await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS idem_meta (name text PRIMARY KEY, value bigint NOT NULL)",
        )
        .await?;
        let fresh = match version_of(&tx).await? {
            (Some(SCHEMA_VERSION), r) if r >= SCHEMA_REVISION => return Ok(None),
            (Some(1 | SCHEMA_VERSION), _) => false,
            (Some(v), _) => return Ok(Some(v)),
            (None, _) => {
                let records: bool = tx
                    .query_one("SELECT to_regclass('idem_records') IS NOT NULL", &[])
                    .await?
                    .try_get(0)?;
                if records {
                    return Ok(Some(0));
                }
                true
            }
        };
        if fresh {
            tx.batch_execute(SCHEMA).await?;
        } else {
            // 1 -> 2 added the claim function; revision 1 the owner column. Stores of version 2
            // that are still running keep working (their claim function now clears owner
            // tokens). Stores of version 1 must stop first: their own upsert would keep a
            // previous owner's token on a row it takes over.
            tx.batch_execute("ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS owner text")
                .await?;
        }
        tx.batch_execute(CLAIM_FUNCTION).await?;
        tx.batch_execute(CLAIM_FUNCTION_REV0).await?;
        tx.execute(
            "INSERT INTO idem_meta (name, value) VALUES ('schema_version', $1), \
             ('schema_revision', $2) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
            &[&SCHEMA_VERSION, &SCHEMA_REVISION],
        )
        .await?;
        Ok::<_, tokio_postgres::Error>(None)
    }
    .await
    .map_err(pg)?;
    match found {
        None => tx.commit().await.map_err(pg),
        Some(0) => Err(StoreError::Incompatible(
            "the PostgreSQL database has an idem_records table without a schema version".into(),
        )),
        Some(v) => Err(incompatible_version(v)),
    }
}

/// The listener: one connection that `LISTEN`s on [`CHANNEL`] and wakes waiters by key;
/// reconnects after a failure (waking everyone, since notifications may have been lost).
async fn listen(target: Target, waiters: Arc<Waiters>, listening: Arc<AtomicBool>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Ok((client, mut connection)) = target.connect().await {
            let driver = {
                let waiters = Arc::clone(&waiters);
                async move {
                    while let Some(Ok(msg)) =
                        std::future::poll_fn(|cx| connection.poll_message(cx)).await
                    {
                        if let AsyncMessage::Notification(n) = msg
                            && let Some(key) = Key::parse(n.payload())
                        {
                            waiters.wake(&key);
                        }
                    }
                }
            };
            let subscribe = async {
                if client.batch_execute(&format!("LISTEN {CHANNEL}")).await.is_ok() {
                    listening.store(true, Ordering::Relaxed);
                    waiters.wake_all();
                }
                // Keeps the client (and so the connection) alive while the driver runs.
                std::future::pending::<()>().await
            };
            tokio::select! {
                () = driver => {}
                () = subscribe => {}
            }
            listening.store(false, Ordering::Relaxed);
            waiters.wake_all();
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// A PostgreSQL error whose text carries the server's message or the I/O cause (tokio-postgres
/// alone prints "db error" or "error connecting to server" and keeps the rest in its source).
#[derive(Debug)]
struct PgError(tokio_postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{} {}: {}", db.severity(), db.code().code(), db.message()),
            // "error connecting to server" alone hides the reason ("Connection refused").
            None => match std::error::Error::source(&self.0) {
                Some(cause) => write!(f, "{}: {cause}", self.0),
                None => write!(f, "{}", self.0),
            },
        }
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn pg(e: tokio_postgres::Error) -> StoreError {
    StoreError::unavailable(PgError(e))
}

/// A connection could not be had: nothing was sent, so sending again is harmless.
fn unreached(e: StoreError) -> Failed {
    match e {
        StoreError::Unavailable(_) => Failed::Lost(e),
        other => Failed::Answered(other),
    }
}

/// The failure of a statement that was sent: [`Failed::Lost`] when the server may have run it
/// and its reply was lost (the connection closed or broke), else the server's answer.
fn sent(e: tokio_postgres::Error) -> Failed {
    let io = std::error::Error::source(&e).is_some_and(|c| c.is::<std::io::Error>());
    if e.as_db_error().is_none() && (e.is_closed() || io) {
        Failed::Lost(pg(e))
    } else {
        Failed::Answered(pg(e))
    }
}

fn decode(key: &Key, kind: Option<i16>, payload: Option<String>) -> Result<Outcome, StoreError> {
    let present = if payload.is_some() { "present" } else { "absent" };
    codec::decode(kind.map(i64::from), payload).ok_or_else(|| {
        StoreError::Incompatible(format!(
            "the PostgreSQL record of key {key} has an outcome this idem cannot read (kind \
             {kind:?}, payload {present})"
        ))
    })
}

/// What one run of the claim statement means; `Retry` when the function gave up racing
/// concurrent writers.
enum Step {
    Done(Claim),
    Retry,
}

fn decide(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    row: Option<tokio_postgres::Row>,
) -> Result<Step, StoreError> {
    let Some(row) = row else { return Ok(Step::Retry) };
    let get = |e: tokio_postgres::Error| {
        StoreError::Incompatible(format!("the PostgreSQL record of key {key}: {e}"))
    };
    // NULL: the function gave up racing concurrent writers.
    let Some(acquired) = row.try_get::<_, Option<bool>>(0).map_err(get)? else {
        return Ok(Step::Retry);
    };
    let bad = |what: String| {
        StoreError::Incompatible(format!("the PostgreSQL record of key {key} {what}"))
    };
    let fence = row.try_get::<_, i64>(1).map_err(get)?;
    let fence =
        Fence(u64::try_from(fence).map_err(|_| bad(format!("has a negative fence {fence}")))?);
    if acquired {
        return Ok(Step::Done(Claim::Acquired { fence, takeover: row.try_get(2).map_err(get)? }));
    }
    let fingerprint: String = row.try_get(3).map_err(get)?;
    let state: i16 = row.try_get(4).map_err(get)?;
    if state != 0 && state != 1 {
        return Err(bad(format!("has an unknown state {state}")));
    }
    if Fingerprint::parse(&fingerprint).is_none() {
        return Err(bad(format!("has a malformed fingerprint {fingerprint:?}")));
    }
    // NULL: the row lacks its lease end (in flight) or its expiry (done).
    let Some(alive) = row.try_get::<_, Option<bool>>(5).map_err(get)? else {
        return Err(bad("has no lease end or expiry".into()));
    };
    // The function answers only with rows it cannot take; one it could have taken is not a
    // record this version writes.
    let free = match state {
        1 => !alive,
        _ => !alive && fingerprint == fp.as_str() && on_expired == OnExpired::TakeOver,
    };
    if free {
        return Err(bad("is in a state the claim should have taken".into()));
    }
    if fingerprint != fp.as_str() {
        return Ok(Step::Done(Claim::Mismatch));
    }
    Ok(Step::Done(match (state, alive) {
        (1, _) => Claim::Completed(Record {
            fingerprint: *fp,
            outcome: decode(key, row.try_get(7).map_err(get)?, row.try_get(8).map_err(get)?)?,
        }),
        (_, true) => {
            let remaining: Option<i64> = row.try_get(6).map_err(get)?;
            Claim::InFlight {
                fence,
                lease_remaining: Duration::from_millis(remaining.unwrap_or(0).max(0) as u64),
            }
        }
        (_, false) => Claim::Unknown,
    }))
}

#[async_trait]
impl Store for PostgresStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let take_over = req.on_expired == OnExpired::TakeOver;
        let lease = ms(req.lease);
        let owner = Owner::new();
        let give_up = GiveUp::arm({
            let (store, key) = (self.clone(), *req.key);
            move || {
                Box::pin(async move {
                    resend::release_eventually(|| store.release_owned(&key, &owner)).await;
                })
            }
        });
        let mut claimed = Err(StoreError::unavailable("no claim was sent"));
        for _ in 0..CLAIM_RUNS {
            let row = resend::resend(|_| async {
                let conn = self.conn().await.map_err(unreached)?;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
                    &req.key.as_str(),
                    &req.fingerprint.as_str(),
                    &lease,
                    &take_over,
                    &owner.as_str(),
                ];
                conn.client.query_opt(&conn.claim, &params).await.map_err(sent)
            })
            .await;
            claimed = row.and_then(|row| decide(req.key, req.fingerprint, req.on_expired, row));
            if !matches!(claimed, Ok(Step::Retry)) {
                break;
            }
        }
        // Only a claim whose every send may have been lost may have left a record behind.
        if !matches!(claimed, Err(StoreError::Unavailable(_))) {
            give_up.answered();
        }
        match claimed? {
            Step::Done(claim) => {
                if self.inner.sweeps.due(now_ms()) {
                    let store = self.clone();
                    // Space only: a failed sweep is retried at the next interval.
                    tokio::spawn(async move {
                        let _ = store.sweep().await;
                    });
                }
                Ok(claim)
            }
            Step::Retry => Err(StoreError::unavailable(format!(
                "the claim of key {} kept racing concurrent writers ({CLAIM_RUNS} runs)",
                req.key
            ))),
        }
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let (kind, payload) = encode(outcome);
        let (k, f, ttl) = (key.as_str(), fence_param(fence), ms(ttl));
        let changed = resend::resend(|again| async move {
            let conn = self.conn().await.map_err(unreached)?;
            let rows = conn.client.query(&conn.complete, &[&k, &f, &ttl, &kind, &payload]).await;
            let changed = rows.map_err(sent)?.len();
            if changed == 0 && again {
                // Completed under this fence: only its holder, this call, can have done it.
                let done = conn.client.query_opt(COMPLETED, &[&k, &f]).await.map_err(sent)?;
                return Ok(usize::from(done.is_some()));
            }
            Ok(changed)
        })
        .await?;
        self.done_or_lost(key, changed)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let (k, f) = (key.as_str(), fence_param(fence));
        let changed = resend::resend(|again| async move {
            let conn = self.conn().await.map_err(unreached)?;
            let rows = conn.client.query(&conn.release, &[&k, &f]).await;
            // A resend that finds nothing to release: the first send released it, or the lease
            // is gone anyway.
            Ok(rows.map_err(sent)?.len().max(usize::from(again)))
        })
        .await?;
        self.done_or_lost(key, changed)
    }

    async fn renew(&self, key: &Key, fence: Fence, lease: Duration) -> Result<(), StoreError> {
        let (k, f, lease) = (key.as_str(), fence_param(fence), ms(lease));
        // Renewing twice renews.
        let n = resend::resend(|_| async move {
            let conn = self.conn().await.map_err(unreached)?;
            conn.client.execute(&conn.renew, &[&k, &f, &lease]).await.map_err(sent)
        })
        .await?;
        if n == 1 { Ok(()) } else { Err(StoreError::LeaseLost) }
    }

    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError> {
        let notify = self.inner.waiters.register(*key);
        // The deadline bounds everything, a reconnect or a slow server included.
        let r = tokio::time::timeout(max, self.wait_inner(key, fence, &notify)).await;
        self.inner.waiters.unregister(key, notify);
        r.unwrap_or(Ok(()))
    }

    async fn forget(&self, key: &Key) -> Result<bool, StoreError> {
        let conn = self.conn().await?;
        let rows = conn.client.query(&conn.forget, &[&key.as_str()]).await;
        let removed = !rows.map_err(pg)?.is_empty();
        self.inner.waiters.wake(key);
        Ok(removed)
    }
}

impl PostgresStore {
    /// Releases the record of `key` if `owner` holds it (a claim that gave up); whether it did.
    async fn release_owned(&self, key: &Key, owner: &Owner) -> Result<bool, StoreError> {
        let conn = self.conn().await?;
        let rows = conn.client.query(RELEASE_OWNED, &[&key.as_str(), &owner.as_str()]).await;
        let released = !rows.map_err(pg)?.is_empty();
        if released {
            self.inner.waiters.wake(key);
        }
        Ok(released)
    }

    fn done_or_lost(&self, key: &Key, rows: usize) -> Result<(), StoreError> {
        if rows == 1 {
            self.inner.waiters.wake(key);
            Ok(())
        } else {
            Err(StoreError::LeaseLost)
        }
    }
}

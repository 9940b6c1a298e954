//! The PostgreSQL store (feature `postgres`): shared by many processes and machines.
//!
//! A claim is one plain statement on its common paths (`Sql::Claim` in `postgres/conn.rs`): it
//! reads the key's row and answers from it (a replay, a live lease, a mismatch, an unknown
//! outcome), so a repeat costs one indexed read and writes nothing; only when the key has no row
//! does it call `idem_claim_fresh`, which takes the key's lock, draws a fence and inserts with
//! `ON CONFLICT DO NOTHING`: the read and the acquisition share one round trip. The rare paths (a
//! row the claim may take: an expired lease, an ended retention, this claim's own row after a
//! lost reply; or a concurrent claim that inserted first) call the plpgsql function
//! `idem_claim`, which upserts with `INSERT .. ON CONFLICT (key) DO UPDATE .. WHERE <free or
//! expired>`, whose conflict check re-decides on the newest row, and reads again when it lost a
//! race. Both draw fences under the same per-key lock. complete, release and renew are
//! conditional on the fence in one statement.
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
//! someone waits on send a notification, so the common path pays nothing for it), with bounded,
//! jittered polling as the fallback, and never past the caller's `max`.
//!
//! Connections: a deadpool-postgres pool (`postgres/pool.rs`), the store's own
//! ([`PostgresStore::connect`], at most [`DEFAULT_CONNECTIONS`] by default) or the application's
//! ([`PostgresStore::from_pool`]), plus one dedicated listener connection outside the pool. Each
//! store step checks a connection out for its statement; connections open on demand, and one the
//! server closed is replaced, so the store works again by itself once the server is back. TLS
//! (feature `postgres-tls`) follows the connection string's `sslmode` and `sslrootcert` as libpq
//! does: see [`PostgresStore::connect`]. Behind PgBouncer in transaction mode (`pgbouncer=true`,
//! or [`PoolOptions::pgbouncer`]) the store keeps no session state between transactions:
//! statements are unnamed, and waiters poll.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::Config;
use tokio_postgres::types::ToSql;

use super::admin::Forgot;
use super::codec::{encode, fence_param, ms, now_ms};
use super::resend::{self, GiveUp, Owner};
use super::sweep::SweepClock;
use super::wait::{self, WaiterMap};
use super::{
    Claim, ClaimRequest, Fence, ListPage, ListQuery, OnExpired, Outcome, RecordInfo, Resolution,
    Stats, Store, StoreError,
};
use crate::key::Key;

mod admin;
mod claim;
mod conn;
mod error;
mod listen;
mod pool;
mod schema;
mod text;
mod tls;
#[cfg(feature = "postgres-tls")]
mod verify;

use claim::{Step, decide, decide_common};
use conn::Sql;
/// The deadpool-postgres that [`PostgresStore::from_pool`] takes a pool of, re-exported so that an
/// application builds its pool with the same version idem was built with: a pool of another
/// major version is another type, and rustc's "expected `Pool`, found `Pool`" does not say why.
pub use deadpool_postgres;
use error::{pg, sent, unreached};
use listen::listen;
pub use pool::PoolOptions;
use pool::Source;
use schema::Schema;
pub use schema::{SCHEMA_REVISION, SCHEMA_VERSION};
use text::{run_text, text};
use tls::Target;
/// The tokio-postgres whose `Config` [`PostgresStore::connect_with`] takes, re-exported for the
/// same reason.
pub use tokio_postgres;

/// The most connections [`PostgresStore::connect`]'s pool opens at once (they open on demand,
/// so a process with few concurrent calls opens few): that many store steps run at a time, and
/// the rest wait for a free connection. Each step holds its connection alone, so this is the
/// store's concurrency against the server; deadpool's own default is 4 per CPU.
pub const DEFAULT_CONNECTIONS: usize = 16;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_FIRST: Duration = Duration::from_millis(2);
/// Polling cap while the listener is down (polling is then the only wake-up).
const POLL_MAX_UNLISTENED: Duration = Duration::from_millis(50);
/// Polling cap while notifications flow (polling only covers a lost notification).
const POLL_MAX_LISTENED: Duration = Duration::from_millis(500);
/// How many times a claim is sent again when the function gave up racing concurrent writers.
const CLAIM_RUNS: usize = 4;

struct Inner {
    source: Source,
    waiters: Arc<WaiterMap<Key>>,
    listening: Arc<AtomicBool>,
    /// Where the listener connects, to start it again (`None`: no listener).
    listen_to: Option<Target>,
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
            .field("connections", &self.inner.source.pool.status().max_size)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects with a libpq-style connection string (`host=127.0.0.1 user=postgres dbname=app`)
    /// or URL (`postgresql://user@host:5432/app?sslmode=verify-full`), and creates or checks the
    /// schema. Must run inside a tokio runtime.
    ///
    /// The store's connections are a deadpool-postgres pool of at most [`DEFAULT_CONNECTIONS`]
    /// (opened on demand; [`connect_with`](Self::connect_with) sets the size), and one more,
    /// outside the pool, listens for wake-ups. Each store step checks a connection out for its
    /// statement, and waits at most the connect timeout for one (then
    /// [`StoreError::Unavailable`]); the executor bounds the step by
    /// [`Policy::store_timeout`](crate::Policy) as well. A connection the server closed is
    /// replaced when next checked out, and a step whose reply it lost is sent again on another.
    ///
    /// TLS (feature `postgres-tls`, rustls) follows libpq's `sslmode`: `disable`, `prefer` (the
    /// default: TLS when the server offers it), `require` (encrypted, certificate unchecked),
    /// `verify-ca` (the chain must lead to a trusted root) and `verify-full` (and the host name
    /// must match). The roots are the PEM file `sslrootcert` names, else the system's roots; with
    /// `sslrootcert`, `prefer` and `require` check the chain as `verify-ca` does.
    ///
    /// Through PgBouncer in transaction mode (or any pooler that may run each transaction on
    /// another server connection), add `pgbouncer=true` (`postgres://..?pgbouncer=true`, or the
    /// keyword `pgbouncer=true`): statements are then sent unnamed (parsed at each call, since a
    /// prepared statement stays on the server connection that prepared it), and waiters poll
    /// (every 1 to 50 ms, full jitter) instead of listening, since `LISTEN` ends with its
    /// transaction there. Without it, a listener that hears nothing is detected (its probe
    /// notification never arrives, see [`listening`](Self::listening)) and waiters poll, but
    /// prepared statements are not safe: set the option. (It is not detected from a failing
    /// prepared statement: before one fails, a statement may be bound on a server connection
    /// where another client prepared one of the same name, and run that.) Claims stay
    /// exactly-once either way: every step is one statement, and so one transaction.
    ///
    /// Fails with [`StoreError::InvalidConfig`] on a Tokio runtime built without timers or I/O
    /// (`enable_all` builds both), for a malformed string, an unknown `sslmode`, an
    /// unreadable `sslrootcert`, a `pgbouncer` other than `true`/`false`, a TLS mode without
    /// the `postgres-tls` feature, a database whose encoding cannot hold every character (neither
    /// `UTF8` nor `SQL_ASCII`: `LATIN1`, `WIN1252`, ..., where an output with a `€` could not be
    /// stored), a role or database whose transactions are read-only by default
    /// (`default_transaction_read_only`), or a role that may not create idem's tables, migrate
    /// them, or write them (the message names what to grant or do);
    /// [`StoreError::Unavailable`] when the server cannot be reached (5 s connect timeout unless
    /// the string sets `connect_timeout`), is a read-only standby (a reader endpoint named where
    /// the primary was meant), or a TLS check fails (the message says which); and
    /// [`StoreError::Incompatible`] when the schema is from another version.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::open_target(Target::parse(url)?, DEFAULT_CONNECTIONS, Schema::Create).await
    }

    /// [`connect`](Self::connect) to a store that already exists: a database (and `search_path`)
    /// without idem's tables is refused with [`StoreError::InvalidConfig`] instead of getting
    /// them, so a tool that only looks at a store (the `idem` command line) does not make a new,
    /// empty one where a connection string was mistyped. A schema of an earlier revision is
    /// still brought up to date, as `connect` does.
    pub async fn connect_existing(url: &str) -> Result<Self, StoreError> {
        Self::open_target(Target::parse(url)?, DEFAULT_CONNECTIONS, Schema::Existing).await
    }

    /// Connects with a parsed [`Config`] (e.g. to set `options`, such as a `search_path` for
    /// another schema) and a pool of at most `connections` connections (at least 1). Its
    /// `ssl_mode` applies (`require`: encrypted, certificate unchecked); use
    /// [`connect`](Self::connect) for `verify-ca` and `verify-full`.
    pub async fn connect_with(config: Config, connections: usize) -> Result<Self, StoreError> {
        Self::open_target(Target::from_config(config)?, connections, Schema::Create).await
    }

    async fn open_target(
        target: Target,
        connections: usize,
        schema: Schema,
    ) -> Result<Self, StoreError> {
        // tokio-postgres would panic at its first socket or timeout.
        crate::tokio_ready::store_step(true)?;
        let source = Source::own(&target, connections)?;
        source.check(schema).await?;
        // Behind PgBouncer in transaction mode a LISTEN does not outlive its transaction.
        let listen = (!target.pgbouncer).then_some(target);
        Ok(Self::assemble(source, listen))
    }

    /// The store around its connection source; the listener, on its own connection to `listen_to`,
    /// starts when there is one.
    fn assemble(source: Source, listen_to: Option<Target>) -> Self {
        let store = PostgresStore {
            inner: Arc::new(Inner {
                source,
                waiters: Arc::new(WaiterMap::default()),
                listening: Arc::new(AtomicBool::new(false)),
                listen_to,
                listener: Mutex::new(None),
                sweeps: SweepClock::new(),
            }),
        };
        store.keep_listening();
        store
    }

    /// Starts the listener on the current runtime unless it runs: the first time, and again when
    /// the runtime it ran on has ended (a store kept in a `static` and used by one `#[tokio::test]`
    /// runtime after another), since nothing else would start it and waiters would poll for good.
    fn keep_listening(&self) {
        let Some(target) = &self.inner.listen_to else { return };
        let mut listener = crate::sync::lock(&self.inner.listener);
        if listener.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (waiters, listening) = (&self.inner.waiters, &self.inner.listening);
        let task = listen(target.clone(), Arc::clone(waiters), Arc::clone(listening));
        *listener = Some(runtime.spawn(task));
    }

    /// Whether waiters are woken by `LISTEN/NOTIFY` now: the listener is connected and its probe
    /// notification arrived. `false` while it (re)connects, behind PgBouncer (`pgbouncer=true`,
    /// or a listener whose probe never arrived), and for [`from_pool`](Self::from_pool) without a
    /// listen connection; waiters then poll.
    pub fn listening(&self) -> bool {
        self.inner.listening.load(Ordering::Relaxed)
    }

    /// How many keys this store's waits in this process are registered on (each gone with the
    /// last wait on its key, also one dropped mid-wait). For tests, not an API.
    #[doc(hidden)]
    pub fn waiting_keys(&self) -> usize {
        self.inner.waiters.keys()
    }

    /// Removes every record whose retention ended (at most 1000 per call); returns how many.
    /// Claims already treat them as absent; this only reclaims space. Runs on its own every 60 s
    /// during claims.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        let conn = self.conn().await?;
        match conn.execute(Sql::Sweep, &[]).await {
            Ok(swept) => Ok(swept),
            Err(e) => Err(pool::write_refused(&conn, e).await),
        }
    }

    async fn wait_inner(&self, key: &Key, fence: Fence, notify: &Notify) -> Result<(), StoreError> {
        let cap = || {
            if self.inner.listening.load(Ordering::Relaxed) {
                POLL_MAX_LISTENED
            } else {
                POLL_MAX_UNLISTENED
            }
        };
        wait::poll_with_backoff(notify, POLL_FIRST, cap, |first| async move {
            let row = {
                let conn = self.conn().await?;
                let sql = if first { Sql::MarkWaited } else { Sql::Held };
                conn.query_opt(sql, &[&key.as_str(), &fence_param(fence)]).await
            };
            let Some(row) = row.map_err(pg)? else { return Ok(None) };
            let remaining: Option<i64> = row.try_get(0).map_err(pg)?;
            Ok(Some(Duration::from_millis(remaining.unwrap_or(0).max(1) as u64)))
        })
        .await
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn uses_tokio_io(&self) -> bool {
        true
    }

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
        let (k, fp, own) = (req.key.as_str(), req.fingerprint.as_str(), owner.as_str());
        let (tool, tenant, run) =
            (text(req.origin.tool), text(req.origin.tenant), run_text(req.origin.run));
        // The common path: one plain statement answers a replay, a live lease, a mismatch or an
        // unknown outcome from the row, or acquires a key that has none.
        let row = resend::resend(|_| async {
            let conn = self.conn().await.map_err(unreached)?;
            let params: [&(dyn ToSql + Sync); 7] = [&k, &fp, &lease, &own, &tool, &tenant, &run];
            conn.query_opt(Sql::Claim, &params).await.map_err(sent)
        })
        .await;
        let mut claimed =
            row.and_then(|row| decide_common(req.key, req.fingerprint, own, req.on_expired, row));
        // The rare path: the function takes over, re-acquires this claim's own row, or races.
        for _ in 0..CLAIM_RUNS {
            if !matches!(claimed, Ok(Step::Retry)) {
                break;
            }
            let row = resend::resend(|_| async {
                let conn = self.conn().await.map_err(unreached)?;
                let params: [&(dyn ToSql + Sync); 8] =
                    [&k, &fp, &lease, &take_over, &own, &tool, &tenant, &run];
                conn.query_opt(Sql::Take, &params).await.map_err(sent)
            })
            .await;
            claimed = row.and_then(|row| decide(req.key, req.fingerprint, req.on_expired, row));
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
        // JSON payloads never hold a raw NUL; a not-storable reason is plain text and may.
        let payload = payload.map(text);
        let payload = payload.as_deref();
        let (k, f, ttl) = (key.as_str(), fence_param(fence), ms(ttl));
        let changed = resend::resend(|again| async move {
            let conn = self.conn().await.map_err(unreached)?;
            let rows = conn.query(Sql::Complete, &[&k, &f, &ttl, &kind, &payload]).await;
            let changed = rows.map_err(sent)?.len();
            if changed == 0 && again {
                // Completed under this fence: only its holder, this call, can have done it.
                let done = conn.query_opt(Sql::Completed, &[&k, &f]).await.map_err(sent)?;
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
            let rows = conn.query(Sql::Release, &[&k, &f]).await;
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
            conn.execute(Sql::Renew, &[&k, &f, &lease]).await.map_err(sent)
        })
        .await?;
        if n == 1 { Ok(()) } else { Err(StoreError::LeaseLost) }
    }

    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError> {
        // Its timeout is Tokio's timer, its listener a task and a connection.
        crate::tokio_ready::store_step(true)?;
        self.keep_listening();
        // Unregistered when the wait ends, also when its caller drops it mid-wait (a duplicate
        // that gave up): otherwise its key would stay in the map for as long as the store lives.
        let waiting = self.inner.waiters.waiting(*key);
        // The deadline bounds everything, a reconnect or a slow server included.
        let r = tokio::time::timeout(max, self.wait_inner(key, fence, waiting.notify())).await;
        r.unwrap_or(Ok(()))
    }

    async fn forget(&self, key: &Key) -> Result<bool, StoreError> {
        let conn = self.conn().await?;
        let rows = conn.query(Sql::Forget, &[&key.as_str()]).await;
        let removed = !rows.map_err(pg)?.is_empty();
        self.inner.waiters.wake(key);
        Ok(removed)
    }

    async fn forget_seen(&self, key: &Key, fence: Fence, done: bool) -> Result<bool, StoreError> {
        let found = self.forget_seen_record(key, fence, done).await?;
        if found == Forgot::Removed {
            self.inner.waiters.wake(key);
        }
        found.answer()
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.list_records(query).await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        self.inspect_record(key).await
    }

    async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: &Resolution,
    ) -> Result<(), StoreError> {
        let changed = self.resolve_record(key, fence, resolution).await?;
        self.done_or_lost(key, changed)
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            // Batches of 1000, so no statement holds many row locks for long.
            let n = self.sweep().await?;
            purged += n;
            if n < 1000 {
                return Ok(purged);
            }
        }
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        self.count_records().await
    }
}

impl PostgresStore {
    /// Releases the record of `key` if `owner` holds it (a claim that gave up); whether it did.
    async fn release_owned(&self, key: &Key, owner: &Owner) -> Result<bool, StoreError> {
        let conn = self.conn().await?;
        let rows = conn.query(Sql::ReleaseOwned, &[&key.as_str(), &owner.as_str()]).await;
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

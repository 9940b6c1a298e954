//! One connection of the PostgreSQL store, checked out of its pool for one store step, with the
//! store's statements (their SQL is here), prepared or unnamed.
//!
//! The steps that find a record by key and fence or owner write their state test as
//! `state + 0 = ..`: with a plain `state = 0` the planner takes the listing index
//! `(state, kind, key)` over the primary key (both look like one row), and there `state = 0` is
//! the only condition that narrows the scan, so each step read every in-flight entry of that
//! index, and every entry a completed record leaves behind until the next vacuum.

use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::Object;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::error::PgError;
use super::schema::SCHEMA_VERSION;
use crate::store::StoreError;

/// The claim's common path, plain SQL in one statement: the row of the key, and when there is
/// none, a fresh acquisition by `idem_claim_fresh` (only then called: a replay is one indexed read).
/// Columns (read by `decide_common` in `claim.rs`): the fence (drawn now when the key had no row,
/// NULL when another claim inserted it meanwhile; else the row's), then the row as it is: state,
/// fingerprint, lease end, expiry, owner token, outcome kind, payload, and the server's `now()`
/// between them. The client compares the times and the token: expressions cost the server more
/// than sending the columns (each evaluated per call, and `extract(epoch ..)` is numeric
/// arithmetic), and the lease still ends on the server's clock. Anything else (a takeable row, a
/// lost race, this claim's own row) goes to `idem_claim`.
const CLAIM: &str = "
SELECT CASE WHEN r.key IS NULL THEN idem_claim_fresh($1, $2, $3, $4, $5, $6, $7) ELSE r.fence END,
       r.state, r.fingerprint, r.lease_until, r.expires_at, now(), r.owner, r.kind, r.payload
FROM (VALUES (1)) AS one LEFT JOIN idem_records AS r ON r.key = $1";

/// The claim's rare path (takeover, retention ended, a resend of this claim, a lost race).
const TAKE: &str = "SELECT * FROM idem_claim($1, $2, $3, $4, $5, $6, $7, $8)";

const COMPLETE: &str = "
WITH u AS (
    UPDATE idem_records
    SET state = 1, lease_until = NULL, kind = $4, payload = $5, since = now(),
        expires_at = now() + $3 * interval '1 millisecond'
    WHERE key = $1 AND fence = $2 AND state + 0 = 0
    RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM u";

const RELEASE: &str = "
WITH d AS (
    DELETE FROM idem_records WHERE key = $1 AND fence = $2 AND state + 0 = 0 RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d";

/// A resent completion that changed nothing: was the record completed under the fence (by the
/// first send)?
const COMPLETED: &str =
    "SELECT 1 FROM idem_records WHERE key = $1 AND fence = $2 AND state + 0 = 1";

/// A claim that gave up releases the record it may have created, by owner token; not one it
/// took over, which is left to its lease: deleting it would erase the dead owner's attempt,
/// which may have taken effect (the next caller takes it over in turn, and asks the check).
const RELEASE_OWNED: &str = "
WITH d AS (
    DELETE FROM idem_records WHERE key = $1 AND owner = $2 AND state + 0 = 0 AND NOT takeover
    RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d";

const RENEW: &str = "
UPDATE idem_records SET lease_until = now() + $3 * interval '1 millisecond'
WHERE key = $1 AND fence = $2 AND state + 0 = 0";

/// Marks the holder as waited on, if still in flight under the fence with a live lease; returns
/// the lease remaining (ms).
const MARK_WAITED: &str = "
UPDATE idem_records SET waited = true
WHERE key = $1 AND fence = $2 AND state + 0 = 0 AND lease_until > now()
RETURNING (extract(epoch FROM lease_until - now()) * 1000)::bigint";

const HELD: &str = "
SELECT (extract(epoch FROM lease_until - now()) * 1000)::bigint FROM idem_records
WHERE key = $1 AND fence = $2 AND state + 0 = 0 AND lease_until > now()";

const FORGET: &str = "
WITH d AS (DELETE FROM idem_records WHERE key = $1 RETURNING key)
SELECT pg_notify('idem_wake', key) FROM d";

const SWEEP: &str = "
DELETE FROM idem_records WHERE key IN (
    SELECT key FROM idem_records WHERE state = 1 AND expires_at <= now() LIMIT 1000)";

/// The store's statements. Each has its parameter types spelled out, so that it can run as a
/// prepared statement (once per pooled connection) or as an unnamed one, parsed with each call
/// (behind PgBouncer in transaction mode, where a prepared statement does not outlive its
/// transaction's server connection).
#[derive(Clone, Copy, Debug)]
pub(super) enum Sql {
    /// key, fingerprint, lease (ms), owner token, tool, tenant, run id.
    Claim,
    /// key, fingerprint, lease (ms), take over, owner token, tool, tenant, run id.
    Take,
    /// key, fence, ttl (ms), kind, payload.
    Complete,
    /// key, fence.
    Release,
    /// key, fence.
    Completed,
    /// key, owner token.
    ReleaseOwned,
    /// key, fence, lease (ms).
    Renew,
    /// key, fence.
    MarkWaited,
    /// key, fence.
    Held,
    /// key.
    Forget,
    Sweep,
}

impl Sql {
    pub(super) const ALL: [Sql; 11] = [
        Sql::Claim,
        Sql::Take,
        Sql::Complete,
        Sql::Release,
        Sql::Completed,
        Sql::ReleaseOwned,
        Sql::Renew,
        Sql::MarkWaited,
        Sql::Held,
        Sql::Forget,
        Sql::Sweep,
    ];

    pub(super) fn text(self) -> &'static str {
        match self {
            Sql::Claim => CLAIM,
            Sql::Take => TAKE,
            Sql::Complete => COMPLETE,
            Sql::Release => RELEASE,
            Sql::Completed => COMPLETED,
            Sql::ReleaseOwned => RELEASE_OWNED,
            Sql::Renew => RENEW,
            Sql::MarkWaited => MARK_WAITED,
            Sql::Held => HELD,
            Sql::Forget => FORGET,
            Sql::Sweep => SWEEP,
        }
    }

    pub(super) fn types(self) -> &'static [Type] {
        const KEY_FENCE: &[Type] = &[Type::TEXT, Type::INT8];
        match self {
            Sql::Claim => &[
                Type::TEXT,
                Type::TEXT,
                Type::INT8,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT,
            ],
            Sql::Take => &[
                Type::TEXT,
                Type::TEXT,
                Type::INT8,
                Type::BOOL,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT,
            ],
            Sql::Complete => &[Type::TEXT, Type::INT8, Type::INT8, Type::INT2, Type::TEXT],
            Sql::Release | Sql::Completed | Sql::MarkWaited | Sql::Held => KEY_FENCE,
            Sql::ReleaseOwned => &[Type::TEXT, Type::TEXT],
            Sql::Renew => &[Type::TEXT, Type::INT8, Type::INT8],
            Sql::Forget => &[Type::TEXT],
            Sql::Sweep => &[],
        }
    }
}

/// A pooled connection for one store step, given back to the pool when dropped.
pub(super) struct Conn {
    /// Dropped before `retire` (fields drop in order): back in the pool when `retire` runs.
    pub(super) client: Object,
    /// Send every statement unnamed (PgBouncer in transaction mode): parsed at each call, since
    /// a prepared statement stays on the server connection that prepared it.
    unnamed: bool,
    retire: Retire,
}

/// Takes the connection out of the pool once it is back there when it is not to be trusted: it
/// reached a read-only server (see [`Conn::watch`]), and then every idle connection opened
/// before it leaves too, or its step was dropped while a statement was on the way (no answer
/// came in time), and then it alone leaves.
struct Retire {
    pool: Option<deadpool_postgres::Pool>,
    created: std::time::Instant,
    read_only: AtomicBool,
    /// When the statement whose answer has not come (yet) was sent.
    in_flight: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long a statement dropped without its answer must have waited for its connection to be
/// given up: the store's statements answer in milliseconds, and a wait ended by its own bound
/// (`Store::wait`) drops a poll on the way at any moment, which says nothing about the
/// connection.
const SILENT_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for Retire {
    fn drop(&mut self) {
        let silent =
            crate::sync::lock(&self.in_flight).is_some_and(|t| t.elapsed() >= SILENT_AFTER);
        let why = if self.read_only.load(Ordering::Relaxed) {
            "PostgreSQL refused a write as read-only (a standby, or a primary demoted in a \
             failover)"
        } else if silent {
            "a PostgreSQL statement got no answer before its step gave up (a connection gone \
             silent, or a server that stopped answering)"
        } else {
            return;
        };
        if let Some(pool) = &self.pool {
            let created = self.created;
            let read_only = self.read_only.load(Ordering::Relaxed);
            // A refusal as read-only speaks for the server the address names, and so for every
            // connection opened to it before. A statement left unanswered speaks only for its
            // own connection: the server may be answering all along (a row lock held by another
            // session, a slow plan, a busy server) while a caller gave up on it, and the pool's
            // other connections, the application's among them, are then healthy. (Connections
            // are told apart by their opening instant, which the monotonic clock keeps distinct.)
            let retired = pool
                .retain(|_, metrics| {
                    if read_only { metrics.created > created } else { metrics.created != created }
                })
                .removed
                .len();
            tracing::warn!(retired, "{why}; closed, and new connections opened");
        }
    }
}

impl Conn {
    pub(super) fn new(client: Object, unnamed: bool) -> Conn {
        let retire = Retire {
            pool: Object::pool(&client),
            created: Object::metrics(&client).created,
            read_only: AtomicBool::new(false),
            in_flight: std::sync::Mutex::new(None),
        };
        Conn { client, unnamed, retire }
    }

    /// Runs `sent`, a statement on this connection, and notes what the connection is worth
    /// after it:
    /// - dropped before the answer, after [`SILENT_AFTER`] (the step's bound ran out): the
    ///   connection may have gone
    ///   silent (a NAT or load balancer that forgot the flow, a server address gone in a
    ///   failover), which nothing but the kernel's retransmission limit closes, after about 15
    ///   minutes; the pool's recycling keeps it since it is open, and every step given it would
    ///   wait out its bound. It leaves the pool instead of going back to it.
    /// - refused as read-only (SQLSTATE 25006: a hot standby, or a primary demoted by a failover
    ///   behind the same address, as a managed database's writer endpoint or a virtual IP): it
    ///   answers so for as long as it lasts. It leaves the pool when the step gives it back.
    ///
    /// After a refusal as read-only the idle connections opened before it (in the same state)
    /// leave with it, and the next step connects to what the address names now. After a dropped
    /// statement it leaves alone: a statement may wait that long on a server that answers (a
    /// row lock another session holds), and the other connections are then healthy; one that
    /// went silent with it leaves when a step given it gives up in turn.
    pub(super) async fn watch<T>(
        &self,
        sent: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, tokio_postgres::Error> {
        *crate::sync::lock(&self.retire.in_flight) = Some(std::time::Instant::now());
        let answer = sent.await;
        *crate::sync::lock(&self.retire.in_flight) = None;
        if let Err(e) = &answer
            && read_only(e)
        {
            self.retire.read_only.store(true, Ordering::Relaxed);
        }
        answer
    }

    /// Prepares every statement of the store on this connection (kept in its statement cache),
    /// so that a database lacking one of the schema's functions fails now, as incompatible.
    pub(super) async fn prepare_all(&self) -> Result<(), StoreError> {
        if self.unnamed {
            return Ok(());
        }
        let all = Sql::ALL.map(|sql| self.client.prepare_typed_cached(sql.text(), sql.types()));
        futures_util::future::try_join_all(all).await.map_err(|e| match e.code() {
            // E.g. the tables were restored without their functions.
            Some(&SqlState::UNDEFINED_FUNCTION) => StoreError::Incompatible(format!(
                "the PostgreSQL database is at idem schema version {SCHEMA_VERSION} but lacks a \
                 function of it ({}); re-create the schema or restore it whole",
                PgError(e)
            )),
            _ => StoreError::unavailable(PgError(e)),
        })?;
        Ok(())
    }

    /// Runs `sql` with `params` (in the order its [`Sql`] variant lists); its rows. Prepared
    /// once per connection (deadpool's statement cache), or unnamed. Run again when PostgreSQL
    /// rolled it back for a concurrent statement (see [`rolled_back`]).
    pub(super) async fn query(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.watch(again_if_rolled_back(|| self.query_once(sql, params))).await
    }

    async fn query_once(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        if self.unnamed {
            return self.client.query_typed(sql.text(), &typed(sql, params)).await;
        }
        let statement = self.client.prepare_typed_cached(sql.text(), sql.types()).await?;
        match self.client.query(&statement, params).await {
            Err(e) if self.forgot_statements(&e) => {
                let statement = self.client.prepare_typed_cached(sql.text(), sql.types()).await?;
                self.client.query(&statement, params).await
            }
            answer => answer,
        }
    }

    /// Runs `sql`; the first row, if any.
    pub(super) async fn query_opt(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        Ok(self.query(sql, params).await?.into_iter().next())
    }

    /// Runs `sql`; how many rows it changed. Run again as [`query`](Self::query) is.
    pub(super) async fn execute(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        self.watch(again_if_rolled_back(|| self.execute_once(sql, params))).await
    }

    async fn execute_once(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        if self.unnamed {
            return self.client.execute_typed(sql.text(), &typed(sql, params)).await;
        }
        let statement = self.client.prepare_typed_cached(sql.text(), sql.types()).await?;
        match self.client.execute(&statement, params).await {
            Err(e) if self.forgot_statements(&e) => {
                let statement = self.client.prepare_typed_cached(sql.text(), sql.types()).await?;
                self.client.execute(&statement, params).await
            }
            answer => answer,
        }
    }

    /// Whether the server no longer knows a statement this connection prepared: the
    /// application reset the session of a connection it shares with the store (`DISCARD ALL`,
    /// `DEALLOCATE ALL`). Nothing ran (binding failed), so the statement cache, wrong for every
    /// statement now, is emptied and the statement prepared and sent again.
    fn forgot_statements(&self, e: &tokio_postgres::Error) -> bool {
        let forgot = e.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME);
        if forgot {
            self.client.statement_cache.clear();
        }
        forgot
    }
}

/// Whether the server refused the statement as read-only (SQLSTATE 25006,
/// `read_only_sql_transaction`): nothing it would write was written.
pub(super) fn read_only(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION)
}

/// How many times a statement PostgreSQL rolled back is sent in all.
const ROLLED_BACK_SENDS: u32 = 10;
/// The ceiling of the first pause before sending it again (full jitter), doubled each time.
const ROLLED_BACK_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Whether PostgreSQL rolled the statement back because of a concurrent one: SQLSTATE 40001
/// (`serialization_failure`) or 40P01 (`deadlock_detected`). Nothing the statement did remains
/// (each of the store's statements is its own transaction), and PostgreSQL's documented remedy
/// is to run it again ("Serialization Failure Handling"). Under READ COMMITTED, PostgreSQL's
/// default, the store's statements get neither; a database or role whose
/// `default_transaction_isolation` is `repeatable read` or `serializable` answers a claim that
/// races another claim's insert with 40001, and sent again in a new transaction it sees the
/// other's row and joins it.
fn rolled_back(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE
        || *c == SqlState::T_R_DEADLOCK_DETECTED)
}

/// `send` until it is not rolled back, at most [`ROLLED_BACK_SENDS`] times.
async fn again_if_rolled_back<T, F, Fut>(mut send: F) -> Result<T, tokio_postgres::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
{
    let mut pause = ROLLED_BACK_PAUSE;
    for _ in 1..ROLLED_BACK_SENDS {
        match send().await {
            Err(e) if rolled_back(&e) => {
                tokio::time::sleep(crate::store::full_jitter(pause)).await;
                pause = pause.saturating_mul(2);
            }
            answer => return answer,
        }
    }
    send().await
}

fn typed<'a>(sql: Sql, params: &[&'a (dyn ToSql + Sync)]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params.iter().zip(sql.types()).map(|(p, t)| (*p, t.clone())).collect()
}

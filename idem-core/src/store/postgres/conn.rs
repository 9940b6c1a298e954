//! One connection of the PostgreSQL store with its statements (their SQL is here), prepared or
//! unnamed, and how a call gets one: [`PostgresStore::conn`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, Statement};

use super::error::{PgError, pg};
use super::pool::{self, PgClient};
use super::schema::{SCHEMA_VERSION, ensure_schema};
use super::tls::Target;
use super::{CONNECT_TIMEOUT, PostgresStore};
use crate::store::StoreError;

/// The claim's common path, plain SQL in one statement: the row of the key, and when there is
/// none, a fresh acquisition by `idem_claim_fresh` (only then called: a replay is one indexed read).
/// Columns: the fence just drawn (NULL unless acquired now), then the existing row as
/// `idem_claim` answers it. Anything else (a takeable row, a lost race) goes to `idem_claim`.
const CLAIM: &str = "
SELECT CASE WHEN r.key IS NULL THEN idem_claim_fresh($1, $2, $3, $4, $5, $6, $7) END,
       r.fence, r.takeover, r.fingerprint, r.state,
       CASE WHEN r.state = 0 THEN r.lease_until > now() ELSE r.expires_at > now() END,
       (extract(epoch FROM r.lease_until - now()) * 1000)::bigint, r.kind, r.payload,
       (r.state = 0 AND r.owner = $4) IS TRUE
FROM (VALUES (1)) AS one LEFT JOIN idem_records AS r ON r.key = $1";

/// The claim's rare path (takeover, retention ended, a resend of this claim, a lost race).
const TAKE: &str = "SELECT * FROM idem_claim($1, $2, $3, $4, $5, $6, $7, $8)";

const COMPLETE: &str = "
WITH u AS (
    UPDATE idem_records
    SET state = 1, lease_until = NULL, kind = $4, payload = $5, since = now(),
        expires_at = now() + $3 * interval '1 millisecond'
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
UPDATE idem_records SET lease_until = now() + $3 * interval '1 millisecond'
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

/// The store's statements. Each has its parameter types spelled out, so that it can run as a
/// prepared statement (a connection of its own) or as an unnamed one, parsed with each call
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

/// One connection and, unless it goes through PgBouncer, its prepared statements.
pub(super) struct Conn {
    pub(super) client: PgClient,
    /// In the order of [`Sql::ALL`]; empty: every statement is sent unnamed.
    prepared: Vec<Statement>,
}

impl Conn {
    /// Prepares every statement on `client`, or none (`unnamed`).
    pub(super) async fn new(client: PgClient, unnamed: bool) -> Result<Conn, StoreError> {
        let mut prepared = Vec::new();
        if !unnamed {
            let all = Sql::ALL.map(|sql| client.prepare(sql.text(), sql.types()));
            prepared = futures_util::future::try_join_all(all).await.map_err(|e| {
                match e.code() {
                    // E.g. the tables were restored without their functions.
                    Some(&SqlState::UNDEFINED_FUNCTION) => StoreError::Incompatible(format!(
                        "the PostgreSQL database is at idem schema version {SCHEMA_VERSION} but \
                         lacks a function of it ({}); re-create the schema or restore it whole",
                        PgError(e)
                    )),
                    _ => pg(e),
                }
            })?;
        }
        Ok(Conn { client, prepared })
    }

    /// Runs `sql` with `params` (in the order its [`Sql`] variant lists); its rows.
    pub(super) async fn query(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        match self.prepared.get(sql as usize) {
            Some(statement) => self.client.query(statement, params).await,
            None => self.client.query_typed(sql.text(), &typed(sql, params)).await,
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

    /// Runs `sql`; how many rows it changed.
    pub(super) async fn execute(
        &self,
        sql: Sql,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        match self.prepared.get(sql as usize) {
            Some(statement) => self.client.execute(statement, params).await,
            None => self.client.execute_typed(sql.text(), &typed(sql, params)).await,
        }
    }
}

fn typed<'a>(sql: Sql, params: &[&'a (dyn ToSql + Sync)]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params.iter().zip(sql.types()).map(|(p, t)| (*p, t.clone())).collect()
}

/// One call's use of a connection.
pub(super) struct Held<'a> {
    conn: Arc<Conn>,
    _busy: Busy<'a>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

/// Counts a call in [`Inner::busy`](super::Inner::busy) until dropped.
struct Busy<'a>(&'a AtomicUsize);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl PostgresStore {
    /// A connection, opened (or re-opened after a failure) on demand, held until the returned
    /// guard is dropped.
    pub(super) async fn conn(&self) -> Result<Held<'_>, StoreError> {
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
}

/// Opens one connection, checks or creates the schema, and prepares the statements (none behind
/// PgBouncer).
async fn open(target: &Target) -> Result<Conn, StoreError> {
    let (mut client, connection) = target.connect().await?;
    tokio::spawn(async move {
        // Ends when the client is dropped or the connection breaks; the error resurfaces as
        // the next statement's error.
        let _ = connection.await;
    });
    ensure_schema(&mut client).await?;
    Conn::new(PgClient::Own(client), target.pgbouncer).await
}

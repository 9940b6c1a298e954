//! One connection of the PostgreSQL store with its prepared statements (their SQL is here), and
//! how a call gets one: [`PostgresStore::conn`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;

use super::error::{PgError, pg};
use super::pool::{self, PgClient};
use super::schema::{SCHEMA_VERSION, ensure_schema};
use super::tls::Target;
use super::{CONNECT_TIMEOUT, PostgresStore};
use crate::store::StoreError;

pub(super) const CLAIM: &str = "SELECT * FROM idem_claim($1::text, $2::text, $3::bigint, \
                                  $4::boolean, $5::text, $6::text, $7::text, $8::text)";

pub(super) const COMPLETE: &str = "
WITH u AS (
    UPDATE idem_records
    SET state = 1, lease_until = NULL, kind = $4, payload = $5, since = now(),
        expires_at = now() + $3::bigint * interval '1 millisecond'
    WHERE key = $1 AND fence = $2 AND state = 0
    RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM u";

pub(super) const RELEASE: &str = "
WITH d AS (
    DELETE FROM idem_records WHERE key = $1 AND fence = $2 AND state = 0 RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d";

/// A resent completion that changed nothing: was the record completed under the fence (by the
/// first send)?
pub(super) const COMPLETED: &str =
    "SELECT 1 FROM idem_records WHERE key = $1 AND fence = $2 AND state = 1";

/// A claim that gave up releases the record it may have created, by owner token.
pub(super) const RELEASE_OWNED: &str = "
WITH d AS (
    DELETE FROM idem_records WHERE key = $1 AND owner = $2 AND state = 0 RETURNING key, waited
)
SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d";

pub(super) const RENEW: &str = "
UPDATE idem_records SET lease_until = now() + $3::bigint * interval '1 millisecond'
WHERE key = $1 AND fence = $2 AND state = 0";

/// Marks the holder as waited on, if still in flight under the fence with a live lease; returns
/// the lease remaining (ms).
pub(super) const MARK_WAITED: &str = "
UPDATE idem_records SET waited = true
WHERE key = $1 AND fence = $2 AND state = 0 AND lease_until > now()
RETURNING (extract(epoch FROM lease_until - now()) * 1000)::bigint";

pub(super) const HELD: &str = "
SELECT (extract(epoch FROM lease_until - now()) * 1000)::bigint FROM idem_records
WHERE key = $1 AND fence = $2 AND state = 0 AND lease_until > now()";

pub(super) const FORGET: &str = "
WITH d AS (DELETE FROM idem_records WHERE key = $1 RETURNING key)
SELECT pg_notify('idem_wake', key) FROM d";

pub(super) const SWEEP: &str = "
DELETE FROM idem_records WHERE key IN (
    SELECT key FROM idem_records WHERE state = 1 AND expires_at <= now() LIMIT 1000)";

/// One connection with its prepared statements.
pub(super) struct Conn {
    pub(super) client: PgClient,
    pub(super) claim: Statement,
    pub(super) complete: Statement,
    pub(super) release: Statement,
    pub(super) renew: Statement,
    pub(super) mark_waited: Statement,
    pub(super) held: Statement,
    pub(super) forget: Statement,
    pub(super) sweep: Statement,
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

/// Opens one connection, checks or creates the schema, and prepares the statements.
async fn open(target: &Target) -> Result<Conn, StoreError> {
    let (mut client, connection) = target.connect().await?;
    tokio::spawn(async move {
        // Ends when the client is dropped or the connection breaks; the error resurfaces as
        // the next statement's error.
        let _ = connection.await;
    });
    ensure_schema(&mut client).await?;
    Conn::prepared(PgClient::Own(client)).await
}

impl Conn {
    /// Prepares the statements on `client` (once per pooled connection: deadpool's statement
    /// cache).
    pub(super) async fn prepared(client: PgClient) -> Result<Conn, StoreError> {
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
        Ok(Conn { client, claim, complete, release, renew, mark_waited, held, forget, sweep })
    }
}

//! The application's own connection pool (deadpool-postgres): [`PostgresStore::from_pool`].
//! Each call checks a connection out for one statement and gives it back, so the store shares
//! the pool with the application's own queries; statements are prepared once per connection
//! (deadpool's statement cache).
//!
//! [`PostgresStore::connect`] keeps its own connections instead of a pool: concurrent calls
//! pipeline their statements on a few shared connections, where a pool would give each call a
//! connection of its own and queue the rest.

use std::time::Duration;

use deadpool_postgres::{Object, Pool, PoolError};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::conn::Conn;
use super::error::pg;
use super::schema::ensure_schema;
use super::tls::Target;
use super::{CONNECT_TIMEOUT, PostgresStore};
use crate::store::StoreError;

/// A connection of the store: its own (a slot of [`PostgresStore::connect`]) or the pool's,
/// given back when dropped.
pub(super) enum PgClient {
    Own(Client),
    Pooled(Object),
}

impl PgClient {
    /// Prepares `sql` with its parameter types; on a pooled connection once per connection
    /// (deadpool's statement cache).
    pub(super) async fn prepare(
        &self,
        sql: &str,
        types: &[Type],
    ) -> Result<Statement, tokio_postgres::Error> {
        match self {
            PgClient::Own(c) => c.prepare_typed(sql, types).await,
            PgClient::Pooled(o) => o.prepare_typed_cached(sql, types).await,
        }
    }
}

impl std::ops::Deref for PgClient {
    type Target = Client;
    fn deref(&self) -> &Client {
        match self {
            PgClient::Own(c) => c,
            PgClient::Pooled(o) => o,
        }
    }
}

/// Checks a connection out of `pool`, waiting at most `wait`.
pub(super) async fn checkout(pool: &Pool, wait: Duration) -> Result<Conn, StoreError> {
    let object = match tokio::time::timeout(wait, pool.get()).await {
        Ok(Ok(object)) => object,
        Ok(Err(PoolError::Backend(e))) => return Err(pg(e)),
        Ok(Err(e)) => return Err(StoreError::unavailable(format!("PostgreSQL pool: {e}"))),
        Err(_) => {
            let status = pool.status();
            return Err(StoreError::unavailable(format!(
                "no connection of the PostgreSQL pool became free within {} ms ({} of {} in use)",
                wait.as_millis(),
                status.size.saturating_sub(status.available),
                status.max_size
            )));
        }
    };
    Conn::new(PgClient::Pooled(object), false).await
}

impl PostgresStore {
    /// A store on the application's own deadpool-postgres pool: every call checks a connection
    /// out for one statement and gives it back. Creates or checks the schema now.
    ///
    /// `listen` is a connection string for one dedicated connection that `LISTEN`s for wake-ups
    /// (a pooled connection cannot: the pool drives its connections and drops notifications);
    /// with `None`, waiters poll (every 2 ms at first, backing off to 50 ms).
    ///
    /// The pool must reach PostgreSQL directly (or through PgBouncer in session mode): the
    /// statements are prepared once per pooled connection. Behind PgBouncer in transaction mode
    /// use [`connect`](Self::connect) with `pgbouncer=true`.
    ///
    /// A call waits at most 5 s for a free connection, then fails with
    /// [`StoreError::Unavailable`]; the executor bounds each store step by
    /// [`Policy::store_timeout`](crate::Policy) anyway, so an exhausted pool fails the call closed
    /// instead of hanging it.
    pub async fn from_pool(pool: Pool, listen: Option<&str>) -> Result<Self, StoreError> {
        let target = listen.map(Target::parse).transpose()?;
        {
            let mut object = match tokio::time::timeout(CONNECT_TIMEOUT, pool.get()).await {
                Ok(Ok(object)) => object,
                Ok(Err(PoolError::Backend(e))) => return Err(pg(e)),
                Ok(Err(e)) => return Err(StoreError::unavailable(format!("PostgreSQL pool: {e}"))),
                Err(_) => {
                    return Err(StoreError::unavailable(
                        "no connection of the PostgreSQL pool became free within 5 s",
                    ));
                }
            };
            ensure_schema(&mut object).await?;
        }
        Ok(PostgresStore::assemble(target, Some(pool), 0))
    }
}

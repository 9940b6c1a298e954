//! Where the store's connections come from: a deadpool-postgres pool, its own
//! ([`PostgresStore::connect`], built from the connection string) or the application's
//! ([`PostgresStore::from_pool`]). Each store step checks a connection out for its statement and
//! gives it back; statements are prepared once per connection (deadpool's statement cache), or
//! sent unnamed behind PgBouncer in transaction mode. A connection found closed when checked out
//! is replaced by a new one.

use std::time::Duration;

use deadpool_postgres::{Pool, PoolError};

use super::conn::Conn;
use super::error::pg;
use super::schema::{Schema, ensure_schema};
use super::tls::Target;
use super::{CONNECT_TIMEOUT, PostgresStore};
use crate::store::StoreError;
use crate::store::redact::SecretUrl;

/// How [`PostgresStore::from_pool_with`] uses the application's pool.
///
/// ```
/// use idem_core::store::postgres::PoolOptions;
/// // The pool goes through PgBouncer in transaction mode; notifications come from a direct
/// // connection to the server.
/// let options = PoolOptions::new().pgbouncer(true).listen("host=db.internal user=app dbname=app");
/// # let _ = options;
/// ```
#[derive(Clone, Debug, Default)]
pub struct PoolOptions {
    /// Printed without its password (`redact.rs`).
    listen: Option<SecretUrl>,
    pgbouncer: bool,
}

impl PoolOptions {
    /// No listen connection (waiters poll), statements prepared once per pooled connection.
    pub fn new() -> Self {
        Self::default()
    }

    /// A connection string (libpq keywords or URL, with `sslmode` and `sslrootcert` as for
    /// [`PostgresStore::connect`]) for one dedicated connection, outside the pool, that `LISTEN`s
    /// for wake-ups: a pooled connection cannot, since the pool drives its connections and drops
    /// notifications. Without it, waiters poll (every 2 ms at first, backing off to 50 ms, full
    /// jitter). It must reach the server itself, or notifications never arrive: a listener whose
    /// probe notification does not arrive (PgBouncer in transaction mode) is detected, and
    /// waiters poll.
    pub fn listen(mut self, conninfo: impl Into<String>) -> Self {
        self.listen = Some(SecretUrl::new(conninfo));
        self
    }

    /// Whether the pool's connections go through PgBouncer in transaction mode (or another
    /// pooler that may run each transaction on another server connection). When `true`,
    /// statements are sent unnamed (parsed at each call), since a prepared statement stays on the
    /// server connection that prepared it; the store keeps no other session state. Default
    /// `false`.
    pub fn pgbouncer(mut self, yes: bool) -> Self {
        self.pgbouncer = yes;
        self
    }
}

/// Where the store's connections come from.
pub(super) struct Source {
    pub(super) pool: Pool,
    /// The pool's own target ([`PostgresStore::connect`]), for the cause of a refused connection
    /// (which TLS check failed); `None` for the application's pool.
    own: Option<Target>,
    /// How long a step waits for a connection, opening one included.
    wait: Duration,
    unnamed: bool,
}

impl Source {
    /// A pool of at most `size` connections to `target`.
    pub(super) fn own(target: &Target, size: usize) -> Result<Source, StoreError> {
        let pool = Pool::builder(target.manager())
            .max_size(size.max(1))
            .build()
            .map_err(|e| StoreError::InvalidConfig(format!("PostgreSQL pool: {e}")))?;
        let wait = target.connect_bound();
        Ok(Source { pool, own: Some(target.clone()), wait, unnamed: target.pgbouncer })
    }

    /// The application's pool.
    pub(super) fn app(pool: Pool, unnamed: bool) -> Source {
        Source { pool, own: None, wait: CONNECT_TIMEOUT, unnamed }
    }

    /// Checks a connection out, waiting at most [`Source::wait`] (then
    /// [`StoreError::Unavailable`], saying how many connections are in use).
    pub(super) async fn checkout(&self) -> Result<Conn, StoreError> {
        // Every step starts here: outside a runtime, or on one without timers or I/O, the wait
        // below or a new connection would be Tokio's panic (a store used directly, from a
        // `static`, under another executor).
        crate::tokio_ready::store_step(true)?;
        let object = match tokio::time::timeout(self.wait, self.pool.get()).await {
            Ok(Ok(object)) => object,
            Ok(Err(PoolError::Backend(e))) => {
                return Err(match &self.own {
                    Some(target) => target.refused(e),
                    None => pg(e),
                });
            }
            Ok(Err(e)) => return Err(StoreError::unavailable(format!("PostgreSQL pool: {e}"))),
            Err(_) => {
                let status = self.pool.status();
                let in_use = status.size.saturating_sub(status.available);
                // With a free slot the wait went into opening a connection: a server that
                // accepts TCP but never answers the startup, or one out of reach. Saying that
                // the pool was exhausted would send the operator after the wrong cause.
                let why = if in_use < status.max_size {
                    "opening a new PostgreSQL connection did not finish (the server is not \
                     answering, or is out of reach)"
                } else {
                    "no connection of the PostgreSQL pool became free (every one is in use)"
                };
                return Err(StoreError::timed_out(format!(
                    "{why} within {} ms ({in_use} of {} in use)",
                    self.wait.as_millis(),
                    status.max_size
                )));
            }
        };
        Ok(Conn::new(object, self.unnamed))
    }

    /// Creates or checks the schema and, with prepared statements, prepares them on the first
    /// connection, so that a wrong address, an incompatible schema or a missing function fails
    /// when the store is made.
    pub(super) async fn check(&self, schema: Schema) -> Result<(), StoreError> {
        let mut conn = self.checkout().await?;
        if schema == Schema::Create {
            refuse_unusable_database(&conn).await?;
        }
        ensure_schema(&mut conn.client, schema, !self.unnamed).await?;
        if conn.client.is_closed() {
            // An index build whose session was ended (`pg_terminate_backend`) takes its
            // connection with it; the store needs none of what it did.
            drop(conn);
            conn = self.checkout().await?;
        }
        conn.prepare_all().await?;
        warn_if_not_durable(&conn).await;
        Ok(())
    }
}

/// Refuses, before anything is created, a database the store could open but never write:
///
/// - one whose encoding cannot hold every character (`LATIN1`, `WIN1252`, `EUC_JP`, ...): the
///   server converts each text value the store sends (UTF-8, as tokio-postgres speaks it) into
///   the database's encoding and refuses one with a character it has no equivalent for
///   (SQLSTATE 22P05). Outputs and errors are JSON written with their characters as they are,
///   and run ids and tool names are the application's text, so a completion with a `€` or an
///   emoji in its output could never be stored (a `never` tool's record would stay in flight,
///   then answer "outcome unknown"), and every call of a run id with such a character would
///   fail. `UTF8` holds everything, and `SQL_ASCII` stores the bytes unconverted.
/// - one whose transactions are read-only: `default_transaction_read_only` set for the role or
///   the database (a configuration: [`StoreError::InvalidConfig`]), or a hot standby, a replica
///   or reader endpoint named where the primary was meant ([`StoreError::Unavailable`], as a
///   standby met during a failover is). Every claim would be refused (SQLSTATE 25006) and, taken
///   for a primary demoted behind its address, sent again on new connections.
///
/// The command line, which opens an existing store to look at it, is not refused.
async fn refuse_unusable_database(conn: &Conn) -> Result<(), StoreError> {
    let Some(server) = Server::asked(conn).await? else { return Ok(()) };
    if let Some(refused) = server.read_only() {
        return Err(refused);
    }
    let Server { encoding, db, .. } = server;
    if encoding.eq_ignore_ascii_case("UTF8") || encoding.eq_ignore_ascii_case("SQL_ASCII") {
        return Ok(());
    }
    Err(StoreError::InvalidConfig(format!(
        "PostgreSQL database {db:?} has encoding {encoding}, which cannot hold every character \
         of the outputs, errors and run ids idem stores (the server would refuse a completion \
         with a character outside {encoding}, and the call's record would stay in flight): put \
         idem's tables in a UTF8 database (CREATE DATABASE idem ENCODING 'UTF8' TEMPLATE \
         template0)"
    )))
}

/// What [`refuse_unusable_database`] asks of the server.
struct Server {
    encoding: String,
    db: String,
    /// `transaction_read_only` is on: the role's or database's default, or a standby's.
    read_only: bool,
    /// `pg_is_in_recovery()`: a hot standby.
    standby: bool,
}

impl Server {
    /// Asks on `conn`; `None` when the server answered no row.
    async fn asked(conn: &Conn) -> Result<Option<Server>, StoreError> {
        // The simple protocol: one round trip, no statement left behind a PgBouncer.
        let asked = "SELECT current_setting('server_encoding'), current_database(), \
                     current_setting('transaction_read_only'), pg_is_in_recovery()";
        let messages = conn.client.simple_query(asked).await.map_err(pg)?;
        Ok(messages.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => {
                let field = |i| row.get(i).unwrap_or_default().to_owned();
                Some(Server {
                    encoding: field(0),
                    db: field(1),
                    read_only: field(2) == "on",
                    standby: field(3) == "t",
                })
            }
            _ => None,
        }))
    }

    /// Why no claim can be written here, if the server's transactions are read-only.
    fn read_only(&self) -> Option<StoreError> {
        let db = &self.db;
        if self.standby {
            return Some(StoreError::unavailable(format!(
                "PostgreSQL database {db:?} is on a read-only standby (pg_is_in_recovery), where \
                 no claim can be written: name the primary (a managed database's writer \
                 endpoint, not a reader or replica endpoint; with several hosts in the \
                 connection string, add target_session_attrs=read-write), or open the store \
                 again once this server is promoted"
            )));
        }
        self.read_only.then(|| {
            StoreError::InvalidConfig(format!(
                "PostgreSQL makes the store's transactions in database {db:?} read-only \
                 (default_transaction_read_only is on for its role or database), so no claim can \
                 be written: turn it off for idem's role (ALTER ROLE .. SET \
                 default_transaction_read_only = off)"
            ))
        })
    }
}

/// The error of a write `conn` sent and the server refused: when refused as read-only, why,
/// as opening the store for calls would say (a role made read-only is a configuration to fix,
/// [`StoreError::InvalidConfig`]; a standby is [`StoreError::Unavailable`]). For the operator's
/// writes, which are sent once: the command line opens a store without that check, so that it
/// can read a replica.
pub(super) async fn write_refused(conn: &Conn, e: tokio_postgres::Error) -> StoreError {
    if !super::conn::read_only(&e) {
        return pg(e);
    }
    match Server::asked(conn).await {
        Ok(Some(server)) => server.read_only().unwrap_or_else(|| pg(e)),
        _ => pg(e),
    }
}

/// Logs a warning when the server acknowledges commits it can still lose: with
/// `synchronous_commit = off` a server crash loses the last commits it acknowledged (up to three
/// times `wal_writer_delay`, 600 ms by default), with `fsync = off` anything. A claim lost that
/// way lets a repeat run the tool again; a completion lost, a `never` repeat answer "unknown".
/// Not refused: the window is a server crash's, and the setting may be deliberate; the store's
/// guarantees assume acknowledged writes survive (`docs/design.md` §5).
async fn warn_if_not_durable(conn: &Conn) {
    // The simple protocol: one round trip, no statement left behind a PgBouncer.
    let settings = "SELECT current_setting('synchronous_commit'), current_setting('fsync')";
    let Ok(messages) = conn.client.simple_query(settings).await else { return };
    let Some(row) = messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    }) else {
        return;
    };
    let (commit, fsync) = (row.get(0).unwrap_or_default(), row.get(1).unwrap_or_default());
    if commit == "off" || fsync == "off" {
        tracing::warn!(
            synchronous_commit = %commit,
            fsync = %fsync,
            "PostgreSQL acknowledges commits a server crash can lose: a claim or outcome lost that \
             way lets a repeat run the tool again; set synchronous_commit and fsync to on for \
             idem's database or role"
        );
    }
}

impl PostgresStore {
    /// A connection for one store step, given back to the pool when dropped.
    pub(super) async fn conn(&self) -> Result<Conn, StoreError> {
        self.inner.source.checkout().await
    }

    /// A store on the application's own deadpool-postgres pool: each store step checks a
    /// connection out for its statement and gives it back, so the store shares the pool with the
    /// application's own queries. Creates or checks the schema now.
    ///
    /// `listen`: see [`PoolOptions::listen`]; with `None`, waiters poll. The pool must reach
    /// PostgreSQL directly (or through PgBouncer in session mode), since statements are prepared
    /// once per pooled connection; behind PgBouncer in transaction mode use
    /// [`from_pool_with`](Self::from_pool_with) and [`PoolOptions::pgbouncer`].
    ///
    /// A step waits at most 5 s for a free connection, then fails with
    /// [`StoreError::Unavailable`]; the executor bounds each store step by
    /// [`Policy::store_timeout`](crate::Policy) anyway, so an exhausted pool fails the call closed
    /// within it instead of hanging it. A connection the pool hands out closed (the server ended
    /// it) fails its step, which is sent again on another connection when its reply may have
    /// been lost; the pool's recycling method (deadpool's `Fast` checks `is_closed`) keeps closed
    /// connections out. A connection whose session the application reset (`DISCARD ALL`,
    /// `DEALLOCATE ALL`) has its statements prepared again at the store's next step on it.
    ///
    /// Fails with [`StoreError::InvalidConfig`] for a malformed `listen` string, and as
    /// [`connect`](Self::connect) does when the server cannot be reached or the schema is from
    /// another version.
    pub async fn from_pool(pool: Pool, listen: Option<&str>) -> Result<Self, StoreError> {
        let mut options = PoolOptions::new();
        options.listen = listen.map(SecretUrl::new);
        Self::from_pool_with(pool, options).await
    }

    /// [`from_pool`](Self::from_pool) with [`PoolOptions`]: a listen connection, and PgBouncer
    /// in transaction mode (unnamed statements).
    pub async fn from_pool_with(pool: Pool, options: PoolOptions) -> Result<Self, StoreError> {
        let listen = options.listen.as_deref().map(Target::parse).transpose()?;
        let source = Source::app(pool, options.pgbouncer);
        source.check(Schema::Create).await?;
        Ok(PostgresStore::assemble(source, listen))
    }
}

//! The store contract (`docs/design.md` §5): one atomic claim, fenced completion, release and renewal,
//! waiting for another owner's result, and retention.
//!
//! Every store passes the same conformance suite (`idem_core::conformance`, feature
//! `conformance`). Each operation of a store is one atomic step on its backend: a conditional
//! write, never a read followed by a write.

use std::sync::Arc;
use std::time::Duration;

use crate::key::{Fingerprint, Key};

pub mod admin;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod codec;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sweep;

/// The SQL stores' outcome columns (kind, payload) as a record's outcome; `None` for a pair this
/// version does not write. For the fuzz targets (`fuzz/`), not an API.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[doc(hidden)]
pub fn decode_sql_outcome(kind: Option<i64>, payload: Option<String>) -> Option<Outcome> {
    codec::decode(kind, payload)
}
pub mod memory;
mod open;
#[cfg(feature = "postgres")]
pub mod postgres;
mod redact;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod resend;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "postgres-tls", feature = "redis-tls"))]
mod tls_refusal;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod url_query;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
mod wait;

#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder};

/// A pause drawn uniformly from zero to `ceiling` (full jitter), so that callers refused together
/// do not come back together.
pub(crate) fn full_jitter(ceiling: Duration) -> Duration {
    use rand::{Rng, SeedableRng};
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rand::rngs::SmallRng::from_os_rng().random_range(0..=nanos))
}
pub use admin::{
    ListPage, ListQuery, Origin, RecordInfo, RecordState, Resolution, StateFilter, Stats,
    StoredOrigin, UnreadableRecord,
};
pub use memory::MemoryStore;
pub use open::{open, open_existing};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
/// A store URL or connection string as it may be printed: its password masked
/// (`postgres://app:***@db/app`, `host=db password=***`), also where the URL is malformed (a
/// mistyped or missing scheme); what errors of [`open`] show. For an application's or a tool's
/// own messages that name the store.
pub use redact::redacted as redacted_url;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// A fencing token: strictly increasing for a key over the life of the store, across takeovers,
/// releases and retention expiry. Only the holder of the current fence may complete, release or
/// renew.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

/// The terminal outcome of an intent, as stored and replayed.
///
/// Payloads are JSON text exactly as the tool's output or error serialized; a stored `0`,
/// `false`, `""`, `[]`, `{}` or `null` replays as itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The tool returned `Ok`; JSON of its output.
    Success(String),
    /// The tool failed permanently; JSON of its error. Replayed as that error.
    Failure(String),
    /// A `never` tool failed ambiguously: the effect may have happened. Replayed as
    /// [`OutcomeUnknown`](crate::Error::OutcomeUnknown) until reconciled.
    Unknown,
    /// The tool returned `Ok`, but its output could not be stored faithfully (its JSON does not
    /// read back as the same value); why, as text. Replayed as
    /// [`OutputNotStorable`](crate::Error::OutputNotStorable): the effect happened, its output is
    /// lost (`docs/design.md` §6.4).
    NotStorable(String),
}

/// A completed record: what claim returns for a repeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The fingerprint of the arguments the record was created with.
    pub fingerprint: Fingerprint,
    /// The stored outcome.
    pub outcome: Outcome,
}

/// What to do when the key is held by a lease that expired without a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnExpired {
    /// Take over with a new fence and run again (safe and keyed tools).
    TakeOver,
    /// Do not run again: answer [`Claim::Unknown`] (never tools). The record stays as it is, so a
    /// late completion by the original owner (still holding the current fence) is accepted.
    Unknown,
}

/// A claim request.
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest<'a> {
    /// The idempotency key.
    pub key: &'a Key,
    /// The fingerprint of the canonical arguments.
    pub fingerprint: &'a Fingerprint,
    /// How long the lease lasts unless renewed.
    pub lease: Duration,
    /// What to do with an expired lease.
    pub on_expired: OnExpired,
    /// The tool and scope of the call, stored with the record for listing
    /// ([`Store::list`]); `Origin::default()` when not known.
    pub origin: Origin<'a>,
}

/// The answer to a claim: the only ways a claim can end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The caller owns the key until the lease ends and must run, then complete or release.
    Acquired {
        /// The fencing token to present with complete, release and renew.
        fence: Fence,
        /// A previous owner's lease had expired without a result (traced as the call's
        /// `idem.outcome` `taken_over`).
        takeover: bool,
    },
    /// Another owner holds a live lease: wait (see [`Store::wait`]) and claim again.
    InFlight {
        /// The current owner's fence.
        fence: Fence,
        /// Time left on its lease.
        lease_remaining: Duration,
    },
    /// The intent has an outcome: replay it.
    Completed(Record),
    /// The lease expired without a result and the request said [`OnExpired::Unknown`].
    Unknown,
    /// The key exists with another fingerprint: a caller-supplied key was reused with other
    /// arguments.
    Mismatch,
}

/// A store failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or failed the operation (connection refused, I/O error,
    /// timeout); retry later. The backend's error is the `source()`. A remote store sends a step
    /// whose reply was lost again before it answers this, and a claim that answers it releases in
    /// the background any record it may have created, so nothing is left held.
    #[error("the store could not be reached or failed the operation")]
    Unavailable(#[source] Arc<dyn std::error::Error + Send + Sync + 'static>),
    /// The fence presented is not the current one: another owner took over, or the record is gone.
    #[error("lease lost: the fence is no longer current")]
    LeaseLost,
    /// A record or schema was written by another version of idem and is not understood. Nothing is
    /// replayed from it.
    #[error("incompatible record or schema: {0}; upgrade idem, or migrate the store")]
    Incompatible(String),
    /// The store's own data is damaged (a SQLite file cut short by a full disk, overwritten by a
    /// bad copy): neither this version of idem nor another can read it, and waiting does not
    /// mend it. Nothing was attempted; restore the store from a backup. The reason names what
    /// is damaged and how to list it.
    #[error("damaged store: {0}")]
    Damaged(String),
    /// The store does not implement this operation (a store written outside idem that only
    /// implements the claim protocol). Nothing was attempted.
    #[error("this store does not support {0}")]
    Unsupported(&'static str),
    /// The store's configuration is invalid: a malformed or unknown store URL, an option the
    /// store does not know, an unreadable CA file, or a store or TLS feature not compiled in.
    /// Nothing was attempted; fix the configuration.
    #[error("invalid store configuration: {0}")]
    InvalidConfig(String),
    /// A listing's cursor ([`ListQuery::cursor`]) this store cannot go on from: one it did not
    /// give (a typo, another store's cursor), or one from before its servers changed (a Redis
    /// Cluster node that is no longer a master). Nothing was read; list again from the first
    /// page, or give the `next` of an earlier page.
    #[error(
        "not a cursor of this store: {:?} (a cursor of another store, or of its servers before they changed); list from the first page, or give the `next` cursor of an earlier page",
        crate::printable::shortened(.0, 128)
    )]
    InvalidCursor(String),
}

impl StoreError {
    /// Wraps any backend error as [`StoreError::Unavailable`].
    pub fn unavailable(e: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        StoreError::Unavailable(Arc::from(e.into()))
    }

    /// [`StoreError::Unavailable`] for a bound that ran out, `why` saying which; on a paused
    /// Tokio clock it says that too (`clock::paused_clock_note`).
    pub(crate) fn timed_out(why: String) -> Self {
        StoreError::unavailable(why + crate::clock::paused_clock_note())
    }
}

/// The `#[async_trait]` attribute [`Store`] is declared with, for a store of one's own:
/// `#[idem_core::store::async_trait] impl Store for MyStore { .. }`, without a dependency line
/// that must match idem's.
pub use async_trait::async_trait;

/// An idempotency store. Implementations must make each method one atomic step.
///
/// Times (`lease`, `ttl`, `max`) are durations measured on the store's own clock (for the
/// in-memory store: tokio's clock, so tests can pause it).
///
/// `Any` lets the executor recognise the [`MemoryStore`] behind an `Arc<dyn Store>` and call it
/// without a future; every `'static` type is `Any`.
#[async_trait]
pub trait Store: std::any::Any + Send + Sync {
    /// Atomically claims `req.key`: creates an in-flight record with a new fence when the key is
    /// free (absent, released or expired by retention), takes over an expired lease
    /// ([`OnExpired`]), or reports the record's state. A record whose fingerprint differs answers
    /// [`Claim::Mismatch`] whatever its state.
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError>;

    /// Stores the outcome if `fence` is current; the record is then kept for `ttl` (retention)
    /// and waiters are woken. [`StoreError::LeaseLost`] otherwise, and nothing is written.
    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), StoreError>;

    /// Frees the key if `fence` is current (the next claim acquires it with a higher fence) and
    /// wakes waiters. [`StoreError::LeaseLost`] otherwise.
    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError>;

    /// Extends the lease to `lease` from now if `fence` is current and the record is in flight.
    /// [`StoreError::LeaseLost`] otherwise.
    async fn renew(&self, key: &Key, fence: Fence, lease: Duration) -> Result<(), StoreError>;

    /// Waits until the record of `key` may no longer be in flight under `fence` (completed,
    /// released, taken over, expired), or `max` has passed, whichever is first. Returning is a
    /// hint, not a promise: the caller claims again. Must never wait past `max`.
    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError>;

    /// Whether this store lives in this process and answers without I/O, as the in-memory store
    /// does. The executor then calls it without timeouts around its steps. Default `false`; a
    /// store that may block or do I/O must keep it.
    fn is_local(&self) -> bool {
        false
    }

    /// Whether this store connects through the Tokio runtime's I/O driver, as the PostgreSQL and
    /// Redis stores do (a connection is made on the runtime of the step that needs it). A call on
    /// a runtime built without I/O is then refused before anything runs, with a configuration
    /// error, rather than meet Tokio's panic at the store's first new connection. Default `false`.
    fn uses_tokio_io(&self) -> bool {
        false
    }

    /// Removes the record of `key` whatever its state (an operator's reconciliation of an unknown
    /// outcome, or tests). Returns whether a record was removed.
    async fn forget(&self, key: &Key) -> Result<bool, StoreError>;

    /// Removes the record of `key` only if it is still the record an operator saw
    /// ([`Store::inspect`], [`Store::list`]): fence `fence`, and completed (`done`) or in flight.
    /// `Ok(false)` when there is no record; [`StoreError::LeaseLost`], removing nothing, when it
    /// changed meanwhile (another owner took it over, its owner completed it): forgetting a
    /// result nobody saw would make the next call run the effect again. The stores of this crate
    /// check and remove in one atomic step; this default reads, then forgets, which is not atomic.
    async fn forget_seen(&self, key: &Key, fence: Fence, done: bool) -> Result<bool, StoreError> {
        match self.inspect(key).await? {
            None => Ok(false),
            Some(info) if info.fence == fence && info.state.is_done() == done => {
                self.forget(key).await
            }
            Some(_) => Err(StoreError::LeaseLost),
        }
    }

    /// One page of the records `query` selects, in an order stable across pages (key order for
    /// the SQL and in-memory stores, scan order for Redis). Records whose retention ended are
    /// left out. Cheap on a large store: indexed queries, or an incremental scan that never
    /// blocks the server. Records written by a version of idem that stored no origin list with
    /// `origin: None`. A record this version cannot read is reported in
    /// [`ListPage::unreadable`] rather than failing the page; an error means the page itself could
    /// not be read (the store is unavailable, the cursor is not one of this store).
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let _ = query;
        Err(StoreError::Unsupported("listing"))
    }

    /// The record of `key` as an operator sees it; `None` when there is none (or its retention
    /// ended).
    async fn inspect(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        let _ = key;
        Err(StoreError::Unsupported("inspecting a record"))
    }

    /// Settles the record of `key` by hand, in one atomic step, only if its fence is still
    /// `fence` (as read by [`Store::inspect`] or [`Store::list`]) and it is resolvable
    /// ([`admin::resolvable`]: outcome unknown, or a lease that ended without a result).
    /// [`StoreError::LeaseLost`] otherwise, and nothing is changed: a live owner, or one that
    /// completed meanwhile, is never overwritten. Waiters are woken.
    async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: &Resolution,
    ) -> Result<(), StoreError> {
        let _ = (key, fence, resolution);
        Err(StoreError::Unsupported("resolving a record"))
    }

    /// Removes the records whose retention ended (claims already treat them as absent); how
    /// many. A store whose backend expires records itself (Redis) answers 0.
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        Err(StoreError::Unsupported("purging"))
    }

    /// Counts of the records by state.
    async fn stats(&self) -> Result<Stats, StoreError> {
        Err(StoreError::Unsupported("stats"))
    }
}

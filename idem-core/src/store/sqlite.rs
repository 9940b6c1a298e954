//! The SQLite store (feature `sqlite`): embedded and durable, one file, shared by the processes of
//! one machine.
//!
//! The database runs in WAL mode, so several processes (each with its own [`SqliteStore`]) can
//! use one file; a step that finds another process holding the lock it needs tries again for up
//! to 5 s. Every write is one conditional statement: a claim that
//! may acquire is `INSERT .. ON CONFLICT(key) DO UPDATE .. WHERE <free or expired> RETURNING ..`,
//! and complete, release and renew are conditional on the fence. When the claim's conditional
//! update does not fire, the row it conflicted with is read inside the same write transaction, so
//! the answer is what the write saw. A claim whose answer needs no write (a replay, a live lease,
//! a mismatch) is answered by a plain read of the committed row first; the write path never
//! relies on that read. Fences come from one counter per database, moved by a trigger in the
//! claim statement, so they increase across release, takeover, forget and retention expiry.
//!
//! Times are milliseconds since the Unix epoch on the machine's clock, shared by its processes.
//! Waiting polls the record with backoff (2 ms doubling to 50 ms), is woken at once by
//! completions and releases made through the same [`SqliteStore`], and never lasts past `max`.
//!
//! Blocking SQLite calls run on tokio's blocking pool (`spawn_blocking`), one connection per
//! store behind a mutex, with cached prepared statements. The connection never waits inside
//! SQLite for another process's lock (busy timeout 0): a step refused as busy lets go of the
//! connection and pauses before it tries again, so the store's other steps (a replay above all)
//! are not held up behind one that waits for the write lock. The one call not on the blocking
//! pool is the read-only claim answer above, made on the calling thread when the connection is
//! free: a primary-key read takes microseconds, a blocking-pool hop tens of them.
//! When that read finds the claim must write, the blocking call goes to the upsert without
//! reading again.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::Notify;

use super::admin::Forgot;
use super::codec::{self, encode, fence_param, ms, now_ms};
use super::sweep::SweepClock;
use super::wait;
use super::{
    Claim, ClaimRequest, Fence, ListPage, ListQuery, OnExpired, Outcome, Record, RecordInfo,
    Resolution, Stats, Store, StoreError, StoredOrigin,
};
use crate::key::{Fingerprint, Key};

mod admin;
mod file;
mod schema;

use file::OpenedFile;

use schema::init_schema;
pub use schema::{SCHEMA_REVISION, SCHEMA_VERSION};

/// Acquires when the key is absent, when its record's retention ended (any fingerprint: the old
/// record is gone whole), or when its lease expired, the fingerprint matches and the request
/// takes over (`?5 = 1`).
const CLAIM: &str = "
INSERT INTO idem_records
    (key, fingerprint, fence, state, lease_until, takeover, tool, tenant, run_id, since)
VALUES (?1, ?2, (SELECT value + 1 FROM idem_meta WHERE name = 'fence'), 0, ?3 + ?4, 0,
        ?6, ?7, ?8, ?3)
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    fence = excluded.fence,
    takeover = (state = 0),
    state = 0,
    lease_until = excluded.lease_until,
    expires_at = NULL,
    kind = NULL,
    payload = NULL,
    tool = excluded.tool,
    tenant = excluded.tenant,
    run_id = excluded.run_id,
    since = excluded.since
WHERE (state = 1 AND expires_at <= ?3)
   OR (state = 0 AND lease_until <= ?3 AND fingerprint = excluded.fingerprint AND ?5 = 1)
RETURNING fence, takeover";

const READ: &str = "
SELECT fingerprint, fence, state, lease_until, expires_at, kind, payload
FROM idem_records WHERE key = ?1";

const COMPLETE: &str = "
UPDATE idem_records
SET state = 1, lease_until = NULL, expires_at = ?3 + ?4, kind = ?5, payload = ?6, since = ?3
WHERE key = ?1 AND fence = ?2 AND state = 0";

const RELEASE: &str = "DELETE FROM idem_records WHERE key = ?1 AND fence = ?2 AND state = 0";

const RENEW: &str = "
UPDATE idem_records SET lease_until = ?3 + ?4 WHERE key = ?1 AND fence = ?2 AND state = 0";

/// Whether `key` is still in flight under `fence` with a live lease.
const HELD: &str = "
SELECT 1 FROM idem_records
WHERE key = ?1 AND fence = ?2 AND state = 0 AND lease_until > ?3";

const FORGET: &str = "DELETE FROM idem_records WHERE key = ?1";

/// key, fence, state (0 in flight, 1 done).
const FORGET_SEEN: &str = "DELETE FROM idem_records WHERE key = ?1 AND fence = ?2 AND state = ?3";

const EXISTS: &str = "SELECT 1 FROM idem_records WHERE key = ?1";

const SWEEP: &str = "
DELETE FROM idem_records WHERE key IN (
    SELECT key FROM idem_records WHERE state = 1 AND expires_at <= ?1 LIMIT 1000)";

/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The size the write-ahead log is cut back to when it starts over (bytes).
const WAL_SIZE_LIMIT: i64 = 16 << 20;
const POLL_FIRST: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(50);

struct Inner {
    conn: Mutex<Conn>,
    /// Woken by this store's completions, releases and forgets (other processes: polling).
    changed: Notify,
    sweeps: SweepClock,
}

/// The path a `sqlite:` URL names (`:memory:` included), percent-decoded as a URL's path is
/// (RFC 3986 §2.1: `a%20b.db` is `a b.db`). Errors: [`StoreError::InvalidConfig`] for another
/// scheme, no path, a query (the URL takes no options, and an unknown one must not silently
/// become part of the file name), or escapes that do not decode to UTF-8.
pub(crate) fn url_path(url: &str) -> Result<std::borrow::Cow<'_, str>, StoreError> {
    let shown = super::redact::redacted(url);
    let invalid = |why: &str| StoreError::InvalidConfig(format!("{why}: {shown:?}"));
    let path = match url.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("sqlite") => {
            rest.strip_prefix("//").unwrap_or(rest)
        }
        _ => return Err(invalid("not a sqlite URL (sqlite://PATH)")),
    };
    if path.is_empty() {
        return Err(invalid("sqlite URL without a path"));
    }
    if let Some((_, query)) = path.split_once('?') {
        let query = super::redact::redacted(query);
        return Err(StoreError::InvalidConfig(format!(
            "a sqlite URL takes no options, and {query:?} is not part of the file name; name \
             the file alone (sqlite:///abs/path.db), or open a path with `?` in it with \
             SqliteStore::open: {shown:?}"
        )));
    }
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map_err(|_| invalid("the sqlite URL's path has %-escapes that are not UTF-8"))
}

/// `path` as SQLite reads a file name: one starting with `file:` gets `./` first. The bundled
/// SQLite is built with URIs on (`SQLITE_USE_URI`), so it reads such a name as a URI whatever the
/// open flags say, options included: `file:idem.db?mode=memory` would be a private in-memory
/// database that no other process or store value shares (each would run every call again), and
/// `?nolock=1` would drop the locks that keep two processes from both acquiring a key.
fn as_file_name(path: &Path) -> std::borrow::Cow<'_, Path> {
    if path.as_os_str().as_encoded_bytes().starts_with(b"file:") {
        std::borrow::Cow::Owned(Path::new(".").join(path))
    } else {
        std::borrow::Cow::Borrowed(path)
    }
}

/// Why the database at `path` could not be opened, naming it: a file that is not an SQLite
/// database is a configuration error (nothing was written to it), and so is a file or
/// directory this process may not write (permissions do not change by waiting); anything else
/// (a missing directory, I/O) the store being unavailable.
fn open_failed(path: &Path, e: rusqlite::Error) -> StoreError {
    let shown = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    match e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::NotADatabase => {
            StoreError::InvalidConfig(format!(
                "{} is not an SQLite database (left as it is); name idem's database file",
                shown.display()
            ))
        }
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ReadOnly => {
            read_only(Some(&shown), &e)
        }
        rusqlite::Error::SqliteFailure(f, _)
            if f.code == rusqlite::ErrorCode::CannotOpen && !shown.exists() =>
        {
            not_created(&shown, e)
        }
        rusqlite::Error::SqliteFailure(f, _)
            if f.code == rusqlite::ErrorCode::CannotOpen && not_writable(&shown) =>
        {
            read_only(Some(&shown), &e)
        }
        // A name no file can have: waiting does not change it.
        rusqlite::Error::NulError(_) => StoreError::InvalidConfig(format!(
            "{:?} holds a NUL byte, which no file name can; name idem's database file",
            shown.display()
        )),
        rusqlite::Error::InvalidPath(_) => StoreError::InvalidConfig(format!(
            "{:?} is not a file name SQLite can open on this system; name another file",
            shown.display()
        )),
        e if is_corrupt(&e) => corrupt(Some(&shown), &e),
        e => StoreError::unavailable(format!(
            "cannot open the SQLite database at {}: {e}",
            shown.display()
        )),
    }
}

/// Why the file at `path` (absolute) could not be created, which SQLite says only as "unable to
/// open database file": its directory is missing (the store creates the file, not directories),
/// or this process may not create files there (a configuration error).
fn not_created(path: &Path, e: rusqlite::Error) -> StoreError {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let cannot = format!("cannot open the SQLite database at {}", path.display());
    match std::fs::metadata(dir) {
        Err(why) if why.kind() == std::io::ErrorKind::NotFound => {
            return StoreError::unavailable(format!(
                "{cannot}: the directory {} does not exist (the store creates the file, not its \
                 directories)",
                dir.display()
            ));
        }
        Ok(meta) if !meta.is_dir() => {
            return StoreError::InvalidConfig(format!(
                "{cannot}: {} is not a directory",
                dir.display()
            ));
        }
        _ => {}
    }
    // Ask the system why, as SQLite did. Should it succeed now, the empty file is a new database
    // to SQLite, and is left: another process may have opened it meanwhile.
    match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Err(why)
            if matches!(
                why.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            StoreError::InvalidConfig(format!(
                "{cannot}: this process may not create files in {} ({why}); create the database \
                 there as a user who may (and let this one write it and its directory), or name \
                 a file in a directory it may write",
                dir.display()
            ))
        }
        _ => StoreError::unavailable(format!("{cannot}: {e}")),
    }
}

/// Whether SQLite's "unable to open database file" for the file at `path`, which exists, is
/// because it cannot be written (a read-only file system, permissions), or because its `-shm`
/// file, which the write-ahead log needs even to read, is missing and could not be made beside it
/// (a directory this process may not write). Opening the file for writing writes nothing.
fn not_writable(path: &Path) -> bool {
    match std::fs::OpenOptions::new().read(true).write(true).open(path) {
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
        ),
        Ok(_) => {
            let mut shm = path.as_os_str().to_owned();
            shm.push("-shm");
            !Path::new(&shm).exists()
        }
    }
}

/// Whether SQLite found the file damaged (`SQLITE_CORRUPT`) or not a database at all
/// (`SQLITE_NOTADB`, when it is found only on a read).
fn is_corrupt(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

/// A damaged database (`at`: where, when known): nothing this idem can read, and waiting does not
/// mend it, so not "unavailable" (which says: try again later).
fn corrupt(at: Option<&Path>, e: &rusqlite::Error) -> StoreError {
    let at = at.map(|p| format!(" at {}", p.display())).unwrap_or_default();
    StoreError::Damaged(format!(
        "the SQLite database{at} is damaged ({e}); restore it from a backup (`PRAGMA \
         integrity_check` lists what is damaged)"
    ))
}

/// A database this process may not write (`at`: where, when known): a configuration error,
/// which waiting does not fix.
fn read_only(at: Option<&Path>, e: &rusqlite::Error) -> StoreError {
    let at = at.map(|p| format!(" at {}", p.display())).unwrap_or_default();
    StoreError::InvalidConfig(format!(
        "the SQLite database{at} cannot be written by this process (the file, its directory, or \
         its -wal and -shm files are read-only; SQLite's write-ahead log needs to write beside \
         the file even to read): {e}"
    ))
}

/// The SQLite [`Store`]. Cheap to clone (clones share one connection).
///
/// Errors: [`StoreError::Unavailable`] when the file cannot be opened or a statement fails (I/O,
/// locked past the 5 s busy timeout); [`StoreError::Incompatible`] for a database written with
/// another schema version or a record this version cannot decode.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`, in WAL mode, and creates or checks
    /// the schema. Blocks while it does (file I/O). `path` is a file name as it is (a name
    /// starting with `file:` is not read as an SQLite URI); `:memory:` is a private in-memory
    /// database, as [`in_memory`](Self::in_memory).
    ///
    /// Errors: [`StoreError::InvalidConfig`] for an empty path (SQLite would open a private
    /// temporary database that no other connection shares: a repeat in another process, or
    /// through another store value, would run again) and for a file that is not an SQLite
    /// database (left as it is) or one in a directory where this process may not create it;
    /// [`StoreError::Unavailable`] naming the path when the file cannot be opened or created
    /// otherwise (a missing directory, which the message names, I/O).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        if path.as_os_str().is_empty() {
            return Err(StoreError::InvalidConfig(
                "the SQLite path is empty, which SQLite opens as a private temporary database \
                 that no other process or store shares; name the database file"
                    .into(),
            ));
        }
        if path.is_dir() {
            return Err(StoreError::InvalidConfig(format!(
                "{} is a directory: name the database file in it",
                std::path::absolute(path).unwrap_or_else(|_| path.to_owned()).display()
            )));
        }
        // No `SQLITE_OPEN_URI`: a path is a file name.
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
            | rusqlite::OpenFlags::SQLITE_OPEN_CREATE
            | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let named = as_file_name(path);
        let conn = Connection::open_with_flags(&named, flags).map_err(|e| open_failed(path, e))?;
        Self::with_connection(conn, Some((path, named.as_ref())))
    }

    /// Opens the idem store in the database file at `path`, which must exist and hold idem's
    /// tables: a missing file, or one without them (another application's database, a mistyped
    /// path), is refused with [`StoreError::InvalidConfig`] and left as it is, where
    /// [`open`](Self::open) would create the file or the tables. For a tool that only looks at a
    /// store (the `idem` command line). A schema of an earlier revision is still brought up to
    /// date, as `open` does.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let missing = |what: &str| {
            StoreError::InvalidConfig(format!(
                "no SQLite database of idem at {} ({what}); nothing is created: name the file \
                 the application uses, with an absolute path (sqlite:///abs/path.db)",
                std::path::absolute(path).unwrap_or_else(|_| path.to_owned()).display()
            ))
        };
        if path.is_dir() {
            return Err(missing("a directory: name the database file in it"));
        }
        if !path.is_file() {
            return Err(missing("no such file"));
        }
        // Read-write but never created, and looked at before anything is written to it (the
        // journal mode included).
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let named = as_file_name(path);
        let conn = Connection::open_with_flags(&named, flags).map_err(|e| open_failed(path, e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| open_failed(path, e))?;
        let tables = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_records'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(|e| match e {
                rusqlite::Error::SqliteFailure(f, _)
                    if f.code == rusqlite::ErrorCode::NotADatabase =>
                {
                    missing("not a SQLite database")
                }
                e => open_failed(path, e),
            })?;
        if tables == 0 {
            return Err(missing("the file has no idem_records table"));
        }
        schema::check_existing(&conn)?;
        Self::with_connection(conn, Some((path, named.as_ref())))
    }

    /// Opens a database from a URL: `sqlite://PATH` or `sqlite:PATH` (a relative or absolute
    /// path, e.g. `sqlite:///var/lib/idem.db`; percent-escapes are decoded, `%20` is a space),
    /// or `sqlite::memory:` for a private in-memory database.
    pub fn open_url(url: &str) -> Result<Self, StoreError> {
        match url_path(url)?.as_ref() {
            ":memory:" => Self::in_memory(),
            path => Self::open(path),
        }
    }

    /// A private in-memory database, gone when the store is dropped (tests).
    pub fn in_memory() -> Result<Self, StoreError> {
        Self::with_connection(Connection::open_in_memory().map_err(StoreError::unavailable)?, None)
    }

    /// The store on `conn`, opened at `path` as `named` (`None`: in memory); errors name `path`.
    fn with_connection(
        mut conn: Connection,
        opened: Option<(&Path, &Path)>,
    ) -> Result<Self, StoreError> {
        let (path, named) = opened.unzip();
        let failed = |e: rusqlite::Error| match path {
            Some(path) => open_failed(path, e),
            None => StoreError::unavailable(e),
        };
        conn.busy_timeout(BUSY_TIMEOUT).map_err(failed)?;
        // `journal_mode` answers with the mode set ("memory" for in-memory databases). Switching
        // a new file to WAL needs an exclusive lock, and SQLite reports BUSY at once instead of
        // calling the busy handler when several processes open the file together: retry.
        let give_up = std::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match conn
                .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0))
            {
                Ok(_mode) => break,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < give_up =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(failed(e)),
            }
        }
        // A write-ahead log keeps the size it grew to (a burst of large outcomes while another
        // process read for long) as long as a connection is open: every time the log starts over,
        // it is cut back to this: four times what the automatic checkpoint lets it reach (1000
        // pages), so a log of the usual size is not cut and grown again each time.
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT).map_err(failed)?;
        conn.set_prepared_statement_cache_capacity(32);
        init_schema(&mut conn)?;
        // From here a lock another process holds is waited for outside SQLite (`Inner::retrying`).
        conn.busy_timeout(Duration::ZERO).map_err(failed)?;
        // Once the write-ahead log and its index are open beside the file.
        let file = named.map(OpenedFile::at);
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                conn: Mutex::new(Conn { conn, file }),
                changed: Notify::new(),
                sweeps: SweepClock::new(),
            }),
        })
    }

    /// Removes every record whose retention ended (at most 1000 per call); returns how many.
    /// Claims already treat them as absent; this only reclaims space. Runs on its own every 60 s
    /// during claims.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        self.call(|conn| Ok(conn.prepare_cached(SWEEP)?.execute(params![now_ms()])?)).await
    }

    /// Runs `f` on the connection on tokio's blocking pool, again while another process holds
    /// the lock it needs (see [`Inner::retrying`]).
    async fn call<T: Send + 'static>(
        &self,
        f: impl FnMut(&mut Connection) -> Result<T, SqlError> + Send + 'static,
    ) -> Result<T, StoreError> {
        // Tokio panics at `spawn_blocking` outside a runtime (a store used by another executor).
        crate::tokio_ready::store_step(false)?;
        let inner = Arc::clone(&self.inner);
        let joined = tokio::task::spawn_blocking(move || inner.retrying(f)).await;
        match joined {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(StoreError::unavailable(e)),
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Conn> {
        crate::sync::lock(&self.conn)
    }

    /// Runs `f` on the connection (on a blocking thread), and again while another process holds
    /// the lock it needs (`SQLITE_BUSY`: the statement changed nothing, and a transaction it was
    /// in rolled back), for up to [`BUSY_TIMEOUT`]. Between tries the connection is let go of and
    /// the thread pauses (1 ms doubling to 50 ms, as SQLite's own busy handler does), so the
    /// store's other steps run meanwhile: a connection waiting inside SQLite would hold up every
    /// step of the process, replays included, for as long as another process kept the lock.
    fn retrying<T>(
        &self,
        mut f: impl FnMut(&mut Connection) -> Result<T, SqlError>,
    ) -> Result<T, SqlError> {
        let give_up = std::time::Instant::now() + BUSY_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        loop {
            let done = {
                let mut guard = self.lock();
                f(guard.writable()?)
            };
            match done {
                Err(SqlError::Sqlite(e))
                    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
                        && std::time::Instant::now() + pause < give_up =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                done => return done,
            }
        }
    }
}

/// The store's connection (busy timeout 0: see [`Inner::retrying`]) and the file it has open.
struct Conn {
    conn: Connection,
    /// The file `conn` has open (`None`: in memory).
    file: Option<OpenedFile>,
}

impl Conn {
    /// For a blocking call. Refused once the file is no longer at the store's path (see
    /// [`file`]).
    fn writable(&mut self) -> Result<&mut Connection, SqlError> {
        if let Some(file) = &self.file {
            file.check().map_err(SqlError::Store)?;
        }
        Ok(&mut self.conn)
    }

    /// For the inline read on the calling thread. The file is not checked here: what a file no
    /// longer at the path still answers without writing (a stored outcome, a mismatch, a lease
    /// to wait for) is true of its record, and the next blocking call (the write, a wait's poll)
    /// is refused.
    fn readable(&self) -> &Connection {
        &self.conn
    }
}

/// The answer of a claim's blocking call, as the claim waits for it. Dropped with an answer sent
/// and not read (the caller stopped waiting just as it came), it releases a fresh key that answer
/// acquired, as the blocking call does when the answer finds nobody: nobody holds that key. A
/// takeover is left to its lease, as there.
struct Unread {
    answer: tokio::sync::oneshot::Receiver<Result<Claim, SqlError>>,
    inner: Arc<Inner>,
    key: Key,
}

impl Drop for Unread {
    fn drop(&mut self) {
        // Closed first: from here the blocking call's send fails, and it releases on its own.
        self.answer.close();
        let Ok(Ok(Claim::Acquired { fence, takeover: false })) = self.answer.try_recv() else {
            return;
        };
        // Outside a runtime (it is shutting down) nothing can run: the lease ends the record.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (inner, key) = (Arc::clone(&self.inner), self.key);
        runtime.spawn_blocking(move || release_unheld(&inner, &key, fence));
    }
}

/// Releases a fresh key a claim acquired for a caller that is gone (on a blocking thread). Best
/// effort: should it fail, the lease ends the record.
fn release_unheld(inner: &Inner, key: &Key, fence: Fence) {
    let _ = inner.retrying(|conn| {
        let release = params![key.as_str(), fence_param(fence)];
        Ok(conn.prepare_cached(RELEASE)?.execute(release)?)
    });
}

/// What the inline read of a claim found (see [`SqliteStore::try_answer_inline`]).
enum Inline {
    Answer(Claim),
    Write,
    Busy,
}

/// An error inside a blocking call: SQLite's, or a record that cannot be decoded.
enum SqlError {
    Sqlite(rusqlite::Error),
    Incompatible(String),
    /// A cursor not made by this store: nothing was read.
    Cursor(String),
    /// The store's file is no longer at its path (see [`file`]).
    Store(StoreError),
}

impl From<rusqlite::Error> for SqlError {
    fn from(e: rusqlite::Error) -> Self {
        SqlError::Sqlite(e)
    }
}

impl From<SqlError> for StoreError {
    fn from(e: SqlError) -> Self {
        match e {
            // A column that does not hold what idem writes there: a record or schema from
            // another version (or edited by hand). Retrying would not help; replaying must not.
            SqlError::Sqlite(
                e @ (rusqlite::Error::InvalidColumnType(..)
                | rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::IntegralValueOutOfRange(..)),
            ) => StoreError::Incompatible(format!("a stored value has an unexpected type: {e}")),
            // A file or directory this process may not write: a configuration error, which
            // waiting does not fix (a busy or full database is an outage: it may pass).
            SqlError::Sqlite(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ReadOnly) => {
                read_only(None, &e)
            }
            SqlError::Sqlite(e) if is_corrupt(&e) => corrupt(None, &e),
            SqlError::Sqlite(e) => StoreError::unavailable(e),
            SqlError::Incompatible(m) => StoreError::Incompatible(m),
            SqlError::Cursor(c) => StoreError::InvalidCursor(c),
            SqlError::Store(e) => e,
        }
    }
}

fn fence_of(v: i64) -> Fence {
    Fence(v as u64)
}

fn decode(key: &Key, kind: Option<i64>, payload: Option<String>) -> Result<Outcome, SqlError> {
    let present = if payload.is_some() { "present" } else { "absent" };
    codec::decode(kind, payload).ok_or_else(|| {
        SqlError::Incompatible(format!(
            "the SQLite record of key {key} has an outcome this idem cannot read (kind \
             {kind:?}, payload {present})"
        ))
    })
}

/// The columns of a record a claim's answer needs: `fence` and `lease_until` are read only for
/// a record in flight (else 0 and `None`), `expires_at`, `kind` and `payload` only for a
/// completed one (else `None`); each column read costs a replay about as much as SQLite's
/// stepping over it.
struct Row {
    /// Whether the row's fingerprint is the claim's (compared in place: no copy of it).
    same: bool,
    fence: i64,
    state: i64,
    lease_until: Option<i64>,
    expires_at: Option<i64>,
    kind: Option<i64>,
    payload: Option<String>,
}

fn read_row(conn: &Connection, key: &Key, fp: &Fingerprint) -> Result<Option<Row>, SqlError> {
    Ok(conn
        .prepare_cached(READ)?
        .query_row(params![key.as_str()], |r| {
            // Bytes, not `str`: a fingerprint is ASCII, so no UTF-8 check is needed to compare.
            let same = match r.get_ref(0)? {
                ValueRef::Text(stored) => stored == fp.as_str().as_bytes(),
                other => {
                    return Err(rusqlite::Error::InvalidColumnType(
                        0,
                        "fingerprint".into(),
                        other.data_type(),
                    ));
                }
            };
            let state = r.get(2)?;
            let mut row = Row {
                same,
                fence: 0,
                state,
                lease_until: None,
                expires_at: None,
                kind: None,
                payload: None,
            };
            if state == 1 {
                row.expires_at = r.get(4)?;
                row.kind = r.get(5)?;
                row.payload = r.get(6)?;
            } else {
                row.fence = r.get(1)?;
                row.lease_until = r.get(3)?;
            }
            Ok(row)
        })
        .optional()?)
}

/// What a claim answers from a row, or `None` when the claim statement would take the row
/// (the same conditions as [`CLAIM`]'s `WHERE`).
fn answer(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    row: Row,
    now: i64,
) -> Result<Option<Claim>, SqlError> {
    let same = row.same;
    match (row.state, row.lease_until, row.expires_at) {
        (1, _, Some(expires)) if expires <= now => Ok(None),
        _ if !same => Ok(Some(Claim::Mismatch)),
        (1, _, _) => Ok(Some(Claim::Completed(Record {
            fingerprint: *fp,
            outcome: decode(key, row.kind, row.payload)?,
        }))),
        (0, Some(until), _) if until > now => Ok(Some(Claim::InFlight {
            fence: fence_of(row.fence),
            lease_remaining: Duration::from_millis((until - now) as u64),
        })),
        (0, Some(_), _) => match on_expired {
            OnExpired::TakeOver => Ok(None),
            OnExpired::Unknown => Ok(Some(Claim::Unknown)),
        },
        (state, _, _) => Err(SqlError::Incompatible(format!(
            "the SQLite record of key {key} has an unknown state {state}"
        ))),
    }
}

/// A claim: answered by a plain read when the record is one the claim would not take (a
/// replay, a live lease, a mismatch: nothing to write, and the read is a committed state), else
/// by the conditional upsert, which decides on its own under the write lock. Without `read`
/// (the inline read just found the claim needs the write) it goes to the upsert at once.
#[allow(clippy::too_many_arguments)]
fn claim_blocking(
    conn: &mut Connection,
    key: Key,
    fp: Fingerprint,
    lease: Duration,
    on_expired: OnExpired,
    origin: &StoredOrigin,
    now: i64,
    read: bool,
) -> Result<Claim, SqlError> {
    if read
        && let Some(row) = read_row(conn, &key, &fp)?
        && let Some(claim) = answer(&key, &fp, on_expired, row, now)?
    {
        return Ok(claim);
    }
    let take_over = i64::from(on_expired == OnExpired::TakeOver);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // The clock again, now that the write lock is held: taking it may have waited for another
    // process up to the busy timeout (5 s), and a lease counted from before that wait would
    // end early (one of 1 s would be inserted already over, and a duplicate would take the key
    // over from an owner that has just started).
    let now = now_ms();
    let acquired = tx
        .prepare_cached(CLAIM)?
        .query_row(
            params![
                key.as_str(),
                fp.as_str(),
                now,
                ms(lease),
                take_over,
                origin.tool,
                origin.tenant,
                origin.run
            ],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, bool>(1)?)),
        )
        .optional()?;
    if let Some((fence, takeover)) = acquired {
        tx.commit()?;
        return Ok(Claim::Acquired { fence: fence_of(fence), takeover });
    }
    // The conditional update did not fire: read the row it conflicted with, still holding the
    // write lock, so nothing changed in between.
    let row = read_row(&tx, &key, &fp)?;
    tx.commit()?;
    match row {
        Some(row) => answer(&key, &fp, on_expired, row, now)?.ok_or_else(|| {
            SqlError::Incompatible(format!(
                "the claim of key {key} found a free record it did not take"
            ))
        }),
        None => Err(SqlError::Incompatible(format!(
            "the claim of key {key} neither inserted nor found a record"
        ))),
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        crate::tokio_ready::store_step(false)?;
        let (key, fp, lease, on_expired) = (*req.key, *req.fingerprint, req.lease, req.on_expired);
        let now = now_ms();
        let read = match self.try_answer_inline(&key, &fp, on_expired, now) {
            Inline::Answer(claim) => return Ok(claim),
            Inline::Write => false,
            Inline::Busy => true,
        };
        let sweep = self.inner.sweeps.due(now);
        let origin = StoredOrigin {
            tool: req.origin.tool.to_owned(),
            tenant: req.origin.tenant.to_owned(),
            run: req.origin.run.to_owned(),
        };
        // SQLite runs in this process, so no reply is lost on the way as with a remote store: a
        // statement either returns its answer to this function or the process is gone (with its
        // leases, as any owner that dies). What can happen is that the caller drops this claim
        // while the blocking call runs (a timeout, a cancelled call); the blocking call then
        // releases what it acquired, since nobody holds it. Dropped after the answer came and
        // before it was read, the claim releases it itself (see `Unread`).
        let (answer, answered) = tokio::sync::oneshot::channel();
        let mut answered = Unread { answer: answered, inner: Arc::clone(&self.inner), key };
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            // The clock is read at each try, not before the hop: the blocking pool may have
            // queued us, and another process may have held the lock.
            let claim = inner.retrying(|conn| {
                claim_blocking(conn, key, fp, lease, on_expired, &origin, now_ms(), read)
            });
            // A fresh key nobody waits for is released; a takeover is left to its lease, so
            // that the dead owner's attempt is not erased (the next caller takes it over).
            if let Err(Ok(Claim::Acquired { fence, takeover: false })) = answer.send(claim) {
                release_unheld(&inner, &key, fence);
            }
            // After the answer, and tried once: it only reclaims space, and a claim answered
            // after it would wait for another process's write lock twice. A sweep that fails
            // is tried again at the next interval.
            if sweep && let Ok(conn) = inner.lock().writable() {
                let _ = conn.prepare_cached(SWEEP).and_then(|mut s| s.execute(params![now_ms()]));
            }
        });
        match (&mut answered.answer).await {
            Ok(claim) => claim.map_err(Into::into),
            Err(_) => Err(StoreError::unavailable("the SQLite claim stopped without an answer")),
        }
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let key = *key;
        let outcome = outcome.clone();
        let changed = self
            .call(move |conn| {
                let (kind, payload) = encode(&outcome);
                let params =
                    params![key.as_str(), fence_param(fence), now_ms(), ms(ttl), kind, payload];
                Ok(conn.prepare_cached(COMPLETE)?.execute(params)?)
            })
            .await?;
        self.changed_or_lost(changed)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let key = *key;
        let changed = self
            .call(move |conn| {
                Ok(conn
                    .prepare_cached(RELEASE)?
                    .execute(params![key.as_str(), fence_param(fence)])?)
            })
            .await?;
        self.changed_or_lost(changed)
    }

    async fn renew(&self, key: &Key, fence: Fence, lease: Duration) -> Result<(), StoreError> {
        let key = *key;
        let changed = self
            .call(move |conn| {
                let params = params![key.as_str(), fence_param(fence), now_ms(), ms(lease)];
                Ok(conn.prepare_cached(RENEW)?.execute(params)?)
            })
            .await?;
        if changed == 1 { Ok(()) } else { Err(StoreError::LeaseLost) }
    }

    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError> {
        // Its timeout is Tokio's timer, its statements Tokio's blocking pool.
        crate::tokio_ready::store_step(false)?;
        // The deadline bounds everything, a statement stuck behind another process's lock
        // included.
        tokio::time::timeout(max, self.wait_inner(key, fence)).await.unwrap_or(Ok(()))
    }

    async fn forget(&self, key: &Key) -> Result<bool, StoreError> {
        let key = *key;
        let removed = self
            .call(move |conn| Ok(conn.prepare_cached(FORGET)?.execute(params![key.as_str()])?))
            .await?;
        self.inner.changed.notify_waiters();
        Ok(removed > 0)
    }

    async fn forget_seen(&self, key: &Key, fence: Fence, done: bool) -> Result<bool, StoreError> {
        let key = *key;
        let found = self
            .call(move |conn| {
                let seen = params![key.as_str(), fence_param(fence), i64::from(done)];
                if conn.prepare_cached(FORGET_SEEN)?.execute(seen)? > 0 {
                    return Ok(Forgot::Removed);
                }
                // Not as seen: changed meanwhile, or gone.
                let there = conn.prepare_cached(EXISTS)?.exists(params![key.as_str()])?;
                Ok(if there { Forgot::Changed } else { Forgot::Absent })
            })
            .await?;
        if found == Forgot::Removed {
            self.inner.changed.notify_waiters();
        }
        found.answer()
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let query = query.clone();
        self.call(move |conn| admin::list(conn, &query, now_ms())).await
    }

    async fn inspect(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        let key = *key;
        self.call(move |conn| admin::inspect(conn, &key, now_ms())).await
    }

    async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: &Resolution,
    ) -> Result<(), StoreError> {
        let (key, resolution) = (*key, resolution.clone());
        let changed =
            self.call(move |conn| admin::resolve(conn, &key, fence, &resolution, now_ms())).await?;
        self.changed_or_lost(changed)
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            // Batches, so other processes' claims get the write lock in between.
            let n = self.sweep().await?;
            purged += n as u64;
            if n < admin::SWEEP_BATCH {
                return Ok(purged);
            }
        }
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        self.call(move |conn| admin::stats(conn, now_ms())).await
    }
}

impl SqliteStore {
    async fn wait_inner(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        wait::poll_with_backoff(
            &self.inner.changed,
            POLL_FIRST,
            || POLL_MAX,
            |_| async move {
                let key = *key;
                let held = self
                    .call(move |conn| {
                        let params = params![key.as_str(), fence_param(fence), now_ms()];
                        Ok(conn.prepare_cached(HELD)?.exists(params)?)
                    })
                    .await?;
                // The check does not read the lease end: the pause (at most POLL_MAX) bounds the sleep.
                Ok(held.then_some(Duration::MAX))
            },
        )
        .await
    }

    /// The claim's read-only answer (a replay, a live lease, a mismatch), computed on the
    /// calling thread when that cannot block: the connection is free and SQLite may not wait for
    /// a lock (busy timeout 0; WAL readers do not wait for writers). Read-only connections of
    /// their own were tried for this and measured: two connections of one process reading at
    /// once with busy timeout 0 stalled for seconds in SQLite's WAL read-lock retries. A read of one row by primary key takes microseconds,
    /// far less than a hop to the blocking pool. [`Inline::Write`]: the row was read and the
    /// claim needs the write (no row, or one it may take); [`Inline::Busy`]: nothing was read.
    fn try_answer_inline(
        &self,
        key: &Key,
        fp: &Fingerprint,
        on_expired: OnExpired,
        now: i64,
    ) -> Inline {
        let answer_from = |conn: &Connection| match read_row(conn, key, fp) {
            Ok(None) => Inline::Write,
            Ok(Some(row)) => match answer(key, fp, on_expired, row, now) {
                Ok(Some(claim)) => Inline::Answer(claim),
                Ok(None) => Inline::Write,
                // Reported by the blocking path, which reads again under the write lock.
                Err(_) => Inline::Busy,
            },
            Err(_) => Inline::Busy,
        };
        let Ok(guard) = self.inner.conn.try_lock() else { return Inline::Busy };
        answer_from(guard.readable())
    }

    fn changed_or_lost(&self, changed: usize) -> Result<(), StoreError> {
        if changed == 1 {
            self.inner.changed.notify_waiters();
            Ok(())
        } else {
            Err(StoreError::LeaseLost)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database this process may not write is a configuration error, not an outage: the
    /// executor does not wait for it, the command line exits with its usage code.
    #[test]
    fn a_read_only_database_is_a_configuration_error() {
        let read_only = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("attempt to write a readonly database".into()),
        );
        match StoreError::from(SqlError::Sqlite(read_only)) {
            StoreError::InvalidConfig(m) => assert!(m.contains("read-only"), "{m}"),
            other => panic!("{other:?}"),
        }
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("database is locked".into()),
        );
        assert!(matches!(StoreError::from(SqlError::Sqlite(busy)), StoreError::Unavailable(_)));
        // Also when the read-only directory keeps the database from opening at all.
        let read_only = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("attempt to write a readonly database".into()),
        );
        match open_failed(Path::new("/srv/idem/store.db"), read_only) {
            StoreError::InvalidConfig(m) => assert!(m.contains("/srv/idem/store.db"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// A file with a table named `idem_records` that is not idem's (no schema version) is refused
    /// by `open_existing` and left exactly as it was: its journal mode is not switched to WAL.
    #[test]
    fn a_foreign_idem_records_table_is_refused_and_its_file_left_as_it_was() {
        let dir = std::env::temp_dir().join(format!("idem-foreign-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("other.db");
        let other = Connection::open(&path).unwrap();
        other
            .execute_batch("CREATE TABLE idem_records (id INTEGER PRIMARY KEY, note TEXT)")
            .unwrap();
        drop(other);
        match SqliteStore::open_existing(&path) {
            Err(StoreError::Incompatible(m)) => {
                assert!(m.contains("without a schema version"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let other = Connection::open(&path).unwrap();
        let mode: String = other.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "delete", "the file's journal mode was changed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The sweep a claim starts (once a minute) runs after the claim is answered, as PostgreSQL's
    /// does: it may wait up to the busy timeout for another process's write lock, and a claim
    /// answered only then would run out the caller's store timeout (5 s too) and fail a call
    /// whose key it had acquired. Here the sweep's deletion is made slow by a trigger: the claim
    /// is answered while the record it removes is still there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_is_answered_before_the_sweep_it_starts() {
        let dir = std::env::temp_dir().join(format!("idem-sweep-after-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("store.db");
        let store = SqliteStore::open(&path).unwrap();
        let claim = |key, fingerprint| ClaimRequest {
            key,
            fingerprint,
            lease: Duration::from_secs(30),
            on_expired: OnExpired::TakeOver,
            origin: Default::default(),
        };
        let expired = Key::from_digest(&[1; 32]);
        let fp = Fingerprint::of_derived_key(&expired);
        let Ok(Claim::Acquired { fence, .. }) = store.claim(claim(&expired, &fp)).await else {
            panic!("a fresh key")
        };
        let done = Outcome::Success("1".into());
        store.complete(&expired, fence, &done, Duration::ZERO).await.unwrap();
        let raw = Connection::open(&path).unwrap();
        raw.execute_batch(
            "CREATE TABLE filler (n INTEGER);
             WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 300)
             INSERT INTO filler SELECT n FROM c;
             CREATE TRIGGER slow_delete AFTER DELETE ON idem_records BEGIN
                 SELECT count(*) FROM filler a, filler b, filler c;
             END;",
        )
        .unwrap();
        store.inner.sweeps.make_due();
        let fresh = Key::from_digest(&[2; 32]);
        let fp = Fingerprint::of_derived_key(&fresh);
        assert!(matches!(store.claim(claim(&fresh, &fp)).await, Ok(Claim::Acquired { .. })));
        let left: i64 = raw
            .query_row(
                "SELECT count(*) FROM idem_records WHERE key = ?1",
                [expired.as_str()],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 1, "the claim was answered only after its sweep removed the record");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A name no file can have (a NUL byte in it, also as `%00` in a URL) is a configuration
    /// error: the command line and a caller that retries outages must not wait for it.
    #[test]
    fn a_path_with_a_nul_byte_is_a_configuration_error() {
        let dir = std::env::temp_dir().join(format!("idem-nul-{}", std::process::id()));
        let named = format!("{}/idem\0.db", dir.display());
        let url = format!("sqlite://{}/idem%00.db", dir.display());
        for opened in [SqliteStore::open(&named), SqliteStore::open_url(&url)] {
            match opened {
                Err(StoreError::InvalidConfig(m)) => assert!(m.contains("NUL"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A directory named as the database is a configuration error, not an outage.
    #[test]
    fn a_directory_is_not_a_database() {
        let dir = std::env::temp_dir();
        match SqliteStore::open(&dir) {
            Err(StoreError::InvalidConfig(m)) => assert!(m.contains("is a directory"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// A damaged file (cut short by a full disk or a bad copy) is not "unavailable", which tells
    /// callers and scripts to try again later: it is a store this idem cannot read.
    #[test]
    fn a_damaged_database_is_not_unavailable() {
        let dir = std::env::temp_dir().join(format!("idem-damaged-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let whole = dir.join("whole.db");
        let store = SqliteStore::open(&whole).expect("a new store");
        drop(store);
        let bytes = std::fs::read(&whole).unwrap();
        let cut = dir.join("cut.db");
        // The header and the first page's start: SQLite sees a database, then damage.
        std::fs::write(&cut, &bytes[..bytes.len().min(100)]).unwrap();
        for opened in [SqliteStore::open_existing(&cut), SqliteStore::open(&cut)] {
            match opened {
                Err(StoreError::Damaged(m)) => assert!(m.contains("damaged"), "{m}"),
                Err(StoreError::InvalidConfig(_)) => {}
                other => panic!("a damaged file must not be unavailable: {other:?}"),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

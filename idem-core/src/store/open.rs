//! One way to name a store: [`open`] takes a URL and returns the store it names.

use std::sync::Arc;

use super::redact::redacted;
use super::{MemoryStore, Store, StoreError};

/// The URL forms [`open`] knows, for error messages.
const FORMS: &str = "memory:, sqlite:///abs/path.db, postgres://user@host/db?sslmode=..., \
                     postgresql://..., redis://host:port/db, rediss://host:port/db?ca=/ca.pem, \
                     redis+cluster://host1:port1,host2:port2/, rediss+cluster://..., \
                     or a PostgreSQL key=value string (host=... dbname=...)";

/// Opens the store `url` names, connecting now:
///
/// | URL | store | feature |
/// |-----|-------|---------|
/// | `memory:` | [`MemoryStore`] (this process only) | - |
/// | `sqlite:///abs/path.db`, `sqlite:rel/path.db`, `sqlite::memory:` | `SqliteStore` | `sqlite` |
/// | `postgres://…`, `postgresql://…` (`sslmode`, `sslrootcert` as in libpq) | `PostgresStore` | `postgres` (TLS: `postgres-tls`) |
/// | `host=… dbname=…` (libpq's key=value form, as `PostgresStore::connect` takes it) | `PostgresStore` | `postgres` |
/// | `redis://…`, `rediss://…?ca=/path/ca.pem` | `RedisStore` on one server | `redis` (TLS: `redis-tls`) |
/// | `redis+cluster://h1:p1,h2:p2,…/`, `rediss+cluster://…` | `RedisStore` on a Redis Cluster (any of its nodes listed) | `redis` (TLS: `redis-tls`) |
///
/// A Redis URL also takes `wait_replicas=N` and `wait_timeout_ms=T` (wait for `N` replicas after
/// each claim and completion; see `RedisStoreBuilder::wait_for_replicas`); an unknown option is
/// `InvalidConfig`.
///
/// Errors: [`StoreError::InvalidConfig`] for an unknown scheme, a malformed URL, or a store
/// whose cargo feature is not compiled in (the message names the feature); otherwise what the
/// store's own constructor answers (`Unavailable` when the server cannot be reached,
/// `Incompatible` for a schema of another version).
///
/// ```no_run
/// # async fn f() -> Result<(), idem_core::StoreError> {
/// let store = idem_core::store::open("postgres://idem@db.example/app?sslmode=verify-full").await?;
/// let idem = idem_core::Idem::builder_shared(store).build();
/// # Ok(()) }
/// ```
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open_as(url, Create::Yes).await
}

/// [`open`] for a store that already exists: nothing is created. A `sqlite:` URL naming a file
/// that does not exist or has no idem tables, and a PostgreSQL database (and `search_path`)
/// without them, are refused with [`StoreError::InvalidConfig`] instead of becoming a new, empty
/// store; so is `memory:` (and `sqlite::memory:`), which is always a new one. A Redis server
/// holds no schema: a key prefix with no key there (no record, no fence counter) is refused the
/// same way, naming the prefixes of idem records found. For tools that only look at a store, such as the
/// `idem` command line, where a mistyped path or connection string must not show an empty store
/// (nothing stuck) while the application's records are elsewhere.
///
/// Errors: as [`open`], and `InvalidConfig` as above.
pub async fn open_existing(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    open_as(url, Create::No).await
}

/// Whether opening may create the store (its file, its tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Create {
    Yes,
    /// Only a store that exists ([`open_existing`]).
    No,
}

async fn open_as(url: &str, create: Create) -> Result<Arc<dyn Store>, StoreError> {
    if is_key_value(url) {
        return postgres(url, create).await;
    }
    // Errors show the URL without its password (`redact.rs`).
    let shown = redacted(url);
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(StoreError::InvalidConfig(format!(
            "store URL {shown:?} has no scheme; expected one of {FORMS}"
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        // Anything after the scheme would be an option or a name this store ignores.
        "memory" if !matches!(rest, "" | "//") => Err(StoreError::InvalidConfig(format!(
            "the memory store takes no path or options, and what follows `memory:` would be \
             ignored; write `memory:`: {shown:?}"
        ))),
        "memory" if create == Create::No => Err(new_store(url)),
        "memory" => Ok(Arc::new(MemoryStore::new())),
        "sqlite" => sqlite(url, create).await,
        // Schemes are case-insensitive (RFC 3986 §3.1); the PostgreSQL client reads only
        // `postgres://` and `postgresql://` as written.
        lower @ ("postgres" | "postgresql") => postgres(&format!("{lower}:{rest}"), create).await,
        "redis" | "rediss" | "redis+unix" | "unix" | "redis+cluster" | "rediss+cluster" => {
            redis(url, create).await
        }
        other => Err(StoreError::InvalidConfig(format!(
            "unknown store URL scheme {other:?} in {shown:?}; expected one of {FORMS}"
        ))),
    }
}

/// The refusal of [`open_existing`] for a store that lives in one process.
fn new_store(url: &str) -> StoreError {
    StoreError::InvalidConfig(format!(
        "{:?} is a store inside one process: opened here it would be a new, empty one; name \
         the store the application uses (sqlite:///abs/path.db, postgres://..., redis://...)",
        redacted(url)
    ))
}

/// Whether `url` is libpq's key=value connection string (`host=db user=app dbname=app`): it
/// starts with a keyword and `=`, which no URL scheme does (a scheme is followed by `:`).
fn is_key_value(url: &str) -> bool {
    let text = url.trim_start();
    let keyword =
        text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(text.len());
    keyword > 0 && text[keyword..].trim_start().starts_with('=')
}

#[cfg(not(all(feature = "sqlite", feature = "postgres", feature = "redis")))]
fn not_compiled(store: &str, feature: &str) -> StoreError {
    StoreError::InvalidConfig(format!(
        "the {store} store is not compiled in: {}",
        enable_feature(feature)
    ))
}

/// How to turn on `feature`, for an error message: the user may have built idem-core through
/// another crate (the `idem` command line has features of the same names).
pub(crate) fn enable_feature(feature: &str) -> String {
    format!(
        "build with the cargo feature `{feature}` (of idem-core, or of the crate built on it: \
         `cargo install --path idem-cli --features {feature}` for the idem command line)"
    )
}

#[cfg(feature = "sqlite")]
async fn sqlite(url: &str, create: Create) -> Result<Arc<dyn Store>, StoreError> {
    let (url, path) = (url.to_owned(), super::sqlite::url_path(url)?.into_owned());
    if create == Create::No && path == ":memory:" {
        return Err(new_store(&url));
    }
    // Opening a file blocks (and may wait for another process's lock).
    crate::tokio_ready::store_step(false)?;
    let opened = tokio::task::spawn_blocking(move || match create {
        Create::Yes => super::SqliteStore::open_url(&url),
        Create::No => super::SqliteStore::open_existing(path),
    })
    .await;
    Ok(Arc::new(opened.map_err(StoreError::unavailable)??))
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(url: &str, create: Create) -> Result<Arc<dyn Store>, StoreError> {
    if create == Create::No && url.ends_with(":memory:") {
        return Err(new_store(url));
    }
    Err(not_compiled("SQLite", "sqlite"))
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, create: Create) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(match create {
        Create::Yes => super::PostgresStore::connect(url).await?,
        Create::No => super::PostgresStore::connect_existing(url).await?,
    }))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str, _: Create) -> Result<Arc<dyn Store>, StoreError> {
    Err(not_compiled("PostgreSQL", "postgres"))
}

#[cfg(feature = "redis")]
async fn redis(url: &str, create: Create) -> Result<Arc<dyn Store>, StoreError> {
    let builder = super::RedisStore::builder(url);
    // A tool that only looks at a store may look at a replica.
    let builder = if create == Create::No { builder.looking_only() } else { builder };
    let store = builder.open().await?;
    if create == Create::No {
        store.check_in_use().await?;
    }
    Ok(Arc::new(store))
}

#[cfg(not(feature = "redis"))]
async fn redis(_: &str, _: Create) -> Result<Arc<dyn Store>, StoreError> {
    Err(not_compiled("Redis", "redis"))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn refused(url: &str) -> String {
        match open(url).await {
            Err(StoreError::InvalidConfig(m)) => m,
            Err(other) => panic!("{url}: expected InvalidConfig, got {other}"),
            Ok(_) => panic!("{url}: opened"),
        }
    }

    #[tokio::test]
    async fn unknown_scheme_names_the_known_forms() {
        let m = refused("mysql://h/db").await;
        assert!(m.contains("\"mysql\"") && m.contains("postgres://"), "{m}");
        let m = refused("/var/lib/idem.db").await;
        assert!(m.contains("no scheme"), "{m}");
    }

    #[test]
    fn key_value_strings_are_told_from_urls() {
        for kv in
            ["host=127.0.0.1 port=5432 user=postgres dbname=test", " dbname = test", "host=[::1]"]
        {
            assert!(is_key_value(kv), "{kv}");
        }
        for url in ["postgres://h/db?sslmode=require", "memory:", "/var/lib/idem.db", "=x", ""] {
            assert!(!is_key_value(url), "{url}");
        }
    }

    /// A key=value string goes to the PostgreSQL store, which refuses a bad option before it
    /// connects (or names the missing feature): not "no scheme".
    #[tokio::test]
    async fn key_value_strings_open_postgres() {
        let m = refused("host=127.0.0.1 dbname=test sslmode=bogus").await;
        assert!(!m.contains("no scheme"), "{m}");
        #[cfg(feature = "postgres")]
        assert!(m.contains("sslmode"), "{m}");
        #[cfg(not(feature = "postgres"))]
        assert!(m.contains("`postgres`"), "{m}");
    }

    #[tokio::test]
    async fn memory_opens() {
        assert!(open("memory:").await.expect("opens").is_local());
        assert!(open("memory://").await.expect("opens").is_local());
        // Anything more would be ignored: refused, not a store that differs from what was asked.
        for url in ["memory:?x=1", "memory:name", "memory://host/db"] {
            let m = refused(url).await;
            assert!(m.contains("takes no path or options"), "{url}: {m}");
        }
    }

    /// A path SQLite would not share (empty: a private temporary database), a URL's escapes, a
    /// `file:` name, and files that cannot be a store: each opens what it names or says why not,
    /// naming the path.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_paths_mean_one_shared_file_or_a_refusal() {
        use crate::store::SqliteStore;
        let dir = std::env::temp_dir().join(format!("idem-sqlite-paths-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        match SqliteStore::open("") {
            Err(StoreError::InvalidConfig(m)) => assert!(m.contains("path is empty"), "{m}"),
            other => panic!("an empty path: {:?}", other.map(drop)),
        }
        // Escapes decode as in any URL's path: the same file as the plain path.
        let url = format!("sqlite://{}/a%20b.db", dir.display());
        drop(open(&url).await.expect("opens"));
        assert!(dir.join("a b.db").is_file(), "{url} is {}", dir.join("a b.db").display());
        assert!(!dir.join("a%20b.db").exists());
        let m = refused(&format!("sqlite://{}/%ff.db", dir.display())).await;
        assert!(m.contains("not UTF-8"), "{m}");
        // A name starting with `file:` is a file of that name, not an SQLite URI with options.
        let uri_like = dir.join("file:x.db?mode=memory");
        drop(SqliteStore::open(&uri_like).expect("opens"));
        assert!(uri_like.is_file(), "a file named {}", uri_like.display());
        // Not a database, a missing directory: refused, naming the path; the file is untouched.
        let text = dir.join("notes.txt");
        std::fs::write(&text, "not a database, at all; long enough to have a header".repeat(4))
            .unwrap();
        let before = std::fs::read(&text).unwrap();
        match SqliteStore::open(&text) {
            Err(StoreError::InvalidConfig(m)) => {
                assert!(m.contains("notes.txt is not an SQLite database"), "{m}");
            }
            other => panic!("a text file: {:?}", other.map(drop)),
        }
        assert_eq!(std::fs::read(&text).unwrap(), before, "left as it is");
        let missing = dir.join("no-such-dir").join("x.db");
        match SqliteStore::open(&missing) {
            Err(e @ StoreError::Unavailable(_)) => {
                let m = crate::ErrorChain(&e).to_string();
                assert!(m.contains("cannot open the SQLite database at"), "{m}");
                assert!(m.contains("no-such-dir"), "{m}");
            }
            other => panic!("a missing directory: {:?}", other.map(drop)),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Nothing an operator mistyped becomes a new store: a missing file stays missing, another
    /// application's SQLite database gets no idem tables (nor WAL files), and stores that only
    /// live in this process are refused.
    #[tokio::test]
    async fn open_existing_creates_nothing() {
        let refused_existing = async |url: &str| match open_existing(url).await {
            Err(StoreError::InvalidConfig(m)) => m,
            Err(other) => panic!("{url}: expected InvalidConfig, got {other}"),
            Ok(_) => panic!("{url}: opened"),
        };
        for url in ["memory:", "MEMORY:", "sqlite::memory:"] {
            assert!(refused_existing(url).await.contains("inside one process"), "{url}");
        }
        #[cfg(feature = "sqlite")]
        {
            let dir =
                std::env::temp_dir().join(format!("idem-open-existing-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let missing = dir.join("missing.db");
            let m = refused_existing(&format!("sqlite://{}", missing.display())).await;
            assert!(m.contains("no such file"), "{m}");
            let m = refused_existing(&format!("sqlite://{}", dir.display())).await;
            assert!(m.contains("a directory: name the database file in it"), "{m}");
            assert!(!missing.exists(), "no file was created");

            let other = dir.join("other.db");
            let conn = rusqlite::Connection::open(&other).unwrap();
            conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)").unwrap();
            drop(conn);
            let m = refused_existing(&format!("sqlite:{}", other.display())).await;
            assert!(m.contains("no idem_records table"), "{m}");
            let conn = rusqlite::Connection::open(&other).unwrap();
            let tables: Vec<String> = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(tables, ["orders"], "the database was left as it was");
            let journal: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
            assert_eq!(journal, "delete", "not switched to WAL");
            drop(conn);

            let garbage = dir.join("garbage.db");
            std::fs::write(&garbage, b"not a database, but long enough to have a header page..")
                .unwrap();
            let m = refused_existing(&format!("sqlite:{}", garbage.display())).await;
            assert!(m.contains("not a SQLite database"), "{m}");

            // An option is not taken as part of the file name, by either way of opening.
            let store = dir.join("idem.db");
            let with_query = format!("sqlite://{}?mode=ro", store.display());
            assert!(refused_existing(&with_query).await.contains("takes no options"));
            assert!(refused(&with_query).await.contains("takes no options"));
            assert!(!store.exists(), "nothing was created");

            // An idem store opens.
            drop(open(&format!("sqlite:{}", store.display())).await.expect("created by open"));
            open_existing(&format!("sqlite:{}", store.display())).await.expect("opens");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn missing_feature_is_named() {
        let m = refused("postgres://h/db").await;
        assert!(m.contains("`postgres`"), "{m}");
    }
}

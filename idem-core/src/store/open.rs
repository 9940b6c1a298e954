//! One way to name a store: [`open`] takes a URL and returns the store it names.

use std::sync::Arc;

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
    if is_key_value(url) {
        return postgres(url).await;
    }
    let Some((scheme, _)) = url.split_once(':') else {
        return Err(StoreError::InvalidConfig(format!(
            "store URL {url:?} has no scheme; expected one of {FORMS}"
        )));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        "sqlite" => sqlite(url).await,
        "postgres" | "postgresql" => postgres(url).await,
        "redis" | "rediss" | "redis+unix" | "unix" | "redis+cluster" | "rediss+cluster" => {
            redis(url).await
        }
        other => Err(StoreError::InvalidConfig(format!(
            "unknown store URL scheme {other:?} in {url:?}; expected one of {FORMS}"
        ))),
    }
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
        "the {store} store is not compiled in: enable the cargo feature `{feature}` of idem-core"
    ))
}

#[cfg(feature = "sqlite")]
async fn sqlite(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let url = url.to_owned();
    // Opening a file blocks (and may wait for another process's lock).
    let opened = tokio::task::spawn_blocking(move || super::SqliteStore::open_url(&url)).await;
    let store = opened.map_err(StoreError::unavailable)??;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(_: &str) -> Result<Arc<dyn Store>, StoreError> {
    Err(not_compiled("SQLite", "sqlite"))
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(super::PostgresStore::connect(url).await?))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str) -> Result<Arc<dyn Store>, StoreError> {
    Err(not_compiled("PostgreSQL", "postgres"))
}

#[cfg(feature = "redis")]
async fn redis(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(super::RedisStore::open(url).await?))
}

#[cfg(not(feature = "redis"))]
async fn redis(_: &str) -> Result<Arc<dyn Store>, StoreError> {
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
    }

    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn missing_feature_is_named() {
        let m = refused("postgres://h/db").await;
        assert!(m.contains("`postgres`"), "{m}");
    }
}

//! A server that acknowledges writes it can still lose breaks the store's assumption that an
//! acknowledged claim or outcome survives: a PostgreSQL with `synchronous_commit = off` or
//! `fsync = off` (a crash loses the last commits; `idem-core/src/store/postgres/pool.rs`), a Redis
//! without an append-only file (a restart loses what was written since the last snapshot;
//! `idem-core/src/store/redis/persistence.rs`). Opening the store on one logs a warning saying so.
//! So does opening a PostgreSQL store that creates its tables while other schemas of the database
//! hold some: records left there by a changed `search_path` would be run again.
//! Its own test binary: the warning is caught by a subscriber installed for this thread.
//! Run: cargo test --features postgres,redis --test durability

use std::str::FromStr;
use std::sync::{Arc, Mutex};

use idem_core::PostgresStore;
use idem_core::store::RedisStore;
use idem_tests::servers::RedisPrivate;
use idem_tests::{or_skip, pg_url};
use tokio_postgres::Config;
use tracing_subscriber::layer::SubscriberExt;

#[path = "shared/pg.rs"]
mod pg;

/// Collects the messages of warnings.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message<'a>(&'a mut String);
        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut text = String::new();
            event.record(&mut Message(&mut text));
            self.0.lock().unwrap().push(text);
        }
    }
}

/// The warnings logged while `open` runs on this thread; `None` when its store is absent (skip).
async fn warnings_of<T, E: std::fmt::Display>(
    what: &str,
    open: impl Future<Output = Result<T, E>>,
) -> Option<Vec<String>> {
    let warnings = Warnings::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    or_skip(what, open.await)?;
    let found = warnings.0.lock().unwrap().clone();
    Some(found)
}

async fn warnings_on_open(options: &str) -> Option<Vec<String>> {
    let mut config = Config::from_str(&pg_url()).unwrap();
    config.options(options);
    warnings_of("PostgreSQL", PostgresStore::connect_with(config, 1)).await
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_that_may_lose_acknowledged_commits_is_named_at_open() {
    let Some(lossy) = warnings_on_open("-c synchronous_commit=off").await else { return };
    assert!(
        lossy
            .iter()
            .any(|w| w.contains("synchronous_commit=off") && w.contains("run the tool again")),
        "{lossy:?}"
    );
    let Some(durable) = warnings_on_open("-c synchronous_commit=on").await else { return };
    assert!(!durable.iter().any(|w| w.contains("synchronous_commit")), "{durable:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_that_a_restart_empties_is_named_at_open() {
    let Some(redis) =
        or_skip("redis-server (a private one)", RedisPrivate::start("redis-aof", &[]))
    else {
        return;
    };
    // Started as every local server here is: no append-only file, no snapshots.
    let Some(lossy) = warnings_of("Redis", RedisStore::open(&redis.url(""))).await else { return };
    assert!(
        lossy.iter().any(|w| w.contains("appendonly") && w.contains("run the tool again")),
        "{lossy:?}"
    );
    let admin = redis::Client::open(redis.url("")).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "appendonly", "yes"])
        .query_async(&mut admin)
        .await
        .unwrap();
    let Some(durable) = warnings_of("Redis", RedisStore::open(&redis.url(""))).await else {
        return;
    };
    assert!(!durable.iter().any(|w| w.contains("appendonly")), "{durable:?}");
}

/// An application whose `search_path` changed (a new connection string, a role whose own schema
/// now comes first) would start on a new, empty store, and every call recorded in the old one
/// would run its tool again when repeated: opening names the schemas that already hold idem's
/// tables. Opening a store that exists says nothing.
#[tokio::test(flavor = "current_thread")]
async fn new_tables_beside_existing_ones_are_named_at_open() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let (old, admin, config) = pg::private_schema("schema_before").await;
    drop(PostgresStore::connect_with(config, 1).await.expect("the first store"));
    let (new, _, moved) = pg::private_schema("schema_after").await;
    let created = warnings_of("PostgreSQL", PostgresStore::connect_with(moved.clone(), 1)).await;
    let reopened = warnings_of("PostgreSQL", PostgresStore::connect_with(moved, 1)).await;
    pg::drop_schema(&admin, &old).await;
    pg::drop_schema(&admin, &new).await;
    let created = created.expect("opens");
    assert!(
        created.iter().any(|w| w.contains(&new) && w.contains(&old) && w.contains("search_path")),
        "{created:?}"
    );
    let reopened = reopened.expect("opens");
    assert!(!reopened.iter().any(|w| w.contains("search_path")), "{reopened:?}");
}

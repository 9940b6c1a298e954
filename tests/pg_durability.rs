//! A PostgreSQL that acknowledges commits a server crash can lose (`synchronous_commit = off`,
//! `fsync = off`) breaks the store's assumption that an acknowledged claim or outcome survives;
//! opening the store on one logs a warning saying so (`idem-core/src/store/postgres/pool.rs`).
//! Its own test binary: the warning is caught by a subscriber installed for this thread.
//! Run: cargo test --features postgres --test pg_durability

use std::str::FromStr;
use std::sync::{Arc, Mutex};

use idem_core::PostgresStore;
use idem_tests::{or_skip, pg_url};
use tokio_postgres::Config;
use tracing_subscriber::layer::SubscriberExt;

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

async fn warnings_on_open(options: &str) -> Option<Vec<String>> {
    let mut config = Config::from_str(&pg_url()).unwrap();
    config.options(options);
    let warnings = Warnings::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    or_skip("PostgreSQL", PostgresStore::connect_with(config, 1).await)?;
    let found = warnings.0.lock().unwrap().clone();
    Some(found)
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

//! `PostgresStore::from_pool`: the store on the application's own deadpool-postgres pool
//! (`IDEM_PG_URL`; skipped when the server is unreachable, a failure under `CI=true`). The
//! conformance suite passes with a dedicated LISTEN connection and without one (waiters poll),
//! and an exhausted pool fails a call closed within `Policy::store_timeout`.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, Pool};
use idem_core::{Classify, Error, Failure, Idem, Policy, PostgresStore, tool};
use idem_tests::{or_skip, pg_url};
use serde::{Deserialize, Serialize};

/// The application's pool.
fn app_pool(size: usize) -> Pool {
    let config = tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    let manager = Manager::new(config, tokio_postgres::NoTls);
    Pool::builder(manager).max_size(size).build().expect("pool")
}

async fn store(listen: bool) -> Option<Arc<PostgresStore>> {
    let url = pg_url();
    let store = PostgresStore::from_pool(app_pool(4), listen.then_some(url.as_str())).await;
    or_skip("PostgreSQL", store).map(Arc::new)
}

mod listening {
    use super::*;
    idem_core::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store(true).await
    );
    idem_core::store_admin_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store(true).await
    );
}

/// Without a LISTEN connection, waits poll: the wait tests pass all the same.
mod polling {
    use super::*;
    idem_core::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store(false).await
    );
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("never fails")]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[tool(retry = "keyed")]
async fn book(seat: String) -> Result<String, Never> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("booked {seat}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_fails_closed_then_serves() {
    let pool = app_pool(1);
    let Some(store) = or_skip("PostgreSQL", PostgresStore::from_pool(pool.clone(), None).await)
    else {
        return;
    };
    let policy = Policy { store_timeout: Duration::from_millis(300), ..Policy::default() };
    let idem = Idem::builder(store).policy(policy).build();
    let run = idem.run(format!("pool-{}-{:?}", std::process::id(), std::time::SystemTime::now()));

    // The application's own query holds the pool's only connection.
    let held = pool.get().await.expect("the application's connection");
    held.query_one("SELECT 1", &[]).await.expect("the application's query");
    let answer = book(&run, "12A".into()).await;
    assert!(
        matches!(answer, Err(Error::StoreUnavailable { .. })),
        "an exhausted pool fails the call closed, got {answer:?}"
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 0, "the tool did not run");

    // Once the application gives the connection back, the same call runs, once.
    drop(held);
    assert_eq!(book(&run, "12A".into()).await.expect("runs"), "booked 12A");
    assert_eq!(book(&run, "12A".into()).await.expect("replays"), "booked 12A");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "ran once, then replayed");
}

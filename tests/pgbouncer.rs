//! The PostgreSQL store through PgBouncer in transaction mode (a private `pgbouncer` this binary
//! starts in front of `IDEM_PG_URL`'s server): with `pgbouncer=true` the store sends only unnamed
//! statements and keeps no session state between transactions, and waiters poll instead of
//! listening. The conformance suites (claims, operator side, several instances) and the
//! multi-process scenario pass through it, and so do the suites for the application's own pool
//! pointed at PgBouncer (`PostgresStore::from_pool_with` with `PoolOptions::pgbouncer`); polling
//! wakes a waiter in another store, and a listener behind PgBouncer finds out that notifications
//! do not arrive.

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_core::conformance::fresh_key;
use idem_core::store::postgres::PoolOptions;
use idem_core::store::{Claim, Outcome};
use idem_core::{PostgresStore, Store, StoreError};
use idem_tests::servers::PgBouncer;
use idem_tests::{acquire, claim_req, or_skip, pg_url};

const EXE: &str = env!("CARGO_BIN_EXE_idem-stress-worker");

/// One PgBouncer for the whole binary, in front of the server of `IDEM_PG_URL`.
fn bouncer() -> Option<&'static PgBouncer> {
    static SERVER: OnceLock<Result<PgBouncer, String>> = OnceLock::new();
    let started = SERVER.get_or_init(|| {
        let config = tokio_postgres::Config::from_str(&pg_url()).map_err(|e| e.to_string())?;
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "127.0.0.1".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let dbname = config.get_dbname().unwrap_or("test");
        let user = config.get_user().unwrap_or("postgres");
        PgBouncer::start(&host, port, dbname, user)
    });
    or_skip("PgBouncer (the pgbouncer package)", started.as_ref())
}

/// The store through PgBouncer, in PgBouncer mode.
async fn store() -> Option<Arc<PostgresStore>> {
    let bouncer = bouncer()?;
    let url = bouncer.conninfo("pgbouncer=true");
    or_skip("PostgreSQL through PgBouncer", PostgresStore::connect(&url).await).map(Arc::new)
}

idem_core::store_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await
);
// Listing, inspecting, resolving and counting: unnamed statements too.
idem_core::store_admin_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await
);

/// Two stores on one database, both through PgBouncer.
async fn pair() -> Option<(Arc<PostgresStore>, Arc<PostgresStore>)> {
    Some((store().await?, store().await?))
}

idem_core::store_multi_instance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    pair().await
);

/// The store on the application's deadpool pool, whose connections go through PgBouncer.
async fn app_store() -> Option<Arc<PostgresStore>> {
    let bouncer = bouncer()?;
    let config = tokio_postgres::Config::from_str(&bouncer.conninfo("")).expect("conninfo");
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager).max_size(4).build().expect("pool");
    let store = PostgresStore::from_pool_with(pool, PoolOptions::new().pgbouncer(true)).await;
    or_skip("PostgreSQL through PgBouncer", store).map(Arc::new)
}

mod app_pool {
    use super::*;
    idem_core::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        app_store().await
    );
    idem_core::store_admin_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        app_store().await
    );
    idem_core::store_multi_instance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        app_pair().await
    );
}

/// The application's pool and the store's own, both through PgBouncer, on one database.
async fn app_pair() -> Option<(Arc<PostgresStore>, Arc<PostgresStore>)> {
    Some((app_store().await?, store().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_across_processes_through_pgbouncer() {
    let Some(_) = store().await else { return };
    let url = bouncer().map(|b| b.conninfo("pgbouncer=true")).unwrap_or_default();
    idem_tests::hammer::hammer(EXE, &format!("pg:{url}"), "mp-pgbouncer").await;
}

/// Nothing carries notifications through PgBouncer: a waiter in another store (another process,
/// as far as the store knows) is woken by its own polling once the holder completes, long before
/// its `max`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_wakes_a_waiter_of_another_store() {
    let Some(holder) = store().await else { return };
    let waiter = store().await.expect("a second store");
    assert!(!waiter.listening(), "PgBouncer mode does not listen");
    let (key, fp) = fresh_key("polling_wakes_a_waiter", "{}");
    let fence = acquire(&*holder, &key, &fp).await;
    let max = Duration::from_secs(600);
    let waiting = tokio::spawn({
        let waiter = Arc::clone(&waiter);
        async move { waiter.wait(&key, fence, max).await }
    });
    // The waiter polls while the holder is in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter returned while the holder was in flight");
    holder
        .complete(&key, fence, &Outcome::Success("1".into()), Duration::from_secs(30))
        .await
        .expect("complete");
    // A hang guard only: a waiter that is never woken would sit out its 10-minute max.
    let woken = tokio::time::timeout(Duration::from_secs(60), waiting).await;
    woken.expect("the waiter returned long before its max").expect("task").expect("wait");
    let after = waiter.claim(claim_req(&key, &fp)).await.expect("claim");
    assert!(matches!(after, Claim::Completed(_)), "the waiter sees the completion: {after:?}");
}

/// A listener whose connection goes through PgBouncer (here: a store on a direct pool with its
/// listen connection string pointing at PgBouncer) finds that its probe notification never
/// arrives, and leaves waiters polling; the same listener on the direct server listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_behind_pgbouncer_is_detected() {
    let Some(bouncer) = bouncer() else { return };
    let direct = || {
        let config = tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL");
        let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
        deadpool_postgres::Pool::builder(manager).max_size(2).build().expect("pool")
    };
    let Some(listened) =
        or_skip("PostgreSQL", PostgresStore::from_pool(direct(), Some(&pg_url())).await)
    else {
        return;
    };
    let behind = PostgresStore::from_pool(direct(), Some(&bouncer.conninfo("")))
        .await
        .expect("a store listening through PgBouncer");
    // Both probes have had ample time; the direct listener must have succeeded by now.
    for _ in 0..100 {
        if listened.listening() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listened.listening(), "the listener on the direct server listens");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!behind.listening(), "the probe notification never arrives through PgBouncer");
    // And its waiters are still woken, by polling.
    let (key, fp) = fresh_key("listener_behind_pgbouncer", "{}");
    let fence = acquire(&listened, &key, &fp).await;
    let waiting = tokio::spawn({
        let behind = behind.clone();
        async move { behind.wait(&key, fence, Duration::from_secs(600)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    listened
        .complete(&key, fence, &Outcome::Success("1".into()), Duration::from_secs(30))
        .await
        .expect("complete");
    let woken = tokio::time::timeout(Duration::from_secs(60), waiting).await;
    woken.expect("the waiter returned long before its max").expect("task").expect("wait");
}

/// A connection string with `options` (a `search_path` for another schema, say) through a
/// PgBouncer that does not pass it on: PgBouncer refuses the startup parameter at every
/// connection, which no retry changes. A configuration error naming the parameter and the way
/// out (the role's own search_path), not "unavailable" (an outage to wait out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_parameter_pgbouncer_refuses_is_a_configuration_error() {
    let Some(bouncer) = bouncer() else { return };
    let url = bouncer.conninfo("pgbouncer=true options='-c search_path=public'");
    match PostgresStore::connect(&url).await {
        Err(StoreError::InvalidConfig(m)) => {
            assert!(m.contains("options") && m.contains("ALTER ROLE"), "{m}");
        }
        other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
    }
}

//! The store's connection pools: the application's own deadpool-postgres pool
//! (`PostgresStore::from_pool`) and the one `PostgresStore::connect` builds (`IDEM_PG_URL`;
//! skipped when the server is unreachable, a failure under `CI=true`). The conformance suite
//! passes with a dedicated LISTEN connection and without one (waiters poll); an exhausted pool,
//! either kind, fails a call closed within `Policy::store_timeout`; and a connection the server
//! ends (`pg_terminate_backend`) is replaced, so the next call succeeds; a server that never
//! answers is named as the cause, not an exhausted pool.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::conformance::fresh_key;
use idem_core::store::postgres::deadpool_postgres::{Manager, Pool};
use idem_core::store::postgres::tokio_postgres;
use idem_core::store::{Claim, Outcome, StoreError};
use idem_core::{Error, Idem, Policy, PostgresStore, Store, tool};
use idem_tests::{Never, acquire, claim_req, or_skip, pg_url};

/// The application's pool.
fn app_pool(size: usize) -> Pool {
    app_pool_of(tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL"), size)
}

fn app_pool_of(config: tokio_postgres::Config, size: usize) -> Pool {
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

static SEATS: AtomicUsize = AtomicUsize::new(0);

#[tool(retry = "keyed")]
async fn seat(seat: String) -> Result<String, Never> {
    SEATS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("seated {seat}"))
}

/// The configuration of `IDEM_PG_URL` with an `application_name` unique to this process and
/// `what`, so the test finds its store's server connections in `pg_stat_activity`.
fn named(what: &str) -> (tokio_postgres::Config, String) {
    let mut config = tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    let name = format!("idem-pool-{what}-{}", std::process::id());
    config.application_name(&name);
    (config, name)
}

async fn admin() -> tokio_postgres::Client {
    let config = tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.expect("admin connect");
    tokio::spawn(conn);
    client
}

/// Waits (a hang guard only) until `check` holds.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The server processes of the connections named `name`.
async fn backends(admin: &tokio_postgres::Client, name: &str) -> Vec<i32> {
    let rows = admin
        .query("SELECT pid FROM pg_stat_activity WHERE application_name = $1", &[&name])
        .await
        .expect("pg_stat_activity");
    rows.iter().map(|r| r.get(0)).collect()
}

/// `connect`'s own pool, of one connection, busy with a statement blocked on a row lock: a step
/// waits at most the connect timeout for it (the pool's message says so), a call through the
/// executor fails closed within `store_timeout` without running the tool, and once the
/// connection is free again the same call runs once and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_pool_exhausted_fails_closed_then_serves() {
    let (mut config, name) = named("exhausted");
    config.connect_timeout(Duration::from_secs(1));
    let Some(store) = or_skip("PostgreSQL", PostgresStore::connect_with(config, 1).await) else {
        return;
    };
    let admin = admin().await;
    let (held, fp) = fresh_key("own_pool_exhausted", "held");
    let fence = acquire(&store, &held, &fp).await;
    // The row lock makes the store's completion wait in the server, holding the connection.
    admin.batch_execute("BEGIN").await.expect("begin");
    admin
        .query("SELECT 1 FROM idem_records WHERE key = $1 FOR UPDATE", &[&held.as_str()])
        .await
        .expect("lock the row");
    let blocked = tokio::spawn({
        let store = store.clone();
        async move {
            let ok = Outcome::Success("1".into());
            store.complete(&held, fence, &ok, Duration::from_secs(60)).await
        }
    });
    until("the completion waits for the row lock", || async {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND wait_event_type = 'Lock'",
                &[&name],
            )
            .await
            .expect("pg_stat_activity");
        row.get::<_, i64>(0) == 1
    })
    .await;

    let (other, _) = fresh_key("own_pool_exhausted", "other");
    // One step, not a claim (which sends again after a connection it could not have).
    match store.inspect(&other).await {
        Err(StoreError::Unavailable(m)) => {
            assert!(m.to_string().contains("became free"), "the pool's wait ran out: {m}")
        }
        got => panic!("an exhausted pool answers Unavailable, got {got:?}"),
    }
    let policy = Policy { store_timeout: Duration::from_millis(300), ..Policy::default() };
    let idem = Idem::builder(store.clone()).policy(policy).build();
    let run =
        idem.run(format!("own-pool-{}-{:?}", std::process::id(), std::time::SystemTime::now()));
    let answer = seat(&run, "7C".into()).await;
    assert!(
        matches!(answer, Err(Error::StoreUnavailable { .. })),
        "an exhausted pool fails the call closed, got {answer:?}"
    );
    assert_eq!(SEATS.load(Ordering::SeqCst), 0, "the tool did not run");

    admin.batch_execute("ROLLBACK").await.expect("unlock");
    blocked.await.expect("task").expect("the blocked completion completes");
    assert_eq!(seat(&run, "7C".into()).await.expect("runs"), "seated 7C");
    assert_eq!(seat(&run, "7C".into()).await.expect("replays"), "seated 7C");
    assert_eq!(SEATS.load(Ordering::SeqCst), 1, "ran once, then replayed");
}

/// Every server connection of `store` (named `name`) is ended by `pg_terminate_backend`; the
/// next calls succeed on new connections, and the record written before is still there.
async fn killed_connections_are_replaced(store: &PostgresStore, name: &str) {
    let admin = admin().await;
    let (done, fp) = fresh_key("killed_connections", name);
    let fence = acquire(store, &done, &fp).await;
    let ok = Outcome::Success("\"kept\"".into());
    store.complete(&done, fence, &ok, Duration::from_secs(60)).await.expect("complete");
    let before = backends(&admin, name).await;
    assert!(!before.is_empty(), "the store's connections are named {name}");
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .expect("terminate");
    until("the ended connections are gone", || async {
        backends(&admin, name).await.iter().all(|pid| !before.contains(pid))
    })
    .await;

    let replay = store.claim(claim_req(&done, &fp)).await.expect("the next call succeeds");
    assert!(matches!(replay, Claim::Completed(_)), "replays the record, got {replay:?}");
    let (fresh, fp2) = fresh_key("killed_connections", name);
    let fence = acquire(store, &fresh, &fp2).await;
    store.complete(&fresh, fence, &ok, Duration::from_secs(60)).await.expect("complete again");
    let after = backends(&admin, name).await;
    assert!(!after.is_empty(), "new connections serve the calls");
    assert!(after.iter().all(|pid| !before.contains(pid)), "no ended connection is reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_pool_replaces_a_killed_connection() {
    let (config, name) = named("killed-own");
    let Some(store) = or_skip("PostgreSQL", PostgresStore::connect_with(config, 2).await) else {
        return;
    };
    killed_connections_are_replaced(&store, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_pool_replaces_a_killed_connection() {
    let (config, name) = named("killed-app");
    let store = PostgresStore::from_pool(app_pool_of(config, 2), None).await;
    let Some(store) = or_skip("PostgreSQL", store) else { return };
    killed_connections_are_replaced(&store, &name).await;
}

/// A server that accepts the TCP connection and never answers the startup (a hung server, a
/// half-open proxy): connecting fails within the connect timeout and names that cause, not an
/// exhausted pool, which would send the operator after the application's own connections.
/// Needs no PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_named_as_such() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = silent.local_addr().expect("addr").port();
    // Accept and hold every connection, answering nothing.
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let url = format!("host=127.0.0.1 port={port} user=postgres dbname=test connect_timeout=1");
    // A hang would be the fault itself: the guard only turns one into a failure.
    let connected = tokio::time::timeout(Duration::from_secs(60), PostgresStore::connect(&url))
        .await
        .expect("connecting to a silent server must end, bounded by connect_timeout");
    match connected {
        Err(StoreError::Unavailable(m)) => {
            let m = m.to_string();
            assert!(m.contains("did not finish") && m.contains("not answering"), "{m}");
            assert!(!m.contains("became free"), "{m}");
        }
        other => panic!("a silent server is Unavailable, got {:?}", other.map(|_| ())),
    }
    held.abort();
}

/// A connection whose server turned read-only (a primary demoted by a failover behind one
/// address: a managed database's writer endpoint, a virtual IP, a DNS name cached while it
/// moved) refuses every write with SQLSTATE 25006 for as long as it lasts, and the pool's
/// recycling keeps it since it is still open: every claim would fail until the process
/// restarted, while a new connection reaches the writable server. Here the application's pool
/// holds two connections made read-only as a demoted primary's are; connections opened later
/// are writable. The store leaves the read-only ones and goes on on new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_a_server_turned_read_only_are_replaced() {
    let pool = app_pool(2);
    let Some(store) = or_skip("PostgreSQL", PostgresStore::from_pool(pool.clone(), None).await)
    else {
        return;
    };
    let (first, second) = (pool.get().await.expect("a"), pool.get().await.expect("b"));
    for conn in [&first, &second] {
        conn.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            .await
            .expect("read-only session");
    }
    drop((first, second));
    for i in 0..3 {
        let (key, fp) = fresh_key("pg_read_only", &format!("{{\"i\":{i}}}"));
        let fence = match store.claim(claim_req(&key, &fp)).await {
            Ok(Claim::Acquired { fence, .. }) => fence,
            other => panic!("claim {i} after the server turned read-only: {other:?}"),
        };
        let ok = Outcome::Success(i.to_string());
        store.complete(&key, fence, &ok, Duration::from_secs(60)).await.expect("complete");
        match store.claim(claim_req(&key, &fp)).await {
            Ok(Claim::Completed(record)) => assert_eq!(record.outcome, ok),
            other => panic!("replay {i}: {other:?}"),
        }
    }
}

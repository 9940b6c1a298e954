//! Attacks on the PostgreSQL store's connection pool: a connection whose session the application
//! reset (`DISCARD ALL`) before giving it back, many callers of one key at once, a connection the
//! server ends while the completion waits on it, and connection strings that must be refused
//! with a clear error.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, Pool};
use idem_core::store::StoreError;
use idem_core::{Idem, PostgresStore, Store, tool};
use idem_tests::{Never, or_skip, pg_url};

fn run_id(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("pg-attack-{tag}-{}-{nanos}", std::process::id())
}

static RESETS: AtomicUsize = AtomicUsize::new(0);

#[tool(retry = "keyed")]
async fn after_reset(n: u32) -> Result<u32, Never> {
    RESETS.fetch_add(1, Ordering::SeqCst);
    Ok(n * 2)
}

/// The application shares its pool with the store and resets a connection's session
/// (`DISCARD ALL`, `DEALLOCATE ALL`) before giving it back: the statements the store prepared on
/// it are gone from the server, and the store's next steps on that connection must still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_pool_connection_reset_by_the_application() {
    let config = tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    // One connection: the store's steps and the application's reset meet on it.
    let pool =
        Pool::builder(Manager::new(config, tokio_postgres::NoTls)).max_size(1).build().unwrap();
    let Some(store) = or_skip("PostgreSQL", PostgresStore::from_pool(pool.clone(), None).await)
    else {
        return;
    };
    let idem = Idem::builder(store).build();
    let run = idem.run(run_id("discard"));
    assert_eq!(after_reset(&run, 1).await.expect("first call"), 2);

    for reset in ["DISCARD ALL", "DEALLOCATE ALL"] {
        pool.get().await.expect("the application's connection").batch_execute(reset).await.unwrap();
        let n = if reset == "DISCARD ALL" { 2 } else { 3 };
        let answer = after_reset(&run, n).await;
        assert_eq!(answer.expect("a call after the application's reset"), n * 2, "{reset}");
        assert_eq!(after_reset(&run, n).await.expect("replay"), n * 2, "{reset}");
    }
    assert_eq!(RESETS.load(Ordering::SeqCst), 3, "each call ran once");
}

/// The side effects of `one_effect`, by test tag (tests of this file run in parallel).
static RAN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

#[tool(retry = "keyed")]
async fn one_effect(order: String) -> Result<String, Never> {
    let n = {
        let mut ran = RAN.lock().unwrap();
        ran.push(order.clone());
        ran.len()
    };
    // Held long enough that every other caller finds the claim in flight.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(format!("{order} #{n}"))
}

/// 64 callers of one key at once: the side effect happens once and every caller gets its output.
async fn sixty_four_callers(store: PostgresStore, tag: &str) {
    let idem = Idem::builder(store).build();
    let run = idem.run(run_id(tag));
    let calls = (0..64).map(|_| {
        let run = run.clone();
        let order = tag.to_owned();
        tokio::spawn(async move { one_effect(&run, order).await })
    });
    let answers = futures_util::future::join_all(calls).await;
    let outputs: Vec<String> =
        answers.into_iter().map(|a| a.expect("task").expect("every caller succeeds")).collect();
    assert_eq!(RAN.lock().unwrap().iter().filter(|t| *t == tag).count(), 1, "one side effect");
    assert!(outputs[0].starts_with(&format!("{tag} #")), "{}", outputs[0]);
    assert!(outputs.iter().all(|o| *o == outputs[0]), "one output for all: {outputs:?}");
}

/// On `connect`'s own pool (fewer connections than callers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_callers_of_one_key_on_the_own_pool() {
    let Some(store) = or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await) else {
        return;
    };
    sixty_four_callers(store, "own").await;
}

/// On an application pool of one connection, waiters polling: no caller may hold the only
/// connection while it waits for the one that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_callers_of_one_key_on_a_pool_of_one() {
    let config = tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    let pool =
        Pool::builder(Manager::new(config, tokio_postgres::NoTls)).max_size(1).build().unwrap();
    let Some(store) = or_skip("PostgreSQL", PostgresStore::from_pool(pool, None).await) else {
        return;
    };
    sixty_four_callers(store, "one").await;
}

/// Connection strings idem must refuse as [`StoreError::InvalidConfig`], before any connection.
#[tokio::test]
async fn bad_connection_strings_are_invalid_config() {
    let bad = [
        "postgres://127.0.0.1/test?sslmode=bogus",
        "postgres://127.0.0.1/test?sslmode=",
        "postgres://127.0.0.1/test?pgbouncer=maybe",
        "postgres://127.0.0.1/test?pgbouncer",
        "postgres://127.0.0.1/test?pool_max_size=abc",
        "postgres://127.0.0.1/test?connect_timeout=-1x",
        "postgres://127.0.0.1/test?sslmode=%ff%fe",
        "postgres://127.0.0.1/test?sslmode=%",
        "postgres://127.0.0.1:99999/test",
        "host=127.0.0.1 sslmode=bogus",
        "host=127.0.0.1 pgbouncer=maybe",
        "host=127.0.0.1 pgbouncer='",
        "host=127.0.0.1 dbname=test \\",
        "host",
        "postgresql://",
        "postgresql:///test",
        "host=a,b port=1,2,3 dbname=test",
        "host=a,b hostaddr=127.0.0.1 dbname=test",
        "",
        "\u{0}",
        "postgres://u@[::1/test",
    ];
    for url in bad {
        let answer = tokio::time::timeout(Duration::from_secs(5), PostgresStore::connect(url))
            .await
            .unwrap_or_else(|_| panic!("{url:?}: no answer within 5 s"));
        match answer {
            Err(StoreError::InvalidConfig(m)) => assert!(!m.is_empty(), "{url:?}"),
            Err(other) => panic!("{url:?}: expected InvalidConfig, got {other:?}"),
            Ok(_) => panic!("{url:?}: accepted"),
        }
    }
}

static BLOCKED_RUNS: AtomicUsize = AtomicUsize::new(0);
static RELEASE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(0);

#[tool(retry = "keyed")]
async fn completes_late(n: u32) -> Result<u32, Never> {
    BLOCKED_RUNS.fetch_add(1, Ordering::SeqCst);
    RELEASE.acquire().await.expect("open").forget();
    Ok(n + 1)
}

/// The server ends the connection (`pg_terminate_backend`) while the store's completion waits on
/// it for a lock: the completion is sent again on a new connection, the caller gets its output,
/// a later caller the replay, and the tool runs once. The store lives in a schema of its own,
/// which the test locks without touching anyone else's tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_ended_while_its_completion_waits() {
    let Some((admin, schema, mut config)) = own_schema("idem_attack").await else { return };
    let name = format!("idem-attack-{}", std::process::id());
    config.application_name(&name);
    let store = PostgresStore::connect_with(config, 4).await.expect("store");
    let run = Idem::builder(store).build().run(run_id("ended"));

    let call = tokio::spawn({
        let run = run.clone();
        async move { completes_late(&run, 41).await }
    });
    // The claim is written; hold the table so that the completion waits on its lock.
    until_count(&admin, &format!("SELECT count(*) FROM {schema}.idem_records"), &[], 1).await;
    admin.batch_execute(&format!("BEGIN; LOCK TABLE {schema}.idem_records")).await.unwrap();
    RELEASE.add_permits(1);
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND \
                   wait_event_type = 'Lock'";
    until_count(&admin, waiting, &[&name], 1).await;
    let ended = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock'",
            &[&name],
        )
        .await
        .unwrap();
    assert_eq!(ended, 1, "the completion's connection was ended");
    admin.batch_execute("COMMIT").await.unwrap();

    assert_eq!(call.await.expect("task").expect("the call gets its output"), 42);
    assert_eq!(completes_late(&run, 41).await.expect("replay"), 42);
    assert_eq!(BLOCKED_RUNS.load(Ordering::SeqCst), 1, "ran once");
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}

/// An admin connection, a schema of the test's own named `prefix` and the process id (dropped
/// first if a run left it), and a config whose connections use that schema; `None` when
/// PostgreSQL is away (the caller returns: a skip, or a failure under CI).
async fn own_schema(
    prefix: &str,
) -> Option<(tokio_postgres::Client, String, tokio_postgres::Config)> {
    let url = pg_url();
    let (admin, conn) =
        or_skip("PostgreSQL", tokio_postgres::connect(&url, tokio_postgres::NoTls).await)?;
    tokio::spawn(conn);
    let schema = format!("{prefix}_{}", std::process::id());
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let mut config = tokio_postgres::Config::from_str(&url).expect("IDEM_PG_URL");
    config.options(format!("-c search_path={schema}"));
    Some((admin, schema, config))
}

/// Polls `sql` (a count, with `args`) until it is `want`; gives up after 2,000 polls.
async fn until_count(
    admin: &tokio_postgres::Client,
    sql: &str,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    want: i64,
) {
    for _ in 0..2_000 {
        let n: i64 = admin.query_one(sql, args).await.unwrap().get(0);
        if n == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{sql} never counted {want}");
}

/// A caller gives up on a completion (its future dropped by `tokio::time::timeout`) after 1.5 s
/// spent waiting on a row lock another session holds: the server was answering all along. The
/// store may give up the connection whose statement it abandoned, but the application's other
/// idle connections in the shared pool are healthy and stay in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_giving_up_on_a_lock_wait_keeps_the_other_connections() {
    let Some((admin, schema, config)) = own_schema("idem_attack_gave_up").await else { return };
    let pool =
        Pool::builder(Manager::new(config, tokio_postgres::NoTls)).max_size(4).build().unwrap();
    let store = PostgresStore::from_pool(pool.clone(), None).await.expect("store");
    let key = idem_core::conformance::fresh_key("gave_up", "{}");
    let fence = idem_tests::acquire(&store, &key.0, &key.1).await;

    // Another session holds the record's row.
    admin.batch_execute("BEGIN").await.unwrap();
    admin
        .execute(
            &format!("SELECT 1 FROM {schema}.idem_records WHERE key = $1 FOR UPDATE"),
            &[&key.0.as_str()],
        )
        .await
        .unwrap();
    // The application holds three connections, so the completion opens the newest.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(pool.get().await.expect("the application's connection"));
    }
    let mut pids = Vec::new();
    for c in &held {
        pids.push(c.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get::<_, i32>(0));
    }
    let gave_up = tokio::spawn({
        let store = store.clone();
        let key = key.0;
        async move {
            let outcome = idem_core::store::Outcome::Success("1".into());
            let complete = store.complete(&key, fence, &outcome, Duration::from_secs(60));
            tokio::time::timeout(Duration::from_millis(1500), complete).await.is_err()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The application is done with its connections: idle in the pool, and healthy.
    drop(held);
    assert!(gave_up.await.unwrap(), "the completion waited on the lock until its caller gave up");
    admin.batch_execute("ROLLBACK").await.unwrap();

    let mut after = Vec::new();
    let mut again = Vec::new();
    for _ in 0..4 {
        let c = pool.get().await.expect("a connection");
        after.push(c.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get::<_, i32>(0));
        again.push(c);
    }
    let kept = pids.iter().filter(|p| after.contains(p)).count();
    assert_eq!(kept, 3, "the application's idle connections {pids:?} were closed: now {after:?}");
    drop(again);
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
}

/// A password with a `?` written as it is in a URL (libpq and tokio-postgres read the user info up
/// to the `@`, so `postgres://app:pa?ss@db/app` is the password `pa?ss`; managed databases
/// generate such passwords): the URL's own options after the path still apply. idem read its own
/// options (`sslmode`, `sslrootcert`, `pgbouncer`) from the first `?` on, inside the password,
/// so it saw none of them: `pgbouncer=true` reached tokio-postgres and was refused as unknown,
/// and `sslmode=require` was replaced by the default `prefer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_mark_in_a_url_password_keeps_the_urls_options() {
    let config = tokio_postgres::Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => {
            eprintln!("SKIP: IDEM_PG_URL names no TCP host");
            return;
        }
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let db = config.get_dbname().unwrap_or("postgres");
    // A server that authenticates by password needs the real one, which has no `?` to test.
    if config.get_password().is_some() {
        eprintln!("SKIP: IDEM_PG_URL has a password; this test needs trust authentication");
        return;
    }
    let url = format!("postgres://{user}:pa?ss@{host}:{port}/{db}");
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let store = PostgresStore::connect(&format!("{url}?pgbouncer=true"))
        .await
        .expect("a URL whose password has a `?` opens, with its options");
    // Through PgBouncer in transaction mode: no listener is started.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!store.listening(), "pgbouncer=true was not applied");
    #[cfg(not(feature = "postgres-tls"))]
    match PostgresStore::connect(&format!("{url}?sslmode=require")).await {
        Err(StoreError::InvalidConfig(m)) => assert!(m.contains("sslmode=require"), "{m}"),
        other => panic!("sslmode=require without TLS compiled in: {:?}", other.map(drop)),
    }
}

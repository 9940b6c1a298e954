//! The store conformance suite against the PostgreSQL store (`IDEM_PG_URL`; skipped when the
//! server is unreachable, a failure under `CI=true`), plus what only this store has: several
//! stores on one database, LISTEN/NOTIFY, a versioned schema, reconnection.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::PostgresStore;
use idem_core::conformance::fresh_key;
use idem_core::store::{Claim, Outcome};
use idem_core::{Store, StoreError};
use idem_tests::{acquire, claim_req, or_skip, pg_url};
use tokio_postgres::{Config, NoTls};

async fn store() -> Option<Arc<PostgresStore>> {
    or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).map(Arc::new)
}

#[path = "shared/pg.rs"]
mod pg;

use pg::{private_schema, raw};

idem_core::store_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await
);
idem_core::store_admin_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await
);

/// Two stores on one database, each with its own connections and listener.
async fn pair() -> Option<(Arc<PostgresStore>, Arc<PostgresStore>)> {
    Some((store().await?, store().await?))
}

idem_core::store_multi_instance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    pair().await
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_on_one_database_acquire_once() {
    let Some(first) = store().await else { return };
    let mut stores = vec![first];
    for _ in 0..3 {
        stores.push(Arc::new(PostgresStore::connect(&pg_url()).await.expect("connect")));
    }
    let (key, fp) = fresh_key("stores_on_one_database_acquire_once", "{}");
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = Arc::clone(&stores[i % stores.len()]);
            tokio::spawn(async move { store.claim(claim_req(&key, &fp)).await.expect("claim") })
        })
        .collect();
    let mut acquired = 0;
    for t in tasks {
        if matches!(t.await.expect("task"), Claim::Acquired { .. }) {
            acquired += 1;
        }
    }
    assert_eq!(acquired, 1, "32 claims through 4 stores on one database: exactly one acquires");
}

/// A waiter in another process is woken by NOTIFY: the holder's completion sends one on
/// `idem_wake` with the key, once somebody waits on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_notifies_waiters_of_other_processes() {
    let Some(holder) = store().await else { return };
    let config = Config::from_str(&pg_url()).expect("config");
    let (listener, mut conn) = config.connect(NoTls).await.expect("raw connect");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(msg)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notification(n) = msg {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN idem_wake").await.expect("listen");

    let (key, fp) = fresh_key("complete_notifies_waiters", "{}");
    let fence = acquire(&*holder, &key, &fp).await;
    let waiter = PostgresStore::connect(&pg_url()).await.expect("connect");
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.wait(&key, fence, Duration::from_secs(20)).await }
    });
    // Let the waiter register before the completion.
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder
        .complete(&key, fence, &Outcome::Success("1".into()), Duration::from_secs(30))
        .await
        .expect("complete");
    let notified = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match rx.recv().await {
                Some(payload) if payload == key.as_str() => return true,
                Some(_) => continue,
                None => return false,
            }
        }
    })
    .await;
    assert_eq!(
        notified,
        Ok(true),
        "completing a waited-on record must NOTIFY idem_wake with its key"
    );
    waiting.await.expect("task").expect("wait");
    let got = waiter.claim(claim_req(&key, &fp)).await.expect("claim");
    assert!(matches!(got, Claim::Completed(_)), "the waiter then replays, got {got:?}");
}

/// A database of another schema version is refused, in a private schema so other tests on the
/// same database are not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_schema_version_is_incompatible() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("version").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("create the idem schema"));
    admin
        .batch_execute(&format!(
            "UPDATE {schema}.idem_meta SET value = 99 WHERE name = 'schema_version'"
        ))
        .await
        .expect("bump version");
    let got = PostgresStore::connect_with(config, 1).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop schema");
    match got {
        Err(StoreError::Incompatible(m)) => assert!(m.contains("99"), "names the version: {m}"),
        other => panic!("schema version 99 must be Incompatible, got {other:?}"),
    }
}

/// The claims of the completed and the held record, and the held record's completion.
type Answers = (Result<Claim, StoreError>, Result<Claim, StoreError>, Result<(), StoreError>);

/// What a store of this version answers on a database taken back to schema version 1
/// (`to_version_1`) or to version 2, revision 0: the value of `meta` in `idem_meta` after it connected, and (when it connected)
/// its claims of a record completed and one held before the downgrade, and the held record's
/// completion by its owner. The schema is dropped before returning.
struct Migrated {
    meta: Result<i64, tokio_postgres::Error>,
    fp: idem_core::Fingerprint,
    fence: idem_core::store::Fence,
    answers: Option<Answers>,
    /// The completed record as the operator's `inspect` reads it after the migration.
    inspected: Option<Result<Option<idem_core::store::RecordInfo>, idem_core::StoreError>>,
}

async fn migrated(tag: &str, meta: &str, to_version_1: bool) -> Migrated {
    let (schema, admin, config) = private_schema(tag).await;
    let (done, fp) = fresh_key(tag, "done");
    let (held, _) = fresh_key(tag, "held");
    let fence = {
        let old = PostgresStore::connect_with(config.clone(), 1).await.expect("create schema");
        let first = acquire(&old, &done, &fp).await;
        let ok = Outcome::Success("\"kept\"".into());
        old.complete(&done, first, &ok, Duration::from_secs(60)).await.expect("complete");
        acquire(&old, &held, &fp).await
    };
    if to_version_1 {
        // Back to what version 1 created.
        pg::to_version_1(&admin, &schema).await;
    } else {
        pg::to_revision_0(&admin, &schema).await;
    }
    let store = PostgresStore::connect_with(config, 1).await;
    let meta = admin
        .query_one(&format!("SELECT value FROM {schema}.idem_meta WHERE name = '{meta}'"), &[])
        .await
        .map(|row| row.get::<_, i64>(0));
    let inspected = match &store {
        Ok(s) => Some(s.inspect(&done).await),
        Err(_) => None,
    };
    let answers = match &store {
        Ok(s) => Some((
            s.claim(claim_req(&done, &fp)).await,
            s.claim(claim_req(&held, &fp)).await,
            s.complete(&held, fence, &Outcome::Unknown, Duration::from_secs(60)).await,
        )),
        Err(_) => None,
    };
    drop(store);
    pg::drop_schema(&admin, &schema).await;
    Migrated { meta, fp, fence, answers, inspected }
}

/// A database at schema version 1 (the tables without the `idem_claim` function) is migrated
/// when a store of this version connects, and what it holds is kept: a completed record replays,
/// an in-flight one keeps its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_version_1_is_migrated_and_keeps_its_records() {
    let Some(_) = store().await else { return };
    let Migrated { meta, fp, fence, answers, .. } =
        migrated("migrate", "schema_version", true).await;
    assert_eq!(meta.expect("version row"), idem_core::store::postgres::SCHEMA_VERSION);
    let (replay, in_flight, completed) =
        answers.expect("a version 1 database must be migrated, not refused");
    assert_eq!(
        replay.expect("claim"),
        Claim::Completed(idem_core::store::Record {
            fingerprint: fp,
            outcome: Outcome::Success("\"kept\"".into())
        })
    );
    match in_flight.expect("claim") {
        Claim::InFlight { fence: f, .. } => assert_eq!(f, fence, "the owner is kept"),
        other => panic!("the in-flight record must stay held, got {other:?}"),
    }
    completed.expect("the owner completes after the migration");
}

/// A database at schema version 2, revision 0 (no owner column) is migrated to revision 1 when a
/// store of this version connects, and what it holds is kept; the record's owner can still
/// complete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_revision_0_is_migrated_and_keeps_its_records() {
    let Some(_) = store().await else { return };
    let Migrated { meta, fence, answers, inspected, .. } =
        migrated("revision", "schema_revision", false).await;
    assert_eq!(meta.expect("revision row"), idem_core::store::postgres::SCHEMA_REVISION);
    // Written before records had an origin and a start: both unknown, not an age of 0 (which
    // would show the oldest stuck records as brand new).
    let info = inspected.expect("connected").expect("inspect").expect("the record is kept");
    assert_eq!((info.origin, info.age), (None, None), "unknown origin and age");
    let (replay, in_flight, completed) = answers.expect("revision 0 must be migrated");
    assert!(matches!(replay, Ok(Claim::Completed(_))), "{replay:?}");
    assert!(
        matches!(in_flight, Ok(Claim::InFlight { fence: f, .. }) if f == fence),
        "{in_flight:?}"
    );
    completed.expect("the owner completes after the migration");
}

/// A store of revision 0 still running after the migration calls `idem_claim` without an owner
/// token: its takeover of an expired lease clears the previous owner's token, so that owner's
/// resend can never acquire a record another owner now holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_0_claims_clear_the_owner_token_on_takeover() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("revision0_takeover", "{}");
    let short =
        idem_core::store::ClaimRequest { lease: Duration::from_millis(1), ..claim_req(&key, &fp) };
    let Ok(Claim::Acquired { fence, .. }) = store.claim(short).await else {
        panic!("a fresh key must be acquired")
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let admin = pg::admin().await;
    let owner = async |admin: &tokio_postgres::Client| {
        let row = admin
            .query_one("SELECT owner, fence FROM idem_records WHERE key = $1", &[&key.as_str()])
            .await
            .expect("the record");
        (row.get::<_, Option<String>>(0), row.get::<_, i64>(1))
    };
    let (before, _) = owner(&admin).await;
    assert!(before.is_some(), "a claim of this version stores its owner token");
    // What a store of revision 0 sends.
    let row = admin
        .query_one(
            "SELECT o_acquired, o_fence FROM idem_claim($1::text, $2::text, 30000::bigint, true)",
            &[&key.as_str(), &fp.as_str()],
        )
        .await
        .expect("the revision 0 claim");
    let (acquired, taken): (bool, i64) = (row.get(0), row.get(1));
    let (after, stored) = owner(&admin).await;
    assert!(
        acquired && taken > fence.0 as i64,
        "a takeover with a higher fence: {taken} {fence:?}"
    );
    assert_eq!((after, stored), (None, taken), "the takeover clears the previous owner's token");
}

/// The listing indexes valid on the table in `schema`, and the definition of one.
async fn listing_indexes(admin: &tokio_postgres::Client, schema: &str) -> (i64, String) {
    let row = admin
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE x.indisvalid), \
                        max(pg_get_indexdef(x.indexrelid)) FILTER (WHERE c.relname = \
                            'idem_records_tool') \
                 FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid \
                 WHERE x.indrelid = '{schema}.idem_records'::regclass \
                   AND c.relname IN ('idem_records_state', 'idem_records_tool', \
                                     'idem_records_run')"
            ),
            &[],
        )
        .await
        .expect("the indexes");
    (row.get(0), row.get::<_, Option<String>>(1).unwrap_or_default())
}

/// The session of a concurrent build of a listing index on the table in `schema` while it waits
/// for a lock (an older transaction's end), once there is one; `None` when `opening` ended first
/// or none came within 30 s.
async fn build_waiting<T>(
    admin: &tokio_postgres::Client,
    schema: &str,
    opening: &tokio::task::JoinHandle<T>,
) -> Option<i32> {
    let waiting = format!(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND backend_type = 'client backend' \
         AND query LIKE 'CREATE INDEX CONCURRENTLY % ON {schema}.idem_records %' LIMIT 1"
    );
    for _ in 0..600 {
        if let Some(row) = admin.query_opt(&waiting, &[]).await.expect("activity") {
            return Some(row.get(0));
        }
        if opening.is_finished() {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A migration that adds the listing indexes to a table that holds records builds them after its
/// commit with `CREATE INDEX CONCURRENTLY`, so the table stays writable during the build: a
/// plain `CREATE INDEX` in the migration would hold every running store's claims and
/// completions for as long as it reads the table. Here a build waits for an older transaction
/// to end; meanwhile another session writes the table; then the store opens with every index
/// valid and its record kept. An index a cut-short build left invalid is built again by the next
/// store to open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_builds_the_listing_indexes_without_blocking_writes() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("online_index").await;
    let (key, fp) = fresh_key("online_index", "kept");
    {
        let old = PostgresStore::connect_with(config.clone(), 1).await.expect("create schema");
        let fence = acquire(&old, &key, &fp).await;
        let kept = Outcome::Success("\"kept\"".into());
        old.complete(&key, fence, &kept, Duration::from_secs(60)).await.expect("complete");
    }
    // Revision 0 had none of the listing indexes (its columns' indexes went with them).
    pg::to_revision_0(&admin, &schema).await;
    admin.batch_execute(&format!("DROP INDEX {schema}.idem_records_state")).await.expect("drop");
    // An older transaction, whose snapshot a concurrent build waits out before it ends.
    let older = raw(&config).await;
    older.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").await.expect("begin");
    let opening = tokio::spawn(PostgresStore::connect_with(config.clone(), 1));
    let seen = build_waiting(&admin, &schema, &opening).await;
    assert!(seen.is_some(), "no concurrent index build waited for the older transaction");
    // The build cannot end before the older transaction does; a write does not wait for it.
    let insert = format!(
        "INSERT INTO {schema}.idem_records (key, fingerprint, fence, state) \
         VALUES ('written during the build', 'x', 1, 1)"
    );
    let write = admin.execute(&insert, &[]);
    let written = tokio::time::timeout(Duration::from_secs(60), write).await;
    assert!(matches!(written, Ok(Ok(1))), "a write during the build: {written:?}");
    assert!(!opening.is_finished(), "the build was still waiting when the write went through");
    older.batch_execute("COMMIT").await.expect("commit");
    let store = opening.await.expect("task").expect("the migrated store opens");
    assert_eq!(listing_indexes(&admin, &schema).await.0, 3, "every listing index valid");
    let replay = store.claim(claim_req(&key, &fp)).await;
    assert!(matches!(replay, Ok(Claim::Completed(_))), "the record is kept: {replay:?}");
    drop(store);

    // What a build cut short leaves: an invalid index of that name (here, a unique one over
    // duplicates, which fails after it was entered in the catalog).
    admin
        .batch_execute(&format!(
            "DROP INDEX {schema}.idem_records_tool; \
             INSERT INTO {schema}.idem_records (key, fingerprint, fence, state) \
             VALUES ('a duplicate', 'x', 2, 1)"
        ))
        .await
        .expect("drop, duplicate");
    let cut_short = admin
        .batch_execute(&format!(
            "CREATE UNIQUE INDEX CONCURRENTLY idem_records_tool ON {schema}.idem_records \
             (fingerprint)"
        ))
        .await;
    assert!(cut_short.is_err(), "the unique build over duplicates fails");
    assert_eq!(listing_indexes(&admin, &schema).await.0, 2, "one index left invalid");
    let again = PostgresStore::connect_with(config.clone(), 1).await.expect("open again");
    let (valid, tool) = listing_indexes(&admin, &schema).await;
    assert_eq!(valid, 3, "the invalid index was built again");
    assert!(tool.contains("(tool, key)") && !tool.contains("UNIQUE"), "rebuilt as idem's: {tool}");
    drop(again);

    // The application's role, which may use the table but does not own it, cannot build an
    // index: its store opens all the same (a warning names the statements), and the owner's
    // next open builds it.
    admin.batch_execute(&format!("DROP INDEX {schema}.idem_records_run")).await.expect("drop");
    let (role, as_app) = pg::login_role(&admin, &schema, "index_app", &config).await;
    admin
        .batch_execute(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.idem_records TO {role}; \
             GRANT SELECT ON {schema}.idem_meta TO {role}; \
             GRANT USAGE ON SEQUENCE {schema}.idem_fence TO {role}"
        ))
        .await
        .expect("grants");
    let app = PostgresStore::connect_with(as_app, 1).await;
    assert!(app.is_ok(), "a role that cannot build the index still opens: {:?}", app.err());
    assert_eq!(listing_indexes(&admin, &schema).await.0, 2, "not built by that role");
    drop(app);
    drop(PostgresStore::connect_with(config, 1).await.expect("the owner opens"));
    assert_eq!(listing_indexes(&admin, &schema).await.0, 3, "built at the owner's open");
    pg::drop_schema(&admin, &schema).await;
    pg::drop_role(&admin, &role).await;
}

/// One store builds the listing indexes at a time: stores opening at once on a table without
/// them do not start concurrent builds, which deadlock on each other's snapshots. A store whose
/// build's session is ended opens all the same; the failed build keeps others from trying again
/// until its lease ends, then one builds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_indexes_are_built_by_one_store_at_a_time() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("index_herd").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("create schema"));
    let drop_all = format!(
        "DROP INDEX {schema}.idem_records_state, {schema}.idem_records_tool, \
         {schema}.idem_records_run"
    );
    admin.batch_execute(&drop_all).await.expect("drop the indexes");
    let opens = futures_util::future::join_all(
        (0..8).map(|_| PostgresStore::connect_with(config.clone(), 1)),
    )
    .await;
    assert!(
        opens.iter().all(Result::is_ok),
        "every store opens: {:?}",
        opens.iter().find_map(|o| o.as_ref().err())
    );
    assert_eq!(listing_indexes(&admin, &schema).await.0, 3, "built once every open returned");
    drop(opens);

    admin.batch_execute(&drop_all).await.expect("drop the indexes again");
    let older = raw(&config).await;
    older.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").await.expect("begin");
    let opening = tokio::spawn(PostgresStore::connect_with(config.clone(), 1));
    let pid = build_waiting(&admin, &schema, &opening).await.expect("a build waits");
    admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate");
    older.batch_execute("COMMIT").await.expect("commit");
    let store = opening.await.expect("task").expect("a store whose build was ended opens");
    let (key, fp) = fresh_key("index_herd", "after");
    let claimed = store.claim(claim_req(&key, &fp)).await;
    assert!(matches!(claimed, Ok(Claim::Acquired { .. })), "and works: {claimed:?}");
    drop(store);
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("open within the lease"));
    assert!(listing_indexes(&admin, &schema).await.0 < 3, "no build within the failed one's lease");
    admin
        .batch_execute(&format!(
            "UPDATE {schema}.idem_meta SET value = 0 WHERE name = 'listing_index_build'"
        ))
        .await
        .expect("the lease ends");
    drop(PostgresStore::connect_with(config, 1).await.expect("open after the lease"));
    assert_eq!(listing_indexes(&admin, &schema).await.0, 3, "built after the lease");
    pg::drop_schema(&admin, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_outcome_is_incompatible_not_replayed() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("undecodable_outcome", "{}");
    let fence = acquire(&*store, &key, &fp).await;
    store
        .complete(&key, fence, &Outcome::Success("1".into()), Duration::from_secs(30))
        .await
        .expect("complete");
    let admin = raw(&Config::from_str(&pg_url()).expect("config")).await;
    admin
        .execute("UPDATE idem_records SET kind = 7 WHERE key = $1", &[&key.as_str()])
        .await
        .expect("write a future outcome kind");
    match store.claim(claim_req(&key, &fp)).await {
        Err(StoreError::Incompatible(m)) => assert!(m.contains(key.as_str()), "names the key: {m}"),
        other => panic!("an undecodable outcome must be Incompatible, got {other:?}"),
    }
}

#[tokio::test]
async fn unreachable_server_is_unavailable() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let got = PostgresStore::connect("host=127.0.0.1 port=1 user=postgres connect_timeout=2").await;
    match got {
        Err(e @ StoreError::Unavailable(_)) => {
            let cause = std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
            assert!(!cause.is_empty(), "Unavailable carries the cause");
        }
        other => panic!("an unreachable server must be Unavailable, got {other:?}"),
    }
}

/// Connections killed by the server (as on a restart): calls fail as Unavailable at worst, and
/// the same store works again by itself, with its records intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_connections_are_killed() {
    let Some(_) = store().await else { return };
    let app = format!("idem-reconnect-{}", std::process::id());
    let mut config = Config::from_str(&pg_url()).expect("config");
    config.application_name(&app);
    let store = PostgresStore::connect_with(config.clone(), 2).await.expect("connect");
    let (key, fp) = fresh_key("reconnects_after_connections_are_killed", "{}");
    let fence = acquire(&store, &key, &fp).await;
    store
        .complete(&key, fence, &Outcome::Success("\"kept\"".into()), Duration::from_secs(30))
        .await
        .expect("complete");

    // The listener connects in the background: wait for it (a hang guard of 20 s), so that both
    // of the store's connections are there to be killed.
    for _ in 0..400 {
        if store.listening() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.listening(), "the store listens before its connections are killed");
    let admin = raw(&Config::from_str(&pg_url()).expect("config")).await;
    let killed = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("terminate");
    assert!(killed >= 2, "the store's connections were killed ({killed})");

    let mut replayed = None;
    for _ in 0..5 {
        match store.claim(claim_req(&key, &fp)).await {
            Ok(claim) => {
                replayed = Some(claim);
                break;
            }
            Err(StoreError::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("a broken connection must be Unavailable, got {e}"),
        }
    }
    let want = Claim::Completed(idem_core::store::Record {
        fingerprint: fp,
        outcome: Outcome::Success("\"kept\"".into()),
    });
    assert_eq!(replayed, Some(want), "the store must reconnect by itself and replay");
}

#[path = "shared/executor.rs"]
mod executor;

/// Two executors, each with its own store on one database (as two processes).
async fn two_stores() -> Option<(Arc<dyn Store>, Arc<dyn Store>)> {
    let a = store().await?;
    let b = PostgresStore::connect(&pg_url()).await.expect("connect");
    Some((a, Arc::new(b)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_duplicates_across_processes_run_once() {
    let Some((a, b)) = two_stores().await else { return };
    executor::duplicates_across_executors_run_once(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_crashed_holder_is_taken_over() {
    let Some((a, b)) = two_stores().await else { return };
    executor::crashed_holder_is_taken_over(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_churn() {
    let Some(first) = store().await else { return };
    let mut stores: Vec<Arc<dyn Store>> = vec![first];
    for _ in 0..3 {
        stores.push(Arc::new(PostgresStore::connect(&pg_url()).await.expect("connect")));
    }
    executor::mutual_exclusion_under_churn(stores).await;
}

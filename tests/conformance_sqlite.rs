//! The store conformance suite against the SQLite store: on one database file shared by every
//! test of this process (each test opens its own store, so its own connection, as separate
//! processes would), and on private in-memory databases.

use std::path::PathBuf;
use std::sync::Arc;

use idem_core::SqliteStore;

fn shared_file() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-conformance-{}.db", std::process::id()))
}

async fn file_store() -> Option<Arc<SqliteStore>> {
    Some(Arc::new(SqliteStore::open(shared_file()).expect("open the SQLite file")))
}

idem_core::store_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    file_store().await
);
idem_core::store_admin_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    file_store().await
);

mod in_memory {
    async fn store() -> Option<std::sync::Arc<idem_core::SqliteStore>> {
        Some(std::sync::Arc::new(idem_core::SqliteStore::in_memory().expect("in-memory SQLite")))
    }

    idem_core::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store().await
    );
    idem_core::store_admin_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store().await
    );
}

// What only the SQLite store has: a file shared by several stores (as by several processes),
// a versioned schema, and records written by someone else.

use idem_core::store::{Claim, ClaimRequest, OnExpired, Outcome};
use idem_core::{Key, Store, StoreError};
use std::time::Duration;

fn fresh_file(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-{name}-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_on_one_file_acquire_once() {
    let path = fresh_file("race");
    let stores: Vec<Arc<SqliteStore>> =
        (0..4).map(|_| Arc::new(SqliteStore::open(&path).expect("open"))).collect();
    let (key, fp) = idem_core::conformance::fresh_key("stores_on_one_file_acquire_once", "{}");
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = Arc::clone(&stores[i % stores.len()]);
            tokio::spawn(async move {
                let req = ClaimRequest {
                    key: &key,
                    fingerprint: &fp,
                    lease: Duration::from_secs(30),
                    on_expired: OnExpired::TakeOver,
                    origin: Default::default(),
                };
                store.claim(req).await.expect("claim")
            })
        })
        .collect();
    let mut acquired = 0;
    for t in tasks {
        if matches!(t.await.expect("task"), Claim::Acquired { .. }) {
            acquired += 1;
        }
    }
    assert_eq!(acquired, 1, "32 claims through 4 connections on one file: exactly one acquires");
}

#[tokio::test]
async fn other_schema_version_is_incompatible() {
    let path = fresh_file("version");
    drop(SqliteStore::open(&path).expect("create the schema"));
    let raw = rusqlite::Connection::open(&path).expect("raw open");
    raw.execute("UPDATE idem_meta SET value = 99 WHERE name = 'schema_version'", [])
        .expect("bump version");
    match SqliteStore::open(&path) {
        Err(StoreError::Incompatible(m)) => {
            assert!(m.contains("99"), "message names the version: {m}")
        }
        other => panic!("a database of schema version 99 must be Incompatible, got {other:?}"),
    }
}

/// Stores a completed record in a new file, edits its row with `tamper` (`?1` is the key), and
/// claims it again: what a record written by another version (or by hand) gets.
async fn claim_after_tampering(
    name: &str,
    tamper: &str,
) -> (Result<Claim, StoreError>, Key, PathBuf) {
    let path = fresh_file(name);
    let store = SqliteStore::open(&path).expect("open");
    let (key, fp) = idem_core::conformance::fresh_key(name, "{}");
    let req = ClaimRequest {
        key: &key,
        fingerprint: &fp,
        lease: Duration::from_secs(30),
        on_expired: OnExpired::TakeOver,
        origin: Default::default(),
    };
    let Claim::Acquired { fence, .. } = store.claim(req).await.expect("claim") else {
        panic!("fresh key must be acquired")
    };
    let outcome = Outcome::Success("1".into());
    store.complete(&key, fence, &outcome, Duration::from_secs(3600)).await.expect("complete");
    let raw = rusqlite::Connection::open(&path).expect("raw open");
    raw.execute(tamper, [key.as_str()]).expect("tamper");
    (store.claim(req).await, key, path)
}

#[tokio::test]
async fn undecodable_outcome_is_incompatible_not_replayed() {
    let tamper = "UPDATE idem_records SET kind = 7 WHERE key = ?1";
    match claim_after_tampering("undecodable_outcome", tamper).await {
        (Err(StoreError::Incompatible(m)), key, _) => {
            assert!(m.contains(key.as_str()), "names the key: {m}")
        }
        (other, ..) => panic!("an undecodable outcome must be Incompatible, got {other:?}"),
    }
}

/// Values of the wrong type, as a hand edit or another version might leave them: a clear
/// `Incompatible` ("retry later" would be wrong), never a replay.
#[tokio::test]
async fn values_of_the_wrong_type_are_incompatible() {
    let tamper = "UPDATE idem_records SET expires_at = 'soon' WHERE key = ?1";
    let (claim, _, path) = claim_after_tampering("wrong_types", tamper).await;
    assert!(
        matches!(claim, Err(StoreError::Incompatible(_))),
        "a text expiry must be Incompatible, got {claim:?}"
    );
    let raw = rusqlite::Connection::open(&path).expect("raw open");
    raw.execute("UPDATE idem_meta SET value = 'one' WHERE name = 'schema_version'", [])
        .expect("tamper the version");
    match SqliteStore::open(&path) {
        Err(StoreError::Incompatible(_)) => {}
        other => panic!("a text schema version must be Incompatible, got {other:?}"),
    }
}

/// Several processes starting at once open one new file together: each must get a store, not
/// "database is locked" (switching a new file to WAL does not wait on SQLite's busy handler).
#[test]
fn many_stores_open_a_new_file_at_once() {
    for round in 0..20 {
        let path = fresh_file(&format!("open-race-{round}"));
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let opened: Vec<_> = (0..8)
            .map(|_| {
                let (path, barrier) = (path.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::open(&path).map(drop)
                })
            })
            .collect();
        for handle in opened {
            let result = handle.join().expect("no panic");
            assert!(result.is_ok(), "round {round}: {result:?}");
        }
    }
}

#[tokio::test]
async fn open_url_forms() {
    let path = fresh_file("url");
    let store = SqliteStore::open_url(&format!("sqlite://{}", path.display())).expect("sqlite://");
    drop(store);
    assert!(path.exists(), "sqlite://PATH opens that file");
    SqliteStore::open_url("sqlite::memory:").expect("in-memory URL");
    for bad in ["postgres://x", "sqlite://", "/tmp/x.db"] {
        assert!(
            matches!(SqliteStore::open_url(bad), Err(StoreError::InvalidConfig(_))),
            "{bad:?} must be refused"
        );
    }
}

#[path = "shared/executor.rs"]
mod executor;

/// Two executors, each with its own store on one file (as two processes).
fn two_stores(name: &str) -> (Arc<dyn Store>, Arc<dyn Store>) {
    let path = fresh_file(name);
    (
        Arc::new(SqliteStore::open(&path).expect("open")),
        Arc::new(SqliteStore::open(&path).expect("open")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_duplicates_across_processes_run_once() {
    let (a, b) = two_stores("exec-dup");
    executor::duplicates_across_executors_run_once(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_crashed_holder_is_taken_over() {
    let (a, b) = two_stores("exec-crash");
    executor::crashed_holder_is_taken_over(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_churn() {
    let path = fresh_file("churn");
    let stores: Vec<Arc<dyn Store>> = (0..4)
        .map(|_| Arc::new(SqliteStore::open(&path).expect("open")) as Arc<dyn Store>)
        .collect();
    executor::mutual_exclusion_under_churn(stores).await;
}

/// A claim dropped while its blocking call waits for the database (the caller's timeout, a
/// cancelled call) does not leave a record nobody holds: the blocking call releases what it
/// acquired once it finds nobody waiting for its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_dropped_mid_flight_releases_what_it_acquired() {
    let path = fresh_file("dropped");
    let store = SqliteStore::open(&path).expect("open");
    let other = SqliteStore::open(&path).expect("open");
    let (key, fp) = idem_core::conformance::fresh_key("dropped_claim", "{}");
    let never = never_claim(&key, &fp);
    // Another connection holds the write lock, so the claim's write waits (busy timeout 5 s).
    let raw = rusqlite::Connection::open(&path).expect("raw");
    raw.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let dropped = tokio::time::timeout(Duration::from_millis(200), store.claim(never)).await;
    assert!(dropped.is_err(), "the claim must still be waiting for the lock: {dropped:?}");
    raw.execute_batch("COMMIT").expect("unlock");
    // The dropped claim's blocking call now acquires and releases.
    acquired_again(&other, never, "the dropped claim's").await;
}

/// A claim whose answer came back but was never read (its caller dropped it at that moment: a
/// `select!` whose other branch won, a task aborted) leaves no record nobody holds either: a
/// `never` tool's repeat would wait out the lease, then answer "outcome unknown" for a call that
/// never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_answered_but_dropped_unread_releases_what_it_acquired() {
    use std::task::{Context, Poll, Waker};

    let path = fresh_file("dropped_unread");
    let store = SqliteStore::open(&path).expect("open");
    let other = SqliteStore::open(&path).expect("open");
    let (key, fp) = idem_core::conformance::fresh_key("dropped_unread", "{}");
    let never = never_claim(&key, &fp);
    // Another connection holds the write lock, so the claim's first poll cannot be answered.
    let raw = rusqlite::Connection::open(&path).expect("raw");
    raw.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let mut claim = store.claim(never);
    let first = claim.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert!(matches!(first, Poll::Pending), "the claim must wait for the lock: {first:?}");
    raw.execute_batch("COMMIT").expect("unlock");
    // The claim acquires and answers; its answer is never read.
    let held = || {
        raw.query_row("SELECT count(*) FROM idem_records WHERE key = ?1", [key.as_str()], |r| {
            r.get::<_, i64>(0)
        })
        .expect("count")
    };
    for _ in 0..500 {
        if held() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held(), 1, "the claim acquired");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(claim);
    acquired_again(&other, never, "the unread claim's").await;
}

/// A `never` tool's claim with a 30 s lease: a record left behind by a dropped claim would stop
/// its key that long, then answer "outcome unknown".
fn never_claim<'a>(key: &'a idem_core::Key, fp: &'a idem_core::Fingerprint) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        fingerprint: fp,
        lease: Duration::from_secs(30),
        on_expired: OnExpired::Unknown,
        origin: Default::default(),
    }
}

/// Polls until `other` acquires `req`'s key (at most about 2 s): the record `whose` names was
/// released.
async fn acquired_again(other: &SqliteStore, req: ClaimRequest<'_>, whose: &str) {
    let mut last = None;
    for _ in 0..100 {
        match other.claim(req).await {
            Ok(Claim::Acquired { .. }) => return,
            got => last = Some(got),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{whose} record was never released; last answer {last:?}");
}

/// A database a store of this version made, holding one record whose outcome is unknown, then
/// changed behind the store's back by the SQL `edit`: its path, a raw connection to it, and the
/// record's key and fingerprint.
async fn edited_database(
    tag: &str,
    edit: &str,
) -> (PathBuf, rusqlite::Connection, idem_core::Key, idem_core::Fingerprint) {
    let path = fresh_file(tag);
    let store = SqliteStore::open(&path).expect("open");
    let (key, fp) = idem_core::conformance::fresh_key(tag, "{}");
    let fence = idem_tests::acquire(&store, &key, &fp).await;
    store.complete(&key, fence, &Outcome::Unknown, Duration::from_secs(3600)).await.expect("done");
    drop(store);
    let raw = rusqlite::Connection::open(&path).expect("raw open");
    raw.execute_batch(edit).expect("edit the database");
    (path, raw, key, fp)
}

/// Opens a store on the database at `path` (`what` it holds), which must migrate it: this
/// version's revision is recorded.
fn open_migrated(path: &std::path::Path, raw: &rusqlite::Connection, what: &str) -> SqliteStore {
    let store = SqliteStore::open(path).unwrap_or_else(|e| panic!("{what} opens: {e}"));
    let revision: i64 = raw
        .query_row("SELECT value FROM idem_meta WHERE name = 'schema_revision'", [], |r| r.get(0))
        .expect("revision");
    assert_eq!(revision, idem_core::store::sqlite::SCHEMA_REVISION, "{what} is migrated");
    store
}

/// A database of schema revision 0 (before records kept their origin) is migrated when a store
/// of this version opens it: its records still replay, list with an unknown origin and age, and
/// can be resolved.
#[tokio::test]
async fn revision_0_database_is_migrated() {
    use idem_core::store::{ListQuery, RecordState, Resolution, StateFilter};
    // Back to revision 0: the columns and indexes of revision 1 removed.
    let (path, raw, key, fp) = edited_database(
        "revision0",
        "DROP INDEX idem_records_state; DROP INDEX idem_records_tool; DROP INDEX idem_records_run;
         ALTER TABLE idem_records DROP COLUMN tool; ALTER TABLE idem_records DROP COLUMN tenant;
         ALTER TABLE idem_records DROP COLUMN run_id; ALTER TABLE idem_records DROP COLUMN since;
         DELETE FROM idem_meta WHERE name = 'schema_revision';",
    )
    .await;
    let store = open_migrated(&path, &raw, "a revision 0 database");
    let info = store.inspect(&key).await.expect("inspect").expect("the old record");
    assert_eq!((info.origin, info.age), (None, None), "unknown origin and age");
    assert_eq!(info.state, RecordState::Done(Outcome::Unknown));
    let query = ListQuery { state: Some(StateFilter::Unknown), ..ListQuery::default() };
    let page = store.list(&query).await.expect("list");
    assert!(page.records.iter().any(|r| r.key == key), "the old record lists: {page:?}");
    let by_tool = ListQuery { tool: Some("revision0".into()), ..ListQuery::default() };
    assert!(store.list(&by_tool).await.expect("list").records.is_empty(), "no origin, no match");
    store.resolve(&key, info.fence, &Resolution::NotHappened).await.expect("resolve");
    assert!(matches!(
        store.claim(idem_tests::claim_req(&key, &fp)).await,
        Ok(Claim::Acquired { .. })
    ));
}

/// A migration cut short after some of its steps (the columns added, one index built, the
/// revision not yet recorded) is finished by the next store to open: each step can be taken again.
#[tokio::test]
async fn a_migration_cut_short_is_finished_at_the_next_open() {
    let (path, raw, key, _) = edited_database(
        "cut_short",
        "DROP INDEX idem_records_tool; DROP INDEX idem_records_run;
         DELETE FROM idem_meta WHERE name = 'schema_revision';",
    )
    .await;
    let store = open_migrated(&path, &raw, "a migration cut short");
    let indexes: i64 = raw
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN \
             ('idem_records_state', 'idem_records_tool', 'idem_records_run')",
            [],
            |r| r.get(0),
        )
        .expect("indexes");
    assert_eq!(indexes, 3, "every listing index");
    let info = store.inspect(&key).await.expect("inspect").expect("the record is kept");
    assert_eq!(info.state, idem_core::store::RecordState::Done(Outcome::Unknown));
}

mod multi_instance {
    use std::sync::Arc;

    use idem_core::SqliteStore;

    /// Two stores on the shared file, each with its own connection, as two processes would.
    async fn pair() -> Option<(Arc<SqliteStore>, Arc<SqliteStore>)> {
        let open =
            || Arc::new(SqliteStore::open(super::shared_file()).expect("open the SQLite file"));
        Some((open(), open()))
    }

    idem_core::store_multi_instance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        pair().await
    );
}

/// While another connection holds the write lock, claims that only read answer at once and
/// right (a replay, a live lease, a lease ended for a never tool, a mismatch), several times in
/// a row; a claim that needs the write after them waits for the lock rather than failing, and
/// acquires once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_while_another_connection_holds_the_write_lock() {
    let path = fresh_file("locked_reads");
    let store = Arc::new(SqliteStore::open(&path).expect("open"));
    let req = |key: &'static Key, fp, on_expired| ClaimRequest {
        key,
        fingerprint: fp,
        lease: Duration::from_secs(60),
        on_expired,
        origin: Default::default(),
    };
    let leak = |name: &str| -> (&'static Key, &'static idem_core::Fingerprint) {
        let (k, f) = idem_core::conformance::fresh_key("locked_reads", name);
        (Box::leak(Box::new(k)), Box::leak(Box::new(f)))
    };
    let (done, done_fp) = leak("done");
    let (held, held_fp) = leak("held");
    let (ended, ended_fp) = leak("ended");
    let (fresh, fresh_fp) = leak("fresh");
    let (_, other_fp) = leak("other");
    let acquired = |c: Claim| match c {
        Claim::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    };
    let take = OnExpired::TakeOver;
    let f = acquired(store.claim(req(done, done_fp, take)).await.unwrap());
    let ok = Outcome::Success("{\"id\":\"ch_1\"}".into());
    store.complete(done, f, &ok, Duration::from_secs(600)).await.unwrap();
    let held_fence = acquired(store.claim(req(held, held_fp, take)).await.unwrap());
    let short = ClaimRequest { lease: Duration::from_millis(1), ..req(ended, ended_fp, take) };
    acquired(store.claim(short).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;

    let raw = rusqlite::Connection::open(&path).expect("raw");
    raw.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    for round in 0..3 {
        let bounded = |c| tokio::time::timeout(Duration::from_secs(2), c);
        let got = bounded(store.claim(req(done, done_fp, take))).await.expect("no wait");
        assert_eq!(
            got.unwrap(),
            Claim::Completed(idem_core::store::Record {
                fingerprint: *done_fp,
                outcome: ok.clone()
            }),
            "round {round}"
        );
        match bounded(store.claim(req(held, held_fp, take))).await.expect("no wait").unwrap() {
            Claim::InFlight { fence, .. } => assert_eq!(fence, held_fence, "round {round}"),
            other => panic!("round {round}: {other:?}"),
        }
        let never = req(ended, ended_fp, OnExpired::Unknown);
        let got = bounded(store.claim(never)).await.expect("no wait").unwrap();
        assert_eq!(got, Claim::Unknown, "round {round}");
        let got = bounded(store.claim(req(done, other_fp, take))).await.expect("no wait").unwrap();
        assert_eq!(got, Claim::Mismatch, "round {round}");
    }
    // A claim that needs the write waits for the lock (the reads did not leave the connection
    // without its busy timeout) and acquires once it is released.
    let waiting = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.claim(req(fresh, fresh_fp, take)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the write must wait for the lock: {:?}", waiting.await);
    raw.execute_batch("COMMIT").expect("unlock");
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("acquired");
    assert!(matches!(got.unwrap(), Ok(Claim::Acquired { .. })));
}

/// While another connection holds the write lock and a claim of this store waits for it, the
/// store's replays still answer: the claim waiting for the lock does not keep the store's
/// connection from them for the whole busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_answer_while_a_claim_of_the_same_store_waits_for_the_write_lock() {
    let path = fresh_file("replay_behind_write");
    let store = Arc::new(SqliteStore::open(&path).expect("open"));
    let (done, done_fp) = idem_core::conformance::fresh_key("replay_behind_write", "done");
    let fence = idem_tests::acquire(&*store, &done, &done_fp).await;
    let ok = Outcome::Success("1".into());
    store.complete(&done, fence, &ok, Duration::from_secs(600)).await.expect("complete");
    let raw = rusqlite::Connection::open(&path).expect("raw");
    raw.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let (fresh, fresh_fp) = idem_core::conformance::fresh_key("replay_behind_write", "fresh");
    let waiting = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.claim(idem_tests::claim_req(&fresh, &fresh_fp)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the fresh claim must wait for the lock");
    for round in 0..3 {
        let replay = store.claim(idem_tests::claim_req(&done, &done_fp));
        let got = tokio::time::timeout(Duration::from_secs(2), replay).await;
        match got {
            Ok(Ok(Claim::Completed(record))) => assert_eq!(record.outcome, ok, "round {round}"),
            other => panic!("round {round}: the replay waited behind the claim: {other:?}"),
        }
    }
    raw.execute_batch("COMMIT").expect("unlock");
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("acquired");
    assert!(matches!(got.expect("task"), Ok(Claim::Acquired { .. })));
}

/// Replays, fresh claims and completions while another connection keeps the WAL busy: it writes
/// to a table of its own and checkpoints in `TRUNCATE` and `RESTART` modes (which wait for
/// readers and reset the WAL) in a loop. Every replay answers the stored outcome, and every write
/// of the store waits for its turn rather than failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_and_claims_while_another_connection_checkpoints() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    let path = fresh_file("checkpoints");
    let store = Arc::new(SqliteStore::open(&path).expect("open"));
    let (done, done_fp) = idem_core::conformance::fresh_key("checkpoints", "done");
    let Claim::Acquired { fence, .. } =
        store.claim(idem_tests::claim_req(&done, &done_fp)).await.expect("claim")
    else {
        panic!("a fresh key is acquired");
    };
    let ok = Outcome::Success("{\"id\":\"ch_1\"}".into());
    store.complete(&done, fence, &ok, Duration::from_secs(600)).await.expect("complete");

    let stop = Arc::new(AtomicBool::new(false));
    let checkpoints = Arc::new(AtomicU32::new(0));
    let other = std::thread::spawn({
        let (path, stop, checkpoints) = (path.clone(), Arc::clone(&stop), Arc::clone(&checkpoints));
        move || {
            let raw = rusqlite::Connection::open(&path).expect("raw");
            raw.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
            raw.execute_batch("CREATE TABLE IF NOT EXISTS other (n INTEGER)").expect("table");
            let mut n = 0u32;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                raw.execute("INSERT INTO other (n) VALUES (?1)", [n]).expect("insert");
                let mode = if n.is_multiple_of(2) { "TRUNCATE" } else { "RESTART" };
                // One row: whether the checkpoint was blocked (1), WAL frames, frames moved.
                let blocked: i64 = raw
                    .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| r.get(0))
                    .expect("checkpoint");
                if blocked == 0 {
                    checkpoints.fetch_add(1, Ordering::SeqCst);
                }
                // A busy neighbour, not one that never lets go of the write lock.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });

    let mut fresh_claims = 0;
    // At least 2,000 replays, and on until the other connection has checkpointed 50 times.
    let mut i = 0u32;
    while i < 2_000 || checkpoints.load(Ordering::SeqCst) < 50 {
        assert!(i < 1_000_000, "the other connection stopped checkpointing");
        let got = store.claim(idem_tests::claim_req(&done, &done_fp)).await;
        assert_eq!(
            got.expect("a replay during a checkpoint answers"),
            Claim::Completed(idem_core::store::Record {
                fingerprint: done_fp,
                outcome: ok.clone()
            }),
            "replay {i}"
        );
        if i.is_multiple_of(100) {
            let (key, fp) = idem_core::conformance::fresh_key("checkpoints", &i.to_string());
            let Claim::Acquired { fence, .. } =
                store.claim(idem_tests::claim_req(&key, &fp)).await.expect("a fresh claim waits")
            else {
                panic!("a fresh key is acquired");
            };
            store.complete(&key, fence, &ok, Duration::from_secs(600)).await.expect("complete");
            fresh_claims += 1;
        }
        i += 1;
    }
    stop.store(true, Ordering::SeqCst);
    other.join().expect("the other connection");
    assert_eq!(fresh_claims, i.div_ceil(100), "every fresh claim acquired and completed");
}

/// A claim that waited for another process's write lock counts its lease from when it got the
/// lock, not from before the wait: otherwise a lease of 2 s after a wait of 2.5 s is inserted
/// already over, and a duplicate takes the key over from an owner that has just started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_for_the_write_lock_gets_its_whole_lease() {
    let path = fresh_file("waited_lease");
    let store = SqliteStore::open(&path).expect("open");
    let other = SqliteStore::open(&path).expect("open");
    let (key, fp) = idem_core::conformance::fresh_key("waited_lease", "{}");
    // A lease of 2 s, for a keyed tool (an ended lease is taken over).
    fn keyed<'a>(key: &'a Key, fp: &'a idem_core::key::Fingerprint) -> ClaimRequest<'a> {
        let lease = Duration::from_secs(2);
        let origin = Default::default();
        ClaimRequest { key, fingerprint: fp, lease, on_expired: OnExpired::TakeOver, origin }
    }
    let raw = rusqlite::Connection::open(&path).expect("raw");
    raw.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let claiming = tokio::spawn({
        let store = store.clone();
        async move { store.claim(keyed(&key, &fp)).await }
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    raw.execute_batch("COMMIT").expect("unlock");
    let claimed = claiming.await.expect("task").expect("claim");
    assert!(matches!(claimed, Claim::Acquired { takeover: false, .. }), "{claimed:?}");
    // At once: the lease has most of its 2 s left.
    let duplicate = other.claim(keyed(&key, &fp)).await.expect("claim");
    assert!(
        matches!(duplicate, Claim::InFlight { .. }),
        "the owner's lease is live: {duplicate:?}"
    );
}

/// An existing database in a directory where this process may not create files (a read-only
/// volume, a container's read-only root): SQLite's write-ahead log needs to make files beside
/// it even to read, and SQLite says only "unable to open database file". The error says so, as
/// a configuration error, for the application's store and for a tool that only looks at it.
#[test]
fn a_database_in_a_directory_that_refuses_new_files_says_why() {
    /// Takes the directory's immutable attribute back, whatever the test does.
    struct Immutable(PathBuf);
    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = std::process::Command::new("chattr").arg("-i").arg(&self.0).status();
        }
    }
    let dir = fresh_file("fixed-dir").with_extension("d");
    // Left immutable by an earlier run that was killed: only then is there anything to undo
    // (chattr on a missing directory prints an error that reads like a failure).
    if dir.exists() {
        let _ = std::process::Command::new("chattr").arg("-i").arg(&dir).status();
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.db");
    drop(SqliteStore::open(&path).expect("creates"));
    // `chattr +i`: no new files in it, root included; skipped where it is not available.
    let fixed = std::process::Command::new("chattr").arg("+i").arg(&dir).status();
    if !fixed.is_ok_and(|s| s.success()) {
        assert!(
            !idem_tests::is_ci(),
            "chattr +i (an immutable directory) is required under CI=true"
        );
        eprintln!("SKIP: chattr +i (an immutable directory) is not available here");
        return;
    }
    let _undo = Immutable(dir.clone());
    for opened in [SqliteStore::open(&path).map(drop), SqliteStore::open_existing(&path).map(drop)]
    {
        match opened {
            Err(StoreError::InvalidConfig(m)) => {
                assert!(m.contains("store.db cannot be written by this process"), "{m}");
            }
            other => panic!("a directory refusing new files: {other:?}"),
        }
    }
}

/// SQLite says only "unable to open database file" when it cannot create the file; the error
/// says why, naming the directory: one that does not exist, or one in which this process may not
/// create files (a configuration error: waiting does not change permissions).
#[test]
fn a_file_that_cannot_be_created_says_why() {
    let missing = fresh_file("no-dir").with_extension("d").join("sub");
    match SqliteStore::open(missing.join("store.db")) {
        Err(StoreError::Unavailable(e)) => {
            let m = e.to_string();
            assert!(m.contains(&format!("{} does not exist", missing.display())), "{m}");
        }
        other => panic!("a missing directory: {:?}", other.map(drop)),
    }
    // sysfs: no process creates files there, root included.
    if std::path::Path::new("/sys/kernel").is_dir() {
        match SqliteStore::open("/sys/idem-test.db") {
            Err(StoreError::InvalidConfig(m)) => {
                assert!(m.contains("may not create files in /sys"), "{m}");
            }
            other => panic!("a directory refusing new files: {:?}", other.map(drop)),
        }
    }
}

/// A name starting with `file:` is a file name (`SqliteStore::open`'s contract), not an SQLite
/// URI with options: the bundled SQLite reads URIs whatever the open flags say, so
/// `file:/path/x.db?mode=memory` opened a private in-memory database for each store value, and
/// two stores "on the same file" both acquired the same key (the tool would run twice). As a
/// file name it is a relative path under a directory `file:` that does not exist here: refused,
/// or, were it there, one file both stores share.
#[tokio::test]
async fn a_name_starting_with_file_is_not_an_sqlite_uri() {
    let dir = idem_tests::servers::temp_dir("sqlite-file-uri");
    let name = format!("file:{}/x.db?mode=memory", dir.display());
    match (idem_core::SqliteStore::open(&name), idem_core::SqliteStore::open(&name)) {
        (Ok(a), Ok(b)) => {
            let (key, fp) = idem_core::conformance::fresh_key("file_uri", "{}");
            let first = a.claim(idem_tests::claim_req(&key, &fp)).await;
            let second = b.claim(idem_tests::claim_req(&key, &fp)).await;
            assert!(
                matches!(first, Ok(Claim::Acquired { .. }))
                    && matches!(second, Ok(Claim::InFlight { .. })),
                "two stores opened with {name:?} do not share their records: {first:?}, {second:?}"
            );
        }
        (Err(e), _) | (_, Err(e)) => {
            let m = idem_core::ErrorChain(&e).to_string();
            assert!(m.contains("file:"), "{m}");
        }
    }
}

fn remove_database_files(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let _ = std::fs::remove_file(name);
    }
}

/// Whether `claim` is the refusal of a store whose file is no longer at its path.
fn refused_as_moved(claim: &Result<Claim, StoreError>) -> bool {
    matches!(claim, Err(StoreError::Unavailable(e)) if e.to_string().contains("no longer the file"))
}

/// A database file deleted under an open store (an operator starting over, a temp-file cleaner)
/// and made again by another process: the store that had it open must not acquire keys in the
/// file nobody else sees any more, where every key the new file holds would run a second time.
/// It fails closed, saying why; opened again, it sees the new file. Also for a name that is not
/// UTF-8, which SQLite cannot report back as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_file_was_deleted_claims_nothing_in_it() {
    let mut paths = vec![fresh_file("deleted_under")];
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let mut bytes = b"idem-deleted-\xff-".to_vec();
        bytes.extend(format!("{}.db", std::process::id()).into_bytes());
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join(std::ffi::OsStr::from_bytes(&bytes));
        remove_database_files(&path);
        paths.push(path);
    }
    for path in paths {
        let old = SqliteStore::open(&path).expect("open");
        let (warm, fp) = idem_core::conformance::fresh_key("deleted_under_warm", "{}");
        idem_tests::acquire(&old, &warm, &fp).await;
        remove_database_files(&path);
        let new = SqliteStore::open(&path).expect("the file made again");
        let (key, fp) = idem_core::conformance::fresh_key("deleted_under", "{}");
        idem_tests::acquire(&new, &key, &fp).await;
        let again = old.claim(idem_tests::claim_req(&key, &fp)).await;
        assert!(
            refused_as_moved(&again),
            "{}: the key is held in the file at the path; the old store answered {again:?}",
            path.display()
        );
        let reopened = SqliteStore::open(&path).expect("open again");
        let again = reopened.claim(idem_tests::claim_req(&key, &fp)).await;
        assert!(matches!(again, Ok(Claim::InFlight { .. })), "{again:?}");
        remove_database_files(&path);
    }
}

/// The write-ahead log and its index deleted under an open store (taken for temporary files):
/// a process opening the file afterwards makes new ones and sees none of what the open store
/// writes in its own, so the open store must not acquire keys there either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_log_was_deleted_claims_nothing_in_it() {
    let path = fresh_file("log_deleted");
    let old = SqliteStore::open(&path).expect("open");
    let (warm, fp) = idem_core::conformance::fresh_key("log_deleted_warm", "{}");
    idem_tests::acquire(&old, &warm, &fp).await;
    for beside in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(beside);
        std::fs::remove_file(name).expect("remove the log and its index");
    }
    // Another process: SQLite shares one process's view of a file among its connections.
    let other = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "another_process_acquires", "--nocapture", "--test-threads=1"])
        .env(ANOTHER_PROCESS_DB, &path)
        .output()
        .expect("run another process");
    let said = String::from_utf8_lossy(&other.stdout);
    assert!(
        said.contains("acquired log_deleted"),
        "{said}{}",
        String::from_utf8_lossy(&other.stderr)
    );
    let (key, fp) = idem_core::conformance::fresh_key("log_deleted", "{}");
    let again = old.claim(idem_tests::claim_req(&key, &fp)).await;
    assert!(
        refused_as_moved(&again),
        "the key is held in the log a process opening the file sees; the old store answered \
         {again:?}"
    );
}

const ANOTHER_PROCESS_DB: &str = "IDEM_TEST_ANOTHER_PROCESS_DB";

/// Run by `a_store_whose_log_was_deleted_claims_nothing_in_it` as another process; nothing when
/// run as a test.
#[tokio::test]
async fn another_process_acquires() {
    let Some(path) = std::env::var_os(ANOTHER_PROCESS_DB) else { return };
    let store = SqliteStore::open(PathBuf::from(path)).expect("open in another process");
    let (key, fp) = idem_core::conformance::fresh_key("log_deleted", "{}");
    idem_tests::acquire(&store, &key, &fp).await;
    println!("acquired log_deleted");
}

/// What a burst of large outcomes leaves on disk once it is over: the write-ahead log grows while
/// a reader keeps it from starting over (another process's long read, a backup), and must not
/// keep that size for as long as the store is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_shrinks_after_a_burst() {
    let path = fresh_file("log_burst");
    let store = SqliteStore::open(&path).expect("open");
    let wal = {
        let mut name = path.as_os_str().to_owned();
        name.push("-wal");
        PathBuf::from(name)
    };
    let reader = rusqlite::Connection::open(&path).expect("raw");
    reader.execute_batch("BEGIN").expect("begin");
    let _: i64 = reader.query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0)).unwrap();
    let big = Outcome::Success(format!("\"{}\"", "x".repeat(1 << 20)));
    for i in 0..48 {
        let (key, fp) = idem_core::conformance::fresh_key("log_burst", &format!("{{\"i\":{i}}}"));
        let fence = idem_tests::acquire(&store, &key, &fp).await;
        store.complete(&key, fence, &big, Duration::from_secs(3600)).await.expect("complete");
    }
    let peak = std::fs::metadata(&wal).expect("wal").len();
    reader.execute_batch("COMMIT").expect("end the read");
    drop(reader);
    for i in 0..4 {
        let (key, fp) =
            idem_core::conformance::fresh_key("log_burst_after", &format!("{{\"i\":{i}}}"));
        let fence = idem_tests::acquire(&store, &key, &fp).await;
        store.complete(&key, fence, &Outcome::Unknown, Duration::from_secs(3600)).await.unwrap();
    }
    let after = std::fs::metadata(&wal).expect("wal").len();
    assert!(after <= 16 << 20, "the log held {peak} bytes at the peak and {after} after");
}

/// A backup restored by renaming it over the database file (its old log and index removed first)
/// while a store has the file open: the store writes nothing to the file renamed over, which
/// no process opened afterwards sees; opened again, it replays the backup's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_file_was_renamed_over_claims_nothing_in_it() {
    let path = fresh_file("renamed_over");
    let backup = fresh_file("renamed_over_backup");
    let (key, fp) = idem_core::conformance::fresh_key("renamed_over", "{}");
    let running = SqliteStore::open(&path).expect("open");
    let done = Outcome::Success("\"from the backup\"".into());
    {
        let restored = SqliteStore::open(&backup).expect("the backup");
        let fence = idem_tests::acquire(&restored, &key, &fp).await;
        restored.complete(&key, fence, &done, Duration::from_secs(3600)).await.expect("complete");
    }
    for beside in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{beside}", path.display()));
    }
    std::fs::rename(&backup, &path).expect("rename the backup into place");
    let claim = running.claim(idem_tests::claim_req(&key, &fp)).await;
    assert!(refused_as_moved(&claim), "{claim:?}");
    let reopened = SqliteStore::open(&path).expect("open again");
    match reopened.claim(idem_tests::claim_req(&key, &fp)).await {
        Ok(Claim::Completed(record)) => assert_eq!(record.outcome, done),
        other => panic!("the restored file's record must replay, got {other:?}"),
    }
}

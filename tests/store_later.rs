//! An outcome the store refused when the tool finished is stored later, in the background
//! (`idem-core/src/executor/store_later.rs`): here SQLite, whose write lock another process holds
//! for longer than the store's busy timeout (a backup, a `VACUUM`, a long migration). The caller
//! gets its result at once; once the lock is free the record is completed, and repeats replay it
//! instead of running a keyed tool again after its lease or answering "unknown" for a never tool.
//! Run: cargo test --features sqlite --test store_later

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::store::SqliteStore;
use idem_core::{Error, Idem, NoError, Policy, ToolFailure, tool};
use tokio::sync::Semaphore;

static GATE: Semaphore = Semaphore::const_new(0);
/// Bodies that reached the gate.
static STARTED: AtomicU32 = AtomicU32::new(0);
static SENT: AtomicU32 = AtomicU32::new(0);
static CHARGED: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "never")]
async fn send_wire(to: String) -> Result<String, NoError> {
    STARTED.fetch_add(1, Ordering::SeqCst);
    GATE.acquire().await.unwrap().forget();
    SENT.fetch_add(1, Ordering::SeqCst);
    Ok(format!("wire to {to}"))
}

#[tool(retry = "keyed")]
async fn charge(customer: String) -> Result<String, NoError> {
    STARTED.fetch_add(1, Ordering::SeqCst);
    GATE.acquire().await.unwrap().forget();
    CHARGED.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charged {customer}"))
}

static REFUSED: AtomicU32 = AtomicU32::new(0);

/// A permanent failure: stored and replayed like a result.
#[tool(retry = "keyed")]
async fn refund(charge: String) -> Result<String, ToolFailure> {
    STARTED.fetch_add(1, Ordering::SeqCst);
    GATE.acquire().await.unwrap().forget();
    REFUSED.fetch_add(1, Ordering::SeqCst);
    Err(ToolFailure::permanent(format!("{charge} was never captured")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_the_locked_store_refused_are_stored_once_it_is_free() {
    let dir = std::env::temp_dir().join(format!("idem-store-later-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    // A store step is bounded by 1 s: the callers get their results while the completions,
    // on SQLite's blocking pool, still wait for the lock (5 s each, one after the other).
    let policy = Policy {
        lease: Duration::from_secs(2),
        store_timeout: Duration::from_secs(1),
        ..Policy::default()
    };
    let idem = Idem::builder_shared(store).policy(policy).build();
    let run = idem.run("store-later");
    // Nothing pending: no wait, whatever the bound (Duration::MAX means none).
    assert_eq!(idem.late_completions_settled(Duration::MAX).await, 0);

    let wire = tokio::spawn({
        let run = run.clone();
        async move { send_wire(&run, "ada".into()).await }
    });
    let charged = tokio::spawn({
        let run = run.clone();
        async move { charge(&run, "cus_1".into()).await }
    });
    let refused = tokio::spawn({
        let run = run.clone();
        async move { refund(&run, "ch_1".into()).await }
    });
    // All claimed (the bodies wait at the gate); now another process takes the write lock.
    while STARTED.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    GATE.add_permits(3);
    // The completions wait out the busy timeout (5 s each) and fail; the callers have their
    // results already.
    assert_eq!(wire.await.unwrap().unwrap(), "wire to ada");
    assert_eq!(charged.await.unwrap().unwrap(), "charged cus_1");
    let first_refusal = refused.await.unwrap().unwrap_err();
    tokio::time::sleep(Duration::from_secs(11)).await;
    let in_flight: i64 = other
        .query_row("SELECT count(*) FROM idem_records WHERE state = 0", [], |r| r.get(0))
        .unwrap();
    assert_eq!(in_flight, 3, "every completion failed while the lock was held");
    assert_eq!(idem.late_completions(), 3, "all three are being sent again");
    // Meanwhile a repeat runs nothing: the store is busy (fail closed), or the never tool's
    // lease has ended and its outcome is unknown.
    let meanwhile = send_wire(&run, "ada".into()).await;
    assert!(
        matches!(meanwhile, Err(Error::StoreUnavailable { .. } | Error::OutcomeUnknown { .. })),
        "{meanwhile:?}"
    );
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);

    // Once the lock is free the records are completed in the background: the repeats replay,
    // though the leases (2 s) have ended.
    assert_eq!(idem.late_completions_settled(Duration::from_secs(20)).await, 0);
    assert_eq!(send_wire(&run, "ada".into()).await.unwrap(), "wire to ada");
    GATE.add_permits(10); // Were the charge to run again, it would not block.
    assert_eq!(charge(&run, "cus_1".into()).await.unwrap(), "charged cus_1");
    let replayed = refund(&run, "ch_1".into()).await.unwrap_err();
    for error in [&first_refusal, &replayed] {
        let failure = error.tool_error().expect("the tool's own error");
        assert_eq!(failure.message(), "ch_1 was never captured");
    }
    assert_eq!(REFUSED.load(Ordering::SeqCst), 1, "the refund ran once; its failure replayed");
    assert_eq!(SENT.load(Ordering::SeqCst), 1, "the wire ran once");
    assert_eq!(CHARGED.load(Ordering::SeqCst), 1, "the charge ran once, and was replayed");
    let _ = std::fs::remove_dir_all(&dir);
}

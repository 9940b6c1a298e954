//! Outputs whose stored form would not read back as the same value (`docs/design.md` §6.4): a NaN,
//! a map whose keys are not strings, a `Serialize` that `Deserialize` does not mirror. The first
//! caller gets its output; the record says the effect happened and the output is not storable;
//! every later caller gets `OutputNotStorable` with the key, never a different value, and the
//! tool never runs again.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Classify, Ctx, Error, ErrorKind, Failure, Idem, MemoryStore, Store, tool};
use idem_tests::Doubling;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("declined")]
struct Declined;

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

/// Runs per tool and case (each test uses its own case, so tests may run in parallel).
static RUNS: Mutex<BTreeMap<(&str, String), u32>> = Mutex::new(BTreeMap::new());

fn ran(tool: &'static str, case: &str) {
    *RUNS.lock().unwrap().entry((tool, case.to_owned())).or_default() += 1;
}

fn runs(tool: &'static str, case: &str) -> u32 {
    RUNS.lock().unwrap().get(&(tool, case.to_owned())).copied().unwrap_or(0)
}

/// Computes a ratio after booking something: NaN has no JSON form (serde_json writes `null`).
#[tool(retry = "keyed")]
async fn book_ratio(cx: &Ctx, case: String) -> Result<f64, Declined> {
    let _ = cx.key();
    ran("ratio", &case);
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(f64::NAN)
}

/// A map keyed by tuples: JSON object keys are strings, serde_json refuses it.
#[tool(retry = "keyed")]
async fn book_grid(cx: &Ctx, case: String) -> Result<HashMap<(u8, u8), String>, Declined> {
    let _ = cx.key();
    ran("grid", &case);
    Ok(HashMap::from([((1, 2), "a".to_owned())]))
}

#[tool(retry = "never")]
async fn book_doubling(case: String) -> Result<Doubling, Declined> {
    ran("doubling", &case);
    Ok(Doubling(21))
}

/// Every later call, through `a` and through `b` (another executor on the same store), gets the
/// error with the key, and the key is the same each time.
fn assert_not_storable<T: std::fmt::Debug, E: std::fmt::Debug + std::fmt::Display>(
    got: &[Result<T, Error<E>>],
    needle: &str,
) {
    let mut keys = Vec::new();
    for r in got {
        match r {
            Err(e @ Error::OutputNotStorable { key, reason, .. }) => {
                assert_eq!(e.kind(), ErrorKind::OutputNotStorable);
                assert!(reason.contains(needle), "{reason}");
                assert!(e.to_string().contains("do not call it again"), "{e}");
                keys.push(*key);
            }
            other => panic!("expected OutputNotStorable, got {other:?}"),
        }
    }
    keys.dedup();
    assert_eq!(keys.len(), 1, "one intent, one key: {keys:?}");
}

async fn every_kind(store: Arc<dyn Store>, case: &str) {
    let a = Idem::builder_shared(Arc::clone(&store)).build().run("r");
    let b = Idem::builder_shared(store).build().run("r");
    // The first caller and a duplicate that arrives while it runs.
    let (first, joined) = tokio::join!(book_ratio(&a, case.into()), book_ratio(&a, case.into()));
    assert!(first.unwrap().is_nan(), "the first caller gets the real output");
    let later = [joined, book_ratio(&a, case.into()).await, book_ratio(&b, case.into()).await];
    assert_not_storable(&later, "NaN");
    assert_eq!(runs("ratio", case), 1, "ran once");

    let first = book_grid(&a, case.into()).await.unwrap();
    assert_eq!(first, HashMap::from([((1, 2), "a".to_owned())]));
    let later = [book_grid(&a, case.into()).await, book_grid(&b, case.into()).await];
    assert_not_storable(&later, "map whose keys");
    assert_eq!(runs("grid", case), 1, "ran once");

    assert_eq!(book_doubling(&a, case.into()).await.unwrap(), Doubling(21));
    let later = [book_doubling(&a, case.into()).await, book_doubling(&b, case.into()).await];
    assert_not_storable(&later, "different value");
    assert_eq!(runs("doubling", case), 1, "a never tool ran once");
}

#[tokio::test(start_paused = true)]
async fn memory_store_records_an_output_that_cannot_be_stored() {
    every_kind(Arc::new(MemoryStore::new()), "memory").await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_store_records_an_output_that_cannot_be_stored() {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-unstorable-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = idem_core::SqliteStore::open(&path).expect("open the SQLite file");
    every_kind(Arc::new(store), "sqlite").await;
    // A store opened later on the same file reads the record written before.
    let reopened = idem_core::SqliteStore::open(&path).expect("reopen");
    let run = Idem::new(reopened).run("r");
    assert_not_storable(&[book_grid(&run, "sqlite".into()).await], "map whose keys");
    assert_eq!(runs("grid", "sqlite"), 1);
}

/// A case of this process alone: the durable servers keep records across test runs.
#[cfg(any(feature = "postgres", feature = "redis"))]
fn fresh_case(store: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{store}-{}-{nanos}", std::process::id())
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_records_an_output_that_cannot_be_stored() {
    let store = idem_core::PostgresStore::connect(&idem_tests::pg_url()).await;
    let Some(store) = idem_tests::or_skip("PostgreSQL", store) else { return };
    every_kind(Arc::new(store), &fresh_case("postgres")).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_records_an_output_that_cannot_be_stored() {
    let store = idem_core::RedisStore::builder(idem_tests::redis_url())
        .prefix(idem_tests::redis_prefix())
        .open()
        .await;
    let Some(store) = idem_tests::or_skip("Redis", store) else { return };
    every_kind(Arc::new(store), &fresh_case("redis")).await;
}

/// What a provider answered for a field it may leave out: `Some(Value::Null)` when it sent
/// `null`, `None` when it sent nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Lookup {
    found: Option<serde_json::Value>,
}

/// Looks a record up; the provider answered with an explicit `null`.
#[tool(retry = "keyed")]
async fn look_up(case: String) -> Result<Lookup, Declined> {
    ran("lookup", &case);
    Ok(Lookup { found: Some(serde_json::Value::Null) })
}

/// `Some` of a value written as `null` (`Some(Value::Null)`, `Some(None)`, `Some(())`) is written
/// as the `null` of `None` and reads back as `None`: a replay would hand later callers another
/// value than the first got. It is recorded as not storable, as any output that does not read
/// back as itself.
#[tokio::test(start_paused = true)]
async fn some_of_null_is_not_replayed_as_none() {
    let a = Idem::in_memory().run("r");
    let first = look_up(&a, "some-null".into()).await.unwrap();
    assert_eq!(first, Lookup { found: Some(serde_json::Value::Null) }, "the real output");
    let later = [look_up(&a, "some-null".into()).await, look_up(&a, "some-null".into()).await];
    assert_not_storable(&later, "reads back as `None`");
    assert_eq!(runs("lookup", "some-null"), 1, "ran once");
}

/// Tags a customer; answers the customer's tags, a set.
#[tool(retry = "keyed")]
async fn tag_customer(case: String) -> Result<std::collections::HashSet<String>, Declined> {
    ran("tags", &case);
    Ok((0..20).map(|i| format!("tag-{i}")).collect())
}

/// A set (`HashSet`) lists its members in an order of its own, which a set read back from the
/// same JSON need not keep: it is the same value, stored and replayed, not refused as one that
/// reads back differently.
#[tokio::test(start_paused = true)]
async fn a_set_is_stored_and_replayed_whatever_its_order() {
    let a = Idem::in_memory().run("r");
    let first = tag_customer(&a, "set".into()).await.unwrap();
    for _ in 0..3 {
        assert_eq!(tag_customer(&a, "set".into()).await.unwrap(), first, "replayed");
    }
    assert_eq!(runs("tags", "set"), 1, "ran once");
}

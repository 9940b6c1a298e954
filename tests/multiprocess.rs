//! Exactly-once across processes (docs/design.md, the store contract): worker processes hammer one set of
//! intents with duplicate calls against a durable store, while the test SIGKILLs some of them
//! between claim and complete and SIGSTOPs others past their lease, then resumes them. A ledger on
//! disk, outside the store, counts the side effects.
//!
//! - `charge` (keyed; its fake provider deduplicates by the forwarded key): exactly one effect per
//!   intent, and every caller received that effect.
//! - `wire` (never; nothing deduplicates it): at most one body and one effect per intent, and every
//!   intent ends as a result or as outcome unknown.
//! - No resumed worker overwrites a newer owner: the stored result of every intent comes from the
//!   highest fence under which its body ran, and the stopped keyed worker received that result.

#![cfg(any(feature = "redis", feature = "sqlite", feature = "postgres"))]

use idem_tests::hammer::hammer;
#[cfg(feature = "sqlite")]
use idem_tests::workers;

const EXE: &str = env!("CARGO_BIN_EXE_idem-stress-worker");

/// The keys of the scenario's intents, to remove them from a shared server afterwards (the
/// unknown ones would otherwise stay there, in flight, for an operator to reconcile).
#[cfg(feature = "redis")]
fn keys(run: &str) -> Vec<idem_core::Key> {
    let scope = idem_core::Scope::run(run);
    let mut out = Vec::new();
    for tool in ["charge", "wire"] {
        for intent in 0..idem_tests::hammer::INTENTS {
            let args = idem_core::to_canonical_string(&intent).expect("canonical u32");
            out.push(idem_core::key::derive_key(&scope, tool, args.as_bytes()));
        }
    }
    out
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_exactly_once_across_processes() {
    let url = idem_tests::redis_url();
    let reachable = idem_core::store::RedisStore::open(&url).await.map(drop);
    if idem_tests::or_skip("Redis", reachable).is_none() {
        return;
    }
    let run = hammer(EXE, &url, "mp-redis").await;
    let store = idem_core::RedisStore::open(&url).await.expect("reopen");
    for key in keys(&run) {
        use idem_core::Store;
        assert!(store.forget(&key).await.expect("forget"), "every intent left a record");
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_exactly_once_across_processes() {
    // One database file shared by every worker process of the machine.
    let db = workers::temp_dir("mp-sqlite-db").join("idem.db");
    hammer(EXE, &format!("sqlite://{}", db.display()), "mp-sqlite").await;
    let _ = std::fs::remove_dir_all(db.parent().unwrap_or(&db));
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exactly_once_across_processes() {
    let url = idem_tests::pg_url();
    let reachable = idem_core::PostgresStore::connect(&url).await.map(drop);
    if idem_tests::or_skip("PostgreSQL", reachable).is_none() {
        return;
    }
    hammer(EXE, &format!("pg:{url}"), "mp-postgres").await;
}

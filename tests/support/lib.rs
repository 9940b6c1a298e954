//! Shared test support for the workspace's integration tests (not part of idem): service
//! addresses and the rule for a service that cannot be reached.

use std::fmt::Display;

use idem_core::store::{Claim, ClaimRequest, Fence, OnExpired, Store};
use idem_core::{Classify, Failure, Fingerprint, Key};

/// Whether the tests run under CI (`CI=true`): a missing service then fails the run.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The PostgreSQL connection string for tests: `IDEM_PG_URL`, or the local default.
pub fn pg_url() -> String {
    std::env::var("IDEM_PG_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".to_owned())
}

/// The Redis URL for tests: `IDEM_REDIS_URL`, or the local default.
pub fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// A tag of this test process alone (`<pid>-<ns>`), for names in a server or database that
/// outlives it and that other programs use at the same time (process ids come back).
pub fn process_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos}", std::process::id())
    })
}

/// A Redis key prefix of this test process alone (`idem-test-<pid>-<ns>`): tests on a server that
/// other programs use at the same time never touch each other's keys.
pub fn redis_prefix() -> String {
    format!("idem-test-{}", process_tag())
}

/// The rule for an unreachable service: under `CI=true` the test fails (panics with the cause);
/// otherwise it prints a skip line and the caller returns (`None`).
pub fn or_skip<T, E: Display>(service: &str, connected: Result<T, E>) -> Option<T> {
    match connected {
        Ok(v) => Some(v),
        Err(e) if is_ci() => panic!("{service} is required under CI=true but unreachable: {e}"),
        Err(e) => {
            // Straight to stderr, past the test harness's capture, so the skip is seen; with the
            // variable that names its address (not the address: it may hold a password).
            let at = match service {
                "PostgreSQL" => {
                    " at IDEM_PG_URL (default host=127.0.0.1 port=5432 user=postgres dbname=test)"
                }
                "Redis" => " at IDEM_REDIS_URL (default redis://127.0.0.1:6379/)",
                _ => "",
            };
            let line = format!("SKIP: {service} unreachable{at} ({e}); under CI=true this fails\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            None
        }
    }
}

/// A claim of `key` that takes over an expired lease, with the conformance suite's lease
/// ([`LONG`](idem_core::conformance::LONG), 30 s).
pub fn claim_req<'a>(key: &'a Key, fp: &'a Fingerprint) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        fingerprint: fp,
        lease: idem_core::conformance::LONG,
        on_expired: OnExpired::TakeOver,
        origin: Default::default(),
    }
}

/// Claims a key that must be free (the test fails otherwise); its fence.
pub async fn acquire(store: &dyn Store, key: &Key, fp: &Fingerprint) -> Fence {
    match store.claim(claim_req(key, fp)).await {
        Ok(Claim::Acquired { fence, .. }) => fence,
        other => panic!("a fresh key must be acquired, got {other:?}"),
    }
}

/// An operator's steps on `store`, each after a pause (2.5 s) longer than the server's idle
/// timeout (set to 1 s by the test): a count, a listing, an inspect and a checked forget of one
/// completed record, then a forget of one in flight. `store` must hold no other record.
pub async fn operator_steps_after_idle_pauses(store: &dyn Store, tag: &str) {
    use idem_core::conformance::{LONG, fresh_key};
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(2500));
    let (key, fp) = fresh_key(tag, "{}");
    let fence = acquire(store, &key, &fp).await;
    let done = idem_core::store::Outcome::Success("1".into());
    store.complete(&key, fence, &done, LONG).await.unwrap();
    pause().await;
    let stats = store.stats().await.map_err(|e| e.to_string());
    assert_eq!(stats.map(|s| s.completed), Ok(1), "stats after an idle pause");
    pause().await;
    let page = store.list(&idem_core::store::ListQuery::default()).await;
    assert_eq!(page.map(|p| p.records.len()).map_err(|e| e.to_string()), Ok(1), "list");
    pause().await;
    let shown = store.inspect(&key).await.map_err(|e| e.to_string());
    assert!(matches!(shown, Ok(Some(_))), "inspect after an idle pause: {shown:?}");
    // Checked, as the command line sends it, and not.
    let seen = shown.unwrap().unwrap();
    pause().await;
    let forgot = store.forget_seen(&key, seen.fence, true).await.map_err(|e| e.to_string());
    assert_eq!(forgot, Ok(true), "forget_seen after an idle pause");
    let (other, fp) = fresh_key(tag, "{\"in_flight\":true}");
    acquire(store, &other, &fp).await;
    pause().await;
    let forgot = store.forget(&other).await.map_err(|e| e.to_string());
    assert_eq!(forgot, Ok(true), "forget after an idle pause");
    assert!(store.inspect(&other).await.unwrap().is_none(), "the record is gone");
}

/// Worker processes, their ledger and their answers (multi-process and outage tests).
pub mod workers;

/// The in-memory store behind a test's hook (counting, delaying or failing operations).
pub mod wrapped;

/// The multi-process exactly-once scenario (tests/multiprocess.rs, tests/pgbouncer.rs).
pub mod hammer;

/// A TCP proxy that cuts, restores, or loses one reply (outage and lost-reply tests).
pub mod proxy;

/// `assert!(matches!(answer, pattern))` that prints the answer when it fails: what the store
/// said, not only that it was wrong.
#[macro_export]
macro_rules! assert_answer {
    ($answer:expr, $($pattern:pat_param)|+ $(if $guard:expr)? $(,)?) => {
        match $answer {
            $($pattern)|+ $(if $guard)? => {}
            ref other => panic!(
                "expected {}, the store answered {other:?}",
                stringify!($($pattern)|+ $(if $guard)?)
            ),
        }
    };
}

/// Private servers with TLS (PostgreSQL, Redis) and the certificates they use.
pub mod servers;

/// The error type of test tools that never fail ("never fails"; permanent, were it ever made).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Never;

impl Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never fails")
    }
}

impl std::error::Error for Never {}

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

/// Writes twice its value and reads the number back as is: a value whose JSON does not read back
/// as itself, for outputs and errors that must not be stored as they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Doubling(pub u32);

impl serde::Serialize for Doubling {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0.saturating_mul(2))
    }
}

impl<'de> serde::Deserialize<'de> for Doubling {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <u32 as serde::Deserialize>::deserialize(d).map(Doubling)
    }
}

/// A private Redis Cluster (3 masters, 3 replicas) the test starts, kills and reshapes.
pub mod cluster;

//! The store conformance suite (`docs/design.md` §5): every [`Store`] passes these tests, written once and
//! run by each backend's own test file (the shape of object_store's `integration` module).
//!
//! Each behaviour is one public async fn taking `&dyn Store`; each asserts what a caller of the
//! store would check and panics with a message naming the broken rule. They use real time with
//! short leases (about 250 ms) where a lease must expire and long ones (30 s) where it must not,
//! so they pass against stores on their own clocks (SQLite, PostgreSQL, Redis) and under tokio's
//! paused clock (the in-memory store) alike. Every test uses fresh keys, so suites may run
//! concurrently and repeatedly on one shared database.
//!
//! Use [`store_conformance_tests!`](crate::store_conformance_tests) to get one named
//! `#[tokio::test]` per behaviour:
//!
//! ```
//! async fn store() -> Option<std::sync::Arc<idem_core::MemoryStore>> {
//!     Some(std::sync::Arc::new(idem_core::MemoryStore::new()))
//! }
//! idem_core::store_conformance_tests!(#[tokio::test(start_paused = true)] store().await);
//! ```
//!
//! Stores shared by processes also pass the multi-instance tier (`conformance/multi_instance.rs`):
//! the same rules across two instances over one backend, with
//! [`store_multi_instance_tests!`](crate::store_multi_instance_tests).
//!
//! This module is test support: it panics on purpose when a store breaks the contract.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use tokio::time::sleep;

use crate::key::{Fingerprint, Key, Scope, derive_key, fingerprint};

mod admin;
use crate::store::{Claim, ClaimRequest, Fence, OnExpired, Outcome, Record, Store, StoreError};
pub use admin::*;

mod multi_instance;
mod wait;

pub use multi_instance::*;
pub use wait::*;

/// A lease meant to expire during a test.
pub const SHORT: Duration = Duration::from_millis(250);
/// How long a test sleeps to be sure a [`SHORT`] lease or retention has expired.
pub const PAST_SHORT: Duration = Duration::from_millis(400);
/// A lease or retention meant to outlive any test.
pub const LONG: Duration = Duration::from_secs(30);
/// The slack allowed past `max` when checking that [`Store::wait`] never waits past it (real
/// clocks on a loaded machine overshoot timers a little).
pub const WAIT_SLACK: Duration = Duration::from_secs(1);

/// Generates one `#[tokio::test]` per behaviour of the suite.
///
/// The first tokens are the test attribute (e.g. `#[tokio::test(start_paused = true)]` or
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`); then an expression, evaluated
/// in each test's async body, of type `Option<P>` where `P` derefs to a [`Store`] (`Arc<S>`,
/// `Box<dyn Store>`, ...). `None` skips the test (a service that is not reachable outside CI).
#[macro_export]
macro_rules! store_conformance_tests {
    (#[$attr:meta] $make:expr) => {
        $crate::store_conformance_tests!(@each #[$attr] $make;
            claim_fresh_key_acquires,
            concurrent_claims_acquire_once,
            in_flight_reports_holder,
            completed_replays_exact_payloads,
            failure_and_unknown_replay_as_themselves,
            stale_fence_changes_nothing,
            completed_record_is_not_overwritten,
            expired_lease_is_taken_over,
            concurrent_takeovers_acquire_once,
            expired_lease_unknown_accepts_late_complete,
            renew_extends_lease,
            release_frees_key,
            fences_increase_across_release_takeover_forget_retention,
            mismatch_in_every_state,
            retention_removes_record_whole,
            wait_wakes_on_complete,
            wait_wakes_on_release,
            wait_never_past_max,
            wait_returns_when_not_held,
            forget_removes_any_state,
        );
    };
    (@each #[$attr:meta] $make:expr; $($name:ident,)*) => {
        $(
            #[$attr]
            async fn $name() {
                let Some(store) = $make else { return };
                let store: &dyn $crate::Store = &*store;
                $crate::conformance::$name(store).await;
            }
        )*
    };
}

/// Generates one `#[tokio::test]` per behaviour of the operator's part of the contract (listing,
/// inspecting, resolving, purging, counting; `docs/design.md` §5.1), with the same arguments as
/// [`store_conformance_tests!`](crate::store_conformance_tests). Every store of idem passes both;
/// a store written elsewhere that implements only the claim protocol passes the first.
#[macro_export]
macro_rules! store_admin_conformance_tests {
    (#[$attr:meta] $make:expr) => {
        $crate::store_conformance_tests!(@each #[$attr] $make;
            list_by_state,
            list_filters_and_pages,
            inspect_shows_one_record,
            resolve_happened_replays,
            resolve_not_happened_frees_key,
            resolve_is_fenced,
            forget_seen_is_fenced,
            purge_removes_only_expired,
            stats_count_by_state,
        );
    };
}

/// A fresh key and fingerprint, unique across processes and runs (so suites can share a
/// database); `args` tells two intents of one test apart.
pub fn fresh_key(test: &str, args: &str) -> (Key, Fingerprint) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        format!("conformance-{}-{nanos}", std::process::id())
    });
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let scope = Scope::run(format!("{run}-{seq}"));
    (derive_key(&scope, test, args.as_bytes()), fingerprint(args.as_bytes()))
}

/// Another fingerprint than `fresh_key`'s, for mismatch tests.
pub fn other_fingerprint() -> Fingerprint {
    fingerprint(b"{\"other\":true}")
}

fn req<'a>(key: &'a Key, fp: &'a Fingerprint, lease: Duration, on: OnExpired) -> ClaimRequest<'a> {
    ClaimRequest { key, fingerprint: fp, lease, on_expired: on, origin: Default::default() }
}

async fn claim(store: &dyn Store, key: &Key, fp: &Fingerprint, lease: Duration) -> Claim {
    claim_on(store, key, fp, lease, OnExpired::TakeOver).await
}

async fn claim_on(
    store: &dyn Store,
    key: &Key,
    fp: &Fingerprint,
    lease: Duration,
    on: OnExpired,
) -> Claim {
    match store.claim(req(key, fp, lease, on)).await {
        Ok(c) => c,
        Err(e) => panic!("claim of {key:?} failed: {e}"),
    }
}

async fn acquire(store: &dyn Store, key: &Key, fp: &Fingerprint, lease: Duration) -> Fence {
    match claim(store, key, fp, lease).await {
        Claim::Acquired { fence, takeover: false } => fence,
        other => panic!("claim of a free key must be Acquired without takeover, got {other:?}"),
    }
}

async fn complete(store: &dyn Store, key: &Key, fence: Fence, outcome: &Outcome, ttl: Duration) {
    if let Err(e) = store.complete(key, fence, outcome, ttl).await {
        panic!("complete by the current owner ({fence:?}) must succeed, got {e}");
    }
}

fn success(json: &str) -> Outcome {
    Outcome::Success(json.to_owned())
}

fn assert_lease_lost(what: &str, r: Result<(), StoreError>) {
    match r {
        Err(StoreError::LeaseLost) => {}
        other => panic!("{what} must fail with LeaseLost, got {other:?}"),
    }
}

fn assert_completed(what: &str, got: Claim, fp: &Fingerprint, outcome: &Outcome) {
    let want = Claim::Completed(Record { fingerprint: *fp, outcome: outcome.clone() });
    assert_eq!(got, want, "{what}: the stored outcome must replay exactly");
}

fn assert_in_flight(what: &str, got: Claim, fence: Fence) {
    match got {
        Claim::InFlight { fence: f, .. } if f == fence => {}
        other => panic!("{what}: expected InFlight held by {fence:?}, got {other:?}"),
    }
}

/// A claim on a key never seen acquires it, without takeover.
pub async fn claim_fresh_key_acquires(store: &dyn Store) {
    let (key, fp) = fresh_key("claim_fresh_key_acquires", "{}");
    let got = claim(store, &key, &fp, LONG).await;
    assert!(
        matches!(got, Claim::Acquired { takeover: false, .. }),
        "a fresh key must be Acquired without takeover, got {got:?}"
    );
}

/// 32 concurrent claims of one free key: exactly one acquires, the others see it in flight under
/// the winner's fence.
pub async fn concurrent_claims_acquire_once(store: &dyn Store) {
    let (key, fp) = fresh_key("concurrent_claims_acquire_once", "{}");
    let claims = join_all((0..32).map(|_| store.claim(req(&key, &fp, LONG, OnExpired::TakeOver))));
    let claims: Vec<Claim> = claims.await.into_iter().map(|r| r.expect("claim failed")).collect();
    one_winner(&claims, "of 32 concurrent claims", "a losing concurrent claim");
}

/// Asserts that exactly one of `claims` acquired and every other saw the winner's fence in flight.
pub(crate) fn one_winner(claims: &[Claim], among: &str, loser: &str) {
    let winners: Vec<Fence> = claims
        .iter()
        .filter_map(|c| match c {
            Claim::Acquired { fence, .. } => Some(*fence),
            _ => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one claim {among} must acquire: {claims:?}");
    for c in claims {
        match c {
            Claim::Acquired { .. } => {}
            c => assert_in_flight(loser, c.clone(), winners[0]),
        }
    }
}

/// A second claim sees the holder's fence and a lease remaining no longer than the lease.
pub async fn in_flight_reports_holder(store: &dyn Store) {
    let (key, fp) = fresh_key("in_flight_reports_holder", "{}");
    let fence = acquire(store, &key, &fp, LONG).await;
    match claim(store, &key, &fp, Duration::from_secs(1)).await {
        Claim::InFlight { fence: f, lease_remaining } => {
            assert_eq!(f, fence, "InFlight must report the holder's fence");
            assert!(
                lease_remaining <= LONG,
                "lease_remaining {lease_remaining:?} must not exceed the holder's lease {LONG:?}"
            );
            assert!(
                lease_remaining > Duration::from_secs(1),
                "lease_remaining {lease_remaining:?} must be the holder's lease ({LONG:?}), not the \
                 asking claim's"
            );
        }
        other => panic!("a claim of a held key must be InFlight, got {other:?}"),
    }
}

/// Payloads replay exactly as stored, including the falsy and empty JSON values, unicode and a
/// 100 KB document.
pub async fn completed_replays_exact_payloads(store: &dyn Store) {
    let big = format!("{{\"blob\":\"{}\"}}", "é🦀x".repeat(100 * 1024 / 7));
    let payloads = [
        "0",
        "false",
        "\"\"",
        "[]",
        "{}",
        "null",
        "-0.5e-7",
        "{\"b\":1, \"a\":[1,2] }",
        "\"h\\u00e9llo w\u{f6}rld \u{1F980} \\u0000 \\\"q\\\"\"",
        big.as_str(),
    ];
    for (i, p) in payloads.iter().enumerate() {
        let (key, fp) = fresh_key("completed_replays_exact_payloads", &i.to_string());
        let fence = acquire(store, &key, &fp, LONG).await;
        let outcome = success(p);
        complete(store, &key, fence, &outcome, LONG).await;
        let got = claim(store, &key, &fp, LONG).await;
        assert_completed(&format!("payload #{i} ({} bytes)", p.len()), got, &fp, &outcome);
    }
}

/// `Failure` and `Unknown` outcomes replay as themselves (not as success, not lost).
pub async fn failure_and_unknown_replay_as_themselves(store: &dyn Store) {
    let outcomes = [
        Outcome::Failure("{\"code\":\"card_declined\"}".into()),
        Outcome::Failure("null".into()),
        Outcome::Failure("\"\"".into()),
        Outcome::Unknown,
        Outcome::NotStorable("`ratio` of the output is NaN, which JSON cannot carry".into()),
    ];
    for (i, outcome) in outcomes.iter().enumerate() {
        let (key, fp) = fresh_key("failure_and_unknown_replay_as_themselves", &i.to_string());
        let fence = acquire(store, &key, &fp, LONG).await;
        complete(store, &key, fence, outcome, LONG).await;
        let got = claim(store, &key, &fp, LONG).await;
        assert_completed(&format!("{outcome:?}"), got, &fp, outcome);
    }
}

/// complete, release and renew with a fence that is not current fail with `LeaseLost` and leave
/// the record as it was.
pub async fn stale_fence_changes_nothing(store: &dyn Store) {
    let (key, fp) = fresh_key("stale_fence_changes_nothing", "{}");
    let fence = acquire(store, &key, &fp, LONG).await;
    for stale in [Fence(fence.0.wrapping_sub(1)), Fence(fence.0 + 1), Fence(fence.0 + 1_000_000)] {
        assert_lease_lost(
            "complete with a stale fence",
            store.complete(&key, stale, &success("1"), LONG).await,
        );
        assert_lease_lost("release with a stale fence", store.release(&key, stale).await);
        assert_lease_lost("renew with a stale fence", store.renew(&key, stale, LONG).await);
    }
    assert_in_flight("after stale calls", claim(store, &key, &fp, LONG).await, fence);
    // A stale fence on a key that has no record at all.
    let (absent, _) = fresh_key("stale_fence_changes_nothing", "absent");
    assert_lease_lost(
        "complete of an absent key",
        store.complete(&absent, fence, &success("1"), LONG).await,
    );
    assert_lease_lost("release of an absent key", store.release(&absent, fence).await);
    assert_lease_lost("renew of an absent key", store.renew(&absent, fence, LONG).await);
    // The owner still completes normally afterwards.
    complete(store, &key, fence, &success("2"), LONG).await;
    assert_completed("after stale calls", claim(store, &key, &fp, LONG).await, &fp, &success("2"));
}

/// Once completed, the owner's own fence can no longer complete, release or renew: the first
/// outcome stands.
pub async fn completed_record_is_not_overwritten(store: &dyn Store) {
    let (key, fp) = fresh_key("completed_record_is_not_overwritten", "{}");
    let fence = acquire(store, &key, &fp, LONG).await;
    complete(store, &key, fence, &success("\"first\""), LONG).await;
    assert_lease_lost(
        "a second complete",
        store.complete(&key, fence, &success("\"second\""), LONG).await,
    );
    assert_lease_lost("release after complete", store.release(&key, fence).await);
    assert_lease_lost("renew after complete", store.renew(&key, fence, LONG).await);
    let got = claim(store, &key, &fp, LONG).await;
    assert_completed("after late calls", got, &fp, &success("\"first\""));
}

/// An expired lease is taken over with a higher fence and `takeover: true`; the old owner can no
/// longer complete, release or renew, and the new owner's result stands.
pub async fn expired_lease_is_taken_over(store: &dyn Store) {
    let (key, fp) = fresh_key("expired_lease_is_taken_over", "{}");
    let old = acquire(store, &key, &fp, SHORT).await;
    sleep(PAST_SHORT).await;
    let new = match claim(store, &key, &fp, LONG).await {
        Claim::Acquired { fence, takeover: true } => fence,
        other => panic!("a claim after the lease expired must take over, got {other:?}"),
    };
    assert!(new > old, "the takeover fence {new:?} must be higher than the old {old:?}");
    assert_lease_lost(
        "the old owner's complete",
        store.complete(&key, old, &success("\"old\""), LONG).await,
    );
    assert_lease_lost("the old owner's release", store.release(&key, old).await);
    assert_lease_lost("the old owner's renew", store.renew(&key, old, LONG).await);
    assert_in_flight("after the old owner's calls", claim(store, &key, &fp, LONG).await, new);
    complete(store, &key, new, &success("\"new\""), LONG).await;
    assert_lease_lost(
        "the old owner's complete after the new owner's",
        store.complete(&key, old, &success("\"old\""), LONG).await,
    );
    let got = claim(store, &key, &fp, LONG).await;
    assert_completed("after takeover", got, &fp, &success("\"new\""));
}

/// 32 concurrent claims of an expired lease: exactly one takes over.
pub async fn concurrent_takeovers_acquire_once(store: &dyn Store) {
    let (key, fp) = fresh_key("concurrent_takeovers_acquire_once", "{}");
    let old = acquire(store, &key, &fp, SHORT).await;
    sleep(PAST_SHORT).await;
    let claims = join_all((0..32).map(|_| store.claim(req(&key, &fp, LONG, OnExpired::TakeOver))));
    let claims: Vec<Claim> = claims.await.into_iter().map(|r| r.expect("claim failed")).collect();
    let winners: Vec<Fence> = claims
        .iter()
        .filter_map(|c| match c {
            Claim::Acquired { fence, takeover: true } => Some(*fence),
            _ => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one of 32 concurrent takeovers must win: {claims:?}");
    assert!(winners[0] > old, "the takeover fence must be higher than the expired one");
    for c in &claims {
        match c {
            Claim::Acquired { takeover: true, .. } => {}
            c => assert_in_flight("a losing concurrent takeover", c.clone(), winners[0]),
        }
    }
}

/// With `OnExpired::Unknown` an expired lease answers `Claim::Unknown` and changes nothing: the
/// original owner's late completion is accepted and then replayed.
pub async fn expired_lease_unknown_accepts_late_complete(store: &dyn Store) {
    let (key, fp) = fresh_key("expired_lease_unknown_accepts_late_complete", "{}");
    let fence = acquire(store, &key, &fp, SHORT).await;
    sleep(PAST_SHORT).await;
    for _ in 0..2 {
        let got = claim_on(store, &key, &fp, LONG, OnExpired::Unknown).await;
        assert_eq!(got, Claim::Unknown, "an expired lease with OnExpired::Unknown must be Unknown");
    }
    complete(store, &key, fence, &success("\"late\""), LONG).await;
    let got = claim_on(store, &key, &fp, LONG, OnExpired::Unknown).await;
    assert_completed("the late completion", got, &fp, &success("\"late\""));
}

/// renew extends the lease: a claim after the original lease would have ended still sees the
/// key in flight.
pub async fn renew_extends_lease(store: &dyn Store) {
    let (key, fp) = fresh_key("renew_extends_lease", "{}");
    let fence = acquire(store, &key, &fp, SHORT).await;
    if let Err(e) = store.renew(&key, fence, LONG).await {
        panic!("renew by the current owner must succeed, got {e}");
    }
    sleep(PAST_SHORT).await;
    assert_in_flight(
        "after renew, past the first lease",
        claim(store, &key, &fp, LONG).await,
        fence,
    );
    match claim(store, &key, &fp, LONG).await {
        Claim::InFlight { lease_remaining, .. } => assert!(
            lease_remaining > SHORT,
            "lease_remaining {lease_remaining:?} must reflect the renewed lease {LONG:?}"
        ),
        other => panic!("expected InFlight, got {other:?}"),
    }
    complete(store, &key, fence, &success("1"), LONG).await;
}

/// release frees the key: the next claim acquires with a higher fence and no takeover, and the
/// released fence is dead.
pub async fn release_frees_key(store: &dyn Store) {
    let (key, fp) = fresh_key("release_frees_key", "{}");
    let first = acquire(store, &key, &fp, LONG).await;
    if let Err(e) = store.release(&key, first).await {
        panic!("release by the current owner must succeed, got {e}");
    }
    assert_lease_lost("a second release", store.release(&key, first).await);
    let second = acquire(store, &key, &fp, LONG).await;
    assert!(second > first, "the fence after release {second:?} must exceed {first:?}");
    assert_lease_lost(
        "complete with the released fence",
        store.complete(&key, first, &success("1"), LONG).await,
    );
    assert_in_flight(
        "after the released owner's complete",
        claim(store, &key, &fp, LONG).await,
        second,
    );
}

/// Fences of one key strictly increase across release, takeover, forget and retention expiry.
pub async fn fences_increase_across_release_takeover_forget_retention(store: &dyn Store) {
    fence_turns("fences_increase", store, store, "").await;
}

/// Acquire and release on `a`, acquire on `b`, a takeover by `a`, forget on `b`, a completion on
/// `a` and retention expiry, then acquire on `b`: each fence must exceed the one before. `across`
/// ends the failure messages (which instances were involved).
async fn fence_turns(test: &str, a: &dyn Store, b: &dyn Store, across: &str) {
    let (key, fp) = fresh_key(test, "{}");
    let f1 = acquire(a, &key, &fp, LONG).await;
    a.release(&key, f1).await.expect("release");
    let f2 = acquire(b, &key, &fp, SHORT).await;
    assert!(f2 > f1, "after release{across}: {f2:?} must exceed {f1:?}");
    sleep(PAST_SHORT).await;
    let f3 = match claim(a, &key, &fp, LONG).await {
        Claim::Acquired { fence, takeover: true } => fence,
        other => panic!("expected a takeover{across}, got {other:?}"),
    };
    assert!(f3 > f2, "after takeover{across}: {f3:?} must exceed {f2:?}");
    assert!(b.forget(&key).await.expect("forget"), "forget{across} must remove the record");
    let f4 = acquire(a, &key, &fp, LONG).await;
    assert!(f4 > f3, "after forget{across}: {f4:?} must exceed {f3:?}");
    complete(a, &key, f4, &success("1"), SHORT).await;
    sleep(PAST_SHORT).await;
    let f5 = acquire(b, &key, &fp, LONG).await;
    assert!(f5 > f4, "after retention expiry{across}: {f5:?} must exceed {f4:?}");
}

/// The same key with another fingerprint is a `Mismatch` whatever the record's state: in flight,
/// expired (both `OnExpired` modes), and completed with each kind of outcome.
pub async fn mismatch_in_every_state(store: &dyn Store) {
    let other = other_fingerprint();
    let check = |what: &'static str, got: Claim| {
        assert_eq!(got, Claim::Mismatch, "another fingerprint on a {what} record must be Mismatch");
    };

    let (key, fp) = fresh_key("mismatch_in_every_state", "in_flight");
    let fence = acquire(store, &key, &fp, LONG).await;
    check("in-flight", claim(store, &key, &other, LONG).await);
    assert_in_flight("after a mismatch", claim(store, &key, &fp, LONG).await, fence);

    let (key, fp) = fresh_key("mismatch_in_every_state", "expired");
    let fence = acquire(store, &key, &fp, SHORT).await;
    sleep(PAST_SHORT).await;
    check("expired (TakeOver)", claim_on(store, &key, &other, LONG, OnExpired::TakeOver).await);
    check("expired (Unknown)", claim_on(store, &key, &other, LONG, OnExpired::Unknown).await);
    complete(store, &key, fence, &success("1"), LONG).await;

    let outcomes = [success("0"), Outcome::Failure("{}".into()), Outcome::Unknown];
    for (i, outcome) in outcomes.iter().enumerate() {
        let (key, fp) = fresh_key("mismatch_in_every_state", &format!("done{i}"));
        let fence = acquire(store, &key, &fp, LONG).await;
        complete(store, &key, fence, outcome, LONG).await;
        check("completed", claim(store, &key, &other, LONG).await);
        assert_completed("after a mismatch", claim(store, &key, &fp, LONG).await, &fp, outcome);
    }

    // A released key holds no fingerprint any more.
    let (key, fp) = fresh_key("mismatch_in_every_state", "released");
    let fence = acquire(store, &key, &fp, LONG).await;
    store.release(&key, fence).await.expect("release");
    let got = claim(store, &key, &other, LONG).await;
    assert!(
        matches!(got, Claim::Acquired { takeover: false, .. }),
        "a released key must be free for any fingerprint, got {got:?}"
    );
}

/// A completed record whose retention ended is gone whole: no replay, no fingerprint, no fence.
pub async fn retention_removes_record_whole(store: &dyn Store) {
    let (key, fp) = fresh_key("retention_removes_record_whole", "{}");
    let fence = acquire(store, &key, &fp, LONG).await;
    complete(store, &key, fence, &success("\"kept briefly\""), SHORT).await;
    sleep(PAST_SHORT).await;
    // Another fingerprint acquires: the old fingerprint went with the record.
    let got = claim(store, &key, &other_fingerprint(), LONG).await;
    let next = match got {
        Claim::Acquired { fence: f, takeover: false } => f,
        other => panic!("an expired record must be absent (Acquired), got {other:?}"),
    };
    assert!(next > fence, "the fence after retention {next:?} must exceed {fence:?}");
    assert_lease_lost(
        "complete with the expired record's fence",
        store.complete(&key, fence, &success("1"), LONG).await,
    );
    // The old fingerprint now meets the new record: a mismatch, never the old replay.
    let got = claim(store, &key, &fp, LONG).await;
    assert_eq!(got, Claim::Mismatch, "the old intent must meet the new record, not a replay");
}

/// forget removes a record in any state and reports whether there was one; the key is then free
/// and the forgotten fence is dead.
pub async fn forget_removes_any_state(store: &dyn Store) {
    let (key, fp) = fresh_key("forget_removes_any_state", "{}");
    assert!(!store.forget(&key).await.expect("forget"), "forget of an absent key must be false");
    let fence = acquire(store, &key, &fp, LONG).await;
    assert!(
        store.forget(&key).await.expect("forget"),
        "forget of an in-flight record must be true"
    );
    assert_lease_lost(
        "complete after forget",
        store.complete(&key, fence, &success("1"), LONG).await,
    );
    let fence = acquire(store, &key, &fp, LONG).await;
    complete(store, &key, fence, &Outcome::Unknown, LONG).await;
    assert!(store.forget(&key).await.expect("forget"), "forget of a completed record must be true");
    assert!(!store.forget(&key).await.expect("forget"), "a second forget must be false");
    let got = claim(store, &key, &fp, LONG).await;
    assert!(
        matches!(got, Claim::Acquired { takeover: false, .. }),
        "a forgotten key must be free, got {got:?}"
    );
}

//! Automatic reconciliation (`#[tool(reconcile = check)]`, `docs/design.md` §3.1): a tool whose
//! attempt ended ambiguously, or whose owner died holding the lease, asks the target system
//! whether the effect happened instead of answering "outcome unknown". Side effects and checks
//! are counted at the (fake) provider. Every case runs on the in-memory store, with tokio's paused
//! clock so leases end without waiting, and on each durable store the features enable (SQLite,
//! PostgreSQL at `IDEM_PG_URL`, Redis at `IDEM_REDIS_URL`), in real time: their takeover of an
//! expired lease and their refusal of a stale fence are the store's own code.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::key::{Fingerprint, Key, derive_key};
use idem_core::store::{Claim, ClaimRequest, Fence, OnExpired, Origin, Outcome, StoreError};
use idem_core::{
    Classify, Ctx, Error, Failure, Idem, Reconciled, Run, Served, Tool, ToolSet, tool,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum RefundError {
    #[error("the provider timed out after the request was sent")]
    TimedOut,
}

impl Classify for RefundError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Refund {
    id: String,
    cents: u64,
}

/// What one run of the refund's body does at the provider.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// The refund is made, then the reply is lost: the caller sees a timeout.
    EffectThenTimeout,
    /// The request never reached the provider: the caller sees a timeout.
    TimeoutNoEffect,
    /// The refund is made and the reply arrives.
    Ok,
    /// The refund is made, then the reply never comes (the caller gives up on the call, or its
    /// process dies).
    EffectThenHang,
    /// While the request is out, another caller takes the key over (this caller's renewals
    /// failed for a whole lease, or its worker was blocked); then the caller sees a timeout.
    TakenOverThenTimeout,
}

/// A payment provider with a list of refunds by idempotency key, counting the refund's runs and
/// the checks that ask it.
#[derive(Default)]
struct Provider {
    runs: AtomicUsize,
    checks: AtomicUsize,
    refunds: Mutex<HashMap<String, Refund>>,
    script: Mutex<VecDeque<Step>>,
    /// When set, the check answers "unknown" (the lookup itself failed).
    lookup_down: Mutex<bool>,
    /// When set, the check waits for it before answering.
    check_gate: Mutex<Option<Arc<Notify>>>,
    /// Notified when a check starts.
    check_started: Notify,
    /// The store through which another caller takes the key over ([`Step::TakenOverThenTimeout`]).
    thief: Mutex<Option<Arc<dyn idem_core::Store>>>,
    /// When set, the check panics (a bug in the lookup).
    check_panics: Mutex<bool>,
}

impl Provider {
    fn with_script(steps: &[Step]) -> Arc<Provider> {
        let p = Provider::default();
        p.script.lock().unwrap().extend(steps.iter().copied());
        Arc::new(p)
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    fn make(&self, key: &str, cents: u64) -> Refund {
        let mut refunds = self.refunds.lock().unwrap();
        let n = refunds.len() + 1;
        refunds.entry(key.to_owned()).or_insert(Refund { id: format!("re_{n}"), cents }).clone()
    }
}

#[idem_core::tool_set]
impl Provider {
    /// Refund a payment. Refunds have no provider-side deduplication: one attempt only.
    #[tool(retry = "never", reconcile = refund_made, lease = "10s")]
    async fn refund(&self, cx: &Ctx, payment: String, cents: u64) -> Result<Refund, RefundError> {
        let _ = payment;
        self.runs.fetch_add(1, Ordering::SeqCst);
        let step = self.script.lock().unwrap().pop_front().unwrap_or(Step::Ok);
        match step {
            Step::EffectThenTimeout => {
                self.make(cx.key(), cents);
                Err(RefundError::TimedOut)
            }
            Step::TimeoutNoEffect => Err(RefundError::TimedOut),
            Step::TakenOverThenTimeout => {
                let thief = self.thief.lock().unwrap().clone().expect("a thief");
                let key = Key::parse(cx.key()).expect("a key");
                thief.forget(&key).await.expect("forget");
                let fingerprint = Fingerprint::of_derived_key(&key);
                let req = ClaimRequest {
                    key: &key,
                    fingerprint: &fingerprint,
                    lease: Duration::from_secs(60),
                    on_expired: OnExpired::Unknown,
                    origin: Origin { tool: "refund", tenant: "", run: "thief" },
                };
                let taken = thief.claim(req).await.expect("claim");
                assert!(matches!(taken, Claim::Acquired { .. }), "{taken:?}");
                Err(RefundError::TimedOut)
            }
            Step::Ok => Ok(self.make(cx.key(), cents)),
            Step::EffectThenHang => {
                self.make(cx.key(), cents);
                std::future::pending().await
            }
        }
    }

    /// The check: the provider's list of refunds, by idempotency key.
    async fn refund_made(&self, key: &Key, payment: String, cents: u64) -> Reconciled<Refund> {
        let _ = (payment, cents);
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.check_started.notify_one();
        let gate = self.check_gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            gate.notified().await;
        }
        if *self.lookup_down.lock().unwrap() {
            return Reconciled::Unknown;
        }
        if *self.check_panics.lock().unwrap() {
            panic!("the refunds page changed its layout");
        }
        match self.refunds.lock().unwrap().get(key.as_str()) {
            Some(refund) => Reconciled::Happened(refund.clone()),
            None => Reconciled::NotHappened,
        }
    }
}

async fn refund(
    p: &Arc<Provider>,
    run: &Run,
) -> (Result<Refund, Error<RefundError>>, Option<Served>) {
    let tool = p.refund_tool();
    let args = idem_core::__private::make_args(&tool, ("pay_1".to_owned(), 500u64));
    let (result, report) = run.call_reported(&tool, args).await;
    (result, report.and_then(|r| r.served))
}

/// The key and fingerprint of `refund("pay_1", 500)` in `run`.
fn refund_key(p: &Arc<Provider>, run: &Run) -> (Key, Fingerprint) {
    fn intent<T: Tool>(_: &T, args: &T::Args) -> Vec<u8> {
        let mut out = Vec::new();
        T::write_intent(args, &mut out).unwrap();
        out
    }
    let tool = p.refund_tool();
    let args = idem_core::__private::make_args(&tool, ("pay_1".to_owned(), 500u64));
    let key = derive_key(run.scope(), "refund", &intent(&tool, &args));
    (key, Fingerprint::of_derived_key(&key))
}

/// An owner that claimed the key and then stopped (its process died, or it paused): its lease
/// of 300 ms runs out without a result. Returns its fence.
async fn dead_owner(idem: &Idem, key: &Key, fingerprint: &Fingerprint) -> Fence {
    let req = ClaimRequest {
        key,
        fingerprint,
        lease: Duration::from_millis(300),
        on_expired: OnExpired::Unknown,
        origin: Origin { tool: "refund", tenant: "", run: "r" },
    };
    let Claim::Acquired { fence, .. } = idem.store().claim(req).await.unwrap() else {
        panic!("the first claim acquires");
    };
    // Durable stores end leases by their server's clock: wait well past it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    fence
}

async fn happened_after_an_ambiguous_failure_stores_the_providers_output_and_replays_it(
    idem: Idem,
    run_id: &str,
) {
    let p = Provider::with_script(&[Step::EffectThenTimeout]);
    let run = idem.run(run_id);
    let (first, served) = refund(&p, &run).await;
    assert_eq!(first.unwrap(), Refund { id: "re_1".into(), cents: 500 });
    assert_eq!(served, Some(Served::Reconciled));
    assert_eq!((p.runs(), p.checks()), (1, 1));

    for _ in 0..3 {
        let (again, served) = refund(&p, &run).await;
        assert_eq!(again.unwrap(), Refund { id: "re_1".into(), cents: 500 });
        assert_eq!(served, Some(Served::Replayed));
    }
    assert_eq!((p.runs(), p.checks()), (1, 1), "repeats replay: nothing runs or asks again");
    assert_eq!(p.refunds.lock().unwrap().len(), 1);
}

async fn not_happened_runs_the_body_exactly_once_more(idem: Idem, run_id: &str) {
    let p = Provider::with_script(&[Step::TimeoutNoEffect, Step::Ok]);
    let run = idem.run(run_id);
    let (first, served) = refund(&p, &run).await;
    assert_eq!(first.unwrap(), Refund { id: "re_1".into(), cents: 500 });
    assert_eq!(served, Some(Served::Executed));
    assert_eq!((p.runs(), p.checks()), (2, 1));

    let (again, served) = refund(&p, &run).await;
    assert_eq!(again.unwrap(), Refund { id: "re_1".into(), cents: 500 });
    assert_eq!(served, Some(Served::Replayed));
    assert_eq!((p.runs(), p.checks()), (2, 1));
}

async fn not_happened_twice_in_one_call_frees_the_key_instead_of_a_third_run(
    idem: Idem,
    run_id: &str,
) {
    let p = Provider::with_script(&[Step::TimeoutNoEffect, Step::TimeoutNoEffect]);
    let run = idem.run(run_id);
    let (first, _) = refund(&p, &run).await;
    assert!(matches!(first, Err(Error::Tool { error: RefundError::TimedOut, .. })), "{first:?}");
    assert_eq!((p.runs(), p.checks()), (2, 2));

    // Nothing happened, and the record says nothing: the next call runs.
    let (again, served) = refund(&p, &run).await;
    assert_eq!(again.unwrap(), Refund { id: "re_1".into(), cents: 500 });
    assert_eq!(served, Some(Served::Executed));
    assert_eq!((p.runs(), p.checks()), (3, 2));
}

async fn unknown_answers_outcome_unknown_as_without_a_check(idem: Idem, run_id: &str) {
    let p = Provider::with_script(&[Step::EffectThenTimeout]);
    *p.lookup_down.lock().unwrap() = true;
    let run = idem.run(run_id);
    let (first, served) = refund(&p, &run).await;
    assert!(matches!(first, Err(Error::OutcomeUnknown { .. })), "{first:?}");
    assert_eq!(served, Some(Served::Unknown));
    assert_eq!((p.runs(), p.checks()), (1, 1));

    // The stored "unknown" is replayed: settling it is the operator's (the check is asked only
    // by the caller that holds the fence).
    let (again, _) = refund(&p, &run).await;
    assert!(matches!(again, Err(Error::OutcomeUnknown { .. })), "{again:?}");
    assert_eq!((p.runs(), p.checks()), (1, 1));
}

async fn a_dead_owners_expired_lease_is_taken_over_and_the_check_consulted(
    idem: Idem,
    run_id: &str,
) {
    let p = Provider::with_script(&[]);
    let run = idem.run(run_id);
    let (key, fingerprint) = refund_key(&p, &run);
    let dead = dead_owner(&idem, &key, &fingerprint).await;
    // The dead owner's refund reached the provider before it died.
    let made = p.make(key.as_str(), 500);

    let (result, served) = refund(&p, &run).await;
    assert_eq!(result.unwrap(), made);
    assert_eq!(served, Some(Served::Reconciled));
    assert_eq!((p.runs(), p.checks()), (0, 1), "the check answered; the body did not run");

    // The dead owner, finishing late, cannot overwrite the reconciled outcome: its fence is stale.
    let late = Outcome::Success(r#"{"id":"re_late","cents":500}"#.into());
    let refused = idem.store().complete(&key, dead, &late, Duration::from_secs(60)).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost)), "{refused:?}");
    let (again, served) = refund(&p, &run).await;
    assert_eq!(again.unwrap(), made);
    assert_eq!(served, Some(Served::Replayed));
    assert_eq!((p.runs(), p.checks()), (0, 1));
}

async fn a_dead_owners_effect_that_did_not_happen_runs_now_exactly_once(idem: Idem, run_id: &str) {
    let p = Provider::with_script(&[]);
    let run = idem.run(run_id);
    let (key, fingerprint) = refund_key(&p, &run);
    dead_owner(&idem, &key, &fingerprint).await;

    let (result, served) = refund(&p, &run).await;
    assert_eq!(result.unwrap(), Refund { id: "re_1".into(), cents: 500 });
    assert_eq!(served, Some(Served::TakenOver));
    assert_eq!((p.runs(), p.checks()), (1, 1));
    let (_, served) = refund(&p, &run).await;
    assert_eq!(served, Some(Served::Replayed));
    assert_eq!((p.runs(), p.checks()), (1, 1));
}

async fn a_dead_owners_unknown_check_answer_stays_unknown(idem: Idem, run_id: &str) {
    let p = Provider::with_script(&[]);
    *p.lookup_down.lock().unwrap() = true;
    let run = idem.run(run_id);
    let (key, fingerprint) = refund_key(&p, &run);
    dead_owner(&idem, &key, &fingerprint).await;

    let (result, served) = refund(&p, &run).await;
    assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
    assert_eq!(served, Some(Served::Unknown));
    assert_eq!((p.runs(), p.checks()), (0, 1), "a never tool does not run on an unknown answer");
}

/// While the check runs, its caller holds the fence: the dead owner's late completion is
/// refused, a duplicate waits for the reconciled outcome instead of asking or running, and
/// exactly one outcome is stored.
async fn the_check_runs_under_the_callers_fence_so_a_late_completion_cannot_also_win(
    idem: Idem,
    run_id: &str,
) {
    let p = Provider::with_script(&[]);
    let gate = Arc::new(Notify::new());
    *p.check_gate.lock().unwrap() = Some(Arc::clone(&gate));
    let run = idem.run(run_id);
    let (key, fingerprint) = refund_key(&p, &run);
    let dead = dead_owner(&idem, &key, &fingerprint).await;
    let made = p.make(key.as_str(), 500);

    let started = p.check_started.notified();
    let reconciler = tokio::spawn({
        let (p, run) = (Arc::clone(&p), run.clone());
        async move { refund(&p, &run).await }
    });
    started.await;

    // The dead owner comes back while the check runs: refused, nothing written.
    let late = Outcome::Success(r#"{"id":"re_late","cents":500}"#.into());
    let refused = idem.store().complete(&key, dead, &late, Duration::from_secs(60)).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost)), "{refused:?}");
    // A duplicate finds the key in flight and waits.
    let duplicate = tokio::spawn({
        let (p, run) = (Arc::clone(&p), run.clone());
        async move { refund(&p, &run).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!duplicate.is_finished());

    gate.notify_one();
    let (result, served) = reconciler.await.unwrap();
    assert_eq!(result.unwrap(), made);
    assert_eq!(served, Some(Served::Reconciled));
    let (dup, dup_served) = duplicate.await.unwrap();
    assert_eq!(dup.unwrap(), made);
    assert_eq!(dup_served, Some(Served::Joined));
    assert_eq!((p.runs(), p.checks()), (0, 1));
}

/// The other order: the owner completes before anyone takes its lease over; its outcome stands
/// and the check is not asked.
async fn an_owner_that_completes_first_wins_and_the_check_is_not_asked(idem: Idem, run_id: &str) {
    let p = Provider::with_script(&[]);
    let run = idem.run(run_id);
    let (key, fingerprint) = refund_key(&p, &run);
    let owner = dead_owner(&idem, &key, &fingerprint).await;
    let done = Outcome::Success(r#"{"id":"re_owner","cents":500}"#.into());
    idem.store().complete(&key, owner, &done, Duration::from_secs(60)).await.unwrap();

    let (result, served) = refund(&p, &run).await;
    assert_eq!(result.unwrap(), Refund { id: "re_owner".into(), cents: 500 });
    assert_eq!(served, Some(Served::Replayed));
    assert_eq!((p.runs(), p.checks()), (0, 0));
}

async fn the_tool_set_calls_the_reconciling_tool_like_any_other(idem: Idem, run_id: &str) {
    let p = Provider::with_script(&[Step::EffectThenTimeout]);
    let set: ToolSet = p.tool_set();
    let run = idem.run(run_id);
    let args = serde_json::json!({ "payment": "pay_1", "cents": 500 });
    let result = set.call(&run, "refund", &args).await;
    assert!(!result.is_error, "{result:?}");
    assert_eq!((p.runs(), p.checks()), (1, 1));
    let again = set.call(&run, "refund", &args).await;
    assert_eq!(again.text, result.text);
    assert_eq!((p.runs(), p.checks()), (1, 1));
}

/// An owner whose key was taken over while its attempt ran neither asks the check nor runs the
/// body again: the key and its answer are the new owner's (a `never` tool's body runs once).
async fn an_owner_whose_lease_was_taken_over_neither_asks_nor_runs_again(idem: Idem, run_id: &str) {
    let p = Provider::with_script(&[Step::TakenOverThenTimeout, Step::Ok]);
    *p.thief.lock().unwrap() = Some(Arc::clone(idem.store()));
    let run = idem.run(run_id);
    let (result, _) = refund(&p, &run).await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert_eq!((p.runs(), p.checks()), (1, 0), "neither the check nor a second run");
}

/// A run id of this process and case alone: the durable servers keep records across test runs.
fn run_id(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("reconcile-{case}-{}-{nanos}", std::process::id())
}

/// One test per case on a store: `$open` gives an `Option<Idem>` (`None`: the service is
/// unreachable outside CI, and the case is skipped); `$test` is the test attribute (the in-memory
/// store runs on tokio's paused clock, the durable ones in real time).
macro_rules! on_store {
    ($test:meta, $open:path) => {
        on_store!(@cases $test, $open,
        happened_after_an_ambiguous_failure_stores_the_providers_output_and_replays_it,
        not_happened_runs_the_body_exactly_once_more,
        not_happened_twice_in_one_call_frees_the_key_instead_of_a_third_run,
        unknown_answers_outcome_unknown_as_without_a_check,
        a_dead_owners_expired_lease_is_taken_over_and_the_check_consulted,
        a_dead_owners_effect_that_did_not_happen_runs_now_exactly_once,
        a_dead_owners_unknown_check_answer_stays_unknown,
        the_check_runs_under_the_callers_fence_so_a_late_completion_cannot_also_win,
        an_owner_that_completes_first_wins_and_the_check_is_not_asked,
        the_tool_set_calls_the_reconciling_tool_like_any_other,
        an_owner_whose_lease_was_taken_over_neither_asks_nor_runs_again);
    };
    (@cases $test:meta, $open:path, $($case:ident),*) => {
        $(
            #[$test]
            async fn $case() {
                let Some(idem) = $open(stringify!($case)).await else { return };
                super::$case(idem, &super::run_id(stringify!($case))).await;
            }
        )*
    };
}

mod memory {
    use idem_core::Idem;

    async fn open(_case: &str) -> Option<Idem> {
        Some(Idem::in_memory())
    }

    on_store!(tokio::test(start_paused = true), open);
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use idem_core::Idem;

    /// A file of this case alone.
    async fn open(case: &str) -> Option<Idem> {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("idem-reconcile-{case}-{}.db", std::process::id()));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        Some(Idem::new(idem_core::SqliteStore::open(&path).expect("open the SQLite file")))
    }

    on_store!(tokio::test, open);
}

#[cfg(feature = "postgres")]
mod postgres {
    use idem_core::Idem;

    async fn open(_case: &str) -> Option<Idem> {
        let store = idem_core::PostgresStore::connect(&idem_tests::pg_url()).await;
        idem_tests::or_skip("PostgreSQL", store).map(Idem::new)
    }

    on_store!(tokio::test, open);
}

#[cfg(feature = "redis")]
mod redis {
    use idem_core::Idem;

    async fn open(_case: &str) -> Option<Idem> {
        let store = idem_core::RedisStore::builder(idem_tests::redis_url())
            .prefix(idem_tests::redis_prefix())
            .open()
            .await;
        idem_tests::or_skip("Redis", store).map(Idem::new)
    }

    on_store!(tokio::test, open);
}

// A free fn tool and a keyed tool: the check is a free fn.

static WIRES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
static WIRE_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Send a wire transfer (keyed: the bank deduplicates by the key), whose replies are lost.
#[tool(retry = "keyed", attempts = 2, reconcile = wire_sent)]
async fn wire(cx: &Ctx, to: String, cents: u64) -> Result<String, RefundError> {
    let _ = cents;
    WIRE_RUNS.fetch_add(1, Ordering::SeqCst);
    let mut wires = WIRES.lock().unwrap();
    if !wires.iter().any(|(k, _)| k == cx.key()) {
        wires.push((cx.key().to_owned(), format!("wire_to_{to}")));
    }
    Err(RefundError::TimedOut)
}

async fn wire_sent(key: &Key, to: String, cents: u64) -> Reconciled<String> {
    let _ = (to, cents);
    let wires = WIRES.lock().unwrap();
    match wires.iter().find(|(k, _)| k == key.as_str()) {
        Some((_, id)) => Reconciled::Happened(id.clone()),
        None => Reconciled::NotHappened,
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_tool_whose_last_attempt_was_ambiguous_gets_the_checks_output() {
    let run = Idem::in_memory().run("wire-test");
    let id = wire(&run, "acct_9".into(), 100).await.unwrap();
    assert_eq!(id, "wire_to_acct_9");
    assert_eq!(WIRE_RUNS.load(Ordering::SeqCst), 2, "both attempts ran (same key)");
    let again = wire(&run, "acct_9".into(), 100).await.unwrap();
    assert_eq!(again, id);
    assert_eq!(WIRE_RUNS.load(Ordering::SeqCst), 2);
}

/// Claims answered after 200 ms, and the first fence confirmation (a renewal) refused as a store
/// that is briefly down, as the test says.
struct Slow {
    claims: bool,
    renewals_down: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl idem_tests::wrapped::Hook for Slow {
    async fn before(&self, op: idem_tests::wrapped::Op<'_>) -> Result<(), StoreError> {
        use idem_tests::wrapped::Op;
        match op {
            Op::Claim(_) if self.claims => tokio::time::sleep(Duration::from_millis(200)).await,
            Op::Renew if self.renewals_down.load(Ordering::SeqCst) > 0 => {
                self.renewals_down.fetch_sub(1, Ordering::SeqCst);
                return Err(StoreError::unavailable("the store is briefly down"));
            }
            _ => {}
        }
        Ok(())
    }
}

fn slow_store(claims: bool, renewals_down: usize) -> Idem {
    let hook = Slow { claims, renewals_down: renewals_down.into() };
    Idem::builder_shared(Arc::new(idem_tests::wrapped::Wrapped::new(hook))).build()
}

/// A call cancelled while its claim takes a dead owner's key over does not erase that owner's
/// attempt: the takeover is left to its lease (not released), and the next caller takes the
/// key over in turn and asks the check, which finds the dead owner's refund: no second refund.
#[tokio::test(start_paused = true)]
async fn an_abandoned_takeover_is_left_to_its_lease_and_the_next_caller_asks_the_check() {
    let idem = slow_store(true, 0);
    let p = Provider::with_script(&[]);
    let run = idem.run("abandoned-takeover");
    let (key, fingerprint) = refund_key(&p, &run);
    dead_owner(&idem, &key, &fingerprint).await;
    let made = p.make(key.as_str(), 500);
    let cancelled = tokio::time::timeout(Duration::from_millis(50), refund(&p, &run)).await;
    assert!(cancelled.is_err(), "the claim must still be under way: {cancelled:?}");
    let (again, served) = refund(&p, &run).await;
    assert_eq!(again.unwrap(), made);
    assert_eq!(served, Some(Served::Reconciled));
    assert_eq!((p.runs(), p.checks()), (0, 1), "the check found it; the body did not run");
    assert_eq!(p.refunds.lock().unwrap().len(), 1, "one refund in all");
}

/// A store briefly down when the owner confirms its fence before the check does not turn a
/// known outcome into "unknown": the check is asked (a store step under the fence later finds
/// out whether the fence is still current), and its answer is the call's.
#[tokio::test(start_paused = true)]
async fn a_confirmation_the_store_cannot_answer_does_not_make_the_outcome_unknown() {
    let idem = slow_store(false, 1);
    let p = Provider::with_script(&[Step::EffectThenTimeout]);
    let run = idem.run("confirmation-down");
    let (first, served) = refund(&p, &run).await;
    assert_eq!(first.unwrap(), Refund { id: "re_1".into(), cents: 500 });
    assert_eq!(served, Some(Served::Reconciled));
    assert_eq!((p.runs(), p.checks()), (1, 1));
}

/// A check that panics (the user's code, as the body is) answers "unknown": the caller gets
/// "outcome unknown", the panic does not unwind out of the call, and nothing runs again.
#[tokio::test(start_paused = true)]
async fn a_check_that_panics_answers_unknown() {
    let p = Provider::with_script(&[Step::EffectThenTimeout]);
    *p.check_panics.lock().unwrap() = true;
    let run = Idem::in_memory().run("check-panics");
    let (first, _) = refund(&p, &run).await;
    assert!(matches!(first, Err(Error::OutcomeUnknown { .. })), "{first:?}");
    let (again, _) = refund(&p, &run).await;
    assert!(matches!(again, Err(Error::OutcomeUnknown { .. })), "{again:?}");
    assert_eq!((p.runs(), p.checks()), (1, 1), "one run, one check; the repeat replays unknown");
}

/// A never tool with a check claims so that a dead owner's expired lease can be taken over (and
/// the check asked under the new fence); the in-memory store's sweep must not take such a record
/// for one that any caller may re-run and drop it: the next caller would then acquire a fresh
/// key and run the refund a second time without asking the check. On `idem`, whose store sweeps
/// every second.
async fn the_sweep_keeps_a_dead_owners_record_for_its_check(idem: Idem, run: &str) {
    let p = Provider::with_script(&[Step::EffectThenHang]);
    let run = idem.run(run);
    // The first caller's refund reaches the provider, then the caller gives up on the call
    // before anything is stored: its claim stays until its 10 s lease ends.
    let gave_up = tokio::time::timeout(Duration::from_millis(50), refund(&p, &run)).await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    let made = p.refunds.lock().unwrap().values().next().cloned().expect("the refund was made");
    // Past the lease and the sweep interval: the next claim sweeps first.
    tokio::time::sleep(Duration::from_secs(15)).await;

    let (result, served) = refund(&p, &run).await;
    assert_eq!(result.unwrap(), made);
    assert_eq!(served, Some(Served::Reconciled));
    assert_eq!((p.runs(), p.checks()), (1, 1), "the check answered; the refund did not run again");
}

#[tokio::test(start_paused = true)]
async fn a_swept_store_still_asks_the_check_for_a_dead_owners_never_tool() {
    let store = Arc::new(idem_core::MemoryStore::with_sweep_interval(Duration::from_secs(1)));
    let idem = Idem::builder_shared(store).build();
    the_sweep_keeps_a_dead_owners_record_for_its_check(idem, "swept-dead-owner").await;
}

/// The same with the in-memory store behind a store of the user's own (a wrapper that counts or
/// logs its steps): the executor cannot see through it and claims through `Store`.
#[tokio::test(start_paused = true)]
async fn a_swept_store_behind_a_wrapper_still_asks_the_check_for_a_dead_owners_never_tool() {
    let inner = Arc::new(idem_core::MemoryStore::with_sweep_interval(Duration::from_secs(1)));
    let store = idem_tests::wrapped::Wrapped::over(inner, idem_tests::wrapped::Pass);
    let idem = Idem::builder_shared(Arc::new(store)).build();
    the_sweep_keeps_a_dead_owners_record_for_its_check(idem, "swept-dead-owner-wrapped").await;
}

/// A payout with no provider-side deduplication, and a lookup by key whose first answer is slow
/// to arrive (the provider answered "not made", then the reply took 10 s).
#[derive(Default)]
struct Payouts {
    runs: AtomicUsize,
    checks: AtomicUsize,
    made: Mutex<Vec<String>>,
}

#[idem_core::tool_set]
impl Payouts {
    /// Pay out. The first caller's process dies before its request leaves.
    #[tool(retry = "never", reconcile = payout_made, lease = "3s", timeout = "1m")]
    async fn payout(&self, cx: &Ctx, payee: String) -> Result<String, RefundError> {
        let _ = payee;
        if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        let mut made = self.made.lock().unwrap();
        made.push(cx.key().to_owned());
        Ok(format!("po_{}", made.len()))
    }

    async fn payout_made(&self, key: &Key, payee: String) -> Reconciled<String> {
        let _ = payee;
        let found = self.made.lock().unwrap().iter().position(|k| k == key.as_str());
        if self.checks.fetch_add(1, Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        match found {
            Some(i) => Reconciled::Happened(format!("po_{}", i + 1)),
            None => Reconciled::NotHappened,
        }
    }
}

/// Renewals fail as a store that is down while `down` is set; everything else passes.
#[derive(Default)]
struct RenewalsDown {
    down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl idem_tests::wrapped::Hook for RenewalsDown {
    async fn before(&self, op: idem_tests::wrapped::Op<'_>) -> Result<(), StoreError> {
        if matches!(op, idem_tests::wrapped::Op::Renew) && self.down.load(Ordering::SeqCst) {
            return Err(StoreError::unavailable("the store is down"));
        }
        Ok(())
    }
}

/// A caller that took a dead owner's lease over asks the check under its fence; while the check
/// is slow, its renewals fail and its lease ends, and a third caller takes the key over, asks,
/// and pays out. The slow check then answers "not made" (true when the lookup ran): the caller
/// must confirm its fence before it runs the payout, as after its own ambiguous attempt, and not
/// pay out a second time beside the new owner.
#[tokio::test(start_paused = true)]
async fn a_takeover_whose_slow_check_outlived_its_lease_does_not_run_beside_the_new_owner() {
    let inner = Arc::new(idem_core::MemoryStore::new());
    let hook = Arc::new(RenewalsDown::default());
    struct Shared(Arc<RenewalsDown>);
    #[async_trait::async_trait]
    impl idem_tests::wrapped::Hook for Shared {
        async fn before(&self, op: idem_tests::wrapped::Op<'_>) -> Result<(), StoreError> {
            self.0.before(op).await
        }
    }
    let a = Idem::builder_shared(inner.clone()).build();
    let b = Idem::builder_shared(Arc::new(idem_tests::wrapped::Wrapped::over(
        inner.clone(),
        Shared(hook.clone()),
    )))
    .build();
    let c = Idem::builder_shared(inner).build();
    let p = Arc::new(Payouts::default());
    let call = |idem: &Idem| {
        let (p, run) = (p.clone(), idem.run("payout-takeover"));
        async move {
            let tool = p.payout_tool();
            let args = idem_core::__private::make_args(&tool, ("acct_1".to_owned(),));
            run.call(&tool, args).await
        }
    };
    // A dies with its claim in flight.
    assert!(tokio::time::timeout(Duration::from_millis(50), call(&a)).await.is_err());
    tokio::time::sleep(Duration::from_secs(4)).await;
    // B takes over and asks; its renewals fail while the lookup is out.
    hook.down.store(true, Ordering::SeqCst);
    let b_call = tokio::spawn(call(&b));
    tokio::time::sleep(Duration::from_secs(4)).await;
    // B's lease ended: C takes over, asks (not made), pays out.
    let c_result = call(&c).await;
    assert_eq!(c_result.unwrap(), "po_1");
    hook.down.store(false, Ordering::SeqCst);
    let b_result = b_call.await.unwrap();
    assert_eq!(p.made.lock().unwrap().len(), 1, "one payout; B got {b_result:?}");
    assert!(matches!(b_result, Err(Error::LeaseLost { .. })), "{b_result:?}");
}

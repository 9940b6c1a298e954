//! The protocol of `docs/design.md` §3 when things fail, on the in-memory store: a store that is
//! down or frozen fails closed, caller keys reused with other arguments, exact replay of falsy
//! outcomes, retention and sweeping, cancelled callers, and hardening found by adversarial testing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::store::{Outcome, Store};
use idem_core::{
    BudgetKind, Ctx, Error, Idem, MemoryStore, Policy, RetryClass, StoreError, Tool, ToolDef,
    ToolOptions,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use idem_tests::wrapped::{Hook, Op, Pass, Wrapped};

#[path = "shared/protocol.rs"]
mod rig;

use rig::*;

// ---------------------------------------------------------------------------------------------
// Fail closed, caller-supplied keys, exact replay, retention.

/// A memory store with one fault injected.
#[derive(Clone, Copy)]
enum Fault {
    /// The server is down: every operation fails at once.
    Down,
    /// The server accepts requests and never answers.
    Frozen,
    /// Claims are answered after this long (the caller may have given up).
    SlowClaims(Duration),
    /// The server goes down after the claim: `complete` fails.
    CompleteFails,
    /// The store's data is damaged: every operation fails, and waiting does not mend it.
    Damaged,
}

/// The in-memory store with `fault` injected.
fn faulty(fault: Fault) -> Wrapped<Fault> {
    Wrapped::new(fault)
}

fn down() -> StoreError {
    StoreError::unavailable("connection refused (127.0.0.1:6379)")
}

#[async_trait::async_trait]
impl Hook for Fault {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        match (*self, op) {
            (Fault::Down, _) => Err(down()),
            (Fault::Frozen, _) => std::future::pending().await,
            (Fault::SlowClaims(d), Op::Claim(_)) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            (Fault::CompleteFails, Op::Complete { .. }) => Err(down()),
            (Fault::Damaged, _) => Err(StoreError::Damaged(
                "the SQLite database at /var/idem.db is damaged (database disk image is \
                 malformed); restore it from a backup"
                    .into(),
            )),
            _ => Ok(()),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn when_the_store_is_down_keyed_and_never_tools_do_not_run() {
    for class in [RetryClass::Keyed, RetryClass::Never] {
        let tool = PayTool::new(class, ToolOptions::default(), &[], Step::Succeed);
        let got = Idem::new(faulty(Fault::Down)).run("r").call(&*tool, args("cus_1", 4900)).await;
        match got {
            Err(e @ Error::StoreUnavailable { .. }) => {
                assert!(e.to_string().contains("nothing was executed"), "{e}");
            }
            other => panic!("{class}: {other:?}"),
        }
        assert_eq!(tool.runs(), 0, "{class}: fail closed");
    }
    // A safe tool without caching does not need the store; with caching it fails closed unless
    // the executor allows it to fail open.
    let tool = PayTool::new(RetryClass::Safe, ToolOptions::default(), &[], Step::Succeed);
    assert!(Idem::new(faulty(Fault::Down)).run("r").call(&*tool, args("c", 1)).await.is_ok());
    let cached =
        Idem::builder(faulty(Fault::Down)).policy(Policy { cache_safe: true, ..policy() }).build();
    let got = cached.run("r").call(&*tool, args("c", 1)).await;
    assert!(matches!(got, Err(Error::StoreUnavailable { .. })), "{got:?}");
    let open = Idem::builder(faulty(Fault::Down))
        .policy(Policy { cache_safe: true, ..policy() })
        .safe_fail_open(true)
        .build();
    assert!(open.run("r").call(&*tool, args("c", 1)).await.is_ok());
    assert_eq!(tool.runs(), 2);
}

/// A damaged store fails closed, and the caller is told to restore it, not to upgrade idem: no
/// version reads a damaged file, and a record-level "incompatible" would send the operator after
/// an upgrade that cannot help.
#[tokio::test(start_paused = true)]
async fn a_damaged_store_fails_closed_and_says_restore_not_upgrade() {
    for class in [RetryClass::Keyed, RetryClass::Never] {
        let tool = PayTool::new(class, ToolOptions::default(), &[], Step::Succeed);
        let got = Idem::new(faulty(Fault::Damaged)).run("r").call(&*tool, args("cus_1", 49)).await;
        let Err(e @ Error::StoreUnavailable { .. }) = got else { panic!("{class}: {got:?}") };
        let told = idem_core::ErrorChain(&e).to_string();
        assert!(told.contains("restore it from a backup"), "{class}: {told}");
        assert!(!told.to_lowercase().contains("upgrade"), "{class}: {told}");
        assert!(!told.contains("retry when the store is back"), "{class}: {told}");
        assert!(e.to_string().contains("nothing was executed"), "{class}: {e}");
        assert_eq!(tool.runs(), 0, "{class}: fail closed");
    }
}

/// An empty caller key (an absent `Idempotency-Key` header passed on as `""`), or one of only
/// white space, is refused before anything runs or is claimed: it would put every call of the
/// tool in the run on one record.
#[tokio::test(start_paused = true)]
async fn an_empty_caller_key_is_refused_and_nothing_runs() {
    let tool = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    let idem = executor();
    // Only white space is as empty: a header of spaces, a template left unset.
    for empty in ["", " ", "\t \n"] {
        let run = idem.run("r").with_idempotency_key(empty);
        match run.call(&*tool, args("cus_1", 4900)).await {
            Err(
                e @ Error::InvalidArguments {
                    source: idem_core::KeyError::EmptyIdempotencyKey, ..
                },
            ) => {
                let why =
                    std::error::Error::source(&e).map(ToString::to_string).unwrap_or_default();
                assert!(why.contains("idempotency key is empty"), "{e}: {why}");
                let said = e.to_string();
                assert!(said.contains("the caller's idempotency key cannot make"), "{said}");
            }
            other => panic!("{empty:?}: {other:?}"),
        }
    }
    assert_eq!(tool.runs(), 0);
    // Without it, the same call runs once, under a key derived from the arguments.
    assert_eq!(idem.run("r").call(&*tool, args("cus_1", 4900)).await.unwrap(), "ch_1");
    assert_eq!(tool.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_key_reused_with_other_arguments_is_refused() {
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[],
        Step::Slow(Duration::from_millis(100)),
    );
    let run = executor().run("r").with_idempotency_key("order-1042");
    // While the first is in flight and after it completed.
    let (first, clash) =
        tokio::join!(run.call(&*tool, args("cus_1", 4900)), run.call(&*tool, args("cus_1", 9900)));
    assert_eq!(first.unwrap(), "ch_1");
    let later = run.call(&*tool, args("cus_1", 9900)).await;
    // Both name the key the caller gave, not the digest stored for it, which it never saw.
    for clash in [clash, later] {
        match clash {
            Err(e @ Error::KeyReuseMismatch { .. }) => {
                let text = e.to_string();
                assert!(text.contains("idempotency key \"order-1042\""), "{text}");
                assert!(text.contains("use a new key"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        run.call(&*tool, args("cus_1", 4900)).await.unwrap(),
        "ch_1",
        "same key, same arguments: replay"
    );
    assert_eq!(tool.runs(), 1);
}

/// A safe tool that keeps no record runs each call: its caller key reused with other arguments
/// runs on its own, while the first call is in flight as after it finished (there is no stored
/// fingerprint to refuse it by once the first has finished, and the answer must not depend on
/// timing). Each caller gets the result of its own arguments, never the other's.
#[tokio::test(start_paused = true)]
async fn a_safe_tools_caller_key_reused_with_other_arguments_runs_either_way() {
    let tool = PayTool::new(
        RetryClass::Safe,
        ToolOptions::default(),
        &[],
        Step::Slow(Duration::from_millis(100)),
    );
    let run = executor().run("r").with_idempotency_key("quote-7");
    let (first, other) =
        tokio::join!(run.call(&*tool, args("cus_1", 4900)), run.call(&*tool, args("cus_1", 9900)));
    let later = run.call(&*tool, args("cus_1", 700)).await;
    let (first, other, later) = (first.unwrap(), other.unwrap(), later.unwrap());
    assert_eq!(tool.runs(), 3, "each call ran its own arguments");
    assert!(first != other && other != later && first != later, "{first} {other} {later}");
    // The same arguments in flight still join.
    let (a, b) =
        tokio::join!(run.call(&*tool, args("cus_1", 4900)), run.call(&*tool, args("cus_1", 4900)));
    assert_eq!(a.unwrap(), b.unwrap());
    assert_eq!(tool.runs(), 4);
}

/// Returns whatever JSON it is given.
struct Echo {
    runs: AtomicUsize,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct EchoArgs {
    value: serde_json::Value,
}

static ECHO_DEF: ToolDef = ToolDef {
    name: "echo",
    description: "",
    class: RetryClass::Keyed,
    options: ToolOptions { ttl: Some(Duration::from_secs(2)), ..ToolOptions::NONE },
};

impl Tool for Echo {
    type Args = EchoArgs;
    type Output = serde_json::Value;
    type Error = PayError;
    fn def(&self) -> &'static ToolDef {
        &ECHO_DEF
    }
    fn run(
        &self,
        _cx: &Ctx,
        args: EchoArgs,
    ) -> impl std::future::Future<Output = Result<serde_json::Value, PayError>> + Send {
        self.runs.fetch_add(1, Ordering::SeqCst);
        async move { Ok(args.value) }
    }
}

#[tokio::test(start_paused = true)]
async fn falsy_outcomes_replay_as_themselves() {
    use serde_json::json;
    let tool = Echo { runs: AtomicUsize::new(0) };
    let run = executor().run("r");
    let values = [
        json!(0),
        json!(false),
        json!(""),
        json!([]),
        json!({}),
        json!(null),
        json!(0.5),
        json!("é\u{1F600}"),
    ];
    for v in &values {
        assert_eq!(&run.call(&tool, EchoArgs { value: v.clone() }).await.unwrap(), v);
        assert_eq!(
            &run.call(&tool, EchoArgs { value: v.clone() }).await.unwrap(),
            v,
            "replayed exactly"
        );
    }
    assert_eq!(tool.runs.load(Ordering::SeqCst), values.len(), "each value ran once");
}

#[tokio::test(start_paused = true)]
async fn expired_records_are_swept_so_memory_stays_bounded() {
    let store = Arc::new(MemoryStore::with_sweep_interval(Duration::from_secs(1)));
    let idem = executor_on(store.clone(), policy());
    let tool = Echo { runs: AtomicUsize::new(0) };
    let run = idem.run("r");
    for i in 0..3000 {
        run.call(&tool, EchoArgs { value: i.into() }).await.unwrap();
    }
    assert!(store.len() <= 3000);
    // Past the 2 s retention, the next call sweeps everything that expired.
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.call(&tool, EchoArgs { value: "one more".into() }).await.unwrap();
    assert_eq!(store.len(), 1, "only the live record remains");
    // An expired intent runs again (its outcome was forgotten with the record).
    run.call(&tool, EchoArgs { value: 0.into() }).await.unwrap();
    assert_eq!(tool.runs.load(Ordering::SeqCst), 3002);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_leader_does_not_strand_its_joiners() {
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[Step::Slow(Duration::from_secs(3600))],
        Step::Succeed,
    );
    let idem = executor();
    let run = idem.run("r");
    let leader = run.call(&*tool, args("cus_1", 4900));
    let joiner = run.call(&*tool, args("cus_1", 4900));
    // The leader is dropped (its caller gave up) a second in; the joiner must still finish: it
    // waits for the abandoned lease to expire, takes over and runs with the same key.
    let leader = tokio::time::timeout(Duration::from_secs(1), leader);
    let (l, j) = tokio::join!(leader, joiner);
    assert!(l.is_err(), "the leader timed out");
    assert_eq!(j.unwrap(), "ch_1");
    assert_eq!(tool.runs(), 2);
    assert_eq!(tool.distinct_keys(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_that_waits_past_its_budget_stops_and_the_first_call_is_unaffected() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let patient =
        executor_on(store.clone(), Policy { attempt_timeout: Duration::from_secs(60), ..policy() });
    let hasty = executor_on(store, Policy { deadline: Duration::from_secs(1), ..policy() });
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[],
        Step::Slow(Duration::from_secs(5)),
    );
    let run_a = patient.run("r");
    let first = run_a.call(&*tool, args("cus_1", 4900));
    let second = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = Instant::now();
        let got = hasty.run("r").call(&*tool, args("cus_1", 4900)).await;
        (got, started.elapsed())
    };
    let (first, (second, waited)) = tokio::join!(first, second);
    assert_eq!(first.unwrap(), "ch_1");
    assert!(
        matches!(second, Err(Error::BudgetExhausted { budget: BudgetKind::Deadline, .. })),
        "{second:?}"
    );
    assert!(waited <= Duration::from_secs(1), "never waits past its budget: {waited:?}");
    assert_eq!(tool.runs(), 1);
}

// ---------------------------------------------------------------------------------------------
// Hardening found by adversarial testing.

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_outlives_the_retention_of_results() {
    let opts = ToolOptions { ttl: Some(Duration::from_secs(3600)), ..Default::default() };
    let tool = PayTool::new(RetryClass::Never, opts, &[Step::ChargeThenReset], Step::Succeed);
    let run = executor().run("r");
    assert!(matches!(run.call(&*tool, args("cus_1", 1)).await, Err(Error::OutcomeUnknown { .. })));
    tokio::time::sleep(Duration::from_secs(48 * 3600)).await;
    let later = run.call(&*tool, args("cus_1", 1)).await;
    assert!(matches!(later, Err(Error::OutcomeUnknown { .. })), "{later:?}");
    assert_eq!(tool.runs(), 1, "unknown until reconciled, not until the retention ends");
}

#[tokio::test(start_paused = true)]
async fn a_frozen_store_fails_closed_within_the_budget() {
    let idem = Idem::builder(faulty(Fault::Frozen))
        .policy(Policy { deadline: Duration::from_secs(1), ..policy() })
        .build();
    let tool = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    let started = Instant::now();
    let got = idem.run("r").call(&*tool, args("cus_1", 1)).await;
    assert!(matches!(got, Err(Error::StoreUnavailable { .. })), "{got:?}");
    assert!(started.elapsed() <= Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(tool.runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_late_claim_answer_is_released_so_nothing_is_left_owned() {
    let store = Arc::new(faulty(Fault::SlowClaims(Duration::from_secs(10))));
    let hasty =
        executor_on(store.clone(), Policy { store_timeout: Duration::from_secs(1), ..policy() });
    let tool = PayTool::new(RetryClass::Never, ToolOptions::default(), &[], Step::Succeed);
    let got = hasty.run("r").call(&*tool, args("cus_1", 1)).await;
    assert!(matches!(got, Err(Error::StoreUnavailable { .. })), "{got:?}");
    // The claim lands later and is released in the background: the never tool is not stuck as
    // "unknown", and a patient caller runs it once.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(store.inner.len(), 0, "the late claim was released");
    let patient = executor_on(store, Policy { store_timeout: Duration::from_secs(60), ..policy() });
    assert_eq!(patient.run("r").call(&*tool, args("cus_1", 1)).await.unwrap(), "ch_1");
    assert_eq!(tool.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn huge_durations_and_retry_after_hints_do_not_panic() {
    let unlimited = Policy {
        attempt_timeout: Duration::MAX,
        deadline: Duration::MAX,
        lease: Duration::MAX,
        ttl: Duration::MAX,
        failure_ttl: Duration::MAX,
        store_timeout: Duration::MAX,
        ..policy()
    };
    let tool =
        PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[Step::Transient], Step::Succeed);
    let run = executor_on(Arc::new(MemoryStore::new()), unlimited).run("r");
    assert_eq!(run.call(&*tool, args("cus_1", 1)).await.unwrap(), "ch_1");
    assert_eq!(run.call(&*tool, args("cus_1", 1)).await.unwrap(), "ch_1", "replayed");

    let forever = rate_limited(&RATE_LIMITED_SAFE, u64::MAX, usize::MAX);
    let got = executor().run("r").call(&forever, args("q", 1)).await;
    assert!(
        matches!(got, Err(Error::BudgetExhausted { budget: BudgetKind::Deadline, .. })),
        "{got:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_renewed_while_waiting_out_a_retry_after_hint() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let short_lease = Policy { lease: Duration::from_millis(100), ..policy() };
    let (a, b) = (executor_on(store.clone(), short_lease), executor_on(store, short_lease));
    let tool = rate_limited(&RATE_LIMITED_KEYED, 5000, 1);
    let run_a = a.run("r");
    let first = run_a.call(&tool, args("q", 1));
    let second = async {
        // During the 5 s retry-after pause, long past the 100 ms lease.
        tokio::time::sleep(Duration::from_secs(2)).await;
        b.run("r").call(&tool, args("q", 1)).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.unwrap(), 42);
    assert_eq!(second.unwrap(), 42);
    assert_eq!(
        tool.runs.load(Ordering::SeqCst),
        2,
        "one rate-limited attempt, one retry; no takeover"
    );
}

#[tokio::test(start_paused = true)]
async fn records_abandoned_by_cancelled_callers_are_swept() {
    let store = Arc::new(MemoryStore::with_sweep_interval(Duration::from_secs(1)));
    let idem = executor_on(store.clone(), Policy { lease: Duration::from_secs(2), ..policy() });
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[],
        Step::Slow(Duration::from_secs(3600)),
    );
    let run = idem.run("r");
    for i in 0..2000 {
        // The caller gives up while the tool runs: the claim stays until its lease ends.
        let _ =
            tokio::time::timeout(Duration::from_millis(1), run.call(&*tool, args("cus", i))).await;
    }
    assert!(store.len() >= 2000);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let _ = tokio::time::timeout(Duration::from_millis(1), run.call(&*tool, args("last", 0))).await;
    assert_eq!(store.len(), 1, "expired leases of re-runnable tools are swept");
}

/// The store refuses one `complete`, the `nth` (from 0), as unavailable (a failover, a lock held
/// past the busy timeout), and takes every other.
struct OneCompleteFails {
    nth: usize,
    seen: AtomicUsize,
}

impl OneCompleteFails {
    fn store(nth: usize) -> Arc<Wrapped<OneCompleteFails>> {
        Arc::new(Wrapped::new(OneCompleteFails { nth, seen: AtomicUsize::new(0) }))
    }
}

#[async_trait::async_trait]
impl Hook for OneCompleteFails {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        match op {
            Op::Complete { .. } if self.seen.fetch_add(1, Ordering::SeqCst) == self.nth => {
                Err(down())
            }
            _ => Ok(()),
        }
    }
}

/// A `never` tool's "unknown" outcome the store refused is sent again in the background, as a
/// result is: once it lands the record reads as unknown for an operator (`idem list`, a
/// reconciliation pass), not as a claim still in flight, and a repeat answers unknown at once
/// instead of waiting out the lease.
#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_the_store_refused_is_stored_later() {
    let store = OneCompleteFails::store(0);
    let idem = executor_on(store.clone(), Policy { lease: Duration::from_secs(3600), ..policy() });
    let run = idem.run("r");
    let never = PayTool::new(RetryClass::Never, ToolOptions::default(), &[], Step::ChargeThenReset);
    let got = run.call(&*never, args("cus_1", 1)).await;
    assert!(matches!(got, Err(Error::OutcomeUnknown { .. })), "{got:?}");
    assert_eq!(idem.late_completions_settled(Duration::from_secs(60)).await, 0);
    let key = match run.call(&*never, args("cus_1", 1)).await {
        Err(Error::OutcomeUnknown { key, .. }) => key,
        other => panic!("a repeat within the lease answers unknown: {other:?}"),
    };
    let record = store.inner.inspect(&key).await.unwrap().expect("the record");
    assert!(
        matches!(record.state, idem_core::store::RecordState::Done(Outcome::Unknown)),
        "{record:?}"
    );
    assert_eq!(never.runs(), 1, "the never tool ran once");
}

/// A worker whose lease was taken over while its charge ran finds, at completion, that the new
/// owner gave the key up (its attempts failed before sending): the key is the worker's again and
/// its result becomes the intent's. When the store then refuses that completion as unavailable,
/// the caller still gets the charge that happened, and the outcome is stored later: "the store is
/// unavailable; nothing was executed" would send the caller to charge again.
#[tokio::test(start_paused = true)]
async fn a_result_stored_after_taking_the_key_back_is_not_reported_as_not_executed() {
    // The first completion is the worker's under its lost fence (refused by the store itself as
    // taken over); the second, after it took the key back, is refused as unavailable.
    let store = OneCompleteFails::store(1);
    let shared: Arc<dyn Store> = store.clone();
    let (a, b) = (executor_on(shared.clone(), policy()), executor_on(shared, policy()));
    let slow = slow_charge();
    let failing = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Transient);
    let run_a = a.run("r");
    let worker_a = run_a.call(&*slow, args("cus_1", 4900));
    let mut worker_a = std::pin::pin!(worker_a);
    // Poll A until its charge started, then stop polling it: A is paused (no renewals).
    until_started(&mut worker_a, &slow.started, "A").await;
    tokio::time::sleep(policy().lease + Duration::from_secs(1)).await;
    // B takes the expired lease over, fails before sending on every attempt, and lets go.
    let b_result = b.run("r").call(&*failing, args("cus_1", 4900)).await;
    assert!(matches!(b_result, Err(Error::Tool { .. })), "{b_result:?}");
    // A resumes: its charge happened.
    let a_result = worker_a.await;
    assert_eq!(a_result.expect("A's caller gets its charge"), "ch_1");
    assert_eq!(a.late_completions_settled(Duration::from_secs(60)).await, 0);
    // The outcome landed: a repeat replays the charge and charges nothing.
    let again = a.run("r").call(&*slow, args("cus_1", 4900)).await;
    assert_eq!(again.unwrap(), "ch_1");
    assert_eq!((slow.charges(), slow.runs()), (1, 1));
}

/// Claims after the first fail as the store going down; everything else goes through.
struct LaterClaimsFail(AtomicUsize);

#[async_trait::async_trait]
impl Hook for LaterClaimsFail {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        match op {
            Op::Claim(_) if self.0.fetch_add(1, Ordering::SeqCst) > 0 => Err(down()),
            _ => Ok(()),
        }
    }
}

/// A worker paused past its lease between two attempts finds the key taken over, and the store
/// goes down before it can wait for the new owner: its caller hears that the lease was lost (the
/// new owner's result stands), not "unavailable, nothing was executed", after an attempt ran.
#[tokio::test(start_paused = true)]
async fn a_worker_that_lost_its_lease_while_the_store_went_down_says_lease_lost() {
    let memory = Arc::new(MemoryStore::new());
    let a = executor_on(
        Arc::new(Wrapped::over(memory.clone(), LaterClaimsFail(AtomicUsize::new(0)))),
        policy(),
    );
    let b = executor_on(Arc::new(Wrapped::over(memory, Pass)), policy());
    // A's first attempt fails ambiguously (it may have charged); a retry would be allowed.
    let flaky = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[Step::ChargeThenReset],
        Step::Succeed,
    );
    let slow = slow_charge();
    // A runs until its first attempt failed, pauses past its lease; B takes the key over with
    // a slow charge; A resumes while B runs.
    let (a_result, b_result) = paused_worker_and_new_owner(&a, &b, &flaky, &slow).await;
    assert!(matches!(a_result, Err(Error::LeaseLost { .. })), "{a_result:?}");
    assert_eq!(flaky.runs(), 1, "A did not retry beside B");
    assert!(b_result.is_ok(), "{b_result:?}");
    assert_eq!(slow.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn when_the_store_fails_after_the_work_the_caller_hears_what_happened() {
    let idem = executor_on(Arc::new(faulty(Fault::CompleteFails)), policy());
    let run = idem.run("r");
    // A never tool whose attempt was ambiguous: "unknown", not "nothing was executed".
    let never = PayTool::new(RetryClass::Never, ToolOptions::default(), &[], Step::ChargeThenReset);
    let got = run.call(&*never, args("cus_1", 1)).await;
    assert!(matches!(got, Err(Error::OutcomeUnknown { .. })), "{got:?}");
    // Once its lease ends the claim reads as unknown too; the tool never runs again.
    tokio::time::sleep(policy().lease * 2).await;
    let got = run.call(&*never, args("cus_1", 1)).await;
    assert!(matches!(got, Err(Error::OutcomeUnknown { .. })), "{got:?}");
    assert_eq!(never.runs(), 1);

    // A declined card: the caller gets the decline, not a store error.
    let keyed = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Decline);
    let got = run.call(&*keyed, args("cus_2", 1)).await;
    assert!(matches!(got, Err(Error::Tool { error: PayError::Declined(_), .. })), "{got:?}");
    // A success: the caller gets the charge.
    let ok = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    assert_eq!(run.call(&*ok, args("cus_3", 1)).await.unwrap(), "ch_1");
}

/// The in-memory store behind a wrapper the executor cannot see through, so calls take the
/// generic path of any other store (it still says it is local, as the store itself does).
fn generic_path(store: Arc<MemoryStore>) -> Wrapped<Pass> {
    Wrapped::over(store, Pass).local()
}

/// Keys and fingerprints of a store's records, as the operator's listing shows them.
async fn listed(store: &dyn Store) -> Vec<(String, String)> {
    let page = store.list(&Default::default()).await.expect("list");
    let mut rows = Vec::new();
    for r in &page.records {
        let inspected = store.inspect(&r.key).await.expect("inspect").expect("a record");
        assert_eq!(inspected.fingerprint, r.fingerprint, "inspect and list agree");
        for hex in [r.key.as_str(), r.fingerprint.as_str()] {
            assert!(
                hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
                "{hex:?}"
            );
        }
        rows.push((r.key.to_string(), r.fingerprint.to_string()));
    }
    let mut sorted = rows.clone();
    sorted.sort();
    assert_eq!(rows, sorted, "listed in key order");
    rows
}

/// One history on the in-memory store: a derived key, a caller key, that key reused with other
/// arguments, a replay, and the record forgotten through the store. Returns the listing.
async fn memory_history(store: Arc<dyn Store>) -> Vec<(String, String)> {
    let tool = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    let run = executor_on(Arc::clone(&store), policy()).run("r");
    let keyed = run.with_idempotency_key("order-7");
    assert_eq!(run.call(&*tool, args("cus_1", 100)).await.unwrap(), "ch_1");
    assert_eq!(keyed.call(&*tool, args("cus_1", 200)).await.unwrap(), "ch_2");
    let clash = keyed.call(&*tool, args("cus_1", 300)).await;
    assert!(matches!(clash, Err(Error::KeyReuseMismatch { .. })), "{clash:?}");
    // The caller key with the derived record's arguments is still the caller key's record.
    let clash = keyed.call(&*tool, args("cus_1", 100)).await;
    assert!(matches!(clash, Err(Error::KeyReuseMismatch { .. })), "{clash:?}");
    assert_eq!(run.call(&*tool, args("cus_1", 100)).await.unwrap(), "ch_1", "replay");
    assert_eq!(keyed.call(&*tool, args("cus_1", 200)).await.unwrap(), "ch_2", "replay");
    assert_eq!(tool.runs(), 2);

    let rows = listed(&*store).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let derived: Vec<_> = rows.iter().filter(|(k, f)| k == f).collect();
    assert_eq!(derived.len(), 1, "a derived key's fingerprint is the key itself: {rows:?}");
    let caller = rows.iter().find(|(k, f)| k != f).expect("the caller key's record").clone();

    // Forgotten through the store: the caller key is free for other arguments.
    let key = idem_core::Key::parse(&caller.0).expect("a key");
    assert!(store.forget(&key).await.unwrap());
    // It runs again; the provider, given the same forwarded key, answers its first charge.
    assert_eq!(keyed.call(&*tool, args("cus_1", 300)).await.unwrap(), "ch_2");
    assert_eq!(tool.runs(), 3);
    let after = listed(&*store).await;
    assert_eq!(after.len(), 2, "{after:?}");
    let again = after.iter().find(|(k, _)| *k == caller.0).expect("the caller key again");
    assert_ne!(again.1, caller.1, "the new record has the new arguments' fingerprint");
    rows.into_iter().chain(after).collect()
}

/// The executor's direct calls to an in-memory store (recognised behind `Arc<dyn Store>`) and
/// its generic path through the `Store` trait keep the same records: same keys, the same
/// fingerprints for a derived and a caller-supplied key, the same refusals and replays.
#[tokio::test(start_paused = true)]
async fn the_direct_and_generic_memory_paths_keep_the_same_records() {
    let direct = memory_history(Arc::new(MemoryStore::new())).await;
    let generic = memory_history(Arc::new(generic_path(Arc::new(MemoryStore::new())))).await;
    assert_eq!(direct, generic);
}

/// Duplicates of a call on the in-memory store, direct and through a wrapper: one execution,
/// every caller gets its output; after the owner's lease ends (a cancelled first caller), a
/// keyed call takes over and runs once more, and a never call answers the outcome is unknown
/// until an operator resolves it through the store.
#[tokio::test(start_paused = true)]
async fn cancelled_owner_on_either_memory_path() {
    for opaque in [false, true] {
        let memory = Arc::new(MemoryStore::new());
        let store: Arc<dyn Store> =
            if opaque { Arc::new(generic_path(Arc::clone(&memory))) } else { memory };
        let idem = executor_on(Arc::clone(&store), policy());
        for class in [RetryClass::Keyed, RetryClass::Never] {
            let slow = Step::Slow(Duration::from_secs(1));
            let tool = PayTool::new(class, ToolOptions::default(), &[], slow);
            let run = idem.run(format!("dups-{class}"));
            let calls = (0..5).map(|_| run.call(&*tool, args("cus_1", 100)));
            let got = futures_util::future::join_all(calls).await;
            assert!(
                got.iter().all(|g| matches!(g.as_deref(), Ok("ch_1"))),
                "{opaque} {class}: {got:?}"
            );
            assert_eq!(tool.runs(), 1, "{opaque} {class}");

            // The first caller is cancelled mid-attempt: its record stays in flight.
            let first = run.call(&*tool, args("cus_2", 100));
            assert!(tokio::time::timeout(Duration::from_millis(10), first).await.is_err());
            assert_eq!(tool.runs(), 2, "{opaque} {class}");
            // Past the lease (10 s): a keyed tool takes over and runs again with the same key; a
            // never tool must not guess.
            tokio::time::sleep(Duration::from_secs(11)).await;
            let again = run.call(&*tool, args("cus_2", 100)).await;
            match class {
                RetryClass::Keyed => {
                    assert!(again.is_ok(), "{opaque}: {again:?}");
                    assert_eq!(tool.runs(), 3, "{opaque}");
                }
                _ => {
                    assert!(matches!(again, Err(Error::OutcomeUnknown { .. })), "{again:?}");
                    assert_eq!(tool.runs(), 2, "{opaque}");
                    // The operator settles it through the store: later calls replay that.
                    let key = match again {
                        Err(Error::OutcomeUnknown { key, .. }) => key,
                        _ => unreachable!(),
                    };
                    let info = store.inspect(&key).await.unwrap().expect("the record");
                    let outcome = Outcome::Success("\"ch_9\"".into());
                    let happened = idem_core::store::Resolution::Happened {
                        outcome,
                        ttl: Duration::from_secs(600),
                    };
                    store.resolve(&key, info.fence, &happened).await.expect("resolve");
                    let settled = run.call(&*tool, args("cus_2", 100)).await;
                    assert_eq!(settled.unwrap(), "ch_9", "{opaque}");
                    assert_eq!(tool.runs(), 2, "{opaque}");
                }
            }
        }
    }
}

/// The store's wait for the owner fails once (its connection dropped while it watched the
/// record: a runtime that ended under a connection shared by parallel tests, a server restart).
struct FirstWaitFails(AtomicUsize);

#[async_trait::async_trait]
impl Hook for FirstWaitFails {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        match op {
            Op::Wait if self.0.fetch_add(1, Ordering::SeqCst) == 0 => Err(down()),
            _ => Ok(()),
        }
    }
}

/// A duplicate whose wait for another process's call failed does not answer `StoreUnavailable`
/// ("nothing was executed") while that call charges: a wait only tells when to look again, so it
/// claims again as after any wake-up, and replays the owner's result. One charge.
#[tokio::test(start_paused = true)]
async fn a_wait_that_failed_claims_again_and_replays_the_owners_result() {
    let store: Arc<dyn Store> = Arc::new(Wrapped::new(FirstWaitFails(AtomicUsize::new(0))));
    let (owner, duplicate) = (executor_on(store.clone(), policy()), executor_on(store, policy()));
    let slow = slow_charge();
    let run_owner = owner.run("r");
    let first = run_owner.call(&*slow, args("cus_1", 4900));
    let mut first = std::pin::pin!(first);
    until_started(&mut first, &slow.started, "the owner").await;
    let run_duplicate = duplicate.run("r");
    let (first, second) = tokio::join!(first, run_duplicate.call(&*slow, args("cus_1", 4900)));
    assert_eq!(first.unwrap(), "ch_1");
    assert_eq!(second.unwrap(), "ch_1", "the duplicate replays the owner's result");
    assert_eq!(slow.provider.count(), 1);
    assert_eq!(slow.runs(), 1);
}

//! The protocol of `docs/design.md` §3, row by row and class by class, on the in-memory store.
//!
//! Each test counts what a user would count: how many times the tool body ran, how many charges
//! the (fake) payment provider created, and what every caller received. Time is tokio's paused
//! clock, so leases, timeouts and backoff are exact and instant.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{Claim, ClaimRequest, Fence, OnExpired, Outcome, Store};
use idem_core::{
    Backoff, BudgetKind, Classify, Ctx, Error, Failure, Idem, MemoryStore, Policy, RetryBudget,
    RetryClass, Scope, StoreError, Tool, ToolDef, ToolOptions,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// A fake payment provider and a scripted charge tool.

/// Creates charges; deduplicates by the idempotency key it is given, like Stripe does.
#[derive(Default)]
struct Provider {
    charges: Mutex<Vec<String>>,
    by_key: Mutex<HashMap<String, String>>,
}

impl Provider {
    fn charge(&self, idempotency_key: Option<&str>) -> String {
        let mut by_key = self.by_key.lock().unwrap();
        if let Some(id) = idempotency_key.and_then(|k| by_key.get(k)) {
            return id.clone();
        }
        let mut charges = self.charges.lock().unwrap();
        let id = format!("ch_{}", charges.len() + 1);
        charges.push(id.clone());
        if let Some(k) = idempotency_key {
            by_key.insert(k.to_owned(), id.clone());
        }
        id
    }
    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct ChargeArgs {
    customer: String,
    amount_cents: u64,
}

fn args(customer: &str, amount_cents: u64) -> ChargeArgs {
    ChargeArgs { customer: customer.into(), amount_cents }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("provider unavailable")]
    Unavailable,
    #[error("connection reset after the request was sent")]
    Reset,
    #[error("card declined: {0}")]
    Declined(String),
}

impl Classify for PayError {
    fn classify(&self) -> Failure {
        match self {
            PayError::Unavailable => Failure::transient(),
            PayError::Reset => Failure::ambiguous(),
            PayError::Declined(_) => Failure::permanent(),
        }
    }
}

/// What one attempt of the tool does.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Charges and answers.
    Succeed,
    /// Charges after this long, then answers.
    Slow(Duration),
    /// Fails before sending: nothing happened.
    Transient,
    /// Charges, then the response is lost: the attempt hangs until its timeout.
    ChargeThenTimeout,
    /// Charges, then the connection resets (an ambiguous error).
    ChargeThenReset,
    /// The card is declined.
    Decline,
}

struct PayTool {
    def: &'static ToolDef,
    provider: Arc<Provider>,
    script: Mutex<VecDeque<Step>>,
    then: Step,
    runs: AtomicUsize,
    keys: Mutex<Vec<String>>,
    started: tokio::sync::Notify,
}

impl PayTool {
    fn new(class: RetryClass, options: ToolOptions, script: &[Step], then: Step) -> Arc<Self> {
        Self::with_provider(class, options, script, then, Arc::default())
    }
    fn with_provider(
        class: RetryClass,
        options: ToolOptions,
        script: &[Step],
        then: Step,
        provider: Arc<Provider>,
    ) -> Arc<Self> {
        let def = Box::leak(Box::new(ToolDef {
            name: "charge_card",
            description: "Charge a customer's card.",
            class,
            options,
        }));
        Arc::new(PayTool {
            def,
            provider,
            script: Mutex::new(script.iter().copied().collect()),
            then,
            runs: AtomicUsize::new(0),
            keys: Mutex::default(),
            started: tokio::sync::Notify::new(),
        })
    }
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
    fn charges(&self) -> usize {
        self.provider.count()
    }
    fn distinct_keys(&self) -> usize {
        let mut keys = self.keys.lock().unwrap().clone();
        keys.sort();
        keys.dedup();
        keys.len()
    }
}

impl Tool for PayTool {
    type Args = ChargeArgs;
    type Output = String;
    type Error = PayError;

    fn def(&self) -> &'static ToolDef {
        self.def
    }

    fn run(
        &self,
        cx: &Ctx,
        _args: ChargeArgs,
    ) -> impl std::future::Future<Output = Result<String, PayError>> + Send {
        let key = cx.key().to_owned();
        let step = self.script.lock().unwrap().pop_front().unwrap_or(self.then);
        async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            self.keys.lock().unwrap().push(key.clone());
            self.started.notify_waiters();
            // A keyed or never tool forwards the key; the provider deduplicates by it.
            let forwarded = (self.def.class != RetryClass::Safe).then_some(key.as_str());
            match step {
                Step::Succeed => Ok(self.provider.charge(forwarded)),
                Step::Slow(d) => {
                    tokio::time::sleep(d).await;
                    Ok(self.provider.charge(forwarded))
                }
                Step::Transient => Err(PayError::Unavailable),
                Step::ChargeThenTimeout => {
                    self.provider.charge(forwarded);
                    std::future::pending().await
                }
                Step::ChargeThenReset => {
                    self.provider.charge(forwarded);
                    Err(PayError::Reset)
                }
                Step::Decline => Err(PayError::Declined("insufficient funds".into())),
            }
        }
    }
}

/// A provider's rate limit, with the Retry-After hint it sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("rate limited, retry after {after_ms} ms")]
struct RateLimited {
    after_ms: u64,
}

impl Classify for RateLimited {
    fn classify(&self) -> Failure {
        Failure::transient().retry_after(Duration::from_millis(self.after_ms))
    }
}

fn policy() -> Policy {
    Policy {
        attempts: 3,
        attempt_timeout: Duration::from_secs(1),
        deadline: Duration::from_secs(60),
        lease: Duration::from_secs(10),
        ttl: Duration::from_secs(3600),
        failure_ttl: Duration::from_secs(600),
        backoff: Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(1) },
        cache_safe: false,
        store_timeout: Duration::from_secs(5),
        ..Policy::default()
    }
}

fn executor_on(store: Arc<dyn Store>, policy: Policy) -> Idem {
    Idem::builder_shared(store).policy(policy).seed(7).build()
}

fn executor() -> Idem {
    executor_on(Arc::new(MemoryStore::new()), policy())
}

const CLASSES: [RetryClass; 3] = [RetryClass::Safe, RetryClass::Keyed, RetryClass::Never];

fn key_of(
    tool: &PayTool,
    scope: &Scope,
    a: &ChargeArgs,
) -> (idem_core::Key, idem_core::Fingerprint) {
    let canonical = idem_core::to_canonical_string(a).unwrap();
    let key = idem_core::key::derive_key(scope, tool.def.name, canonical.as_bytes());
    (key, idem_core::Fingerprint::of_derived_key(&key))
}

// ---------------------------------------------------------------------------------------------
// Row 1: first call.

#[tokio::test(start_paused = true)]
async fn first_call_safe_and_keyed_retry_a_transient_failure_with_the_same_key() {
    for class in [RetryClass::Safe, RetryClass::Keyed] {
        let tool = PayTool::new(class, ToolOptions::default(), &[Step::Transient], Step::Succeed);
        let got = executor().run("r").call(&*tool, args("cus_1", 4900)).await;
        assert_eq!(got.unwrap(), "ch_1", "{class}");
        assert_eq!(tool.runs(), 2, "{class}: one failed attempt, one retry");
        assert_eq!(tool.charges(), 1, "{class}");
        assert_eq!(tool.distinct_keys(), 1, "{class}: every attempt carries the same key");
    }
}

#[tokio::test(start_paused = true)]
async fn first_call_never_gets_exactly_one_attempt_and_a_transient_failure_frees_the_key() {
    let tool =
        PayTool::new(RetryClass::Never, ToolOptions::default(), &[Step::Transient], Step::Succeed);
    let idem = executor();
    let run = idem.run("r");
    let got = run.call(&*tool, args("cus_1", 4900)).await;
    assert!(matches!(got, Err(Error::Tool { error: PayError::Unavailable, .. })), "{got:?}");
    assert_eq!(tool.runs(), 1, "never tools are not retried");
    // A transient failure proves nothing happened, so the claim was released: the next call runs.
    assert_eq!(run.call(&*tool, args("cus_1", 4900)).await.unwrap(), "ch_1");
    assert_eq!(tool.runs(), 2);
    assert_eq!(tool.charges(), 1);
}

#[tokio::test(start_paused = true)]
async fn never_tool_ignores_an_attempts_option() {
    let opts = ToolOptions { attempts: Some(5), ..Default::default() };
    let tool = PayTool::new(RetryClass::Never, opts, &[], Step::Transient);
    let got = executor().run("r").call(&*tool, args("cus_1", 1)).await;
    assert!(matches!(got, Err(Error::Tool { .. })), "{got:?}");
    assert_eq!(tool.runs(), 1);
}

// ---------------------------------------------------------------------------------------------
// Row 2: duplicate while the first is in flight.

#[tokio::test(start_paused = true)]
async fn in_process_duplicates_join_the_first_call_for_every_class() {
    for class in CLASSES {
        let tool = PayTool::new(
            class,
            ToolOptions::default(),
            &[],
            Step::Slow(Duration::from_millis(500)),
        );
        let run = executor().run("r");
        let calls = (0..10).map(|_| run.call(&*tool, args("cus_1", 4900)));
        let results = futures_util::future::join_all(calls).await;
        for r in results {
            assert_eq!(r.unwrap(), "ch_1", "{class}: every duplicate receives the first result");
        }
        assert_eq!(tool.runs(), 1, "{class}");
        assert_eq!(tool.charges(), 1, "{class}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_in_another_executor_waits_for_the_stored_result() {
    for class in CLASSES {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let policy = Policy { cache_safe: true, ..policy() };
        let (a, b) = (executor_on(store.clone(), policy), executor_on(store, policy));
        let tool = PayTool::new(
            class,
            ToolOptions::default(),
            &[],
            Step::Slow(Duration::from_millis(500)),
        );
        let run_a = a.run("r");
        let first = run_a.call(&*tool, args("cus_1", 4900));
        let second = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            b.run("r").call(&*tool, args("cus_1", 4900)).await
        };
        let (first, second) = tokio::join!(first, second);
        assert_eq!(first.unwrap(), "ch_1", "{class}");
        assert_eq!(second.unwrap(), "ch_1", "{class}: the other executor waited for the record");
        assert_eq!(tool.runs(), 1, "{class}");
    }
}

// ---------------------------------------------------------------------------------------------
// Row 3: repeat after completion.

#[tokio::test(start_paused = true)]
async fn a_repeat_after_completion_replays_for_keyed_and_never() {
    for class in [RetryClass::Keyed, RetryClass::Never] {
        let tool = PayTool::new(class, ToolOptions::default(), &[], Step::Succeed);
        let run = executor().run("r");
        assert_eq!(run.call(&*tool, args("cus_1", 4900)).await.unwrap(), "ch_1");
        assert_eq!(run.call(&*tool, args("cus_1", 4900)).await.unwrap(), "ch_1", "{class}");
        assert_eq!(tool.runs(), 1, "{class}: replayed, not run");
        // Another intent (other arguments, or the same arguments in another run) does run.
        assert_eq!(run.call(&*tool, args("cus_1", 5000)).await.unwrap(), "ch_2");
        assert_eq!(run.idem().run("r2").call(&*tool, args("cus_1", 4900)).await.unwrap(), "ch_3");
        assert_eq!(tool.runs(), 3, "{class}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_safe_repeat_runs_again_unless_caching_is_on() {
    let tool = PayTool::new(RetryClass::Safe, ToolOptions::default(), &[], Step::Succeed);
    let run = executor().run("r");
    run.call(&*tool, args("cus_1", 1)).await.unwrap();
    run.call(&*tool, args("cus_1", 1)).await.unwrap();
    assert_eq!(tool.runs(), 2, "without caching a safe tool runs every time");

    let tool = PayTool::new(RetryClass::Safe, ToolOptions::default(), &[], Step::Succeed);
    let cached = executor_on(Arc::new(MemoryStore::new()), Policy { cache_safe: true, ..policy() });
    let run = cached.run("r");
    assert_eq!(run.call(&*tool, args("cus_1", 1)).await.unwrap(), "ch_1");
    assert_eq!(run.call(&*tool, args("cus_1", 1)).await.unwrap(), "ch_1");
    assert_eq!(tool.runs(), 1, "with caching the repeat is replayed");
}

// ---------------------------------------------------------------------------------------------
// Row 4: the previous owner's lease expired without a result.

/// A worker that claimed the key, charged with the key, and died before completing.
async fn crashed_owner(
    store: &MemoryStore,
    tool: &PayTool,
    scope: &Scope,
    a: &ChargeArgs,
    on_expired: OnExpired,
) {
    let (key, fingerprint) = key_of(tool, scope, a);
    let claim = store
        .claim(ClaimRequest {
            key: &key,
            fingerprint: &fingerprint,
            lease: policy().lease,
            on_expired,
            origin: Default::default(),
        })
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
    tool.provider.charge(Some(key.as_str()));
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_taken_over_and_re_run_with_the_same_key_for_keyed() {
    let store = Arc::new(MemoryStore::new());
    let tool = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    let scope = Scope::run("r");
    crashed_owner(&store, &tool, &scope, &args("cus_1", 4900), OnExpired::TakeOver).await;
    let idem = executor_on(store, policy());
    let started = Instant::now();
    let got = idem.scope(scope).call(&*tool, args("cus_1", 4900)).await;
    assert_eq!(got.unwrap(), "ch_1", "the provider deduplicated the re-run by the key");
    assert_eq!(tool.runs(), 1);
    assert_eq!(tool.charges(), 1);
    assert!(started.elapsed() >= policy().lease, "waited for the lease to expire first");
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_re_run_for_a_cached_safe_tool() {
    let store = Arc::new(MemoryStore::new());
    let tool = PayTool::new(RetryClass::Safe, ToolOptions::default(), &[], Step::Succeed);
    let scope = Scope::run("r");
    crashed_owner(&store, &tool, &scope, &args("cus_1", 1), OnExpired::TakeOver).await;
    let idem = executor_on(store, Policy { cache_safe: true, ..policy() });
    assert_eq!(idem.scope(scope).call(&*tool, args("cus_1", 1)).await.unwrap(), "ch_2");
    assert_eq!(tool.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_of_a_never_tool_is_outcome_unknown_and_never_re_run() {
    let store = Arc::new(MemoryStore::new());
    let tool = PayTool::new(RetryClass::Never, ToolOptions::default(), &[], Step::Succeed);
    let scope = Scope::run("r");
    crashed_owner(&store, &tool, &scope, &args("cus_1", 4900), OnExpired::Unknown).await;
    let idem = executor_on(store, policy());
    let run = idem.scope(scope);
    for _ in 0..3 {
        let got = run.call(&*tool, args("cus_1", 4900)).await;
        assert!(matches!(got, Err(Error::OutcomeUnknown { .. })), "{got:?}");
    }
    assert_eq!(tool.runs(), 0, "a never tool is not run again after its owner vanished");
    assert_eq!(tool.charges(), 1, "only the crashed owner's charge");
}

// ---------------------------------------------------------------------------------------------
// Row 5: transient failure, attempts or budget exhausted.

#[tokio::test(start_paused = true)]
async fn transient_failures_exhaust_attempts_then_the_error_reaches_the_caller() {
    for class in CLASSES {
        let tool = PayTool::new(class, ToolOptions::default(), &[], Step::Transient);
        let run = executor().run("r");
        let got = run.call(&*tool, args("cus_1", 4900)).await;
        assert!(
            matches!(got, Err(Error::Tool { error: PayError::Unavailable, .. })),
            "{class}: {got:?}"
        );
        let attempts = if class == RetryClass::Never { 1 } else { 3 };
        assert_eq!(tool.runs(), attempts, "{class}");
        // The key was released (nothing happened), so the next call runs again.
        let _ = run.call(&*tool, args("cus_1", 4900)).await;
        assert_eq!(tool.runs(), 2 * attempts, "{class}: released, not stored");
        assert_eq!(tool.charges(), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Row 6: ambiguous failure (timeout, reset after send).

#[tokio::test(start_paused = true)]
async fn an_ambiguous_failure_is_retried_with_the_same_key_for_safe_and_keyed() {
    for first in [Step::ChargeThenTimeout, Step::ChargeThenReset] {
        let tool = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[first], Step::Succeed);
        let got = executor().run("r").call(&*tool, args("cus_1", 4900)).await;
        assert_eq!(got.unwrap(), "ch_1", "{first:?}: the retry received the first charge");
        assert_eq!((tool.runs(), tool.charges(), tool.distinct_keys()), (2, 1, 1), "{first:?}");

        let tool = PayTool::new(RetryClass::Safe, ToolOptions::default(), &[first], Step::Succeed);
        let got = executor().run("r").call(&*tool, args("cus_1", 4900)).await;
        assert!(got.is_ok(), "{first:?}: a safe tool is simply retried");
        assert_eq!(tool.runs(), 2, "{first:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_failure_of_a_never_tool_is_recorded_unknown_and_not_retried() {
    for first in [Step::ChargeThenTimeout, Step::ChargeThenReset] {
        let tool = PayTool::new(RetryClass::Never, ToolOptions::default(), &[first], Step::Succeed);
        let run = executor().run("r");
        for _ in 0..3 {
            let got = run.call(&*tool, args("cus_1", 4900)).await;
            match got {
                Err(e @ Error::OutcomeUnknown { .. }) => {
                    let text = e.to_string();
                    assert!(
                        text.contains("may have taken effect") && text.contains("Do not retry"),
                        "{text}"
                    );
                }
                other => panic!("{first:?}: expected OutcomeUnknown, got {other:?}"),
            }
        }
        assert_eq!((tool.runs(), tool.charges()), (1, 1), "{first:?}: one attempt, ever");
    }
}

#[tokio::test(start_paused = true)]
async fn ambiguous_failures_on_every_attempt_keep_the_key_for_the_next_call() {
    let tool =
        PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::ChargeThenTimeout);
    let run = executor().run("r");
    let got = run.call(&*tool, args("cus_1", 4900)).await;
    assert!(matches!(got, Err(Error::Timeout { attempt: 3, .. })), "{got:?}");
    assert_eq!((tool.runs(), tool.charges(), tool.distinct_keys()), (3, 1, 1));
}

// ---------------------------------------------------------------------------------------------
// Row 7: permanent failure.

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_is_stored_and_replayed_for_keyed_and_never() {
    for class in CLASSES {
        let tool = PayTool::new(class, ToolOptions::default(), &[Step::Decline], Step::Succeed);
        let run = executor().run("r");
        let declined = PayError::Declined("insufficient funds".into());
        for _ in 0..2 {
            let got = run.call(&*tool, args("cus_1", 4900)).await;
            match class {
                RetryClass::Safe => {}
                _ => assert!(
                    matches!(&got, Err(Error::Tool { error, .. }) if *error == declined),
                    "{class}: {got:?}"
                ),
            }
        }
        let expected_runs = if class == RetryClass::Safe { 2 } else { 1 };
        assert_eq!(tool.runs(), expected_runs, "{class}");
    }
}

// ---------------------------------------------------------------------------------------------
// The incident of seed 000: the charge happens, the response times out.

#[tokio::test(start_paused = true)]
async fn the_double_charge_incident_ends_with_one_charge_for_every_kind_of_retry() {
    // Without idem: the retry after a timeout charges again.
    let naive = Provider::default();
    let _first = naive.charge(None); // response lost
    let _retry = naive.charge(None);
    assert_eq!(naive.count(), 2, "the failure this test guards against");

    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[Step::ChargeThenTimeout],
        Step::Succeed,
    );
    let idem = executor();
    let run = idem.run("conversation-1");
    // The executor retries the timed-out attempt with the same key.
    let first = run.call(&*tool, args("cus_1", 4900)).await.unwrap();
    assert_eq!(first, "ch_1");
    // "The model" calls again with the same arguments: replayed.
    let again = run.call(&*tool, args("cus_1", 4900)).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(tool.charges(), 1);
    assert_eq!(tool.runs(), 2, "one timed-out attempt and its retry; the re-call was a replay");

    // 1,000 concurrent duplicates of a new intent whose first attempt times out.
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[Step::ChargeThenTimeout],
        Step::Succeed,
    );
    let calls = (0..1000).map(|_| run.call(&*tool, args("cus_2", 1200)));
    let results = futures_util::future::join_all(calls).await;
    assert_eq!(results.len(), 1000);
    for r in results {
        assert_eq!(r.unwrap(), "ch_1", "every duplicate receives the first charge id");
    }
    assert_eq!(tool.charges(), 1);
    assert_eq!(tool.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_thousand_duplicates_across_two_executors_give_one_charge() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a, b) = (executor_on(store.clone(), policy()), executor_on(store, policy()));
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[Step::ChargeThenTimeout],
        Step::Succeed,
    );
    let calls = (0..1000).map(|i| {
        let idem = if i % 2 == 0 { &a } else { &b };
        let tool = &tool;
        async move { idem.run("r").call(&**tool, args("cus_1", 4900)).await }
    });
    for r in futures_util::future::join_all(calls).await {
        assert_eq!(r.unwrap(), "ch_1");
    }
    assert_eq!(tool.charges(), 1);
}

// ---------------------------------------------------------------------------------------------
// Fencing: a paused worker whose lease was taken over cannot complete over the new owner.

#[tokio::test(start_paused = true)]
async fn a_paused_worker_cannot_overwrite_the_new_owner_and_the_new_result_stands() {
    // (The store-level refusal, LeaseLost for a stale fence, is in the conformance suite.)
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a, b) = (executor_on(store.clone(), policy()), executor_on(store, policy()));
    // Worker A's first attempt charges slowly; worker B's succeeds at once.
    let slow = PayTool::new(
        RetryClass::Keyed,
        ToolOptions { attempt_timeout: Some(Duration::from_secs(3600)), ..Default::default() },
        &[],
        Step::Slow(Duration::from_secs(30)),
    );
    let fast = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    // A's provider already has a charge, so A's own charge is "ch_2", B's is "ch_1".
    slow.provider.charge(None);

    let run_a = a.run("r");
    let worker_a = run_a.call(&*slow, args("cus_1", 4900));
    let mut worker_a = std::pin::pin!(worker_a);
    // Poll A until its tool body started, then stop polling it: A is "paused" (no renewals).
    tokio::select! {
        _ = &mut worker_a => panic!("A finished early"),
        () = slow.started.notified() => {}
    }
    tokio::time::sleep(policy().lease + Duration::from_secs(1)).await;

    let b_result = b.run("r").call(&*fast, args("cus_1", 4900)).await;
    assert_eq!(b_result.unwrap(), "ch_1", "B took over the expired lease");

    // A resumes; its charge happens (its own provider) but it cannot store its result over B's:
    // its caller receives the result that stands, B's.
    let a_result = worker_a.await;
    assert_eq!(
        a_result.unwrap(),
        "ch_1",
        "A's caller gets the new owner's result, not its own ch_2"
    );
    assert_eq!(slow.charges(), 2, "A's own charge did happen (in its provider)");

    // The record holds B's result.
    let replay = b.run("r").call(&*fast, args("cus_1", 4900)).await.unwrap();
    assert_eq!(replay, "ch_1");
    let replay_a = a.run("r").call(&*slow, args("cus_1", 4900)).await.unwrap();
    assert_eq!(replay_a, "ch_1", "A's executor replays B's result too");
    assert_eq!((fast.runs(), slow.runs()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_long_call_renews_its_lease_so_nobody_takes_over() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let policy = Policy {
        lease: Duration::from_secs(3),
        attempt_timeout: Duration::from_secs(60),
        ..policy()
    };
    let (a, b) = (executor_on(store.clone(), policy), executor_on(store, policy));
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[],
        Step::Slow(Duration::from_secs(20)),
    );
    let run_a = a.run("r");
    let first = run_a.call(&*tool, args("cus_1", 4900));
    let second = async {
        // Long past the original lease: only renewal keeps the first call the owner.
        tokio::time::sleep(Duration::from_secs(10)).await;
        b.run("r").call(&*tool, args("cus_1", 4900)).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.unwrap(), "ch_1");
    assert_eq!(second.unwrap(), "ch_1");
    assert_eq!(tool.runs(), 1, "the second executor waited instead of taking over");
}

// ---------------------------------------------------------------------------------------------
// Budgets and backoff.

#[tokio::test(start_paused = true)]
async fn a_dependency_that_always_fails_gets_no_retry_storm() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let budget = Arc::new(RetryBudget::new(20, 0.1));
    let idem = Idem::builder_shared(store)
        .policy(Policy { attempts: 4, ..policy() })
        .retry_budget(budget.clone())
        .seed(1)
        .build();
    let tool = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Transient);
    let run = idem.run("r");
    let mut budget_refusals = 0;
    for i in 0..100 {
        match run.call(&*tool, args("cus_1", i)).await {
            Err(Error::BudgetExhausted { budget: BudgetKind::RetryBudget, .. }) => {
                budget_refusals += 1
            }
            Err(Error::Tool { error: PayError::Unavailable, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    let attempts = tool.runs();
    // Without a retry budget: 100 calls x 4 attempts = 400. With 20 tokens, retries stop once
    // 10 failures drained half the bucket: every call keeps its first attempt only.
    assert!(
        attempts <= 100 + 10,
        "attempts {attempts} exceed first attempts plus the retry budget"
    );
    assert!(attempts >= 100, "every call made its first attempt");
    assert!(budget_refusals >= 90, "{budget_refusals}");
    assert_eq!(tool.charges(), 0, "no effect repeated");
}

#[tokio::test(start_paused = true)]
async fn the_wall_clock_budget_bounds_the_whole_call() {
    let opts = ToolOptions {
        attempts: Some(10),
        attempt_timeout: Some(Duration::from_secs(1)),
        deadline: Some(Duration::from_millis(2500)),
        ..Default::default()
    };
    let tool = PayTool::new(RetryClass::Keyed, opts, &[], Step::ChargeThenTimeout);
    let started = Instant::now();
    let got = executor().run("r").call(&*tool, args("cus_1", 4900)).await;
    assert!(
        matches!(got, Err(Error::BudgetExhausted { budget: BudgetKind::Deadline, .. })),
        "{got:?}"
    );
    assert!(started.elapsed() <= Duration::from_millis(2500), "{:?}", started.elapsed());
    assert!(tool.runs() <= 3, "{}", tool.runs());
    assert_eq!(tool.charges(), 1, "retries reused the key");
}

/// A tool whose first `limited` answers are "rate limited, retry after `after_ms`", then 42.
struct RateLimitedTool {
    def: &'static ToolDef,
    after_ms: u64,
    limited: usize,
    runs: AtomicUsize,
}

const fn rate_limited_def(class: RetryClass) -> ToolDef {
    ToolDef { name: "search", description: "", class, options: ToolOptions::NONE }
}
static RATE_LIMITED_SAFE: ToolDef = rate_limited_def(RetryClass::Safe);
static RATE_LIMITED_KEYED: ToolDef = rate_limited_def(RetryClass::Keyed);

fn rate_limited(def: &'static ToolDef, after_ms: u64, limited: usize) -> RateLimitedTool {
    RateLimitedTool { def, after_ms, limited, runs: AtomicUsize::new(0) }
}

impl Tool for RateLimitedTool {
    type Args = ChargeArgs;
    type Output = u32;
    type Error = RateLimited;
    fn def(&self) -> &'static ToolDef {
        self.def
    }
    fn run(
        &self,
        _cx: &Ctx,
        _args: ChargeArgs,
    ) -> impl std::future::Future<Output = Result<u32, RateLimited>> + Send {
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        let answer =
            if n < self.limited { Err(RateLimited { after_ms: self.after_ms }) } else { Ok(42) };
        async move { answer }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_hint_is_honoured() {
    let tool = rate_limited(&RATE_LIMITED_SAFE, 5000, 1);
    let started = Instant::now();
    assert_eq!(executor().run("r").call(&tool, args("q", 1)).await.unwrap(), 42);
    assert!(started.elapsed() >= Duration::from_secs(5), "{:?}", started.elapsed());
}

#[tokio::test(start_paused = true)]
async fn backoff_uses_full_jitter_and_a_seed_reproduces_it() {
    async fn elapsed_with_seed(seed: u64) -> Duration {
        let idem = Idem::builder(MemoryStore::new())
            .policy(Policy { attempts: 6, ..policy() })
            .seed(seed)
            .build();
        let tool = PayTool::new(RetryClass::Safe, ToolOptions::default(), &[], Step::Transient);
        let started = Instant::now();
        let _ = idem.run("r").call(&*tool, args("cus_1", 1)).await;
        started.elapsed()
    }
    let a = elapsed_with_seed(11).await;
    assert_eq!(a, elapsed_with_seed(11).await, "same seed, same sleeps");
    // Five sleeps, each random in [0, min(1 s, 100 ms * 2^n)]: at most 0.1+0.2+0.4+0.8+1.0 s.
    assert!(a <= Duration::from_millis(2500), "{a:?}");
    let samples: Vec<Duration> =
        futures_util::future::join_all((0..8).map(elapsed_with_seed)).await;
    let distinct: std::collections::HashSet<_> = samples.iter().collect();
    assert!(distinct.len() > 1, "jitter varies with the seed: {samples:?}");
}

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
}

struct Faulty {
    inner: MemoryStore,
    fault: Fault,
}

fn faulty(fault: Fault) -> Faulty {
    Faulty { inner: MemoryStore::new(), fault }
}

fn down() -> StoreError {
    StoreError::unavailable("connection refused (127.0.0.1:6379)")
}

impl Faulty {
    /// What every operation meets first.
    async fn gate(&self) -> Result<(), StoreError> {
        match self.fault {
            Fault::Down => Err(down()),
            Fault::Frozen => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl Store for Faulty {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.gate().await?;
        if let Fault::SlowClaims(d) = self.fault {
            tokio::time::sleep(d).await;
        }
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        k: &idem_core::Key,
        f: Fence,
        o: &Outcome,
        t: Duration,
    ) -> Result<(), StoreError> {
        self.gate().await?;
        if let Fault::CompleteFails = self.fault {
            return Err(down());
        }
        self.inner.complete(k, f, o, t).await
    }
    async fn release(&self, k: &idem_core::Key, f: Fence) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.release(k, f).await
    }
    async fn renew(&self, k: &idem_core::Key, f: Fence, l: Duration) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.renew(k, f, l).await
    }
    async fn wait(&self, k: &idem_core::Key, f: Fence, m: Duration) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.wait(k, f, m).await
    }
    async fn forget(&self, k: &idem_core::Key) -> Result<bool, StoreError> {
        self.gate().await?;
        self.inner.forget(k).await
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
    assert!(matches!(clash, Err(Error::KeyReuseMismatch { .. })), "{clash:?}");
    let clash = run.call(&*tool, args("cus_1", 9900)).await;
    match clash {
        Err(e @ Error::KeyReuseMismatch { .. }) => {
            assert!(e.to_string().contains("use a new key"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        run.call(&*tool, args("cus_1", 4900)).await.unwrap(),
        "ch_1",
        "same key, same arguments: replay"
    );
    assert_eq!(tool.runs(), 1);
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

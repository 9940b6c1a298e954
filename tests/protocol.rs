//! The protocol of `docs/design.md` §3, row by row and class by class, on the in-memory store.
//!
//! Each test counts what a user would count: how many times the tool body ran, how many charges
//! the (fake) payment provider created, and what every caller received. Time is tokio's paused
//! clock, so leases, timeouts and backoff are exact and instant.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Claim, ClaimRequest, OnExpired, Store};
use idem_core::{Error, MemoryStore, Policy, RetryClass, Scope, ToolOptions};
use tokio::time::Instant;

#[path = "shared/protocol.rs"]
mod rig;

use rig::*;

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

/// The wait hook hears a taken-over call twice: when it starts waiting for the dead owner, and
/// when it owns the key and runs the tool (`on_owner`). A joiner and a first call that did not
/// wait never hear `on_owner`.
#[tokio::test(start_paused = true)]
async fn the_wait_hook_hears_a_waiter_become_the_owner() {
    use std::sync::Mutex;

    let heard = Arc::new(Mutex::new(Vec::new()));
    let hook = |heard: &Arc<Mutex<Vec<&'static str>>>| {
        let (w, o) = (Arc::clone(heard), Arc::clone(heard));
        idem_core::WaitHook::new(move |_| w.lock().unwrap().push("waiting"))
            .on_owner(move |_| o.lock().unwrap().push("owner"))
    };
    let store = Arc::new(MemoryStore::new());
    let tool = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    let scope = Scope::run("r");
    crashed_owner(&store, &tool, &scope, &args("cus_1", 4900), OnExpired::TakeOver).await;
    let idem = executor_on(store, policy());
    let run = idem.scope(scope).with_wait_hook(hook(&heard));
    let (got, report) = run.call_reported(&*tool, args("cus_1", 4900)).await;
    assert_eq!(got.unwrap(), "ch_1");
    assert_eq!(report.and_then(|r| r.served), Some(idem_core::Served::TakenOver));
    let taken_over = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(taken_over.last(), Some(&"owner"), "{taken_over:?}");
    assert!(taken_over[..taken_over.len() - 1].iter().all(|h| *h == "waiting"), "{taken_over:?}");
    assert!(!taken_over[..taken_over.len() - 1].is_empty(), "it waited first: {taken_over:?}");

    // A first call and its in-process duplicate (a joiner): "waiting" once, never "owner".
    let tool = PayTool::new(
        RetryClass::Keyed,
        ToolOptions::default(),
        &[],
        Step::Slow(Duration::from_millis(500)),
    );
    let run = executor().run("r").with_wait_hook(hook(&heard));
    let (first, second) =
        tokio::join!(run.call(&*tool, args("cus_2", 1)), run.call(&*tool, args("cus_2", 1)));
    assert_eq!((first.unwrap(), second.unwrap()), ("ch_1".into(), "ch_1".into()));
    assert_eq!(*heard.lock().unwrap(), ["waiting"]);
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

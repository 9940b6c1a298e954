//! The protocol of `docs/design.md` §3 under budgets and backoff, on the in-memory store: no
//! retry storm, the deadline, Retry-After hints, full jitter.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::Store;
use idem_core::{
    BudgetKind, Error, Idem, MemoryStore, Policy, RetryBudget, RetryClass, ToolOptions,
};
use tokio::time::Instant;

#[path = "shared/protocol.rs"]
mod rig;

use rig::*;

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

/// A duplicate that joined a call in this process does not inherit that call's deadline: when
/// the first call's time runs out while it waits for another owner, the duplicate goes on waiting
/// in its own time and receives the owner's result.
#[tokio::test(start_paused = true)]
async fn a_joiner_outlives_the_deadline_of_the_call_it_joined() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a, b) = (executor_on(store.clone(), policy()), executor_on(store, policy()));
    let slow_opts =
        ToolOptions { attempt_timeout: Some(Duration::from_secs(10)), ..Default::default() };
    let owner = PayTool::new(RetryClass::Keyed, slow_opts, &[], Step::Slow(Duration::from_secs(3)));
    let short = ToolOptions { deadline: Some(Duration::from_secs(2)), ..Default::default() };
    let waiter = PayTool::new(RetryClass::Keyed, short, &[], Step::Succeed);

    let owner_call = tokio::spawn({
        let (b, owner) = (b.clone(), Arc::clone(&owner));
        async move { b.run("r").call(&*owner, args("cus_1", 4900)).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let first = tokio::spawn({
        let (a, waiter) = (a.clone(), Arc::clone(&waiter));
        async move { a.run("r").call(&*waiter, args("cus_1", 4900)).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let joiner = tokio::spawn({
        let (a, waiter) = (a.clone(), Arc::clone(&waiter));
        async move { a.run("r").call_reported(&*waiter, args("cus_1", 4900)).await }
    });

    let first = first.await.unwrap();
    assert!(
        matches!(
            first,
            Err(Error::BudgetExhausted { budget: BudgetKind::Deadline, error: None, .. })
        ),
        "the first waiter's own 2 s ran out: {first:?}"
    );
    let (joined, report) = joiner.await.unwrap();
    assert_eq!(joined.unwrap(), "ch_1", "the joiner waited on in its own time");
    assert_eq!(report.unwrap().served, Some(idem_core::Served::Joined));
    assert_eq!(owner_call.await.unwrap().unwrap(), "ch_1");
    assert_eq!((owner.runs(), waiter.runs()), (1, 0), "only the owner ran");
}

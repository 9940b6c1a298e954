//! A tool body that panics: the panic ends its attempt and becomes the caller's error, the key
//! is settled at once (released, or "outcome unknown" for a never tool) instead of staying
//! claimed until its lease ends, and nothing else unwinds.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{Classify, Error, ErrorKind, Failure, Idem, Served, ToolSet, tool};
use idem_tests::wrapped::{Pass, Wrapped};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("declined")]
struct Declined;

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

static CHARGES: AtomicU32 = AtomicU32::new(0);

/// Panics on its first run only; allows three attempts.
#[tool(retry = "keyed", attempts = 3)]
async fn charge(customer: String) -> Result<String, Declined> {
    if CHARGES.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("index out of bounds for {customer}");
    }
    Ok(format!("ch_{customer}"))
}

#[tokio::test(start_paused = true)]
async fn a_keyed_tool_that_panics_is_not_retried_and_its_key_is_free_for_a_repeat() {
    let run = Idem::in_memory().run("r1");
    match charge(&run, "cus_1".into()).await {
        Err(Error::Panicked { tool, attempt, message }) => {
            assert_eq!((tool, attempt), ("charge", 1));
            assert_eq!(message, "index out of bounds for cus_1");
        }
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1, "no retry after a panic");
    let before = Instant::now();
    assert_eq!(charge(&run, "cus_1".into()).await.unwrap(), "ch_cus_1");
    assert_eq!(CHARGES.load(Ordering::SeqCst), 2, "the repeat ran the tool again");
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was free: no lease to wait out");
}

static REFUNDS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "never")]
async fn refund(charge_id: String) -> Result<String, Declined> {
    REFUNDS.fetch_add(1, Ordering::SeqCst);
    panic!("refund of {charge_id} lost its connection mid-write");
}

#[tokio::test(start_paused = true)]
async fn a_never_tool_that_panics_is_outcome_unknown_for_every_repeat() {
    let run = Idem::in_memory().run("r1");
    for _ in 0..3 {
        let result = refund(&run, "ch_1".into()).await;
        assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
    }
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 1, "a never tool runs once, panic or not");
}

static GATED: AtomicU32 = AtomicU32::new(0);
static GATE: Semaphore = Semaphore::const_new(0);

/// Waits for the gate, then panics on its first run.
#[tool(retry = "keyed", lease = "30s")]
async fn send_mail(to: String) -> Result<u32, Declined> {
    let n = GATED.fetch_add(1, Ordering::SeqCst);
    if n == 0 {
        GATE.acquire().await.unwrap().forget();
        panic!("template missing for {to}");
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_on_a_panicking_owner_is_answered_without_waiting_out_the_lease() {
    let run = Idem::in_memory().run("r1");
    let owner = tokio::spawn({
        let run = run.clone();
        async move { send_mail(&run, "a@example.com".into()).await }
    });
    tokio::task::yield_now().await;
    let joiner = tokio::spawn({
        let run = run.clone();
        async move { run.call_reported(&SendMailTool, SendMailArgs::new("a@example.com".into())).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    GATE.add_permits(1);
    let owner = owner.await.expect("the panic did not unwind out of the call");
    assert!(matches!(owner, Err(Error::Panicked { .. })), "{owner:?}");
    let (joined, report) = joiner.await.unwrap();
    // The duplicate in this process shares the owner's failure, as for a transient error: no
    // run of the tool for each waiting duplicate in turn.
    assert!(matches!(joined, Err(Error::Panicked { .. })), "{joined:?}");
    assert_eq!(report.unwrap().served, Some(Served::Joined));
    assert_eq!(GATED.load(Ordering::SeqCst), 1);
    // The key was released at the panic, not left to its lease: the next call runs at once.
    let before = Instant::now();
    let (again, report) =
        run.call_reported(&SendMailTool, SendMailArgs::new("a@example.com".into())).await;
    assert_eq!(again.unwrap(), 1);
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was released, not left to its lease");
    assert_eq!(report.unwrap().served, Some(Served::Executed), "executed, not taken over");
    assert_eq!(GATED.load(Ordering::SeqCst), 2);
}

static DURABLE_CHARGES: AtomicU32 = AtomicU32::new(0);
static DURABLE_REFUNDS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed", attempts = 3)]
async fn charge_durable(customer: String) -> Result<String, Declined> {
    if DURABLE_CHARGES.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("charge of {customer} hit a bug");
    }
    Ok(format!("ch_{customer}"))
}

#[tool(retry = "never")]
async fn refund_durable(charge_id: String) -> Result<String, Declined> {
    DURABLE_REFUNDS.fetch_add(1, Ordering::SeqCst);
    panic!("refund of {charge_id} hit a bug");
}

/// The same through a store the executor treats as any durable one (boxed steps, the store's
/// own release and completion), not the in-memory store's direct path.
#[tokio::test(start_paused = true)]
async fn on_a_durable_store_a_panic_releases_the_key_or_records_the_outcome_unknown() {
    let run = Idem::new(Wrapped::new(Pass)).run("r1");
    let first = charge_durable(&run, "cus_d".into()).await;
    assert!(matches!(first, Err(Error::Panicked { attempt: 1, .. })), "{first:?}");
    let before = Instant::now();
    assert_eq!(charge_durable(&run, "cus_d".into()).await.unwrap(), "ch_cus_d");
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was released, not left to its lease");
    assert_eq!(DURABLE_CHARGES.load(Ordering::SeqCst), 2);

    for _ in 0..3 {
        let result = refund_durable(&run, "ch_d".into()).await;
        assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
    }
    assert_eq!(DURABLE_REFUNDS.load(Ordering::SeqCst), 1);
}

static LOOKUPS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "safe")]
async fn lookup(id: u64) -> Result<u64, Declined> {
    LOOKUPS.fetch_add(1, Ordering::SeqCst);
    let table: Vec<u64> = Vec::new();
    Ok(table[id as usize])
}

#[tokio::test]
async fn a_tool_set_answers_a_panic_with_an_error_result() {
    let set = ToolSet::new().with(LookupTool).unwrap();
    let run = Idem::in_memory().run("r1");
    let result = set.call(&run, "lookup", &serde_json::json!({"id": 3})).await;
    assert!(result.is_error);
    assert_eq!(result.error_kind, Some(ErrorKind::Panicked));
    assert!(
        result.text.starts_with(
            "Error (tool_panicked): tool `lookup` panicked in attempt 1: index out of bounds"
        ),
        "{}",
        result.text
    );
    assert_eq!(LOOKUPS.load(Ordering::SeqCst), 1);
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("rate limited")]
struct Flaky;

impl Classify for Flaky {
    fn classify(&self) -> Failure {
        panic!("classify: no rule for this error yet")
    }
}

static CLASSIFIED: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed", attempts = 3)]
async fn quote(item: String) -> Result<String, Flaky> {
    CLASSIFIED.fetch_add(1, Ordering::SeqCst);
    let _ = item;
    Err(Flaky)
}

/// A panic in the error type's `Classify::classify` (the user's code, as the body is) ends the
/// attempt as a body's panic does: the caller gets `Panicked` naming it, nothing is retried, and
/// the key is free at once instead of staying claimed until its lease ends.
#[tokio::test(start_paused = true)]
async fn a_panic_in_classify_ends_the_attempt_as_a_bodys_panic_does() {
    let run = Idem::in_memory().run("r1");
    match quote(&run, "bolt".into()).await {
        Err(Error::Panicked { tool, attempt, message }) => {
            assert_eq!((tool, attempt), ("quote", 1));
            assert!(message.contains("`Classify::classify` panicked"), "{message}");
            assert!(message.contains("no rule for this error yet"), "{message}");
        }
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert_eq!(CLASSIFIED.load(Ordering::SeqCst), 1, "no retry after the panic");
    let before = Instant::now();
    assert!(matches!(quote(&run, "bolt".into()).await, Err(Error::Panicked { .. })));
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was free: no lease to wait out");
    assert_eq!(CLASSIFIED.load(Ordering::SeqCst), 2);
}

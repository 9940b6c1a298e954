//! A caller that stops a call (`Run::with_stop`: the user pressed Stop, the MCP client sent
//! `notifications/cancelled`) starts nothing more: an attempt in progress finishes and its outcome
//! is stored, no retry and no first attempt after a wait starts, and the key is released for a
//! repeat. Duplicates that joined the stopped call in this process are not stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::store::{MemoryStore, Store};
use idem_core::{Classify, Error, ErrorKind, Failure, Idem, StopSignal, tool};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("rate limited")]
struct RateLimited;

impl Classify for RateLimited {
    fn classify(&self) -> Failure {
        Failure::transient().retry_after(Duration::from_secs(2))
    }
}

/// Waits (on the paused clock) until `runs` counts a first run of its tool.
async fn until_started(runs: &AtomicU32) {
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts `call` and drops it once its tool runs: the key's owner is then dead, and its record
/// stays in flight until the lease ends.
async fn leave_a_dead_owner<F>(runs: &AtomicU32, call: F)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let dead = tokio::spawn(call);
    until_started(runs).await;
    dead.abort();
    let _ = dead.await;
}

static TRANSFERS: AtomicU32 = AtomicU32::new(0);

/// Refused with a 2 s retry-after on its first run (nothing happened), done after.
#[tool(retry = "keyed", attempts = 3)]
async fn transfer(to: String) -> Result<String, RateLimited> {
    if TRANSFERS.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(RateLimited);
    }
    Ok(format!("tr_{to}"))
}

/// Stopped while it waits to retry: no second attempt, `Cancelled` at once, and the key is free:
/// a repeat runs at once (no lease to wait out).
#[tokio::test(start_paused = true)]
async fn a_call_stopped_before_its_retry_starts_no_retry_and_frees_its_key() {
    let run = Idem::in_memory().run("r1");
    let stop = StopSignal::new();
    let call = tokio::spawn({
        let run = run.with_stop(stop.clone());
        async move { transfer(&run, "acct_1".into()).await }
    });
    until_started(&TRANSFERS).await;
    stop.stop();
    let before = Instant::now();
    match call.await.unwrap() {
        Err(Error::Cancelled { tool, attempts }) => assert_eq!((tool, attempts), ("transfer", 1)),
        other => panic!("expected Cancelled, got {other:?}"),
    }
    assert!(before.elapsed() < Duration::from_secs(2), "it did not wait out the retry pause");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(TRANSFERS.load(Ordering::SeqCst), 1, "no attempt after the stop");
    let before = Instant::now();
    assert_eq!(transfer(&run, "acct_1".into()).await.unwrap(), "tr_acct_1");
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was released");
    assert_eq!(TRANSFERS.load(Ordering::SeqCst), 2);
}

static SHIPMENTS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "never")]
async fn ship(order: String) -> Result<String, RateLimited> {
    SHIPMENTS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(format!("sh_{order}"))
}

/// Stopped in the middle of an attempt: the attempt finishes, its outcome is the call's and is
/// stored, and a repeat replays it.
#[tokio::test(start_paused = true)]
async fn an_attempt_in_progress_finishes_and_is_stored() {
    let run = Idem::in_memory().run("r1");
    let stop = StopSignal::new();
    let call = tokio::spawn({
        let run = run.with_stop(stop.clone());
        async move { ship(&run, "o1".into()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(SHIPMENTS.load(Ordering::SeqCst), 1, "the attempt is running");
    stop.stop();
    assert_eq!(call.await.unwrap().unwrap(), "sh_o1");
    assert_eq!(ship(&run, "o1".into()).await.unwrap(), "sh_o1", "replayed");
    assert_eq!(SHIPMENTS.load(Ordering::SeqCst), 1);
}

static REFUNDS: AtomicU32 = AtomicU32::new(0);
static GATE: Semaphore = Semaphore::const_new(0);

/// The first run waits for the gate, then fails (transient, no retry allowed): the key is
/// released with nothing done.
#[tool(retry = "keyed", attempts = 1)]
async fn refund(charge: String) -> Result<String, RateLimited> {
    if REFUNDS.fetch_add(1, Ordering::SeqCst) == 0 {
        GATE.acquire().await.expect("gate").forget();
        return Err(RateLimited);
    }
    Ok(format!("re_{charge}"))
}

/// A call that waits for another process's owner (two runtimes on one store) and is stopped
/// meanwhile does not run the tool when the key comes free: `StoppedWaiting` (kind
/// `stopped_waiting`), and the key is free for the next caller.
#[tokio::test(start_paused = true)]
async fn a_call_stopped_while_it_waits_for_another_owner_runs_nothing() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (a, b) = (Idem::builder_shared(store.clone()).build(), Idem::builder_shared(store).build());
    let owner = tokio::spawn({
        let run = a.run("r1");
        async move { refund(&run, "ch_1".into()).await }
    });
    until_started(&REFUNDS).await;
    let stop = StopSignal::new();
    let waiter = tokio::spawn({
        let run = b.run("r1").with_stop(stop.clone());
        async move { refund(&run, "ch_1".into()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.stop();
    GATE.add_permits(1);
    assert!(owner.await.unwrap().is_err(), "the owner's attempt failed and let go");
    match waiter.await.unwrap() {
        Err(e @ Error::StoppedWaiting { .. }) => {
            assert_eq!(
                (e.kind(), e.kind().as_str()),
                (ErrorKind::StoppedWaiting, "stopped_waiting")
            );
        }
        other => panic!("expected StoppedWaiting, got {other:?}"),
    }
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 1, "the stopped waiter ran nothing");
    let before = Instant::now();
    assert_eq!(refund(&a.run("r1"), "ch_1".into()).await.unwrap(), "re_ch_1");
    assert_eq!(before.elapsed(), Duration::ZERO, "the key is free");
}

static QUOTES: AtomicU32 = AtomicU32::new(0);

/// Refused with a 2 s retry-after on its first run, done after.
#[tool(retry = "keyed", attempts = 3)]
async fn quote(item: String) -> Result<String, RateLimited> {
    if QUOTES.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(RateLimited);
    }
    Ok(format!("q_{item}"))
}

/// A duplicate that joined a call in this process is not stopped with it: the stopped leader
/// ends with `Cancelled`, and the joiner runs the call itself and gets its output.
#[tokio::test(start_paused = true)]
async fn a_joiner_of_a_stopped_call_runs_the_call_itself() {
    let run = Idem::in_memory().run("r1");
    let stop = StopSignal::new();
    let leader = tokio::spawn({
        let run = run.with_stop(stop.clone());
        async move { quote(&run, "i1".into()).await }
    });
    until_started(&QUOTES).await;
    let joiner = tokio::spawn({
        let run = run.clone();
        async move { quote(&run, "i1".into()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.stop();
    assert!(matches!(leader.await.unwrap(), Err(Error::Cancelled { .. })));
    assert_eq!(joiner.await.unwrap().unwrap(), "q_i1");
    assert_eq!(QUOTES.load(Ordering::SeqCst), 2, "the joiner ran the second attempt");
}

static PAYS: AtomicU32 = AtomicU32::new(0);

/// Hangs on its first run (its caller then goes away), instant after.
#[tool(retry = "keyed", lease = "10s")]
async fn pay(to: String) -> Result<String, RateLimited> {
    if PAYS.fetch_add(1, Ordering::SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
    Ok(format!("p_{to}"))
}

/// A call stopped while it waits for a dead owner's lease to end answers at once, and does not
/// take the record over afterwards (which would hold the key up for one more lease): the next
/// caller runs when the dead owner's lease ends.
#[tokio::test(start_paused = true)]
async fn a_call_stopped_while_it_waits_answers_at_once_and_takes_nothing_over() {
    let run = Idem::in_memory().run("r1");
    leave_a_dead_owner(&PAYS, {
        let run = run.clone();
        async move { pay(&run, "bob".into()).await }
    })
    .await;
    let claimed = Instant::now();
    let stop = StopSignal::new();
    let waiter = tokio::spawn({
        let run = run.with_stop(stop.clone());
        async move { pay(&run, "bob".into()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.stop();
    let stopped = waiter.await.unwrap();
    assert!(matches!(stopped, Err(Error::StoppedWaiting { .. })), "{stopped:?}");
    assert!(claimed.elapsed() < Duration::from_secs(1), "the stop was heard during the wait");
    assert_eq!(pay(&run, "bob".into()).await.unwrap(), "p_bob");
    assert!(claimed.elapsed() < Duration::from_secs(11), "only the dead owner's lease was waited");
    assert_eq!(PAYS.load(Ordering::SeqCst), 2);
}

static LAUNCHES: AtomicU32 = AtomicU32::new(0);
static JOINED: Semaphore = Semaphore::const_new(0);

/// Waits for the gate, then done.
#[tool(retry = "keyed")]
async fn launch(site: String) -> Result<String, RateLimited> {
    LAUNCHES.fetch_add(1, Ordering::SeqCst);
    JOINED.acquire().await.expect("gate").forget();
    Ok(format!("l_{site}"))
}

/// A duplicate in this process that joined a running call and is stopped answers at once; the
/// call it joined goes on and its outcome is stored.
#[tokio::test(start_paused = true)]
async fn a_stopped_joiner_answers_at_once_and_the_call_goes_on() {
    let run = Idem::in_memory().run("r1");
    let leader = tokio::spawn({
        let run = run.clone();
        async move { launch(&run, "s1".into()).await }
    });
    until_started(&LAUNCHES).await;
    let stop = StopSignal::new();
    let joiner = tokio::spawn({
        let run = run.with_stop(stop.clone());
        async move { launch(&run, "s1".into()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.stop();
    // Told that the call it joined goes on, not that nothing is stored and a repeat runs.
    let stopped = joiner.await.unwrap().expect_err("stopped");
    let text = stopped.to_string();
    assert!(matches!(stopped, Error::StoppedWaiting { tool: "launch", .. }), "{stopped:?}");
    assert!(text.contains("did not stop that call"), "{text}");
    assert!(text.contains("a repeat gets that call's outcome"), "{text}");
    JOINED.add_permits(1);
    assert_eq!(leader.await.unwrap().unwrap(), "l_s1");
    assert_eq!(launch(&run, "s1".into()).await.unwrap(), "l_s1", "replayed");
    assert_eq!(LAUNCHES.load(Ordering::SeqCst), 1);
}

static SETTLES: AtomicU32 = AtomicU32::new(0);
static SETTLE_FIRST: Semaphore = Semaphore::const_new(0);
static SETTLE_SECOND: Semaphore = Semaphore::const_new(0);

/// The first run waits for its gate and answers "first"; the second waits for its own.
#[tool(retry = "keyed", attempts = 1, lease = "3s")]
async fn settle(invoice: String) -> Result<String, RateLimited> {
    if SETTLES.fetch_add(1, Ordering::SeqCst) == 0 {
        SETTLE_FIRST.acquire().await.expect("gate").forget();
        return Ok(format!("first_{invoice}"));
    }
    SETTLE_SECOND.acquire().await.expect("gate").forget();
    Ok(format!("second_{invoice}"))
}

/// Every lease renewal fails (a store that cannot be reached for them).
struct NoRenewals;

#[async_trait::async_trait]
impl idem_tests::wrapped::Hook for NoRenewals {
    async fn before(&self, op: idem_tests::wrapped::Op<'_>) -> Result<(), idem_core::StoreError> {
        match op {
            idem_tests::wrapped::Op::Renew => {
                Err(idem_core::StoreError::unavailable("renewals are down"))
            }
            _ => Ok(()),
        }
    }
}

/// A call whose attempt ran, but whose lease another process took over meanwhile, waits for the
/// new owner's outcome; stopped during that wait, it must not say that it ran nothing
/// (`Cancelled { attempts: 0 }`): its tool did run, and the key is the other owner's.
#[tokio::test(start_paused = true)]
async fn a_call_stopped_after_its_attempt_ran_does_not_say_it_ran_nothing() {
    let memory = Arc::new(MemoryStore::new());
    let a = Idem::new(idem_tests::wrapped::Wrapped::over(memory.clone(), NoRenewals));
    let b = Idem::builder_shared(memory).build();
    let stop = StopSignal::new();
    let first = tokio::spawn({
        let run = a.run("r1").with_stop(stop.clone());
        async move { settle(&run, "inv_1".into()).await }
    });
    until_started(&SETTLES).await;
    // The first owner's lease ends unrenewed; another process takes the key over.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let second = tokio::spawn({
        let run = b.run("r1");
        async move { settle(&run, "inv_1".into()).await }
    });
    while SETTLES.load(Ordering::SeqCst) == 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first attempt ends: its outcome is refused (lease lost), and it waits for the new owner.
    SETTLE_FIRST.add_permits(1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.stop();
    let first = tokio::time::timeout(Duration::from_secs(1), first)
        .await
        .expect("the stop was heard")
        .unwrap();
    assert!(
        matches!(first, Err(Error::LeaseLost { .. })),
        "its tool ran once, and the key is another owner's: {first:?}"
    );
    SETTLE_SECOND.add_permits(1);
    assert_eq!(second.await.unwrap().unwrap(), "second_inv_1");
    assert_eq!(SETTLES.load(Ordering::SeqCst), 2);
}

static RENEWS: AtomicU32 = AtomicU32::new(0);

/// Hangs on its first run (its caller then goes away), instant after.
#[tool(retry = "keyed", lease = "10s")]
async fn renew_plan(plan: String) -> Result<String, RateLimited> {
    if RENEWS.fetch_add(1, Ordering::SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
    Ok(format!("rp_{plan}"))
}

/// A call whose signal was stopped before it started (a signal reused after a stop, a server
/// shutting down) finds a dead owner's expired lease: it runs nothing, and it does not take the
/// record over either, which would hold the key up for one more lease with nothing running.
#[tokio::test(start_paused = true)]
async fn a_call_stopped_before_it_starts_takes_no_dead_owners_record_over() {
    let run = Idem::in_memory().run("r1");
    leave_a_dead_owner(&RENEWS, {
        let run = run.clone();
        async move { renew_plan(&run, "pro".into()).await }
    })
    .await;
    // The dead owner's lease ends.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let stop = StopSignal::new();
    stop.stop();
    let stopped = renew_plan(&run.with_stop(stop), "pro".into()).await;
    assert!(matches!(stopped, Err(Error::Cancelled { attempts: 0, .. })), "{stopped:?}");
    let before = Instant::now();
    assert_eq!(renew_plan(&run, "pro".into()).await.unwrap(), "rp_pro");
    assert_eq!(before.elapsed(), Duration::ZERO, "no lease taken by the stopped call to wait out");
    assert_eq!(RENEWS.load(Ordering::SeqCst), 2);
}

static INVOICES: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn invoice(order: String) -> Result<String, RateLimited> {
    INVOICES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("inv_{order}"))
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("the bank's answer was lost")]
struct AnswerLost;

impl Classify for AnswerLost {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

static WIRES: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "never")]
async fn wire(to: String) -> Result<String, AnswerLost> {
    WIRES.fetch_add(1, Ordering::SeqCst);
    let _ = to;
    Err(AnswerLost)
}

/// A call whose signal was stopped before it started (a signal reused after a stop, a server
/// shutting down) for a key whose outcome is stored starts nothing by answering it: it gets the
/// stored output, the stored "outcome unknown", the refusal of a caller's key reused with other
/// arguments, as any other repeat does. `Cancelled` there would say that nothing is stored and a
/// repeat runs the tool, which is false (and a never tool's caller would read it as "not done").
#[tokio::test]
async fn a_call_stopped_before_it_starts_answers_what_is_stored_for_its_key() {
    let run = Idem::in_memory().run("r1");
    let stop = StopSignal::new();
    stop.stop();
    let stopped = run.with_stop(stop.clone());

    assert_eq!(invoice(&run, "o1".into()).await.unwrap(), "inv_o1");
    assert_eq!(invoice(&stopped, "o1".into()).await.unwrap(), "inv_o1", "replayed");
    assert_eq!(INVOICES.load(Ordering::SeqCst), 1);

    let first = wire(&run, "acct".into()).await;
    assert!(matches!(first, Err(Error::OutcomeUnknown { .. })), "{first:?}");
    let again = wire(&stopped, "acct".into()).await;
    assert!(matches!(again, Err(Error::OutcomeUnknown { .. })), "{again:?}");
    assert_eq!(WIRES.load(Ordering::SeqCst), 1);

    let keyed = run.with_idempotency_key("inv-7");
    assert_eq!(invoice(&keyed, "o7".into()).await.unwrap(), "inv_o7");
    let other = invoice(&keyed.with_stop(stop.clone()), "o8".into()).await;
    assert!(matches!(other, Err(Error::KeyReuseMismatch { .. })), "{other:?}");

    // Nothing stored for the key: nothing run, nothing claimed.
    let fresh = invoice(&stopped, "o9".into()).await;
    assert!(matches!(fresh, Err(Error::Cancelled { attempts: 0, .. })), "{fresh:?}");
    assert_eq!(invoice(&run, "o9".into()).await.unwrap(), "inv_o9");
    assert_eq!(INVOICES.load(Ordering::SeqCst), 3);
}

/// Rate limited for a minute (nothing happened).
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("rate limited for a minute")]
struct LimitedForAMinute;

impl Classify for LimitedForAMinute {
    fn classify(&self) -> Failure {
        Failure::transient().retry_after(Duration::from_secs(60))
    }
}

static BOOKINGS: AtomicU32 = AtomicU32::new(0);

/// Takes 1 s; rate limited for a minute on its first run, done after, saying which attempt of
/// its call answered.
#[tool(retry = "keyed", attempts = 2, timeout = "10s")]
async fn book(cx: &idem_core::Ctx, room: String) -> Result<String, LimitedForAMinute> {
    let first = BOOKINGS.fetch_add(1, Ordering::SeqCst) == 0;
    tokio::time::sleep(Duration::from_secs(1)).await;
    if first {
        return Err(LimitedForAMinute);
    }
    Ok(format!("bk_{room} on attempt {}", cx.attempt()))
}

/// A joiner that takes over a stopped call 20 s after it joined gets a whole attempt of its own:
/// the 10 s attempt timeout counts from when its attempt starts, not from when the joiner
/// started waiting. Counted from then, its first attempt "timed out" the moment it started (an
/// ambiguous failure: the body was already running), and the tool ran once more for nothing.
#[tokio::test(start_paused = true)]
async fn a_joiner_that_takes_over_a_stopped_call_gets_its_whole_attempt_timeout() {
    let run = Idem::in_memory().run("r1");
    let stop = StopSignal::new();
    let leader = tokio::spawn({
        let run = run.with_stop(stop.clone());
        async move { book(&run, "101".into()).await }
    });
    until_started(&BOOKINGS).await;
    let joiner = tokio::spawn({
        let run = run.clone();
        async move { book(&run, "101".into()).await }
    });
    // The leader's attempt fails after 1 s and it pauses for its minute; stopped meanwhile.
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.stop();
    assert!(matches!(leader.await.unwrap(), Err(Error::Cancelled { attempts: 1, .. })));
    assert_eq!(joiner.await.unwrap().unwrap(), "bk_101 on attempt 1");
    assert_eq!(BOOKINGS.load(Ordering::SeqCst), 2, "the leader's attempt and the joiner's");
}

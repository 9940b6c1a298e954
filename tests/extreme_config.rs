//! Configuration at its extremes, through the public API: zero and `Duration::MAX` in the
//! policy, and a store that reports them. Each case says what the caller receives and how many
//! times the tool ran; none may panic, hang, or let a duplicate run beside its owner.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::store::{Claim, Store, StoreError};
use idem_core::{Idem, MemoryStore, tool};
use idem_tests::Never;
use idem_tests::wrapped::{Hook, Op, Wrapped};

static SLOW_RUNS: AtomicU32 = AtomicU32::new(0);

/// Works for 300 ms: long enough for a duplicate to arrive while it runs.
#[tool(retry = "keyed")]
async fn slow_charge(tag: String) -> Result<String, Never> {
    SLOW_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(format!("ch_{tag}"))
}

/// Over the in-memory store, reports every lease in flight as `Duration::MAX` long: a store of
/// someone's own may say "no end" that way.
struct EndlessLeases;

#[async_trait::async_trait]
impl Hook for EndlessLeases {
    async fn before(&self, _: Op<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    fn claimed(&self, claim: Claim) -> Claim {
        match claim {
            Claim::InFlight { fence, .. } => {
                Claim::InFlight { fence, lease_remaining: Duration::MAX }
            }
            other => other,
        }
    }
}

/// A duplicate that finds the key in flight under a lease of `Duration::MAX` waits for the owner
/// (bounded by its deadline) and joins its outcome. It used to panic adding a millisecond of
/// slack to that lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_on_a_lease_the_store_reports_as_endless() {
    let store: Arc<dyn Store> = Arc::new(Wrapped::new(EndlessLeases));
    // Two executors on one store, as two processes: the second cannot join in process.
    let (a, b) = (Idem::builder_shared(store.clone()).build(), Idem::builder_shared(store).build());
    let before = SLOW_RUNS.load(Ordering::SeqCst);
    let first = tokio::spawn(async move { slow_charge(&a.run("endless"), "1".into()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn(async move { slow_charge(&b.run("endless"), "1".into()).await });
    assert_eq!(first.await.expect("the owner must not panic").unwrap(), "ch_1");
    assert_eq!(second.await.expect("the duplicate must not panic").unwrap(), "ch_1");
    assert_eq!(SLOW_RUNS.load(Ordering::SeqCst) - before, 1, "the duplicate joined; one run");
}

static LEASED_RUNS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn leased_charge(tag: String) -> Result<String, Never> {
    LEASED_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(format!("ch_{tag}"))
}

/// A policy lease of zero is raised to `MIN_LEASE`, which the owner keeps renewing while it
/// works: a duplicate from another executor waits and joins. Raised only to 1 ms, the lease
/// lapsed between renewals and the duplicate took the key over and ran the tool beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_lease_still_keeps_a_duplicate_out() {
    let policy = idem_core::Policy { lease: Duration::ZERO, ..idem_core::Policy::default() };
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let executor = || Idem::builder_shared(store.clone()).policy(policy).build();
    let (a, b) = (executor(), executor());
    let first = tokio::spawn(async move { leased_charge(&a.run("zero-lease"), "1".into()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn(async move { leased_charge(&b.run("zero-lease"), "1".into()).await });
    assert_eq!(first.await.unwrap().unwrap(), "ch_1");
    assert_eq!(second.await.unwrap().unwrap(), "ch_1");
    assert_eq!(LEASED_RUNS.load(Ordering::SeqCst), 1, "the duplicate ran beside its owner");
}

/// A store that answers each operation after 20 ms, as one across a slow network.
struct Slow;

#[async_trait::async_trait]
impl Hook for Slow {
    async fn before(&self, _: Op<'_>) -> Result<(), StoreError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }
}

/// A store timeout of zero fails every claim closed (nothing runs), and the error names the
/// setting, so the misconfiguration is found from the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_store_timeout_fails_closed_and_names_the_setting() {
    let policy =
        idem_core::Policy { store_timeout: Duration::ZERO, ..idem_core::Policy::default() };
    let store = Arc::new(Wrapped::new(Slow));
    let idem = Idem::builder_shared(store).policy(policy).build();
    let before = LEASED_RUNS.load(Ordering::SeqCst);
    match leased_charge(&idem.run("zero-store-timeout"), "z".into()).await {
        Err(idem_core::Error::StoreUnavailable { source, .. }) => {
            // The store error and its causes, as a log line shows them.
            let said = idem_core::ErrorChain(&source).to_string();
            assert!(said.contains("Policy::store_timeout"), "{said}");
        }
        other => panic!("a zero store timeout fails closed, got {other:?}"),
    }
    assert_eq!(LEASED_RUNS.load(Ordering::SeqCst), before, "the tool did not run");
}

static DUE_RUNS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn due_charge(tag: String) -> Result<String, Never> {
    DUE_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(format!("ch_{tag}"))
}

/// A call whose deadline has passed when a claim is due ends as a passed deadline does
/// everywhere else, `BudgetExhausted` naming the deadline, and the tool does not run: a zero
/// deadline on a store elsewhere (as on the in-memory store), and a duplicate that waited out its
/// deadline for another owner. Both answered `StoreUnavailable` ("the store did not answer the
/// claim within 0ns") after a claim sent with no time left: a dashboard saw a store outage in a
/// spent budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_due_after_the_deadline_is_a_passed_deadline() {
    let zero = idem_core::Policy { deadline: Duration::ZERO, ..idem_core::Policy::default() };
    for store in [Arc::new(Wrapped::new(Slow)) as Arc<dyn Store>, Arc::new(MemoryStore::new())] {
        let idem = Idem::builder_shared(store).policy(zero).build();
        let before = DUE_RUNS.load(Ordering::SeqCst);
        match due_charge(&idem.run("zero-deadline"), "d".into()).await {
            Err(idem_core::Error::BudgetExhausted {
                budget: idem_core::BudgetKind::Deadline,
                ..
            }) => {}
            other => panic!("a zero deadline has passed, got {other:?}"),
        }
        assert_eq!(DUE_RUNS.load(Ordering::SeqCst), before, "the tool did not run");
    }

    // Another executor on the same store, as another process: it waits for the owner (300 ms of
    // work) with a deadline of 100 ms.
    let store: Arc<dyn Store> = Arc::new(Wrapped::new(Slow));
    let owner = Idem::builder_shared(store.clone()).build();
    let hasty =
        idem_core::Policy { deadline: Duration::from_millis(100), ..idem_core::Policy::default() };
    let duplicate = Idem::builder_shared(store).policy(hasty).build();
    let before = DUE_RUNS.load(Ordering::SeqCst);
    let first = tokio::spawn(async move { due_charge(&owner.run("waited-out"), "w".into()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    match due_charge(&duplicate.run("waited-out"), "w".into()).await {
        Err(idem_core::Error::BudgetExhausted {
            budget: idem_core::BudgetKind::Deadline, ..
        }) => {}
        other => panic!("the duplicate's deadline passed while it waited, got {other:?}"),
    }
    assert_eq!(first.await.unwrap().unwrap(), "ch_w");
    assert_eq!(DUE_RUNS.load(Ordering::SeqCst) - before, 1, "the owner ran it once");
}

static CUT_RUNS: AtomicU32 = AtomicU32::new(0);

/// Works for 40 ms.
#[tool(retry = "keyed")]
async fn quick_charge(tag: String) -> Result<String, Never> {
    CUT_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(40)).await;
    Ok(format!("ch_{tag}"))
}

/// A duplicate woken by the owner's completion with 15 ms of its deadline left, on a store that
/// takes 20 ms per step: the claim after the wait runs out of deadline. That is the budget spent
/// waiting, as when the wait itself reaches the deadline: `BudgetExhausted` naming the deadline,
/// not `StoreUnavailable` ("the store did not answer the claim within 15ms"), which depended on
/// whether the wake came a moment before the deadline or at it. On tokio's paused clock, so the
/// timeline is the program's own: the owner claims at 0-20 ms, works to 60 ms and completes at
/// 80 ms; the duplicate starts at 5 ms with a 90 ms deadline (95 ms), waits from 25 ms, claims
/// again at 80 ms.
#[tokio::test(start_paused = true)]
async fn a_claim_after_a_wait_that_the_deadline_cuts_short_is_a_passed_deadline() {
    let store: Arc<dyn Store> = Arc::new(Wrapped::new(Slow));
    let owner = Idem::builder_shared(store.clone()).build();
    let hasty =
        idem_core::Policy { deadline: Duration::from_millis(90), ..idem_core::Policy::default() };
    let duplicate = Idem::builder_shared(store).policy(hasty).build();
    let first = tokio::spawn(async move { quick_charge(&owner.run("cut"), "c".into()).await });
    tokio::time::sleep(Duration::from_millis(5)).await;
    match quick_charge(&duplicate.run("cut"), "c".into()).await {
        Err(idem_core::Error::BudgetExhausted {
            budget: idem_core::BudgetKind::Deadline, ..
        }) => {}
        other => panic!("the deadline ran out in the claim after the wait, got {other:?}"),
    }
    assert_eq!(first.await.unwrap().unwrap(), "ch_c");
    assert_eq!(CUT_RUNS.load(Ordering::SeqCst), 1, "the owner ran it once");
}

/// A store whose lease renewals take 4 s to answer (within the 5 s store timeout): one across a
/// congested network, or a pool whose connections are all busy.
struct SlowRenewals;

#[async_trait::async_trait]
impl Hook for SlowRenewals {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        if matches!(op, Op::Renew) {
            tokio::time::sleep(Duration::from_secs(4)).await;
        }
        Ok(())
    }
}

/// Works for 2.5 s, renewing its 3 s lease every second.
#[tool(retry = "keyed", lease = "3s")]
async fn steady_charge(tag: String) -> Result<String, Never> {
    tokio::time::sleep(Duration::from_millis(2500)).await;
    Ok(format!("ch_{tag}"))
}

/// A renewal slow to answer runs beside the work it renews: the call answers when its work ends
/// (2.5 s), not when the renewal in progress then does (5 s). Timed on tokio's paused clock, so
/// the durations are the program's own, not the machine's.
#[tokio::test(start_paused = true)]
async fn a_slow_renewal_does_not_hold_up_the_work_it_renews() {
    let store = Arc::new(Wrapped::new(SlowRenewals));
    let idem = Idem::builder_shared(store).build();
    let started = tokio::time::Instant::now();
    let charged = steady_charge(&idem.run("slow-renewals"), "1".into()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(charged, "ch_1");
    assert!(took < Duration::from_secs(3), "answered {took:?} after the start, not at 2.5 s");
}

static LIMITED_RUNS: AtomicU32 = AtomicU32::new(0);

/// Rate limited on its first attempt ("retry after 1.5 s"), then charges; its lease of 3 s is
/// renewed every second, so one renewal falls inside the pause.
#[tool(retry = "keyed", lease = "3s")]
async fn limited_charge(tag: String) -> Result<String, idem_core::ToolFailure> {
    if LIMITED_RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(idem_core::ToolFailure::transient("rate limited")
            .retry_after(Duration::from_millis(1500)));
    }
    Ok(format!("ch_{tag}"))
}

/// A renewal slow to answer runs beside the pause before a retry too, as beside an attempt: the
/// retry starts when the provider's retry-after ends (1.5 s), not when the renewal in progress
/// then answers (5 s), which could also push it past the call's deadline.
#[tokio::test(start_paused = true)]
async fn a_slow_renewal_does_not_stretch_the_pause_before_a_retry() {
    let store = Arc::new(Wrapped::new(SlowRenewals));
    let idem = Idem::builder_shared(store).build();
    let started = tokio::time::Instant::now();
    let charged = limited_charge(&idem.run("slow-renewals-pause"), "1".into()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(charged, "ch_1");
    assert_eq!(LIMITED_RUNS.load(Ordering::SeqCst), 2, "one retry");
    assert!(took < Duration::from_secs(2), "answered {took:?} after the start, not at 1.5 s");
}

/// A store that answers every lease renewal "lease lost" (the record was taken over under a
/// higher fence), counting them.
#[derive(Default)]
struct RenewalsLost(AtomicU32);

#[async_trait::async_trait]
impl Hook for RenewalsLost {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        if matches!(op, Op::Renew) {
            self.0.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::LeaseLost);
        }
        Ok(())
    }
}

/// Works for 30 s under a lease of 3 s, renewed every second.
#[tool(retry = "keyed", lease = "3s", timeout = "1m")]
async fn long_charge(tag: String) -> Result<String, Never> {
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(format!("ch_{tag}"))
}

/// A fence the store refused as taken over never becomes current again (fences only increase):
/// the call stops renewing it, instead of asking the store the same question every third of a
/// lease (and logging a warning each time) for as long as its work goes on.
#[tokio::test(start_paused = true)]
async fn a_renewal_refused_as_lease_lost_is_not_sent_again() {
    let store = Arc::new(Wrapped::new(RenewalsLost::default()));
    let idem = Idem::builder_shared(store.clone()).build();
    let _ = long_charge(&idem.run("renewals-lost"), "1".into()).await;
    assert_eq!(store.hook.0.load(Ordering::SeqCst), 1, "one renewal refused, none after it");
}

/// Rate limited for 2.5 s of its 3 s deadline; a 3 s lease.
#[tool(retry = "keyed", lease = "3s", deadline = "3s")]
async fn deadline_charge(tag: String) -> Result<String, idem_core::ToolFailure> {
    let _ = tag;
    Err(idem_core::ToolFailure::transient("rate limited").retry_after(Duration::from_millis(2500)))
}

/// A retry whose pause ended at the deadline or just past it (a timer fires on the next
/// millisecond; the lease had to be confirmed first, and the store was slow to answer) makes no
/// attempt, and the caller hears why as when the pause would have ended past the deadline: the
/// deadline, with the tool's last error and its retry-after hint. Not a bare "deadline passed"
/// with no error, which also reads to in-process duplicates as a call that failed at nothing.
#[tokio::test(start_paused = true)]
async fn a_pause_that_ends_past_the_deadline_still_reports_the_tools_last_error() {
    let store = Arc::new(Wrapped::new(SlowRenewals));
    let idem = Idem::builder_shared(store).build();
    match deadline_charge(&idem.run("pause-past-deadline"), "1".into()).await {
        Err(idem_core::Error::BudgetExhausted {
            budget: idem_core::BudgetKind::Deadline,
            error: Some(error),
            retry_after: Some(after),
            ..
        }) => {
            assert_eq!(error.message(), "rate limited");
            assert_eq!(after, Duration::from_millis(2500));
        }
        other => panic!("the deadline, with the tool's error and hint: {other:?}"),
    }
}

static LOST_THEN_LIMITED_RUNS: AtomicU32 = AtomicU32::new(0);

/// Works for 1.5 s under a lease of 3 s (one renewal falls inside), then is rate limited for
/// 2 s (another would fall inside the pause); its retry charges.
#[tool(retry = "keyed", lease = "3s", timeout = "1m")]
async fn lost_then_limited(tag: String) -> Result<String, idem_core::ToolFailure> {
    if LOST_THEN_LIMITED_RUNS.fetch_add(1, Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        return Err(
            idem_core::ToolFailure::transient("rate limited").retry_after(Duration::from_secs(2))
        );
    }
    Ok(format!("ch_{tag}"))
}

/// A fence the store refused as taken over during an attempt is not renewed again during the
/// pause that follows, nor "confirmed" again before the retry: the store's answer cannot change
/// (fences only increase). The call goes straight to the new owner's key.
#[tokio::test(start_paused = true)]
async fn a_fence_refused_during_an_attempt_is_not_renewed_in_the_pause_after_it() {
    let store = Arc::new(Wrapped::new(RenewalsLost::default()));
    let idem = Idem::builder_shared(store.clone()).build();
    let got = lost_then_limited(&idem.run("lost-then-limited"), "1".into()).await;
    assert_eq!(got.unwrap(), "ch_1");
    assert_eq!(LOST_THEN_LIMITED_RUNS.load(Ordering::SeqCst), 2);
    assert_eq!(store.hook.0.load(Ordering::SeqCst), 1, "one renewal refused, none after it");
}

/// The store refuses the outcome (after the claim succeeded) with a refusal waiting does not
/// mend: its file found damaged, or its configuration refused (a privilege revoked mid-run).
struct FinalOnComplete(fn() -> StoreError);

#[async_trait::async_trait]
impl Hook for FinalOnComplete {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        if matches!(op, Op::Complete { .. }) {
            return Err((self.0)());
        }
        Ok(())
    }
}

static DAMAGED_RUNS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn damaged_charge(tag: String) -> Result<String, Never> {
    DAMAGED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("ch_{tag}"))
}

/// A store found damaged mid-call (or refusing its configuration): the charge ran, and its
/// caller gets it. Waiting does not mend either, so the outcome is not queued to be sent again
/// in the background "while the store is away" (which a process about to exit would then wait
/// for).
#[tokio::test(start_paused = true)]
async fn a_store_found_damaged_after_the_claim_is_not_sent_the_outcome_again() {
    let refusals: [fn() -> StoreError; 2] = [
        || {
            StoreError::Damaged(
                "the SQLite database is damaged (database disk image is malformed); restore it \
                 from a backup"
                    .into(),
            )
        },
        || StoreError::InvalidConfig("permission denied for table idem_records".into()),
    ];
    for (i, refusal) in refusals.into_iter().enumerate() {
        let store = Arc::new(Wrapped::new(FinalOnComplete(refusal)));
        let idem = Idem::builder_shared(store).build();
        let charged = damaged_charge(&idem.run("damaged-mid-call"), i.to_string()).await;
        assert_eq!(charged.unwrap(), format!("ch_{i}"), "the effect happened: the caller gets it");
        assert_eq!(idem.late_completions(), 0, "{i}: nothing queued for a store that cannot heal");
    }
    assert_eq!(DAMAGED_RUNS.load(Ordering::SeqCst), 2);
}

static MAILS: AtomicU32 = AtomicU32::new(0);

/// Sends a mail: its request is under way after the first poll, answered 5 ms later.
#[tool(retry = "never")]
async fn send_mail(to: String) -> Result<String, Never> {
    MAILS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(format!("sent to {to}"))
}

/// A per-attempt timeout of zero (written as "no timeout", which is what zero means in many
/// clients) is refused before anything runs, and the error names the setting, as
/// `#[tool(timeout = "0s")]` is refused at compile time. Taken as given, every attempt timed out
/// the moment it started: a `never` tool's body had already sent its request, and its outcome
/// was recorded unknown for good, so every repeat answered "outcome unknown" too.
#[tokio::test(start_paused = true)]
async fn a_zero_attempt_timeout_runs_nothing_and_names_the_setting() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let zero =
        idem_core::Policy { attempt_timeout: Duration::ZERO, ..idem_core::Policy::default() };
    let idem = Idem::builder_shared(store.clone()).policy(zero).build();
    match send_mail(&idem.run("zero-attempt-timeout"), "ops".into()).await {
        Err(idem_core::Error::StoreUnavailable {
            source: StoreError::InvalidConfig(why), ..
        }) => {
            assert!(why.contains("Policy::attempt_timeout"), "{why}");
        }
        other => panic!("a zero attempt timeout is refused, got {other:?}"),
    }
    assert_eq!(MAILS.load(Ordering::SeqCst), 0, "the tool did not run");
    // Nothing was recorded: with the setting fixed, the mail goes out.
    let fixed = Idem::builder_shared(store).build();
    let sent = send_mail(&fixed.run("zero-attempt-timeout"), "ops".into()).await;
    assert_eq!(sent.unwrap(), "sent to ops");
    assert_eq!(MAILS.load(Ordering::SeqCst), 1);
}

static WIRES: AtomicU32 = AtomicU32::new(0);

/// Wires money: nobody can deduplicate it.
#[tool(retry = "never")]
async fn wire(to: String) -> Result<String, Never> {
    WIRES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("wired to {to}"))
}

/// A retention of zero for results (written as "keep forever", which is what zero means to
/// memcached and many caches), or of a moment (a nanosecond, a millisecond: written for tests,
/// or as a unit mistaken), is refused before anything runs, and the error names the setting, as
/// `#[tool(ttl = "0s")]` and `ttl = "1ms"` are refused at compile time. Taken as given, the
/// result expired before the repeat came, and every repeat of a `never` tool's call ran its
/// effect again.
#[tokio::test(start_paused = true)]
async fn a_retention_under_a_second_runs_nothing_and_names_the_setting() {
    let shortest = idem_core::MIN_TTL - Duration::from_nanos(1);
    for ttl in [Duration::ZERO, Duration::from_nanos(1), Duration::from_millis(1), shortest] {
        let policy = idem_core::Policy { ttl, ..idem_core::Policy::default() };
        let idem = Idem::builder(MemoryStore::new()).policy(policy).build();
        let run = idem.run("short-ttl");
        for _ in 0..2 {
            match wire(&run, "acct_1".into()).await {
                Err(idem_core::Error::StoreUnavailable {
                    source: StoreError::InvalidConfig(why),
                    ..
                }) => assert!(why.contains("Policy::ttl") && why.contains("1 s"), "{why}"),
                other => panic!("a retention of {ttl:?} is refused, got {other:?}"),
            }
        }
    }
    assert_eq!(WIRES.load(Ordering::SeqCst), 0, "nothing was wired");
    // At the shortest, a repeat within it replays.
    let policy = idem_core::Policy { ttl: idem_core::MIN_TTL, ..idem_core::Policy::default() };
    let run = Idem::builder(MemoryStore::new()).policy(policy).build().run("shortest-ttl");
    for _ in 0..2 {
        assert_eq!(wire(&run, "acct_1".into()).await.unwrap(), "wired to acct_1");
    }
    assert_eq!(WIRES.load(Ordering::SeqCst), 1, "wired once");
}

/// A store whose wait returns at once (a wait is only a hint), counting claims.
struct ImpatientWaits(AtomicU32);

#[async_trait::async_trait]
impl Hook for ImpatientWaits {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        if let Op::Claim(_) = op {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
    fn waits(&self) -> bool {
        false
    }
}

static REFUNDS: AtomicU32 = AtomicU32::new(0);

/// Works for 300 ms: long enough for a duplicate from another worker to wait on it.
#[tool(retry = "keyed")]
async fn slow_refund(tag: String) -> Result<String, Never> {
    REFUNDS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(format!("re_{tag}"))
}

/// A duplicate from another worker, on a store whose wait returns at once, gets the owner's
/// result without claiming in a busy loop meanwhile: the waits that return while the owner still
/// holds the key are spaced by a growing pause. Before, the loop never yielded, so an owner
/// polled by the same task (joined futures, a current-thread runtime) never ran again: its lease
/// ended unrenewed, and the duplicate took the key over and refunded a second time.
#[tokio::test]
async fn a_store_whose_wait_returns_at_once_is_not_claimed_in_a_busy_loop() {
    let store = Arc::new(Wrapped::new(ImpatientWaits(AtomicU32::new(0))));
    let (a, b) =
        (Idem::builder_shared(store.clone()).build(), Idem::builder_shared(store.clone()).build());
    let (run_a, run_b) = (a.run("impatient"), b.run("impatient"));
    let owner = slow_refund(&run_a, "1".into());
    let duplicate = async {
        // Once the owner holds the key.
        tokio::time::sleep(Duration::from_millis(20)).await;
        slow_refund(&run_b, "1".into()).await
    };
    let (owner, duplicate) = tokio::join!(owner, duplicate);
    assert_eq!(owner.unwrap(), "re_1");
    assert_eq!(duplicate.unwrap(), "re_1", "the duplicate gets the owner's result");
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 1, "the refund ran once");
    let claims = store.hook.0.load(Ordering::SeqCst);
    assert!(claims < 50, "the duplicate claimed {claims} times while the owner ran");
}

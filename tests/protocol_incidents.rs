//! The protocol of `docs/design.md` §3 in the incidents it exists for, on the in-memory store:
//! the double charge, a thousand duplicates, and fencing a paused worker out.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::Store;
use idem_core::{Idem, MemoryStore, Policy, RetryClass, Served, ToolOptions};

#[path = "shared/protocol.rs"]
mod rig;

use rig::*;

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
    let (a, b) = two_workers();
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
    let (a, b) = two_workers();
    // Worker A's first attempt charges slowly; worker B's succeeds at once.
    let slow = slow_charge();
    let fast = PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[], Step::Succeed);
    // A's provider already has a charge, so A's own charge is "ch_2", B's is "ch_1".
    slow.provider.charge(None);

    let run_a = a.run("r");
    let worker_a = run_a.call_reported(&*slow, args("cus_1", 4900));
    let mut worker_a = std::pin::pin!(worker_a);
    // Poll A until its tool body started, then stop polling it: A is "paused" (no renewals).
    until_started(&mut worker_a, &slow.started, "A").await;
    tokio::time::sleep(policy().lease + Duration::from_secs(1)).await;

    let b_result = b.run("r").call(&*fast, args("cus_1", 4900)).await;
    assert_eq!(b_result.unwrap(), "ch_1", "B took over the expired lease");

    // A resumes; its charge happens (its own provider) but it cannot store its result over B's:
    // its caller receives the result that stands, B's.
    let (a_result, a_report) = worker_a.await;
    assert_eq!(
        a_result.unwrap(),
        "ch_1",
        "A's caller gets the new owner's result, not its own ch_2"
    );
    assert_eq!(
        a_report.unwrap().served,
        Some(Served::Executed),
        "A ran its tool: its answer is not labelled a replay"
    );
    assert_eq!(slow.charges(), 2, "A's own charge did happen (in its provider)");

    // The record holds B's result.
    let replay = b.run("r").call(&*fast, args("cus_1", 4900)).await.unwrap();
    assert_eq!(replay, "ch_1");
    let replay_a = a.run("r").call(&*slow, args("cus_1", 4900)).await.unwrap();
    assert_eq!(replay_a, "ch_1", "A's executor replays B's result too");
    assert_eq!((fast.runs(), slow.runs()), (1, 1));
}

/// A worker paused between two attempts past its lease (a stalled process, a long retry-after
/// whose renewals could not run) must not start its next attempt beside the owner that took the
/// key over: a lease-based lock whose holder went on acting after it expired is the fault that
/// fencing exists to stop. It waits for the new owner's outcome instead.
#[tokio::test(start_paused = true)]
async fn a_worker_paused_between_attempts_past_its_lease_does_not_retry_beside_the_new_owner() {
    let (a, b) = two_workers();
    // A's first attempt fails before sending; its retry would succeed.
    let flaky = flaky_charge();
    let slow = slow_charge();
    // A runs until its first attempt failed, pauses past its lease; B takes the key over with
    // a slow charge; A resumes while B runs.
    let (a_result, b_result) = paused_worker_and_new_owner(&a, &b, &flaky, &slow).await;
    assert_eq!(b_result.unwrap(), "ch_1");
    assert_eq!(flaky.runs(), 1, "A did not run a second attempt beside B");
    assert_eq!(a_result.unwrap(), "ch_1", "A's caller gets the outcome of the new owner");
    assert_eq!(slow.runs(), 1);
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
// Duplicates of a call that fails without a stored outcome share its failure (no retry storm).

#[tokio::test(start_paused = true)]
async fn duplicates_in_memory_share_a_transient_failure_instead_of_running_in_turn() {
    for idem in [executor(), Idem::in_memory()] {
        // Each attempt fails before sending; the executor retries it, then gives up.
        let tool = PayTool::new(
            RetryClass::Keyed,
            ToolOptions { attempts: Some(2), ..Default::default() },
            &[],
            Step::Transient,
        );
        let run = idem.run("r");
        let calls = (0..20).map(|_| run.call_reported(&*tool, args("cus_1", 4900)));
        let results = futures_util::future::join_all(calls).await;
        assert_eq!(tool.runs(), 2, "the first call's two attempts, and nobody else's");
        let joined = results
            .iter()
            .filter(|(_, report)| report.as_ref().unwrap().served == Some(Served::Joined))
            .count();
        assert_eq!(joined, 19, "the other 19 joined it");
        for (result, _) in &results {
            assert!(
                matches!(result, Err(idem_core::Error::Tool { .. })),
                "every caller receives the failure: {result:?}"
            );
        }
        // Shared, not stored: a later call tries again.
        let _ = run.call(&*tool, args("cus_1", 4900)).await;
        assert_eq!(tool.runs(), 4);
    }
}

/// A worker paused between attempts past its lease rejoins the key as a waiter (its wait hook
/// hears it: an MCP server sends "waiting for another call" progress). When the new owner then
/// lets the key go (its one attempt timed out, nothing stored), the worker owns the key again and
/// runs its retry: its hook must hear that it owns the key, as any waiter that becomes the owner,
/// or the client keeps being told the call waits for another one while it runs its tool.
#[tokio::test(start_paused = true)]
async fn a_worker_that_rejoined_and_owns_the_key_again_tells_its_wait_hook() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (a, b) = two_workers();
    let flaky = flaky_charge();
    // B's one attempt hangs past its 5 s timeout: ambiguous, and with no attempt left the key is
    // released with nothing stored.
    let giving_up = PayTool::new(
        RetryClass::Keyed,
        ToolOptions {
            attempts: Some(1),
            attempt_timeout: Some(Duration::from_secs(5)),
            ..Default::default()
        },
        &[],
        Step::Slow(Duration::from_secs(3600)),
    );
    let (waits, owns) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let hook = {
        let (waits, owns) = (waits.clone(), owns.clone());
        idem_core::WaitHook::new(move |_| {
            waits.fetch_add(1, Ordering::SeqCst);
        })
        .on_owner(move |_| {
            owns.fetch_add(1, Ordering::SeqCst);
        })
    };
    let run_a = a.run("r").with_wait_hook(hook);
    let worker_a = run_a.call(&*flaky, args("cus_1", 4900));
    let mut worker_a = std::pin::pin!(worker_a);
    until_started(&mut worker_a, &flaky.started, "A").await;
    tokio::time::sleep(policy().lease + Duration::from_secs(1)).await;
    let run_b = b.run("r");
    let worker_b = run_b.call(&*giving_up, args("cus_1", 4900));
    let mut worker_b = std::pin::pin!(worker_b);
    until_started(&mut worker_b, &giving_up.started, "B").await;
    let (a_result, b_result) = tokio::join!(worker_a, worker_b);
    assert!(b_result.is_err(), "{b_result:?}");
    assert_eq!(a_result.unwrap(), "ch_1", "A ran its retry once B let go");
    assert_eq!(flaky.runs(), 2);
    assert!(waits.load(Ordering::SeqCst) >= 1, "A waited for B");
    assert_eq!(owns.load(Ordering::SeqCst), 1, "A's hook heard that it owns the key again");
}

/// The worker paused between attempts past its lease, on each durable store the features enable,
/// in real time: the fenced renewal before the retry is the store's own code. A resumes while B,
/// which took the key over, still runs: A does not retry beside it, and answers with B's charge.
async fn paused_worker_does_not_retry_beside_the_new_owner_on(store: Arc<dyn Store>, run: &str) {
    let lease = Policy { lease: Duration::from_millis(300), ..policy() };
    let (a, b) = (executor_on(store.clone(), lease), executor_on(store, lease));
    let flaky = flaky_charge();
    let slow = PayTool::with_provider(
        RetryClass::Keyed,
        ToolOptions { attempt_timeout: Some(Duration::from_secs(30)), ..Default::default() },
        &[],
        Step::Slow(Duration::from_millis(1500)),
        flaky.provider.clone(),
    );
    let run_a = a.run(run);
    let worker_a = run_a.call(&*flaky, args("cus_1", 4900));
    let mut worker_a = std::pin::pin!(worker_a);
    until_started(&mut worker_a, &flaky.started, "A").await;
    // A is not polled for well over its lease (its renewals cannot run).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let run_b = b.run(run);
    let worker_b = run_b.call(&*slow, args("cus_1", 4900));
    let mut worker_b = std::pin::pin!(worker_b);
    until_started(&mut worker_b, &slow.started, "B").await;
    let (a_result, b_result) = tokio::join!(worker_a, worker_b);
    assert_eq!(b_result.unwrap(), "ch_1");
    assert_eq!(flaky.runs(), 1, "A did not run a second attempt beside B");
    assert_eq!(a_result.unwrap(), "ch_1", "A's caller gets the outcome of the new owner");
    assert_eq!(flaky.charges(), 1);
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_paused_worker_does_not_retry_beside_the_new_owner_on_sqlite() {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-paused-worker-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = Arc::new(idem_core::SqliteStore::open(&path).expect("open the SQLite file"));
    paused_worker_does_not_retry_beside_the_new_owner_on(store, "paused-worker").await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_paused_worker_does_not_retry_beside_the_new_owner_on_postgres() {
    let store = idem_core::PostgresStore::connect(&idem_tests::pg_url()).await;
    let Some(store) = idem_tests::or_skip("PostgreSQL", store) else { return };
    let run = format!("paused-worker-{}", idem_tests::process_tag());
    paused_worker_does_not_retry_beside_the_new_owner_on(Arc::new(store), &run).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_paused_worker_does_not_retry_beside_the_new_owner_on_redis() {
    let store = idem_core::RedisStore::builder(idem_tests::redis_url())
        .prefix(idem_tests::redis_prefix())
        .open()
        .await;
    let Some(store) = idem_tests::or_skip("Redis", store) else { return };
    let run = format!("paused-worker-{}", idem_tests::process_tag());
    paused_worker_does_not_retry_beside_the_new_owner_on(Arc::new(store), &run).await;
}

/// A worker paused past its lease rejoins the key and waits for the new owner; its deadline ends
/// first. Its caller hears the deadline with the tool's last error (as when its pause before a
/// retry ends at the deadline), not a bare "deadline passed" with no error, which also reads to
/// its in-process duplicates as a call that failed at nothing.
#[tokio::test(start_paused = true)]
async fn a_worker_whose_deadline_ends_while_it_rejoins_reports_the_tools_last_error() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let short = Policy { deadline: Duration::from_secs(20), ..policy() };
    let (a, b) = (executor_on(store.clone(), short), executor_on(store, policy()));
    let flaky = flaky_charge();
    let slow = slow_charge();
    // A runs until its first attempt failed, pauses past its lease; B takes the key over with
    // a slow charge; A resumes while B runs.
    let (a_result, b_result) = paused_worker_and_new_owner(&a, &b, &flaky, &slow).await;
    assert_eq!(b_result.unwrap(), "ch_1");
    assert_eq!(flaky.runs(), 1, "A did not run a second attempt beside B");
    match a_result {
        Err(idem_core::Error::BudgetExhausted {
            budget: idem_core::BudgetKind::Deadline,
            error: Some(rig::PayError::Unavailable),
            ..
        }) => {}
        other => panic!("the deadline, with the tool's last error: {other:?}"),
    }
}

/// A worker paused past its lease rejoins the key (B took it over) with a duplicate of its own
/// process joined to it; its caller stops it while it waits for B. It answers `Cancelled` after
/// its one attempt, runs nothing more; the duplicate starts over, waits for B and gets B's charge.
#[tokio::test(start_paused = true)]
async fn a_worker_stopped_while_it_rejoins_leaves_its_joiner_to_the_new_owner() {
    let (a, b) = two_workers();
    let flaky = flaky_charge();
    let slow = PayTool::with_provider(
        RetryClass::Keyed,
        ToolOptions { attempt_timeout: Some(Duration::from_secs(3600)), ..Default::default() },
        &[],
        Step::Slow(Duration::from_secs(30)),
        flaky.provider.clone(),
    );
    let stop = idem_core::StopSignal::new();
    let run_a = a.run("r");
    let stopped_run = run_a.with_stop(stop.clone());
    let worker_a = stopped_run.call(&*flaky, args("cus_1", 4900));
    let mut worker_a = std::pin::pin!(worker_a);
    until_started(&mut worker_a, &flaky.started, "A").await;
    let joiner = run_a.call(&*flaky, args("cus_1", 4900));
    let mut joiner = std::pin::pin!(joiner);
    tokio::select! {
        _ = &mut joiner => panic!("the joiner finished early"),
        () = tokio::task::yield_now() => {}
    }
    tokio::time::sleep(policy().lease + Duration::from_secs(1)).await;
    let run_b = b.run("r");
    let worker_b = run_b.call(&*slow, args("cus_1", 4900));
    let mut worker_b = std::pin::pin!(worker_b);
    until_started(&mut worker_b, &slow.started, "B").await;
    let stopping = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        stop.stop();
    };
    let (a_result, j_result, b_result, ()) = tokio::join!(worker_a, joiner, worker_b, stopping);
    assert!(
        matches!(a_result, Err(idem_core::Error::Cancelled { attempts: 1, .. })),
        "{a_result:?}"
    );
    assert_eq!(b_result.unwrap(), "ch_1");
    assert_eq!(j_result.unwrap(), "ch_1", "the joiner gets the new owner's charge");
    assert_eq!(flaky.runs(), 1, "neither A nor its joiner ran beside B");
    assert_eq!((slow.runs(), flaky.charges()), (1, 1));
}

/// A keyed tool whose attempts wait for what the script says, then fail before sending (with the
/// script's retry-after hint) or answer; it counts how many of its bodies run at once.
struct Paced {
    script: std::sync::Mutex<std::collections::VecDeque<(Duration, Option<Duration>)>>,
    running: std::sync::atomic::AtomicUsize,
    most_at_once: std::sync::atomic::AtomicUsize,
    runs: std::sync::atomic::AtomicUsize,
}

static PACED: idem_core::ToolDef = idem_core::ToolDef {
    name: "paced_charge",
    description: "",
    class: RetryClass::Keyed,
    options: ToolOptions::NONE,
};

impl idem_core::Tool for Paced {
    type Args = rig::ChargeArgs;
    type Output = String;
    type Error = idem_core::ToolFailure;
    fn def(&self) -> &'static idem_core::ToolDef {
        &PACED
    }
    fn run(
        &self,
        _cx: &idem_core::Ctx,
        _args: rig::ChargeArgs,
    ) -> impl std::future::Future<Output = Result<String, idem_core::ToolFailure>> + Send {
        use std::sync::atomic::Ordering::SeqCst;
        let step = self.script.lock().unwrap().pop_front();
        async move {
            let n = self.runs.fetch_add(1, SeqCst) + 1;
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most_at_once.fetch_max(now, SeqCst);
            let (work, fails) = step.unwrap_or((Duration::from_secs(20), None));
            tokio::time::sleep(work).await;
            self.running.fetch_sub(1, SeqCst);
            match (step, fails) {
                (Some(_), Some(after)) => {
                    Err(idem_core::ToolFailure::transient("unavailable").retry_after(after))
                }
                (Some(_), None) => Err(idem_core::ToolFailure::transient("unavailable")),
                (None, _) => Ok(format!("ch_{n}")),
            }
        }
    }
}

/// Attempts and pauses each shorter than a third of the lease, which is when renewals come: the
/// lease must still be renewed on time. Here the third attempt starts 21 s after the claim (under
/// the three quarters of a 30 s lease after which a retry confirms its lease first) and runs 20 s:
/// a renewal counted from the attempt's start, not from the last one the store accepted, comes at
/// 31 s, after the lease ended at 30 s, and a second worker takes the key over and charges beside
/// the first.
#[tokio::test(start_paused = true)]
async fn a_lease_is_renewed_on_time_across_attempts_and_pauses_shorter_than_a_renewal_period() {
    use std::sync::atomic::Ordering::SeqCst;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let policy = Policy {
        attempts: 3,
        lease: Duration::from_secs(30),
        attempt_timeout: Duration::from_secs(3600),
        deadline: Duration::from_secs(3600),
        // No jitter: the pauses are the hints.
        backoff: idem_core::Backoff { base: Duration::ZERO, cap: Duration::ZERO },
        ..policy()
    };
    let (a, b) = (executor_on(store.clone(), policy), executor_on(store, policy));
    let tool = Paced {
        script: std::sync::Mutex::new(
            [
                (Duration::from_millis(9_900), Some(Duration::from_millis(9_900))),
                (Duration::from_millis(1_300), None),
            ]
            .into(),
        ),
        running: Default::default(),
        most_at_once: Default::default(),
        runs: Default::default(),
    };
    let run_a = a.run("r");
    let first = run_a.call(&tool, args("cus_1", 4900));
    let second = async {
        // After the first lease would have ended, while the first worker's third attempt runs.
        tokio::time::sleep(Duration::from_secs(30) + Duration::from_millis(500)).await;
        b.run("r").call(&tool, args("cus_1", 4900)).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(tool.most_at_once.load(SeqCst), 1, "two workers ran the charge at once");
    assert_eq!(tool.runs.load(SeqCst), 3, "the first worker's three attempts, nobody else's");
    assert_eq!(first.unwrap(), "ch_3");
    assert_eq!(second.unwrap(), "ch_3", "the second worker waited for the first one's charge");
}

//! Executor-level tests on a durable store, shared by the SQLite, PostgreSQL and Redis test
//! files: two executors (two processes' worth of in-process state) on one database, and a
//! hand-written keyed tool whose side effects are counted outside the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::store::Store;
use idem_core::{Classify, Ctx, Failure, Idem, RetryClass, Tool, ToolDef, ToolOptions};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    pub customer: String,
    pub cents: u64,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
pub enum ChargeError {
    #[error("card declined")]
    Declined,
}

impl Classify for ChargeError {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

/// A keyed charge: each run is one side effect, numbered in the receipt; it takes `work` to run.
pub struct Charge {
    pub effects: Arc<AtomicUsize>,
    pub work: Duration,
}

static CHARGE: ToolDef = ToolDef {
    name: "charge",
    description: "Charges a customer.",
    class: RetryClass::Keyed,
    // A short lease, so a crashed holder's lease ends within the test.
    options: ToolOptions { lease: Some(Duration::from_millis(600)), ..ToolOptions::NONE },
};

impl Tool for Charge {
    type Args = ChargeArgs;
    type Output = String;
    type Error = ChargeError;

    fn def(&self) -> &'static ToolDef {
        &CHARGE
    }

    async fn run(&self, _cx: &Ctx, _args: ChargeArgs) -> Result<String, ChargeError> {
        tokio::time::sleep(self.work).await;
        let n = self.effects.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("receipt-{n}"))
    }
}

fn run_id(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{test}-{}-{nanos}", std::process::id())
}

fn args() -> ChargeArgs {
    ChargeArgs { customer: "cus_1".into(), cents: 4900 }
}

/// 8 concurrent duplicates, 4 through each executor: one side effect, and every caller receives
/// the first result.
pub async fn duplicates_across_executors_run_once(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let effects = Arc::new(AtomicUsize::new(0));
    let tool = Arc::new(Charge { effects: Arc::clone(&effects), work: Duration::from_millis(200) });
    let run = run_id("duplicates_across_executors_run_once");
    let runs =
        [Idem::builder_shared(a).build().run(&run), Idem::builder_shared(b).build().run(&run)];
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let run = runs[i % 2].clone();
            let tool = Arc::clone(&tool);
            tokio::spawn(async move { run.call(&*tool, args()).await })
        })
        .collect();
    for call in calls {
        let got = call.await.expect("task").expect("call");
        assert_eq!(got, "receipt-1", "every duplicate receives the first result");
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1, "8 duplicates over 2 executors: one effect");
    // A later repeat through either executor replays.
    for run in &runs {
        assert_eq!(run.call(&*tool, args()).await.expect("replay"), "receipt-1");
    }
    assert_eq!(effects.load(Ordering::SeqCst), 1, "replays run nothing");
}

/// A holder that dies between claim and complete (its task is aborted, nothing is released):
/// the other executor waits out the lease, takes over, runs once, and its result stands.
pub async fn crashed_holder_is_taken_over(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let effects = Arc::new(AtomicUsize::new(0));
    let slow = Charge { effects: Arc::clone(&effects), work: Duration::from_secs(3600) };
    let fast = Charge { effects: Arc::clone(&effects), work: Duration::from_millis(10) };
    let run = run_id("crashed_holder_is_taken_over");
    let first = Idem::builder_shared(a).build().run(&run);
    let second = Idem::builder_shared(b).build().run(&run);
    let crashed = tokio::spawn(async move { first.call(&slow, args()).await });
    // Let it claim, then kill it mid-run.
    tokio::time::sleep(Duration::from_millis(200)).await;
    crashed.abort();
    assert!(crashed.await.is_err_and(|e| e.is_cancelled()), "the holder was killed");
    let got = second.call(&fast, args()).await.expect("takeover call");
    assert_eq!(got, "receipt-1", "the survivor runs once after the lease ends");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the killed holder never completed its effect");
    assert_eq!(second.call(&fast, args()).await.expect("replay"), "receipt-1");
    assert_eq!(effects.load(Ordering::SeqCst), 1, "replays run nothing");
}

/// Mutual exclusion under churn: 8 workers over several stores (as processes) claim one key,
/// hold it briefly and release it, 25 times each. Never two holders at once, and every release
/// is by the current holder (a claim, release or fence answered wrong would show here).
pub async fn mutual_exclusion_under_churn(stores: Vec<Arc<dyn Store>>) {
    use idem_core::store::Claim;
    use std::sync::atomic::AtomicBool;

    let (key, fp) = idem_core::conformance::fresh_key("mutual_exclusion_under_churn", "{}");
    let held = Arc::new(AtomicBool::new(false));
    let acquisitions = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&stores[i % stores.len()]);
            let held = Arc::clone(&held);
            let acquisitions = Arc::clone(&acquisitions);
            tokio::spawn(async move {
                let mut mine = 0;
                while mine < 25 {
                    let req = idem_tests::claim_req(&key, &fp);
                    match store.claim(req).await.expect("claim") {
                        Claim::Acquired { fence, takeover } => {
                            assert!(!takeover, "no lease expired, so nothing to take over");
                            assert!(!held.swap(true, Ordering::SeqCst), "two holders at once");
                            acquisitions.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            held.store(false, Ordering::SeqCst);
                            store.release(&key, fence).await.expect("release by the holder");
                            mine += 1;
                        }
                        Claim::InFlight { fence, .. } => {
                            store.wait(&key, fence, Duration::from_millis(50)).await.expect("wait");
                        }
                        other => {
                            panic!("a contended free key answers Acquired or InFlight: {other:?}")
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }
    assert_eq!(acquisitions.load(Ordering::SeqCst), 200, "every worker acquired 25 times");
}

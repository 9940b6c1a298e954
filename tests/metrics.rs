//! idem's metrics (`idem_core::metrics`, feature `metrics`): a scripted run of calls, each
//! outcome of known count, read back exactly from `metrics-util`'s debugging recorder.

use idem_tests::wrapped::{Hook, Op, Wrapped};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::store::{Store, StoreError};
use idem_core::{Classify, Failure, Idem, Key, MemoryStore, Reconciled, RetryBudget, tool};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("declined")]
    Declined,
    #[error("unreachable")]
    Unreachable,
    #[error("timed out after sending")]
    TimedOut,
}

impl Classify for PayError {
    fn classify(&self) -> Failure {
        match self {
            PayError::Declined => Failure::permanent(),
            PayError::Unreachable => Failure::transient(),
            PayError::TimedOut => Failure::ambiguous(),
        }
    }
}

static RUNS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn charge(customer: String) -> Result<String, PayError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("ch_{customer}"))
}

#[tool(retry = "keyed")]
async fn slow_charge(customer: String) -> Result<String, PayError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(format!("ch_{customer}"))
}

#[tool(retry = "keyed")]
async fn declined(customer: String) -> Result<String, PayError> {
    let _ = customer;
    Err(PayError::Declined)
}

#[tool(retry = "never")]
async fn wire(to: String) -> Result<String, PayError> {
    let _ = to;
    Err(PayError::TimedOut)
}

async fn refund_made(key: &Key, payment: String) -> Reconciled<String> {
    let _ = key;
    Reconciled::Happened(format!("re_{payment}"))
}

#[tool(retry = "never", reconcile = refund_made)]
async fn refund(payment: String) -> Result<String, PayError> {
    let _ = payment;
    Err(PayError::TimedOut)
}

#[tool(retry = "safe", attempts = 3)]
async fn flaky(customer: String) -> Result<String, PayError> {
    let _ = customer;
    Err(PayError::Unreachable)
}

/// The recorded values by name and sorted labels.
type Seen = BTreeMap<(String, Vec<(String, String)>), DebugValue>;

fn key(name: &str, labels: &[(&str, &str)]) -> (String, Vec<(String, String)>) {
    let mut labels: Vec<(String, String)> =
        labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    labels.sort();
    (name.to_owned(), labels)
}

fn counter(seen: &Seen, name: &str, labels: &[(&str, &str)]) -> u64 {
    match seen.get(&key(name, labels)) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

#[test]
fn a_scripted_run_is_counted_exactly() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let unknown_gauge = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            // Two tokens: after one failed attempt no retry is allowed.
            let idem = Idem::builder(MemoryStore::new())
                .retry_budget(Arc::new(RetryBudget::new(2, 0.1)))
                .build();
            let run = idem.run("metrics");
            charge(&run, "a".into()).await.unwrap(); // executed
            charge(&run, "a".into()).await.unwrap(); // replayed
            let (x, y) = tokio::join!(slow_charge(&run, "b".into()), slow_charge(&run, "b".into()));
            assert_eq!(x.unwrap(), y.unwrap()); // executed + joined
            declined(&run, "c".into()).await.unwrap_err(); // failed (stored)
            declined(&run, "c".into()).await.unwrap_err(); // replayed
            wire(&run, "d".into()).await.unwrap_err(); // unknown
            wire(&run, "d".into()).await.unwrap_err(); // unknown (replayed)
            assert_eq!(refund(&run, "e".into()).await.unwrap(), "re_e"); // reconciled
            flaky(&run, "f".into()).await.unwrap_err(); // failed; its retry refused by the budget
            idem_core::metrics::refresh_record_gauges(idem.store().as_ref()).await.unwrap()
        })
    });
    assert_eq!(unknown_gauge.unknown, 1);

    let mut seen = Seen::new();
    let mut histograms: BTreeMap<Vec<(String, String)>, usize> = BTreeMap::new();
    for (composite, _, _, value) in snapshotter.snapshot().into_vec() {
        let k = composite.key();
        let labels: Vec<(&str, &str)> = k.labels().map(|l| (l.key(), l.value())).collect();
        let entry = key(k.name(), &labels);
        if let DebugValue::Histogram(samples) = &value {
            assert_eq!(k.name(), "idem_store_step_seconds");
            assert!(samples.iter().all(|s| s.into_inner() >= 0.0));
            histograms.insert(entry.1.clone(), samples.len());
        }
        seen.insert(entry, value);
    }

    let calls = |tool: &str, class: &str, outcome: &str| {
        counter(
            &seen,
            "idem_calls_total",
            &[("tool", tool), ("class", class), ("outcome", outcome)],
        )
    };
    assert_eq!(calls("charge", "keyed", "executed"), 1);
    assert_eq!(calls("charge", "keyed", "replayed"), 1);
    assert_eq!(calls("slow_charge", "keyed", "executed"), 1);
    assert_eq!(calls("slow_charge", "keyed", "joined"), 1);
    assert_eq!(calls("declined", "keyed", "failed"), 1);
    assert_eq!(calls("declined", "keyed", "replayed"), 1);
    assert_eq!(calls("wire", "never", "unknown"), 2);
    assert_eq!(calls("refund", "never", "reconciled"), 1);
    assert_eq!(calls("flaky", "safe", "failed"), 1);
    let total_calls: u64 = seen
        .iter()
        .filter(|((name, _), _)| name == "idem_calls_total")
        .map(|(_, v)| if let DebugValue::Counter(n) = v { *n } else { 0 })
        .sum();
    assert_eq!(total_calls, 10, "no other call series: {seen:?}");

    let attempts = |tool: &str, class: &str| {
        counter(&seen, "idem_attempts_total", &[("tool", tool), ("class", class)])
    };
    assert_eq!(attempts("charge", "keyed"), 1);
    assert_eq!(attempts("slow_charge", "keyed"), 1);
    assert_eq!(attempts("declined", "keyed"), 1);
    assert_eq!(attempts("wire", "never"), 1);
    assert_eq!(attempts("refund", "never"), 1);
    assert_eq!(attempts("flaky", "safe"), 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);

    assert_eq!(counter(&seen, "idem_retry_budget_refusals_total", &[("tool", "flaky")]), 1);
    assert_eq!(
        counter(
            &seen,
            "idem_reconciliations_total",
            &[("tool", "refund"), ("verdict", "happened")]
        ),
        1
    );
    match seen.get(&key("idem_outcomes_unknown", &[])) {
        Some(DebugValue::Gauge(v)) => assert_eq!(v.into_inner(), 1.0),
        other => panic!("idem_outcomes_unknown: {other:?}"),
    }

    // Claims: 2 charge, 1 slow_charge (its duplicate joins the call in this process without
    // claiming), 2 declined, 2 wire, 1 refund; the safe tool uses no store. Completions: one per
    // stored outcome.
    let step = |s: &str| vec![("step".to_owned(), s.to_owned())];
    assert_eq!(histograms.get(&step("claim")), Some(&8), "{histograms:?}");
    assert_eq!(histograms.get(&step("complete")), Some(&5), "{histograms:?}");
    // The refund's owner confirms its fence (a renewal) once, before asking its check.
    assert_eq!(histograms.get(&step("renew")), Some(&1), "{histograms:?}");
    assert_eq!(histograms.len(), 3, "no release in this run: {histograms:?}");
}

/// Makes the store's counting (`Store::stats`) fail while set, as a store that went down.
#[derive(Default)]
struct StatsDown(std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl Hook for StatsDown {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        match op {
            Op::Stats if self.0.load(Ordering::SeqCst) => {
                Err(StoreError::unavailable("connection refused"))
            }
            _ => Ok(()),
        }
    }
}

/// `watch_record_gauges` counts at once, then once per period; a failed count sets nothing (the
/// gauges keep their last values); once aborted it counts no more.
#[test]
fn the_gauge_watcher_counts_at_once_then_every_period() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The gauges (unknown outcomes, expired leases) set since the last read: the debugging
    // recorder's snapshot takes each gauge's value and leaves 0 in its place. Each step below
    // changes the store so that a count would set a value other than 0.
    let gauges = || {
        let read = record_gauges(&snapshotter);
        (read("idem_outcomes_unknown"), read("idem_leases_expired"))
    };
    let rt = paused_runtime();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let store = Arc::new(Wrapped::new(StatsDown::default()));
            let run = Idem::builder_shared(store.clone()).build().run("gauges");
            wire(&run, "acct_1".into()).await.unwrap_err(); // one unknown outcome
            assert!(gauges().0.is_nan(), "nothing is counted before the watcher starts");

            let period = Duration::from_secs(60);
            let watcher = idem_core::metrics::watch_record_gauges(store.clone(), period);
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(gauges(), (1.0, 0.0), "the first count is at once");

            // A second unknown outcome, and an owner that stops holding its 30 s lease.
            wire(&run, "acct_2".into()).await.unwrap_err();
            let key = Key::parse(&"ab".repeat(32)).unwrap();
            let fp = idem_core::Fingerprint::of_derived_key(&key);
            idem_tests::acquire(store.as_ref(), &key, &fp).await;
            tokio::time::sleep(Duration::from_secs(31)).await;
            assert_eq!(gauges(), (0.0, 0.0), "not counted again before the period ends");
            tokio::time::sleep(Duration::from_secs(30)).await;
            assert_eq!(gauges(), (2.0, 1.0), "counted again after one period");

            store.hook.0.store(true, Ordering::SeqCst);
            store.inner.forget(&key).await.unwrap();
            tokio::time::sleep(period).await;
            assert_eq!(gauges(), (0.0, 0.0), "a failed count sets nothing");
            store.hook.0.store(false, Ordering::SeqCst);
            tokio::time::sleep(period).await;
            assert_eq!(gauges(), (2.0, 0.0), "the next count after the store is back");

            watcher.abort();
            wire(&run, "acct_3".into()).await.unwrap_err();
            tokio::time::sleep(period * 3).await;
            assert_eq!(gauges(), (0.0, 0.0), "an aborted watcher counts no more");
        })
    });
}

/// The gauges set since the last read, by name (NaN for one not set): the debugging recorder's
/// snapshot takes each gauge's value and leaves 0 in its place.
fn record_gauges(snapshotter: &Snapshotter) -> impl Fn(&str) -> f64 {
    let gauges: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(composite, _, _, value)| match value {
            DebugValue::Gauge(v) => Some((composite.key().name().to_owned(), v.into_inner())),
            _ => None,
        })
        .collect();
    move |name| gauges.iter().find(|(n, _)| n == name).map_or(f64::NAN, |(_, v)| *v)
}

/// A current-thread runtime whose clock only moves when every task waits (tokio's paused time).
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
}

/// A period of zero is nonsense, but it must not kill the watcher: tokio's interval panics on it
/// (inside the spawned task, so the gauges were silently never set). It counts at once, then
/// every `MIN_GAUGE_PERIOD`.
#[test]
fn a_zero_gauge_period_counts_every_second() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let unknown = || record_gauges(&snapshotter)("idem_outcomes_unknown");
    let rt = paused_runtime();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let store = Arc::new(Wrapped::new(StatsDown::default()));
            let run = Idem::builder_shared(store.clone()).build().run("zero-period");
            wire(&run, "acct_1".into()).await.unwrap_err();
            let watcher = idem_core::metrics::watch_record_gauges(store.clone(), Duration::ZERO);
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(unknown(), 1.0, "the first count is at once");
            wire(&run, "acct_2".into()).await.unwrap_err();
            tokio::time::sleep(idem_core::metrics::MIN_GAUGE_PERIOD / 2).await;
            assert_eq!(unknown(), 0.0, "not counted again within the shortest period");
            tokio::time::sleep(idem_core::metrics::MIN_GAUGE_PERIOD).await;
            assert_eq!(unknown(), 2.0, "counted again after the shortest period");
            assert!(!watcher.is_finished(), "the watcher is still running");
            watcher.abort();
        })
    });
}

/// On a runtime built without timers the watcher cannot tick: it ends, logging why, instead of
/// panicking in its task (where nobody would see it and the gauges were never set).
#[test]
fn the_gauge_watcher_on_a_runtime_without_timers_ends_without_panicking() {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ended = rt.block_on(async {
        idem_core::metrics::watch_record_gauges(store, Duration::from_secs(60)).await
    });
    assert!(ended.is_ok(), "the watcher's task panicked: {ended:?}");
}

//! A retry-after hint that does not fit before the deadline (`docs/design.md` §6.2): one attempt,
//! the claim released, and the caller gets the tool's own error with its hint and the reason no
//! retry was made, typed and in the text a model reads.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{BudgetKind, Classify, Ctx, Error, ErrorKind, Failure, Idem, ToolSet, tool};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;

/// A provider's rate limit with the `Retry-After` it sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("rate limited, retry after {after_s} s")]
struct RateLimited {
    after_s: u64,
}

impl Classify for RateLimited {
    fn classify(&self) -> Failure {
        Failure::transient().retry_after(Duration::from_secs(self.after_s))
    }
}

static SENT: AtomicU32 = AtomicU32::new(0);

/// Sends a report; the provider is rate limited for half an hour.
#[tool(retry = "keyed", deadline = "60s")]
async fn send_report(cx: &Ctx, to: String) -> Result<String, RateLimited> {
    let _ = (cx.key(), to);
    SENT.fetch_add(1, Ordering::SeqCst);
    Err(RateLimited { after_s: 1800 })
}

const HALF_AN_HOUR: Duration = Duration::from_secs(1800);

#[tokio::test(start_paused = true)]
async fn a_hint_past_the_deadline_returns_the_tool_error_with_the_hint() {
    let run = Idem::in_memory().run("r");
    let started = Instant::now();
    let got = send_report(&run, "ops".into()).await;
    assert_eq!(SENT.load(Ordering::SeqCst), 1, "one attempt: the retry would not fit");
    assert!(started.elapsed() < Duration::from_secs(60), "no wait: {:?}", started.elapsed());
    let err = got.unwrap_err();
    match &err {
        Error::BudgetExhausted {
            budget: BudgetKind::Deadline,
            error: Some(RateLimited { after_s: 1800 }),
            retry_after: Some(after),
            ..
        } => assert_eq!(*after, HALF_AN_HOUR),
        other => panic!("expected the tool's error with its hint, got {other:?}"),
    }
    assert_eq!(err.tool_error(), Some(&RateLimited { after_s: 1800 }));
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    let text = err.to_string();
    assert!(text.contains("rate limited, retry after 1800 s"), "{text}");
    assert!(text.contains("past the call's deadline"), "{text}");
    assert!(text.contains("retry after 1800000 ms"), "{text}");

    // The claim was released and nothing stored: the next call runs again at once (a held claim
    // would make it wait for its deadline; a stored outcome would be replayed).
    let again = send_report(&run, "ops".into()).await;
    assert_eq!(SENT.load(Ordering::SeqCst), 2, "released, not stored");
    assert!(
        matches!(again, Err(Error::BudgetExhausted { error: Some(_), retry_after: Some(_), .. })),
        "{again:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());

    // A model reads the same: the tool's error, the hint, and why no retry was made.
    let set = ToolSet::new().with(SendReportTool).unwrap();
    let r = set.call(&run, "send_report", &json!({"to": "ops"})).await;
    assert_eq!(SENT.load(Ordering::SeqCst), 3);
    assert!(r.is_error);
    assert_eq!(r.error_kind, Some(ErrorKind::BudgetExhausted));
    assert!(r.text.contains("rate limited, retry after 1800 s"), "{}", r.text);
    assert!(r.text.contains("retry after 1800000 ms"), "{}", r.text);
    assert!(r.text.contains("no retry was made"), "{}", r.text);
    assert_eq!(r.content["error"]["detail"]["retry_after_ms"], 1_800_000);
    assert_eq!(r.content["error"]["detail"]["tool_error"], json!({"after_s": 1800}));
}

/// A provider that says "never" (`Duration::MAX`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("closed for good")]
struct ClosedForGood;

impl Classify for ClosedForGood {
    fn classify(&self) -> Failure {
        Failure::transient().retry_after(Duration::MAX)
    }
}

#[tool(retry = "keyed")]
async fn close_account(id: String) -> Result<String, ClosedForGood> {
    let _ = id;
    Err(ClosedForGood)
}

/// An endless hint reads as a century (the longest duration idem keeps), in the text and in the
/// JSON a model reads, not as a 23-digit number nor a number JSON cannot hold exactly.
#[tokio::test(start_paused = true)]
async fn an_endless_hint_reads_as_a_century() {
    const CENTURY_MS: u64 = 100 * 365 * 24 * 3600 * 1000;
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(CloseAccountTool).unwrap();
    let r = set.call(&run, "close_account", &json!({"id": "a"})).await;
    assert_eq!(r.error_kind, Some(ErrorKind::BudgetExhausted), "{}", r.text);
    assert!(r.text.contains(&format!("retry after {CENTURY_MS} ms")), "{}", r.text);
    assert_eq!(r.content["error"]["detail"]["retry_after_ms"], CENTURY_MS);
}

static ALERTS: AtomicU32 = AtomicU32::new(0);

/// Sends an alert: the provider's first answer is a five-minute rate limit, later ones succeed.
#[tool(retry = "keyed")]
async fn send_alert(to: String) -> Result<String, RateLimited> {
    let _ = to;
    match ALERTS.fetch_add(1, Ordering::SeqCst) {
        0 => Err(RateLimited { after_s: 300 }),
        n => Ok(format!("alert {}", n + 1)),
    }
}

/// A call pausing out a long hint whose key another worker took over meanwhile (this one stalled
/// past its lease, the other took the lease over and finished) answers with the new owner's
/// result as soon as a renewal finds the key taken, not when the five minutes are over, and does
/// not send again.
#[tokio::test(start_paused = true)]
async fn a_pause_ends_when_a_renewal_finds_the_key_taken_over() {
    let store: std::sync::Arc<dyn idem_core::store::Store> =
        std::sync::Arc::new(idem_core::MemoryStore::new());
    let policy = idem_core::Policy {
        lease: Duration::from_secs(10),
        deadline: Duration::from_secs(900),
        ..idem_core::Policy::default()
    };
    let a = Idem::builder_shared(store.clone()).policy(policy).build();
    let b = Idem::builder_shared(store).policy(policy).build();
    let (run_a, run_b) = (a.run("r"), b.run("r"));

    let worker_a = send_alert(&run_a, "ops".into());
    let mut worker_a = std::pin::pin!(worker_a);
    // A's first attempt is rate limited; A pauses (renewing its lease) ...
    let polled = tokio::time::timeout(Duration::from_secs(1), &mut worker_a).await;
    assert!(polled.is_err(), "A is pausing out the hint: {polled:?}");
    assert_eq!(ALERTS.load(Ordering::SeqCst), 1);
    // ... then stalls past its lease (not polled: no renewal goes out), and B takes it over.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(send_alert(&run_b, "ops".into()).await.unwrap(), "alert 2");

    let resumed = Instant::now();
    let got = worker_a.await;
    assert_eq!(got.unwrap(), "alert 2", "A's caller gets the new owner's result");
    assert_eq!(ALERTS.load(Ordering::SeqCst), 2, "A did not send again");
    assert!(
        resumed.elapsed() < Duration::from_secs(60),
        "A answered once its renewal was refused, not after the hint: {:?}",
        resumed.elapsed()
    );
}

/// A provider asking for a 1 ms pause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("busy, retry after 1 ms")]
struct Busy;

impl Classify for Busy {
    fn classify(&self) -> Failure {
        Failure::transient().retry_after(Duration::from_millis(1))
    }
}

#[tool(retry = "keyed")]
async fn poll_job(id: String) -> Result<String, Busy> {
    let _ = id;
    Err(Busy)
}

/// A short hint under a long backoff: the pause the backoff drew is what would end past the
/// deadline, and the message says so instead of blaming the tool's 1 ms.
#[tokio::test(start_paused = true)]
async fn a_short_hint_is_not_blamed_for_a_backoff_past_the_deadline() {
    let policy = idem_core::Policy {
        deadline: Duration::from_secs(2),
        backoff: idem_core::Backoff {
            base: Duration::from_secs(3600),
            cap: Duration::from_secs(3600),
        },
        ..idem_core::Policy::default()
    };
    let run = Idem::builder(idem_core::MemoryStore::new()).policy(policy).seed(7).build().run("r");
    let err = poll_job(&run, "j".into()).await.unwrap_err();
    assert!(matches!(err, Error::BudgetExhausted { budget: BudgetKind::Deadline, .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("at least the 1 ms the tool asked for"), "{text}");
    assert!(text.contains("would end past the call's deadline"), "{text}");
}

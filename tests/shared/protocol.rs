//! Shared by the protocol tests (tests/protocol*.rs): a fake payment provider that deduplicates
//! by idempotency key, a scripted charge tool, and the executor and policy they run under.

#![allow(dead_code)] // each test binary uses a part of it

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::Store;
use idem_core::{
    Backoff, Classify, Ctx, Failure, Idem, MemoryStore, Policy, RetryClass, Scope, Tool, ToolDef,
    ToolOptions,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// A fake payment provider and a scripted charge tool.

/// Creates charges; deduplicates by the idempotency key it is given, like Stripe does.
#[derive(Default)]
pub(crate) struct Provider {
    pub(crate) charges: Mutex<Vec<String>>,
    pub(crate) by_key: Mutex<HashMap<String, String>>,
}

impl Provider {
    pub(crate) fn charge(&self, idempotency_key: Option<&str>) -> String {
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
    pub(crate) fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ChargeArgs {
    pub(crate) customer: String,
    pub(crate) amount_cents: u64,
}

pub(crate) fn args(customer: &str, amount_cents: u64) -> ChargeArgs {
    ChargeArgs { customer: customer.into(), amount_cents }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub(crate) enum PayError {
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
pub(crate) enum Step {
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

pub(crate) struct PayTool {
    pub(crate) def: &'static ToolDef,
    pub(crate) provider: Arc<Provider>,
    pub(crate) script: Mutex<VecDeque<Step>>,
    pub(crate) then: Step,
    pub(crate) runs: AtomicUsize,
    pub(crate) keys: Mutex<Vec<String>>,
    pub(crate) started: tokio::sync::Notify,
}

impl PayTool {
    pub(crate) fn new(
        class: RetryClass,
        options: ToolOptions,
        script: &[Step],
        then: Step,
    ) -> Arc<Self> {
        Self::with_provider(class, options, script, then, Arc::default())
    }
    pub(crate) fn with_provider(
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
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
    pub(crate) fn charges(&self) -> usize {
        self.provider.count()
    }
    pub(crate) fn distinct_keys(&self) -> usize {
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
pub(crate) struct RateLimited {
    pub(crate) after_ms: u64,
}

impl Classify for RateLimited {
    fn classify(&self) -> Failure {
        Failure::transient().retry_after(Duration::from_millis(self.after_ms))
    }
}

pub(crate) fn policy() -> Policy {
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

pub(crate) fn executor_on(store: Arc<dyn Store>, policy: Policy) -> Idem {
    Idem::builder_shared(store).policy(policy).seed(7).build()
}

pub(crate) fn executor() -> Idem {
    executor_on(Arc::new(MemoryStore::new()), policy())
}

pub(crate) const CLASSES: [RetryClass; 3] =
    [RetryClass::Safe, RetryClass::Keyed, RetryClass::Never];

pub(crate) fn key_of(
    tool: &PayTool,
    scope: &Scope,
    a: &ChargeArgs,
) -> (idem_core::Key, idem_core::Fingerprint) {
    let canonical = idem_core::to_canonical_string(a).unwrap();
    let key = idem_core::key::derive_key(scope, tool.def.name, canonical.as_bytes());
    (key, idem_core::Fingerprint::of_derived_key(&key))
}

/// A tool whose first `limited` answers are "rate limited, retry after `after_ms`", then 42.
pub(crate) struct RateLimitedTool {
    pub(crate) def: &'static ToolDef,
    pub(crate) after_ms: u64,
    pub(crate) limited: usize,
    pub(crate) runs: AtomicUsize,
}

pub(crate) const fn rate_limited_def(class: RetryClass) -> ToolDef {
    ToolDef { name: "search", description: "", class, options: ToolOptions::NONE }
}
pub(crate) static RATE_LIMITED_SAFE: ToolDef = rate_limited_def(RetryClass::Safe);
pub(crate) static RATE_LIMITED_KEYED: ToolDef = rate_limited_def(RetryClass::Keyed);

pub(crate) fn rate_limited(
    def: &'static ToolDef,
    after_ms: u64,
    limited: usize,
) -> RateLimitedTool {
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

/// Polls `worker` until its tool's body started (`started`), then leaves it unpolled: a worker
/// paused mid-call, which renews nothing until it is polled again. `who` names it if it finishes
/// instead.
pub(crate) async fn until_started<F: std::future::Future + Unpin>(
    worker: &mut F,
    started: &tokio::sync::Notify,
    who: &str,
) {
    tokio::select! {
        _ = worker => panic!("{who} finished early"),
        () = started.notified() => {}
    }
}

/// A keyed charge whose one attempt takes 30 s, under an attempt timeout long enough for it: the
/// owner that takes a paused worker's key over.
pub(crate) fn slow_charge() -> Arc<PayTool> {
    PayTool::new(
        RetryClass::Keyed,
        ToolOptions { attempt_timeout: Some(Duration::from_secs(3600)), ..Default::default() },
        &[],
        Step::Slow(Duration::from_secs(30)),
    )
}

/// Worker A (on `a`) calls `tool` and is left unpolled once its body started (a paused worker)
/// for longer than the lease; worker B (on `b`) then takes the key over with `slow` (see
/// [`slow_charge`]), and both run to their ends, A resuming while B runs. Their answers, A's
/// first.
pub(crate) async fn paused_worker_and_new_owner(
    a: &Idem,
    b: &Idem,
    tool: &PayTool,
    slow: &PayTool,
) -> (Result<String, idem_core::Error<PayError>>, Result<String, idem_core::Error<PayError>>) {
    let (run_a, run_b) = (a.run("r"), b.run("r"));
    let worker_a = run_a.call(tool, args("cus_1", 4900));
    let mut worker_a = std::pin::pin!(worker_a);
    until_started(&mut worker_a, &tool.started, "A").await;
    tokio::time::sleep(policy().lease + Duration::from_secs(1)).await;
    let worker_b = run_b.call(slow, args("cus_1", 4900));
    let mut worker_b = std::pin::pin!(worker_b);
    until_started(&mut worker_b, &slow.started, "B").await;
    tokio::join!(worker_a, worker_b)
}

/// Two executors (two workers) on one in-memory store, under [`policy`].
pub(crate) fn two_workers() -> (Idem, Idem) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    (executor_on(store.clone(), policy()), executor_on(store, policy()))
}

/// A keyed charge whose first attempt fails before sending and whose retry would succeed.
pub(crate) fn flaky_charge() -> Arc<PayTool> {
    PayTool::new(RetryClass::Keyed, ToolOptions::default(), &[Step::Transient], Step::Succeed)
}

//! The executor: claim → run → complete, row by row of the table in DESIGN §3.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use crate::budget::RetryBudget;
use crate::class::RetryClass;
use crate::clock::{FOREVER, later};
use crate::ctx::Ctx;
use crate::error::{BudgetKind, Error};
use crate::failure::{Classify, FailureKind};
use crate::flight::{Enter, Flights, Shared};
use crate::key::{self, Fingerprint, Key, Scope};
use crate::policy::Policy;
use crate::store::{
    Claim, ClaimRequest, Fence, MemoryStore, OnExpired, Outcome, Record, Store, StoreError,
};
use crate::tool::Tool;

/// The runtime: a store, a default policy, a shared retry budget and the in-process single
/// flight. Cheap to clone (one `Arc`); share one per process.
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    /// `store.is_local()`, read once.
    local_store: bool,
    policy: Policy,
    budget: Arc<RetryBudget>,
    flights: Flights,
    rng: Mutex<SmallRng>,
    safe_fail_open: bool,
}

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem").field("policy", &self.inner.policy).finish_non_exhaustive()
    }
}

/// Builds an [`Idem`].
pub struct IdemBuilder {
    store: Arc<dyn Store>,
    policy: Policy,
    budget: Option<Arc<RetryBudget>>,
    seed: Option<u64>,
    safe_fail_open: bool,
}

impl IdemBuilder {
    /// The default policy for every tool; a tool's own options override it.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }
    /// A retry budget, possibly shared with other executors. Default: a new
    /// `RetryBudget::default()`.
    pub fn retry_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }
    /// Seeds the jitter's random numbers, for reproducible tests. Default: seeded by the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Lets `safe` tools with caching on run when the store is unavailable (fail open). Keyed and
    /// never tools always fail closed. Default off.
    pub fn safe_fail_open(mut self, on: bool) -> Self {
        self.safe_fail_open = on;
        self
    }
    /// The executor.
    pub fn build(self) -> Idem {
        let rng = match self.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        Idem {
            inner: Arc::new(Inner {
                local_store: self.store.is_local(),
                store: self.store,
                policy: self.policy,
                budget: self.budget.unwrap_or_default(),
                flights: Flights::default(),
                rng: Mutex::new(rng),
                safe_fail_open: self.safe_fail_open,
            }),
        }
    }
}

impl Idem {
    /// An executor on a new [`MemoryStore`] with the default policy.
    pub fn in_memory() -> Idem {
        Idem::builder(MemoryStore::new()).build()
    }
    /// An executor on `store` with the default policy.
    pub fn new(store: impl Store) -> Idem {
        Idem::builder(store).build()
    }
    /// A builder on `store`.
    pub fn builder(store: impl Store) -> IdemBuilder {
        Idem::builder_shared(Arc::new(store))
    }
    /// A builder on a store shared with others.
    pub fn builder_shared(store: Arc<dyn Store>) -> IdemBuilder {
        IdemBuilder {
            store,
            policy: Policy::default(),
            budget: None,
            seed: None,
            safe_fail_open: false,
        }
    }
    /// The handle through which tools are called in one run: the run id is part of every key.
    pub fn run(&self, run_id: impl Into<String>) -> Run {
        self.scope(Scope::run(run_id))
    }
    /// The handle for a full scope (tenant and run).
    pub fn scope(&self, scope: Scope) -> Run {
        Run { idem: self.clone(), scope: Arc::new(scope), caller_key: None, call_id: None }
    }
    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }
    /// The shared retry budget.
    pub fn retry_budget(&self) -> &Arc<RetryBudget> {
        &self.inner.budget
    }
    /// The default policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }
}

/// A run: the scope of keys, and how tools are called. Cheap to clone.
///
/// ```
/// # use idem_core::Idem;
/// let idem = Idem::in_memory();
/// let run = idem.run("conversation-42");
/// // charge_card(&run, "cus_1".into(), 4900).await  -- a #[tool] fn takes the run first
/// ```
#[derive(Clone, Debug)]
pub struct Run {
    idem: Idem,
    scope: Arc<Scope>,
    caller_key: Option<Arc<str>>,
    call_id: Option<Arc<str>>,
}

impl Run {
    /// The scope of this run's keys.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
    /// The executor.
    pub fn idem(&self) -> &Idem {
        &self.idem
    }
    /// The same run, but the next calls use `key` (the caller's own idempotency key) instead of
    /// a key derived from the arguments. A fingerprint of the arguments is stored with it, and a
    /// reuse with other arguments fails with [`Error::KeyReuseMismatch`].
    pub fn with_idempotency_key(&self, key: impl Into<Arc<str>>) -> Run {
        Run { caller_key: Some(key.into()), ..self.clone() }
    }
    /// The same run, with the agent's tool-call id (recorded as `gen_ai.tool.call.id`; not part
    /// of the key: the model invents a new one for every repeat).
    pub fn with_call_id(&self, id: impl Into<Arc<str>>) -> Run {
        Run { call_id: Some(id.into()), ..self.clone() }
    }
    /// The caller-supplied idempotency key, if any.
    pub fn caller_key(&self) -> Option<&str> {
        self.caller_key.as_deref()
    }

    /// Calls `tool` with `args` through the protocol: derive the key, join an in-flight duplicate
    /// or claim, run with retries, store the outcome, replay it for repeats.
    ///
    /// Errors: the tool's own ([`Error::Tool`]) or any of idem's ([`Error`]).
    pub async fn call<T: Tool>(
        &self,
        tool: &T,
        args: T::Args,
    ) -> Result<T::Output, Error<T::Error>> {
        let def = tool.def();
        let mut canonical = Vec::with_capacity(256);
        T::write_intent(&args, &mut canonical)
            .map_err(|source| Error::InvalidArguments { tool: def.name, source })?;
        let (key, fingerprint) = match &self.caller_key {
            Some(k) => (key::caller_key(&self.scope, def.name, k), key::fingerprint(&canonical)),
            None => {
                let key = key::derive_key(&self.scope, def.name, &canonical);
                (key, Fingerprint::of_derived_key(&key))
            }
        };
        let policy = self.idem.inner.policy.with_options(def.class, &def.options);
        let span = tracing::info_span!(
            "execute_tool",
            otel.name = Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = def.name,
            gen_ai.tool.call.id = self.call_id.as_deref(),
            idem.key = Empty,
            idem.class = def.class.as_str(),
            idem.attempt = Empty,
            idem.outcome = Empty,
            error.type = Empty,
        );
        if !span.is_disabled() {
            span.record("otel.name", format!("execute_tool {}", def.name));
            span.record("idem.key", key.as_str());
        }
        let call = Call {
            inner: &self.idem.inner,
            tool,
            key,
            fingerprint,
            policy,
            deadline: later(Instant::now(), policy.budget),
            span: span.clone(),
        };
        let result = call.execute(args).instrument(span.clone()).await;
        if let Err(e) = &result {
            span.record("error.type", e.kind());
        }
        result
    }
}

/// One call in progress.
struct Call<'a, T: Tool> {
    inner: &'a Inner,
    tool: &'a T,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
    deadline: Instant,
    span: tracing::Span,
}

/// What the leader hands to joiners, built only when someone joined.
fn share<T: Tool>(
    name: &'static str,
    key: Key,
    result: &Result<T::Output, Error<T::Error>>,
) -> Shared {
    Arc::new(match result {
        Ok(out) => serde_json::to_string(out).map_err(|e| Error::ReplayFailed {
            tool: name,
            key,
            reason: format!("the output could not be serialized: {e}"),
        }),
        Err(e) => Err(e
            .try_retype(|err| serde_json::to_string(err).map_err(|_| ()))
            .unwrap_or_else(|()| Error::ReplayFailed {
                tool: name,
                key,
                reason: "the tool error could not be serialized".into(),
            })),
    })
}

impl<E> Error<E> {
    /// A copy with the tool's error converted by `f`; `f`'s failure is returned as is.
    fn try_retype<F, X>(&self, f: impl FnOnce(&E) -> Result<F, X>) -> Result<Error<F>, X> {
        Ok(match self {
            Error::Tool { tool, error } => Error::Tool { tool, error: f(error)? },
            Error::InvalidArguments { tool, source } => {
                Error::InvalidArguments { tool, source: source.clone() }
            }
            Error::StoreUnavailable { tool, source } => {
                Error::StoreUnavailable { tool, source: source.clone() }
            }
            Error::LeaseLost { tool, key } => Error::LeaseLost { tool, key: *key },
            Error::KeyReuseMismatch { tool, key } => Error::KeyReuseMismatch { tool, key: *key },
            Error::OutcomeUnknown { tool, key } => Error::OutcomeUnknown { tool, key: *key },
            Error::Timeout { tool, timeout, attempt } => {
                Error::Timeout { tool, timeout: *timeout, attempt: *attempt }
            }
            Error::BudgetExhausted { tool, budget } => {
                Error::BudgetExhausted { tool, budget: *budget }
            }
            Error::ReplayFailed { tool, key, reason } => {
                Error::ReplayFailed { tool, key: *key, reason: reason.clone() }
            }
        })
    }
}

fn decode<V: DeserializeOwned, E>(tool: &'static str, key: Key, json: &str) -> Result<V, Error<E>> {
    serde_json::from_str(json).map_err(|e| Error::ReplayFailed { tool, key, reason: e.to_string() })
}

/// What claiming ended with: this call owns the key, or it already has its answer.
enum Owned<T: Tool> {
    Fence(Fence),
    Answer(Result<T::Output, Error<T::Error>>),
}

/// How one attempt ended.
enum Attempt<O, E> {
    Done(Result<O, E>),
    TimedOut,
}

impl<T: Tool> Call<'_, T> {
    fn name(&self) -> &'static str {
        self.tool.def().name
    }

    fn class(&self) -> RetryClass {
        self.tool.def().class
    }

    fn outcome(&self, what: &'static str) {
        self.span.record("idem.outcome", what);
    }

    async fn execute(&self, args: T::Args) -> Result<T::Output, Error<T::Error>> {
        if self.uses_store() && self.inner.local_store {
            // An in-process store already makes duplicates wait for the first call and wakes
            // them directly: a second single flight in front of it would only add cost.
            return self.lead(args).await;
        }
        loop {
            match self.inner.flights.enter(self.key, self.fingerprint) {
                Enter::Mismatch => {
                    return Err(Error::KeyReuseMismatch { tool: self.name(), key: self.key });
                }
                Enter::Join(slot) => {
                    let shared = match tokio::time::timeout_at(self.deadline, slot.wait()).await {
                        Err(_) => {
                            return Err(Error::BudgetExhausted {
                                tool: self.name(),
                                budget: BudgetKind::WallClock,
                            });
                        }
                        // The leader was cancelled before it finished: start over.
                        Ok(None) => continue,
                        Ok(Some(shared)) => shared,
                    };
                    self.outcome("joined");
                    return self.decode_shared(&shared);
                }
                Enter::Lead(leader) => {
                    let result = self.lead(args).await;
                    leader.finish(|| share::<T>(self.name(), self.key, &result));
                    return result;
                }
            }
        }
    }

    fn decode_shared(
        &self,
        shared: &Result<String, Error<String>>,
    ) -> Result<T::Output, Error<T::Error>> {
        match shared {
            Ok(json) => decode(self.name(), self.key, json),
            Err(e) => Err(e
                .try_retype(|json| decode::<T::Error, T::Error>(self.name(), self.key, json))
                .unwrap_or_else(|e| e)),
        }
    }

    fn uses_store(&self) -> bool {
        self.class() != RetryClass::Safe || self.policy.cache_safe
    }

    async fn lead(&self, args: T::Args) -> Result<T::Output, Error<T::Error>> {
        if !self.uses_store() {
            self.outcome("executed");
            return self.attempts(args, None).await;
        }
        let on_expired = match self.class() {
            RetryClass::Never => OnExpired::Unknown,
            _ => OnExpired::TakeOver,
        };
        match self.acquire(on_expired).await {
            Ok(Owned::Fence(fence)) => {
                self.outcome("executed");
                self.attempts(args, Some(fence)).await
            }
            Ok(Owned::Answer(answer)) => answer,
            Err(e) if self.class() == RetryClass::Safe && self.inner.safe_fail_open => {
                tracing::warn!(error = %e, "store unavailable; running safe tool without it");
                self.outcome("executed");
                self.attempts(args, None).await
            }
            Err(e) => Err(self.store_error(e)),
        }
    }

    /// Claims until this call owns the key or has its answer: waits for another owner's
    /// result, replays a stored one, or says why not. Bounded by the wall-clock budget.
    async fn acquire(&self, on_expired: OnExpired) -> Result<Owned<T>, StoreError> {
        let store = &self.inner.store;
        let answer = |a| Ok(Owned::Answer(a));
        let mut waited = false;
        loop {
            match self.claim(on_expired).await? {
                Claim::Acquired { fence, .. } => return Ok(Owned::Fence(fence)),
                Claim::InFlight { fence, lease_remaining } => {
                    let now = Instant::now();
                    if now >= self.deadline {
                        let budget = BudgetKind::WallClock;
                        return answer(Err(Error::BudgetExhausted { tool: self.name(), budget }));
                    }
                    let max = (self.deadline - now).min(lease_remaining + Duration::from_millis(1));
                    // A store that stops answering is caught by the next claim's timeout.
                    let woken = tokio::time::timeout(max, store.wait(&self.key, fence, max)).await;
                    if let Ok(Err(e)) = woken {
                        return Err(e);
                    }
                    waited = true;
                }
                Claim::Completed(record) => {
                    self.outcome(if waited { "joined" } else { "replayed" });
                    return answer(self.replay(record));
                }
                Claim::Unknown => {
                    self.outcome("unknown");
                    return answer(Err(Error::OutcomeUnknown { tool: self.name(), key: self.key }));
                }
                Claim::Mismatch => {
                    return answer(Err(Error::KeyReuseMismatch {
                        tool: self.name(),
                        key: self.key,
                    }));
                }
            }
        }
    }

    /// One claim, bounded by the call's budget and the store timeout. A claim that does not
    /// answer in time is finished in the background and released if it acquired, so a slow store
    /// leaves no phantom owner behind (for a never tool that would read as an unknown outcome).
    async fn claim(&self, on_expired: OnExpired) -> Result<Claim, StoreError> {
        if self.inner.local_store {
            // Answers without I/O: nothing to bound, nothing left behind.
            let req = ClaimRequest {
                key: &self.key,
                fingerprint: &self.fingerprint,
                lease: self.policy.lease,
                on_expired,
            };
            return self.inner.store.claim(req).await;
        }
        let now = Instant::now();
        let bound = later(now, self.policy.store_timeout).min(self.deadline);
        let store = Arc::clone(&self.inner.store);
        let (key, fingerprint, lease) = (self.key, self.fingerprint, self.policy.lease);
        let mut claim = Box::pin(async move {
            let req = ClaimRequest { key: &key, fingerprint: &fingerprint, lease, on_expired };
            store.claim(req).await
        });
        match tokio::time::timeout_at(bound, &mut claim).await {
            Ok(answer) => answer,
            Err(_) => {
                let store = Arc::clone(&self.inner.store);
                tokio::spawn(async move {
                    if let Ok(Claim::Acquired { fence, .. }) = claim.await {
                        let _ = store.release(&key, fence).await;
                    }
                });
                Err(StoreError::unavailable(format!(
                    "the store did not answer the claim within {:?}",
                    bound.saturating_duration_since(now)
                )))
            }
        }
    }

    /// A store step after the claim (complete, release, renew), bounded by the store timeout,
    /// not by the call's budget: the tool's work is done and its outcome should be kept.
    async fn bounded(
        &self,
        step: impl Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        if self.inner.local_store {
            return step.await;
        }
        let timeout = self.policy.store_timeout;
        match tokio::time::timeout(timeout, step).await {
            Ok(result) => result,
            Err(_) => {
                Err(StoreError::unavailable(format!("the store did not answer within {timeout:?}")))
            }
        }
    }

    async fn release(&self, fence: Fence) {
        // A failed release only delays the next claim until the lease ends.
        let _ = self.bounded(self.inner.store.release(&self.key, fence)).await;
    }

    async fn renew(&self, fence: Fence) {
        if let Err(e) =
            self.bounded(self.inner.store.renew(&self.key, fence, self.policy.lease)).await
        {
            // Keep running: stopping mid-effect is itself ambiguous. A lost lease surfaces as
            // LeaseLost when the outcome is stored.
            tracing::warn!(error = %e, "lease renewal failed");
        }
    }

    /// Sleeps `pause` before a retry, still renewing the lease (a provider's retry-after may be
    /// longer than the lease).
    async fn pause(&self, fence: Option<Fence>, pause: Duration) {
        let until = later(Instant::now(), pause);
        let Some(fence) = fence else {
            tokio::time::sleep_until(until).await;
            return;
        };
        let period = self.policy.lease / 3;
        loop {
            let next = later(Instant::now(), period);
            if next >= until {
                tokio::time::sleep_until(until).await;
                return;
            }
            tokio::time::sleep_until(next).await;
            self.renew(fence).await;
        }
    }

    fn store_error(&self, e: StoreError) -> Error<T::Error> {
        match e {
            StoreError::LeaseLost => Error::LeaseLost { tool: self.name(), key: self.key },
            source => Error::StoreUnavailable { tool: self.name(), source },
        }
    }

    fn replay(&self, record: Record) -> Result<T::Output, Error<T::Error>> {
        match record.outcome {
            Outcome::Success(json) => decode(self.name(), self.key, &json),
            Outcome::Failure(json) => {
                Err(Error::Tool { tool: self.name(), error: decode(self.name(), self.key, &json)? })
            }
            Outcome::Unknown => Err(Error::OutcomeUnknown { tool: self.name(), key: self.key }),
        }
    }

    /// The attempts loop, holding `fence` (or none for a safe tool that does not use the store).
    async fn attempts(
        &self,
        args: T::Args,
        fence: Option<Fence>,
    ) -> Result<T::Output, Error<T::Error>> {
        let budget = &self.inner.budget;
        let mut args = Some(args);
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            self.span.record("idem.attempt", attempt);
            let started = Instant::now();
            if started >= self.deadline {
                // Waiting for a duplicate used the whole budget: starting an attempt that would
                // time out at once would only make its outcome ambiguous.
                if let Some(fence) = fence {
                    self.release(fence).await;
                }
                return Err(Error::BudgetExhausted {
                    tool: self.name(),
                    budget: BudgetKind::WallClock,
                });
            }
            let attempt_deadline = later(started, self.policy.attempt_timeout).min(self.deadline);
            let cx = Ctx { key: self.key, attempt, deadline: attempt_deadline, fence };
            // The last allowed attempt takes the arguments; earlier ones need a copy for a retry.
            let this_args = match args.take() {
                Some(a) if attempt >= self.policy.attempts => a,
                Some(a) => {
                    let copy = a.clone();
                    args = Some(a);
                    copy
                }
                None => return Err(self.internal("arguments used up before the last attempt")),
            };
            let ended = self.run_attempt(&cx, this_args, attempt_deadline).await;
            let (failure, error) = match ended {
                Attempt::Done(Ok(output)) => {
                    budget.on_success();
                    return self.finish_ok(fence, output).await;
                }
                Attempt::Done(Err(error)) => (error.classify(), Some(error)),
                Attempt::TimedOut => (crate::failure::Failure::ambiguous(), None),
            };
            let as_error = |error: Option<T::Error>| match error {
                Some(error) => Error::Tool { tool: self.name(), error },
                None => Error::Timeout {
                    tool: self.name(),
                    timeout: attempt_deadline - started,
                    attempt,
                },
            };
            match (failure.kind, self.class()) {
                (FailureKind::Permanent, _) => {
                    let err = as_error(error);
                    if let (Some(fence), Error::Tool { error, .. }) = (fence, &err) {
                        match serde_json::to_string(error) {
                            Ok(json) => {
                                let outcome = Outcome::Failure(json);
                                let ttl = self.policy.failure_ttl;
                                // Not stored (store down, lease lost): the caller still gets the
                                // tool's answer; the claim ends with its lease.
                                if let Err(e) = self.store_outcome(fence, &outcome, ttl).await {
                                    tracing::warn!(error = %e, "permanent failure not stored");
                                }
                            }
                            // A permanent failure means nothing happened: freeing the key is
                            // safe, and better than storing what cannot be replayed.
                            Err(_) => self.release(fence).await,
                        }
                    }
                    return Err(err);
                }
                (FailureKind::Ambiguous, RetryClass::Never) => {
                    budget.on_failure();
                    if let Some(fence) = fence {
                        // Kept until someone reconciles it, not for the retention of a result:
                        // expiring it would let the tool run a second time. If the store cannot
                        // take it, the claim stays in flight and reads as unknown once its lease
                        // ends: either way the honest answer is "unknown", never "not executed".
                        if let Err(e) = self.store_outcome(fence, &Outcome::Unknown, FOREVER).await
                        {
                            tracing::warn!(error = %e, "unknown outcome not stored");
                        }
                    }
                    self.outcome("unknown");
                    return Err(Error::OutcomeUnknown { tool: self.name(), key: self.key });
                }
                (FailureKind::Transient | FailureKind::Ambiguous, _) => {
                    budget.on_failure();
                    let stop = if attempt >= self.policy.attempts {
                        Some(None)
                    } else if !budget.can_retry() {
                        Some(Some(BudgetKind::RetryBudget))
                    } else {
                        let ceiling = self.policy.backoff.ceiling(attempt);
                        let jitter = self.jitter(ceiling);
                        let pause = jitter.max(failure.retry_after.unwrap_or_default());
                        if later(Instant::now(), pause) >= self.deadline {
                            Some(Some(BudgetKind::WallClock))
                        } else {
                            self.pause(fence, pause).await;
                            None
                        }
                    };
                    let Some(budget_kind) = stop else { continue };
                    if let Some(fence) = fence {
                        // Nothing is stored: a later call claims again and, for a keyed tool,
                        // re-runs with the same key so the provider deduplicates.
                        self.release(fence).await;
                    }
                    return Err(match budget_kind {
                        None => as_error(error),
                        Some(budget) => Error::BudgetExhausted { tool: self.name(), budget },
                    });
                }
            }
        }
    }

    /// A broken invariant of the executor itself, reported rather than panicking.
    #[cold]
    fn internal(&self, what: &str) -> Error<T::Error> {
        Error::ReplayFailed {
            tool: self.name(),
            key: self.key,
            reason: format!("internal error in idem's executor: {what}; please report it"),
        }
    }

    fn jitter(&self, ceiling: Duration) -> Duration {
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        let mut rng = self.inner.rng.lock().unwrap_or_else(|p| p.into_inner());
        Duration::from_nanos(rng.random_range(0..=nanos))
    }

    async fn finish_ok(
        &self,
        fence: Option<Fence>,
        output: T::Output,
    ) -> Result<T::Output, Error<T::Error>> {
        let Some(fence) = fence else { return Ok(output) };
        let json = match serde_json::to_string(&output) {
            Ok(json) => json,
            Err(e) => {
                // The effect happened but cannot be stored: keep the claim until its lease ends
                // rather than invite a second run, and tell the caller.
                return Err(Error::ReplayFailed {
                    tool: self.name(),
                    key: self.key,
                    reason: format!("the output could not be serialized: {e}"),
                });
            }
        };
        let outcome = Outcome::Success(json);
        match self.store_outcome(fence, &outcome, self.policy.ttl).await {
            Ok(()) => Ok(output),
            Err(Error::LeaseLost { .. }) => self.after_lease_lost(output, outcome).await,
            Err(e) => {
                // The effect happened and the caller gets its result; the record stays in flight
                // until its lease ends, then a keyed repeat re-runs with the same key and a never
                // repeat answers OutcomeUnknown: nothing runs twice unprotected.
                tracing::warn!(error = %e, "outcome not stored");
                Ok(output)
            }
        }
    }

    /// This call's lease was taken over (it paused, or its renewals failed) after its work
    /// succeeded. The new owner's outcome stands: wait for it and answer with it, so every caller
    /// of the intent receives the same result. If the new owner gave up, this call's result
    /// becomes the intent's (a keyed tool's provider deduplicated both runs by the key).
    async fn after_lease_lost(
        &self,
        output: T::Output,
        outcome: Outcome,
    ) -> Result<T::Output, Error<T::Error>> {
        let lost = || Error::LeaseLost { tool: self.name(), key: self.key };
        if self.class() == RetryClass::Never {
            // Only an operator's `forget` takes a never tool's lease: do not guess.
            return Err(lost());
        }
        match self.acquire(OnExpired::TakeOver).await {
            Ok(Owned::Answer(answer)) => answer,
            Ok(Owned::Fence(fence)) => {
                self.store_outcome(fence, &outcome, self.policy.ttl).await.map(|()| output)
            }
            Err(_) => Err(lost()),
        }
    }

    async fn store_outcome(
        &self,
        fence: Fence,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), Error<T::Error>> {
        self.bounded(self.inner.store.complete(&self.key, fence, outcome, ttl))
            .await
            .map_err(|e| self.store_error(e))
    }

    /// Runs one attempt under its timeout, renewing the lease every third of it.
    async fn run_attempt(
        &self,
        cx: &Ctx,
        args: T::Args,
        deadline: Instant,
    ) -> Attempt<T::Output, T::Error> {
        let mut work = std::pin::pin!(self.tool.run(cx, args));
        // Most attempts of a fast tool finish on their first poll: no timer is armed for them.
        if let Poll::Ready(ended) =
            std::future::poll_fn(|c| Poll::Ready(work.as_mut().poll(c))).await
        {
            return Attempt::Done(ended);
        }
        let timeout = std::pin::pin!(tokio::time::sleep_until(deadline));
        let mut timeout = timeout;
        let Some(fence) = cx.fence else {
            return tokio::select! {
                biased;
                ended = &mut work => Attempt::Done(ended),
                () = &mut timeout => Attempt::TimedOut,
            };
        };
        let period = self.policy.lease / 3;
        let mut renew_at = std::pin::pin!(tokio::time::sleep(period));
        loop {
            tokio::select! {
                biased;
                ended = &mut work => return Attempt::Done(ended),
                () = &mut timeout => return Attempt::TimedOut,
                () = &mut renew_at => {
                    self.renew(fence).await;
                    renew_at.as_mut().reset(later(Instant::now(), period));
                }
            }
        }
    }
}

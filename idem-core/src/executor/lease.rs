//! Owning a key: claim it (or wait for its owner, or replay its outcome), keep the lease alive
//! while the tool works or pauses, store the outcome, release the claim. Every step after the
//! claim is bounded by the store timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::call::Call;
use super::report::Served;
use crate::clock::later;
use crate::error::Chain;
use crate::error::Error;
use crate::key::Scope;
use crate::metrics::StepTimer;
use crate::store::admin::RecordState;
use crate::store::{
    Claim, ClaimRequest, Fence, MemoryStore, OnExpired, Origin, Outcome, Record, StoreError,
};
use crate::tool::Tool;

/// What claiming ended with: this call owns the key, or it already has its answer.
pub(super) enum Owned<T: Tool> {
    /// The key is this call's. `takeover`: a previous owner's lease had ended without a result.
    /// `at_start`: acquired by the in-memory store's first claim, so nothing has waited since the
    /// call's start and its clock reading can time the first attempt.
    Fence {
        fence: Fence,
        takeover: bool,
        at_start: bool,
    },
    Answer(Result<T::Output, Error<T::Error>>),
}

/// What one claim's answer means for the call.
pub(super) enum Settled<T: Tool> {
    /// It owns the key or has its answer.
    Owned(Owned<T>),
    /// Another owner holds the key under `fence`, whose lease has `lease_remaining` left.
    Wait { fence: Fence, lease_remaining: Duration },
}

/// The call's deadline had passed when a claim was due (a zero deadline, or one spent waiting
/// for another owner: nothing is sent), or ran out in a claim after such a wait. Carried as the
/// store error's source so that the call answers [`Error::BudgetExhausted`] with
/// [`BudgetKind::Deadline`](crate::BudgetKind::Deadline), as the in-memory store's calls do, not
/// `StoreUnavailable` about a store nobody asked. (A call's first claim that the store does not
/// answer within the whole deadline is `StoreUnavailable`, naming the deadline: the store did
/// not answer.)
#[derive(Debug, thiserror::Error)]
#[error("the call's deadline had passed before the claim was sent")]
pub(super) struct DeadlineSpent;

impl DeadlineSpent {
    /// Whether `e` says so.
    pub(super) fn is(e: &StoreError) -> bool {
        matches!(e, StoreError::Unavailable(source) if source.downcast_ref::<Self>().is_some())
    }
}

/// The longest pause before claiming again after a wait for another owner failed (full jitter):
/// short next to a lease, and long enough that a store whose waits fail at once is not asked in
/// a busy loop.
const WAIT_FAILED_PAUSE: Duration = Duration::from_millis(250);

/// The first ceiling of the pause before waiting again after a wait returned while the same
/// owner still held the key; it doubles with each such return, up to [`WAIT_FAILED_PAUSE`].
/// [`Store::wait`] may return early (it is a hint), and a store whose wait returns at once would
/// otherwise be asked to claim in a busy loop for as long as the owner runs.
const EARLY_WAKE_PAUSE: Duration = Duration::from_millis(2);

impl<T: Tool> Call<'_, T> {
    /// Claims until this call owns the key or has its answer: waits for another owner's
    /// result, replays a stored one, or says why not. Bounded by the deadline. `at_start`: this
    /// is the call's first claim, right after its start.
    pub(super) async fn acquire(
        &self,
        on_expired: OnExpired,
        at_start: bool,
    ) -> Result<Owned<T>, StoreError> {
        match self.settle(self.claim(on_expired, at_start).await?, false, at_start) {
            Settled::Owned(owned) => Ok(owned),
            // Boxed: the wait's timers would make every call's future larger, and a call that
            // waits for another owner is not in a hurry.
            Settled::Wait { fence, lease_remaining } => {
                Box::pin(self.wait_and_claim(on_expired, fence, lease_remaining)).await
            }
        }
    }

    /// The first claim of a call on the in-memory store, which answers at once: most calls own
    /// the key or have their answer after it, and no claim loop's future is built for them.
    pub(super) fn first_claim_memory(
        &self,
        memory: &MemoryStore,
        on_expired: OnExpired,
    ) -> Settled<T> {
        // The call's first claim follows its start with nothing awaited between: that clock
        // reading serves.
        let timer = StepTimer::start();
        let asks = self.tool.reconciles();
        let claim =
            memory.claim_at(self.claim_request(on_expired), &self.digest, self.started, asks);
        timer.done("claim");
        self.settle(claim, false, true)
    }

    /// What `claim` means for the call (see [`Settled`]). `waited`: the call waited for another
    /// owner before this claim.
    fn settle(&self, claim: Claim, waited: bool, at_start: bool) -> Settled<T> {
        let answer = |a| Settled::Owned(Owned::Answer(a));
        match claim {
            Claim::Acquired { fence, takeover } => {
                let at_start = at_start && self.inner.memory.is_some();
                Settled::Owned(Owned::Fence { fence, takeover, at_start })
            }
            Claim::InFlight { fence, lease_remaining } => Settled::Wait { fence, lease_remaining },
            Claim::Completed(record) => {
                self.outcome(if waited { Served::Joined } else { Served::Replayed });
                answer(self.replay(record))
            }
            Claim::Unknown => {
                self.outcome(Served::Unknown);
                answer(Err(Error::OutcomeUnknown { tool: self.name(), key: self.key }))
            }
            Claim::Mismatch => answer(Err(self.reuse_mismatch())),
        }
    }

    /// Waits for the owner of `fence`, whose lease has `lease_remaining` left, then claims again,
    /// until this call owns the key or has its answer. Bounded by the deadline.
    pub(super) async fn wait_and_claim(
        &self,
        on_expired: OnExpired,
        mut fence: Fence,
        mut lease_remaining: Duration,
    ) -> Result<Owned<T>, StoreError> {
        let store = &self.inner.store;
        // A stopped call waits no more: it holds nothing, and taking the key over afterwards
        // only to let it go would hold it up for a lease.
        let stopped = || Ok(Owned::Answer(Err(self.stopped_waiting())));
        // Waits in a row that returned with the same owner still holding the key.
        let mut early: u32 = 0;
        loop {
            let now = Instant::now();
            if now >= self.deadline {
                return Ok(Owned::Answer(Err(self.deadline_passed())));
            }
            if self.stop_requested() {
                return stopped();
            }
            // Saturating: a store may report a lease of `Duration::MAX` ("no end").
            let max =
                (self.deadline - now).min(lease_remaining.saturating_add(Duration::from_millis(1)));
            if early > 0 {
                let ceiling = EARLY_WAKE_PAUSE
                    .saturating_mul(1 << (early - 1).min(16))
                    .min(WAIT_FAILED_PAUSE);
                let pause = crate::store::full_jitter(ceiling).min(max);
                let Some(()) = self.unless_stopped(tokio::time::sleep(pause)).await else {
                    return stopped();
                };
                if Instant::now() >= self.deadline {
                    continue;
                }
            }
            let max = max.min(self.deadline.saturating_duration_since(Instant::now()));
            self.waiting();
            // A store that stops answering is caught by the next claim's timeout.
            let waited_from = Instant::now();
            let wait = tokio::time::timeout(max, store.wait(&self.key, fence, max));
            let Some(woken) = self.unless_stopped(wait).await else { return stopped() };
            let returned_early = matches!(woken, Ok(Ok(()))) && waited_from.elapsed() < max;
            match woken {
                // A wait only tells when to look again. One that could not watch the record (a
                // connection dropped under it, a store that stopped answering) is not the call's
                // answer while the owner may be charging: after a pause, the claim looks, resent
                // and bounded as any claim, and answers for the store if it is down.
                Ok(Err(StoreError::Unavailable(e))) => {
                    tracing::debug!(error = %e, "the wait for another owner failed; claiming again");
                    let pause = crate::store::full_jitter(WAIT_FAILED_PAUSE).min(max);
                    let Some(()) = self.unless_stopped(tokio::time::sleep(pause)).await else {
                        return stopped();
                    };
                }
                Ok(Err(e)) => return Err(e),
                Ok(Ok(())) | Err(_) => {}
            }
            match self.settle(self.claim(on_expired, false).await?, true, false) {
                Settled::Owned(owned) => return Ok(owned),
                Settled::Wait { fence: f, lease_remaining: l } => {
                    early = if returned_early && f == fence { early.saturating_add(1) } else { 0 };
                    (fence, lease_remaining) = (f, l);
                }
            }
        }
    }

    fn origin<'s>(&self, scope: &'s Scope) -> Origin<'s> {
        Origin { tool: self.name(), tenant: scope.tenant(), run: scope.run_id() }
    }

    /// One claim, bounded by the call's deadline and the store timeout (see
    /// [`Call::claim_once`]). One that acquires the key notes when it was sent, as the instant
    /// the lease is known to run from ([`Call::confirmed_at`]); the call's first claim, sent at
    /// its start (`at_start`), is confirmed as of that start, the default, and stores nothing.
    async fn claim(&self, on_expired: OnExpired, at_start: bool) -> Result<Claim, StoreError> {
        let timer = StepTimer::start();
        let sent = (!at_start).then(Instant::now);
        let answer = match &self.inner.memory {
            // Answers at once: no future, no timeout, nothing left behind. The call's first
            // claim follows its start with nothing awaited between: that clock reading serves.
            Some(memory) => {
                let now = sent.unwrap_or(self.started);
                let asks = self.tool.reconciles();
                Ok(memory.claim_at(self.claim_request(on_expired), &self.digest, now, asks))
            }
            None => self.claim_once(on_expired, at_start).await,
        };
        if let (Some(sent), Ok(Claim::Acquired { .. })) = (sent, &answer) {
            self.confirmed_at(sent);
        }
        timer.done("claim");
        answer
    }

    fn claim_request(&self, on_expired: OnExpired) -> ClaimRequest<'_> {
        ClaimRequest {
            key: &self.key,
            fingerprint: &self.fingerprint,
            lease: self.policy.lease,
            on_expired,
            origin: self.origin(self.scope),
        }
    }

    /// One claim on a store elsewhere, bounded by the call's deadline and the store timeout. A
    /// claim that does not answer in time is finished in the background and released if it
    /// acquired, so a slow store leaves no phantom owner behind (for a never tool that would read
    /// as an unknown outcome).
    async fn claim_once(&self, on_expired: OnExpired, at_start: bool) -> Result<Claim, StoreError> {
        if self.inner.local_store {
            // Answers without I/O: nothing to bound, nothing left behind.
            return self.inner.store.claim(self.claim_request(on_expired)).await;
        }
        let now = Instant::now();
        if now >= self.deadline {
            return Err(StoreError::Unavailable(Arc::new(DeadlineSpent)));
        }
        let bound = later(now, self.policy.store_timeout).min(self.deadline);
        let store = Arc::clone(&self.inner.store);
        let (key, fingerprint, lease) = (self.key, self.fingerprint, self.policy.lease);
        let (scope, tool) = (Arc::clone(self.scope), self.name());
        let claim = Box::pin(async move {
            let origin = Origin { tool, tenant: scope.tenant(), run: scope.run_id() };
            let req =
                ClaimRequest { key: &key, fingerprint: &fingerprint, lease, on_expired, origin };
            store.claim(req).await
        });
        // Once sent, a claim may be acquired by the store whether or not this call still waits
        // for it (a SQL statement runs on after its future is dropped): whoever stops waiting,
        // the store timeout or the caller's cancellation, leaves the claim to finish in the
        // background, where a fresh key it acquired is released (see `Abandonable`).
        let mut claim = Abandonable {
            claim: Some(claim),
            store: Arc::clone(&self.inner.store),
            key,
            limit: self.policy.store_timeout,
        };
        match tokio::time::timeout_at(bound, &mut claim).await {
            Ok(answer) => answer,
            Err(_) => {
                drop(claim);
                if bound >= self.deadline && !at_start {
                    // After a wait for another owner (or a pause), the deadline ran out in the
                    // claim that followed: the budget was spent waiting, as when the wait itself
                    // reaches the deadline a moment later, not a store that failed to answer.
                    return Err(StoreError::Unavailable(Arc::new(DeadlineSpent)));
                }
                // Name the limit that ran out, so a misconfigured one (a zero store timeout)
                // is found from the message.
                let limit = if bound < self.deadline {
                    "Policy::store_timeout"
                } else {
                    "the call's deadline"
                };
                Err(StoreError::timed_out(format!(
                    "the store did not answer the claim within {:?} ({limit})",
                    bound.saturating_duration_since(now)
                )))
            }
        }
    }

    /// A store step after the claim (complete, release, renew), bounded by the store timeout,
    /// not by the call's deadline: the tool's work is done and its outcome should be kept.
    /// Its latency is recorded under `name` (`idem_store_step_seconds`).
    pub(super) async fn bounded(
        &self,
        name: &'static str,
        step: impl Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        let timer = StepTimer::start();
        let result = if self.inner.local_store {
            step.await
        } else {
            let timeout = self.policy.store_timeout;
            match tokio::time::timeout(timeout, step).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::timed_out(format!(
                    "the store did not answer within {timeout:?} (Policy::store_timeout)"
                ))),
            }
        };
        timer.done(name);
        result
    }

    pub(super) async fn release(&self, fence: Fence) {
        // A failed release only delays the next claim until the lease ends.
        let _ = self.bounded("release", self.inner.store.release(&self.key, fence)).await;
    }

    /// Renews the lease under `fence`; `false` once the store refused it as taken over (the
    /// fence never becomes current again: fences only increase).
    pub(super) async fn renew(&self, fence: Fence) -> bool {
        let sent = Instant::now();
        let renewed = self
            .bounded("renew", self.inner.store.renew(&self.key, fence, self.policy.lease))
            .await;
        match renewed {
            Ok(()) => {
                self.confirmed_at(sent);
                true
            }
            Err(e) => {
                // Keep running: stopping mid-effect is itself ambiguous. A lost lease surfaces as
                // LeaseLost when the outcome is stored.
                tracing::warn!(error = %Chain(&e), "lease renewal failed");
                if let StoreError::LeaseLost = e {
                    self.lost.store(fence.0, std::sync::atomic::Ordering::Relaxed);
                    return false;
                }
                true
            }
        }
    }

    /// Sleeps `pause` before the next attempt; `false` when the caller stopped the call
    /// ([`super::Run::with_stop`]) before it ended.
    pub(super) async fn pause(&self, fence: Option<Fence>, pause: Duration) -> bool {
        self.unless_stopped(self.pause_renewing(fence, pause)).await.is_some()
    }

    /// Sleeps `pause`, still renewing the lease (a provider's retry-after may be longer than the
    /// lease). The renewals run beside the pause, not in it, as beside an attempt: a store slow
    /// to answer a renewal (up to the store timeout) must not make the pause longer than asked,
    /// which would start the retry late, or past the call's deadline.
    async fn pause_renewing(&self, fence: Option<Fence>, pause: Duration) {
        let until = tokio::time::sleep_until(later(Instant::now(), pause));
        let Some(fence) = fence else {
            until.await;
            return;
        };
        // A renewal the store refused ends the pause: the key is another owner's now, and its
        // answer is the call's (the attempt loop rejoins it), not one to hear only when a long
        // retry-after has run out.
        let mut renewals = std::pin::pin!(self.renew_while_held(fence));
        tokio::select! {
            biased;
            () = until => {}
            () = &mut renewals => {}
        }
    }

    /// Whether the caller stopped the call ([`super::Run::with_stop`]).
    pub(super) fn stop_requested(&self) -> bool {
        self.stop.is_some_and(|s| s.is_stopped())
    }

    /// `work`'s output, or `None` when the caller stops the call first: the one place a wait
    /// hears a stop (a pause before a retry, a wait for another owner, a joiner's wait).
    pub(super) async fn unless_stopped<F: std::future::Future>(
        &self,
        work: F,
    ) -> Option<F::Output> {
        match self.stop {
            None => Some(work.await),
            Some(stop) => tokio::select! {
                out = work => Some(out),
                () = stop.stopped() => None,
            },
        }
    }

    /// A call stopped before its first claim: it claims nothing, but an outcome already stored
    /// for its key starts nothing and is what the caller asked for, so it is replayed (and a
    /// reuse of the key with other arguments refused) as a claim would have; `Cancelled`, which
    /// tells the caller that nothing is stored and a repeat runs the tool, would be false there.
    /// Anything else (no record, an owner's lease, a store that cannot be read this way) is
    /// `Cancelled` with nothing run.
    pub(super) async fn stopped_before_claim(&self) -> Result<T::Output, Error<T::Error>> {
        if let Ok(Some(info)) = self.inner.store.inspect(&self.key).await {
            if info.fingerprint != self.fingerprint {
                return Err(self.reuse_mismatch());
            }
            if let RecordState::Done(outcome) = info.state {
                self.outcome(Served::Replayed);
                return self.replay(Record { fingerprint: info.fingerprint, outcome });
            }
        }
        Err(self.cancelled(0))
    }

    /// The error of a call its caller stopped after `attempts` attempts.
    pub(super) fn cancelled(&self, attempts: u32) -> Error<T::Error> {
        Error::Cancelled { tool: self.name(), attempts }
    }

    /// The error of a call its caller stopped while it waited for another call with its key.
    pub(super) fn stopped_waiting(&self) -> Error<T::Error> {
        Error::StoppedWaiting { tool: self.name(), key: self.key }
    }

    /// Ends a call its caller stopped after `attempts` attempts: the key it holds is released
    /// (nothing more will run under it), except a dead owner's record it took over and ran
    /// nothing under, which is left to its lease so that the dead owner's attempt is not erased.
    pub(super) async fn stopped(&self, fence: Option<Fence>, attempts: u32) -> Error<T::Error> {
        if let Some(fence) = fence {
            let took_over = self.served.get() == Some(Served::TakenOver);
            if attempts > 0 || !took_over {
                self.release(fence).await;
            }
        }
        self.cancelled(attempts)
    }

    /// Stores `outcome` under `fence`: moved into the record of the in-memory store, lent to
    /// any other. On failure the outcome is handed back with the error.
    pub(super) async fn store_outcome(
        &self,
        fence: Fence,
        outcome: Outcome,
        ttl: Duration,
    ) -> Result<(), (Error<T::Error>, Outcome)> {
        if let Some(memory) = &self.inner.memory {
            let timer = StepTimer::start();
            let done = memory.complete_owned(&self.digest, fence, outcome, ttl);
            timer.done("complete");
            return done.map_err(|outcome| (self.store_error(StoreError::LeaseLost), outcome));
        }
        match self
            .bounded("complete", self.inner.store.complete(&self.key, fence, &outcome, ttl))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => Err((self.store_error(e), outcome)),
        }
    }
}

/// A claim sent to the store, which the call may stop waiting for. Dropped before its answer
/// (the store timeout ran out, or the caller was cancelled: a `select!`, a timeout around the
/// call, a client that left), it is finished on the runtime, for at most the store timeout
/// more, and a fresh key it acquired is released, so no record is left in flight with no
/// owner: a `never` tool's repeat would otherwise wait out the lease and then answer "outcome
/// unknown" for a call that never ran. A takeover it acquired is left to its lease: releasing
/// it would erase the dead owner's attempt, which may have taken effect, and the next caller
/// takes it over in turn (and asks the tool's check, if it has one).
struct Abandonable {
    claim: Option<futures_util::future::BoxFuture<'static, Result<Claim, StoreError>>>,
    store: Arc<dyn crate::store::Store>,
    key: crate::key::Key,
    /// How much longer an abandoned claim may take (`Policy::store_timeout`).
    limit: Duration,
}

impl Future for Abandonable {
    type Output = Result<Claim, StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(claim) = self.claim.as_mut() else {
            return std::task::Poll::Ready(Err(StoreError::unavailable("the claim was answered")));
        };
        let answer = std::task::ready!(claim.as_mut().poll(cx));
        self.claim = None;
        std::task::Poll::Ready(answer)
    }
}

impl Drop for Abandonable {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else { return };
        // Outside a runtime (it is shutting down) nothing can run: the lease ends the record.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (store, key, limit) = (Arc::clone(&self.store), self.key, self.limit);
        runtime.spawn(async move {
            let answer = tokio::time::timeout(limit, claim).await;
            if let Ok(Ok(Claim::Acquired { fence, takeover: false })) = answer {
                let _ = tokio::time::timeout(limit, store.release(&key, fence)).await;
            }
        });
    }
}

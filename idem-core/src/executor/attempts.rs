//! The attempt loop of a call that owns its key (or runs without the store): run an attempt under
//! its timeout, classify how it failed, decide the next step ([`Next`]), and store the outcome.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt;
use rand::Rng;
use tokio::time::Instant;

use super::call::Call;
use super::caught::{caught, panic_message};
use super::lease::Owned;
use super::report::Served;
use super::storable::{Unstorable, stored_json};
use crate::class::RetryClass;
use crate::clock::{FOREVER, later};
use crate::ctx::Ctx;
use crate::error::Chain;
use crate::error::{BudgetKind, Error};
use crate::failure::{Classify, Failure, FailureKind};
use crate::metrics::StepTimer;
use crate::reconcile::Reconciled;
use crate::store::{Fence, OnExpired, Outcome, StoreError};
use crate::tool::Tool;

/// The reason of [`Error::OutputNotStorable`] and [`Outcome::NotStorable`].
fn not_storable_reason(why: &dyn std::fmt::Display) -> String {
    format!("the tool ran, but its output could not be stored: {why}")
}

/// How [`Call::finish_ok_now`] left a call: answered, or with a completion still to await.
pub(super) enum Finish<T: Tool> {
    Done(Result<T::Output, Error<T::Error>>),
    /// A store other than the in-memory one completes the record.
    Store(Storing<T>),
    /// The in-memory store refused the completion: another caller took the key over.
    LeaseLost {
        output: T::Output,
        outcome: Outcome,
    },
}

/// An outcome to store under `fence`, and what the caller gets once it is stored (or could not
/// be): the output, or the error of an output too deep to store.
pub(super) struct Storing<T: Tool> {
    fence: Fence,
    outcome: Outcome,
    then: Result<T::Output, Error<T::Error>>,
    /// `outcome` is the output's JSON, which reads back as itself.
    success: bool,
}

/// How one attempt ended.
enum Attempt<O, E> {
    Done(Result<O, E>),
    TimedOut,
    /// The body panicked; the message of its payload.
    Panicked(String),
}

/// What the store says of a fence this call held.
pub(super) enum Holds {
    /// Still current.
    Yes,
    /// Another caller took the key over.
    Lost,
    /// The store did not answer: a store step under the fence later finds out (fenced), so
    /// only what cannot be undone (running the body again) waits for a confirmation.
    Unconfirmed,
}

/// What a body's future gives when polled through `catch_unwind`.
type Caught<O, E> = Result<Result<O, E>, Box<dyn std::any::Any + Send>>;

impl<O, E> Attempt<O, E> {
    fn from_caught(caught: Caught<O, E>) -> Self {
        match caught {
            Ok(ended) => Attempt::Done(ended),
            Err(payload) => Attempt::Panicked(panic_message(payload.as_ref())),
        }
    }
}

/// What follows a transient or ambiguous failure that the class allows to retry.
#[derive(Debug, PartialEq)]
enum Next {
    /// Sleep `pause` (full jitter, at least the tool's retry-after), then run the next attempt.
    Retry { pause: Duration },
    /// No further attempt: the claim is released and the caller is told why.
    Stop(Stop),
}

/// Why no further attempt is made.
#[derive(Debug, PartialEq)]
enum Stop {
    /// Every allowed attempt ran: the caller gets the last attempt's error.
    AttemptsUsed,
    /// A budget refuses the retry: the shared retry budget, or the deadline, before which the
    /// wait (at least the tool's `retry_after`) would not end.
    Exhausted { budget: BudgetKind, retry_after: Option<Duration> },
}

impl<T: Tool> Call<'_, T> {
    /// The attempts loop, holding `fence` (or none for a safe tool that does not use the store).
    /// `started`: a clock reading taken with nothing awaited since, which times the first attempt
    /// (one clock read fewer; the attempt's timeout counts from a moment before it started).
    pub(super) async fn attempts(
        &self,
        args: T::Args,
        mut fence: Option<Fence>,
        mut started: Option<Instant>,
    ) -> Result<T::Output, Error<T::Error>> {
        let budget = &self.inner.budget;
        // A reconciling tool keeps the arguments for its check, after the last attempt too.
        let reconciles = self.tool.reconciles() && fence.is_some();
        let mut args = Some(args);
        let mut attempt = 0u32;
        // Attempts allowed: the policy's, plus one for a never tool whose check found that its
        // ambiguous attempt did not happen (at most once per call).
        let mut allowed = self.policy.attempts;
        loop {
            // A stop is heard between steps only: never in the middle of an attempt.
            if self.stop_requested() {
                return Err(self.stopped(fence, attempt).await);
            }
            attempt += 1;
            if !self.span.is_disabled() {
                self.span.record("idem.attempt", attempt);
            }
            let started = started.take().unwrap_or_else(Instant::now);
            if started >= self.deadline {
                // Waiting for a duplicate used the time up to the deadline: starting an attempt that would
                // time out at once would only make its outcome ambiguous.
                if let Some(fence) = fence {
                    self.release(fence).await;
                }
                return Err(self.deadline_passed());
            }
            crate::metrics::attempt(self.name(), self.class().as_str());
            let attempt_deadline = later(started, self.policy.attempt_timeout).min(self.deadline);
            let cx = Ctx { key: self.key, attempt, deadline: attempt_deadline, fence };
            // The last allowed attempt takes the arguments; earlier ones need a copy for a retry
            // (copied where they are, not moved out and back), unless a retry can read its own
            // back from the intent.
            let this_args = match args.as_ref() {
                // The arguments' `Clone` is the user's code, as the body is.
                Some(a) if reconciles || (attempt < allowed && !T::ARGS_FROM_INTENT) => {
                    match caught(|| a.clone()) {
                        Ok(copy) => copy,
                        // Before the attempt ran: nothing happened in it, so the key is released
                        // (a never tool's too: it reaches a further attempt only when nothing
                        // happened before).
                        Err(message) => {
                            let message = format!("the arguments' `Clone` panicked: {message}");
                            return Err(self.panicked_releasing(fence, attempt, message).await);
                        }
                    }
                }
                _ => match args.take() {
                    Some(a) => a,
                    None => return Err(self.internal("arguments used up before the last attempt")),
                },
            };
            // A `run` written by hand may do part of its work before it returns its future: a
            // panic there is the attempt's, as one in the future's body is.
            let ended = match caught(|| self.tool.run(&cx, this_args)) {
                Err(message) => Attempt::Panicked(message),
                Ok(work) => {
                    // A panicking body is caught at each poll and ends its attempt (the caller
                    // gets an error, the key is settled), instead of unwinding through the call
                    // and leaving the key claimed until its lease ends. The body is not touched
                    // after.
                    let work = FutureExt::catch_unwind(AssertUnwindSafe(work));
                    let mut work = std::pin::pin!(work);
                    // Most attempts of a fast tool finish on their first poll: no timer is armed
                    // for them, and the future that times and renews an attempt is built (boxed,
                    // so the call's own future stays small) only for those that wait.
                    match std::future::poll_fn(|c| Poll::Ready(work.as_mut().poll(c))).await {
                        Poll::Ready(caught) => Attempt::from_caught(caught),
                        Poll::Pending => {
                            Box::pin(self.attempt_pending(work.as_mut(), fence, attempt_deadline))
                                .await
                        }
                    }
                }
            };
            let (failure, error) = match ended {
                Attempt::Done(Ok(output)) => {
                    budget.on_success();
                    return match self.finish_ok_now(fence, output) {
                        Finish::Done(result) => result,
                        rest => self.finish_ok_later(rest).await,
                    };
                }
                // The error type's own code: a panic there ends the attempt as the body's would
                // (duplicates hear at once instead of waiting out the lease).
                Attempt::Done(Err(error)) => match caught(|| error.classify()) {
                    Ok(failure) => (failure, Some(error)),
                    Err(message) => {
                        budget.on_failure();
                        let message = format!("`Classify::classify` panicked: {message}");
                        return self.after_panic(fence, attempt, message, args.as_ref()).await;
                    }
                },
                Attempt::TimedOut => (Failure::ambiguous(), None),
                Attempt::Panicked(message) => {
                    budget.on_failure();
                    return self.after_panic(fence, attempt, message, args.as_ref()).await;
                }
            };
            let error = match error {
                Some(error) => Error::Tool { tool: self.name(), error },
                None => Error::Timeout {
                    tool: self.name(),
                    timeout: attempt_deadline - started,
                    attempt,
                },
            };
            match (failure.kind, self.class()) {
                (FailureKind::Permanent, _) => return Err(self.permanent(fence, error).await),
                (FailureKind::Ambiguous, RetryClass::Never) => {
                    budget.on_failure();
                    if let (true, Some(fence), Some(kept)) = (reconciles, fence, args.as_ref()) {
                        // Only the fence's holder asks, and runs again: a lease taken over while
                        // the attempt ran (renewals failed for a whole lease, the worker was
                        // blocked) is another caller's now, and so is the key's answer.
                        if let Holds::Lost = self.still_holds(fence).await {
                            return Err(self.lease_lost());
                        }
                        match self.ask_check(fence, kept).await {
                            Reconciled::Happened(output) => {
                                return self.happened(fence, output).await;
                            }
                            // Nothing happened: the call goes on as a never tool does, with
                            // its one attempt (still holding the fence: no other caller runs).
                            Reconciled::NotHappened if allowed == self.policy.attempts => {
                                match self.still_holds(fence).await {
                                    Holds::Yes => {}
                                    Holds::Lost => return Err(self.lease_lost()),
                                    // Not run again without the fence confirmed, and nothing
                                    // stored: the record is left to its lease, and the next
                                    // caller takes it over and asks the check in turn.
                                    Holds::Unconfirmed => return Err(error),
                                }
                                allowed += 1;
                                continue;
                            }
                            // Nothing happened twice: free the key, as after a transient
                            // failure, rather than run a third time in one call.
                            Reconciled::NotHappened => {
                                self.release(fence).await;
                                return Err(error);
                            }
                            Reconciled::Unknown => {}
                        }
                    }
                    return Err(self.unknown(fence).await);
                }
                (FailureKind::Transient | FailureKind::Ambiguous, _) => {
                    budget.on_failure();
                    let stop = match self.next(attempt, &failure) {
                        Next::Retry { pause } => {
                            if args.is_none() {
                                match self.args_from_intent() {
                                    Ok(read) => args = Some(read),
                                    // No retry without arguments: the caller hears the last
                                    // attempt's error, as when the attempts are used up.
                                    Err(why) => {
                                        tracing::error!(tool = self.name(), attempt, "{why}");
                                        if let Some(fence) = fence {
                                            self.release(fence).await;
                                        }
                                        return Err(error);
                                    }
                                }
                            }
                            if !self.pause(fence, pause).await {
                                return Err(self.stopped(fence, attempt).await);
                            }
                            // A call that paused past its lease (its process stalled, its
                            // renewals failed) may have lost the key to another caller, who
                            // runs the tool now: the next attempt starts only under a fence the
                            // store still accepts. Asked only when the lease may have lapsed.
                            // A fence a renewal found taken over is not asked about again:
                            // the store's answer cannot change.
                            if let Some(held) = fence
                                && self.lease_may_have_lapsed(held)
                                && (self.refused(held)
                                    || matches!(self.still_holds(held).await, Holds::Lost))
                            {
                                match self.rejoin(attempt).await {
                                    Ok(owned) => fence = Some(owned),
                                    // The wait for the new owner ran to the deadline: as a pause
                                    // that ends there, the caller hears the tool's last error
                                    // and its hint. The key is the new owner's: nothing to
                                    // release.
                                    Err(Err(Error::BudgetExhausted {
                                        budget: BudgetKind::Deadline,
                                        error: None,
                                        ..
                                    })) => {
                                        let budget = BudgetKind::Deadline;
                                        let retry_after = failure.retry_after;
                                        let stop = Stop::Exhausted { budget, retry_after };
                                        return Err(self.stop_error(stop, error));
                                    }
                                    Err(answer) => return answer,
                                }
                            }
                            if Instant::now() < self.deadline {
                                continue;
                            }
                            // The pause ended at the deadline or past it (a timer fires on the
                            // next millisecond; confirming the lease took the store's time): no
                            // attempt, and the caller hears why with the tool's last error, as
                            // when the pause would have ended past the deadline.
                            Stop::Exhausted {
                                budget: BudgetKind::Deadline,
                                retry_after: failure.retry_after,
                            }
                        }
                        Next::Stop(stop) => stop,
                    };
                    // A keyed tool whose last attempt was ambiguous: the check may know that it
                    // happened, and then its output is the call's.
                    if let (FailureKind::Ambiguous, true, Some(fence), Some(kept)) =
                        (failure.kind, reconciles, fence, args.as_ref())
                        && let Reconciled::Happened(output) = self.ask_check(fence, kept).await
                    {
                        return self.happened(fence, output).await;
                    }
                    if let Some(fence) = fence {
                        // Nothing is stored: a later call claims again and, for a keyed tool,
                        // re-runs with the same key so the provider deduplicates.
                        self.release(fence).await;
                    }
                    return Err(self.stop_error(stop, error));
                }
            }
        }
    }

    /// A retry's own arguments, read back from the intent's canonical text
    /// ([`Tool::ARGS_FROM_INTENT`]): only if they write that same intent again, so that the retry
    /// runs what the key names. The arguments' `Deserialize` and `Serialize` are the user's code:
    /// a panic there is a refusal too.
    fn args_from_intent(&self) -> Result<T::Args, String> {
        let read = caught(|| serde_json::from_slice::<T::Args>(self.intent))
            .map_err(|panic| format!("reading the arguments back for a retry panicked: {panic}"))?
            .map_err(|e| format!("the arguments do not read back from their intent: {e}"))?;
        let mut again = Vec::with_capacity(self.intent.len());
        match caught(|| T::write_intent(&read, &mut again)) {
            Ok(Ok(())) if again == self.intent => Ok(read),
            _ => Err("the arguments read back from their intent write another intent; the tool \
                      must not set `ARGS_FROM_INTENT`"
                .to_owned()),
        }
    }

    /// The caller's error when the retries stop for `stop` after the tool's last `error`.
    fn stop_error(&self, stop: Stop, error: Error<T::Error>) -> Error<T::Error> {
        match (stop, error) {
            (Stop::AttemptsUsed, error) => error,
            // The tool's last error and its hint go to the caller, with the reason.
            (Stop::Exhausted { budget, retry_after }, Error::Tool { tool, error }) => {
                Error::BudgetExhausted { tool, budget, error: Some(error), retry_after }
            }
            (Stop::Exhausted { budget, retry_after }, _) => {
                Error::BudgetExhausted { tool: self.name(), budget, error: None, retry_after }
            }
        }
    }

    /// The decision after failed attempt number `attempt`, which may be retried: a retry needs an
    /// attempt left, the shared retry budget's consent, and time for the pause before the deadline.
    fn next(&self, attempt: u32, failure: &Failure) -> Next {
        if attempt >= self.policy.attempts {
            return Next::Stop(Stop::AttemptsUsed);
        }
        if !self.inner.budget.can_retry() {
            crate::metrics::retry_budget_refusal(self.name());
            let retry_after = failure.retry_after;
            return Next::Stop(Stop::Exhausted { budget: BudgetKind::RetryBudget, retry_after });
        }
        let ceiling = self.policy.backoff.ceiling(attempt);
        let pause = self.jitter(ceiling).max(failure.retry_after.unwrap_or_default());
        if later(Instant::now(), pause) >= self.deadline {
            let retry_after = failure.retry_after;
            return Next::Stop(Stop::Exhausted { budget: BudgetKind::Deadline, retry_after });
        }
        Next::Retry { pause }
    }

    /// A permanent failure: stored and replayed when it is the tool's own error and the call owns
    /// the key. Returns the caller's error.
    async fn permanent(&self, fence: Option<Fence>, err: Error<T::Error>) -> Error<T::Error> {
        if let (Some(fence), Error::Tool { error, .. }) = (fence, &err) {
            // Checked as an output is (docs/design.md §6.4): an error that would not read back
            // as itself (a NaN, a `Serialize` its `Deserialize` does not mirror) would replay
            // as another error than the one this caller gets.
            let json =
                stored_json(error).ok().filter(|json| json.len() <= self.policy.max_outcome_bytes);
            match json {
                Some(json) => {
                    let outcome = Outcome::Failure(json);
                    let ttl = self.policy.failure_ttl;
                    // Not stored: the caller still gets the tool's answer, and the failure is sent
                    // again in the background while the store is away (`store_later.rs`); a lost
                    // lease leaves the record to its new owner.
                    if let Err((e, outcome)) = self.store_outcome(fence, outcome, ttl).await {
                        self.store_later(fence, outcome, ttl, &e);
                    }
                }
                // A permanent failure means nothing happened: freeing the key is safe, and better
                // than storing what cannot be replayed as itself (or is past the limits).
                None => self.release(fence).await,
            }
        }
        err
    }

    /// An attempt that panicked, with the arguments `kept` (a tool with a check keeps a copy for
    /// it): a never tool's outcome is not known, and its check is asked before "outcome unknown"
    /// is answered (as after an ambiguous failure; only the fence's holder asks): happened, its
    /// output is the call's; not happened, the key is released and the caller gets `Panicked`.
    async fn after_panic(
        &self,
        fence: Option<Fence>,
        attempt: u32,
        message: String,
        kept: Option<&T::Args>,
    ) -> Result<T::Output, Error<T::Error>> {
        if let (RetryClass::Never, true, Some(fence), Some(kept)) =
            (self.class(), self.tool.reconciles(), fence, kept)
        {
            if let Holds::Lost = self.still_holds(fence).await {
                tracing::error!(tool = self.name(), attempt, panic = %message, "the tool panicked");
                return Err(self.lease_lost());
            }
            match self.ask_check(fence, kept).await {
                Reconciled::Happened(output) => {
                    tracing::error!(tool = self.name(), attempt, panic = %message, "the tool panicked");
                    return self.happened(fence, output).await;
                }
                Reconciled::NotHappened => {
                    return Err(self.panicked_releasing(Some(fence), attempt, message).await);
                }
                Reconciled::Unknown => {}
            }
        }
        Err(self.panicked(fence, attempt, message).await)
    }

    /// An attempt whose body panicked: no further attempt (a panic is a bug, and its effect may
    /// have happened). A never tool's outcome is unknown, stored so as after a timeout; any
    /// other tool's key is released, as after a failure that left nothing to replay.
    async fn panicked(
        &self,
        fence: Option<Fence>,
        attempt: u32,
        message: String,
    ) -> Error<T::Error> {
        if self.class() == RetryClass::Never {
            tracing::error!(tool = self.name(), attempt, panic = %message, "the tool panicked");
            return self.unknown(fence).await;
        }
        self.panicked_releasing(fence, attempt, message).await
    }

    /// A panic after which nothing may have happened that a repeat must not repeat: the key is
    /// released and the caller gets `Panicked`.
    async fn panicked_releasing(
        &self,
        fence: Option<Fence>,
        attempt: u32,
        message: String,
    ) -> Error<T::Error> {
        tracing::error!(tool = self.name(), attempt, panic = %message, "the tool panicked");
        if let Some(fence) = fence {
            self.release(fence).await;
        }
        Error::Panicked { tool: self.name(), attempt, message }
    }

    /// An ambiguous failure of a never tool: the outcome is unknown, for good.
    pub(super) async fn unknown(&self, fence: Option<Fence>) -> Error<T::Error> {
        if let Some(fence) = fence {
            // Kept until someone reconciles it, not for the retention of a result: expiring it
            // would let the tool run a second time. If the store cannot take it, it is sent again
            // in the background as any outcome is (`store_later.rs`); until it lands the claim
            // stays in flight and reads as unknown once its lease ends: either way the honest
            // answer is "unknown", never "not executed".
            if let Err((e, outcome)) = self.store_outcome(fence, Outcome::Unknown, FOREVER).await {
                self.store_later(fence, outcome, FOREVER, &e);
            }
        }
        self.outcome(Served::Unknown);
        Error::OutcomeUnknown { tool: self.name(), key: self.key }
    }

    fn jitter(&self, ceiling: Duration) -> Duration {
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        let mut rng = crate::sync::lock(&self.inner.rng);
        Duration::from_nanos(rng.random_range(0..=nanos))
    }

    /// Finishes a call whose attempt (or check) gave `output`: checks that it can be stored and
    /// stores it under `fence`, then answers with it.
    pub(super) async fn finish_ok(
        &self,
        fence: Option<Fence>,
        output: T::Output,
    ) -> Result<T::Output, Error<T::Error>> {
        match self.finish_ok_now(fence, output) {
            Finish::Done(result) => result,
            rest => self.finish_ok_later(rest).await,
        }
    }

    /// [`Call::finish_ok`] as far as it goes without awaiting: all of it on the in-memory store
    /// unless the lease was lost; up to the completion on any other store.
    pub(super) fn finish_ok_now(&self, fence: Option<Fence>, output: T::Output) -> Finish<T> {
        // serde_json writes without a depth limit, and so does every caller that turns the output
        // into JSON: an output past the limit (docs/key-spec.md, "Limits") goes no further. It
        // is leaked, not dropped: dropping it would recurse as deep as it is.
        // The record says the effect happened and its output could not be stored, as for any
        // output that cannot be stored: every later caller hears it.
        // With a store, the storability check is also the depth check; without one, only depth.
        // A panic in the output's `Serialize` or `Deserialize` (the user's code) is caught there:
        // the output cannot be written, so it goes no further either.
        let checked = match fence {
            Some(_) => stored_json(&output),
            None => match caught(|| crate::limits::check_depth(&output)) {
                Ok(depth) => depth.map(|()| String::new()).map_err(Unstorable::TooDeep),
                Err(message) => Err(Unstorable::Panicked(message)),
            },
        };
        if let Err(why @ (Unstorable::TooDeep(_) | Unstorable::Panicked(_))) = &checked {
            if matches!(why, Unstorable::TooDeep(_)) {
                std::mem::forget(output);
            } else {
                drop(output);
            }
            let error = self.not_storable(why);
            if let (Some(fence), Error::OutputNotStorable { reason, .. }) = (fence, &error) {
                let outcome = Outcome::NotStorable(reason.clone());
                return self.store_now(Storing {
                    fence,
                    outcome,
                    then: Err(error),
                    success: false,
                });
            }
            return Finish::Done(Err(error));
        }
        let Some(fence) = fence else { return Finish::Done(Ok(output)) };
        let outcome = match checked {
            // Sending more than the policy allows could block a shared store: only the short
            // record that the output could not be stored is sent. This caller has the output.
            Ok(json) if json.len() > self.policy.max_outcome_bytes => {
                let limit = self.policy.max_outcome_bytes;
                Outcome::NotStorable(not_storable_reason(&format_args!(
                    "its JSON is {} bytes, more than the limit of {limit} bytes (Policy::max_outcome_bytes)",
                    json.len()
                )))
            }
            Ok(json) => Outcome::Success(json),
            // The effect happened but its output would not replay as itself: the record says so,
            // and every later caller hears it. This caller has the real output.
            Err(why) => Outcome::NotStorable(not_storable_reason(&why)),
        };
        let success = matches!(outcome, Outcome::Success(_));
        self.store_now(Storing { fence, outcome, then: Ok(output), success })
    }

    /// Stores at once on the in-memory store; leaves any other store's completion to
    /// [`Call::finish_ok_later`].
    fn store_now(&self, storing: Storing<T>) -> Finish<T> {
        let Some(memory) = &self.inner.memory else { return Finish::Store(storing) };
        let Storing { fence, outcome, then, success } = storing;
        let timer = StepTimer::start();
        let stored = memory.complete_owned(&self.digest, fence, outcome, self.policy.ttl);
        timer.done("complete");
        match (stored, then) {
            (Ok(()), then) => {
                if success {
                    self.served.set_output_checked();
                }
                Finish::Done(then)
            }
            (Err(outcome), Ok(output)) => Finish::LeaseLost { output, outcome },
            (Err(_), Err(error)) => {
                let e = self.store_error(StoreError::LeaseLost);
                tracing::warn!(error = %Chain(&e), "outcome not stored");
                Finish::Done(Err(error))
            }
        }
    }

    /// The rest of [`Call::finish_ok`] after [`Call::finish_ok_now`].
    pub(super) async fn finish_ok_later(
        &self,
        rest: Finish<T>,
    ) -> Result<T::Output, Error<T::Error>> {
        let Storing { fence, outcome, then, success } = match rest {
            Finish::Done(result) => return result,
            // Boxed: a lease lost is rare, and taking the key back needs the claim loop.
            Finish::LeaseLost { output, outcome } => {
                return Box::pin(self.after_lease_lost(output, outcome)).await;
            }
            Finish::Store(storing) => storing,
        };
        let checked = || {
            if success {
                self.served.set_output_checked();
            }
        };
        match (self.store_outcome(fence, outcome, self.policy.ttl).await, then) {
            (Ok(()), then) => {
                checked();
                then
            }
            (Err((Error::LeaseLost { .. }, outcome)), Ok(output)) => {
                Box::pin(self.after_lease_lost(output, outcome)).await
            }
            (Err((e, outcome)), Ok(output)) => {
                // The effect happened and the caller gets its result. The outcome is sent again
                // in the background (`store_later.rs`); until it lands (or if it never does) the
                // record stays in flight, and once its lease ends a keyed repeat re-runs with the
                // same key and a never repeat answers OutcomeUnknown: nothing runs twice
                // unprotected.
                self.store_later(fence, outcome, self.policy.ttl, &e);
                checked();
                Ok(output)
            }
            (Err((e, outcome)), Err(error)) => {
                self.store_later(fence, outcome, self.policy.ttl, &e);
                Err(error)
            }
        }
    }

    /// Sends a completion the store refused again in the background, when the store was
    /// unavailable (an outage, which may pass); any other refusal is final: a lost lease, an
    /// incompatible record, and what the caller also hears as "unavailable" but waiting does not
    /// mend (a damaged store, a configuration the store refuses). The lease settles the record.
    fn store_later(&self, fence: Fence, outcome: Outcome, ttl: Duration, e: &Error<T::Error>) {
        let Error::StoreUnavailable { source: source @ StoreError::Unavailable(_), .. } = e else {
            tracing::warn!(error = %Chain(e), "outcome not stored");
            return;
        };
        super::store_later::Later {
            late: Arc::clone(&self.inner.late),
            store: Arc::clone(&self.inner.store),
            tool: self.name(),
            key: self.key,
            fence,
            outcome,
            ttl,
            step_timeout: (!self.inner.local_store).then_some(self.policy.store_timeout),
        }
        .spawn(source);
    }

    /// The error of an output that ran but cannot be stored: why, and that it happened.
    fn not_storable(&self, why: &dyn std::fmt::Display) -> Error<T::Error> {
        Error::OutputNotStorable {
            tool: self.name(),
            key: self.key,
            reason: not_storable_reason(why),
        }
    }

    /// Whether this call still holds the key under `fence`, asked of the store (a fenced lease
    /// renewal, which also extends it).
    pub(super) async fn still_holds(&self, fence: Fence) -> Holds {
        let sent = Instant::now();
        let renewed = self.inner.store.renew(&self.key, fence, self.policy.lease);
        match self.bounded("renew", renewed).await {
            Ok(()) => {
                self.confirmed_at(sent);
                Holds::Yes
            }
            Err(StoreError::LeaseLost) => Holds::Lost,
            Err(e) => {
                tracing::warn!(error = %Chain(&e), "cannot confirm the lease");
                Holds::Unconfirmed
            }
        }
    }

    pub(super) fn lease_lost(&self) -> Error<T::Error> {
        Error::LeaseLost { tool: self.name(), key: self.key }
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
        if self.class() == RetryClass::Never {
            // Only an operator's `forget` takes a never tool's lease: do not guess.
            return Err(self.lease_lost());
        }
        match self.take_back().await {
            // Stopped while it waited for the new owner: this call's tool ran, so it is not
            // `Cancelled` with nothing run; the key is the new owner's.
            Err(Some(Err(e))) if e.is_stopped() => Err(self.lease_lost()),
            Err(None) => Err(self.lease_lost()),
            Err(Some(answer)) => answer,
            Ok(fence) => {
                match self.store_outcome(fence, outcome, self.policy.ttl).await {
                    Ok(()) => Ok(output),
                    Err((Error::LeaseLost { .. }, _)) => Err(self.lease_lost()),
                    // The tool ran and the key is this call's again: as after any completion
                    // the store refused, the caller gets the result and the outcome is sent
                    // again in the background; "not executed" would be false.
                    Err((e, outcome)) => {
                        self.store_later(fence, outcome, self.policy.ttl, &e);
                        Ok(output)
                    }
                }
            }
        }
    }

    /// This call's lease was taken over while it paused before a retry, after `attempts`
    /// attempts: the key is the new owner's, and so is the answer. Waits for it, as a call whose
    /// completion found its lease lost does ([`Call::after_lease_lost`]); if the new owner let
    /// the key go, the call owns it again under the fence it is given (`Ok`).
    async fn rejoin(&self, attempts: u32) -> Result<Fence, Result<T::Output, Error<T::Error>>> {
        match self.take_back().await {
            Ok(fence) => {
                // It waited and runs its tool again: its wait hook hears it, as any waiter's
                // that becomes the owner (an MCP server stops sending "waiting" progress).
                self.owns_after_waiting();
                Ok(fence)
            }
            Err(Some(Err(e))) if e.is_stopped() => Err(Err(self.cancelled(attempts))),
            Err(Some(answer)) => Err(answer),
            // The store cannot be asked for the new owner's answer: "unavailable, nothing was
            // executed" would be false after this call's attempts; the new owner's result
            // stands, and a repeat receives it.
            Err(None) => Err(Err(self.lease_lost())),
        }
    }

    /// After this call's lease was taken over, with its tool run: claims the key again, which
    /// waits for the new owner's answer (`Err(Some)`, labelled as served by this call's run: it
    /// did not replay or join, whatever the claim says) or, if that owner let the key go, owns it
    /// again (`Ok`). `Err(None)`: the store could not be asked.
    async fn take_back(&self) -> Result<Fence, Option<Result<T::Output, Error<T::Error>>>> {
        let ran = self.served.get();
        match self.acquire(OnExpired::TakeOver, false).await {
            Ok(Owned::Fence { fence, .. }) => Ok(fence),
            Ok(Owned::Answer(answer)) => {
                if let Some(ran) = ran {
                    self.label(ran);
                }
                Err(Some(answer))
            }
            Err(e) => {
                tracing::warn!(error = %Chain(&e), "cannot wait for the owner that took over");
                Err(None)
            }
        }
    }

    /// The rest of an attempt that did not finish on its first poll: runs `work` to its end
    /// under the attempt's timeout, renewing the lease (if `fence`) every third of it.
    async fn attempt_pending<F>(
        &self,
        mut work: Pin<&mut F>,
        fence: Option<Fence>,
        deadline: Instant,
    ) -> Attempt<T::Output, T::Error>
    where
        F: Future<Output = Caught<T::Output, T::Error>>,
    {
        let mut timeout = std::pin::pin!(tokio::time::sleep_until(deadline));
        let Some(fence) = fence else {
            return tokio::select! {
                biased;
                caught = &mut work => Attempt::from_caught(caught),
                () = &mut timeout => Attempt::TimedOut,
            };
        };
        // Renewals run beside the work, not in its place: a store slow to answer a renewal (up
        // to the store timeout) must not keep the work and its timeout from being polled.
        let mut renewals = std::pin::pin!(self.renewals(fence));
        tokio::select! {
            biased;
            caught = &mut work => Attempt::from_caught(caught),
            () = &mut timeout => Attempt::TimedOut,
            never = &mut renewals => match never {},
        }
    }

    /// Renews the lease under `fence` every third of it (see [`Call::renew_while_held`]), for
    /// as long as it is polled, beside work that must go on even once the key was taken over.
    pub(super) async fn renewals(&self, fence: Fence) -> std::convert::Infallible {
        self.renew_while_held(fence).await;
        // Taken over: asking again would only get the same answer, every third of a lease for
        // as long as the work goes on. The work is not stopped (stopping mid-effect is itself
        // ambiguous); its completion finds the lease lost, and no retry starts under the fence.
        std::future::pending().await
    }

    /// Renews the lease under `fence` every third of it, and returns once the store refused a
    /// renewal (another owner took the key over).
    ///
    /// Counted from when the store last accepted a claim or renewal of this call, not from
    /// when this attempt, pause or check started: a call's steps each start their own renewals,
    /// and steps each shorter than a third of the lease would otherwise renew nothing while the
    /// lease runs out under them (another caller would take the key over and run the tool
    /// beside this one). A renewal that is overdue goes out at once.
    pub(super) async fn renew_while_held(&self, fence: Fence) {
        let period = self.policy.lease / 3;
        // When this loop last sent a renewal: one the store did not answer is not sent again
        // before a period has passed, so a store that is down is not asked in a busy loop.
        let mut sent: Option<Instant> = None;
        // Refused during an earlier attempt or pause of this call: not sent again.
        while !self.refused(fence) {
            let due = later(self.confirmed_instant(), period);
            let due = match sent {
                Some(sent) => due.max(later(sent, period)),
                None => due,
            };
            tokio::time::sleep_until(due).await;
            sent = Some(Instant::now());
            if !self.renew(fence).await {
                break;
            }
        }
    }
}

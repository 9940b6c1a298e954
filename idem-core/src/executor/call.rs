//! One call in progress: the in-process single flight in front of the store, the choice between
//! running with or without the store, and replay of a stored or shared outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::Inner;
use super::lease::DeadlineSpent;
use super::lease::{Owned, Settled};
use super::report::{Served, ServedSlot, WaitHook};
use crate::class::RetryClass;
use crate::clock::later;
use crate::error::Chain;
use crate::error::{BudgetKind, Error};
use crate::flight::{Enter, Shared};
use crate::key::{Fingerprint, Key, Scope};

use super::attempts::Holds;
use super::storable::storable;
use crate::policy::Policy;
use crate::reconcile::Reconciled;
use crate::store::{Fence, OnExpired, Outcome, Record, StoreError};
use crate::tool::Tool;
use crate::toolset::arguments::with_whole_numbers_as_integers;

/// One call in progress.
pub(super) struct Call<'a, T: Tool> {
    pub(super) inner: &'a Inner,
    pub(super) tool: &'a T,
    pub(super) key: Key,
    /// The digest `key` spells, by which the in-memory store finds its record.
    pub(super) digest: [u8; 32],
    pub(super) fingerprint: Fingerprint,
    /// The intent's canonical text, from which a retry of a tool whose arguments read back from
    /// it ([`Tool::ARGS_FROM_INTENT`]) gets its own arguments.
    pub(super) intent: &'a [u8],
    /// Stored with the record (its origin) for listing.
    pub(super) scope: &'a Arc<Scope>,
    pub(super) policy: &'a Policy,
    /// When the call started (the deadline counts from it).
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    pub(super) span: tracing::Span,
    pub(super) served: ServedSlot,
    pub(super) on_wait: Option<&'a WaitHook>,
    /// The caller's request to start nothing more ([`super::Run::with_stop`]).
    pub(super) stop: Option<&'a super::stop::StopSignal>,
    /// The caller's own idempotency key, which a reuse with other arguments names.
    pub(super) caller_key: Option<&'a Arc<str>>,
    /// This call has waited for another owner ([`Call::waiting`]): its wait hook hears when it
    /// becomes the owner.
    pub(super) waited: AtomicBool,
    /// When this call last knew its lease to run a full lease from (a claim or a renewal it
    /// sent that the store accepted), in nanoseconds after `started`; 0 for the first claim,
    /// sent at the start (nothing to store on the common path). A retry after a pause longer
    /// than that confirms the fence first ([`Call::confirmed_at`]).
    pub(super) confirmed: AtomicU64,
    /// The fence a renewal found taken over (0: none). It never becomes current again.
    pub(super) lost: AtomicU64,
}

/// What the leader hands to joiners when its call succeeded, built only when someone joined: the
/// output's JSON if it reads back as the same value (as a stored outcome would), else the error a
/// later caller gets from the record.
fn share_ok<T: Tool>(name: &'static str, key: Key, output: &T::Output) -> Shared {
    Arc::new(storable(output).map_err(|reason| Error::OutputNotStorable {
        tool: name,
        key,
        reason,
    }))
}

/// What the leader hands to joiners when its call failed: `skeleton` is the error with the tool's
/// own error taken out (`tool_error`), which joiners receive as JSON.
fn share_err<E: serde::Serialize>(
    name: &'static str,
    key: Key,
    skeleton: &Error<()>,
    tool_error: Option<&E>,
) -> Shared {
    // A tool's error is checked before serde_json, which has no depth limit, writes it; its
    // `Serialize` is the user's code, which may panic.
    let json = tool_error.map(|e| {
        super::caught::caught(|| {
            crate::limits::check_depth(e).map_err(|_| ())?;
            serde_json::to_string(e).map_err(|_| ())
        })
        .unwrap_or(Err(()))
    });
    Arc::new(Err(skeleton
        .clone()
        .try_map_tool(|()| match &json {
            Some(Ok(json)) => Ok(json.clone()),
            _ => Err(()),
        })
        .unwrap_or_else(|()| Error::ReplayFailed {
            tool: name,
            key,
            reason: "the tool error could not be serialized".into(),
        })))
}

/// A stored outcome read as the tool's type; a panic in its `Deserialize` (the user's code) is a
/// replay that failed, and the record stays as it is. What the tool returned was written by
/// serde and reads back as it is; a result an operator gave (`idem resolve --happened`) may
/// spell an integer `5.0`, which is read as the integer it equals, as a model's arguments are,
/// and one the type refuses is said as a model's arguments are (the field, the number as
/// written).
fn decode<V: DeserializeOwned, E>(tool: &'static str, key: Key, json: &str) -> Result<V, Error<E>> {
    let failed = |reason| Error::ReplayFailed { tool, key, reason };
    let panicked = |message| failed(format!("its `Deserialize` panicked: {message}"));
    match super::caught::caught(|| serde_json::from_str(json)) {
        Ok(Ok(read)) => Ok(read),
        Ok(Err(_)) => match super::caught::caught(|| with_whole_numbers_as_integers(json)) {
            Ok(read) => read.map_err(failed),
            Err(message) => Err(panicked(message)),
        },
        Err(message) => Err(panicked(message)),
    }
}

impl<T: Tool> Call<'_, T> {
    pub(super) fn name(&self) -> &'static str {
        self.tool.def().name
    }

    pub(super) fn class(&self) -> RetryClass {
        self.tool.def().class
    }

    pub(super) fn outcome(&self, served: Served) {
        self.label(served);
        // Every call passes here: without a wait hook (the common case) one test, nothing more.
        if matches!(served, Served::Executed | Served::TakenOver) {
            self.owns_after_waiting();
        }
    }

    /// Tells the wait hook that this call, which waited for another owner, owns the key and
    /// runs its tool.
    pub(super) fn owns_after_waiting(&self) {
        if let Some(hook) = self.on_wait
            && self.waited.load(Ordering::Relaxed)
        {
            hook.owner(&self.key);
        }
    }

    /// Records how the call was served, in its span and its report, and nothing else.
    pub(super) fn label(&self, served: Served) {
        // A disabled span still looks the field up by name among its ten: skipped.
        if !self.span.is_disabled() {
            self.span.record("idem.outcome", served.as_str());
        }
        self.served.set(served);
    }

    /// This call starts waiting for another owner of its key.
    pub(super) fn waiting(&self) {
        if let Some(hook) = self.on_wait {
            self.waited.store(true, Ordering::Relaxed);
            hook.waiting(&self.key);
        }
    }

    pub(super) async fn execute(&self, args: T::Args) -> Result<T::Output, Error<T::Error>> {
        // A network store makes its connections on the runtime of the step that needs one: one
        // opened elsewhere (a store kept in a static) would meet Tokio's panic here.
        let io = self.inner.store_io && self.uses_store();
        if let Err(lacks) = crate::tokio_ready::for_store(io) {
            // Timeouts, backoff and lease renewals are Tokio's timers: outside a runtime, or on
            // one built without them, the first would panic, possibly with the tool's work under
            // way. Nothing has run yet.
            return Err(self.store_error(StoreError::InvalidConfig(lacks.advice())));
        }
        // Also in front of an in-process store: it makes duplicates wait for the first call, but
        // when that call fails without a stored outcome (a transient error, a panic) it lets go
        // of the key and each waiter would run the tool in turn; joiners of a flight receive the
        // failure instead, as for every other store.
        // Whether this call waited on a flight before it leads: its start is then long past, and
        // its claim and first attempt are timed from when they happen, not from that start.
        let mut waited = false;
        loop {
            match self.inner.flights.enter(self.key, self.fingerprint) {
                // A safe call that keeps no record runs for each caller: a reuse with other
                // arguments is refused only where it is stored, and would otherwise be refused
                // or run depending on whether the first call had finished.
                // Boxed, as the leader's other rare entry below.
                Enter::Mismatch if !self.uses_store() => {
                    return Box::pin(self.lead(args, false)).await;
                }
                Enter::Mismatch => return Err(self.reuse_mismatch()),
                Enter::Join(slot) => {
                    waited = true;
                    self.waiting();
                    // Bounded by a lease too when the call uses the store: a leader whose future
                    // is kept but no longer polled (its host stopped driving it without dropping
                    // it) renews nothing, and its lease ends. A duplicate in another process then
                    // takes the key over (or answers "unknown" for a never tool); so does this
                    // one: it leaves the flight and claims through the store like any other
                    // caller, which also waits for a leader that is alive and replays its
                    // outcome.
                    let leave = if self.uses_store() {
                        later(Instant::now(), self.policy.lease).min(self.deadline)
                    } else {
                        self.deadline
                    };
                    let joined = tokio::time::timeout_at(leave, slot.wait());
                    // A stopped joiner waits no more; the call it joined goes on.
                    let Some(joined) = self.unless_stopped(joined).await else {
                        return Err(self.stopped_waiting());
                    };
                    let shared = match joined {
                        Err(_) if leave < self.deadline => {
                            // Boxed, as the leader's claim loop is elsewhere: rare.
                            return Box::pin(self.lead(args, false)).await;
                        }
                        Err(_) => {
                            return Err(self.deadline_passed());
                        }
                        // The leader was cancelled before it finished: start over.
                        Ok(None) => continue,
                        // The leader's own deadline ran out with nothing failed (it waited for
                        // another owner, or its attempt timed out): that is not this call's,
                        // which goes on in its own time (and joins or leads again).
                        Ok(Some(shared))
                            if matches!(
                                &*shared,
                                Err(Error::BudgetExhausted {
                                    budget: BudgetKind::Deadline,
                                    error: None,
                                    ..
                                })
                            ) && Instant::now() < self.deadline =>
                        {
                            continue;
                        }
                        Ok(Some(shared)) => shared,
                    };
                    self.outcome(Served::Joined);
                    return self.decode_shared(&shared);
                }
                Enter::Lead(leader) => {
                    let (name, key) = (self.name(), self.key);
                    return match self.lead(args, !waited).await {
                        Ok(output) => {
                            leader.finish(|| share_ok::<T>(name, key, &output));
                            Ok(output)
                        }
                        // Stopped by this caller, not by the joiners: they start over, as
                        // after a leader that went away, and one of them runs the call.
                        Err(e) if e.is_stopped() => {
                            drop(leader);
                            Err(e)
                        }
                        Err(e) => {
                            // Taken apart so joiners get the tool's error as JSON, then rebuilt.
                            let mut tool_error = None;
                            let skeleton = e.map_tool(|error| tool_error = Some(error));
                            leader.finish(|| share_err(name, key, &skeleton, tool_error.as_ref()));
                            Err(skeleton
                                .try_map_tool(|()| tool_error.take().ok_or(()))
                                .unwrap_or_else(|()| self.internal("a tool error went missing")))
                        }
                    };
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
                .clone()
                .try_map_tool(|json| decode::<T::Error, T::Error>(self.name(), self.key, &json))
                .unwrap_or_else(|e| e)),
        }
    }

    /// Notes that the lease ran a full lease from `at` (a claim or a renewal sent then, which the
    /// store accepted).
    pub(super) fn confirmed_at(&self, at: Instant) {
        let nanos = u64::try_from(at.saturating_duration_since(self.started).as_nanos())
            .unwrap_or(u64::MAX);
        self.confirmed.fetch_max(nanos, Ordering::Relaxed);
    }

    /// When the store last accepted a claim or renewal of this call (see [`Call::confirmed`]).
    pub(super) fn confirmed_instant(&self) -> Instant {
        later(self.started, Duration::from_nanos(self.confirmed.load(Ordering::Relaxed)))
    }

    /// Whether the lease under `fence` may have lapsed: a renewal found it taken over, or three
    /// quarters of a lease passed since this call last knew its lease to run (it may have paused
    /// past it: a stalled process, renewals that failed or did not answer), and another caller
    /// may have taken the key over. Not all of it: a store may measure the lease on a clock that
    /// drifts from this one.
    pub(super) fn lease_may_have_lapsed(&self, fence: Fence) -> bool {
        if self.refused(fence) {
            return true;
        }
        let confirmed = Duration::from_nanos(self.confirmed.load(Ordering::Relaxed));
        let since =
            Instant::now().saturating_duration_since(self.started).saturating_sub(confirmed);
        since >= self.policy.lease.saturating_mul(3) / 4
    }

    /// Whether a renewal of this call found `fence` taken over (it never becomes current again).
    pub(super) fn refused(&self, fence: Fence) -> bool {
        self.lost.load(Ordering::Relaxed) == fence.0
    }

    pub(super) fn uses_store(&self) -> bool {
        self.class() != RetryClass::Safe || self.policy.cache_safe
    }

    /// Runs the call as the flight's leader. `at_start`: nothing was awaited since the call
    /// started (it did not wait on another flight first), so its start can serve as the moment
    /// of its first claim and of its first attempt.
    pub(super) async fn lead(
        &self,
        args: T::Args,
        at_start: bool,
    ) -> Result<T::Output, Error<T::Error>> {
        if !self.uses_store() {
            self.outcome(Served::Executed);
            return self.attempts(args, None, None).await;
        }
        // Stopped before it claims (as before each claim after a wait): a claim would only take
        // a dead owner's expired record over to leave it to a new lease with nothing running.
        if self.stop_requested() {
            return self.stopped_before_claim().await;
        }
        // A never tool with a check takes a dead owner's expired lease over, to ask the check
        // under its own fence; without one, the record stays as it is and reads as unknown.
        let on_expired = match self.class() {
            RetryClass::Never if !self.tool.reconciles() => OnExpired::Unknown,
            _ => OnExpired::TakeOver,
        };
        let owned = match &self.inner.memory {
            Some(memory) if at_start => match self.first_claim_memory(memory, on_expired) {
                Settled::Owned(owned) => Ok(owned),
                // Boxed, as in `acquire`.
                Settled::Wait { fence, lease_remaining } => {
                    Box::pin(self.wait_and_claim(on_expired, fence, lease_remaining)).await
                }
            },
            _ => self.acquire(on_expired, at_start).await,
        };
        match owned {
            Ok(Owned::Fence { fence, takeover, at_start }) => {
                // Taken over: a previous owner's lease ended without a result, so its attempt
                // may have had an effect that this run repeats (with the same key).
                self.outcome(if takeover { Served::TakenOver } else { Served::Executed });
                // The first attempt is timed from the call's start when nothing waited since.
                let mut started = at_start.then_some(self.started);
                if takeover && self.tool.reconciles() {
                    started = None;
                    match self.ask_check(fence, &args).await {
                        Reconciled::Happened(output) => return self.happened(fence, output).await,
                        Reconciled::NotHappened => {}
                        // A keyed tool re-runs with the same key (the provider deduplicates); a
                        // never tool may not run again.
                        Reconciled::Unknown if self.class() == RetryClass::Never => {
                            return Err(self.unknown(Some(fence)).await);
                        }
                        Reconciled::Unknown => {}
                    }
                    // The check may have outlived the lease (its renewals failed while it ran,
                    // or were refused as taken over), and another caller may have taken the key
                    // over, asked in turn and run the tool: the attempt runs only under a fence
                    // the store still accepts, as after the call's own ambiguous attempt. A
                    // never tool is not run without that confirmation; the record is left to
                    // its lease, and the next caller takes it over and asks the check.
                    let never = self.class() == RetryClass::Never;
                    if never || self.lease_may_have_lapsed(fence) {
                        match self.still_holds(fence).await {
                            Holds::Yes => {}
                            Holds::Lost => return Err(self.lease_lost()),
                            Holds::Unconfirmed if never => {
                                return Err(self.store_error(StoreError::unavailable(
                                    "the lease could not be confirmed after the check",
                                )));
                            }
                            Holds::Unconfirmed => {}
                        }
                    }
                }
                self.attempts(args, Some(fence), started).await
            }
            Ok(Owned::Answer(answer)) => answer,
            Err(e)
                if self.class() == RetryClass::Safe
                    && self.inner.safe_fail_open
                    && !DeadlineSpent::is(&e) =>
            {
                tracing::warn!(error = %Chain(&e), "store unavailable; running safe tool without it");
                self.outcome(Served::Executed);
                self.attempts(args, None, None).await
            }
            Err(e) => Err(self.store_error(e)),
        }
    }

    pub(super) fn store_error(&self, e: StoreError) -> Error<T::Error> {
        match e {
            e if DeadlineSpent::is(&e) => self.deadline_passed(),
            StoreError::LeaseLost => Error::LeaseLost { tool: self.name(), key: self.key },
            StoreError::Incompatible(reason) => {
                Error::Incompatible { tool: self.name(), key: self.key, reason }
            }
            source => Error::StoreUnavailable { tool: self.name(), source },
        }
    }

    pub(super) fn replay(&self, record: Record) -> Result<T::Output, Error<T::Error>> {
        match record.outcome {
            Outcome::Success(json) => decode(self.name(), self.key, &json),
            Outcome::Failure(json) => {
                Err(Error::Tool { tool: self.name(), error: decode(self.name(), self.key, &json)? })
            }
            Outcome::Unknown => Err(Error::OutcomeUnknown { tool: self.name(), key: self.key }),
            Outcome::NotStorable(reason) => {
                Err(Error::OutputNotStorable { tool: self.name(), key: self.key, reason })
            }
        }
    }

    /// The key was used before with other arguments (IETF Idempotency-Key draft: 422).
    pub(super) fn reuse_mismatch(&self) -> Error<T::Error> {
        Error::KeyReuseMismatch {
            tool: self.name(),
            key: self.key,
            caller_key: self.caller_key.cloned(),
        }
    }

    /// A broken invariant of the executor itself, reported rather than panicking.
    #[cold]
    pub(super) fn internal(&self, what: &str) -> Error<T::Error> {
        Error::Internal { tool: self.name(), key: self.key, what: what.to_owned() }
    }

    /// The deadline passed before an attempt could start or a duplicate's outcome arrived.
    pub(super) fn deadline_passed(&self) -> Error<T::Error> {
        Error::BudgetExhausted {
            tool: self.name(),
            budget: BudgetKind::Deadline,
            error: None,
            retry_after: None,
        }
    }
}

//! One call in progress: the in-process single flight in front of the store, the choice between
//! running with or without the store, and replay of a stored or shared outcome.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::Inner;
use super::lease::Owned;
use super::report::{Served, ServedSlot, WaitHook};
use crate::class::RetryClass;
use crate::error::{BudgetKind, Error};
use crate::flight::{Enter, Shared};
use crate::key::{Fingerprint, Key};
use crate::policy::Policy;
use crate::store::{OnExpired, Outcome, Record, StoreError};
use crate::tool::Tool;

/// One call in progress.
pub(super) struct Call<'a, T: Tool> {
    pub(super) inner: &'a Inner,
    pub(super) tool: &'a T,
    pub(super) key: Key,
    pub(super) fingerprint: Fingerprint,
    pub(super) policy: Policy,
    pub(super) deadline: Instant,
    pub(super) span: tracing::Span,
    pub(super) served: ServedSlot,
    pub(super) on_wait: Option<&'a WaitHook>,
}

/// What the leader hands to joiners, built only when someone joined.
fn share<T: Tool>(
    name: &'static str,
    key: Key,
    result: &Result<T::Output, Error<T::Error>>,
) -> Shared {
    // An output reaches here only within the depth limit (`finish_ok`); a tool's error is
    // checked before serde_json, which has no limit, writes it.
    Arc::new(match result {
        Ok(out) => serde_json::to_string(out).map_err(|e| Error::ReplayFailed {
            tool: name,
            key,
            reason: format!("the output could not be serialized: {e}"),
        }),
        Err(e) => Err(e
            .try_retype(|err| {
                crate::limits::check_depth(err).map_err(|_| ())?;
                serde_json::to_string(err).map_err(|_| ())
            })
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

impl<T: Tool> Call<'_, T> {
    pub(super) fn name(&self) -> &'static str {
        self.tool.def().name
    }

    pub(super) fn class(&self) -> RetryClass {
        self.tool.def().class
    }

    pub(super) fn outcome(&self, served: Served) {
        self.span.record("idem.outcome", served.as_str());
        self.served.set(served);
    }

    /// This call starts waiting for another owner of its key.
    pub(super) fn waiting(&self) {
        if let Some(hook) = self.on_wait {
            hook.call(&self.key);
        }
    }

    pub(super) async fn execute(&self, args: T::Args) -> Result<T::Output, Error<T::Error>> {
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
                    self.waiting();
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
                    self.outcome(Served::Joined);
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
            self.outcome(Served::Executed);
            return self.attempts(args, None).await;
        }
        let on_expired = match self.class() {
            RetryClass::Never => OnExpired::Unknown,
            _ => OnExpired::TakeOver,
        };
        match self.acquire(on_expired).await {
            Ok(Owned::Fence(fence)) => {
                self.outcome(Served::Executed);
                self.attempts(args, Some(fence)).await
            }
            Ok(Owned::Answer(answer)) => answer,
            Err(e) if self.class() == RetryClass::Safe && self.inner.safe_fail_open => {
                tracing::warn!(error = %e, "store unavailable; running safe tool without it");
                self.outcome(Served::Executed);
                self.attempts(args, None).await
            }
            Err(e) => Err(self.store_error(e)),
        }
    }

    pub(super) fn store_error(&self, e: StoreError) -> Error<T::Error> {
        match e {
            StoreError::LeaseLost => Error::LeaseLost { tool: self.name(), key: self.key },
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
        }
    }

    /// A broken invariant of the executor itself, reported rather than panicking.
    #[cold]
    pub(super) fn internal(&self, what: &str) -> Error<T::Error> {
        Error::ReplayFailed {
            tool: self.name(),
            key: self.key,
            reason: format!("internal error in idem's executor: {what}; please report it"),
        }
    }
}

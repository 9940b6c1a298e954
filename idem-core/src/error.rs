//! The errors a caller of a tool can receive. Every variant can be matched, and every message
//! says what happened and what to do next.

use std::time::Duration;

use crate::key::{Key, KeyError};
use crate::store::StoreError;

/// What stopped a budget: the executor's attempts, its wall-clock budget, or the shared retry
/// budget (token bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetKind {
    /// The tool's `attempts` were all used.
    Attempts,
    /// The wall-clock budget for the whole call (all attempts and waits) ran out.
    WallClock,
    /// The shared retry budget refused another retry: the dependency is failing for many callers.
    RetryBudget,
}

impl std::fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BudgetKind::Attempts => "attempts",
            BudgetKind::WallClock => "wall-clock budget",
            BudgetKind::RetryBudget => "shared retry budget",
        })
    }
}

/// The error of a protected tool call: the tool's own error `E`, or one of idem's.
///
/// `E` is the tool's error type. A permanent tool error of a keyed or never tool is stored and
/// replayed: repeats receive the same [`Error::Tool`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E> {
    /// The tool failed with its own error (permanent, or the last of its retries).
    #[error("tool `{tool}` failed: {error}")]
    Tool {
        /// The tool's stable name.
        tool: &'static str,
        /// The tool's error.
        error: E,
    },

    /// The arguments cannot be turned into a key (NaN, an infinity, a map with non-string keys).
    /// The tool did not run; fix the arguments.
    #[error("tool `{tool}` was not called: {source}")]
    InvalidArguments {
        /// The tool's stable name.
        tool: &'static str,
        /// Why the arguments were refused.
        #[source]
        source: KeyError,
    },

    /// The store could not be reached or answered with an error. Keyed and never tools did not run
    /// (fail closed). Retry later; nothing happened.
    #[error(
        "tool `{tool}` was not called: the idempotency store is unavailable ({source}); nothing was executed, retry when the store is back"
    )]
    StoreUnavailable {
        /// The tool's stable name.
        tool: &'static str,
        /// The store's error.
        #[source]
        source: StoreError,
    },

    /// This worker's lease was taken over by another worker (it paused or ran past its lease), so
    /// its result was not stored: the new owner's result stands. Call again to receive it.
    #[error(
        "tool `{tool}` lost its lease on key {key}: another worker took over and its result stands; call again to receive it"
    )]
    LeaseLost {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key.
        key: Key,
    },

    /// A caller-supplied idempotency key was reused with different arguments
    /// (IETF draft-ietf-httpapi-idempotency-key-header §2.6: 422). Nothing ran; use a new key for
    /// a new intent.
    #[error(
        "tool `{tool}` was not called: idempotency key {key} was already used with other arguments; use a new key for a new intent"
    )]
    KeyReuseMismatch {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key.
        key: Key,
    },

    /// A `never` tool's earlier attempt may have taken effect and its result is not known (an
    /// ambiguous failure, or its worker vanished). It will not be run again: check the target
    /// system, then reconcile the record.
    #[error(
        "tool `{tool}` may have taken effect; its outcome is unknown (key {key}). Do not retry: check the target system and reconcile"
    )]
    OutcomeUnknown {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key.
        key: Key,
    },

    /// A per-attempt timeout fired on the last allowed attempt. A timeout is ambiguous: for a keyed
    /// tool the key was kept for the next call, so the provider deduplicates it.
    #[error(
        "tool `{tool}` timed out after {timeout:?} on attempt {attempt}; the effect may have happened. A call with the same arguments reuses the key"
    )]
    Timeout {
        /// The tool's stable name.
        tool: &'static str,
        /// The per-attempt timeout.
        timeout: Duration,
        /// The attempt that timed out (1-based).
        attempt: u32,
    },

    /// No attempt was allowed, or a duplicate could not be joined, within the named budget.
    /// Nothing new ran; retry later.
    #[error("tool `{tool}` stopped: its {budget} is exhausted; retry later")]
    BudgetExhausted {
        /// The tool's stable name.
        tool: &'static str,
        /// Which budget.
        budget: BudgetKind,
    },

    /// The stored outcome could not be decoded into the tool's output type (the type changed since
    /// it was stored, or the record was written by another version). Nothing ran again.
    #[error(
        "tool `{tool}`: the stored outcome for key {key} cannot be replayed ({reason}); nothing ran again. Check that the output type did not change, or forget the record"
    )]
    ReplayFailed {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key.
        key: Key,
        /// Why decoding failed.
        reason: String,
    },
}

impl<E> Error<E> {
    /// Maps the tool's error type, keeping every framework variant.
    pub fn map_tool<F>(self, f: impl FnOnce(E) -> F) -> Error<F> {
        match self {
            Error::Tool { tool, error } => Error::Tool { tool, error: f(error) },
            Error::InvalidArguments { tool, source } => Error::InvalidArguments { tool, source },
            Error::StoreUnavailable { tool, source } => Error::StoreUnavailable { tool, source },
            Error::LeaseLost { tool, key } => Error::LeaseLost { tool, key },
            Error::KeyReuseMismatch { tool, key } => Error::KeyReuseMismatch { tool, key },
            Error::OutcomeUnknown { tool, key } => Error::OutcomeUnknown { tool, key },
            Error::Timeout { tool, timeout, attempt } => Error::Timeout { tool, timeout, attempt },
            Error::BudgetExhausted { tool, budget } => Error::BudgetExhausted { tool, budget },
            Error::ReplayFailed { tool, key, reason } => Error::ReplayFailed { tool, key, reason },
        }
    }

    /// The tool's own error, if this is one.
    pub fn tool_error(&self) -> Option<&E> {
        match self {
            Error::Tool { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The stable `error.type` for traces and machine-readable results (OpenTelemetry semantic
    /// conventions: low-cardinality).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Tool { .. } => ErrorKind::Tool,
            Error::InvalidArguments { .. } => ErrorKind::InvalidArguments,
            Error::StoreUnavailable { .. } => ErrorKind::StoreUnavailable,
            Error::LeaseLost { .. } => ErrorKind::LeaseLost,
            Error::KeyReuseMismatch { .. } => ErrorKind::KeyReuseMismatch,
            Error::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::BudgetExhausted { .. } => ErrorKind::BudgetExhausted,
            Error::ReplayFailed { .. } => ErrorKind::ReplayFailed,
        }
    }
}

/// The stable, machine-readable kind of a failed call: the `error.type` of a trace span and the
/// `error_kind` of a [`ToolResult`](crate::ToolResult), whose `content` carries it as
/// `{"error": {"kind": "<wire string>"}}`. The wire strings ([`ErrorKind::as_str`]) never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// `tool_error`: [`Error::Tool`], the tool's own error.
    Tool,
    /// `invalid_arguments`: [`Error::InvalidArguments`], or a model's arguments that are not JSON,
    /// not an object, or do not fit the tool's types (also NaN and infinities, which JSON cannot
    /// carry).
    InvalidArguments,
    /// `store_unavailable`: [`Error::StoreUnavailable`].
    StoreUnavailable,
    /// `lease_lost`: [`Error::LeaseLost`].
    LeaseLost,
    /// `key_reuse_mismatch`: [`Error::KeyReuseMismatch`].
    KeyReuseMismatch,
    /// `outcome_unknown`: [`Error::OutcomeUnknown`].
    OutcomeUnknown,
    /// `timeout`: [`Error::Timeout`].
    Timeout,
    /// `budget_exhausted`: [`Error::BudgetExhausted`].
    BudgetExhausted,
    /// `replay_failed`: [`Error::ReplayFailed`].
    ReplayFailed,
    /// `unknown_tool`: a tool set was asked for a tool it does not hold.
    UnknownTool,
    /// `invalid_tool_call`: a tool call whose envelope is malformed (no name, wrong shape).
    InvalidToolCall,
    /// `output_not_json`: the tool ran, but its output could not be turned into JSON.
    OutputNotJson,
}

impl ErrorKind {
    /// The wire string: `tool_error`, `invalid_arguments`, ... (snake case, stable).
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Tool => "tool_error",
            ErrorKind::InvalidArguments => "invalid_arguments",
            ErrorKind::StoreUnavailable => "store_unavailable",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::KeyReuseMismatch => "key_reuse_mismatch",
            ErrorKind::OutcomeUnknown => "outcome_unknown",
            ErrorKind::Timeout => "timeout",
            ErrorKind::BudgetExhausted => "budget_exhausted",
            ErrorKind::ReplayFailed => "replay_failed",
            ErrorKind::UnknownTool => "unknown_tool",
            ErrorKind::InvalidToolCall => "invalid_tool_call",
            ErrorKind::OutputNotJson => "output_not_json",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

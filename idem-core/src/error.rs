//! The errors a caller of a tool can receive. Every variant can be matched, and every message
//! says what happened and what to do next.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::key::{Key, KeyError};
use crate::store::StoreError;

/// What refused to go on: the call's deadline, or the shared retry budget (token bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetKind {
    /// The deadline of the whole call ([`Policy::deadline`](crate::Policy::deadline): all
    /// attempts and waits) has passed, or the next wait would pass it.
    Deadline,
    /// The shared retry budget refused another retry: the dependency is failing for many callers.
    RetryBudget,
}

impl std::fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BudgetKind::Deadline => "deadline",
            BudgetKind::RetryBudget => "shared retry budget",
        })
    }
}

/// The error of a protected tool call: the tool's own error `E`, or one of idem's.
///
/// `E` is the tool's error type. A permanent tool error of a keyed or never tool is stored and
/// replayed: repeats receive the same [`Error::Tool`].
///
/// Each error gives its cause once: a variant that wraps another error names it as its
/// [`source`](std::error::Error::source) and does not repeat it in its message, so a report that
/// walks the chain (`anyhow`'s `{:#}`, [`ToolResult`](crate::ToolResult) text) prints each cause
/// once.
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

    /// No key could be made: the arguments have no canonical form (NaN, an infinity, a map with
    /// non-string keys), are larger than the policy allows, or the caller's idempotency key is
    /// empty (or only white space). The tool did not run; `source` says which, and what to fix.
    #[error(
        "tool `{tool}` was not called: {} cannot make an idempotency key",
        refused_part(source)
    )]
    InvalidArguments {
        /// The tool's stable name.
        tool: &'static str,
        /// Why the arguments were refused.
        #[source]
        source: KeyError,
    },

    /// The store could not be reached or answered with an error. Keyed and never tools did not run
    /// (fail closed); nothing happened. `source` says whether waiting helps: an outage
    /// ([`StoreError::Unavailable`]: retry later) or not (a configuration the store refuses, a
    /// damaged store: an operator must fix it first), and the message says which.
    #[error(
        "tool `{tool}` was not called: the idempotency store is unavailable; nothing was executed, {then}",
        then = after_store_error(source)
    )]
    StoreUnavailable {
        /// The tool's stable name.
        tool: &'static str,
        /// The store's error.
        #[source]
        source: StoreError,
    },

    /// The record of the key was written by another version of idem, or is damaged: the store
    /// cannot say what happened, so nothing ran and nothing is replayed from it. Upgrade every
    /// process sharing the store to one version, or inspect and `forget` the record.
    #[error(
        "tool `{tool}` was not called: the stored record of key {key} is not readable by this version of idem ({reason}); nothing ran. Upgrade idem, or inspect and forget the record"
    )]
    Incompatible {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key.
        key: Key,
        /// What the store could not read.
        reason: String,
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
        "tool `{tool}` was not called: {} was already used with other arguments; use a new key for a new intent",
        reused_key(caller_key.as_deref(), key)
    )]
    KeyReuseMismatch {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key (derived from the caller's key, the scope and the tool).
        key: Key,
        /// The caller's own key as it was given
        /// ([`Run::with_idempotency_key`](crate::Run::with_idempotency_key)), which the message
        /// names: the caller never saw `key`.
        caller_key: Option<Arc<str>>,
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

    /// A budget stopped the call before its outcome was settled: its deadline passed (while it
    /// waited for a duplicate, or before the wait a retry needed could end), or the shared retry
    /// budget refused a retry. Nothing is stored and the claim was released: a later call may
    /// run again (a keyed tool with the same key).
    ///
    /// When an attempt had failed with the tool's own error, `error` is that last error and
    /// `retry_after` its hint, if it gave one: a caller may try again after it.
    #[error("{}", budget_message(.tool, .budget, .error.as_ref(), .retry_after))]
    BudgetExhausted {
        /// The tool's stable name.
        tool: &'static str,
        /// Which budget.
        budget: BudgetKind,
        /// The tool's last error, when the last attempt ended with one (not when it timed out
        /// or when no attempt ran).
        error: Option<E>,
        /// The retry-after hint of the last error (RFC 9110 §10.2.3 `Retry-After`), if any.
        retry_after: Option<Duration>,
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

    /// The tool ran (its effect happened), but its output could not be stored faithfully: its
    /// JSON does not read back as the same value (a NaN or infinite float, a map whose keys are
    /// not strings, a `Serialize` that `Deserialize` does not mirror). The record says so, and
    /// every later call of the intent receives this error, never a different value; the first
    /// caller received the output itself. An output deeper than the depth limit or larger than
    /// [`Policy::max_outcome_bytes`](crate::Policy::max_outcome_bytes) is refused to the first
    /// caller too, and nothing is sent to the store (the claim ends with its lease). Do not call again for this intent: check the target
    /// system for the result.
    #[error(
        "tool `{tool}`: {reason}; it is not replayed (key {key}). The effect happened: do not call it again for this intent, check the target system for its result"
    )]
    OutputNotStorable {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key.
        key: Key,
        /// Why the output could not be stored.
        reason: String,
    },

    /// The tool's body panicked during an attempt (the panic is caught; the process goes on).
    /// Whether its effect happened is not known, and a panic is a bug, not a passing failure, so
    /// the call makes no further attempt and stores nothing: the key is released (a repeat runs
    /// the tool again, a `keyed` tool with the same idempotency key for the provider to
    /// deduplicate). A `never` tool's caller gets [`Error::OutcomeUnknown`] instead, which its
    /// repeats get too.
    #[error("tool `{tool}` panicked in attempt {attempt}: {message}")]
    Panicked {
        /// The tool's stable name.
        tool: &'static str,
        /// The attempt that panicked (1 for the first).
        attempt: u32,
        /// The panic's message (`"<not a string>"` for a payload of another type).
        message: String,
    },

    /// The caller stopped the call ([`Run::with_stop`](crate::Run::with_stop)) before it was
    /// done: no further attempt was started, nothing is stored, and the key was released (or,
    /// when the call had taken over a dead owner's record, left to its lease). A repeat runs
    /// the tool (a `keyed` one with the same idempotency key).
    #[error(
        "the call of `{tool}` was stopped by its caller after {attempts} attempt(s); nothing more \
         was started and nothing is stored, so a repeat runs it"
    )]
    Cancelled {
        /// The tool's stable name.
        tool: &'static str,
        /// The attempts this call made before it stopped (0: it ran nothing).
        attempts: u32,
    },

    /// The caller stopped the call ([`Run::with_stop`](crate::Run::with_stop)) while it waited
    /// for another call holding the same key: a duplicate in flight in this process, which it
    /// had joined, or an owner in another. It ran nothing and claimed nothing, and the call it
    /// waited for is not stopped by this. A repeat is answered by that call: with its outcome
    /// once stored, or, should that call end without one (its owner died, or was stopped
    /// too), as after any such owner. Not [`Error::Cancelled`], whose message (nothing stored,
    /// a repeat runs the tool) would be false here.
    #[error(
        "the call of `{tool}` was stopped by its caller while it waited for another call with \
         its idempotency key {key}; it ran nothing and did not stop that call, so a repeat gets \
         that call's outcome once it is stored"
    )]
    StoppedWaiting {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key both calls hold.
        key: Key,
    },

    /// Another fn of the same name, declared elsewhere (or the same method of another type),
    /// was called as a tool first in this [`Idem`](crate::Idem), both taking their stable name
    /// from their fn ([`Tool::declared_at`](crate::Tool::declared_at)): the name is part of
    /// every key, so each would be answered with the other's stored results. Nothing ran. Give one of them a name
    /// of its own (`#[tool(name = "..")]`), or, when one is the other rewritten, give it this
    /// name (`name = "<this name>"`) to say so. Through a [`ToolSet`](crate::ToolSet) the model
    /// reads only that the tool is unavailable and that a repeat fails the same way; this text,
    /// which is for the application's developer, goes to the log (`tracing`, error level).
    #[error(
        "tool `{tool}` was not called: the name `{tool}` is already held in this Idem by another tool, {held_by}; this one is {declared_at}. A tool's name is part of every key, so the two would replay each other's results: give one of them a name of its own with #[tool(name = \"..\")], or, if this one replaces the other, write #[tool(name = \"{tool}\")] on it to share its keys"
    )]
    NameTaken {
        /// The stable name both tools have.
        tool: &'static str,
        /// Where the refused tool is declared ([`Tool::declared_at`](crate::Tool::declared_at),
        /// and for a method the type: `app::find, a method of app::Beta`).
        declared_at: String,
        /// Where the tool holding the name is declared, written the same way.
        held_by: String,
    },

    /// A broken invariant of idem itself, reported instead of a panic. Please report it.
    #[error("internal error in idem for tool `{tool}` (key {key}): {what}; please report it")]
    Internal {
        /// The tool's stable name.
        tool: &'static str,
        /// The idempotency key.
        key: Key,
        /// What went wrong.
        what: String,
    },
}

/// What an idempotency key could not be made of: the caller's key, or the arguments.
fn refused_part(source: &KeyError) -> &'static str {
    match source {
        KeyError::EmptyIdempotencyKey => "the caller's idempotency key",
        _ => "its arguments",
    }
}

/// What the caller of a tool the store refused can do: wait for an outage to pass, or not.
fn after_store_error(source: &StoreError) -> &'static str {
    match source {
        StoreError::Unavailable(_) => "retry when the store is back",
        StoreError::Damaged(_) => {
            "and retrying will not help until an operator restores the store from a backup"
        }
        StoreError::InvalidConfig(_) | StoreError::Unsupported(_) => {
            "and retrying will not help until an operator fixes the store's configuration"
        }
        _ => "retry later",
    }
}

/// The key a [`Error::KeyReuseMismatch`] names: the caller's own when there is one.
fn reused_key(caller_key: Option<&str>, key: &Key) -> String {
    match caller_key {
        Some(own) => format!("idempotency key {own:?} (stored as {key})"),
        None => format!("idempotency key {key}"),
    }
}

/// The message of [`Error::BudgetExhausted`]: the tool's last error if there is one, and why no
/// retry was made.
fn budget_message<E: std::fmt::Display>(
    tool: &str,
    budget: &BudgetKind,
    error: Option<&E>,
    retry_after: &Option<Duration>,
) -> String {
    let mut msg = match error {
        Some(error) => format!("tool `{tool}` failed: {error}; no retry was made: "),
        None => format!("tool `{tool}` stopped: "),
    };
    match (budget, retry_after) {
        (BudgetKind::Deadline, Some(after)) => {
            // Capped at a century, as the stores cap durations: a hint of `Duration::MAX` would
            // otherwise print as a 23-digit number. The wait is the hint or the backoff's pause,
            // whichever is longer: a short hint may not be what reached past the deadline.
            let after = crate::clock::ms(*after);
            let _ = write!(
                msg,
                "the wait before the next attempt, at least the {after} ms the tool asked for, \
                 would end past the call's deadline; retry after {after} ms at the earliest",
            );
        }
        (BudgetKind::Deadline, None) if error.is_some() => {
            msg.push_str(
                "the wait before the next attempt would end past the call's deadline; retry later",
            );
        }
        (BudgetKind::Deadline, None) => msg.push_str("its deadline has passed; retry later"),
        (BudgetKind::RetryBudget, _) => {
            msg.push_str("the shared retry budget is exhausted; retry later");
        }
    }
    msg
}

impl<E> Error<E> {
    /// Converts the tool's error type with `f`, keeping every framework variant as it is.
    pub fn map_tool<F>(self, mut f: impl FnMut(E) -> F) -> Error<F> {
        match self.try_map_tool(|e| Ok::<F, Infallible>(f(e))) {
            Ok(mapped) => mapped,
            Err(never) => match never {},
        }
    }

    /// Converts the tool's error type with `f`, which may fail; its failure is returned as is.
    /// The one place that lists every variant.
    pub(crate) fn try_map_tool<F, X>(
        self,
        mut f: impl FnMut(E) -> Result<F, X>,
    ) -> Result<Error<F>, X> {
        Ok(match self {
            Error::Tool { tool, error } => Error::Tool { tool, error: f(error)? },
            Error::BudgetExhausted { tool, budget, error, retry_after } => {
                let error = match error {
                    Some(e) => Some(f(e)?),
                    None => None,
                };
                Error::BudgetExhausted { tool, budget, error, retry_after }
            }
            Error::InvalidArguments { tool, source } => Error::InvalidArguments { tool, source },
            Error::StoreUnavailable { tool, source } => Error::StoreUnavailable { tool, source },
            Error::Incompatible { tool, key, reason } => Error::Incompatible { tool, key, reason },
            Error::LeaseLost { tool, key } => Error::LeaseLost { tool, key },
            Error::KeyReuseMismatch { tool, key, caller_key } => {
                Error::KeyReuseMismatch { tool, key, caller_key }
            }
            Error::OutcomeUnknown { tool, key } => Error::OutcomeUnknown { tool, key },
            Error::Timeout { tool, timeout, attempt } => Error::Timeout { tool, timeout, attempt },
            Error::ReplayFailed { tool, key, reason } => Error::ReplayFailed { tool, key, reason },
            Error::OutputNotStorable { tool, key, reason } => {
                Error::OutputNotStorable { tool, key, reason }
            }
            Error::Panicked { tool, attempt, message } => {
                Error::Panicked { tool, attempt, message }
            }
            Error::Cancelled { tool, attempts } => Error::Cancelled { tool, attempts },
            Error::StoppedWaiting { tool, key } => Error::StoppedWaiting { tool, key },
            Error::NameTaken { tool, declared_at, held_by } => {
                Error::NameTaken { tool, declared_at, held_by }
            }
            Error::Internal { tool, key, what } => Error::Internal { tool, key, what },
        })
    }

    /// Whether the caller stopped the call ([`Error::Cancelled`], [`Error::StoppedWaiting`]).
    pub(crate) fn is_stopped(&self) -> bool {
        matches!(self, Error::Cancelled { .. } | Error::StoppedWaiting { .. })
    }

    /// The tool's own error: of [`Error::Tool`], or the last one before a budget stopped the
    /// retries ([`Error::BudgetExhausted`]).
    pub fn tool_error(&self) -> Option<&E> {
        match self {
            Error::Tool { error, .. } => Some(error),
            Error::BudgetExhausted { error, .. } => error.as_ref(),
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
            Error::Incompatible { .. } => ErrorKind::Incompatible,
            Error::LeaseLost { .. } => ErrorKind::LeaseLost,
            Error::KeyReuseMismatch { .. } => ErrorKind::KeyReuseMismatch,
            Error::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::BudgetExhausted { .. } => ErrorKind::BudgetExhausted,
            Error::ReplayFailed { .. } => ErrorKind::ReplayFailed,
            Error::OutputNotStorable { .. } => ErrorKind::OutputNotStorable,
            Error::Panicked { .. } => ErrorKind::Panicked,
            Error::Cancelled { .. } => ErrorKind::Cancelled,
            Error::StoppedWaiting { .. } => ErrorKind::StoppedWaiting,
            Error::NameTaken { .. } => ErrorKind::NameTaken,
            Error::Internal { .. } => ErrorKind::Internal,
        }
    }
}

/// Displays an error and every cause under it ([`source`](std::error::Error::source)), each once:
/// `message: cause: cause of the cause`. For logs, the text a model reads, and a program's own
/// error messages (the `idem` command line's): `ErrorChain(&e).to_string()`.
///
/// Some backends' errors write their cause into their own message and still return it as their
/// `source()` (redis's I/O errors: "Connection refused (os error 111)" over the same
/// `io::Error`); a cause whose text the error above it already holds is not written again.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut above = self.0.to_string();
        f.write_str(&above)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !above.contains(&text) {
                write!(f, ": {text}")?;
            }
            above = text;
            next = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod chain_tests {
    use super::Chain;

    /// An error that, like redis's, writes its cause's text into its own and returns the cause.
    #[derive(Debug)]
    struct Repeats(std::io::Error);

    impl std::fmt::Display for Repeats {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", self.0)
        }
    }

    impl std::error::Error for Repeats {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_above_is_written_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = crate::StoreError::unavailable(Repeats(io));
        assert_eq!(
            Chain(&e).to_string(),
            "the store could not be reached or failed the operation: Connection refused"
        );
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
    /// `incompatible`: [`Error::Incompatible`].
    Incompatible,
    /// `output_not_storable`: [`Error::OutputNotStorable`].
    OutputNotStorable,
    /// `internal`: [`Error::Internal`].
    Internal,
    /// `tool_panicked`: [`Error::Panicked`].
    Panicked,
    /// `cancelled`: [`Error::Cancelled`].
    Cancelled,
    /// `stopped_waiting`: [`Error::StoppedWaiting`]. Apart from `cancelled` because a repeat is
    /// answered differently: after `cancelled` it runs the tool, after this it gets the outcome
    /// of the call that was waited for.
    StoppedWaiting,
    /// `tool_name_taken`: [`Error::NameTaken`].
    NameTaken,
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
            ErrorKind::Incompatible => "incompatible",
            ErrorKind::OutputNotStorable => "output_not_storable",
            ErrorKind::Internal => "internal",
            ErrorKind::Panicked => "tool_panicked",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::StoppedWaiting => "stopped_waiting",
            ErrorKind::NameTaken => "tool_name_taken",
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

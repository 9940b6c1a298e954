//! How a tool's own error is classified: transient, ambiguous or permanent (`docs/design.md` §3).

use std::convert::Infallible;
use std::time::Duration;

/// What a failure says about the side effect, which decides whether a retry may follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// Nothing happened and trying again may succeed (connection refused, 429, 503 before send).
    Transient,
    /// The effect may or may not have happened (timeout or reset after the request was sent).
    Ambiguous,
    /// Retrying cannot help (validation error, card declined). Keyed and never tools store and
    /// replay it.
    Permanent,
}

/// A classified failure: its kind and an optional retry-after hint from the provider
/// (HTTP `Retry-After`, RFC 9110 §10.2.3), honoured by the executor's backoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Transient, ambiguous or permanent.
    pub kind: FailureKind,
    /// Wait at least this long before the next attempt.
    pub retry_after: Option<Duration>,
}

impl Failure {
    /// Nothing happened; a retry may succeed.
    pub const fn transient() -> Self {
        Failure { kind: FailureKind::Transient, retry_after: None }
    }
    /// The effect may have happened.
    pub const fn ambiguous() -> Self {
        Failure { kind: FailureKind::Ambiguous, retry_after: None }
    }
    /// Retrying cannot help.
    pub const fn permanent() -> Self {
        Failure { kind: FailureKind::Permanent, retry_after: None }
    }
    /// Adds a retry-after hint.
    pub const fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}

/// Implemented by every tool's error type: says what a failure means for a retry.
///
/// Permanent failures of keyed and never tools are stored and replayed, so the error type is also
/// `Serialize + DeserializeOwned` (checked where the tool is declared).
///
/// ```
/// use idem_core::{Classify, Failure};
/// #[derive(Debug)]
/// enum PaymentError { Declined, Timeout, RateLimited { after_ms: u64 } }
/// impl Classify for PaymentError {
///     fn classify(&self) -> Failure {
///         match self {
///             PaymentError::Declined => Failure::permanent(),
///             PaymentError::Timeout => Failure::ambiguous(),
///             PaymentError::RateLimited { after_ms } => Failure::transient()
///                 .retry_after(std::time::Duration::from_millis(*after_ms)),
///         }
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "the tool error type `{Self}` does not say whether a failure may be retried",
    note = "implement `idem_core::Classify` for `{Self}`: return `Failure::transient()`, `Failure::ambiguous()` or `Failure::permanent()`"
)]
pub trait Classify {
    /// The kind of this failure and an optional retry-after hint.
    fn classify(&self) -> Failure;
}

impl Classify for Infallible {
    fn classify(&self) -> Failure {
        match *self {}
    }
}

/// The error type of a tool that cannot fail: `Result<T, idem_core::NoError>`. It has no
/// values. (`std::convert::Infallible` cannot serve: a tool's error must be `Serialize` and
/// `Deserialize`, to be stored and replayed, and serde implements neither for it.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NoError {}

impl std::fmt::Display for NoError {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

impl std::error::Error for NoError {}

impl Classify for NoError {
    fn classify(&self) -> Failure {
        match *self {}
    }
}

//! How a tool's own error is classified: transient, ambiguous or permanent (`docs/design.md` §3).

use std::convert::Infallible;
use std::time::Duration;

/// What a failure says about the side effect, which decides whether a retry may follow.
/// Serialized in snake case (`"transient"`, `"ambiguous"`, `"permanent"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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

/// A tool error for code that propagates errors with `?` instead of declaring its own error
/// type: a message and its [`Failure`]. `Result<T, ToolFailure>` is a tool's return type like
/// any other; `anyhow::Error` and `Box<dyn Error>` cannot be one (a tool's error is stored and
/// replayed as JSON, and says whether a retry may follow).
///
/// `?` converts any [`std::error::Error`] into an **ambiguous** failure, its message the error
/// and its causes: an error the tool did not classify may have come after the request left, so
/// a `safe` or `keyed` tool retries it (a keyed one under the same idempotency key) and a
/// `never` tool answers outcome unknown instead of running again. Say more where the tool
/// knows: [`ToolFailure::transient`] (nothing happened), [`ToolFailure::permanent`] (stored and
/// replayed to every repeat). Stored as `{"message": "..", "kind": "permanent",
/// "retry_after_ms": 1500}` (`retry_after_ms` only when set).
///
/// Like `anyhow::Error`, it does not implement `std::error::Error` itself (that would collide
/// with the conversion from every error); it is `Display` and `Debug`, which is what
/// [`crate::Error`] needs. Neither `anyhow::Error` nor `Box<dyn Error>` is a `std::error::Error`,
/// so `?` does not convert them: `.map_err(ToolFailure::ambiguous)` does.
///
/// ```
/// use idem_core::{ToolFailure, tool};
///
/// /// Look up an order.
/// #[tool(retry = "safe")]
/// async fn order_status(id: String) -> Result<String, ToolFailure> {
///     let n: u64 = id.parse()?; // a ParseIntError: ambiguous
///     if n == 0 {
///         return Err(ToolFailure::permanent("there is no order 0"));
///     }
///     Ok(format!("order {n}: shipped"))
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolFailure {
    message: String,
    kind: FailureKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

impl ToolFailure {
    /// Nothing happened; a retry may succeed.
    pub fn transient(message: impl std::fmt::Display) -> Self {
        Self::new(FailureKind::Transient, message)
    }
    /// The effect may have happened.
    pub fn ambiguous(message: impl std::fmt::Display) -> Self {
        Self::new(FailureKind::Ambiguous, message)
    }
    /// Retrying cannot help; a keyed or never tool stores it and replays it to every repeat.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        Self::new(FailureKind::Permanent, message)
    }
    /// Adds a retry-after hint (whole milliseconds, rounded up), as [`Failure::retry_after`].
    #[must_use]
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after_ms = Some(crate::clock::ms(after));
        self
    }
    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Transient, ambiguous or permanent.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    fn new(kind: FailureKind, message: impl std::fmt::Display) -> Self {
        // `{:#}`: the alternate form, in which `anyhow::Error` writes its causes too.
        ToolFailure { message: format!("{message:#}"), kind, retry_after_ms: None }
    }
}

impl std::fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error + 'static> From<E> for ToolFailure {
    fn from(error: E) -> Self {
        ToolFailure::ambiguous(crate::ErrorChain(&error))
    }
}

impl Classify for ToolFailure {
    fn classify(&self) -> Failure {
        let failure = Failure { kind: self.kind, retry_after: None };
        match self.retry_after_ms {
            Some(ms) => failure.retry_after(Duration::from_millis(ms)),
            None => failure,
        }
    }
}

#[cfg(test)]
mod tool_failure_tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the provider did not answer")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn propagate() -> Result<(), ToolFailure> {
        Err(Outer(std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out")))?
    }

    #[test]
    fn question_mark_makes_an_ambiguous_failure_with_every_cause() {
        let failure = propagate().unwrap_err();
        assert_eq!(failure.kind(), FailureKind::Ambiguous);
        assert_eq!(failure.classify(), Failure::ambiguous());
        assert_eq!(failure.to_string(), "the provider did not answer: read timed out");
    }

    #[test]
    fn stored_as_json_and_read_back() {
        let failure =
            ToolFailure::transient("rate limited").retry_after(Duration::from_micros(1500));
        let json = serde_json::to_value(&failure).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"message": "rate limited", "kind": "transient", "retry_after_ms": 2})
        );
        let back: ToolFailure = serde_json::from_value(json).unwrap();
        assert_eq!(back, failure);
        assert_eq!(back.classify(), Failure::transient().retry_after(Duration::from_millis(2)));
        let permanent = serde_json::to_value(ToolFailure::permanent("declined")).unwrap();
        assert_eq!(permanent, serde_json::json!({"message": "declined", "kind": "permanent"}));
        let unknown = serde_json::from_value::<ToolFailure>(
            serde_json::json!({"message": "x", "kind": "sometimes"}),
        );
        assert!(unknown.is_err());
    }
}

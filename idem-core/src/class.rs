//! The retry class a tool declares: how it may be retried (`docs/design.md` §3).

use std::fmt;
use std::str::FromStr;

/// How a tool may be retried. Classify the tool, not the error: a timeout is ambiguous whatever
/// the error type says, so the class decides what a retry is allowed to do.
///
/// | class | first call | lease expired, no result | ambiguous failure |
/// |---|---|---|---|
/// | [`Safe`](RetryClass::Safe) | run, retry transient and ambiguous failures | re-run | retry |
/// | [`Keyed`](RetryClass::Keyed) | claim, run with the key, retries reuse it | take over, re-run with the same key | retry with the same key |
/// | [`Never`](RetryClass::Never) | claim, exactly one attempt | [`OutcomeUnknown`](crate::Error::OutcomeUnknown) | record unknown |
///
/// MCP tool annotations (MCP spec 2025-11-25, `ToolAnnotations`) follow from the class:
/// `Safe` → `readOnlyHint`, `Keyed` → `idempotentHint`, `Never` → `destructiveHint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryClass {
    /// Reads and pure computations: running twice changes nothing.
    Safe,
    /// Side effects the provider deduplicates by the forwarded idempotency key
    /// (a charge, a mail with a message id, an insert with a natural key).
    Keyed,
    /// Side effects nobody can deduplicate or observe afterwards: one attempt, and an honest
    /// "outcome unknown" when it is ambiguous.
    Never,
}

impl RetryClass {
    /// The spelling used in `#[tool(retry = "...")]`, in keys' documentation and in traces.
    pub const fn as_str(self) -> &'static str {
        match self {
            RetryClass::Safe => "safe",
            RetryClass::Keyed => "keyed",
            RetryClass::Never => "never",
        }
    }
}

impl fmt::Display for RetryClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing a retry class that is not `safe`, `keyed` or `never`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown retry class `{0}`: expected \"safe\", \"keyed\" or \"never\"")]
pub struct UnknownRetryClass(pub String);

impl FromStr for RetryClass {
    type Err = UnknownRetryClass;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "safe" => Ok(RetryClass::Safe),
            "keyed" => Ok(RetryClass::Keyed),
            "never" => Ok(RetryClass::Never),
            other => Err(UnknownRetryClass(other.to_owned())),
        }
    }
}

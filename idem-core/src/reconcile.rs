//! Automatic reconciliation: what a tool's check (`#[tool(reconcile = check)]`) answers when the
//! executor asks whether an attempt whose outcome is unknown took effect (`docs/design.md` §3.1).

/// The answer of a reconciliation check: did the intent of this idempotency key take effect in
/// the target system?
///
/// A check is declared with `#[tool(retry = "never" | "keyed", reconcile = check)]`: an
/// `async fn check(key: &Key, <the tool's parameters, by value, in order>) -> Reconciled<Output>`
/// (the context parameter left out). It asks the target system, for example a provider's lookup
/// by idempotency key. A check that cannot tell (the provider is down, the lookup failed) answers
/// [`Reconciled::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Reconciled<O> {
    /// The effect happened; this is its output, as the tool would have returned it. It is stored
    /// (under the caller's fence) and replayed to every repeat.
    Happened(O),
    /// The effect did not happen. The call goes on as its class says: a `never` tool runs now,
    /// once.
    NotHappened,
    /// The check cannot tell: the caller gets [`crate::Error::OutcomeUnknown`], as without a
    /// check.
    Unknown,
}

impl<O> Reconciled<O> {
    /// `happened`, `not_happened` or `unknown` (the `idem.reconciled` field of traces).
    pub fn as_str(&self) -> &'static str {
        match self {
            Reconciled::Happened(_) => "happened",
            Reconciled::NotHappened => "not_happened",
            Reconciled::Unknown => "unknown",
        }
    }
}

//! Asking a tool's reconciliation check (`#[tool(reconcile = check)]`) whether an attempt whose
//! outcome is unknown took effect, and acting on the answer (`docs/design.md` §3.1).
//!
//! The check runs only while this call holds the key's current fence: after its own ambiguous
//! attempt, or after taking over a dead owner's expired lease. So at most one caller asks at a
//! time, and whatever it stores is fenced: the earlier owner, finishing late, presents a stale
//! fence and is refused (`LeaseLost`), and a caller that lost its own lease while the check ran
//! stores nothing. The check's answer and a late owner's completion can never both be stored.
//! Before asking, and before running again on "not happened", the caller confirms with the
//! store that its fence is still current: one whose lease was taken over while its attempt ran
//! answers `LeaseLost` and neither asks nor runs.

use std::panic::AssertUnwindSafe;
use std::task::Poll;

use futures_util::FutureExt;

use super::call::Call;
use super::report::Served;
use crate::error::Error;
use crate::reconcile::Reconciled;
use crate::store::Fence;
use crate::tool::Tool;

impl<T: Tool> Call<'_, T> {
    /// Runs the tool's check while holding `fence`, renewing the lease every third of it.
    ///
    /// Bounded by the per-attempt timeout, not by the call's deadline: the check comes after the
    /// attempt that may have used the deadline up, and the answer without it is "unknown". A check
    /// that does not answer in time, or panics, is "unknown".
    pub(super) async fn ask_check(&self, fence: Fence, args: &T::Args) -> Reconciled<T::Output> {
        // The user's code, as the body is: a panic is caught, and its verdict is "unknown".
        let unknown = |message: String| {
            tracing::error!(panic = %message, "the reconciliation check panicked; outcome unknown");
            Reconciled::Unknown
        };
        let check = async {
            // A `reconcile` written by hand may panic before it returns its future: that panic
            // is the check's too, not one to unwind through the call that holds the fence.
            match super::caught::caught(|| self.tool.reconcile(&self.key, args)) {
                Ok(asked) => FutureExt::catch_unwind(AssertUnwindSafe(asked)).await.unwrap_or_else(
                    |payload| unknown(super::caught::panic_message(payload.as_ref())),
                ),
                Err(message) => unknown(message),
            }
        };
        let mut check = std::pin::pin!(check);
        let verdict = match std::future::poll_fn(|c| Poll::Ready(check.as_mut().poll(c))).await {
            Poll::Ready(verdict) => verdict,
            Poll::Pending => {
                let timeout = self.policy.attempt_timeout;
                let mut expired = std::pin::pin!(tokio::time::sleep(timeout));
                // Beside the check, so that a slow renewal does not hold the check up.
                let mut renewals = std::pin::pin!(self.renewals(fence));
                tokio::select! {
                    biased;
                    verdict = &mut check => verdict,
                    () = &mut expired => {
                        tracing::warn!(?timeout, "reconciliation check timed out; outcome unknown");
                        Reconciled::Unknown
                    }
                    never = &mut renewals => match never {},
                }
            }
        };
        tracing::info!(idem.reconciled = verdict.as_str(), "reconciliation check answered");
        crate::metrics::reconciliation(self.name(), verdict.as_str());
        verdict
    }

    /// The check found that the effect happened: `output` is stored under `fence` (as a success
    /// of the tool would be) and returned. A lost lease answers `LeaseLost` for a `never` tool:
    /// another caller took the key over, and its answer stands.
    pub(super) async fn happened(
        &self,
        fence: Fence,
        output: T::Output,
    ) -> Result<T::Output, Error<T::Error>> {
        self.outcome(Served::Reconciled);
        self.finish_ok(Some(fence), output).await
    }
}

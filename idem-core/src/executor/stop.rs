//! A caller's request that a call start nothing more ([`Run::with_stop`](super::Run::with_stop)):
//! the user pressed Stop, the MCP client sent `notifications/cancelled`, the process is shutting
//! down.
//!
//! Dropping a call's future stops it too, but in the middle of an attempt that leaves the effect
//! ambiguous; so front doors that must not lose an attempt's outcome (the MCP server) run each
//! call to its end in a task of its own. A stop is heard only between steps: an attempt already
//! running finishes and its outcome is stored, no new attempt starts (not the first, after a wait
//! for another owner, nor a retry), and a claim with nothing run under it is released.

use tokio_util::sync::CancellationToken;

/// Asks the calls made with it ([`Run::with_stop`](super::Run::with_stop)) to start nothing more.
/// Cheap to clone; clones are one signal. Once stopped, it stays stopped. (tokio-util's
/// `CancellationToken` underneath, kept out of idem's API.)
#[derive(Clone, Debug, Default)]
pub struct StopSignal(CancellationToken);

impl StopSignal {
    /// A signal not stopped yet.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// A signal of its own that is also stopped when this one is (also when it already was):
    /// one per call, under one for a whole server (its shutdown stops every call; a call's own
    /// stop stops only it).
    pub fn child(&self) -> StopSignal {
        StopSignal(self.0.child_token())
    }

    /// Stops every call made with this signal at its next step.
    pub fn stop(&self) {
        self.0.cancel();
    }

    /// Whether [`stop`](Self::stop) was called on it or on a signal it is a child of.
    pub fn is_stopped(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once the signal (or a signal it is a child of) is stopped.
    pub async fn stopped(&self) {
        self.0.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::StopSignal;

    #[tokio::test]
    async fn a_child_is_stopped_by_its_parent_and_not_the_other_way() {
        let server = StopSignal::new();
        let (one, two) = (server.child(), server.child());
        one.stop();
        assert!(one.is_stopped() && !two.is_stopped() && !server.is_stopped());
        tokio::time::timeout(Duration::from_secs(5), one.stopped()).await.expect("stopped");
        let waiting = tokio::spawn({
            let two = two.clone();
            async move { two.stopped().await }
        });
        tokio::task::yield_now().await;
        server.stop();
        assert!(two.is_stopped());
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").unwrap();
        // A child made after the stop starts stopped.
        assert!(server.child().is_stopped());
    }
}

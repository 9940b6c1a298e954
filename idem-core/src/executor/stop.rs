//! A caller's request that a call start nothing more ([`Run::with_stop`](super::Run::with_stop)):
//! the user pressed Stop, the MCP client sent `notifications/cancelled`, the process is shutting
//! down.
//!
//! Dropping a call's future stops it too, but in the middle of an attempt that leaves the effect
//! ambiguous; so front doors that must not lose an attempt's outcome (the MCP server) run each
//! call to its end in a task of its own. A stop is heard only between steps: an attempt already
//! running finishes and its outcome is stored, no new attempt starts (not the first, after a wait
//! for another owner, nor a retry), and a claim with nothing run under it is released.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Asks the calls made with it ([`Run::with_stop`](super::Run::with_stop)) to start nothing more.
/// Cheap to clone; clones are one signal. Once stopped, it stays stopped.
#[derive(Clone, Debug, Default)]
pub struct StopSignal(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    stopped: AtomicBool,
    notify: Notify,
    /// Stopping the parent stops this one too ([`StopSignal::child`]).
    parent: Option<StopSignal>,
}

impl StopSignal {
    /// A signal not stopped yet.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// A signal of its own that is also stopped when this one is: one per call, under one for a
    /// whole server (its shutdown stops every call; a call's own stop stops only it).
    pub fn child(&self) -> StopSignal {
        StopSignal(Arc::new(Inner { parent: Some(self.clone()), ..Inner::default() }))
    }

    /// Stops every call made with this signal at its next step.
    pub fn stop(&self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    /// Whether [`stop`](Self::stop) was called on it or on a signal it is a child of.
    pub fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::SeqCst)
            || self.0.parent.as_ref().is_some_and(Self::is_stopped)
    }

    /// Resolves once the signal (or a signal it is a child of) is stopped.
    pub async fn stopped(&self) {
        let own = async {
            loop {
                let notified = self.0.notify.notified();
                let mut notified = std::pin::pin!(notified);
                // Registered before the check, so a stop in between is not missed.
                notified.as_mut().enable();
                if self.0.stopped.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        };
        match &self.0.parent {
            None => own.await,
            Some(parent) => {
                // Boxed: a chain of children would otherwise nest futures without bound.
                let parent = Box::pin(parent.stopped());
                tokio::select! {
                    () = own => {}
                    () = parent => {}
                }
            }
        }
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

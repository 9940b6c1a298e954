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
}

impl StopSignal {
    /// A signal not stopped yet.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Stops every call made with this signal at its next step.
    pub fn stop(&self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::SeqCst)
    }

    /// Resolves once the signal is stopped.
    pub async fn stopped(&self) {
        loop {
            let notified = self.0.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a stop in between is not missed.
            notified.as_mut().enable();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}

//! An outcome (a result, or a permanent failure to replay) the store refused when the tool
//! finished (it was down, busy with another process's write lock, or full) is stored later, in
//! the background, while this process lives.
//!
//! The caller has its result at once, as before; what changes is the record. Left in flight, it
//! would make a `keyed` repeat wait out the lease and run the tool again, and a `never` repeat
//! answer outcome unknown for a call that succeeded. Sent again once the store answers, the
//! completion lands and repeats replay it. The completion is fenced, so sending it late is
//! safe: once another owner has taken the key over it is refused (`LeaseLost`) and the retries
//! stop; the record is the new owner's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::error::Chain;
use crate::key::Key;
use crate::store::full_jitter;
use crate::store::{Fence, Outcome, Store, StoreError};

/// How long the completion is retried before it is left for the lease to settle.
const STORE_LATER_FOR: Duration = Duration::from_secs(600);
/// The pause ceilings between sends (full jitter): from 100 ms, doubling up to 5 s.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// The late completions of one [`Idem`](super::Idem) still being sent, so that a process can
/// wait for them before it exits ([`Idem::late_completions_settled`](super::Idem::late_completions_settled)).
#[derive(Default)]
pub(super) struct LateCompletions {
    pending: AtomicUsize,
    settled: tokio::sync::Notify,
}

impl LateCompletions {
    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Waits until none is pending, at most `max`; how many still are.
    pub(super) async fn settled(&self, max: Duration) -> usize {
        // `None`: no deadline (`Duration::MAX`, or one past what the clock can hold).
        let deadline = tokio::time::Instant::now().checked_add(max);
        loop {
            // Registered before the count is read, so a last one ending in between wakes it.
            let settled = self.settled.notified();
            if self.pending() == 0 {
                return 0;
            }
            match deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, settled).await.is_err() {
                        return self.pending();
                    }
                }
                None => settled.await,
            }
        }
    }
}

/// One late completion counted in its [`LateCompletions`] while it is alive.
struct Pending(Arc<LateCompletions>);

impl Pending {
    fn new(late: &Arc<LateCompletions>) -> Pending {
        late.pending.fetch_add(1, Ordering::AcqRel);
        Pending(Arc::clone(late))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.settled.notify_waiters();
        }
    }
}

/// One completion to send again.
pub(super) struct Later {
    pub(super) late: Arc<LateCompletions>,
    pub(super) store: Arc<dyn Store>,
    pub(super) tool: &'static str,
    pub(super) key: Key,
    pub(super) fence: Fence,
    pub(super) outcome: Outcome,
    pub(super) ttl: Duration,
    /// Each send's bound (`Policy::store_timeout`); `None` for a store in this process.
    pub(super) step_timeout: Option<Duration>,
}

impl Later {
    /// Starts the retries on the current Tokio runtime (a call runs on one); without one the
    /// record is left to its lease, as before.
    pub(super) fn spawn(self, why: &StoreError) {
        tracing::warn!(
            tool = self.tool,
            key = %self.key,
            error = %Chain(why),
            "outcome not stored; sending it again in the background while the store is away"
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pending = Pending::new(&self.late);
            runtime.spawn(async move {
                self.run().await;
                drop(pending);
            });
        }
    }

    async fn run(self) {
        let until = tokio::time::Instant::now() + STORE_LATER_FOR;
        let mut pause = FIRST_PAUSE;
        loop {
            tokio::time::sleep(full_jitter(pause)).await;
            pause = pause.saturating_mul(2).min(LONGEST_PAUSE);
            let send = self.store.complete(&self.key, self.fence, &self.outcome, self.ttl);
            let sent = match self.step_timeout {
                Some(bound) => tokio::time::timeout(bound, send).await.unwrap_or_else(|_| {
                    Err(StoreError::unavailable("the store did not answer in time"))
                }),
                None => send.await,
            };
            match sent {
                Ok(()) => {
                    tracing::info!(tool = self.tool, key = %self.key, "outcome stored late");
                    return;
                }
                Err(StoreError::Unavailable(_)) if tokio::time::Instant::now() < until => {}
                Err(StoreError::LeaseLost) => {
                    // An earlier send that timed out completed it after all, or another owner
                    // took the key over: either way the record is settled without this send.
                    tracing::debug!(
                        tool = self.tool,
                        key = %self.key,
                        "the record is no longer in flight under this call's fence"
                    );
                    return;
                }
                Err(e) => {
                    // A store this version cannot write, or one away for too long: the lease
                    // settles it.
                    tracing::warn!(
                        tool = self.tool,
                        key = %self.key,
                        error = %Chain(&e),
                        "outcome not stored late; the record stays in flight until its lease ends"
                    );
                    return;
                }
            }
        }
    }
}

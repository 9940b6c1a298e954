//! When the SQL stores (SQLite, PostgreSQL) sweep records whose retention ended.

use std::sync::atomic::{AtomicI64, Ordering};

use super::codec::now_ms;

/// How often a store sweeps records whose retention ended: once per minute, by whichever call
/// first finds the minute over (claims already treat such records as absent; sweeping only
/// reclaims space).
pub(crate) struct SweepClock {
    next_ms: AtomicI64,
}

const SWEEP_EVERY_MS: i64 = 60_000;

impl SweepClock {
    pub(crate) fn new() -> Self {
        SweepClock { next_ms: AtomicI64::new(now_ms() + SWEEP_EVERY_MS) }
    }

    /// Makes the next call of [`due`](Self::due) answer true.
    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) fn make_due(&self) {
        self.next_ms.store(i64::MIN, Ordering::Relaxed);
    }

    /// Whether the caller should sweep now; true for exactly one caller per minute.
    pub(crate) fn due(&self, now_ms: i64) -> bool {
        let due = self.next_ms.load(Ordering::Relaxed);
        now_ms >= due
            && self
                .next_ms
                .compare_exchange(
                    due,
                    now_ms + SWEEP_EVERY_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

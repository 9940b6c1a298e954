//! Instants far in the future without overflow: a policy may say `Duration::MAX` for "no limit",
//! and a provider's retry-after hint comes from outside.

use std::time::Duration;

use tokio::time::Instant;

/// The longest duration idem hands to a store or adds to an instant: 100 years. Every store can
/// represent it (SQLite and Redis count milliseconds in an i64, PostgreSQL intervals reach
/// millions of years), and it is "forever" for any record.
pub const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `d` in whole milliseconds, capped at [`FOREVER`]: what the stores write (longer would
/// overflow PostgreSQL's `interval` and SQLite's `now + ms`, and means the same).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres", feature = "redis")), allow(dead_code))]
pub(crate) fn ms(d: Duration) -> u64 {
    // FOREVER is about 3.2e12 ms: it fits u64 and i64.
    u64::try_from(d.min(FOREVER).as_millis()).unwrap_or(u64::MAX)
}

/// `now + d`, saturating at `now + FOREVER`.
#[inline]
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d.min(FOREVER)).unwrap_or(now)
}

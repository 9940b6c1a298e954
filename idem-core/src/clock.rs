//! Instants far in the future without overflow: a policy may say `Duration::MAX` for "no limit",
//! and a provider's retry-after hint comes from outside.

use std::time::Duration;

use tokio::time::Instant;

/// The longest duration idem hands to a store or adds to an instant: 100 years. Every store can
/// represent it (SQLite and Redis count milliseconds in an i64, PostgreSQL intervals reach
/// millions of years), and it is "forever" for any record.
pub const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `d` in whole milliseconds, rounded up and capped at [`FOREVER`]: what the stores write
/// (longer would overflow PostgreSQL's `interval` and SQLite's `now + ms`, and means the same).
/// Rounded up, so that a retention or a lease is never shorter than asked: 500 µs truncated
/// would be 0 ms, a record kept for no time at all.
pub(crate) fn ms(d: Duration) -> u64 {
    // FOREVER is about 3.2e12 ms: it fits u64 and i64.
    u64::try_from(d.min(FOREVER).as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// `now + d`, saturating at `now + FOREVER`, or as far as the platform's instants reach.
#[inline]
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    later_with(now, d, |at, d| at.checked_add(d))
}

/// What `later` falls back to where an instant cannot reach a century ahead (tokio caps its own
/// timers at 30 years for that reason, naming FreeBSD and macOS).
const FAR: [Duration; 2] =
    [Duration::from_secs(30 * 365 * 24 * 3600), Duration::from_secs(365 * 24 * 3600)];

/// [`later`] with the addition given, so the fallback can be tested on any platform. Never
/// `now` for a long `d`: "no limit" would become a deadline or a lease that has already ended.
#[inline]
fn later_with(
    now: Instant,
    d: Duration,
    add: impl Fn(Instant, Duration) -> Option<Instant>,
) -> Instant {
    let d = d.min(FOREVER);
    add(now, d).or_else(|| FAR.iter().find_map(|far| add(now, d.min(*far)))).unwrap_or(now)
}

/// What to add to the message of a timeout that ran out on a paused clock: Tokio's paused test
/// clock (`#[tokio::test(start_paused = true)]`, `tokio::time::pause`) jumps to the next timer
/// whenever the runtime only waits on I/O, so a bound on a network step runs out at once however
/// fast the server answers, and the message alone would send the reader after a server that is
/// fine. Empty on a running clock, also one that was paused, advanced and resumed: it is then
/// ahead of the system's but follows real time again, and its timeouts are real.
pub(crate) fn paused_clock_note() -> &'static str {
    // A paused clock stands still while real time passes (only a parked runtime advances it,
    // and this runs without parking); a running one moves with it.
    let (before, real) = (Instant::now(), std::time::Instant::now());
    while real.elapsed() < Duration::from_micros(100) {
        std::hint::spin_loop();
    }
    if Instant::now() == before {
        "; the runtime's clock is paused (`start_paused = true`, `tokio::time::pause`), and a \
         paused clock skips ahead to a timeout while the store's network I/O is pending: use a \
         real clock with a remote store"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_round_up_so_nothing_becomes_zero() {
        assert_eq!(ms(Duration::ZERO), 0);
        assert_eq!(ms(Duration::from_nanos(1)), 1);
        assert_eq!(ms(Duration::from_micros(500)), 1);
        assert_eq!(ms(Duration::from_millis(7)), 7);
        assert_eq!(ms(Duration::from_micros(7_001)), 8);
        assert_eq!(ms(Duration::MAX), ms(FOREVER));
    }

    /// On a platform whose instants end 40 years ahead, "no limit" is 30 years away, not now.
    #[test]
    fn a_platform_that_cannot_reach_a_century_gets_the_farthest_instant_it_can() {
        let now = Instant::now();
        let limit = Duration::from_secs(40 * 365 * 24 * 3600);
        let add = |at: Instant, d: Duration| if d > limit { None } else { at.checked_add(d) };
        assert_eq!(later_with(now, Duration::MAX, add), now + FAR[0]);
        assert_eq!(later_with(now, FOREVER, add), now + FAR[0]);
        assert_eq!(later_with(now, Duration::from_secs(5), add), now + Duration::from_secs(5));
        let short = |at: Instant, d: Duration| if d > FAR[1] { None } else { at.checked_add(d) };
        assert_eq!(later_with(now, Duration::MAX, short), now + FAR[1]);
        assert_eq!(later(now, Duration::MAX), now + FOREVER, "Linux reaches a century");
    }
}

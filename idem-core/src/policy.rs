//! Retry policy: attempts, timeouts, the deadline, leases, retention and size limits
//! (`docs/design.md` §6).

use std::time::Duration;

use crate::class::RetryClass;
use crate::clock::FOREVER;

/// Exponential backoff with full jitter: before retry `n` (1-based) the executor sleeps
/// `random(0, min(cap, base * 2^(n-1)))`, or the failure's retry-after hint if longer
/// (AWS Architecture Blog, "Exponential Backoff and Jitter", 2015).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry's ceiling. Default 100 ms.
    pub base: Duration,
    /// The largest ceiling. Default 10 s.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(10) }
    }
}

impl Backoff {
    /// The ceiling before retry `retry` (1-based): `min(cap, base * 2^(retry-1))`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// The effective policy of one call: executor defaults overridden by the tool's options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Attempts in all, the first included. Default 3; `never` tools always get 1.
    ///
    /// Every duration below is capped at 100 years ([`crate::FOREVER`]), so `Duration::MAX`
    /// can be used for "no limit".
    pub attempts: u32,
    /// Timeout of one attempt; a timeout is an ambiguous failure. Default 30 s. Zero is refused
    /// when a call is made (`Error::StoreUnavailable` with a configuration error naming it):
    /// every attempt would time out as it starts; `Duration::MAX` means no limit.
    pub attempt_timeout: Duration,
    /// Deadline of the whole call, measured from its start (gRPC's word): every attempt, the
    /// backoff between them and waiting for a duplicate end by then. Default 120 s.
    pub deadline: Duration,
    /// Lease of a claim; renewed every third of it while the tool runs. Default 30 s; at least
    /// [`MIN_LEASE`] (100 ms): a shorter one, zero included, is raised to it.
    pub lease: Duration,
    /// Retention of a successful outcome. Default 24 h. Less than [`MIN_TTL`] (1 s), zero
    /// included, is refused when a call that uses the store is made (`Error::StoreUnavailable`
    /// with a configuration error naming it): a result kept for a moment is not replayed to the
    /// repeats it is kept for; `Duration::MAX` keeps results for good.
    pub ttl: Duration,
    /// Retention of a permanent failure (shorter, so a fixed cause can be retried). Default 1 h.
    pub failure_ttl: Duration,
    /// Backoff between attempts.
    pub backoff: Backoff,
    /// Whether `safe` tools store and replay their result for `ttl`. Default off: safe tools then
    /// only share in-flight duplicates within the process and never touch the store.
    pub cache_safe: bool,
    /// How long one store operation may take before it counts as the store being unavailable.
    /// A claim is also bounded by the call's deadline. Default 5 s.
    pub store_timeout: Duration,
    /// The largest canonical arguments, in bytes, a call accepts; larger ones are refused before
    /// the claim ([`crate::KeyError::TooLarge`]). Default 1 MiB: far above what a model writes
    /// as one tool call's arguments, and small enough to hash and hold per call.
    pub max_argument_bytes: usize,
    /// The largest stored outcome (the output's or a permanent error's JSON), in bytes. A larger
    /// output is not sent to the store: the effect happened, so the call is answered like an
    /// output that cannot be stored; a larger permanent error releases the key. Default 4 MiB:
    /// writing it keeps a shared Redis busy for milliseconds, not seconds, and it is more than
    /// a model's context takes in from one tool result.
    pub max_outcome_bytes: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            attempts: 3,
            attempt_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(120),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(24 * 3600),
            failure_ttl: Duration::from_secs(3600),
            backoff: Backoff::default(),
            cache_safe: false,
            store_timeout: Duration::from_secs(5),
            max_argument_bytes: DEFAULT_MAX_ARGUMENT_BYTES,
            max_outcome_bytes: DEFAULT_MAX_OUTCOME_BYTES,
        }
    }
}

/// The shortest lease a call holds: 100 ms. The lease is renewed every third of it, and tokio's
/// timers and a store's round trip take about a millisecond: a lease much shorter (a zero, say)
/// would lapse between renewals while the tool runs, and a duplicate would take the key over and
/// run beside it. `#[tool(lease = "..")]` refuses a shorter one.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// The shortest retention of a successful outcome a call that uses the store accepts: 1 s. A
/// result is kept so that a repeat, which comes seconds to hours later (a model re-calling a tool
/// that timed out, a framework's retry), replays it; kept for less, every repeat of a `never`
/// tool's call would run its effect again. `#[tool(ttl = "..")]` refuses a shorter one.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// [`Policy::max_argument_bytes`]'s default: 1 MiB.
const DEFAULT_MAX_ARGUMENT_BYTES: usize = 1 << 20;
/// [`Policy::max_outcome_bytes`]'s default: 4 MiB.
const DEFAULT_MAX_OUTCOME_BYTES: usize = 4 << 20;

/// The options a tool declares in `#[tool(...)]`; `None` keeps the executor's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToolOptions {
    /// `attempts = N`.
    pub attempts: Option<u32>,
    /// `timeout = "30s"`: per-attempt timeout.
    pub attempt_timeout: Option<Duration>,
    /// `deadline = "2m"`: deadline of the whole call, from its start.
    pub deadline: Option<Duration>,
    /// `lease = "30s"`.
    pub lease: Option<Duration>,
    /// `ttl = "24h"`: retention of the outcome.
    pub ttl: Option<Duration>,
}

impl ToolOptions {
    /// Every option unset (the executor's defaults apply): `Default::default()` for `static`s and
    /// `const`s, e.g. `ToolOptions { attempts: Some(5), ..ToolOptions::NONE }`.
    pub const NONE: ToolOptions = ToolOptions {
        attempts: None,
        attempt_timeout: None,
        deadline: None,
        lease: None,
        ttl: None,
    };
}

impl Policy {
    /// This policy with a tool's options applied; a `never` tool gets exactly one attempt.
    pub fn with_options(mut self, class: RetryClass, opts: &ToolOptions) -> Policy {
        if let Some(v) = opts.attempts {
            self.attempts = v;
        }
        if let Some(v) = opts.attempt_timeout {
            self.attempt_timeout = v;
        }
        if let Some(v) = opts.deadline {
            self.deadline = v;
        }
        if let Some(v) = opts.lease {
            self.lease = v;
        }
        if let Some(v) = opts.ttl {
            self.ttl = v;
            self.failure_ttl = self.failure_ttl.min(v);
        }
        self.attempts = match class {
            RetryClass::Never => 1,
            _ => self.attempts.max(1),
        };
        // `Duration::MAX` means "no limit"; stores and instants get at most a century.
        for d in [
            &mut self.attempt_timeout,
            &mut self.deadline,
            &mut self.lease,
            &mut self.ttl,
            &mut self.failure_ttl,
            &mut self.store_timeout,
        ] {
            *d = (*d).min(FOREVER);
        }
        self.lease = self.lease.max(MIN_LEASE);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_ceiling_doubles_from_base_up_to_cap() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(1) };
        let ms: Vec<u128> = (1..=6).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(1), "no overflow");
    }

    #[test]
    fn none_is_the_default() {
        assert_eq!(ToolOptions::NONE, ToolOptions::default());
    }

    #[test]
    fn never_tools_get_one_attempt_whatever_the_options() {
        let opts = ToolOptions { attempts: Some(5), ..Default::default() };
        assert_eq!(Policy::default().with_options(RetryClass::Never, &opts).attempts, 1);
        assert_eq!(Policy::default().with_options(RetryClass::Keyed, &opts).attempts, 5);
        let zero = ToolOptions { attempts: Some(0), ..Default::default() };
        assert_eq!(Policy::default().with_options(RetryClass::Safe, &zero).attempts, 1);
    }

    #[test]
    fn a_lease_under_the_minimum_is_raised_to_it() {
        for lease in [Duration::ZERO, Duration::from_nanos(1), Duration::from_millis(99)] {
            let policy = Policy { lease, ..Policy::default() };
            let got = policy.with_options(RetryClass::Keyed, &ToolOptions::NONE).lease;
            assert_eq!(got, MIN_LEASE, "{lease:?}");
            let opts = ToolOptions { lease: Some(lease), ..ToolOptions::NONE };
            assert_eq!(Policy::default().with_options(RetryClass::Never, &opts).lease, MIN_LEASE);
        }
        let opts = ToolOptions { lease: Some(Duration::from_millis(150)), ..ToolOptions::NONE };
        let got = Policy::default().with_options(RetryClass::Keyed, &opts).lease;
        assert_eq!(got, Duration::from_millis(150), "a longer lease is kept as it is");
    }

    #[test]
    fn a_short_ttl_also_shortens_failure_retention() {
        let opts = ToolOptions { ttl: Some(Duration::from_secs(60)), ..Default::default() };
        let p = Policy::default().with_options(RetryClass::Keyed, &opts);
        assert_eq!((p.ttl, p.failure_ttl), (Duration::from_secs(60), Duration::from_secs(60)));
    }
}

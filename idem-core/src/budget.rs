//! A retry budget shared by every call of an executor, so that a degraded dependency does not
//! receive a retry storm.

use std::sync::atomic::{AtomicU64, Ordering};

/// Retry throttling as in gRPC (A6 "Client Retry Design", retry throttling): a token bucket that
/// every failed attempt drains by one token and every success refills by `token_ratio`. Retries
/// are allowed only while the bucket holds more than half of `max_tokens`; first attempts are
/// never refused. With the defaults (100 tokens, ratio 0.1) a dependency that fails every call
/// gets no more retries after about 50 failures, and needs about 10 successes per failure to
/// recover.
#[derive(Debug)]
pub struct RetryBudget {
    /// Tokens in thousandths, so the bucket is one atomic integer.
    milli_tokens: AtomicU64,
    max_milli: u64,
    ratio_milli: u64,
}

impl RetryBudget {
    /// A bucket of `max_tokens` (at least 1) refilled by `token_ratio` tokens per success
    /// (clamped to 0.001..=1.0).
    pub fn new(max_tokens: u32, token_ratio: f64) -> Self {
        let max_milli = u64::from(max_tokens.max(1)) * 1000;
        let ratio = if token_ratio.is_finite() { token_ratio.clamp(0.001, 1.0) } else { 0.1 };
        RetryBudget {
            milli_tokens: AtomicU64::new(max_milli),
            max_milli,
            ratio_milli: (ratio * 1000.0).round() as u64,
        }
    }

    /// Whether a retry may be sent now.
    pub fn can_retry(&self) -> bool {
        self.milli_tokens.load(Ordering::Relaxed) > self.max_milli / 2
    }

    /// Records a failed attempt (transient or ambiguous).
    pub fn on_failure(&self) {
        let _ = self
            .milli_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| Some(t.saturating_sub(1000)));
    }

    /// Records a successful attempt.
    pub fn on_success(&self) {
        let (ratio, max) = (self.ratio_milli, self.max_milli);
        let _ = self.milli_tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
            (t < max).then(|| (t + ratio).min(max))
        });
    }

    /// Tokens left (for metrics and tests).
    pub fn tokens(&self) -> f64 {
        self.milli_tokens.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        RetryBudget::new(100, 0.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_close_the_budget_and_successes_reopen_it() {
        let b = RetryBudget::new(10, 0.5);
        assert!(b.can_retry());
        for _ in 0..5 {
            b.on_failure();
        }
        assert!(!b.can_retry(), "5 of 10 tokens left is not more than half");
        b.on_success();
        assert!(b.can_retry());
        for _ in 0..100 {
            b.on_success();
        }
        assert_eq!(b.tokens(), 10.0, "never above max");
        for _ in 0..100 {
            b.on_failure();
        }
        assert_eq!(b.tokens(), 0.0, "never below zero");
    }
}

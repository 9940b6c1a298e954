//! Metrics through the `metrics` facade (feature `metrics`): the application installs a recorder
//! (a Prometheus exporter, say) and idem's calls are counted in it. Without the feature, or
//! without a recorder, recording does nothing. Names and labels (`docs/design.md` §9):
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `idem_calls_total` | counter | `tool`, `class`, `outcome` | calls, by how each ended |
//! | `idem_attempts_total` | counter | `tool`, `class` | attempts of the tool's body that started |
//! | `idem_store_step_seconds` | histogram (s) | `step` | latency of one store step: `claim`, `complete`, `release`, `renew` |
//! | `idem_retry_budget_refusals_total` | counter | `tool` | retries the shared retry budget refused |
//! | `idem_reconciliations_total` | counter | `tool`, `verdict` | answers of reconciliation checks: `happened`, `not_happened`, `unknown` |
//! | `idem_outcomes_unknown` | gauge | | records whose outcome is unknown, as last counted in the store |
//! | `idem_leases_expired` | gauge | | records in flight whose lease ended without a result (dead owners), as last counted |
//!
//! The two gauges are fed by counting the store's records ([`Store::stats`]): call
//! [`refresh_record_gauges`] now and then, or let [`watch_record_gauges`] do it every period.
//! The counters and the histogram are recorded by the executor as calls run.
//!
//! `outcome` is one of `executed`, `taken_over`, `replayed`, `joined`, `reconciled`, `unknown`,
//! `failed`: a call that returned its tool's output says how it was served ([`crate::Served`]);
//! a stored or shared failure replayed or joined says `replayed` or `joined`; `OutcomeUnknown` is
//! `unknown`; any other error is `failed`.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{Stats, Store, StoreError};

/// `idem_calls_total`.
pub const CALLS: &str = "idem_calls_total";
/// `idem_attempts_total`.
pub const ATTEMPTS: &str = "idem_attempts_total";
/// `idem_store_step_seconds`.
pub const STORE_STEP_SECONDS: &str = "idem_store_step_seconds";
/// `idem_retry_budget_refusals_total`.
pub const RETRY_BUDGET_REFUSALS: &str = "idem_retry_budget_refusals_total";
/// `idem_reconciliations_total`.
pub const RECONCILIATIONS: &str = "idem_reconciliations_total";
/// `idem_outcomes_unknown`.
pub const OUTCOMES_UNKNOWN: &str = "idem_outcomes_unknown";
/// `idem_leases_expired`.
pub const LEASES_EXPIRED: &str = "idem_leases_expired";

/// Registers the description and unit of every metric above with the installed recorder (the
/// `# HELP` lines of Prometheus text). Optional; call it once after installing the recorder.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
        describe_counter!(CALLS, "Tool calls through idem, by tool, retry class and outcome");
        describe_counter!(ATTEMPTS, "Attempts of a tool's body that started");
        describe_histogram!(STORE_STEP_SECONDS, Unit::Seconds, "Latency of one store step");
        describe_counter!(RETRY_BUDGET_REFUSALS, "Retries refused by the shared retry budget");
        describe_counter!(RECONCILIATIONS, "Answers of reconciliation checks, by verdict");
        describe_gauge!(OUTCOMES_UNKNOWN, "Records whose outcome is unknown, as last counted");
        describe_gauge!(
            LEASES_EXPIRED,
            "Records whose owner's lease ended without a result, as last counted"
        );
    }
}

/// Counts the store's records ([`Store::stats`]) and sets the gauges `idem_outcomes_unknown` and
/// `idem_leases_expired` from the counts, which it returns. A `never` tool's unknown outcome stays
/// until it is reconciled, so the first gauge is the operator's queue.
///
/// Errors: the store's, unchanged (a store that cannot count answers
/// [`StoreError::Unsupported`]); the gauges then keep their last values.
pub async fn refresh_record_gauges(store: &dyn Store) -> Result<Stats, StoreError> {
    // A network store's connection on a runtime without I/O would be Tokio's panic.
    crate::tokio_ready::store_step(store.uses_tokio_io())?;
    let stats = store.stats().await?;
    set_record_gauges(&stats);
    Ok(stats)
}

/// Sets the gauges from counts made elsewhere (the `idem stats` command, say).
pub fn set_record_gauges(stats: &Stats) {
    #[cfg(feature = "metrics")]
    {
        // Counts far beyond 2^53 would lose precision; a store does not hold that many records.
        ::metrics::gauge!(OUTCOMES_UNKNOWN).set(stats.unknown as f64);
        ::metrics::gauge!(LEASES_EXPIRED).set(stats.lease_expired as f64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = stats;
}

/// The shortest period of [`watch_record_gauges`]: one second.
pub const MIN_GAUGE_PERIOD: Duration = Duration::from_secs(1);

/// Spawns a task (on the current tokio runtime) that calls [`refresh_record_gauges`] every
/// `period`, the first time at once. A failed count is logged (`tracing` warning) and tried
/// again next period. Abort the returned handle to stop it. Counting reads every record's state
/// (indexed on the SQL stores, a scan on Redis): choose a period of minutes, not seconds. A
/// period under [`MIN_GAUGE_PERIOD`] (zero, say) counts every [`MIN_GAUGE_PERIOD`]. On a runtime
/// built without timers the task logs why (`tracing` error) and ends.
///
/// # Panics
///
/// Outside a Tokio runtime, as `tokio::spawn` does.
pub fn watch_record_gauges(store: Arc<dyn Store>, period: Duration) -> tokio::task::JoinHandle<()> {
    // tokio's interval panics on a zero period (in the task, so the gauges would silently never
    // be set), and a tiny one would count the whole store back to back.
    let period = period.max(MIN_GAUGE_PERIOD);
    tokio::spawn(async move {
        if let Err(lacks) = crate::tokio_ready::for_store(store.uses_tokio_io()) {
            // tokio's interval would panic in this task, and the gauges never be set, unsaid.
            tracing::error!("the store's record gauges are not counted: {}", lacks.advice());
            return;
        }
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(e) = refresh_record_gauges(store.as_ref()).await {
                tracing::warn!(error = %crate::error::Chain(&e), "counting the store's records failed");
            }
        }
    })
}

/// A store step about to run: its latency is recorded when it is done.
pub(crate) struct StepTimer {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
}

impl StepTimer {
    pub(crate) fn start() -> StepTimer {
        StepTimer {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
        }
    }

    /// Records the step's latency under `step`.
    pub(crate) fn done(self, step: &'static str) {
        #[cfg(feature = "metrics")]
        ::metrics::histogram!(STORE_STEP_SECONDS, "step" => step)
            .record(self.started.elapsed().as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = step;
    }
}

#[cfg(feature = "metrics")]
pub(crate) fn call(tool: &'static str, class: &'static str, outcome: &'static str) {
    ::metrics::counter!(CALLS, "tool" => tool, "class" => class, "outcome" => outcome).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn attempt(tool: &'static str, class: &'static str) {
    ::metrics::counter!(ATTEMPTS, "tool" => tool, "class" => class).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn retry_budget_refusal(tool: &'static str) {
    ::metrics::counter!(RETRY_BUDGET_REFUSALS, "tool" => tool).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn reconciliation(tool: &'static str, verdict: &'static str) {
    ::metrics::counter!(RECONCILIATIONS, "tool" => tool, "verdict" => verdict).increment(1);
}

#[cfg(not(feature = "metrics"))]
pub(crate) fn call(_: &'static str, _: &'static str, _: &'static str) {}
#[cfg(not(feature = "metrics"))]
pub(crate) fn attempt(_: &'static str, _: &'static str) {}
#[cfg(not(feature = "metrics"))]
pub(crate) fn retry_budget_refusal(_: &'static str) {}
#[cfg(not(feature = "metrics"))]
pub(crate) fn reconciliation(_: &'static str, _: &'static str) {}

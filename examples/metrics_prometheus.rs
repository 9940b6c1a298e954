//! idem's metrics as Prometheus text: a few tool calls, then the exposition a scrape would read.
//!
//! ```text
//! cargo run --example metrics_prometheus --features metrics
//! ```
//!
//! The recorder is `metrics-exporter-prometheus` without its HTTP listener (default features
//! off): a server of your own serves `handle.render()` at `/metrics`. The metric names and labels
//! are documented in `idem_core::metrics` and `docs/design.md` §9.

use idem_core::{Classify, Failure, Idem, Key, Reconciled, tool};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("card declined")]
    Declined,
    #[error("the provider timed out after the request was sent")]
    TimedOut,
}

impl Classify for PayError {
    fn classify(&self) -> Failure {
        match self {
            PayError::Declined => Failure::permanent(),
            PayError::TimedOut => Failure::ambiguous(),
        }
    }
}

/// Charge a card (the provider deduplicates by the idempotency key).
#[tool(retry = "keyed")]
async fn charge(customer: String, amount_cents: u64) -> Result<String, PayError> {
    if amount_cents > 10_000 {
        return Err(PayError::Declined);
    }
    Ok(format!("ch_{customer}_{amount_cents}"))
}

/// Wire money: nobody deduplicates it, and this reply is lost.
#[tool(retry = "never")]
async fn wire(to: String, amount_cents: u64) -> Result<String, PayError> {
    let _ = (to, amount_cents);
    Err(PayError::TimedOut)
}

/// Refund: the reply is lost too, but the provider's list of refunds says it was made.
#[tool(retry = "never", reconcile = refund_made)]
async fn refund(charge_id: String) -> Result<String, PayError> {
    let _ = charge_id;
    Err(PayError::TimedOut)
}

async fn refund_made(key: &Key, charge_id: String) -> Reconciled<String> {
    Reconciled::Happened(format!("re_{charge_id}_{}", &key.as_str()[..8]))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Store steps as a histogram with buckets from 0.5 ms to 2.5 s (without buckets the
    // exporter renders a summary).
    let buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(idem_core::metrics::STORE_STEP_SECONDS.into()),
            &buckets,
        )?
        .install_recorder()?;
    idem_core::metrics::describe();

    let idem = Idem::in_memory();
    let run = idem.run("conversation-42");
    charge(&run, "cus_1".into(), 4900).await?;
    charge(&run, "cus_1".into(), 4900).await?; // replayed
    let _ = charge(&run, "cus_2".into(), 50_000).await; // declined, stored
    let _ = wire(&run, "acct_9".into(), 100).await; // outcome unknown
    refund(&run, "ch_cus_1_4900".into()).await?; // reconciled
    // The gauges come from counting the store's records; an application does this periodically
    // (`idem_core::metrics::watch_record_gauges`).
    idem_core::metrics::refresh_record_gauges(idem.store().as_ref()).await?;

    print!("{}", handle.render());
    Ok(())
}

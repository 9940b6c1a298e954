//! Permanent failures whose stored form would not read back as the same error: a NaN in the
//! error, a `Serialize` that `Deserialize` does not mirror. A permanent failure means nothing
//! happened, so the key is freed rather than stored in a lossy form: a repeat runs the tool
//! again and gets the tool's own answer, never another error than the first caller got.

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::{Classify, Error, Failure, Idem, tool};
use idem_tests::Doubling;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum Declined {
    #[error("declined, limit {0:?}")]
    Limit(Doubling),
    #[error("declined, risk score {0}")]
    Risk(f64),
}

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

static LIMIT_RUNS: AtomicU32 = AtomicU32::new(0);
static RISK_RUNS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "never")]
async fn pay_limit(order: String) -> Result<u32, Declined> {
    let _ = order;
    LIMIT_RUNS.fetch_add(1, Ordering::SeqCst);
    Err(Declined::Limit(Doubling(21)))
}

#[tool(retry = "never")]
async fn pay_risk(order: String) -> Result<u32, Declined> {
    let _ = order;
    RISK_RUNS.fetch_add(1, Ordering::SeqCst);
    Err(Declined::Risk(f64::NAN))
}

/// Every caller of the intent gets the error the tool returned, never another value.
#[tokio::test]
async fn a_failure_that_would_not_replay_as_itself_is_not_replayed() {
    let idem = Idem::in_memory();
    let run = idem.run("unstorable-failure");
    for _ in 0..2 {
        match pay_limit(&run, "o-1".into()).await {
            Err(Error::Tool { error: Declined::Limit(limit), .. }) => {
                assert_eq!(limit, Doubling(21), "the tool's own error")
            }
            other => panic!("the tool's error, got {other:?}"),
        }
    }
    assert_eq!(LIMIT_RUNS.load(Ordering::SeqCst), 2, "nothing was stored: the repeat ran");
    for _ in 0..2 {
        match pay_risk(&run, "o-1".into()).await {
            Err(Error::Tool { error: Declined::Risk(score), .. }) => assert!(score.is_nan()),
            other => panic!("the tool's error, got {other:?}"),
        }
    }
    assert_eq!(RISK_RUNS.load(Ordering::SeqCst), 2, "nothing was stored: the repeat ran");
}

//! A user crate that depends on idem-core as `idem` (`idem = { package = "idem-core", .. }`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

/// The tools' error.
#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("declined")]
pub struct Declined;

impl idem::Classify for Declined {
    fn classify(&self) -> idem::Failure {
        idem::Failure::permanent()
    }
}

/// Counts executions.
pub static CHARGES: AtomicU32 = AtomicU32::new(0);

/// Charge a card.
#[idem::tool(retry = "keyed")]
pub async fn charge(cx: &idem::Ctx, amount_cents: u64) -> Result<String, Declined> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{amount_cents}:{}", cx.key()))
}

/// A client with its tools.
#[derive(Default)]
pub struct Ledger;

#[idem::tool_set]
impl Ledger {
    /// Read a balance.
    #[idem::tool(retry = "safe")]
    pub async fn balance(&self, account: String) -> Result<String, Declined> {
        Ok(account)
    }
}

/// The tool set of a ledger.
pub fn ledger_tools() -> idem::ToolSet {
    Arc::new(Ledger).tool_set()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tools_expand_against_the_renamed_dependency_and_run_once_per_intent() {
        let run = idem::Idem::in_memory().run("r1");
        let a = charge(&run, 4900).await.unwrap();
        let b = charge(&run, 4900).await.unwrap();
        assert_eq!(a, b);
        assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
        let set = ledger_tools();
        let result = set.call(&run, "balance", &serde_json::json!({"account": "a1"})).await;
        assert_eq!(result.content, serde_json::json!("a1"));
    }
}

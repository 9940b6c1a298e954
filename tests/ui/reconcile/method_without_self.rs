use idem_core::{Key, Reconciled};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::ambiguous()
    }
}

struct Bank;

#[idem_core::tool_set]
impl Bank {
    #[tool(retry = "never", reconcile = wire_sent)]
    async fn wire(&self, to: String, cents: u64) -> Result<String, Failed> {
        Ok(format!("{to}{cents}"))
    }

    // The method check leaves out the receiver.
    async fn wire_sent(key: &Key, to: String, cents: u64) -> Reconciled<String> {
        let _ = (key, to, cents);
        Reconciled::Unknown
    }
}

fn main() {}

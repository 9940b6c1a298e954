use idem_core::{Key, Reconciled, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::ambiguous()
    }
}

// The check answers with another output type than the tool's.
async fn wire_sent(key: &Key, to: String, cents: u64) -> Reconciled<u64> {
    let _ = (key, to);
    Reconciled::Happened(cents)
}

#[tool(retry = "never", reconcile = wire_sent)]
async fn wire(to: String, cents: u64) -> Result<String, Failed> {
    Ok(format!("{to}{cents}"))
}

fn main() {}

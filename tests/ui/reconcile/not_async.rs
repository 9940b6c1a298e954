use idem_core::{Key, Reconciled, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::ambiguous()
    }
}

// The check is not async.
fn wire_sent(key: &Key, to: String, cents: u64) -> Reconciled<String> {
    let _ = (key, to, cents);
    Reconciled::Unknown
}

#[tool(retry = "never", reconcile = wire_sent)]
async fn wire(to: String, cents: u64) -> Result<String, Failed> {
    Ok(format!("{to}{cents}"))
}

fn main() {}

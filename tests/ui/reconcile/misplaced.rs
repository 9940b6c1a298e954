use idem_core::{Key, Reconciled, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::ambiguous()
    }
}

async fn balance_read(key: &Key, customer: String) -> Reconciled<u64> {
    let _ = (key, customer);
    Reconciled::Unknown
}

#[tool(retry = "safe", reconcile = balance_read)]
async fn balance(customer: String) -> Result<u64, Failed> {
    Ok(customer.len() as u64)
}

#[tool(retry = "never", reconcile = "wire_sent")]
async fn wire(to: String) -> Result<String, Failed> {
    Ok(to)
}

fn main() {}

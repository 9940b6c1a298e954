use idem_core::{Tool, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

/// Send a wire transfer.
#[tool(retry = "never", attempts = 1, timeout = "10s", deadline = "1m", lease = "30s", ttl = "24h")]
async fn wire_transfer(iban: String, amount_cents: u64) -> Result<String, Failed> {
    Ok(format!("{iban}:{amount_cents}"))
}

fn main() {
    assert_eq!(WireTransferTool.def().class, idem_core::RetryClass::Never);
}

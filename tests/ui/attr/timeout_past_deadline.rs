use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

// The deadline bounds every attempt: this timeout could never end one.
#[tool(retry = "keyed", timeout = "5m", deadline = "1m")]
async fn charge() -> Result<(), Failed> {
    Ok(())
}

// Equal is fine: one attempt may use the whole deadline.
#[tool(retry = "keyed", timeout = "1m", deadline = "60s")]
async fn refund() -> Result<(), Failed> {
    Ok(())
}

fn main() {}

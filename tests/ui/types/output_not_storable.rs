use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

struct Receipt {
    id: String,
}

#[tool(retry = "keyed")]
async fn charge(amount: u64) -> Result<Receipt, Failed> {
    Ok(Receipt { id: amount.to_string() })
}

fn main() {}

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

struct Payments;

#[idem_core::tool_set]
impl Payments {
    #[tool(retry = "keyed", name = "charge")]
    async fn charge_card(&self, amount: u64) -> Result<u64, Failed> {
        Ok(amount)
    }

    #[tool(retry = "keyed")]
    async fn charge(&self, amount: u64) -> Result<u64, Failed> {
        Ok(amount)
    }
}

fn main() {}

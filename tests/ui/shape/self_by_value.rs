use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

struct Payments;

impl Payments {
    #[tool(retry = "keyed")]
    async fn charge(self, amount: u64) -> Result<u64, Failed> {
        Ok(amount)
    }
}

fn main() {}

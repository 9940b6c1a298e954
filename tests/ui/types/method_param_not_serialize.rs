use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[derive(Clone)]
struct Customer {
    id: String,
}

struct Payments;

impl Payments {
    #[tool(retry = "keyed")]
    async fn charge(&self, customer: Customer, amount: u64) -> Result<u64, Failed> {
        let _ = customer.id;
        Ok(amount)
    }
}

fn main() {}

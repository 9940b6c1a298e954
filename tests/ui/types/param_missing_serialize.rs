use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[derive(Clone, serde::Deserialize, schemars::JsonSchema)]
struct Customer {
    id: String,
}

#[tool(retry = "keyed")]
async fn charge(customer: Customer, amount: u64) -> Result<u64, Failed> {
    let _ = customer.id;
    Ok(amount)
}

async fn caller(run: &idem_core::Run) -> Result<u64, idem_core::Error<Failed>> {
    charge(run, Customer { id: "cus_1".into() }, 1).await
}

fn main() {
    let _ = caller;
}

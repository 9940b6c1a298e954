use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "keyed")]
async fn charge(customer: &str, amount: u64) -> Result<u64, Failed> {
    let _ = customer;
    Ok(amount)
}

// The typed call keeps its shape after the error: its call sites add nothing.
async fn caller(run: &idem_core::Run) -> Result<u64, idem_core::Error<Failed>> {
    charge(run, "cus_1", 1).await
}

fn main() {
    let _ = caller;
}

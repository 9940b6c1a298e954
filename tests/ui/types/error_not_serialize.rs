use idem_core::tool;

#[derive(Debug, thiserror::Error)]
#[error("declined")]
struct Declined;

impl idem_core::Classify for Declined {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "keyed")]
async fn charge(amount: u64) -> Result<u64, Declined> {
    Ok(amount)
}

fn main() {}

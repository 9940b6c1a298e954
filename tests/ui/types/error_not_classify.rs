use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("declined")]
struct Declined;

#[tool(retry = "keyed")]
async fn charge(amount: u64) -> Result<u64, Declined> {
    Ok(amount)
}

async fn caller(run: &idem_core::Run) -> Result<u64, idem_core::Error<Declined>> {
    charge(run, 1).await
}

fn main() {
    let _ = caller;
}

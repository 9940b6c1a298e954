use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("declined")]
struct Declined;

#[tool(retry = "keyed")]
async fn charge(amount: u64) -> Result<u64, Declined> {
    Ok(amount)
}

fn main() {}

use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "safe", name = "get balance")]
async fn get_balance() -> Result<(), Failed> {
    Ok(())
}

fn main() {}

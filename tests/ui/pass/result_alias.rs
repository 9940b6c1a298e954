use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

type Result<T> = std::result::Result<T, Failed>;

#[tool(retry = "safe")]
async fn get(id: u64) -> Result<u64> {
    Ok(id)
}

#[tool(retry = "safe")]
async fn get_full(id: u64) -> std::result::Result<u64, Failed> {
    Ok(id)
}

fn main() {}

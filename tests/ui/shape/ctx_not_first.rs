use idem_core::{tool, Ctx};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "keyed")]
async fn charge(amount: u64, cx: &Ctx) -> Result<u64, Failed> {
    let _ = cx;
    Ok(amount)
}

fn main() {}

use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "safe")]
async fn area((w, h): (u32, u32)) -> Result<u32, Failed> {
    Ok(w * h)
}

fn main() {}

use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

// Every mistake is reported at once, each at its place.
#[tool(retry = "keyd", timeout = "fast", color = "red")]
fn charge(amount: u64) -> Result<u64, Failed> {
    Ok(amount)
}

fn main() {}

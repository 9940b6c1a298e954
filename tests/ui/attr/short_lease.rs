use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

// A lease this short lapses between its renewals: a duplicate would run beside the tool.
#[tool(retry = "keyed", lease = "1ms")]
async fn charge() -> Result<(), Failed> {
    Ok(())
}

#[tool(retry = "never", lease = "99ms")]
async fn wire() -> Result<(), Failed> {
    Ok(())
}

fn main() {}

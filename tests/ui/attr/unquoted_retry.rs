use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = keyed)]
async fn charge(amount: u64) -> Result<u64, Failed> {
    Ok(amount)
}

// The call sites still type-check: one error, at `keyed`.
async fn caller(run: &idem_core::Run) -> Result<u64, idem_core::Error<Failed>> {
    let _set = idem_core::ToolSet::new().with(ChargeTool);
    charge(run, 1).await
}

fn main() {
    let _ = caller;
}

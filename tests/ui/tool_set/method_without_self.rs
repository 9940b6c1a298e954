use std::sync::Arc;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

pub struct Desk;

#[idem_core::tool_set]
impl Desk {
    /// Needs no state.
    #[tool(retry = "safe")]
    async fn stateless(n: u32) -> Result<u32, Failed> {
        Ok(n)
    }

    #[tool(retry = "safe")]
    async fn with_state(&self) -> Result<u32, Failed> {
        Ok(0)
    }
}

fn main() {
    let _ = Arc::new(Desk).tool_set();
}

//! `#[tool]` imported under another name would expand outside the set: refused, at the name.
use std::sync::Arc;

use idem_core::tool as idem_tool;

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
    #[idem_tool(retry = "safe")]
    pub async fn aliased(&self, n: u32) -> Result<u32, Failed> {
        Ok(n)
    }

    #[tool(retry = "safe")]
    pub async fn named(&self) -> Result<u32, Failed> {
        Ok(0)
    }
}

fn main() {
    let _ = Arc::new(Desk).tool_set();
}

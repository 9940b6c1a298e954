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
    #[tool(retry = "safe")]
    async fn count(&self) -> Result<u32, Failed> {
        Ok(0)
    }

    /// The error is at this method's `#[tool]`, not at the block's attribute.
    #[tool]
    async fn open(&self, title: String) -> Result<String, Failed> {
        Ok(title)
    }

    #[tool(name = "close_ticket")]
    async fn close(&self, id: u64) -> Result<u64, Failed> {
        Ok(id)
    }
}

fn main() {
    let desk = Arc::new(Desk);
    let _ = desk.tool_set();
    let run = idem_core::Idem::in_memory().run("r");
    let _ = desk.open(&run, "printer".into());
}

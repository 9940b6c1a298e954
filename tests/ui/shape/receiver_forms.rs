use std::sync::Arc;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

struct Desk;

#[idem_core::tool_set]
impl Desk {
    // The long form of `&self`: one error saying to write `&self`.
    #[tool(retry = "safe")]
    async fn typed(self: &Self) -> Result<u32, Failed> {
        Ok(1)
    }

    // A named lifetime: one error about lifetimes, not about concrete types.
    #[tool(retry = "safe")]
    async fn named<'a>(&'a self) -> Result<u32, Failed> {
        Ok(2)
    }
}

fn main() {
    let _ = Arc::new(Desk).tool_set();
}

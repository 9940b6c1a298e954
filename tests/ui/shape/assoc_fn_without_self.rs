//! `#[tool]` on an associated fn without `self` in a plain `impl` block: one error at the
//! name, and the fn left as written, so its callers type-check.
use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

pub struct Desk;

impl Desk {
    /// Needs no state.
    #[tool(retry = "safe")]
    pub async fn stateless(#[idem(skip)] trace: String, n: u32) -> Result<u32, Failed> {
        let _ = trace;
        Ok(n)
    }

    /// A method tool beside it expands as usual.
    #[tool(retry = "safe")]
    async fn stateful(&self, n: u32) -> Result<u32, Failed> {
        Ok(n)
    }
}

mod nested {
    use super::*;

    /// An indented free fn is still a free tool.
    #[tool(retry = "keyed")]
    pub async fn in_a_module(n: u32) -> Result<u32, Failed> {
        Ok(n)
    }
}

fn main() {
    let _ = Desk::stateless(String::new(), 1);
    let _ = std::sync::Arc::new(Desk).stateful_tool();
    let _ = nested::InAModuleTool;
}

//! A type named as `#[tool]` names the tool's arguments, inside a parameter's type: one error at
//! that type, and the call site type-checks.
use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SearchArgs {
    pub query: String,
}

/// Search several at once.
#[tool(retry = "safe")]
pub async fn search(all: Vec<SearchArgs>) -> Result<usize, Failed> {
    Ok(all.len())
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = search(&run, vec![SearchArgs { query: "q".into() }]);
}

//! A type named as `#[tool]` names the tool's arguments, inside a parameter's type: one error at
//! that type, and the call site type-checks.
use idem_core::{NoError, tool};

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SearchArgs {
    pub query: String,
}

/// Search several at once.
#[tool(retry = "safe")]
pub async fn search(all: Vec<SearchArgs>) -> Result<usize, NoError> {
    Ok(all.len())
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = search(&run, vec![SearchArgs { query: "q".into() }]);
}

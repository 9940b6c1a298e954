//! A type named as `#[tool]` names the tool's arguments, in the return type or written
//! `self::SearchArgs`: one error at that type each, and the call sites type-check.
use idem_core::{NoError, tool};

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SearchArgs {
    pub query: String,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ListArgs {
    pub page: u32,
}

/// Search.
#[tool(retry = "safe")]
pub async fn search(query: String) -> Result<Vec<SearchArgs>, NoError> {
    Ok(vec![SearchArgs { query }])
}

/// List.
#[tool(retry = "safe")]
pub async fn list(all: Vec<self::ListArgs>) -> Result<usize, NoError> {
    Ok(all.len())
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = search(&run, "q".into());
    let _ = list(&run, vec![]);
}

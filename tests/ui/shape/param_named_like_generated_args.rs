use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

/// The user's own arguments struct, named as `#[tool]` names the arguments of `search`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SearchArgs {
    pub query: String,
}

/// Search.
#[tool(retry = "safe")]
pub async fn search(args: SearchArgs) -> Result<usize, Failed> {
    Ok(args.query.len())
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = search(&run, SearchArgs { query: "q".into() });
}

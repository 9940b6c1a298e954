//! serde's and schemars' field attributes cannot reach the generated arguments: one error at the
//! attribute saying what to write instead.
use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "safe")]
async fn lookup(#[serde(rename = "userId")] user_id: String) -> Result<String, Failed> {
    Ok(user_id)
}

async fn caller(run: &idem_core::Run) -> Result<String, idem_core::Error<Failed>> {
    lookup(run, "u".into()).await
}

fn main() {
    let _ = caller;
}

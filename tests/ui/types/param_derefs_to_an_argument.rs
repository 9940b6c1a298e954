//! A type that dereferences to a valid argument (`Arc<String>` to `String`; serde's `rc` feature
//! is off) is refused at the type, naming the trait, not later as a type mismatch.
use std::sync::Arc;

use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "keyed")]
async fn tag(label: Arc<String>, amount: u64) -> Result<u64, Failed> {
    let _ = label;
    Ok(amount)
}

async fn caller(run: &idem_core::Run) -> Result<u64, idem_core::Error<Failed>> {
    tag(run, Arc::new("a".into()), 1).await
}

fn main() {
    let _ = caller;
}

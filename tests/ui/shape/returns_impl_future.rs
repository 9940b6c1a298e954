//! A fn returning `impl Future` instead of an `async fn`: one error saying what to write.
use std::future::Future;

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
fn balance(customer: String) -> impl Future<Output = Result<u64, Failed>> + Send {
    async move {
        let _ = customer;
        Ok(0)
    }
}

fn main() {
    let _ = balance;
}

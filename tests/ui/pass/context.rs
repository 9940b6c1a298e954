use idem_core::{Ctx, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "keyed")]
async fn charge(cx: &Ctx, amount_cents: u64) -> Result<String, Failed> {
    Ok(format!("{}:{amount_cents}:{}", cx.key(), cx.attempt()))
}

#[tool(retry = "never")]
async fn refund(cx: &idem_core::Ctx) -> Result<String, Failed> {
    Ok(cx.key().to_owned())
}

fn main() {}

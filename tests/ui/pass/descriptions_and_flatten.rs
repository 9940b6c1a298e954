use std::sync::Arc;

use idem_core::{Ctx, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[derive(Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct PartialArgs {
    /// The charge.
    pub charge_id: String,
    pub amount_cents: u64,
}

/// Refund a [`PartialArgs::charge_id`].
#[doc = include_str!("../../fixtures/refund_doc.md")]
#[tool(retry = "keyed")]
pub async fn refund(
    cx: &Ctx,
    /// Why the money goes back.
    reason: String,
    /// Optional note, shown to the customer.
    note: Option<String>,
) -> Result<String, Failed> {
    Ok(format!("{reason}:{note:?}:{}", cx.key()))
}

#[tool(retry = "keyed", description = "Refund part of a charge.")]
pub async fn partial(#[idem(flatten)] args: PartialArgs) -> Result<u64, Failed> {
    Ok(args.amount_cents)
}

pub struct Ledger;

impl Ledger {
    #[tool(retry = "keyed")]
    pub async fn reverse(&self, #[idem(ctx)] cx: &idem_core::Ctx, #[idem(flatten)] args: PartialArgs) -> Result<u64, Failed> {
        let _ = cx.key();
        Ok(args.amount_cents)
    }
}

async fn callers(run: &idem_core::Run) -> Result<u64, idem_core::Error<Failed>> {
    refund(run, "damaged".into(), None).await?;
    let args = PartialArgs { charge_id: "ch_1".into(), amount_cents: 5 };
    partial(run, args.clone()).await?;
    Arc::new(Ledger).reverse(run, args).await
}

fn main() {
    let _ = callers;
}

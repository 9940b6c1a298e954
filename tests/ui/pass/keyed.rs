use idem_core::{Tool, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Charge {
    pub id: String,
}

/// Charge a card.
#[tool(retry = "keyed")]
pub(crate) async fn charge_card(customer: String, amount_cents: u64) -> Result<Charge, Failed> {
    Ok(Charge { id: format!("{customer}:{amount_cents}") })
}

fn main() {
    assert_eq!(ChargeCardTool.def().class, idem_core::RetryClass::Keyed);
}

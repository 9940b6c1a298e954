use idem_core::{Tool, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

/// Read a balance.
#[tool(retry = "safe")]
pub async fn get_balance(customer: String) -> Result<u64, Failed> {
    Ok(customer.len() as u64)
}

fn main() {
    assert_eq!(GetBalanceTool.def().class, idem_core::RetryClass::Safe);
    let _args = GetBalanceArgs::new("c".into());
}

use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

static LEDGER: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

async fn notify() {}

#[tool(retry = "keyed")]
async fn charge(amount: u64) -> Result<u64, Failed> {
    let mut ledger = LEDGER.lock().unwrap();
    ledger.push(amount);
    notify().await;
    Ok(ledger.len() as u64)
}

async fn caller(run: &idem_core::Run) -> Result<u64, idem_core::Error<Failed>> {
    charge(run, 1).await
}

fn main() {
    let _ = caller;
}

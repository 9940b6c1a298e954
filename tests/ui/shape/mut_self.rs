use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

struct Payments {
    count: u32,
}

impl Payments {
    #[tool(retry = "keyed")]
    async fn charge(&mut self, amount: u64) -> Result<u64, Failed> {
        self.count += 1;
        Ok(amount)
    }
}

fn main() {}

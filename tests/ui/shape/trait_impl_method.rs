//! `#[tool]` on a method of a trait impl or of a trait: one error each at the name, and the
//! fns left as written.
use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

pub struct Desk;

pub trait Charge {
    fn charge(&self, n: u32) -> impl std::future::Future<Output = Result<u32, Failed>> + Send;

    #[tool(retry = "safe")]
    async fn balance(&self, n: u32) -> Result<u32, Failed> {
        Ok(n)
    }
}

impl Charge for Desk {
    #[tool(retry = "keyed")]
    async fn charge(&self, n: u32) -> Result<u32, Failed> {
        Ok(n)
    }
}

fn main() {
    let _ = Desk.charge(1);
    let _ = Desk.balance(1);
}

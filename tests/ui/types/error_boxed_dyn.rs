use idem_core::tool;

// Stands for the anyhow crate: the check reads the path as written.
mod anyhow {
    #[derive(Debug)]
    pub struct Error;
    pub type Result<T> = std::result::Result<T, Error>;
}

type DynResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tool(retry = "keyed")]
async fn charge(amount: u64) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    Ok(amount)
}

#[tool(retry = "keyed")]
async fn refund(amount: u64) -> anyhow::Result<u64> {
    Ok(amount)
}

#[tool(retry = "safe")]
async fn balance(customer: String) -> Result<u64, anyhow::Error> {
    let _ = customer;
    Ok(1)
}

// Through a local alias the macro cannot see into: rustc's own error.
#[tool(retry = "keyed")]
async fn hold(amount: u64) -> DynResult<u64> {
    Ok(amount)
}

// The call sites compile against the tools' shape: no second error here.
async fn caller(run: &idem_core::Run) {
    let _ = charge(run, 1).await;
    let _ = refund(run, 1).await;
    let _ = balance(run, "c".into()).await;
    let _ = hold(run, 1).await;
}

fn main() {
    let _ = caller;
}

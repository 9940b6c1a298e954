use idem_core::tool;

// A string error compiles everywhere else; here it would be classified by nobody.
#[tool(retry = "keyed")]
async fn charge(amount: u64) -> Result<u64, String> {
    if amount == 0 {
        return Err("nothing to charge".to_owned());
    }
    Ok(amount)
}

#[tool(retry = "never")]
async fn refund(amount: u64) -> Result<u64, &'static str> {
    Ok(amount)
}

#[tool(retry = "safe")]
async fn balance(customer: String) -> Result<u64, std::string::String> {
    let _ = customer;
    Ok(1)
}

// The call sites compile against the tools' shape: no second error here.
async fn caller(run: &idem_core::Run) {
    let _ = charge(run, 1).await;
    let _ = refund(run, 1).await;
    let _ = balance(run, "c".into()).await;
}

fn main() {
    let _ = caller;
}

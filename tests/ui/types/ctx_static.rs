//! The context borrowed for `'static`: it is lent to the body for one attempt, so the one error
//! is at the lifetime and says what to write, not a borrow error about generated names.
use idem_core::{Ctx, NoError, tool};

/// Charges a card.
#[tool(retry = "keyed")]
async fn charge(cx: &'static Ctx, cents: u64) -> Result<String, NoError> {
    Ok(format!("{}:{cents}", cx.key()))
}

async fn caller(run: &idem_core::Run) -> Result<String, idem_core::Error<NoError>> {
    charge(run, 1).await
}

fn main() {
    let _ = caller;
}

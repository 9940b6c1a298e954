//! `#[tool]` written twice on one fn (or on a method of a tool set) is one error at the second;
//! the tool is expanded from the first, so its calls type-check.
use std::sync::Arc;

use idem_core::{Idem, NoError, tool, tool_set};

/// Look up an order.
#[tool(retry = "keyed")]
#[tool(retry = "safe")]
async fn lookup(order: String) -> Result<String, NoError> {
    Ok(order)
}

struct Desk;

#[tool_set]
impl Desk {
    /// File an order.
    #[tool(retry = "keyed")]
    #[idem_core::tool(retry = "keyed")]
    async fn file(&self, order: String) -> Result<String, NoError> {
        Ok(order)
    }
}

fn main() {
    let run = Idem::in_memory().run("twice");
    let _ = lookup(&run, "o_1".into());
    let _ = LookupTool;
    let desk = Arc::new(Desk);
    let _ = desk.file(&run, "o_1".into());
    let _ = desk.tool_set();
}

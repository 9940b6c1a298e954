//! A crate that forbids the lints the expansion's names and imports could trip: `#[forbid]`
//! cannot be lowered by an `#[allow]` (rustc's E0453), so the expansion must not need one. Free
//! tools, methods in a tool set, a context, several parameters, and the calls. (The error type
//! is idem's `NoError`: serde's and thiserror's derives themselves `allow` some of these.)
#![forbid(
    non_snake_case,
    non_upper_case_globals,
    non_camel_case_types,
    unused_imports,
    unused_qualifications,
    unsafe_code,
    missing_docs
)]

use std::sync::Arc;

use idem_core::{Ctx, Idem, NoError, tool, tool_set};

/// Charges a customer.
#[tool(retry = "keyed")]
pub async fn charge_card(cx: &Ctx, customer: String, amount_cents: u64) -> Result<String, NoError> {
    Ok(format!("{customer}:{amount_cents}:{}", cx.key()))
}

/// Reads the time.
#[tool(retry = "safe")]
pub async fn now_ms() -> Result<u64, NoError> {
    Ok(0)
}

/// A ledger whose methods are tools.
pub struct Ledger;

#[tool_set]
impl Ledger {
    /// Posts an entry.
    #[tool(retry = "never")]
    pub async fn post(&self, account: String, cents: i64) -> Result<i64, NoError> {
        Ok(cents + account.len() as i64)
    }
}

/// The tools as values, in a set.
pub fn tools() -> Result<idem_core::ToolSet, idem_core::ToolSetError> {
    idem_core::ToolSet::new().with(ChargeCardTool)?.with(NowMsTool)?.merge(Arc::new(Ledger).tool_set())
}

/// Calls each tool once.
pub async fn calls() -> Result<(), idem_core::Error<NoError>> {
    let idem = Idem::in_memory();
    let run = idem.run("forbidden-lints");
    charge_card(&run, "cus_1".into(), 100).await?;
    now_ms(&run).await?;
    let ledger = Arc::new(Ledger);
    ledger.post(&run, "acct".into(), 5).await?;
    let _set = ledger.tool_set();
    Ok(())
}

fn main() {}

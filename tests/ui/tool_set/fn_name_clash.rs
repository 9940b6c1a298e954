//! `fn_name` naming what the block's expansion adds for a tool (`<method>_tool`, the tool as a
//! value): one error at the value, instead of rustc's "duplicate definitions".
use std::sync::Arc;

use idem_core::{NoError, tool_set};

struct Desk;

#[tool_set(fn_name = "count_tool")]
impl Desk {
    /// Count.
    #[tool(retry = "safe")]
    async fn count(&self) -> Result<u32, NoError> {
        Ok(0)
    }
}

fn main() {
    let _ = Arc::new(Desk).count_tool();
}

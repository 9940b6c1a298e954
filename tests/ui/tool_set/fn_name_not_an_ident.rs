//! `fn_name` must name a method: one error at the value; the block still expands (its set's
//! method keeps the default name), so nothing else is reported.
use std::sync::Arc;

use idem_core::{NoError, tool_set};

struct Desk;

#[tool_set(fn_name = "desk tools")]
impl Desk {
    /// Count.
    #[tool(retry = "safe")]
    async fn count(&self) -> Result<u32, NoError> {
        Ok(0)
    }
}

fn main() {
    let _ = Arc::new(Desk).tool_set();
}

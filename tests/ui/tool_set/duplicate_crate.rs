//! `crate = ".."` given twice to `#[tool_set]` is one error, as in `#[tool]`, instead of the
//! last one silently applying.
use std::sync::Arc;

use idem_core::{NoError, tool_set};

struct Desk;

#[tool_set(crate = "::idem_core", crate = "idem_core")]
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

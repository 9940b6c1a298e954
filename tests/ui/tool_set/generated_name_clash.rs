//! `#[tool_set]` adds `<method>_tool` for each tool and `tool_set` to the block: a method of the
//! block with one of these names is one error at the tool's name (or at the block's own
//! `tool_set`), not rustc's "duplicate definitions" at the attribute, and the calls of both
//! still type-check.
use std::sync::Arc;

use idem_core::{Idem, NoError, tool_set};

struct Search;

#[tool_set]
impl Search {
    /// Search the catalog.
    #[tool(retry = "safe")]
    async fn search(&self, query: String) -> Result<usize, NoError> {
        Ok(query.len())
    }

    /// Search the catalog, another way.
    #[tool(retry = "safe")]
    async fn search_tool(&self, query: String) -> Result<usize, NoError> {
        Ok(query.len())
    }
}

struct Desk;

#[tool_set]
impl Desk {
    /// Count.
    #[tool(retry = "safe")]
    async fn count(&self) -> Result<u32, NoError> {
        Ok(0)
    }

    fn tool_set(&self) -> u32 {
        0
    }
}

fn main() {
    let run = Idem::in_memory().run("clash");
    let search = Arc::new(Search);
    let _ = search.search(&run, "shoes".into());
    let _ = search.search_tool(&run, "shoes".into());
    let _ = search.tool_set();
    let desk = Arc::new(Desk);
    let _ = desk.count(&run);
    let _: u32 = desk.tool_set();
}

//! A method tool, or a `#[tool_set]`, on a type that borrows (a lifetime named, written `'_`
//! or elided in `&str`): one error each, at the method's name or the block's type, saying `Self`
//! must be `'static`; the typed calls and `tool_set` keep their shapes, so their callers
//! type-check.
use std::sync::Arc;

use idem_core::{Ctx, NoError, tool};

pub struct Desk<'a> {
    prefix: &'a str,
}

impl<'a> Desk<'a> {
    /// Opens a ticket.
    #[tool(retry = "keyed")]
    pub async fn open(&self, cx: &Ctx, title: String) -> Result<String, NoError> {
        Ok(format!("{}{title} {}", self.prefix, cx.key()))
    }
}

pub struct Shelf<'a> {
    items: &'a [String],
}

#[idem_core::tool_set]
impl Shelf<'_> {
    /// Counts the items.
    #[tool(retry = "safe")]
    pub async fn count(&self, #[idem(skip)] trace: String) -> Result<usize, NoError> {
        let _ = trace;
        Ok(self.items.len())
    }
}

pub struct Named<T> {
    name: T,
}

impl Named<&str> {
    /// Says the name.
    #[tool(retry = "safe")]
    pub async fn say(&self) -> Result<String, NoError> {
        Ok(self.name.to_owned())
    }
}

#[tokio::main]
async fn main() {
    // The typed calls, as callers write them once the types own their data.
    let run = idem_core::Idem::in_memory().run("r");
    let desk = Arc::new(Desk { prefix: "T-" });
    let _: Result<String, idem_core::Error<NoError>> = desk.open(&run, "printer".into()).await;
    let items = vec![String::new()];
    let shelf = Arc::new(Shelf { items: &items });
    let _: Result<usize, idem_core::Error<NoError>> = shelf.count(&run, String::new()).await;
    let _: idem_core::ToolSet = shelf.tool_set();
    let named = Arc::new(Named { name: "desk" });
    let _: Result<String, idem_core::Error<NoError>> = named.say(&run).await;
}

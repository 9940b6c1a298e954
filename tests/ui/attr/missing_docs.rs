//! A tool's doc comment is the description the model reads: in a crate that denies
//! `missing_docs`, an undocumented tool is reported like any undocumented fn (the expansion's
//! own text about the typed call does not document it), and a documented one is not, nor one
//! whose `description = ".."` gives the text. `#[doc(alias = "..")]` gives no text.
#![deny(missing_docs)]

use idem_core::tool;

/// The error.
#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "safe")]
pub async fn lookup(id: u64) -> Result<u64, Failed> {
    Ok(id)
}

/// Read a balance.
#[tool(retry = "safe")]
pub async fn balance(id: u64) -> Result<u64, Failed> {
    Ok(id)
}

/// A client.
pub struct Desk;

impl Desk {
    #[tool(retry = "safe")]
    pub async fn find(&self, id: u64) -> Result<u64, Failed> {
        Ok(id)
    }

    /// Count.
    #[tool(retry = "safe")]
    pub async fn count(&self) -> Result<u64, Failed> {
        Ok(0)
    }
}

#[tool(retry = "safe", description = "Look up an order.")]
pub async fn order(id: u64) -> Result<u64, Failed> {
    Ok(id)
}

impl Desk {
    #[tool(retry = "safe", description = "Look up a desk.")]
    pub async fn desk(&self, id: u64) -> Result<u64, Failed> {
        Ok(id)
    }
}

#[doc(alias = "search")]
#[tool(retry = "safe")]
pub async fn find_order(id: u64) -> Result<u64, Failed> {
    Ok(id)
}

impl Desk {
    #[doc(alias = "tally")]
    #[tool(retry = "safe")]
    pub async fn total(&self) -> Result<u64, Failed> {
        Ok(0)
    }

    #[doc(alias = "seat")]
    #[tool(retry = "safe", description = "Book a seat.")]
    pub async fn book(&self, id: u64) -> Result<u64, Failed> {
        Ok(id)
    }
}

fn main() {}

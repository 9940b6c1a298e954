//! A tool neither called nor used as a value (in no tool set) is reported unused at its name,
//! as the fn would be; a tool used either way is not, and `#[allow(dead_code)]` or
//! `#[expect(dead_code)]` on it is honoured.
#![deny(dead_code, unfulfilled_lint_expectations)]

use std::sync::Arc;

use idem_core::{Idem, NoError, tool};

/// Never used.
#[tool(retry = "safe")]
async fn forgotten(n: u32) -> Result<u32, NoError> {
    Ok(n)
}

/// Used as a value only.
#[tool(retry = "safe")]
async fn listed(n: u32) -> Result<u32, NoError> {
    Ok(n)
}

/// Called only.
#[tool(retry = "safe")]
async fn called(n: u32) -> Result<u32, NoError> {
    Ok(n)
}

/// Unused, on purpose.
#[allow(dead_code)]
#[tool(retry = "safe")]
async fn kept(n: u32) -> Result<u32, NoError> {
    Ok(n)
}

/// Unused, expected so.
#[expect(dead_code)]
#[tool(retry = "safe")]
async fn expected(n: u32) -> Result<u32, NoError> {
    Ok(n)
}

struct Desk;

impl Desk {
    /// Never used.
    #[tool(retry = "safe")]
    async fn lost(&self, n: u32) -> Result<u32, NoError> {
        Ok(n)
    }

    /// Used as a value only.
    #[tool(retry = "safe")]
    async fn filed(&self, n: u32) -> Result<u32, NoError> {
        Ok(n)
    }

    /// Unused, expected so.
    #[expect(dead_code)]
    #[tool(retry = "safe")]
    async fn shelved(&self, n: u32) -> Result<u32, NoError> {
        Ok(n)
    }
}

fn main() {
    let run = Idem::in_memory().run("unused");
    let _ = ListedTool;
    let _ = called(&run, 1);
    let _ = Arc::new(Desk).filed_tool();
}

//! An `impl Trait` in a tool's return type is one error at it (the output and the error are
//! named in the tool's type and stored), and the tool's calls still type-check.
use idem_core::{Idem, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "safe")]
async fn quote(n: u32) -> Result<impl serde::Serialize, Failed> {
    Ok(n)
}

type QuoteResult<T> = Result<T, Failed>;

#[tool(retry = "safe")]
async fn summary(n: u32) -> QuoteResult<impl std::fmt::Display> {
    Ok(n)
}

fn main() {
    let run = Idem::in_memory().run("opaque");
    let _ = quote(&run, 1);
    let _ = summary(&run, 1);
}

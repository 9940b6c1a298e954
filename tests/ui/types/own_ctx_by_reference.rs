//! A type of the application's own named `Ctx`, taken by reference: `&Ctx` is read as idem's
//! context, and the one error says so at the parameter (not a mismatch between two `Ctx`s).
use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

/// The application's own context.
struct Ctx {
    user: String,
}

/// Who is asking.
#[tool(retry = "safe")]
async fn whoami(ctx: &Ctx, n: u64) -> Result<String, Failed> {
    Ok(format!("{}{n}", ctx.user))
}

async fn caller(run: &idem_core::Run) -> Result<String, idem_core::Error<Failed>> {
    whoami(run, 1).await
}

fn main() {
    let _ = caller;
}

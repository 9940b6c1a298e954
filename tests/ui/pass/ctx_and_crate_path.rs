use idem_core::{Ctx, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

/// A type of the user's that happens to be named `Ctx`: an ordinary argument.
mod mine {
    #[derive(Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
    pub struct Ctx {
        pub tenant: String,
    }
}

#[tool(retry = "safe")]
pub async fn whoami(ctx: mine::Ctx) -> Result<String, Failed> {
    Ok(ctx.tenant)
}

#[tool(retry = "keyed")]
pub async fn tenant_key(cx: &Ctx, ctx: mine::Ctx) -> Result<String, Failed> {
    Ok(format!("{}:{}", ctx.tenant, cx.key()))
}

mod facade {
    pub use idem_core as idem;
}

#[tool(retry = "safe", crate = "crate::facade::idem")]
pub async fn via_facade(cx: &facade::idem::Ctx, n: u64) -> Result<u64, Failed> {
    let _ = cx;
    Ok(n)
}

mod reexport {
    pub use idem_core;
}

/// The context named through a module that re-exports idem-core, with no `crate = ".."`: still
/// the context, not a borrowed argument.
#[tool(retry = "safe")]
pub async fn via_reexport(cx: &reexport::idem_core::Ctx, n: u64) -> Result<u64, Failed> {
    let _ = cx;
    Ok(n)
}

fn main() {
    let _ = (WhoamiTool, TenantKeyTool, ViaFacadeTool, ViaReexportTool);
}

use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

// A `cfg` applies to every generated item: nothing of this tool exists in this build.
#[cfg(any())]
#[tool(retry = "safe")]
async fn gone(x: u64) -> Result<u64, Failed> {
    Ok(x)
}

// Other attributes stay on the body.
#[tool(retry = "safe")]
#[allow(clippy::needless_return)]
async fn kept(r#type: String) -> Result<String, Failed> {
    return Ok(r#type);
}

// A name whose words start with a digit once the leading `_` is gone: its items keep the `_`.
#[tool(retry = "safe", name = "verify_2fa")]
async fn _2fa_verify(code: u32) -> Result<u32, Failed> {
    Ok(code)
}

// Tools named like the expansion's closure parameters: the body's fn, declared in the closure's
// block, would shadow them.
#[tool(retry = "safe")]
async fn args(list: Vec<String>) -> Result<usize, Failed> {
    Ok(list.len())
}

#[tool(retry = "keyed")]
async fn cx(cx: &idem_core::Ctx, n: u32) -> Result<u32, Failed> {
    let _ = cx.key();
    Ok(n)
}

fn main() {
    let _ = (ArgsTool, CxTool);
    let _ = KeptTool;
    let _ = KeptArgs::new(String::new());
    let _ = (_2faVerifyTool, _2faVerifyArgs::new(1));
}

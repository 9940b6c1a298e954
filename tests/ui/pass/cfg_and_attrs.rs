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

fn main() {
    let _ = KeptTool;
    let _ = KeptArgs::new(String::new());
    let _ = (_2faVerifyTool, _2faVerifyArgs::new(1));
}

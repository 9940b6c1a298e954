//! A deprecated tool warns where it is called, not where it is defined (the expansion calls the
//! body itself).
#![deny(deprecated)]

use std::sync::Arc;

use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[deprecated(note = "use `greet`")]
#[tool(retry = "safe")]
pub async fn hello(name: String) -> Result<String, Failed> {
    Ok(name)
}

pub struct Desk;

#[idem_core::tool_set]
impl Desk {
    #[deprecated(note = "use `post`")]
    #[tool(retry = "keyed")]
    pub async fn old_post(&self, n: u32) -> Result<u32, Failed> {
        Ok(n)
    }
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = hello(&run, "h".into());
    let _ = Arc::new(Desk).old_post(&run, 1);
}

//! `#[tool_set]` on a trait impl: one error, and the impl left as written.
#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

pub trait Describe {
    fn describe(&self) -> String;
}

pub struct Desk;

#[idem_core::tool_set]
impl Describe for Desk {
    fn describe(&self) -> String {
        "desk".into()
    }
}

fn main() {
    let _ = Desk.describe();
}

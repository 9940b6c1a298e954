use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "safe")]
async fn search(query: String, #[cfg(feature = "paging")] page: u32) -> Result<u32, Failed> {
    Ok(query.len() as u32)
}

fn main() {
    // The call site does not add errors of its own.
    let idem = idem_core::Idem::in_memory();
    let run = idem.run("r");
    let _ = search(&run, "q".into());
}

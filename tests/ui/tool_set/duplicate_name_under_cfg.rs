//! Two tools of one name under `#[cfg]`s that both hold: the clash is reported where both are
//! compiled (the conditions are not exclusive here).

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

struct Lookup;

#[idem_core::tool_set]
impl Lookup {
    #[cfg(all())]
    #[tool(retry = "safe", name = "lookup")]
    async fn lookup_v1(&self, id: u64) -> Result<u64, Failed> {
        Ok(id)
    }

    #[cfg(not(any()))]
    #[tool(retry = "safe", name = "lookup")]
    async fn lookup_v2(&self, id: u64) -> Result<u64, Failed> {
        Ok(id * 2)
    }
}

fn main() {
    let _ = std::sync::Arc::new(Lookup).tool_set();
}

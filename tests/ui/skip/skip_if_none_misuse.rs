use idem_core::{tool, Ctx};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

// Not an `Option`: it is never `None`.
#[tool(retry = "keyed")]
async fn open_ticket(title: String, #[idem(skip_if_none)] memo: String) -> Result<String, Failed> {
    Ok(format!("{title} {memo}"))
}

// Skipped twice over.
#[tool(retry = "keyed", skip(trace))]
async fn close_ticket(
    #[idem(skip_if_none)] cx: &Ctx,
    id: u64,
    #[idem(skip, skip_if_none)] note: Option<String>,
    #[idem(skip_if_none)] trace: Option<String>,
) -> Result<u64, Failed> {
    let _ = (cx, note, trace);
    Ok(id)
}

async fn call_sites(run: &idem_core::Run) {
    let _ = open_ticket(run, "printer".into(), String::new()).await;
    let _ = close_ticket(run, 7, None, None).await;
}

fn main() {
    let _ = call_sites;
}

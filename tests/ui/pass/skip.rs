use idem_core::tool;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "keyed", skip(trace_id))]
async fn send_mail(
    to: String,
    #[idem(skip)] request_id: String,
    trace_id: u64,
    #[allow(unused_variables)] mut body: String,
) -> Result<(), Failed> {
    body.push('!');
    let _ = (to, request_id, trace_id, body);
    Ok(())
}

struct Desk;

impl Desk {
    #[tool(retry = "keyed")]
    async fn open_ticket(
        &self,
        title: String,
        #[idem(skip_if_none)] memo: Option<String>,
        #[idem(skip_if_none)] tags: std::option::Option<Vec<String>>,
    ) -> Result<String, Failed> {
        Ok(format!("{title} {memo:?} {tags:?}"))
    }
}

#[tool(retry = "never")]
async fn refund(charge: String, #[idem(skip_if_none)] reason: Option<String>) -> Result<(), Failed> {
    let _ = (charge, reason);
    Ok(())
}

async fn call_sites(run: &idem_core::Run) {
    let _ = refund(run, "ch_1".into(), None).await;
    let _ = std::sync::Arc::new(Desk).open_ticket(run, "printer".into(), Some("urgent".into()), None).await;
}

fn main() {
    let _ = call_sites;
}

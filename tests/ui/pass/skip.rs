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

fn main() {}

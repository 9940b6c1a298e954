use std::time::Duration;

use idem_core::{Tool, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[tool(retry = "keyed", name = "send-mail_v2", attempts = 5, timeout = "500ms", deadline = "2m", lease = "45s", ttl = "1h")]
async fn send_mail(to: String) -> Result<(), Failed> {
    let _ = to;
    Ok(())
}

fn main() {
    let def = SendMailTool.def();
    assert_eq!(def.name, "send-mail_v2");
    assert_eq!(def.options.attempts, Some(5));
    assert_eq!(def.options.attempt_timeout, Some(Duration::from_millis(500)));
    assert_eq!(def.options.deadline, Some(Duration::from_secs(120)));
    assert_eq!(def.options.lease, Some(Duration::from_secs(45)));
    assert_eq!(def.options.ttl, Some(Duration::from_secs(3600)));
}

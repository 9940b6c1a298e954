use idem_core::{NoError, tool};

/// A retention of a moment: a repeat a second later would run the transfer again.
#[tool(retry = "never", ttl = "1ms")]
async fn wire(to: String) -> Result<String, NoError> {
    Ok(to)
}

/// Just under the shortest.
#[tool(retry = "keyed", ttl = "999ms")]
async fn charge(to: String) -> Result<String, NoError> {
    Ok(to)
}

/// The shortest compiles.
#[tool(retry = "never", ttl = "1s")]
async fn refund(to: String) -> Result<String, NoError> {
    Ok(to)
}

fn main() {
    let run = idem_core::Idem::in_memory().run("ttl");
    let _ = wire(&run, "a".into());
    let _ = charge(&run, "a".into());
    let _ = refund(&run, "a".into());
}

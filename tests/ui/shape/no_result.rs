use idem_core::tool;

#[tool(retry = "safe")]
async fn ping() {}

fn main() {}

use idem_core::tool;

#[tool(retry = "safe")]
struct Balance;

fn main() {}

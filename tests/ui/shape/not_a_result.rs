use idem_core::tool;

#[tool(retry = "safe")]
async fn count() -> u64 {
    1
}

fn main() {}

//! A where clause on a tool without generic parameters: the error is at the clause, not at the
//! attribute.
use idem_core::{NoError, tool};

/// Double it.
#[tool(retry = "safe")]
pub async fn double(n: u32) -> Result<u32, NoError>
where
    u32: Copy,
{
    Ok(n * 2)
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = double(&run, 3);
}

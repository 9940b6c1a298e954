//! A where clause on a tool without generic parameters, with predicates or without: the error is
//! at the clause, not at the attribute.
use idem_core::{NoError, tool};

/// Double it.
#[tool(retry = "safe")]
pub async fn double(n: u32) -> Result<u32, NoError>
where
    u32: Copy,
{
    Ok(n * 2)
}

/// Triple it.
#[tool(retry = "safe")]
pub async fn triple(n: u32) -> Result<u32, NoError>
where
{
    Ok(n * 3)
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = double(&run, 3);
    let _ = triple(&run, 3);
}

//! `get_v2` and `get_v_2` give the same type names (`GetV2Args`, `GetV2Tool`): rustc reports each
//! name once, at the second fn's name, and nothing else (no clash of hidden items, no conflicting
//! impls); the call sites of both type-check.
use idem_core::{NoError, tool};

/// Version 2.
#[tool(retry = "safe")]
async fn get_v2(n: u32) -> Result<u32, NoError> {
    Ok(n)
}

/// Version 2, spelled another way.
#[tool(retry = "safe")]
async fn get_v_2(n: u32) -> Result<u32, NoError> {
    Ok(n + 1)
}

fn main() {
    let run = idem_core::Idem::in_memory().run("clash");
    let _ = get_v2(&run, 1);
    let _ = get_v_2(&run, 1);
}

//! A call on a Tokio runtime built without timers, for `tests/runtimes.rs`, which builds this with
//! `panic = "abort"`: a tool that finishes at once needs no timer, and is answered.

use idem_core::{Idem, NoError, tool};

/// Book a seat.
#[tool(retry = "keyed")]
async fn book(seat: u32) -> Result<u32, NoError> {
    Ok(seat)
}

fn main() {
    let idem = Idem::in_memory();
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    match runtime.block_on(book(&idem.run("abort"), 1)) {
        Ok(seat) => println!("booked {seat}"),
        Err(e) => println!("refused: {e}"),
    }
}

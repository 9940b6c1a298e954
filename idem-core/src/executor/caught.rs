//! The user's code that runs around a tool's body: the arguments' `Serialize` (for the key),
//! the `Serialize` and `Deserialize` of its output and error, `Classify`, the reconciliation
//! check. A panic there ends in an error that names it, as a panic in the body does, instead of
//! unwinding out of the call after the effect happened (with the outcome unstored, so a `never`
//! tool's repeat would wait out the lease).

use std::panic::{AssertUnwindSafe, catch_unwind};

/// `f()`, or the message of its panic. Nothing is shared with `f` across the unwind but what
/// the caller drops or reports, hence `AssertUnwindSafe`.
pub(crate) fn caught<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| panic_message(payload.as_ref()))
}

/// The text of a panic's payload: `panic!` gives a `&str` or a `String`.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<not a string>".to_owned()
    }
}

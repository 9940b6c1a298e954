//! Support for the code `#[tool]` generates. Not a public API: reached through
//! `idem_core::__private`, and may change in any release.

use std::fmt::{self, Debug, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::canonical::KeyError;
use crate::ctx::Ctx;
use crate::failure::Classify;
use crate::policy::ToolOptions;
use crate::tool::{Tool, ToolDef};

/// Every option unset; generated definitions write `ToolOptions { attempts: Some(3), ..NO_OPTIONS }`
/// in a `static`, where `Default::default()` cannot be called.
pub const NO_OPTIONS: ToolOptions =
    ToolOptions { attempts: None, attempt_timeout: None, budget: None, lease: None, ttl: None };

/// A boxed, sendable future borrowing for `'a`: what a method tool's body returns.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Splits a tool's return type into its success and error types, so that aliases such as
/// `type Result<T> = std::result::Result<T, MyError>` work too.
#[diagnostic::on_unimplemented(
    message = "a tool must return `Result<T, E>`, not `{Self}`",
    label = "not a `Result`",
    note = "`T` is stored and replayed to every repeat; `E` implements `idem_core::Classify`"
)]
pub trait ToolReturn {
    /// The success type.
    type Ok;
    /// The error type.
    type Err;
}

impl<T, E> ToolReturn for Result<T, E> {
    type Ok = T;
    type Err = E;
}

// The checks below test one bound each (`Serialize`): rustc reports one error per unmet bound,
// and the derives and the `Tool` impl already report the others at the same span. These add the
// message that says what to do.

/// A tool argument's first bound, with a message that says what to do.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool argument: it must be Serialize, Deserialize, JsonSchema, Clone, Send and Sync",
    label = "this parameter becomes a field of the tool's JSON arguments",
    note = "derive `serde::Serialize`, `serde::Deserialize`, `schemars::JsonSchema` and `Clone` for `{Self}`, or mark a parameter that is not part of the call `#[idem(skip)]` (it still has to be an argument)"
)]
pub trait ToolArg {}

impl<T: Serialize + ?Sized> ToolArg for T {}

/// A tool success type's first bound.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored and replayed: a tool's success type must be Serialize and Deserialize",
    label = "the result is stored as JSON and replayed to every repeat of the call",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait ToolOutput {}

impl<T: Serialize + ?Sized> ToolOutput for T {}

/// A tool error type's first bound.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool error: it must be Serialize, Deserialize, Display and Debug",
    label = "permanent failures are stored as JSON and replayed to every repeat of the call",
    note = "derive `serde::Serialize`, `serde::Deserialize`, `Debug` and `thiserror::Error` (or implement `Display`) for `{Self}`"
)]
pub trait ToolError {}

impl<T: Serialize + ?Sized> ToolError for T {}

/// Checks, spanned at the user's parameter type.
pub const fn assert_arg<T: ToolArg + ?Sized>() {}
/// Checks, spanned at the user's return type.
pub const fn assert_output<T: ToolOutput + ?Sized>() {}
/// Checks, spanned at the user's error type.
pub const fn assert_error<T: ToolError + Classify + ?Sized>() {}
/// Checks, spanned at the user's return type.
pub const fn assert_result<T: ToolReturn + ?Sized>() {}

/// The part of the intent a method tool's arguments define: written by `#[tool]` for the
/// arguments struct it declares inside the method's `..._tool()` constructor.
pub trait Intent {
    /// Writes the RFC 8785 canonical text of the arguments that make up the intent (the ones not
    /// marked `#[idem(skip)]`).
    fn write_intent(&self, out: &mut Vec<u8>) -> Result<(), KeyError>;
}

/// The body of a method tool: calls the user's method on the receiver.
pub type MethodBody<S, A, O, E> = for<'a> fn(&'a S, &'a Ctx, A) -> BoxFuture<'a, Result<O, E>>;

/// A tool declared with `#[tool]` on an `async fn(&self, ..)` method: holds the receiver in an
/// `Arc` and calls the method for each attempt. An attribute on a method can only add items to
/// its `impl` block, so the arguments type is declared inside the generated constructor and this
/// generic struct carries the rest.
pub struct MethodTool<S, A, O, E> {
    receiver: Arc<S>,
    def: &'static ToolDef,
    body: MethodBody<S, A, O, E>,
}

impl<S, A, O, E> MethodTool<S, A, O, E> {
    /// The tool of `receiver`, whose definition is `def`, running `body`.
    pub fn new(receiver: Arc<S>, def: &'static ToolDef, body: MethodBody<S, A, O, E>) -> Self {
        MethodTool { receiver, def, body }
    }
    /// The receiver.
    pub fn receiver(&self) -> &Arc<S> {
        &self.receiver
    }
}

impl<S, A, O, E> Clone for MethodTool<S, A, O, E> {
    fn clone(&self) -> Self {
        MethodTool { receiver: Arc::clone(&self.receiver), def: self.def, body: self.body }
    }
}

impl<S, A, O, E> Debug for MethodTool<S, A, O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodTool").field("name", &self.def.name).finish_non_exhaustive()
    }
}

impl<S, A, O, E> Tool for MethodTool<S, A, O, E>
where
    S: Send + Sync + 'static,
    A: Intent + Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static,
    O: Serialize + DeserializeOwned + Send + 'static,
    E: Classify + Serialize + DeserializeOwned + Display + Debug + Send + 'static,
{
    type Args = A;
    type Output = O;
    type Error = E;

    fn def(&self) -> &'static ToolDef {
        self.def
    }

    fn write_intent(args: &A, out: &mut Vec<u8>) -> Result<(), KeyError> {
        args.write_intent(out)
    }

    // `async fn` captures both borrows; returning the boxed future (one lifetime) cannot.
    async fn run(&self, cx: &Ctx, args: A) -> Result<O, E> {
        (self.body)(&self.receiver, cx, args).await
    }
}

/// Builds a tool's arguments from the typed call's parameters, in declaration order.
pub fn make_args<T: Tool, P>(_tool: &T, params: P) -> T::Args
where
    T::Args: From<P>,
{
    T::Args::from(params)
}

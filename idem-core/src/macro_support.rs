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
use crate::error::Error;
use crate::executor::Run;
use crate::failure::Classify;
use crate::key::Key;
use crate::reconcile::Reconciled;
use crate::tool::{Tool, ToolDef};

mod args;
mod none_probe;

pub use args::*;

/// A boxed, sendable future borrowing for `'a`: what a tool's body returns, and what the typed
/// call of a free fn tool returns (`Pin<Box<dyn Future<Output = T> + Send + 'a>>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The typed call of a tool: `run.call(&tool, args)` with the tool moved in, boxed, so that the
/// user's crate writes no `async fn` per tool (a method tool's, and behind [`FnTool`]'s pointer
/// a free fn tool's).
pub fn call_owned<T: Tool>(
    run: &Run,
    tool: T,
    args: T::Args,
) -> BoxFuture<'_, Result<T::Output, Error<T::Error>>> {
    Box::pin(async move { run.call(&tool, args).await })
}

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

// Each kind of type has its bounds in one trait, required by the generic tool types below.
// `#[tool]` checks each bound on its own at the user's spans first (see `macro_checks`), so a
// user sees which trait is missing, once.

/// What a tool argument must be: a field of the JSON arguments the model sends (deserialized,
/// described by a JSON Schema), part of the intent (serialized) and cloned for retries.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool argument: it must be Serialize, Deserialize, JsonSchema, Clone, Send and Sync",
    label = "a parameter of type `{Self}` becomes a field of the tool's JSON arguments",
    note = "derive `serde::Serialize`, `serde::Deserialize`, `schemars::JsonSchema` and `Clone` for `{Self}`; a parameter that is not part of the call's intent is marked `#[idem(skip)]`, but it is still an argument and needs the same"
)]
pub trait ToolArg:
    Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static
{
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static> ToolArg for T {}

/// What a tool's success type must be: stored as JSON and replayed to every repeat.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored and replayed: a tool's success type must be Serialize and Deserialize",
    label = "the result is stored as JSON and replayed to every repeat of the call",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait ToolOutput: Serialize + DeserializeOwned + Send + 'static {}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned + Send + 'static> ToolOutput for T {}

/// What a tool's error type must be: classified (may it be retried?), and stored as JSON and
/// replayed when permanent.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool error: it must implement `idem_core::Classify`, Serialize, Deserialize, Display and Debug",
    label = "the error says whether a failure may be retried; permanent ones are stored as JSON and replayed to every repeat",
    note = "implement `idem_core::Classify` for `{Self}` (return `Failure::transient()`, `Failure::ambiguous()` or `Failure::permanent()`) and derive `serde::Serialize`, `serde::Deserialize`, `Debug` and `thiserror::Error` (or implement `Display`)"
)]
pub trait ToolError:
    Classify + Serialize + DeserializeOwned + Display + Debug + Send + 'static
{
}

#[diagnostic::do_not_recommend]
impl<T: Classify + Serialize + DeserializeOwned + Display + Debug + Send + 'static> ToolError
    for T
{
}

/// What a generic tool's whole arguments must be: every bound of `Tool::Args`, and the intent.
/// One trait with one impl per arguments type, so the code `#[tool]` writes proves one bound
/// per tool (the impl's own) instead of each bound of `Tool::Args` on its own, which is most of
/// the type checking of a typed call.
pub trait ToolArgs:
    Intent + Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static
{
}

impl<T: ArgTuple, F: Fields> ToolArgs for Args<T, F> {}

impl<T: ToolArg> ToolArgs for crate::flat_args::Flat<T> {}

/// The part of the arguments that makes up the intent: implemented by [`Args`] (the skipped
/// parameters left out), required by the generic tools [`FnTool`] and [`MethodTool`].
pub trait Intent {
    /// Writes the canonical text (JCS (RFC 8785) with exact integers, `docs/key-spec.md`) of the
    /// arguments that make up the intent (the ones not marked `#[idem(skip)]`, and not those
    /// marked `#[idem(skip_if_none)]` that are `None`).
    fn write_intent(&self, out: &mut Vec<u8>) -> Result<(), KeyError>;

    /// [`Tool::ARGS_FROM_INTENT`] of the tools with these arguments.
    const FROM_INTENT: bool = false;
}

/// The body of a method tool: calls the user's method on the receiver.
pub type MethodBody<S, A, O, E> = for<'a> fn(&'a S, &'a Ctx, A) -> BoxFuture<'a, Result<O, E>>;

/// The reconciliation check of a method tool (`reconcile = check`): calls the user's method on
/// the receiver with the key and a copy of the arguments.
pub type MethodCheck<S, A, O> = for<'a> fn(&'a S, &'a Key, &'a A) -> BoxFuture<'a, Reconciled<O>>;

/// The reconciliation check of a free fn tool: calls the user's check with the key and a copy of
/// the arguments.
pub type FnCheck<A, O> = for<'a> fn(&'a Key, &'a A) -> BoxFuture<'a, Reconciled<O>>;

/// A tool declared with `#[tool]` on an `async fn(&self, ..)` method: holds the receiver in an
/// `Arc` and calls the method for each attempt. An attribute on a method can only add items to
/// its `impl` block, so the arguments' field names are declared inside the generated constructor
/// and this generic struct carries the rest.
pub struct MethodTool<S, A, O, E> {
    receiver: Arc<S>,
    def: &'static ToolDef,
    body: MethodBody<S, A, O, E>,
    check: Option<MethodCheck<S, A, O>>,
    /// [`Tool::declared_at`].
    at: &'static str,
}

impl<S, A, O, E> MethodTool<S, A, O, E> {
    /// The tool of `receiver`, whose definition is `def`, running `body`, declared at `at`.
    pub fn new(
        receiver: Arc<S>,
        def: &'static ToolDef,
        body: MethodBody<S, A, O, E>,
        at: &'static str,
    ) -> Self {
        MethodTool { receiver, def, body, check: None, at }
    }

    /// The same tool, reconciled by `check` (`#[tool(reconcile = ..)]`).
    pub fn reconciled_by(self, check: MethodCheck<S, A, O>) -> Self {
        MethodTool { check: Some(check), ..self }
    }
}

impl<S, A, O, E> Clone for MethodTool<S, A, O, E> {
    fn clone(&self) -> Self {
        MethodTool {
            receiver: Arc::clone(&self.receiver),
            def: self.def,
            body: self.body,
            check: self.check,
            at: self.at,
        }
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
    A: ToolArgs,
    O: ToolOutput,
    E: ToolError,
{
    type Args = A;
    type Output = O;
    type Error = E;

    fn def(&self) -> &'static ToolDef {
        self.def
    }

    fn declared_at(&self) -> &'static str {
        self.at
    }

    fn declared_on(&self) -> &'static str {
        std::any::type_name::<S>()
    }

    const ARGS_FROM_INTENT: bool = A::FROM_INTENT;

    fn write_intent(args: &A, out: &mut Vec<u8>) -> Result<(), KeyError> {
        args.write_intent(out)
    }

    // `async fn` captures both borrows; returning the boxed future (one lifetime) cannot.
    async fn run(&self, cx: &Ctx, args: A) -> Result<O, E> {
        (self.body)(&self.receiver, cx, args).await
    }

    fn reconciles(&self) -> bool {
        self.check.is_some()
    }

    async fn reconcile(&self, key: &Key, args: &A) -> Reconciled<O> {
        match self.check {
            Some(check) => check(&self.receiver, key, args).await,
            None => Reconciled::Unknown,
        }
    }
}

/// The body of a free fn tool: calls the user's fn (declared inside the closure `#[tool]` writes).
pub type FnBody<A, O, E> = for<'a> fn(&'a Ctx, A) -> BoxFuture<'a, Result<O, E>>;

/// A tool declared with `#[tool]` on a free `async fn`: its definition and its body. One generic
/// `Tool` impl here instead of one per tool; `ChargeCardTool` is a type alias of this and a
/// constant of that type, so it is used as before (`&ChargeCardTool`, `ChargeCardTool.def()`).
pub struct FnTool<A, O, E> {
    def: &'static ToolDef,
    body: FnBody<A, O, E>,
    check: Option<FnCheck<A, O>>,
    call: FnCall<A, O, E>,
    /// [`Tool::declared_at`].
    at: &'static str,
}

/// The typed call of a free fn tool, instantiated where the tool's constant is built: the typed
/// call reaches the executor through this pointer and proves no bound of its own.
pub type FnCall<A, O, E> =
    for<'a> fn(&'a Run, FnTool<A, O, E>, A) -> BoxFuture<'a, Result<O, Error<E>>>;

impl<A, O, E> FnTool<A, O, E> {
    /// The tool whose definition is `def`, running `body`, declared at `at`.
    pub const fn new(def: &'static ToolDef, body: FnBody<A, O, E>, at: &'static str) -> Self
    where
        A: ToolArgs,
        O: ToolOutput,
        E: ToolError,
    {
        FnTool { def, body, check: None, call: call_owned::<FnTool<A, O, E>>, at }
    }

    /// The same tool, reconciled by `check` (`#[tool(reconcile = ..)]`).
    pub const fn reconciled_by(self, check: FnCheck<A, O>) -> Self {
        FnTool { check: Some(check), ..self }
    }

    /// The typed call: `run.call(&tool, args)`, boxed. No bound to prove here (the constructor
    /// proved them), so a crate of many tools type-checks one plain call per typed call, and
    /// the boxed future's type is written out (no opaque type per tool).
    pub fn call(self, run: &Run, args: A) -> BoxFuture<'_, Result<O, Error<E>>> {
        (self.call)(run, self, args)
    }
}

impl<A, O, E> Clone for FnTool<A, O, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A, O, E> Copy for FnTool<A, O, E> {}

impl<A, O, E> Debug for FnTool<A, O, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnTool").field("name", &self.def.name).finish_non_exhaustive()
    }
}

impl<A, O, E> Tool for FnTool<A, O, E>
where
    A: ToolArgs,
    O: ToolOutput,
    E: ToolError,
{
    type Args = A;
    type Output = O;
    type Error = E;

    fn def(&self) -> &'static ToolDef {
        self.def
    }

    fn declared_at(&self) -> &'static str {
        self.at
    }

    const ARGS_FROM_INTENT: bool = A::FROM_INTENT;

    fn write_intent(args: &A, out: &mut Vec<u8>) -> Result<(), KeyError> {
        args.write_intent(out)
    }

    fn run(&self, cx: &Ctx, args: A) -> impl Future<Output = Result<O, E>> + Send {
        (self.body)(cx, args)
    }

    fn reconciles(&self) -> bool {
        self.check.is_some()
    }

    async fn reconcile(&self, key: &Key, args: &A) -> Reconciled<O> {
        match self.check {
            Some(check) => check(key, args).await,
            None => Reconciled::Unknown,
        }
    }
}

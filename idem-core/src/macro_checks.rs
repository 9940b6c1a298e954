//! The type checks `#[tool]` emits at the user's spans, built so that one mistake gives one
//! error, at the type, naming the trait that is missing (axum's `debug_handler` does the same
//! for handlers).
//!
//! Each requirement is its own trait with a `#[diagnostic::on_unimplemented]` message, checked by
//! a method call on a value of the type, spanned at the type as written:
//! `customer.__idem_arg_json_schema()`. A method that does not apply is error E0599, whose
//! message is the requirement's own when one trait is missing; and the call's type is then
//! rustc's error type, which silences every later error that involves it. The checked types flow
//! through [`checked`] into the generated code that needs the bounds ([`Checked::tool`],
//! [`Checked::method`]), so nothing after the first failed check is reported again. The checks
//! run in a closure that is never called.
//!
//! The body's future is boxed by [`tool_body`], whose `Send` bound is the only one on it: rustc
//! then points at the value held across an `.await` once.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::marker::PhantomData;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::failure::Classify;
use crate::flat_args::Flat;
use crate::macro_support::{
    Args, BoxFuture, FnBody, FnTool, MethodTool, ToolArgs, ToolError, ToolOutput,
};
use crate::reconcile::Reconciled;
use crate::tool::ToolDef;

/// A value of the type being checked. The check methods are implemented for it, not for the
/// type itself: a method call on the type would auto-dereference, and a type that dereferences
/// to one meeting the requirement (`Arc<String>` to `String`) would pass its check and fail later
/// with a type mismatch that names no trait. The requirement is a trait of `Checking<T>` (the
/// receiver's own type), so rustc's message for the failed call is the requirement's.
pub struct Checking<T>(pub T);

/// One requirement: a marker trait with its message and a check trait whose method applies
/// only when the requirement holds.
/// With `contained`, a second note says what to do when the type is a standard container
/// (rustc names `Vec<Customer>`, not the `Customer` that lacks the trait).
macro_rules! requirement {
    ($(#[$doc:meta])* $marker:ident, $check:ident, $method:ident, [$($bound:tt)*],
     $message:literal, $label:literal, $note:literal, contained) => {
        requirement!(
            $(#[$doc])* $marker, $check, $method, [$($bound)*], $message, $label, $note,
            "for a standard container such as `Vec<X>` or `Option<X>`, the type it holds needs the trait: derive it there"
        );
    };
    ($(#[$doc:meta])* $marker:ident, $check:ident, $method:ident, [$($bound:tt)*],
     $message:literal, $label:literal, $($note:literal),+) => {
        $(#[$doc])*
        #[diagnostic::on_unimplemented(message = $message, label = $label, $(note = $note),+)]
        pub trait $marker<T> {}

        #[diagnostic::do_not_recommend]
        impl<T: $($bound)*> $marker<T> for Checking<T> {}

        #[doc = concat!("Applies when [`", stringify!($marker), "`] holds; see the module docs.")]
        pub trait $check: Sized {
            /// Returns `self`; an E0599 at the user's type when the requirement does not hold.
            fn $method(self) -> Self {
                self
            }
        }

        impl<T> $check for Checking<T> where Checking<T>: $marker<T> {}
    };
}

requirement!(
    /// A tool argument is described to the model by its JSON Schema.
    ArgJsonSchema, CheckArgJsonSchema, __idem_arg_json_schema, [JsonSchema],
    "`{T}` cannot be a tool argument: it does not implement `schemars::JsonSchema`",
    "the model is shown each argument's JSON Schema",
    "derive `schemars::JsonSchema` for `{T}` with schemars 1 (`schemars = \"1\"` in Cargo.toml: the derive of schemars 0.8 implements another trait); a tool argument must be Serialize, Deserialize, JsonSchema, Clone, Send and Sync. idem's context is not an argument: take it as `cx: &Ctx`",
    contained
);
requirement!(
    /// A tool argument is part of the call's intent, serialized into its idempotency key.
    ArgSerialize, CheckArgSerialize, __idem_arg_serialize, [Serialize],
    "`{T}` cannot be a tool argument: it does not implement `serde::Serialize`",
    "each argument is serialized into the call's idempotency key (its canonical JSON)",
    "derive `serde::Serialize` for `{T}` (`Arc<str>` and `Rc<T>` need serde's `rc` feature); a tool argument must be Serialize, Deserialize, JsonSchema, Clone, Send and Sync",
    contained
);
requirement!(
    /// A tool argument is read from the model's JSON.
    ArgDeserialize, CheckArgDeserialize, __idem_arg_deserialize, [DeserializeOwned],
    "`{T}` cannot be a tool argument: it does not implement `serde::Deserialize` (owned)",
    "the model sends each argument as JSON",
    "derive `serde::Deserialize` for `{T}` (an owned type: `String`, not `&str`); a tool argument must be Serialize, Deserialize, JsonSchema, Clone, Send and Sync",
    contained
);
requirement!(
    /// A tool argument is cloned for every attempt.
    ArgClone, CheckArgClone, __idem_arg_clone, [Clone],
    "`{T}` cannot be a tool argument: it does not implement `Clone`",
    "every attempt of a retried call gets its own copy of the arguments",
    "derive `Clone` for `{T}`; a tool argument must be Serialize, Deserialize, JsonSchema, Clone, Send and Sync",
    contained
);
requirement!(
    /// A tool argument moves between threads with the call.
    ArgSendSync, CheckArgSendSync, __idem_arg_send_sync, [Send + Sync + 'static],
    "`{T}` cannot be a tool argument: it is not `Send + Sync + 'static`",
    "calls, retries and joined duplicates run on any thread of the runtime",
    "use owned, thread-safe types (`Arc` instead of `Rc`, no borrowed data)"
);
requirement!(
    /// A tool's success value is stored and replayed to every repeat.
    OutputSerialize, CheckOutputSerialize, __idem_output_serialize, [Serialize],
    "`{T}` cannot be stored and replayed: a tool's success type must implement `serde::Serialize`",
    "the result is stored as JSON and replayed to every repeat of the call",
    "derive `serde::Serialize` and `serde::Deserialize` for `{T}`",
    contained
);
requirement!(
    /// A tool's success value is read back for every replay.
    OutputDeserialize, CheckOutputDeserialize, __idem_output_deserialize, [DeserializeOwned],
    "`{T}` cannot be stored and replayed: a tool's success type must implement `serde::Deserialize`",
    "the result is stored as JSON and replayed to every repeat of the call",
    "derive `serde::Serialize` and `serde::Deserialize` for `{T}`",
    contained
);
requirement!(
    /// A tool's success value is handed to callers on any thread.
    OutputSend, CheckOutputSend, __idem_output_send, [Send + 'static],
    "`{T}` cannot be a tool's success type: it is not `Send + 'static`",
    "joined duplicates receive the result on other threads",
    "use owned, thread-safe types"
);
requirement!(
    /// A tool's error says whether a failure may be retried.
    ErrorClassify, CheckErrorClassify, __idem_error_classify, [Classify],
    "`{T}` cannot be a tool error: it does not implement `idem_core::Classify`",
    "the error says whether a failure may be retried",
    "implement `idem_core::Classify` for `{T}`: return `Failure::transient()` (safe to retry), `Failure::ambiguous()` (may have happened) or `Failure::permanent()` (stored and replayed); for another crate's error, return `Result<T, idem_core::ToolFailure>` (`?` converts it)"
);
requirement!(
    /// A permanent tool error is stored and replayed.
    ErrorSerialize, CheckErrorSerialize, __idem_error_serialize, [Serialize],
    "`{T}` cannot be a tool error: it does not implement `serde::Serialize`",
    "permanent errors are stored as JSON and replayed to every repeat",
    "derive `serde::Serialize` and `serde::Deserialize` for `{T}`, or return `Result<T, idem_core::ToolFailure>` (`?` converts any error); a tool that cannot fail returns `Result<T, idem_core::NoError>`"
);
requirement!(
    /// A permanent tool error is read back for every replay.
    ErrorDeserialize, CheckErrorDeserialize, __idem_error_deserialize, [DeserializeOwned],
    "`{T}` cannot be a tool error: it does not implement `serde::Deserialize`",
    "permanent errors are stored as JSON and replayed to every repeat",
    "derive `serde::Serialize` and `serde::Deserialize` for `{T}`, or return `Result<T, idem_core::ToolFailure>` (`?` converts any error)"
);
requirement!(
    /// A tool error is shown to the model.
    ErrorDisplay, CheckErrorDisplay, __idem_error_display, [Display + Debug],
    "`{T}` cannot be a tool error: it does not implement `Display` and `Debug`",
    "the model reads the error's text",
    "derive `Debug` and `thiserror::Error` (or implement `Display`) for `{T}`"
);
requirement!(
    /// A tool error is handed to callers on any thread.
    ErrorSend, CheckErrorSend, __idem_error_send, [Send + 'static],
    "`{T}` cannot be a tool error: it is not `Send + 'static`",
    "joined duplicates receive the error on other threads",
    "use owned, thread-safe types"
);

/// The types of a tool after its checks: the parameters' tuple, the success and the error
/// types, each rustc's error type when its check failed.
pub struct Checked<P, O, E>(PhantomData<fn(P, O, E)>);

/// Carries the types the check closure returns (the closure is never called).
pub const fn checked<I, P, O, E>(checks: impl FnOnce(I) -> (P, O, E)) -> Checked<P, O, E> {
    std::mem::forget(checks);
    Checked(PhantomData)
}

/// `T` is `U`: converts a value of the concrete type the macro wrote into the type built from
/// the checked types (the same type when the checks pass).
pub trait Is<U> {
    /// `self`, as `U`.
    fn into_same(self) -> U;
}

impl<T> Is<T> for T {
    fn into_same(self) -> T {
        self
    }
}

// Methods, not functions: a receiver's type fixes `P`, `O` and `E` even when it holds rustc's
// error type, where a function argument of such a type would be skipped and the next argument's
// concrete type would decide them, and the failed bound be reported a second time.
impl<P, O, E> Checked<P, O, E> {
    /// A free fn tool, typed by the checks: its constant's initializer. The bounds are proved
    /// here, once per tool; the typed call ([`FnTool::call`]) proves none.
    pub const fn tool<F>(
        self,
        def: &'static ToolDef,
        body: FnBody<Args<P, F>, O, E>,
        at: &'static str,
    ) -> FnTool<Args<P, F>, O, E>
    where
        Args<P, F>: ToolArgs,
        O: ToolOutput,
        E: ToolError,
    {
        FnTool::new(def, body, at)
    }

    /// A method tool, typed by the checks.
    pub fn method<S, F, T>(self, tool: T) -> MethodTool<S, Args<P, F>, O, E>
    where
        T: Is<MethodTool<S, Args<P, F>, O, E>>,
    {
        tool.into_same()
    }
}

/// The same for a tool whose one parameter is `#[idem(flatten)]`.
impl<A, O, E> Checked<(A,), O, E> {
    /// A free fn tool taking one arguments struct, typed by the checks.
    pub const fn tool_flat(
        self,
        def: &'static ToolDef,
        body: FnBody<Flat<A>, O, E>,
        at: &'static str,
    ) -> FnTool<Flat<A>, O, E>
    where
        Flat<A>: ToolArgs,
        O: ToolOutput,
        E: ToolError,
    {
        FnTool::new(def, body, at)
    }

    /// A method tool taking one arguments struct, typed by the checks.
    pub fn method_flat<S, T>(self, tool: T) -> MethodTool<S, Flat<A>, O, E>
    where
        T: Is<MethodTool<S, Flat<A>, O, E>>,
    {
        tool.into_same()
    }
}

/// idem's context as the type the body names: a first parameter written `&Ctx` is read as the
/// context whatever `Ctx` names where the tool is written, and one of the user's own types of
/// that name gets this one error, saying so, instead of a type mismatch between two `Ctx`s.
#[diagnostic::on_unimplemented(
    message = "`&{Self}` as a tool's parameter is read as idem's context (`&idem_core::Ctx`), and this `{Self}` is another type",
    label = "read as idem's context",
    note = "a parameter of a type of your own named `Ctx` is an argument when it is owned (`ctx: Ctx`); for idem's context write `&idem_core::Ctx`"
)]
pub trait IdemContext {
    /// The context as this type.
    fn of(cx: &crate::Ctx) -> &Self;
}

impl IdemContext for crate::Ctx {
    fn of(cx: &crate::Ctx) -> &Self {
        cx
    }
}

/// The context passed to a tool's body (see [`IdemContext`]).
pub fn context<C: IdemContext>(cx: &crate::Ctx) -> &C {
    C::of(cx)
}

/// Boxes one attempt of a tool's body.
pub fn tool_body<'a, F>(body: F) -> BoxFuture<'a, F::Output>
where
    F: Future + Send + 'a, // tools must be Send: retries, joins and the runtime move them across threads
{
    Box::pin(body)
}

/// What a reconciliation check returns: the future of an `async fn` answering `Reconciled<O>`,
/// where `O` is the tool's success type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not what a reconciliation check returns: it must be the future of an `async fn` returning `Reconciled<{O}>`",
    label = "the check named by `reconcile = ..` is called here with the key and the tool's arguments",
    note = "write `async fn check(key: &idem_core::Key, <the tool's parameters, by value, in order>) -> idem_core::Reconciled<{O}>`; on a method tool, a method taking `&self` first; its future must be `Send`"
)]
pub trait ReconcileFuture<O>: Future<Output = Reconciled<O>> + Send {}

#[diagnostic::do_not_recommend]
impl<O, F: Future<Output = Reconciled<O>> + Send> ReconcileFuture<O> for F {}

/// Boxes the future of a tool's reconciliation check.
pub fn reconcile_check<'a, O, F: ReconcileFuture<O> + 'a>(
    check: F,
) -> BoxFuture<'a, Reconciled<O>> {
    Box::pin(check)
}

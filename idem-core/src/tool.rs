//! What `#[tool]` generates: a [`Tool`] implementation with its [`ToolDef`].

use std::fmt::{Debug, Display};
use std::future::Future;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::canonical::KeyError;
use crate::class::RetryClass;
use crate::ctx::Ctx;
use crate::failure::Classify;
use crate::key::Key;
use crate::policy::ToolOptions;
use crate::reconcile::Reconciled;

/// A tool's static definition: what the model sees and how the executor treats it.
#[derive(Clone, Copy, Debug)]
pub struct ToolDef {
    /// The stable name: part of every key, so renaming the Rust fn does not change keys.
    pub name: &'static str,
    /// The description for the model (the fn's doc comment).
    pub description: &'static str,
    /// How the tool may be retried.
    pub class: RetryClass,
    /// The options declared in the attribute.
    pub options: ToolOptions,
}

/// A tool whose every call goes through the idem protocol. Implemented by `#[tool]`; implement it
/// by hand only for tools built at run time.
pub trait Tool: Send + Sync + 'static {
    /// All arguments, as the model sends them (parameters marked `#[idem(skip)]` included).
    type Args: Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static;
    /// The success value; stored as JSON and replayed.
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// The tool's error; permanent ones are stored as JSON and replayed.
    type Error: Classify + Serialize + DeserializeOwned + Display + Debug + Send + 'static;

    /// The tool's definition.
    fn def(&self) -> &'static ToolDef;

    /// Where the tool is declared (`app::orders::get`), written by `#[tool]`
    /// for a tool whose name is its fn's; empty for one given its name (`name = ".."`, which
    /// says it is the tool of that name: a version renamed or rewritten) and for one implemented
    /// by hand, neither of which is checked. The stable name is part of every key, so two fns
    /// that happen to share a name (`users::get`, `orders::get`) would replay each other's
    /// results: an [`Idem`](crate::Idem) refuses a call of a tool whose name another declaration
    /// was called under first ([`Error::NameTaken`](crate::Error::NameTaken)).
    fn declared_at(&self) -> &'static str {
        ""
    }

    /// For a method tool, the type it is a method of (`std::any::type_name` of the receiver:
    /// `app::Alpha`, `app::Repo<u8>`), told apart with [`declared_at`](Self::declared_at): two
    /// types' methods of one name, or one generic block used with two types, are two tools.
    /// Empty for a free fn's tool and one implemented by hand.
    fn declared_on(&self) -> &'static str {
        ""
    }

    /// Writes the canonical text (JCS (RFC 8785) with exact integers, `docs/key-spec.md`) of the
    /// arguments that make up the intent into `out`. See [`crate::canonicalize`]. By default all
    /// of `args` are the intent; `#[tool]` leaves out the parameters marked `#[idem(skip)]`, and
    /// those marked `#[idem(skip_if_none)]` that are `None`.
    fn write_intent(args: &Self::Args, out: &mut Vec<u8>) -> Result<(), KeyError> {
        crate::canonical::canonicalize(args, out)
    }

    /// Whether the canonical text [`Tool::write_intent`] writes, read back with the arguments'
    /// `Deserialize`, gives the same arguments: every field is in the intent and reads back equal
    /// (no skipped fields, no floats, since RFC 8785 writes `-0.0` as `0`). When it does, a call
    /// that may retry does not copy the arguments before each attempt (their `Clone`, and the
    /// copy's drop, were about a seventh of a first call on the in-memory store); a retry reads
    /// its own arguments back from the intent instead, and runs only if they write the same
    /// intent again. A tool that reconciles keeps its copy for the check. `#[tool]` sets it when
    /// every parameter is a `String`, `bool`, `char`, an integer, `()`, or an `Option`, `Vec` or
    /// `BTreeMap<String, _>` of these, and none is skipped. Default `false`.
    const ARGS_FROM_INTENT: bool = false;

    /// Runs one attempt. Called by the executor only, after a successful claim.
    fn run(
        &self,
        cx: &Ctx,
        args: Self::Args,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send;

    /// Whether [`Tool::reconcile`] asks the target system (`#[tool(reconcile = check)]`). When it
    /// does, the executor consults it before answering [`crate::Error::OutcomeUnknown`], and
    /// takes over a dead owner's expired lease of a `never` tool to ask it
    /// (`docs/design.md` §3.1). Default `false`.
    fn reconciles(&self) -> bool {
        false
    }

    /// Asks the target system whether the intent of `key` with `args` took effect. Called by the
    /// executor only, while the caller holds the key's fence, and only when
    /// [`Tool::reconciles`]. Default: [`Reconciled::Unknown`].
    fn reconcile(
        &self,
        key: &Key,
        args: &Self::Args,
    ) -> impl Future<Output = Reconciled<Self::Output>> + Send {
        let _ = (key, args);
        std::future::ready(Reconciled::Unknown)
    }
}

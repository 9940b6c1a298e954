//! # idem: tool calls that are safe to retry
//!
//! Agents retry at every layer: the HTTP client inside a tool, the framework, and the model
//! re-calling a tool that timed out. idem gives every tool call an idempotency key derived from its
//! intent (scope, stable tool name, arguments in JCS (RFC 8785) with exact integers, SHA-256),
//! claims that key atomically before the work, stores the outcome and replays it for every repeat,
//! makes concurrent duplicates wait for the first result, and lets each tool declare how it may be
//! retried with `#[tool(retry = "safe" | "keyed" | "never")]`.
//!
//! See `README.md` for a tour and `docs/key-spec.md` for the key derivation.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod budget;
mod canonical;
mod class;
mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
mod ctx;
mod doc_text;
mod error;
mod executor;
mod failure;
mod flat_args;
mod flight;
pub mod json_text;
pub mod key;
pub mod limits;
mod macro_checks;
mod macro_support;
pub mod metrics;
mod policy;
mod printable;
mod reconcile;
pub mod store;
mod sync;
mod tokio_ready;
mod tool;
pub mod toolset;

pub use budget::RetryBudget;
pub use class::{RetryClass, UnknownRetryClass};
pub use clock::FOREVER;
pub use ctx::Ctx;
pub use error::{BudgetKind, Chain as ErrorChain, Error, ErrorKind};
pub use executor::{CallReport, Idem, IdemBuilder, Run, Served, StopSignal, WaitHook};
pub use failure::{Classify, Failure, FailureKind, NoError, ToolFailure};
pub use key::{Fingerprint, Key, KeyError, Scope, canonicalize, to_canonical_string};
pub use limits::MAX_DEPTH;
pub use policy::{Backoff, MIN_LEASE, MIN_TTL, Policy, ToolOptions};
pub use printable::{printable, printable_json, printable_lines, shortened};
pub use reconcile::Reconciled;
#[cfg(feature = "postgres")]
pub use store::PostgresStore;
#[cfg(feature = "redis")]
pub use store::RedisStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::{MemoryStore, Store, StoreError};
pub use tool::{Tool, ToolDef};
pub use toolset::{Annotations, DynTool, ToolDefinition, ToolResult, ToolSet, ToolSetError};

/// Declares an async fn as a tool: `#[tool(retry = "safe" | "keyed" | "never")]`.
pub use idem_macros::tool;

/// Collects the `#[tool]` methods of an `impl` block into `fn tool_set(self: &Arc<Self>) -> ToolSet`.
pub use idem_macros::tool_set;

/// What generated code needs; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use schemars;
    pub use serde;
    pub use serde_json;

    pub use crate::doc_text::DocText;
    pub use crate::flat_args::Flat;
    pub use crate::macro_support::*;

    /// The checks `#[tool]` emits at the user's types.
    pub mod checks {
        pub use crate::macro_checks::*;
    }
}

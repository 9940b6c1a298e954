//! The executor: claim → run → complete, row by row of the table in `docs/design.md` §3.
//!
//! - this module: the runtime ([`Idem`]) and its builder;
//! - `run`: the handle a caller holds ([`Run`]) and the entry of every call;
//! - `call`: one call in progress, the in-process single flight, replay;
//! - `lease`: claiming the key, waiting for another owner, renewing and releasing;
//! - `attempts`: the attempt loop and the decision after each failed attempt;
//! - `caught`: the user's code around the body (serde, `Classify`), a panic there an error.

mod attempts;
mod call;
mod caught;
mod lease;
mod names;
mod reconcile;
mod report;
mod run;
mod stop;
mod storable;
mod store_later;

use std::sync::{Arc, Mutex};

use rand::SeedableRng;
use rand::rngs::SmallRng;

pub use report::{CallReport, Served, WaitHook};
pub use run::Run;
pub use stop::StopSignal;

pub(crate) use caught::panic_message;
pub(crate) use storable::storable;

use crate::budget::RetryBudget;
use crate::class::RetryClass;
use crate::flight::Flights;
use crate::key::Scope;
use crate::policy::{Policy, ToolOptions};
use crate::store::{MemoryStore, Store};

/// The runtime: a store, a default policy, a shared retry budget and the in-process single
/// flight. Cheap to clone (one `Arc`); share one per process.
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    /// `store.is_local()`, read once.
    local_store: bool,
    /// `store.uses_tokio_io()`, read once.
    store_io: bool,
    /// The store, when it is a [`MemoryStore`]: claimed and completed directly, without the
    /// boxed futures of the `Store` trait and without copying the outcome into the record.
    memory: Option<Arc<MemoryStore>>,
    policy: Policy,
    /// `policy` with no tool options, for a safe, a keyed and a never tool: what most calls use,
    /// worked out once.
    class_policies: [Policy; 3],
    budget: Arc<RetryBudget>,
    flights: Flights,
    rng: Mutex<SmallRng>,
    safe_fail_open: bool,
    /// Completions the store refused, being sent again in the background (`store_later.rs`).
    late: Arc<store_later::LateCompletions>,
    /// The declaration that holds each tool name (`names.rs`).
    names: names::Names,
}

impl Inner {
    /// The policy of a call of a tool of `class` without options of its own, worked out once;
    /// `None` when `options` has some (see [`Policy::with_options`]).
    #[inline]
    fn class_policy(&self, class: RetryClass, options: &ToolOptions) -> Option<&Policy> {
        if *options != ToolOptions::NONE {
            return None;
        }
        let i = match class {
            RetryClass::Safe => 0,
            RetryClass::Keyed => 1,
            RetryClass::Never => 2,
        };
        Some(&self.class_policies[i])
    }
}

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem").field("policy", &self.inner.policy).finish_non_exhaustive()
    }
}

/// Builds an [`Idem`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct IdemBuilder {
    store: Arc<dyn Store>,
    policy: Policy,
    budget: Option<Arc<RetryBudget>>,
    seed: Option<u64>,
    safe_fail_open: bool,
}

impl IdemBuilder {
    /// The default policy for every tool; a tool's own options override it.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }
    /// A retry budget, possibly shared with other executors. Default: a new
    /// `RetryBudget::default()`.
    pub fn retry_budget(mut self, budget: Arc<RetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }
    /// Seeds the jitter's random numbers, for reproducible tests. Default: seeded by the OS.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// Lets `safe` tools with caching on run when the store is unavailable (fail open). Keyed and
    /// never tools always fail closed. Default off.
    pub fn safe_fail_open(mut self, on: bool) -> Self {
        self.safe_fail_open = on;
        self
    }
    /// The executor.
    pub fn build(self) -> Idem {
        let rng = match self.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        Idem {
            inner: Arc::new(Inner {
                local_store: self.store.is_local(),
                store_io: self.store.uses_tokio_io(),
                memory: (Arc::clone(&self.store) as Arc<dyn std::any::Any + Send + Sync>)
                    .downcast::<MemoryStore>()
                    .ok(),
                store: self.store,
                class_policies: [RetryClass::Safe, RetryClass::Keyed, RetryClass::Never]
                    .map(|class| self.policy.with_options(class, &ToolOptions::NONE)),
                policy: self.policy,
                budget: self.budget.unwrap_or_default(),
                flights: Flights::default(),
                names: names::Names::new(),
                rng: Mutex::new(rng),
                safe_fail_open: self.safe_fail_open,
                late: Arc::default(),
            }),
        }
    }
}

impl Idem {
    /// An executor on a new [`MemoryStore`] with the default policy.
    pub fn in_memory() -> Idem {
        Idem::builder(MemoryStore::new()).build()
    }
    /// An executor on `store` with the default policy.
    pub fn new(store: impl Store) -> Idem {
        Idem::builder(store).build()
    }
    /// A builder on `store`.
    pub fn builder(store: impl Store) -> IdemBuilder {
        Idem::builder_shared(Arc::new(store))
    }
    /// A builder on a store shared with others.
    pub fn builder_shared(store: Arc<dyn Store>) -> IdemBuilder {
        IdemBuilder {
            store,
            policy: Policy::default(),
            budget: None,
            seed: None,
            safe_fail_open: false,
        }
    }
    /// The handle through which tools are called in one run: the run id is part of every key.
    ///
    /// An empty (or blank) run id is one run shared by every caller that passes it: the same
    /// arguments in two conversations are then one intent, and the second is replayed, not run
    /// (a fallback like `conversation_id.unwrap_or_default()` does this). It is allowed, for
    /// work that is one intent wherever it comes from, and logged as a warning; the MCP and rig
    /// front doors refuse an empty run id.
    pub fn run(&self, run_id: impl Into<String>) -> Run {
        self.scope(Scope::run(run_id))
    }
    /// The handle for a full scope (tenant and run). An empty or blank run id is logged as
    /// [`Idem::run`] says.
    pub fn scope(&self, scope: Scope) -> Run {
        // Blank: nothing but white space and invisible format characters (a zero-width space).
        let blank = |c: char| {
            c.is_whitespace() || matches!(c, '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}')
        };
        if scope.run_id().chars().all(blank) {
            tracing::warn!(
                run_id = %scope.run_id().escape_debug(),
                "a run with an empty id: every caller that passes one shares it, so the same \
                 call from two conversations is replayed instead of run; pass the \
                 conversation's id"
            );
        }
        Run::new(self.clone(), scope)
    }
    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }
    /// The shared retry budget.
    pub fn retry_budget(&self) -> &Arc<RetryBudget> {
        &self.inner.budget
    }
    /// The default policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }
    /// How many outcomes are being sent to the store again in the background: the store refused
    /// them as unavailable when their tools finished (the callers had their results), and they
    /// are re-sent with full-jitter pauses from 100 ms to 5 s for up to 10 minutes, until one
    /// lands or another owner has taken the key over (`docs/design.md` §6.3).
    pub fn late_completions(&self) -> usize {
        self.inner.late.pending()
    }
    /// Waits until no late completion is pending (each landed or gave up), at most `max`;
    /// returns how many still are. A process about to exit calls it first: one dropped with the
    /// runtime leaves its record in flight until the lease ends (then a `keyed` repeat runs the
    /// tool again, with the same key, and a `never` repeat answers `OutcomeUnknown`).
    pub async fn late_completions_settled(&self, max: std::time::Duration) -> usize {
        self.inner.late.settled(max).await
    }
}

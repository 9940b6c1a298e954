//! The handle a caller holds for one run, and the entry of every protected call: derive the key,
//! open the trace span, hand over to [`Call`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use tokio::time::Instant;
use tracing::Instrument;
use tracing::field::Empty;

use super::Idem;
use super::call::Call;
use super::report::{CallReport, Served, ServedSlot, WaitHook};
use super::stop::StopSignal;
use crate::class::RetryClass;
use crate::clock::later;
use crate::error::Error;
use crate::key::{self, Fingerprint, KeyError, Scope};
use crate::tool::Tool;

/// A run: the scope of keys, and how tools are called. Cheap to clone.
///
/// ```
/// # use idem_core::Idem;
/// let idem = Idem::in_memory();
/// let run = idem.run("conversation-42");
/// // charge_card(&run, "cus_1".into(), 4900).await  -- a #[tool] fn takes the run first
/// ```
#[derive(Clone, Debug)]
pub struct Run {
    idem: Idem,
    scope: Arc<Scope>,
    caller_key: Option<Arc<str>>,
    call_id: Option<Arc<str>>,
    on_wait: Option<WaitHook>,
    stop: Option<StopSignal>,
}

impl Run {
    pub(super) fn new(idem: Idem, scope: Scope) -> Run {
        Run {
            idem,
            scope: Arc::new(scope),
            caller_key: None,
            call_id: None,
            on_wait: None,
            stop: None,
        }
    }
    /// The scope of this run's keys.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
    /// The executor.
    pub fn idem(&self) -> &Idem {
        &self.idem
    }
    /// The same run, but the next calls use `key` (the caller's own idempotency key) instead of
    /// a key derived from the arguments. A fingerprint of the arguments is stored with it, and a
    /// reuse with other arguments fails with [`Error::KeyReuseMismatch`].
    #[must_use = "the key applies only to the returned run, not to this one"]
    pub fn with_idempotency_key(&self, key: impl Into<Arc<str>>) -> Run {
        Run { caller_key: Some(key.into()), ..self.clone() }
    }
    /// The same run, with the agent's tool-call id (recorded as `gen_ai.tool.call.id`; not part
    /// of the key: the model invents a new one for every repeat).
    #[must_use = "the call id applies only to the returned run, not to this one"]
    pub fn with_call_id(&self, id: impl Into<Arc<str>>) -> Run {
        Run { call_id: Some(id.into()), ..self.clone() }
    }
    /// The same run (caller key, call id, wait hook) in another scope.
    pub fn in_scope(&self, scope: Scope) -> Run {
        Run { scope: Arc::new(scope), ..self.clone() }
    }
    /// The same run, with `hook` called each time one of its calls starts waiting for another
    /// owner of its key (for signs of life while it waits, such as MCP progress notifications;
    /// [`WaitHook::on_owner`] also hears when a call that waited runs the tool itself).
    pub fn with_wait_hook(&self, hook: WaitHook) -> Run {
        Run { on_wait: Some(hook), ..self.clone() }
    }
    /// The same run, whose calls start nothing more once `stop` is stopped (see [`StopSignal`]):
    /// an attempt already running finishes and its outcome is stored; no further attempt starts
    /// (not a retry, nor the first one of a call that waited for another owner); a key claimed
    /// with nothing run under it is released. Such a call ends with [`Error::Cancelled`], or
    /// [`Error::StoppedWaiting`] when it was waiting for another call with its key; one
    /// stopped before it started whose key has an outcome stored answers it, as any repeat does.
    /// Duplicates that joined it in this process are not stopped: one of them runs the call.
    pub fn with_stop(&self, stop: StopSignal) -> Run {
        Run { stop: Some(stop), ..self.clone() }
    }
    /// The caller-supplied idempotency key, if any.
    pub fn caller_key(&self) -> Option<&str> {
        self.caller_key.as_deref()
    }
    /// The agent's tool-call id set by [`with_call_id`](Self::with_call_id), if any.
    pub fn call_id(&self) -> Option<&str> {
        self.call_id.as_deref()
    }

    /// Calls `tool` with `args` through the protocol: derive the key, join an in-flight duplicate
    /// or claim, run with retries, store the outcome, replay it for repeats.
    ///
    /// Errors: the tool's own ([`Error::Tool`]) or any of idem's ([`Error`]). Arguments that
    /// cannot be canonicalised, nest deeper than [`crate::MAX_DEPTH`] or are larger than
    /// [`crate::Policy::max_argument_bytes`] are refused with [`Error::InvalidArguments`] before
    /// anything is claimed or run. Arguments refused for their depth are leaked, not dropped:
    /// dropping them would recurse as deep as they are (`docs/key-spec.md`, "Limits").
    pub fn call<T: Tool>(
        &self,
        tool: &T,
        args: T::Args,
    ) -> impl Future<Output = Result<T::Output, Error<T::Error>>> {
        // The call's own future, not one wrapped around it: the typed calls come this way.
        self.call_into(tool, args, None, false)
    }

    /// [`Run::call`], and what the call reports beside its result: its key and how it was served
    /// (executed, replayed, joined). The report is `None` when the arguments were refused before
    /// a key existed.
    pub async fn call_reported<T: Tool>(
        &self,
        tool: &T,
        args: T::Args,
    ) -> (Result<T::Output, Error<T::Error>>, Option<CallReport>) {
        self.call_reported_checked(tool, args, false).await
    }

    /// [`Run::call_reported`]; `checked`: the arguments were read from JSON by a
    /// [`crate::ToolSet`], which checked them for a key they would share with other arguments
    /// (`toolset/same_key.rs`) from the JSON the client sent, so that is not asked again from
    /// the key's text.
    pub(crate) async fn call_reported_checked<T: Tool>(
        &self,
        tool: &T,
        args: T::Args,
        checked: bool,
    ) -> (Result<T::Output, Error<T::Error>>, Option<CallReport>) {
        let mut report = None;
        let result = self.call_into(tool, args, Some(&mut report), checked).await;
        (result, report)
    }

    /// [`Run::call`], writing the call's report into `report` if given.
    async fn call_into<T: Tool>(
        &self,
        tool: &T,
        args: T::Args,
        report: Option<&mut Option<CallReport>>,
        checked: bool,
    ) -> Result<T::Output, Error<T::Error>> {
        let def = tool.def();
        let inner = &self.idem.inner;
        let declared = (tool.declared_at(), tool.declared_on());
        if let Err(holder) = inner.names.check(def, declared) {
            crate::metrics::call(def.name, def.class.as_str(), "failed");
            let (declared_at, held_by) =
                (super::names::shown(declared), super::names::shown(holder));
            return Err(Error::NameTaken { tool: def.name, declared_at, held_by });
        }
        // Lent by the executor unless the tool has options of its own: no copy per call.
        let with_options;
        let policy = match inner.class_policy(def.class, &def.options) {
            Some(policy) => policy,
            None => {
                with_options = inner.policy.with_options(def.class, &def.options);
                &with_options
            }
        };
        if let Some(why) = refused_policy(policy, def.class) {
            crate::metrics::call(def.name, def.class.as_str(), "failed");
            let source = crate::store::StoreError::InvalidConfig(why.into());
            return Err(Error::StoreUnavailable { tool: def.name, source });
        }
        let mut canonical = Vec::with_capacity(256);
        // The arguments' `Serialize` is the caller's code: its panic refuses the call (nothing
        // is claimed yet) as any other failure to write the intent does.
        let written = super::caught::caught(|| T::write_intent(&args, &mut canonical))
            .unwrap_or_else(|message| {
                Err(KeyError::Custom(format!("their `Serialize` panicked: {message}")))
            })
            .and_then(|()| {
                // Two arguments the tool tells apart written alike: the second would be answered
                // with the first's outcome (`docs/key-spec.md`, `Some(None)` and whole floats).
                // What another walk on this thread left unread only asks once more: the check
                // reads these arguments, and refuses only what they hold.
                let seen = crate::canonical::take_seen();
                if checked || (seen.some_nulls == 0 && !seen.whole_floats) {
                    return Ok(());
                }
                super::caught::caught(|| {
                    crate::toolset::same_key::typed_call::<T>(def.name, &args, &canonical, seen)
                })
                .unwrap_or(None)
                .map_or(Ok(()), Err)
            });
        if let Err(source) = written {
            if matches!(source, KeyError::TooDeep { .. }) {
                std::mem::forget(args);
            }
            crate::metrics::call(def.name, def.class.as_str(), "failed");
            return Err(Error::InvalidArguments { tool: def.name, source });
        }
        if canonical.len() > policy.max_argument_bytes {
            crate::metrics::call(def.name, def.class.as_str(), "failed");
            let source =
                KeyError::TooLarge { size: canonical.len(), limit: policy.max_argument_bytes };
            return Err(Error::InvalidArguments { tool: def.name, source });
        }
        let caller_key = self.caller_key.as_deref();
        // Only white space is as empty (a header of spaces, a template left unset).
        if caller_key.is_some_and(|key| key.trim().is_empty()) {
            crate::metrics::call(def.name, def.class.as_str(), "failed");
            return Err(Error::InvalidArguments {
                tool: def.name,
                source: KeyError::EmptyIdempotencyKey,
            });
        }
        let (key, digest) = key::key_and_digest(&self.scope, def.name, &canonical, caller_key);
        let fingerprint = match caller_key {
            Some(_) => key::fingerprint(&canonical),
            None => Fingerprint::of_derived_key(&key),
        };
        let span = tracing::info_span!(
            "execute_tool",
            otel.name = Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = def.name,
            gen_ai.tool.call.id = self.call_id.as_deref(),
            idem.key = Empty,
            idem.class = def.class.as_str(),
            idem.attempt = Empty,
            idem.outcome = Empty,
            error.type = Empty,
        );
        if !span.is_disabled() {
            span.record("otel.name", format!("execute_tool {}", def.name));
            span.record("idem.key", key.as_str());
        }
        let started = Instant::now();
        let call = Call {
            inner,
            tool,
            key,
            digest,
            fingerprint,
            intent: &canonical,
            scope: &self.scope,
            policy,
            started,
            deadline: later(started, policy.deadline),
            span: span.clone(),
            served: ServedSlot::default(),
            on_wait: self.on_wait.as_ref(),
            stop: self.stop.as_ref(),
            caller_key: self.caller_key.as_ref(),
            waited: AtomicBool::new(false),
            confirmed: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        };
        // Without a subscriber the span does nothing: the call's future is not wrapped (nor moved
        // into the wrapper) for it.
        let result = if !span.is_disabled() {
            call.execute(args).instrument(span.clone()).await
        } else {
            call.execute(args).await
        };
        if let Err(e) = &result {
            span.record("error.type", e.kind().as_str());
        }
        let served = call.served.get();
        crate::metrics::call(def.name, def.class.as_str(), outcome_label(&result, served));
        if let Some(report) = report {
            let scope = Arc::clone(&self.scope);
            let output_checked = call.served.output_checked();
            *report = Some(CallReport { scope, key, served, output_checked });
        }
        result
    }
}

/// Why a call under `policy` is refused before anything runs, if it is: a zero where
/// `#[tool(..)]` does not compile one, and which zero often means "no limit" elsewhere.
fn refused_policy(policy: &crate::policy::Policy, class: RetryClass) -> Option<&'static str> {
    if policy.attempt_timeout.is_zero() {
        // Every attempt would time out the moment it starts, after its body's first poll (a
        // request under way): a never tool's outcome would be unknown for good.
        return Some(
            "Policy::attempt_timeout is zero, so every attempt would time out the moment it \
             starts; nothing was run. Set a positive timeout (`Duration::MAX` for no limit but \
             the call's deadline)",
        );
    }
    let uses_store = class != RetryClass::Safe || policy.cache_safe;
    if uses_store && policy.ttl < crate::policy::MIN_TTL {
        // A result kept for a moment is not replayed: every repeat of a never tool's call would
        // run its effect again.
        return Some(
            "Policy::ttl is under 1 s (idem_core::MIN_TTL), so a result would expire before the \
             repeats it is kept for and each would run the tool again; nothing was run. Set a \
             retention of at least 1 s (`Duration::MAX` keeps results for good)",
        );
    }
    None
}

/// The `outcome` label of `idem_calls_total` (`crate::metrics`): how a call that returned the
/// tool's output was served; `replayed` or `joined` for a stored or shared failure; `unknown`
/// for `OutcomeUnknown`; `failed` for any other error.
fn outcome_label<O, E>(result: &Result<O, Error<E>>, served: Option<Served>) -> &'static str {
    match (result, served) {
        (Err(Error::OutcomeUnknown { .. }), _) => "unknown",
        (Ok(_), Some(served)) => served.as_str(),
        (Ok(_), None) => "executed",
        (Err(_), Some(served @ (Served::Replayed | Served::Joined))) => served.as_str(),
        (Err(_), _) => "failed",
    }
}

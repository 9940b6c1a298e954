//! An idem [`ToolSet`] bound to a [`Run`], as rig [`DynamicTool`]s.

use std::sync::Arc;

use idem_core::toolset::Arguments;
use idem_core::{ErrorKind, Run, Scope, Tool, ToolResult, ToolSet, ToolSetError};
use rig_core::message::ToolName;
use rig_core::tool::{
    ContextValue, DynamicTool, ToolContext, ToolErrorKind, ToolExecutionError, ToolOutput,
};
use rig_core::wasm_compat::WasmBoxedFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::result::to_rig;

/// The run a rig agent's tool calls belong to, for one prompt: put it in the prompt's
/// [`ToolContext`] (`agent.prompt(..).tool_context(cx)`) to scope that conversation's keys
/// without building the tools again. A string with more than white space; the tenant of the
/// bound run is kept.
/// Without it, the run the tools were bound to applies.
///
/// Its slot is `idem/run`, the name MCP requests use in `_meta` for the same thing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunId(pub String);

impl ContextValue for RunId {
    const KEY: &'static str = idem_core::toolset::MCP_META_RUN;
}

/// How idem served one rig tool call: published in the call's result context (rig's host-only
/// result metadata, [`ToolContext::insert_result`]; an agent hook reads it from
/// `OutcomeEvent::context`, a registry's caller from the context it passed), never shown to the
/// model. The same facts an MCP result carries in `_meta` (`idem/run`, `idem/key`,
/// `idem/outcome`), so an operator can tell a replayed charge from a new one.
///
/// Published once the arguments were accepted; a call refused before that (unknown tool,
/// malformed arguments, an invalid [`RunId`]) publishes none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemReport {
    /// The run the key was derived in.
    pub run: String,
    /// The idempotency key, 64 hex digits (SHA-256).
    pub key: String,
    /// How the call was served: `executed`, `replayed`, `joined`, `taken_over`, `reconciled` or
    /// `unknown` ([`idem_core::Served::as_str`]); `None` when the call failed before that was
    /// decided (the store unavailable, a caller key reused with other arguments).
    pub outcome: Option<String>,
}

impl ContextValue for IdemReport {
    const KEY: &'static str = "idem/report";
}

/// An idem tool set bound to a run, handed to rig as one [`DynamicTool`] per tool.
///
/// Each rig tool's call goes through the idem protocol under the run (or the prompt's
/// [`RunId`]): the key is derived from the run, the tool's name and the arguments, so a model
/// that calls `charge_card` again with the same arguments gets the stored charge replayed
/// instead of a second charge. What rig sees of each tool is idem's definition: the name, the
/// description (the tool fn's doc comment) and the JSON Schema of the arguments.
///
/// ```
/// # use idem_core::{Idem, ToolSet};
/// # use idem_rig::RigToolSet;
/// # fn demo(tools: ToolSet) {
/// let idem = Idem::in_memory();
/// let tools = RigToolSet::new(tools, idem.run("conversation-42"));
/// let rig_tools = tools.dynamic_tools(); // for rig-agent's `AgentBuilder::dynamic_tools`
/// # let _ = rig_tools;
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RigToolSet {
    tools: Arc<ToolSet>,
    run: Run,
    /// The calls' tasks, shared by clones and by the rig tools made from them.
    calls: TaskTracker,
}

impl RigToolSet {
    /// `tools`, every call of which runs in `run`.
    pub fn new(tools: ToolSet, run: Run) -> Self {
        RigToolSet { tools: Arc::new(tools), run, calls: TaskTracker::new() }
    }

    /// Waits until every call started through these tools (or a clone of them, or a rig tool
    /// made from them) has finished and its outcome is stored. A call runs in a task of its own,
    /// so that a host that stops waiting for it (a timeout around the prompt, a web request
    /// whose client went away: the agent's future is dropped) does not cut an attempt off
    /// halfway, leaving its claim to the lease and its repeat to run the tool again: a process
    /// that exits must wait for this first, or the runtime drops the calls mid-effect. Then
    /// [`Idem::late_completions_settled`](idem_core::Idem::late_completions_settled) waits for
    /// outcomes the store refused when their tools finished.
    pub async fn calls_finished(&self) {
        // A closed tracker still takes new calls; closing only lets `wait` end once it is empty.
        self.calls.close();
        self.calls.wait().await;
    }

    /// How many calls started through these tools are still running.
    pub fn calls_running(&self) -> usize {
        self.calls.len()
    }

    /// One idem tool alone. Errors: [`ToolSetError`] (an invalid name, arguments that are not
    /// a JSON object).
    pub fn single(tool: impl Tool, run: Run) -> Result<Self, ToolSetError> {
        Ok(RigToolSet::new(ToolSet::new().with(tool)?, run))
    }

    /// The idem tool set.
    pub fn tool_set(&self) -> &ToolSet {
        &self.tools
    }

    /// The run calls belong to when the prompt names none.
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// Every tool as a rig [`DynamicTool`], sorted by name.
    pub fn dynamic_tools(&self) -> Vec<DynamicTool> {
        self.tools.definitions().filter_map(|def| self.dynamic_tool(def.name)).collect()
    }

    /// The tool `name` as a rig [`DynamicTool`], if it is in the set.
    pub fn dynamic_tool(&self, name: &str) -> Option<DynamicTool> {
        let def = self.tools.definition(name)?;
        // idem tool names are never empty (`ToolSet` checks them), so this never drops a tool.
        let rig_name = ToolName::new(def.name).ok()?;
        let parameters = Value::Object(def.input_schema.clone());
        let tools = Arc::clone(&self.tools);
        let run = self.run.clone();
        let calls = self.calls.clone();
        let name: &'static str = def.name;
        Some(DynamicTool::new_with_context(
            rig_name,
            def.description,
            parameters,
            move |cx: &mut ToolContext, args: Value| -> WasmBoxedFuture<'_, _> {
                // Resolved before the future so it borrows nothing from the context.
                let run = run_for(&run, cx);
                let tools = Arc::clone(&tools);
                let calls = calls.clone();
                Box::pin(async move { call(tools, &calls, run?, name, args, cx).await })
            },
        ))
    }
}

/// Calls `name` through idem, publishes how it was served in `cx`, and turns the result into
/// rig's terms.
async fn call(
    tools: Arc<ToolSet>,
    calls: &TaskTracker,
    run: Run,
    name: &'static str,
    args: Value,
    cx: &mut ToolContext,
) -> Result<ToolOutput, ToolExecutionError> {
    let call = async move {
        // rig hands over parsed JSON; `null` (no arguments) means `{}` as in the OpenAI format.
        let args = match &args {
            Value::Null => Arguments::Absent,
            other => Arguments::Json(other),
        };
        tools.call_args(&run, name, args).await
    };
    // In a task of its own: if the host drops this future (it stopped waiting), the attempt
    // still finishes and its outcome is stored, so the repeat is answered from it. Outside a
    // tokio runtime there is no task to run it in, and it runs here.
    let result = match tokio::runtime::Handle::try_current() {
        Ok(_) => calls.spawn(call.instrument(tracing::Span::current())).await.unwrap_or_else(|e| {
            let why = format!(
                "the task running `{name}` ended without a result ({e}); an outcome it reached is stored, and a repeat gets it"
            );
            ToolResult::error(ErrorKind::Internal, why, None)
        }),
        Err(_) => call.await,
    };
    if let Some(report) = &result.report {
        let report = IdemReport {
            run: report.scope.run_id().to_owned(),
            key: report.key.as_str().to_owned(),
            outcome: report.served.map(|s| s.as_str().to_owned()),
        };
        // Strings always encode as JSON: this cannot fail, and the call's answer does not
        // depend on it.
        let _ = cx.insert_result(report);
    }
    to_rig(result)
}

/// The run of this call: the prompt's [`RunId`] in the bound run's tenant, or the bound run.
fn run_for(bound: &Run, cx: &ToolContext) -> Result<Run, ToolExecutionError> {
    match cx.get::<RunId>() {
        Ok(None) => Ok(bound.clone()),
        // Only white space is as empty: a template left unset would put every prompt that
        // sends it in one run, answered with one another's outcomes.
        Ok(Some(RunId(id))) if !id.trim().is_empty() => {
            // The bound run in another scope: its caller key, call id and wait hook stay.
            Ok(bound.in_scope(Scope::run(id).with_tenant(bound.scope().tenant())))
        }
        Ok(Some(_)) => Err(context_error("it is empty or only white space".to_owned())),
        Err(e) => Err(context_error(e.to_string())),
    }
}

fn context_error(why: String) -> ToolExecutionError {
    ToolExecutionError::new(
        ToolErrorKind::Other,
        format!(
            "Error (invalid_run): the tool context's `{}` must be a string with more than white space ({why}); nothing was executed",
            RunId::KEY
        ),
    )
    .with_code("invalid_run")
    .with_retryable(false)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem_core::{Classify, Failure, Idem, WaitHook};
    use tokio::sync::Semaphore;

    use super::*;

    #[derive(Debug, Serialize, Deserialize, thiserror::Error)]
    #[error("declined")]
    struct Declined;

    impl Classify for Declined {
        fn classify(&self) -> Failure {
            Failure::permanent()
        }
    }

    static GATE: Semaphore = Semaphore::const_new(0);

    #[idem_core::tool(retry = "keyed")]
    async fn gated(n: u32) -> Result<u32, Declined> {
        GATE.acquire().await.map_err(|_| Declined)?.forget();
        Ok(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_duplicate_in_a_prompts_run_calls_the_bound_runs_wait_hook() {
        let waits = Arc::new(AtomicU32::new(0));
        let bound = Idem::in_memory().run("default").with_wait_hook(WaitHook::new({
            let waits = Arc::clone(&waits);
            move |_| {
                waits.fetch_add(1, Ordering::SeqCst);
            }
        }));
        let mut cx = ToolContext::new();
        cx.insert(RunId("conv-b".into())).unwrap();
        let run = run_for(&bound, &cx).unwrap();
        let first = tokio::spawn({
            let run = run.clone();
            async move { gated(&run, 7).await }
        });
        tokio::task::yield_now().await;
        let second = tokio::spawn(async move { gated(&run, 7).await });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        GATE.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap(), 7);
        assert_eq!(second.await.unwrap().unwrap(), 7);
        assert_eq!(waits.load(Ordering::SeqCst), 1, "the duplicate's wait reached the hook");
    }

    static BOOKINGS: AtomicU32 = AtomicU32::new(0);
    static DESK: Semaphore = Semaphore::const_new(0);

    /// Book a room; the hotel answers when the desk lets it.
    #[idem_core::tool(retry = "keyed", lease = "300ms")]
    async fn book(room: u32) -> Result<u32, Declined> {
        BOOKINGS.fetch_add(1, Ordering::SeqCst);
        DESK.acquire().await.map_err(|_| Declined)?.forget();
        Ok(room)
    }

    /// A host that stops waiting for a call (a timeout around the prompt, a web request whose
    /// client went away: the agent's future is dropped) does not cut the call off in the middle
    /// of its attempt: it finishes and its outcome is stored, so the repeat gets it. Before, the
    /// attempt was dropped with the future, its claim was left to its lease, and the repeat ran
    /// the booking a second time.
    #[tokio::test]
    async fn a_call_the_host_stops_waiting_for_finishes_and_its_repeat_gets_its_outcome() {
        let tools = RigToolSet::single(BookTool, Idem::in_memory().run("conv-1")).unwrap();
        let tool = tools.dynamic_tool("book").unwrap();
        let first = tokio::spawn({
            let tool = tool.clone();
            async move { tool.execute(serde_json::json!({"room": 7})).await }
        });
        while BOOKINGS.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        DESK.add_permits(1);

        let mut cx = ToolContext::new();
        let again = tool.execute_with(&mut cx, serde_json::json!({"room": 7})).await.unwrap();
        assert_eq!(again.as_json(), Some(&serde_json::json!(7)));
        assert_eq!(BOOKINGS.load(Ordering::SeqCst), 1, "one booking");
        let report = cx.result::<IdemReport>().unwrap().expect("a report");
        let outcome = report.outcome.as_deref().unwrap_or_default();
        assert!(["replayed", "joined"].contains(&outcome), "{report:?}");
        tools.calls_finished().await;
    }

    static STOCK_READS: AtomicU32 = AtomicU32::new(0);

    /// Read a shelf's stock.
    #[idem_core::tool(retry = "keyed")]
    async fn stock(shelf: u32) -> Result<std::collections::HashMap<String, u32>, Declined> {
        STOCK_READS.fetch_add(1, Ordering::SeqCst);
        Ok((0..32).map(|i| (format!("item{i:02}"), shelf + i)).collect())
    }

    /// A replay decodes the output again, and a `HashMap` comes back in another order; with
    /// rig-core's `preserve_order` the model would read another text on a repeat.
    #[tokio::test]
    async fn a_replay_gives_the_model_the_text_of_its_first_call() {
        let tools = RigToolSet::single(StockTool, Idem::in_memory().run("conv-2")).unwrap();
        let tool = tools.dynamic_tool("stock").unwrap();
        let first = tool.execute(serde_json::json!({"shelf": 100})).await.unwrap();
        let again = tool.execute(serde_json::json!({"shelf": 100})).await.unwrap();
        assert_eq!(STOCK_READS.load(Ordering::SeqCst), 1, "one read");
        let text = |out: &rig_core::tool::ToolOutput| serde_json::to_string(out.as_json().unwrap());
        assert_eq!(text(&again).unwrap(), text(&first).unwrap());
        assert!(text(&first).unwrap().starts_with(r#"{"item00":100,"item01":101,"#));
    }

    #[test]
    fn a_prompts_run_keeps_the_bound_runs_key_call_id_and_wait_hook() {
        let bound = Idem::in_memory()
            .run("default")
            .with_idempotency_key("key-1")
            .with_call_id("call-1")
            .with_wait_hook(WaitHook::new(|_| {}));
        let mut cx = ToolContext::new();
        cx.insert(RunId("conv-a".into())).unwrap();
        let run = run_for(&bound, &cx).unwrap();
        assert_eq!(run.scope().run_id(), "conv-a");
        assert_eq!(run.caller_key(), Some("key-1"));
        assert_eq!(run.call_id(), Some("call-1"));
        // The wait hook has no accessor: the test above shows it is reached in a prompt's run.
    }

    #[test]
    fn a_run_id_of_only_white_space_is_refused() {
        let bound = Idem::in_memory().run("default");
        for id in ["", " ", "\t\n"] {
            let mut cx = ToolContext::new();
            cx.insert(RunId(id.into())).unwrap();
            let e = run_for(&bound, &cx).unwrap_err();
            assert_eq!(e.code(), Some("invalid_run"), "{id:?}");
            let said = e.model_feedback().unwrap_or_default();
            assert!(said.contains("empty or only white space"), "{said}");
        }
    }
}

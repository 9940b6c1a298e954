//! Agent-facing tool sets (DESIGN §7): list tool definitions for a model and dispatch the calls
//! a model makes, by name with JSON arguments, always through the idem protocol.
//!
//! A [`ToolSet`] holds heterogeneous tools behind the object-safe [`DynTool`] adapter. It speaks
//! the shapes agents produce:
//!
//! | format | definitions | call in | result out |
//! |---|---|---|---|
//! | OpenAI chat | [`ToolSet::openai_tools`] | `tool_calls[i]`: `{"id","type":"function","function":{"name","arguments":"<JSON text>"}}` | `{"role":"tool","tool_call_id","content"}` |
//! | Anthropic messages | [`ToolSet::anthropic_tools`] | `tool_use` block: `{"type":"tool_use","id","name","input":{..}}` | `{"type":"tool_result","tool_use_id","content","is_error"}` |
//! | MCP `tools/call` | [`ToolSet::mcp_tools`] | params: `{"name","arguments","_meta"}` | `CallToolResult`: `{"content":[{"type":"text","text"}],"isError"}` |
//!
//! Everything a model can cause comes back as a [`ToolResult`] it can read, never a panic:
//! unknown tool, malformed or ill-typed arguments (naming the field), NaN, a caller key reused
//! with other arguments, store unavailable, budget exhausted, and outcome unknown, whose text says
//! that the action may have happened, must not be repeated, and what to check.
//!
//! The key scope is the [`Run`] given to each call. The tool-call id a model invents (OpenAI
//! `id`, Anthropic `id`) is recorded for tracing only ([`Run::with_call_id`]) and is not part of
//! the key: a model that repeats a call sends a new id for the same intent.

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::class::RetryClass;
use crate::error::Error;
use crate::executor::Run;
use crate::key::{Key, Scope};
use crate::tool::{Tool, ToolDef};

/// The `_meta` key of an MCP `tools/call` request that names the run, i.e. the scope of the
/// key: `{"_meta": {"idem/run": "conversation-42"}}`. A non-empty string. Follows the `_meta`
/// naming rule of the MCP spec 2025-11-25 (`prefix/name`, the prefix `idem/` is ours). When it
/// is absent the server's default run applies (for `idem-mcp`: one run per MCP session).
pub const MCP_META_RUN: &str = "idem/run";

/// The `_meta` key of an MCP `tools/call` request that carries the caller's own idempotency key:
/// `{"_meta": {"idem/idempotencyKey": "order-17-charge"}}`. A non-empty string. The call then
/// goes through [`Run::with_idempotency_key`]: the fingerprint of the arguments is stored, and a
/// reuse with other arguments is refused (`key_reuse_mismatch`).
pub const MCP_META_IDEMPOTENCY_KEY: &str = "idem/idempotencyKey";

/// `error_kind` of a call to a tool that is not in the set.
pub const UNKNOWN_TOOL: &str = "unknown_tool";
/// `error_kind` of arguments that are not JSON, not an object, or do not fit the tool's types
/// (also NaN and infinities, which JSON cannot carry). Same spelling as
/// [`Error::InvalidArguments`]'s kind.
pub const INVALID_ARGUMENTS: &str = "invalid_arguments";
/// `error_kind` of a tool call whose envelope is malformed (no name, wrong shape).
pub const INVALID_TOOL_CALL: &str = "invalid_tool_call";
/// `error_kind` of an output that could not be turned into JSON after the tool ran.
pub const OUTPUT_NOT_JSON: &str = "output_not_json";

/// MCP tool annotations (MCP spec 2025-11-25, `ToolAnnotations`), derived from the retry class.
///
/// All are hints. The spec's defaults when absent: `readOnlyHint` false, `destructiveHint` true,
/// `idempotentHint` false, `openWorldHint` true; `destructiveHint` and `idempotentHint` are
/// meaningful only when `readOnlyHint` is false. The mapping:
///
/// | class | readOnlyHint | destructiveHint | idempotentHint | openWorldHint |
/// |---|---|---|---|---|
/// | `safe` | `true` | absent (meaningless) | absent (meaningless) | absent |
/// | `keyed` | `false` | absent (default true: the class does not say whether the effect destroys) | `true` | absent |
/// | `never` | `false` | `true` | `false` | absent |
///
/// `openWorldHint` is left absent: the class says how a tool may be retried, not whether it
/// talks to the outside world.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    /// The tool does not modify its environment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may perform destructive updates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling the tool again with the same arguments has no additional effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool interacts with an open world of external entities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

impl Annotations {
    /// The annotations of a tool of class `class` (see the table above).
    pub const fn for_class(class: RetryClass) -> Self {
        match class {
            RetryClass::Safe => Annotations {
                read_only_hint: Some(true),
                destructive_hint: None,
                idempotent_hint: None,
                open_world_hint: None,
            },
            RetryClass::Keyed => Annotations {
                read_only_hint: Some(false),
                destructive_hint: None,
                idempotent_hint: Some(true),
                open_world_hint: None,
            },
            RetryClass::Never => Annotations {
                read_only_hint: Some(false),
                destructive_hint: Some(true),
                idempotent_hint: Some(false),
                open_world_hint: None,
            },
        }
    }
}

/// What a model is told about one tool.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    /// The stable name (part of every key).
    pub name: &'static str,
    /// The description (the tool fn's doc comment).
    pub description: &'static str,
    /// The retry class.
    pub class: RetryClass,
    /// JSON Schema (2020-12, from schemars) of the arguments; always `"type": "object"`.
    pub input_schema: Map<String, Value>,
    /// The MCP annotations derived from the class.
    pub annotations: Annotations,
}

impl ToolDefinition {
    /// The MCP `Tool` object: `{"name","description","inputSchema","annotations"}`.
    pub fn to_mcp(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": self.annotations,
        })
    }
    /// An OpenAI chat `tools[i]` entry: `{"type":"function","function":{"name","description","parameters"}}`.
    pub fn to_openai(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        })
    }
    /// An Anthropic `tools[i]` entry: `{"name","description","input_schema"}`.
    pub fn to_anthropic(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        })
    }
}

/// The outcome of one dispatched call, typed for Rust callers and renderable for every format.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    /// On success the tool's output as JSON. On error
    /// `{"error": {"kind", "message", "detail"?}}`, where `detail` is the tool's own error as JSON
    /// (for `tool_error`) or `{"idempotency_key"}` (for `outcome_unknown`).
    pub content: Value,
    /// What the model reads: the output as compact JSON text (a string output as itself), or
    /// `Error (<kind>): <message>`.
    pub text: String,
    /// Whether the call failed (MCP `isError`, Anthropic `is_error`).
    pub is_error: bool,
    /// The stable kind of the failure: [`UNKNOWN_TOOL`], [`INVALID_ARGUMENTS`],
    /// [`INVALID_TOOL_CALL`], [`OUTPUT_NOT_JSON`] or one of [`Error::kind`]'s (`tool_error`,
    /// `outcome_unknown`, `key_reuse_mismatch`, `store_unavailable`, `budget_exhausted`,
    /// `timeout`, `lease_lost`, `replay_failed`). `None` on success.
    pub error_kind: Option<&'static str>,
}

impl ToolResult {
    /// A successful result carrying `output`.
    pub fn success(output: Value) -> Self {
        let text = match &output {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        ToolResult { content: output, text, is_error: false, error_kind: None }
    }

    /// A failed result of kind `kind` with the message the model reads and optional detail.
    pub fn error(kind: &'static str, message: impl Into<String>, detail: Option<Value>) -> Self {
        let message = message.into();
        let text = format!("Error ({kind}): {message}");
        let mut error = json!({ "kind": kind, "message": message });
        if let (Some(detail), Some(obj)) = (detail, error.as_object_mut()) {
            obj.insert("detail".into(), detail);
        }
        ToolResult {
            content: json!({ "error": error }),
            text,
            is_error: true,
            error_kind: Some(kind),
        }
    }

    /// MCP `CallToolResult` JSON (spec 2025-11-25): one text block with [`Self::text`],
    /// `isError`, and `structuredContent` when the output is a JSON object.
    pub fn to_mcp(&self) -> Value {
        let mut out = json!({
            "content": [{ "type": "text", "text": self.text }],
            "isError": self.is_error,
        });
        if !self.is_error
            && self.content.is_object()
            && let Some(obj) = out.as_object_mut()
        {
            obj.insert("structuredContent".into(), self.content.clone());
        }
        out
    }

    /// An OpenAI chat tool message: `{"role":"tool","tool_call_id","content"}`.
    pub fn to_openai_message(&self, tool_call_id: &str) -> Value {
        json!({ "role": "tool", "tool_call_id": tool_call_id, "content": self.text })
    }

    /// An Anthropic `tool_result` content block:
    /// `{"type":"tool_result","tool_use_id","content","is_error"}`.
    pub fn to_anthropic_block(&self, tool_use_id: &str) -> Value {
        json!({
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": self.text,
            "is_error": self.is_error,
        })
    }
}

/// A JSON-RPC error for an MCP `tools/call` that cannot be routed (MCP spec 2025-11-25, "Error
/// Handling": unknown tool and invalid `_meta` are protocol errors, code -32602).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} (JSON-RPC {code})")]
pub struct McpProtocolError {
    /// The JSON-RPC error code (-32602, invalid params).
    pub code: i64,
    /// The message.
    pub message: String,
}

impl McpProtocolError {
    /// JSON-RPC "Invalid params".
    pub const INVALID_PARAMS: i64 = -32602;

    fn invalid_params(message: impl Into<String>) -> Self {
        McpProtocolError { code: Self::INVALID_PARAMS, message: message.into() }
    }

    /// The JSON-RPC `error` object: `{"code","message"}`.
    pub fn to_json(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }
}

/// The arguments of one call as the model sent them.
#[derive(Clone, Copy, Debug)]
pub enum Arguments<'a> {
    /// Parsed JSON (Anthropic `input`, MCP `arguments`).
    Json(&'a Value),
    /// JSON text (OpenAI `function.arguments`). Empty or blank text means `{}`.
    Text(&'a str),
    /// None sent (MCP `arguments` is optional): `{}`.
    Absent,
}

/// What a dispatch knows about the set it belongs to (to tell the model what to check after an
/// unknown outcome). Built by [`ToolSet`].
#[derive(Clone, Debug, Default)]
pub struct DispatchContext {
    read_only: Vec<&'static str>,
}

/// An object-safe view of a [`Tool`], implemented for every `T: Tool`, so that one [`ToolSet`]
/// holds tools of different argument, output and error types.
pub trait DynTool: Send + Sync + 'static {
    /// The tool's definition.
    fn tool_def(&self) -> &'static ToolDef;
    /// The JSON Schema of the arguments (schemars, JSON Schema 2020-12).
    fn input_schema(&self) -> Value;
    /// Parses `args`, calls the tool through `run` (the idem protocol) and renders the outcome.
    /// Never panics on input: every failure is a [`ToolResult`] with `is_error`.
    fn dispatch<'a>(
        &'a self,
        run: &'a Run,
        args: Arguments<'a>,
        cx: &'a DispatchContext,
    ) -> BoxFuture<'a, ToolResult>;
}

impl<T: Tool> DynTool for T {
    fn tool_def(&self) -> &'static ToolDef {
        self.def()
    }

    fn input_schema(&self) -> Value {
        schemars::SchemaGenerator::default().into_root_schema_for::<T::Args>().to_value()
    }

    fn dispatch<'a>(
        &'a self,
        run: &'a Run,
        args: Arguments<'a>,
        cx: &'a DispatchContext,
    ) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let def = self.def();
            let args: T::Args = match parse_args(def.name, args) {
                Ok(args) => args,
                Err(message) => return ToolResult::error(INVALID_ARGUMENTS, message, None),
            };
            match run.call(self, args).await {
                Ok(output) => match serde_json::to_value(&output) {
                    Ok(v) => ToolResult::success(v),
                    Err(e) => ToolResult::error(
                        OUTPUT_NOT_JSON,
                        format!(
                            "`{}` ran, but its output could not be turned into JSON ({e}); do not call it again for this intent: a repeat replays the stored outcome",
                            def.name
                        ),
                        None,
                    ),
                },
                Err(e) => error_result(def, &e, cx),
            }
        })
    }
}

/// Why a tool cannot join a set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolSetError {
    /// Two tools share a name; names select the tool and are part of every key.
    #[error("a tool named `{0}` is already in the set; tool names must be unique")]
    DuplicateName(&'static str),
    /// The name breaks the MCP rule (spec 2025-11-25, "Tool names"): 1 to 128 characters from
    /// `A-Z a-z 0-9 _ - .`. (OpenAI and Anthropic are stricter: no `.`, at most 64.)
    #[error(
        "tool name `{0}` is not valid: MCP (spec 2025-11-25, Tool names) allows 1 to 128 characters from A-Z, a-z, 0-9, `_`, `-` and `.`"
    )]
    InvalidName(&'static str),
    /// The arguments' schema is not an object schema: MCP requires `inputSchema` of
    /// `"type": "object"`, and models send arguments as an object.
    #[error(
        "the arguments of tool `{0}` do not have an object schema; make the arguments a struct with named fields"
    )]
    NotAnObject(&'static str),
}

#[derive(Clone)]
struct Entry {
    tool: Arc<dyn DynTool>,
    definition: ToolDefinition,
}

/// A set of tools a model may call, by name with JSON arguments. Cheap to clone.
///
/// ```
/// # use idem_core::{Idem, ToolSet};
/// # async fn demo(tools: ToolSet) {
/// let idem = Idem::in_memory();
/// let run = idem.run("conversation-42");
/// let call = serde_json::json!({"type": "tool_use", "id": "toolu_1", "name": "get_balance",
///                               "input": {"customer": "cus_1"}});
/// let block = tools.call_anthropic(&run, &call).await; // {"type":"tool_result", ...}
/// # }
/// ```
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<&'static str, Entry>,
    cx: DispatchContext,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSet").field("tools", &self.tools.keys()).finish()
    }
}

fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        ToolSet::default()
    }

    /// This set with `tool` added. Errors: [`ToolSetError`] (duplicate or invalid name, arguments
    /// that are not an object).
    pub fn with(mut self, tool: impl Tool) -> Result<Self, ToolSetError> {
        self.add(tool)?;
        Ok(self)
    }

    /// Adds `tool`. Errors: see [`ToolSet::with`]; the set is unchanged on error.
    pub fn add(&mut self, tool: impl Tool) -> Result<(), ToolSetError> {
        self.add_dyn(Arc::new(tool))
    }

    /// Adds a tool already behind the object-safe adapter.
    pub fn add_dyn(&mut self, tool: Arc<dyn DynTool>) -> Result<(), ToolSetError> {
        let def = tool.tool_def();
        if !valid_name(def.name) {
            return Err(ToolSetError::InvalidName(def.name));
        }
        if self.tools.contains_key(def.name) {
            return Err(ToolSetError::DuplicateName(def.name));
        }
        let input_schema = match tool.input_schema() {
            Value::Object(schema) if schema.get("type") == Some(&Value::from("object")) => schema,
            _ => return Err(ToolSetError::NotAnObject(def.name)),
        };
        let definition = ToolDefinition {
            name: def.name,
            description: def.description,
            class: def.class,
            input_schema,
            annotations: Annotations::for_class(def.class),
        };
        if def.class == RetryClass::Safe {
            self.cx.read_only.push(def.name);
            self.cx.read_only.sort_unstable();
        }
        self.tools.insert(def.name, Entry { tool, definition });
        Ok(())
    }

    /// The definitions, sorted by name.
    pub fn definitions(&self) -> impl Iterator<Item = &ToolDefinition> {
        self.tools.values().map(|e| &e.definition)
    }

    /// The definition of `name`, if it is in the set.
    pub fn definition(&self, name: &str) -> Option<&ToolDefinition> {
        self.tools.get(name).map(|e| &e.definition)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// MCP `tools/list` entries.
    pub fn mcp_tools(&self) -> Vec<Value> {
        self.definitions().map(ToolDefinition::to_mcp).collect()
    }

    /// OpenAI chat `tools` array.
    pub fn openai_tools(&self) -> Vec<Value> {
        self.definitions().map(ToolDefinition::to_openai).collect()
    }

    /// Anthropic `tools` array.
    pub fn anthropic_tools(&self) -> Vec<Value> {
        self.definitions().map(ToolDefinition::to_anthropic).collect()
    }

    /// Calls `name` with arguments as parsed JSON, in `run` (the key scope).
    pub async fn call(&self, run: &Run, name: &str, args: &Value) -> ToolResult {
        self.call_args(run, name, Arguments::Json(args)).await
    }

    /// Calls `name` with arguments as JSON text, in `run`.
    pub async fn call_text(&self, run: &Run, name: &str, args: &str) -> ToolResult {
        self.call_args(run, name, Arguments::Text(args)).await
    }

    /// Calls `name` with `args`, in `run`. An unknown name is a result of kind [`UNKNOWN_TOOL`]
    /// listing the available tools.
    pub async fn call_args(&self, run: &Run, name: &str, args: Arguments<'_>) -> ToolResult {
        match self.tools.get(name) {
            Some(entry) => entry.tool.dispatch(run, args, &self.cx).await,
            None => self.unknown_tool(name),
        }
    }

    fn unknown_tool(&self, name: &str) -> ToolResult {
        let available: Vec<&str> = self.tools.keys().copied().collect();
        ToolResult::error(
            UNKNOWN_TOOL,
            format!(
                "there is no tool named `{name}`; nothing was executed. Available tools: {}",
                available.join(", ")
            ),
            None,
        )
    }

    /// Dispatches one OpenAI chat `tool_calls` entry
    /// (`{"id","type":"function","function":{"name","arguments":"<JSON text>"}}`; `arguments`
    /// given as an object is accepted too) and returns the tool message
    /// `{"role":"tool","tool_call_id","content"}`. The `id` goes to tracing, not into the key.
    pub async fn call_openai(&self, run: &Run, tool_call: &Value) -> Value {
        let id = tool_call.get("id").and_then(Value::as_str).unwrap_or_default();
        let function = tool_call.get("function");
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
        let result = match name {
            None => ToolResult::error(
                INVALID_TOOL_CALL,
                "the tool call has no `function.name`; nothing was executed",
                None,
            ),
            Some(name) => {
                let run = with_call_id(run, id);
                let args = match function.and_then(|f| f.get("arguments")) {
                    None | Some(Value::Null) => Arguments::Absent,
                    Some(Value::String(text)) => Arguments::Text(text),
                    Some(other) => Arguments::Json(other),
                };
                self.call_args(&run, name, args).await
            }
        };
        result.to_openai_message(id)
    }

    /// Dispatches one Anthropic `tool_use` content block (`{"type":"tool_use","id","name","input"}`)
    /// and returns the `tool_result` block `{"type":"tool_result","tool_use_id","content","is_error"}`.
    pub async fn call_anthropic(&self, run: &Run, block: &Value) -> Value {
        let id = block.get("id").and_then(Value::as_str).unwrap_or_default();
        let result = match block.get("name").and_then(Value::as_str) {
            None => ToolResult::error(
                INVALID_TOOL_CALL,
                "the tool_use block has no `name`; nothing was executed",
                None,
            ),
            Some(name) => {
                let run = with_call_id(run, id);
                let args = match block.get("input") {
                    None | Some(Value::Null) => Arguments::Absent,
                    Some(input) => Arguments::Json(input),
                };
                self.call_args(&run, name, args).await
            }
        };
        result.to_anthropic_block(id)
    }

    /// Dispatches MCP `tools/call` params (`{"name","arguments","_meta"}`) and returns
    /// `CallToolResult` JSON. `_meta` may name the run ([`MCP_META_RUN`]) and carry the caller's
    /// idempotency key ([`MCP_META_IDEMPOTENCY_KEY`]); otherwise `run` applies.
    ///
    /// Errors (protocol errors, MCP spec 2025-11-25 "Error Handling", code -32602): no `name`, an
    /// unknown tool, or an ill-formed idem `_meta` entry. Everything else, invalid arguments
    /// included, is a result with `isError: true`.
    pub async fn call_mcp(&self, run: &Run, params: &Value) -> Result<Value, McpProtocolError> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| McpProtocolError::invalid_params("tools/call params have no `name`"))?;
        if !self.tools.contains_key(name) {
            return Err(McpProtocolError::invalid_params(format!("Unknown tool: {name}")));
        }
        let meta = match params.get("_meta") {
            None | Some(Value::Null) => None,
            Some(Value::Object(meta)) => Some(meta),
            // Ignoring it would drop a caller's idempotency key and run the tool unprotected.
            Some(_) => {
                return Err(McpProtocolError::invalid_params("`_meta` must be a JSON object"));
            }
        };
        let run = mcp_run(run, meta)?;
        let args = match params.get("arguments") {
            None | Some(Value::Null) => Arguments::Absent,
            Some(args) => Arguments::Json(args),
        };
        Ok(self.call_args(&run, name, args).await.to_mcp())
    }
}

fn with_call_id(run: &Run, id: &str) -> Run {
    if id.is_empty() { run.clone() } else { run.with_call_id(id) }
}

/// The run an MCP request asks for: `run` with its run id replaced by `_meta["idem/run"]`
/// (tenant kept) and the caller's key from `_meta["idem/idempotencyKey"]`, when present.
///
/// Errors: an entry that is present but not a non-empty string (JSON-RPC invalid params).
pub fn mcp_run(run: &Run, meta: Option<&Map<String, Value>>) -> Result<Run, McpProtocolError> {
    let Some(meta) = meta else { return Ok(run.clone()) };
    let text = |key: &str| -> Result<Option<&str>, McpProtocolError> {
        match meta.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(_) => Err(McpProtocolError::invalid_params(format!(
                "`_meta[\"{key}\"]` must be a non-empty string"
            ))),
        }
    };
    let mut out = match text(MCP_META_RUN)? {
        Some(id) => {
            let scope = Scope::run(id).with_tenant(run.scope().tenant());
            let mut next = run.idem().scope(scope);
            if let Some(k) = run.caller_key() {
                next = next.with_idempotency_key(k);
            }
            next
        }
        None => run.clone(),
    };
    if let Some(key) = text(MCP_META_IDEMPOTENCY_KEY)? {
        out = out.with_idempotency_key(key);
    }
    Ok(out)
}

/// Parses the model's arguments into the tool's type, or says what is wrong, naming the field.
fn parse_args<A: DeserializeOwned>(tool: &str, args: Arguments<'_>) -> Result<A, String> {
    let empty = Value::Object(Map::new());
    let parsed;
    let value = match args {
        Arguments::Json(v) => v,
        Arguments::Absent => &empty,
        Arguments::Text(text) if text.trim().is_empty() => &empty,
        Arguments::Text(text) => {
            // Straight from the text into the typed arguments: a `Value` would keep only the last
            // of two duplicate keys, and turn integers beyond 64 bits into floats.
            let mut de = serde_json::Deserializer::from_str(text);
            let object = text.trim_start().starts_with('{');
            let typed =
                if object { serde_path_to_error::deserialize(&mut de).map(Some) } else { Ok(None) };
            let syntax = |e: &serde_json::Error| {
                let mut msg = format!(
                    "the arguments of `{tool}` are not valid JSON ({e}); nothing was executed. Send one JSON object"
                );
                if text.contains("NaN") || text.contains("Infinity") {
                    msg.push_str(" (JSON has no NaN or Infinity: pass a finite number)");
                }
                msg
            };
            match typed {
                // serde's derives also accept an array for a struct: only an object will do, and
                // anything else is parsed only to say what it is.
                Ok(None) => {
                    parsed = serde_json::from_str::<Value>(text).map_err(|e| syntax(&e))?;
                    &parsed
                }
                Ok(Some(args)) => return de.end().map(|()| args).map_err(|e| syntax(&e)),
                Err(e) if e.inner().is_syntax() || e.inner().is_eof() => {
                    return Err(syntax(e.inner()));
                }
                Err(e) => return Err(field_error(tool, &e)),
            }
        }
    };
    if !value.is_object() {
        return Err(format!(
            "the arguments of `{tool}` must be a JSON object, not {}; nothing was executed",
            json_type(value)
        ));
    }
    serde_path_to_error::deserialize(value).map_err(|e| field_error(tool, &e))
}

/// "invalid arguments for `tool`: field `a.b`: <what serde said>; ...".
fn field_error<E: Display>(tool: &str, e: &serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    let mut msg = format!("invalid arguments for `{tool}`: ");
    if path != "." {
        let _ = write!(msg, "field `{path}`: ");
    }
    let _ = write!(msg, "{}; nothing was executed, fix the arguments and call again", e.inner());
    msg
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The readable result of a failed protected call.
fn error_result<E: Serialize + Display>(
    def: &ToolDef,
    err: &Error<E>,
    cx: &DispatchContext,
) -> ToolResult {
    let name = def.name;
    let kind = err.kind();
    match err {
        Error::Tool { error, .. } => ToolResult::error(
            kind,
            format!("`{name}` failed: {error}"),
            serde_json::to_value(error).ok(),
        ),
        Error::OutcomeUnknown { key, .. } => {
            ToolResult::error(kind, outcome_unknown_text(name, key, cx), Some(key_detail(key)))
        }
        Error::Timeout { timeout, attempt, .. } => {
            let repeat = match def.class {
                RetryClass::Safe => "it only reads, so calling it again is safe",
                _ => {
                    "calling it again with the same arguments is safe: the repeat reuses the idempotency key, so the action will not happen twice"
                }
            };
            ToolResult::error(
                kind,
                format!(
                    "`{name}` timed out after {} ms on attempt {attempt}; the action may have happened. {repeat}",
                    timeout.as_millis()
                ),
                None,
            )
        }
        Error::InvalidArguments { source, .. } => ToolResult::error(
            kind,
            format!(
                "invalid arguments for `{name}`: {source}; nothing was executed, fix the arguments and call again"
            ),
            None,
        ),
        other => ToolResult::error(kind, other.to_string(), None),
    }
}

fn key_detail(key: &Key) -> Value {
    json!({ "idempotency_key": key.as_str() })
}

fn outcome_unknown_text(name: &str, key: &Key, cx: &DispatchContext) -> String {
    let mut text = format!(
        "OUTCOME UNKNOWN: `{name}` may have taken effect, and whether it did is not known. Do NOT call `{name}` again for this request: it will not be executed again and a repeat only returns this message. Check whether it happened in the target system"
    );
    if !cx.read_only.is_empty() {
        let _ = write!(text, " (read-only tools that may help: {})", cx.read_only.join(", "));
    }
    let _ = write!(text, ", or ask a human to check and reconcile it (idempotency key {key}).");
    text
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use schemars::JsonSchema;
    use serde::Deserialize;

    use super::*;
    use crate::store::{Claim, ClaimRequest, Fence, Outcome, Store, StoreError};
    use crate::{Classify, Ctx, Failure, Idem, Policy, RetryBudget, ToolOptions};

    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    struct ChargeArgs {
        customer: String,
        amount_cents: u64,
    }

    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    struct BalanceArgs {
        customer: String,
    }

    #[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
    struct ScaleArgs {
        factor: f64,
    }

    #[derive(Debug, Serialize, Deserialize, thiserror::Error)]
    enum PayError {
        #[error("card declined: {0}")]
        Declined(String),
        #[error("the provider timed out after the request was sent")]
        Timeout,
        #[error("the provider is unavailable")]
        Unavailable,
    }

    impl Classify for PayError {
        fn classify(&self) -> Failure {
            match self {
                PayError::Declined(_) => Failure::permanent(),
                PayError::Timeout => Failure::ambiguous(),
                PayError::Unavailable => Failure::transient(),
            }
        }
    }

    type Behave<A> = fn(&A, u32) -> Result<Value, PayError>;

    /// A hand-written tool (the `#[tool]` macro generates the same impl): counts its runs.
    struct Fake<A> {
        def: &'static ToolDef,
        runs: Arc<AtomicU32>,
        behave: Behave<A>,
        delay: Duration,
        _args: PhantomData<fn() -> A>,
    }

    fn fake<A>(name: &'static str, class: RetryClass, behave: Behave<A>) -> Fake<A> {
        fake_with(name, class, ToolOptions::default(), behave)
    }

    fn fake_with<A>(
        name: &'static str,
        class: RetryClass,
        options: ToolOptions,
        behave: Behave<A>,
    ) -> Fake<A> {
        let def = Box::leak(Box::new(ToolDef { name, description: "a test tool", class, options }));
        Fake {
            def,
            runs: Arc::new(AtomicU32::new(0)),
            behave,
            delay: Duration::ZERO,
            _args: PhantomData,
        }
    }

    impl<A> Tool for Fake<A>
    where
        A: Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static,
    {
        type Args = A;
        type Output = Value;
        type Error = PayError;

        fn def(&self) -> &'static ToolDef {
            self.def
        }
        fn run(&self, _cx: &Ctx, args: A) -> impl Future<Output = Result<Value, PayError>> + Send {
            let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            let (behave, delay) = (self.behave, self.delay);
            async move {
                tokio::time::sleep(delay).await;
                behave(&args, n)
            }
        }
    }

    fn charge_ok(a: &ChargeArgs, n: u32) -> Result<Value, PayError> {
        Ok(json!({"charge_id": format!("ch_{n}"), "amount_cents": a.amount_cents}))
    }
    fn balance_ok(a: &BalanceArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!({"customer": a.customer, "balance_cents": 0}))
    }
    fn refund_times_out(_: &ChargeArgs, _: u32) -> Result<Value, PayError> {
        Err(PayError::Timeout)
    }

    struct Tools {
        set: ToolSet,
        charges: Arc<AtomicU32>,
        refunds: Arc<AtomicU32>,
    }

    fn tools() -> Tools {
        let charge = fake("charge_card", RetryClass::Keyed, charge_ok);
        let refund = fake("refund", RetryClass::Never, refund_times_out);
        let balance = fake("get_balance", RetryClass::Safe, balance_ok);
        let (charges, refunds) = (charge.runs.clone(), refund.runs.clone());
        let set = ToolSet::new().with(charge).unwrap().with(refund).unwrap().with(balance).unwrap();
        Tools { set, charges, refunds }
    }

    #[test]
    fn definitions_carry_schema_and_annotations_from_the_class() {
        let t = tools();
        let names: Vec<_> = t.set.definitions().map(|d| d.name).collect();
        assert_eq!(names, ["charge_card", "get_balance", "refund"]);

        let charge = t.set.definition("charge_card").unwrap().to_mcp();
        assert_eq!(charge["inputSchema"]["type"], "object");
        assert_eq!(charge["inputSchema"]["properties"]["amount_cents"]["type"], "integer");
        assert_eq!(charge["inputSchema"]["required"], json!(["customer", "amount_cents"]));
        assert_eq!(charge["annotations"], json!({"readOnlyHint": false, "idempotentHint": true}));
        let balance = t.set.definition("get_balance").unwrap().to_mcp();
        assert_eq!(balance["annotations"], json!({"readOnlyHint": true}));
        let refund = t.set.definition("refund").unwrap().to_mcp();
        assert_eq!(
            refund["annotations"],
            json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false})
        );

        let openai = t.set.openai_tools();
        assert_eq!(openai[0]["type"], "function");
        assert_eq!(openai[0]["function"]["name"], "charge_card");
        assert_eq!(openai[0]["function"]["parameters"]["type"], "object");
        let anthropic = t.set.anthropic_tools();
        assert_eq!(anthropic[2]["name"], "refund");
        assert_eq!(anthropic[2]["input_schema"]["type"], "object");
    }

    #[test]
    fn bad_tools_are_refused_with_a_reason() {
        let t = tools();
        let dup = fake("charge_card", RetryClass::Keyed, charge_ok);
        assert_eq!(t.set.with(dup).unwrap_err(), ToolSetError::DuplicateName("charge_card"));
        let spaced = fake("charge card", RetryClass::Keyed, charge_ok);
        assert_eq!(
            ToolSet::new().with(spaced).unwrap_err(),
            ToolSetError::InvalidName("charge card")
        );
        fn scalar(_: &u64, _: u32) -> Result<Value, PayError> {
            Ok(Value::Null)
        }
        let scalar_args = fake("scalar", RetryClass::Safe, scalar);
        assert_eq!(
            ToolSet::new().with(scalar_args).unwrap_err(),
            ToolSetError::NotAnObject("scalar")
        );
    }

    #[tokio::test]
    async fn repeats_with_new_call_ids_and_reordered_keys_run_once() {
        let t = tools();
        let run = Idem::in_memory().run("conv-1");
        let first = t
            .set
            .call_openai(
                &run,
                &json!({"id": "call_a", "type": "function", "function": {"name": "charge_card",
                    "arguments": "{\"customer\":\"cus_1\",\"amount_cents\":4900}"}}),
            )
            .await;
        assert_eq!(first["role"], "tool");
        assert_eq!(first["tool_call_id"], "call_a");
        let again = t
            .set
            .call_openai(
                &run,
                &json!({"id": "call_b", "type": "function", "function": {"name": "charge_card",
                    "arguments": "{ \"amount_cents\": 4900, \"customer\": \"cus_1\" }"}}),
            )
            .await;
        assert_eq!(again["tool_call_id"], "call_b");
        assert_eq!(again["content"], first["content"]);
        let block = t
            .set
            .call_anthropic(
                &run,
                &json!({"type": "tool_use", "id": "toolu_1", "name": "charge_card",
                    "input": {"amount_cents": 4900, "customer": "cus_1"}}),
            )
            .await;
        assert_eq!(block["is_error"], false);
        assert_eq!(block["content"], first["content"]);
        assert_eq!(t.charges.load(Ordering::SeqCst), 1);
        let content: Value = serde_json::from_str(first["content"].as_str().unwrap()).unwrap();
        assert_eq!(content["charge_id"], "ch_1");

        // Another run is another intent.
        let other = Idem::in_memory().run("conv-2");
        let r = t
            .set
            .call(&other, "charge_card", &json!({"customer": "cus_1", "amount_cents": 4900}))
            .await;
        assert!(!r.is_error);
        assert_eq!(t.charges.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn unknown_tool_lists_the_available_ones() {
        let t = tools();
        let run = Idem::in_memory().run("r");
        let r = t.set.call(&run, "charge", &json!({})).await;
        assert!(r.is_error);
        assert_eq!(r.error_kind, Some(UNKNOWN_TOOL));
        assert!(r.text.contains("no tool named `charge`"), "{}", r.text);
        assert!(r.text.contains("charge_card, get_balance, refund"), "{}", r.text);
        let block =
            t.set.call_anthropic(&run, &json!({"type": "tool_use", "id": "x", "input": {}})).await;
        assert_eq!(block["is_error"], true);
        assert!(block["content"].as_str().unwrap().contains("invalid_tool_call"));
        assert_eq!(t.charges.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn bad_arguments_name_the_problem_and_run_nothing() {
        let t = tools();
        let run = Idem::in_memory().run("r");
        let cases: [(&str, &str, &str); 6] = [
            ("{\"customer\": \"cus_1\", \"amount_cents\": 49", INVALID_ARGUMENTS, "not valid JSON"),
            (
                "{\"customer\": \"cus_1\", \"amount_cents\": NaN}",
                INVALID_ARGUMENTS,
                "JSON has no NaN",
            ),
            (
                "{\"customer\": \"cus_1\", \"amount_cents\": \"4900\"}",
                INVALID_ARGUMENTS,
                "field `amount_cents`: invalid type: string \"4900\", expected u64",
            ),
            (
                "{\"customer\": \"cus_1\", \"amount_cents\": -5}",
                INVALID_ARGUMENTS,
                "field `amount_cents`",
            ),
            ("{\"customer\": \"cus_1\"}", INVALID_ARGUMENTS, "missing field `amount_cents`"),
            ("[\"cus_1\", 4900]", INVALID_ARGUMENTS, "must be a JSON object, not an array"),
        ];
        for (args, kind, needle) in cases {
            let r = t.set.call_text(&run, "charge_card", args).await;
            assert!(r.is_error, "{args}");
            assert_eq!(r.error_kind, Some(kind), "{args}");
            assert!(r.text.contains(needle), "{args}: {}", r.text);
            assert!(r.text.contains("nothing was executed"), "{}", r.text);
        }
        assert_eq!(t.charges.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn non_finite_numbers_are_refused_before_the_claim() {
        fn scale(a: &ScaleArgs, _: u32) -> Result<Value, PayError> {
            Ok(json!(a.factor))
        }
        let tool = fake("scale", RetryClass::Keyed, scale);
        let runs = tool.runs.clone();
        let run = Idem::in_memory().run("r");
        let set = ToolSet::new().with(tool).unwrap();
        // JSON cannot carry NaN or infinities: the text is refused before any claim.
        let r = set.call_text(&run, "scale", "{\"factor\": Infinity}").await;
        assert_eq!(r.error_kind, Some(INVALID_ARGUMENTS));
        assert!(r.text.contains("finite number"), "{}", r.text);
        let r = set.call_text(&run, "scale", "{\"factor\": 1e999}").await;
        assert_eq!(r.error_kind, Some(INVALID_ARGUMENTS), "{}", r.text);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn outcome_unknown_says_do_not_retry_and_what_to_check() {
        let t = tools();
        let run = Idem::in_memory().run("r");
        let args = json!({"customer": "cus_1", "amount_cents": 100});
        let first = t.set.call(&run, "refund", &args).await;
        let again = t.set.call(&run, "refund", &args).await;
        assert_eq!(t.refunds.load(Ordering::SeqCst), 1, "a never tool runs once");
        for r in [&first, &again] {
            assert!(r.is_error);
            assert_eq!(r.error_kind, Some("outcome_unknown"));
            assert!(r.text.contains("may have taken effect"), "{}", r.text);
            assert!(r.text.contains("Do NOT call `refund` again"), "{}", r.text);
            assert!(r.text.contains("read-only tools that may help: get_balance"), "{}", r.text);
            assert!(r.content["error"]["detail"]["idempotency_key"].is_string());
        }
        let mcp = first.to_mcp();
        assert_eq!(mcp["isError"], true);
        assert_eq!(mcp["content"][0]["type"], "text");
        assert!(mcp.get("structuredContent").is_none());
    }

    #[tokio::test]
    async fn a_tool_error_is_readable_and_replayed() {
        fn declined(_: &ChargeArgs, n: u32) -> Result<Value, PayError> {
            Err(PayError::Declined(format!("insufficient funds (run {n})")))
        }
        let tool = fake("charge_card", RetryClass::Keyed, declined);
        let runs = tool.runs.clone();
        let set = ToolSet::new().with(tool).unwrap();
        let run = Idem::in_memory().run("r");
        let args = json!({"customer": "cus_1", "amount_cents": 100});
        let a = set.call(&run, "charge_card", &args).await;
        let b = set.call(&run, "charge_card", &args).await;
        assert_eq!(a, b);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(a.error_kind, Some("tool_error"));
        assert!(a.text.contains("card declined: insufficient funds (run 1)"), "{}", a.text);
        assert_eq!(a.content["error"]["detail"], json!({"Declined": "insufficient funds (run 1)"}));
    }

    #[tokio::test]
    async fn a_caller_key_reused_with_other_arguments_is_refused() {
        let t = tools();
        let run = Idem::in_memory().run("session");
        let call = |amount: u64| {
            json!({"name": "charge_card", "arguments": {"customer": "cus_1", "amount_cents": amount},
                "_meta": {"idem/run": "conv-9", "idem/idempotencyKey": "order-17"}})
        };
        let a = t.set.call_mcp(&run, &call(100)).await.unwrap();
        assert_eq!(a["isError"], false);
        assert_eq!(a["structuredContent"]["charge_id"], "ch_1");
        let b = t.set.call_mcp(&run, &call(100)).await.unwrap();
        assert_eq!(a, b);
        let c = t.set.call_mcp(&run, &call(999)).await.unwrap();
        assert_eq!(c["isError"], true);
        let text = c["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("Error (key_reuse_mismatch)"), "{text}");
        assert!(text.contains("already used with other arguments"), "{text}");
        assert_eq!(t.charges.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn mcp_protocol_errors_for_unroutable_calls() {
        let t = tools();
        let run = Idem::in_memory().run("session");
        let e = t.set.call_mcp(&run, &json!({"name": "nope", "arguments": {}})).await.unwrap_err();
        assert_eq!(e.code, -32602);
        assert_eq!(e.message, "Unknown tool: nope");
        let e = t
            .set
            .call_mcp(
                &run,
                &json!({"name": "get_balance", "arguments": {"customer": "c"},
                "_meta": {"idem/run": 7}}),
            )
            .await
            .unwrap_err();
        assert!(e.message.contains("idem/run"), "{e}");
        // Bad arguments are a tool result, not a protocol error.
        let r =
            t.set.call_mcp(&run, &json!({"name": "get_balance", "arguments": {}})).await.unwrap();
        assert_eq!(r["isError"], true);
        assert!(r["content"][0]["text"].as_str().unwrap().contains("missing field `customer`"));
    }

    #[tokio::test]
    async fn meta_run_is_the_key_scope() {
        let t = tools();
        let idem = Idem::in_memory();
        let session_a = idem.run("session-a");
        let session_b = idem.run("session-b");
        let call = json!({"name": "charge_card", "arguments": {"customer": "c", "amount_cents": 1},
            "_meta": {"idem/run": "conv-1"}});
        let a = t.set.call_mcp(&session_a, &call).await.unwrap();
        let b = t.set.call_mcp(&session_b, &call).await.unwrap();
        assert_eq!(a, b, "the same run id from two sessions is one intent");
        assert_eq!(t.charges.load(Ordering::SeqCst), 1);
        let no_meta =
            json!({"name": "charge_card", "arguments": {"customer": "c", "amount_cents": 1}});
        t.set.call_mcp(&session_a, &no_meta).await.unwrap();
        t.set.call_mcp(&session_b, &no_meta).await.unwrap();
        assert_eq!(
            t.charges.load(Ordering::SeqCst),
            3,
            "without a run id each session is its own scope"
        );
    }

    struct DownStore;

    #[async_trait]
    impl Store for DownStore {
        async fn claim(&self, _: ClaimRequest<'_>) -> Result<Claim, StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
        async fn complete(
            &self,
            _: &Key,
            _: Fence,
            _: &Outcome,
            _: Duration,
        ) -> Result<(), StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
        async fn release(&self, _: &Key, _: Fence) -> Result<(), StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
        async fn renew(&self, _: &Key, _: Fence, _: Duration) -> Result<(), StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
        async fn wait(&self, _: &Key, _: Fence, _: Duration) -> Result<(), StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
        async fn forget(&self, _: &Key) -> Result<bool, StoreError> {
            Err(StoreError::unavailable("connection refused"))
        }
    }

    #[tokio::test]
    async fn store_unavailable_runs_nothing_and_says_so() {
        let t = tools();
        let run = Idem::new(DownStore).run("r");
        let r = t.set.call(&run, "charge_card", &json!({"customer": "c", "amount_cents": 1})).await;
        assert_eq!(r.error_kind, Some("store_unavailable"));
        assert!(r.text.contains("nothing was executed"), "{}", r.text);
        assert_eq!(t.charges.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn budget_exhausted_and_timeout_are_readable() {
        fn flaky(_: &ChargeArgs, _: u32) -> Result<Value, PayError> {
            Err(PayError::Unavailable)
        }
        let tool = fake("charge_card", RetryClass::Keyed, flaky);
        let runs = tool.runs.clone();
        let set = ToolSet::new().with(tool).unwrap();
        let idem = Idem::builder(crate::MemoryStore::new())
            .retry_budget(Arc::new(RetryBudget::new(1, 0.1)))
            .seed(7)
            .build();
        let r = set
            .call(&idem.run("r"), "charge_card", &json!({"customer": "c", "amount_cents": 1}))
            .await;
        assert_eq!(r.error_kind, Some("budget_exhausted"), "{}", r.text);
        assert!(r.text.contains("shared retry budget is exhausted; retry later"), "{}", r.text);
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let mut slow = fake_with(
            "charge_card",
            RetryClass::Keyed,
            ToolOptions {
                attempts: Some(2),
                attempt_timeout: Some(Duration::from_millis(500)),
                ..ToolOptions::default()
            },
            charge_ok,
        );
        slow.delay = Duration::from_secs(5);
        let runs = slow.runs.clone();
        let set = ToolSet::new().with(slow).unwrap();
        let idem =
            Idem::builder(crate::MemoryStore::new()).policy(Policy::default()).seed(7).build();
        let r = set
            .call(&idem.run("r"), "charge_card", &json!({"customer": "c", "amount_cents": 1}))
            .await;
        assert_eq!(r.error_kind, Some("timeout"), "{}", r.text);
        assert!(r.text.contains("timed out after 500 ms on attempt 2"), "{}", r.text);
        assert!(r.text.contains("calling it again with the same arguments is safe"), "{}", r.text);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}

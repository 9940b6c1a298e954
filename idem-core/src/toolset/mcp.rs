//! MCP (spec 2025-11-25): tool annotations derived from the retry class, `tools/list` entries,
//! `tools/call` in, `CallToolResult` out, the idem `_meta` entries, and the protocol errors of a
//! call that cannot be routed.

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::{Arguments, ErrorKind, ToolDefinition, ToolResult, ToolSet};
use crate::class::RetryClass;
use crate::executor::Run;
use crate::key::Scope;

/// The `_meta` key of an MCP `tools/call` request that names the run, i.e. the scope of the
/// key: `{"_meta": {"idem/run": "conversation-42"}}`. A string (more than white space) of at most
/// [`MAX_META_ID_BYTES`] bytes. Follows the `_meta`
/// naming rule of the MCP spec 2025-11-25 (`prefix/name`, the prefix `idem/` is ours). When it
/// is absent the server's default run applies (for `idem-mcp`: one run per MCP session).
pub const MCP_META_RUN: &str = "idem/run";

/// The `_meta` key of an MCP `tools/call` request that carries the caller's own idempotency key:
/// `{"_meta": {"idem/idempotencyKey": "order-17-charge"}}`. A string (more than white space) of at most
/// [`MAX_META_ID_BYTES`] bytes. The call then
/// goes through [`Run::with_idempotency_key`]: the fingerprint of the arguments is stored, and a
/// reuse with other arguments is refused (`key_reuse_mismatch`).
pub const MCP_META_IDEMPOTENCY_KEY: &str = "idem/idempotencyKey";

/// The longest `_meta["idem/run"]` and `_meta["idem/idempotencyKey"]` an MCP server accepts, in
/// bytes of UTF-8: 1,024. A run id is stored with every record (the PostgreSQL store keeps the
/// first 1,024 bytes of any run id for its listing, since its index entries are bounded) and
/// echoed in every result's `_meta`; a conversation id or a caller's key is an identifier, not a
/// document. A longer one is refused as an ill-formed entry, JSON-RPC -32602, like one that is
/// not a string; nothing runs.
pub const MAX_META_ID_BYTES: usize = 1024;

/// The longest tool name an error message repeats, in characters (MCP 2025-11-25 "Tools": a
/// tool name SHOULD be 1 to 128 characters); an unknown name beyond it is shown cut, with `…`.
pub(super) const SHOWN_NAME_CHARS: usize = 128;

/// The `_meta` key of a `CallToolResult` that carries the call's idempotency key (64 hex digits).
pub const MCP_META_KEY: &str = "idem/key";

/// The `_meta` key of a `CallToolResult` that says how the call was served: `executed`,
/// `replayed`, `joined`, `taken_over`, `reconciled` or `unknown` ([`crate::Served`]).
pub const MCP_META_OUTCOME: &str = "idem/outcome";

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
}

/// The deepest `structuredContent` an answer carries: [`crate::limits::MAX_DEPTH`] less the
/// JSON-RPC message and its `result` object around it.
const MCP_RESULT_DEPTH: usize = crate::limits::MAX_DEPTH - 2;

impl ToolResult {
    /// MCP `CallToolResult` JSON (spec 2025-11-25): one text block with [`Self::text`],
    /// `isError`, `structuredContent` when the output is a JSON object (its members sorted by name,
    /// as [`ToolResult::success`] holds them, so that a replay answers as its first call did;
    /// nested at most 125 levels, so that the whole JSON-RPC answer stays within the depth JSON
    /// readers accept, as
    /// `idem_core::limits::MAX_DEPTH` explains), and `_meta` saying what
    /// idem did once the arguments were accepted: `{"idem/run": "<run id>", "idem/key": "<64 hex
    /// digits>", "idem/outcome": "executed" | "replayed" | "joined" | "unknown"}` (`idem/outcome`
    /// is absent when the call failed before that was decided, `idem/run` when a caller's key
    /// was sent without a run).
    pub fn to_mcp(&self) -> Value {
        let mut out = Map::new();
        out.insert("content".into(), json!([{ "type": "text", "text": self.text }]));
        out.insert("isError".into(), Value::Bool(self.is_error));
        // The JSON-RPC message and its `result` are two levels around `structuredContent`: an
        // output within the depth limit but past it by those would make the whole answer one that
        // serde_json (rmcp's client among others) refuses to read. The text block still holds it.
        if !self.is_error
            && self.content.is_object()
            && crate::limits::check_value_depth_within(&self.content, MCP_RESULT_DEPTH).is_ok()
        {
            out.insert("structuredContent".into(), self.content.clone());
        }
        if let Some(report) = &self.report {
            let mut meta = Map::new();
            // A caller's key without a run has none to name (the run id `""`, which a client may
            // not send back).
            if !report.scope.run_id().is_empty() {
                meta.insert(MCP_META_RUN.into(), report.scope.run_id().into());
            }
            meta.insert(MCP_META_KEY.into(), report.key.as_str().into());
            if let Some(served) = report.served {
                meta.insert(MCP_META_OUTCOME.into(), served.as_str().into());
            }
            out.insert("_meta".into(), Value::Object(meta));
        }
        Value::Object(out)
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
        // What the client sent may be repeated in it.
        McpProtocolError {
            code: Self::INVALID_PARAMS,
            message: crate::printable::lines_owned(message.into()),
        }
    }

    /// The JSON-RPC `error` object: `{"code","message"}`.
    pub fn to_json(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }
}

/// What an MCP server does with a `keyed` or `never` call that names no run in
/// `_meta["idem/run"]`. Such a call is scoped to the server's session run, so its repeat after a
/// reconnect or a server restart is a new intent and runs again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingRun {
    /// Run it in the session's scope and log a `tracing` warning (the default).
    #[default]
    Warn,
    /// Refuse it: an `isError` result of kind `invalid_tool_call` that says what to send;
    /// nothing runs. `safe` tools are never refused.
    Refuse,
}

/// One MCP `tools/call` as a server received it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct McpCall<'a> {
    /// `params.name`.
    pub name: &'a str,
    /// `params.arguments` (as text when the transport kept it: integers beyond 64 bits stay
    /// exact).
    pub arguments: Arguments<'a>,
    /// `params._meta`, whose idem entries name the run and carry a caller key.
    pub meta: Option<&'a Map<String, Value>>,
}

impl<'a> McpCall<'a> {
    /// A call of `name` with `arguments` and `_meta`.
    pub fn new(
        name: &'a str,
        arguments: Arguments<'a>,
        meta: Option<&'a Map<String, Value>>,
    ) -> Self {
        McpCall { name, arguments, meta }
    }
}

impl ToolSet {
    /// MCP `tools/list` entries.
    pub fn mcp_tools(&self) -> Vec<Value> {
        self.definitions().map(ToolDefinition::to_mcp).collect()
    }

    /// Dispatches MCP `tools/call` params (`{"name","arguments","_meta"}`) and returns
    /// `CallToolResult` JSON ([`ToolResult::to_mcp`]), as [`ToolSet::dispatch_mcp`] with
    /// [`MissingRun::Warn`].
    ///
    /// Errors: as [`ToolSet::dispatch_mcp`], and params without a string `name`.
    pub async fn call_mcp(&self, run: &Run, params: &Value) -> Result<Value, McpProtocolError> {
        let name = super::call_name(params.get("name"), "`name`")
            .map_err(McpProtocolError::invalid_params)?;
        let meta = match params.get("_meta") {
            None | Some(Value::Null) => None,
            Some(Value::Object(meta)) => Some(meta),
            // Ignoring it would drop a caller's idempotency key and run the tool unprotected.
            Some(_) => {
                return Err(McpProtocolError::invalid_params("`_meta` must be a JSON object"));
            }
        };
        let args = match params.get("arguments") {
            None | Some(Value::Null) => Arguments::Absent,
            Some(args) => Arguments::Json(args),
        };
        let call = McpCall { name, arguments: args, meta };
        Ok(self.dispatch_mcp(run, call, MissingRun::Warn).await?.to_mcp())
    }

    /// Dispatches one MCP `tools/call`: the one MCP mapping of idem (idem-mcp's server uses it).
    /// `_meta` may name the run ([`MCP_META_RUN`], looked up inside `session`'s tenant) and carry
    /// the caller's idempotency key ([`MCP_META_IDEMPOTENCY_KEY`]); otherwise `session` applies,
    /// and a `keyed` or `never` call is handled as `missing_run` says.
    ///
    /// Errors (protocol errors, MCP spec 2025-11-25 "Error Handling", code -32602): an unknown
    /// tool, or an ill-formed idem `_meta` entry. Everything else, invalid arguments included,
    /// is a result with `isError: true`.
    pub async fn dispatch_mcp(
        &self,
        session: &Run,
        call: McpCall<'_>,
        missing_run: MissingRun,
    ) -> Result<ToolResult, McpProtocolError> {
        let Some(def) = self.definition(call.name) else {
            let name = super::shown(call.name, SHOWN_NAME_CHARS);
            let why = match self.refusal(call.name) {
                Some(refusal) => format!(" (left out of the tool set: {refusal})"),
                None => String::new(),
            };
            return Err(McpProtocolError::invalid_params(format!("Unknown tool: {name}{why}")));
        };
        let run = mcp_run(session, call.meta)?;
        // A caller's own key identifies the call across sessions as a run id does.
        let named = call.meta.is_some_and(|m| {
            [MCP_META_RUN, MCP_META_IDEMPOTENCY_KEY]
                .iter()
                .any(|k| matches!(m.get(*k), Some(Value::String(_))))
        });
        if !named && def.class != RetryClass::Safe {
            match missing_run {
                MissingRun::Warn => tracing::warn!(
                    tool = call.name,
                    run = session.scope().run_id(),
                    "a {} MCP call without _meta[\"{MCP_META_RUN}\"]: it is scoped to this session, so a repeat after a reconnect or a restart runs again. The host should send one stable id per conversation there (the server's instructions ask for it); to refuse such calls instead, use with_missing_run(MissingRun::Refuse)",
                    def.class.as_str(),
                ),
                MissingRun::Refuse => {
                    return Ok(ToolResult::error(
                        ErrorKind::InvalidToolCall,
                        missing_run_text(call.name),
                        None,
                    ));
                }
            }
        }
        Ok(self.call_args(&run, call.name, call.arguments).await)
    }
}

/// What a refused call without a run id tells the host.
fn missing_run_text(tool: &str) -> String {
    format!(
        "`{tool}` changes something, and this server requires the run id with every such call (it keeps no session a repeat could be recognised in, or is configured to require one); nothing was executed. Send `\"_meta\": {{\"{MCP_META_RUN}\": \"<conversation id>\"}}` in the `tools/call` params: the same id for every call of one conversation, also after a reconnect, so that a repeat is recognised and never runs twice (or your own `\"{MCP_META_IDEMPOTENCY_KEY}\"`, the same on every retry of one call)"
    )
}

/// The run an MCP request asks for: `run` with its run id replaced by `_meta["idem/run"]`
/// (tenant kept) and the caller's key from `_meta["idem/idempotencyKey"]`, when present. A
/// caller's key without a run is scoped to the tenant alone (run id `""`), not to the session
/// `run` stands for, so that it survives a reconnect.
///
/// Errors: an entry that is present but not a string of at most [`MAX_META_ID_BYTES`] bytes
/// with more than white space (JSON-RPC invalid params).
pub fn mcp_run(run: &Run, meta: Option<&Map<String, Value>>) -> Result<Run, McpProtocolError> {
    let Some(meta) = meta else { return Ok(run.clone()) };
    let text = |key: &str| -> Result<Option<&str>, McpProtocolError> {
        match meta.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.len() > MAX_META_ID_BYTES => {
                Err(McpProtocolError::invalid_params(format!(
                    "`_meta[\"{key}\"]` is {} bytes long; it may be at most {MAX_META_ID_BYTES} bytes (UTF-8). Send a shorter id, the same one on every retry; nothing was executed",
                    s.len()
                )))
            }
            // Only white space is as empty: a host's unset template (`" "`) would scope every
            // conversation that sends it to one run, and answer each with another's outcomes.
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s)),
            Some(_) => Err(McpProtocolError::invalid_params(format!(
                "`_meta[\"{key}\"]` must be a string with more than white space, the same one on every retry; nothing was executed"
            ))),
        }
    };
    let tenant = run.scope().tenant();
    let (named, key) = (text(MCP_META_RUN)?, text(MCP_META_IDEMPOTENCY_KEY)?);
    let out = match (named, key) {
        (Some(id), _) => run.in_scope(Scope::run(id).with_tenant(tenant)),
        // A client's own key names its intent by itself (unique per client, as the IETF
        // Idempotency-Key draft asks), so without a run it is not the session's: a resend after
        // a reconnect or a restart is another session and must find the same record.
        (None, Some(_)) => run.in_scope(Scope::run("").with_tenant(tenant)),
        (None, None) => run.clone(),
    };
    Ok(match key {
        Some(key) => out.with_idempotency_key(key),
        None => out,
    })
}

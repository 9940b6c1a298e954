//! # idem-mcp: serve an idem [`ToolSet`] over MCP
//!
//! An MCP server (spec 2025-11-25) on the official Rust SDK, `rmcp`, that serves any
//! [`ToolSet`] over stdio. Every `tools/call` goes through the idem protocol, so a client that
//! times out and calls again, or sends the same call twice at once, causes one effect.
//!
//! - `tools/list`: the set's definitions: name, description, `inputSchema` (schemars), and
//!   `annotations` derived from the retry class (see [`idem_core::Annotations`]).
//! - `tools/call`: tool failures (bad arguments, tool errors, outcome unknown, store
//!   unavailable, ...) are results with `isError: true` whose text the model can read. An
//!   unknown tool, or an ill-formed idem `_meta` entry, is a protocol error (JSON-RPC -32602,
//!   MCP spec 2025-11-25 "Error Handling").
//! - Scope: the key scope is the run. A request may name it in `_meta["idem/run"]`
//!   ([`MCP_META_RUN`]); otherwise the run is the MCP session: one id per server connection.
//!   Name the run when the same conversation may reach another server process (a restart, a
//!   second replica), or repeats will not be recognised there.
//! - A client-supplied idempotency key in `_meta["idem/idempotencyKey"]`
//!   ([`MCP_META_IDEMPOTENCY_KEY`]) is used instead of the derived key; a reuse with other
//!   arguments is refused (`key_reuse_mismatch`).
//!
//! - Transport: [`stdio::LineTransport`] reads one JSON-RPC message per line and answers every
//!   request it cannot pass on to rmcp with the request's id (see [`jsonrpc`] for the table of
//!   answers), including text no SDK would send: numbers beyond `f64`, lone surrogates, nesting
//!   past 128 levels, repeated member names. A `tools/call` whose `arguments` are not one JSON
//!   object with unique member names gets an `isError` result of kind `invalid_arguments`, the
//!   same as on the OpenAI and Anthropic front doors; its tool does not run.
//!
//! rmcp's own `#[tool_router]`/`#[tool]` macros are not used: [`IdemServer`] implements
//! `ServerHandler` by hand over the tool set, so idem's `#[tool]` is the only tool attribute.
//!
//! ```no_run
//! # async fn demo(tools: idem_core::ToolSet) -> Result<(), idem_mcp::ServeError> {
//! let idem = idem_core::Idem::in_memory();
//! idem_mcp::IdemServer::new(tools, &idem).serve_stdio().await
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod jsonrpc;
pub mod stdio;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use idem_core::toolset::{Arguments, ToolDefinition, ToolResult, mcp_run};
pub use idem_core::toolset::{MCP_META_IDEMPOTENCY_KEY, MCP_META_RUN};
use idem_core::{Idem, Run, ToolSet};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value};

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The MCP handshake failed (the client closed the connection, or sent no `initialize`).
    #[error("the MCP session could not start: {0}")]
    Initialize(#[source] Box<rmcp::service::ServerInitializeError>),
    /// The task serving the session panicked or was cancelled.
    #[error("the MCP session ended abnormally: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// An MCP server over a [`ToolSet`]. One value serves one connection (one session).
#[derive(Clone)]
pub struct IdemServer {
    tools: Arc<ToolSet>,
    session: Run,
    implementation: Implementation,
    instructions: Option<String>,
}

impl std::fmt::Debug for IdemServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdemServer")
            .field("tools", &self.tools)
            .field("session", &self.session.scope())
            .finish_non_exhaustive()
    }
}

/// A run id unique to this connection: process id, start time (ns) and a counter.
fn session_run_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("mcp-session-{}-{nanos}-{n}", std::process::id())
}

impl IdemServer {
    /// A server for `tools` on `idem`; calls without `_meta["idem/run"]` are scoped to a new run
    /// id for this session (`mcp-session-<pid>-<start ns>-<n>`).
    pub fn new(tools: ToolSet, idem: &Idem) -> Self {
        IdemServer::with_session_run(tools, idem.run(session_run_id()))
    }

    /// A server whose calls without `_meta["idem/run"]` use `session` (its scope, tenant and
    /// caller key).
    pub fn with_session_run(tools: ToolSet, session: Run) -> Self {
        IdemServer {
            tools: Arc::new(tools),
            session,
            implementation: Implementation::new("idem-mcp", env!("CARGO_PKG_VERSION")),
            instructions: None,
        }
    }

    /// The name and version reported in `initialize` (`serverInfo`).
    pub fn with_implementation(
        mut self,
        name: impl Into<String>,
        version: impl Into<String>,
    ) -> Self {
        self.implementation = Implementation::new(name, version);
        self
    }

    /// Instructions for the model, reported in `initialize`.
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// The run used when a call names none.
    pub fn session_run(&self) -> &Run {
        &self.session
    }

    /// The tool set.
    pub fn tools(&self) -> &ToolSet {
        &self.tools
    }

    /// Serves this session over stdin/stdout until the client closes it.
    ///
    /// Errors: [`ServeError`].
    pub async fn serve_stdio(self) -> Result<(), ServeError> {
        let running =
            self.serve(stdio::stdio()).await.map_err(|e| ServeError::Initialize(Box::new(e)))?;
        let reason = running.waiting().await?;
        tracing::debug!(?reason, "MCP session ended");
        Ok(())
    }

    /// Handles one `tools/call`: see the crate docs for routing and scope.
    async fn call(
        &self,
        params: CallToolRequestParams,
        meta: Map<String, Value>,
        text: Option<jsonrpc::ArgumentsText>,
    ) -> CallResult {
        let name = params.name.to_string();
        if self.tools.definition(&name).is_none() {
            return Err(ErrorData::invalid_params(format!("Unknown tool: {name}"), None));
        }
        let run = mcp_run(&self.session, Some(&meta))
            .map_err(|e| ErrorData::invalid_params(e.message, None))?;
        let tools = Arc::clone(&self.tools);
        let args = params.arguments.map(Value::Object);
        // The call runs in its own task: if the client gives up on the request, the effect still
        // finishes and its outcome is stored, so the client's repeat is answered from it.
        let task = tokio::spawn(async move {
            let args = match (&text, &args) {
                (Some(text), _) => Arguments::Text(&text.0),
                (None, Some(v)) => Arguments::Json(v),
                (None, None) => Arguments::Absent,
            };
            tools.call_args(&run, &name, args).await
        });
        let result = task.await.map_err(|e| {
            ErrorData::internal_error(format!("the tool call task failed: {e}"), None)
        })?;
        Ok(to_call_tool_result(&result).into())
    }
}

type CallResult = Result<CallToolResponse, ErrorData>;

/// The rmcp `Tool` for a definition.
pub fn to_mcp_tool(def: &ToolDefinition) -> rmcp::model::Tool {
    let a = def.annotations;
    rmcp::model::Tool::new(def.name, def.description, Arc::new(def.input_schema.clone()))
        .with_annotations(ToolAnnotations::from_raw(
            None,
            a.read_only_hint,
            a.destructive_hint,
            a.idempotent_hint,
            a.open_world_hint,
        ))
}

/// The rmcp `CallToolResult` for a dispatch result: one text block, `isError`, and
/// `structuredContent` for object outputs (as [`ToolResult::to_mcp`]).
pub fn to_call_tool_result(result: &ToolResult) -> CallToolResult {
    let content = vec![ContentBlock::text(result.text.clone())];
    if result.is_error {
        return CallToolResult::error(content);
    }
    let mut out = CallToolResult::success(content);
    if result.content.is_object() {
        out.structured_content = Some(result.content.clone());
    }
    out
}

impl ServerHandler for IdemServer {
    fn get_info(&self) -> ServerConfig {
        let config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(self.implementation.clone());
        match &self.instructions {
            Some(text) => config.with_instructions(text.clone()),
            None => config,
        }
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.definitions().map(to_mcp_tool).collect()))
    }

    async fn call_tool(
        &self,
        mut request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> CallResult {
        // rmcp moves the request's `_meta` into the context; read both in case a version keeps it.
        let mut meta = context.meta.0.0;
        if let Some(own) = request.meta.take() {
            meta.extend(own.0.0);
        }
        let text = context.extensions.get::<jsonrpc::ArgumentsText>().cloned();
        self.call(request, meta, text).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem_core::{Classify, Failure, tool};
    use serde_json::json;

    use super::*;

    #[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
    #[error("declined")]
    struct Declined;

    impl Classify for Declined {
        fn classify(&self) -> Failure {
            Failure::permanent()
        }
    }

    static ORDERS: AtomicU32 = AtomicU32::new(0);

    /// Place an order.
    #[tool(retry = "keyed")]
    async fn place_order(item: String) -> Result<serde_json::Value, Declined> {
        let n = ORDERS.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(json!({ "order": n, "item": item }))
    }

    fn server() -> IdemServer {
        let tools = ToolSet::new().with(PlaceOrderTool).unwrap();
        IdemServer::new(tools, &Idem::in_memory())
    }

    fn params(v: Value) -> CallToolRequestParams {
        serde_json::from_value(v).unwrap()
    }

    fn meta(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_rmcp_tool_matches_the_tool_set_definition() {
        let server = server();
        let def = server.tools().definition("place_order").unwrap();
        let tool = serde_json::to_value(to_mcp_tool(def)).unwrap();
        assert_eq!(tool, def.to_mcp());
        assert_eq!(tool["annotations"], json!({"readOnlyHint": false, "idempotentHint": true}));
    }

    #[tokio::test]
    async fn unknown_tool_and_bad_meta_are_invalid_params() {
        let server = server();
        let Err(e) = server.call(params(json!({"name": "nope"})), Map::new(), None).await else {
            panic!("an unknown tool was answered")
        };
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert_eq!(e.message, "Unknown tool: nope");
        let call = params(json!({"name": "place_order", "arguments": {"item": "a"}}));
        let Err(e) = server.call(call, meta(json!({"idem/idempotencyKey": ""})), None).await else {
            panic!("an empty idempotency key was accepted")
        };
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    }

    #[tokio::test]
    async fn calls_are_scoped_to_the_meta_run_or_the_session() {
        let (a, b) = (server(), server());
        let before = ORDERS.load(Ordering::SeqCst);
        let call = || params(json!({"name": "place_order", "arguments": {"item": "scope-test"}}));
        let run = || meta(json!({"idem/run": "conv-1"}));
        // Two sessions on one store would be two processes; here each server has its own
        // in-memory store, so only the session scope is observable across them.
        let complete = |r: CallResult| match r {
            Ok(CallToolResponse::Complete(result)) => result,
            other => panic!("not a complete result: {other:?}"),
        };
        let first = complete(a.call(call(), run(), None).await);
        let again = complete(a.call(call(), run(), None).await);
        assert_eq!(first, again);
        a.call(call(), Map::new(), None).await.unwrap();
        a.call(call(), Map::new(), None).await.unwrap();
        b.call(call(), Map::new(), None).await.unwrap();
        assert_eq!(ORDERS.load(Ordering::SeqCst) - before, 3, "conv-1, session a, session b");
        assert_eq!(first.is_error, Some(false));
        assert_eq!(first.structured_content.unwrap()["item"], "scope-test");
    }

    #[tokio::test]
    async fn bad_arguments_are_an_is_error_result() {
        let server = server();
        let call = params(json!({"name": "place_order", "arguments": {"item": 5}}));
        let CallToolResponse::Complete(result) = server.call(call, Map::new(), None).await.unwrap()
        else {
            panic!("not a complete result")
        };
        assert_eq!(result.is_error, Some(true));
        let text = serde_json::to_value(&result.content[0]).unwrap()["text"].clone();
        assert!(text.as_str().unwrap().contains("field `item`"), "{text}");
    }
}

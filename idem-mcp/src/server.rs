//! [`IdemServer`]: an MCP server whose tools are one idem [`ToolSet`], over any rmcp transport.

use idem_core::toolset::MissingRun;
use idem_core::{Idem, Run, ToolSet};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

use crate::tools::{IdemTools, RUN_ID_INSTRUCTIONS};
use crate::{ServeError, stdio};

/// The answer to a `tools/list` cursor: this server never issues one.
const INVALID_CURSOR: &str = "this cursor was not issued by this server: its tools/list result holds \
every tool in one page and has no `nextCursor`; send tools/list without a cursor";

/// An MCP server over a [`ToolSet`]. One value serves one connection (one session).
#[derive(Clone, Debug)]
pub struct IdemServer {
    tools: IdemTools,
    implementation: Implementation,
    instructions: Option<String>,
}

impl IdemServer {
    /// A server for `tools` on `idem`; calls without `_meta["idem/run"]` are scoped to a new run
    /// id for this session (`mcp-session-<pid>-<start ns>-<n>`).
    pub fn new(tools: ToolSet, idem: &Idem) -> Self {
        IdemServer::from_tools(IdemTools::new(tools, idem))
    }

    /// A server whose calls without `_meta["idem/run"]` use `session` (its scope, tenant and
    /// caller key).
    pub fn with_session_run(tools: ToolSet, session: Run) -> Self {
        IdemServer::from_tools(IdemTools::with_session_run(tools, session))
    }

    /// A server over `tools`.
    pub fn from_tools(tools: IdemTools) -> Self {
        IdemServer {
            tools,
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

    /// Instructions for the model, reported in `initialize` after [`RUN_ID_INSTRUCTIONS`].
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// See [`IdemTools::with_missing_run`].
    pub fn with_missing_run(mut self, missing_run: MissingRun) -> Self {
        self.tools = self.tools.with_missing_run(missing_run);
        self
    }

    /// The run used when a call names none. Over HTTP, a run made by `new` is the base of each
    /// MCP session's own (its id, `-`, the session's id), in the request's principal.
    pub fn session_run(&self) -> &Run {
        self.tools.session_run()
    }

    /// The tools.
    pub fn tools(&self) -> &IdemTools {
        &self.tools
    }

    /// Serves this session over stdin/stdout ([`stdio::stdio`]) until the client closes it, then
    /// waits for the calls still running ([`IdemTools::calls_finished`]): a client that closes
    /// stdin while a call is in flight (it gave up, or it is restarting the server) finds the
    /// call's outcome stored when it calls again, and its repeat is replayed.
    ///
    /// SIGTERM, SIGINT and SIGHUP (Ctrl-C off Unix) end the session as EOF does: hosts stop a
    /// stdio server by closing stdin, then SIGTERM, then SIGKILL, about 2 s apart (the MCP
    /// TypeScript SDK, VS Code), so a call still running when SIGTERM comes gets until the
    /// SIGKILL to finish and be stored instead of being cut off at once; a call that is waiting
    /// to retry, or waiting for another owner, starts nothing more and releases its key
    /// ([`IdemTools::stop_calls`]). A second signal stops the wait: the calls still running are
    /// left to their leases. The handlers are installed
    /// for the whole process when this is called.
    ///
    /// Errors: [`ServeError`].
    pub async fn serve_stdio(self) -> Result<(), ServeError> {
        let tools = self.tools.clone();
        let session = async {
            let running = self
                .serve(stdio::stdio())
                .await
                .map_err(|e| ServeError::Initialize(Box::new(e)))?;
            let reason = running.waiting().await?;
            tracing::debug!(?reason, "MCP session ended");
            Ok(())
        };
        // On a signal the session is dropped, which cancels it: no request is read after it.
        tools.serve_until_shutdown(session).await.unwrap_or(Ok(()))
    }
}

impl ServerHandler for IdemServer {
    fn get_info(&self) -> ServerConfig {
        let instructions = match &self.instructions {
            Some(text) => format!("{RUN_ID_INSTRUCTIONS}\n\n{text}"),
            None => RUN_ID_INSTRUCTIONS.to_owned(),
        };
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(self.implementation.clone())
            .with_instructions(instructions)
    }

    /// Every tool in one page, without a `nextCursor`. So no cursor is valid here, and one is
    /// refused with -32602 (MCP 2025-11-25 "Pagination": an invalid cursor SHOULD be Invalid
    /// params) instead of answering the first page again to a client that thinks it is paging.
    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        if request.is_some_and(|r| r.cursor.is_some()) {
            return Err(ErrorData::invalid_params(INVALID_CURSOR, None));
        }
        Ok(ListToolsResult::with_all_items(self.tools.list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.tools.call(&request.name, request.arguments, context).await
    }
}

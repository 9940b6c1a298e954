//! idem tools inside an rmcp server of one's own: a plain rmcp `#[tool]` (`echo`) in a
//! `#[tool_router]`, and idem tools (`create_ticket`, keyed; `ticket_count`, safe) merged into
//! the same router. The server keeps its own `ServerHandler`; idem adds tools, nothing else.
//!
//! ```text
//! cargo run -p idem-mcp --example mixed_mcp
//! ```
//!
//! Serves MCP over stdio ([`idem_mcp::stdio`], which answers every request line, even one rmcp
//! could not parse). Records live in memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::{Classify, Failure, Idem, ToolSet};
use idem_mcp::{IdemTools, RUN_ID_INSTRUCTIONS};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};

/// The user's own server, as rmcp's macros build it.
#[derive(Clone)]
struct Desk {
    tool_router: ToolRouter<Desk>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// The text to send back.
    text: String,
}

#[tool_router]
impl Desk {
    /// A plain rmcp tool: nothing to protect, so idem is not involved.
    #[tool(description = "Send the text back unchanged.")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Desk {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mixed_mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "{RUN_ID_INSTRUCTIONS}\n\nA help desk: echo, create_ticket, ticket_count."
            ))
    }
}

/// The help desk's backend: tickets opened so far.
#[derive(Default)]
struct Tickets {
    opened: AtomicU64,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("the ticket system refused: {0}")]
struct Refused(String);

impl Classify for Refused {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

#[derive(Serialize, Deserialize)]
struct Ticket {
    ticket: u64,
    title: String,
}

// The idem tools' own type, not the server's `#[tool_router]` block: rmcp's macro would read
// their `#[tool]` as its own. With rmcp's `tool` imported, idem's is written by its path.
impl Tickets {
    /// Open a ticket titled `title`. A repeat with the same title in the same run returns the
    /// first ticket.
    #[idem_core::tool(retry = "keyed")]
    async fn create_ticket(&self, title: String) -> Result<Ticket, Refused> {
        if title.is_empty() {
            return Err(Refused("a ticket needs a title".into()));
        }
        let ticket = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Ticket { ticket, title })
    }

    /// How many tickets were opened.
    #[idem_core::tool(retry = "safe")]
    async fn ticket_count(&self) -> Result<u64, Refused> {
        Ok(self.opened.load(Ordering::SeqCst))
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match serve().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("mixed_mcp: {message}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn serve() -> Result<(), String> {
    let tickets = Arc::new(Tickets::default());
    let set = ToolSet::new()
        .with(tickets.create_ticket_tool())
        .and_then(|s| s.with(tickets.ticket_count_tool()))
        .map_err(|e| e.to_string())?;
    let idem = IdemTools::new(set, &Idem::in_memory());
    // The server's own router plus idem's: one `tools/list`, one `tools/call`. A name in both
    // is refused here rather than one tool silently replacing the other.
    let desk = Desk { tool_router: idem.mount(Desk::tool_router()).map_err(|e| e.to_string())? };
    let running = desk.serve(idem_mcp::stdio::stdio()).await.map_err(|e| e.to_string())?;
    // The client may close stdin, or its host send SIGTERM, while a call is in flight: let it
    // finish and store its outcome before the process exits, so the client's repeat is replayed.
    match idem.serve_until_shutdown(running.waiting()).await {
        Some(ended) => ended.map(drop).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

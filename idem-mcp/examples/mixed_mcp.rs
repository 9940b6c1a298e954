//! idem tools inside an rmcp server of one's own: a plain rmcp `#[tool]` (`echo`) in a
//! `#[tool_router]`, and idem tools (`create_ticket`, keyed; `ticket_count`, safe) merged into
//! the same router. The server keeps its own `ServerHandler`; idem adds tools, nothing else.
//!
//! ```text
//! cargo run -p idem-mcp --example mixed_mcp
//! MIXED_TOKENS=tok-alice=alice cargo run -p idem-mcp --features http --example mixed_mcp -- --http 127.0.0.1:8080
//! ```
//!
//! Serves MCP over stdio ([`idem_mcp::stdio`], which answers every request line, even one rmcp
//! could not parse), or with `--http ADDR` over streamable HTTP at `http://ADDR/mcp`
//! ([`idem_mcp::http::service_for`]: the same server, one per session, behind idem's checks).
//! Over HTTP a request needs `Authorization: Bearer TOKEN` with a token of `MIXED_TOKENS`
//! (`token=user,token=user`), else HTTP 401; the token's user is the principal, the scope of
//! every key. Records live in memory.

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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let served = match args.as_slice() {
        [] => serve().await,
        [flag, addr] if flag == "--http" => serve_http(addr).await,
        _ => Err("usage: mixed_mcp [--http ADDR]".to_owned()),
    };
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("mixed_mcp: {message}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The help desk's idem tools, over one store.
fn idem_tools() -> Result<IdemTools, String> {
    let tickets = Arc::new(Tickets::default());
    let set = ToolSet::new()
        .with(tickets.create_ticket_tool())
        .and_then(|s| s.with(tickets.ticket_count_tool()))
        .map_err(|e| e.to_string())?;
    Ok(IdemTools::new(set, &Idem::in_memory()))
}

async fn serve() -> Result<(), String> {
    let idem = idem_tools()?;
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

#[cfg(not(feature = "http"))]
async fn serve_http(addr: &str) -> Result<(), String> {
    Err(format!("--http {addr}: this build has no HTTP server; run with `--features http`"))
}

#[cfg(feature = "http")]
#[path = "common/bearer.rs"]
mod bearer;

#[cfg(feature = "http")]
async fn serve_http(addr: &str) -> Result<(), String> {
    let tokens = bearer::tokens(&std::env::var("MIXED_TOKENS").unwrap_or_default());
    // One `IdemTools` for every session: its calls are the ones a shutdown waits for.
    let idem = idem_tools()?.with_principal(bearer::principal);
    let router = idem.mount(Desk::tool_router()).map_err(|e| e.to_string())?;
    let make = move || Desk { tool_router: router.clone() };
    let config = idem_mcp::http::StreamableHttpServerConfig::default();
    let sessions = idem_mcp::http::SessionConfig::default();
    let mcp = idem_mcp::http::service_for(make, idem.principal_fn(), config, sessions);
    let shutdown = mcp.shutdown();
    let app = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(tokens, bearer::authenticate));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("mixed_mcp: listening on http://{local}/mcp");
    // SIGTERM lets the calls in flight finish and reach their clients, then exits.
    let served = shutdown
        .serve(idem, |draining| {
            axum::serve(listener, app).with_graceful_shutdown(draining).into_future()
        })
        .await;
    match served {
        idem_mcp::http::Served::Ended(served) => served.map_err(|e| e.to_string()),
        idem_mcp::http::Served::Drained => Ok(()),
        idem_mcp::http::Served::Cut { calls } => {
            Err(format!("stopped by a second signal with {calls} call(s) still running"))
        }
    }
}

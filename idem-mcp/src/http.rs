//! Remote MCP over streamable HTTP (feature `http`), on rmcp's server transport, with every
//! caller's records inside the scope of its principal.
//!
//! One HTTP server serves many users, and `_meta["idem/run"]` and `_meta["idem/idempotencyKey"]`
//! are chosen by the client: without more, user B could send A's run id and A's arguments and
//! be answered with A's stored result. So over HTTP the scope of every key is the principal (the
//! authenticated identity the app's auth layer puts in the request: a bearer token's user, an
//! OAuth subject) plus the run, and a run id or caller key is only looked up inside it:
//!
//! - The app supplies a [`PrincipalFn`] from the request head (`http::request::Parts`, whose
//!   extensions hold what its auth middleware inserted) to the principal, with
//!   [`IdemTools::with_principal`](crate::IdemTools::with_principal).
//! - A `keyed` or `never` call that arrives over HTTP when no principal function is configured,
//!   or for which it finds no principal, is refused with an `isError` result naming what is
//!   missing; nothing runs. `safe` calls still run (in the session's own run).
//! - Authentication itself (HTTP 401 for a missing or unknown token) is the app's layer in front
//!   of this service, as in `examples/payments_mcp.rs --http`.
//!
//! ```no_run
//! # async fn demo(make: impl Fn() -> idem_mcp::IdemServer + Send + Sync + 'static) -> std::io::Result<()> {
//! use idem_mcp::http::{StreamableHttpServerConfig, service};
//! // let app = axum::Router::new().nest_service("/mcp", service(make, StreamableHttpServerConfig::default()));
//! let _mcp = service(make, StreamableHttpServerConfig::default());
//! # Ok(()) }
//! ```

use std::sync::Arc;

pub use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
pub use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService,
};

use crate::IdemServer;

/// The app's function from an HTTP request's head to its principal (`None`: the request has
/// none, and `keyed`/`never` calls are refused). It sees the head as the app's middleware left
/// it: headers, and extensions such as an authenticated user id.
pub type PrincipalFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// rmcp's streamable HTTP service over a new [`IdemServer`] from `make` for each MCP session
/// (sessions in memory). A tower service: mount it in an app's router, e.g.
/// `axum::Router::new().nest_service("/mcp", service(make, config))`, behind the app's auth.
pub fn service(
    make: impl Fn() -> IdemServer + Send + Sync + 'static,
    config: StreamableHttpServerConfig,
) -> StreamableHttpService<IdemServer, LocalSessionManager> {
    StreamableHttpService::new(move || Ok(make()), Arc::new(LocalSessionManager::default()), config)
}

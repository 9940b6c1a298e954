//! # idem-mcp: serve an idem [`ToolSet`](idem_core::ToolSet) over MCP
//!
//! An MCP server (spec 2025-11-25) on the official Rust SDK, `rmcp`, that serves any
//! [`ToolSet`](idem_core::ToolSet) over stdio, or over streamable HTTP with the feature `http`
//! (the `http` module). Every `tools/call` goes through the idem protocol, so a client that
//! times out and calls again, or sends the same call twice at once, causes one effect.
//!
//! - `tools/list`: the set's definitions: name, description, `inputSchema` (schemars), and
//!   `annotations` derived from the retry class (see [`idem_core::Annotations`]), all in one
//!   page without a `nextCursor`, so a request with a `cursor` is refused with -32602 (MCP
//!   2025-11-25 "Pagination": an invalid cursor is Invalid params). A `cursor` that is not a
//!   string is refused by the transport for every list method, also those of a user's own rmcp
//!   server: rmcp would ignore it and answer the first page. A user's server that merges
//!   [`IdemTools::router`] keeps its own `tools/list` and its own answer to string cursors.
//! - `tools/call`: tool failures (bad arguments, tool errors, outcome unknown, store
//!   unavailable, ...) are results with `isError: true` whose text the model can read. An
//!   unknown tool, or an ill-formed idem `_meta` entry, is a protocol error (JSON-RPC -32602,
//!   MCP spec 2025-11-25 "Error Handling").
//! - Scope: the key scope is the run. A request may name it in `_meta["idem/run"]`
//!   ([`MCP_META_RUN`]; at most [`MAX_META_ID_BYTES`] bytes, a longer one is -32602); otherwise
//!   the run is the MCP session: one id per server connection. Name the run when the same
//!   conversation may reach another server process (a restart, a second replica), or repeats
//!   will not be recognised there. The server's `instructions` say so
//!   ([`RUN_ID_INSTRUCTIONS`]); a `keyed` or `never` call without it is logged as a warning, or
//!   refused ([`IdemServer::with_missing_run`]).
//! - Results carry `_meta` with the run (`idem/run`), the key (`idem/key`) and how the call
//!   was served (`idem/outcome`: `executed`, `replayed`, `joined`, `taken_over`, `reconciled`,
//!   or `unknown` when the call's outcome is not known; see [`idem_core::Served`]).
//! - A call that waits on another owner of its key (a duplicate in flight, here or in another
//!   process) sends `notifications/progress` every [`PROGRESS_INTERVAL`] when the request has a
//!   `progressToken`, and one last when it stops waiting to run the tool itself (the other
//!   owner's lease ended or it let go). Cancelling a waiting request does not cancel the run it
//!   waits on. A cancelled request (`notifications/cancelled`) starts nothing more: an attempt in
//!   progress finishes and its outcome is stored for a repeat, but no retry, and no first attempt
//!   after a wait, starts after the client has gone ([`idem_core::StopSignal`]).
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
//! - Shutdown: [`IdemServer::serve_stdio`] ends the session on EOF and on SIGTERM, SIGINT or
//!   SIGHUP (hosts close stdin, then SIGTERM, then SIGKILL, about 2 s apart), then waits for the
//!   calls still running so that their outcomes are stored; a second signal stops the wait.
//!
//! Two ways to serve: [`IdemServer`], a `ServerHandler` whose tools are the set; or
//! [`IdemTools::router`], an rmcp `ToolRouter` to merge with a server's own `#[tool_router]`
//! (its tools, prompts and resources stay as they are; see `examples/mixed_mcp.rs`).
//!
//! ```no_run
//! # async fn demo(tools: idem_core::ToolSet) -> Result<(), idem_mcp::ServeError> {
//! let idem = idem_core::Idem::in_memory();
//! idem_mcp::IdemServer::new(tools, &idem).serve_stdio().await
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "http")]
pub mod http;
pub mod jsonrpc;
mod server;
mod shutdown;
mod stdin;
pub mod stdio;
mod tools;

pub use idem_core::toolset::{
    MAX_META_ID_BYTES, MCP_META_IDEMPOTENCY_KEY, MCP_META_KEY, MCP_META_OUTCOME, MCP_META_RUN,
    MissingRun,
};
/// The rmcp that idem-mcp is built with: [`IdemTools::mount`] takes this version's
/// `ToolRouter`, so a server of yours that mounts idem tools uses the same (another major version
/// is another type).
pub use rmcp;
pub use server::IdemServer;
pub use tools::{
    IdemTools, LATE_COMPLETIONS_AT_EXIT, NameCollision, PROGRESS_INTERVAL, RUN_ID_INSTRUCTIONS,
    to_call_tool_result, to_mcp_tool,
};

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

#[cfg(test)]
mod tests {
    use idem_core::{Classify, Failure, Idem, ToolSet, tool};
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

    /// Place an order.
    #[tool(retry = "keyed")]
    async fn place_order(item: String) -> Result<serde_json::Value, Declined> {
        Ok(json!({ "item": item }))
    }

    fn tools() -> ToolSet {
        ToolSet::new().with(PlaceOrderTool).unwrap()
    }

    /// A charge whose provider takes 3.2 s, under a lease of 300 ms: a duplicate waiting for it
    /// wakes at each end of the lease the leader has renewed, so its wait hook fires every few
    /// hundred milliseconds.
    #[tool(retry = "keyed", lease = "300ms")]
    async fn slow_charge(item: String) -> Result<serde_json::Value, Declined> {
        tokio::time::sleep(std::time::Duration::from_millis(3200)).await;
        Ok(json!({ "item": item }))
    }

    /// A client of an [`IdemServer`] over an in-memory byte stream, sending and reading
    /// JSON-RPC lines; initialized.
    struct Client {
        write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
        lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    }

    impl Client {
        async fn connect(set: ToolSet, idem: &Idem) -> Client {
            Client::serving(IdemServer::new(set, idem)).await
        }

        /// A client of `server` over the stdio transport, past the handshake.
        async fn serving(server: impl rmcp::ServerHandler) -> Client {
            Client::initialized(Client::stream_to(server)).await
        }

        /// The client's end of a stream `server` serves over the stdio transport (in a task),
        /// before any handshake.
        fn stream_to(server: impl rmcp::ServerHandler) -> tokio::io::DuplexStream {
            let (client, server_end) = tokio::io::duplex(1 << 16);
            let (server_read, server_write) = tokio::io::split(server_end);
            tokio::spawn(async move {
                use rmcp::ServiceExt;
                let transport = stdio::LineTransport::new(server_read, server_write);
                if let Ok(running) = server.serve(transport).await {
                    let _ = running.waiting().await;
                }
            });
            client
        }

        /// A client on its end of a stream, with no handshake (a connection that opens no
        /// session).
        fn raw(stream: tokio::io::DuplexStream) -> Client {
            use tokio::io::AsyncBufReadExt;
            let (read, write) = tokio::io::split(stream);
            Client { write, lines: tokio::io::BufReader::new(read).lines() }
        }

        /// A client on its end of a stream a server serves, past the handshake.
        async fn initialized(stream: tokio::io::DuplexStream) -> Client {
            let mut client = Client::raw(stream);
            client
                .send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"}}}))
                .await;
            let init = client.next().await;
            assert_eq!(init["id"], 0, "{init}");
            client.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
            client
        }

        async fn send(&mut self, message: serde_json::Value) {
            use tokio::io::AsyncWriteExt;
            self.write.write_all(format!("{message}\n").as_bytes()).await.unwrap();
        }

        async fn next(&mut self) -> serde_json::Value {
            let line =
                tokio::time::timeout(std::time::Duration::from_secs(60), self.lines.next_line())
                    .await
                    .expect("a message within a minute")
                    .unwrap()
                    .expect("the server answers");
            serde_json::from_str(&line).unwrap()
        }

        /// Reads until `n` responses came: them, and the progress notifications' params.
        async fn responses(
            &mut self,
            n: usize,
        ) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
            let (mut answered, mut progress) = (Vec::new(), Vec::new());
            while answered.len() < n {
                let message = self.next().await;
                if message["method"] == "notifications/progress" {
                    progress.push(message["params"].clone());
                } else {
                    answered.push(message);
                }
            }
            (answered, progress)
        }
    }

    /// One server cloned into the server of each connection a process accepts (a socket
    /// listener handing each client `server.clone()`): a call that names no run is scoped to its
    /// connection, so the same order placed over a second connection is placed again, and its
    /// repeat over that connection is replayed. Before, every connection shared the one run, and
    /// the second connection's order was answered with the first's.
    #[tokio::test]
    async fn connections_of_one_shared_server_each_have_their_own_run() {
        let server = IdemServer::new(tools(), &Idem::in_memory());
        let order = |id: i64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "place_order", "arguments": {"item": "tea"}}})
        };
        let outcome =
            |answer: &serde_json::Value| answer["result"]["_meta"]["idem/outcome"].clone();
        let mut first = Client::serving(server.clone()).await;
        let mut second = Client::serving(server.clone()).await;
        first.send(order(1)).await;
        assert_eq!(outcome(&first.next().await), "executed");
        second.send(order(2)).await;
        let other = second.next().await;
        assert_eq!(outcome(&other), "executed", "a second connection: {other}");
        second.send(order(3)).await;
        assert_eq!(outcome(&second.next().await), "replayed", "its repeat");
        first.send(order(4)).await;
        let again = first.next().await;
        assert_eq!(outcome(&again), "replayed", "the first connection's repeat: {again}");
        // The first connection keeps the server's session run.
        assert_eq!(again["result"]["_meta"]["idem/run"], server.session_run().scope().run_id());
    }

    static ORDERS_WITHOUT_TIMERS: std::sync::atomic::AtomicU32 =
        std::sync::atomic::AtomicU32::new(0);

    /// Place an order (counted).
    #[tool(retry = "keyed")]
    async fn count_order(item: String) -> Result<serde_json::Value, Declined> {
        ORDERS_WITHOUT_TIMERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(json!({ "item": item }))
    }

    /// A server on a runtime built without timers answers a call that carries a progress token
    /// with the configuration error a call without one gets, and runs nothing. Before, the
    /// handler made its progress clock first, and Tokio's panic ended the request unanswered.
    #[tokio::test]
    async fn a_server_without_timers_refuses_a_call_with_a_progress_token() {
        let (client, server_end) = tokio::io::duplex(1 << 16);
        let server = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            runtime.block_on(async move {
                use rmcp::ServiceExt;
                let (read, write) = tokio::io::split(server_end);
                let set = ToolSet::new().with(CountOrderTool).unwrap();
                let server = IdemServer::new(set, &Idem::in_memory());
                if let Ok(running) = server.serve(stdio::LineTransport::new(read, write)).await {
                    let _ = running.waiting().await;
                }
            });
        });
        let mut client = Client::initialized(client).await;
        for (id, meta) in [(1, json!({})), (2, json!({"progressToken": "tok"}))] {
            client
                .send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                    "name": "count_order", "arguments": {"item": "tea"}, "_meta": meta}}))
                .await;
            let answer = client.next().await;
            assert_eq!(answer["id"], id, "{answer}");
            assert_eq!(answer["result"]["isError"], true, "{answer}");
            let text = answer["result"]["content"][0]["text"].as_str().unwrap_or_default();
            assert!(text.contains("enable_time"), "{answer}");
        }
        assert_eq!(ORDERS_WITHOUT_TIMERS.load(std::sync::atomic::Ordering::SeqCst), 0);
        drop(client);
        server.join().unwrap();
    }

    /// The same, over connections that open no session (MCP 2026-07-28: each request carries
    /// the client's protocol version and capabilities, and no `initialize` comes): rmcp keeps no
    /// client info for such a connection, and every one of them got the server's session run, so
    /// the second connection's order was answered with the first's.
    #[tokio::test]
    async fn sessionless_connections_of_one_shared_server_each_have_their_own_run() {
        let server = IdemServer::new(tools(), &Idem::in_memory());
        let connect = |server: IdemServer| Client::raw(Client::stream_to(server));
        let order = |id: i64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "place_order", "arguments": {"item": "tea"}, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {}}}})
        };
        let outcome =
            |answer: &serde_json::Value| answer["result"]["_meta"]["idem/outcome"].clone();
        let mut first = connect(server.clone());
        let mut second = connect(server.clone());
        first.send(order(1)).await;
        let placed = first.next().await;
        assert_eq!(outcome(&placed), "executed", "{placed}");
        second.send(order(2)).await;
        let other = second.next().await;
        assert_eq!(outcome(&other), "executed", "a second connection: {other}");
        second.send(order(3)).await;
        assert_eq!(outcome(&second.next().await), "replayed", "its repeat");
        first.send(order(4)).await;
        assert_eq!(outcome(&first.next().await), "replayed", "the first connection's repeat");
    }

    /// MCP 2025-11-25 "Progress": a call that waits on a duplicate for 3.2 s hears one
    /// notification when its wait starts and one per `PROGRESS_INTERVAL` (1 s) after it, so 4
    /// in all, with progress 1, 2, 3, 4: the hook firing again each time the waiter wakes is not
    /// another notification.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_of_known_length_hears_one_progress_notification_per_interval() {
        let set = ToolSet::new().with(SlowChargeTool).unwrap();
        let mut client = Client::connect(set, &Idem::in_memory()).await;
        let started = std::time::Instant::now();
        for id in [1, 2] {
            client
                .send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                    "name": "slow_charge", "arguments": {"item": "a"},
                    "_meta": {"idem/run": "conv-1", "progressToken": format!("tok-{id}")}}}))
                .await;
        }
        let (answered, progress) = client.responses(2).await;
        let waited = started.elapsed();
        let outcomes: Vec<_> =
            answered.iter().map(|a| a["result"]["_meta"]["idem/outcome"].clone()).collect();
        assert!(outcomes.contains(&json!("joined")), "{answered:?}");
        let tokens: std::collections::BTreeSet<_> =
            progress.iter().map(|p| p["progressToken"].to_string()).collect();
        assert!(tokens.len() <= 1, "only the joiner waits: {progress:?}");
        let values: Vec<f64> = progress.iter().filter_map(|p| p["progress"].as_f64()).collect();
        assert!(values.windows(2).all(|w| w[0] < w[1]), "progress increases: {values:?}");
        // At most one at the start and one per whole interval of the wait (measured here, so
        // no shorter than the server's): the hook's own firings add none. At least the first
        // and one tick: the joiner's wait can start late on a loaded machine, so no more is
        // certain.
        let most = 1 + (waited.as_millis() / PROGRESS_INTERVAL.as_millis()) as usize;
        assert!(
            (2..=most).contains(&values.len()),
            "{} notifications in a wait of {waited:?}, expected 2 to {most}: {values:?}",
            values.len()
        );
    }

    /// Bodies of `stall` started: the first one never ends (its owner dies), the others take
    /// 2.5 s, long enough for two progress intervals.
    static STALL_STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// A charge whose first owner hangs until it is killed.
    #[tool(retry = "keyed", lease = "300ms")]
    async fn stall(item: String) -> Result<serde_json::Value, Declined> {
        if STALL_STARTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        Ok(json!({ "item": item }))
    }

    /// A request waits on an owner that dies, then owns the key and runs the tool itself for
    /// 2.5 s: its progress says so once, and no "waiting" notification follows (two would have,
    /// one per interval, while it ran).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_that_becomes_the_owner_stops_saying_it_waits() {
        let idem = Idem::in_memory();
        let set = ToolSet::new().with(StallTool).unwrap();
        let mut client = Client::connect(set, &idem).await;
        let run = idem.run("conv-1");
        let owner = tokio::spawn(async move { stall(&run, "a".into()).await });
        while STALL_STARTS.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        client
            .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "stall", "arguments": {"item": "a"},
                "_meta": {"idem/run": "conv-1", "progressToken": "tok-1"}}}))
            .await;
        // The request waits: its first notification.
        let first = client.next().await;
        assert_eq!(first["method"], "notifications/progress", "{first}");
        assert!(first["params"]["message"].as_str().unwrap().contains("waiting"), "{first}");
        owner.abort();
        assert!(owner.await.unwrap_err().is_cancelled());

        let (answered, progress) = client.responses(1).await;
        let result = &answered[0]["result"];
        assert_eq!(result["structuredContent"], json!({"item": "a"}), "{answered:?}");
        let outcome = result["_meta"]["idem/outcome"].as_str().unwrap();
        assert!(["executed", "taken_over"].contains(&outcome), "{outcome}");
        assert_eq!(STALL_STARTS.load(std::sync::atomic::Ordering::SeqCst), 2);
        let messages: Vec<&str> =
            progress.iter().map(|p| p["message"].as_str().unwrap_or_default()).collect();
        let ran = messages
            .iter()
            .position(|m| m.contains("now runs the tool"))
            .unwrap_or_else(|| panic!("no notification said the call runs the tool: {messages:?}"));
        assert_eq!(ran, messages.len() - 1, "nothing after it: {messages:?}");
        assert!(messages[..ran].iter().all(|m| m.contains("waiting")), "{messages:?}");
        let values: Vec<f64> = std::iter::once(&first["params"])
            .chain(&progress)
            .filter_map(|p| p["progress"].as_f64())
            .collect();
        assert!(values.windows(2).all(|w| w[0] < w[1]), "progress increases: {values:?}");
    }

    #[test]
    fn the_rmcp_tool_is_the_tool_set_definition() {
        let set = tools();
        let def = set.definition("place_order").unwrap();
        let tool = serde_json::to_value(to_mcp_tool(def).unwrap()).unwrap();
        assert_eq!(tool, def.to_mcp());
        assert_eq!(tool["annotations"], json!({"readOnlyHint": false, "idempotentHint": true}));
        let listed = json!([def.to_mcp()]);
        let router = IdemTools::new(set, &Idem::in_memory()).router::<()>();
        assert_eq!(serde_json::to_value(router.list_all()).unwrap(), listed);
    }

    /// The in-memory store behind a door that refuses every completion for its first 1.5 s, as
    /// a store that went away just as the tool finished; not local, so the executor goes
    /// through the `Store` trait as for a server.
    struct AwayAtFirst {
        inner: idem_core::MemoryStore,
        back_at: std::time::Instant,
    }

    #[async_trait::async_trait]
    impl idem_core::Store for AwayAtFirst {
        async fn claim(
            &self,
            req: idem_core::store::ClaimRequest<'_>,
        ) -> Result<idem_core::store::Claim, idem_core::StoreError> {
            self.inner.claim(req).await
        }
        async fn complete(
            &self,
            key: &idem_core::Key,
            fence: idem_core::store::Fence,
            outcome: &idem_core::store::Outcome,
            ttl: std::time::Duration,
        ) -> Result<(), idem_core::StoreError> {
            if std::time::Instant::now() < self.back_at {
                return Err(idem_core::StoreError::unavailable("away"));
            }
            self.inner.complete(key, fence, outcome, ttl).await
        }
        async fn release(
            &self,
            key: &idem_core::Key,
            fence: idem_core::store::Fence,
        ) -> Result<(), idem_core::StoreError> {
            self.inner.release(key, fence).await
        }
        async fn renew(
            &self,
            key: &idem_core::Key,
            fence: idem_core::store::Fence,
            lease: std::time::Duration,
        ) -> Result<(), idem_core::StoreError> {
            self.inner.renew(key, fence, lease).await
        }
        async fn wait(
            &self,
            key: &idem_core::Key,
            fence: idem_core::store::Fence,
            max: std::time::Duration,
        ) -> Result<(), idem_core::StoreError> {
            self.inner.wait(key, fence, max).await
        }
        async fn forget(&self, key: &idem_core::Key) -> Result<bool, idem_core::StoreError> {
            self.inner.forget(key).await
        }
    }

    /// A server that stops (`calls_finished`, as `serve_stdio` does when the client leaves)
    /// right after a call whose outcome the store refused waits for the outcome sent again in
    /// the background, so the record is complete when the process exits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopping_server_waits_for_outcomes_the_store_refused() {
        let back_at = std::time::Instant::now() + std::time::Duration::from_millis(1500);
        let store = AwayAtFirst { inner: idem_core::MemoryStore::new(), back_at };
        let idem = Idem::new(store);
        let server = IdemServer::new(tools(), &idem);
        let tools = server.tools().clone();
        let mut client = Client::serving(server).await;
        client
            .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "place_order", "arguments": {"item": "a"},
                "_meta": {"idem/run": "conv-1"}}}))
            .await;
        let answer = client.next().await;
        assert_eq!(answer["result"]["structuredContent"], json!({"item": "a"}), "{answer}");
        assert_eq!(idem.late_completions(), 1, "the store refused the outcome");
        tools.calls_finished().await;
        assert_eq!(idem.late_completions(), 0, "stored before the server stops");
        let replay = ToolSet::call(
            &self::tools(),
            &idem.run("conv-1"),
            "place_order",
            &json!({"item": "a"}),
        )
        .await;
        let replay = serde_json::to_value(to_call_tool_result(&replay).unwrap()).unwrap();
        assert_eq!(replay["_meta"]["idem/outcome"], "replayed", "{replay}");
    }

    /// A server of the app's own that rewrites a call's arguments before handing it to idem.
    struct Rewriting(IdemServer);

    impl rmcp::ServerHandler for Rewriting {
        async fn call_tool(
            &self,
            mut request: rmcp::model::CallToolRequestParams,
            context: rmcp::service::RequestContext<rmcp::RoleServer>,
        ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
            if let Some(arguments) = &mut request.arguments {
                arguments.insert("item".into(), json!("forced-by-server"));
            }
            self.0.call_tool(request, context).await
        }
    }

    /// Over stdio the transport keeps the arguments' text (for exact wide integers); when a
    /// server passes idem other arguments than the client sent, those are the call (what runs,
    /// and its key), not the client's text.
    #[tokio::test]
    async fn arguments_a_wrapping_server_passes_are_the_call() {
        let idem = Idem::in_memory();
        let mut client = Client::serving(Rewriting(IdemServer::new(tools(), &idem))).await;
        client
            .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "place_order", "arguments": {"item": "model-chosen"},
                "_meta": {"idem/run": "conv-1"}}}))
            .await;
        let answer = client.next().await;
        assert_eq!(answer["result"]["structuredContent"], json!({"item": "forced-by-server"}));
        let again = tools()
            .call(&idem.run("conv-1"), "place_order", &json!({"item": "forced-by-server"}))
            .await;
        let again = serde_json::to_value(to_call_tool_result(&again).unwrap()).unwrap();
        assert_eq!(again["_meta"]["idem/outcome"], "replayed", "the key of what ran: {again}");
    }

    #[tokio::test]
    async fn the_rmcp_result_is_the_tool_set_result_with_its_meta() {
        let set = tools();
        let run = Idem::in_memory().run("conv-1");
        let first = set.call(&run, "place_order", &json!({"item": "a"})).await;
        let again = set.call(&run, "place_order", &json!({"item": "a"})).await;
        let (first, again) =
            (to_call_tool_result(&first).unwrap(), to_call_tool_result(&again).unwrap());
        let (first, again) =
            (serde_json::to_value(first).unwrap(), serde_json::to_value(again).unwrap());
        assert_eq!(first["_meta"]["idem/run"], "conv-1");
        assert_eq!(first["_meta"]["idem/outcome"], "executed");
        assert_eq!(again["_meta"]["idem/outcome"], "replayed");
        assert_eq!(first["_meta"]["idem/key"], again["_meta"]["idem/key"]);
        assert_eq!(first["_meta"]["idem/key"].as_str().map(str::len), Some(64));
        assert_eq!(first["structuredContent"], json!({"item": "a"}));
    }

    static TRANSFERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// Send money; the provider refuses the first try with a 2 s retry-after (nothing happened).
    #[tool(retry = "keyed", attempts = 3)]
    async fn transfer(to: String) -> Result<serde_json::Value, idem_core::ToolFailure> {
        let n = TRANSFERS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n == 0 {
            let refused = idem_core::ToolFailure::transient("429 rate limited");
            return Err(refused.retry_after(std::time::Duration::from_secs(2)));
        }
        Ok(json!({ "to": to, "transfer": n }))
    }

    /// The user presses Stop while the call waits out a retry-after (its first attempt did
    /// nothing): after `notifications/cancelled` no further attempt starts, and the key is
    /// free, so a repeat runs the transfer once. Before, the retry ran 2 s after the cancel.
    #[tokio::test]
    async fn a_cancelled_call_starts_no_further_attempt() {
        use std::sync::atomic::Ordering;
        let idem = Idem::in_memory();
        let set = ToolSet::new().with(TransferTool).unwrap();
        let mut c = Client::connect(set, &idem).await;
        let call = |id: i64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "transfer", "arguments": {"to": "bob"},
                "_meta": {"idem/run": "conv-1"}}})
        };
        c.send(call(1)).await;
        while TRANSFERS.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 1, "reason": "the user pressed Stop"}}))
            .await;
        // Past the 2 s retry-after.
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        assert_eq!(TRANSFERS.load(Ordering::SeqCst), 1, "no attempt after the cancel");
        c.send(call(2)).await;
        let answer = c.next().await;
        assert_eq!(answer["id"], 2, "{answer}");
        assert_eq!(answer["result"]["_meta"]["idem/outcome"], "executed", "{answer}");
        assert_eq!(answer["result"]["structuredContent"]["transfer"], 1, "{answer}");
        assert_eq!(TRANSFERS.load(Ordering::SeqCst), 2);
    }

    static PAYOUTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// Pay out; the provider refuses the first try with a 2 s retry-after (nothing happened).
    #[tool(retry = "keyed", attempts = 3)]
    async fn payout(to: String) -> Result<serde_json::Value, idem_core::ToolFailure> {
        let n = PAYOUTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n == 0 {
            let refused = idem_core::ToolFailure::transient("429 rate limited");
            return Err(refused.retry_after(std::time::Duration::from_secs(2)));
        }
        Ok(json!({ "to": to, "payout": n }))
    }

    /// A shutdown (`IdemTools::stop_calls`, as `serve_stdio` does on SIGTERM) ends a call that
    /// waits to retry at once: it answers `cancelled`, starts no further attempt, and its key is
    /// free, so the repeat after a restart runs at once instead of waiting out a lease.
    #[tokio::test]
    async fn a_shutdown_ends_the_calls_waiting_to_retry_and_frees_their_keys() {
        use std::sync::atomic::Ordering;
        let idem = Idem::in_memory();
        let set = ToolSet::new().with(PayoutTool).unwrap();
        let server = IdemServer::new(set, &idem);
        let tools = server.tools().clone();
        let mut c = Client::serving(server).await;
        c.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "payout", "arguments": {"to": "bob"}, "_meta": {"idem/run": "conv-s"}}}))
            .await;
        while PAYOUTS.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        tools.stop_calls();
        let answer = c.next().await;
        assert_eq!(answer["id"], 1, "{answer}");
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        assert!(answer["result"]["content"][0]["text"].as_str().unwrap().contains("stopped"));
        tools.calls_finished().await;
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        assert_eq!(PAYOUTS.load(Ordering::SeqCst), 1, "no attempt after the shutdown");
        let set = ToolSet::new().with(PayoutTool).unwrap();
        let again = set.call(&idem.run("conv-s"), "payout", &json!({"to": "bob"})).await;
        assert!(!again.is_error, "{}", again.text);
        assert_eq!(PAYOUTS.load(Ordering::SeqCst), 2, "the key was free: the repeat ran");
    }
}

//! A newline-delimited JSON-RPC transport (MCP stdio) that answers every request it cannot pass
//! on, in front of rmcp's service loop.
//!
//! Each line goes through [`crate::jsonrpc::check_message`]: a well-formed message
//! goes to rmcp, a bad request is answered here with its id, a bad notification is dropped.
//! Outgoing messages are written by one task, one line each, so an answer written while rmcp
//! polls for the next message is never interleaved with another.
//!
//! A request whose `id` is that of a request still in flight is answered here with -32600 and
//! that id, and does not run: MCP 2025-11-25 "Basic" (Requests) says an id MUST NOT be reused in
//! a session, and rmcp would run the second request and drop its response (both share the id's
//! slot), so the client would never hear of an effect it caused. An id is free again once its
//! response is written. The id of a request the client cancels (`notifications/cancelled`) stays
//! taken for the rest of the session: rmcp's handler for it is not stopped, only told, and when
//! it answers, rmcp files the answer under whichever request holds the id then, so a new request
//! reusing the id would get the cancelled request's answer and lose its own.
//!
//! A second `initialize` on one connection is answered here with -32600 and its id (MCP
//! 2025-11-25 "Lifecycle": initialization happens once), as the HTTP service answers one naming a
//! live session; the session goes on as it was. A notification or a response that comes before
//! `initialize` is dropped: rmcp would end the whole session on it, before the client's
//! `initialize` is read.

use std::collections::HashSet;
use std::io;
use std::marker::PhantomData;

use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcMessage, RequestId,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use crate::stdin::Stdin;

use crate::jsonrpc::{
    CancelledIds, Inbound, check_message, error_reply, id_cancelled, id_in_ends, id_in_lossy,
    id_in_use,
};

/// The longest line accepted, in bytes (16 MiB, as rmcp's own stdio transport). A longer line
/// is skipped to its end and answered with -32600, with the request's id when its first 64 KiB
/// name it (the Python SDK writes `id` before `params`) or its last 64 KiB end with it (the
/// TypeScript SDK writes it last), else with a `null` id.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// How rmcp's answer to a request without a session begins.
const RMCP_MISSING_META: &str = "request _meta is missing or has malformed required fields";

/// What this transport adds to it before the client sent `initialize`.
const NOT_INITIALIZED: &str = ". No session has started on this connection: send `initialize` \
    first, then `notifications/initialized` (the MCP lifecycle), or name these fields in every \
    request's `_meta` (the sessionless lifecycle of MCP 2026-07-28)";

/// An MCP server transport over a byte stream pair (stdin/stdout, a socket, a pipe): one JSON-RPC
/// message per line, each request answered exactly once.
pub struct LineTransport<R, W> {
    read: BufReader<R>,
    line: Vec<u8>,
    max_line_bytes: usize,
    /// The line past the limit being skipped, if any.
    skipping: Option<Skipped>,
    writer: Writer<W>,
    /// The ids of the requests passed on to rmcp and not answered yet.
    in_flight: HashSet<RequestId>,
    /// The ids of requests the client cancelled while they were in flight, oldest first: never
    /// given to another request in this session (at most
    /// [`MAX_CANCELLED_IDS`](crate::jsonrpc::MAX_CANCELLED_IDS) kept).
    cancelled: CancelledIds<RequestId>,
    /// An `initialize` request came: the session's lifecycle has started.
    initialized: bool,
    /// rmcp serves the session: an `initialize`, or a request with the sessionless lifecycle's
    /// `_meta`, was passed on. Before, rmcp waits for one of them and ends the whole session on
    /// anything else.
    started: bool,
    /// The session started with a request naming its version in `_meta` (MCP 2026-07-28), not
    /// with `initialize`.
    sessionless: bool,
    /// This connection, put in each request's extensions: rmcp keeps no client info for a
    /// connection that opens no session (MCP 2026-07-28), so the tools tell connections apart by
    /// this.
    connection: Connection,
    _role: PhantomData<fn() -> RoleServer>,
}

/// One connection of a [`LineTransport`], in the extensions of each request read from it; alive
/// (strongly held) while the transport is.
#[derive(Clone, Default)]
pub(crate) struct Connection(pub(crate) std::sync::Arc<()>);

enum Writer<W> {
    /// Not started yet: the task is spawned on first use, inside the runtime.
    Idle(W),
    Running {
        tx: mpsc::UnboundedSender<Vec<u8>>,
        task: JoinHandle<()>,
    },
    Closed,
}

impl<R, W> std::fmt::Debug for LineTransport<R, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineTransport").field("max_line_bytes", &self.max_line_bytes).finish()
    }
}

/// The transport over this process's stdin and stdout. Stdin is read on a thread of its own
/// ([`Stdin`]), so a process whose session ended while its stdin is still open (a signal) exits
/// when `main` returns instead of waiting for a line.
pub fn stdio() -> LineTransport<Stdin, tokio::io::Stdout> {
    LineTransport::new(Stdin::new(), tokio::io::stdout())
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// Reads requests from `read`, writes responses and notifications to `write`.
    pub fn new(read: R, write: W) -> Self {
        LineTransport {
            read: BufReader::new(read),
            line: Vec::new(),
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            skipping: None,
            writer: Writer::Idle(write),
            in_flight: HashSet::new(),
            cancelled: CancelledIds::default(),
            initialized: false,
            started: false,
            sessionless: false,
            connection: Connection::default(),
            _role: PhantomData,
        }
    }

    /// Sets the longest line accepted, in bytes (default [`DEFAULT_MAX_LINE_BYTES`]).
    pub fn with_max_line_bytes(mut self, max_line_bytes: usize) -> Self {
        self.max_line_bytes = max_line_bytes;
        self
    }

    fn sender(&mut self) -> Option<&mpsc::UnboundedSender<Vec<u8>>> {
        if matches!(self.writer, Writer::Idle(_)) {
            let Writer::Idle(mut write) = std::mem::replace(&mut self.writer, Writer::Closed)
            else {
                return None;
            };
            let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
            let task = tokio::spawn(async move {
                while let Some(line) = rx.recv().await {
                    let written = async {
                        write.write_all(&line).await?;
                        // Flush when nothing else is queued, so a burst is one write.
                        if rx.is_empty() {
                            write.flush().await?;
                        }
                        io::Result::Ok(())
                    };
                    if let Err(e) = written.await {
                        tracing::error!(error = %e, "cannot write to the MCP client");
                        return;
                    }
                }
                let _ = write.flush().await;
            });
            self.writer = Writer::Running { tx, task };
        }
        match &self.writer {
            Writer::Running { tx, .. } => Some(tx),
            _ => None,
        }
    }

    fn queue(&mut self, message: &impl serde::Serialize) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(message).map_err(io::Error::other)?;
        bytes.push(b'\n');
        let tx = self.sender().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, "the transport is closed")
        })?;
        tx.send(bytes).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the writer stopped"))
    }

    /// Reads one line into `self.line` without letting it grow past the limit. Cancel-safe: a
    /// partial line stays in `self.line` for the next call.
    async fn read_line(&mut self) -> io::Result<Line> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                // A last line without its newline is still a message: the client closed its
                // input after writing it, and is waiting for the answer.
                if let Some(skipped) = self.skipping.take() {
                    return Ok(Line::TooLong(skipped.id()));
                }
                if !self.line.is_empty() {
                    return Ok(Line::Complete);
                }
                return Ok(Line::Eof);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let mut step = None;
            if self.line.len().saturating_add(take) > self.max_line_bytes && self.skipping.is_none()
            {
                // Only the ends are kept, for the id: clients write it before the params (the
                // Python SDK) or after them (the TypeScript SDK).
                self.skipping = Some(Skipped::new(std::mem::take(&mut self.line)));
            }
            if let Some(skipped) = &mut self.skipping {
                skipped.keep(&available[..take]);
                // Answered once its end is read: the id may be there.
                if newline.is_some() {
                    step = self.skipping.take().map(|s| Line::TooLong(s.id()));
                }
            } else {
                self.line.extend_from_slice(&available[..take]);
                if newline.is_some() {
                    step = Some(Line::Complete);
                }
            }
            self.read.consume(take);
            if let Some(step) = step {
                return Ok(step);
            }
        }
    }
}

impl<R, W> LineTransport<R, W> {
    /// Notes a request's id as in flight, or refuses the request when its id already is; frees
    /// the id of a request the client cancels (rmcp sends no response for it). `Ok(None)`: a
    /// notification or a response before the session started, dropped.
    fn track(
        &mut self,
        message: ClientJsonRpcMessage,
    ) -> Result<Option<ClientJsonRpcMessage>, serde_json::Value> {
        if !self.started && !matches!(message, JsonRpcMessage::Request(_)) {
            // rmcp ends the session on a message other than a request before it starts (MCP
            // "Lifecycle": initialization comes first); a notification is never answered, and
            // a response answers nothing the server asked yet.
            tracing::debug!("dropping a notification or a response sent before `initialize`");
            return Ok(None);
        }
        match &message {
            JsonRpcMessage::Request(request) => {
                let initialize = matches!(request.request, ClientRequest::InitializeRequest(_));
                // MCP 2025-11-25 "Lifecycle": initialization is the session's first interaction,
                // once. rmcp would negotiate again inside the running session, replacing the
                // client's version and capabilities under the calls in flight; the HTTP service
                // refuses the same (an `initialize` naming a live session).
                if initialize && self.initialized {
                    return Err(error_reply(
                        Some(&request.id),
                        rmcp::model::ErrorCode::INVALID_REQUEST,
                        "Invalid request: this session is already initialized (MCP \"Lifecycle\": \
                         `initialize` is sent once per connection); to start a new session, start \
                         a new connection",
                    ));
                }
                // rmcp would negotiate inside the sessionless lifecycle it already serves, and
                // then refuse every request that, as after an `initialize`, names no version.
                if initialize && self.sessionless {
                    return Err(error_reply(
                        Some(&request.id),
                        rmcp::model::ErrorCode::INVALID_REQUEST,
                        "Invalid request: this connection started without `initialize` (its first \
                         request carried `io.modelcontextprotocol/protocolVersion` in `_meta`), so \
                         every request names its version in `_meta`; to use `initialize`, start a \
                         new connection and send it first",
                    ));
                }
                if self.cancelled.contains(&request.id) {
                    return Err(id_cancelled(&request.id));
                }
                if !self.in_flight.insert(request.id.clone()) {
                    return Err(id_in_use(&request.id));
                }
                if initialize {
                    self.initialized = true;
                }
                // A request that carries the sessionless lifecycle's fields, naming a version
                // rmcp serves, starts that lifecycle; a `server/discover` probe does not. rmcp
                // refuses one naming another version (-32022) and keeps waiting for a start: the
                // session has not started, so a notification after it is dropped here.
                let meta = rmcp::model::GetMeta::get_meta(&request.request);
                let probe = matches!(request.request, ClientRequest::DiscoverRequest(_));
                let sessionless = !probe
                    && meta.protocol_version().is_some_and(|version| {
                        rmcp::model::ProtocolVersion::KNOWN_VERSIONS.contains(&version)
                    })
                    && meta
                        .missing_required_keys(&rmcp::model::ProtocolVersion::V_2026_07_28)
                        .is_empty();
                if !self.started && sessionless {
                    self.sessionless = true;
                }
                self.started |= initialize || sessionless;
            }
            JsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) =
                    &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                    && self.in_flight.remove(id)
                {
                    // Not free: its handler may still answer (see the module's doc). The id of a
                    // request already answered, or never sent, is left as it is.
                    self.cancelled.insert(id);
                }
            }
            _ => {}
        }
        let mut message = message;
        if let JsonRpcMessage::Request(request) = &mut message {
            let extensions = rmcp::model::GetExtensions::extensions_mut(&mut request.request);
            extensions.insert(self.connection.clone());
        }
        Ok(Some(message))
    }
}

enum Line {
    Complete,
    /// Skipped; with the id read from its head, when there is one.
    TooLong(Option<RequestId>),
    Eof,
}

/// How much of each end of a skipped line is searched for its id, in bytes.
const ID_SCAN_BYTES: usize = 64 * 1024;

/// The first and last [`ID_SCAN_BYTES`] of a line past the limit, as it is skipped.
struct Skipped {
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl Skipped {
    fn new(start: Vec<u8>) -> Skipped {
        let mut skipped = Skipped { head: Vec::new(), tail: Vec::new() };
        skipped.keep(&start);
        skipped
    }

    /// Notes the next bytes of the line.
    fn keep(&mut self, bytes: &[u8]) {
        let more = ID_SCAN_BYTES.saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..more]);
        let last = &bytes[bytes.len().saturating_sub(ID_SCAN_BYTES)..];
        let drop = (self.tail.len() + last.len()).saturating_sub(ID_SCAN_BYTES);
        self.tail.drain(..drop);
        self.tail.extend_from_slice(last);
    }

    fn id(&self) -> Option<RequestId> {
        id_in_ends(&self.head, &self.tail)
    }
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        mut item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        if !self.initialized
            && let JsonRpcMessage::Error(error) = &mut item
            && error.error.message.starts_with(RMCP_MISSING_META)
        {
            // rmcp answers a request sent before `initialize` as a request of the sessionless
            // lifecycle (MCP 2026-07-28) that lacks its `_meta` fields; a client of an earlier
            // version most likely forgot the handshake.
            error.error.message = format!("{}{NOT_INITIALIZED}", error.error.message).into();
        }
        let answered = match &item {
            JsonRpcMessage::Response(response) => Some(&response.id),
            JsonRpcMessage::Error(error) => error.id.as_ref(),
            _ => None,
        };
        if let Some(id) = answered {
            self.in_flight.remove(id);
        }
        std::future::ready(self.queue(&item))
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.read_line().await {
                Ok(Line::Complete) => {}
                Ok(Line::TooLong(id)) => {
                    let message = format!(
                        "Invalid request: the line is longer than {} bytes; nothing was done",
                        self.max_line_bytes
                    );
                    let reply =
                        error_reply(id.as_ref(), rmcp::model::ErrorCode::INVALID_REQUEST, message);
                    self.queue(&reply).ok()?;
                    continue;
                }
                Ok(Line::Eof) => return None,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read from the MCP client");
                    return None;
                }
            }
            let inbound = match std::str::from_utf8(&self.line) {
                Ok(text) => check_message(text.trim_end_matches(['\n', '\r'])),
                // With the id when it can be read, so the client hears at once why its request
                // failed instead of waiting out its timeout.
                Err(e) => Inbound::Reply(error_reply(
                    id_in_lossy(&self.line).as_ref(),
                    rmcp::model::ErrorCode::PARSE_ERROR,
                    format!(
                        "Parse error: the line is not UTF-8 ({e}); JSON text is UTF-8 (RFC 8259 §8.1): send the message encoded so"
                    ),
                )),
            };
            self.line.clear();
            match inbound {
                Inbound::Message(message) => match self.track(*message) {
                    Ok(Some(message)) => return Some(message),
                    Ok(None) => {}
                    Err(reply) => self.queue(&reply).ok()?,
                },
                Inbound::Reply(reply) => self.queue(&reply).ok()?,
                Inbound::Ignore => {}
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        if let Writer::Running { tx, task } = std::mem::replace(&mut self.writer, Writer::Closed) {
            drop(tx);
            task.await.map_err(io::Error::other)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    use super::*;

    /// Writes `lines`, which end with a ping (id 3), to a transport that reads lines of at most
    /// `max` bytes, and expects the ping to reach it; before it, the client reads one error reply
    /// per refused line, with the ids `ids` in order, the code `code` and a message saying `says`.
    async fn refused_before_the_ping(
        lines: Vec<u8>,
        max: usize,
        ids: &[serde_json::Value],
        code: i64,
        says: &str,
    ) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server);
        let mut transport = LineTransport::new(server_read, server_write).with_max_line_bytes(max);
        let (read, mut write) = tokio::io::split(client);
        let writer = tokio::spawn(async move {
            write.write_all(&lines).await.unwrap();
            write
        });
        let next = transport.receive().await.expect("the ping after the refused lines");
        let JsonRpcMessage::Request(ping) = next else { panic!("{next:?}") };
        assert_eq!(ping.id, RequestId::Number(3));
        let _write = writer.await.unwrap();
        let mut replies = tokio::io::BufReader::new(read).lines();
        for id in ids {
            let line = replies.next_line().await.unwrap().unwrap();
            let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert_eq!(&reply["id"], id, "{reply}");
            assert_eq!(reply["error"]["code"], code, "{reply}");
            let message = reply["error"]["message"].as_str().unwrap();
            assert!(message.contains(says), "{message}");
        }
    }

    /// A line past the limit is skipped and answered once, with the id it names (or `null` when
    /// it names none), and the lines after it are read as before.
    #[tokio::test]
    async fn a_line_past_the_limit_is_answered_with_its_id_and_the_next_line_is_read() {
        let big = "x".repeat(5000);
        let lines = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"big-1\",\"method\":\"tools/call\",\"params\":{{\"a\":\"{big}\"}}}}\n\
             {{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{{\"a\":\"{big}\"}},\"id\":7}}\n\
             {{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}}\n"
        );
        let ids = [serde_json::json!("big-1"), serde_json::json!(7)];
        refused_before_the_ping(lines.into_bytes(), 1000, &ids, -32600, "longer than 1000 bytes")
            .await;
    }

    /// A line that is not UTF-8 (a client writing its platform's code page, as Windows' cp1252
    /// for an `é` in an argument) is a parse error answered with the request's id when the line
    /// names one outside the bytes that are not UTF-8, so the client hears at once why its request
    /// failed instead of waiting out its timeout; `null` when it names none, or a notification.
    #[tokio::test]
    async fn a_line_that_is_not_utf8_is_answered_with_its_id() {
        let mut lines: Vec<u8> = Vec::new();
        for line in [
            &b"{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"tools/call\",\"params\":{\"name\":\"charge\",\"arguments\":{\"customer\":\"caf\xe9\"}}}\n"[..],
            b"{\"method\":\"tools/call\",\"params\":{\"arguments\":{\"customer\":\"caf\xe9\"}},\"jsonrpc\":\"2.0\",\"id\":\"r-13\"}\n",
            // The id itself is not UTF-8: not named.
            b"{\"jsonrpc\":\"2.0\",\"id\":\"caf\xe9\",\"method\":\"ping\"}\n",
            // A notification, a response: no id to answer with.
            b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"id\":14,\"d\":\"\xe9\"}}\n",
            b"{\"jsonrpc\":\"2.0\",\"id\":15,\"result\":{\"d\":\"\xe9\"}}\n",
            b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\n",
        ] {
            lines.extend_from_slice(line);
        }
        let null = serde_json::Value::Null;
        let ids =
            [serde_json::json!(12), serde_json::json!("r-13"), null.clone(), null.clone(), null];
        refused_before_the_ping(lines, DEFAULT_MAX_LINE_BYTES, &ids, -32700, "not UTF-8").await;
    }

    /// A notification or a response that comes before `initialize` (a client's early
    /// `notifications/initialized` or `notifications/cancelled`, an answer to nothing) is dropped:
    /// rmcp ends the whole session on it, and the server exited before the client's
    /// `initialize`. The session starts when `initialize` comes, and serves as usual.
    #[tokio::test]
    async fn a_notification_or_a_response_before_initialize_does_not_end_the_session() {
        let replies = replies_to(&[
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":0}}"#,
            r#"{"jsonrpc":"2.0","id":"s-1","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":"s-2","error":{"code":-32601,"message":"no"}}"#,
            INITIALIZE,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        ])
        .await;
        assert_eq!(replies.len(), 2, "{replies:?}");
        for (reply, id) in replies.iter().zip([serde_json::json!("init"), serde_json::json!(2)]) {
            assert_eq!(reply["id"], id, "{reply}");
            assert!(reply["result"].is_object(), "{reply}");
        }
    }

    /// Serves `lines` on a new session and returns the replies, one per request, until the
    /// client closes; the server must not end before (rmcp ends it on a lifecycle it cannot
    /// follow), and answers nothing else.
    async fn replies_to(lines: &[&str]) -> Vec<serde_json::Value> {
        use rmcp::ServiceExt;
        let (client, server) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server);
        let idem = idem_core::Idem::in_memory();
        let served = tokio::spawn(async move {
            let transport = LineTransport::new(server_read, server_write);
            let running = crate::IdemServer::new(idem_core::ToolSet::new(), &idem)
                .serve(transport)
                .await
                .map_err(|e| e.to_string())?;
            running.waiting().await.map_err(|e| e.to_string())?;
            Ok::<(), String>(())
        });
        let (read, mut write) = tokio::io::split(client);
        let mut replies = tokio::io::BufReader::new(read).lines();
        let mut out = Vec::new();
        for line in lines {
            write.write_all(format!("{line}\n").as_bytes()).await.unwrap();
            // One at a time: a request's reply before the next line is sent.
            if line.contains("\"id\"") && line.contains("\"method\"") {
                let reply = replies.next_line().await.unwrap();
                let reply = reply.unwrap_or_else(|| panic!("the server ended after {line}"));
                out.push(serde_json::from_str(&reply).unwrap());
            }
        }
        write.shutdown().await.unwrap();
        assert_eq!(replies.next_line().await.unwrap(), None, "nothing else was answered");
        served.await.unwrap().unwrap();
        out
    }

    const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

    /// A first request naming in `_meta` a version rmcp does not serve is refused (-32022) and
    /// starts nothing: a notification after it was passed to rmcp, which then ended the whole
    /// session before the client's `initialize`.
    #[tokio::test]
    async fn a_request_naming_an_unknown_version_starts_no_session() {
        let replies = replies_to(&[
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2027-01-01","io.modelcontextprotocol/clientCapabilities":{}}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#,
            INITIALIZE,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#,
        ])
        .await;
        assert_eq!(replies[0]["error"]["code"], -32022, "{}", replies[0]);
        assert_eq!(replies[1]["id"], "init");
        assert!(replies[1]["result"]["protocolVersion"].is_string(), "{}", replies[1]);
        assert_eq!(replies[2]["result"], serde_json::json!({}), "{}", replies[2]);
    }

    /// A connection whose first request names its version in `_meta` (MCP 2026-07-28) serves
    /// without `initialize`; an `initialize` after it is refused, where rmcp negotiated again and
    /// then refused every request that named no version, as if the session were broken.
    #[tokio::test]
    async fn initialize_after_a_sessionless_start_is_refused_and_the_session_serves_on() {
        let versioned = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25","io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        let replies =
            replies_to(&[&versioned.replace("\"id\":3", "\"id\":1"), INITIALIZE, versioned]).await;
        assert!(replies[0]["result"]["tools"].is_array(), "{}", replies[0]);
        assert_eq!(replies[1]["id"], "init");
        assert_eq!(replies[1]["error"]["code"], -32600, "{}", replies[1]);
        let message = replies[1]["error"]["message"].as_str().unwrap();
        assert!(message.contains("started without `initialize`"), "{message}");
        assert!(replies[2]["result"]["tools"].is_array(), "{}", replies[2]);
    }

    /// The TypeScript SDK (behind Claude Desktop, VS Code, Cursor) writes a request's members as
    /// `method`, `params`, `jsonrpc`, `id`: the id of a line past the limit is at its end, far
    /// from its head. The answer carries it, so the client hears at once why its request failed
    /// instead of waiting out its timeout for an answer it cannot match. An `id` nested in the
    /// params of a notification, or the id of a response, is not taken for the line's.
    #[tokio::test]
    async fn a_line_past_the_limit_with_its_id_last_is_answered_with_that_id() {
        // Longer than the head and the tail that are searched together.
        let big = "x".repeat(200_000);
        let lines = format!(
            "{{\"method\":\"tools/call\",\"params\":{{\"name\":\"t\",\"arguments\":{{\"a\":\"{big}\"}}}},\"jsonrpc\":\"2.0\",\"id\":7}}\n\
             {{\"method\":\"tools/call\",\"params\":{{\"a\":\"{big}\"}},\"jsonrpc\":\"2.0\",\"id\" : \"req-\\\"8\\\"-é\" }}\r\n\
             {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"a\":\"{big}\",\"id\":5}}}}\n\
             {{\"result\":{{\"a\":\"{big}\"}},\"jsonrpc\":\"2.0\",\"id\":6}}\n\
             {{\"method\":\"ping\",\"params\":{{\"a\":\"{big}\"}},\"b\":\"x\\\",\\\"id\\\":9\"}}\n\
             {{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}}\n"
        );
        let null = serde_json::Value::Null;
        let ids = [
            serde_json::json!(7),
            serde_json::json!("req-\"8\"-é"),
            null.clone(),
            null.clone(),
            null,
        ];
        refused_before_the_ping(lines.into_bytes(), 1000, &ids, -32600, "longer than 1000 bytes")
            .await;
    }
}

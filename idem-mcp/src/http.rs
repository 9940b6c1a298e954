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
//!   missing; nothing runs. `safe` calls still run (in the session's own run). An empty
//!   principal counts as none.
//! - A request without a session (`legacy_session_mode: false`, or MCP 2026-07-28, which has no
//!   sessions) is served by a server of its own, so its session run is that request alone: a
//!   `keyed` or `never` call in it that names neither `_meta["idem/run"]` nor
//!   `_meta["idem/idempotencyKey"]` is refused (`invalid_tool_call`, saying what to send),
//!   whatever [`MissingRun`](idem_core::toolset::MissingRun) says, since every retry of it
//!   would run again. rmcp's routing decides, not the client's session header.
//! - Authentication itself (HTTP 401 for a missing or unknown token) is the app's layer in front
//!   of this service, as in `examples/payments_mcp.rs --http`.
//! - A session belongs to the principal that opened it (MCP 2025-11-25 "Security Best
//!   Practices", session hijacking: bind session ids to the user): a request naming a session
//!   that another principal opened, or one opened with a principal by a request without one, is
//!   answered 404 as an unknown session, and nothing in it runs, is closed or is streamed.
//!   With rmcp's `session_store` (sessions restored on another instance), the owner is kept in
//!   the stored `initialize` parameters (`_meta["idem/owner"]`, a SHA-256 of the principal, not
//!   the principal itself), and checked before a session is restored; a stored session without
//!   one (written before idem bound it, or its write failed) is answered 404, and the client
//!   opens a new one.
//! - Browser origins are checked (MCP 2025-11-25 "Transports": servers MUST validate `Origin`,
//!   against DNS rebinding): a request whose `Origin` header is not one of the config's
//!   `allowed_origins` is refused with 403; with none listed, every request that carries an
//!   `Origin` is (clients other than web pages send none). List a web client's origin with
//!   `StreamableHttpServerConfig::with_allowed_origins`. rmcp checks `Host` against
//!   `allowed_hosts` (loopback by default).
//!
//! ```no_run
//! # async fn demo(make: impl Fn() -> idem_mcp::IdemServer + Send + Sync + 'static) -> std::io::Result<()> {
//! use idem_mcp::http::{StreamableHttpServerConfig, service};
//! // let app = axum::Router::new().nest_service("/mcp", service(make, StreamableHttpServerConfig::default()));
//! let _mcp = service(make, StreamableHttpServerConfig::default());
//! # Ok(()) }
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, ConstString, ErrorCode, RequestId,
};

use rmcp::transport::streamable_http_server::session::SessionStore;
pub use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, SessionConfig,
};
pub use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService,
};

mod idle;
mod late;

pub use idle::SessionLimits;

use crate::IdemServer;
use crate::jsonrpc::{
    ArgumentsText, CancelledIds, Inbound, check_message, error_reply, id_cancelled, id_in_lossy,
    id_in_use,
};

/// The app's function from an HTTP request's head to its principal (`None`: the request has
/// none, and `keyed`/`never` calls are refused). It sees the head as the app's middleware left
/// it: headers, and extensions such as an authenticated user id.
pub type PrincipalFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// rmcp's streamable HTTP service over a new [`IdemServer`] from `make` for each MCP session
/// (sessions in memory), behind [`Checked`]. A tower service: mount it in an app's router, e.g.
/// `axum::Router::new().nest_service("/mcp", service(make, config))`, behind the app's auth.
pub fn service(
    make: impl Fn() -> IdemServer + Send + Sync + 'static,
    config: StreamableHttpServerConfig,
) -> Checked<StreamableHttpService<IdemServer, LocalSessionManager>> {
    service_with_sessions(make, config, SessionConfig::default())
}

/// [`service`] with rmcp's settings for its sessions: `keep_alive` (default 5 minutes) is how
/// long a session may stay idle before it is closed; a request naming a closed session gets HTTP
/// 404, and the client starts a new session. A session is idle while no request names it, no
/// response carrying a call's result is open and no idem tool call in it still runs: a call that
/// runs for longer than `keep_alive` keeps its session, and its client gets the result. (rmcp
/// alone counts a running call as silence; [`Checked`] keeps this timer in its place.) A
/// standalone `GET` stream does not keep a session open, as for rmcp.
///
/// A client whose connection broke mid-call resumes the call's stream (`GET` with
/// `Last-Event-ID`, MCP "Transports", resumability) for its result: while the call runs, or up
/// to `completed_cache_ttl` (60 s by default) after it ended, as long as the session is open. An
/// idem call holds its session until it has run; a tool of your own server (see [`service_for`])
/// holds it only while its response is open. What a dropped stream missed is kept up to 16 MiB
/// per stream and 64 MiB in all. Past that, a resume with nothing to send is answered 410
/// ("Gone"), so that the client stops resuming and its call fails; the repeat, with the same
/// run, replays the stored outcome.
///
/// Keys do not depend on the session: a client that re-initializes and repeats a call with the
/// same principal and `_meta["idem/run"]` gets the first call's outcome; one that names no run
/// was scoped to the closed session's run, and its repeat runs again.
///
/// Open sessions are bounded ([`SessionLimits`], by default 100 per principal and 10,000 in
/// all; [`Checked::with_session_limits`]): a principal at its bound that opens another closes
/// its own least recently used idle session, at the total the least recently used idle one of
/// anyone goes, and an `initialize` that finds every candidate in use is 503 with
/// `Retry-After`.
pub fn service_with_sessions(
    make: impl Fn() -> IdemServer + Send + Sync + 'static,
    config: StreamableHttpServerConfig,
    sessions: SessionConfig,
) -> Checked<StreamableHttpService<IdemServer, LocalSessionManager>> {
    // The principal function every session's server is made with: one server made here only to
    // read it (making one is cheap and starts nothing).
    let sample = make().tools().clone();
    if !sample.shares_calls(make().tools()) {
        tracing::warn!(
            "each MCP session gets IdemTools of its own (`make` builds them, as \
             `IdemServer::new` does): a shutdown cannot wait for their calls once their clients \
             have gone; build one IdemTools and give every session a clone \
             (`IdemServer::from_tools(tools.clone())`)"
        );
    }
    let mut checked = service_for(make, sample.principal_fn(), config, sessions);
    checked.tools = Some(sample);
    checked
}

/// [`service_with_sessions`] for a server of the app's own (an rmcp `ServerHandler` whose router
/// has idem tools [mounted](crate::IdemTools::mount)): the same checks, with the sessions bound
/// to `principal`, which must be the one its idem tools scope calls by
/// ([`IdemTools::principal_fn`](crate::IdemTools::principal_fn)).
pub fn service_for<H: rmcp::ServerHandler + Send + 'static>(
    make: impl Fn() -> H + Send + Sync + 'static,
    principal: Option<PrincipalFn>,
    config: StreamableHttpServerConfig,
    sessions: SessionConfig,
) -> Checked<StreamableHttpService<H, LocalSessionManager>> {
    let idle = idle::Idle::new(sessions.keep_alive);
    let notes = Notes { keep_alive: sessions.keep_alive, idle: idle.clone(), map: Arc::default() };
    let owners = Owners { principal, notes: notes.clone(), store: config.session_store.clone() };
    let late = late::LateResults::new(sessions.completed_cache_ttl);
    let mut manager = LocalSessionManager::default();
    manager.session_config = sessions;
    // Idle sessions are closed by `idle`, which does not count a running call as silence.
    manager.session_config.keep_alive = None;
    let max_body_bytes = config.max_request_body_bytes;
    // The MCP spec's MUST: with no origins listed, rmcp would check none.
    let config =
        if config.allowed_origins.is_empty() { config.enforce_origin_validation() } else { config };
    let sessions = config.legacy_session_mode;
    let streams = config.cancellation_token.clone();
    let manager = Arc::new(manager);
    let inner = StreamableHttpService::new(move || Ok(make()), Arc::clone(&manager), config);
    let versions = Versions { notes };
    Checked {
        idle,
        late,
        inner,
        max_body_bytes,
        in_flight: Arc::default(),
        owners,
        versions,
        sessions,
        manager,
        responses: OpenResponses::default(),
        draining: tokio_util::sync::CancellationToken::new(),
        tools: None,
        streams,
        limits: SessionLimits::default(),
    }
}

/// Which principal opened each session ([`Checked`] answers a request from another as rmcp
/// answers an unknown session). Sessions idle for longer than rmcp keeps them are forgotten.
#[derive(Clone)]
struct Owners {
    principal: Option<PrincipalFn>,
    /// Shared with [`Versions`].
    notes: Notes,
    /// rmcp's `session_store`, shared with other instances: where a session opened elsewhere
    /// keeps its owner.
    store: Option<Arc<dyn SessionStore>>,
}

/// Whether a request may use the session it names.
enum Access {
    Allowed,
    /// Another principal's session, or a stored one whose owner is not known: 404.
    Refused,
    /// The session store could not be read: the owner cannot be checked (503).
    StoreFailed,
}

/// The member of a stored session's `initialize` parameters that names its owner.
const OWNER_META: &str = "idem/owner";

/// How a session's owner is written in the session store: a digest, so that the store (often
/// another team's Redis) does not hold user ids; `none` for a request without a principal.
fn owner_mark(who: &Option<String>) -> String {
    match who {
        Some(who) => {
            let digest = idem_core::key::fingerprint(who.as_bytes());
            format!("sha256:{}", digest.as_str())
        }
        None => "none".to_owned(),
    }
}

/// What this layer notes of one session beside rmcp.
#[derive(Debug)]
struct Note {
    /// The principal that opened it ([`Owners`]; `None`: not noted).
    owner: Option<Option<String>>,
    /// Whether its client reads priming events ([`Versions`]; `None`: not noted).
    reads_priming: Option<bool>,
    /// When a request last named it.
    seen: Instant,
}

/// The notes of every session, in one map: forgotten together once the session closes, and
/// swept together ([`note_session`]).
#[derive(Clone, Debug)]
struct Notes {
    keep_alive: Option<std::time::Duration>,
    idle: idle::Idle,
    map: Arc<NoteMap>,
}

/// The map of [`Notes`].
type NoteMap = std::sync::Mutex<std::collections::HashMap<String, Note>>;

/// Locks the notes' map (one that a panic left locked is still read).
fn lock_notes(map: &NoteMap) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Note>> {
    map.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Notes {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Note>> {
        lock_notes(&self.map)
    }

    /// Notes `session` with `noted` (now its last use).
    fn note(&self, session: &str, noted: impl FnOnce(&mut Note)) {
        note_session(&mut self.lock(), self.keep_alive, &self.idle, session, noted);
    }

    /// A session closed (by its client's `DELETE`, or here).
    fn forget(&self, session: &str) {
        self.lock().remove(session);
    }
}

impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owners").field("principal", &self.principal.is_some()).finish()
    }
}

/// How many sessions are noted before the idle ones are looked for.
const OWNERS_SWEEP_AT: usize = 1024;

/// Past [`OWNERS_SWEEP_AT`], the idle ones are looked for each time the map has this many more
/// (or fewer): with thousands of sessions open, a walk over all of them at every new session
/// made opening sessions cost the square of their number, under the lock every request takes.
const OWNERS_SWEEP_EVERY: usize = 256;

/// Notes `session` with `noted` (now its last use) in the map of what this layer keeps per
/// session ([`Notes`]); past [`OWNERS_SWEEP_AT`] sessions, at every
/// [`OWNERS_SWEEP_EVERY`]th size, those no longer open here and not named for longer than a
/// session is kept are forgotten first (the task that closes idle sessions forgets them too; this
/// bounds the map should one be missed). A session still open is never forgotten, however long
/// ago a request named it: its owner must still be checked.
fn note_session(
    sessions: &mut std::collections::HashMap<String, Note>,
    keep_alive: Option<std::time::Duration>,
    idle: &idle::Idle,
    session: &str,
    noted: impl FnOnce(&mut Note),
) {
    if sessions.len() >= OWNERS_SWEEP_AT
        && sessions.len().is_multiple_of(OWNERS_SWEEP_EVERY)
        && let Some(keep) = keep_alive
    {
        sessions.retain(|id, note| idle.knows(id) || note.seen.elapsed() <= keep);
    }
    let now = Instant::now();
    let note = sessions.entry(session.to_owned()).or_insert_with(|| Note {
        owner: None,
        reads_priming: None,
        seen: now,
    });
    noted(note);
    note.seen = now;
}

impl Owners {
    /// Whether the request may use the session it names (any request when no principal is
    /// configured, or it names none). A session this layer did not see opened is looked up in
    /// the session store, if any: one stored there is allowed for its owner only (and noted),
    /// one stored nowhere is left to rmcp, which answers 404 for it too; nothing is noted for
    /// it, so ids a client makes up take no memory. A session open here whose owner is not
    /// known (which should not happen) is refused: the check fails closed.
    async fn allows(&self, parts: &http::request::Parts, manager: &LocalSessionManager) -> Access {
        let Some(principal) = &self.principal else { return Access::Allowed };
        let Some(session) = session_id(parts) else { return Access::Allowed };
        let who = principal(parts);
        match self.notes.lock().get_mut(session) {
            Some(Note { owner: Some(owner), seen, .. }) if *owner == who => {
                *seen = Instant::now();
                return Access::Allowed;
            }
            Some(Note { owner: Some(_), .. }) => return Access::Refused,
            _ => {}
        }
        let Some(store) = &self.store else {
            use rmcp::transport::streamable_http_server::session::SessionManager;
            if manager.has_session(&session.into()).await.unwrap_or(true) {
                tracing::warn!(
                    "a request named an open MCP session whose owner is not known; refused"
                );
                return Access::Refused;
            }
            return Access::Allowed;
        };
        let state = match store.load(session).await {
            Ok(Some(state)) => state,
            Ok(None) => return Access::Allowed,
            Err(e) => {
                tracing::warn!(error = %e, "the MCP session store could not be read to check a session's owner");
                return Access::StoreFailed;
            }
        };
        let stored = state.initialize_params.meta.as_ref().and_then(|m| m.0.0.get(OWNER_META));
        if stored.and_then(|v| v.as_str()) != Some(owner_mark(&who).as_str()) {
            return Access::Refused;
        }
        self.note(session, who);
        Access::Allowed
    }

    /// Notes the principal of the request whose answer opened a session, here and, with a
    /// session store, in the state rmcp stored for it (before the answer reaches the client, so
    /// before any other instance can be asked for the session).
    async fn opened(&self, parts: &http::request::Parts, answer: &Response) {
        let Some(principal) = &self.principal else { return };
        let Some(session) = opened_session(answer) else { return };
        let who = principal(parts);
        if let Some(store) = &self.store {
            // rmcp stored the state before answering. A failure leaves it without an owner,
            // which other instances refuse: the session works here only.
            let bound = match store.load(session).await {
                Ok(Some(mut state)) => {
                    let meta = state.initialize_params.meta.get_or_insert_default();
                    meta.0.0.insert(OWNER_META.into(), owner_mark(&who).into());
                    store.store(session, &state).await
                }
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = bound {
                tracing::warn!(error = %e, "the MCP session store could not keep a session's owner; other instances will not restore the session");
            }
        }
        self.note(session, who);
    }

    fn note(&self, session: &str, who: Option<String>) {
        self.notes.note(session, |note| note.owner = Some(who));
    }

    /// Whether `session` is open here or, with a session store, stored for another instance to
    /// restore. A failure to look counts as known: rmcp's answer stands.
    async fn knows(&self, manager: &LocalSessionManager, session: &str) -> bool {
        use rmcp::transport::streamable_http_server::session::SessionManager;
        if manager.has_session(&session.into()).await.unwrap_or(true) {
            return true;
        }
        match &self.store {
            Some(store) => !matches!(store.load(session).await, Ok(None)),
            None => false,
        }
    }
}

const SESSION_HEADER: &str = "mcp-session-id";

fn session_id(parts: &http::request::Parts) -> Option<&str> {
    parts.headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok())
}

/// The session an `initialize` answer opened.
fn opened_session(answer: &Response) -> Option<&str> {
    answer.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok())
}

/// The MCP session rmcp serves the request in, if any: behind [`Checked`] as it routed the
/// request, behind rmcp's service alone the session header (rmcp answers 404 to one it does not
/// know).
pub(crate) fn routed_session(parts: &http::request::Parts) -> Option<&str> {
    match parts.extensions.get::<InSession>() {
        Some(InSession(false)) => None,
        _ => session_id(parts).filter(|id| !id.is_empty()),
    }
}

/// The HTTP status of a JSON-RPC answer [`Checked`] gives itself: 400 for a message it refuses
/// (a parse error, an invalid request), as MCP 2025-11-25 "Transports" requires for input the
/// server cannot accept and as the official Python and TypeScript SDKs answer; 200 for an answer
/// to a request it accepted (an `isError` tool result for bad arguments).
fn status_of(answer: &serde_json::Value) -> http::StatusCode {
    let refused = [ErrorCode::PARSE_ERROR.0, ErrorCode::INVALID_REQUEST.0];
    match answer.pointer("/error/code").and_then(serde_json::Value::as_i64) {
        Some(code) if refused.iter().any(|&c| i64::from(c) == code) => {
            http::StatusCode::BAD_REQUEST
        }
        _ => http::StatusCode::OK,
    }
}

/// A JSON-RPC answer with this status, typed `application/json`.
fn json_reply(status: http::StatusCode, answer: &serde_json::Value) -> Response {
    with_json_type(reply(status, answer.to_string().into()))
}

fn with_json_type(mut answer: Response) -> Response {
    answer
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    answer
}

/// The answer to a request that would open a session, or use one, on a server that is
/// shutting down ([`Shutdown`]): 503, to be retried, on another instance or after a restart.
fn shutting_down() -> Response {
    let mut answer = reply(
        http::StatusCode::SERVICE_UNAVAILABLE,
        Bytes::from_static(b"Service Unavailable: the server is shutting down"),
    );
    answer.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    answer
}

/// The answer to an `initialize` that [`SessionLimits`] leave no room for: 503 with
/// `Retry-After` (seconds) and a JSON-RPC error with the request's id saying what to do.
fn too_many_sessions(
    message: &ClientJsonRpcMessage,
    full: &idle::Full,
    limits: SessionLimits,
) -> Response {
    let text = match (full, limits.per_principal, limits.total) {
        (idle::Full::Principal, Some(n), _) => format!(
            "Service Unavailable: this user has {n} MCP sessions open, the most allowed, and a \
             request is running in each; close one (DELETE) or retry once one is done"
        ),
        (_, _, Some(n)) => format!(
            "Service Unavailable: the server has {n} MCP sessions open, the most allowed, and a \
             request is running in each; retry later"
        ),
        _ => "Service Unavailable: too many MCP sessions open; retry later".to_owned(),
    };
    let id = match message {
        ClientJsonRpcMessage::Request(r) => Some(&r.id),
        _ => None,
    };
    let answer = error_reply(id, ErrorCode::INTERNAL_ERROR, text);
    let mut answer = json_reply(http::StatusCode::SERVICE_UNAVAILABLE, &answer);
    answer.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("5"));
    answer
}

/// Notes the session an `initialize` answer opened (its owner, its protocol version, its place
/// under [`SessionLimits`]) and closes the session chosen to make room for it, or spares that
/// one when none was opened.
async fn note_opened(
    (idle, owners, versions, late, manager): (
        idle::Idle,
        Owners,
        Versions,
        late::LateResults,
        Arc<LocalSessionManager>,
    ),
    opening: Option<(idle::Opening, Option<String>, Option<String>)>,
    head: &http::request::Parts,
    answer: &Response,
    priming: bool,
) {
    // Open before its owner is noted: what is noted of an open session is kept.
    if let Some((opening, who, evicted)) = opening {
        let opened = opened_session(answer);
        if let Some(opened) = opened {
            idle.opened(opened, who.as_deref());
        }
        match evicted {
            Some(evicted) if opened.is_some() => {
                close_here(&manager, &evicted).await;
                forget_session(&evicted, (&idle, &owners.notes, &late));
            }
            Some(evicted) => idle.spared(&evicted),
            None => {}
        }
        drop(opening);
    }
    owners.opened(head, answer).await;
    versions.opened(answer, priming);
}

/// Forgets what this layer keeps of `session` beside rmcp, once it is closed (by its client's
/// `DELETE`, or to make room). The task that closes idle sessions does the same through weak
/// references.
fn forget_session(session: &str, (idle, notes, late): (&idle::Idle, &Notes, &late::LateResults)) {
    idle.closed(session);
    notes.forget(session);
    late.forget(session);
}

/// Closes `session` in rmcp; one rmcp has already ended is not there, nothing to close.
async fn close_here(manager: &LocalSessionManager, session: &str) {
    use rmcp::transport::streamable_http_server::session::SessionManager;
    if let Err(e) = manager.close_session(&session.into()).await {
        tracing::debug!(error = %e, "closing an MCP session");
    }
}

/// rmcp's answer for a session it does not know.
fn unknown_session() -> Response {
    reply(http::StatusCode::NOT_FOUND, Bytes::from_static(b"Not Found: Session not found"))
}

/// rmcp's answer, with its 500 for a session whose service has ended (closed for idleness while
/// a call still ran: the session is listed until the call ends) made the 404 of a terminated
/// session, which MCP 2025-11-25 "Transports" (Session Management) requires and on which clients
/// start a new session; on a 500 they give up.
async fn terminated_as_unknown(answer: Response) -> Response {
    if answer.status() != http::StatusCode::INTERNAL_SERVER_ERROR {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    // An error's short text; `Infallible` as the body's error.
    let Ok(collected) = body.collect().await;
    let text = collected.to_bytes();
    if text.windows(TERMINATED.len()).any(|w| w == TERMINATED) {
        return unknown_session();
    }
    http::Response::from_parts(parts, Full::new(text).boxed())
}

/// What rmcp's session manager says of a session whose service has ended.
const TERMINATED: &[u8] = b"Session service terminated";

/// rmcp's answer to a `GET` with a `Last-Event-ID`, with its 200 and an empty stream that ends
/// at once made 410 ("Gone"). rmcp answers so whenever it cannot resume: the id is not one of its
/// (`abc`), the request is unknown to it, or its events are gone (rmcp keeps a completed
/// request's events for `completed_cache_ttl`, and none of a connection that failed without
/// closing). The MCP
/// SDKs take that empty 200 as a working reconnect and resume again with the same
/// `Last-Event-ID`, for ever: the Python SDK (2.3) starts its count of attempts over after each
/// one, and so does rmcp's own client. An error status is counted, so the client gives up after
/// a few attempts and its call fails; the host's repeat of the call, with the same run, replays
/// the stored outcome. A stream with something to send, or still open (a call that runs), is
/// passed on unchanged: rmcp has queued what it resends before it answers, so one poll tells.
fn gone_if_empty(answer: Response) -> Response {
    use futures_util::{FutureExt, StreamExt};
    if answer.status() != http::StatusCode::OK {
        return answer;
    }
    let (parts, mut body) = answer.into_parts();
    match body.frame().now_or_never() {
        Some(None) => reply(http::StatusCode::GONE, Bytes::from_static(GONE)),
        Some(Some(first)) => {
            let rest = http_body_util::BodyStream::new(body);
            let body =
                http_body_util::StreamBody::new(futures_util::stream::iter([first]).chain(rest));
            http::Response::from_parts(parts, BoxBody::new(body))
        }
        None => http::Response::from_parts(parts, body),
    }
}

/// How long a resume that rmcp has nothing for waits for the session's dropped streams still
/// being read, before it is answered 410.
const READERS_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A resume answered from what a dropped stream left ([`late::LateResults`]).
fn kept_answer(
    kept: Bytes,
    open: Option<OpenResponse>,
    in_use: Option<Arc<idle::InUse>>,
) -> Response {
    let answer = http::Response::builder()
        .header(http::header::CONTENT_TYPE, "text/event-stream")
        .header(http::header::CACHE_CONTROL, "no-cache")
        .body(BoxBody::new(Full::new(kept)))
        .unwrap_or_else(|_| reply(http::StatusCode::INTERNAL_SERVER_ERROR, Bytes::new()));
    answer.map(|body| BoxBody::new(Tracked::new(body, None, open, in_use, None)))
}

const GONE: &[u8] =
    b"Gone: nothing is left to send on this stream (its events are no longer kept); \
repeat the call with the same run id for its stored outcome";

/// A tower service that reads each POSTed JSON-RPC message with
/// [`crate::jsonrpc::check_message`] before rmcp does, as the stdio transport does: a request it
/// cannot pass on (a repeated member, a value JSON text cannot carry into a value, arguments that
/// are not one object) is answered here with its id (`application/json`), a bad notification
/// with 202 and nothing; every other request goes on to `inner` unchanged. What rmcp would
/// refuse for the request's head comes first: an unknown `Mcp-Session-Id` is 404 whatever the
/// body, a missing one 400, as rmcp answers them. A body longer than the config's
/// `max_request_body_bytes` is refused with 413, as rmcp refuses it, without keeping more than
/// that of it or reading any of it as JSON. A message refused here (a parse error, an invalid
/// request) is answered with 400 and its JSON-RPC error (see `status_of`). A request that reuses
/// the id of a request still in flight in its session is -32600 and does not run (see
/// `claim_id`); an `initialize` naming a
/// live session is 400 with -32600 (MCP 2025-11-25 "Lifecycle": once per session), and a `DELETE`
/// naming a session this service does not know is 404, as any other request naming it. `Accept`
/// ranges (`*/*`, `application/*`, `text/*`) cover the types they name (see `widen_accept`).
#[derive(Clone, Debug)]
pub struct Checked<S> {
    inner: S,
    /// When each session was last used, and the task that closes the idle ones.
    idle: idle::Idle,
    /// What clients that dropped a call's stream missed, for a late resume.
    late: late::LateResults,
    max_body_bytes: usize,
    /// The requests of each session whose response is still being sent: (session, request id).
    in_flight: InFlightIds,
    owners: Owners,
    /// Whether each session's client reads priming events, by the version it opened it with.
    versions: Versions,
    /// `legacy_session_mode` of rmcp's config: whether any request is served in a session.
    sessions: bool,
    /// rmcp's sessions on this instance: whether a `DELETE` names one (see [`Owners::knows`]).
    manager: Arc<LocalSessionManager>,
    /// The responses still being sent that carry a call's result (see [`Shutdown`]).
    responses: OpenResponses,
    /// Cancelled when a [`Shutdown`] starts draining: no new session is opened.
    draining: tokio_util::sync::CancellationToken,
    /// The tools of the sessions' servers, when this service makes them: a [`Shutdown`] checks
    /// that it waits for the same calls.
    tools: Option<crate::IdemTools>,
    /// rmcp's `cancellation_token`: cancelled, it ends every stream and session.
    streams: tokio_util::sync::CancellationToken,
    /// How many sessions may be open, per principal and in all.
    limits: SessionLimits,
}

impl<S> Checked<S> {
    /// This service with other bounds on its open sessions than [`SessionLimits::default`] (100
    /// per principal, 10,000 in all).
    pub fn with_session_limits(mut self, limits: SessionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The handle that ends this service gracefully: take it before the service is mounted (it
    /// shares the service's state, clones included).
    pub fn shutdown(&self) -> Shutdown {
        Shutdown {
            responses: self.responses.clone(),
            draining: self.draining.clone(),
            streams: self.streams.clone(),
            sessions_tools: self.tools.clone(),
        }
    }
}

/// Ends a [`Checked`] service so that the calls it is serving finish and their clients receive
/// their results. [`Shutdown::serve`] runs the server (axum's `serve` with its graceful
/// shutdown, or hyper's) until a signal, then drains it:
///
/// ```no_run
/// # async fn demo(
/// #     tools: idem_mcp::IdemTools,
/// #     make: impl Fn() -> idem_mcp::IdemServer + Send + Sync + 'static,
/// # ) {
/// use idem_mcp::http::{StreamableHttpServerConfig, service};
/// let mcp = service(make, StreamableHttpServerConfig::default());
/// let shutdown = mcp.shutdown();
/// // let app = axum::Router::new().nest_service("/mcp", mcp);
/// // let served = shutdown
/// //     .serve(tools, |draining| {
/// //         axum::serve(listener, app).with_graceful_shutdown(draining).into_future()
/// //     })
/// //     .await; // Served::Ended(io::Result<()>), Served::Drained, or Served::Cut { calls }
/// # let _ = (mcp, shutdown.serve(tools, |draining| draining));
/// # }
/// ```
///
/// On the first SIGTERM, SIGINT or SIGHUP (Ctrl-C off Unix):
/// 1. `draining` resolves: the server stops accepting connections. A new `initialize` on an
///    open connection is answered 503 (the client starts its session elsewhere).
/// 2. Calls that wait to retry or for another owner start nothing more and release their keys
///    ([`IdemTools::stop_calls`](crate::IdemTools::stop_calls)); new calls start nothing.
/// 3. Once every call started through `tools` has finished and been stored
///    ([`IdemTools::calls_finished`](crate::IdemTools::calls_finished)) and every response
///    that carries a call's result has been sent, or its client has gone (a POST's, or a
///    `GET` resuming one with `Last-Event-ID`), rmcp's `cancellation_token` is cancelled: the
///    standalone `GET` streams and the sessions end, and any request still arriving is
///    answered 503.
/// 4. The connections then have [`CLOSE_GRACE`] to close (the server's own future ends:
///    [`Served::Ended`]); after it, those still open (a request sent in part, a client that
///    stopped reading) are dropped with the server's future ([`Served::Drained`]).
///
/// A second signal ends the wait at once ([`Served::Cut`]): responses still open are cut, and
/// calls still running are left to their leases (a `keyed` repeat runs again once the lease ends, a
/// `never` one answers "outcome unknown"). Two signals of one kind sent back to back may
/// arrive as one (pending signals coalesce); another signal kind, or a pause, always counts.
/// A client that never reads its response holds step 3 until then, or until the SIGKILL that
/// follows SIGTERM (after 10 s with `docker stop`, 30 s in Kubernetes). Use this or
/// [`IdemTools::serve_until_shutdown`](crate::IdemTools::serve_until_shutdown), not both:
/// that one drops the server at the first signal, cutting the open responses (the calls are
/// still stored, and their repeats replayed).
#[derive(Clone, Debug)]
pub struct Shutdown {
    responses: OpenResponses,
    draining: tokio_util::sync::CancellationToken,
    streams: tokio_util::sync::CancellationToken,
    /// See [`Checked`]'s `tools`.
    sessions_tools: Option<crate::IdemTools>,
}

/// How long the connections have to close once the drain is done (see [`Shutdown`]): enough
/// to flush the last responses, short beside the 10 s a container stop leaves.
pub const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Resolves when a [`Shutdown`] starts draining: the future for `with_graceful_shutdown`.
pub struct Draining(std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>);

impl std::future::Future for Draining {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for Draining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Draining")
    }
}

/// How a server run by [`Shutdown::serve`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Served<T> {
    /// The server's own future ended (after a drain, or before any signal) with this output.
    Ended(T),
    /// Drained: every call finished and was stored and every result was sent, but connections
    /// still open after [`CLOSE_GRACE`] (or at a second signal) were dropped with the server's
    /// future. Nothing was lost.
    Drained,
    /// A second signal cut the drain: responses still open were cut, and `calls` calls still
    /// running were left to their leases (a `keyed` repeat runs again once a lease ends, a
    /// `never` one answers "outcome unknown"). A supervisor may want to hear of it: exit with
    /// an error.
    Cut {
        /// The calls still running when the drain was cut.
        calls: usize,
    },
}

impl Shutdown {
    /// Runs the server `serve` makes (given the [`Draining`] future to stop accepting on) until
    /// it ends, or until a signal and the drain described on [`Shutdown`], and says how it
    /// ended ([`Served`]). Unless it is [`Served::Ended`], the server's future was dropped,
    /// and the process should return from `main`, which ends the connections' tasks. The
    /// signal handlers are installed for the whole process when this is called; `tools` must
    /// be the ones every session serves (clones of one [`IdemTools`](crate::IdemTools)).
    pub fn serve<F: std::future::Future>(
        self,
        tools: crate::IdemTools,
        serve: impl FnOnce(Draining) -> F,
    ) -> impl std::future::Future<Output = Served<F::Output>> {
        if self.sessions_tools.as_ref().is_some_and(|own| !own.shares_calls(&tools)) {
            tracing::warn!(
                "the IdemTools given to Shutdown::serve are not the ones the MCP sessions use: \
                 the drain waits only for calls whose clients are still connected; pass the \
                 IdemTools whose clones `make` gives the sessions"
            );
        }
        // Installed now: a signal that comes before the future is first polled is not missed.
        let signals = crate::shutdown::Signals::new();
        let serving = serve(Draining(Box::pin(self.draining.clone().cancelled_owned())));
        self.drain(tools, signals, serving)
    }

    async fn drain<F: std::future::Future>(
        self,
        tools: crate::IdemTools,
        mut signals: crate::shutdown::Signals,
        serving: F,
    ) -> Served<F::Output> {
        let mut serving = std::pin::pin!(serving);
        let signal = tokio::select! {
            served = &mut serving => return Served::Ended(served),
            signal = signals.next() => signal,
        };
        tracing::info!(
            signal,
            "draining the MCP service: no new connections; the calls still running finish and \
             their responses are sent"
        );
        tools.stop_calls();
        self.draining.cancel();
        // The server may end first (its last connection closed): the calls still running are
        // waited for all the same, as their outcomes must be stored before the process exits.
        let mut served = None;
        let drained = async {
            tools.calls_finished().await;
            self.responses.all_closed().await;
        };
        let mut drained = std::pin::pin!(drained);
        loop {
            tokio::select! {
                out = &mut serving, if served.is_none() => served = Some(out),
                () = &mut drained => break,
                signal = signals.next() => {
                    let calls = tools.calls_running();
                    tracing::warn!(
                        signal,
                        calls,
                        responses = self.responses.count(),
                        "ending the open responses; the calls still running are left to their \
                         leases"
                    );
                    self.streams.cancel();
                    return Served::Cut { calls };
                }
            }
        }
        self.streams.cancel();
        if let Some(served) = served {
            return Served::Ended(served);
        }
        let why = tokio::select! {
            served = &mut serving => return Served::Ended(served),
            () = tokio::time::sleep(CLOSE_GRACE) => "the close grace ended",
            signal = signals.next() => signal,
        };
        tracing::warn!(
            why,
            "connections still open after the drain (a request sent in part, a client that \
             stopped reading): dropping them"
        );
        Served::Drained
    }
}

/// How many responses that carry a call's result (a POST's, or a `GET` resuming one)
/// [`Checked`] is still sending.
#[derive(Clone, Debug)]
struct OpenResponses(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for OpenResponses {
    fn default() -> Self {
        OpenResponses(Arc::new(tokio::sync::watch::channel(0).0))
    }
}

impl OpenResponses {
    fn open(&self) -> OpenResponse {
        self.0.send_modify(|n| *n += 1);
        OpenResponse(self.clone())
    }

    fn count(&self) -> usize {
        *self.0.borrow()
    }

    async fn all_closed(&self) {
        // The sender lives in `self`, so the wait ends only with the count at zero.
        let _ = self.0.subscribe().wait_for(|&n| n == 0).await;
    }
}

/// One open response: counted until dropped (sent in full, or its client went away).
struct OpenResponse(OpenResponses);

impl Drop for OpenResponse {
    fn drop(&mut self) {
        self.0.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Put in a request's head by [`Checked`]: whether rmcp serves the request in a session (a
/// session id header, sessions on, a protocol version before 2026-07-28) or by a server made for
/// it alone. A client's session header does not decide it: rmcp ignores one it does not route by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InSession(pub(crate) bool);

/// The first protocol version without sessions (SEP-2567): rmcp serves a request that names it,
/// or a later one, statelessly whatever its headers say.
const SESSIONLESS_SINCE: &str = "2026-07-28";

/// Whether rmcp serves `message` in the session its head names, as rmcp routes it: sessions on,
/// a session id, and a protocol version (the request's `_meta`, else the header) before
/// [`SESSIONLESS_SINCE`]. Dates compare as text.
fn in_session(
    sessions: bool,
    parts: &http::request::Parts,
    message: &ClientJsonRpcMessage,
) -> bool {
    if !sessions || session_id(parts).is_none() {
        return false;
    }
    let from_meta = match message {
        ClientJsonRpcMessage::Request(r) => {
            rmcp::model::GetMeta::get_meta(&r.request).protocol_version()
        }
        _ => None,
    }
    .map(|v| v.to_string());
    let from_header = || {
        parts.headers.get("mcp-protocol-version").and_then(|v| v.to_str().ok()).map(str::to_owned)
    };
    from_meta.or_else(from_header).is_none_or(|v| v.as_str() < SESSIONLESS_SINCE)
}

/// (`Mcp-Session-Id`, request id) of every request whose response body has not ended, and of
/// every request cancelled while it was (see [`claim_id`]).
type InFlightIds = Arc<std::sync::Mutex<Ids>>;

/// The request ids [`Checked`] keeps taken, per session.
#[derive(Debug, Default)]
struct Ids {
    live: std::collections::HashSet<(String, RequestId)>,
    cancelled: CancelledIds<(String, RequestId)>,
}

/// Frees a request's id in its session when its response body is dropped: sent in full, or the
/// client went away.
struct IdInFlight {
    ids: InFlightIds,
    entry: (String, RequestId),
}

impl Drop for IdInFlight {
    fn drop(&mut self) {
        self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner).live.remove(&self.entry);
    }
}

/// A response body that holds, until it is dropped, its request's [`IdInFlight`], its place
/// among the [`OpenResponses`] and its session's use, each if any.
struct Tracked {
    body: BoxBody<Bytes, Infallible>,
    id: Option<IdInFlight>,
    _open: Option<OpenResponse>,
    in_use: Option<Arc<idle::InUse>>,
    /// For a call's stream in a session: where to keep what its client misses if it drops the
    /// stream before the end (see [`late`]).
    late: Option<(late::LateResults, String)>,
    ended: bool,
}

impl Tracked {
    fn new(
        body: BoxBody<Bytes, Infallible>,
        id: Option<IdInFlight>,
        open: Option<OpenResponse>,
        in_use: Option<Arc<idle::InUse>>,
        late: Option<(late::LateResults, String)>,
    ) -> Self {
        Tracked { body, id, _open: open, in_use, late, ended: false }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // The client went away before the end: the rest is read here, and the request's id and
        // its session's use are held until it has come.
        if !self.ended
            && !http_body::Body::is_end_stream(&self.body)
            && let Some((late, session)) = self.late.take()
        {
            let body = std::mem::replace(&mut self.body, empty_body());
            late.read_on(session, body, (self.id.take(), self.in_use.take()));
        }
    }
}

fn empty_body() -> BoxBody<Bytes, Infallible> {
    BoxBody::new(http_body_util::Empty::new())
}

/// Put in the head of a request rmcp serves in a session: the session stays open while it is
/// held. An idem tool's call holds it until the call has run, so that its session outlives a
/// client that dropped the call's stream and may resume it (see [`idle`]).
#[derive(Clone)]
pub(crate) struct SessionUse {
    _held: Arc<idle::InUse>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

type Response = http::Response<BoxBody<Bytes, Infallible>>;

/// The service [`Checked`] wraps: rmcp's, answering every request (never an error) with a future
/// that may move between threads.
pub(crate) trait RmcpService:
    tower_service::Service<
        http::Request<Full<Bytes>>,
        Response = Response,
        Error = Infallible,
        Future: Send + 'static,
    >
{
}

impl<S> RmcpService for S where
    S: tower_service::Service<
            http::Request<Full<Bytes>>,
            Response = Response,
            Error = Infallible,
            Future: Send + 'static,
        >
{
}

impl<S, B> tower_service::Service<http::Request<B>> for Checked<S>
where
    S: RmcpService + Clone + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Display,
{
    type Response = Response;
    type Error = Infallible;
    type Future = futures_util::future::BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let mut inner = self.inner.clone();
        let max_body_bytes = self.max_body_bytes;
        let in_flight = Arc::clone(&self.in_flight);
        let owners = self.owners.clone();
        let versions = self.versions.clone();
        let sessions = self.sessions;
        let manager = Arc::clone(&self.manager);
        let responses = self.responses.clone();
        let (draining, ended) = (self.draining.clone(), self.streams.is_cancelled());
        let idle = self.idle.clone();
        let late = self.late.clone();
        let limits = self.limits;
        idle.start_closing(&self.manager, &self.streams, || {
            // Weak: the closing task ends once the service is dropped, and the maps with it.
            let notes = Arc::downgrade(&owners.notes.map);
            let kept = late.downgrade();
            move |session: &str| {
                late::forget(&kept, session);
                if let Some(notes) = notes.upgrade() {
                    lock_notes(&notes).remove(session);
                }
            }
        });
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            // The sessions are gone: a 404 would send the client to open another here. Decided
            // before the owner is looked up, which may read the session store.
            let access = if ended { None } else { Some(owners.allows(&parts, &manager).await) };
            let refused = match access {
                None => Some(shutting_down()),
                Some(Access::Allowed) => None,
                Some(Access::Refused) => Some(unknown_session()),
                Some(Access::StoreFailed) => {
                    let text = "Service Unavailable: the session store could not be read";
                    Some(reply(http::StatusCode::SERVICE_UNAVAILABLE, text.into()))
                }
            };
            if let Some(refused) = refused {
                // The body is read first (thrown away, and drained past the limit as for a 413):
                // answered with its body unread, the connection is closed after the answer, and
                // a client that keeps connections (httpx, undici) sends its next request on it
                // and hears "disconnected without a response".
                let _ = collect_at_most(body, max_body_bytes).await;
                return Ok(refused);
            }
            widen_accept(&mut parts.headers);
            let bytes = match collect_at_most(body, max_body_bytes).await {
                Ok(bytes) => bytes,
                Err(refused) => return Ok(refused),
            };
            let text = match std::str::from_utf8(&bytes) {
                _ if parts.method != http::Method::POST => None,
                Ok(text) => Some(text),
                // JSON text is UTF-8 (RFC 8259 §8.1): a parse error, as over stdio, not a 415.
                Err(_) if is_json(&parts.headers) => {
                    // What rmcp refuses by the head alone (`Host`, `Origin`, `Accept`) first.
                    if let Some(refused) = refused_by_transport(&mut inner, &parts, "").await {
                        return Ok(refused);
                    }
                    // With the request's id when it can be read, as over stdio.
                    let answer = error_reply(
                        id_in_lossy(&bytes).as_ref(),
                        ErrorCode::PARSE_ERROR,
                        "Parse error: the body is not UTF-8, which JSON text must be",
                    );
                    return Ok(json_reply(http::StatusCode::BAD_REQUEST, &answer));
                }
                Err(_) => None,
            };
            if let Some(text) = text {
                // What Checked answers itself: a JSON-RPC answer (or 202 for a bad
                // notification), after rmcp's answer for the request's head, if any.
                let (status, own) = match check_message(text) {
                    Inbound::Reply(answer) => (status_of(&answer), answer.to_string().into()),
                    // MCP 2025-11-25 "Transports": input the server cannot accept MUST get an
                    // HTTP error (202 is for accepted notifications and responses).
                    Inbound::Ignore => {
                        let answer = error_reply(
                            None,
                            ErrorCode::INVALID_REQUEST,
                            "Invalid request: the body is not a JSON-RPC request, notification or response this server accepts",
                        );
                        (http::StatusCode::BAD_REQUEST, answer.to_string().into())
                    }
                    Inbound::Message(message) => {
                        let opens = session_id(&parts).is_none()
                            && matches!(
                                &*message,
                                ClientJsonRpcMessage::Request(r)
                                    if matches!(r.request, ClientRequest::InitializeRequest(_))
                            );
                        // rmcp parses the body again with serde_json, which reads an integer
                        // beyond 64 bits as a double; the handler finds the arguments' text in
                        // the request head it gets from rmcp, and parses typed arguments from
                        // it, exactly, as over stdio.
                        if let Some(text) = arguments_text(&message) {
                            parts.extensions.insert(text);
                        }
                        let routed = in_session(sessions, &parts, &message);
                        parts.extensions.insert(InSession(routed));
                        // MCP 2025-11-25 "Lifecycle": initialization is a session's first
                        // interaction, once; rmcp would negotiate again inside the open
                        // session. One naming a session rmcp does not know gets its 404.
                        if opens && draining.is_cancelled() {
                            return Ok(shutting_down());
                        }
                        let reinitialize = match (&*message, session_id(&parts)) {
                            (ClientJsonRpcMessage::Request(r), Some(session))
                                if routed
                                    && matches!(r.request, ClientRequest::InitializeRequest(_))
                                    && owners.knows(&manager, session).await =>
                            {
                                Some(error_reply(
                                    Some(&r.id),
                                    ErrorCode::INVALID_REQUEST,
                                    "Invalid request: this session is already initialized; to start a new one, send `initialize` without `Mcp-Session-Id`",
                                ))
                            }
                            _ => None,
                        };
                        let claimed = match reinitialize {
                            Some(refused) => Err((http::StatusCode::BAD_REQUEST, refused)),
                            None => claim_id(&in_flight, &parts, &message, routed)
                                .map_err(|reused| (http::StatusCode::BAD_REQUEST, reused)),
                        };
                        match claimed {
                            Err((status, answer)) => (status, answer.to_string().into()),
                            Ok(id) => {
                                // A session it opens must fit the bounds; at one, an idle session
                                // is chosen to make room, and closed once rmcp has opened this
                                // one (not for an `initialize` that rmcp refuses).
                                let opening = if opens && sessions {
                                    let who = owners.principal.as_ref().and_then(|f| f(&parts));
                                    match idle.admit(who.as_deref(), limits) {
                                        Ok((opening, evicted)) => Some((opening, who, evicted)),
                                        Err(full) => {
                                            return Ok(too_many_sessions(&message, &full, limits));
                                        }
                                    }
                                } else {
                                    None
                                };
                                let open = responses.open();
                                let head = opens.then(|| parts.clone());
                                let priming = versions.reads_priming(&parts, Some(&*message));
                                // rmcp parses the body again: it gets the message as checked
                                // (arguments encoded twice read as an object, a byte-order mark
                                // dropped, `"params": null` read as none), as over stdio, where
                                // rmcp is handed the message itself. The arguments' exact text
                                // is in the head.
                                let body = serde_json::to_vec(&*message).map_or(bytes, Bytes::from);
                                // Until its response ends, the request keeps its session
                                // open; one naming a session being closed is told it is gone.
                                let session =
                                    session_id(&parts).filter(|_| routed).map(str::to_owned);
                                let in_use = match &session {
                                    Some(session) => match idle.begin(session) {
                                        Ok(in_use) => Some(Arc::new(in_use)),
                                        Err(idle::Closing) => return Ok(unknown_session()),
                                    },
                                    None => None,
                                };
                                // An idem tool's call holds it too, until it has run: a client
                                // that dropped the stream may resume it for its result. Only a
                                // call: rmcp keeps a request's head a moment past its answer,
                                // and a session is idle once its requests are answered.
                                let calls = matches!(
                                    &*message,
                                    ClientJsonRpcMessage::Request(r)
                                        if matches!(r.request, ClientRequest::CallToolRequest(_))
                                );
                                if let Some(in_use) = in_use.as_ref().filter(|_| calls) {
                                    parts
                                        .extensions
                                        .insert(SessionUse { _held: Arc::clone(in_use) });
                                }
                                let request = http::Request::from_parts(parts, Full::new(body));
                                let call = inner.call(request);
                                let answer = match head {
                                    // An `initialize` runs to its end in a task of its own, and
                                    // its session is noted, also when its client hangs up first:
                                    // rmcp opens the session before it answers, and one not
                                    // noted here is neither counted nor ever closed (rmcp's own
                                    // timer is off).
                                    Some(head) => {
                                        let opens = (
                                            idle.clone(),
                                            owners.clone(),
                                            versions.clone(),
                                            late.clone(),
                                            Arc::clone(&manager),
                                        );
                                        let noted = async move {
                                            let Ok(answer) = call.await;
                                            let answer = terminated_as_unknown(answer).await;
                                            note_opened(opens, opening, &head, &answer, priming)
                                                .await;
                                            answer
                                        };
                                        match tokio::runtime::Handle::try_current() {
                                            Ok(runtime) => {
                                                runtime.spawn(noted).await.unwrap_or_else(|_| {
                                                    reply(
                                                        http::StatusCode::INTERNAL_SERVER_ERROR,
                                                        Bytes::new(),
                                                    )
                                                })
                                            }
                                            Err(_) => noted.await,
                                        }
                                    }
                                    None => {
                                        let Ok(answer) = call.await;
                                        terminated_as_unknown(answer).await
                                    }
                                };
                                if let Some(in_use) = &in_use
                                    && answer.status().is_success()
                                {
                                    in_use.served();
                                }
                                let late = session
                                    .filter(|_| {
                                        answer.status().is_success()
                                            && is_event_stream(answer.headers())
                                    })
                                    .map(|session| (late.clone(), session));
                                let answer = if priming { answer } else { without_priming(answer) };
                                return Ok(answer.map(|body| {
                                    BoxBody::new(Tracked::new(body, id, Some(open), in_use, late))
                                }));
                            }
                        }
                    }
                };
                if let Some(refused) = refused_by_transport(&mut inner, &parts, text).await {
                    return Ok(refused);
                }
                // rmcp accepted the request's head: a request in its session, answered here.
                if let Some(session) = session_id(&parts).filter(|_| sessions) {
                    idle.named(session);
                }
                // A JSON-RPC answer, also with an HTTP error status (400).
                return Ok(with_json_type(reply(status, own)));
            }
            let delete = (parts.method == http::Method::DELETE).then(|| parts.clone());
            // MCP 2025-11-25 "Transports" (Session Management): a request naming a terminated
            // session MUST get 404, a DELETE too; rmcp answers 202 to a DELETE of any id. Looked
            // up before rmcp closes it; rmcp's own refusals (`Host`, `Origin`, no session id, a
            // protocol version without sessions) come first, as its answer is kept for them.
            let unknown = match delete.as_ref().and_then(session_id) {
                Some(session) if sessions => !owners.knows(&manager, session).await,
                _ => false,
            };
            let priming = versions.reads_priming(&parts, None);
            // A `GET` resuming a stream, with `Last-Event-ID` as rmcp reads it (text: a value
            // that is not, rmcp ignores, and opens a standalone stream).
            let last_event_id = (parts.method == http::Method::GET)
                .then(|| parts.headers.get("last-event-id").and_then(|v| v.to_str().ok()))
                .flatten()
                .map(str::to_owned);
            // One resuming a request's stream (rmcp's event ids `<index>/<request>`) carries
            // that call's result: a drain waits for it as for a POST's response.
            let resumes = last_event_id.as_deref().is_some_and(|last| last.contains('/'));
            let open = resumes.then(|| responses.open());
            let session = session_id(&parts).filter(|_| sessions).map(str::to_owned);
            let in_use = match session.as_deref().filter(|_| delete.is_none()) {
                Some(session) => match idle.begin(session) {
                    Ok(in_use) => Some(Arc::new(in_use)),
                    Err(idle::Closing) => return Ok(unknown_session()),
                },
                None => None,
            };
            // A resume of a call's stream whose client dropped it before the call's end: what it
            // missed is kept here (rmcp no longer has it once the call has answered).
            // Only in a session still open here: one closed may have lost its owner check.
            let kept_for = match (&session, &last_event_id) {
                (Some(session), Some(last)) if resumes && idle.knows(session) => {
                    Some((session, last))
                }
                _ => None,
            };
            if let Some(kept) = kept_for.as_ref().and_then(|(s, last)| late.after(s, last)) {
                return Ok(kept_answer(kept, open, in_use));
            }
            let answer = inner.call(http::Request::from_parts(parts, Full::new(bytes))).await?;
            let answer = terminated_as_unknown(answer).await;
            let answer = if last_event_id.is_some() { gone_if_empty(answer) } else { answer };
            // Nothing from rmcp: the call may have answered a moment ago, its events not yet
            // kept by the reader of its dropped stream.
            if answer.status() == http::StatusCode::GONE
                && let Some((session, last)) = &kept_for
                && let Some(kept) = late.after_readers(session, last, READERS_WAIT).await
            {
                return Ok(kept_answer(kept, open, in_use));
            }
            if let Some(in_use) = &in_use
                && answer.status().is_success()
            {
                in_use.served();
            }
            // A resumed call's stream keeps its session open until it ends; a standalone stream
            // is a use of it when it opens.
            let in_use = in_use.filter(|_| resumes);
            // The standalone stream of a `GET`.
            let mut answer = if priming { answer } else { without_priming(answer) };
            if let Some(head) = delete
                && answer.status().is_success()
            {
                if let Some(session) = session_id(&head) {
                    forget_session(session, (&idle, &owners.notes, &late));
                }
                if unknown {
                    return Ok(unknown_session());
                }
                // The session is closed when this answers, not later, as rmcp's 202 ("Accepted")
                // says; the Python SDK logs "Session termination failed: 202" for it (it takes
                // 200 and 204).
                if answer.status() == http::StatusCode::ACCEPTED {
                    *answer.status_mut() = http::StatusCode::OK;
                }
            }
            // A resumed stream dropped again is read on as the call's own was.
            let late = session
                .filter(|_| resumes && answer.status().is_success())
                .map(|session| (late.clone(), session));
            Ok(match (open, in_use) {
                (None, None) => answer,
                (open, in_use) => {
                    answer.map(|body| BoxBody::new(Tracked::new(body, None, open, in_use, late)))
                }
            })
        })
    }
}

/// Notes a request's id as in flight in its session, or refuses the request when a request of
/// that id is already in flight there: MCP 2025-11-25 "Basic" (Requests) says an id MUST NOT be
/// reused in a session, and rmcp would run both and send only one response, leaving the other
/// request's stream open with nothing to come (the client waits for ever). A request whose client
/// dropped its stream stays in flight until its answer has come (see [`late`]), or until the
/// client resumes the stream mid-call and rmcp moves the call there. Messages rmcp does not
/// serve in the session they name (`routed` false: `initialize`, a stateless server, a
/// 2026-07-28 request, whose `Mcp-Session-Id` may be stale or made up and shared by strangers)
/// are not tracked.
///
/// The id of a request the client cancels (`notifications/cancelled`) while it is in flight
/// stays taken for the session, also once its stream is closed (a client that cancels drops the
/// stream): rmcp does not stop the cancelled handler, and files its late answer under whichever
/// request holds the id then, so a new request reusing the id would get the cancelled request's
/// answer and never its own. Such a request is -32600 ([`id_cancelled`]) and does not run.
fn claim_id(
    ids: &InFlightIds,
    parts: &http::request::Parts,
    message: &rmcp::model::ClientJsonRpcMessage,
    routed: bool,
) -> Result<Option<IdInFlight>, serde_json::Value> {
    if !routed {
        return Ok(None);
    }
    let Some(session) = session_id(parts) else { return Ok(None) };
    let mut taken = ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let request = match message {
        rmcp::model::JsonRpcMessage::Request(request) => request,
        rmcp::model::JsonRpcMessage::Notification(notification) => {
            if let ClientNotification::CancelledNotification(cancelled) = &notification.notification
                && let Some(id) = &cancelled.params.request_id
            {
                let entry = (session.to_owned(), id.clone());
                if taken.live.contains(&entry) {
                    taken.cancelled.insert(&entry);
                }
            }
            return Ok(None);
        }
        _ => return Ok(None),
    };
    let entry = (session.to_owned(), request.id.clone());
    if taken.cancelled.contains(&entry) {
        return Err(id_cancelled(&request.id));
    }
    if !taken.live.insert(entry.clone()) {
        return Err(id_in_use(&request.id));
    }
    Ok(Some(IdInFlight { ids: Arc::clone(ids), entry }))
}

/// The first protocol version whose clients read an SSE event that carries no data: the
/// "priming" event (SEP-1699) rmcp starts every stream with, an event id and a `retry` over an
/// empty `data:`.
const PRIMING_SINCE: &str = "2025-11-25";

/// Whether each session's client reads priming events ([`PRIMING_SINCE`]), by the protocol
/// version its `initialize` negotiated: MCP 2025-06-18 "Transports" says to use that for a
/// request without `MCP-Protocol-Version` before assuming 2025-03-26. Kept in the sessions'
/// [`Notes`], beside their owners.
#[derive(Clone, Debug)]
struct Versions {
    /// Shared with [`Owners`].
    notes: Notes,
}

impl Versions {
    /// Whether the client of this request reads rmcp's priming events, by the protocol version
    /// it speaks: an `initialize` names it (rmcp answers one it does not know with a later
    /// version, which does), another request in its `_meta` or the `MCP-Protocol-Version`
    /// header, else the version its session was opened with; failing all, 2025-03-26 (MCP
    /// 2025-06-18 "Transports"). Dates compare as text.
    fn reads_priming(
        &self,
        parts: &http::request::Parts,
        message: Option<&ClientJsonRpcMessage>,
    ) -> bool {
        use rmcp::model::ProtocolVersion;
        let named = match message {
            Some(ClientJsonRpcMessage::Request(r)) => match &r.request {
                ClientRequest::InitializeRequest(init) => {
                    let asked = &init.params.protocol_version;
                    if !ProtocolVersion::KNOWN_VERSIONS.contains(asked) {
                        return true;
                    }
                    Some(asked.to_string())
                }
                other => {
                    rmcp::model::GetMeta::get_meta(other).protocol_version().map(|v| v.to_string())
                }
            },
            _ => None,
        };
        let header = || {
            parts
                .headers
                .get("mcp-protocol-version")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        if let Some(version) = named.or_else(header) {
            return version.as_str() >= PRIMING_SINCE;
        }
        let opened = session_id(parts).and_then(|session| {
            self.notes.lock().get_mut(session).and_then(|note| {
                note.seen = Instant::now();
                note.reads_priming
            })
        });
        opened.unwrap_or(ProtocolVersion::V_2025_03_26.as_str() >= PRIMING_SINCE)
    }

    /// Notes how the client of the session `answer` opened reads priming events.
    fn opened(&self, answer: &Response, reads: bool) {
        let Some(session) = opened_session(answer) else { return };
        self.notes.note(session, |note| note.reads_priming = Some(reads));
    }
}

/// `answer` without rmcp's priming events, when it is an event stream: a client of a protocol
/// version before [`PRIMING_SINCE`] parses every event's data as a JSON-RPC message, and the
/// empty data of a priming event fails it (the TypeScript SDK before its fix dropped the whole
/// connection on it: "Unexpected end of JSON input"). Such a client never resumes a stream by
/// event id, so nothing it uses is lost. Other answers are left as they are.
fn without_priming(answer: Response) -> Response {
    let stream = answer
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("text/event-stream"));
    if !stream {
        return answer;
    }
    answer.map(|body| BoxBody::new(NoPriming { body, pending: Vec::new(), ended: false }))
}

/// An event-stream body with its priming events left out ([`without_priming`]). Events pass
/// through as soon as they are whole; a partial one waits for the rest.
struct NoPriming {
    body: BoxBody<Bytes, Infallible>,
    /// The bytes of an event not yet whole.
    pending: Vec<u8>,
    ended: bool,
}

impl NoPriming {
    /// The whole events in `pending` that are not priming events, taken out of it.
    fn whole_events(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut line_start = 0;
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i] == b'\n' {
                let line = &self.pending[line_start..i];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if line.is_empty() {
                    // A blank line ends the event.
                    let event = &self.pending[start..=i];
                    if !is_priming(event) {
                        out.extend_from_slice(event);
                    }
                    start = i + 1;
                }
                line_start = i + 1;
            }
            i += 1;
        }
        self.pending.drain(..start);
        out
    }
}

/// Whether an SSE event carries `data` fields and every one is empty: rmcp's priming event (or
/// its bare retry hint), not a message. Comments (keep-alives) carry no data and stay.
fn is_priming(event: &[u8]) -> bool {
    let mut data = false;
    for line in event.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line == b"data" {
            data = true;
        } else if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if !value.is_empty() {
                return false;
            }
            data = true;
        }
    }
    data
}

impl http_body::Body for NoPriming {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        loop {
            if self.ended {
                // What is left of a stream that ended mid-event goes out as it came.
                if self.pending.is_empty() {
                    return Poll::Ready(None);
                }
                let rest = std::mem::take(&mut self.pending);
                return Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(rest)))));
            }
            match std::task::ready!(std::pin::Pin::new(&mut self.body).poll_frame(cx)) {
                None => self.ended = true,
                Some(Err(never)) => match never {},
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        self.pending.extend_from_slice(&data);
                        let events = self.whole_events();
                        if !events.is_empty() {
                            return Poll::Ready(Some(Ok(http_body::Frame::data(events.into()))));
                        }
                    }
                    // Trailers: after every event.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.is_empty()
    }
}

/// The method [`refused_by_transport`] asks rmcp with: read-only, and known in every protocol
/// version (MCP 2026-07-28 answers `ping` without a session as an unknown method).
const PROBE: &str = "tools/list";

/// rmcp's answer to a message it would refuse for its head alone: 404 for a session it does not
/// know (MCP 2025-11-25 "Session Management": the server MUST answer 404 for a terminated
/// session, and the client starts a new one), 400 for a request that needs a session and names
/// none, 406 or 415 for the wrong `Accept` or `Content-Type`. `None` when rmcp would take it.
///
/// A message [`Checked`] answers itself (bad arguments, a repeated member) must get those answers
/// first, as if rmcp had read it: a client told "200, isError" for a call in a dead session
/// retries it there instead of re-initializing. (A body rmcp could not read as a message at all,
/// not UTF-8 or not JSON, it refuses before the session, and so does [`Checked`].) rmcp is asked
/// with a [`PROBE`] carrying the
/// message's head and `params._meta` (which may name the protocol version and so the kind of
/// session), not the message itself: its order of checks stays rmcp's, and nothing runs.
async fn refused_by_transport<S: RmcpService>(
    inner: &mut S,
    parts: &http::request::Parts,
    text: &str,
) -> Option<Response> {
    // A message rmcp would look at the session for is probed with it; anything else (an
    // `initialize`, which needs no session and would open one; text that is no message at all)
    // without it, for what rmcp refuses by the head alone (`Host`, `Origin`, `Accept`,
    // `Content-Type`): the probe's 400 for the missing session is then not this message's.
    let message = serde_json::from_str::<serde_json::Value>(text).ok();
    let method = message.as_ref().and_then(|m| m.get("method")).and_then(|m| m.as_str());
    let in_session = method.is_some_and(|m| m != rmcp::model::InitializeResultMethod::VALUE);
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let meta = message
        .as_ref()
        .and_then(|m| m.get("params"))
        .and_then(|p| p.get("_meta"))
        .filter(|m| m.is_object());
    let mut params = serde_json::Map::new();
    if let Some(meta) = meta {
        params.insert("_meta".into(), meta.clone());
    }
    // An id of its own: the message's id may not be readable, and is not rmcp's to answer.
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": format!("idem-transport-check-{n}"), "method": PROBE,
        "params": params,
    });
    let mut head = parts.clone();
    head.headers.remove(http::header::CONTENT_LENGTH);
    if !in_session {
        head.headers.remove(SESSION_HEADER);
    }
    // The headers that repeat the body (MCP 2026-07-28: `Mcp-Method`, `Mcp-Name`,
    // `Mcp-Param-*`) are checked against it: they must name the probe.
    let repeated: Vec<http::HeaderName> = head
        .headers
        .keys()
        .filter(|k| k.as_str() == "mcp-name" || k.as_str().starts_with("mcp-param-"))
        .cloned()
        .collect();
    for name in repeated {
        head.headers.remove(name);
    }
    if head.headers.contains_key("mcp-method") {
        head.headers.insert("mcp-method", http::HeaderValue::from_static(PROBE));
    }
    let probe = http::Request::from_parts(head, Full::new(Bytes::from(body.to_string())));
    std::future::poll_fn(|cx| inner.poll_ready(cx)).await.ok()?;
    // Infallible: the answer is always a response. Its body (the pong) is dropped unread.
    let answer = inner.call(probe).await.ok()?;
    let refused = if in_session {
        !answer.status().is_success()
    } else {
        matches!(answer.status().as_u16(), 403 | 406 | 415)
    };
    refused.then_some(answer)
}

/// How much of a body over the limit is read and thrown away before its 413 is sent: a client
/// still sending when the answer comes and the connection closes is reset and may lose the
/// answer, so the rest of a moderately large body is drained, without keeping it.
const DRAIN_BYTES: usize = 64 * 1024 * 1024;

/// The body, read as it streams in up to `max` bytes: a longer one is refused with 413 (rmcp's
/// answer and text) without keeping more than `max` bytes of it, so a client cannot make the
/// server hold a body of any size; a body that fails to arrive is 400.
async fn collect_at_most<B>(body: B, max: usize) -> Result<Bytes, Response>
where
    B: http_body::Body,
    B::Error: std::fmt::Display,
{
    use bytes::{Buf, BufMut};
    let mut body = std::pin::pin!(body);
    let mut collected = bytes::BytesMut::new();
    let mut over = None::<usize>;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(_) if over.is_some() => break,
            Err(e) => return Err(reply(http::StatusCode::BAD_REQUEST, e.to_string().into())),
        };
        let Ok(data) = frame.into_data() else { continue };
        if let Some(drained) = over.as_mut() {
            *drained = drained.saturating_add(data.remaining());
            if *drained > DRAIN_BYTES {
                break;
            }
        } else if data.remaining() > max.saturating_sub(collected.len()) {
            over = Some(data.remaining());
            collected = bytes::BytesMut::new();
        } else {
            collected.put(data);
        }
    }
    if over.is_some() {
        let text = format!("Payload Too Large: request body exceeds {max} bytes");
        return Err(reply(http::StatusCode::PAYLOAD_TOO_LARGE, text.into()));
    }
    Ok(collected.freeze())
}

/// The types the MCP transport answers with, which a media range in `Accept` may cover.
const ANSWER_TYPES: [&str; 2] = ["application/json", "text/event-stream"];

/// Names in `Accept` each of [`ANSWER_TYPES`] that a range there covers (`*/*`, `application/*`,
/// `text/*`; RFC 9110 §12.5.1) and that it does not list itself: rmcp matches the two types
/// literally and answers 406 to `Accept: */*`, which curl, httpx and Postman send by default. A
/// range weighted `q=0` covers nothing, and a type listed by name keeps its own weight.
fn widen_accept(headers: &mut http::HeaderMap) {
    let mut listed = Vec::new();
    let mut ranges = Vec::new();
    for value in headers.get_all(http::header::ACCEPT).iter().filter_map(|v| v.to_str().ok()) {
        for entry in value.split(',') {
            let mut parts = entry.split(';');
            let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let refused = parts.any(|p| {
                p.split_once('=').is_some_and(|(name, q)| {
                    name.trim().eq_ignore_ascii_case("q")
                        && q.trim().parse::<f32>().is_ok_and(|q| q == 0.0)
                })
            });
            if ANSWER_TYPES.contains(&essence.as_str()) {
                listed.push(essence);
            } else if !refused && essence.ends_with("/*") {
                ranges.push(essence);
            }
        }
    }
    for kind in ANSWER_TYPES {
        let top = kind.split('/').next().unwrap_or(kind);
        let covered = ranges.iter().any(|r| r == "*/*" || r.strip_suffix("/*") == Some(top));
        if covered && !listed.iter().any(|l| l == kind) {
            headers.append(http::header::ACCEPT, http::HeaderValue::from_static(kind));
        }
    }
}

/// Whether the request says its body is JSON, by its media type as rmcp reads it (rmcp answers
/// any other type itself, `application/jsonx` too).
fn is_json(headers: &http::HeaderMap) -> bool {
    headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        let essence = v.split_once(';').map_or(v, |(essence, _)| essence);
        essence.trim().eq_ignore_ascii_case("application/json")
    })
}

/// Whether a response is an event stream (a call's stream, not a JSON answer).
fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        let essence = v.split_once(';').map_or(v, |(essence, _)| essence);
        essence.trim().eq_ignore_ascii_case("text/event-stream")
    })
}

/// The arguments' text [`check_message`] kept for a `tools/call` request.
fn arguments_text(message: &ClientJsonRpcMessage) -> Option<ArgumentsText> {
    let ClientJsonRpcMessage::Request(request) = message else { return None };
    let ClientRequest::CallToolRequest(call) = &request.request else { return None };
    call.extensions.get::<ArgumentsText>().cloned()
}

fn reply(status: http::StatusCode, body: Bytes) -> Response {
    let mut response = http::Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    if status == http::StatusCode::OK {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    }
    response
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use idem_core::{Idem, ToolSet};
    use rmcp::transport::streamable_http_server::session::{SessionState, SessionStoreError};

    use super::*;

    /// rmcp's session store as another team's Redis would be: shared by every instance.
    #[derive(Default)]
    struct SharedSessions(std::sync::Mutex<HashMap<String, SessionState>>);

    #[async_trait::async_trait]
    impl SessionStore for SharedSessions {
        async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
            Ok(self.0.lock().unwrap().get(id).cloned())
        }
        async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
            self.0.lock().unwrap().insert(id.to_owned(), state.clone());
            Ok(())
        }
        async fn delete(&self, id: &str) -> Result<(), SessionStoreError> {
            self.0.lock().unwrap().remove(id);
            Ok(())
        }
    }

    /// One server instance: its own sessions in memory, the principal from `x-user`.
    fn instance(
        store: &Arc<SharedSessions>,
    ) -> Checked<StreamableHttpService<IdemServer, LocalSessionManager>> {
        let idem = Idem::in_memory();
        let make = move || {
            let tools = crate::IdemTools::new(ToolSet::new(), &idem).with_principal(|parts| {
                parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
            });
            IdemServer::from_tools(tools)
        };
        let mut config = StreamableHttpServerConfig::default();
        config.session_store = Some(Arc::clone(store) as Arc<dyn SessionStore>);
        service(make, config)
    }

    /// The service's answer to `request`, once it is ready.
    async fn serve<S>(server: &mut S, request: http::Request<Full<Bytes>>) -> Response
    where
        S: tower_service::Service<http::Request<Full<Bytes>>, Response = Response>,
        S::Error: std::fmt::Debug,
    {
        std::future::poll_fn(|cx| server.poll_ready(cx)).await.unwrap();
        server.call(request).await.unwrap()
    }

    async fn post<H: rmcp::ServerHandler + Send + 'static>(
        server: &mut Checked<StreamableHttpService<H, LocalSessionManager>>,
        user: &str,
        session: Option<&str>,
        body: serde_json::Value,
    ) -> Response {
        let mut request = http::Request::post("http://localhost/mcp")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("x-user", user);
        if let Some(session) = session {
            request = request.header(SESSION_HEADER, session);
        }
        let request = request.body(Full::new(Bytes::from(body.to_string()))).unwrap();
        serve(server, request).await
    }

    fn initialize() -> serde_json::Value {
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
            // What a client may send: it is not what decides the owner.
            "_meta": {"idem/owner": "none"}}})
    }

    fn list() -> serde_json::Value {
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    }

    /// A session opened on one instance and restored from rmcp's session store on another is
    /// still its opener's: another user naming it there is answered as for an unknown session.
    #[tokio::test]
    async fn a_session_restored_on_another_instance_is_still_its_owners() {
        let store = Arc::new(SharedSessions::default());
        let (mut a, mut b, mut c) = (instance(&store), instance(&store), instance(&store));
        let opened = post(&mut a, "alice", None, initialize()).await;
        assert_eq!(opened.status(), http::StatusCode::OK);
        let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
        let stored = store.0.lock().unwrap()[&session].clone();
        let owner = &stored.initialize_params.meta.as_ref().unwrap().0.0[OWNER_META];
        assert_eq!(owner, &serde_json::Value::from(owner_mark(&Some("alice".into()))));
        assert!(!owner.as_str().unwrap().contains("alice"), "the store holds a digest: {owner}");

        let bob = post(&mut b, "bob", Some(&session), list()).await;
        assert_eq!(bob.status(), http::StatusCode::NOT_FOUND, "bob's request on instance b");
        let alice = post(&mut c, "alice", Some(&session), list()).await;
        assert_eq!(alice.status(), http::StatusCode::OK, "alice's request on instance c");
        // Once restored on c and noted there, bob is still refused on c.
        let bob = post(&mut c, "bob", Some(&session), list()).await;
        assert_eq!(bob.status(), http::StatusCode::NOT_FOUND, "bob's request on instance c");
    }

    /// A stored session without an owner (written before sessions were bound, or the write of
    /// the owner failed) is refused on an instance that did not open it: nobody can show it is
    /// theirs.
    #[tokio::test]
    async fn a_stored_session_without_an_owner_is_refused_elsewhere() {
        let store = Arc::new(SharedSessions::default());
        let (mut a, mut b) = (instance(&store), instance(&store));
        let opened = post(&mut a, "alice", None, initialize()).await;
        let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
        {
            let mut sessions = store.0.lock().unwrap();
            let state = sessions.get_mut(&session).unwrap();
            state.initialize_params.meta.as_mut().unwrap().0.0.remove(OWNER_META);
        }
        let alice = post(&mut b, "alice", Some(&session), list()).await;
        assert_eq!(alice.status(), http::StatusCode::NOT_FOUND);
        // The instance that opened it still knows its owner.
        let alice = post(&mut a, "alice", Some(&session), list()).await;
        assert_eq!(alice.status(), http::StatusCode::OK);
    }

    /// A request of a client speaking `version` (`None`: a 2025-03-26 client, which sends no
    /// `MCP-Protocol-Version`).
    fn request_of(
        version: Option<&str>,
        method: http::Method,
        session: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> http::Request<Full<Bytes>> {
        let mut request = http::Request::builder()
            .method(method)
            .uri("http://localhost/mcp")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(version) = version {
            request = request.header("mcp-protocol-version", version);
        }
        if let Some(session) = session {
            request = request.header(SESSION_HEADER, session);
        }
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        request.body(Full::new(body)).unwrap()
    }

    /// The first frame of a stream that stays open (a `GET`), or `None` when nothing comes in
    /// half a second.
    async fn first_frame(response: Response) -> Option<String> {
        let mut body = response.into_body();
        let frame = tokio::time::timeout(std::time::Duration::from_millis(500), body.frame());
        let data = frame.await.ok()??.ok()?.into_data().ok()?;
        Some(String::from_utf8_lossy(&data).into_owned())
    }

    /// SEP-1699's priming event (an event id and `retry` over empty data) goes only to clients
    /// of 2025-11-25 or later: a client of an earlier version parses every event's data as a
    /// JSON-RPC message, and the empty one broke it. rmcp sends it on every stream, whatever the
    /// version the session speaks. A request that names no version is the session's.
    #[tokio::test]
    async fn priming_events_go_only_to_clients_that_read_them() {
        let idem = Idem::in_memory();
        let make = move || IdemServer::new(ToolSet::new(), &idem);
        let mut server = service(make, StreamableHttpServerConfig::default());
        let empty_data = |body: &str| body.contains("data: \n") || body.contains("data:\n");
        for (version, header, primed) in [
            ("2024-11-05", None, false),
            ("2025-03-26", None, false),
            ("2025-06-18", Some("2025-06-18"), false),
            // A request without the header: the version its session was opened with.
            ("2025-06-18", None, false),
            ("2025-11-25", Some("2025-11-25"), true),
            ("2025-11-25", None, true),
            // A version rmcp does not know: it answers with its latest.
            ("2099-01-01", Some("2025-11-25"), true),
        ] {
            let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "old", "version": "1"}}});
            let opened =
                serve(&mut server, request_of(None, http::Method::POST, None, Some(init))).await;
            assert_eq!(opened.status(), http::StatusCode::OK, "{version}");
            let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
            let body = text(opened).await;
            let answered = if version == "2099-01-01" { "2025-11-25" } else { version };
            assert!(body.contains(&format!(r#""protocolVersion":"{answered}""#)), "{body}");
            assert_eq!(empty_data(&body), primed, "{version}, initialize: {body:?}");

            let ping = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
            let request = request_of(header, http::Method::POST, Some(&session), Some(ping));
            let body = text(serve(&mut server, request).await).await;
            assert!(body.contains(r#""id":2,"result":{}"#), "{version}: {body}");
            assert_eq!(empty_data(&body), primed, "{version}, ping: {body:?}");

            let stream = request_of(header, http::Method::GET, Some(&session), None);
            let stream = serve(&mut server, stream).await;
            assert_eq!(stream.status(), http::StatusCode::OK, "{version}");
            let first = first_frame(stream).await;
            assert_eq!(
                first.as_deref().is_some_and(empty_data),
                primed,
                "{version}, GET: {first:?}"
            );
        }
    }

    /// Whole events go through as they come, in order; a priming event is left out wherever it
    /// falls, also cut across frames; keep-alive comments stay.
    #[tokio::test]
    async fn a_stream_loses_its_priming_events_and_nothing_else() {
        let frames = [
            "data: \nid: 0\nretry: 3000\n\n:\n\ndata: {\"a\":1}\nid: 1\n\nda",
            "ta: {\"b\"",
            ":2}\n\ndata:\r\nretry: 5\r\n\r\ndata: {\"c\":3}\n\n",
        ];
        let stream = futures_util::stream::iter(
            frames.map(|f| Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(f)))),
        );
        let mut answer = http::Response::new(BoxBody::new(http_body_util::StreamBody::new(stream)));
        answer.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        let body = text(without_priming(answer)).await;
        assert_eq!(body, ":\n\ndata: {\"a\":1}\nid: 1\n\ndata: {\"b\":2}\n\ndata: {\"c\":3}\n\n");
    }

    /// A new session of a 2025-11-25 client: its id.
    async fn open_session(
        server: &mut Checked<StreamableHttpService<IdemServer, LocalSessionManager>>,
    ) -> String {
        let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "c", "version": "1"}}});
        let request = request_of(Some("2025-11-25"), http::Method::POST, None, Some(init));
        let opened = serve(server, request).await;
        opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned()
    }

    /// Look something up, slowly.
    #[idem_core::tool(retry = "safe")]
    async fn slow_lookup(what: String) -> Result<String, idem_core::ToolFailure> {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        Ok(what)
    }

    /// A request reusing the id of one the client cancelled (and whose stream it dropped, as a
    /// client that cancels does) is refused with -32600 and its id, and does not run: rmcp
    /// would file the cancelled call's late answer under the new request, which then got the
    /// wrong answer and lost its own. Another id in the session, and the id in another session,
    /// are served.
    #[tokio::test]
    async fn the_id_of_a_cancelled_request_is_not_given_to_the_next_request() {
        let idem = Idem::in_memory();
        let make = move || IdemServer::new(ToolSet::new().with(SlowLookupTool).unwrap(), &idem);
        let mut server = service(make, StreamableHttpServerConfig::default());
        let post = |session: &str, body: serde_json::Value| {
            request_of(Some("2025-11-25"), http::Method::POST, Some(session), Some(body))
        };
        let session = open_session(&mut server).await;
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "slow_lookup", "arguments": {"what": "a"}}});
        let stream = serve(&mut server, post(&session, call)).await;
        assert_eq!(stream.status(), http::StatusCode::OK);
        let cancel = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 5, "reason": "the user pressed Stop"}});
        let cancelled = serve(&mut server, post(&session, cancel)).await;
        assert_eq!(cancelled.status(), http::StatusCode::ACCEPTED);
        drop(stream);

        let ping = |id: i64| serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        let reused = serve(&mut server, post(&session, ping(5))).await;
        assert_eq!(reused.status(), http::StatusCode::BAD_REQUEST);
        let reused: serde_json::Value = serde_json::from_str(&text(reused).await).unwrap();
        assert_eq!((&reused["id"], &reused["error"]["code"]), (&5.into(), &(-32600).into()));
        let message = reused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("cancelled"), "{message}");

        let fresh = text(serve(&mut server, post(&session, ping(6))).await).await;
        assert!(fresh.contains(r#""id":6,"result":{}"#), "{fresh}");
        let other = open_session(&mut server).await;
        let elsewhere = text(serve(&mut server, post(&other, ping(5))).await).await;
        assert!(elsewhere.contains(r#""id":5,"result":{}"#), "{elsewhere}");
    }

    /// What the message check accepts, rmcp is given as checked: it parsed the body again, and
    /// answered arguments encoded twice (`"arguments": "{..}"`, the form some bridges send) with
    /// -32601, and a body led by a byte-order mark with a 415 and no JSON-RPC answer, where stdio
    /// served both.
    #[tokio::test]
    async fn rmcp_serves_the_message_as_checked() {
        let idem = Idem::in_memory();
        let make = move || IdemServer::new(ToolSet::new().with(SlowLookupTool).unwrap(), &idem);
        let mut server = service(make, StreamableHttpServerConfig::default());
        let session = open_session(&mut server).await;
        let post = |body: Bytes| {
            let mut request =
                request_of(Some("2025-11-25"), http::Method::POST, Some(&session), None);
            *request.body_mut() = Full::new(body);
            request
        };
        let call = |id: u32, arguments: serde_json::Value| {
            let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "slow_lookup", "arguments": arguments}});
            Bytes::from(call.to_string())
        };
        let twice = text(serve(&mut server, post(call(2, r#"{"what":"a"}"#.into()))).await).await;
        assert!(
            twice.contains(r#""id":2,"result":{"content":[{"type":"text","text":"a"}]"#),
            "{twice}"
        );
        let empty = text(serve(&mut server, post(call(3, "".into()))).await).await;
        assert!(empty.contains(r#""id":3,"result":"#), "{empty}");
        assert!(empty.contains("missing field `what`"), "{empty}");
        let marked = Bytes::from(format!(
            "\u{feff}{}",
            serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "ping"})
        ));
        let answer = serve(&mut server, post(marked)).await;
        assert_eq!(answer.status(), http::StatusCode::OK);
        let answer = text(answer).await;
        assert!(answer.contains(r#""id":4,"result":{}"#), "{answer}");
    }

    type TestService = Checked<StreamableHttpService<IdemServer, LocalSessionManager>>;

    /// POSTs `call` in `session`, reads its stream's first event and drops the stream, as a
    /// broken connection does: that event's id.
    async fn first_event_then_drop(
        server: &mut TestService,
        session: &str,
        call: serde_json::Value,
    ) -> String {
        let stream = serve(server, post_in(session, call)).await;
        assert_eq!(stream.status(), http::StatusCode::OK);
        let first = stream.into_body().frame().await.unwrap().unwrap().into_data().unwrap();
        let first = String::from_utf8(first.to_vec()).unwrap();
        first
            .lines()
            .find_map(|line| line.strip_prefix("id:"))
            .map(|id| id.trim().to_owned())
            .unwrap_or_else(|| panic!("no event id in {first:?}"))
    }

    /// Waits until a call of `tools` runs.
    async fn until_a_call_runs(tools: &crate::IdemTools) {
        let guard = std::time::Duration::from_secs(60);
        tokio::time::timeout(guard, async {
            while tools.calls_running() == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the call runs");
    }

    /// The id of an event stream's last event.
    fn last_event_id(stream: &str) -> String {
        stream
            .lines()
            .filter_map(|line| line.strip_prefix("id:"))
            .next_back()
            .map(|id| id.trim().to_owned())
            .unwrap_or_else(|| panic!("no event id in {stream:?}"))
    }

    /// A service whose principal is the `x-user` header, of [`SlowLookupTool`], under `limits`.
    fn limited(limits: SessionLimits) -> (crate::IdemTools, TestService) {
        let set = ToolSet::new().with(SlowLookupTool).unwrap();
        let tools = crate::IdemTools::new(set, &Idem::in_memory()).with_principal(|parts| {
            parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
        });
        let make = {
            let tools = tools.clone();
            move || IdemServer::from_tools(tools.clone())
        };
        let server = service(make, StreamableHttpServerConfig::default());
        (tools, server.with_session_limits(limits))
    }

    /// `user` opens a session: its id.
    async fn open_as(server: &mut TestService, user: &str) -> String {
        let opened = post(server, user, None, initialize()).await;
        assert_eq!(opened.status(), http::StatusCode::OK, "{user}'s initialize");
        opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned()
    }

    /// A principal at its bound that opens another session closes its own least recently used
    /// idle one (a request naming it then gets 404, on which clients open a new session); the
    /// others stay, and another principal's sessions are not touched.
    #[tokio::test]
    async fn a_principal_at_its_bound_closes_its_oldest_idle_session() {
        let limits = SessionLimits { per_principal: Some(2), total: None };
        let (_, mut server) = limited(limits);
        let bobs = open_as(&mut server, "bob").await;
        let first = open_as(&mut server, "alice").await;
        let second = open_as(&mut server, "alice").await;
        // The first is used since: the second is now the least recently used.
        assert_eq!(
            post(&mut server, "alice", Some(&first), list()).await.status(),
            http::StatusCode::OK
        );
        let third = open_as(&mut server, "alice").await;
        let status = |s: Response| s.status();
        assert_eq!(
            status(post(&mut server, "alice", Some(&second), list()).await),
            http::StatusCode::NOT_FOUND
        );
        for session in [&first, &third] {
            assert_eq!(
                status(post(&mut server, "alice", Some(session), list()).await),
                http::StatusCode::OK
            );
        }
        assert_eq!(
            status(post(&mut server, "bob", Some(&bobs), list()).await),
            http::StatusCode::OK
        );
        // A session its client closed frees its place: no other is closed for the next.
        let mut delete = request_of(Some("2025-11-25"), http::Method::DELETE, Some(&first), None);
        delete.headers_mut().insert("x-user", "alice".parse().unwrap());
        assert!(serve(&mut server, delete).await.status().is_success());
        let fourth = open_as(&mut server, "alice").await;
        for session in [&third, &fourth] {
            assert_eq!(
                status(post(&mut server, "alice", Some(session), list()).await),
                http::StatusCode::OK
            );
        }
    }

    /// An `initialize` that rmcp refuses (a browser page's `Origin`, not allowed) opens nothing,
    /// and so closes nothing to make room: the idle session stays, and serves.
    #[tokio::test]
    async fn an_initialize_rmcp_refuses_closes_no_session() {
        let limits = SessionLimits { per_principal: Some(1), total: Some(1) };
        let (_, mut server) = limited(limits);
        let alices = open_as(&mut server, "alice").await;
        for user in ["alice", "bob"] {
            let mut init =
                request_of(Some("2025-11-25"), http::Method::POST, None, Some(initialize()));
            init.headers_mut().insert("x-user", user.parse().unwrap());
            init.headers_mut().insert("origin", "http://evil.example".parse().unwrap());
            let refused = serve(&mut server, init).await;
            assert_eq!(refused.status(), http::StatusCode::FORBIDDEN, "{user}");
        }
        // Read in full, as a client reads it: a response dropped unread is a dropped stream,
        // read on, which holds its session a moment longer.
        let listed = post(&mut server, "alice", Some(&alices), list()).await;
        assert_eq!(listed.status(), http::StatusCode::OK);
        assert!(text(listed).await.contains("tools"));
        // Still the one to go for a session that opens.
        let _again = open_as(&mut server, "alice").await;
        let status = post(&mut server, "alice", Some(&alices), list()).await.status();
        assert_eq!(status, http::StatusCode::NOT_FOUND);
    }

    /// With every session of the principal in use (a call running in it), another `initialize`
    /// is 503 with `Retry-After` and a JSON-RPC error carrying its id; the running call is not
    /// disturbed, and once it is done a new session takes the idle one's place. The whole
    /// server's bound refuses any principal's new session.
    #[tokio::test]
    async fn an_initialize_past_every_bound_in_use_is_503_and_a_running_call_is_not_touched() {
        let limits = SessionLimits { per_principal: Some(1), total: Some(2) };
        let (tools, mut server) = limited(limits);
        let alices = open_as(&mut server, "alice").await;
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "slow_lookup", "arguments": {"what": "kept"}}});
        let running = post(&mut server, "alice", Some(&alices), call).await;
        assert_eq!(running.status(), http::StatusCode::OK);
        let refused = post(&mut server, "alice", None, initialize()).await;
        assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[http::header::RETRY_AFTER], "5");
        let refused: serde_json::Value = serde_json::from_str(&text(refused).await).unwrap();
        assert_eq!(refused["id"], 1, "{refused}");
        assert!(
            refused["error"]["message"].as_str().unwrap().contains("1 MCP sessions open"),
            "{refused}"
        );
        let guard = std::time::Duration::from_secs(60);
        let answer = tokio::time::timeout(guard, text(running)).await.expect("the call ends");
        assert!(answer.contains(r#""text":"kept""#), "{answer}");
        assert_eq!(tools.calls_running(), 0);
        let again = open_as(&mut server, "alice").await;
        let status = post(&mut server, "alice", Some(&alices), list()).await.status();
        assert_eq!(status, http::StatusCode::NOT_FOUND, "the idle one made room");
        // The server's bound: alice's and bob's make two, and carol's takes the place of the
        // least recently used idle one, whoever's it is.
        let bobs = open_as(&mut server, "bob").await;
        let carols = open_as(&mut server, "carol").await;
        let status = post(&mut server, "alice", Some(&again), list()).await.status();
        assert_eq!(status, http::StatusCode::NOT_FOUND, "the least recently used made room");
        // With a call running in each, there is none to close: 503.
        let mut running = Vec::new();
        for (user, session) in [("bob", &bobs), ("carol", &carols)] {
            let call = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "slow_lookup", "arguments": {"what": user}}});
            running.push(post(&mut server, user, Some(session), call).await);
        }
        let refused = post(&mut server, "dave", None, initialize()).await;
        assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(text(refused).await.contains("the server has 2 MCP sessions open"));
        for (answer, user) in running.into_iter().zip(["bob", "carol"]) {
            let answer = tokio::time::timeout(guard, text(answer)).await.expect("the call ends");
            assert!(answer.contains(&format!(r#""text":"{user}""#)), "{answer}");
        }
    }

    /// A service of [`SlowLookupTool`] whose sessions close after `keep_alive` idle (in ms;
    /// rmcp's default without), the tools its sessions share (to count running calls), and a
    /// session opened in it.
    async fn slow_service(keep_alive: Option<u64>) -> (crate::IdemTools, TestService, String) {
        let set = ToolSet::new().with(SlowLookupTool).unwrap();
        let tools = crate::IdemTools::new(set, &Idem::in_memory());
        let make = {
            let tools = tools.clone();
            move || IdemServer::from_tools(tools.clone())
        };
        let mut sessions = SessionConfig::default();
        if let Some(ms) = keep_alive {
            sessions.keep_alive = Some(std::time::Duration::from_millis(ms));
        }
        let mut server =
            service_with_sessions(make, StreamableHttpServerConfig::default(), sessions);
        let session = open_session(&mut server).await;
        (tools, server, session)
    }

    /// A service whose principal is the `x-user` header, and a session alice opened in it.
    async fn alices_session() -> (TestService, String) {
        let idem = Idem::in_memory();
        let make = move || {
            let tools = crate::IdemTools::new(ToolSet::new(), &idem).with_principal(|parts| {
                parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
            });
            IdemServer::from_tools(tools)
        };
        let mut server = service(make, StreamableHttpServerConfig::default());
        let opened = post(&mut server, "alice", None, initialize()).await;
        let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
        (server, session)
    }

    /// A POST of `body` in `session`.
    fn post_in(session: &str, body: serde_json::Value) -> http::Request<Full<Bytes>> {
        request_of(Some("2025-11-25"), http::Method::POST, Some(session), Some(body))
    }

    /// A call that runs for longer than the session's `keep_alive` keeps its session open (rmcp
    /// alone closed it at `keep_alive`, and the call's client never got its result); once the
    /// call's response has been sent, the session is idle, and it is closed after `keep_alive`:
    /// a request naming it then gets 404, the answer for a terminated session (MCP 2025-11-25
    /// "Transports") on which clients start a new one.
    #[tokio::test]
    async fn a_running_call_keeps_its_session_open_and_an_idle_one_is_closed() {
        let (_, mut server, session) = slow_service(Some(200)).await;
        let post = |body| post_in(&session, body);
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "slow_lookup", "arguments": {"what": "kept"}}});
        let stream = serve(&mut server, post(call)).await;
        assert_eq!(stream.status(), http::StatusCode::OK);
        // The call (1.5 s) is read to its end, with nothing else sent in the session: seven
        // times its keep-alive of silence from the client.
        let result = text(stream).await;
        assert!(result.contains(r#""text":"kept""#), "the call's stream: {result}");
        assert!(result.contains(r#""isError":false"#), "the call's stream: {result}");
        // The session outlived the call; now idle, it is closed.
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let ping = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
        let answer = serve(&mut server, post(ping)).await;
        assert_eq!(answer.status(), http::StatusCode::NOT_FOUND, "{}", text(answer).await);
    }

    /// Requests this layer answers itself (here arguments with a repeated member, refused
    /// before rmcp reads them) are requests naming the session all the same: they keep it open.
    #[tokio::test]
    async fn requests_answered_before_rmcp_keep_their_session_open() {
        let (_, mut server, session) = slow_service(Some(400)).await;
        for id in 3..13 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let body = format!(
                r#"{{"jsonrpc": "2.0", "id": {id}, "method": "tools/call", "params": {{"name": "slow_lookup", "arguments": {{"what": "a", "what": "b"}}}}}}"#
            );
            let mut request =
                request_of(Some("2025-11-25"), http::Method::POST, Some(&session), None);
            *request.body_mut() = Full::new(Bytes::from(body));
            let answer = serve(&mut server, request).await;
            assert_eq!(answer.status(), http::StatusCode::OK);
            let answer = text(answer).await;
            // Refused before the tool ran: `invalid_arguments`, with the request's id.
            assert!(answer.contains(r#""isError":true"#), "request {id}: {answer}");
            assert!(answer.contains("invalid_arguments"), "request {id}: {answer}");
            assert!(answer.contains(&format!(r#""id":{id}"#)), "request {id}: {answer}");
        }
        let ping = serde_json::json!({"jsonrpc": "2.0", "id": 20, "method": "ping"});
        let request =
            request_of(Some("2025-11-25"), http::Method::POST, Some(&session), Some(ping));
        let answer = serve(&mut server, request).await;
        assert_eq!(answer.status(), http::StatusCode::OK, "{}", text(answer).await);
    }

    /// What is kept of each session (its owner) is forgotten only once the session is closed:
    /// past `OWNERS_SWEEP_AT` sessions, those not named for a while are forgotten, but not one
    /// still open, however long ago a request named it (one whose call outlived its
    /// `keep_alive`). Forgotten, its owner would not be checked, and any user could use it.
    #[test]
    fn an_open_session_keeps_its_owner_when_others_are_forgotten() {
        let keep = std::time::Duration::from_millis(10);
        let idle = idle::Idle::new(Some(keep));
        idle.opened("open", None);
        let long_ago = Instant::now() - std::time::Duration::from_secs(1);
        let owned = |who: &str| Note {
            owner: Some(Some(who.to_owned())),
            reads_priming: Some(true),
            seen: long_ago,
        };
        let mut noted: HashMap<String, Note> =
            (1..OWNERS_SWEEP_AT).map(|i| (format!("closed-{i}"), owned("bob"))).collect();
        noted.insert("open".into(), owned("alice"));
        // Open, as a noted session is: a later sweep keeps it however long the test takes.
        idle.opened("new", None);
        note_session(&mut noted, Some(keep), &idle, "new", |n| n.owner = Some(Some("bob".into())));
        let mut left: Vec<&str> = noted.keys().map(String::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["new", "open"]);
        assert_eq!(noted["open"].owner, Some(Some("alice".to_owned())));
        // Many sessions open: not walked at each new one, yet what is missed still goes within
        // a few hundred.
        for i in 0..2 * OWNERS_SWEEP_AT {
            idle.opened(&format!("open-{i}"), None);
            noted.insert(format!("open-{i}"), owned("alice"));
        }
        noted.insert("missed".into(), owned("bob"));
        let mut added = 0;
        while noted.contains_key("missed") {
            added += 1;
            idle.opened(&format!("more-{added}"), None);
            note_session(&mut noted, Some(keep), &idle, &format!("more-{added}"), |n| {
                n.owner = Some(None)
            });
            assert!(added <= OWNERS_SWEEP_EVERY, "still there after {added} new sessions");
        }
        assert_eq!(noted.len(), 2 * OWNERS_SWEEP_AT + 2 + added, "every open session kept");
    }

    /// A session open here whose owner this layer does not know (it should never forget one)
    /// is refused to everyone, as an unknown session: the owner check fails closed.
    #[tokio::test]
    async fn an_open_session_whose_owner_is_not_known_is_refused() {
        let (mut server, session) = alices_session().await;
        let own = post(&mut server, "alice", Some(&session), list()).await;
        assert_eq!(own.status(), http::StatusCode::OK);
        let other = post(&mut server, "bob", Some(&session), list()).await;
        assert_eq!(other.status(), http::StatusCode::NOT_FOUND);
        // Its notes stay (its protocol version), its owner is gone.
        server.owners.notes.lock().get_mut(&session).expect("the session is noted").owner = None;
        for user in ["bob", "alice"] {
            let answer = post(&mut server, user, Some(&session), list()).await;
            assert_eq!(answer.status(), http::StatusCode::NOT_FOUND, "{user}");
        }
    }

    /// A client that drops a call's stream mid-call (its connection broke) may resume the
    /// stream for the result (`GET` with `Last-Event-ID`): the session stays open until the call
    /// has run, then is idle. Before, it was idle from the drop, and closed under the call.
    #[tokio::test]
    async fn a_call_whose_stream_was_dropped_keeps_its_session_until_it_has_run() {
        let (tools, mut server, session) = slow_service(Some(200)).await;
        let post = |body| post_in(&session, body);
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "slow_lookup", "arguments": {"what": "dropped"}}});
        let stream = serve(&mut server, post(call)).await;
        assert_eq!(stream.status(), http::StatusCode::OK);
        let guard = std::time::Duration::from_secs(60);
        until_a_call_runs(&tools).await;
        drop(stream);
        // Past the keep-alive since the drop; the call (1.5 s) still runs.
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        assert_eq!(tools.calls_running(), 1);
        let ping = |id: u32| serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        let answer = serve(&mut server, post(ping(3))).await;
        assert_eq!(answer.status(), http::StatusCode::OK);
        assert!(text(answer).await.contains(r#""result":{}"#));
        // Once it has run, the session is idle, and closed.
        tokio::time::timeout(guard, tools.calls_finished()).await.expect("the call ends");
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let answer = serve(&mut server, post(ping(4))).await;
        assert_eq!(answer.status(), http::StatusCode::NOT_FOUND, "{}", text(answer).await);
    }

    /// The task that closes idle sessions ends with the service: dropped, it leaves no task
    /// behind, and the sessions' maps go with it.
    #[tokio::test]
    async fn the_closing_task_ends_with_the_service() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let mut sessions = SessionConfig::default();
        sessions.keep_alive = Some(std::time::Duration::from_millis(40));
        let mut server = service_with_sessions(
            || IdemServer::from_tools(crate::IdemTools::new(ToolSet::new(), &Idem::in_memory())),
            StreamableHttpServerConfig::default(),
            sessions,
        );
        let answer = post(&mut server, "alice", Some("made-up"), list()).await;
        assert_eq!(answer.status(), http::StatusCode::NOT_FOUND);
        drop(answer);
        assert_eq!(metrics.num_alive_tasks(), before + 1, "the closing task runs");
        drop(server);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while metrics.num_alive_tasks() > before {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(ended.is_ok(), "{} tasks left", metrics.num_alive_tasks() - before);
    }

    /// A client whose connection broke mid-call, resuming the call's stream only once the call
    /// has ended, gets the result: the dropped stream is read on to its end and what the client
    /// missed is kept (over TCP rmcp 3.11 had lost it by then and sent an empty stream, on which
    /// the Python SDK reconnects for ever: `tests/mcp/http_cases_test.py` `lifecycle`). A resume
    /// from the last event gets nothing more, and another session naming the stream gets nothing
    /// of it.
    #[tokio::test]
    async fn a_stream_dropped_mid_call_is_resumed_after_the_call_with_its_result() {
        let (tools, mut server, session) = slow_service(None).await;
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "slow_lookup", "arguments": {"what": "late"}}});
        // The priming event, then the connection breaks.
        let last_id = first_event_then_drop(&mut server, &session, call).await;
        let guard = std::time::Duration::from_secs(60);
        tokio::time::timeout(guard, tools.calls_finished()).await.expect("the call ends");
        // The dropped stream was read on to its end, and its result kept.
        let kept = tokio::time::timeout(guard, async {
            loop {
                if let Some(kept) = server.late.after(&session, &last_id) {
                    break kept;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the result is kept");
        assert!(String::from_utf8_lossy(&kept).contains(r#""text":"late""#), "{kept:?}");
        let resume = |session: &str, last: &str| {
            let mut request =
                request_of(Some("2025-11-25"), http::Method::GET, Some(session), None);
            request.headers_mut().insert("last-event-id", last.parse().unwrap());
            request
        };
        let resumed = serve(&mut server, resume(&session, &last_id)).await;
        assert_eq!(resumed.status(), http::StatusCode::OK);
        let resumed = tokio::time::timeout(guard, text(resumed)).await.expect("the stream ends");
        assert!(resumed.contains(r#""text":"late""#), "resumed: {resumed:?}");
        assert!(resumed.contains(r#""id":2"#), "resumed: {resumed:?}");
        // From its last event: nothing more to send. rmcp's empty 200 would have the client
        // resume for ever; 410 ends its retries.
        let result_id = last_event_id(&resumed);
        let again = serve(&mut server, resume(&session, &result_id)).await;
        assert_eq!(again.status(), http::StatusCode::GONE);
        assert!(!text(again).await.contains("late"));
        // Another session: not its stream.
        let other = open_session(&mut server).await;
        let stolen = serve(&mut server, resume(&other, &last_id)).await;
        assert_eq!(stolen.status(), http::StatusCode::GONE);
        assert!(!text(stolen).await.contains("late"));
    }

    /// A resume of a request's stream that has nothing to send (the request is unknown, or
    /// answered and its events gone) is 410, not rmcp's 200 with an empty stream: on that, the
    /// MCP SDKs resume again with the same `Last-Event-ID` for ever. A resume of a call that
    /// still runs is the open stream that brings its result, and a resume of the standalone
    /// stream (an event id without a request) stays rmcp's.
    #[tokio::test]
    async fn a_resume_with_nothing_to_send_is_gone_and_one_of_a_running_call_is_not() {
        let (tools, mut server, session) = slow_service(None).await;
        let resume = |last: &str| {
            let mut request =
                request_of(Some("2025-11-25"), http::Method::GET, Some(&session), None);
            request.headers_mut().insert("last-event-id", last.parse().unwrap());
            request
        };
        for unknown in ["0/99", "3/1", "abc", ""] {
            let answer = serve(&mut server, resume(unknown)).await;
            assert_eq!(answer.status(), http::StatusCode::GONE, "{unknown}");
            assert!(text(answer).await.contains("same run id"), "{unknown}");
        }
        // A ping, answered in full: its stream ends with it.
        let ping = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        let answered = text(serve(&mut server, post_in(&session, ping)).await).await;
        let ping_id = last_event_id(&answered);
        let answer = serve(&mut server, resume(&ping_id)).await;
        assert_eq!(answer.status(), http::StatusCode::GONE, "{ping_id}");
        // A call that runs: its resumed stream stays open and brings the result.
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "slow_lookup", "arguments": {"what": "running"}}});
        let last_id = first_event_then_drop(&mut server, &session, call).await;
        let guard = std::time::Duration::from_secs(60);
        until_a_call_runs(&tools).await;
        let resumed = serve(&mut server, resume(&last_id)).await;
        assert_eq!(resumed.status(), http::StatusCode::OK);
        assert_eq!(tools.calls_running(), 1, "resumed while the call runs");
        let resumed = tokio::time::timeout(guard, text(resumed)).await.expect("the stream ends");
        assert!(resumed.contains(r#""text":"running""#), "resumed: {resumed:?}");
        // The standalone stream's resume: rmcp's open stream.
        let standalone = serve(&mut server, resume("0")).await;
        assert_eq!(standalone.status(), http::StatusCode::OK);
        use futures_util::FutureExt;
        assert!(standalone.into_body().frame().now_or_never().is_none(), "it stays open");
    }

    /// A `Last-Event-ID` that is not text is not a resume: rmcp ignores it and opens a
    /// standalone stream, which does not keep the session open (it held the session, and a
    /// graceful shutdown, for as long as the client kept the stream).
    #[tokio::test]
    async fn a_last_event_id_that_is_not_text_opens_a_standalone_stream() {
        let (_, mut server, session) = slow_service(Some(200)).await;
        let mut get = request_of(Some("2025-11-25"), http::Method::GET, Some(&session), None);
        let not_text = http::HeaderValue::from_bytes(b"\xc3\xa9/1").unwrap();
        get.headers_mut().insert("last-event-id", not_text);
        let stream = serve(&mut server, get).await;
        assert_eq!(stream.status(), http::StatusCode::OK);
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let ping = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        let answer = serve(&mut server, post_in(&session, ping)).await;
        assert_eq!(
            answer.status(),
            http::StatusCode::NOT_FOUND,
            "closed while the stream was open"
        );
        drop(stream);
    }

    /// What a dropped stream left is sent only in a session still open here: once the session
    /// is closed (its owner forgotten), a resume naming it is rmcp's 404, also when the stream's
    /// reader kept its events after the close.
    #[tokio::test]
    async fn a_closed_sessions_kept_events_are_not_sent() {
        let (mut server, session) = alices_session().await;
        let resume = |user: &str| {
            let mut request =
                request_of(Some("2025-11-25"), http::Method::GET, Some(&session), None);
            request.headers_mut().insert("last-event-id", "0/7".parse().unwrap());
            request.headers_mut().insert("x-user", user.parse().unwrap());
            request
        };
        server.late.keep_for_test(&session, b"data: {\"result\":\"alice's\"}\nid: 1/7\n\n");
        let own = serve(&mut server, resume("alice")).await;
        assert!(text(own).await.contains("alice's"), "the owner's resume");
        let bob = serve(&mut server, resume("bob")).await;
        assert_eq!(bob.status(), http::StatusCode::NOT_FOUND);
        let mut delete = request_of(Some("2025-11-25"), http::Method::DELETE, Some(&session), None);
        delete.headers_mut().insert("x-user", "alice".parse().unwrap());
        assert!(serve(&mut server, delete).await.status().is_success());
        // Kept after the close, as by a reader that ended just then.
        server.late.keep_for_test(&session, b"data: {\"result\":\"alice's\"}\nid: 1/7\n\n");
        let bob = serve(&mut server, resume("bob")).await;
        assert_eq!(bob.status(), http::StatusCode::NOT_FOUND, "{}", text(bob).await);
    }

    /// While a session is used, it stays open however long that lasts: requests more often than
    /// its `keep_alive` keep it.
    #[tokio::test]
    async fn requests_keep_a_session_open() {
        let (_, mut server, session) = slow_service(Some(400)).await;
        for id in 3..13 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            let ping = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
            let answer = serve(&mut server, post_in(&session, ping)).await;
            assert_eq!(answer.status(), http::StatusCode::OK, "ping {id}: {}", text(answer).await);
        }
    }

    static SENT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// Send a message.
    #[idem_core::tool(retry = "never")]
    async fn send_message(to: String) -> Result<String, idem_core::ToolFailure> {
        SENT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(format!("sent to {to}"))
    }

    async fn text(response: Response) -> String {
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// Without sessions (a stateless server; MCP 2026-07-28 has none), each request is served by
    /// a server of its own, so a call that names no run has no scope a retry could share: a
    /// `keyed` or `never` call is refused, one that names its run runs once and is replayed.
    #[tokio::test]
    async fn a_sessionless_call_that_names_no_run_is_refused() {
        let idem = Idem::in_memory();
        let make = move || {
            let set = ToolSet::new().with(SendMessageTool).unwrap();
            IdemServer::from_tools(crate::IdemTools::new(set, &idem).with_principal(|parts| {
                parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
            }))
        };
        let mut config = StreamableHttpServerConfig::default();
        config.legacy_session_mode = false;
        config.json_response = true;
        let mut server = service(make, config);
        let call = |meta: serde_json::Value| {
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                "name": "send_message", "arguments": {"to": "bob"}, "_meta": meta}})
        };
        let before = SENT.load(std::sync::atomic::Ordering::SeqCst);
        // A session header rmcp does not route by (made up, or stale) makes no session either.
        for session in [None, None, Some("garbage"), Some("")] {
            let refused =
                text(post(&mut server, "alice", session, call(serde_json::json!({}))).await).await;
            assert!(refused.contains("requires the run id"), "{session:?}: {refused}");
            assert!(refused.contains(r#""isError":true"#), "{session:?}: {refused}");
        }
        assert_eq!(SENT.load(std::sync::atomic::Ordering::SeqCst), before, "nothing was sent");
        let named = serde_json::json!({"idem/run": "conv-1"});
        let first = text(post(&mut server, "alice", None, call(named.clone())).await).await;
        let again = text(post(&mut server, "alice", None, call(named)).await).await;
        assert!(first.contains(r#""idem/outcome":"executed""#), "{first}");
        assert!(again.contains(r#""idem/outcome":"replayed""#), "{again}");
        assert_eq!(SENT.load(std::sync::atomic::Ordering::SeqCst), before + 1, "sent once");
        // An empty principal is none: refused, not the scope every caller without one shares.
        let empty = text(
            post(&mut server, "", None, call(serde_json::json!({"idem/run": "conv-1"}))).await,
        )
        .await;
        assert!(empty.contains("no authenticated principal"), "{empty}");
        assert_eq!(SENT.load(std::sync::atomic::Ordering::SeqCst), before + 1, "nothing more");
    }

    /// A 2026-07-28 request whose body idem refuses (a repeated member) gets idem's answer: the
    /// probe of its head for rmcp's own refusals is a method 2026-07-28 knows, and the headers
    /// that repeat the body (`Mcp-Method`, `Mcp-Name`) name it, or rmcp refuses the probe.
    #[tokio::test]
    async fn a_refused_body_of_a_2026_request_gets_idems_answer() {
        let idem = Idem::in_memory();
        let make = move || {
            let set = ToolSet::new().with(SendMessageTool).unwrap();
            IdemServer::from_tools(crate::IdemTools::new(set, &idem))
        };
        let mut server = service(make, StreamableHttpServerConfig::default());
        let body = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"send_message","arguments":{"to":"a","to":"b"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}"#;
        let request = http::Request::post("http://localhost/mcp")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "send_message")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let answer = serve(&mut server, request).await;
        let status = answer.status();
        let text = text(answer).await;
        assert_eq!(status, http::StatusCode::OK, "{text}");
        assert!(text.contains(r#""id":5"#) && text.contains("`to`"), "{text}");
    }

    /// rmcp routes by protocol version before the session header: a request naming 2026-07-28
    /// (in `_meta` or the header) is served without a session whatever header it carries.
    #[test]
    fn a_session_is_what_rmcp_routes_by() {
        let parts = |headers: &[(&str, &str)]| {
            let mut request = http::Request::post("/mcp");
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            request.body(()).unwrap().into_parts().0
        };
        let call = |meta: serde_json::Value| -> ClientJsonRpcMessage {
            serde_json::from_value(serde_json::json!({"jsonrpc": "2.0", "id": 1,
                "method": "tools/call", "params": {"name": "t", "arguments": {}, "_meta": meta}}))
            .unwrap()
        };
        let plain = call(serde_json::json!({}));
        let session = [(SESSION_HEADER, "s-1")];
        assert!(in_session(true, &parts(&session), &plain));
        assert!(!in_session(false, &parts(&session), &plain), "sessions off");
        assert!(!in_session(true, &parts(&[]), &plain), "no session header");
        let new_header = [(SESSION_HEADER, "s-1"), ("mcp-protocol-version", "2026-07-28")];
        assert!(!in_session(true, &parts(&new_header), &plain));
        let old_header = [(SESSION_HEADER, "s-1"), ("mcp-protocol-version", "2025-11-25")];
        assert!(in_session(true, &parts(&old_header), &plain));
        let new_meta =
            call(serde_json::json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"}));
        assert!(!in_session(true, &parts(&old_header), &new_meta), "the body's version first");
    }

    async fn delete<H: rmcp::ServerHandler + Send + 'static>(
        server: &mut Checked<StreamableHttpService<H, LocalSessionManager>>,
        session: &str,
    ) -> http::StatusCode {
        let request = http::Request::delete("http://localhost/mcp")
            .header("host", "localhost")
            .header("mcp-protocol-version", "2025-11-25")
            .header("x-user", "alice")
            .header(SESSION_HEADER, session)
            .body(Full::new(Bytes::new()))
            .unwrap();
        serve(server, request).await.status()
    }

    /// Clones of one `IdemTools` wait for each other's calls; two built apart do not (which
    /// `service_with_sessions` and `Shutdown::serve` warn of).
    #[test]
    fn tools_share_calls_only_with_their_clones() {
        let idem = Idem::in_memory();
        let one = crate::IdemTools::new(ToolSet::new(), &idem);
        assert!(one.shares_calls(&one.clone()));
        assert!(!one.shares_calls(&crate::IdemTools::new(ToolSet::new(), &idem)));
    }

    /// Sends SIGHUP to this process, as a closed terminal does.
    #[cfg(unix)]
    fn hang_up() {
        let sent = std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    }

    /// A graceful shutdown, signal by signal (one test: the signals reach the whole process).
    /// The first stops new sessions (503) and lets a call that runs (1.5 s) finish and send its
    /// result before rmcp's streams end; the server's own end is then waited for. A second
    /// signal cuts the wait, naming the call it leaves; so does a server still open after the
    /// close grace, with nothing lost.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_graceful_shutdown_sends_the_running_calls_results_and_a_second_signal_cuts() {
        let guard = std::time::Duration::from_secs(60);
        let make_server = || {
            let set = ToolSet::new().with(SlowLookupTool).unwrap();
            let tools = crate::IdemTools::new(set, &Idem::in_memory());
            let make = {
                let tools = tools.clone();
                move || IdemServer::from_tools(tools.clone())
            };
            (tools, service(make, StreamableHttpServerConfig::default()))
        };
        // The response's head comes before rmcp hands the call to the tools: a signal before
        // that would stop it from starting at all.
        let until_running = |tools: crate::IdemTools| async move {
            while tools.calls_running() == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        let lookup = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "slow_lookup", "arguments": {"what": "drained"}}});
        let call = |session: &str| {
            request_of(Some("2025-11-25"), http::Method::POST, Some(session), Some(lookup.clone()))
        };

        // The drain: the call finishes and its client reads the result, then the streams end,
        // then the server.
        let (tools, mut mcp) = make_server();
        let session = open_session(&mut mcp).await;
        let stream = serve(&mut mcp, call(&session)).await;
        assert_eq!(stream.status(), http::StatusCode::OK);
        tokio::time::timeout(guard, until_running(tools.clone())).await.expect("the call runs");
        // A second response carrying a result, still being sent once the call is done.
        let open = mcp.responses.open();
        let shutdown = mcp.shutdown();
        let streams = shutdown.streams.clone();
        let serving = tokio::spawn(shutdown.serve(tools.clone(), {
            let streams = streams.clone();
            // As axum's serve: stops accepting at `draining`, ends once the streams have.
            move |draining| async move {
                draining.await;
                streams.cancelled().await;
                "served"
            }
        }));
        hang_up();
        tokio::time::timeout(guard, mcp.draining.cancelled()).await.expect("draining");
        let refused = post(&mut mcp, "alice", None, initialize()).await;
        assert_eq!(refused.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[http::header::RETRY_AFTER], "1");
        // The drain has had time to run; the call has not (1.5 s).
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!streams.is_cancelled(), "the streams ended while a call ran");
        assert_eq!((tools.calls_running(), mcp.responses.count()), (1, 2));
        let result = tokio::time::timeout(guard, text(stream)).await.expect("the result");
        assert!(result.contains(r#""text":"drained""#), "{result}");
        assert!(result.contains(r#""isError":false"#), "{result}");
        // The call is done and its result sent: only the other open response holds the drain.
        tokio::time::timeout(guard, tools.calls_finished()).await.expect("finished");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!streams.is_cancelled(), "the streams ended while a response was open");
        assert_eq!(mcp.responses.count(), 1);
        drop(open);
        let served = tokio::time::timeout(guard, serving).await.expect("ends").unwrap();
        assert_eq!(served, Served::Ended("served"));
        assert!(streams.is_cancelled());
        // Once the streams are gone, every request is 503, not the 404 of an unknown session.
        let late = post(&mut mcp, "alice", Some(&session), list()).await;
        assert_eq!(late.status(), http::StatusCode::SERVICE_UNAVAILABLE);

        // A second signal ends the wait for a call that still runs, and names it.
        let (tools, mut mcp) = make_server();
        let session = open_session(&mut mcp).await;
        let _stream = serve(&mut mcp, call(&session)).await;
        tokio::time::timeout(guard, until_running(tools.clone())).await.expect("the call runs");
        let shutdown = mcp.shutdown();
        let streams = shutdown.streams.clone();
        let serving = tokio::spawn(shutdown.serve(tools, |draining| async move {
            draining.await;
            std::future::pending::<()>().await
        }));
        hang_up();
        tokio::time::timeout(guard, mcp.draining.cancelled()).await.expect("draining");
        // Apart: two signals of one kind sent at once may arrive as one.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        hang_up();
        let served = tokio::time::timeout(guard, serving).await.expect("cut").unwrap();
        assert_eq!(served, Served::Cut { calls: 1 });
        assert!(streams.is_cancelled());

        // A server that does not end once drained (a connection that sent half a request) is
        // dropped after the close grace, with no second signal.
        let (tools, mcp) = make_server();
        let serving = tokio::spawn(mcp.shutdown().serve(tools, |_| std::future::pending::<()>()));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        hang_up();
        let served = tokio::time::timeout(guard, serving).await.expect("dropped").unwrap();
        assert_eq!(served, Served::Drained);
    }

    /// MCP 2025-11-25 "Transports" (Session Management): once a session is terminated the server
    /// MUST answer requests naming it with 404, and a DELETE is such a request. rmcp answers 202
    /// to a DELETE of any session id, so a client that closes a session twice, or one the server
    /// already closed for silence, is told it closed something.
    #[tokio::test]
    async fn a_delete_naming_an_unknown_or_closed_session_is_404() {
        let store = Arc::new(SharedSessions::default());
        let (mut a, mut b) = (instance(&store), instance(&store));
        let opened = post(&mut a, "alice", None, initialize()).await;
        let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
        assert_eq!(delete(&mut a, "no-such-session").await, http::StatusCode::NOT_FOUND);
        // A session stored by another instance is known here, and closed.
        assert!(delete(&mut b, &session).await.is_success(), "closing alice's session on b");
        assert_eq!(delete(&mut b, &session).await, http::StatusCode::NOT_FOUND, "closed twice");
        let mut plain = service(
            || IdemServer::from_tools(crate::IdemTools::new(ToolSet::new(), &Idem::in_memory())),
            StreamableHttpServerConfig::default(),
        );
        let opened = post(&mut plain, "alice", None, initialize()).await;
        let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
        assert_eq!(delete(&mut plain, &session).await, http::StatusCode::OK, "closing a session");
        assert_eq!(delete(&mut plain, &session).await, http::StatusCode::NOT_FOUND);
        assert_eq!(delete(&mut plain, "no-such-session").await, http::StatusCode::NOT_FOUND);
        let after = post(&mut plain, "alice", Some(&session), list()).await;
        assert_eq!(after.status(), http::StatusCode::NOT_FOUND, "a request after DELETE");
    }

    /// MCP 2025-11-25 "Lifecycle": initialization is the first interaction of a session, once. An
    /// `initialize` naming a live session is refused (400, -32600 with its id) and leaves the
    /// session as it was; rmcp answered it 200 and negotiated again inside the open session. One
    /// naming an unknown session is still 404, and one without a session opens a new one.
    #[tokio::test]
    async fn an_initialize_in_a_live_session_is_refused() {
        let mut server = service(
            || IdemServer::from_tools(crate::IdemTools::new(ToolSet::new(), &Idem::in_memory())),
            StreamableHttpServerConfig::default(),
        );
        let opened = post(&mut server, "alice", None, initialize()).await;
        let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
        let again = post(&mut server, "alice", Some(&session), initialize()).await;
        assert_eq!(again.status(), http::StatusCode::BAD_REQUEST);
        assert!(again.headers().get(SESSION_HEADER).is_none(), "no new session");
        // A JSON-RPC answer says it is JSON, whatever its status.
        assert_eq!(again.headers()[http::header::CONTENT_TYPE], "application/json");
        let answer: serde_json::Value = serde_json::from_str(&text(again).await).unwrap();
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert_eq!(answer["id"], 1, "{answer}");
        let alive = text(post(&mut server, "alice", Some(&session), list()).await).await;
        assert!(alive.contains(r#""tools":[]"#), "the session still serves: {alive}");
        let unknown = post(&mut server, "alice", Some("no-such-session"), initialize()).await;
        assert_eq!(unknown.status(), http::StatusCode::NOT_FOUND);
        let fresh = post(&mut server, "alice", None, initialize()).await;
        assert_eq!(fresh.status(), http::StatusCode::OK);
        assert_ne!(fresh.headers()[SESSION_HEADER].to_str().unwrap(), session);
    }

    /// RFC 9110 §12.5.1: `*/*`, `application/*` and `text/*` in `Accept` cover the types the MCP
    /// transport answers with; curl, httpx and Postman send `*/*` by default. rmcp matched the
    /// two types literally and answered 406; a range weighted `q=0` still excludes them.
    #[tokio::test]
    async fn wildcard_accept_ranges_cover_json_and_event_streams() {
        let mut server = service(
            || IdemServer::from_tools(crate::IdemTools::new(ToolSet::new(), &Idem::in_memory())),
            StreamableHttpServerConfig::default(),
        );
        let mut send = async |method: http::Method, accept: &str, session: Option<&str>| {
            let mut request = http::Request::builder()
                .method(method.clone())
                .uri("http://localhost/mcp")
                .header("host", "localhost")
                .header("content-type", "application/json")
                .header("accept", accept);
            if let Some(session) = session {
                request = request.header(SESSION_HEADER, session);
            }
            let body =
                if method == http::Method::POST { initialize().to_string() } else { String::new() };
            let request = request.body(Full::new(Bytes::from(body))).unwrap();
            serve(&mut server, request).await
        };
        let mut session = None;
        for accept in
            ["*/*", "application/*, text/*", "application/json, text/*;q=0.5", "*/*;q=0.8"]
        {
            let answer = send(http::Method::POST, accept, None).await;
            assert_eq!(answer.status(), http::StatusCode::OK, "POST, Accept: {accept}");
            session = Some(answer.headers()[SESSION_HEADER].to_str().unwrap().to_owned());
        }
        for accept in
            ["application/*", "text/*", "text/html", "*/*;q=0", "application/json;q=0, */*"]
        {
            let answer = send(http::Method::POST, accept, None).await;
            assert_eq!(answer.status(), http::StatusCode::NOT_ACCEPTABLE, "POST, Accept: {accept}");
        }
        let stream = send(http::Method::GET, "*/*", session.as_deref()).await;
        assert_eq!(stream.status(), http::StatusCode::OK, "GET, Accept: */*");
        let refused = send(http::Method::GET, "application/*", session.as_deref()).await;
        assert_eq!(
            refused.status(),
            http::StatusCode::NOT_ACCEPTABLE,
            "GET, Accept: application/*"
        );
    }

    /// `Content-Type` is compared by its media type, as rmcp compares it: `application/jsonx` is
    /// another type (415), whatever the body, and `Application/JSON; charset=utf-8` is JSON (a
    /// body that is not UTF-8 is then a JSON-RPC parse error, not rmcp's 415).
    #[tokio::test]
    async fn content_type_is_matched_by_media_type_not_prefix() {
        let mut server = service(
            || IdemServer::from_tools(crate::IdemTools::new(ToolSet::new(), &Idem::in_memory())),
            StreamableHttpServerConfig::default(),
        );
        for (kind, want) in [
            ("application/jsonx", http::StatusCode::UNSUPPORTED_MEDIA_TYPE),
            ("application/json-seq", http::StatusCode::UNSUPPORTED_MEDIA_TYPE),
            ("Application/JSON; charset=utf-8", http::StatusCode::BAD_REQUEST),
        ] {
            let request = http::Request::post("http://localhost/mcp")
                .header("host", "localhost")
                .header("content-type", kind)
                .header("accept", "application/json, text/event-stream")
                .body(Full::new(Bytes::from_static(
                    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}",
                )))
                .unwrap();
            let answer = serve(&mut server, request).await;
            let status = answer.status();
            let body = text(answer).await;
            assert_eq!(status, want, "{kind}: {body}");
            if want == http::StatusCode::BAD_REQUEST {
                assert!(body.contains("-32700"), "{kind}: {body}");
            }
        }
        // A forbidden `Origin` is refused before the body is read as JSON, as rmcp refuses it.
        let request = http::Request::post("http://localhost/mcp")
            .header("host", "localhost")
            .header("origin", "http://evil.example")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(Full::new(Bytes::from_static(b"{\"id\":\"\xff\"}")))
            .unwrap();
        let answer = serve(&mut server, request).await;
        assert_eq!(answer.status(), http::StatusCode::FORBIDDEN);
    }

    /// Request ids are unique within a session (MCP 2025-11-25 "Basic"). A request rmcp serves
    /// without one (sessions off; a stale or made-up `Mcp-Session-Id` it does not route by) shares
    /// no session with another that carries the same header, so the same id in both is no reuse.
    #[tokio::test]
    async fn request_ids_are_claimed_only_in_a_session() {
        let mut config = StreamableHttpServerConfig::default();
        config.legacy_session_mode = false;
        let mut server = service(
            || IdemServer::from_tools(crate::IdemTools::new(ToolSet::new(), &Idem::in_memory())),
            config,
        );
        // The first answer's body is held open: its request is still in flight.
        let first = post(&mut server, "alice", Some("stale"), list()).await;
        assert_eq!(first.status(), http::StatusCode::OK);
        let second = text(post(&mut server, "bob", Some("stale"), list()).await).await;
        assert!(second.contains(r#""tools":[]"#), "{second}");
        drop(first);
    }

    static POSTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// Post a note.
    #[idem_core::tool(retry = "never")]
    async fn post_note(text: String) -> Result<String, idem_core::ToolFailure> {
        POSTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(format!("posted {text}"))
    }

    /// A server built once and handed to every session (`make` returning a clone, as rmcp's own
    /// examples do): a call that names no run is scoped to its session, so the same note posted
    /// in a second session of the same user is posted again, as it is with a server made for
    /// each session. Before, every session shared the one server's run, and the second session's
    /// call was answered with the first session's note.
    #[tokio::test]
    async fn sessions_of_one_shared_server_each_have_their_own_run() {
        use std::sync::atomic::Ordering::SeqCst;
        let idem = Idem::in_memory();
        let tools = crate::IdemTools::new(ToolSet::new().with(PostNoteTool).unwrap(), &idem)
            .with_principal(|parts| {
                parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
            });
        let shared = IdemServer::from_tools(tools.clone());
        let mut served = service(move || shared.clone(), StreamableHttpServerConfig::default());
        let own = Own {
            tool_router: tools
                .mount(rmcp::handler::server::router::tool::ToolRouter::new())
                .unwrap(),
        };
        let mut mounted = service_for(
            move || own.clone(),
            tools.principal_fn(),
            StreamableHttpServerConfig::default(),
            SessionConfig::default(),
        );
        let call = |meta: serde_json::Value| {
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                "name": "post_note", "arguments": {"text": "hello"}, "_meta": meta}})
        };
        async fn session<H: rmcp::ServerHandler + Send + 'static>(
            server: &mut Checked<StreamableHttpService<H, LocalSessionManager>>,
        ) -> String {
            let opened = post(server, "alice", None, initialize()).await;
            opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned()
        }
        let before = POSTED.load(SeqCst);
        let first = session(&mut served).await;
        let second = session(&mut served).await;
        let a =
            text(post(&mut served, "alice", Some(&first), call(serde_json::json!({}))).await).await;
        let b = text(post(&mut served, "alice", Some(&second), call(serde_json::json!({}))).await)
            .await;
        let again =
            text(post(&mut served, "alice", Some(&second), call(serde_json::json!({}))).await)
                .await;
        assert!(a.contains(r#""idem/outcome":"executed""#), "{a}");
        assert!(b.contains(r#""idem/outcome":"executed""#), "a second session: {b}");
        assert!(again.contains(r#""idem/outcome":"replayed""#), "its repeat: {again}");
        assert_eq!(POSTED.load(SeqCst), before + 2, "one note per session");

        let first = session(&mut mounted).await;
        let second = session(&mut mounted).await;
        let a = text(post(&mut mounted, "alice", Some(&first), call(serde_json::json!({}))).await)
            .await;
        let b = text(post(&mut mounted, "alice", Some(&second), call(serde_json::json!({}))).await)
            .await;
        assert!(a.contains(r#""idem/outcome":"executed""#), "{a}");
        assert!(b.contains(r#""idem/outcome":"executed""#), "a second session, mounted: {b}");
        assert_eq!(POSTED.load(SeqCst), before + 4, "one note per session, mounted");
        // A run named in `_meta` is the same in every session: the repeat is replayed.
        let named = serde_json::json!({"idem/run": "conv-9"});
        let a = text(post(&mut mounted, "alice", Some(&first), call(named.clone())).await).await;
        let b = text(post(&mut mounted, "alice", Some(&second), call(named)).await).await;
        assert!(a.contains(r#""idem/outcome":"executed""#), "{a}");
        assert!(b.contains(r#""idem/outcome":"replayed""#), "{b}");
        assert_eq!(POSTED.load(SeqCst), before + 5);
    }

    /// An rmcp server of the app's own, idem tools mounted in its router.
    #[derive(Clone)]
    struct Own {
        tool_router: rmcp::handler::server::router::tool::ToolRouter<Own>,
    }

    #[rmcp::tool_handler(router = self.tool_router)]
    impl rmcp::ServerHandler for Own {}

    /// The app's own server behind the same checks: its sessions are bound to the principal its
    /// idem tools scope calls by, and its idem tools answer as they do in an `IdemServer`.
    #[tokio::test]
    async fn an_apps_own_server_gets_the_same_session_binding() {
        let idem = Idem::in_memory();
        let tools = crate::IdemTools::new(ToolSet::new().with(SendMessageTool).unwrap(), &idem)
            .with_principal(|parts| {
                parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
            });
        let principal = tools.principal_fn();
        let make = move || Own {
            tool_router: tools
                .mount(rmcp::handler::server::router::tool::ToolRouter::new())
                .unwrap(),
        };
        let mut server = service_for(
            make,
            principal,
            StreamableHttpServerConfig::default(),
            SessionConfig::default(),
        );
        let opened = post(&mut server, "alice", None, initialize()).await;
        assert_eq!(opened.status(), http::StatusCode::OK);
        let session = opened.headers()[SESSION_HEADER].to_str().unwrap().to_owned();
        let bob = post(&mut server, "bob", Some(&session), list()).await;
        assert_eq!(bob.status(), http::StatusCode::NOT_FOUND, "bob naming alice's session");
        let alice = text(post(&mut server, "alice", Some(&session), list()).await).await;
        assert!(alice.contains("send_message"), "{alice}");
    }
}

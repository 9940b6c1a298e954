//! [`IdemTools`]: an idem [`ToolSet`] as MCP tools, for [`IdemServer`](crate::IdemServer) or for
//! a user's own rmcp server beside its `#[tool_router]` tools ([`IdemTools::router`]).
//!
//! The mapping itself (definitions, `_meta`, results) is idem-core's
//! ([`ToolSet::dispatch_mcp`], [`ToolDefinition::to_mcp`], [`ToolResult::to_mcp`]); this module
//! only moves it into rmcp's types and adds what needs the MCP session: the session run, the
//! client's `progressToken`, the arguments' text kept by the transport.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use idem_core::toolset::{Arguments, ErrorKind, McpCall, MissingRun, ToolDefinition, ToolResult};
use idem_core::{Idem, Run, StopSignal, ToolSet, WaitHook};
use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResponse, CallToolResult, JsonObject, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value};
use tokio_util::task::TaskTracker;

use crate::jsonrpc::ArgumentsText;

/// What a host should be told to send so that retries survive a reconnect: put it in the
/// server's `instructions` (MCP `initialize`). [`IdemServer`](crate::IdemServer) does.
pub const RUN_ID_INSTRUCTIONS: &str = "Tool calls that change something are protected against \
running twice. With every tools/call, send `_meta: {\"idem/run\": \"<conversation id>\"}`: one \
stable id per conversation, the same on every retry, also after a reconnect or a server restart. \
A repeat with the same arguments in the same run then returns the first call's result instead of \
acting again. Results say what happened in `_meta[\"idem/outcome\"]`: executed, replayed, joined, \
taken_over (ran after an earlier owner stopped without a result), reconciled (an earlier attempt \
was found to have taken effect), or unknown (the call may have taken effect: do not repeat it, \
check).";

/// How long [`IdemTools::calls_finished`] waits for outcomes the store refused when their tools
/// finished, still being sent again in the background: 10 s.
pub const LATE_COMPLETIONS_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a call that waits on another owner of its key sends an MCP progress notification
/// (MCP 2025-11-25 "Progress"), when its request has a `progressToken`: one when the wait starts,
/// then one per interval until the call is answered, so a wait of `t` seconds hears at most
/// `1 + t` notifications, with progress 1, 2, 3, ...
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// A run id unique to this connection: process id, start time (ns) and a counter.
pub(crate) fn session_run_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("mcp-session-{}-{nanos}-{n}", std::process::id())
}

/// The connections one [`IdemTools`] (and its clones) served outside HTTP, each with the run its
/// calls that name none get.
#[derive(Default)]
struct Connections {
    runs: Vec<(Mark, String)>,
    opened: u64,
}

/// How a connection is known: by the mark [`crate::stdio::LineTransport`] puts in each of its
/// requests, else by the client's `initialize` parameters that rmcp keeps for it (none for a
/// connection that opens no session, MCP 2026-07-28). Either is one allocation per connection,
/// held here weakly: its address is not reused while it is listed.
enum Mark {
    Transport(std::sync::Weak<()>),
    Client(std::sync::Weak<rmcp::model::InitializeRequestParams>),
}

impl Mark {
    fn of(context: &RequestContext<RoleServer>) -> Option<Mark> {
        if let Some(connection) = context.extensions.get::<crate::stdio::Connection>() {
            return Some(Mark::Transport(Arc::downgrade(&connection.0)));
        }
        context.peer.peer_info().map(|client| Mark::Client(Arc::downgrade(&client)))
    }

    fn alive(&self) -> bool {
        match self {
            Mark::Transport(mark) => mark.strong_count() > 0,
            Mark::Client(mark) => mark.strong_count() > 0,
        }
    }

    fn address(&self) -> *const () {
        match self {
            Mark::Transport(mark) => mark.as_ptr().cast(),
            Mark::Client(mark) => mark.as_ptr().cast(),
        }
    }
}

/// An idem [`ToolSet`] as MCP tools for one session. Cheap to clone.
#[derive(Clone)]
pub struct IdemTools {
    tools: Arc<ToolSet>,
    session: Run,
    /// Whether `session` was made here ([`IdemTools::new`]) rather than given: each HTTP session
    /// and each connection then gets a run of its own, since one value (and its clones) may serve
    /// every one.
    per_session: bool,
    /// The connections (rmcp services) these tools and their clones served, each with its run:
    /// one value may be cloned into the server of each connection a process accepts.
    connections: Arc<std::sync::Mutex<Connections>>,
    missing_run: MissingRun,
    /// The calls' tasks, shared by clones, so a server can let them finish before it exits.
    calls: TaskTracker,
    /// Every call's stop signal is a child of this one ([`IdemTools::stop_calls`]).
    shutdown: StopSignal,
    #[cfg(feature = "http")]
    principal: Option<crate::http::PrincipalFn>,
}

impl std::fmt::Debug for IdemTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdemTools")
            .field("tools", &self.tools)
            .field("session", &self.session.scope())
            .field("missing_run", &self.missing_run)
            .finish()
    }
}

impl IdemTools {
    /// `tools` on `idem`; calls without `_meta["idem/run"]` are scoped to a new run id for this
    /// session (`mcp-session-<pid>-<start ns>-<n>`).
    ///
    /// Each MCP session (over HTTP) or connection (a process that accepts several) has a run
    /// of its own, also when one `IdemTools` (or a server holding it) is cloned into every one:
    /// a repeat in another session runs again, as it does in a new process.
    pub fn new(tools: ToolSet, idem: &Idem) -> Self {
        let mut tools = IdemTools::with_session_run(tools, idem.run(session_run_id()));
        tools.per_session = true;
        tools
    }

    /// `tools`, with calls that name no run scoped to `session` (its tenant, run and caller key).
    /// A run named in `_meta["idem/run"]` is looked up inside `session`'s tenant.
    pub fn with_session_run(tools: ToolSet, session: Run) -> Self {
        IdemTools {
            tools: Arc::new(tools),
            session,
            per_session: false,
            connections: Arc::default(),
            missing_run: MissingRun::Warn,
            calls: TaskTracker::new(),
            shutdown: StopSignal::new(),
            #[cfg(feature = "http")]
            principal: None,
        }
    }

    /// Waits until every call started through these tools (or a clone of them) has finished and
    /// its outcome is stored. A call runs in a task of its own, so that a client that goes away
    /// (stdio EOF, a closed HTTP connection or session, `notifications/cancelled`) does not stop
    /// an effect halfway: a process that exits when its transport closes must wait for this
    /// first, or the runtime drops the call mid-effect, its claim is left to expire and the
    /// client's repeat after a restart waits for the lease and runs the tool again (a `never`
    /// tool's outcome becomes unknown). [`IdemServer::serve_stdio`](crate::IdemServer::serve_stdio)
    /// does. Each call is bounded by its tool's timeout and deadline. Then it waits up to
    /// [`LATE_COMPLETIONS_AT_EXIT`] for the outcomes the store refused when their tools finished
    /// (being sent again: [`Idem::late_completions`](idem_core::Idem::late_completions)); one
    /// still pending after that is left to its lease, and logged.
    pub async fn calls_finished(&self) {
        // A closed tracker still takes new calls; closing only lets `wait` end once it is empty.
        self.calls.close();
        self.calls.wait().await;
        let left = self.session.idem().late_completions_settled(LATE_COMPLETIONS_AT_EXIT).await;
        if left > 0 {
            tracing::warn!(
                outcomes = left,
                "outcomes the store refused are still not stored; their records stay in flight \
                 until their leases end"
            );
        }
    }

    /// Tells every call started through these tools (or a clone of them) to start nothing more,
    /// as a cancelled request does ([`idem_core::StopSignal`]): attempts in progress finish and
    /// are stored; calls waiting to retry, or waiting for another owner, end and release their
    /// keys at once. For a shutdown that must end soon (a host sends SIGKILL about 2 s after
    /// SIGTERM): a call still pausing before a retry would otherwise be cut off in the middle
    /// of its next attempt. New calls after this start nothing either.
    pub fn stop_calls(&self) {
        self.shutdown.stop();
    }

    /// Runs `serving` (what serves these tools: rmcp's `RunningService::waiting()` over stdio,
    /// axum's `serve` over HTTP) until it ends or the process gets SIGTERM, SIGINT or SIGHUP
    /// (Ctrl-C off Unix), then waits for the calls still running
    /// ([`calls_finished`](Self::calls_finished)), so that each call's outcome is stored before
    /// the process exits and its repeat on a restarted server is replayed. Without it, SIGTERM
    /// (a host stopping a stdio server, `docker stop`, Kubernetes, systemd) ends the process at
    /// once: a `keyed` call cut off mid-attempt runs again on its repeat once its lease ends, a
    /// `never` one answers "outcome unknown".
    ///
    /// On the first signal `serving` is dropped (no new request is read; over HTTP the
    /// listener closes and open responses end, and the client's repeat is answered from the
    /// store; `http::Shutdown`, feature `http`, sends them instead), and calls that wait to
    /// retry or for another owner start nothing more and release their keys ([`stop_calls`](Self::stop_calls)): the SIGKILL that follows comes soon. A
    /// second signal stops the wait, leaving the calls still running to their leases. The
    /// handlers are installed for the whole process when this is called.
    /// [`IdemServer::serve_stdio`](crate::IdemServer::serve_stdio) does this.
    ///
    /// Returns what `serving` returned, or `None` when a signal ended it. These tools must be
    /// the ones every session serves (clones of one `IdemTools`): calls of another value are not
    /// waited for.
    pub async fn serve_until_shutdown<T>(
        &self,
        serving: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let mut signals = crate::shutdown::Signals::new();
        let stop_waiting_calls = |signal: &str| {
            tracing::info!(signal, "ending the MCP service and the calls waiting to run");
            self.stop_calls();
        };
        let mut signalled = false;
        let served = tokio::select! {
            served = serving => Some(served),
            signal = signals.next() => {
                stop_waiting_calls(signal);
                signalled = true;
                None
            }
        };
        let left = self.calls_running();
        if left > 0 {
            tracing::info!(calls = left, "the service ended: finishing the calls still running");
        }
        loop {
            tokio::select! {
                () = self.calls_finished() => break,
                signal = signals.next() => {
                    // The first signal after EOF (the hosts' order: stdin closed, then SIGTERM)
                    // is the first signal, not the second.
                    if !signalled {
                        stop_waiting_calls(signal);
                        signalled = true;
                        continue;
                    }
                    let left = self.calls_running();
                    tracing::warn!(
                        signal,
                        calls = left,
                        "leaving the calls still running to their leases"
                    );
                    break;
                }
            }
        }
        served
    }

    /// How many calls started through these tools are still running.
    pub fn calls_running(&self) -> usize {
        self.calls.len()
    }

    /// Over HTTP, scope every call to the principal `principal` finds in the request (see
    /// [`crate::http`]): the key scope's tenant is the principal, so a run id or caller key from
    /// the client is only looked up among that principal's records. An empty (or blank)
    /// principal counts as none.
    #[cfg(feature = "http")]
    pub fn with_principal(
        mut self,
        principal: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        // An empty principal is none: as a tenant it would be the scope without one, which every
        // caller not over HTTP (stdio, a run made in code) shares.
        self.principal =
            Some(Arc::new(move |parts| principal(parts).filter(|p| !p.trim().is_empty())));
        self
    }

    /// The principal function set with [`with_principal`](Self::with_principal), if any: for
    /// [`crate::http::service_for`], which binds sessions to it.
    #[cfg(feature = "http")]
    pub fn principal_fn(&self) -> Option<crate::http::PrincipalFn> {
        self.principal.clone()
    }

    /// Whether `other` is this value or a clone of it, so that each waits for the other's calls.
    #[cfg(feature = "http")]
    pub(crate) fn shares_calls(&self, other: &IdemTools) -> bool {
        TaskTracker::ptr_eq(&self.calls, &other.calls)
    }

    /// The session run for a request: over HTTP, inside the request's principal. `Err` is the
    /// refusal of a `keyed` or `never` call that has no principal.
    fn session_for(&self, name: &str, context: &RequestContext<RoleServer>) -> Result<Run, String> {
        #[cfg(feature = "http")]
        if let Some(parts) = context.extensions.get::<http::request::Parts>() {
            // rmcp's factory may hand every session a clone of one server: the value alone does
            // not tell sessions apart, and calls of two conversations would share one run.
            let mut run = self.session.scope().run_id().to_owned();
            let session = crate::http::routed_session(parts).filter(|_| self.per_session);
            if let Some(id) = session {
                run = format!("{run}-{id}");
            }
            let principal = self.principal.as_ref().and_then(|f| f(parts));
            if let Some(principal) = principal {
                let scope = idem_core::Scope::run(run).with_tenant(principal);
                return Ok(self.session.in_scope(scope));
            }
            let changes =
                self.tools.definition(name).is_some_and(|d| d.class != idem_core::RetryClass::Safe);
            if changes {
                return Err(match self.principal {
                    None => format!(
                        "`{name}` is refused: this MCP server serves several users over HTTP and has no principal configured (idem_mcp::IdemTools::with_principal), so a run id or idempotency key from one client could reach another user's records; nothing was executed. The server's operator must configure how a request's user is found"
                    ),
                    Some(_) => format!(
                        "`{name}` is refused: this request carries no authenticated principal, and over HTTP every call that changes something is scoped to one; nothing was executed. Authenticate (for example with an `Authorization: Bearer` token) and call again"
                    ),
                });
            }
            if session.is_some() {
                let tenant = self.session.scope().tenant().to_owned();
                let scope = idem_core::Scope::run(run).with_tenant(tenant);
                return Ok(self.session.in_scope(scope));
            }
            // A request without a session has a server of its own: nothing to tell apart.
            return Ok(self.session.clone());
        }
        #[cfg(not(feature = "http"))]
        let _ = name;
        if let Some(run) = self.connection_run(context) {
            let tenant = self.session.scope().tenant().to_owned();
            return Ok(self.session.in_scope(idem_core::Scope::run(run).with_tenant(tenant)));
        }
        Ok(self.session.clone())
    }

    /// The run of the connection (outside HTTP) that sent the request, when the session run was
    /// made here: the first connection has the session run itself, each later one a run of its
    /// own. `None`: the session run applies (a run given by the caller, or a connection known by
    /// neither mark, one that opened no session over a transport other than idem's).
    fn connection_run(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        if !self.per_session {
            return None;
        }
        let mark = Mark::of(context)?;
        // A poisoned lock only means another call panicked while holding it: the list is whole.
        let mut connections =
            self.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        connections.runs.retain(|(seen, _)| seen.alive());
        let seen =
            connections.runs.iter().find(|(seen, _)| std::ptr::eq(seen.address(), mark.address()));
        if let Some((_, run)) = seen {
            return Some(run.clone());
        }
        let base = self.session.scope().run_id();
        let run = match connections.opened {
            0 => base.to_owned(),
            n => format!("{base}-{n}"),
        };
        connections.opened += 1;
        connections.runs.push((mark, run.clone()));
        Some(run)
    }

    /// What to do with a `keyed` or `never` call that names no run (default
    /// [`MissingRun::Warn`]: a `tracing` warning). [`MissingRun::Refuse`] answers it with an
    /// `isError` result saying what to send. Over HTTP without a session (a stateless server, or
    /// MCP 2026-07-28's sessionless requests) such a call is always refused: its only scope
    /// would be the request itself, and every retry would run again.
    pub fn with_missing_run(mut self, missing_run: MissingRun) -> Self {
        self.missing_run = missing_run;
        self
    }

    /// The run used when a call names none. Over HTTP, a run made by `new` is the base of each
    /// MCP session's own (its id, `-`, the session's id), in the request's principal.
    pub fn session_run(&self) -> &Run {
        &self.session
    }

    /// The tool set.
    pub fn tools(&self) -> &ToolSet {
        &self.tools
    }

    /// The rmcp tools for `tools/list`, sorted by name.
    pub fn list(&self) -> Vec<rmcp::model::Tool> {
        self.tools.definitions().filter_map(|d| to_mcp_tool(d).ok()).collect()
    }

    /// These tools added to a user's own rmcp router (the server's `#[tool_router]`), so that
    /// each idem tool is listed and called like the server's own. The server's own `list_tools`
    /// answers `tools/list`, cursors included: the router adds tools to its list, not a
    /// pagination of its own.
    ///
    /// Errors: [`NameCollision`] when a tool of `router` (enabled or disabled) has the name of an
    /// idem tool; `router` is then dropped, since rmcp's router would keep one of the two without
    /// a word, and a call meant for the idem tool could run an unprotected one every time it is
    /// retried. Mount last: a router merged into the result with `+` afterwards replaces tools
    /// of the same name unchecked.
    pub fn mount<S: Send + Sync + 'static>(
        &self,
        router: ToolRouter<S>,
    ) -> Result<ToolRouter<S>, NameCollision> {
        let names: Vec<String> = self
            .tools
            .definitions()
            // A disabled route would still be replaced, and the idem tool would take its
            // disabled state.
            .filter(|d| router.has_route(d.name) || router.is_disabled(d.name))
            .map(|d| d.name.to_owned())
            .collect();
        if !names.is_empty() {
            return Err(NameCollision { names });
        }
        Ok(router + self.router())
    }

    /// A router of these tools alone, for a user's own rmcp server. Prefer
    /// [`mount`](Self::mount): merged with `+`, rmcp's router keeps the later of two tools of
    /// one name without a word.
    pub fn router<S: Send + Sync + 'static>(&self) -> ToolRouter<S> {
        let mut router = ToolRouter::new();
        for def in self.tools.definitions() {
            let tool = match to_mcp_tool(def) {
                Ok(tool) => tool,
                Err(e) => {
                    tracing::error!(tool = def.name, error = %e, "not an MCP tool definition");
                    continue;
                }
            };
            let this = self.clone();
            router.add_route(ToolRoute::new_dyn(tool, move |cx: ToolCallContext<'_, S>| {
                let this = this.clone();
                let ToolCallContext { request_context, name, arguments, .. } = cx;
                let call: BoxFuture<'static, _> =
                    Box::pin(async move { this.call(&name, arguments, request_context).await });
                call
            }));
        }
        router
    }

    /// Handles one `tools/call` of `name`, with the request's context (its `_meta`, progress
    /// token, the arguments' text kept by [`crate::stdio::LineTransport`]).
    ///
    /// Errors: an unknown tool or an ill-formed idem `_meta` entry (JSON-RPC -32602).
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let meta: Map<String, Value> = context.meta.0.0.clone();
        // The client's text is the call only while it is what this handler was given: a server
        // wrapping these tools may pass other arguments (rewritten, or a call it builds inside
        // another tool's request), and those are the call then.
        let text = arguments_text(&context).filter(|t| is_the_call(&t.0, arguments.as_ref()));
        let mut session = match self.session_for(name, &context) {
            Ok(run) => run,
            Err(refusal) => {
                let result = ToolResult::error(ErrorKind::InvalidToolCall, refusal, None);
                return Ok(to_call_tool_result(&result)?.into());
            }
        };
        let waits = context.meta.get_progress_token().map(|token| {
            let (tx, rx) = tokio::sync::watch::channel(Waiting::No);
            let owner = tx.clone();
            session = session.with_wait_hook(
                WaitHook::new(move |_| {
                    tx.send_replace(Waiting::Yes);
                })
                .on_owner(move |_| {
                    owner.send_replace(Waiting::Owner);
                }),
            );
            (token, rx)
        });
        // A cancelled request starts nothing more: its attempt in progress finishes and is
        // stored, but no retry (or first attempt after a wait) runs after the client has gone.
        let stop = self.shutdown.child();
        let session = session.with_stop(stop.clone());
        let tools = Arc::clone(&self.tools);
        let missing_run = if sessionless(&context) { MissingRun::Refuse } else { self.missing_run };
        let name = name.to_owned();
        #[cfg(feature = "http")]
        let in_session = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<crate::http::SessionUse>().cloned());
        // The call runs in its own task: if the client gives up on the request (or cancels it),
        // the effect still finishes and its outcome is stored, so the client's repeat is answered
        // from it; a joiner that goes away leaves the run it joined alone. The tracker tells
        // `calls_finished` when it is done.
        let mut task = self.calls.spawn(async move {
            // Over HTTP, its session stays open until the call has run.
            #[cfg(feature = "http")]
            let _in_session = in_session;
            let value = arguments.map(Value::Object);
            let args = match (&text, &value) {
                (Some(text), _) => Arguments::Text(&text.0),
                (None, Some(value)) => Arguments::Json(value),
                (None, None) => Arguments::Absent,
            };
            let call = McpCall::new(&name, args, Some(&meta));
            tools.dispatch_mcp(&session, call, missing_run).await
        });
        // rmcp cancels `context.ct` on `notifications/cancelled` (and when the session ends) and
        // drops whatever this handler answers afterwards; the handler has to stop by itself, or a
        // waiting request goes on sending progress for a request the client has forgotten.
        let cancelled = context.ct.clone();
        let joined = match waits {
            None => tokio::select! {
                done = &mut task => done,
                () = cancelled.cancelled() => return Err(stopped(&stop)),
            },
            Some((token, mut rx)) => {
                // One clock: a notification when the call starts waiting, then one per interval
                // from then on. The hook fires again each time the waiter goes back to waiting
                // (a store that is polled, a leader that was cancelled): that is the same wait,
                // not another tick. Once the call owns the key (the other owner's lease ended, or
                // it let go) it runs the tool itself: one last notification says so, and the
                // "waiting" ones stop.
                let mut sent = 0u64;
                // Made when the wait starts, not before: on a runtime built without timers the
                // call is refused (a configuration error) and never waits, and making the clock
                // first would be Tokio's panic instead of that answer.
                let mut tick: Option<tokio::time::Interval> = None;
                let mut state = Waiting::No;
                loop {
                    tokio::select! {
                        done = &mut task => break done,
                        () = cancelled.cancelled() => return Err(stopped(&stop)),
                        changed = rx.changed(), if state != Waiting::Owner => {
                            if changed.is_err() {
                                // The hook is gone with the call: only the result is left.
                                break (&mut task).await;
                            }
                            let now = *rx.borrow_and_update();
                            let was = std::mem::replace(&mut state, now);
                            match (was, now) {
                                // The same wait again: not another notification.
                                (Waiting::Yes, Waiting::Yes) => continue,
                                // The wait starts: one now, the next an interval later.
                                (_, Waiting::Yes) => tick = Some(progress_clock()),
                                // Owner before any "waiting" went out (the watch keeps only the
                                // latest news): nothing to take back.
                                (Waiting::No, _) => continue,
                                // Owner after waiting: the last notification.
                                _ => {}
                            }
                        }
                        // In `Yes` a notification has gone out already (the arm above sent it).
                        () = next_tick(&mut tick), if state == Waiting::Yes => {}
                    }
                    sent += 1;
                    let message = match state {
                        Waiting::Owner => {
                            "the other call with the same idempotency key let go of it (its lease \
                             ended or it released the key); this call now runs the tool"
                        }
                        _ => {
                            "waiting for another call with the same idempotency key to finish; \
                             its result will be this call's"
                        }
                    };
                    // MCP 2025-11-25 "Progress": the value increases with each notification.
                    #[allow(clippy::cast_precision_loss)]
                    let param = ProgressNotificationParam::new(token.clone(), sent as f64)
                        .with_message(message);
                    if let Err(e) = context.peer.notify_progress(param).await {
                        tracing::debug!(error = %e, "cannot send a progress notification");
                    }
                }
            }
        };
        let result = joined
            .map_err(|e| {
                ErrorData::internal_error(format!("the tool call task failed: {e}"), None)
            })?
            .map_err(|e| ErrorData::invalid_params(e.message, None))?;
        Ok(to_call_tool_result(&result)?.into())
    }
}

/// The clock of a waiting call's progress: its first tick one interval from now (the wait's
/// first notification goes out when the wait starts). A late tick (a slow client) delays the
/// ones after it instead of a burst.
fn progress_clock() -> tokio::time::Interval {
    let first = tokio::time::Instant::now() + PROGRESS_INTERVAL;
    let mut tick = tokio::time::interval_at(first, PROGRESS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// The next tick of `tick`; never, while there is no clock.
async fn next_tick(tick: &mut Option<tokio::time::Interval>) {
    match tick {
        Some(tick) => {
            tick.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Where a call with a progress token stands, as its wait hook tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    /// Not waiting (yet).
    No,
    /// Waiting for another owner of the key.
    Yes,
    /// It waited, then became the owner: it runs the tool.
    Owner,
}

/// The answer of a request the client cancelled: rmcp drops it (MCP: a cancelled request gets no
/// response). The call is told to start nothing more (`stop`): an attempt in progress finishes in
/// the call's task and its outcome is stored for a repeat; no further attempt starts.
fn stopped(stop: &StopSignal) -> ErrorData {
    stop.stop();
    ErrorData::internal_error(
        "the request was cancelled; an attempt in progress finishes and a repeat gets its \
         outcome, and no further attempt starts",
        None,
    )
}

/// The arguments' text as the client sent it: put in the request by
/// [`crate::stdio::LineTransport`], or over HTTP in the request head by [`crate::http::Checked`].
/// `None` behind another transport: the arguments are then the value rmcp parsed, where an integer
/// beyond 64 bits has become a double (a typed integer parameter refuses it as `invalid_arguments`).
fn arguments_text(context: &RequestContext<RoleServer>) -> Option<ArgumentsText> {
    if let Some(text) = context.extensions.get::<ArgumentsText>() {
        return Some(text.clone());
    }
    #[cfg(feature = "http")]
    if let Some(parts) = context.extensions.get::<http::request::Parts>() {
        return parts.extensions.get::<ArgumentsText>().cloned();
    }
    None
}

/// Tools of the server's own router have the names of idem tools ([`IdemTools::mount`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameCollision {
    /// The names in both, sorted.
    pub names: Vec<String>,
}

impl std::fmt::Display for NameCollision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.names.iter().map(|n| format!("`{n}`")).collect();
        write!(
            f,
            "{} {} the name of both a tool of the server's own and an idem tool: rename one \
             (`#[tool(name = \"..\")]` for the idem tool). Merged anyway, the router would keep \
             one of each, and a call meant for the idem tool could run the other, without \
             idempotency",
            names.join(", "),
            if names.len() == 1 { "is" } else { "are" }
        )
    }
}

impl std::error::Error for NameCollision {}

/// Whether the request came over HTTP without a session: a stateless server, or MCP 2026-07-28's
/// sessionless requests. Its session run is then this request alone, so a `keyed` or `never`
/// call that names no run would run again on every retry: it is refused whatever
/// [`IdemTools::with_missing_run`] says. Behind [`crate::http::Checked`] rmcp's routing decides
/// (a session header rmcp ignores does not make a session); behind rmcp's service alone, the
/// session header.
fn sessionless(context: &RequestContext<RoleServer>) -> bool {
    #[cfg(feature = "http")]
    if let Some(parts) = context.extensions.get::<http::request::Parts>() {
        return match parts.extensions.get::<crate::http::InSession>() {
            Some(routed) => !routed.0,
            None => !parts.headers.contains_key("mcp-session-id"),
        };
    }
    let _ = context;
    false
}

/// Whether the arguments' `text` reads as `arguments`. Text that does not read as JSON (nesting
/// past serde_json's limit) is the client's own: its refusal says what is wrong with it.
fn is_the_call(text: &str, arguments: Option<&JsonObject>) -> bool {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(parsed)) => arguments == Some(&parsed),
        Ok(_) => arguments.is_none(),
        Err(_) => true,
    }
}

/// The rmcp `Tool` for a definition (from [`ToolDefinition::to_mcp`]).
///
/// Errors: the definition does not fit rmcp's `Tool` (a schema that is not an object).
pub fn to_mcp_tool(def: &ToolDefinition) -> Result<rmcp::model::Tool, serde_json::Error> {
    serde_json::from_value(def.to_mcp())
}

/// The rmcp `CallToolResult` for a dispatch result (from [`ToolResult::to_mcp`]: one text block,
/// `isError`, `structuredContent` for object outputs, `_meta` with the run, key and outcome).
///
/// Errors: JSON-RPC internal error when rmcp cannot read it (never for idem's own results).
pub fn to_call_tool_result(result: &ToolResult) -> Result<CallToolResult, ErrorData> {
    serde_json::from_value(result.to_mcp())
        .map_err(|e| ErrorData::internal_error(format!("not an MCP tool result: {e}"), None))
}

#[cfg(test)]
mod tests {
    use idem_core::{Idem, ToolSet};
    use serde_json::json;

    use super::*;

    /// The client's text is the call only while it reads as the arguments the handler was given:
    /// a wrapping server's rewritten arguments win.
    #[test]
    fn the_text_is_the_call_only_while_it_is_the_arguments() {
        let args = |v: Value| v.as_object().cloned();
        let sent = r#"{"name": "model-chosen", "n": 1}"#;
        assert!(is_the_call(sent, args(json!({"n": 1, "name": "model-chosen"})).as_ref()));
        assert!(!is_the_call(sent, args(json!({"n": 1, "name": "forced"})).as_ref()));
        assert!(!is_the_call(sent, None));
        // Members repeated: the text stays the call, so the repeat is refused from it.
        assert!(is_the_call(r#"{"n": 1, "n": 2}"#, args(json!({"n": 2})).as_ref()));
        assert!(is_the_call("null", None));
        assert!(!is_the_call("null", args(json!({"n": 1})).as_ref()));
    }

    /// A tool of the server's own router with an idem tool's name is refused when mounting;
    /// rmcp's `+` would keep one of the two without a word.
    #[test]
    fn mounting_refuses_a_name_in_both() {
        use rmcp::handler::server::router::tool::ToolRoute;
        #[idem_core::tool(retry = "keyed")]
        async fn bump(n: u32) -> Result<u32, idem_core::ToolFailure> {
            Ok(n)
        }
        #[idem_core::tool(retry = "safe")]
        async fn peek(n: u32) -> Result<u32, idem_core::ToolFailure> {
            Ok(n)
        }
        let tools = IdemTools::new(
            ToolSet::new().with(BumpTool).unwrap().with(PeekTool).unwrap(),
            &Idem::in_memory(),
        );
        let own = |name: &'static str| {
            let tool = rmcp::model::Tool::new(name, "the server's own", Arc::new(Map::new()));
            ToolRoute::<()>::new_dyn(tool, |_| {
                Box::pin(async { Ok(CallToolResult::success(vec![]).into()) }) as BoxFuture<'_, _>
            })
        };
        let mut colliding = ToolRouter::<()>::new();
        colliding.add_route(own("bump"));
        colliding.add_route(own("echo"));
        let refused = tools.mount(colliding).unwrap_err();
        assert_eq!(refused.names, ["bump"]);
        assert!(refused.to_string().contains("`bump` is the name of both"), "{refused}");
        // Also when the server's own tool of that name is disabled.
        let mut disabled = ToolRouter::<()>::new();
        disabled.add_route(own("peek"));
        disabled.disable_route("peek");
        assert_eq!(tools.mount(disabled).unwrap_err().names, ["peek"]);

        let mut distinct = ToolRouter::<()>::new();
        distinct.add_route(own("echo"));
        let mounted = tools.mount(distinct).unwrap();
        let mut names: Vec<String> =
            mounted.list_all().into_iter().map(|t| t.name.into_owned()).collect();
        names.sort();
        assert_eq!(names, ["bump", "echo", "peek"]);
    }

    /// A principal function answering an empty or blank string answers no principal: as a
    /// tenant, `""` is the scope every caller without one shares.
    #[cfg(feature = "http")]
    #[test]
    fn an_empty_principal_is_none() {
        let tools = IdemTools::new(ToolSet::new(), &Idem::in_memory()).with_principal(|parts| {
            parts.headers.get("x-user").and_then(|v| v.to_str().ok()).map(str::to_owned)
        });
        let principal = tools.principal_fn().unwrap();
        let parts = |user: &str| {
            http::Request::get("/").header("x-user", user).body(()).unwrap().into_parts().0
        };
        assert_eq!(principal(&parts("")), None);
        assert_eq!(principal(&parts("  ")), None);
        assert_eq!(principal(&parts("alice")), Some("alice".to_owned()));
    }
}

//! Closing idle MCP sessions without closing one whose call is still running.
//!
//! rmcp closes a session after `keep_alive` without a message from its client, and counts a
//! running tool call as silence: a charge that took longer than `keep_alive` lost its session
//! (and its client the response) while it ran. So [`Checked`](super::Checked) turns rmcp's timer
//! off and keeps its own: a session is idle while no request names it and no response carrying a
//! call's result is open (a POST's, or a `GET` resuming one; a standalone `GET` stream is not a
//! call, as for rmcp), and it is closed once idle for `keep_alive`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

/// The sessions this instance serves, with when each was last used and its open call responses.
#[derive(Clone, Debug, Default)]
pub(super) struct Idle(Arc<Sessions>);

#[derive(Debug, Default)]
struct Sessions {
    /// `None`: sessions are never closed for idleness (rmcp's `keep_alive: None`).
    keep_alive: Option<Duration>,
    lives: Mutex<HashMap<String, Life>>,
    /// Whether the task that closes idle sessions was started (at the first session, inside the
    /// runtime that serves it).
    closing: AtomicBool,
}

#[derive(Debug)]
struct Life {
    /// The last request that named the session, or the last of its call responses to end.
    seen: Instant,
    /// Its call responses still open.
    open: usize,
}

/// A call response of a session, counted as use of it until dropped (sent in full, or its client
/// went away).
pub(super) struct InUse {
    idle: Weak<Sessions>,
    session: String,
}

impl Drop for InUse {
    fn drop(&mut self) {
        if let Some(sessions) = self.idle.upgrade()
            && let Some(life) = sessions.lock().get_mut(&self.session)
        {
            life.open = life.open.saturating_sub(1);
            life.seen = Instant::now();
        }
    }
}

impl Idle {
    pub(super) fn new(keep_alive: Option<Duration>) -> Self {
        Idle(Arc::new(Sessions { keep_alive, ..Sessions::default() }))
    }

    /// A request named `session`, or its answer opened it.
    pub(super) fn used(&self, session: &str) {
        let now = Instant::now();
        self.0.lock().entry(session.to_owned()).or_insert(Life { seen: now, open: 0 }).seen = now;
    }

    /// A call response of `session` starts: the session is in use until the guard is dropped.
    pub(super) fn call_response(&self, session: &str) -> InUse {
        let now = Instant::now();
        let mut lives = self.0.lock();
        let life = lives.entry(session.to_owned()).or_insert(Life { seen: now, open: 0 });
        life.seen = now;
        life.open += 1;
        InUse { idle: Arc::downgrade(&self.0), session: session.to_owned() }
    }

    /// Whether `session` has a call response open (it is not idle, whenever it was last named).
    pub(super) fn in_use(&self, session: &str) -> bool {
        self.0.lock().get(session).is_some_and(|life| life.open > 0)
    }

    /// The client closed `session` (`DELETE`).
    pub(super) fn closed(&self, session: &str) {
        self.0.lock().remove(session);
    }

    /// Starts, once, the task that closes sessions idle for `keep_alive` on `manager`, calling
    /// `forget` with each so that what is kept beside rmcp goes too. It ends when the service is
    /// dropped or `ended` (rmcp's `cancellation_token`, which ends every session) is cancelled.
    pub(super) fn start_closing(
        &self,
        manager: &Arc<LocalSessionManager>,
        ended: &tokio_util::sync::CancellationToken,
        forget: impl Fn(&str) + Send + 'static,
    ) {
        let Some(keep_alive) = self.0.keep_alive else { return };
        // Outside a runtime (a service called by hand), tried again at the next request.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.0.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        // A session is closed between `keep_alive` and a quarter of it later.
        let tick = (keep_alive / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
        let (sessions, manager, ended) =
            (Arc::downgrade(&self.0), Arc::clone(manager), ended.clone());
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    () = ended.cancelled() => return,
                    () = tokio::time::sleep(tick) => {}
                }
                let Some(sessions) = sessions.upgrade() else { return };
                let idle: Vec<String> = {
                    let mut lives = sessions.lock();
                    let idle = lives
                        .iter()
                        .filter(|(_, life)| life.open == 0 && life.seen.elapsed() >= keep_alive)
                        .map(|(id, _)| id.clone())
                        .collect();
                    for id in &idle {
                        lives.remove(id);
                    }
                    idle
                };
                drop(sessions);
                for id in idle {
                    // A session rmcp already ended (its client's transport failed) is not there:
                    // nothing to close.
                    if let Err(e) = manager.close_session(&id.as_str().into()).await {
                        tracing::debug!(error = %e, "closing an idle MCP session");
                    }
                    forget(&id);
                }
            }
        });
    }
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Life>> {
        self.lives.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

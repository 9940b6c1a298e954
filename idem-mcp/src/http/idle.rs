//! Closing idle MCP sessions without closing one whose call is still being answered.
//!
//! rmcp closes a session after `keep_alive` without a message from its client, and counts a
//! running tool call as silence: a charge that took longer than `keep_alive` lost its session
//! (and its client the response) while it ran. So [`Checked`](super::Checked) turns rmcp's timer
//! off and keeps its own: a session is idle while no request names it, no response carrying a
//! call's result is open (a POST's, or a `GET` resuming one; a standalone `GET` stream is not a
//! call, as for rmcp) and no idem tool's call in it is still running (its client may have dropped
//! the stream, and resume it), and it is closed once idle for `keep_alive`.
//!
//! A request counts from before it reaches rmcp ([`Idle::begin`]) and a session is chosen for
//! closing under the same lock: one that a request has begun in is not closed, and a request
//! that names a session being closed is answered 404 without reaching rmcp. Either the request
//! is served in full or it is told the session is gone; never a stream cut by the close.
//!
//! The same table bounds how many sessions are open ([`SessionLimits`]): per principal, where
//! one at its bound closes its own least recently used idle session to open another, and in all.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

/// The sessions this instance serves, with when each was last used and its requests still being
/// answered.
#[derive(Clone, Debug, Default)]
pub(super) struct Idle(Arc<Sessions>);

#[derive(Debug, Default)]
struct Sessions {
    /// `None`: sessions are never closed for idleness (rmcp's `keep_alive: None`).
    keep_alive: Option<Duration>,
    lives: Mutex<Table>,
    /// Whether the task that closes idle sessions was started (at the first request, inside the
    /// runtime that serves it).
    closing: AtomicBool,
}

/// The sessions, and how many each principal has open or is opening (for [`SessionLimits`]).
#[derive(Debug, Default)]
struct Table {
    lives: HashMap<String, Life>,
    /// Per principal: its sessions open here (known, and opened by an `initialize` here), so
    /// that one at its bound is looked for among its own, not among every session.
    open_by: HashMap<String, HashSet<String>>,
    /// Sessions open here, whoever opened them.
    open: usize,
    /// `initialize` requests admitted and not yet answered: per principal, and in all.
    opening_by: HashMap<String, usize>,
    opening: usize,
}

impl Table {
    /// The idle session (open here, no request in it, not being closed) used least recently,
    /// of `principal` or of anyone.
    fn least_recently_used(&self, principal: Option<&str>) -> Option<String> {
        let idle = |life: &Life| life.known && !life.closing && life.open == 0;
        let oldest = match principal {
            Some(principal) => self
                .open_by
                .get(principal)?
                .iter()
                .filter_map(|id| self.lives.get(id).map(|life| (id, life)))
                .filter(|(_, life)| idle(life))
                .min_by_key(|(_, life)| life.seen),
            None => {
                self.lives.iter().filter(|(_, life)| idle(life)).min_by_key(|(_, life)| life.seen)
            }
        };
        oldest.map(|(id, _)| id.clone())
    }

    /// Forgets `session`, and that it counted against its principal.
    fn remove(&mut self, session: &str) -> Option<Life> {
        let life = self.lives.remove(session)?;
        if life.known {
            self.open = self.open.saturating_sub(1);
            if let Some(principal) = &life.principal
                && let Some(sessions) = self.open_by.get_mut(principal)
            {
                sessions.remove(session);
                if sessions.is_empty() {
                    self.open_by.remove(principal);
                }
            }
        }
        Some(life)
    }
}

fn decrement(counts: &mut HashMap<String, usize>, principal: &str) {
    if let Some(n) = counts.get_mut(principal) {
        *n -= 1;
        if *n == 0 {
            counts.remove(principal);
        }
    }
}

/// How many MCP sessions may be open at once, per principal and in all (`None`: no bound).
/// Each open session costs memory (rmcp's per-session task and buffers, tens of KiB) until it is
/// closed, by its client (`DELETE`, which most clients never send) or when idle for
/// `keep_alive`; without a bound, a client that opens a session per request, or one in a loop,
/// makes the server keep them all for `keep_alive`.
///
/// A principal at its bound that opens another closes its own least recently used idle session
/// (no request in it, no call running): a client that leaks sessions loses only its own old ones,
/// and a request naming that one gets 404, on which MCP clients open a new session. At `total`,
/// the least recently used idle session of anyone makes room. Only when every candidate is in
/// use is an `initialize` refused, with 503 and `Retry-After`. Requests without a principal
/// count toward `total` only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Sessions one principal may have open (default 100).
    pub per_principal: Option<usize>,
    /// Sessions open in all (default 10,000, as the official Python SDK's server).
    pub total: Option<usize>,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits { per_principal: Some(100), total: Some(10_000) }
    }
}

/// An `initialize` admitted under [`SessionLimits`]: counted as opening until dropped (after its
/// answer, by then counted as open if it opened a session).
pub(super) struct Opening {
    idle: Weak<Sessions>,
    principal: Option<String>,
}

impl Drop for Opening {
    fn drop(&mut self) {
        let Some(sessions) = self.idle.upgrade() else { return };
        let mut table = sessions.lock();
        table.opening = table.opening.saturating_sub(1);
        if let Some(principal) = &self.principal {
            decrement(&mut table.opening_by, principal);
        }
    }
}

/// Why an `initialize` may not open a session now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Full {
    /// The principal's sessions are all in use.
    Principal,
    /// The server has `total` open.
    Total,
}

#[derive(Debug)]
struct Life {
    /// The last request that named the session began or ended then.
    seen: Instant,
    /// Its requests begun and not yet answered in full (a call's response: until its end).
    open: usize,
    /// rmcp served a request in it, or opened it: the session exists. An entry made by requests
    /// naming an id rmcp does not know goes with the last of them.
    known: bool,
    /// Chosen for closing: requests naming it are refused until it is gone.
    closing: bool,
    /// Who opened it here (`None`: no principal, or opened elsewhere).
    principal: Option<String>,
}

/// The session a request named is being closed for idleness: answer as for a closed session.
#[derive(Debug)]
pub(super) struct Closing;

/// A request of a session, counted as use of it until dropped: at once for most requests, when
/// the response has been sent in full (or its client went away) for a call's.
pub(super) struct InUse {
    idle: Weak<Sessions>,
    session: String,
}

impl InUse {
    /// rmcp served the request: the session exists (one opened elsewhere and restored here
    /// counts toward the total from now on).
    pub(super) fn served(&self) {
        let Some(sessions) = self.idle.upgrade() else { return };
        let mut table = sessions.lock();
        if let Some(life) = table.lives.get_mut(&self.session)
            && !life.known
        {
            life.known = true;
            table.open += 1;
        }
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let Some(sessions) = self.idle.upgrade() else { return };
        let mut table = sessions.lock();
        if let Some(life) = table.lives.get_mut(&self.session) {
            life.open = life.open.saturating_sub(1);
            life.seen = Instant::now();
            if life.open == 0 && !life.known {
                table.remove(&self.session);
            }
        }
    }
}

impl Idle {
    pub(super) fn new(keep_alive: Option<Duration>) -> Self {
        Idle(Arc::new(Sessions { keep_alive, ..Sessions::default() }))
    }

    /// A request naming `session` is about to reach rmcp: the session is not closed until the
    /// guard is dropped. Refused when the session is being closed.
    pub(super) fn begin(&self, session: &str) -> Result<InUse, Closing> {
        let now = Instant::now();
        let mut table = self.0.lock();
        let life = table.lives.entry(session.to_owned()).or_insert(Life {
            seen: now,
            open: 0,
            known: false,
            closing: false,
            principal: None,
        });
        if life.closing {
            return Err(Closing);
        }
        life.seen = now;
        life.open += 1;
        Ok(InUse { idle: Arc::downgrade(&self.0), session: session.to_owned() })
    }

    /// rmcp opened `session` (an `initialize` answer) for `principal`.
    pub(super) fn opened(&self, session: &str, principal: Option<&str>) {
        let life = Life {
            seen: Instant::now(),
            open: 0,
            known: true,
            closing: false,
            principal: principal.map(str::to_owned),
        };
        let mut table = self.0.lock();
        table.remove(session);
        table.open += 1;
        if let Some(principal) = principal {
            table.open_by.entry(principal.to_owned()).or_default().insert(session.to_owned());
        }
        table.lives.insert(session.to_owned(), life);
    }

    /// Admits an `initialize` of `principal` under `limits`: counted as opening until the
    /// returned guard is dropped. At a bound, the least recently used idle session (the
    /// principal's own at its bound, anyone's at the total) is chosen for closing (requests
    /// naming it are refused from now on) and returned: the caller closes it once the new
    /// session is open, or [spares](Self::spared) it.
    pub(super) fn admit(
        &self,
        principal: Option<&str>,
        limits: SessionLimits,
    ) -> Result<(Opening, Option<String>), Full> {
        let mut table = self.0.lock();
        let mut evicted = None;
        if let (Some(principal), Some(bound)) = (principal, limits.per_principal) {
            let has = table.open_by.get(principal).map_or(0, HashSet::len)
                + table.opening_by.get(principal).copied().unwrap_or(0);
            if has >= bound {
                let oldest = table.least_recently_used(Some(principal)).ok_or(Full::Principal)?;
                evicted = Some(oldest);
            }
        }
        // One being closed frees its place; at the total, the least recently used idle session
        // of any principal makes room: refusing instead would shut every client out for as long
        // as idle sessions stay (for ever with `keep_alive: None`).
        if let Some(total) = limits.total
            && evicted.is_none()
            && table.open + table.opening >= total
        {
            evicted = Some(table.least_recently_used(None).ok_or(Full::Total)?);
        }
        if let Some(id) = &evicted
            && let Some(life) = table.lives.get_mut(id)
        {
            life.closing = true;
        }
        table.opening += 1;
        if let Some(principal) = principal {
            *table.opening_by.entry(principal.to_owned()).or_default() += 1;
        }
        let opening =
            Opening { idle: Arc::downgrade(&self.0), principal: principal.map(str::to_owned) };
        Ok((opening, evicted))
    }

    /// A request named `session` and was answered without reaching rmcp (after rmcp accepted
    /// its head): a use of the session, if it is one this instance serves.
    pub(super) fn named(&self, session: &str) {
        if let Some(life) = self.0.lock().lives.get_mut(session)
            && life.known
            && !life.closing
        {
            life.seen = Instant::now();
        }
    }

    /// Whether `session` is open here: what is kept about it beside rmcp (its owner) must stay.
    pub(super) fn knows(&self, session: &str) -> bool {
        self.0.lock().lives.get(session).is_some_and(|life| life.known)
    }

    /// `session`, chosen to make room for a session that was not opened after all, stays.
    pub(super) fn spared(&self, session: &str) {
        if let Some(life) = self.0.lock().lives.get_mut(session) {
            life.closing = false;
        }
    }

    /// The client closed `session` (`DELETE`), or it was closed here.
    pub(super) fn closed(&self, session: &str) {
        self.0.lock().remove(session);
    }

    /// Starts, once, the task that closes sessions idle for `keep_alive` on `manager`, calling
    /// the function `forget` makes with each so that what is kept beside rmcp goes too. It ends
    /// when the service is dropped or `ended` (rmcp's `cancellation_token`, which ends every
    /// session) is cancelled. Called at every request: once started, it costs one atomic load.
    pub(super) fn start_closing<F: Fn(&str) + Send + 'static>(
        &self,
        manager: &Arc<LocalSessionManager>,
        ended: &tokio_util::sync::CancellationToken,
        forget: impl FnOnce() -> F,
    ) {
        if self.0.closing.load(Ordering::Acquire) {
            return;
        }
        let Some(keep_alive) = self.0.keep_alive else { return };
        // Outside a runtime (a service called by hand), tried again at the next request.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.0.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        let forget = forget();
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
                let idle: Vec<String> = sessions
                    .lock()
                    .lives
                    .iter_mut()
                    .filter(|(_, life)| {
                        !life.closing && life.open == 0 && life.seen.elapsed() >= keep_alive
                    })
                    .map(|(id, life)| {
                        life.closing = true;
                        id.clone()
                    })
                    .collect();
                for id in idle {
                    // A session rmcp already ended (its client's transport failed) is not there:
                    // nothing to close.
                    if let Err(e) = manager.close_session(&id.as_str().into()).await {
                        tracing::debug!(error = %e, "closing an idle MCP session");
                    }
                    forget(&id);
                    sessions.lock().remove(&id);
                }
            }
        });
    }
}

impl Sessions {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.lives.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session is not closed while a request is in it, however long it takes; once idle for
    /// `keep_alive` it is, and a request that names it while it is being closed is refused
    /// (answered as for a closed session) instead of being served into a session closed under it.
    #[tokio::test]
    async fn a_session_in_use_stays_and_one_being_closed_lets_no_request_in() {
        let idle = Idle::new(Some(Duration::from_millis(40)));
        idle.opened("s", None);
        let request = idle.begin("s").unwrap();
        request.served();
        let (forgot, forgotten) = std::sync::mpsc::channel();
        let probe = idle.clone();
        let manager = Arc::new(LocalSessionManager::default());
        let ended = tokio_util::sync::CancellationToken::new();
        idle.start_closing(&manager, &ended, || {
            move |id: &str| {
                let let_in = probe.begin(id).is_ok();
                forgot.send((id.to_owned(), let_in)).unwrap();
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(forgotten.try_recv().is_err(), "closed while a request was in it");
        assert!(idle.knows("s"));
        drop(request);
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Ok(closed) = forgotten.try_recv() {
                    break closed;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the idle session is closed");
        assert_eq!(closed, ("s".to_owned(), false), "a request was let into a closing session");
        tokio::time::timeout(Duration::from_secs(30), async {
            while idle.knows("s") {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a closed session is forgotten");
        ended.cancel();
    }

    /// `initialize` requests not yet answered count against the bounds, so that concurrent ones
    /// cannot pass them together; one that opened nothing gives its place back.
    #[test]
    fn sessions_being_opened_count_against_the_bounds() {
        let idle = Idle::new(Some(Duration::from_secs(300)));
        let limits = SessionLimits { per_principal: Some(1), total: Some(2) };
        let (first, evicted) = idle.admit(Some("alice"), limits).unwrap();
        assert_eq!(evicted, None);
        assert_eq!(idle.admit(Some("alice"), limits).err(), Some(Full::Principal));
        let (bobs, _) = idle.admit(Some("bob"), limits).unwrap();
        assert_eq!(idle.admit(None, limits).err(), Some(Full::Total));
        // Bob's opened nothing (an error answer): its place is free again.
        drop(bobs);
        let (carols, _) = idle.admit(Some("carol"), limits).unwrap();
        idle.opened("a1", Some("alice"));
        drop(first);
        drop(carols);
        // Alice's session, idle: her next one closes it.
        let (_, evicted) = idle.admit(Some("alice"), limits).unwrap();
        assert_eq!(evicted.as_deref(), Some("a1"));
        assert!(idle.begin("a1").is_err(), "being closed: no request let in");
        idle.closed("a1");
        let table = idle.0.lock();
        assert_eq!((table.open, table.open_by.len()), (0, 0));
    }

    /// Requests naming an id rmcp does not know leave nothing behind: ids a client makes up
    /// take no memory.
    #[test]
    fn a_made_up_session_is_not_kept() {
        let idle = Idle::new(Some(Duration::from_secs(300)));
        let (one, two) = (idle.begin("made-up").unwrap(), idle.begin("made-up").unwrap());
        drop(one);
        assert_eq!(idle.0.lock().lives.len(), 1, "kept while a request names it");
        drop(two);
        assert!(idle.0.lock().lives.is_empty());
        // One that rmcp served is kept, and counted as open until it goes.
        idle.begin("real").unwrap().served();
        assert!(idle.knows("real"));
        assert_eq!(idle.0.lock().open, 1);
        idle.closed("real");
        assert_eq!(idle.0.lock().open, 0);
    }
}

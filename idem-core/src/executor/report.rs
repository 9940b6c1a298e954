//! What a call reports beside its result (its key and how it was served), and the hook a caller
//! sets to hear when a call waits on another owner of its key.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::key::{Key, Scope};

/// How a call was served (the span field `idem.outcome` carries the same words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Served {
    /// `executed`: this call ran the tool (or is the one whose run every duplicate shares).
    Executed,
    /// `replayed`: a stored outcome was returned; nothing ran.
    Replayed,
    /// `joined`: the call waited for another call of the same key (in this process or
    /// another) and returned that call's outcome; nothing ran twice.
    Joined,
    /// `unknown`: an earlier attempt may have taken effect and its outcome is not known.
    Unknown,
    /// `taken_over`: this call ran the tool after a previous owner's lease ended without a
    /// result (that owner's attempt may have had an effect; a keyed tool repeats it with the
    /// same key).
    TakenOver,
    /// `reconciled`: an attempt's outcome was unknown (this call's, or a dead owner's), and the
    /// tool's reconciliation check found that it happened; its output was stored and returned.
    Reconciled,
}

impl Served {
    /// `executed`, `replayed`, `joined`, `unknown`, `taken_over` or `reconciled`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Served::Executed => "executed",
            Served::Replayed => "replayed",
            Served::Joined => "joined",
            Served::Unknown => "unknown",
            Served::TakenOver => "taken_over",
            Served::Reconciled => "reconciled",
        }
    }

    fn from_u8(n: u8) -> Option<Served> {
        match n {
            1 => Some(Served::Executed),
            2 => Some(Served::Replayed),
            3 => Some(Served::Joined),
            4 => Some(Served::Unknown),
            5 => Some(Served::TakenOver),
            6 => Some(Served::Reconciled),
            _ => None,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            Served::Executed => 1,
            Served::Replayed => 2,
            Served::Joined => 3,
            Served::Unknown => 4,
            Served::TakenOver => 5,
            Served::Reconciled => 6,
        }
    }
}

impl fmt::Display for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one call reports beside its result ([`crate::Run::call_reported`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallReport {
    /// The scope the key was derived in (tenant and run).
    pub scope: Arc<Scope>,
    /// The idempotency key of the call.
    pub key: Key,
    /// How it was served; `None` when it failed before that was decided (store unavailable,
    /// budget exhausted while waiting, a caller key reused with other arguments).
    pub served: Option<Served>,
    /// The `Ok` output is this call's own and the executor found that its JSON reads back as
    /// itself (it stored it): a caller that turns it into JSON need not check again.
    pub(crate) output_checked: bool,
}

/// Called each time a call starts to wait for another owner of its key: a duplicate in flight
/// in this process, or a claim held by another process (until its outcome is stored or its
/// lease runs out). Set with [`crate::Run::with_wait_hook`]; it must return quickly.
///
/// A wait ends in one of two ways: the call gets the other owner's outcome (it returns), or it
/// becomes the owner itself and runs the tool (the other owner's lease ended, it released the
/// key, or the in-process leader was cancelled). [`WaitHook::on_owner`] hears the second, so
/// that signs of life sent while waiting ("waiting for another call") stop once the call runs.
#[derive(Clone)]
pub struct WaitHook {
    waiting: KeyFn,
    owner: Option<KeyFn>,
}

type KeyFn = Arc<dyn Fn(&Key) + Send + Sync>;

impl WaitHook {
    /// A hook that calls `f` with the key being waited on.
    pub fn new(f: impl Fn(&Key) + Send + Sync + 'static) -> Self {
        WaitHook { waiting: Arc::new(f), owner: None }
    }

    /// The same hook, also calling `f` when a call that waited owns the key and starts running
    /// its tool (executed or taken over; [`Served`] says which once the call returns). Not
    /// called for a call that never waited.
    pub fn on_owner(self, f: impl Fn(&Key) + Send + Sync + 'static) -> Self {
        WaitHook { owner: Some(Arc::new(f)), ..self }
    }

    pub(super) fn waiting(&self, key: &Key) {
        hear(&self.waiting, key);
    }

    pub(super) fn owner(&self, key: &Key) {
        if let Some(f) = &self.owner {
            hear(f, key);
        }
    }
}

/// Calls a hook (the caller's code): its panic is logged, not unwound through the call, which
/// may hold the key's claim at that point (it would stay claimed until its lease ends, and a
/// `never` tool's later callers would read "outcome unknown" for a call that ran nothing).
fn hear(f: &KeyFn, key: &Key) {
    if let Err(message) = super::caught::caught(|| f(key)) {
        tracing::error!(panic = %message, "the wait hook panicked; the call goes on");
    }
}

impl fmt::Debug for WaitHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WaitHook")
    }
}

/// Where a call records how it was served, and whether its own output was found storable.
#[derive(Debug, Default)]
pub(super) struct ServedSlot(AtomicU8);

/// The bit of [`ServedSlot`] that says the output was checked; the others are [`Served`].
const CHECKED: u8 = 0x80;

impl ServedSlot {
    #[inline]
    pub(super) fn set(&self, served: Served) {
        let checked = self.0.load(Ordering::Relaxed) & CHECKED;
        self.0.store(served.to_u8() | checked, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn get(&self) -> Option<Served> {
        Served::from_u8(self.0.load(Ordering::Relaxed) & !CHECKED)
    }

    /// The output this call returns is its own, and its JSON reads back as itself.
    #[inline]
    pub(super) fn set_output_checked(&self) {
        self.0.fetch_or(CHECKED, Ordering::Relaxed);
    }

    #[inline]
    pub(super) fn output_checked(&self) -> bool {
        self.0.load(Ordering::Relaxed) & CHECKED != 0
    }
}

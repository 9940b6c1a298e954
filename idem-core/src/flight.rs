//! In-process single flight: duplicates of a call that is running in this executor join it and
//! receive its result instead of touching the store.
//!
//! The common case has no duplicate, so a leader only inserts a map entry; the slot that joiners
//! wait on is created by the first joiner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::Notify;

use crate::error::Error;
use crate::key::{Fingerprint, Key};

/// A finished call as joiners receive it: the output's JSON, or the error with the tool's error as
/// JSON. Decoded by each joiner into its own typed value.
pub(crate) type Shared = Arc<Result<String, Error<String>>>;

/// Where joiners wait for the leader's result.
#[derive(Default)]
pub(crate) struct Slot {
    /// `Some` once the leader published; `None` inside when it was cancelled first.
    result: OnceLock<Option<Shared>>,
    notify: Notify,
}

impl Slot {
    /// The leader's result, or `None` when the leader was cancelled (start over).
    pub(crate) async fn wait(&self) -> Option<Shared> {
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Register before looking, so a publish in between is not missed.
            notified.as_mut().enable();
            if let Some(result) = self.result.get() {
                return result.clone();
            }
            notified.await;
        }
    }

    fn set(&self, result: Option<Shared>) {
        let _ = self.result.set(result);
        self.notify.notify_waiters();
    }
}

struct Entry {
    fingerprint: Fingerprint,
    slot: Option<Arc<Slot>>,
    /// Tells this leader's entry from a later one for the same key.
    generation: u64,
}

/// Every call enters and leaves the map, replays included. Keys are SHA-256 digests, spread
/// evenly already: a seeded fast hash is enough (as in the in-memory store).
type Map = HashMap<Key, Entry, foldhash::fast::RandomState>;

#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<(Map, u64)>,
}

pub(crate) enum Enter<'a> {
    /// This caller runs the call and must finish through the guard.
    Lead(Leader<'a>),
    /// Another caller is running it: wait on the slot.
    Join(Arc<Slot>),
    /// The running call has the same key and other arguments.
    Mismatch,
}

impl Flights {
    fn lock(&self) -> MutexGuard<'_, (Map, u64)> {
        crate::sync::lock(&self.map)
    }

    pub(crate) fn enter(&self, key: Key, fingerprint: Fingerprint) -> Enter<'_> {
        let mut guard = self.lock();
        let (map, generations) = &mut *guard;
        if let Some(entry) = map.get_mut(&key) {
            if entry.fingerprint != fingerprint {
                return Enter::Mismatch;
            }
            return Enter::Join(Arc::clone(entry.slot.get_or_insert_with(Default::default)));
        }
        *generations += 1;
        let generation = *generations;
        map.insert(key, Entry { fingerprint, slot: None, generation });
        Enter::Lead(Leader { flights: self, key, generation, finished: false })
    }
}

/// Held by the caller that runs a call. Dropping it without finishing (the caller was
/// cancelled) wakes joiners with nothing, and they start over.
pub(crate) struct Leader<'a> {
    flights: &'a Flights,
    key: Key,
    generation: u64,
    finished: bool,
}

impl Leader<'_> {
    /// Leaves the flight; when someone joined, hands them `share()`'s result.
    pub(crate) fn finish(mut self, share: impl FnOnce() -> Shared) {
        self.finished = true;
        if let Some(slot) = self.take_slot() {
            slot.set(Some(share()));
        }
    }

    fn take_slot(&self) -> Option<Arc<Slot>> {
        let mut guard = self.flights.lock();
        let map = &mut guard.0;
        match map.get(&self.key) {
            Some(e) if e.generation == self.generation => map.remove(&self.key)?.slot,
            _ => None,
        }
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        if !self.finished
            && let Some(slot) = self.take_slot()
        {
            slot.set(None);
        }
    }
}

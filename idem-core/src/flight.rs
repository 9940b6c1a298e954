//! In-process single flight: duplicates of a call that is running in this executor join it and
//! receive its result instead of touching the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::error::Error;
use crate::key::{Fingerprint, Key};

/// A finished call as joiners receive it: the output's JSON, or the error with the tool's error as
/// JSON. Decoded by each joiner into its own typed value.
pub(crate) type Shared = Arc<Result<String, Error<String>>>;

type Slot = watch::Receiver<Option<Shared>>;

#[derive(Default)]
pub(crate) struct Flights {
    map: Mutex<HashMap<Key, (Fingerprint, Slot)>>,
}

pub(crate) enum Enter<'a> {
    /// This caller runs the call and must publish through the guard.
    Lead(Leader<'a>),
    /// Another caller is running it: wait on the slot.
    Join(Slot),
    /// The running call has the same key and other arguments.
    Mismatch,
}

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, (Fingerprint, Slot)>> {
        // Every update is a single insert or remove: a poisoned map is still consistent.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn enter(&self, key: Key, fingerprint: Fingerprint) -> Enter<'_> {
        let mut map = self.lock();
        if let Some((fp, slot)) = map.get(&key) {
            return if *fp == fingerprint { Enter::Join(slot.clone()) } else { Enter::Mismatch };
        }
        let (tx, rx) = watch::channel(None);
        let map_rx = rx.clone();
        map.insert(key, (fingerprint, rx));
        Enter::Lead(Leader { flights: self, key, tx, rx: map_rx })
    }
}

/// Held by the caller that runs a call. Dropping it without publishing (the caller was
/// cancelled) closes the slot, and joiners start over.
pub(crate) struct Leader<'a> {
    flights: &'a Flights,
    key: Key,
    tx: watch::Sender<Option<Shared>>,
    rx: Slot,
}

impl Leader<'_> {
    /// Whether anyone joined; the shared form is built only then.
    pub(crate) fn has_joiners(&self) -> bool {
        // The map and the leader hold one receiver each.
        self.tx.receiver_count() > 2
    }

    pub(crate) fn publish(self, shared: Shared) {
        self.tx.send_replace(Some(shared));
    }
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut map = self.flights.lock();
        if map.get(&self.key).is_some_and(|(_, slot)| self.rx.same_channel(slot)) {
            map.remove(&self.key);
        }
    }
}

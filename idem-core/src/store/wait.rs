//! Waiting for another owner's result, as the stores shared by processes do it: one map of this
//! process's waiters by key, and one loop that re-checks the record with backoff until its holder
//! is gone. Wake-ups (this store's own writes, `LISTEN/NOTIFY`, pub/sub) only cut a pause short;
//! the re-check decides, so a lost wake-up costs at most one pause.

#[cfg(any(feature = "postgres", feature = "redis"))]
use std::borrow::Borrow;
#[cfg(any(feature = "postgres", feature = "redis"))]
use std::collections::HashMap;
#[cfg(any(feature = "postgres", feature = "redis"))]
use std::hash::Hash;
#[cfg(any(feature = "postgres", feature = "redis"))]
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Notify;

use super::StoreError;

/// This process's waiters by key (a record's key, or a pub/sub channel): one [`Notify`] per key,
/// shared by its waiters and removed with the last of them.
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) struct WaiterMap<K> {
    map: Mutex<HashMap<K, Waiting>>,
}

#[cfg(any(feature = "postgres", feature = "redis"))]
struct Waiting {
    waiters: usize,
    notify: Arc<Notify>,
}

#[cfg(any(feature = "postgres", feature = "redis"))]
impl<K> Default for WaiterMap<K> {
    fn default() -> Self {
        WaiterMap { map: Mutex::new(HashMap::new()) }
    }
}

#[cfg(any(feature = "postgres", feature = "redis"))]
impl<K: Hash + Eq> WaiterMap<K> {
    /// Adds a waiter on `key`; give it back with [`unregister`](Self::unregister).
    pub(crate) fn register(&self, key: K) -> Arc<Notify> {
        let mut map = crate::sync::lock(&self.map);
        let entry = map
            .entry(key)
            .or_insert_with(|| Waiting { waiters: 0, notify: Arc::new(Notify::new()) });
        entry.waiters += 1;
        Arc::clone(&entry.notify)
    }

    /// Adds a waiter on `key`, removed when the returned guard is dropped (the wait ended, or
    /// its future was dropped mid-wait).
    #[cfg(feature = "postgres")]
    pub(crate) fn waiting(&self, key: K) -> Registered<'_, K>
    where
        K: Clone,
    {
        let notify = self.register(key.clone());
        Registered { map: self, key, notify }
    }

    /// Removes a waiter on `key`; whether it was the last one.
    pub(crate) fn unregister<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = crate::sync::lock(&self.map);
        match map.get_mut(key) {
            Some(w) if w.waiters > 1 => {
                w.waiters -= 1;
                false
            }
            Some(_) => {
                map.remove(key);
                true
            }
            None => false,
        }
    }

    /// How many keys have waiters registered.
    pub(crate) fn keys(&self) -> usize {
        crate::sync::lock(&self.map).len()
    }

    /// Wakes every waiter on `key`.
    pub(crate) fn wake<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(w) = crate::sync::lock(&self.map).get(key) {
            w.notify.notify_waiters();
        }
    }

    /// Wakes every waiter (wake-ups may have been lost, e.g. while a listener reconnected).
    pub(crate) fn wake_all(&self) {
        for w in crate::sync::lock(&self.map).values() {
            w.notify.notify_waiters();
        }
    }

    /// Whether anyone waits on `key`.
    #[cfg(feature = "redis")]
    pub(crate) fn wanted<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        crate::sync::lock(&self.map).contains_key(key)
    }
}

/// A waiter registered on a key of a [`WaiterMap`] for as long as it lives.
#[cfg(feature = "postgres")]
pub(crate) struct Registered<'a, K: Hash + Eq> {
    map: &'a WaiterMap<K>,
    key: K,
    notify: Arc<Notify>,
}

#[cfg(feature = "postgres")]
impl<K: Hash + Eq> Registered<'_, K> {
    /// What wakes this waiter.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

#[cfg(feature = "postgres")]
impl<K: Hash + Eq> Drop for Registered<'_, K> {
    fn drop(&mut self) {
        self.map.unregister(&self.key);
    }
}

/// Re-checks a record until its holder is gone: `check(first)` answers the holder's lease time
/// left, or `None` once the record is no longer held under the awaited fence (`first` is true for
/// the first check only). Between checks it sleeps a random time from 1 ms to `pause` (full jitter;
/// `pause` from `first_pause`, doubling up to `cap()`, read at each step), never past the lease end
/// (the caller must then claim again: a takeover or `Unknown`), and wakes early on `notify`. The
/// caller bounds the whole wait by its `max`.
pub(crate) async fn poll_with_backoff<F, Fut>(
    notify: &Notify,
    first_pause: Duration,
    cap: impl Fn() -> Duration,
    mut check: F,
) -> Result<(), StoreError>
where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = Result<Option<Duration>, StoreError>>,
{
    let mut pause = first_pause;
    let mut first = true;
    let mut rng = SmallRng::from_os_rng();
    loop {
        // Registered before the check, so a wake-up in between is not missed.
        let woken = notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let Some(lease_left) = check(first).await? else { return Ok(()) };
        first = false;
        // Full jitter (1 ms to `pause`): waiters polling one server do not query in step.
        let sleep = Duration::from_millis(rng.random_range(1..=pause.as_millis().max(1) as u64));
        let _ = tokio::time::timeout(sleep.min(lease_left), woken).await;
        pause = (pause * 2).min(cap());
    }
}

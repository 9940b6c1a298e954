//! The in-memory store: the default, for one process. Records live in a mutex-guarded map; leases
//! and retention use tokio's clock (so tests can pause it); expired records are swept as the map
//! grows and at least every sweep interval, so memory stays bounded by the live records. A record
//! whose owner's lease ended without a result is swept only when the executor claims this store
//! directly and says its tool re-runs unasked (no reconciliation check, not `never`); claimed
//! through the `Store` trait (behind a wrapper), such a record stays until its key is claimed
//! again, since the claim cannot say whether a check must be asked first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::admin::{self, Forgot, ListPage, ListQuery, RecordInfo, RecordState, Resolution, Stats};
use super::{
    Claim, ClaimRequest, Fence, OnExpired, Origin, Outcome, Record, Store, StoreError, StoredOrigin,
};
use crate::clock::later;
use crate::key::{Fingerprint, Key};

#[derive(Debug)]
enum State {
    /// `sweepable`: once the lease ends, a sweep may drop the record, since the next claim
    /// would re-run the tool anyway with nothing asked first. Not so for a claim that answers
    /// `Unknown` on an expired lease, nor for one whose caller asks a check before it re-runs a
    /// dead owner's attempt (a `never` tool with one claims to take the lease over, and runs
    /// again only when its check says the effect did not happen): dropped, the record would
    /// come back as a fresh key, and the tool would run again unasked.
    InFlight {
        fence: Fence,
        lease_until: Instant,
        sweepable: bool,
    },
    Done {
        fence: Fence,
        outcome: Outcome,
        expires: Instant,
    },
}

/// A record's fingerprint. For a derived key it is the key itself
/// ([`Fingerprint::of_derived_key`]), and is not stored a second time.
#[derive(Debug)]
struct StoredFingerprint(Option<Box<Fingerprint>>);

impl StoredFingerprint {
    fn new(key: &Key, fingerprint: &Fingerprint) -> Self {
        if *fingerprint == Fingerprint::of_derived_key(key) {
            StoredFingerprint(None)
        } else {
            StoredFingerprint(Some(Box::new(*fingerprint)))
        }
    }
    fn get(&self, key: &Key) -> Fingerprint {
        match &self.0 {
            Some(f) => **f,
            None => Fingerprint::of_derived_key(key),
        }
    }
    fn is(&self, key: &Key, fingerprint: &Fingerprint) -> bool {
        self.get(key) == *fingerprint
    }
}

#[derive(Debug)]
struct Entry {
    fingerprint: StoredFingerprint,
    state: State,
    origin: Arc<StoredOrigin>,
    /// When the record entered its state (acquired, taken over, completed).
    since: Instant,
    /// Created when someone first waits on this record.
    waiters: Option<Arc<Notify>>,
}

impl Entry {
    fn wake(&mut self) {
        if let Some(n) = self.waiters.take() {
            n.notify_waiters();
        }
    }
    /// Whether retention has removed this record (a done record past its TTL).
    fn expired(&self, now: Instant) -> bool {
        matches!(self.state, State::Done { expires, .. } if expires <= now)
    }
    /// Whether a sweep may drop it: expired, or abandoned by an owner whose lease ended and whose
    /// tool may be re-run.
    fn sweepable(&self, now: Instant) -> bool {
        self.expired(now)
            || matches!(self.state, State::InFlight { lease_until, sweepable: true, .. }
                if lease_until <= now)
    }
}

/// A key as the 32 bytes of its digest rather than its 64 hex digits: a smaller table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Digest([u8; 32]);

impl Digest {
    fn of(key: &Key) -> Self {
        Digest(key.digest())
    }
    fn key(&self) -> Key {
        Key::from_digest(&self.0)
    }
}

impl std::hash::Hash for Digest {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // A digest is uniformly distributed: 8 of its bytes identify it well enough for a hash
        // table. Equal values hash equally.
        let mut head = [0u8; 8];
        head.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_le_bytes(head));
    }
}

#[derive(Debug)]
struct Map {
    /// Keys are SHA-256 digests, spread evenly already: a seeded fast hash is enough.
    entries: HashMap<Digest, Entry, foldhash::fast::RandomState>,
    /// The origin of the last record created: consecutive calls of one tool in one run share it.
    last_origin: Option<Arc<StoredOrigin>>,
    next_sweep: Instant,
    /// Sweep when the map doubles past its size after the last sweep.
    sweep_at_len: usize,
}

/// The in-memory [`Store`]: no setup, protects one process. Fences come from one counter, so
/// they increase across releases and expiry.
#[derive(Debug)]
pub struct MemoryStore {
    map: Mutex<Map>,
    fences: AtomicU64,
    sweep_interval: Duration,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

const MIN_SWEEP_LEN: usize = 1024;

impl MemoryStore {
    /// An empty store that sweeps expired records at least every 60 s.
    pub fn new() -> Self {
        Self::with_sweep_interval(Duration::from_secs(60))
    }

    /// An empty store that sweeps expired records at least every `interval`.
    pub fn with_sweep_interval(interval: Duration) -> Self {
        MemoryStore {
            map: Mutex::new(Map {
                entries: HashMap::default(),
                last_origin: None,
                next_sweep: later(Instant::now(), interval),
                sweep_at_len: MIN_SWEEP_LEN,
            }),
            fences: AtomicU64::new(0),
            sweep_interval: interval,
        }
    }

    /// Records held now, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        crate::sync::lock(&self.map)
    }

    fn next_fence(&self) -> Fence {
        Fence(self.fences.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn maybe_sweep(&self, map: &mut Map, now: Instant) {
        if now < map.next_sweep && map.entries.len() < map.sweep_at_len {
            return;
        }
        map.entries.retain(|_, e| !e.sweepable(now));
        give_back_room(&mut map.entries);
        map.next_sweep = later(now, self.sweep_interval);
        map.sweep_at_len = (map.entries.len() * 2).max(MIN_SWEEP_LEN);
    }
}

/// Frees the table's room beyond twice what its records need. A hash table keeps the room of the
/// most records it ever held: after a burst of calls whose records expired, the process would
/// hold the burst's peak for good (100,000 records: 17 MB) instead of what the live records need.
fn give_back_room<V, S: std::hash::BuildHasher>(entries: &mut HashMap<Digest, V, S>) {
    let room = (entries.len() * 2).max(MIN_SWEEP_LEN);
    if entries.capacity() > room * 2 {
        entries.shrink_to(room);
    }
}

impl MemoryStore {
    /// [`Store::claim`] at `now`, without a future: the executor calls it directly. `digest`:
    /// the digest `req.key` spells. `asks`: the caller asks a check before it re-runs a dead
    /// owner's attempt, so its record is kept until a claim takes it over (never swept).
    pub(crate) fn claim_at(
        &self,
        req: ClaimRequest<'_>,
        digest: &[u8; 32],
        now: Instant,
        asks: bool,
    ) -> Claim {
        let sweepable = req.on_expired == OnExpired::TakeOver && !asks;
        let mut map = self.lock();
        self.maybe_sweep(&mut map, now);
        let Map { entries, last_origin, .. } = &mut *map;
        let mut acquire = |fence| Entry {
            fingerprint: StoredFingerprint::new(req.key, req.fingerprint),
            state: State::InFlight { fence, lease_until: later(now, req.lease), sweepable },
            origin: shared_origin(last_origin, &req.origin),
            since: now,
            waiters: None,
        };
        // One lookup whether the key is new or not.
        let entry = match entries.entry(Digest(*digest)) {
            std::collections::hash_map::Entry::Vacant(free) => {
                let fence = self.next_fence();
                free.insert(acquire(fence));
                return Claim::Acquired { fence, takeover: false };
            }
            std::collections::hash_map::Entry::Occupied(held) => held.into_mut(),
        };
        if entry.expired(now) {
            let fence = self.next_fence();
            *entry = acquire(fence);
            return Claim::Acquired { fence, takeover: false };
        }
        if !entry.fingerprint.is(req.key, req.fingerprint) {
            return Claim::Mismatch;
        }
        match &entry.state {
            State::Done { outcome, .. } => {
                Claim::Completed(Record { fingerprint: *req.fingerprint, outcome: outcome.clone() })
            }
            State::InFlight { fence, lease_until, .. } if *lease_until > now => {
                Claim::InFlight { fence: *fence, lease_remaining: *lease_until - now }
            }
            State::InFlight { .. } => match req.on_expired {
                OnExpired::Unknown => Claim::Unknown,
                OnExpired::TakeOver => {
                    let fence = self.next_fence();
                    entry.wake();
                    entry.state =
                        State::InFlight { fence, lease_until: later(now, req.lease), sweepable };
                    entry.since = now;
                    Claim::Acquired { fence, takeover: true }
                }
            },
        }
    }

    /// [`Store::complete`] taking the outcome by value: it moves into the record. On a stale
    /// fence ([`StoreError::LeaseLost`]) nothing is written and the outcome is handed back.
    pub(crate) fn complete_owned(
        &self,
        digest: &[u8; 32],
        fence: Fence,
        outcome: Outcome,
        ttl: Duration,
    ) -> Result<(), Outcome> {
        let now = Instant::now();
        let mut map = self.lock();
        match map.entries.get_mut(&Digest(*digest)) {
            Some(e) if matches!(e.state, State::InFlight { fence: f, .. } if f == fence) => {
                e.state = State::Done { fence, outcome, expires: later(now, ttl) };
                e.since = now;
                e.wake();
                Ok(())
            }
            _ => Err(outcome),
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let digest = req.key.digest();
        // Through the trait (this store behind a wrapper of the user's own, which the executor
        // cannot see through) a claim does not say whether its caller asks a check before it
        // re-runs a dead owner's attempt (a `never` tool with one claims with `TakeOver`). The
        // record is kept as if it did: a dropped record would come back as a fresh key and run
        // the tool again unasked, while a kept one only waits for the next claim of its key.
        Ok(self.claim_at(req, &digest, Instant::now(), true))
    }

    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.complete_owned(&key.digest(), fence, outcome.clone(), ttl)
            .map_err(|_| StoreError::LeaseLost)
    }

    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        let digest = Digest::of(key);
        let mut map = self.lock();
        match map.entries.get_mut(&digest) {
            Some(e) if matches!(e.state, State::InFlight { fence: f, .. } if f == fence) => {
                e.wake();
                map.entries.remove(&digest);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn renew(&self, key: &Key, fence: Fence, lease: Duration) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut map = self.lock();
        match map.entries.get_mut(&Digest::of(key)) {
            Some(Entry { state: State::InFlight { fence: f, lease_until, .. }, .. })
                if *f == fence =>
            {
                *lease_until = later(now, lease);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }

    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError> {
        // Its timeout is Tokio's timer (a store used outside a call, by operator code).
        crate::tokio_ready::store_step(false)?;
        let notify = {
            let now = Instant::now();
            let mut map = self.lock();
            match map.entries.get_mut(&Digest::of(key)) {
                Some(e) => match e.state {
                    State::InFlight { fence: f, lease_until, .. }
                        if f == fence && lease_until > now =>
                    {
                        // Wake at lease expiry at the latest: a takeover needs a claim to happen.
                        let until = (lease_until - now).min(max);
                        (Arc::clone(e.waiters.get_or_insert_with(Default::default)), until)
                    }
                    _ => return Ok(()),
                },
                None => return Ok(()),
            }
        };
        let (notify, until) = notify;
        let notified = notify.notified();
        tokio::pin!(notified);
        // `notify_waiters` wakes only registered futures: re-check after registering, so a
        // completion between the unlock above and `enable` is not missed.
        notified.as_mut().enable();
        if !self.still_in_flight(key, fence) {
            return Ok(());
        }
        let _ = tokio::time::timeout(until, notified).await;
        Ok(())
    }

    fn is_local(&self) -> bool {
        true
    }

    async fn forget(&self, key: &Key) -> Result<bool, StoreError> {
        let mut map = self.lock();
        Ok(match map.entries.remove(&Digest::of(key)) {
            Some(mut e) => {
                e.wake();
                true
            }
            None => false,
        })
    }

    async fn forget_seen(&self, key: &Key, fence: Fence, done: bool) -> Result<bool, StoreError> {
        let mut map = self.lock();
        let digest = Digest::of(key);
        let seen = match map.entries.get(&digest) {
            None => return Forgot::Absent.answer(),
            Some(e) => match e.state {
                State::InFlight { fence: held, .. } => !done && held == fence,
                State::Done { fence: held, .. } => done && held == fence,
            },
        };
        if !seen {
            return Forgot::Changed.answer();
        }
        if let Some(mut e) = map.entries.remove(&digest) {
            e.wake();
        }
        Forgot::Removed.answer()
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let after = match &query.cursor {
            None => None,
            Some(c) => Some(Digest::of(
                &Key::parse(c).ok_or_else(|| StoreError::InvalidCursor(c.clone()))?,
            )),
        };
        let now = Instant::now();
        let map = self.lock();
        // Bytes sort as their lowercase hex digits do: this is key order.
        let mut entries: Vec<(&Digest, &Entry)> = map
            .entries
            .iter()
            .filter(|(d, e)| !e.expired(now) && after.is_none_or(|a| d.0 > a.0))
            .collect();
        entries.sort_unstable_by_key(|(digest, _)| digest.0);
        let mut page = ListPage::default();
        for (digest, entry) in entries {
            page.scanned += 1;
            let key = digest.key();
            let info = entry.info(&key, now);
            if query.selects(&info) {
                page.records.push(info);
                if page.records.len() == query.page_size() {
                    page.next = Some(key.to_string());
                    break;
                }
            }
        }
        Ok(page)
    }

    async fn inspect(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        let now = Instant::now();
        let map = self.lock();
        Ok(map.entries.get(&Digest::of(key)).filter(|e| !e.expired(now)).map(|e| e.info(key, now)))
    }

    async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: &Resolution,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let digest = Digest::of(key);
        let mut map = self.lock();
        let Some(entry) = map.entries.get_mut(&digest) else { return Err(StoreError::LeaseLost) };
        let info = entry.info(key, now);
        if entry.expired(now) || info.fence != fence || !admin::resolvable(&info.state) {
            return Err(StoreError::LeaseLost);
        }
        entry.wake();
        match resolution {
            Resolution::Happened { outcome, ttl } => {
                entry.state =
                    State::Done { fence, outcome: outcome.clone(), expires: later(now, *ttl) };
                entry.since = now;
            }
            Resolution::NotHappened => {
                map.entries.remove(&digest);
            }
        }
        Ok(())
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut map = self.lock();
        let before = map.entries.len();
        map.entries.retain(|_, e| !e.expired(now));
        give_back_room(&mut map.entries);
        Ok((before - map.entries.len()) as u64)
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        let now = Instant::now();
        let map = self.lock();
        let mut stats = Stats::default();
        for (digest, e) in map.entries.iter().filter(|(_, e)| !e.expired(now)) {
            stats.count(&e.info(&digest.key(), now).state);
        }
        Ok(stats)
    }
}

/// The stored origin for `origin`: the last one created if it is the same, else a new one.
fn shared_origin(last: &mut Option<Arc<StoredOrigin>>, origin: &Origin<'_>) -> Arc<StoredOrigin> {
    if let Some(o) = last
        && o.tool == origin.tool
        && o.tenant == origin.tenant
        && o.run == origin.run
    {
        return Arc::clone(o);
    }
    let new = Arc::new(StoredOrigin {
        tool: origin.tool.to_owned(),
        tenant: origin.tenant.to_owned(),
        run: origin.run.to_owned(),
    });
    *last = Some(Arc::clone(&new));
    new
}

impl Entry {
    fn info(&self, key: &Key, now: Instant) -> RecordInfo {
        let (fence, state) = match &self.state {
            State::InFlight { fence, lease_until, .. } => (
                *fence,
                RecordState::InFlight {
                    lease_remaining: lease_until.saturating_duration_since(now),
                },
            ),
            State::Done { fence, outcome, .. } => (*fence, RecordState::Done(outcome.clone())),
        };
        RecordInfo {
            key: *key,
            fingerprint: self.fingerprint.get(key),
            fence,
            origin: Some(StoredOrigin::clone(&self.origin)),
            state,
            age: Some(now.saturating_duration_since(self.since)),
        }
    }
}

impl MemoryStore {
    fn still_in_flight(&self, key: &Key, fence: Fence) -> bool {
        let now = Instant::now();
        matches!(
            self.lock().entries.get(&Digest::of(key)),
            Some(Entry { state: State::InFlight { fence: f, lease_until, .. }, .. })
                if *f == fence && *lease_until > now
        )
    }
}

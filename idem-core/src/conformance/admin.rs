//! The operator's part of the store contract (`docs/design.md` §5.1): listing, inspecting,
//! resolving, purging and counting. Every test uses its own run id as the origin and lists with
//! it as the run prefix, so suites sharing one database do not see each other's records.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::sleep;

use super::{LONG, PAST_SHORT, SHORT};
use crate::key::{Fingerprint, Key, Scope, derive_key, fingerprint};
use crate::store::{
    Claim, ClaimRequest, Fence, ListQuery, OnExpired, Origin, Outcome, Record, RecordInfo,
    RecordState, Resolution, StateFilter, Store, StoreError,
};

/// The tool name every record of these tests is claimed under.
pub const TOOL: &str = "conformance_tool";

/// A run id unique across processes and runs, naming `test`.
pub fn fresh_run(test: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{test}-{}-{nanos}-{seq}", std::process::id())
}

/// One test's records: a run, and the tool each record is claimed under.
struct Fixture<'s> {
    store: &'s dyn Store,
    run: String,
}

impl<'s> Fixture<'s> {
    fn new(store: &'s dyn Store, test: &str) -> Self {
        Fixture { store, run: fresh_run(test) }
    }

    fn key(&self, tool: &str, args: &str) -> (Key, Fingerprint) {
        let scope = Scope::run(self.run.clone()).with_tenant("conformance");
        (derive_key(&scope, tool, args.as_bytes()), fingerprint(args.as_bytes()))
    }

    async fn claim(&self, tool: &str, key: &Key, fp: &Fingerprint, lease: Duration) -> Claim {
        let origin = Origin { tool, tenant: "conformance", run: &self.run };
        let req =
            ClaimRequest { key, fingerprint: fp, lease, on_expired: OnExpired::Unknown, origin };
        match self.store.claim(req).await {
            Ok(c) => c,
            Err(e) => panic!("claim of {key:?} failed: {e}"),
        }
    }

    /// A new record of `tool` held under a lease of `lease`; its key and fence.
    async fn held(&self, tool: &str, args: &str, lease: Duration) -> (Key, Fence) {
        let (key, fp) = self.key(tool, args);
        match self.claim(tool, &key, &fp, lease).await {
            Claim::Acquired { fence, .. } => (key, fence),
            other => panic!("a fresh key must be acquired, got {other:?}"),
        }
    }

    /// A new record of [`TOOL`] completed with `outcome`; its key.
    async fn done(&self, args: &str, outcome: Outcome, ttl: Duration) -> Key {
        let (key, fence) = self.held(TOOL, args, LONG).await;
        if let Err(e) = self.store.complete(&key, fence, &outcome, ttl).await {
            panic!("complete by the owner must succeed, got {e}");
        }
        key
    }

    /// Every record of this test's run that `query` selects, page by page.
    async fn list_all(&self, mut query: ListQuery) -> Vec<RecordInfo> {
        query.run_prefix = Some(self.run.clone());
        let mut all = Vec::new();
        for _ in 0..100_000 {
            let page = match self.store.list(&query).await {
                Ok(page) => page,
                Err(e) => panic!("list failed: {e}"),
            };
            assert!(
                page.records.len() + page.unreadable.len() <= query.page_size(),
                "a page holds at most {} records, readable or not, got {} and {} unreadable",
                query.page_size(),
                page.records.len(),
                page.unreadable.len()
            );
            all.extend(page.records);
            match page.next {
                Some(next) => query.cursor = Some(next),
                None => return all,
            }
        }
        panic!("the listing never ended");
    }

    async fn keys(&self, query: ListQuery) -> BTreeSet<Key> {
        let records = self.list_all(query).await;
        let keys: BTreeSet<Key> = records.iter().map(|r| r.key).collect();
        assert_eq!(keys.len(), records.len(), "a listing returns each record once: {records:?}");
        keys
    }

    async fn inspect(&self, key: &Key) -> Option<RecordInfo> {
        match self.store.inspect(key).await {
            Ok(info) => info,
            Err(e) => panic!("inspect of {key:?} failed: {e}"),
        }
    }
}

fn state(state: StateFilter) -> ListQuery {
    ListQuery { state: Some(state), ..ListQuery::default() }
}

fn set(keys: &[Key]) -> BTreeSet<Key> {
    keys.iter().copied().collect()
}

/// Records in each state list under that state and no other, with their origin and fence.
pub async fn list_by_state(store: &dyn Store) {
    let f = Fixture::new(store, "list_by_state");
    let (live, live_fence) = f.held(TOOL, "live", LONG).await;
    let (dead, _) = f.held(TOOL, "dead", SHORT).await;
    let unknown = f.done("unknown", Outcome::Unknown, LONG).await;
    let completed = f.done("completed", Outcome::Success("{\"id\":1}".into()), LONG).await;
    let failed = f.done("failed", Outcome::Failure("\"declined\"".into()), LONG).await;
    let lost = f.done("lost", Outcome::NotStorable("NaN".into()), LONG).await;
    sleep(PAST_SHORT).await;
    let cases = [
        (StateFilter::InFlight, set(&[live, dead])),
        (StateFilter::LeaseEnded, set(&[dead])),
        (StateFilter::Unknown, set(&[unknown])),
        (StateFilter::Completed, set(&[completed])),
        (StateFilter::Failed, set(&[failed])),
        (StateFilter::NotStorable, set(&[lost])),
    ];
    for (filter, want) in cases {
        assert_eq!(f.keys(state(filter)).await, want, "records listed as {filter:?}");
    }
    let all = f.list_all(ListQuery::default()).await;
    assert_eq!(all.len(), 6, "every record of the run without a state filter: {all:?}");
    for info in &all {
        let origin = info.origin.as_ref().expect("a record of this version has an origin");
        assert_eq!((origin.tool.as_str(), origin.run.as_str()), (TOOL, f.run.as_str()));
        assert_eq!(origin.tenant, "conformance");
    }
    let by_key = |k: Key| all.iter().find(|r| r.key == k).expect("listed");
    match by_key(live) {
        RecordInfo { fence, state: RecordState::InFlight { lease_remaining }, .. } => {
            assert_eq!(*fence, live_fence, "an in-flight record lists its owner's fence");
            assert!(*lease_remaining > SHORT && *lease_remaining <= LONG, "{lease_remaining:?}");
        }
        other => panic!("a held record must list as in flight, got {other:?}"),
    }
    assert_eq!(
        by_key(dead).state,
        RecordState::InFlight { lease_remaining: Duration::ZERO },
        "a lease that ended lists as in flight with no time left"
    );
}

/// How much older the old records of [`list_filters_and_pages`] are than its young ones.
const AGE_GAP: Duration = Duration::from_secs(1);
/// What a store's own clock and whole-millisecond ages may add to or take from an age.
const AGE_ROUNDING: Duration = Duration::from_millis(50);

/// Tool, run prefix and age filters, and pages of a given size that together hold every record
/// exactly once.
pub async fn list_filters_and_pages(store: &dyn Store) {
    let f = Fixture::new(store, "list_filters_and_pages");
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(f.done(&format!("old{i}"), Outcome::Success(i.to_string()), LONG).await);
    }
    sleep(AGE_GAP).await;
    let young_from = std::time::Instant::now();
    let mut young = Vec::new();
    for i in 0..4 {
        young.push(f.done(&format!("young{i}"), Outcome::Success(i.to_string()), LONG).await);
    }
    let (other_tool, _) = f.held("other_tool", "x", LONG).await;
    let every: BTreeSet<Key> = old.iter().chain(&young).copied().chain([other_tool]).collect();

    assert_eq!(f.keys(ListQuery::default()).await, every, "no filter: the whole run");
    let tool = ListQuery { tool: Some("other_tool".into()), ..ListQuery::default() };
    assert_eq!(f.keys(tool).await, set(&[other_tool]), "the tool filter");
    // Every old record is at least `AGE_GAP` older than every young one. A threshold of the
    // young group's age now plus most of that gap therefore lists every old record, however long
    // the listing takes. It lists no young record while the young are younger than the
    // threshold, which holds for the whole listing if it holds when the listing has returned.
    // A listing that took longer than the slack (a loaded machine) proves nothing about the
    // young records and is asked again; no verdict is forced from it.
    let slack = AGE_GAP - AGE_ROUNDING;
    let mut decided = None;
    for _ in 0..20 {
        let threshold = young_from.elapsed() + slack;
        let aged = ListQuery { older_than: Some(threshold), ..ListQuery::default() };
        let listed = f.keys(aged).await;
        assert!(listed.is_superset(&set(&old)), "older than {threshold:?}: every old record");
        if young_from.elapsed() + AGE_ROUNDING < threshold {
            decided = Some((listed, threshold));
            break;
        }
    }
    let Some((listed, threshold)) = decided else {
        panic!("each of 20 listings took longer than {slack:?}: no verdict on the young records")
    };
    assert_eq!(listed, set(&old), "older than {threshold:?}: the old records and no young one");
    for limit in [1, 2, 3, 100] {
        let paged = ListQuery { limit, ..ListQuery::default() };
        assert_eq!(f.keys(paged).await, every, "pages of {limit} hold every record once");
    }
    let prefix = f.run[..f.run.len() - 1].to_owned();
    let by_prefix = ListQuery { run_prefix: Some(prefix.clone()), ..ListQuery::default() };
    let found = listed_among(store, by_prefix, &every).await;
    assert_eq!(found, every, "a prefix of the run id selects the run's records");
    // The run filter is exact: the whole id selects them, a prefix of it none.
    let whole = ListQuery { run: Some(f.run.clone()), ..ListQuery::default() };
    assert_eq!(listed_among(store, whole, &every).await, every, "the run's whole id");
    let cut = ListQuery { run: Some(prefix), ..ListQuery::default() };
    assert!(listed_among(store, cut, &every).await.is_empty(), "a run id is not a prefix");
    let none = ListQuery { run_prefix: Some(format!("{}-none", f.run)), ..ListQuery::default() };
    assert!(store.list(&none).await.expect("list").records.is_empty(), "a prefix no run has");
    // A cursor this store did not make is the caller's mistake (a typo, another store's
    // cursor): InvalidCursor naming it, not a record of another version and not an outage to
    // retry.
    for cursor in ["zz", "", ";x;", "not a cursor"] {
        let foreign = ListQuery { cursor: Some(cursor.into()), ..ListQuery::default() };
        match store.list(&foreign).await {
            Err(StoreError::InvalidCursor(c)) if c == cursor => {}
            other => panic!(
                "a cursor not made by this store ({cursor:?}) is InvalidCursor, got {other:?}"
            ),
        }
    }
}

/// The keys among `among` that every page of `query` lists (other tests' records ignored).
async fn listed_among(
    store: &dyn Store,
    mut query: ListQuery,
    among: &BTreeSet<Key>,
) -> BTreeSet<Key> {
    let mut found = BTreeSet::new();
    loop {
        let page = store.list(&query).await.expect("list");
        found.extend(page.records.iter().filter(|r| among.contains(&r.key)).map(|r| r.key));
        match page.next {
            Some(next) => query.cursor = Some(next),
            None => return found,
        }
    }
}

/// inspect shows one record with its origin, fence, state and age; an absent key is `None`.
pub async fn inspect_shows_one_record(store: &dyn Store) {
    let f = Fixture::new(store, "inspect_shows_one_record");
    let (key, fence) = f.held(TOOL, "one", LONG).await;
    let info = f.inspect(&key).await.expect("a held record is found");
    assert_eq!((info.key, info.fence), (key, fence));
    assert_eq!(info.fingerprint, f.key(TOOL, "one").1);
    assert!(matches!(info.state, RecordState::InFlight { .. }), "{info:?}");
    assert!(info.age.is_some_and(|a| a < LONG), "age {:?}", info.age);
    let outcome = Outcome::Success("[1,2]".into());
    store.complete(&key, fence, &outcome, LONG).await.expect("complete");
    let info = f.inspect(&key).await.expect("a completed record is found");
    assert_eq!(info.state, RecordState::Done(outcome));
    let (absent, _) = f.key(TOOL, "absent");
    assert_eq!(f.inspect(&absent).await, None, "an absent key");
}

fn refused(what: &str, r: Result<(), StoreError>) {
    match r {
        Err(StoreError::LeaseLost) => {}
        other => panic!("{what} must be refused with LeaseLost, got {other:?}"),
    }
}

/// Resolving an unknown outcome or a dead owner's record as happened stores the outcome, and
/// claims then replay it.
pub async fn resolve_happened_replays(store: &dyn Store) {
    let f = Fixture::new(store, "resolve_happened_replays");
    let unknown = f.done("unknown", Outcome::Unknown, LONG).await;
    let (dead, dead_fence) = f.held(TOOL, "dead", SHORT).await;
    sleep(PAST_SHORT).await;
    let fence = f.inspect(&unknown).await.expect("found").fence;
    for (key, fence) in [(unknown, fence), (dead, dead_fence)] {
        let outcome = Outcome::Success("{\"refund\":\"re_1\"}".into());
        let happened = Resolution::Happened { outcome: outcome.clone(), ttl: LONG };
        store.resolve(&key, fence, &happened).await.expect("resolve an unresolved record");
        let fp = f.inspect(&key).await.expect("found").fingerprint;
        let got = f.claim(TOOL, &key, &fp, LONG).await;
        assert_eq!(got, Claim::Completed(Record { fingerprint: fp, outcome }), "replayed");
        let again = Resolution::Happened { outcome: Outcome::Success("0".into()), ttl: LONG };
        refused("resolving a record already resolved", store.resolve(&key, fence, &again).await);
    }
}

/// Resolving as not happened frees the key: the next claim acquires with a higher fence.
pub async fn resolve_not_happened_frees_key(store: &dyn Store) {
    let f = Fixture::new(store, "resolve_not_happened_frees_key");
    let unknown = f.done("unknown", Outcome::Unknown, LONG).await;
    let (dead, dead_fence) = f.held(TOOL, "dead", SHORT).await;
    sleep(PAST_SHORT).await;
    let fence = f.inspect(&unknown).await.expect("found").fence;
    for (key, fence) in [(unknown, fence), (dead, dead_fence)] {
        store.resolve(&key, fence, &Resolution::NotHappened).await.expect("resolve");
        assert_eq!(f.inspect(&key).await, None, "the record is gone");
        let fp = f.fingerprint_of(key, &[("unknown", unknown), ("dead", dead)]);
        match f.claim(TOOL, &key, &fp, LONG).await {
            Claim::Acquired { fence: next, takeover: false } => {
                assert!(next > fence, "the next fence {next:?} must exceed {fence:?}")
            }
            other => panic!("the next claim must acquire, got {other:?}"),
        }
        refused(
            "resolving a record now live",
            store.resolve(&key, fence, &Resolution::NotHappened).await,
        );
    }
}

impl Fixture<'_> {
    fn fingerprint_of(&self, key: Key, named: &[(&str, Key)]) -> Fingerprint {
        let (args, _) = named.iter().find(|(_, k)| *k == key).expect("a named key");
        self.key(TOOL, args).1
    }
}

/// Resolution is fenced: a live owner, a stored success or failure, a fence that is not current
/// and an absent key are refused with `LeaseLost`, and the record stays as it was; a dead owner
/// that completes late wins over a resolution made with the fence read before.
pub async fn resolve_is_fenced(store: &dyn Store) {
    let f = Fixture::new(store, "resolve_is_fenced");
    let happened = Resolution::Happened { outcome: Outcome::Success("1".into()), ttl: LONG };
    let (live, fence) = f.held(TOOL, "live", LONG).await;
    for r in [&happened, &Resolution::NotHappened] {
        refused("resolving a live owner's record", store.resolve(&live, fence, r).await);
    }
    assert!(
        matches!(f.inspect(&live).await.map(|i| i.state), Some(RecordState::InFlight { .. })),
        "the live record stays in flight"
    );
    let stored = Outcome::Failure("\"declined\"".into());
    let failed = f.done("failed", stored.clone(), LONG).await;
    let fence = f.inspect(&failed).await.expect("found").fence;
    for r in [&happened, &Resolution::NotHappened] {
        refused("resolving a stored failure", store.resolve(&failed, fence, r).await);
    }
    assert_eq!(f.inspect(&failed).await.map(|i| i.state), Some(RecordState::Done(stored)));
    let unknown = f.done("unknown", Outcome::Unknown, LONG).await;
    let fence = f.inspect(&unknown).await.expect("found").fence;
    for stale in [Fence(fence.0.wrapping_sub(1)), Fence(fence.0 + 1)] {
        refused("resolving with another fence", store.resolve(&unknown, stale, &happened).await);
    }
    assert_eq!(
        f.inspect(&unknown).await.map(|i| i.state),
        Some(RecordState::Done(Outcome::Unknown))
    );
    let (absent, _) = f.key(TOOL, "absent");
    refused("resolving an absent key", store.resolve(&absent, Fence(1), &happened).await);
    // The operator reads a dead owner's fence; the owner completes late (its fence is still
    // current); the resolution made with the fence read before must not overwrite it.
    let (late, fence) = f.held(TOOL, "late", SHORT).await;
    sleep(PAST_SHORT).await;
    let seen = f.inspect(&late).await.expect("found").fence;
    let real = Outcome::Success("\"the owner's\"".into());
    store.complete(&late, fence, &real, LONG).await.expect("a late complete by the owner");
    refused("resolving after the owner completed", store.resolve(&late, seen, &happened).await);
    assert_eq!(f.inspect(&late).await.map(|i| i.state), Some(RecordState::Done(real)));
}

/// `forget_seen` removes only the record as it was seen: a record taken over (another fence) or
/// completed by its owner (same fence, another state) since it was read is refused with
/// `LeaseLost` and kept; the record as seen is removed (in flight or done); an absent key is
/// `false`.
pub async fn forget_seen_is_fenced(store: &dyn Store) {
    let f = Fixture::new(store, "forget_seen_is_fenced");
    // A dead owner, read; then taken over by another caller.
    let (taken, fence) = f.held(TOOL, "taken", SHORT).await;
    sleep(PAST_SHORT).await;
    let seen = f.inspect(&taken).await.expect("found");
    assert_eq!(seen.fence, fence);
    let (_, fp) = f.key(TOOL, "taken");
    let origin = Origin { tool: TOOL, tenant: "conformance", run: &f.run };
    let on_expired = OnExpired::TakeOver;
    let req = ClaimRequest { key: &taken, fingerprint: &fp, lease: LONG, on_expired, origin };
    let Ok(Claim::Acquired { fence: new, takeover: true }) = store.claim(req).await else {
        panic!("the dead owner's record must be taken over")
    };
    let forgot = store.forget_seen(&taken, fence, false).await;
    refused("forgetting a record taken over since", forgot.map(drop));
    let now = f.inspect(&taken).await.expect("kept");
    assert_eq!(now.fence, new, "the new owner's record is kept");
    // In flight when read, completed by its owner since (same fence).
    let (late, fence) = f.held(TOOL, "late", SHORT).await;
    sleep(PAST_SHORT).await;
    let seen = f.inspect(&late).await.expect("found");
    assert!(!seen.state.is_done());
    let real = Outcome::Success("\"the owner's\"".into());
    store.complete(&late, fence, &real, LONG).await.expect("a late complete by the owner");
    let forgot = store.forget_seen(&late, fence, false).await;
    refused("forgetting a record completed since", forgot.map(drop));
    assert_eq!(f.inspect(&late).await.map(|i| i.state), Some(RecordState::Done(real)));
    // As seen: removed, in flight or done; then absent.
    assert!(store.forget_seen(&late, fence, true).await.expect("forget"), "a done record as seen");
    assert!(f.inspect(&late).await.is_none(), "removed");
    let (held, fence) = f.held(TOOL, "held", LONG).await;
    assert!(store.forget_seen(&held, fence, false).await.expect("forget"), "in flight as seen");
    assert!(f.inspect(&held).await.is_none(), "removed");
    assert!(!store.forget_seen(&held, fence, false).await.expect("forget"), "absent: false");
}

/// purge removes records whose retention ended (they no longer list or inspect), never a live one.
pub async fn purge_removes_only_expired(store: &dyn Store) {
    let f = Fixture::new(store, "purge_removes_only_expired");
    let short = f.done("short", Outcome::Success("1".into()), SHORT).await;
    let kept = f.done("kept", Outcome::Success("2".into()), LONG).await;
    let (held, _) = f.held(TOOL, "held", LONG).await;
    sleep(PAST_SHORT).await;
    assert_eq!(f.inspect(&short).await, None, "a record past retention does not inspect");
    assert_eq!(f.keys(ListQuery::default()).await, set(&[kept, held]), "nor list");
    store.purge_expired().await.expect("purge");
    assert_eq!(f.keys(ListQuery::default()).await, set(&[kept, held]), "purge keeps the rest");
}

/// stats counts records by state (lower bounds: other tests share the store).
pub async fn stats_count_by_state(store: &dyn Store) {
    let f = Fixture::new(store, "stats_count_by_state");
    f.held(TOOL, "live", LONG).await;
    f.held(TOOL, "dead", SHORT).await;
    f.done("unknown", Outcome::Unknown, LONG).await;
    f.done("completed", Outcome::Success("1".into()), LONG).await;
    f.done("failed", Outcome::Failure("1".into()), LONG).await;
    f.done("lost", Outcome::NotStorable("NaN".into()), LONG).await;
    sleep(PAST_SHORT).await;
    let stats = store.stats().await.expect("stats");
    let counts = [
        stats.in_flight,
        stats.lease_expired,
        stats.unknown,
        stats.completed,
        stats.failed,
        stats.not_storable,
    ];
    assert!(counts.iter().all(|&n| n >= 1), "each state counts this test's record: {stats:?}");
    assert_eq!(stats.total(), counts.iter().sum::<u64>() + stats.unreadable);
}

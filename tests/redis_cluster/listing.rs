//! The operator side on a slot half-moved between two masters: a listing reads each record on
//! the node that holds it, following `MOVED` and `ASK` as the steps do.

use idem_core::store::{ListQuery, Stats};

use super::*;

/// What the operator sees of a store while a slot is mid-migration.
struct Seen {
    /// Every key the listing returned, in order, across its pages.
    listed: Result<Vec<Key>, StoreError>,
    pages: usize,
    inspected: Vec<Result<bool, StoreError>>,
    stats: Result<Stats, StoreError>,
}

async fn look(store: &RedisStore, keys: &[Key]) -> Seen {
    let (mut listed, mut pages) = (Vec::new(), 0);
    let mut q = ListQuery { limit: 2, ..ListQuery::default() };
    let listed = loop {
        match store.list(&q).await {
            Ok(page) => {
                pages += 1;
                listed.extend(page.records.iter().map(|r| r.key));
                match page.next {
                    Some(next) => q.cursor = Some(next),
                    None => break Ok(listed),
                }
            }
            Err(e) => break Err(e),
        }
    };
    let mut inspected = Vec::new();
    for key in keys {
        inspected.push(store.inspect(key).await.map(|found| found.is_some_and(|i| i.key == *key)));
    }
    Seen { listed, pages, inspected, stats: store.stats().await }
}

/// A slot IMPORTING on one master and MIGRATING on its owner, three of its six records already
/// moved. The owner's `SCAN` finds the three left, the importer's the three moved; the importer
/// answers a plain `GET` of a moved record with `MOVED` to the owner, which answers `ASK` back.
/// Every record is listed exactly once (pages of 2), inspect finds each, stats counts six.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_and_inspect_read_a_slot_mid_migration() {
    let Some(cluster) = tokio::task::spawn_blocking(shared).await.unwrap() else { return };
    // A prefix of this test alone: the listing holds its records and no others.
    let prefix = format!("idem-list-migrating-{}", std::process::id());
    let store = RedisStore::builder(cluster.url("")).prefix(prefix).open().await.expect("opens");
    let (probe, fp) = fresh_key("list-migrating", "{}");
    let slot = cluster::slot(&store.record_key(&probe));
    let keys = keys_in_slot(&store, slot, 6);
    for key in &keys {
        assert_answer!(store.claim(claim_req(key, &fp)).await, Ok(Claim::Acquired { .. }));
    }
    let from = cluster.master_of(slot).unwrap();
    let to = cluster
        .nodes()
        .unwrap()
        .into_iter()
        .find(|n| n.master && !n.failed && n.id != from.id)
        .expect("another master");
    assert_eq!(cluster.begin_migration(slot, &to).unwrap().id, from.id);
    for key in &keys[..3] {
        cluster.move_key(&from, &to, &store.record_key(key)).unwrap();
    }
    let seen = look(&store, &keys).await;
    // The slot settles before asserting, so a failure leaves the shared cluster whole.
    cluster.end_migration(slot, &from, &to, Duration::ZERO).unwrap();

    let listed = seen.listed.expect("the listing reads records of a slot being migrated");
    for key in &keys {
        assert_eq!(listed.iter().filter(|k| *k == key).count(), 1, "{key} listed once: {listed:?}");
    }
    assert_eq!(listed.len(), keys.len(), "only this test's records: {listed:?}");
    assert!(seen.pages >= 3, "pages of 2 for 6 records, got {}", seen.pages);
    for (key, found) in keys.iter().zip(&seen.inspected) {
        assert!(matches!(found, Ok(true)), "inspect {key}: {found:?}");
    }
    let stats = seen.stats.expect("stats reads records of a slot being migrated");
    assert_eq!((stats.in_flight, stats.unreadable), (6, 0), "{stats:?}");
}

/// Records on every master, three of them made unreadable behind the store's back (on their
/// slot's master): at every page size, every readable record is listed once and every unreadable
/// one reported once by its key, so the cursor goes on past an unreadable record that ends a
/// page, within a node and from one node to the next; stats counts the three as unreadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_reports_unreadable_records_on_every_master() {
    let Some(cluster) = tokio::task::spawn_blocking(shared).await.unwrap() else { return };
    let prefix = format!("idem-list-unreadable-{}", std::process::id());
    let store = RedisStore::builder(cluster.url("")).prefix(prefix).open().await.expect("opens");
    let keys: Vec<Key> = (0..12).map(|i| fresh_key("list-unreadable", &i.to_string()).0).collect();
    let (_, fp) = fresh_key("list-unreadable", "{}");
    for key in &keys {
        let fence = match store.claim(claim_req(key, &fp)).await {
            Ok(Claim::Acquired { fence, .. }) => fence,
            other => panic!("a fresh key is acquired, got {other:?}"),
        };
        store.complete(key, fence, &Outcome::Success("1".into()), LONG).await.expect("complete");
    }
    let masters: std::collections::BTreeSet<u16> = keys
        .iter()
        .map(|k| cluster.master_of(cluster::slot(&store.record_key(k))).unwrap().port)
        .collect();
    assert!(masters.len() > 1, "the records are spread over the masters: {masters:?}");
    let bad = [keys[0], keys[5], keys[11]];
    for key in &bad {
        let name = store.record_key(key);
        let port = cluster.master_of(cluster::slot(&name)).unwrap().port;
        cluster.cli(port, &["SET", &name, "not a record"]).unwrap();
    }
    let mut good: Vec<Key> = keys.iter().filter(|k| !bad.contains(k)).copied().collect();
    good.sort();
    let mut want_bad: Vec<String> = bad.iter().map(Key::to_string).collect();
    want_bad.sort();
    for size in 1..=keys.len() + 1 {
        let mut q = ListQuery { limit: size, ..ListQuery::default() };
        let (mut listed, mut unreadable) = (Vec::new(), Vec::new());
        for page in 0.. {
            assert!(page < 1000, "pages of {size}: the listing never ended");
            let page = store.list(&q).await.expect("one unreadable record fails no page");
            assert!(page.records.len() + page.unreadable.len() <= size, "{page:?}");
            listed.extend(page.records.iter().map(|r| r.key));
            unreadable.extend(page.unreadable.into_iter().map(|u| {
                assert!(u.reason.contains("schema version"), "{u:?}");
                u.key
            }));
            match page.next {
                Some(next) => q.cursor = Some(next),
                None => break,
            }
        }
        listed.sort();
        unreadable.sort();
        assert_eq!(listed, good, "pages of {size}: every readable record once");
        assert_eq!(unreadable, want_bad, "pages of {size}: every unreadable record once");
    }
    let stats = store.stats().await.expect("stats");
    assert_eq!((stats.completed, stats.unreadable), (9, 3), "{stats:?}");
    for key in &keys {
        store.forget(key).await.expect("forget");
    }
}

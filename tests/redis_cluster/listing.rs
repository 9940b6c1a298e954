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

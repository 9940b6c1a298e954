//! The store conformance suite against Redis (`IDEM_REDIS_URL`, default
//! `redis://127.0.0.1:6379/`), plus what only Redis has: the key layout for Redis Cluster, records
//! of another schema version, and keys of another type.

#![cfg(feature = "redis")]

use std::time::Duration;

use idem_core::StoreError;
use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, ClaimRequest, Fence, OnExpired, Outcome, RedisStore, Store};
use idem_tests::{or_skip, redis_url};

async fn store() -> Option<RedisStore> {
    or_skip("Redis", RedisStore::open(&redis_url()).await)
}

async fn raw() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).expect("redis url");
    client.get_multiplexed_async_connection().await.expect("raw redis connection")
}

idem_core::store_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await.map(Box::new)
);

fn claim_req<'a>(key: &'a idem_core::Key, fp: &'a idem_core::Fingerprint) -> ClaimRequest<'a> {
    ClaimRequest { key, fingerprint: fp, lease: LONG, on_expired: OnExpired::TakeOver }
}

/// CRC16 of a Redis Cluster hash slot (XMODEM), of the hash tag when there is one.
fn slot(key: &str) -> u16 {
    let tagged = match (key.find('{'), key.find('}')) {
        (Some(open), Some(close)) if close > open + 1 => &key[open + 1..close],
        _ => key,
    };
    let mut crc: u16 = 0;
    for &b in tagged.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

#[tokio::test]
async fn record_and_fence_counter_share_a_cluster_slot() {
    let Some(store) = store().await else { return };
    let mut slots = std::collections::HashSet::new();
    for i in 0..50 {
        let (key, _) = fresh_key("slots", &i.to_string());
        let (rec, fence, chan) =
            (store.record_key(&key), store.fence_key(&key), store.channel(&key));
        assert_eq!(slot(&rec), slot(&fence), "{rec} and {fence} must hash to one slot");
        assert_eq!(slot(&rec), slot(&chan));
        slots.insert(slot(&rec));
    }
    // The tag is the idempotency key, so keys spread over the cluster.
    assert!(slots.len() > 40, "only {} slots for 50 keys", slots.len());
}

#[tokio::test]
async fn record_of_another_schema_version_is_refused_not_replayed() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("schema", "{}");
    let Claim::Acquired { fence, .. } = store.claim(claim_req(&key, &fp)).await.unwrap() else {
        panic!("fresh key must be acquired")
    };
    store.complete(&key, fence, &Outcome::Success("42".into()), LONG).await.unwrap();
    // A future version rewrote the record.
    let mut raw = raw().await;
    let _: () = redis::cmd("HSET")
        .arg(store.record_key(&key))
        .arg("v")
        .arg("2")
        .query_async(&mut raw)
        .await
        .unwrap();
    match store.claim(claim_req(&key, &fp)).await {
        Err(StoreError::Incompatible(why)) => assert!(why.contains("schema version 2"), "{why}"),
        other => panic!("a v2 record must be Incompatible, got {other:?}"),
    }
    for r in [
        store.complete(&key, fence, &Outcome::Success("1".into()), LONG).await,
        store.release(&key, fence).await,
        store.renew(&key, fence, LONG).await,
        store.wait(&key, fence, Duration::from_millis(10)).await,
    ] {
        assert!(matches!(r, Err(StoreError::Incompatible(_))), "got {r:?}");
    }
    // Forget is the operator's way out, and works whatever is stored.
    assert!(store.forget(&key).await.unwrap());
    assert!(matches!(store.claim(claim_req(&key, &fp)).await, Ok(Claim::Acquired { .. })));
}

#[tokio::test]
async fn key_of_another_type_is_refused() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("wrongtype", "{}");
    let mut raw = raw().await;
    let _: () =
        redis::cmd("SET").arg(store.record_key(&key)).arg("x").query_async(&mut raw).await.unwrap();
    match store.claim(claim_req(&key, &fp)).await {
        Err(StoreError::Incompatible(why)) => assert!(why.contains("string"), "{why}"),
        other => panic!("a string key must be Incompatible, got {other:?}"),
    }
    store.forget(&key).await.unwrap();
}

#[tokio::test]
async fn record_of_unknown_outcome_kind_is_refused() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("kind", "{}");
    let Claim::Acquired { fence, .. } = store.claim(claim_req(&key, &fp)).await.unwrap() else {
        panic!("fresh key must be acquired")
    };
    store.complete(&key, fence, &Outcome::Success("1".into()), LONG).await.unwrap();
    let mut raw = raw().await;
    let _: () = redis::cmd("HSET")
        .arg(store.record_key(&key))
        .arg("ok")
        .arg("z")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(matches!(store.claim(claim_req(&key, &fp)).await, Err(StoreError::Incompatible(_))));
}

#[tokio::test]
async fn fences_increase_after_the_counter_itself_is_gone() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("counter_gone", "{}");
    let Claim::Acquired { fence: first, .. } = store.claim(claim_req(&key, &fp)).await.unwrap()
    else {
        panic!("fresh key must be acquired")
    };
    store.forget(&key).await.unwrap();
    let mut raw = raw().await;
    let _: () = redis::cmd("DEL").arg(store.fence_key(&key)).query_async(&mut raw).await.unwrap();
    let Claim::Acquired { fence: second, .. } = store.claim(claim_req(&key, &fp)).await.unwrap()
    else {
        panic!("forgotten key must be acquired")
    };
    assert!(second > first, "{second:?} must be above {first:?}");
    // The stale owner cannot touch the new record.
    assert!(matches!(store.release(&key, first).await, Err(StoreError::LeaseLost)));
    assert!(matches!(store.release(&key, Fence(second.0 + 1)).await, Err(StoreError::LeaseLost)));
    store.release(&key, second).await.unwrap();
}

#[tokio::test]
async fn two_stores_on_one_server_see_one_record() {
    // Two stores are two processes as far as Redis can tell: separate connections.
    let (Some(a), Some(b)) = (store().await, store().await) else { return };
    let (key, fp) = fresh_key("two_stores", "{}");
    let Claim::Acquired { fence, .. } = a.claim(claim_req(&key, &fp)).await.unwrap() else {
        panic!("fresh key must be acquired")
    };
    assert!(
        matches!(b.claim(claim_req(&key, &fp)).await.unwrap(), Claim::InFlight { fence: f, .. } if f == fence)
    );
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.wait(&key, fence, Duration::from_secs(20)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.complete(&key, fence, &Outcome::Success("\"done\"".into()), LONG).await.unwrap();
    // Woken by pub/sub well before the 20 s max (the suite checks the bound; here: it returns).
    tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("woken").unwrap().unwrap();
    assert_eq!(
        b.claim(claim_req(&key, &fp)).await.unwrap(),
        Claim::Completed(idem_core::store::Record {
            fingerprint: fp,
            outcome: Outcome::Success("\"done\"".into())
        })
    );
}

#[tokio::test]
async fn unreachable_server_is_unavailable_with_the_cause() {
    // Port 1 is never a Redis server.
    let r = RedisStore::open("redis://127.0.0.1:1/").await;
    match r {
        Err(StoreError::Unavailable(cause)) => assert!(!cause.to_string().is_empty()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let lazy = RedisStore::builder("redis://127.0.0.1:1/").open_lazy().unwrap();
    let (key, fp) = fresh_key("unreachable", "{}");
    assert!(matches!(lazy.claim(claim_req(&key, &fp)).await, Err(StoreError::Unavailable(_))));
    assert!(matches!(RedisStore::open("not a url").await, Err(StoreError::Unavailable(_))));
}

#[tokio::test]
async fn prefixes_separate_stores_and_braces_are_refused() {
    let Some(a) = store().await else { return };
    let b = RedisStore::builder(redis_url()).prefix("idem-other").open().await.unwrap();
    let (key, fp) = fresh_key("prefix", "{}");
    assert!(matches!(a.claim(claim_req(&key, &fp)).await.unwrap(), Claim::Acquired { .. }));
    assert!(matches!(b.claim(claim_req(&key, &fp)).await.unwrap(), Claim::Acquired { .. }));
    assert!(b.record_key(&key).starts_with("idem-other:{"));
    let bad = RedisStore::builder(redis_url()).prefix("a{b}").open().await;
    match bad {
        Err(StoreError::Unavailable(why)) => assert!(why.to_string().contains("prefix"), "{why}"),
        other => panic!("a prefix with braces must be refused, got {other:?}"),
    }
}

/// complete publishes on a record someone waits on, and only then: `wait` flags the record (`w`),
/// and a record nobody waits on costs no message. Messages from one server arrive in order, so
/// the first message seen must be the watched key's, not the earlier unwatched completion.
#[tokio::test]
async fn complete_publishes_only_when_someone_waits() {
    use futures_util::StreamExt;
    let Some(store) = store().await else { return };
    let (quiet, fp) = fresh_key("publish_quiet", "{}");
    let (watched, _) = fresh_key("publish_watched", "{}");
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut sub = client.get_async_pubsub().await.expect("pub/sub connection");
    sub.subscribe(&[store.channel(&quiet), store.channel(&watched)]).await.unwrap();

    let quiet_fence = acquire(&store, &quiet, &fp).await;
    let fence = acquire(&store, &watched, &fp).await;
    let waiter = tokio::spawn({
        let (store, watched) = (store.clone(), watched);
        async move { store.wait(&watched, fence, Duration::from_secs(30)).await }
    });
    // Flagged once the waiter has subscribed and re-checked the record.
    let mut raw = raw().await;
    let flagged = async {
        loop {
            let w: Option<String> = redis::cmd("HGET")
                .arg(store.record_key(&watched))
                .arg("w")
                .query_async(&mut raw)
                .await
                .unwrap();
            if w.as_deref() == Some("1") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), flagged).await.expect("waiter flags the record");

    store.complete(&quiet, quiet_fence, &Outcome::Success("1".into()), LONG).await.unwrap();
    store.complete(&watched, fence, &Outcome::Success("2".into()), LONG).await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(10), sub.on_message().next())
        .await
        .expect("a message")
        .expect("stream open");
    assert_eq!(msg.get_channel_name(), store.channel(&watched));
    assert_eq!(msg.get_payload::<String>().unwrap(), "complete");
    tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("woken").unwrap().unwrap();
}

async fn acquire(store: &RedisStore, key: &idem_core::Key, fp: &idem_core::Fingerprint) -> Fence {
    match store.claim(claim_req(key, fp)).await.unwrap() {
        Claim::Acquired { fence, .. } => fence,
        other => panic!("a fresh key must be acquired, got {other:?}"),
    }
}

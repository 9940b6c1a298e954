//! The Redis store's common claim in native commands (`SET .. NX GET` with the fence counter,
//! `idem-core/src/store/redis/native.rs`): the fence it picks from its estimate of the server's
//! clock is still above every fence the key had, its lease is not shorter than asked, and a
//! replay comes back from the same command.
//! Run: cargo test --features redis --test redis_native

use std::time::Duration;

use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, Outcome, Record, RedisStore, Store};
use idem_tests::{claim_req, or_skip, redis_prefix, redis_url};

#[path = "shared/redis_records.rs"]
mod records;
use records::raw;

/// A store whose claims take the native path: its first claim has it sample the server's clock.
async fn warm_store() -> Option<RedisStore> {
    let store =
        or_skip("Redis", RedisStore::builder(redis_url()).prefix(redis_prefix()).open().await)?;
    let (key, fp) = fresh_key("native_warm_up", "{}");
    store.claim(claim_req(&key, &fp)).await.expect("warm-up claim");
    for _ in 0..200 {
        if store.native_ready() {
            return Some(store);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the Redis store never sampled the server's clock");
}

/// The server's clock in ms.
async fn server_ms(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    records::server_now(raw).await.0
}

/// The in-flight record's fields (see the Redis store's module docs).
async fn record_fields(store: &RedisStore, key: &idem_core::Key) -> Vec<String> {
    let raw = records::stored(&mut raw().await, &store.record_key(key)).await;
    raw.splitn(8, '|').map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_claim_starts_above_the_fence_counter() {
    let Some(store) = warm_store().await else { return };
    let (key, fp) = fresh_key("native_counter", "{}");
    // An earlier owner's fence far ahead of the server's clock (a clock that stepped back, or a
    // client whose estimate runs behind): the counter holds it after its record went away.
    let mut raw = raw().await;
    let ahead = server_ms(&mut raw).await * 1000 + 3_600_000_000;
    records::set(&mut raw, &store.fence_key(&key), ahead).await;
    match store.claim(claim_req(&key, &fp)).await {
        Ok(Claim::Acquired { fence, takeover: false }) => {
            assert!(fence.0 > ahead, "fence {} must be above the counter {ahead}", fence.0);
            // The record holds the fence the caller got.
            assert_eq!(record_fields(&store, &key).await[2], fence.0.to_string());
        }
        other => panic!("a fresh key must be acquired, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_release_and_forget() {
    let Some(store) = warm_store().await else { return };
    let (key, fp) = fresh_key("native_increase", "{}");
    let mut last = 0;
    for round in 0..20 {
        let Ok(Claim::Acquired { fence, .. }) = store.claim(claim_req(&key, &fp)).await else {
            panic!("round {round}: the free key must be acquired")
        };
        assert!(fence.0 > last, "round {round}: fence {} after {last}", fence.0);
        last = fence.0;
        if round % 2 == 0 {
            store.release(&key, fence).await.expect("release");
        } else {
            assert!(store.forget(&key).await.expect("forget"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_not_shorter_than_asked() {
    let Some(store) = warm_store().await else { return };
    let (key, fp) = fresh_key("native_lease", "{}");
    let mut raw = raw().await;
    let before = server_ms(&mut raw).await;
    let Ok(Claim::Acquired { .. }) = store.claim(claim_req(&key, &fp)).await else {
        panic!("a fresh key must be acquired")
    };
    let after = server_ms(&mut raw).await;
    let lease_end: u64 = record_fields(&store, &key).await[4].parse().expect("lease end");
    let lease = u64::try_from(LONG.as_millis()).unwrap();
    assert!(lease_end >= before + lease, "lease end {lease_end} before {before} + {lease}");
    // The estimate errs late by at most a sample's round trip (20 ms) and the drift since.
    assert!(lease_end <= after + lease + 100, "lease end {lease_end} past {after} + {lease}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_and_a_mismatch_come_from_the_same_command() {
    let Some(store) = warm_store().await else { return };
    let (key, fp) = fresh_key("native_replay", "{}");
    let Ok(Claim::Acquired { fence, .. }) = store.claim(claim_req(&key, &fp)).await else {
        panic!("a fresh key must be acquired")
    };
    let ok = Outcome::Success("{\"id\":\"ch_1\"}".into());
    store.complete(&key, fence, &ok, LONG).await.expect("complete");
    let replay = store.claim(claim_req(&key, &fp)).await.expect("replay");
    assert_eq!(replay, Claim::Completed(Record { fingerprint: fp, outcome: ok }));
    let (_, other) = fresh_key("native_replay_other", "{\"other\":1}");
    assert_eq!(store.claim(claim_req(&key, &other)).await.expect("mismatch"), Claim::Mismatch);
    // An in-flight record of another owner: the script answers (in flight, then mismatch).
    let (key, fp) = fresh_key("native_inflight", "{}");
    let Ok(Claim::Acquired { fence, .. }) = store.claim(claim_req(&key, &fp)).await else {
        panic!("a fresh key must be acquired")
    };
    match store.claim(claim_req(&key, &fp)).await {
        Ok(Claim::InFlight { fence: held, .. }) => assert_eq!(held, fence),
        other => panic!("held by the first claim, got {other:?}"),
    }
    assert_eq!(store.claim(claim_req(&key, &other)).await.expect("mismatch"), Claim::Mismatch);
}

/// A completion writes the record done under its fence with the outcome, when it completed (on
/// the server's clock) and the claim's origin, expiring after the retention, and leaves the fence
/// in the counter for the retention plus the grace; a completion under a fence that is not the
/// record's changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_writes_the_record_and_the_counter() {
    let Some(store) = warm_store().await else { return };
    let (key, fp) = fresh_key("native_complete", "{}");
    let origin = idem_core::store::Origin { tool: "charge|card", tenant: "t,1", run: "r%2" };
    let req = idem_core::store::ClaimRequest { origin, ..claim_req(&key, &fp) };
    let Ok(Claim::Acquired { fence, .. }) = store.claim(req).await else {
        panic!("a fresh key must be acquired")
    };
    let raw = raw().await;
    let mut clock = raw.clone();
    let get = |name: String| {
        let mut raw = raw.clone();
        async move {
            let v: Option<String> =
                redis::cmd("GET").arg(name).query_async(&mut raw).await.unwrap();
            v
        }
    };
    let in_flight = get(store.record_key(&key)).await.expect("in flight");
    let stale = idem_core::store::Fence(fence.0 + 1);
    let ok = Outcome::Success("{\"id\":\"a|b\"}".into());
    let retention = Duration::from_secs(600);
    assert!(matches!(
        store.complete(&key, stale, &ok, retention).await,
        Err(idem_core::store::StoreError::LeaseLost)
    ));
    assert_eq!(get(store.record_key(&key)).await.as_deref(), Some(in_flight.as_str()));
    assert_eq!(get(store.fence_key(&key)).await, None);

    let before = server_ms(&mut clock).await;
    store.complete(&key, fence, &ok, retention).await.expect("complete");
    let after = server_ms(&mut clock).await;
    let done = get(store.record_key(&key)).await.expect("completed");
    let fields: Vec<&str> = done.splitn(10, '|').collect();
    let fence_text = fence.0.to_string();
    assert_eq!(fields[..7], ["3", "d", fence_text.as_str(), "0", "", fp.as_str(), "s"], "{done}");
    let since: u64 = fields[7].parse().expect("since");
    assert!((before..=after).contains(&since), "since {since} outside {before}..={after}");
    // The origin as the claim stored it, escaped.
    assert_eq!(fields[8], in_flight.split('|').nth(8).unwrap());
    assert_eq!(fields[8], "ocharge%7Ccard,t%2C1,r%252");
    assert_eq!(fields[9], "{\"id\":\"a|b\"}");
    assert_eq!(get(store.fence_key(&key)).await, Some(fence_text));
    let pttl = |name: String| {
        let mut raw = raw.clone();
        async move {
            let t: i64 = redis::cmd("PTTL").arg(name).query_async(&mut raw).await.unwrap();
            u64::try_from(t).expect("an expiry")
        }
    };
    let (kept, counter) = (pttl(store.record_key(&key)).await, pttl(store.fence_key(&key)).await);
    let retention_ms = 600_000;
    assert!(kept <= retention_ms && kept > retention_ms - 10_000, "record PTTL {kept}");
    let grace = u64::try_from(idem_core::store::redis::FENCE_COUNTER_GRACE.as_millis()).unwrap();
    let expected = retention_ms + grace;
    assert!(counter <= expected && counter > expected - 10_000, "counter PTTL {counter}");
    assert_eq!(
        store.claim(claim_req(&key, &fp)).await.expect("replay"),
        Claim::Completed(Record { fingerprint: fp, outcome: ok })
    );
}

/// The completion's common case reads the record's header with one Lua pattern. An origin of
/// bytes the store never writes unescaped (UTF-8, NUL and control bytes, Lua's pattern
/// characters) is kept as it is, a lease that ended without a takeover is still its owner's to
/// complete, a waited-on record publishes its completion, and once another owner has taken the
/// record over, the first owner's completion is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_reads_any_header_bytes() {
    use futures_util::StreamExt;
    use idem_core::store::{Fence, OnExpired, StoreError};
    let Some(store) = warm_store().await else { return };
    let mut raw = raw().await;
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut sub = client.get_async_pubsub().await.expect("pub/sub connection");
    let ok = Outcome::Success("\"ok\"".into());
    let reader = raw.clone();
    let get = |name: String| {
        let mut raw = reader.clone();
        async move {
            let v: Option<Vec<u8>> =
                redis::cmd("GET").arg(name).query_async(&mut raw).await.unwrap();
            v
        }
    };
    let now = server_ms(&mut raw).await;
    let origins: [&[u8]; 4] =
        [b"o%-.[]^$()*+?,t%,r-", "oé,ß,運".as_bytes(), b"o\0,\x01\x7f,%", b""];
    for (i, origin) in origins.into_iter().enumerate() {
        for (w, lease_end) in [(1, now + 60_000), (0, now - 1_000)] {
            let (key, fp) = fresh_key("native_header_bytes", &format!("{i}-{w}"));
            let mut record = format!("3|f|17|{w}|{lease_end}|{fp}|someone|{now}|").into_bytes();
            record.extend_from_slice(origin);
            record.push(b'|');
            records::set(&mut raw, &store.record_key(&key), &record).await;
            if w == 1 {
                sub.subscribe(store.channel(&key)).await.unwrap();
            }
            store.complete(&key, Fence(17), &ok, LONG).await.expect("the fence's holder completes");
            let done = get(store.record_key(&key)).await.expect("completed");
            let fields: Vec<&[u8]> = done.splitn(10, |b| *b == b'|').collect();
            let head = format!("3|d|17|0||{fp}|s");
            assert_eq!(fields[..7].join(&b'|'), head.as_bytes(), "{i}");
            assert_eq!(fields[8], origin, "{i}: the origin as it was");
            assert_eq!(fields[9], b"\"ok\"");
            assert_eq!(
                store.claim(claim_req(&key, &fp)).await.expect("replay"),
                Claim::Completed(Record { fingerprint: fp, outcome: ok.clone() })
            );
            if w == 1 {
                let msg = tokio::time::timeout(Duration::from_secs(10), sub.on_message().next())
                    .await
                    .expect("a message")
                    .expect("stream open");
                assert_eq!(msg.get_channel_name(), store.channel(&key));
                assert_eq!(msg.get_payload::<String>().unwrap(), "complete");
                sub.unsubscribe(store.channel(&key)).await.unwrap();
            }
        }
    }

    // Taken over after its lease ended: the first owner's completion is refused.
    let (key, fp) = fresh_key("native_header_bytes", "taken over");
    let record = format!("3|f|17|0|{}|{fp}|someone|{now}|o%-.[],t,r|", now - 1_000);
    records::set(&mut raw, &store.record_key(&key), record).await;
    let req =
        idem_core::store::ClaimRequest { on_expired: OnExpired::TakeOver, ..claim_req(&key, &fp) };
    let Ok(Claim::Acquired { fence, takeover: true }) = store.claim(req).await else {
        panic!("an ended lease must be taken over")
    };
    assert!(fence > Fence(17));
    let taken = get(store.record_key(&key)).await.expect("in flight");
    let got = store.complete(&key, Fence(17), &ok, LONG).await;
    assert!(matches!(got, Err(StoreError::LeaseLost)), "{got:?}");
    assert_eq!(get(store.record_key(&key)).await.as_deref(), Some(&taken[..]));
    store.complete(&key, fence, &Outcome::Success("2".into()), LONG).await.expect("new owner");
    assert_eq!(
        store.claim(claim_req(&key, &fp)).await.expect("replay"),
        Claim::Completed(Record { fingerprint: fp, outcome: Outcome::Success("2".into()) })
    );
}

/// A second store on the same server and prefix: another process, without this one's hint of
/// recently completed keys.
async fn other_process() -> RedisStore {
    RedisStore::builder(redis_url()).prefix(redis_prefix()).open().await.expect("second store")
}

/// A claim of a key this store saw completed reads the record first (one `GET`). Whatever
/// changed since, in another process, the answer is the one the claim itself would give:
/// the replay while it is completed; a fresh acquisition once forgotten; the live owner once
/// another claim holds it; a mismatch for other arguments. Never the stale replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recently_completed_key_answers_as_the_claim_would() {
    let Some(store) = warm_store().await else { return };
    let other = other_process().await;
    let (key, fp) = fresh_key("recent_hint", "{}");
    let done = Outcome::Success("\"paid\"".into());
    let fence = idem_tests::acquire(&store, &key, &fp).await;
    store.complete(&key, fence, &done, LONG).await.expect("complete");
    let replay = Claim::Completed(Record { fingerprint: fp, outcome: done.clone() });
    assert_eq!(store.claim(claim_req(&key, &fp)).await.expect("replay"), replay);
    assert_eq!(store.claim(claim_req(&key, &fp)).await.expect("replay again"), replay);
    // Other arguments under the same key.
    let (_, other_fp) = fresh_key("recent_hint", r#"{"amount":2}"#);
    assert_ne!(other_fp, fp);
    assert_eq!(store.claim(claim_req(&key, &other_fp)).await.expect("mismatch"), Claim::Mismatch);

    // Forgotten by an operator elsewhere, then claimed and held there.
    assert!(other.forget(&key).await.expect("forget"));
    let held = idem_tests::acquire(&other, &key, &fp).await;
    match store.claim(claim_req(&key, &fp)).await {
        Ok(Claim::InFlight { fence, .. }) => assert_eq!(fence, held, "the live owner's fence"),
        got => panic!("a key held elsewhere is in flight here, got {got:?}"),
    }
    other.release(&key, held).await.expect("release");
    // Absent now: this store acquires it, with a fence above the earlier ones.
    match store.claim(claim_req(&key, &fp)).await {
        Ok(Claim::Acquired { fence: again, .. }) => {
            assert!(again.0 > held.0, "fence {} after {}", again.0, held.0)
        }
        got => panic!("a forgotten and released key is acquired, got {got:?}"),
    }
}

/// The same after the record was forgotten in another process and nothing else happened: the
/// `GET` finds no record and the claim acquires; the hint does not replay what is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_key_is_not_replayed_from_the_hint() {
    let Some(store) = warm_store().await else { return };
    let other = other_process().await;
    let (key, fp) = fresh_key("recent_forgotten", "{}");
    let fence = idem_tests::acquire(&store, &key, &fp).await;
    store.complete(&key, fence, &Outcome::Success("1".into()), LONG).await.expect("complete");
    assert!(other.forget(&key).await.expect("forget"));
    assert!(
        matches!(store.claim(claim_req(&key, &fp)).await, Ok(Claim::Acquired { .. })),
        "a forgotten key runs again"
    );
}

/// A cluster URL for one server: opening says the server is not a cluster (configuration), not
/// that it is unreachable or that a record or schema is incompatible.
#[tokio::test]
async fn a_cluster_url_for_one_server_is_a_configuration_error() {
    use idem_core::store::StoreError;
    let url = redis_url();
    let Some(rest) = url.strip_prefix("redis://") else {
        eprintln!("SKIP: IDEM_REDIS_URL is not a redis:// URL");
        return;
    };
    // Reachable, as the plain URL shows; refused at open, saying what to write instead.
    or_skip("Redis", RedisStore::builder(url.clone()).prefix(redis_prefix()).open().await);
    let cluster = format!("redis+cluster://{rest}");
    match RedisStore::builder(cluster).prefix(redis_prefix()).open().await {
        Err(StoreError::InvalidConfig(m)) => {
            assert!(m.contains("does not act as a Redis Cluster"), "{m}");
            assert!(m.contains("redis://host:port"), "{m}");
        }
        other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
    }
}

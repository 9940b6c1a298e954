//! Records written by schema version 1 of the Redis store (a hash) against the current store
//! (`IDEM_REDIS_URL`, default `redis://127.0.0.1:6379/`): migrated by the first step that meets
//! them.

use std::time::Duration;

use idem_core::StoreError;
use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, Fence, Outcome, Store};
use idem_tests::claim_req;

#[path = "shared/redis_records.rs"]
mod redis_records;
use redis_records::{field, pttl, raw, server_now, store, stored, write_v1};

/// Records written by schema version 1 (a hash) are migrated by the first step that meets them.
#[tokio::test]
async fn v1_completed_record_replays() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let other = idem_core::conformance::other_fingerprint();
    for (ok, payload, outcome) in [
        ("s", "\"paid|1\"", Outcome::Success("\"paid|1\"".into())),
        ("f", "{\"declined\":true}", Outcome::Failure("{\"declined\":true}".into())),
        ("u", "", Outcome::Unknown),
    ] {
        let (key, fp) = fresh_key("v1_completed", ok);
        let rec = store.record_key(&key);
        #[rustfmt::skip]
        write_v1(&mut raw, &rec, &[
            ("st", "d".into()), ("fence", "1700000000000000".into()), ("fp", fp.to_string()),
            ("lu", "1700000000000".into()), ("ok", ok.into()), ("p", payload.into()),
        ]).await;
        let _: () =
            redis::cmd("PEXPIRE").arg(&rec).arg(60_000).query_async(&mut raw).await.unwrap();
        let want = Claim::Completed(idem_core::store::Record { fingerprint: fp, outcome });
        assert_eq!(store.claim(claim_req(&key, &fp)).await.unwrap(), want, "v1 ok={ok}");
        // Migrated: a string now, with the hash's expiry.
        let record = stored(&mut raw, &rec).await;
        assert_eq!(record, format!("3|d|1700000000000000|0||{fp}|{ok}|||{payload}"));
        let left = pttl(&mut raw, &rec).await;
        assert!(left > 0 && left <= 60_000, "the migrated record keeps its expiry: {left}");
        assert_eq!(store.claim(claim_req(&key, &fp)).await.unwrap(), want);
        assert_eq!(store.claim(claim_req(&key, &other)).await.unwrap(), Claim::Mismatch);
    }
    // A v1 hash that is not a valid record is refused and left as it is.
    let (key, fp) = fresh_key("v1_completed", "bad kind");
    let rec = store.record_key(&key);
    #[rustfmt::skip]
    write_v1(&mut raw, &rec, &[
        ("st", "d".into()), ("fence", "17".into()), ("fp", fp.to_string()), ("ok", "z".into()),
        ("p", "1".into()),
    ]).await;
    match store.claim(claim_req(&key, &fp)).await {
        Err(StoreError::Incompatible(why)) => assert!(why.contains("schema version 1"), "{why}"),
        other => panic!("a malformed v1 record must be Incompatible, got {other:?}"),
    }
    let kind: String = redis::cmd("TYPE").arg(&rec).query_async(&mut raw).await.unwrap();
    assert_eq!(kind, "hash");
    store.forget(&key).await.unwrap();
}

/// A v1 in-flight record keeps its fence whichever step meets it first: a stale or other fence
/// gets `LeaseLost`, the holder's fence completes, and a takeover starts above it. The fences
/// are set above the server's clock so that only the record can explain the answers.
#[tokio::test]
async fn v1_in_flight_record_keeps_its_fence() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (now_ms, now_us) = server_now(&mut raw).await;
    let fence = Fence(now_us + 3_600_000_000);
    let stale = Fence(fence.0 - 1);
    let newer = Fence(fence.0 + 1);
    for first in ["claim", "complete", "release", "renew", "wait", "takeover", "forget"] {
        let (key, fp) = fresh_key("v1_in_flight", first);
        let rec = store.record_key(&key);
        let lease_end = if first == "takeover" { now_ms - 1 } else { now_ms + 60_000 };
        #[rustfmt::skip]
        write_v1(&mut raw, &rec, &[
            ("st", "f".into()), ("fence", fence.0.to_string()), ("fp", fp.to_string()),
            ("lu", lease_end.to_string()), ("w", "0".into()),
        ]).await;
        let done = Outcome::Success(format!("\"{first}\""));
        match first {
            "claim" => match store.claim(claim_req(&key, &fp)).await.unwrap() {
                Claim::InFlight { fence: f, lease_remaining } => {
                    assert_eq!(f, fence);
                    assert!(lease_remaining > Duration::from_secs(50), "{lease_remaining:?}");
                }
                other => panic!("a v1 in-flight record must be InFlight, got {other:?}"),
            },
            "complete" => {
                for f in [stale, newer] {
                    let r = store.complete(&key, f, &done, LONG).await;
                    assert!(matches!(r, Err(StoreError::LeaseLost)), "{f:?}: {r:?}");
                }
            }
            "release" => {
                for f in [stale, newer] {
                    let r = store.release(&key, f).await;
                    assert!(matches!(r, Err(StoreError::LeaseLost)), "{f:?}: {r:?}");
                }
            }
            "renew" => {
                let r = store.renew(&key, stale, LONG).await;
                assert!(matches!(r, Err(StoreError::LeaseLost)), "{r:?}");
                store.renew(&key, fence, LONG).await.unwrap();
            }
            // Returns at once: the lease runs for a minute, `max` is short.
            "wait" => store.wait(&key, fence, Duration::from_millis(50)).await.unwrap(),
            "takeover" => {
                match store.claim(claim_req(&key, &fp)).await.unwrap() {
                    Claim::Acquired { fence: f, takeover: true } => {
                        assert_eq!(f, newer, "a takeover starts above the record's fence")
                    }
                    other => panic!("an expired v1 record must be taken over, got {other:?}"),
                }
                let r = store.complete(&key, fence, &done, LONG).await;
                assert!(matches!(r, Err(StoreError::LeaseLost)), "{r:?}");
                store.complete(&key, newer, &done, LONG).await.unwrap();
                let want =
                    Claim::Completed(idem_core::store::Record { fingerprint: fp, outcome: done });
                assert_eq!(store.claim(claim_req(&key, &fp)).await.unwrap(), want);
                continue;
            }
            "forget" => {
                // The v1 record's fence goes to the counter: the next fence is above it.
                idem_tests::assert_answer!(store.forget(&key).await, Ok(true));
                let counter: String = redis::cmd("GET")
                    .arg(store.fence_key(&key))
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                assert_eq!(counter, fence.0.to_string());
                match store.claim(claim_req(&key, &fp)).await.unwrap() {
                    Claim::Acquired { fence: f, takeover: false } => assert_eq!(f, newer),
                    other => panic!("a forgotten key must be acquired, got {other:?}"),
                }
                store.release(&key, newer).await.unwrap();
                continue;
            }
            _ => unreachable!(),
        }
        let record = stored(&mut raw, &rec).await;
        assert_eq!(
            field(&record, 0),
            idem_core::store::redis::SCHEMA_VERSION,
            "{first} migrates the record: {record}"
        );
        assert_eq!(field(&record, 2), fence.0.to_string(), "{first} keeps the fence: {record}");
        assert_eq!(pttl(&mut raw, &rec).await, -1, "an in-flight record has no expiry");
        store.complete(&key, fence, &done, LONG).await.unwrap();
        let want = Claim::Completed(idem_core::store::Record { fingerprint: fp, outcome: done });
        assert_eq!(store.claim(claim_req(&key, &fp)).await.unwrap(), want, "after {first}");
    }
}

/// A listing shows a v1 record as the record it is (migrating it, as `inspect` and every step
/// do), and reports a hash that is not a valid v1 record as unreadable, leaving it as it is.
#[tokio::test]
async fn v1_records_are_listed_not_reported_unreadable() {
    use idem_core::store::{ListQuery, RecordState, RedisStore};
    let prefix = format!("{}-listing", idem_tests::redis_prefix());
    let Some(store) = idem_tests::or_skip(
        "Redis",
        RedisStore::builder(idem_tests::redis_url()).prefix(prefix).open().await,
    ) else {
        return;
    };
    let mut raw = raw().await;
    let (good, fp) = fresh_key("v1_listed", "good");
    #[rustfmt::skip]
    write_v1(&mut raw, &store.record_key(&good), &[
        ("st", "d".into()), ("fence", "1700000000000000".into()), ("fp", fp.to_string()),
        ("lu", "1700000000000".into()), ("ok", "s".into()), ("p", "\"paid\"".into()),
    ]).await;
    let (bad, fp) = fresh_key("v1_listed", "bad");
    #[rustfmt::skip]
    write_v1(&mut raw, &store.record_key(&bad), &[
        ("st", "d".into()), ("fence", "17".into()), ("fp", fp.to_string()), ("ok", "z".into()),
        ("p", "1".into()),
    ]).await;

    let page = store.list(&ListQuery::default()).await.expect("list");
    let listed: Vec<_> = page.records.iter().map(|r| (r.key, r.state.clone())).collect();
    assert_eq!(listed, [(good, RecordState::Done(Outcome::Success("\"paid\"".into())))]);
    let unreadable: Vec<&str> = page.unreadable.iter().map(|u| u.key.as_str()).collect();
    assert_eq!(unreadable, [bad.as_str()], "{:?}", page.unreadable);
    assert!(page.unreadable[0].reason.contains("schema version 1"), "{:?}", page.unreadable);
    let migrated = stored(&mut raw, &store.record_key(&good)).await;
    assert!(migrated.starts_with("3|d|1700000000000000|"), "{migrated}");
    let kind: String =
        redis::cmd("TYPE").arg(store.record_key(&bad)).query_async(&mut raw).await.unwrap();
    assert_eq!(kind, "hash", "the bad one is left as it is");
    for key in [good, bad] {
        store.forget(&key).await.unwrap();
    }
}

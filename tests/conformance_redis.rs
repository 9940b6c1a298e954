//! The store conformance suite against Redis (`IDEM_REDIS_URL`, default
//! `redis://127.0.0.1:6379/`), plus what only Redis has: the key layout for Redis Cluster, records
//! of another schema version, and keys of another type.

use std::time::Duration;

use idem_core::StoreError;
use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, Fence, Outcome, RedisStore, Store};
use idem_tests::cluster::slot;
use idem_tests::{acquire, claim_req, redis_url};

#[path = "shared/redis_records.rs"]
mod redis_records;
use redis_records::{field, pttl, raw, refused_by_every_step, server_now, set, store, stored};

idem_core::store_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await.map(Box::new)
);

idem_core::store_admin_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await.map(Box::new)
);

/// Two stores on one server with the same prefix, each with its own connections and pub/sub.
async fn pair() -> Option<(Box<RedisStore>, Box<RedisStore>)> {
    Some((Box::new(store().await?), Box::new(store().await?)))
}

idem_core::store_multi_instance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    pair().await
);

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
    let mut raw = raw().await;
    for (state, done) in [("completed", true), ("in flight", false)] {
        let (key, fp) = fresh_key("schema", state);
        let fence = acquire(&store, &key, &fp).await;
        if done {
            store.complete(&key, fence, &Outcome::Success("42".into()), LONG).await.unwrap();
        }
        // A future version rewrote the record.
        let rec = store.record_key(&key);
        let v3 = stored(&mut raw, &rec).await;
        assert_eq!(field(&v3, 0), idem_core::store::redis::SCHEMA_VERSION);
        set(&mut raw, &rec, &format!("4{}", &v3[1..])).await;
        match store.claim(claim_req(&key, &fp)).await {
            Err(StoreError::Incompatible(why)) => {
                assert!(why.contains("schema version 4"), "{why}")
            }
            other => panic!("a v4 {state} record must be Incompatible, got {other:?}"),
        }
        refused_by_every_step(&store, &key, fence, "schema version 4").await;
    }
    // A hash that is not a version 1 record is not migrated: refused, and left as it is.
    let (key, _) = fresh_key("schema", "hash");
    let rec = store.record_key(&key);
    let _: () = redis::cmd("HSET")
        .arg(&rec)
        .arg("v")
        .arg("3")
        .arg("st")
        .arg("d")
        .query_async(&mut raw)
        .await
        .unwrap();
    let fp = idem_core::conformance::other_fingerprint();
    idem_tests::assert_answer!(
        store.claim(claim_req(&key, &fp)).await,
        Err(StoreError::Incompatible(_))
    );
    let kind: String = redis::cmd("TYPE").arg(&rec).query_async(&mut raw).await.unwrap();
    assert_eq!(kind, "hash", "a record of an unknown version must be left as it is");
    refused_by_every_step(&store, &key, Fence(1), "hash of schema version 3").await;
}

#[tokio::test]
async fn key_of_another_type_is_refused() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (key, _) = fresh_key("wrongtype", "list");
    let _: () = redis::cmd("RPUSH")
        .arg(store.record_key(&key))
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    refused_by_every_step(&store, &key, Fence(1), "list").await;
    // Records are strings, but not every string is a record.
    let (key, _) = fresh_key("wrongtype", "string");
    set(&mut raw, &store.record_key(&key), "x").await;
    refused_by_every_step(&store, &key, Fence(1), "string that is not an idem record").await;
}

#[tokio::test]
async fn record_of_unknown_outcome_kind_is_refused() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("kind", "{}");
    let fence = acquire(&store, &key, &fp).await;
    store.complete(&key, fence, &Outcome::Success("1".into()), LONG).await.unwrap();
    let mut raw = raw().await;
    let rec = store.record_key(&key);
    let record = stored(&mut raw, &rec).await;
    let mut fields: Vec<&str> = record.splitn(8, '|').collect();
    assert_eq!(fields[6], "s");
    fields[6] = "z";
    set(&mut raw, &rec, &fields.join("|")).await;
    match store.claim(claim_req(&key, &fp)).await {
        Err(StoreError::Incompatible(why)) => assert!(why.contains("outcome kind"), "{why}"),
        other => panic!("an unknown outcome kind must be Incompatible, got {other:?}"),
    }
}

/// The claim script hands a completed record to the client as it is stored; the client checks
/// every field. A malformed record is `Incompatible`, never a replay and never a panic.
#[tokio::test]
async fn malformed_completed_records_are_refused_not_replayed() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (_, fp) = fresh_key("malformed", "{}");
    let fp = fp.to_string();
    let upper = fp.to_uppercase();
    let cases: Vec<(String, &str)> = vec![
        ("2|d|".to_owned(), "fewer than 8 fields"),
        ("2|d|17|0||".to_owned(), "fewer than 8 fields"),
        (format!("2|d|17|0||{fp}|s"), "fewer than 8 fields"),
        (format!("2|d||0||{fp}|s|1"), "fence"),
        (format!("2|d|1x|0||{fp}|s|1"), "fence"),
        (format!("2|d|17|2||{fp}|s|1"), "waited-on flag"),
        (format!("2|d|17|0|9z|{fp}|s|1"), "lease end"),
        ("2|d|17|0||abc|s|1".to_owned(), "fingerprint"),
        (format!("2|d|17|0||{upper}|s|1"), "fingerprint"),
        (format!("2|d|17|0||{fp}0|s|1"), "fingerprint"),
        (format!("2|d|17|0||{fp}||1"), "outcome kind"),
        (format!("2|d|17|0||{fp}|ss|1"), "outcome kind"),
        // In flight: the script reads the header itself.
        (format!("2|f|17|0|x|{fp}||"), "malformed"),
        (format!("2|x|17|0||{fp}|s|1"), "malformed"),
        ("2".to_owned(), "not an idem record"),
        (String::new(), "not an idem record"),
    ];
    for (record, why) in cases {
        let (key, fp) = fresh_key("malformed", "{}");
        set(&mut raw, &store.record_key(&key), &record).await;
        match store.claim(claim_req(&key, &fp)).await {
            Err(StoreError::Incompatible(msg)) => {
                assert!(msg.contains(why), "{record:?}: {msg:?} must say {why:?}")
            }
            other => panic!("{record:?} must be Incompatible ({why}), got {other:?}"),
        }
    }
    // A payload that is not UTF-8.
    let (key, fp) = fresh_key("malformed", "{}");
    let mut record = format!("2|d|17|0||{fp}|s|").into_bytes();
    record.extend_from_slice(b"\"\xff\"");
    set(&mut raw, &store.record_key(&key), record).await;
    match store.claim(claim_req(&key, &fp)).await {
        Err(StoreError::Incompatible(msg)) => assert!(msg.contains("UTF-8"), "{msg}"),
        other => panic!("a payload that is not UTF-8 must be Incompatible, got {other:?}"),
    }
    // Well formed: the payload is everything after the seventh `|`, and may contain `|`.
    let (key, fp) = fresh_key("malformed", "{}");
    set(&mut raw, &store.record_key(&key), &format!("2|d|17|1|123|{fp}|f|\"a|b||\"")).await;
    assert_eq!(
        store.claim(claim_req(&key, &fp)).await.unwrap(),
        Claim::Completed(idem_core::store::Record {
            fingerprint: fp,
            outcome: Outcome::Failure("\"a|b||\"".into())
        })
    );
    let other = idem_core::conformance::other_fingerprint();
    assert_eq!(store.claim(claim_req(&key, &other)).await.unwrap(), Claim::Mismatch);
}

/// A record is one string: in flight without expiry, completed with its retention set by the
/// write that completes it (so expiry removes it whole), its fence kept by the counter for the
/// retention plus the grace.
#[tokio::test]
async fn record_layout_and_expiry() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (key, fp) = fresh_key("layout", "{}");
    let fence = acquire(&store, &key, &fp).await;
    let rec = store.record_key(&key);
    let record = stored(&mut raw, &rec).await;
    assert_eq!(
        record,
        format!(
            "3|f|{}|0|{}|{fp}|{}|{}|{}|",
            fence.0,
            field(&record, 4),
            field(&record, 6),
            field(&record, 7),
            field(&record, 8)
        )
    );
    assert!(field(&record, 4).parse::<u64>().is_ok(), "{record}");
    let owner = field(&record, 6);
    assert!(
        owner.len() == 32 && owner.bytes().all(|b| b.is_ascii_hexdigit()),
        "in flight, the seventh field is the claim's owner token: {record}"
    );
    assert_eq!(pttl(&mut raw, &rec).await, -1, "an in-flight record has no expiry");
    store.complete(&key, fence, &Outcome::Success("\"x|y\"".into()), LONG).await.unwrap();
    let done = stored(&mut raw, &rec).await;
    assert!(field(&done, 7).parse::<u64>().is_ok(), "since, in ms: {done}");
    assert_eq!(
        done,
        format!("3|d|{}|0||{fp}|s|{}|{}|\"x|y\"", fence.0, field(&done, 7), field(&record, 8))
    );
    let left = pttl(&mut raw, &rec).await;
    assert!(left > 0 && left <= 30_000, "a completed record expires with its retention: {left}");
    let counter = pttl(&mut raw, &store.fence_key(&key)).await;
    let grace = i64::try_from(idem_core::store::redis::FENCE_COUNTER_GRACE.as_millis()).unwrap();
    assert!(counter > grace && counter <= grace + 30_000, "counter ttl {counter}");
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
    idem_tests::assert_answer!(store.release(&key, first).await, Err(StoreError::LeaseLost));
    idem_tests::assert_answer!(
        store.release(&key, Fence(second.0 + 1)).await,
        Err(StoreError::LeaseLost)
    );
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
    idem_tests::assert_answer!(b.claim(claim_req(&key, &fp)).await.unwrap(), Claim::InFlight { fence: f, .. } if f == fence);
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
        Err(StoreError::Unavailable(cause)) => assert!(!cause.to_string().is_empty(), "{}", cause),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let lazy = RedisStore::builder("redis://127.0.0.1:1/").open_lazy().unwrap();
    let (key, fp) = fresh_key("unreachable", "{}");
    idem_tests::assert_answer!(
        lazy.claim(claim_req(&key, &fp)).await,
        Err(StoreError::Unavailable(_))
    );
    // A malformed URL is a configuration error, not an outage.
    idem_tests::assert_answer!(
        RedisStore::open("not a url").await,
        Err(StoreError::InvalidConfig(_))
    );
}

/// A server that accepts connections and never answers (hung, or a half-open proxy): opening
/// fails within the timeouts and says that nothing answered, and a call on a lazy store fails
/// closed the same way. Needs no Redis.
#[tokio::test]
async fn a_server_that_never_answers_is_named_as_such() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("redis://{}/", silent.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let builder = || {
        RedisStore::builder(&url)
            .connection_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300))
    };
    // A hang would be the fault itself: the guard only turns one into a failure.
    let guard = Duration::from_secs(60);
    match tokio::time::timeout(guard, builder().open()).await.expect("open must end") {
        Err(StoreError::Unavailable(m)) => {
            let m = m.to_string();
            assert!(m.contains("did not answer within 300 ms"), "{m}");
            assert!(m.contains("not answering"), "{m}");
        }
        other => panic!("a silent server is Unavailable, got {:?}", other.map(|_| ())),
    }
    let lazy = builder().open_lazy().expect("lazy");
    let (key, fp) = fresh_key("silent_server", "{}");
    match tokio::time::timeout(guard, lazy.claim(claim_req(&key, &fp))).await.expect("ends") {
        Err(StoreError::Unavailable(m)) => {
            assert!(m.to_string().contains("did not answer"), "{m}")
        }
        other => panic!("a claim on a silent server is Unavailable, got {other:?}"),
    }
    held.abort();
}

#[tokio::test]
async fn prefixes_separate_stores_and_braces_are_refused() {
    let Some(a) = store().await else { return };
    let b = RedisStore::builder(redis_url()).prefix("idem-other").open().await.unwrap();
    let (key, fp) = fresh_key("prefix", "{}");
    idem_tests::assert_answer!(
        a.claim(claim_req(&key, &fp)).await.unwrap(),
        Claim::Acquired { .. }
    );
    idem_tests::assert_answer!(
        b.claim(claim_req(&key, &fp)).await.unwrap(),
        Claim::Acquired { .. }
    );
    assert!(b.record_key(&key).starts_with("idem-other:{"), "{}", b.record_key(&key));
    let bad = RedisStore::builder(redis_url()).prefix("a{b}").open().await;
    match bad {
        Err(StoreError::InvalidConfig(why)) => assert!(why.contains("prefix"), "{why}"),
        other => panic!("a prefix with braces must be refused, got {other:?}"),
    }
}

/// complete, release and forget publish on a record someone waits on (on the channel `wait`
/// subscribes to, `RedisStore::channel`), and complete and release only then: `wait` flags the
/// record (`w`), and a record nobody waits on costs no message. Messages from one server arrive
/// in order, so the first message seen must be the watched key's, not the earlier unwatched one.
#[tokio::test]
async fn ending_a_lease_publishes_only_when_someone_waits() {
    use futures_util::StreamExt;
    let Some(store) = store().await else { return };
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut sub = client.get_async_pubsub().await.expect("pub/sub connection");
    let mut raw = raw().await;
    for end in ["complete", "release", "forget"] {
        let (quiet, fp) = fresh_key("publish_quiet", end);
        let (watched, _) = fresh_key("publish_watched", end);
        sub.subscribe(&[store.channel(&quiet), store.channel(&watched)]).await.unwrap();
        let quiet_fence = acquire(&store, &quiet, &fp).await;
        let fence = acquire(&store, &watched, &fp).await;
        let waiter = tokio::spawn({
            let (store, watched) = (store.clone(), watched);
            async move { store.wait(&watched, fence, Duration::from_secs(30)).await }
        });
        // Flagged once the waiter has subscribed and re-checked the record.
        let flagged = async {
            while field(&stored(&mut raw, &store.record_key(&watched)).await, 3) != "1" {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), flagged).await.expect("waiter flags it");

        let ok = Outcome::Success("1".into());
        match end {
            "complete" => {
                store.complete(&quiet, quiet_fence, &ok, LONG).await.unwrap();
                store.complete(&watched, fence, &ok, LONG).await.unwrap();
            }
            "release" => {
                store.release(&quiet, quiet_fence).await.unwrap();
                store.release(&watched, fence).await.unwrap();
            }
            _ => {
                // An operator's forget always publishes: only the watched key is forgotten.
                store.release(&quiet, quiet_fence).await.unwrap();
                idem_tests::assert_answer!(store.forget(&watched).await, Ok(true));
            }
        }
        let msg = tokio::time::timeout(Duration::from_secs(10), sub.on_message().next())
            .await
            .expect("a message")
            .expect("stream open");
        assert_eq!(msg.get_channel_name(), store.channel(&watched), "{end}");
        assert_eq!(msg.get_payload::<String>().unwrap(), end);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .unwrap()
            .unwrap();
        sub.unsubscribe(&[store.channel(&quiet), store.channel(&watched)]).await.unwrap();
    }
}

#[path = "shared/executor.rs"]
mod executor;

/// Two executors, each with its own store on one server (as two processes).
async fn two_stores() -> Option<(std::sync::Arc<dyn Store>, std::sync::Arc<dyn Store>)> {
    Some((std::sync::Arc::new(store().await?), std::sync::Arc::new(store().await?)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_duplicates_across_processes_run_once() {
    let Some((a, b)) = two_stores().await else { return };
    executor::duplicates_across_executors_run_once(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_crashed_holder_is_taken_over() {
    let Some((a, b)) = two_stores().await else { return };
    executor::crashed_holder_is_taken_over(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_churn() {
    let mut stores: Vec<std::sync::Arc<dyn Store>> = Vec::new();
    for _ in 0..4 {
        let Some(store) = store().await else { return };
        stores.push(std::sync::Arc::new(store));
    }
    executor::mutual_exclusion_under_churn(stores).await;
}

/// Records written by schema version 2 (no origin, no since) still work after the upgrade: an
/// in-flight one is completed by its owner, and both read with origin and age unknown.
#[tokio::test]
async fn v2_records_read_with_origin_unknown() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (key, fp) = fresh_key("v2_records", "done");
    set(&mut raw, &store.record_key(&key), &format!("2|d|17|0||{fp}|s|\"a|b\"")).await;
    let info = store.inspect(&key).await.unwrap().expect("a v2 record inspects");
    assert_eq!((info.origin, info.age, info.fence), (None, None, Fence(17)));
    assert_eq!(info.state, idem_core::store::RecordState::Done(Outcome::Success("\"a|b\"".into())));
    let (key, fp) = fresh_key("v2_records", "in flight");
    let (now, _) = server_now(&mut raw).await;
    let lease_end = now + 60_000;
    set(&mut raw, &store.record_key(&key), &format!("2|f|17|0|{lease_end}|{fp}||")).await;
    let info = store.inspect(&key).await.unwrap().expect("a v2 record inspects");
    assert_eq!((info.origin.clone(), info.age), (None, None));
    assert!(matches!(info.state, idem_core::store::RecordState::InFlight { .. }), "{info:?}");
    store.complete(&key, Fence(17), &Outcome::Success("1".into()), LONG).await.unwrap();
    let info = store.inspect(&key).await.unwrap().expect("completed");
    assert_eq!(info.origin, None, "completing a v2 record keeps its origin unknown");
    assert!(info.age.is_some(), "completed by this version: since is known");
    assert_eq!(
        store.claim(claim_req(&key, &fp)).await.unwrap(),
        Claim::Completed(idem_core::store::Record {
            fingerprint: fp,
            outcome: Outcome::Success("1".into())
        })
    );
}

/// A listing's cursor is checked: one this store did not make is refused, and one at the end of
/// the scan ends the listing.
#[tokio::test]
async fn listing_cursors_are_checked() {
    let Some(store) = store().await else { return };
    let list = |cursor: &str| {
        let q = idem_core::store::ListQuery { cursor: Some(cursor.into()), ..Default::default() };
        let store = store.clone();
        async move { store.list(&q).await }
    };
    for bad in ["nonsense", "10.9.9.9:1;0;", ";x;"] {
        assert!(
            matches!(list(bad).await, Err(StoreError::InvalidCursor(c)) if c == bad),
            "{bad:?}"
        );
    }
    let end = list(";end;").await.expect("the end of the scan");
    assert_eq!((end.records.len(), end.next), (0, None));
}

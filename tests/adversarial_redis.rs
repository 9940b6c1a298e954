//! Adversarial tests of the Redis store (schema 2: one string per record, Lua scripts).
//! Run: cargo test --all-features --test adversarial_redis

use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, ClaimRequest, Fence, OnExpired, Outcome, Record, RedisStore, Store};
use idem_tests::{acquire, claim_req, or_skip, redis_prefix, redis_url};

#[path = "shared/adversarial.rs"]
mod adversarial;

async fn store() -> Option<RedisStore> {
    or_skip("Redis", RedisStore::builder(redis_url()).prefix(redis_prefix()).open().await)
}

async fn raw() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).expect("redis url");
    client.get_multiplexed_async_connection().await.expect("raw redis connection")
}

async fn set(raw: &mut redis::aio::MultiplexedConnection, key: &str, value: &[u8]) {
    let _: () = redis::cmd("SET").arg(key).arg(value).query_async(raw).await.unwrap();
}

async fn get(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET").arg(key).query_async(raw).await.unwrap()
}

// ---------------------------------------------------------------------------------------------
// What held when written
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_round_trip() {
    let Some(store) = store().await else { return };
    let big = format!("\"{}\"", "x|\n".repeat(3 * 1024 * 1024));
    let payloads = [
        "\"a|b|c\"".to_owned(),
        "|".to_owned(),
        "||||||||".to_owned(),
        "2|d|1|0||ab|s|x".to_owned(),
        "\"line\nbreak\r\n\"".to_owned(),
        "\"nul\u{0}byte\"".to_owned(),
        "\"ünïcødé ✓ 🎉 \u{10FFFF}\"".to_owned(),
        String::new(),
        big,
    ];
    for p in payloads {
        for outcome in [Outcome::Success(p.clone()), Outcome::Failure(p.clone())] {
            let (key, fp) = fresh_key("payloads", "{}");
            let fence = acquire(&store, &key, &fp).await;
            store.complete(&key, fence, &outcome, LONG).await.unwrap();
            let got = store.claim(claim_req(&key, &fp)).await.unwrap();
            assert!(
                got == Claim::Completed(Record { fingerprint: fp, outcome: outcome.clone() }),
                "payload of {} bytes did not round-trip",
                p.len()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_fences_are_lease_lost() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("extreme_fences", "{}");
    let fence = acquire(&store, &key, &fp).await;
    for f in
        [Fence(0), Fence(u64::MAX), Fence(i64::MAX as u64), Fence(fence.0 + 1), Fence(fence.0 - 1)]
    {
        let r = store.complete(&key, f, &Outcome::Unknown, LONG).await;
        assert!(matches!(r, Err(StoreError::LeaseLost)), "complete {f:?}: {r:?}");
        let r = store.release(&key, f).await;
        assert!(matches!(r, Err(StoreError::LeaseLost)), "release {f:?}: {r:?}");
        let r = store.renew(&key, f, LONG).await;
        assert!(matches!(r, Err(StoreError::LeaseLost)), "renew {f:?}: {r:?}");
        store.wait(&key, f, Duration::from_millis(20)).await.unwrap();
    }
    // Absent key.
    let (gone, _) = fresh_key("extreme_fences", "absent");
    for f in [Fence(0), Fence(u64::MAX)] {
        idem_tests::assert_answer!(
            store.complete(&gone, f, &Outcome::Unknown, LONG).await,
            Err(StoreError::LeaseLost)
        );
        idem_tests::assert_answer!(store.release(&gone, f).await, Err(StoreError::LeaseLost));
        idem_tests::assert_answer!(store.renew(&gone, f, LONG).await, Err(StoreError::LeaseLost));
    }
    store.complete(&key, fence, &Outcome::Unknown, LONG).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_and_huge_leases() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("leases", "{}");
    let r = ClaimRequest {
        key: &key,
        fingerprint: &fp,
        lease: Duration::ZERO,
        on_expired: OnExpired::TakeOver,
        origin: Default::default(),
    };
    let Claim::Acquired { fence: f1, .. } = store.claim(r).await.unwrap() else { panic!() };
    // A zero lease has expired at once.
    let r = ClaimRequest {
        key: &key,
        fingerprint: &fp,
        lease: Duration::MAX,
        on_expired: OnExpired::TakeOver,
        origin: Default::default(),
    };
    let got = store.claim(r).await.unwrap();
    let Claim::Acquired { fence: f2, takeover: true } = got else { panic!("{got:?}") };
    assert!(f2 > f1, "{:?} must be above {:?}", f2, f1);
    match store.claim(claim_req(&key, &fp)).await.unwrap() {
        Claim::InFlight { fence, lease_remaining } => {
            assert_eq!(fence, f2);
            assert!(lease_remaining > Duration::from_secs(86400 * 365 * 50), "{lease_remaining:?}");
        }
        other => panic!("{other:?}"),
    }
    store.renew(&key, f2, Duration::MAX).await.unwrap();
    store.renew(&key, f2, Duration::ZERO).await.unwrap();
    let got =
        store.claim(ClaimRequest { on_expired: OnExpired::Unknown, ..claim_req(&key, &fp) }).await;
    assert_eq!(got.unwrap(), Claim::Unknown);
    store.complete(&key, f2, &Outcome::Success("1".into()), Duration::MAX).await.unwrap();
    idem_tests::assert_answer!(
        store.claim(claim_req(&key, &fp)).await.unwrap(),
        Claim::Completed(_)
    );
    store.forget(&key).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_records_fail_closed() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (_, fp0) = fresh_key("tampered", "{}");
    let fp = fp0.to_string();
    let cases: Vec<Vec<u8>> = vec![
        b"1|f|17|0|99999999999999|x||".to_vec(),
        format!("2|f|-17|0|99999999999999|{fp}||").into_bytes(),
        format!("2|f|17|0|-5|{fp}||").into_bytes(),
        format!("2|f|17|1|99999999999999|{fp}").into_bytes(),
        b"2|d|17|0|".to_vec(),
        format!("2|d|1 7|0||{fp}|s|1").into_bytes(),
        format!("2|d|+17|0||{fp}|s|1").into_bytes(),
        format!("2|d|١٧|0||{fp}|s|1").into_bytes(),
        format!("2|D|17|0||{fp}|s|1").into_bytes(),
        format!("2|f|17\0|0|99999999999999|{fp}||").into_bytes(),
        format!("2\0|d|17|0||{fp}|s|1").into_bytes(),
        format!(" 2|d|17|0||{fp}|s|1").into_bytes(),
        format!("02|d|17|0||{fp}|s|1").into_bytes(),
        format!("2|d|17|0||{fp} |s|1").into_bytes(),
        vec![0xff, 0xfe, b'|', b'd'],
        b"2|d|||||||".to_vec(),
        b"|||||||".to_vec(),
    ];
    for record in cases {
        let (key, fp) = (fresh_key("tampered", "{}").0, fp0);
        set(&mut raw, &store.record_key(&key), &record).await;
        let shown = String::from_utf8_lossy(&record).into_owned();
        let got = store.claim(claim_req(&key, &fp)).await;
        match &got {
            Err(StoreError::Incompatible(_)) => {}
            // A well-formed in-flight / unknown-kind variant may legitimately read as something.
            other => eprintln!("{shown:?}: claim answered {other:?}"),
        }
        assert!(
            !matches!(got, Ok(Claim::Completed(_)) | Ok(Claim::Acquired { .. })),
            "{shown:?}: claim answered {got:?}"
        );
        for f in [Fence(17), Fence(0)] {
            let r = store.complete(&key, f, &Outcome::Success("2".into()), LONG).await;
            assert!(
                matches!(r, Err(StoreError::Incompatible(_) | StoreError::LeaseLost)),
                "{shown:?}: complete {f:?} answered {r:?}"
            );
        }
        store.forget(&key).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_v1_hashes_and_other_types() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (_, fp) = fresh_key("half_v1", "{}");
    let fps = fp.to_string();
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![("v", "1".into())],
        vec![("v", "1".into()), ("st", "f".into())],
        vec![("v", "1".into()), ("st", "f".into()), ("fence", "17".into())],
        vec![("v", "1".into()), ("st", "d".into()), ("fence", "17".into()), ("fp", fps.clone())],
        vec![
            ("v", "1".into()),
            ("st", "d".into()),
            ("fence", "x".into()),
            ("fp", fps.clone()),
            ("ok", "s".into()),
            ("p", "1".into()),
        ],
        vec![
            ("v", "1".into()),
            ("st", "f".into()),
            ("fence", "17".into()),
            ("fp", fps.clone()),
            ("lu", "1|2".into()),
        ],
        vec![
            ("v", "1".into()),
            ("st", "f".into()),
            ("fence", "17".into()),
            ("fp", fps.clone()),
            ("w", "2".into()),
        ],
        vec![
            ("st", "d".into()),
            ("fence", "17".into()),
            ("fp", fps.clone()),
            ("ok", "s".into()),
            ("p", "1".into()),
        ],
    ];
    for fields in cases {
        let (key, _) = fresh_key("half_v1", "{}");
        let rec = store.record_key(&key);
        let mut cmd = redis::cmd("HSET");
        cmd.arg(&rec);
        for (n, v) in &fields {
            cmd.arg(*n).arg(v);
        }
        let _: () = cmd.query_async(&mut raw).await.unwrap();
        let got = store.claim(claim_req(&key, &fp)).await;
        eprintln!("{fields:?}: claim {got:?}");
        assert!(
            !matches!(got, Ok(Claim::Completed(_)) | Ok(Claim::Acquired { takeover: false, .. })),
            "{fields:?}: {got:?}"
        );
        store.forget(&key).await.unwrap();
    }
    // Other types.
    for ty in ["SADD", "RPUSH", "ZADD", "XADD"] {
        let (key, _) = fresh_key("types", ty);
        let rec = store.record_key(&key);
        let mut cmd = redis::cmd(ty);
        cmd.arg(&rec);
        match ty {
            "ZADD" => cmd.arg(1).arg("m"),
            "XADD" => cmd.arg("*").arg("f").arg("v"),
            _ => cmd.arg("m"),
        };
        let _: redis::Value = cmd.query_async(&mut raw).await.unwrap();
        let got = store.claim(claim_req(&key, &fp)).await;
        assert!(matches!(got, Err(StoreError::Incompatible(_))), "{ty}: {got:?}");
        // A long `max`: with 10 ms, a busy shared server made the wait run out of time and answer
        // Ok before the store had looked at the key (the flake of a full run).
        let r = store.wait(&key, Fence(1), LONG).await;
        assert!(matches!(r, Err(StoreError::Incompatible(_))), "{ty}: {r:?}");
        idem_tests::assert_answer!(store.forget(&key).await, Ok(true));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_on_other_instances_wake() {
    let mut s: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..4 {
        let Some(x) = store().await else { return };
        s.push(Arc::new(x));
    }
    adversarial::every_end_wakes_waiters(&s).await;
}

// ---------------------------------------------------------------------------------------------
// Regressions: each of these failed when written (2026-11-30) and was fixed
// ---------------------------------------------------------------------------------------------

/// A retention of zero (or under a millisecond) is accepted by the in-memory and SQL stores (the
/// record is kept for no time). Redis refuses `SET .. PX 0`, so complete removes such a record at
/// once instead; before that fix it failed and left the lease held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_with_zero_retention_succeeds() {
    let Some(store) = store().await else { return };
    for ttl in [Duration::ZERO, Duration::from_micros(500)] {
        let (key, fp) = fresh_key("zero_retention", &format!("{ttl:?}"));
        let fence = acquire(&store, &key, &fp).await;
        let r = store.complete(&key, fence, &Outcome::Success("1".into()), ttl).await;
        // Kept for at least what was asked (500µs is 1 ms, never 0): gone after that.
        tokio::time::sleep(ttl * 10).await;
        // Whatever the answer, the holder must not be left owning a lease it completed.
        let after = store.claim(claim_req(&key, &fp)).await;
        assert!(
            r.is_ok(),
            "complete with ttl {ttl:?} answered {r:?}; a claim then answers {after:?}"
        );
        match after.unwrap() {
            Claim::Acquired { fence: next, takeover: false } => {
                assert!(next > fence, "{:?} must be above {:?}", next, fence)
            }
            other => panic!("a record kept for {ttl:?} is gone after it; claim answered {other:?}"),
        }
    }
}

/// `Duration::MAX` as `max` means "no limit" elsewhere (the policy says so, and the PostgreSQL
/// and in-memory stores accept it); `Instant::now() + max` used to panic here. The lease is
/// released after 300 ms, so the wait must return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_with_duration_max_does_not_panic() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("wait_max", "{}");
    let fence = acquire(&store, &key, &fp).await;
    let waiter = tokio::spawn({
        let store = store.clone();
        async move { store.wait(&key, fence, Duration::MAX).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.release(&key, fence).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("wait returns");
    match r {
        Ok(r) => r.expect("wait"),
        Err(e) => panic!("wait(max = Duration::MAX) panicked: {e}"),
    }
}

/// A record whose fence Lua cannot hold exactly (above 2^53: tampered, or written by another
/// writer) must not be taken over with a fence that is not above it. Expected: a takeover
/// fence above the stored one, or Incompatible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_of_a_record_with_a_fence_above_2_pow_53() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (key, fp) = fresh_key("big_fence", "{}");
    let stored: u64 = (1 << 53) + 1;
    // In flight, lease long expired.
    set(&mut raw, &store.record_key(&key), format!("2|f|{stored}|0|1|{fp}||").as_bytes()).await;
    match store.claim(claim_req(&key, &fp)).await {
        Ok(Claim::Acquired { fence, .. }) => {
            let now =
                String::from_utf8(get(&mut raw, &store.record_key(&key)).await.unwrap()).unwrap();
            assert!(
                fence.0 > stored,
                "takeover of fence {stored} answered fence {} (record now {now:?})",
                fence.0
            );
        }
        Err(StoreError::Incompatible(_)) => {}
        other => panic!("{other:?}"),
    }
}

/// Same for the fence counter: a fresh claim must start above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_claim_above_a_counter_above_2_pow_53() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (key, fp) = fresh_key("big_counter", "{}");
    let counter: u64 = (1 << 53) + 1;
    set(&mut raw, &store.fence_key(&key), counter.to_string().as_bytes()).await;
    match store.claim(claim_req(&key, &fp)).await {
        Ok(Claim::Acquired { fence, .. }) => {
            assert!(fence.0 > counter, "counter {counter}, fresh fence {}", fence.0)
        }
        Err(StoreError::Incompatible(_)) => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_increase_across_owners_under_contention() {
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..4 {
        let Some(s) = store().await else { return };
        stores.push(Arc::new(s));
    }
    let (count, backwards) =
        adversarial::owner_order_fences(stores, 32, Duration::from_secs(8)).await;
    eprintln!("redis: {count} acquisitions");
    assert!(count > 100, "only {count} acquisitions");
    assert!(backwards.is_empty(), "{backwards:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn very_large_payload() {
    let Some(store) = store().await else { return };
    // 64 MB also works, but blocks the server past other clients' 1 s response timeout.
    for mb in [8usize, 16] {
        let (key, fp) = fresh_key("very_large", &mb.to_string());
        let fence = acquire(&store, &key, &fp).await;
        let out = Outcome::Success(format!("\"{}\"", "y".repeat(mb << 20)));
        let t = std::time::Instant::now();
        let r = store.complete(&key, fence, &out, LONG).await;
        eprintln!(
            "{mb} MB complete: {:?} in {:?}",
            r.as_ref().map_err(|e| e.to_string()),
            t.elapsed()
        );
        let t = std::time::Instant::now();
        let got = store.claim(claim_req(&key, &fp)).await;
        let ok = matches!(&got, Ok(Claim::Completed(r)) if r.outcome == out);
        eprintln!("{mb} MB replay ok={ok} {:?} in {:?}", got.as_ref().err(), t.elapsed());
        store.forget(&key).await.unwrap();
    }
}

/// Many stores meet one expired version 1 in-flight hash at once: one takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_takeover_of_a_v1_hash() {
    let mut stores = Vec::new();
    for _ in 0..4 {
        let Some(s) = store().await else { return };
        stores.push(Arc::new(s));
    }
    let mut raw = raw().await;
    for round in 0..20 {
        let (key, fp) = fresh_key("v1_race", &round.to_string());
        let rec = stores[0].record_key(&key);
        let _: () = redis::cmd("HSET")
            .arg(&rec)
            .arg("v")
            .arg("1")
            .arg("st")
            .arg("f")
            .arg("fence")
            .arg("1000")
            .arg("fp")
            .arg(fp.to_string())
            .arg("lu")
            .arg("1")
            .arg("w")
            .arg("1")
            .query_async(&mut raw)
            .await
            .unwrap();
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let s = Arc::clone(&stores[i % 4]);
                tokio::spawn(async move {
                    match i % 3 {
                        0 => s.claim(claim_req(&key, &fp)).await.map(Some),
                        1 => s.wait(&key, Fence(1000), Duration::from_secs(5)).await.map(|()| None),
                        _ => s.claim(claim_req(&key, &fp)).await.map(Some),
                    }
                })
            })
            .collect();
        let mut won = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(Some(Claim::Acquired { takeover: true, fence })) => {
                    assert!(fence.0 > 1000, "{:?} must be above {:?}", fence.0, 1000);
                    won += 1
                }
                Ok(Some(Claim::InFlight { .. })) | Ok(None) => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(won, 1, "round {round}");
    }
}

/// A version 1 hash that says "completed, success" but has no payload field is not a valid
/// record; the migration fills the payload with "" and the claim replays `Success("")`, an
/// outcome nobody stored (and not JSON). Expected: Incompatible, as for every other malformed
/// version 1 hash (and as PostgreSQL does for kind 1 with a NULL payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_completed_hash_without_payload_is_refused() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    for ok in ["s", "f"] {
        let (key, fp) = fresh_key("v1_no_payload", ok);
        let _: () = redis::cmd("HSET")
            .arg(store.record_key(&key))
            .arg("v")
            .arg("1")
            .arg("st")
            .arg("d")
            .arg("fence")
            .arg("17")
            .arg("fp")
            .arg(fp.to_string())
            .arg("ok")
            .arg(ok)
            .query_async(&mut raw)
            .await
            .unwrap();
        let got = store.claim(claim_req(&key, &fp)).await;
        store.forget(&key).await.unwrap();
        assert!(
            matches!(got, Err(StoreError::Incompatible(_))),
            "v1 hash st=d ok={ok} without p: claim answered {got:?}"
        );
    }
}

/// The client checks every field of a completed record: an unknown outcome (`u`) never has a
/// payload, so one with a payload is Incompatible, as in the PostgreSQL store (kind 3 with a
/// payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_outcome_with_a_payload_is_refused() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (key, fp) = fresh_key("unknown_with_payload", "{}");
    set(&mut raw, &store.record_key(&key), format!("2|d|17|0||{fp}|u|\"paid\"").as_bytes()).await;
    let got = store.claim(claim_req(&key, &fp)).await;
    store.forget(&key).await.unwrap();
    assert!(matches!(got, Err(StoreError::Incompatible(_))), "claim answered {got:?}");
}

/// A fingerprint is 64 hex digits. An in-flight record (v2 string, or a v1 hash it migrates) with
/// a short one is Incompatible, not Mismatch (which would tell the caller it reused a key with
/// other arguments).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_record_with_a_short_fingerprint_is_incompatible() {
    let Some(store) = store().await else { return };
    let mut raw = raw().await;
    let (key, fp) = fresh_key("short_fp", "string");
    set(&mut raw, &store.record_key(&key), b"2|f|17|0|99999999999999|abc||").await;
    let string = store.claim(claim_req(&key, &fp)).await;
    store.forget(&key).await.unwrap();
    let (key, fp) = fresh_key("short_fp", "hash");
    let _: () = redis::cmd("HSET")
        .arg(store.record_key(&key))
        .arg("v")
        .arg("1")
        .arg("st")
        .arg("f")
        .arg("fence")
        .arg("17")
        .arg("fp")
        .arg("abc")
        .arg("lu")
        .arg("99999999999999")
        .query_async(&mut raw)
        .await
        .unwrap();
    let hash = store.claim(claim_req(&key, &fp)).await;
    store.forget(&key).await.unwrap();
    assert!(
        matches!(string, Err(StoreError::Incompatible(_)))
            && matches!(hash, Err(StoreError::Incompatible(_))),
        "v2 string: {string:?}; v1 hash: {hash:?}"
    );
}

/// A replica wait under a millisecond waits 1 ms: sent as `WAIT 1 0` it made Redis wait for ever
/// for a replica (none here, or none answering), so the claim failed only at the response timeout
/// and the store's connection stayed blocked for every later command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_wait_under_a_millisecond_does_not_block() {
    let Some(_) = store().await else { return };
    let store = RedisStore::builder(redis_url())
        .prefix(redis_prefix())
        .wait_for_replicas(1, Duration::from_micros(500))
        .open()
        .await
        .unwrap();
    for i in 0..2 {
        let (key, fp) = fresh_key("sub_ms_wait", &i.to_string());
        let started = std::time::Instant::now();
        let got = store.claim(claim_req(&key, &fp)).await;
        let took = started.elapsed();
        assert!(took < Duration::from_millis(500), "claim {i} took {took:?}: {got:?}");
        // With a replica that acknowledged, the claim acquires; without, it is not trusted.
        match got {
            Ok(Claim::Acquired { fence, .. }) => store.release(&key, fence).await.unwrap(),
            Err(StoreError::Unavailable(_)) => {}
            other => panic!("claim {i}: {other:?}"),
        }
    }
}

//! Redis helpers shared by tests/conformance_redis.rs and tests/redis_schema_v1.rs: the store
//! and a raw connection on the tests' server, and reading and writing records behind the store's
//! back (the stored record and its fields, version 1 records, the
//! server's clock, the check that every step refuses a record).

#![allow(dead_code)] // each test binary uses a part of it

use idem_core::StoreError;
use idem_core::conformance::LONG;
use idem_core::store::{Claim, Fence, Outcome, RedisStore, Store};
use idem_tests::{claim_req, or_skip, redis_prefix, redis_url};

pub async fn store() -> Option<RedisStore> {
    or_skip("Redis", RedisStore::builder(redis_url()).prefix(redis_prefix()).open().await)
}

pub async fn raw() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(redis_url()).expect("redis url");
    client.get_multiplexed_async_connection().await.expect("raw redis connection")
}

/// A record as stored: `V|st|fence|w|lu|fp|ok|payload` (see the store's module docs).
pub async fn stored(raw: &mut redis::aio::MultiplexedConnection, rec: &str) -> String {
    redis::cmd("GET").arg(rec).query_async(raw).await.unwrap()
}

/// Writes `value` (text or bytes) as record `rec`.
pub async fn set(
    raw: &mut redis::aio::MultiplexedConnection,
    rec: &str,
    value: impl redis::ToRedisArgs + Send + Sync,
) {
    let _: () = redis::cmd("SET").arg(rec).arg(value).query_async(raw).await.unwrap();
}

pub async fn pttl(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(raw).await.unwrap()
}

/// Field `i` of a stored record (0 version, 1 state, 2 fence, 3 waited on, 4 lease end,
/// 5 fingerprint, 6 outcome kind, 7 payload).
pub fn field(record: &str, i: usize) -> &str {
    record.splitn(10, '|').nth(i).unwrap_or_else(|| panic!("record {record:?} has no field {i}"))
}

/// Every step but forget refuses the record at `key` as `Incompatible`, with `why` in the
/// message; forget removes it and the key is free again.
pub async fn refused_by_every_step(
    store: &RedisStore,
    key: &idem_core::Key,
    fence: Fence,
    why: &str,
) {
    let fp = idem_core::conformance::other_fingerprint();
    match store.claim(claim_req(key, &fp)).await {
        Err(StoreError::Incompatible(msg)) => assert!(msg.contains(why), "{msg}"),
        other => panic!("the record must be Incompatible ({why}), got {other:?}"),
    }
    for r in [
        store.complete(key, fence, &Outcome::Success("1".into()), LONG).await,
        store.release(key, fence).await,
        store.renew(key, fence, LONG).await,
        // A long `max`: the answer must come from the store, not from running out of time
        // (a busy shared server may take longer than a few ms to answer).
        store.wait(key, fence, LONG).await,
    ] {
        assert!(matches!(r, Err(StoreError::Incompatible(_))), "got {r:?}");
    }
    // Forget is the operator's way out, and works whatever is stored.
    idem_tests::assert_answer!(store.forget(key).await, Ok(true));
    idem_tests::assert_answer!(store.claim(claim_req(key, &fp)).await, Ok(Claim::Acquired { .. }));
}

/// A version 1 record (a hash with fields v, st, fence, fp, lu, ok, p, w).
pub async fn write_v1(
    raw: &mut redis::aio::MultiplexedConnection,
    rec: &str,
    fields: &[(&str, String)],
) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(rec).arg("v").arg("1");
    for (name, value) in fields {
        cmd.arg(*name).arg(value);
    }
    let _: () = cmd.query_async(raw).await.unwrap();
}

/// The server's clock in ms and µs (leases and fences use it).
pub async fn server_now(raw: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(raw).await.unwrap();
    (s * 1000 + us / 1000, s * 1_000_000 + us)
}

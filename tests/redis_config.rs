//! How the Redis store meets a server's configuration (a private `redis-server` per test, since
//! the shared one must not get a memory limit or ACL users):
//!
//! - A Redis that may evict keys (a memory limit and a policy other than `noeviction`) would lose
//!   records and fence counters when full: a completed call would run again, two owners could
//!   hold equal fences. The store refuses to open on one, or on one that will not say, unless the
//!   application accepts it (`idem-core/src/store/redis/eviction.rs`).
//! - What Redis refuses for the store's user or database (a password, a database number, an ACL)
//!   is a configuration error naming it, not an outage to wait out.
//!
//! Run: cargo test --features redis --test redis_config

use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, RedisStore, Store, StoreError};
use idem_tests::servers::RedisPrivate;
use idem_tests::{claim_req, or_skip};

fn server(tag: &str, options: &[&str]) -> Option<RedisPrivate> {
    or_skip("redis-server (a private one)", RedisPrivate::start(tag, options))
}

/// Adds the ACL user `name` (password `pw`) with every right but `denied` (e.g. `-info`; none
/// when empty) on `redis`; its URL.
async fn user(redis: &RedisPrivate, name: &str, denied: &str) -> String {
    let admin = redis::Client::open(redis.url("")).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let mut rules = vec!["SETUSER", name, "on", ">pw", "~*", "&*", "+@all"];
    rules.extend((!denied.is_empty()).then_some(denied));
    let _: () = redis::cmd("ACL").arg(&rules[..]).query_async(&mut admin).await.unwrap();
    format!("redis://{name}:pw@127.0.0.1:{}/", redis.port)
}

fn refusal(opened: Result<impl Sized, StoreError>) -> String {
    match opened {
        Err(StoreError::InvalidConfig(message)) => message,
        Err(other) => panic!("expected InvalidConfig, got {other:?}"),
        Ok(_) => panic!("the store opened on a Redis that may evict its records"),
    }
}

#[tokio::test]
async fn a_redis_that_may_evict_is_refused_unless_accepted() {
    let Some(redis) =
        server("redis-evicting", &["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"])
    else {
        return;
    };
    let message = refusal(RedisStore::open(&redis.url("")).await);
    for part in
        ["maxmemory-policy is volatile-lru", "67108864 bytes", "noeviction", "allow_eviction"]
    {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    // The same through the URL every front door opens (the command line, `Idem::from_url`).
    let message = refusal(idem_core::store::open(&redis.url("")).await);
    assert!(message.contains("volatile-lru"), "{message}");

    // Accepted by the application, in code or in the URL: it opens and works.
    let store = RedisStore::builder(redis.url("")).allow_eviction(true).open().await.unwrap();
    let (key, fp) = fresh_key("eviction_accepted", "{}");
    let claim = store.claim(claim_req(&key, &fp)).await.unwrap();
    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
    assert!(idem_core::store::open(&redis.url("?allow_eviction=true")).await.is_ok());
    // The builder's word is the last: it overrides the URL's.
    let refused =
        RedisStore::builder(redis.url("?allow_eviction=true")).allow_eviction(false).open().await;
    assert!(refusal(refused).contains("volatile-lru"));
    let message = refusal(RedisStore::open(&redis.url("?allow_eviction=maybe")).await);
    assert!(message.contains("allow_eviction must be true or false"), "{message}");
}

#[tokio::test]
async fn noeviction_or_no_limit_opens() {
    let Some(limited) =
        server("redis-noeviction", &["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"])
    else {
        return;
    };
    assert!(RedisStore::open(&limited.url("")).await.is_ok());
    // No memory limit: nothing is evicted, whatever the policy says.
    let Some(unlimited) = server("redis-unlimited", &["--maxmemory-policy", "allkeys-lru"]) else {
        return;
    };
    assert!(RedisStore::open(&unlimited.url("")).await.is_ok());
}

/// A user who may not run `INFO` (it is in `@dangerous`, which least-privilege ACLs leave out)
/// cannot show the server never evicts: refused as one that may, unless accepted.
#[tokio::test]
async fn a_user_who_may_not_read_info_is_refused_unless_accepted() {
    let Some(redis) = server("redis-acl", &[]) else { return };
    let url = user(&redis, "app", "-info").await;
    let message = refusal(RedisStore::open(&url).await);
    for part in ["did not say whether it may evict", "+info", "allow_eviction"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    let store = RedisStore::builder(&url).allow_eviction(true).open().await.unwrap();
    let (key, fp) = fresh_key("eviction_unknown_accepted", "{}");
    let claim = store.claim(claim_req(&key, &fp)).await.unwrap();
    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
}

/// What Redis refuses for the user or the database is a configuration error naming it, not "the
/// store is unavailable, retry when it is back": a wrong password, a database the server does
/// not have, an ACL without a command the store runs (here `TIME`, which its scripts call).
#[tokio::test]
async fn a_refused_user_or_database_is_a_configuration_error() {
    let Some(redis) = server("redis-refusals", &["--databases", "4"]) else { return };
    let app = user(&redis, "app", "").await;
    let notime = user(&redis, "notime", "-time").await;
    let port = redis.port;
    for (url, expect) in [
        (format!("redis://app:wrong@127.0.0.1:{port}/"), "authentication failed"),
        (format!("redis://127.0.0.1:{port}/9"), "DB index is out of range"),
    ] {
        let message = refusal(RedisStore::open(&url).await);
        assert!(message.contains(expect) && message.contains("refused"), "{url}: {message}");
    }
    // Opens (PING and INFO are allowed), but every claim's script calls TIME.
    let store = RedisStore::open(&notime).await.unwrap();
    let (key, fp) = fresh_key("refused_time", "{}");
    match store.claim(claim_req(&key, &fp)).await {
        Err(StoreError::InvalidConfig(m)) => assert!(m.contains("can't run this command"), "{m}"),
        other => panic!("expected InvalidConfig for a user without TIME, got {other:?}"),
    }

    // A record written by a user with every right; then users without GET or SCAN read the
    // store: refused for the user (configuration), not a damaged record or schema.
    let full = RedisStore::open(&app).await.unwrap();
    let (key, fp) = fresh_key("refused_readers", "{}");
    let fence = idem_tests::acquire(&full, &key, &fp).await;
    full.complete(&key, fence, &idem_core::store::Outcome::Success("1".into()), LONG)
        .await
        .unwrap();
    for (name, denied) in [("noget", "-get"), ("noscan", "-scan")] {
        let reader = RedisStore::open(&user(&redis, name, denied).await).await.unwrap();
        let listed = reader.list(&idem_core::store::ListQuery::default()).await;
        match listed {
            Err(StoreError::InvalidConfig(m)) => assert!(m.contains("refused"), "{name}: {m}"),
            other => panic!("{name} listing: expected InvalidConfig, got {:?}", other.map(drop)),
        }
    }
    let noget = RedisStore::open(&user(&redis, "noget", "-get").await).await.unwrap();
    for result in
        [noget.claim(claim_req(&key, &fp)).await.map(drop), noget.inspect(&key).await.map(drop)]
    {
        match result {
            Err(StoreError::InvalidConfig(m)) => assert!(m.contains("refused"), "{m}"),
            other => panic!("without GET: expected InvalidConfig, got {other:?}"),
        }
    }
}

/// A server that does not answer `INFO` (the connection drops while the store opens) is an
/// outage to retry, not a user without `+info`: `Unavailable`, as when `PING` gets no answer.
#[tokio::test]
async fn info_lost_on_the_way_is_an_outage_not_a_refusal() {
    let Some(redis) = server("redis-info-lost", &[]) else { return };
    let proxy = idem_tests::proxy::Proxy::start(format!("127.0.0.1:{}", redis.port)).await;
    proxy.lose_reply_to("INFO");
    match RedisStore::open(&format!("redis://127.0.0.1:{}/", proxy.port())).await {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable, got {:?}", other.map(drop)),
    }
    assert_eq!(proxy.lost(), 1, "the INFO reply was the one lost");
}

/// The builders a program logs with `{:?}` (its configuration at startup, an `.expect()` on a
/// failed open) never print the password of the URL or connection string they were given.
#[test]
fn a_builders_debug_never_prints_the_password() {
    let builder = RedisStore::builder("redis://app:s3cretPW@cache.internal:6379/0").prefix("p");
    let shown = format!("{builder:?}");
    assert!(!shown.contains("s3cretPW"), "{shown}");
    assert!(shown.contains("cache.internal"), "still says where: {shown}");
    #[cfg(feature = "postgres")]
    {
        let options = idem_core::store::postgres::PoolOptions::new()
            .listen("host=db.internal user=app password='s3cretPW' dbname=app");
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cretPW"), "{shown}");
        assert!(shown.contains("db.internal"), "still says where: {shown}");
    }
}

/// A script cache emptied while the store runs (`SCRIPT FLUSH` by an operator or another
/// application, a restart or failover onto a server that never saw the scripts): every step
/// still runs, even when the cache is emptied again between the store's reload and its retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_run_while_the_script_cache_is_flushed() {
    let Some(redis) = server("redis-flush", &[]) else { return };
    let store = std::sync::Arc::new(
        RedisStore::builder(redis.url(""))
            .native_claims(false)
            .replay_reads(false)
            .open()
            .await
            .expect("opens"),
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (url, stop) = (redis.url(""), std::sync::Arc::clone(&stop));
        tokio::spawn(async move {
            let admin = redis::Client::open(url).unwrap();
            let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: () =
                    redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();
            }
        })
    };
    let callers: Vec<_> = (0..8)
        .map(|caller| {
            let store = std::sync::Arc::clone(&store);
            tokio::spawn(async move {
                let mut failed = Vec::new();
                for i in 0..150 {
                    let (key, fp) = fresh_key("script_flush", &format!("{caller}-{i}"));
                    let step = match store.claim(claim_req(&key, &fp)).await {
                        Ok(Claim::Acquired { fence, .. }) => {
                            let done = idem_core::store::Outcome::Success("1".into());
                            store.complete(&key, fence, &done, LONG).await
                        }
                        Ok(other) => panic!("a fresh key: {other:?}"),
                        Err(e) => Err(e),
                    };
                    failed.extend(step.err().map(|e| e.to_string()));
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for caller in callers {
        failed.extend(caller.await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of 2400 steps failed: {:?}",
        failed.len(),
        &failed[..3.min(failed.len())]
    );
}

/// A user whose ACL allows `SCRIPT LOAD` and `EVALSHA` but not `EVAL` still runs its steps after
/// the script cache was emptied.
#[tokio::test(flavor = "current_thread")]
async fn a_user_without_eval_runs_its_steps_after_a_script_flush() {
    let Some(redis) = server("redis-noeval", &[]) else { return };
    let url = user(&redis, "noeval", "-eval").await;
    let store = RedisStore::builder(url).native_claims(false).open().await.expect("opens");
    let admin = redis::Client::open(redis.url("")).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut admin).await.unwrap();
    let (key, fp) = fresh_key("noeval", "{}");
    assert!(matches!(store.claim(claim_req(&key, &fp)).await, Ok(Claim::Acquired { .. })));
}

/// A Redis server holds no schema: a tool that only looks at a store (the `idem` command line)
/// given a URL without the application's `prefix` would list an empty store while the records
/// are under another prefix. A prefix with no key there is refused, naming the one found.
#[tokio::test(flavor = "current_thread")]
async fn a_prefix_without_keys_is_not_an_existing_store() {
    let Some(redis) = server("redis-prefix", &[]) else { return };
    let app = RedisStore::open(&redis.url("?prefix=app")).await.expect("opens");
    let (key, fp) = fresh_key("prefix", "{}");
    assert!(matches!(app.claim(claim_req(&key, &fp)).await, Ok(Claim::Acquired { .. })));
    match idem_core::store::open_existing(&redis.url("")).await {
        Err(StoreError::InvalidConfig(m)) => {
            assert!(
                m.contains("\"idem\"") && m.contains("\"app\"") && m.contains("?prefix="),
                "{m}"
            )
        }
        other => panic!("the default prefix, with no key: {:?}", other.map(drop)),
    }
    idem_core::store::open_existing(&redis.url("?prefix=app")).await.expect("the app's prefix");
}

/// A Redis that closes idle connections (`timeout` in redis.conf, as managed services and
/// hardened configurations set it): the store's connection is gone when the next call comes.
/// A repeat after such a pause replays, and a new call runs, instead of failing closed because
/// the first command went out on the closed connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_the_server_closed_an_idle_connection_are_served() {
    let Some(redis) = server("redis-idle-timeout", &["--timeout", "1"]) else { return };
    let store = RedisStore::open(&redis.url("")).await.expect("opens");
    let (key, fp) = fresh_key("idle_timeout", "{}");
    let fence = idem_tests::acquire(&store, &key, &fp).await;
    let done = idem_core::store::Outcome::Success("1".into());
    store.complete(&key, fence, &done, LONG).await.unwrap();
    for round in 0..2 {
        // Past the server's idle timeout (it checks idle clients about every 100 ms).
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        match store.claim(claim_req(&key, &fp)).await {
            Ok(Claim::Completed(_)) => {}
            other => panic!("round {round}: a repeat after an idle pause must replay: {other:?}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        let (fresh, fresh_fp) = fresh_key("idle_timeout_fresh", &round.to_string());
        match store.claim(claim_req(&fresh, &fresh_fp)).await {
            Ok(Claim::Acquired { .. }) => {}
            other => panic!("round {round}: a new key after an idle pause: {other:?}"),
        }
    }
}

/// Redis 7 gives a new ACL user no pub/sub channel unless it names some (`acl-pubsub-default
/// resetchannels`): `ACL SETUSER app on >pw ~* +@all` may run every command on every key, but
/// `PUBLISH` and `SUBSCRIBE` on none of the store's channels. Waiters then poll; and the steps
/// that publish a wake-up (forget always, the others when someone waits) still do their work
/// and say so, rather than failing after their writes as if the store were down.
#[tokio::test(flavor = "current_thread")]
async fn a_user_without_channel_rights_forgets_and_completes() {
    let Some(redis) = server("redis-nochannels", &[]) else { return };
    let admin = redis::Client::open(redis.url("")).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let rules = ["SETUSER", "app", "resetchannels", "on", ">pw", "~*", "+@all"];
    let _: () = redis::cmd("ACL").arg(&rules[..]).query_async(&mut admin).await.unwrap();
    let url = format!("redis://app:pw@127.0.0.1:{}/", redis.port);
    let store = RedisStore::open(&url).await.expect("opens");
    let done = idem_core::store::Outcome::Success("1".into());

    // The operator's removal: the record goes, and the answer says it went.
    let (key, fp) = fresh_key("nochannels_forget", "{}");
    let fence = idem_tests::acquire(&store, &key, &fp).await;
    store.complete(&key, fence, &done, LONG).await.unwrap();
    assert_eq!(store.forget(&key).await.map_err(|e| e.to_string()), Ok(true));
    assert!(store.inspect(&key).await.unwrap().is_none(), "forgotten");
    // The command line's removal of the record as it was shown.
    let fence = idem_tests::acquire(&store, &key, &fp).await;
    store.complete(&key, fence, &done, LONG).await.unwrap();
    assert_eq!(store.forget_seen(&key, fence, true).await.map_err(|e| e.to_string()), Ok(true));
    assert!(store.inspect(&key).await.unwrap().is_none(), "forgotten as seen");

    // A waiter of a process whose user may subscribe flags the record: the owner completes.
    let (key, fp) = fresh_key("nochannels_complete", "{}");
    let fence = idem_tests::acquire(&store, &key, &fp).await;
    let waiter = RedisStore::open(&redis.url("")).await.expect("opens");
    let waiting = {
        let (waiter, key) = (waiter.clone(), key);
        tokio::spawn(
            async move { waiter.wait(&key, fence, std::time::Duration::from_secs(10)).await },
        )
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(store.complete(&key, fence, &done, LONG).await.map_err(|e| e.to_string()), Ok(()));
    waiting.await.unwrap().unwrap();
    assert!(matches!(waiter.claim(claim_req(&key, &fp)).await, Ok(Claim::Completed(_))));
}

/// A replica named where its master was meant (a managed Redis's reader endpoint, a replica's
/// address): on a read-only replica (the default) every claim is refused with `READONLY` and,
/// taken for a master demoted behind its address, sent again on new connections until it fails
/// as "unavailable"; on a writable replica (`replica-read-only no`) a claim is written there
/// alone, never reaches the master, and a process using the master claims the same key again:
/// the tool runs twice. Opening refuses a replica, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_refused_at_open() {
    // Replicas get the master's data at once, not after the default 5 s wait for more of them.
    let Some(master) = server("redis-replica-master", &["--repl-diskless-sync-delay", "0"]) else {
        return;
    };
    let of = master.port.to_string();
    let on_master = RedisStore::open(&master.url("")).await.expect("the master");
    let (done, done_fp) = fresh_key("replica", "done");
    let fence = idem_tests::acquire(&on_master, &done, &done_fp).await;
    let outcome = idem_core::store::Outcome::Success("1".into());
    on_master.complete(&done, fence, &outcome, LONG).await.unwrap();
    for writable in ["no", "yes"] {
        let tag = format!("redis-replica-{writable}");
        let options = ["--replicaof", "127.0.0.1", &of, "--replica-read-only", writable];
        let Some(replica) = server(&tag, &options) else { return };
        match RedisStore::open(&replica.url("")).await {
            Err(e) => {
                let m = e.to_string() + &format!("{:?}", e);
                assert!(m.contains("replica"), "replica-read-only {writable}: {m}");
                // The command line only looks: it may look at a replica, once it has the records.
                let raw = redis::Client::open(replica.url("")).unwrap();
                let mut raw = raw.get_multiplexed_async_connection().await.unwrap();
                for _ in 0..100 {
                    let n: u64 = redis::cmd("EXISTS")
                        .arg(on_master.record_key(&done))
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                    if n == 1 {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                let looked = idem_core::store::open_existing(&replica.url("")).await;
                assert!(looked.is_ok(), "the command line on a replica: {:?}", looked.err());
            }
            Ok(on_replica) => {
                let (key, fp) = fresh_key("replica", writable);
                let started = std::time::Instant::now();
                let replica_claim = on_replica.claim(claim_req(&key, &fp)).await;
                let master_claim = on_master.claim(claim_req(&key, &fp)).await;
                // What the server on the replica's port says it is, to tell a detection fault
                // from a test that reached another server.
                let raw = redis::Client::open(replica.url("")).unwrap();
                let info: Result<String, _> = match raw.get_multiplexed_async_connection().await {
                    Ok(mut raw) => {
                        redis::cmd("INFO").arg("replication").query_async(&mut raw).await
                    }
                    Err(e) => Err(e),
                };
                panic!(
                    "a replica (replica-read-only {writable}) opened as the store; its claim \
                     after {:?}: {replica_claim:?}; the master's claim of the same key: \
                     {master_claim:?}; INFO replication there: {info:?}",
                    started.elapsed()
                );
            }
        }
    }
}

/// A full Redis under `noeviction` refuses every command that would use memory: new claims fail
/// closed, as documented. What frees memory still works: an operator's `forget` (and the command
/// line's `forget` of a record as it was shown) removes a record, rather than being refused
/// because the script wrote the key's fence counter before deleting the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_still_forgets() {
    let Some(redis) = server("redis-full", &["--maxmemory-policy", "noeviction"]) else {
        return;
    };
    let store = RedisStore::open(&redis.url("")).await.expect("opens");
    let done = idem_core::store::Outcome::Success(format!("\"{}\"", "x".repeat(64 * 1024)));
    let mut records = Vec::new();
    for i in 0..2 {
        let (key, fp) = fresh_key("full_forget", &i.to_string());
        let fence = idem_tests::acquire(&store, &key, &fp).await;
        store.complete(&key, fence, &done, LONG).await.unwrap();
        records.push((key, fence));
    }
    // Full: a memory limit below what the server already holds.
    let admin = redis::Client::open(redis.url("")).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut admin)
        .await
        .unwrap();
    let (fresh, fresh_fp) = fresh_key("full_forget", "new");
    let claimed = store.claim(claim_req(&fresh, &fresh_fp)).await;
    assert!(claimed.is_err(), "a full Redis fails closed: {claimed:?}");

    let (key, _) = records[0];
    assert_eq!(store.forget(&key).await.map_err(|e| e.to_string()), Ok(true));
    let (key, fence) = records[1];
    assert_eq!(store.forget_seen(&key, fence, true).await.map_err(|e| e.to_string()), Ok(true));
    for (key, fence) in &records {
        assert!(store.inspect(key).await.unwrap().is_none(), "removed");
        // The fence went to the counter, so the key's next fence is above it.
        let counter: Option<u64> =
            redis::cmd("GET").arg(store.fence_key(key)).query_async(&mut admin).await.unwrap();
        assert_eq!(counter, Some(fence.0), "the fence counter of a forgotten record");
    }
}

/// The operator's reads after the server closed an idle connection (`timeout` in redis.conf):
/// `idem_core::metrics::watch_record_gauges` counts the store every few minutes, and on a quiet
/// store each count found the connection closed again since the last one, so every count failed
/// and the gauges (the queue of unknown outcomes among them) stopped moving; `list` and `inspect`
/// in a long-lived process failed the same way, and so did an operator's forget. They are sent
/// again, as a claim's replay read is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_reads_after_the_server_closed_an_idle_connection() {
    let Some(redis) = server("redis-idle-reads", &["--timeout", "1"]) else { return };
    let store = RedisStore::open(&redis.url("")).await.expect("opens");
    idem_tests::operator_steps_after_idle_pauses(&store, "idle_reads").await;
}

/// The test servers' own start (tests/support/servers.rs): a port taken between its choice and
/// the server's bind is left for another one, and the server returned is the one started there,
/// not whatever holds the first port.
#[test]
fn a_test_server_moves_off_a_port_taken_before_it_binds() {
    use idem_tests::servers::{free_port, on_free_port, spawn_redis, temp_dir};
    use std::io::{Read, Write};
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_port = taken.local_addr().expect("address").port();
    let dir = temp_dir("port-taken");
    let picks = std::cell::Cell::new(0);
    let pick = || {
        picks.set(picks.get() + 1);
        if picks.get() == 1 { Ok(taken_port) } else { free_port() }
    };
    let started = on_free_port(pick, |port| {
        let mut cmd = std::process::Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--dir"])
            .arg(&dir);
        spawn_redis(&mut cmd, &dir.join(format!("{port}.log"))).map(|child| (port, child))
    });
    let Some((port, mut child)) = or_skip("redis-server (a private one)", started) else { return };
    assert_eq!(picks.get(), 2, "the taken port was given up after one try");
    assert_ne!(port, taken_port);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    conn.write_all(b"PING\r\n").expect("write");
    let mut reply = [0; 7];
    conn.read_exact(&mut reply).expect("read");
    assert_eq!(&reply, b"+PONG\r\n", "the server started answers on the port returned");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

//! Adversarial tests of the PostgreSQL store (schema 2: the `idem_claim` plpgsql function,
//! migrated from schema 1 on connect). Destructive experiments run in private schemas that are
//! dropped afterwards. Run: cargo test --all-features --test adversarial_postgres

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, ClaimRequest, Fence, OnExpired, Outcome, Record};
use idem_core::{PostgresStore, Store, StoreError};
use idem_tests::{acquire, claim_req, or_skip, pg_url, process_tag};
use tokio_postgres::Config;

#[path = "shared/pg.rs"]
mod pg;

use pg::{drop_schema, private_schema, raw};

#[path = "shared/adversarial.rs"]
mod adversarial;

async fn store() -> Option<Arc<PostgresStore>> {
    or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).map(Arc::new)
}

// ---------------------------------------------------------------------------------------------
// Migration races
// ---------------------------------------------------------------------------------------------

async fn connect_many(config: &Config, n: usize) -> Vec<Result<PostgresStore, StoreError>> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let config = config.clone();
            tokio::spawn(async move { PostgresStore::connect_with(config, 1 + i % 3).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// Version, revision, and how many `idem_claim` functions (with and without owner token).
async fn schema_state(admin: &tokio_postgres::Client, schema: &str) -> (i64, i64, i64) {
    let meta = |name: &'static str| async move {
        let row = admin
            .query_one(&format!("SELECT value FROM {schema}.idem_meta WHERE name = $1"), &[&name])
            .await;
        row.expect(name).get::<_, i64>(0)
    };
    let (version, revision) = (meta("schema_version").await, meta("schema_revision").await);
    let functions: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proname = 'idem_claim'",
            &[&schema],
        )
        .await
        .expect("functions")
        .get(0);
    (version, revision, functions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stores_create_a_fresh_schema_at_once() {
    let Some(_) = store().await else { return };
    for round in 0..3 {
        let (schema, admin, config) = private_schema(&format!("fresh{round}")).await;
        let got = connect_many(&config, 12).await;
        let errors: Vec<String> =
            got.iter().filter_map(|r| r.as_ref().err().map(|e| format!("{e:?}"))).collect();
        let mut claims = Vec::new();
        if errors.is_empty() {
            let (key, fp) = fresh_key("fresh_schema", "{}");
            for s in &got {
                claims.push(s.as_ref().unwrap().claim(claim_req(&key, &fp)).await);
            }
        }
        let state = schema_state(&admin, &schema).await;
        drop(got);
        drop_schema(&admin, &schema).await;
        assert!(errors.is_empty(), "round {round}: {} connects failed: {errors:#?}", errors.len());
        assert_eq!(
            state,
            (2, idem_core::store::postgres::SCHEMA_REVISION, 3),
            "round {round}: version, revision, idem_claim count"
        );
        let acquired = claims.iter().filter(|c| matches!(c, Ok(Claim::Acquired { .. }))).count();
        assert_eq!(acquired, 1, "{claims:?}");
    }
}

/// A database or role whose default isolation is REPEATABLE READ or SERIALIZABLE: the stores
/// that waited for the schema lock while the first created the schema must see it, not the
/// snapshot taken before they waited (an `idem_records` without a version, a sequence that
/// already exists, a serialization failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stores_create_a_fresh_schema_at_once_under_snapshot_isolation() {
    let Some(_) = store().await else { return };
    for isolation in ["repeatable\\ read", "serializable"] {
        for round in 0..3 {
            let (schema, admin, mut config) = private_schema(&format!("freshiso{round}")).await;
            config.options(format!(
                "-c search_path={schema} -c default_transaction_isolation={isolation}"
            ));
            let got = connect_many(&config, 12).await;
            let errors: Vec<String> =
                got.iter().filter_map(|r| r.as_ref().err().map(|e| format!("{e:?}"))).collect();
            let state = schema_state(&admin, &schema).await;
            drop(got);
            drop_schema(&admin, &schema).await;
            assert!(errors.is_empty(), "{isolation}, round {round}: {errors:#?}");
            assert_eq!(state, (2, idem_core::store::postgres::SCHEMA_REVISION, 3));
        }
    }
}

/// Version 1 simulated: create the current schema, then take back what came after version 1.
async fn downgrade(admin: &tokio_postgres::Client, schema: &str) {
    pg::to_version_1(admin, schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_stores_migrate_version_1_at_once() {
    let Some(_) = store().await else { return };
    for round in 0..3 {
        let (schema, admin, config) = private_schema(&format!("v1race{round}")).await;
        let (key, fp) = fresh_key("v1race", "{}");
        let (held, _) = fresh_key("v1race", "held");
        let (done_fence, held_fence) = {
            let s = PostgresStore::connect_with(config.clone(), 1).await.expect("create");
            let f = acquire(&s, &key, &fp).await;
            s.complete(&key, f, &Outcome::Success("\"v1\"".into()), LONG).await.unwrap();
            (f, acquire(&s, &held, &fp).await)
        };
        downgrade(&admin, &schema).await;
        // Concurrently: a v1-era client keeps writing rows with plain SQL while stores migrate.
        let v1_writer = {
            let config = config.clone();
            tokio::spawn(async move {
                let c = raw(&config).await;
                for i in 0..50 {
                    let (k, fp) = fresh_key("v1writer", &i.to_string());
                    c.execute(
                        "INSERT INTO idem_records (key, fingerprint, fence, state, lease_until) \
                         VALUES ($1, $2, nextval('idem_fence'), 0, now() + interval '30 s')",
                        &[&k.as_str(), &fp.as_str()],
                    )
                    .await
                    .expect("v1 insert");
                }
            })
        };
        let got = connect_many(&config, 12).await;
        v1_writer.await.expect("v1 writer");
        let errors: Vec<String> =
            got.iter().filter_map(|r| r.as_ref().err().map(|e| format!("{e:?}"))).collect();
        let mut answers = Vec::new();
        for s in got.iter().flatten() {
            answers
                .push((s.claim(claim_req(&key, &fp)).await, s.claim(claim_req(&held, &fp)).await));
        }
        let state = schema_state(&admin, &schema).await;
        drop(got);
        drop_schema(&admin, &schema).await;
        assert!(errors.is_empty(), "round {round}: {} connects failed: {errors:#?}", errors.len());
        assert_eq!(
            state,
            (2, idem_core::store::postgres::SCHEMA_REVISION, 3),
            "round {round}: version, revision, idem_claim count"
        );
        for (done, inflight) in answers {
            assert_eq!(
                done.unwrap(),
                Claim::Completed(Record {
                    fingerprint: fp,
                    outcome: Outcome::Success("\"v1\"".into())
                })
            );
            match inflight.unwrap() {
                Claim::InFlight { fence, .. } => assert_eq!(fence, held_fence),
                other => panic!("{other:?}"),
            }
        }
        let _ = done_fence;
    }
}

/// A migration's `ALTER TABLE` waits for every open transaction on `idem_records`, and every
/// statement after it waits behind it: a session left idle in a transaction (an operator's
/// `psql`) would stop every running store's claims for as long as the new store's opening
/// waited. The opener gives way instead, and migrates once the session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_behind_an_open_transaction_does_not_stop_the_running_stores() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("lockqueue").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("create"));
    pg::to_revision_0(&admin, &schema).await;
    let idle = raw(&config).await;
    idle.batch_execute("BEGIN; SELECT count(*) FROM idem_records").await.unwrap();
    let opener = tokio::spawn(PostgresStore::connect_with(config.clone(), 1));
    // Until the opener asks for its lock on the table.
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE relation = '{schema}.idem_records'::regclass \
         AND mode = 'AccessExclusiveLock' AND NOT granted"
    );
    while admin.query_one(&waiting, &[]).await.unwrap().get::<_, i64>(0) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A running store's read; bounded so that the test ends when it is stopped.
    let reader = raw(&config).await;
    reader.batch_execute("SET statement_timeout = '20s'").await.unwrap();
    let read = reader.query_one("SELECT count(*) FROM idem_records", &[]).await.map(drop);
    idle.batch_execute("COMMIT").await.unwrap();
    let opened = opener.await.unwrap();
    let state = schema_state(&admin, &schema).await;
    drop_schema(&admin, &schema).await;
    read.expect("a read while the opener waits for the idle session");
    opened.expect("opens once the session ended");
    assert_eq!(state, (2, idem_core::store::postgres::SCHEMA_REVISION, 3));
}

/// A search_path whose first schema is empty (a role's own schema, made after idem's tables in
/// the next one): the store's statements reach the tables of the next schema, and a migration
/// brings those up to date, rather than calling them a table without a schema version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_later_in_search_path_are_migrated_where_they_are() {
    let Some(_) = store().await else { return };
    let (held, admin, config) = private_schema("path_held").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("create"));
    pg::to_revision_0(&admin, &held).await;
    let (first, _, mut both) = private_schema("path_first").await;
    both.options(format!("-c search_path={first},{held}"));
    let opened = PostgresStore::connect_with(both, 1).await;
    let claimed = match &opened {
        Ok(store) => {
            let (key, fp) = fresh_key("path_held", "{}");
            store.claim(claim_req(&key, &fp)).await.map(drop)
        }
        Err(e) => Err(e.clone()),
    };
    let state = match claimed {
        Ok(()) => Some(schema_state(&admin, &held).await),
        Err(_) => None,
    };
    let created_first: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1",
            &[&first],
        )
        .await
        .unwrap()
        .get(0);
    drop(opened);
    drop_schema(&admin, &first).await;
    drop_schema(&admin, &held).await;
    claimed.expect("opens and claims");
    assert_eq!(state, Some((2, idem_core::store::postgres::SCHEMA_REVISION, 3)));
    assert_eq!(created_first, 0, "nothing is created in the empty first schema");
}

/// Dropping idem's two tables, the way a store is emptied by hand, leaves the fence sequence and
/// the functions behind: the next opening creates the tables again, and fences go on above the
/// sequence's last one rather than the opening failing on a sequence that already exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_tables_were_dropped_by_hand_opens_again() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("dropped").await;
    let (key, fp) = fresh_key("dropped", "{}");
    let before = {
        let first = PostgresStore::connect_with(config.clone(), 1).await.expect("create");
        acquire(&first, &key, &fp).await
    };
    admin
        .batch_execute(&format!("DROP TABLE {schema}.idem_records, {schema}.idem_meta"))
        .await
        .unwrap();
    let again = match PostgresStore::connect_with(config.clone(), 1).await {
        Ok(store) => store.claim(claim_req(&key, &fp)).await,
        Err(e) => Err(e),
    };
    let state = match again {
        Ok(_) => Some(schema_state(&admin, &schema).await),
        Err(_) => None,
    };
    drop_schema(&admin, &schema).await;
    match again.expect("opens again and claims") {
        Claim::Acquired { fence, .. } => assert!(fence > before, "{fence:?} after {before:?}"),
        other => panic!("the key was dropped with its table: {other:?}"),
    }
    assert_eq!(state, Some((2, idem_core::store::postgres::SCHEMA_REVISION, 3)));
}

/// Stores on a fresh schema and on a v1 schema at once, with a claim running on the v1 schema from
/// a store that connected before the downgrade (its prepared statement calls a function that is
/// dropped and re-created under it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_connected_before_downgrade_keeps_working_after_migration() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("prepared").await;
    let early = PostgresStore::connect_with(config.clone(), 1).await.expect("create");
    let (key, fp) = fresh_key("prepared", "{}");
    let f = acquire(&early, &key, &fp).await;
    downgrade(&admin, &schema).await;
    let late = PostgresStore::connect_with(config.clone(), 1).await;
    let after = early.claim(claim_req(&key, &fp)).await;
    let again = early.claim(claim_req(&key, &fp)).await;
    drop(late);
    drop(early);
    drop_schema(&admin, &schema).await;
    eprintln!("after: {after:?}; again: {again:?}");
    match again {
        Ok(Claim::InFlight { fence, .. }) => assert_eq!(fence, f),
        other => {
            panic!("a store connected before the migration answered {other:?} (first {after:?})")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Concurrency and wake-ups
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_on_other_instances_wake() {
    let Some(first) = store().await else { return };
    let mut s: Vec<Arc<dyn Store>> = vec![first];
    for _ in 0..3 {
        s.push(Arc::new(PostgresStore::connect(&pg_url()).await.expect("connect")));
    }
    adversarial::every_end_wakes_waiters(&s).await;
}

/// Many simultaneous takeovers of one expired lease from several stores: exactly one acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_takeovers_many_stores() {
    let Some(first) = store().await else { return };
    let mut stores: Vec<Arc<PostgresStore>> = vec![first];
    for _ in 0..3 {
        stores.push(Arc::new(PostgresStore::connect(&pg_url()).await.expect("connect")));
    }
    for round in 0..10 {
        let (key, fp) = fresh_key("takeovers", &round.to_string());
        let short = ClaimRequest {
            key: &key,
            fingerprint: &fp,
            lease: Duration::from_millis(100),
            on_expired: OnExpired::TakeOver,
            origin: Default::default(),
        };
        let Claim::Acquired { fence: first, .. } = stores[0].claim(short).await.unwrap() else {
            panic!()
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let s = Arc::clone(&stores[i % 4]);
                tokio::spawn(async move { s.claim(claim_req(&key, &fp)).await })
            })
            .collect();
        let mut won = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(Claim::Acquired { fence, takeover }) => won.push((fence, takeover)),
                Ok(Claim::InFlight { .. }) => {}
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        assert!(won[0].0 > first && won[0].1, "{won:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_round_trip() {
    let Some(store) = store().await else { return };
    let big = format!("\"{}\"", "x|\n".repeat(3 * 1024 * 1024));
    let payloads = [
        "\"a|b|c\"".to_owned(),
        "\"line\nbreak\r\n\"".to_owned(),
        "\"ünïcødé ✓ 🎉 \u{10FFFF}\"".to_owned(),
        "\"\\u0000\"".to_owned(),
        String::new(),
        big,
    ];
    for p in payloads {
        for outcome in [Outcome::Success(p.clone()), Outcome::Failure(p.clone())] {
            let (key, fp) = fresh_key("payloads", "{}");
            let fence = acquire(&*store, &key, &fp).await;
            store.complete(&key, fence, &outcome, LONG).await.unwrap();
            let got = store.claim(claim_req(&key, &fp)).await.unwrap();
            assert!(
                got == Claim::Completed(Record { fingerprint: fp, outcome: outcome.clone() }),
                "the store answered {got:?}"
            );
        }
    }
}

/// A not-storable reason is plain text, not JSON, and may carry a NUL (from the output's own
/// strings): it is stored with U+FFFD in its place, where the completion used to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_storable_reason_with_a_nul_is_stored() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("nul-reason", "{}");
    let fence = acquire(&*store, &key, &fp).await;
    let outcome = Outcome::NotStorable("map key \"a\u{0}b\" is not a string".into());
    store.complete(&key, fence, &outcome, LONG).await.unwrap();
    let stored = Outcome::NotStorable("map key \"a\u{FFFD}b\" is not a string".into());
    let got = store.claim(claim_req(&key, &fp)).await.unwrap();
    assert!(got == Claim::Completed(Record { fingerprint: fp, outcome: stored }), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_fences_are_lease_lost() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("extreme_fences", "{}");
    let fence = acquire(&*store, &key, &fp).await;
    for f in [
        Fence(0),
        Fence(u64::MAX),
        Fence(i64::MAX as u64),
        Fence(1 << 63),
        Fence(fence.0 + 1),
        Fence(fence.0 - 1),
    ] {
        let r = store.complete(&key, f, &Outcome::Unknown, LONG).await;
        assert!(matches!(r, Err(StoreError::LeaseLost)), "complete {f:?}: {r:?}");
        let r = store.release(&key, f).await;
        assert!(matches!(r, Err(StoreError::LeaseLost)), "release {f:?}: {r:?}");
        let r = store.renew(&key, f, LONG).await;
        assert!(matches!(r, Err(StoreError::LeaseLost)), "renew {f:?}: {r:?}");
        store.wait(&key, f, Duration::from_millis(20)).await.unwrap();
    }
    store.complete(&key, fence, &Outcome::Unknown, LONG).await.unwrap();
}

/// The fence sequence restarted below the fences the rows hold: a table restored without its
/// sequence (`pg_dump -t`), or a logical replica promoted (PostgreSQL does not replicate
/// sequences). A takeover of a lease that ended, and a claim of a record whose retention ended,
/// still get a fence above the row's: a downstream that keeps the highest fence it saw accepts
/// the new owner, and the dead owner's late completion is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_still_rise_per_key_after_the_fence_sequence_restarted_below_them() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let (schema, admin, config) = private_schema("fence_restart").await;
    let store = PostgresStore::connect_with(config, 2).await.expect("create");
    admin.batch_execute(&format!("SELECT setval('{schema}.idem_fence', 1000)")).await.unwrap();
    let restart = format!("ALTER SEQUENCE {schema}.idem_fence RESTART WITH 1");
    let (key, fp) = fresh_key("fence_restart", "{}");
    let zero = ClaimRequest { lease: Duration::ZERO, ..claim_req(&key, &fp) };
    let Claim::Acquired { fence: dead, .. } = store.claim(zero).await.unwrap() else { panic!() };
    admin.batch_execute(&restart).await.unwrap();
    let got = store.claim(claim_req(&key, &fp)).await.unwrap();
    let Claim::Acquired { fence: taker, takeover: true } = got else { panic!("{got:?}") };
    assert!(taker > dead, "the takeover's fence {taker:?} must be above the dead owner's {dead:?}");
    let late = store.complete(&key, dead, &Outcome::Success("1".into()), LONG).await;
    assert!(matches!(late, Err(StoreError::LeaseLost)), "the dead owner completed: {late:?}");
    // Retention that ended: the next owner's fence is above the completed record's too.
    store.complete(&key, taker, &Outcome::Success("2".into()), Duration::ZERO).await.unwrap();
    admin.batch_execute(&restart).await.unwrap();
    let got = store.claim(claim_req(&key, &fp)).await.unwrap();
    let Claim::Acquired { fence: next, takeover: false } = got else { panic!("{got:?}") };
    assert!(next > taker, "the fence {next:?} after retention must be above {taker:?}");
    drop(store);
    drop_schema(&admin, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_leases_and_retention() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("zero", "{}");
    let zero = ClaimRequest { lease: Duration::ZERO, ..claim_req(&key, &fp) };
    let Claim::Acquired { fence: f1, .. } = store.claim(zero).await.unwrap() else { panic!() };
    let got = store.claim(claim_req(&key, &fp)).await.unwrap();
    let Claim::Acquired { fence: f2, takeover: true } = got else { panic!("{got:?}") };
    assert!(f2 > f1, "{:?} must be above {:?}", f2, f1);
    store.complete(&key, f2, &Outcome::Success("1".into()), Duration::ZERO).await.unwrap();
    let got = store.claim(claim_req(&key, &fp)).await.unwrap();
    let Claim::Acquired { fence: f3, takeover: false } = got else { panic!("{got:?}") };
    assert!(f3 > f2, "{:?} must be above {:?}", f3, f2);
    store.wait(&key, f3, Duration::MAX).await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_max_duration_returns_on_release() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("wait_max", "{}");
    let fence = acquire(&*store, &key, &fp).await;
    let w = tokio::spawn({
        let store = Arc::clone(&store);
        async move { store.wait(&key, fence, Duration::MAX).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.release(&key, fence).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), w).await.unwrap().unwrap().unwrap();
}

/// Rows this version does not write must be refused as Incompatible. Outcome columns already
/// are (kind 1 without payload, kind 3 with one, no kind). Held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_outcome_columns() {
    assert_tampered_rows_are_incompatible(&[
        "state = 1, kind = NULL, payload = NULL, expires_at = now() + interval '1 h'",
        "state = 1, kind = 1, payload = NULL, expires_at = now() + interval '1 h'",
        "state = 1, kind = 3, payload = 'x', expires_at = now() + interval '1 h'",
    ])
    .await;
}

// ---------------------------------------------------------------------------------------------
// Regressions: each of these failed when written (2026-11-30) and was fixed
// ---------------------------------------------------------------------------------------------

/// `Duration::MAX` means "no limit" (the policy says so; the Redis and in-memory stores cap it at
/// 100 years). Expected: the same here, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_lease_and_retention_are_accepted() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("duration_max", "{}");
    let r = store.claim(ClaimRequest { lease: Duration::MAX, ..claim_req(&key, &fp) }).await;
    assert!(matches!(r, Ok(Claim::Acquired { .. })), "claim with lease Duration::MAX: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_retention_and_renewal_are_accepted() {
    let Some(store) = store().await else { return };
    let (key, fp) = fresh_key("duration_max", "ttl");
    let fence = acquire(&*store, &key, &fp).await;
    let renewed = store.renew(&key, fence, Duration::MAX).await;
    let done = store.complete(&key, fence, &Outcome::Success("1".into()), Duration::MAX).await;
    assert!(renewed.is_ok(), "renew with lease Duration::MAX: {renewed:?}");
    assert!(done.is_ok(), "complete with ttl Duration::MAX: {done:?}");
}

/// Fences are "strictly increasing for a key over the life of the store" (store contract), and
/// tools receive them as fencing tokens (`Ctx::fence`). Workers on four stores claim one key and
/// release it at once; acquisitions are exclusive, so the order in which they are answered is the
/// order of ownership, and each fence must be above the previous one.
///
/// The claim's upsert evaluated `nextval('idem_fence')` before its conflict check, so a claim
/// that waited on another claim's row could acquire with a fence drawn before the previous
/// owner's (about 1% of acquisitions here). Claims that may write now take the key's advisory
/// lock before drawing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fences_increase_across_owners_under_contention() {
    let Some(first) = store().await else { return };
    let mut stores: Vec<Arc<dyn Store>> = vec![first];
    for _ in 0..3 {
        stores.push(Arc::new(PostgresStore::connect(&pg_url()).await.expect("connect")));
    }
    let (count, backwards) =
        adversarial::owner_order_fences(stores, 32, Duration::from_secs(8)).await;
    assert!(count > 100, "only {count} acquisitions");
    assert!(
        backwards.is_empty(),
        "{} of {count} acquisitions got a fence not above the previous owner's: (previous, next) {:?}",
        backwards.len(),
        &backwards[..backwards.len().min(10)]
    );
}

/// Rows this version does not write (a future state, NULL lease or retention, a negative fence,
/// a fingerprint that is not 64 hex digits) must be Incompatible, never "unavailable, retry
/// later" and never an answer built from them (such rows used to be taken for free rows and the
/// claim re-sent until it gave up with "kept racing concurrent writers").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_rows_are_incompatible() {
    assert_tampered_rows_are_incompatible(&[
        "state = 7",
        "state = 7, expires_at = now() - interval '1 s'",
        "lease_until = NULL",
        "state = 1, kind = 1, payload = '1', expires_at = NULL",
        "fence = -5",
        "fingerprint = 'abc'",
    ])
    .await;
}

/// A database whose idem_meta says version 2 but whose idem_claim function is missing (tables
/// restored without functions, e.g. `pg_dump -t 'idem_*'`). Expected: Incompatible naming the
/// missing function, not "unavailable, retry later".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_2_without_the_claim_function_is_incompatible() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("nofn").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("create"));
    let drop_fn = format!(
        "DROP FUNCTION {schema}.idem_claim(text, text, bigint, boolean, text, text, text, text)"
    );
    admin.batch_execute(&drop_fn).await.expect("drop fn");
    let got = PostgresStore::connect_with(config, 1).await;
    drop_schema(&admin, &schema).await;
    match got {
        Err(StoreError::Incompatible(m)) => assert!(m.contains("idem_claim"), "{m}"),
        other => panic!("connect answered {other:?}"),
    }
}

/// For each `SET` clause: a fresh record, changed behind the store's back, must make the claim
/// answer Incompatible (never a replay, a lease or "unavailable"). Reports every case that did
/// not.
async fn assert_tampered_rows_are_incompatible(cases: &[&str]) {
    let Some(store) = store().await else { return };
    let admin = pg::admin().await;
    let mut wrong = Vec::new();
    for case in cases {
        let (key, fp) = fresh_key("tampered_rows", case);
        acquire(&*store, &key, &fp).await;
        admin
            .execute(&format!("UPDATE idem_records SET {case} WHERE key = $1"), &[&key.as_str()])
            .await
            .expect("tamper");
        let got = store.claim(claim_req(&key, &fp)).await;
        store.forget(&key).await.unwrap();
        if !matches!(got, Err(StoreError::Incompatible(_))) {
            wrong.push(format!("{case}: claim answered {got:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} tampered rows:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

/// Index scans of `index` in `schema` so far (as the statistics collector has them).
async fn index_scans(admin: &tokio_postgres::Client, schema: &str, index: &str) -> i64 {
    let row = admin
        .query_one(
            "SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes \
             WHERE schemaname = $1 AND indexrelname = $2",
            &[&schema, &index],
        )
        .await
        .expect("index statistics");
    row.get(0)
}

/// The steps that find a record by key and fence (complete, release, renew, wait) must read it
/// by the primary key. With `state = 0` among their conditions the planner preferred the listing
/// index `(state, kind, key)`, whose only usable condition is then `state = 0`: each of them
/// scanned every in-flight entry of that index, and the entries completed records leave behind
/// until a vacuum, so every first call cost more the more first calls had run before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_by_key_and_fence_read_the_primary_key() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let (schema, admin, config) = private_schema("bykey").await;
    // One connection: its statistics reach the collector together, at the latest when it closes.
    let store = PostgresStore::connect_with(config, 1).await.expect("create");
    let done = Outcome::Success("{}".into());
    // What a store that has run a while holds: completed records, a few in flight.
    for i in 0..300 {
        let (key, fp) = fresh_key("bykey-seed", &i.to_string());
        let fence = acquire(&store, &key, &fp).await;
        if i % 50 != 0 {
            store.complete(&key, fence, &done, LONG).await.expect("complete");
        }
    }
    admin.batch_execute(&format!("ANALYZE {schema}.idem_records")).await.expect("analyze");
    let scans = || async {
        let pkey = index_scans(&admin, &schema, "idem_records_pkey").await;
        (pkey, index_scans(&admin, &schema, "idem_records_state").await)
    };
    let (pkey_before, state_before) = scans().await;
    for i in 0..20 {
        let (key, fp) = fresh_key("bykey", &i.to_string());
        let fence = acquire(&store, &key, &fp).await;
        store.renew(&key, fence, LONG).await.expect("renew");
        // Marks the holder as waited on, then polls it, until the deadline.
        store.wait(&key, fence, Duration::from_millis(5)).await.expect("wait");
        if i % 2 == 0 {
            store.complete(&key, fence, &done, LONG).await.expect("complete");
        } else {
            store.release(&key, fence).await.expect("release");
        }
    }
    drop(store);
    // The closed connection's statistics arrive a moment later: at least a claim, a renewal, a
    // wait and a completion or release each, through one index or the other.
    let (mut pkey, mut state) = (pkey_before, state_before);
    for _ in 0..100 {
        (pkey, state) = scans().await;
        if pkey + state >= pkey_before + state_before + 80 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop_schema(&admin, &schema).await;
    assert!(
        pkey + state >= pkey_before + state_before + 80,
        "the steps' statistics never arrived ({pkey} + {state})"
    );
    assert_eq!(state - state_before, 0, "steps by key and fence scanned the listing index");
}

/// Another session holds row locks on the records (an operator's open transaction, another
/// process mid-statement): claims that only read answer at once and right (a replay, a live
/// lease, a never tool's ended lease, a mismatch), and the owner's completion, found by the
/// primary key, waits for the lock rather than failing, then completes what the replay reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_while_another_session_holds_the_rows() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let (schema, admin, config) = private_schema("rowlock").await;
    let store = Arc::new(PostgresStore::connect_with(config, 2).await.expect("create"));
    let (done, done_fp) = fresh_key("rowlock", "done");
    let (held, held_fp) = fresh_key("rowlock", "held");
    let (ended, ended_fp) = fresh_key("rowlock", "ended");
    let (_, other_fp) = fresh_key("rowlock", "other");
    let ok = Outcome::Success("{\"id\":\"ch_1\"}".into());
    let f = acquire(&*store, &done, &done_fp).await;
    store.complete(&done, f, &ok, LONG).await.expect("complete");
    let held_fence = acquire(&*store, &held, &held_fp).await;
    let short = ClaimRequest { lease: Duration::from_millis(1), ..claim_req(&ended, &ended_fp) };
    assert!(matches!(store.claim(short).await, Ok(Claim::Acquired { .. })));
    tokio::time::sleep(Duration::from_millis(20)).await;

    admin
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {schema}.idem_records WHERE key IN ('{done}', '{held}', \
             '{ended}') FOR UPDATE"
        ))
        .await
        .expect("row locks");
    let bounded = |c| tokio::time::timeout(Duration::from_secs(5), c);
    let got = bounded(store.claim(claim_req(&done, &done_fp))).await.expect("no wait");
    assert_eq!(
        got.unwrap(),
        Claim::Completed(Record { fingerprint: done_fp, outcome: ok.clone() })
    );
    match bounded(store.claim(claim_req(&held, &held_fp))).await.expect("no wait").unwrap() {
        Claim::InFlight { fence, .. } => assert_eq!(fence, held_fence),
        other => panic!("{other:?}"),
    }
    let never = ClaimRequest { on_expired: OnExpired::Unknown, ..claim_req(&ended, &ended_fp) };
    assert_eq!(bounded(store.claim(never)).await.expect("no wait").unwrap(), Claim::Unknown);
    let got = bounded(store.claim(claim_req(&done, &other_fp))).await.expect("no wait");
    assert_eq!(got.unwrap(), Claim::Mismatch);

    let completing = tokio::spawn({
        let (store, ok) = (Arc::clone(&store), ok.clone());
        async move { store.complete(&held, held_fence, &ok, LONG).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!completing.is_finished(), "the completion must wait: {:?}", completing.await);
    admin.batch_execute("COMMIT").await.expect("unlock");
    let got = tokio::time::timeout(Duration::from_secs(5), completing).await;
    let got = got.expect("completed once unlocked").unwrap();
    assert!(got.is_ok(), "{got:?}");
    let got = store.claim(claim_req(&held, &held_fp)).await.unwrap();
    assert_eq!(got, Claim::Completed(Record { fingerprint: held_fp, outcome: ok }));
    drop(store);
    drop_schema(&admin, &schema).await;
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("declined")]
struct Declined;

impl idem_core::Classify for Declined {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

static NUL_RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[idem_core::tool(retry = "keyed")]
async fn open_ticket(title: String) -> Result<String, Declined> {
    NUL_RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(title)
}

/// A run id and tenant with a NUL character (an MCP client's `_meta["idem/run"]` can carry one):
/// PostgreSQL's `text` refuses NUL, and every call failed as "store unavailable". The origin is
/// now stored with U+FFFD in its place; the key is derived from the strings as given, so the
/// repeat replays, and a listing by that run finds the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_id_with_a_nul_character_is_stored_and_replayed() {
    let Some(store) = store().await else { return };
    let run_id = format!("conv\u{0}{}", process_tag());
    let idem = idem_core::Idem::new((*store).clone());
    let run = idem.scope(idem_core::Scope::run(run_id.clone()).with_tenant("acme\u{0}"));
    let title = "printer \u{0} jam".to_owned();
    assert_eq!(open_ticket(&run, title.clone()).await.unwrap(), title);
    let (again, report) =
        run.call_reported(&OpenTicketTool, OpenTicketArgs::new(title.clone())).await;
    assert_eq!(again.unwrap(), title);
    assert_eq!(report.unwrap().served, Some(idem_core::Served::Replayed));
    assert_eq!(NUL_RUNS.load(std::sync::atomic::Ordering::SeqCst), 1, "one ticket");

    let query =
        idem_core::store::ListQuery { run_prefix: Some(run_id.clone()), ..Default::default() };
    let page = store.list(&query).await.unwrap();
    assert_eq!(page.records.len(), 1, "{page:?}");
    let origin = page.records[0].origin.clone().unwrap();
    assert_eq!(origin.run, run_id.replace('\u{0}', "\u{FFFD}"));
    assert_eq!((origin.tool.as_str(), origin.tenant.as_str()), ("open_ticket", "acme\u{FFFD}"));
}

static LONG_RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[idem_core::tool(retry = "keyed")]
async fn open_long_ticket(title: String) -> Result<String, Declined> {
    LONG_RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(title)
}

/// A run id of 100,000 characters (nothing bounds an MCP client's `_meta["idem/run"]`): the run id
/// is indexed for listing, and PostgreSQL refuses a B-tree entry over 2,704 bytes (SQLSTATE
/// 54000), so every such call failed as "store unavailable". The record keeps the first 1,024
/// bytes; the key is derived from the whole run id, so another long run id with the same first
/// kilobyte is another intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_id_longer_than_an_index_entry_is_stored_and_replayed() {
    let Some(store) = store().await else { return };
    let idem = idem_core::Idem::new((*store).clone());
    // This process's tag, then letters in no repeating pattern, so that PostgreSQL cannot
    // compress the entry under its limit.
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    let letters = (0..100_000).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        char::from(b'a' + (x % 26) as u8)
    });
    let stem: String = process_tag().chars().chain(letters).collect();
    let title = "long run".to_owned();
    for (n, run_id) in [format!("{stem}-1"), format!("{stem}-2")].into_iter().enumerate() {
        let run = idem.run(run_id);
        assert_eq!(open_long_ticket(&run, title.clone()).await.unwrap(), title);
        let (again, report) =
            run.call_reported(&OpenLongTicketTool, OpenLongTicketArgs::new(title.clone())).await;
        assert_eq!(again.unwrap(), title);
        assert_eq!(report.unwrap().served, Some(idem_core::Served::Replayed), "run {n}");
    }
    assert_eq!(LONG_RUNS.load(std::sync::atomic::Ordering::SeqCst), 2, "one ticket per run");
    let query = idem_core::store::ListQuery {
        run_prefix: Some(stem[..2000].to_owned()),
        tool: Some("open_long_ticket".into()),
        ..Default::default()
    };
    let page = store.list(&query).await.unwrap();
    assert_eq!(page.records.len(), 2, "{page:?}");
    for record in &page.records {
        assert_eq!(record.origin.as_ref().unwrap().run, &stem[..1024]);
    }
}

/// A database or role whose default isolation is REPEATABLE READ or SERIALIZABLE answers a
/// claim that races another claim's insert with SQLSTATE 40001 (the store's plpgsql relies on
/// READ COMMITTED's fresh snapshot per statement). The store runs such a statement again, in a
/// new transaction that sees the winner's row: exactly one claim acquires, the others find it in
/// flight, and none reports the store unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_under_repeatable_read_and_serializable_join_the_winner() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    for isolation in ["repeatable\\ read", "serializable"] {
        let (schema, admin, mut config) = private_schema("isolation").await;
        config.options(format!(
            "-c search_path={schema} -c default_transaction_isolation={isolation}"
        ));
        let mut stores = Vec::new();
        for _ in 0..8 {
            stores.push(Arc::new(PostgresStore::connect_with(config.clone(), 2).await.unwrap()));
        }
        for round in 0..12 {
            let (key, fp) = fresh_key(&format!("isolation_{round}_{}", process_tag()), "{}");
            let claims: Vec<_> = stores
                .iter()
                .map(|store| {
                    let store = Arc::clone(store);
                    tokio::spawn(async move { store.claim(claim_req(&key, &fp)).await })
                })
                .collect();
            let mut acquired = 0;
            for claim in claims {
                match claim.await.unwrap() {
                    Ok(Claim::Acquired { .. }) => acquired += 1,
                    Ok(Claim::InFlight { .. }) => {}
                    other => panic!("{isolation}, round {round}: {other:?}"),
                }
            }
            assert_eq!(acquired, 1, "{isolation}, round {round}");
        }
        drop(stores);
        drop_schema(&admin, &schema).await;
    }
}

/// What the server refuses for the role, the database or the schema is a configuration error
/// naming it, not "unavailable, retry when the store is back": a database that does not exist,
/// a role without privileges on idem's tables (its claims fail closed: nothing runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_role_or_database_is_a_configuration_error() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let mut missing = Config::from_str(&pg_url()).unwrap();
    missing.dbname(format!("idem_test_no_such_db_{}", process_tag()));
    match PostgresStore::connect_with(missing, 1).await {
        Err(StoreError::InvalidConfig(m)) => assert!(m.contains("3D000"), "{m}"),
        other => panic!("a database that does not exist: {:?}", other.map(drop)),
    }

    let (schema, admin, config) = private_schema("privileges").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.unwrap());
    let (role, as_reader) = pg::login_role(&admin, &schema, "reader", &config).await;
    // Refused when the store opens, not at its first claim.
    let refused = PostgresStore::connect_with(as_reader, 1).await.map(drop);
    drop_schema(&admin, &schema).await;
    pg::drop_role(&admin, &role).await;
    match refused {
        Err(StoreError::InvalidConfig(m)) => assert!(m.contains("42501"), "{m}"),
        other => panic!("a role without privileges: {other:?}"),
    }
}

/// Managed databases split roles: one creates and migrates idem's tables, the application's
/// role only uses them. That role is told what to grant when the tables are missing, what to do
/// when they are of an older revision, and that a `search_path` names no schema, rather than
/// "permission denied for schema"; given the grants the message names, it works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_not_create_the_schema_is_told_what_to_do() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let (schema, admin, config) = private_schema("split_roles").await;
    let (role, as_app) = pg::login_role(&admin, &schema, "app", &config).await;
    let refused = async |config: &Config| match PostgresStore::connect_with(config.clone(), 1).await
    {
        Err(StoreError::InvalidConfig(m)) => m,
        other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
    };

    let m = refused(&as_app).await;
    let grants = [
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.idem_records TO {role}"),
        format!("GRANT SELECT ON {schema}.idem_meta TO {role}"),
        format!("GRANT USAGE ON SEQUENCE {schema}.idem_fence TO {role}"),
        format!("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}"),
    ];
    for grant in &grants {
        assert!(m.contains(grant.as_str()), "{grant:?} in {m}");
    }
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("the owner creates"));
    // Hardened databases revoke execution of new functions from PUBLIC.
    admin
        .batch_execute(&format!("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} FROM PUBLIC"))
        .await
        .unwrap();
    admin.batch_execute(&grants.join("; ")).await.unwrap();
    let app = PostgresStore::connect_with(as_app.clone(), 1).await.expect("the granted role");
    let (key, fp) = fresh_key("split_roles", "{}");
    let fence = acquire(&app, &key, &fp).await;
    app.complete(&key, fence, &Outcome::Success("1".into()), LONG).await.expect("completes");
    drop(app);

    pg::to_revision_0(&admin, &schema).await;
    let m = refused(&as_app).await;
    assert!(m.contains("revision 0") && m.contains("the role that owns the tables"), "{m}");
    // The role's own schema first in search_path: the tables are still named where they are.
    let own = format!("{schema}_own");
    admin.batch_execute(&format!("CREATE SCHEMA {own} AUTHORIZATION {role}")).await.unwrap();
    let mut own_first = as_app.clone();
    own_first.options(format!("-c search_path={own},{schema}"));
    let m = refused(&own_first).await;
    assert!(m.contains(&format!("idem's tables in schema {schema} ")), "{m}");
    admin.batch_execute(&format!("DROP SCHEMA {own} CASCADE")).await.unwrap();

    let mut nowhere = as_app.clone();
    nowhere.options(format!("-c search_path={schema}_missing"));
    let m = refused(&nowhere).await;
    assert!(m.contains("no schema of search_path"), "{m}");

    drop_schema(&admin, &schema).await;
    pg::drop_role(&admin, &role).await;
}

/// A role that may read idem's tables but not write them (one made for looking at the store, or
/// grants on the tables that forgot the fence sequence) is refused when the application's store
/// opens, naming the grants missing, rather than opening and failing every call; a tool that
/// only looks at the store opens with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_may_only_read_is_refused_at_open_with_the_grants_missing() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let (schema, admin, config) = private_schema("read_only_role").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("the owner creates"));
    let (role, as_viewer) = pg::login_role(&admin, &schema, "viewer", &config).await;
    admin
        .batch_execute(&format!("GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}"))
        .await
        .unwrap();
    let reader = PostgresStore::connect_with(as_viewer.clone(), 1).await.map(drop);
    let target = pg::target();
    let (host, port) = target.rsplit_once(':').unwrap();
    let mut url = format!("host={host} port={port} user={role} options='-c search_path={schema}'");
    if let Some(db) = config.get_dbname() {
        url.push_str(&format!(" dbname={db}"));
    }
    let looker = PostgresStore::connect_existing(&url).await.map(drop);
    admin
        .batch_execute(&format!("GRANT INSERT, UPDATE, DELETE ON {schema}.idem_records TO {role}"))
        .await
        .unwrap();
    let no_sequence = PostgresStore::connect_with(as_viewer.clone(), 1).await.map(drop);
    drop_schema(&admin, &schema).await;
    pg::drop_role(&admin, &role).await;
    match reader {
        Err(StoreError::InvalidConfig(m)) => assert!(
            m.contains(&format!("GRANT INSERT, UPDATE, DELETE ON {schema}.idem_records TO {role}"))
                && m.contains(&format!("GRANT USAGE ON SEQUENCE {schema}.idem_fence TO {role}")),
            "{m}"
        ),
        other => panic!("a role that may only read: {other:?}"),
    }
    looker.expect("a tool that only looks at the store opens");
    match no_sequence {
        Err(StoreError::InvalidConfig(m)) => {
            assert!(m.contains("idem_fence") && !m.contains("idem_records TO"), "{m}");
        }
        other => panic!("grants without the sequence: {other:?}"),
    }
}

/// Tables that lack one of idem's functions (dropped by hand, a partial restore) are refused as
/// incompatible with what to do, by the check that every statement the store uses is there, not
/// by the check of the role's privileges failing on the function's name first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_without_a_function_are_incompatible_not_a_failed_privilege_check() {
    if or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await).is_none() {
        return;
    }
    let (schema, admin, config) = private_schema("missing_function").await;
    drop(PostgresStore::connect_with(config.clone(), 1).await.expect("creates"));
    admin
        .batch_execute(&format!(
            "DROP FUNCTION {schema}.idem_claim_fresh(text, text, bigint, text, text, text, text)"
        ))
        .await
        .unwrap();
    let opened = PostgresStore::connect_with(config, 1).await.map(drop);
    drop_schema(&admin, &schema).await;
    match opened {
        Err(StoreError::Incompatible(m)) => {
            assert!(m.contains("lacks a function") && m.contains("re-create the schema"), "{m}");
        }
        other => panic!("tables without a function: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// A call cancelled while its claim waits
// ---------------------------------------------------------------------------------------------

static WIRES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Sends money once: never retried.
#[idem_core::tool(retry = "never")]
async fn wire_once(to: String) -> Result<String, idem_core::ToolFailure> {
    WIRES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(format!("sent to {to}"))
}

/// A call cancelled while its claim waits in PostgreSQL (a timeout around the call, a
/// `select!`, a client that left): the claim statement runs on and commits after its future is
/// gone. The executor finishes it in the background and releases what it acquired, so the
/// repeat runs the tool once. Before, the record stayed in flight with no owner, and the never
/// tool's repeat waited out the 30 s lease to answer "outcome unknown" for a call that never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_while_its_claim_waits_leaves_no_record_behind() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("cancelled_claim").await;
    let store = Arc::new(PostgresStore::connect_with(config, 2).await.expect("connect"));
    let idem = idem_core::Idem::builder_shared(store).build();
    let run = idem.run(format!("cancelled-{}", process_tag()));
    // Both connections of the pool open and idle, so that a step after the claim's may run on
    // the other one.
    let warm: Vec<_> = (0..4).map(|i| wire_once(&run, format!("warm-{i}"))).collect();
    for w in futures_util::future::join_all(warm).await {
        w.expect("warm-up");
    }
    // Another transaction inserts the call's key and has not committed: the claim's insert
    // waits on that row, and a release sent meanwhile on another connection finds nothing.
    let scope = idem_core::key::Scope::run(run.scope().run_id().to_owned());
    let key = idem_core::key::derive_key(&scope, "wire_once", br#"{"to":"acct-1"}"#);
    admin
        .batch_execute(&format!(
            "BEGIN; INSERT INTO {schema}.idem_records (key, fingerprint, fence, state, lease_until, owner) \
             VALUES ('{key}', 'raw', 0, 0, now() + interval '1 hour', 'raw')"
        ))
        .await
        .expect("an uncommitted row");
    let cancelled =
        tokio::time::timeout(Duration::from_millis(300), wire_once(&run, "acct-1".into())).await;
    assert!(cancelled.is_err(), "the claim must still be waiting: {cancelled:?}");
    admin.batch_execute("ROLLBACK").await.expect("roll the row back");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows = admin
        .query(&format!("SELECT owner, state, fence FROM {schema}.idem_records"), &[])
        .await
        .unwrap();
    for r in rows {
        let (o, st, f): (Option<String>, i16, i64) = (r.get(0), r.get(1), r.get(2));
        eprintln!("DEBUG row owner={o:?} state={st} fence={f}");
    }
    let again = tokio::time::timeout(Duration::from_secs(20), wire_once(&run, "acct-1".into()))
        .await
        .expect("the repeat is answered well within the lease")
        .expect("the repeat runs the tool");
    assert_eq!(again, "sent to acct-1");
    assert_eq!(
        WIRES.load(std::sync::atomic::Ordering::SeqCst),
        5,
        "one wire each, the warm-up's 4 and this"
    );
    drop_schema(&admin, &schema).await;
}

/// A takeover claim whose caller gave up (its future dropped while the dead owner's row was
/// locked by another session) and whose store then releases by owner token leaves the record
/// to its lease: deleting it would erase the dead owner's attempt, which may have taken effect,
/// and the next caller would run the tool again instead of taking the key over (and asking its
/// check). The release waited on the same row lock and ran after the takeover committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_whose_caller_gave_up_is_not_released_by_owner() {
    let Some(_) = store().await else { return };
    let (schema, admin, config) = private_schema("given_up_takeover").await;
    let store = PostgresStore::connect_with(config, 3).await.expect("connect");
    let (key, fp) = fresh_key("given_up_takeover", "{}");
    let dead = ClaimRequest {
        key: &key,
        fingerprint: &fp,
        lease: Duration::from_millis(200),
        on_expired: OnExpired::TakeOver,
        origin: Default::default(),
    };
    assert!(matches!(store.claim(dead).await.expect("claim"), Claim::Acquired { .. }));
    tokio::time::sleep(Duration::from_millis(600)).await;
    admin
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM {schema}.idem_records WHERE key = '{key}' FOR UPDATE"
        ))
        .await
        .expect("lock the dead owner's row");
    let taking_over = ClaimRequest { lease: Duration::from_secs(60), ..dead };
    let given_up = tokio::time::timeout(Duration::from_millis(300), store.claim(taking_over)).await;
    assert!(given_up.is_err(), "the takeover must still wait for the row: {given_up:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin.batch_execute("COMMIT").await.expect("unlock");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let info = store.inspect(&key).await.expect("inspect");
    let state = info.map(|i| i.state);
    assert!(
        matches!(state, Some(idem_core::store::RecordState::InFlight { .. })),
        "the taken-over record stays in flight under its lease: {state:?}"
    );
    drop_schema(&admin, &schema).await;
}

/// A database whose encoding is not UTF-8 (`LATIN1` here; `WIN1252`, `EUC_JP` and others are
/// met on older servers): tokio-postgres speaks UTF-8, and the server converts every text value
/// into the database's encoding, refusing a character it has no equivalent for. Outputs and
/// errors are JSON with their characters as they are, and models answer in every script: a
/// completion with a `€` in it could never be stored, and the record would stay in flight (a
/// `never` tool's repeat answering "outcome unknown"). The store refuses such a database when it
/// opens, naming the encoding, instead of failing completions later as "unavailable".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_cannot_hold_every_character_is_refused_at_open() {
    if store().await.is_none() {
        return;
    }
    let admin = pg::admin().await;
    let created = admin
        .batch_execute(
            "CREATE DATABASE idem_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' \
             TEMPLATE template0",
        )
        .await;
    let created = match created {
        // Made by an earlier run, or by a test process running at the same time.
        Err(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE)
                || e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) =>
        {
            Ok(())
        }
        other => other.map_err(|e| format!("CREATE DATABASE idem_latin1: {e}")),
    };
    if or_skip("PostgreSQL role that may create a LATIN1 database", created).is_none() {
        return;
    }
    // Through a parsed `Config`, so that `IDEM_PG_URL` may be a URL or keyword/value pairs.
    let mut latin1 = Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    latin1.dbname("idem_latin1");
    match PostgresStore::connect_with(latin1, 2).await {
        Err(StoreError::InvalidConfig(m)) => {
            assert!(m.contains("LATIN1") && m.contains("UTF8"), "{m}");
        }
        Err(other) => panic!("expected InvalidConfig, got {other:?}"),
        Ok(store) => {
            // What the store would otherwise do: open, then fail the completion for good.
            let (key, fp) = fresh_key("latin1_payload", "{}");
            let fence = acquire(&store, &key, &fp).await;
            let done = store.complete(&key, fence, &Outcome::Success("\"€\"".into()), LONG).await;
            panic!("a LATIN1 database was accepted; a completion with a euro sign: {done:?}");
        }
    }
}

/// A role or database whose transactions are read-only by default (`ALTER ROLE app SET
/// default_transaction_read_only = on`, as a reporting role is set up): the store opened, and
/// every claim was then refused by the server, taken for a primary demoted behind its address,
/// sent again on new connections and answered "unavailable", an outage to wait out. Refused when
/// the store opens, naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_whose_transactions_are_read_only_is_refused_at_open() {
    let Some(_) = store().await else { return };
    let mut read_only = Config::from_str(&pg_url()).expect("IDEM_PG_URL");
    read_only.options("-c default_transaction_read_only=on");
    match PostgresStore::connect_with(read_only, 2).await {
        Err(StoreError::InvalidConfig(m)) => {
            assert!(m.contains("default_transaction_read_only"), "{m}");
        }
        Err(other) => panic!("expected InvalidConfig, got {other:?}"),
        Ok(store) => {
            let (key, fp) = fresh_key("read_only_role", "{}");
            let claimed = store.claim(claim_req(&key, &fp)).await;
            panic!("a read-only role's store opened; its claim: {claimed:?}");
        }
    }
}

/// Authentication the client cannot complete, which no retry changes: a role the server asks for
/// a password the connection string does not hold, and a role whose pg_hba.conf line asks for
/// GSSAPI, which tokio-postgres does not speak. Both were "the store could not be reached" (the
/// command line's exit 5, an outage to wait out); now a configuration error saying what to
/// change. With its password, the first role opens the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_the_client_cannot_complete_is_a_configuration_error() {
    let started = tokio::task::spawn_blocking(|| {
        idem_tests::servers::PgPrivate::start(
            "pg-auth",
            "",
            "host all app_pw 127.0.0.1/32 scram-sha-256\nhost all app_gss 127.0.0.1/32 gss\n",
            "create role app_pw login superuser password 'secret'; create role app_gss login",
        )
    })
    .await
    .expect("server start");
    let Some(server) = or_skip("PostgreSQL (initdb, pg_ctl)", started) else { return };
    let url =
        |user: &str| format!("host=127.0.0.1 port={} user={user} dbname=postgres", server.port);
    for (user, names) in [("app_pw", "password=.."), ("app_gss", "GSSAPI")] {
        match PostgresStore::connect(&url(user)).await {
            Err(StoreError::InvalidConfig(m)) => assert!(m.contains(names), "{user}: {m}"),
            Err(other) => panic!("{user}: expected InvalidConfig, got {other:?}"),
            Ok(_) => panic!("{user}: the store opened without authenticating"),
        }
    }
    let with_password = format!("{} password=secret", url("app_pw"));
    PostgresStore::connect(&with_password)
        .await
        .expect("with its password, the role opens the store");
}

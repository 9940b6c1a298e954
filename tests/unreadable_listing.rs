//! A listing on a durable store holding records this idem cannot read (edited by hand, written by
//! another version) beside readable ones: every readable record is listed exactly once, each
//! unreadable one is reported once with its key and why, at every page size, so also when it is
//! the last record of a page (the cursor must go on past it); and `stats` still counts. Each store
//! is private to the test (a SQLite file, a PostgreSQL schema, a Redis prefix): the listing holds
//! its records and no others.

#![cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]

use std::collections::BTreeSet;

use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{ListQuery, Outcome, StateFilter, Store, UnreadableRecord};
use idem_core::{Key, StoreError};
use idem_tests::acquire;

/// Ten keys that sort as they are numbered: `1111…`, `2222…`, … `aaaa…`.
fn keys() -> Vec<Key> {
    (1..=10u32)
        .map(|i| {
            let digit = char::from_digit(i, 16).expect("a hex digit");
            Key::parse(&digit.to_string().repeat(64)).expect("a key")
        })
        .collect()
}

/// Completes a record of each key, kept for [`LONG`].
async fn write(store: &dyn Store, keys: &[Key]) {
    let (_, fp) = fresh_key("unreadable_listing", "{}");
    for key in keys {
        let fence = acquire(store, key, &fp).await;
        store.complete(key, fence, &Outcome::Success("1".into()), LONG).await.expect("complete");
    }
}

/// What a whole listing found, page by page.
#[derive(Debug)]
struct Listed {
    /// Every readable record's key, in the order listed.
    readable: Vec<String>,
    unreadable: Vec<UnreadableRecord>,
    scanned: u64,
}

async fn list_all(store: &dyn Store, mut query: ListQuery) -> Result<Listed, StoreError> {
    let size = query.page_size();
    let mut all = Listed { readable: Vec::new(), unreadable: Vec::new(), scanned: 0 };
    // A cursor that does not move past a record would list for ever.
    for _ in 0..1000 {
        let page = store.list(&query).await?;
        assert!(
            page.records.len() + page.unreadable.len() <= size,
            "a page holds at most {size} records, readable or not: {page:?}"
        );
        all.readable.extend(page.records.iter().map(|r| r.key.to_string()));
        all.unreadable.extend(page.unreadable);
        all.scanned += page.scanned;
        match page.next {
            Some(next) => query.cursor = Some(next),
            None => return Ok(all),
        }
    }
    panic!("the listing never ended (pages of {size}): {all:?}");
}

/// Lists with every page size from 1 to one more than the records, and checks that `good` is
/// listed exactly once each and `bad` (key, part of the reason) reported exactly once each.
/// `sorted`: the store lists in key order (the SQL stores), which the listing must keep.
async fn check(store: &dyn Store, good: &[Key], bad: &[(String, &str)], sorted: bool) {
    let mut want_good: Vec<String> = good.iter().map(Key::to_string).collect();
    want_good.sort();
    let want_bad: BTreeSet<&str> = bad.iter().map(|(k, _)| k.as_str()).collect();
    for size in 1..=good.len() + bad.len() + 1 {
        let query = ListQuery { limit: size, ..ListQuery::default() };
        let listed = match list_all(store, query).await {
            Ok(listed) => listed,
            Err(e) => panic!("pages of {size}: one unreadable record failed the listing: {e}"),
        };
        let mut readable = listed.readable.clone();
        if sorted {
            assert_eq!(readable, want_good, "pages of {size}: in key order, each once");
        }
        readable.sort();
        assert_eq!(readable, want_good, "pages of {size}: every readable record once");
        let reported: Vec<&str> = listed.unreadable.iter().map(|u| u.key.as_str()).collect();
        assert_eq!(
            reported.iter().copied().collect::<BTreeSet<_>>(),
            want_bad,
            "pages of {size}: every unreadable record reported: {listed:?}"
        );
        assert_eq!(reported.len(), want_bad.len(), "pages of {size}: each once: {listed:?}");
        for (key, why) in bad {
            let found = listed.unreadable.iter().find(|u| &u.key == key).expect("reported");
            assert!(found.reason.contains(why), "{key:?}: {why:?} in {:?}", found.reason);
        }
        assert!(
            listed.scanned >= (good.len() + bad.len()) as u64,
            "pages of {size}: unreadable records are counted as scanned: {listed:?}"
        );
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use idem_core::store::SqliteStore;

    use super::*;

    /// Rows edited by hand: a run id that is not UTF-8, an outcome kind and a state this idem
    /// does not write, a key that is not an idempotency key, and a key that is not even text.
    /// Text keys sort before blobs, so the last two are the last rows, as in a real table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_lists_around_unreadable_records() {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("idem-unreadable-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("idem.db");
        let store = SqliteStore::open(&path).expect("open");
        let keys = keys();
        write(&store, &keys).await;
        let db = rusqlite::Connection::open(&path).expect("open the file");
        let edit = |sql: &str, key: &Key| {
            assert_eq!(db.execute(sql, [key.as_str()]).expect(sql), 1, "{sql}");
        };
        edit(
            "UPDATE idem_records SET run_id = CAST(X'ff' AS TEXT), tool = 't' WHERE key = ?1",
            &keys[2],
        );
        edit("UPDATE idem_records SET kind = 9 WHERE key = ?1", &keys[5]);
        edit("UPDATE idem_records SET state = 'x' WHERE key = ?1", &keys[7]);
        edit("UPDATE idem_records SET key = 'zz edited' WHERE key = ?1", &keys[8]);
        edit("UPDATE idem_records SET key = X'00ff' WHERE key = ?1", &keys[9]);
        let good = [keys[0], keys[1], keys[3], keys[4], keys[6]];
        let bad = [
            (keys[2].to_string(), "invalid utf-8"),
            (keys[5].to_string(), "outcome this idem cannot read (kind Some(9)"),
            (keys[7].to_string(), "Invalid column type"),
            ("zz edited".to_owned(), "malformed key"),
            ("\0\u{fffd}".to_owned(), "Invalid column type"),
        ];
        check(&store, &good, &bad, true).await;

        // A filter the unreadable row's columns pass reports it; one they fail does not.
        let completed = ListQuery { state: Some(StateFilter::Completed), ..ListQuery::default() };
        let listed = list_all(&store, completed).await.expect("list");
        let reported: Vec<&str> = listed.unreadable.iter().map(|u| u.key.as_str()).collect();
        assert!(reported.contains(&keys[2].as_str()), "{listed:?}");
        assert!(!reported.contains(&keys[5].as_str()), "kind 9 is not completed: {listed:?}");

        // One record's key stays an error that names it, for `idem show`.
        match store.inspect(&keys[5]).await {
            Err(StoreError::Incompatible(why)) => {
                assert!(why.contains(keys[5].as_str()) && why.contains("idem forget"), "{why}")
            }
            other => panic!("inspect of an unreadable record: {other:?}"),
        }
        // Counting reads no record whole but checks in SQL what the listing checks of keys,
        // fingerprints, states and outcomes: the kind 9, the state 'x' and the two keys count as
        // unreadable, as the listing reports them, and nothing fails. (A run id that is not
        // UTF-8 is the one thing counting does not see: SQL cannot check UTF-8.)
        let stats = store.stats().await.expect("stats counts around unreadable records");
        assert_eq!(stats.total(), 10, "{stats:?}");
        assert_eq!(stats.unreadable, 4, "the kind 9, the state 'x' and the two keys: {stats:?}");
        // A completed record without its result, and a fingerprint edited: unreadable to both.
        edit("UPDATE idem_records SET payload = NULL WHERE key = ?1", &keys[0]);
        edit("UPDATE idem_records SET fingerprint = 'nothex' WHERE key = ?1", &keys[1]);
        let stats = store.stats().await.expect("stats");
        assert_eq!((stats.total(), stats.unreadable), (10, 6), "{stats:?}");
        let listed = list_all(&store, ListQuery::default()).await.expect("list");
        assert_eq!(listed.unreadable.len(), 7, "the six and the run id: {listed:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::str::FromStr;

    use idem_core::store::PostgresStore;
    use tokio_postgres::{Config, NoTls};

    use super::*;

    /// Rows edited by hand (in a schema of this test alone): an outcome kind, a fingerprint and a
    /// state this idem does not write, and a key that is not an idempotency key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_lists_around_unreadable_records() {
        let base = Config::from_str(&idem_tests::pg_url()).expect("IDEM_PG_URL");
        let Some((admin, conn)) = idem_tests::or_skip("PostgreSQL", base.connect(NoTls).await)
        else {
            return;
        };
        tokio::spawn(conn);
        let schema = format!("idem_test_unreadable_{}", std::process::id());
        let drop = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
        admin.batch_execute(&format!("{drop}; CREATE SCHEMA {schema}")).await.expect("schema");
        let mut config = base;
        config.options(format!("-c search_path={schema}"));
        let store = PostgresStore::connect_with(config, 2).await.expect("connect");
        let keys = keys();
        write(&store, &keys).await;
        let table = format!("{schema}.idem_records");
        for (set, key) in [
            ("kind = 9", &keys[2]),
            ("fingerprint = 'not a fingerprint'", &keys[5]),
            ("state = 7", &keys[7]),
            ("key = 'edited key'", &keys[9]),
        ] {
            let sql = format!("UPDATE {table} SET {set} WHERE key = $1");
            assert_eq!(admin.execute(&sql, &[&key.as_str()]).await.expect(&sql), 1, "{sql}");
        }
        let good = [keys[0], keys[1], keys[3], keys[4], keys[6], keys[8]];
        let bad = [
            (keys[2].to_string(), "outcome this idem cannot read"),
            (keys[5].to_string(), "malformed fingerprint"),
            (keys[7].to_string(), "unknown state 7"),
            ("edited key".to_owned(), "malformed key"),
        ];
        check(&store, &good, &bad, true).await;
        // Counting checks in SQL what the listing checks: all four count as unreadable.
        let stats = store.stats().await.expect("stats counts around unreadable records");
        assert_eq!(stats.total(), 10, "{stats:?}");
        assert_eq!(stats.unreadable, 4, "as the listing reports them: {stats:?}");
        admin.batch_execute(&drop).await.expect("drop schema");
    }
}

#[cfg(feature = "redis")]
mod redis_store {
    use idem_core::store::RedisStore;

    use super::*;

    /// Records written behind the store's back: a string of no schema version, one of this
    /// version with fields missing, and a hash (another type). Listed by `SCAN`, in no order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_lists_around_unreadable_records() {
        let url = idem_tests::redis_url();
        let prefix = format!("{}-unreadable", idem_tests::redis_prefix());
        let opened = RedisStore::builder(&url).prefix(&prefix).open().await;
        let Some(store) = idem_tests::or_skip("Redis", opened) else { return };
        let client = redis::Client::open(url).expect("redis url");
        let mut raw = client.get_multiplexed_async_connection().await.expect("raw connection");
        let keys = keys();
        write(&store, &keys).await;
        let (garbage, short, hash) =
            (store.record_key(&keys[2]), store.record_key(&keys[5]), store.record_key(&keys[7]));
        let () = redis::pipe()
            .cmd("SET")
            .arg(&garbage)
            .arg("not a record")
            .ignore()
            .cmd("SET")
            .arg(&short)
            .arg("3|1|7")
            .ignore()
            .cmd("DEL")
            .arg(&hash)
            .ignore()
            .cmd("HSET")
            .arg(&hash)
            .arg("st")
            .arg("x")
            .ignore()
            .query_async(&mut raw)
            .await
            .expect("edit records");
        let good = [keys[0], keys[1], keys[3], keys[4], keys[6], keys[8], keys[9]];
        let bad = [
            (keys[2].to_string(), "schema version"),
            (keys[5].to_string(), "malformed"),
            (keys[7].to_string(), "WRONGTYPE"),
        ];
        check(&store, &good, &bad, false).await;

        // What cannot be read cannot be filtered: reported whatever the query selects.
        let none = ListQuery { run_prefix: Some("no such run".into()), ..ListQuery::default() };
        let listed = list_all(&store, none).await.expect("list");
        assert!(listed.readable.is_empty(), "{listed:?}");
        assert_eq!(listed.unreadable.len(), 3, "{listed:?}");

        let stats = store.stats().await.expect("stats counts around unreadable records");
        assert_eq!((stats.completed, stats.unreadable), (7, 3), "{stats:?}");
        for key in &keys {
            store.forget(key).await.expect("forget");
        }
    }
}

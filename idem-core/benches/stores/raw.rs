//! Raw round trips of the same servers, with the same client libraries: the baselines idem's
//! calls are measured against.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::aio::ConnectionManager;

/// What a raw write stores: about what the store writes (a 64-hex-digit key, a short JSON value).
const RAW_VALUE: &str =
    r#"{"id":"ch_3PqR7s","amount_cents":4900,"fp":"9f86d081884c7d659a2feaa0c55ad015"}"#;

pub(super) enum Raw {
    /// One connection, same file and settings as the store (WAL, the same `synchronous`).
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    /// PostgreSQL: the baselines go through `pool`, a deadpool-postgres pool of the store's
    /// size with statements prepared once per connection (its statement cache), as the store's
    /// steps do: each call checks a connection out for itself. `conns` are direct connections
    /// with prepared statements (calls go round-robin over them, pipelined when concurrent),
    /// measured beside it as a diagnostic (`Op::Raw2Direct`, `Op::Raw1Direct`); without a
    /// pool (the TLS rounds) the baselines use them.
    Postgres {
        pool: Option<deadpool_postgres::Pool>,
        conns: Vec<PgRaw>,
        next: AtomicU64,
    },
    Redis(ConnectionManager),
}

pub(super) struct PgRaw {
    pub(super) client: tokio_postgres::Client,
    pub(super) insert: tokio_postgres::Statement,
    pub(super) select: tokio_postgres::Statement,
}

pub(super) const PG_INSERT: &str =
    "INSERT INTO bench_raw (key, val) VALUES ($1, $2) ON CONFLICT DO NOTHING";
pub(super) const PG_SELECT: &str = "SELECT val FROM bench_raw WHERE key = $1";

const SQLITE_INSERT: &str = "INSERT OR IGNORE INTO bench_raw (key, val) VALUES (?1, ?2)";
const SQLITE_SELECT: &str = "SELECT val FROM bench_raw WHERE key = ?1";

fn sqlite_write2(conn: &rusqlite::Connection, prefix: &str, i: u64) {
    let mut st = conn.prepare_cached(SQLITE_INSERT).expect("prepare");
    st.execute(rusqlite::params![format!("{prefix}:{i}:a"), RAW_VALUE]).expect("insert");
    st.execute(rusqlite::params![format!("{prefix}:{i}:b"), RAW_VALUE]).expect("insert");
}

fn sqlite_read1(conn: &rusqlite::Connection, key: &str) -> String {
    let mut st = conn.prepare_cached(SQLITE_SELECT).expect("prepare");
    st.query_row(rusqlite::params![key], |r| r.get(0)).expect("select")
}

impl Raw {
    /// Two raw writes of new keys: the baseline of a first call.
    pub(super) async fn write2(&self, prefix: &str, i: u64) {
        match self {
            Raw::Sqlite(conn) => sqlite_write2(&conn.lock().expect("lock"), prefix, i),
            Raw::Postgres { pool: Some(pool), .. } => {
                // One checkout per write, as the store's claim and completion each take one.
                for side in ["a", "b"] {
                    let c = pool.get().await.expect("a pooled connection");
                    let insert = c.prepare_cached(PG_INSERT).await.expect("prepare");
                    let key = format!("{prefix}:{i}:{side}");
                    c.execute(&insert, &[&key, &RAW_VALUE]).await.expect("insert");
                }
            }
            Raw::Postgres { pool: None, .. } => self.write2_direct(prefix, i).await,
            Raw::Redis(conn) => {
                let mut conn = conn.clone();
                for k in [format!("{prefix}:{i}:a"), format!("{prefix}:{i}:b")] {
                    let _: Option<String> = redis::cmd("SET")
                        .arg(k)
                        .arg(RAW_VALUE)
                        .arg("NX")
                        .query_async(&mut conn)
                        .await
                        .expect("SET NX");
                }
            }
        }
    }

    /// One raw read by primary key of an existing key: the baseline of a replay.
    pub(super) async fn read1(&self, key: &str) {
        match self {
            Raw::Sqlite(conn) => {
                std::hint::black_box(sqlite_read1(&conn.lock().expect("lock"), key));
            }
            Raw::Postgres { pool: Some(pool), .. } => {
                let c = pool.get().await.expect("a pooled connection");
                let select = c.prepare_cached(PG_SELECT).await.expect("prepare");
                let row = c.query_one(&select, &[&key]).await.expect("select");
                std::hint::black_box(row.get::<_, String>(0));
            }
            Raw::Postgres { pool: None, .. } => self.read1_direct(key).await,
            Raw::Redis(conn) => {
                let mut conn = conn.clone();
                let v: Option<String> =
                    redis::cmd("GET").arg(key).query_async(&mut conn).await.expect("GET");
                assert!(v.is_some(), "the raw replay key exists");
            }
        }
    }

    /// PostgreSQL: two raw writes on a direct connection, without the pool.
    pub(super) async fn write2_direct(&self, prefix: &str, i: u64) {
        if let Raw::Postgres { conns, next, .. } = self {
            let c = &conns[(next.fetch_add(1, Ordering::Relaxed) as usize) % conns.len()];
            let (a, b) = (format!("{prefix}:{i}:a"), format!("{prefix}:{i}:b"));
            c.client.execute(&c.insert, &[&a, &RAW_VALUE]).await.expect("insert");
            c.client.execute(&c.insert, &[&b, &RAW_VALUE]).await.expect("insert");
        }
    }

    /// PostgreSQL: one raw read on a direct connection, without the pool.
    pub(super) async fn read1_direct(&self, key: &str) {
        if let Raw::Postgres { conns, next, .. } = self {
            let c = &conns[(next.fetch_add(1, Ordering::Relaxed) as usize) % conns.len()];
            let row = c.client.query_one(&c.select, &[&key]).await.expect("select");
            std::hint::black_box(row.get::<_, String>(0));
        }
    }

    /// SQLite only: the same statements through `spawn_blocking` (how the store runs them), to
    /// tell the cost of the blocking pool from the cost of the statements.
    pub(super) async fn write2_blocking(&self, prefix: &Arc<str>, i: u64) {
        if let Raw::Sqlite(conn) = self {
            for side in ["a", "b"] {
                let (conn, prefix) = (Arc::clone(conn), Arc::clone(prefix));
                tokio::task::spawn_blocking(move || {
                    let c = conn.lock().expect("lock");
                    let mut st = c.prepare_cached(SQLITE_INSERT).expect("prepare");
                    st.execute(rusqlite::params![format!("{prefix}:{i}:{side}"), RAW_VALUE])
                        .expect("insert");
                })
                .await
                .expect("join");
            }
        }
    }

    pub(super) async fn read1_blocking(&self, key: &Arc<str>) {
        if let Raw::Sqlite(conn) = self {
            let (conn, key) = (Arc::clone(conn), Arc::clone(key));
            let v = tokio::task::spawn_blocking(move || {
                sqlite_read1(&conn.lock().expect("lock"), &key)
            })
            .await
            .expect("join");
            std::hint::black_box(v);
        }
    }
}

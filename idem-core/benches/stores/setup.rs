//! Settings from the environment, and set-up and removal of each store under test: idem on it
//! and raw access to the same server.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::store::{PostgresStore, RedisStore};
use idem_core::{Idem, Scope};
use redis::aio::ConnectionManager;

use super::raw::{PG_INSERT, PG_SELECT, PgRaw, Raw};
use super::{Subject, read_keys};

pub(super) struct Settings {
    pub(super) rounds: usize,
    pub(super) calls: usize,
    pub(super) tput: Duration,
    pub(super) pg_url: String,
    pub(super) redis_url: String,
    pub(super) stores: Vec<String>,
    pub(super) run_id: String,
    pub(super) python: Option<String>,
    /// Calls per op and round through the delay proxy.
    pub(super) proxy_calls: usize,
    /// The delay proxy's delay in each direction.
    pub(super) proxy_delay: Duration,
}

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

impl Settings {
    pub(super) fn from_env() -> Settings {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Settings {
            rounds: env_or("IDEM_BENCH_ROUNDS", 9),
            calls: env_or("IDEM_BENCH_CALLS", 200),
            tput: Duration::from_secs_f64(env_or("IDEM_BENCH_TPUT_SECS", 2.0)),
            pg_url: std::env::var("IDEM_PG_URL")
                .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".into()),
            redis_url: std::env::var("IDEM_REDIS_URL")
                .unwrap_or_else(|_| "redis://127.0.0.1:6379/".into()),
            stores: std::env::var("IDEM_BENCH_STORES")
                .unwrap_or_else(|_| "sqlite,postgres,redis".into())
                .split(',')
                .map(|s| s.trim().to_owned())
                .collect(),
            run_id: format!("{:x}{:x}", (nanos % (1 << 40)) as u64, std::process::id()),
            python: std::env::var("IDEM_BENCH_PYTHON").ok().filter(|s| !s.is_empty()),
            proxy_calls: env_or("IDEM_BENCH_PROXY_CALLS", 100),
            proxy_delay: Duration::from_micros(env_or("IDEM_BENCH_PROXY_DELAY_US", 500)),
        }
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

pub(super) fn sqlite_path(s: &Settings) -> PathBuf {
    target_dir().join("idem-bench").join(format!("stores-{}.db", s.run_id))
}

/// Opens the store and a raw connection on the same file. Returns the `synchronous` setting.
pub(super) async fn sqlite_subject(s: &Settings, scope: &Scope) -> (Subject, String) {
    let path = sqlite_path(s);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("bench dir");
    // The URL form every tool and the operator command line take (`idem_core::store::open`).
    let url = format!("sqlite://{}", path.display());
    let store = idem_core::store::open(&url).await.expect("open the SQLite store");
    let conn = rusqlite::Connection::open(&path).expect("open the raw connection");
    // The store's settings: WAL and a busy timeout; `synchronous` left at its default, as the
    // store leaves it (read back below and printed).
    conn.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).expect("WAL");
    assert_eq!(mode, "wal");
    let sync: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0)).expect("sync");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS bench_raw (key TEXT PRIMARY KEY, val TEXT NOT NULL) WITHOUT ROWID",
    )
    .expect("raw table");
    let sync = match sync {
        0 => "OFF",
        1 => "NORMAL",
        2 => "FULL",
        3 => "EXTRA",
        _ => "?",
    };
    let prefix: Arc<str> = format!("raw-{}", s.run_id).into();
    let subject = Subject {
        name: "SQLite",
        run: Idem::builder_shared(store).build().scope(scope.clone()),
        raw: Raw::Sqlite(Arc::new(Mutex::new(conn))),
        read_keys: read_keys(&prefix),
        prefix,
        scripts: None,
        cold: None,
    };
    (
        subject,
        format!("journal_mode=WAL, synchronous={sync} (SQLite's default; the store sets none)"),
    )
}

fn pg_schema(s: &Settings) -> String {
    format!("idem_bench_{}", s.run_id)
}

async fn pg_client(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, conn) =
        config.connect(tokio_postgres::NoTls).await.expect("connect to PostgreSQL");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// The PostgreSQL server's configuration from `IDEM_PG_URL`.
pub(super) fn pg_config(s: &Settings) -> tokio_postgres::Config {
    tokio_postgres::Config::from_str(&s.pg_url).expect("IDEM_PG_URL")
}

pub(super) async fn pg_subject(
    s: &Settings,
    base: tokio_postgres::Config,
    scope: &Scope,
    raw_conns: usize,
) -> Subject {
    let admin = pg_client(&base).await;
    let schema = pg_schema(s);
    admin.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await.expect("schema");
    let mut config = base.clone();
    config.options(format!("-c search_path={schema}"));
    // Plaintext, as the raw connections (`NoTls`): with the `postgres-tls` feature the store
    // would otherwise take the TLS the server offers (`sslmode=prefer`) and pay for it against
    // plaintext baselines. The rounds over TLS are separate (`stores/tls.rs`).
    config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    let store = PostgresStore::connect_with(
        config.clone(),
        idem_core::store::postgres::DEFAULT_CONNECTIONS,
    )
    .await
    .expect("connect the PostgreSQL store");
    admin
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.bench_raw (key text PRIMARY KEY, val text NOT NULL)"
        ))
        .await
        .expect("raw table");
    let mut conns = Vec::new();
    for _ in 0..raw_conns {
        let client = pg_client(&config).await;
        let insert = client.prepare(PG_INSERT).await.expect("prepare");
        let select = client.prepare(PG_SELECT).await.expect("prepare");
        conns.push(PgRaw { client, insert, select });
    }
    // The pool the raw baselines go through: the kind the store's own is (deadpool-postgres,
    // `Fast` recycling, statements prepared once per connection), of the same size.
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(idem_core::store::postgres::DEFAULT_CONNECTIONS)
        .build()
        .expect("raw pool");
    let prefix: Arc<str> = format!("raw-{}", s.run_id).into();
    Subject {
        name: "PostgreSQL",
        run: Idem::new(store).scope(scope.clone()),
        raw: Raw::Postgres { pool: Some(pool), conns, next: AtomicU64::new(0) },
        read_keys: read_keys(&prefix),
        prefix,
        scripts: None,
        cold: None,
    }
}

pub(super) fn redis_prefix(s: &Settings) -> String {
    format!("idem-bench-{}", s.run_id)
}

pub(super) async fn redis_subject(s: &Settings, url: &str, scope: &Scope) -> Subject {
    let store = RedisStore::builder(url)
        .prefix(redis_prefix(s))
        .open()
        .await
        .expect("connect the Redis store");
    // The same kind of connection as the store's: a connection manager (multiplexed).
    let client = redis::Client::open(url).expect("IDEM_REDIS_URL");
    let conn = ConnectionManager::new(client).await.expect("connect to Redis");
    let prefix: Arc<str> = format!("{}:raw", redis_prefix(s)).into();
    let scripts = RedisStore::builder(url)
        .prefix(redis_prefix(s))
        .native_claims(false)
        .open()
        .await
        .expect("connect the Redis store");
    let cold = RedisStore::builder(url)
        .prefix(redis_prefix(s))
        .replay_reads(false)
        .open()
        .await
        .expect("connect the Redis store");
    Subject {
        name: "Redis",
        run: Idem::new(store).scope(scope.clone()),
        raw: Raw::Redis(conn),
        read_keys: read_keys(&prefix),
        prefix,
        scripts: Some(Arc::new(scripts)),
        cold: Some(Idem::new(cold).scope(scope.clone())),
    }
}

pub(super) async fn subject(name: &str, s: &Settings, scope: &Scope, raw_conns: usize) -> Subject {
    match name {
        "sqlite" => sqlite_subject(s, scope).await.0,
        "postgres" => pg_subject(s, pg_config(s), scope, raw_conns).await,
        "redis" => redis_subject(s, &s.redis_url, scope).await,
        other => panic!("unknown store {other:?} in IDEM_BENCH_STORES (sqlite, postgres, redis)"),
    }
}

pub(super) async fn cleanup(s: &Settings) {
    if s.stores.iter().any(|n| n == "sqlite") {
        let path = sqlite_path(s);
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
    if s.stores.iter().any(|n| n == "postgres") {
        let base = tokio_postgres::Config::from_str(&s.pg_url).expect("IDEM_PG_URL");
        let admin = pg_client(&base).await;
        let dropped = admin.batch_execute(&format!("DROP SCHEMA {} CASCADE", pg_schema(s))).await;
        if let Err(e) = dropped {
            eprintln!("warning: could not drop schema {}: {e}", pg_schema(s));
        }
    }
    if s.stores.iter().any(|n| n == "redis") {
        let client = redis::Client::open(s.redis_url.as_str()).expect("IDEM_REDIS_URL");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect to Redis");
        let pattern = format!("{}*", redis_prefix(s));
        let mut cursor: u64 = 0;
        let mut removed = 0usize;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .expect("SCAN");
            if !keys.is_empty() {
                removed += keys.len();
                let _: i64 =
                    redis::cmd("DEL").arg(&keys).query_async(&mut conn).await.expect("DEL");
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        eprintln!("removed {removed} Redis keys matching {pattern}");
    }
}

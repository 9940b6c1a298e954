//! Per-call cost of the durable stores (SQLite, PostgreSQL, Redis) against raw round trips of the
//! same server, measured in the same run with the same client library.
//!
//! - first call (claim + complete, through [`Idem`] and a keyed [`Tool`] that does no work) against
//!   two raw writes: `INSERT OR IGNORE` (SQLite, rusqlite), `INSERT .. ON CONFLICT DO NOTHING`
//!   (PostgreSQL, tokio-postgres), `SET key val NX` (Redis, redis-rs connection manager);
//! - replay against one raw read by primary key: `SELECT val .. WHERE key = ?` / `GET key`;
//! - throughput of 32 concurrent callers on distinct keys, idem and the raw baseline;
//! - with `IDEM_BENCH_PYTHON` set, the peer: AWS Powertools' `idempotent_function` on the same Redis
//!   (`benches/powertools_peer.py`), run from here so that it is measured in the same run.
//!
//! Run it all with `benches/run_store_benches.sh`. The machine is noisy (other builds run on it):
//! the measurements are interleaved in rounds (raw, idem, raw, idem, ...), every call is timed on its
//! own, and a ratio is the median over rounds of (idem median / raw median) in that round. That is
//! why this is a `harness = false` binary and not criterion, which runs one benchmark after another.
//!
//! Each run uses its own key prefix, PostgreSQL schema and SQLite file, removed at the end.
//!
//! Settings (environment): `IDEM_PG_URL`, `IDEM_REDIS_URL` (the defaults of the test suite),
//! `IDEM_BENCH_ROUNDS` (default 9), `IDEM_BENCH_CALLS` (calls per kind and round, default 200),
//! `IDEM_BENCH_TPUT_SECS` (seconds per throughput sample, default 2), `IDEM_BENCH_STORES`
//! (comma-separated subset of `sqlite,postgres,redis`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::store::{Claim, ClaimRequest, OnExpired, Outcome, PostgresStore, RedisStore, Store};
use idem_core::{Fingerprint, Idem, Key, Run, Scope};
use redis::aio::ConnectionManager;
use serde::Deserialize;

mod common;
mod delay_proxy;

use common::{ChargeArgs, ChargeCard, DEF, charge_args};

/// The shared tool, without a gate: it answers at once.
const CHARGE: ChargeCard = ChargeCard { gate: None };

/// What a raw write stores: about what the store writes (a 64-hex-digit key, a short JSON value).
const RAW_VALUE: &str =
    r#"{"id":"ch_3PqR7s","amount_cents":4900,"fp":"9f86d081884c7d659a2feaa0c55ad015"}"#;

// ---------------------------------------------------------------------------------------------
// Raw round trips.

enum Raw {
    /// One connection, same file and settings as the store (WAL, the same `synchronous`).
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    /// Connections with prepared statements; calls go round-robin over them.
    Postgres {
        conns: Vec<PgRaw>,
        next: AtomicU64,
    },
    Redis(ConnectionManager),
}

struct PgRaw {
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
    select: tokio_postgres::Statement,
}

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
    async fn write2(&self, prefix: &str, i: u64) {
        match self {
            Raw::Sqlite(conn) => sqlite_write2(&conn.lock().expect("lock"), prefix, i),
            Raw::Postgres { conns, next } => {
                let c = &conns[(next.fetch_add(1, Ordering::Relaxed) as usize) % conns.len()];
                let (a, b) = (format!("{prefix}:{i}:a"), format!("{prefix}:{i}:b"));
                c.client.execute(&c.insert, &[&a, &RAW_VALUE]).await.expect("insert");
                c.client.execute(&c.insert, &[&b, &RAW_VALUE]).await.expect("insert");
            }
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
    async fn read1(&self, key: &str) {
        match self {
            Raw::Sqlite(conn) => {
                std::hint::black_box(sqlite_read1(&conn.lock().expect("lock"), key));
            }
            Raw::Postgres { conns, next } => {
                let c = &conns[(next.fetch_add(1, Ordering::Relaxed) as usize) % conns.len()];
                let row = c.client.query_one(&c.select, &[&key]).await.expect("select");
                std::hint::black_box(row.get::<_, String>(0));
            }
            Raw::Redis(conn) => {
                let mut conn = conn.clone();
                let v: Option<String> =
                    redis::cmd("GET").arg(key).query_async(&mut conn).await.expect("GET");
                assert!(v.is_some(), "the raw replay key exists");
            }
        }
    }

    /// SQLite only: the same statements through `spawn_blocking` (how the store runs them), to
    /// tell the cost of the blocking pool from the cost of the statements.
    async fn write2_blocking(&self, prefix: &Arc<str>, i: u64) {
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

    async fn read1_blocking(&self, key: &Arc<str>) {
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

// ---------------------------------------------------------------------------------------------
// One store under test: idem on it, and raw access to the same server.

struct Subject {
    name: &'static str,
    run: Run,
    raw: Raw,
    /// Prefix of every raw key of this run.
    prefix: Arc<str>,
    /// Raw keys that exist, one per caller (the replay baseline reads them).
    read_keys: Vec<Arc<str>>,
    /// Redis only: the same store with native claims off (every claim the script), for an A/B
    /// of the claim in the same rounds.
    scripts: Option<Arc<dyn Store>>,
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// Concurrent callers in the throughput runs.
const CALLERS: u64 = 32;
/// Seeded records (replays) are numbered from here; first calls count up from 1.
const SEED: u64 = 1 << 40;

fn seed_args(caller: u64) -> ChargeArgs {
    charge_args(SEED + caller)
}

fn read_keys(prefix: &str) -> Vec<Arc<str>> {
    (0..CALLERS).map(|c| Arc::from(format!("{prefix}:{}:a", SEED + c))).collect()
}

fn next() -> u64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    /// Two raw writes.
    Raw2,
    /// idem's first call: claim + complete.
    First,
    /// One raw read.
    Raw1,
    /// idem's replay: one claim answering the stored outcome.
    Replay,
    /// SQLite only: Raw2 / Raw1 through spawn_blocking.
    Raw2Blocking,
    Raw1Blocking,
    /// Diagnostics: the store's own claim + complete, and claim of a completed key, called
    /// directly (no executor), to tell the store's cost from the executor's.
    StoreFirst,
    StoreReplay,
    /// Redis only: the same through the claim script (native claims off).
    ScriptFirst,
    ScriptReplay,
}

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::Raw2 => "raw 2 writes",
            Op::First => "idem first call",
            Op::Raw1 => "raw 1 read",
            Op::Replay => "idem replay",
            Op::Raw2Blocking => "raw 2 writes, spawn_blocking",
            Op::Raw1Blocking => "raw 1 read, spawn_blocking",
            Op::StoreFirst => "store claim+complete only",
            Op::StoreReplay => "store claim (replay) only",
            Op::ScriptFirst => "store claim+complete, scripts",
            Op::ScriptReplay => "store claim (replay), scripts",
        }
    }
}

impl Subject {
    /// Runs `op` once as caller `caller`: replays and raw reads use that caller's own seeded key,
    /// so concurrent callers work on distinct keys.
    async fn op(&self, op: Op, caller: u64) {
        match op {
            Op::Raw2 => self.raw.write2(&self.prefix, next()).await,
            Op::Raw1 => self.raw.read1(&self.read_keys[caller as usize]).await,
            Op::First => {
                let out = self.run.call(&CHARGE, charge_args(next())).await.expect("first call");
                std::hint::black_box(out);
            }
            Op::Replay => {
                let out = self.run.call(&CHARGE, seed_args(caller)).await.expect("replay");
                std::hint::black_box(out);
            }
            Op::Raw2Blocking => self.raw.write2_blocking(&self.prefix, next()).await,
            Op::Raw1Blocking => self.raw.read1_blocking(&self.read_keys[caller as usize]).await,
            Op::StoreFirst | Op::ScriptFirst => {
                let (key, fp) = self.key_of(&charge_args(next()));
                let store = self.store(op);
                let req = ClaimRequest {
                    key: &key,
                    fingerprint: &fp,
                    lease: Duration::from_secs(30),
                    on_expired: OnExpired::TakeOver,
                    origin: Default::default(),
                };
                let Ok(Claim::Acquired { fence, .. }) = store.claim(req).await else {
                    panic!("a new key is acquired")
                };
                let out = Outcome::Success(r#"{"id":"ch_3PqR7s","amount_cents":4901}"#.into());
                store
                    .complete(&key, fence, &out, Duration::from_secs(24 * 3600))
                    .await
                    .expect("complete");
            }
            Op::StoreReplay | Op::ScriptReplay => {
                let (key, fp) = self.key_of(&seed_args(caller));
                let req = ClaimRequest {
                    key: &key,
                    fingerprint: &fp,
                    lease: Duration::from_secs(30),
                    on_expired: OnExpired::TakeOver,
                    origin: Default::default(),
                };
                let claim = self.store(op).claim(req).await;
                assert!(matches!(claim, Ok(Claim::Completed(_))), "a seeded key replays");
            }
        }
    }

    /// The store an op calls directly: idem's, or the one with native claims off.
    fn store(&self, op: Op) -> &Arc<dyn Store> {
        match (op, &self.scripts) {
            (Op::ScriptFirst | Op::ScriptReplay, Some(scripts)) => scripts,
            _ => self.run.idem().store(),
        }
    }

    /// The key and fingerprint the executor derives for `args` (a derived key).
    fn key_of(&self, args: &ChargeArgs) -> (Key, Fingerprint) {
        let mut canonical = Vec::with_capacity(256);
        idem_core::canonicalize(args, &mut canonical).expect("finite");
        let key = idem_core::key::derive_key(self.run.scope(), DEF.name, &canonical);
        (key, Fingerprint::of_derived_key(&key))
    }

    /// Seeds what the replays read, one per caller: idem's completed record and the raw key.
    async fn seed(&self) {
        for caller in 0..CALLERS {
            self.run.call(&CHARGE, seed_args(caller)).await.expect("seed the record");
            self.raw.write2(&self.prefix, SEED + caller).await;
        }
    }

    fn ops(&self) -> Vec<Op> {
        let mut ops =
            vec![Op::Raw2, Op::First, Op::Raw1, Op::Replay, Op::StoreFirst, Op::StoreReplay];
        if matches!(self.raw, Raw::Sqlite(_)) {
            ops.extend([Op::Raw2Blocking, Op::Raw1Blocking]);
        }
        if self.scripts.is_some() {
            ops.extend([Op::ScriptFirst, Op::ScriptReplay]);
        }
        ops
    }
}

// ---------------------------------------------------------------------------------------------
// Settings and set-up.

struct Settings {
    rounds: usize,
    calls: usize,
    tput: Duration,
    pg_url: String,
    redis_url: String,
    stores: Vec<String>,
    run_id: String,
    python: Option<String>,
    /// Calls per op and round through the delay proxy.
    proxy_calls: usize,
    /// The delay proxy's delay in each direction.
    proxy_delay: Duration,
}

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

impl Settings {
    fn from_env() -> Settings {
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

fn sqlite_path(s: &Settings) -> PathBuf {
    target_dir().join("idem-bench").join(format!("stores-{}.db", s.run_id))
}

/// Opens the store and a raw connection on the same file. Returns the `synchronous` setting.
async fn sqlite_subject(s: &Settings, scope: &Scope) -> (Subject, String) {
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
fn pg_config(s: &Settings) -> tokio_postgres::Config {
    tokio_postgres::Config::from_str(&s.pg_url).expect("IDEM_PG_URL")
}

async fn pg_subject(
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
        let insert = client
            .prepare("INSERT INTO bench_raw (key, val) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .await
            .expect("prepare");
        let select =
            client.prepare("SELECT val FROM bench_raw WHERE key = $1").await.expect("prepare");
        conns.push(PgRaw { client, insert, select });
    }
    let prefix: Arc<str> = format!("raw-{}", s.run_id).into();
    Subject {
        name: "PostgreSQL",
        run: Idem::new(store).scope(scope.clone()),
        raw: Raw::Postgres { conns, next: AtomicU64::new(0) },
        read_keys: read_keys(&prefix),
        prefix,
        scripts: None,
    }
}

fn redis_prefix(s: &Settings) -> String {
    format!("idem-bench-{}", s.run_id)
}

async fn redis_subject(s: &Settings, url: &str, scope: &Scope) -> Subject {
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
    Subject {
        name: "Redis",
        run: Idem::new(store).scope(scope.clone()),
        raw: Raw::Redis(conn),
        read_keys: read_keys(&prefix),
        prefix,
        scripts: Some(Arc::new(scripts)),
    }
}

async fn subject(name: &str, s: &Settings, scope: &Scope, raw_conns: usize) -> Subject {
    match name {
        "sqlite" => sqlite_subject(s, scope).await.0,
        "postgres" => pg_subject(s, pg_config(s), scope, raw_conns).await,
        "redis" => redis_subject(s, &s.redis_url, scope).await,
        other => panic!("unknown store {other:?} in IDEM_BENCH_STORES (sqlite, postgres, redis)"),
    }
}

async fn cleanup(s: &Settings) {
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

// ---------------------------------------------------------------------------------------------
// Measurement.

fn median(v: &mut [u64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 { v[n / 2] as f64 } else { (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0 }
}

fn median_f(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Per-call latencies of one store: every op in every round, each call timed on its own.
struct Latencies {
    /// All samples (ns) per op.
    all: BTreeMap<Op, Vec<u64>>,
    /// Per round: the median (ns) per op.
    rounds: Vec<BTreeMap<Op, f64>>,
}

impl Latencies {
    fn median(&self, op: Op) -> f64 {
        median(&mut self.all.get(&op).cloned().unwrap_or_default())
    }
    /// The median over rounds of (median of `a` / median of `b`) in that round.
    fn ratio(&self, a: Op, b: Op) -> f64 {
        let mut r: Vec<f64> =
            self.rounds.iter().filter_map(|m| Some(m.get(&a)? / m.get(&b)?)).collect();
        median_f(&mut r)
    }
}

async fn latencies(subject: &Subject, s: &Settings) -> Latencies {
    latencies_of(subject, subject.ops(), s.rounds, s.calls).await
}

/// [`latencies`] of `ops`, `rounds` rounds of `calls` calls each.
async fn latencies_of(subject: &Subject, ops: Vec<Op>, rounds: usize, calls: usize) -> Latencies {
    // Warm-up: connections, prepared statements, script cache, page cache.
    for &op in &ops {
        for _ in 0..(calls / 4).max(10) {
            subject.op(op, 0).await;
        }
    }
    let mut all: BTreeMap<Op, Vec<u64>> = BTreeMap::new();
    let mut per_round = Vec::new();
    for round in 0..rounds {
        let mut order = ops.clone();
        // Alternate the order so no op always runs right after another one.
        if round % 2 == 1 {
            order.reverse();
        }
        let mut medians = BTreeMap::new();
        for op in order {
            let mut samples = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                subject.op(op, 0).await;
                samples.push(t.elapsed().as_nanos() as u64);
            }
            all.entry(op).or_default().extend_from_slice(&samples);
            medians.insert(op, median(&mut samples));
        }
        per_round.push(medians);
    }
    Latencies { all, rounds: per_round }
}

/// Calls per second of `callers` concurrent callers doing `op` on distinct keys for `dur`.
async fn throughput(subject: &Arc<Subject>, op: Op, callers: u64, dur: Duration) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (subject, stop, done) = (Arc::clone(subject), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    subject.op(op, caller).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// At a realistic round trip: the same servers behind the delay proxy.

/// One store's per-call medians through the delay proxy.
struct Proxied {
    label: &'static str,
    raw2: f64,
    first: f64,
    first_ratio: f64,
    raw1: f64,
    replay: f64,
    replay_ratio: f64,
}

fn first_addr(host: &str, port: u16) -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()).unwrap_or_else(|| {
        panic!("cannot resolve {host}:{port}");
    })
}

/// `url` with its host and port replaced by `addr` (user, password and database kept).
fn redis_url_via(url: &str, addr: std::net::SocketAddr) -> String {
    let info = redis::Client::open(url).expect("IDEM_REDIS_URL").get_connection_info().clone();
    let settings = info.redis_settings();
    let auth = match (settings.username(), settings.password()) {
        (Some(u), Some(p)) => format!("{u}:{p}@"),
        (None, Some(p)) => format!(":{p}@"),
        _ => String::new(),
    };
    format!("redis://{auth}{addr}/{}", settings.db())
}

fn redis_upstream(url: &str) -> std::net::SocketAddr {
    let client = redis::Client::open(url).expect("IDEM_REDIS_URL");
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => first_addr(host, *port),
        other => panic!("the delay proxy needs a plain TCP Redis, not {other:?}"),
    }
}

fn pg_upstream(config: &tokio_postgres::Config) -> std::net::SocketAddr {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    first_addr(&host, config.get_ports().first().copied().unwrap_or(5432))
}

/// `base` reaching the server at `addr` instead (user, password, database kept).
fn pg_config_via(
    base: &tokio_postgres::Config,
    addr: std::net::SocketAddr,
) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    if let Some(u) = base.get_user() {
        c.user(u);
    }
    if let Some(p) = base.get_password() {
        c.password(p);
    }
    if let Some(d) = base.get_dbname() {
        c.dbname(d);
    }
    c.host(addr.ip().to_string()).port(addr.port());
    c
}

/// PostgreSQL and Redis again, each behind its own delay proxy (`s.proxy_delay` each way):
/// idem's first call and replay against the raw baselines through the same proxy.
async fn proxied_runs(s: &Settings, scope: &Scope) -> Vec<Proxied> {
    let mut out = Vec::new();
    for name in s.stores.iter().filter(|n| *n == "postgres" || *n == "redis") {
        let upstream = if name == "postgres" {
            pg_upstream(&pg_config(s))
        } else {
            redis_upstream(&s.redis_url)
        };
        let proxy = delay_proxy::DelayProxy::start(upstream, s.proxy_delay).expect("delay proxy");
        let subject = if name == "postgres" {
            let config = pg_config_via(&pg_config(s), proxy.addr());
            pg_subject(s, config, scope, 1).await
        } else {
            redis_subject(s, &redis_url_via(&s.redis_url, proxy.addr()), scope).await
        };
        subject.seed().await;
        let ops = vec![Op::Raw2, Op::First, Op::Raw1, Op::Replay];
        let lat = latencies_of(&subject, ops, s.rounds, s.proxy_calls).await;
        println!(
            "\n## {} through the delay proxy ({} µs each way): per call (median of {} calls per op)",
            subject.name,
            s.proxy_delay.as_micros(),
            s.rounds * s.proxy_calls
        );
        for (op, v) in &lat.all {
            println!("  {:<30} {:>10}  (n={})", op.label(), us(lat.median(*op)), v.len());
        }
        let p = Proxied {
            label: subject.name,
            raw2: lat.median(Op::Raw2),
            first: lat.median(Op::First),
            first_ratio: lat.ratio(Op::First, Op::Raw2),
            raw1: lat.median(Op::Raw1),
            replay: lat.median(Op::Replay),
            replay_ratio: lat.ratio(Op::Replay, Op::Raw1),
        };
        println!(
            "  first call / 2 raw writes = {:.2}  (target <= 1.10: {})",
            p.first_ratio,
            verdict(p.first_ratio, 1.1)
        );
        println!("  replay / 1 raw read       = {:.2}", p.replay_ratio);
        out.push(p);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The peer.

#[derive(Debug, Deserialize)]
struct Peer {
    first_call_ns: f64,
    replay_ns: f64,
    raw_set_nx_2_ns: f64,
    raw_get_ns: f64,
    iterations: u64,
    powertools_version: String,
    redis_py_version: String,
    python: String,
}

fn run_peer(s: &Settings, python: &str) -> Result<Peer, String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../benches/powertools_peer.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg("--redis-url")
        .arg(&s.redis_url)
        .arg("--prefix")
        .arg(format!("{}-powertools", redis_prefix(s)))
        .arg("--rounds")
        .arg(s.rounds.to_string())
        .arg("--calls")
        .arg(s.calls.to_string())
        .output()
        .map_err(|e| format!("could not run {python} {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| format!("peer output {line:?}: {e}"))
}

// ---------------------------------------------------------------------------------------------

fn us(ns: f64) -> String {
    format!("{:.1} µs", ns / 1e3)
}

/// The replay target of a store (one raw read): 1.5 for SQLite, whose raw read is a local
/// primary-key lookup of about a microsecond; 1.2 for the servers.
fn replay_target(label: &str) -> f64 {
    if label == "SQLite" { 1.5 } else { 1.2 }
}

fn verdict(ratio: f64, target: f64) -> &'static str {
    if ratio <= target { "met" } else { "MISSED" }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} CPUs, {model}")
}

fn main() {
    // `cargo bench` passes `--bench`; a filter or `--list` is not supported: run everything.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let s = Settings::from_env();
    println!("# durable stores bench, run {}", s.run_id);
    println!("machine: {}", machine());
    println!(
        "rounds {}, calls per op and round {}, throughput {:?} per sample, 32 callers",
        s.rounds, s.calls, s.tput
    );
    let scope = Scope::run(format!("bench-{}", s.run_id));
    let mut canonical = Vec::new();
    idem_core::canonicalize(&charge_args(0), &mut canonical).expect("finite");
    println!("canonical arguments: {} bytes", canonical.len());

    let latency_rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let tput_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let mut summary = Vec::new();
    let mut redis_idem: Option<(f64, f64)> = None;
    for name in s.stores.clone() {
        // Per-call latency: one caller on a current-thread runtime.
        let lat = latency_rt.block_on(async {
            let subject = if name == "sqlite" {
                let (subject, settings) = sqlite_subject(&s, &scope).await;
                println!("\nSQLite file {}: {settings}", sqlite_path(&s).display());
                subject
            } else {
                subject(&name, &s, &scope, 1).await
            };
            subject.seed().await;
            let lat = latencies(&subject, &s).await;
            (subject.name, lat)
        });
        let (label, lat) = lat;
        println!("\n## {label}: per call (median of {} calls per op)", s.rounds * s.calls);
        for (op, v) in &lat.all {
            println!("  {:<30} {:>10}  (n={})", op.label(), us(lat.median(*op)), v.len());
        }
        let first = lat.ratio(Op::First, Op::Raw2);
        let replay = lat.ratio(Op::Replay, Op::Raw1);
        println!(
            "  first call / 2 raw writes = {first:.2}  (target <= 1.30: {})",
            verdict(first, 1.3)
        );
        let replay_target = replay_target(label);
        println!(
            "  replay / 1 raw read       = {replay:.2}  (target <= {replay_target:.2}: {})",
            verdict(replay, replay_target)
        );
        if name == "sqlite" {
            println!(
                "  diagnostics: first call / 2 raw writes via spawn_blocking = {:.2}; replay / 1 raw \
                 read via spawn_blocking = {:.2}",
                lat.ratio(Op::First, Op::Raw2Blocking),
                lat.ratio(Op::Replay, Op::Raw1Blocking)
            );
        }
        println!(
            "  diagnostics: store alone (no executor): claim+complete / 2 raw writes = {:.2}, \
             claim of a completed key / 1 raw read = {:.2}; executor share: first call - store = \
             {}, replay - store = {}",
            lat.ratio(Op::StoreFirst, Op::Raw2),
            lat.ratio(Op::StoreReplay, Op::Raw1),
            us(lat.median(Op::First) - lat.median(Op::StoreFirst)),
            us(lat.median(Op::Replay) - lat.median(Op::StoreReplay)),
        );
        if name == "redis" {
            redis_idem = Some((lat.median(Op::First), lat.median(Op::Replay)));
            println!(
                "  diagnostics: claim script instead of native commands (same rounds): \
                 claim+complete / 2 raw writes = {:.2}, claim of a completed key / 1 raw read = {:.2}",
                lat.ratio(Op::ScriptFirst, Op::Raw2),
                lat.ratio(Op::ScriptReplay, Op::Raw1),
            );
        }

        // Throughput: 32 callers on a 2-worker runtime, idem and raw interleaved.
        let raw_conns = idem_core::store::postgres::DEFAULT_CONNECTIONS;
        let tput = tput_rt.block_on(async {
            let subject = Arc::new(subject(&name, &s, &scope, raw_conns).await);
            // SQLite raw through spawn_blocking: blocking the runtime's workers is not a baseline an
            // async caller could use.
            let ops = match subject.raw {
                Raw::Sqlite(_) => [
                    Op::Raw2Blocking,
                    Op::First,
                    Op::Raw1Blocking,
                    Op::Replay,
                    Op::StoreFirst,
                    Op::StoreReplay,
                ],
                _ => [Op::Raw2, Op::First, Op::Raw1, Op::Replay, Op::StoreFirst, Op::StoreReplay],
            };
            let mut per: BTreeMap<Op, Vec<f64>> = BTreeMap::new();
            for &op in &ops {
                throughput(&subject, op, 32, Duration::from_millis(200)).await;
                eprintln!("  {}: warmed up {}", subject.name, op.label());
            }
            for _ in 0..3 {
                for &op in &ops {
                    let v = throughput(&subject, op, 32, s.tput).await;
                    eprintln!("  {}: {} {v:.0} calls/s", subject.name, op.label());
                    per.entry(op).or_default().push(v);
                }
            }
            per.into_iter().map(|(op, mut v)| (op, median_f(&mut v))).collect::<BTreeMap<_, _>>()
        });
        println!("  throughput, 32 concurrent callers on distinct keys (median of 3 samples):");
        for (op, v) in &tput {
            println!("  {:<30} {:>10.0} calls/s", op.label(), v);
        }
        if name == "sqlite" {
            println!(
                "  (SQLite raw: one connection behind a mutex, statements through spawn_blocking as \
                 the store runs them)"
            );
        }
        if name == "postgres" {
            println!(
                "  (PostgreSQL raw under concurrency: {raw_conns} connections, as the store uses)"
            );
        }
        summary.push((label, lat.median(Op::First), first, lat.median(Op::Replay), replay, tput));
    }

    let proxied = latency_rt.block_on(proxied_runs(&s, &scope));

    let mut peer_line = None;
    if let (Some(python), Some((first, replay))) = (&s.python, redis_idem) {
        println!(
            "\n## Peer: AWS Powertools idempotent_function, RedisCachePersistenceLayer, same Redis"
        );
        match run_peer(&s, python) {
            Ok(p) => {
                println!(
                    "  {} (aws-lambda-powertools {}, redis-py {}), {} calls per op",
                    p.python, p.powertools_version, p.redis_py_version, p.iterations
                );
                println!("  {:<30} {:>10}", "powertools first call", us(p.first_call_ns));
                println!("  {:<30} {:>10}", "powertools replay", us(p.replay_ns));
                println!("  {:<30} {:>10}", "redis-py 2 x SET NX", us(p.raw_set_nx_2_ns));
                println!("  {:<30} {:>10}", "redis-py GET", us(p.raw_get_ns));
                let (fr, rr) = (p.first_call_ns / first, p.replay_ns / replay);
                println!(
                    "  idem (Redis) is {fr:.1}x faster on first call, {rr:.1}x on replay (goal >= 5x: \
                     {} / {})",
                    if fr >= 5.0 { "met" } else { "MISSED" },
                    if rr >= 5.0 { "met" } else { "MISSED" }
                );
                peer_line = Some((p, fr, rr));
            }
            Err(e) => println!("  peer not measured: {e}"),
        }
    } else if s.python.is_none() {
        println!("\n(peer skipped: set IDEM_BENCH_PYTHON to a Python with aws-lambda-powertools)");
    }

    println!("\n## Summary (markdown)\n");
    println!(
        "| store | first call | first / 2 raw writes (≤ 1.3) | replay | replay / 1 raw read (≤ 1.2; SQLite 1.5) | \
         first calls/s (raw 2 writes/s) | replays/s (raw reads/s) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (label, first, fr, replay, rr, tput) in &summary {
        let t = |op: Op| {
            let raw = match op {
                Op::Raw2 => tput.get(&Op::Raw2Blocking),
                Op::Raw1 => tput.get(&Op::Raw1Blocking),
                _ => None,
            };
            raw.or(tput.get(&op)).copied().unwrap_or(f64::NAN)
        };
        println!(
            "| {label} | {} | {fr:.2} {} | {} | {rr:.2} {} | {:.0} ({:.0}) | {:.0} ({:.0}) |",
            us(*first),
            verdict(*fr, 1.3),
            us(*replay),
            verdict(*rr, replay_target(label)),
            t(Op::First),
            t(Op::Raw2),
            t(Op::Replay),
            t(Op::Raw1),
        );
    }
    if !proxied.is_empty() {
        println!(
            "\n| through the delay proxy ({} µs each way) | raw 2 writes | first call | first / 2 raw \
             (≤ 1.1) | raw 1 read | replay | replay / 1 raw |",
            s.proxy_delay.as_micros()
        );
        println!("|---|---|---|---|---|---|---|");
        for p in &proxied {
            println!(
                "| {} | {} | {} | {:.2} {} | {} | {} | {:.2} |",
                p.label,
                us(p.raw2),
                us(p.first),
                p.first_ratio,
                verdict(p.first_ratio, 1.1),
                us(p.raw1),
                us(p.replay),
                p.replay_ratio
            );
        }
    }
    if let Some((p, fr, rr)) = peer_line {
        println!(
            "\n| Powertools on the same Redis | first call {} ({fr:.1}x idem) | replay {} ({rr:.1}x idem) |",
            us(p.first_call_ns),
            us(p.replay_ns)
        );
    }

    latency_rt.block_on(cleanup(&s));
}

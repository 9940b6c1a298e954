//! The PostgreSQL store through PgBouncer in transaction mode against raw round trips through the
//! same PgBouncer: a first call (claim + complete) against two raw writes, a replay against one
//! raw read by primary key. Both sides send unnamed statements (`query_typed`), since PgBouncer
//! in transaction mode carries no prepared statements; the store runs with `pgbouncer=true`.
//!
//! Run it with `benches/run_store_benches.sh pgbouncer`, which starts a private PgBouncer in
//! front of `IDEM_PG_URL`'s server, or point `IDEM_BENCH_PGBOUNCER_URL` at one (a libpq
//! connection string without `pgbouncer=true`). Rounds interleave the four kinds of call; a ratio
//! is the median over rounds of (idem median / raw median) in that round, as in `stores.rs`.
//! Settings: `IDEM_BENCH_ROUNDS` (9), `IDEM_BENCH_CALLS` (200 per kind and round).
//!
//! The raw table is dropped at the end; idem's records stay in the database's `idem_records`,
//! completed with a one-hour retention (the store's sweep removes them later).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::{Idem, PostgresStore, Run, Scope};
use tokio_postgres::types::Type;

mod common;

use common::{ChargeCard, charge_args};

const CHARGE: ChargeCard = ChargeCard { gate: None };
const RAW_VALUE: &str =
    r#"{"id":"ch_3PqR7s","amount_cents":4900,"fp":"9f86d081884c7d659a2feaa0c55ad015"}"#;
/// Seeded records (the replays) are numbered from here; first calls count up from 1.
const SEED: u64 = 1 << 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Raw2,
    First,
    Raw1,
    Replay,
}

struct Bench {
    run: Run,
    raw: tokio_postgres::Client,
    table: String,
    next: AtomicU64,
}

impl Bench {
    async fn op(&self, op: Op) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match op {
            Op::Raw2 => {
                let insert = format!(
                    "INSERT INTO {} (key, val) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    self.table
                );
                for side in ["a", "b"] {
                    let key = format!("raw:{n}:{side}");
                    self.raw
                        .execute_typed(&insert, &[(&key, Type::TEXT), (&RAW_VALUE, Type::TEXT)])
                        .await
                        .expect("raw insert");
                }
            }
            Op::Raw1 => {
                let select = format!("SELECT val FROM {} WHERE key = $1", self.table);
                let row = self
                    .raw
                    .query_typed(&select, &[(&"raw:seed:a", Type::TEXT)])
                    .await
                    .expect("raw select");
                std::hint::black_box(row);
            }
            Op::First => {
                let out = self.run.call(&CHARGE, charge_args(n)).await.expect("first call");
                std::hint::black_box(out);
            }
            Op::Replay => {
                let out = self.run.call(&CHARGE, charge_args(SEED)).await.expect("replay");
                std::hint::black_box(out);
            }
        }
    }
}

fn env_or<T: FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1000.0
}

fn main() {
    let Ok(url) = std::env::var("IDEM_BENCH_PGBOUNCER_URL") else {
        eprintln!(
            "skipped: set IDEM_BENCH_PGBOUNCER_URL (benches/run_store_benches.sh pgbouncer starts \
             a PgBouncer and sets it)"
        );
        return;
    };
    let rounds: usize = env_or("IDEM_BENCH_ROUNDS", 9);
    let calls: usize = env_or("IDEM_BENCH_CALLS", 200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let run_id = format!("{:x}{:x}", (nanos % (1 << 40)) as u64, std::process::id());
        let store = PostgresStore::connect(&format!("{url} pgbouncer=true"))
            .await
            .expect("the store through PgBouncer");
        let config = tokio_postgres::Config::from_str(&url).expect("IDEM_BENCH_PGBOUNCER_URL");
        let (raw, conn) = config.connect(tokio_postgres::NoTls).await.expect("raw connect");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let table = format!("idem_bench_raw_{run_id}");
        raw.batch_execute(&format!(
            "CREATE TABLE {table} (key text PRIMARY KEY, val text NOT NULL); \
             INSERT INTO {table} VALUES ('raw:seed:a', '{RAW_VALUE}')"
        ))
        .await
        .expect("raw table");
        let run = Idem::new(store).scope(Scope::run(format!("pgbouncer-bench-{run_id}")));
        let bench = Bench { run, raw, table, next: AtomicU64::new(1) };
        bench.run.call(&CHARGE, charge_args(SEED)).await.expect("seed the replayed record");

        let ops = [Op::Raw2, Op::First, Op::Raw1, Op::Replay];
        for op in ops {
            for _ in 0..(calls / 4).max(10) {
                bench.op(op).await;
            }
        }
        let mut all: BTreeMap<Op, Vec<u64>> = BTreeMap::new();
        let (mut first_ratios, mut replay_ratios) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut order = ops.to_vec();
            if round % 2 == 1 {
                order.reverse();
            }
            let mut medians = BTreeMap::new();
            for op in order {
                let mut samples = Vec::with_capacity(calls);
                for _ in 0..calls {
                    let t = Instant::now();
                    bench.op(op).await;
                    samples.push(t.elapsed().as_nanos() as u64);
                }
                all.entry(op).or_default().extend_from_slice(&samples);
                medians.insert(op, median(&mut samples));
            }
            first_ratios.push(((medians[&Op::First] / medians[&Op::Raw2]) * 1000.0) as u64);
            replay_ratios.push(((medians[&Op::Replay] / medians[&Op::Raw1]) * 1000.0) as u64);
        }
        println!("## PostgreSQL through PgBouncer (transaction mode): per call, median of {rounds} x {calls}");
        for (op, label) in [
            (Op::Raw2, "raw 2 writes (unnamed)"),
            (Op::First, "idem first call"),
            (Op::Raw1, "raw 1 read (unnamed)"),
            (Op::Replay, "idem replay"),
        ] {
            println!("  {label:<28} {:>9.1} µs", median(all.get_mut(&op).expect("measured")));
        }
        println!("  first call / 2 raw writes = {:.2}", median(&mut first_ratios));
        println!("  replay / 1 raw read       = {:.2}", median(&mut replay_ratios));
        let dropped = bench.raw.batch_execute(&format!("DROP TABLE {}", bench.table)).await;
        if let Err(e) = dropped {
            eprintln!("warning: could not drop {}: {e}", bench.table);
        }
        let _ = Duration::ZERO;
    });
}

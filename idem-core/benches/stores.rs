//! Per-call cost of the durable stores (SQLite, PostgreSQL, Redis) against raw round trips of the
//! same server, measured in the same run with the same client library.
//!
//! - first call (claim + complete, through [`Idem`] and a keyed [`Tool`] that does no work) against
//!   two raw writes: `INSERT OR IGNORE` (SQLite, rusqlite), `INSERT .. ON CONFLICT DO NOTHING`
//!   (PostgreSQL, tokio-postgres through a deadpool-postgres pool with cached prepared statements,
//!   the kind of pool the store uses; direct connections beside it as a diagnostic), `SET key val
//!   NX` (Redis, redis-rs connection manager);
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
//! With the features `postgres-tls` and `redis-tls` (as `benches/run_store_benches.sh` builds it),
//! the same first call and replay against raw round trips over TLS, on a private PostgreSQL
//! (`sslmode=verify-full`) and a private Redis (`rediss://`) started by the bench
//! (`stores/tls.rs`).
//!
//! Settings (environment): `IDEM_PG_URL`, `IDEM_REDIS_URL` (the defaults of the test suite),
//! `IDEM_BENCH_ROUNDS` (default 9), `IDEM_BENCH_CALLS` (calls per kind and round, default 200),
//! `IDEM_BENCH_TPUT_SECS` (seconds per throughput sample, default 2), `IDEM_BENCH_STORES`
//! (comma-separated subset of `sqlite,postgres,redis`), `IDEM_BENCH_PROFILE` (`STORE:OP`, e.g.
//! `redis:replay`: only that op's throughput at 32 callers for `IDEM_BENCH_TPUT_SECS`, nothing
//! else, for a profiler; ops `raw2`, `first`, `raw1`, `replay`, `store-first`, `store-replay`,
//! and for PostgreSQL `raw2-direct`, `raw1-direct`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::store::{Claim, ClaimRequest, OnExpired, Outcome, Store};
use idem_core::{Fingerprint, Key, Run, Scope};

mod common;
mod delay_proxy;
#[path = "stores/measure.rs"]
mod measure;
#[path = "stores/peer.rs"]
mod peer;
#[path = "stores/proxied.rs"]
mod proxied;
#[path = "stores/raw.rs"]
mod raw;
#[path = "stores/setup.rs"]
mod setup;
#[cfg(all(feature = "postgres-tls", feature = "redis-tls"))]
#[path = "stores/tls.rs"]
mod tls;

use common::{ChargeArgs, ChargeCard, DEF, charge_args};
use measure::{latencies, median_f, throughput};
use peer::run_peer;
use proxied::proxied_runs;
use raw::Raw;
use setup::{Settings, cleanup, sqlite_path, sqlite_subject, subject};

/// The shared tool, without a gate: it answers at once.
const CHARGE: ChargeCard = ChargeCard { gate: None };

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
    /// Redis only: idem on the same server with the store's replay reads off, as in a process
    /// that did not see the key completed (after a restart, on another replica).
    cold: Option<Run>,
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
    /// PostgreSQL only: Raw2 / Raw1 on direct connections instead of the pool.
    Raw2Direct,
    Raw1Direct,
    /// Diagnostics: the store's own claim + complete, and claim of a completed key, called
    /// directly (no executor), to tell the store's cost from the executor's.
    StoreFirst,
    StoreReplay,
    /// Redis only: the same through the claim script (native claims off).
    ScriptFirst,
    ScriptReplay,
    /// Redis only: idem's replay without the store's replay read (`cold`).
    ColdReplay,
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
            Op::Raw2Direct => "raw 2 writes, direct conn",
            Op::Raw1Direct => "raw 1 read, direct conn",
            Op::StoreFirst => "store claim+complete only",
            Op::StoreReplay => "store claim (replay) only",
            Op::ScriptFirst => "store claim+complete, scripts",
            Op::ScriptReplay => "store claim (replay), scripts",
            Op::ColdReplay => "idem replay, no replay read",
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
            Op::ColdReplay => {
                let run = self.cold.as_ref().expect("a cold run (Redis)");
                let out = run.call(&CHARGE, seed_args(caller)).await.expect("replay");
                std::hint::black_box(out);
            }
            Op::Raw2Blocking => self.raw.write2_blocking(&self.prefix, next()).await,
            Op::Raw1Blocking => self.raw.read1_blocking(&self.read_keys[caller as usize]).await,
            Op::Raw2Direct => self.raw.write2_direct(&self.prefix, next()).await,
            Op::Raw1Direct => self.raw.read1_direct(&self.read_keys[caller as usize]).await,
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
        if matches!(self.raw, Raw::Postgres { pool: Some(_), .. }) {
            ops.extend([Op::Raw2Direct, Op::Raw1Direct]);
        }
        if self.scripts.is_some() {
            ops.extend([Op::ScriptFirst, Op::ScriptReplay]);
        }
        if self.cold.is_some() {
            ops.push(Op::ColdReplay);
        }
        ops
    }
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

    if let Ok(profile) = std::env::var("IDEM_BENCH_PROFILE") {
        profile_one(&s, &scope, &profile, &tput_rt);
        return;
    }

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
        if name == "postgres" {
            println!(
                "  diagnostics: raw baselines on direct connections instead of the pool: first call / \
                 2 raw writes = {:.2}, replay / 1 raw read = {:.2}, store alone's claim of a \
                 completed key / 1 raw read = {:.2}",
                lat.ratio(Op::First, Op::Raw2Direct),
                lat.ratio(Op::Replay, Op::Raw1Direct),
                lat.ratio(Op::StoreReplay, Op::Raw1Direct),
            );
        }
        if lat.all.contains_key(&Op::ColdReplay) {
            println!(
                "  replay in a process without the replay read (another process, after a \
                 restart) / 1 raw read = {:.2}",
                lat.ratio(Op::ColdReplay, Op::Raw1)
            );
        }
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
                Raw::Sqlite(_) => vec![
                    Op::Raw2Blocking,
                    Op::First,
                    Op::Raw1Blocking,
                    Op::Replay,
                    Op::StoreFirst,
                    Op::StoreReplay,
                ],
                Raw::Postgres { pool: Some(_), .. } => vec![
                    Op::Raw2,
                    Op::First,
                    Op::Raw1,
                    Op::Replay,
                    Op::StoreFirst,
                    Op::StoreReplay,
                    Op::Raw2Direct,
                    Op::Raw1Direct,
                ],
                _ => {
                    vec![Op::Raw2, Op::First, Op::Raw1, Op::Replay, Op::StoreFirst, Op::StoreReplay]
                }
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
                "  (PostgreSQL raw: a deadpool pool of {raw_conns} connections, as the store's; \
                 direct: {raw_conns} connections, pipelined when concurrent)"
            );
        }
        summary.push((label, lat.median(Op::First), first, lat.median(Op::Replay), replay, tput));
    }

    let proxied = latency_rt.block_on(proxied_runs(&s, &scope));
    #[cfg(all(feature = "postgres-tls", feature = "redis-tls"))]
    let over_tls = latency_rt.block_on(tls::tls_runs(&s, &scope));
    #[cfg(not(all(feature = "postgres-tls", feature = "redis-tls")))]
    let over_tls: Vec<proxied::Proxied> = {
        println!("\n(TLS rounds skipped: build with the features postgres-tls and redis-tls)");
        Vec::new()
    };

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
    if !over_tls.is_empty() {
        println!(
            "\n| over TLS (private servers) | raw 2 writes | first call | first / 2 raw (≤ 1.3) | \
             raw 1 read | replay | replay / 1 raw (≤ 1.2) |"
        );
        println!("|---|---|---|---|---|---|---|");
        for p in &over_tls {
            println!(
                "| {} | {} | {} | {:.2} {} | {} | {} | {:.2} {} |",
                p.label,
                us(p.raw2),
                us(p.first),
                p.first_ratio,
                verdict(p.first_ratio, 1.3),
                us(p.raw1),
                us(p.replay),
                p.replay_ratio,
                verdict(p.replay_ratio, 1.2)
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

/// `IDEM_BENCH_PROFILE=STORE:OP`: seeds the store, then runs only `OP` at 32 callers.
fn profile_one(s: &Settings, scope: &Scope, profile: &str, rt: &tokio::runtime::Runtime) {
    let (name, op) = profile.split_once(':').expect("IDEM_BENCH_PROFILE is STORE:OP");
    let op = match op {
        "raw2" => Op::Raw2,
        "first" => Op::First,
        "raw1" => Op::Raw1,
        "raw2-direct" => Op::Raw2Direct,
        "raw1-direct" => Op::Raw1Direct,
        "replay" => Op::Replay,
        "store-first" => Op::StoreFirst,
        "store-replay" => Op::StoreReplay,
        other => panic!("unknown op {other:?}"),
    };
    rt.block_on(async {
        let subject = if name == "sqlite" {
            sqlite_subject(s, scope).await.0
        } else {
            subject(name, s, scope, idem_core::store::postgres::DEFAULT_CONNECTIONS).await
        };
        let subject = Arc::new(subject);
        subject.seed().await;
        // IDEM_BENCH_PROFILE_CALLERS: 1 for the cost of one call alone (callgrind), else 32.
        let callers = std::env::var("IDEM_BENCH_PROFILE_CALLERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CALLERS);
        throughput(&subject, op, callers, Duration::from_millis(200)).await;
        let v = throughput(&subject, op, callers, s.tput).await;
        println!("{name} {}: {v:.0} calls/s", op.label());
        cleanup(s).await;
    });
}

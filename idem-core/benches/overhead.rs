//! Per-call overhead of a keyed call on the in-memory store, against the irreducible floor measured
//! in the same run: canonicalising and hashing the same ~200 bytes of arguments.
//!
//! `cargo bench -p idem-core --bench overhead`; the ratios are printed at the end (and recorded in
//! BENCHMARKS.md). Ratios, not absolute times, are what we compare: these machines are noisy.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::hint::black_box;

use criterion::{BatchSize, Criterion};
use sha2::{Digest, Sha256};

mod common;

use common::{ChargeArgs, ChargeCard, charge_args};
use idem_core::{Idem, MemoryStore, Scope};

fn floor(scope: &Scope, args: &ChargeArgs) -> idem_core::Key {
    let mut out = Vec::with_capacity(256);
    idem_core::canonicalize(args, &mut out).expect("finite arguments");
    idem_core::key::derive_key(scope, "charge_card", &out)
}

/// The floor of the floor: what any key would cost without canonical form, serde_json's own
/// bytes of the same value (members in declaration order, not sorted) hashed with SHA-256.
fn plain_floor(args: &ChargeArgs) -> [u8; 32] {
    let json = serde_json::to_vec(args).expect("serializable");
    Sha256::digest(&json).into()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let scope = Scope::run("bench-run");
    let mut canonical = Vec::new();
    idem_core::canonicalize(&charge_args(0), &mut canonical).expect("finite");
    eprintln!("canonical arguments: {} bytes", canonical.len());

    let mut g = c.benchmark_group("keyed_call");
    let counter = AtomicU64::new(0);
    g.bench_function("floor_canonicalize_and_hash", |b| {
        b.iter_batched(
            || charge_args(counter.fetch_add(1, Ordering::Relaxed)),
            |args| black_box(floor(&scope, &args)),
            BatchSize::SmallInput,
        )
    });

    let counter = AtomicU64::new(0);
    g.bench_function("plain_serde_json_and_sha256", |b| {
        b.iter_batched(
            || charge_args(counter.fetch_add(1, Ordering::Relaxed)),
            |args| black_box(plain_floor(&args)),
            BatchSize::SmallInput,
        )
    });

    let idem = Idem::new(MemoryStore::new());
    let run = idem.scope(scope.clone());
    let tool = ChargeCard { gate: None };
    let counter = AtomicU64::new(1_000_000);
    g.bench_function("first_call", |b| {
        b.to_async(&rt).iter_batched(
            || charge_args(counter.fetch_add(1, Ordering::Relaxed)),
            |args| async { black_box(run.call(&tool, args).await.expect("first call")) },
            BatchSize::SmallInput,
        )
    });

    // Replay on its own store: the first-call bench above filled `idem`'s with a million records.
    let idem = Idem::new(MemoryStore::new());
    let run = idem.scope(scope.clone());
    rt.block_on(run.call(&tool, charge_args(0))).expect("seed the record");
    g.bench_function("replay", |b| {
        b.to_async(&rt).iter_batched(
            || charge_args(0),
            |args| async { black_box(run.call(&tool, args).await.expect("replay")) },
            BatchSize::SmallInput,
        )
    });
    g.finish();

    // 1,000 concurrent duplicates: time from the first call's completion (the gate opening) until
    // every duplicate has its result.
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("duplicates");
    g.sample_size(20);
    let n = AtomicU64::new(0);
    g.bench_function("resolve_1000_after_first_completes", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let gate = Arc::new(tokio::sync::Semaphore::new(0));
                let tool = Arc::new(ChargeCard { gate: Some(gate.clone()) });
                let args = charge_args(10_000_000 + n.fetch_add(1, Ordering::Relaxed));
                let idem = Idem::new(MemoryStore::new());
                total += mt.block_on(async {
                    let run = idem.run("dups");
                    let tasks: Vec<_> = (0..1000)
                        .map(|_| {
                            let (run, tool, args) = (run.clone(), tool.clone(), args.clone());
                            tokio::spawn(async move { run.call(&*tool, args).await })
                        })
                        .collect();
                    // Let every duplicate reach the single flight before the first completes.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let opened = Instant::now();
                    gate.add_permits(1);
                    for t in tasks {
                        t.await.expect("task").expect("result");
                    }
                    opened.elapsed()
                });
            }
            total
        })
    });
    g.finish();
}

fn estimate_ns(group: &str, id: &str) -> Option<f64> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = dir.join("criterion").join(group).join(id).join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

/// Ratios measured interleaved: rounds of (plain, floor, first call, replay), each a batch of calls
/// timed as a whole, the ratio taken within each round and the median over rounds reported. On a
/// machine whose load changes by the second this is steadier than comparing criterion's
/// benchmarks, which run one after another.
#[allow(non_snake_case)]
fn interleaved() {
    // Fewer for a profiler: `IDEM_BENCH_ROUNDS`, `IDEM_BENCH_BATCH`.
    let env = |name: &str, default| {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    };
    let (ROUNDS, BATCH) = (env("IDEM_BENCH_ROUNDS", 21) as usize, env("IDEM_BENCH_BATCH", 20_000));
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let scope = Scope::run("bench-run");
    let tool = ChargeCard { gate: None };
    let (mut first_ratios, mut replay_ratios) = (Vec::new(), Vec::new());
    let (mut floor_ratios, mut floor_per_call, mut plain_per_call) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut next = 50_000_000u64;
    for _ in 0..ROUNDS {
        let idem = Idem::new(MemoryStore::new());
        let run = idem.scope(scope.clone());
        rt.block_on(run.call(&tool, charge_args(0))).expect("seed the record");
        let mut batch = || {
            next += BATCH;
            (next..next + BATCH).map(charge_args).collect::<Vec<_>>()
        };
        let (inputs, mut digests) = (batch(), Vec::with_capacity(BATCH as usize));
        let t = Instant::now();
        for args in &inputs {
            digests.push(plain_floor(args));
        }
        let plain_ns = t.elapsed().as_nanos() as f64;
        drop(digests);
        let mut keys = Vec::with_capacity(BATCH as usize);
        let t = Instant::now();
        for args in &inputs {
            keys.push(floor(&scope, args));
        }
        let floor_ns = t.elapsed().as_nanos() as f64;
        drop(keys);
        let (inputs, mut outs) = (batch(), Vec::with_capacity(BATCH as usize));
        let first_ns = rt.block_on(async {
            let mut inputs = inputs;
            let t = Instant::now();
            for args in inputs.drain(..) {
                outs.push(run.call(&tool, args).await.expect("first call"));
            }
            let ns = t.elapsed().as_nanos() as f64;
            // The batch's own buffer is freed outside the timed loop, as the floor's is: its
            // free can set glibc consolidating every small free chunk, which is not the calls'.
            drop(inputs);
            ns
        });
        outs.clear();
        let inputs: Vec<_> = (0..BATCH).map(|_| charge_args(0)).collect();
        let replay_ns = rt.block_on(async {
            let mut inputs = inputs;
            let t = Instant::now();
            for args in inputs.drain(..) {
                outs.push(run.call(&tool, args).await.expect("replay"));
            }
            let ns = t.elapsed().as_nanos() as f64;
            // The batch's own buffer is freed outside the timed loop, as the floor's is: its
            // free can set glibc consolidating every small free chunk, which is not the calls'.
            drop(inputs);
            ns
        });
        floor_ratios.push(floor_ns / plain_ns);
        floor_per_call.push(floor_ns / BATCH as f64);
        plain_per_call.push(plain_ns / BATCH as f64);
        first_ratios.push(first_ns / floor_ns);
        replay_ratios.push(replay_ns / floor_ns);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("\ninterleaved, median of {ROUNDS} rounds of {BATCH} calls each:");
    println!("first call / floor = {:.2} (target <= 2.0)", median(&mut first_ratios));
    println!("replay / floor     = {:.2} (target <= 1.5)", median(&mut replay_ratios));
    println!(
        "floor / plain      = {:.2} (target <= 1.5); per call: floor {:.0} ns, plain {:.0} ns \
         (serde_json::to_vec + SHA-256, unsorted)",
        median(&mut floor_ratios),
        median(&mut floor_per_call),
        median(&mut plain_per_call)
    );
}

fn profile(what: &str) {
    let n: u64 =
        std::env::var("IDEM_BENCH_BATCH").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let scope = Scope::run("bench-run");
    let tool = ChargeCard { gate: None };
    let idem = Idem::new(MemoryStore::new());
    let run = idem.scope(scope.clone());
    rt.block_on(run.call(&tool, charge_args(0))).expect("seed the record");
    rt.block_on(async {
        for i in 1..=n {
            match what {
                "floor" => drop(black_box(floor(&scope, &charge_args(i)))),
                "plain" => drop(black_box(plain_floor(&charge_args(i)))),
                "first" => drop(black_box(run.call(&tool, charge_args(i)).await)),
                "replay" => drop(black_box(run.call(&tool, charge_args(0)).await)),
                other => panic!("IDEM_BENCH_PROFILE: floor, plain, first or replay, not {other:?}"),
            }
        }
    });
}

fn main() {
    // `IDEM_BENCH_INTERLEAVED_ONLY=1`: the interleaved ratios alone, without criterion (quick).
    // `IDEM_BENCH_PROFILE=floor|plain|first|replay`: that alone, `IDEM_BENCH_BATCH` times, for a
    // profiler (`valgrind --tool=callgrind` counts instructions: repeatable on a busy machine).
    if let Ok(what) = std::env::var("IDEM_BENCH_PROFILE") {
        profile(&what);
        return;
    }
    if std::env::var_os("IDEM_BENCH_INTERLEAVED_ONLY").is_some() {
        interleaved();
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        interleaved();
    }
    let floor = estimate_ns("keyed_call", "floor_canonicalize_and_hash");
    let first = estimate_ns("keyed_call", "first_call");
    let replay = estimate_ns("keyed_call", "replay");
    let plain = estimate_ns("keyed_call", "plain_serde_json_and_sha256");
    let dups = estimate_ns("duplicates", "resolve_1000_after_first_completes");
    if let (Some(floor), Some(first), Some(replay)) = (floor, first, replay) {
        println!("\nmedians: floor {floor:.0} ns, first call {first:.0} ns, replay {replay:.0} ns");
        println!("first call / floor = {:.2} (target <= 2.0)", first / floor);
        println!("replay / floor     = {:.2} (target <= 1.5)", replay / floor);
        if let Some(plain) = plain {
            println!("floor / plain      = {:.2} (plain {plain:.0} ns)", floor / plain);
        }
    }
    if let Some(d) = dups {
        println!(
            "1,000 duplicates resolved {:.3} ms after the first completed (target < 5 ms)",
            d / 1e6
        );
    }
}

//! Measurement: per-call latencies in interleaved rounds, their medians and ratios, and the
//! throughput of concurrent callers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::setup::Settings;
use super::{Op, Subject};

fn median(v: &mut [u64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 { v[n / 2] as f64 } else { (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0 }
}

pub(super) fn median_f(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Per-call latencies of one store: every op in every round, each call timed on its own.
pub(super) struct Latencies {
    /// All samples (ns) per op.
    pub(super) all: BTreeMap<Op, Vec<u64>>,
    /// Per round: the median (ns) per op.
    pub(super) rounds: Vec<BTreeMap<Op, f64>>,
}

impl Latencies {
    pub(super) fn median(&self, op: Op) -> f64 {
        median(&mut self.all.get(&op).cloned().unwrap_or_default())
    }
    /// The median over rounds of (median of `a` / median of `b`) in that round.
    pub(super) fn ratio(&self, a: Op, b: Op) -> f64 {
        let mut r: Vec<f64> =
            self.rounds.iter().filter_map(|m| Some(m.get(&a)? / m.get(&b)?)).collect();
        median_f(&mut r)
    }
}

pub(super) async fn latencies(subject: &Subject, s: &Settings) -> Latencies {
    latencies_of(subject, subject.ops(), s.rounds, s.calls).await
}

/// [`latencies`] of `ops`, `rounds` rounds of `calls` calls each.
pub(super) async fn latencies_of(
    subject: &Subject,
    ops: Vec<Op>,
    rounds: usize,
    calls: usize,
) -> Latencies {
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
pub(super) async fn throughput(subject: &Arc<Subject>, op: Op, callers: u64, dur: Duration) -> f64 {
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

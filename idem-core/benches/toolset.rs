//! What a tool set adds to a replay on the in-memory store: reading the model's arguments (text
//! or a parsed value) into the tool's type, the checks that the key tells apart what the tool
//! reads (`toolset/same_key.rs`), and the result as JSON, against the typed call of the same
//! arguments (`Run::call`), measured in the same run.
//!
//! `cargo bench -p idem-core --bench toolset`. Interleaved rounds, as in `overhead.rs`: within
//! a round every variant runs under the same load, and the medians of the per-round ratios are
//! printed at the end.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{ChargeCard, charge_args};
use idem_core::{Idem, ToolSet};

/// The bench's arguments as a model sends them: integers where the tool takes integers.
fn args_text() -> String {
    serde_json::to_string(&charge_args(0)).expect("serializable")
}

/// The same arguments with the amount written as a float (`4900.0`), as clients that pass
/// numbers through a float send it: read as the integer, the same key.
fn args_text_whole_float() -> String {
    args_text().replace("\"amount_cents\":4900", "\"amount_cents\":4900.0")
}

const CALLS: u32 = 20_000;
const ROUNDS: usize = 15;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let run = Idem::in_memory().run("bench-run");
    let tool = ChargeCard { gate: None };
    let set = ToolSet::new().with(ChargeCard { gate: None }).expect("one tool");
    let (text, whole) = (args_text(), args_text_whole_float());
    let value: Value = serde_json::from_str(&text).expect("JSON");
    // Every variant replays the one record.
    rt.block_on(run.call(&tool, charge_args(0))).expect("seed the record");
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..CALLS {
            f();
        }
        start.elapsed() / CALLS
    };
    let mut typed = || {
        black_box(rt.block_on(run.call(&tool, black_box(charge_args(0)))).expect("replay"));
    };
    let mut from_text = || {
        let r = rt.block_on(set.call_text(&run, "charge_card", black_box(&text)));
        assert!(!r.is_error, "{}", r.text);
        black_box(r);
    };
    let mut from_whole = || {
        let r = rt.block_on(set.call_text(&run, "charge_card", black_box(&whole)));
        assert!(!r.is_error, "{}", r.text);
        black_box(r);
    };
    let mut from_value = || {
        let r = rt.block_on(set.call(&run, "charge_card", black_box(&value)));
        assert!(!r.is_error, "{}", r.text);
        black_box(r);
    };
    let mut rounds: Vec<[Duration; 4]> = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        rounds.push([
            time(&mut typed),
            time(&mut from_text),
            time(&mut from_whole),
            time(&mut from_value),
        ]);
    }
    let median = |i: usize| {
        let mut ratios: Vec<f64> =
            rounds.iter().map(|r| r[i].as_secs_f64() / r[0].as_secs_f64()).collect();
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    };
    let typed_ns = {
        let mut ns: Vec<u128> = rounds.iter().map(|r| r[0].as_nanos()).collect();
        ns.sort_unstable();
        ns[ns.len() / 2]
    };
    println!("tool set replay, {ROUNDS} rounds of {CALLS} calls, median ratio to the typed call:");
    println!("  typed Run::call replay                   {typed_ns} ns (1.00x)");
    println!("  ToolSet::call_text, integers             {:.2}x", median(1));
    println!("  ToolSet::call_text, amount as 4900.0     {:.2}x", median(2));
    println!("  ToolSet::call, parsed value              {:.2}x", median(3));
}

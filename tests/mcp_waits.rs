//! Calls that wait on another owner of their key, over the `payments_mcp` example's stdio with raw
//! JSON-RPC lines: the waiting request gets MCP progress notifications when it sent a
//! `progressToken`, and cancelling it (`notifications/cancelled`) leaves the run it joined alone.
//!
//! The provider takes `PAYMENTS_DELAY_MS` (3 s) to charge, so a duplicate sent right after the
//! first call finds it in flight. Charge ids are sequential (`ch_0001`, `ch_0002`, ...): the id a
//! later, new charge gets counts the charges made before it.

use mcp_support::Server;
use serde_json::{Value, json};

mod mcp_support;

fn charge(id: i64, amount: u64, meta: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "charge_card", "arguments": {"customer": "cus_w", "amount_cents": amount},
        "_meta": meta}})
    .to_string()
}

/// Reads until the response to `id`; returns it and the progress notifications before it.
fn until_response(s: &Server, id: i64, others: &mut Vec<Value>) -> (Value, Vec<Value>) {
    let mut progress = Vec::new();
    loop {
        let msg = s.read().unwrap_or_else(|| panic!("the server exited before answering {id}"));
        if msg["method"] == "notifications/progress" {
            progress.push(msg);
        } else if msg["id"] == id {
            return (msg, progress);
        } else {
            others.push(msg);
        }
    }
}

fn charge_id(response: &Value) -> String {
    assert_eq!(response["result"]["isError"], false, "{response}");
    response["result"]["structuredContent"]["charge_id"].as_str().unwrap().to_owned()
}

fn outcome(response: &Value) -> &str {
    response["result"]["_meta"]["idem/outcome"].as_str().unwrap_or_default()
}

#[test]
fn a_joiner_gets_progress_and_cancelling_it_leaves_the_shared_run_alone() {
    let binary = mcp_support::payments_mcp();
    let mut s = Server::start(&binary, &[("PAYMENTS_DELAY_MS", "3000")]);
    s.initialize();
    let mut others = Vec::new();

    // A joiner with a progress token hears from the server while the first call runs.
    s.write(&charge(1, 11, json!({"idem/run": "conv-w"})));
    s.write(&charge(2, 11, json!({"idem/run": "conv-w", "progressToken": "tok-2"})));
    let (first, before_first) = until_response(&s, 1, &mut others);
    let (joined, progress) = until_response(&s, 2, &mut others);
    let progress: Vec<_> = before_first.into_iter().chain(progress).collect();
    assert_eq!(charge_id(&first), "ch_0001");
    assert_eq!(charge_id(&joined), "ch_0001", "the joiner shares the first call's charge");
    assert_eq!((outcome(&first), outcome(&joined)), ("executed", "joined"));
    assert!(!progress.is_empty(), "no progress notification while the joiner waited");
    for (n, p) in progress.iter().enumerate() {
        assert_eq!(p["params"]["progressToken"], "tok-2", "{p}");
        assert_eq!(
            p["params"]["progress"].as_f64(),
            Some((n + 1) as f64),
            "progress increases: {p}"
        );
        let message = p["params"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("same idempotency key"), "{p}");
    }

    // The joiner is cancelled while the first call is in flight: the first call's charge is
    // made once and stored, and a repeat replays it.
    s.write(&charge(3, 12, json!({"idem/run": "conv-w"})));
    s.write(&charge(4, 12, json!({"idem/run": "conv-w", "progressToken": "tok-4"})));
    s.write(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 4, "reason": "the user gave up"}})
        .to_string(),
    );
    let (leader, _) = until_response(&s, 3, &mut others);
    assert_eq!(charge_id(&leader), "ch_0002");
    assert_eq!(outcome(&leader), "executed");
    s.write(&charge(5, 12, json!({"idem/run": "conv-w"})));
    let (repeat, _) = until_response(&s, 5, &mut others);
    assert_eq!(charge_id(&repeat), "ch_0002");
    assert_eq!(outcome(&repeat), "replayed");
    s.write(&charge(6, 13, json!({"idem/run": "conv-w"})));
    let (next, _) = until_response(&s, 6, &mut others);
    assert_eq!(charge_id(&next), "ch_0003", "one charge per intent, cancelled joiner included");

    // Whatever the cancelled request got (MCP: nothing, or its shared result), it was never an
    // error and never another charge.
    for msg in &others {
        assert_eq!(msg["id"], 4, "an unexpected message: {msg}");
        assert_eq!(charge_id(msg), "ch_0002", "{msg}");
    }
}

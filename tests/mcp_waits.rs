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

/// The response to `id` (already read into `others`, or read now) and the progress
/// notifications read before it.
fn until_response(s: &Server, id: i64, others: &mut Vec<Value>) -> (Value, Vec<Value>) {
    let mut progress = Vec::new();
    if let Some(i) = others.iter().position(|m| m["id"] == id) {
        return (others.remove(i), progress);
    }
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

/// The id of the first request that hears progress (the one waiting), reading from `s`; other
/// messages go to `others`.
fn first_waiter(s: &Server, tokens: &[(&str, i64)], others: &mut Vec<Value>) -> i64 {
    loop {
        let msg = s.read().expect("the server answers");
        if msg["method"] == "notifications/progress" {
            let token = msg["params"]["progressToken"].clone();
            if let Some((_, id)) = tokens.iter().find(|(t, _)| token == *t) {
                return *id;
            }
        }
        others.push(msg);
    }
}

#[test]
fn a_joiner_gets_progress_and_cancelling_it_leaves_the_shared_run_alone() {
    let binary = mcp_support::payments_mcp();
    let mut s = Server::start(&binary, &[("PAYMENTS_DELAY_MS", "3000")]);
    s.initialize();
    let mut others = Vec::new();

    // Two duplicates with progress tokens: whichever rmcp runs second joins the first, and only
    // the joiner hears progress while it waits.
    s.write(&charge(1, 11, json!({"idem/run": "conv-w", "progressToken": "tok-1"})));
    s.write(&charge(2, 11, json!({"idem/run": "conv-w", "progressToken": "tok-2"})));
    let (one, mut progress) = until_response(&s, 1, &mut others);
    let (two, more) = until_response(&s, 2, &mut others);
    progress.extend(more);
    progress.extend(others.extract_if(.., |m| m["method"] == "notifications/progress"));
    assert!(others.is_empty(), "{others:?}");
    assert_eq!((charge_id(&one), charge_id(&two)), ("ch_0001".into(), "ch_0001".into()));
    let (joined, token) = match (outcome(&one), outcome(&two)) {
        ("executed", "joined") => (&two, "tok-2"),
        ("joined", "executed") => (&one, "tok-1"),
        other => panic!("one executes, one joins: {other:?}"),
    };
    assert_eq!(joined["result"]["_meta"]["idem/run"], "conv-w");
    assert!(!progress.is_empty(), "no progress notification while the joiner waited");
    for (n, p) in progress.iter().enumerate() {
        assert_eq!(p["params"]["progressToken"], token, "only the joiner waits: {p}");
        let expected = f64::from(u32::try_from(n + 1).unwrap());
        assert_eq!(p["params"]["progress"].as_f64(), Some(expected), "progress increases: {p}");
        let message = p["params"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("same idempotency key"), "{p}");
    }

    // A joiner (the one that hears progress) is cancelled while the first call is in flight:
    // the charge is made once and stored, and a repeat replays it.
    s.write(&charge(3, 12, json!({"idem/run": "conv-w", "progressToken": "tok-3"})));
    s.write(&charge(4, 12, json!({"idem/run": "conv-w", "progressToken": "tok-4"})));
    let waiter = first_waiter(&s, &[("tok-3", 3), ("tok-4", 4)], &mut others);
    let leader = 7 - waiter;
    s.write(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": waiter, "reason": "the user gave up"}})
        .to_string(),
    );
    let (led, _) = until_response(&s, leader, &mut others);
    assert_eq!(charge_id(&led), "ch_0002");
    assert_eq!(outcome(&led), "executed");
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
        if msg["method"] == "notifications/progress" {
            assert_eq!(msg["params"]["progressToken"], format!("tok-{waiter}"), "{msg}");
            continue;
        }
        assert_eq!(msg["id"], waiter, "an unexpected message: {msg}");
        assert_eq!(charge_id(msg), "ch_0002", "{msg}");
    }
}

#[test]
fn a_cancelled_joiner_hears_no_more_progress() {
    let binary = mcp_support::payments_mcp();
    let mut s = Server::start(&binary, &[("PAYMENTS_DELAY_MS", "3000")]);
    s.initialize();
    let mut others = Vec::new();
    s.write(&charge(1, 21, json!({"idem/run": "conv-c", "progressToken": "tok-1"})));
    s.write(&charge(2, 21, json!({"idem/run": "conv-c", "progressToken": "tok-2"})));
    let waiter = first_waiter(&s, &[("tok-1", 1), ("tok-2", 2)], &mut others);
    let leader = 3 - waiter;
    s.write(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": waiter, "reason": "the user gave up"}})
        .to_string(),
    );
    // The first call takes 3 s more; progress comes every second while a request waits. After
    // the cancellation, at most one notification already on its way may still arrive.
    let (led, progress) = until_response(&s, leader, &mut others);
    assert_eq!(charge_id(&led), "ch_0001");
    let late: Vec<_> = progress
        .iter()
        .chain(others.iter().filter(|m| m["method"] == "notifications/progress"))
        .filter(|m| m["params"]["progressToken"] == format!("tok-{waiter}"))
        .collect();
    assert!(late.len() <= 1, "progress for a cancelled request: {late:?}");
}

/// One clock for progress: a notification when the wait starts, then one per
/// `PROGRESS_INTERVAL` (1 s), never one more each time the waiter goes back to waiting on the
/// store. A joiner that waits about 3.5 s hears 4 (at 0, 1, 2 and 3 s), with progress 1 to 4.
#[test]
fn a_wait_of_known_length_hears_one_progress_notification_per_second() {
    let binary = mcp_support::payments_mcp();
    let mut s = Server::start(&binary, &[("PAYMENTS_DELAY_MS", "3500")]);
    s.initialize();
    let mut others = Vec::new();
    let sent = std::time::Instant::now();
    s.write(&charge(1, 31, json!({"idem/run": "conv-p", "progressToken": "tok-1"})));
    s.write(&charge(2, 31, json!({"idem/run": "conv-p", "progressToken": "tok-2"})));
    let (one, mut progress) = until_response(&s, 1, &mut others);
    let (two, more) = until_response(&s, 2, &mut others);
    let waited = sent.elapsed();
    progress.extend(more);
    progress.extend(others.extract_if(.., |m| m["method"] == "notifications/progress"));
    assert!(others.is_empty(), "{others:?}");
    let token = match (outcome(&one), outcome(&two)) {
        ("executed", "joined") => "tok-2",
        ("joined", "executed") => "tok-1",
        other => panic!("one executes, one joins: {other:?}"),
    };
    assert!(progress.iter().all(|p| p["params"]["progressToken"] == token), "{progress:?}");
    let values: Vec<f64> =
        progress.iter().filter_map(|p| p["params"]["progress"].as_f64()).collect();
    assert!(values.windows(2).all(|w| w[0] < w[1]), "progress increases: {values:?}");
    // At most one at the start and one per whole second of the wait (measured here, so it is
    // at least as long as the server's). At least the first and one tick: on a loaded machine
    // the joiner's wait may start well after the leader's, so no more is certain.
    let most = 1 + usize::try_from(waited.as_secs()).unwrap_or(usize::MAX);
    assert!(
        (2..=most).contains(&progress.len()),
        "{} notifications in a wait of {waited:?} (expected 2 to {most}): {values:?}",
        progress.len()
    );
}

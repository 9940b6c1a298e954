//! What real MCP clients do to a server, over the `payments_mcp` example's stdio with raw
//! JSON-RPC lines: go away in the middle of a call and come back to a restarted server.
//!
//! The provider takes `PAYMENTS_DELAY_MS` to charge; charge ids are sequential, and the ledger
//! (`<db>.ledger.json`) counts the charge requests that reached the provider.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use mcp_support::{Server, payments_mcp, target_dir};
use serde_json::{Value, json};

mod mcp_support;

fn charge(id: i64, run: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "charge_card", "arguments": {"customer": "cus_eof", "amount_cents": 700},
        "_meta": {"idem/run": run}}})
    .to_string()
}

fn ledger(db: &Path) -> Value {
    let path = format!("{}.ledger.json", db.display());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn fresh_db(name: &str) -> std::path::PathBuf {
    let work = target_dir().join(name);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    work.join("idem.db")
}

/// After the first server (now exited) took `run`'s charge: the charge reached the provider once;
/// a new server process over the same SQLite store replays it (not taken over: the record was
/// completed before the first server exited, so the repeat did not wait out an abandoned lease
/// and charge again), and the provider is not asked again.
fn replayed_after_a_restart(binary: &Path, args: &[&OsStr], db: &Path, run: &str) {
    assert_eq!(ledger(db)["charge_requests"], 1, "the charge in flight finished before the exit");
    let mut second = Server::start_with(binary, args, &[]);
    second.initialize();
    second.write(&charge(2, run));
    let answer = second.read().expect("an answer");
    assert_eq!(answer["id"], 2, "{answer}");
    let result = &answer["result"];
    assert_eq!(result["isError"], false, "{answer}");
    assert_eq!(result["_meta"]["idem/outcome"], "replayed", "{answer}");
    assert_eq!(result["structuredContent"]["charge_id"], "ch_0001", "{answer}");
    assert_eq!(ledger(db)["charge_requests"], 1, "the provider was not asked again");
}

/// A client that closes stdin while its charge is in flight (it gave up, or its host is
/// restarting the server) and calls again on a new server process over the same SQLite store:
/// the charge finished and was stored before the first process exited, so the repeat is replayed
/// at once. rmcp itself only waits 5 s for handlers after EOF; the provider here takes 7 s.
/// Before, the process exited mid-charge and the repeat waited for the claim's lease (30 s) and
/// charged again (`taken_over`).
#[test]
fn a_call_in_flight_when_stdin_closes_is_stored_and_replayed_after_a_restart() {
    let binary = payments_mcp();
    let db = fresh_db("mcp-clients-eof");
    let args = [OsStr::new("--sqlite"), db.as_os_str()];
    let mut first = Server::start_with(&binary, &args, &[("PAYMENTS_DELAY_MS", "7000")]);
    first.initialize();
    first.write(&charge(1, "conversation-eof"));
    std::thread::sleep(Duration::from_millis(300));
    drop(first.stdin.take());
    let status = first.child.wait().unwrap();
    assert!(status.success(), "the server exits cleanly after EOF: {status}");
    replayed_after_a_restart(&binary, &args, &db, "conversation-eof");
}

fn signal(child: &std::process::Child, name: &str) {
    let pid = child.id().to_string();
    let sent = std::process::Command::new("kill").args([name, &pid]).status().expect("kill runs");
    assert!(sent.success(), "kill {name} {pid}");
}

/// A host that stops the server with SIGTERM while a charge is in flight (the MCP SDKs close
/// stdin, then SIGTERM about 2 s later, then SIGKILL; older ones send SIGTERM alone): the server
/// ends the session as on EOF, the charge finishes and is stored, the process exits cleanly, and
/// the repeat on a restarted server is replayed. Before, SIGTERM killed the process mid-charge and
/// the repeat waited out the lease and charged again (`taken_over`).
#[cfg(unix)]
#[test]
fn a_call_in_flight_when_sigterm_comes_is_stored_and_replayed_after_a_restart() {
    let binary = payments_mcp();
    let db = fresh_db("mcp-clients-sigterm");
    let args = [OsStr::new("--sqlite"), db.as_os_str()];
    let mut first = Server::start_with(&binary, &args, &[("PAYMENTS_DELAY_MS", "2000")]);
    first.initialize();
    first.write(&charge(1, "conversation-sigterm"));
    std::thread::sleep(Duration::from_millis(300));
    signal(&first.child, "-TERM");
    let status = first.child.wait().unwrap();
    assert!(status.success(), "the server exits cleanly after SIGTERM: {status}");
    replayed_after_a_restart(&binary, &args, &db, "conversation-sigterm");
}

/// The hosts' whole order (the MCP SDKs, VS Code): stdin closed, then SIGTERM 2 s later, then
/// SIGKILL. SIGTERM after EOF is the first signal, not a second: the charge still running (2.5 s)
/// finishes and is stored, and its repeat on a restarted server is replayed.
#[cfg(unix)]
#[test]
fn stdin_closed_then_sigterm_still_lets_a_call_in_flight_finish() {
    let binary = payments_mcp();
    let db = fresh_db("mcp-clients-ladder");
    let args = [OsStr::new("--sqlite"), db.as_os_str()];
    let mut first = Server::start_with(&binary, &args, &[("PAYMENTS_DELAY_MS", "2500")]);
    first.initialize();
    first.write(&charge(1, "conversation-ladder"));
    std::thread::sleep(Duration::from_millis(300));
    drop(first.stdin.take());
    std::thread::sleep(Duration::from_millis(1000));
    signal(&first.child, "-TERM");
    let status = first.child.wait().unwrap();
    assert!(status.success(), "the server exits cleanly: {status}");
    replayed_after_a_restart(&binary, &args, &db, "conversation-ladder");
}

/// A second signal ends the wait for the calls still running: an operator's second Ctrl-C
/// stops the process (the charge, a minute long here, is left to its lease).
#[cfg(unix)]
#[test]
fn a_second_signal_stops_waiting_for_the_calls_still_running() {
    let binary = payments_mcp();
    let db = fresh_db("mcp-clients-second-signal");
    let args = [OsStr::new("--sqlite"), db.as_os_str()];
    let mut s = Server::start_with(&binary, &args, &[("PAYMENTS_DELAY_MS", "60000")]);
    s.initialize();
    s.write(&charge(1, "conversation-second-signal"));
    std::thread::sleep(Duration::from_millis(300));
    signal(&s.child, "-INT");
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.child.try_wait().unwrap().is_none(), "the first signal waits for the charge");
    signal(&s.child, "-INT");
    for _ in 0..100 {
        if let Some(status) = s.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = s.child.kill();
    panic!("the server still waits for its minute-long charge after a second signal");
}

fn call(id: i64, name: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments, "_meta": {"idem/run": "conversation-ids"}}})
    .to_string()
}

/// A client that reuses the id of a request still in flight (MCP 2025-11-25 "Basic": it MUST
/// NOT): the second request is refused with -32600 and that id, and does not run. Before, rmcp
/// ran it (a second charge) and dropped its response, so the client never heard of the effect.
/// An id is free again once answered.
#[test]
fn a_request_reusing_the_id_of_one_in_flight_is_refused_and_does_not_run() {
    let mut s = Server::start(&payments_mcp(), &[("PAYMENTS_DELAY_MS", "1000")]);
    s.initialize();
    s.write(&call(7, "charge_card", json!({"customer": "cus_a", "amount_cents": 1})));
    s.write(&call(7, "charge_card", json!({"customer": "cus_b", "amount_cents": 1})));
    let (first, second) = (s.read().expect("an answer"), s.read().expect("an answer"));
    let (refused, answered) =
        if first.get("error").is_some() { (first, second) } else { (second, first) };
    assert_eq!(refused["id"], 7, "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("in flight") && message.contains("id of its own"), "{message}");
    assert_eq!(answered["id"], 7, "{answered}");
    assert_eq!(answered["result"]["structuredContent"]["customer"], "cus_a", "{answered}");

    // Nothing was charged to cus_b; the id, answered, may be used again.
    s.write(&call(7, "get_balance", json!({"customer": "cus_b"})));
    let balance = s.read().expect("an answer");
    assert_eq!(balance["id"], 7, "{balance}");
    assert_eq!(balance["result"]["structuredContent"]["balance_cents"], 0, "{balance}");
}

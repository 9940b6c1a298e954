//! The cases held over stdio, held over streamable HTTP: `tests/mcp/http_cases_test.py` drives
//! `payments_mcp --http` (SQLite store, two bearer tokens) with the official Python MCP SDK, one
//! case per test, each with its own server and store:
//!
//! - a session the server closed for silence answers HTTP 404; re-initialized with the same
//!   token and run id the call replays, with another token it is that user's own;
//! - duplicates in flight join the first call (and hear progress while they wait);
//! - cancelling a joiner (`notifications/cancelled`) leaves the shared run alone;
//! - a restart on SQLite replays a charge and keeps an unknown refund unknown;
//! - a body over the server's limit is 413, also when the server would answer it itself;
//! - a request reusing the id of one in flight in its session is 400, -32600 and runs nothing;
//! - a session DELETEd mid-call: the call is stored once and replayed in a new session, 404
//!   after; a dropped response stream resumes with GET and `Last-Event-ID`, and a resume with
//!   nothing left to send is 410;
//! - a user's 101st open session closes that user's least recently used one (404 after), and
//!   no other;
//! - SIGTERM while a charge is in flight: the charge finishes and is stored before the server
//!   exits, and the repeat on a restarted server is replayed;
//! - integers beyond 64 bits and beyond 2^53 in arguments are exact, as over stdio;
//! - a body that is not UTF-8 is a JSON-RPC parse error (-32700), as a line over stdio is, with
//!   400, as is a body that is not JSON or a batch (MCP "Transports": input the server cannot
//!   accept is an HTTP error);
//! - a message answered before rmcp reads it (bad arguments) still gets 404 for an unknown
//!   session and 400 for none, and 403 for a forbidden `Host` or `Origin`, as rmcp answers any
//!   message there; a notification the server cannot accept, or an empty body, is 400;
//! - a session belongs to the user who opened it: another user's token naming it is 404 for a
//!   call, its stream and its DELETE, and nothing runs; another origin is 403; the bearer
//!   scheme is case-insensitive and a 401 names it.
//!
//! Setup and skips as in `tests/mcp_python.rs`.

use std::path::Path;
use std::process::Command;

use idem_tests::or_skip;
use mcp_support::{payments_mcp, python_with_mcp, target_dir};

mod mcp_support;

fn case(name: &str) {
    let Some(python) = or_skip("python3 with the `mcp` package", python_with_mcp()) else {
        return;
    };
    let server = payments_mcp();
    let work = target_dir().join(format!("mcp-http-{name}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/http_cases_test.py");
    let out = Command::new(python).arg(script).arg(name).arg(&server).arg(&work).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python MCP client failed ({name}):\n{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("ok: {name}:")), "{stdout}");
}

#[test]
fn a_call_longer_than_the_idle_limit_keeps_its_session_then_it_expires_with_404_and_a_repeat_replays()
 {
    case("expiry");
}

#[test]
fn duplicates_over_http_join_the_call_in_flight() {
    case("joins");
}

#[test]
fn cancelling_a_joiner_over_http_leaves_the_shared_run_alone() {
    case("cancel");
}

#[test]
fn a_restart_on_sqlite_replays_over_http() {
    case("restart");
}

#[test]
fn integers_beyond_64_bits_and_2_pow_53_are_exact_over_http() {
    case("numbers");
}

#[test]
fn a_body_that_is_not_utf8_is_a_parse_error_over_http() {
    case("not_utf8");
}

#[test]
fn a_bad_request_in_an_unknown_session_is_404_before_its_json_rpc_answer() {
    case("sessions");
}

#[test]
fn a_session_is_its_owners_and_other_origins_are_refused() {
    case("owners");
}

#[test]
fn a_request_reusing_the_id_of_one_in_flight_is_refused_and_runs_nothing() {
    case("duplicate_ids");
}

#[test]
fn a_body_over_the_limit_is_413_and_not_kept() {
    case("big_body");
}

#[test]
fn a_users_sessions_are_bounded_and_the_least_recently_used_goes() {
    case("bound");
}

#[test]
fn a_session_deleted_mid_call_stores_the_call_once_and_a_dropped_stream_resumes() {
    case("lifecycle");
}

#[cfg(unix)]
#[test]
fn a_call_in_flight_when_sigterm_comes_is_stored_and_replayed_over_http() {
    case("sigterm");
}

//! Raw JSON-RPC lines over the `payments_mcp` example's stdio, including lines an SDK refuses to
//! send: every request from which an id can be read gets exactly one response with that id and
//! the right code (JSON-RPC 2.0 §5.1; MCP `isError` for bad tool arguments), notifications get
//! none, and the server keeps serving.
//!
//! Each case writes its line, then a `ping` sentinel with a fresh id, and reads until the
//! sentinel's answer (and the case's, when it goes to a tool) has arrived: anything else that
//! arrives is a failure.

use mcp_support::Server;
use serde_json::{Value, json};

mod mcp_support;

/// What one case expects: `None` for no response at all.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// A JSON-RPC error with this code, for the case's id (`null` when `id` is `None`).
    Error(i64),
    /// A tool result with `isError: true` whose text contains this.
    ToolError(&'static str),
    /// A successful tool result.
    ToolOk,
    /// No response (a notification).
    Nothing,
}

trait Check {
    fn check(&mut self, what: &str, line: &str, id: Option<Value>, expect: Expect);
}

impl Check for Server {
    /// Sends `line` and checks that exactly the expected response, and nothing else, came back.
    fn check(&mut self, what: &str, line: &str, id: Option<Value>, expect: Expect) {
        // Answers from rmcp's handlers may come after the sentinel's: wait for them too.
        let wait_for = if let Expect::Nothing = expect { None } else { id.as_ref() };
        let id_key = id.clone().unwrap_or(Value::Null);
        let mut got = self.exchange(line, wait_for);
        let answers = got.remove(&id_key.to_string()).unwrap_or_default();
        assert!(got.is_empty(), "{what}: responses for other ids: {got:?}");
        if let Expect::Nothing = expect {
            assert!(answers.is_empty(), "{what}: a notification was answered: {answers:?}");
            return;
        }
        assert_eq!(answers.len(), 1, "{what}: exactly one response expected: {answers:?}");
        let answer = &answers[0];
        assert_eq!(answer["jsonrpc"], "2.0", "{what}: {answer}");
        assert_eq!(answer["id"], id_key, "{what}: {answer}");
        match expect {
            Expect::Error(code) => {
                assert_eq!(answer["error"]["code"], code, "{what}: {answer}");
                assert!(answer["error"]["message"].is_string(), "{what}: {answer}");
            }
            Expect::ToolError(text) => {
                assert_eq!(answer["result"]["isError"], true, "{what}: {answer}");
                let said = answer["result"]["content"][0]["text"].as_str().unwrap_or_default();
                assert!(said.contains(text), "{what}: {said:?} lacks {text:?}");
            }
            Expect::ToolOk => assert_eq!(answer["result"]["isError"], false, "{what}: {answer}"),
            Expect::Nothing => unreachable!(),
        }
    }
}

fn call(id: i64, params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#)
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn every_request_line_gets_one_answer_with_its_id_and_notifications_none() {
    const INVALID_ARGUMENTS: &str = "Error (invalid_arguments)";
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    s.initialize();
    let charge =
        |id, args: &str| call(id, &format!(r#"{{"name":"charge_card","arguments":{args}}}"#));
    let cases: Vec<(&str, String, Option<Value>, Expect)> = vec![
        // Values inside the arguments that serde_json cannot represent: the tool's own error.
        ("1e400 in arguments", charge(1, r#"{"customer":"c","amount_cents":1e400}"#), Some(json!(1)), Expect::ToolError("number out of range")),
        ("lone surrogate in arguments", charge(2, r#"{"customer":"\ud800","amount_cents":1}"#), Some(json!(2)), Expect::ToolError(INVALID_ARGUMENTS)),
        ("125 levels in arguments", charge(3, &format!(r#"{{"customer":{},"amount_cents":1}}"#, nested(125))), Some(json!(3)), Expect::ToolError(INVALID_ARGUMENTS)),
        ("100,000 levels in arguments", charge(4, &format!(r#"{{"customer":{},"amount_cents":1}}"#, nested(100_000))), Some(json!(4)), Expect::ToolError("recursion limit")),
        ("arguments an array", charge(5, "[1,2]"), Some(json!(5)), Expect::ToolError("must be a JSON object, not an array")),
        ("arguments a string", charge(6, r#""cus_1""#), Some(json!(6)), Expect::ToolError("not a string")),
        ("arguments a number", charge(7, "7"), Some(json!(7)), Expect::ToolError("not a number")),
        // A string holding no text (OpenAI's arguments for none, passed on by a bridge): none.
        ("arguments an empty string", charge(50, r#""""#), Some(json!(50)), Expect::ToolError("missing field `customer`")),
        ("a repeated argument", charge(8, r#"{"customer":"acct-A","amount_cents":500,"customer":"acct-B"}"#), Some(json!(8)), Expect::ToolError("the member `customer` appears twice")),
        ("a repeated nested member", charge(9, r#"{"customer":"a","amount_cents":5,"x":{"k":1,"k":2}}"#), Some(json!(9)), Expect::ToolError("appears twice in the object at `x`")),
        // The envelope: protocol errors with the id.
        ("ping with 1e400 params", r#"{"jsonrpc":"2.0","id":10,"method":"ping","params":{"x":1e400}}"#.into(), Some(json!(10)), Expect::Error(-32602)),
        ("ping with a lone surrogate", r#"{"jsonrpc":"2.0","id":"s-11","method":"ping","params":{"x":"\ud800"}}"#.into(), Some(json!("s-11")), Expect::Error(-32602)),
        ("ping nested 200 deep", format!(r#"{{"jsonrpc":"2.0","id":12,"method":"ping","params":{{"x":{}}}}}"#, nested(200)), Some(json!(12)), Expect::Error(-32602)),
        ("a repeated name", call(13, r#"{"name":"charge_card","name":"refund","arguments":{}}"#), Some(json!(13)), Expect::Error(-32602)),
        ("a repeated arguments member", call(14, r#"{"name":"get_balance","arguments":{"customer":"a"},"arguments":{"customer":"b"}}"#), Some(json!(14)), Expect::Error(-32602)),
        ("params an array", call(15, r#"["charge_card",{}]"#), Some(json!(15)), Expect::Error(-32602)),
        ("params a string", call(16, r#""charge_card""#), Some(json!(16)), Expect::Error(-32600)),
        ("no tool name", call(17, r#"{"arguments":{}}"#), Some(json!(17)), Expect::Error(-32602)),
        ("_meta a number", call(40, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":5}"#), Some(json!(40)), Expect::Error(-32602)),
        ("_meta an array", call(41, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":[]}"#), Some(json!(41)), Expect::Error(-32602)),
        // `null` is no `_meta` (clients that write an absent field as `null`): the call runs.
        ("_meta null", call(39, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":null}"#), Some(json!(39)), Expect::ToolOk),
        ("_meta a string on ping", r#"{"jsonrpc":"2.0","id":42,"method":"ping","params":{"_meta":"s"}}"#.into(), Some(json!(42)), Expect::Error(-32602)),
        // A progress token rmcp cannot carry would be dropped, and no progress would come.
        ("progressToken an object", call(43, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":{"progressToken":{"a":1}}}"#), Some(json!(43)), Expect::Error(-32602)),
        ("progressToken a fraction", call(44, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":{"progressToken":1.5}}"#), Some(json!(44)), Expect::Error(-32602)),
        ("progressToken beyond 64 bits", call(45, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":{"progressToken":123456789012345678901234567890}}"#), Some(json!(45)), Expect::Error(-32602)),
        ("progressToken a boolean", call(46, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":{"progressToken":true}}"#), Some(json!(46)), Expect::Error(-32602)),
        ("progressToken an integer", call(47, r#"{"name":"get_balance","arguments":{"customer":"a"},"_meta":{"progressToken":-1}}"#), Some(json!(47)), Expect::ToolOk),
        // An id with neither a method nor a result or an error: a request without its method.
        ("an id alone", r#"{"jsonrpc":"2.0","id":48}"#.into(), Some(json!(48)), Expect::Error(-32600)),
        ("initialize params that do not fit", r#"{"jsonrpc":"2.0","id":18,"method":"initialize","params":{"protocolVersion":7}}"#.into(), Some(json!(18)), Expect::Error(-32602)),
        ("the id after a bad value", r#"{"jsonrpc":"2.0","method":"ping","params":{"x":1e400},"id":19}"#.into(), Some(json!(19)), Expect::Error(-32602)),
        ("jsonrpc 1.0", r#"{"jsonrpc":"1.0","id":20,"method":"ping"}"#.into(), Some(json!(20)), Expect::Error(-32600)),
        ("method a number", r#"{"jsonrpc":"2.0","id":21,"method":5}"#.into(), Some(json!(21)), Expect::Error(-32600)),
        ("a repeated method", r#"{"jsonrpc":"2.0","id":22,"method":"ping","method":"tools/list"}"#.into(), Some(json!(22)), Expect::Error(-32600)),
        ("unknown method", r#"{"jsonrpc":"2.0","id":23,"method":"tools/frobnicate"}"#.into(), Some(json!(23)), Expect::Error(-32601)),
        ("truncated after the id", r#"{"jsonrpc":"2.0","id":24,"method":"ping""#.into(), Some(json!(24)), Expect::Error(-32700)),
        // No id to be had: answered with id null.
        ("not JSON", "charge the card please".into(), None, Expect::Error(-32700)),
        ("truncated before the id", r#"{"jsonrpc":"2.0","method":"ping","#.into(), None, Expect::Error(-32700)),
        ("a batch", r#"[{"jsonrpc":"2.0","id":25,"method":"ping"}]"#.into(), None, Expect::Error(-32600)),
        ("a string", r#""ping""#.into(), None, Expect::Error(-32600)),
        ("a null id", r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#.into(), None, Expect::Error(-32600)),
        ("a float id", r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#.into(), None, Expect::Error(-32600)),
        ("a repeated id", r#"{"jsonrpc":"2.0","id":26,"id":27,"method":"ping"}"#.into(), None, Expect::Error(-32600)),
        // Notifications: never answered, however bad.
        ("notification with 1e400", r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"x":1e400}}"#.into(), None, Expect::Nothing),
        ("notification with a lone surrogate", r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"x":"\ud800"}}"#.into(), None, Expect::Nothing),
        ("notification params an array", r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":[1]}"#.into(), None, Expect::Nothing),
        ("notification with repeated members", r#"{"jsonrpc":"2.0","method":"notifications/roots/list_changed","params":{"a":1,"a":2}}"#.into(), None, Expect::Nothing),
        ("unknown notification", r#"{"jsonrpc":"2.0","method":"notifications/frobnicated"}"#.into(), None, Expect::Nothing),
        ("notification nested 100,000 deep", format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{}}}"#, nested(100_000)), None, Expect::Nothing),
        // And the server still works.
        ("a good call", charge(28, r#"{"customer":"cus_raw","amount_cents":5}"#), Some(json!(28)), Expect::ToolOk),
        // Arguments encoded twice (an object's text in a string): the object inside.
        ("arguments an object's text", charge(49, r#""{\"customer\":\"cus_text\",\"amount_cents\":5}""#), Some(json!(49)), Expect::ToolOk),
    ];
    for (what, line, id, expect) in cases {
        s.check(what, &line, id, expect);
    }
    // The first good charge ran once; a repeat with members in another order replays it.
    let again =
        s.exchange(&charge(29, r#"{"amount_cents":5,"customer":"cus_raw"}"#), Some(&json!(29)));
    let text = again["29"][0]["result"]["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(text.contains("ch_0001"), "one charge in all: {text}");
    // Closing stdin ends the session; nothing else was written.
    drop(s.stdin.take());
    assert_eq!(s.read(), None, "nothing after the last answer");
    assert!(s.child.wait().unwrap().success());
}

/// The one answer to `line` (sent with `id`), after checking that nothing else came back.
fn answer(s: &mut Server, line: &str, id: i64) -> Value {
    let mut got = s.exchange(line, Some(&json!(id)));
    let answers = got.remove(&json!(id).to_string()).unwrap_or_default();
    assert!(got.is_empty(), "{line}: responses for other ids: {got:?}");
    assert_eq!(answers.len(), 1, "{line}: exactly one response expected: {answers:?}");
    answers.into_iter().next().unwrap()
}

fn list(id: i64, method: &str, params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#)
}

/// MCP 2025-11-25 "Pagination": an invalid cursor is -32602. idem's server lists every tool in
/// one page, so no cursor is valid; a cursor that is not a string is refused for every list
/// method, also in front of a user's own rmcp server, whose string cursors stay its own.
#[test]
fn a_list_cursor_the_server_never_issued_is_invalid_params() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    s.initialize();
    let error = |a: &Value| {
        (a["error"]["code"].as_i64(), a["error"]["message"].as_str().map(str::to_owned))
    };
    let all = answer(&mut s, &list(1, "tools/list", "{}"), 1);
    let names = all["result"]["tools"].as_array().map(Vec::len).unwrap_or_default();
    assert!(names > 0 && all["result"].get("nextCursor").is_none(), "{all}");
    let null = answer(&mut s, &list(2, "tools/list", r#"{"cursor":null}"#), 2);
    assert_eq!(null["result"], all["result"], "a null cursor is no cursor");
    let bogus = answer(&mut s, &list(3, "tools/list", r#"{"cursor":"bogus"}"#), 3);
    let (code, message) = error(&bogus);
    assert_eq!(code, Some(-32602), "{bogus}");
    assert!(
        message.as_deref().unwrap_or_default().contains("send tools/list without a cursor"),
        "{bogus}"
    );
    for (id, method, cursor, found) in [
        (4, "tools/list", "5", "not a number"),
        (5, "tools/list", "{}", "not an object"),
        (6, "prompts/list", "[]", "not an array"),
        (7, "resources/list", "true", "not a boolean"),
        (8, "resources/templates/list", "7", "not a number"),
    ] {
        let a = answer(&mut s, &list(id, method, &format!(r#"{{"cursor":{cursor}}}"#)), id);
        let (code, message) = error(&a);
        let message = message.unwrap_or_default();
        assert_eq!(code, Some(-32602), "{method} {cursor}: {a}");
        assert!(message.contains(&format!("the `cursor` of `{method}` must be a string")), "{a}");
        assert!(message.contains(found), "{a}");
    }

    // idem tools inside a user's rmcp server: its tools/list answers string cursors itself.
    let mut s = Server::start(&mcp_support::build_example("mixed_mcp"), &[]);
    s.initialize();
    let a = answer(&mut s, &list(1, "tools/list", r#"{"cursor":5}"#), 1);
    assert_eq!(error(&a).0, Some(-32602), "{a}");
    let a = answer(&mut s, &list(2, "tools/list", r#"{"cursor":"its-own"}"#), 2);
    assert!(a["result"]["tools"].is_array(), "the user's handler answers: {a}");
}

/// A run id or caller key in `_meta` longer than `MAX_META_ID_BYTES` (1,024 bytes) is refused as
/// an ill-formed idem entry (-32602, like a number there), saying the limit, not echoed or
/// stored; one at the limit is served and echoed whole.
#[test]
fn a_run_id_longer_than_1024_bytes_is_invalid_params() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    s.initialize();
    let charge = |id: i64, meta: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "charge_card", "arguments": {"customer": "cus_long", "amount_cents": 7},
            "_meta": meta}})
        .to_string()
    };
    let at_limit = "r".repeat(1024);
    let a = answer(&mut s, &charge(1, json!({"idem/run": at_limit})), 1);
    assert_eq!(a["result"]["isError"], false, "{}", a["result"]["content"]);
    assert_eq!(a["result"]["_meta"]["idem/run"], at_limit.as_str());
    for (id, meta) in [
        (2, json!({"idem/run": "r".repeat(100_000)})),
        (3, json!({"idem/run": "é".repeat(513)})),
        (4, json!({"idem/run": "conv-1", "idem/idempotencyKey": "k".repeat(1025)})),
    ] {
        let line = charge(id, meta);
        let a = answer(&mut s, &line, id);
        // A failure shows the answer's start: an echoed id would be 100,000 characters.
        let shown: String = a.to_string().chars().take(300).collect();
        assert_eq!(a["error"]["code"], -32602, "{shown}");
        let message = a["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("at most 1024 bytes"), "{message}");
        assert!(a.to_string().len() < 1000, "the id is not echoed: {}", a.to_string().len());
    }
    // Nothing ran for the refused calls: the next new charge is the second.
    let a = answer(&mut s, &charge(5, json!({"idem/run": "conv-2"})), 5);
    let text = a["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("ch_0002"), "{a}");
}

/// A tool call before `initialize` (a client that skipped the handshake) is answered with its
/// id, saying to send `initialize`; the session then starts as usual and the call runs.
#[test]
fn a_call_before_initialize_says_to_initialize_and_the_session_starts_after() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    let early = call(1, r#"{"name":"charge_card","arguments":{"customer":"c","amount_cents":5}}"#);
    s.write(&early);
    let refused = s.read().expect("an answer to the early call");
    assert_eq!(refused["id"], 1, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("send `initialize` first"), "{message}");
    s.initialize();
    let late = call(2, r#"{"name":"charge_card","arguments":{"customer":"c","amount_cents":5}}"#);
    let ran = answer(&mut s, &late, 2);
    assert_eq!(ran["result"]["isError"], false, "{ran}");
    assert_eq!(ran["result"]["_meta"]["idem/outcome"], "executed", "{ran}");
}

/// The last request of a client that closes its input without a final newline is answered
/// (it was dropped with the unfinished line), and the server then ends.
#[test]
fn a_last_request_without_a_newline_is_answered_before_the_server_ends() {
    use std::io::Write;
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    s.initialize();
    let last = call(7, r#"{"name":"charge_card","arguments":{"customer":"c","amount_cents":9}}"#);
    let mut stdin = s.stdin.take().expect("stdin");
    stdin.write_all(last.as_bytes()).unwrap();
    drop(stdin);
    let answer = s.read().expect("an answer to the last line");
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
    assert_eq!(answer["result"]["_meta"]["idem/outcome"], "executed", "{answer}");
    assert!(s.read().is_none(), "nothing more: the server ended");
}

/// An error that repeats what the client sent (a member's name, a tool's name) shows its
/// control characters as escapes: hosts print these messages to terminals and logs.
#[test]
fn errors_repeat_what_the_client_sent_with_control_characters_escaped() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    s.initialize();
    let repeated = r#"{"jsonrpc":"2.0","id":50,"method":"ping","x\u001b[2J":1,"x\u001b[2J":2}"#;
    let unknown = call(51, r#"{"name":"charge\u001b]0;pwned\u0007","arguments":{}}"#);
    for (line, id, says) in
        [(repeated, 50, "x\\u{1b}[2J"), (&unknown[..], 51, "charge\\u{1b}]0;pwned\\u{7}")]
    {
        let got = answer(&mut s, line, id);
        let message = got["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{message:?} lacks {says:?}");
        assert!(!message.contains(['\u{1b}', '\u{7}']), "{message:?}");
    }
}

/// A host that starts the server and closes its input before the handshake: the server ends
/// quietly and successfully (it exited with the usage-error code 2).
#[test]
fn a_client_that_leaves_before_initialize_ends_the_server_cleanly() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    drop(s.stdin.take());
    assert_eq!(s.read(), None, "nothing is written");
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
}

/// `"params": null`, which clients built on Go's, Java's or C#'s JSON libraries (and editors' MCP
/// clients) send for a request without params, is no params: `tools/list` lists the tools and
/// `ping` is answered, instead of -32600 for the `null`.
#[test]
fn a_request_with_null_params_is_served_as_one_without() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    s.initialize();
    let listed = answer(&mut s, &list(1, "tools/list", "null"), 1);
    let tools = listed["result"]["tools"].as_array().map(Vec::len).unwrap_or_default();
    assert!(tools > 0, "{listed}");
    let pong = answer(&mut s, &list(2, "ping", "null"), 2);
    assert_eq!(pong["result"], json!({}), "{pong}");
    let call = answer(&mut s, &list(3, "tools/call", "null"), 3);
    assert_eq!(call["error"]["code"], -32602, "a call still needs its name: {call}");
}

/// MCP "Lifecycle": `initialize` is a connection's first interaction, once. A second one, with
/// another version and client, is refused with -32600 and its id, as over HTTP (an `initialize`
/// naming a live session), and the session goes on as negotiated: calls keep running and a
/// repeat keeps replaying.
#[test]
fn a_second_initialize_on_one_connection_is_refused_and_the_session_goes_on() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[]);
    s.initialize();
    let charge = |id: i64| {
        call(
            id,
            r#"{"name":"charge_card","arguments":{"customer":"c","amount_cents":5},"_meta":{"idem/run":"conv-init"}}"#,
        )
    };
    let first = answer(&mut s, &charge(1), 1);
    assert_eq!(first["result"]["_meta"]["idem/outcome"], "executed", "{first}");
    let again = json!({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
        "protocolVersion": "2024-11-05", "capabilities": {},
        "clientInfo": {"name": "someone-else", "version": "9"}}});
    let refused = answer(&mut s, &again.to_string(), 2);
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("already initialized"), "{message}");
    let repeat = answer(&mut s, &charge(3), 3);
    assert_eq!(repeat["result"]["_meta"]["idem/outcome"], "replayed", "{repeat}");
}

/// A request that reuses the id of one the client just cancelled is refused (-32600, its id):
/// rmcp's handler for the cancelled request still answers, and rmcp files that answer under
/// whichever request holds the id then, so the new request got "the request was cancelled" and
/// its own answer was dropped. The cancel and the reuse are written together, as a client that
/// presses Stop and retries at once does. The id of a request already answered stays reusable.
#[test]
fn the_id_of_a_cancelled_request_is_not_given_to_the_next_request() {
    let mut s = Server::start(&mcp_support::payments_mcp(), &[("PAYMENTS_DELAY_MS", "400")]);
    s.initialize();
    let charge = |id: i64, customer: &str| {
        call(
            id,
            &format!(
                r#"{{"name":"charge_card","arguments":{{"customer":"{customer}","amount_cents":5}},"_meta":{{"idem/run":"conv-cancel"}}}}"#
            ),
        )
    };
    let balance =
        |id: i64| call(id, r#"{"name":"get_balance","arguments":{"customer":"cus_reuse"}}"#);
    s.write(&charge(5, "cus_slow"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}"#;
    s.write(&format!("{cancel}\n{}", balance(5)));
    let reused = s.read().expect("an answer to the reused id");
    assert_eq!(reused["id"], 5, "{reused}");
    assert_eq!(reused["error"]["code"], -32600, "the reuse is refused, not answered: {reused}");
    let message = reused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("cancelled"), "{message}");
    // The session goes on: a fresh id is served, and nothing else was answered under 5 (the
    // cancelled request's answer is dropped).
    let fresh = answer(&mut s, &balance(6), 6);
    assert_eq!(fresh["result"]["isError"], false, "{fresh}");
    std::thread::sleep(std::time::Duration::from_millis(600));
    let done = answer(&mut s, &balance(7), 7);
    assert_eq!(done["result"]["isError"], false, "{done}");
    // An answered id is free again.
    let again = answer(&mut s, &balance(6), 6);
    assert_eq!(again["result"]["isError"], false, "{again}");
}

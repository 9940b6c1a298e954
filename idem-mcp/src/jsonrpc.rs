//! One inbound JSON-RPC message, checked before rmcp sees it, so that every request is answered.
//!
//! rmcp's own line transport drops a line it cannot parse (a number beyond `f64`, a lone
//! surrogate, deep nesting) without a reply, and routes a standard request whose params do not
//! fit its schema to "method not found". Here the text is read in two passes: first only its
//! shape (members kept as raw text, which accepts every grammatical JSON value at any depth), so
//! the `id` is known even when a value inside cannot be represented; then each member for real,
//! with unique member names ([`idem_core::json_text`]). The outcome, per JSON-RPC 2.0 §5.1 and
//! MCP 2025-11-25 "Error Handling":
//!
//! | input | answer |
//! |---|---|
//! | not JSON (grammar) | -32700 parse error, with the `id` when it was read before the error, else `null` |
//! | not an object, a batch, a bad `jsonrpc`/`id`/`method`, a repeated top-level member, scalar `params` (`null` is read as no params) | -32600 invalid request |
//! | `params` an array, or a value in it that JSON text cannot carry into a value (beyond `f64`, lone surrogate, deeper than 128), a repeated member, `params._meta` not an object (`null` is none), params that do not fit a standard method (a list method's `cursor` that is not a string or `null`, which rmcp would ignore) | -32602 invalid params |
//! | `tools/call` whose `arguments` are not one JSON object with unique member names | a `CallToolResult` with `isError: true` and `invalid_arguments`, as on the OpenAI and Anthropic front doors |
//! | a notification or a response that is bad in any way | nothing (JSON-RPC: never answer a notification) |

use std::fmt;
use std::sync::Arc;

use idem_core::json_text::{self, JsonTextError};
use idem_core::toolset::{ErrorKind, ToolResult};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ConstString, ErrorCode, RequestId};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

/// The text of a `tools/call` request's `arguments` as the client sent it, put in the request's
/// extensions (`RequestContext::extensions`) by [`check_message`]. Typed arguments are parsed
/// from it, as from OpenAI argument text: integers beyond 64 bits stay exact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgumentsText(pub Arc<str>);

/// What to do with one inbound message.
#[derive(Debug)]
pub enum Inbound {
    /// A well-formed message for rmcp.
    Message(Box<ClientJsonRpcMessage>),
    /// Answer it with this JSON-RPC message (an error, or an `isError` tool result) and go on.
    Reply(Value),
    /// Neither pass it on nor answer (a bad notification or response, an empty line).
    Ignore,
}

/// The methods a client may send that rmcp's `ClientRequest` knows. A request for one of them
/// that rmcp files under "custom" has params that do not fit.
fn is_standard_request(method: &str) -> bool {
    use rmcp::model::*;
    [
        PingRequestMethod::VALUE,
        InitializeResultMethod::VALUE,
        DiscoverRequestMethod::VALUE,
        CompleteRequestMethod::VALUE,
        SetLevelRequestMethod::VALUE,
        GetPromptRequestMethod::VALUE,
        ListPromptsRequestMethod::VALUE,
        ListResourcesRequestMethod::VALUE,
        ListResourceTemplatesRequestMethod::VALUE,
        ReadResourceRequestMethod::VALUE,
        SubscriptionsListenRequestMethod::VALUE,
        SubscribeRequestMethod::VALUE,
        UnsubscribeRequestMethod::VALUE,
        CallToolRequestMethod::VALUE,
        ListToolsRequestMethod::VALUE,
        GetTaskMethod::VALUE,
        UpdateTaskMethod::VALUE,
        CancelTaskMethod::VALUE,
        ListSkillsRequestMethod::VALUE,
        GetSkillRequestMethod::VALUE,
        ReadResourceDirectoryRequestMethod::VALUE,
    ]
    .contains(&method)
}

/// The list methods a client pages through with `params.cursor` (MCP 2025-11-25
/// "Pagination"), whose cursor is a string.
fn is_paginated(method: &str) -> bool {
    use rmcp::model::*;
    [
        ListToolsRequestMethod::VALUE,
        ListPromptsRequestMethod::VALUE,
        ListResourcesRequestMethod::VALUE,
        ListResourceTemplatesRequestMethod::VALUE,
        ListSkillsRequestMethod::VALUE,
    ]
    .contains(&method)
}

/// A JSON-RPC error response. `id` is `null` when it could not be read.
pub fn error_reply(id: Option<&RequestId>, code: ErrorCode, message: impl fmt::Display) -> Value {
    // Messages repeat what the client sent (a method, a member's name): escaped, as every
    // error text a client or a log may print ([`idem_core::printable_lines`]).
    let message = message.to_string();
    let message = idem_core::printable_lines(&message);
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code.0, "message": message },
    })
}

/// The answer to a request whose `id` is that of a request still in flight in its session (MCP
/// 2025-11-25 "Basic": a request id MUST NOT be reused in a session): -32600 with that id. Both
/// transports send it instead of passing the request on, since rmcp would run both requests and
/// answer only one.
pub fn id_in_use(id: &RequestId) -> Value {
    error_reply(
        Some(id),
        ErrorCode::INVALID_REQUEST,
        format!(
            "Invalid request: the id {id} is already used by a request in flight in this session (MCP 2025-11-25 \"Basic\": a request id MUST NOT be reused in a session); nothing was run. Send this request again with an id of its own"
        ),
    )
}

/// The answer to a request whose `id` is that of a request the client cancelled in its session:
/// -32600 with that id. rmcp does not stop a cancelled request's handler, it only tells it; when
/// the handler answers, rmcp files the answer under whichever request holds the id then, so a new
/// request reusing the id would get the cancelled request's answer and lose its own. Both
/// transports keep cancelled ids taken for the session and send this instead.
pub fn id_cancelled(id: &RequestId) -> Value {
    error_reply(
        Some(id),
        ErrorCode::INVALID_REQUEST,
        format!(
            "Invalid request: the id {id} is that of a request cancelled in this session, whose handler may still answer under it (MCP 2025-11-25 \"Basic\": a request id MUST NOT be reused in a session); nothing was run. Send this request again with an id of its own"
        ),
    )
}

/// The ids of requests cancelled while in flight, oldest first, kept taken (see
/// [`id_cancelled`]); past [`MAX_CANCELLED_IDS`] the oldest is freed (its handler has long
/// finished: a cancelled idem call stops at once).
///
/// Each is kept as a 128-bit digest under keys drawn for this set, not as the id: an id is the
/// client's text, as long as a request body allows (4 MiB by default over HTTP), and 4096 of
/// them kept as text let a client make the server hold gigabytes for the rest of its life. Two
/// ids share a digest with a chance of about 2^-128 per pair, which a client cannot steer
/// without the keys.
#[derive(Debug)]
pub(crate) struct CancelledIds<K> {
    ids: std::collections::HashSet<u128>,
    order: std::collections::VecDeque<u128>,
    keys: (std::hash::RandomState, std::hash::RandomState),
    _ids: std::marker::PhantomData<fn(&K)>,
}

impl<K> Default for CancelledIds<K> {
    fn default() -> Self {
        CancelledIds {
            ids: Default::default(),
            order: Default::default(),
            keys: Default::default(),
            _ids: std::marker::PhantomData,
        }
    }
}

/// How many cancelled request ids a transport keeps taken (per stdio session; over HTTP, for all
/// sessions together).
pub const MAX_CANCELLED_IDS: usize = 4096;

impl<K: std::hash::Hash> CancelledIds<K> {
    fn digest(&self, id: &K) -> u128 {
        use std::hash::BuildHasher;
        (u128::from(self.keys.0.hash_one(id)) << 64) | u128::from(self.keys.1.hash_one(id))
    }

    pub(crate) fn insert(&mut self, id: &K) {
        let digest = self.digest(id);
        if self.ids.insert(digest) {
            self.order.push_back(digest);
        }
        while self.order.len() > MAX_CANCELLED_IDS {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }

    pub(crate) fn contains(&self, id: &K) -> bool {
        self.ids.contains(&self.digest(id))
    }
}

/// A JSON-RPC success response carrying `result`.
pub fn result_reply(id: &RequestId, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// The members of one object, as raw text, in order (repeats kept).
type Members<'a> = Vec<(String, &'a RawValue)>;

/// Reads an object's members into `out` one by one, so that those read before a syntax error
/// are still there after it.
struct MembersSeed<'s, 'a>(&'s mut Members<'a>);

impl<'de: 'a, 'a> DeserializeSeed<'de> for MembersSeed<'_, 'a> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de: 'a, 'a> Visitor<'de> for MembersSeed<'_, 'a> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(name) = map.next_key::<String>()? {
            let value: &'de RawValue = map.next_value()?;
            self.0.push((name, value));
        }
        Ok(())
    }
}

/// Reads the members of the object `text`; on a syntax error, the members read before it.
fn members(text: &str) -> (Members<'_>, Result<(), serde_json::Error>) {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_str(text);
    let read = MembersSeed(&mut out).deserialize(&mut de).and_then(|()| de.end());
    (out, read)
}

/// The single member `name`; `Err` when it is repeated.
fn member<'a>(members: &Members<'a>, name: &str) -> Result<Option<&'a RawValue>, ()> {
    let mut found = members.iter().filter(|(n, _)| n == name).map(|(_, v)| *v);
    let first = found.next();
    if found.next().is_some() { Err(()) } else { Ok(first) }
}

/// A JSON-RPC id: a string or an integer (MCP: never `null`).
fn request_id(raw: &RawValue) -> Option<RequestId> {
    match serde_json::from_str::<Value>(raw.get()).ok()? {
        Value::String(s) => Some(RequestId::String(s.into())),
        Value::Number(n) => n.as_i64().map(RequestId::Number),
        _ => None,
    }
}

/// Why `raw` is not an id this server can answer with (JSON-RPC 2.0 §5: the id of the error
/// response is then `null`, so the message shows the id as it was sent).
fn bad_id(raw: &RawValue) -> String {
    let text = raw.get().trim();
    let shown: String = text.chars().take(64).collect();
    let integer = text.strip_prefix('-').unwrap_or(text);
    if !integer.is_empty() && integer.bytes().all(|b| b.is_ascii_digit()) {
        format!(
            "Invalid request: the `id` {shown} is an integer beyond the 64-bit signed range \
             (-2^63 to 2^63-1) this server reads: send a smaller integer or a string"
        )
    } else if first_non_space(text).is_some_and(|b| b == b'-' || b.is_ascii_digit()) {
        format!(
            "Invalid request: the `id` {shown} is not an integer: an id is a string or an integer \
             (MCP 2025-11-25 \"Basic\"), without a fraction or an exponent"
        )
    } else {
        format!(
            "Invalid request: the `id` must be a string or an integer (MCP 2025-11-25 \"Basic\": never \
             null), not {shown}"
        )
    }
}

/// What kind of JSON value a raw member is, for a message: "a string", "an object", ...
fn raw_kind(raw: &RawValue) -> &'static str {
    match first_non_space(raw.get()) {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        _ => "a number",
    }
}

fn first_non_space(text: &str) -> Option<u8> {
    text.bytes().find(|b| !b.is_ascii_whitespace())
}

/// The id of a request from the head of its text, cut anywhere (a message too long to read
/// whole): read when the members before the cut include exactly one `id` a reply can carry and
/// a `method` (a request), and no `result` or `error` (a response).
pub fn id_in_head(head: &[u8]) -> Option<RequestId> {
    id_in_ends(head, b"")
}

/// The id of a request too long to read whole, from its first and last bytes: from its head as
/// [`id_in_head`] reads it, or, when the head shows a request without an `id` member yet, from
/// its tail ending with `"id": <string or integer> }`. Clients write the id after the params too
/// (the TypeScript SDK: `method`, `params`, `jsonrpc`, `id`).
pub fn id_in_ends(head: &[u8], tail: &[u8]) -> Option<RequestId> {
    let text = match std::str::from_utf8(head) {
        Ok(text) => text,
        // Cut inside a character.
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (members, _) = members(text);
    // Only a request is answered: a response (`result`, `error`) to one of the server's own
    // requests carries the id of that request, and a reply with it would land on a request of
    // the client's that has the same id. Without a `method` before the cut, it is not known.
    if !matches!(member(&members, "method"), Ok(Some(_)))
        || !matches!(member(&members, "result"), Ok(None))
        || !matches!(member(&members, "error"), Ok(None))
    {
        return None;
    }
    let raw = match member(&members, "id") {
        Ok(Some(raw)) => raw,
        Ok(None) => return id_in_tail(tail),
        Err(()) => return None,
    };
    // A number cut short reads as another number (`42` cut after the `4`): a number counts only
    // when something follows it before the cut (a string ends with its quote).
    let end = raw.get().as_ptr() as usize - text.as_ptr() as usize + raw.get().len();
    if end == text.len() && !raw.get().starts_with('"') {
        return None;
    }
    request_id(raw)
}

/// The id of a request whose text is not UTF-8 (a client writing its platform's code page, as
/// Windows' cp1252 for an `é`): read as [`id_in_head`] reads it from the text with every sequence
/// that is not UTF-8 replaced by U+FFFD. Such bytes sit inside strings, so the members around them
/// read as sent; an id holding U+FFFD may not be the one sent, and is not named.
pub fn id_in_lossy(bytes: &[u8]) -> Option<RequestId> {
    let text = String::from_utf8_lossy(bytes);
    match id_in_head(text.as_bytes())? {
        RequestId::String(id) if id.contains(char::REPLACEMENT_CHARACTER) => None,
        id => Some(id),
    }
}

/// The id among the last members of an object's text, read from its end: `"id": <value>`
/// followed only by members whose values are strings, numbers, booleans or `null` (a client may
/// write more after the id), then `}`. In a JSON object the members right before the closing
/// brace are members of that object, so at the end of a message this is the message's own id,
/// not one nested in its params: read backwards, each scalar value, its colon and its key are
/// outside any string, and the comma before the key separates two members of that object.
fn id_in_tail(tail: &[u8]) -> Option<RequestId> {
    /// At most this many members after the id are read past.
    const MEMBERS: usize = 8;
    let whitespace = |c: char| matches!(c, ' ' | '\t' | '\n' | '\r');
    // The first bytes may be cut inside a character; the members read here are whole.
    let text = String::from_utf8_lossy(tail);
    let mut body = text.trim_end_matches(whitespace).strip_suffix('}')?;
    for _ in 0..MEMBERS {
        let (rest, value) = body
            .trim_end_matches(whitespace)
            .split_at(scalar_start(body.trim_end_matches(whitespace))?);
        let rest =
            rest.trim_end_matches(whitespace).strip_suffix(':')?.trim_end_matches(whitespace);
        let (rest, key) = rest.split_at(string_start(rest)?);
        let key: String = serde_json::from_str(key).ok()?;
        let rest = rest.trim_end_matches(whitespace);
        if key == "id" {
            // The key opens the member: after the object's `{` or a `,`.
            return rest
                .ends_with([',', '{'])
                .then(|| serde_json::from_str(value).ok().and_then(request_id))
                .flatten();
        }
        body = rest.strip_suffix(',')?;
    }
    None
}

/// Where the scalar value that ends `text` starts: a string, or a number, `true`, `false` or
/// `null`. `None` when `text` ends otherwise (an object, an array).
fn scalar_start(text: &str) -> Option<usize> {
    if text.ends_with('"') {
        return string_start(text);
    }
    let bytes = text.as_bytes();
    let token = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.');
    let start = bytes.len() - bytes.iter().rev().take_while(|b| token(b)).count();
    (start < bytes.len()).then_some(start)
}

/// Where the string that ends `text` starts: the last quote before its closing quote that no odd
/// run of backslashes escapes.
fn string_start(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    if bytes.last() != Some(&b'"') {
        return None;
    }
    let mut before = bytes.len() - 1;
    loop {
        let quote = bytes[..before].iter().rposition(|b| *b == b'"')?;
        let escapes = bytes[..quote].iter().rev().take_while(|b| **b == b'\\').count();
        if escapes % 2 == 0 {
            return Some(quote);
        }
        before = quote;
    }
}

/// Checks one inbound message (one line of stdio, one HTTP body) and says what to do with it.
pub fn check_message(text: &str) -> Inbound {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    match first_non_space(text) {
        None => return Inbound::Ignore,
        Some(b'{') => {}
        Some(b'[') => {
            return Inbound::Reply(error_reply(
                None,
                ErrorCode::INVALID_REQUEST,
                "JSON-RPC batches are not supported (MCP 2025-06-18 removed them): send one message per line",
            ));
        }
        Some(_) => {
            let reply = match serde_json::from_str::<serde::de::IgnoredAny>(text) {
                Err(e) => error_reply(None, ErrorCode::PARSE_ERROR, format!("Parse error: {e}")),
                Ok(_) => error_reply(
                    None,
                    ErrorCode::INVALID_REQUEST,
                    "Invalid request: a JSON-RPC message is a JSON object",
                ),
            };
            return Inbound::Reply(reply);
        }
    }
    let (members, read) = members(text);
    let id_raw = member(&members, "id");
    let id = match id_raw {
        Ok(Some(raw)) => request_id(raw),
        _ => None,
    };
    if let Err(e) = read {
        // Not JSON at all: there may be no message to speak of, so no notification rule applies.
        return Inbound::Reply(error_reply(
            id.as_ref(),
            ErrorCode::PARSE_ERROR,
            format!("Parse error: {e}"),
        ));
    }
    let method = match member(&members, "method") {
        Ok(Some(raw)) => match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::String(m)) => Some(m),
            _ => return invalid_request(id_raw, id.as_ref(), "`method` must be a string"),
        },
        Ok(None) => None,
        Err(()) => {
            return invalid_request(id_raw, id.as_ref(), "the member `method` appears twice");
        }
    };
    let Some(method) = method else {
        // A response to one of our requests, or nonsense: never answered, unless it has an id
        // and neither `result` nor `error`, which makes it no response but a request without
        // its method (JSON-RPC 2.0 §5: Invalid Request, with the id when it can be read).
        return match serde_json::from_str::<ClientJsonRpcMessage>(text) {
            Ok(msg) if json_text::check_unique(text).is_ok() => Inbound::Message(Box::new(msg)),
            _ if id.is_some()
                && matches!(member(&members, "result"), Ok(None))
                && matches!(member(&members, "error"), Ok(None)) =>
            {
                Inbound::Reply(error_reply(
                    id.as_ref(),
                    ErrorCode::INVALID_REQUEST,
                    "Invalid request: a message with an `id` needs a `method` (a request), or a `result` or an `error` (a response)",
                ))
            }
            _ => {
                tracing::debug!(
                    "ignoring an inbound message that has no method and is not a response"
                );
                Inbound::Ignore
            }
        };
    };
    match id_raw {
        Ok(None) => notification(text, &members, &method),
        Err(()) => Inbound::Reply(error_reply(
            None,
            ErrorCode::INVALID_REQUEST,
            "the member `id` appears twice",
        )),
        Ok(Some(raw)) => match id {
            None => Inbound::Reply(error_reply(None, ErrorCode::INVALID_REQUEST, bad_id(raw))),
            Some(id) => request(&members, &method, &id),
        },
    }
}

fn invalid_request(
    id_raw: Result<Option<&RawValue>, ()>,
    id: Option<&RequestId>,
    message: &str,
) -> Inbound {
    match id_raw {
        // No id: a notification, never answered.
        Ok(None) => {
            tracing::debug!(message, "ignoring an invalid notification");
            Inbound::Ignore
        }
        _ => Inbound::Reply(error_reply(
            id,
            ErrorCode::INVALID_REQUEST,
            format!("Invalid request: {message}"),
        )),
    }
}

fn notification(text: &str, members: &Members<'_>, method: &str) -> Inbound {
    let checked = json_text::check_unique(text)
        .map_err(|e| e.to_string())
        .and_then(|()| rebuild(members).map_err(|e| e.to_string()))
        .and_then(|v| serde_json::from_value::<ClientJsonRpcMessage>(v).map_err(|e| e.to_string()));
    match checked {
        Ok(msg @ ClientJsonRpcMessage::Notification(_)) => Inbound::Message(Box::new(msg)),
        Ok(_) => Inbound::Ignore,
        Err(e) => {
            tracing::debug!(method, error = %e, "ignoring an invalid notification");
            Inbound::Ignore
        }
    }
}

/// The message as a value, every member parsed for real.
fn rebuild(members: &Members<'_>) -> Result<Value, JsonTextError> {
    let mut out = Map::new();
    for (name, raw) in members {
        out.insert(name.clone(), json_text::parse_unique(raw.get())?);
    }
    Ok(Value::Object(out))
}

fn request(members: &Members<'_>, method: &str, id: &RequestId) -> Inbound {
    let reply = |code, message: String| Inbound::Reply(error_reply(Some(id), code, message));
    let mut seen = std::collections::HashSet::new();
    if let Some((name, _)) = members.iter().find(|(n, _)| !seen.insert(n.as_str())) {
        return reply(
            ErrorCode::INVALID_REQUEST,
            format!("Invalid request: the member `{name}` appears twice"),
        );
    }
    match member(members, "jsonrpc") {
        Ok(Some(raw)) if raw.get() == "\"2.0\"" => {}
        _ => {
            return reply(
                ErrorCode::INVALID_REQUEST,
                "Invalid request: `jsonrpc` must be \"2.0\"".into(),
            );
        }
    }
    let mut out = Map::new();
    let mut arguments = None;
    for (name, raw) in members {
        // `"params": null` is how many clients write "no params" (Go's, Java's and C#'s JSON
        // libraries, editors' MCP clients for a list request): read as omitted, as a `null`
        // `arguments` is, rather than refusing a `tools/list` or `ping` the client cannot phrase
        // otherwise. A method that needs params is then refused for lacking them (-32602).
        if name == "params" && raw.get().trim() == "null" {
            continue;
        }
        let value = if name == "params" {
            match params(raw, method, id) {
                Ok((value, args)) => {
                    arguments = args;
                    value
                }
                Err(answer) => return answer,
            }
        } else {
            match json_text::parse_unique(raw.get()) {
                Ok(v) => v,
                Err(e) => {
                    return reply(
                        ErrorCode::INVALID_REQUEST,
                        format!("Invalid request: `{name}`: {e}"),
                    );
                }
            }
        };
        out.insert(name.clone(), value);
    }
    let message = match serde_json::from_value::<ClientJsonRpcMessage>(Value::Object(out)) {
        Ok(m) => m,
        // The envelope was checked above: what rmcp refuses of a standard method is its params.
        Err(e) if is_standard_request(method) => {
            return reply(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "Invalid params: the params of `{method}` do not fit the MCP schema of that method: {e}"
                ),
            );
        }
        Err(e) => return reply(ErrorCode::INVALID_REQUEST, format!("Invalid request: {e}")),
    };
    let ClientJsonRpcMessage::Request(mut request) = message else {
        return reply(ErrorCode::INVALID_REQUEST, "Invalid request: not a request".into());
    };
    match &mut request.request {
        ClientRequest::CustomRequest(_) if is_standard_request(method) => {
            return reply(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "Invalid params: the params of `{method}` do not fit the MCP schema of that method"
                ),
            );
        }
        ClientRequest::CallToolRequest(call) => {
            if let Some(text) = arguments {
                call.extensions.insert(ArgumentsText(text));
            }
        }
        _ => {}
    }
    Inbound::Message(Box::new(ClientJsonRpcMessage::Request(request)))
}

/// The params of a request as a value, and for `tools/call` the arguments' text. `Err` is the
/// answer to send instead.
fn params(
    raw: &RawValue,
    method: &str,
    id: &RequestId,
) -> Result<(Value, Option<Arc<str>>), Inbound> {
    let reply = |code, message: String| Inbound::Reply(error_reply(Some(id), code, message));
    match first_non_space(raw.get()) {
        Some(b'{') => {}
        Some(b'[') => {
            return Err(reply(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "Invalid params: the params of `{method}` must be an object (MCP), not an array"
                ),
            ));
        }
        _ => {
            return Err(reply(
                ErrorCode::INVALID_REQUEST,
                "Invalid request: `params` must be an object".into(),
            ));
        }
    }
    // Read once: the `_meta` check below is for every request, the envelope's for `tools/call`.
    let (members, _) = members(raw.get());
    // MCP: `params._meta` is an object of names to values, for every request. `null` is none,
    // as `"params": null` is no params (clients whose JSON libraries write an absent field as
    // `null`), and as idem's own MCP mapping reads it (`ToolSet::call_mcp`).
    let null_meta =
        matches!(member(&members, "_meta"), Ok(Some(meta)) if meta.get().trim() == "null");
    if let Ok(Some(meta)) = member(&members, "_meta").map(|m| m.filter(|_| !null_meta)) {
        if first_non_space(meta.get()) != Some(b'{') {
            return Err(reply(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "Invalid params: `_meta` must be an object (MCP), such as {{\"idem/run\": \"<run id>\"}}, not {}",
                    raw_kind(meta)
                ),
            ));
        }
        // rmcp reads a progress token it cannot carry (an object, a fraction, an integer beyond
        // 64 bits) as none, and the client then waits for notifications that never come. Read
        // as text, as the rest of the message: no value is built.
        let (meta, _) = self::members(meta.get());
        if let Ok(Some(token)) = member(&meta, "progressToken")
            && first_non_space(token.get()) != Some(b'"')
            && token.get().trim().parse::<i64>().is_err()
        {
            let found = match raw_kind(token) {
                "a number" => "this number",
                other => other,
            };
            return Err(reply(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "Invalid params: `_meta.progressToken` must be a string or an integer (MCP 2025-11-25 \"Progress\"; at most 64 bits), not {found}"
                ),
            ));
        }
    }
    if method != rmcp::model::CallToolRequestMethod::VALUE {
        let mut value = match json_text::parse_unique(raw.get()) {
            Ok(v) => v,
            Err(e) => return Err(reply(ErrorCode::INVALID_PARAMS, format!("Invalid params: {e}"))),
        };
        if let (true, Value::Object(params)) = (null_meta, &mut value) {
            params.remove("_meta");
        }
        if is_paginated(method)
            && let Some(cursor) = value.get("cursor")
            && !(cursor.is_string() || cursor.is_null())
        {
            // rmcp drops params it cannot read and would answer the first page: a client
            // paging with a broken cursor would read the same page forever.
            return Err(reply(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "Invalid params: the `cursor` of `{method}` must be a string (MCP 2025-11-25 \"Pagination\": the `nextCursor` of an earlier result, as it was sent), not {}; omit it for the first page",
                    json_text::kind(cursor)
                ),
            ));
        }
        return Ok((value, None));
    }
    // tools/call: the envelope is a protocol matter, the arguments are the tool's.
    let mut seen = std::collections::HashSet::new();
    if let Some((name, _)) = members.iter().find(|(n, _)| !seen.insert(n.as_str())) {
        return Err(reply(
            ErrorCode::INVALID_PARAMS,
            format!(
                "Invalid params: the member `{name}` appears twice in the params of `tools/call`"
            ),
        ));
    }
    let name = match member(&members, "name") {
        Ok(Some(raw)) => match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::String(name)) => name,
            _ => {
                return Err(reply(
                    ErrorCode::INVALID_PARAMS,
                    "Invalid params: `name` must be a string".into(),
                ));
            }
        },
        _ => {
            return Err(reply(
                ErrorCode::INVALID_PARAMS,
                "Invalid params: `tools/call` needs a `name`".into(),
            ));
        }
    };
    let mut out = Map::new();
    let mut text = None;
    for (member, raw) in &members {
        if member == "_meta" && null_meta {
            continue;
        }
        // A string holding no text (OpenAI's arguments for none, passed on by a bridge) is no
        // arguments, as on every front door: left out, as an absent `arguments` is.
        if member == "arguments" && json_text::is_no_arguments_string(raw.get()) {
            continue;
        }
        let value = if member == "arguments" && raw.get() != "null" {
            // Encoded twice (an object's text in a string): that object, as on every front door.
            let inner = json_text::twice_encoded(raw.get());
            let arguments = inner.as_deref().unwrap_or(raw.get());
            match json_text::parse_arguments(&name, arguments) {
                Ok(args) => {
                    text = Some(Arc::from(arguments));
                    Value::Object(args)
                }
                Err(message) => {
                    let result =
                        ToolResult::error(ErrorKind::InvalidArguments, message, None).to_mcp();
                    return Err(Inbound::Reply(result_reply(id, result)));
                }
            }
        } else {
            match json_text::parse_unique(raw.get()) {
                Ok(v) => v,
                Err(e) => {
                    return Err(reply(
                        ErrorCode::INVALID_PARAMS,
                        format!("Invalid params: `{member}`: {e}"),
                    ));
                }
            }
        };
        out.insert(member.clone(), value);
    }
    Ok((Value::Object(out), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(line: &str) -> Value {
        match check_message(line) {
            Inbound::Reply(reply) => reply,
            other => panic!("{line}: not refused: {other:?}"),
        }
    }

    /// The head of a message cut anywhere, even inside a character or a string, names its id
    /// when the members before the cut hold exactly one id a reply can carry and a method (a
    /// request, not a response).
    #[test]
    fn the_id_is_read_from_the_head_of_a_message_cut_anywhere() {
        let whole =
            r#"{"jsonrpc":"2.0","id":"req-é7","method":"tools/call","params":{"name":"ü"}}"#;
        // Known once the method is read too.
        let after_method = whole.find(r#","params""#).unwrap();
        for cut in 0..=whole.len() {
            let id = id_in_head(&whole.as_bytes()[..cut]);
            let expected = (cut >= after_method).then(|| RequestId::String("req-é7".into()));
            assert_eq!(id, expected, "cut at {cut}");
        }
        let number = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"a":"xxxx"#;
        assert_eq!(id_in_head(number), Some(RequestId::Number(42)));
        for cut in
            [r#"{"method":"m","id":4"#, r#"{"method":"m","id":42"#, r#"{"method":"m","id": -"#]
        {
            assert_eq!(id_in_head(cut.as_bytes()), None, "{cut}: the number may go on");
        }
        assert_eq!(id_in_head(br#"{"method":"m","id": 42 "#), Some(RequestId::Number(42)));
        // A response's id is not a request's, and without a method before the cut the message
        // may be a response.
        for head in [
            &br#"{"jsonrpc":"2.0","id":5,"result":{"content":"xxxx"#[..],
            br#"{"jsonrpc":"2.0","id":6,"error":{"code":1,"message":"xxx"#,
            br#"{"jsonrpc":"2.0","id":7,"params":{"a":"xxxx"#,
            br#"{"jsonrpc":"2.0","id":8,"method":"m","result":1,"params":{"a":"#,
        ] {
            assert_eq!(id_in_head(head), None, "{}", String::from_utf8_lossy(head));
        }
        // No id to be had: none before the cut, repeated, or not one a reply can carry.
        for head in [
            &br#"{"jsonrpc":"2.0","method":"tools/call","params":{"a":1},"id":"#[..],
            br#"{"id":1,"id":2,"method":"#,
            br#"{"id":1.5,"method":"#,
            br#"{"id":null,"method":"#,
            br#"[{"id":1,"method":"#,
            b"",
        ] {
            assert_eq!(id_in_head(head), None, "{}", String::from_utf8_lossy(head));
        }
    }

    /// A message cut in the middle, whose head shows a request without its `id`, names the id at
    /// its end when the last member before the closing brace is `"id"` with a string or an
    /// integer; nothing else at the end is taken for it.
    #[test]
    fn the_id_is_read_from_the_tail_when_the_head_names_none() {
        let head = br#"{"method":"tools/call","params":{"a":"xxxx"#;
        for (tail, id) in [
            (&br#"xx"}},"jsonrpc":"2.0","id":7}"#[..], Some(RequestId::Number(7))),
            (br#"xx"}}, "id" : -3 }  "#, Some(RequestId::Number(-3))),
            (br#"x"},"id":"a\"b\\"}"#, Some(RequestId::String(r#"a"b\"#.into()))),
            // Not an id a reply can carry.
            (br#"x"},"id":1.5}"#, None),
            (br#"x"},"id":18446744073709551616}"#, None),
            (br#"x"},"id":null}"#, None),
            // Nested, or inside a string, or another key ending in `id`.
            (br#"x","id":7}}"#, None),
            (br#"x"},"b":"c\",\"id\":7"}"#, None),
            (br#"x"},"b\"id":7}"#, None),
            (br#"x"},"uid":7}"#, None),
            // Members after the id (a session id, flags) are read past; an object or an array
            // after it is not.
            (
                br#"x"},"id":7,"sessionId":"s-\"1\"","n":-1.5e3,"t":true,"z":null}"#,
                Some(RequestId::Number(7)),
            ),
            (br#"x"},"id":7,"more":{"a":1}}"#, None),
            (br#"x"},"id":7,"more":[1]}"#, None),
            (br#"x"},"i\u0064":7}"#, Some(RequestId::Number(7))),
        ] {
            assert_eq!(id_in_ends(head, tail), id, "{}", String::from_utf8_lossy(tail));
        }
        let tail = br#"x"},"id":7}"#;
        // The head decides when it names an id, a response, or no method.
        assert_eq!(
            id_in_ends(br#"{"id":8,"method":"m","params":{"a":"xx"#, tail),
            Some(RequestId::Number(8))
        );
        assert_eq!(id_in_ends(br#"{"result":{"a":"xx"#, tail), None);
        assert_eq!(id_in_ends(br#"{"params":{"a":"xx"#, tail), None);
        assert_eq!(id_in_ends(br#"{"method":"m","error":{},"params":{"a":"xx"#, tail), None);
    }

    /// `"params": null` is no params: a list or a ping goes on to rmcp as if it had none, and a
    /// `tools/call`, which needs a name, is refused for lacking it (-32602), not for the `null`.
    /// Likewise `"_meta": null` is no `_meta`.
    #[test]
    fn null_params_are_no_params() {
        for method in ["tools/list", "ping", "prompts/list"] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":null}}"#);
            let Inbound::Message(message) = check_message(&line) else {
                panic!("{method} with null params refused: {:?}", check_message(&line))
            };
            let ClientJsonRpcMessage::Request(request) = *message else { panic!("{method}") };
            assert_eq!(request.id, RequestId::Number(1));
            assert_eq!(request.request.method(), method);
        }
        let call = refusal(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":null}"#);
        assert_eq!(call["id"], 2, "{call}");
        assert_eq!(call["error"]["code"], -32602, "{call}");
        // `_meta: null` is no `_meta`, for a call as for any request.
        for line in [
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"t","arguments":{},"_meta":null}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":null}}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"ping","params":{"_meta":null}}"#,
        ] {
            assert!(
                matches!(check_message(line), Inbound::Message(_)),
                "{line}: {:?}",
                check_message(line)
            );
        }
        // Other scalars stay refused.
        let scalar = refusal(r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":5}"#);
        assert_eq!(scalar["error"]["code"], -32600, "{scalar}");
    }

    /// A cancelled id stays taken without the server keeping its text: a client chooses its ids'
    /// length (up to the request body limit), and the 4096 kept were each held whole, so a client
    /// that sent and cancelled requests with ids of megabytes made the server hold gigabytes.
    #[test]
    fn a_cancelled_id_is_kept_without_its_text() {
        let text: std::sync::Arc<str> = "x".repeat(1 << 20).into();
        let mut cancelled = CancelledIds::default();
        cancelled.insert(&RequestId::String(std::sync::Arc::clone(&text)));
        assert_eq!(std::sync::Arc::strong_count(&text), 1, "the set holds the id's text");
        assert!(cancelled.contains(&RequestId::String("x".repeat(1 << 20).into())));
        assert!(!cancelled.contains(&RequestId::String("x".into())));
        assert!(!cancelled.contains(&RequestId::Number(1)));
        // Bounded: the oldest is freed past the limit.
        for n in 0..MAX_CANCELLED_IDS {
            cancelled.insert(&RequestId::Number(n as i64));
        }
        assert!(!cancelled.contains(&RequestId::String(text)));
        assert!(cancelled.contains(&RequestId::Number(0)));
    }

    /// An id this server cannot answer with is refused with a `null` id (JSON-RPC 2.0 §5), so
    /// the message must say which id it was and what to send instead.
    #[test]
    fn an_id_that_cannot_be_read_is_named_with_what_to_send() {
        for (id, says) in [
            ("18446744073709551615", "beyond the 64-bit signed range"),
            ("-9223372036854775809", "beyond the 64-bit signed range"),
            ("1.5", "is not an integer"),
            ("1e3", "is not an integer"),
            ("null", "never null"),
            ("[1]", "not [1]"),
        ] {
            let reply = refusal(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
            assert_eq!(reply["id"], Value::Null, "{reply}");
            assert_eq!(reply["error"]["code"], -32600, "{reply}");
            let message = reply["error"]["message"].as_str().unwrap();
            assert!(message.contains(says) && message.contains(id), "{id}: {message}");
        }
        for id in ["-5", "9223372036854775807", "-9223372036854775808", r#""""#] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            assert!(matches!(check_message(&line), Inbound::Message(_)), "{id}");
        }
    }
}

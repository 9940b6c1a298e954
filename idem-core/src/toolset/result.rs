//! The result a model reads: the output as JSON text, or `Error (<kind>): <message>` with a
//! message that says what happened and what to do next.

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::DispatchContext;
use crate::class::RetryClass;
use crate::error::{Chain, Error, ErrorKind};
use crate::executor::CallReport;
use crate::failure::{Classify, FailureKind};
use crate::key::{Key, KeyError};
use crate::tool::ToolDef;

/// The outcome of one dispatched call, typed for Rust callers and renderable for every format.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    /// On success the tool's output as JSON, object members sorted by name at every level (an
    /// integer beyond 64 bits, which a `Value` cannot hold, as a string of its digits; `text`
    /// has it as a number). On error
    /// `{"error": {"kind", "message", "detail"?, "retryable"?}}`, where `detail` is the tool's own
    /// error as JSON (for `tool_error`) or `{"idempotency_key"}` (for `outcome_unknown`), and
    /// `retryable` (for `tool_error`) says whether a repeat runs the tool again (`true`: the last
    /// attempt failed transiently or ambiguously and nothing was stored) or returns the same
    /// error (`false`: a permanent error).
    pub content: Value,
    /// What the model reads: the output as compact JSON text with object members sorted by name
    /// (a string output as itself, but as its JSON when it is empty or only whitespace: `""`),
    /// or `Error (<kind>): <message>`. Never empty.
    pub text: String,
    /// Whether the call failed (MCP `isError`, Anthropic `is_error`).
    pub is_error: bool,
    /// The stable kind of the failure (its wire string is [`ErrorKind::as_str`]): one of
    /// [`Error::kind`]'s, or a kind only a tool set knows ([`ErrorKind::UnknownTool`],
    /// [`ErrorKind::InvalidToolCall`], [`ErrorKind::OutputNotJson`]). `None` on success.
    pub error_kind: Option<ErrorKind>,
    /// The call's key and how it was served, once the arguments were accepted (MCP results carry
    /// them in `_meta`).
    pub report: Option<CallReport>,
}

impl ToolResult {
    /// A successful result carrying `output`, its object members sorted by name at every level,
    /// in `content` and in the text. Every format (MCP `structuredContent`, Gemini's output, a rig
    /// block) then answers a first call and its replay alike, whichever map serde_json was built
    /// with: under its `preserve_order` feature, which any crate in the build may turn on
    /// (rig-core does), a replay decodes the output again, and a `HashMap` output comes back in
    /// another order.
    pub fn success(mut output: Value) -> Self {
        // No work without `preserve_order`, whose maps are always sorted.
        output.sort_all_objects();
        let text = match &output {
            Value::String(s) => string_text(s),
            other => other.to_string(),
        };
        ToolResult { content: output, text, is_error: false, error_kind: None, report: None }
    }

    /// A successful result carrying the output whose JSON text is `json` (as serde_json wrote
    /// it), for an output that a [`Value`] cannot hold: an integer beyond 64 bits keeps its exact
    /// digits in the text, and is a string of them in `content`. The text is written as
    /// [`ToolResult::success`] writes it (members sorted by name).
    ///
    /// Errors: `json` is not one JSON value.
    pub(super) fn success_from_text(json: &str) -> Result<Self, serde_json::Error> {
        let raw: &RawValue = serde_json::from_str(json)?;
        let content = wide_value(raw)?;
        let text = match &content {
            Value::String(s) => string_text(s),
            _ => {
                let mut text = String::with_capacity(json.len());
                // Members sorted as `success` sorts them (and as `content`, built from a
                // `BTreeMap`, holds them).
                crate::json_text::sorted_compact(
                    raw,
                    crate::json_text::Compact { sets: false, read_strings: false },
                    &mut text,
                )?;
                text
            }
        };
        Ok(ToolResult { content, text, is_error: false, error_kind: None, report: None })
    }

    /// The same result, carrying `report`.
    pub fn with_report(mut self, report: Option<CallReport>) -> Self {
        self.report = report;
        self
    }

    /// A failed result of kind `kind` with the message the model reads and optional detail.
    ///
    /// Characters of `message` that could act on a terminal, other than line feeds and tabs, are
    /// escaped ([`crate::printable_lines`]): a message may repeat what a model sent (a field
    /// name, a value), and hosts print results to terminals and logs. A message of more than
    /// 16,384 characters keeps its first 8,192 and its last 4,096, with the count of those left
    /// out between them: what a model sent may be as long as its arguments.
    pub fn error(kind: ErrorKind, message: impl Into<String>, detail: Option<Value>) -> Self {
        let message = bounded(crate::printable::lines_owned(message.into()));
        let text = format!("Error ({kind}): {message}");
        let mut error = json!({ "kind": kind, "message": message });
        if let (Some(detail), Some(obj)) = (detail, error.as_object_mut()) {
            obj.insert("detail".into(), detail);
        }
        ToolResult {
            content: json!({ "error": error }),
            text,
            is_error: true,
            error_kind: Some(kind),
            report: None,
        }
    }
}

/// The most characters of a failure's message (`ToolResult::error`): 16,384. A message may
/// repeat what the model sent (an unknown field's name, a value of the wrong type), which can
/// be as long as the arguments (1 MiB by default), and the model reads the message whole. A
/// longer one keeps its first half and its last quarter of this, where it says what to do, with
/// the count of characters left out between them.
pub(crate) const MAX_MESSAGE_CHARS: usize = 16 * 1024;

fn bounded(message: String) -> String {
    let count = message.chars().count();
    if count <= MAX_MESSAGE_CHARS {
        return message;
    }
    let (head, tail) = (MAX_MESSAGE_CHARS / 2, MAX_MESSAGE_CHARS / 4);
    let start: String = message.chars().take(head).collect();
    let end: String = message.chars().skip(count - tail).collect();
    format!("{start} … ({} characters left out) … {end}", count - head - tail)
}

/// The text of a string output: the string itself, or its JSON (`""`, `" "`) when it is empty or
/// only whitespace. Hosts pass the text on as a text block, and Anthropic's Messages API refuses a
/// whole request whose tool result holds an empty or blank text block ("text content blocks must
/// be non-empty", "must contain non-whitespace text"): the agent's next turn would fail over a
/// tool that answered "nothing". The quotes also tell the model what it got.
fn string_text(s: &str) -> String {
    if s.trim().is_empty() { serde_json::Value::from(s).to_string() } else { s.to_owned() }
}

/// An integer token (`-12`, `340282366920938463463374607431768211455`) beyond what a [`Value`]
/// holds exactly (`i64`, `u64`): its digits as a string; `None` for any other JSON.
fn wide_integer(token: &str) -> Option<String> {
    let digits = token.strip_prefix('-').unwrap_or(token);
    let integer = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    (integer && token.parse::<i64>().is_err() && token.parse::<u64>().is_err())
        .then(|| token.to_owned())
}

/// `raw` as a [`Value`], with integers beyond 64 bits as strings of their digits. Recursive:
/// `raw` was written from an output checked against the depth limit.
fn wide_value(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get();
    Ok(match text.as_bytes().first() {
        Some(b'{') => {
            let members: BTreeMap<String, &RawValue> = serde_json::from_str(text)?;
            let members = members.into_iter().map(|(k, v)| Ok((k, wide_value(v)?)));
            Value::Object(members.collect::<Result<_, serde_json::Error>>()?)
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text)?;
            Value::Array(items.into_iter().map(wide_value).collect::<Result<_, _>>()?)
        }
        _ => match wide_integer(text) {
            Some(digits) => Value::String(digits),
            None => serde_json::from_str(text)?,
        },
    })
}

/// The readable result of a failed protected call.
pub(super) fn error_result<E: Serialize + Display + Classify>(
    def: &ToolDef,
    err: &Error<E>,
    cx: &DispatchContext,
) -> ToolResult {
    let name = def.name;
    let kind = err.kind();
    match err {
        Error::Tool { error, .. } => {
            // A permanent error is final (stored and replayed for a keyed or never tool); any
            // other is the last of this call's attempts, and nothing was stored: a repeat tries
            // again. `retryable` says which, for hosts and agent frameworks.
            let retryable = error.classify().kind != FailureKind::Permanent;
            let again = if retryable {
                "; nothing was stored, so calling it again tries again"
            } else {
                ""
            };
            let mut result = ToolResult::error(
                kind,
                format!("`{name}` failed: {error}{again}"),
                error_json(error),
            );
            if let Some(obj) = result.content.get_mut("error").and_then(Value::as_object_mut) {
                obj.insert("retryable".into(), Value::Bool(retryable));
            }
            result
        }
        Error::OutcomeUnknown { key, .. } => {
            ToolResult::error(kind, outcome_unknown_text(name, key, cx), Some(key_detail(key)))
        }
        Error::Timeout { timeout, attempt, .. } => {
            let repeat = match def.class {
                RetryClass::Safe => "it only reads, so calling it again is safe",
                _ => {
                    "calling it again with the same arguments is safe: the repeat reuses the idempotency key, so the action will not happen twice"
                }
            };
            ToolResult::error(
                kind,
                format!(
                    "`{name}` timed out after {} ms on attempt {attempt}; the action may have happened. {repeat}",
                    timeout.as_millis()
                ),
                None,
            )
        }
        Error::InvalidArguments { source, .. } => {
            let why = match source {
                // These arguments came from JSON, which has no NaN or infinity: a finite number
                // became one when read into its parameter's type (1e300 for an `f32`).
                KeyError::NonFinite { path, value } => format!(
                    "{} became {value} when read into its parameter's type: the number is beyond \
                     that type's range (an f32 holds magnitudes up to about 3.4e38); pass a \
                     smaller number",
                    crate::canonical::describe(path)
                ),
                other => other.to_string(),
            };
            ToolResult::error(
                kind,
                format!(
                    "invalid arguments for `{name}`: {why}; nothing was executed, fix the arguments and call again"
                ),
                None,
            )
        }
        Error::BudgetExhausted { error: Some(error), retry_after, .. } => {
            let mut detail = json!({ "tool_error": error_json(error) });
            if let (Some(after), Some(obj)) = (retry_after, detail.as_object_mut()) {
                obj.insert("retry_after_ms".into(), json!(crate::clock::ms(*after)));
            }
            ToolResult::error(kind, err.to_string(), Some(detail))
        }
        Error::StoreUnavailable { source, .. } => {
            ToolResult::error(kind, format!("{err} ({})", Chain(source)), None)
        }
        Error::OutputNotStorable { key, .. } => {
            ToolResult::error(kind, err.to_string(), Some(key_detail(key)))
        }
        // A mistake in the application, which the model can neither fix nor get past by
        // calling again, and whose advice (module paths, `#[tool(name = ..)]`) is for its
        // developer: that goes to the log, the model is told what it can do.
        Error::NameTaken { .. } => {
            tracing::error!(tool = name, "{err}");
            ToolResult::error(
                kind,
                format!(
                    "`{name}` was not run: the application declares two different tools under this name, a mistake in the application, not in the arguments; calling it again fails the same way, so do not repeat it and tell the user this tool is unavailable"
                ),
                None,
            )
        }
        other => ToolResult::error(kind, other.to_string(), None),
    }
}

/// The tool's own error as JSON (an integer beyond 64 bits as a string of its digits, as in a
/// success's content); `None` when it nests past the depth limit, checked before serde_json
/// (which has no limit, and would overflow the stack) writes it, or cannot be written.
fn error_json<E: Serialize>(error: &E) -> Option<Value> {
    crate::limits::check_depth(error).ok()?;
    serde_json::to_value(error).ok().or_else(|| {
        let json = serde_json::to_string(error).ok()?;
        wide_value(serde_json::from_str(&json).ok()?).ok()
    })
}

fn key_detail(key: &Key) -> Value {
    json!({ "idempotency_key": key.as_str() })
}

fn outcome_unknown_text(name: &str, key: &Key, cx: &DispatchContext) -> String {
    let mut text = format!(
        "OUTCOME UNKNOWN: `{name}` may have taken effect, and whether it did is not known. Do NOT call `{name}` again for this request: it will not be executed again and a repeat only returns this message. Check whether it happened in the target system"
    );
    if !cx.read_only.is_empty() {
        let _ = write!(text, " (read-only tools that may help: {})", cx.read_only.join(", "));
    }
    let _ = write!(text, ", or ask a human to check and reconcile it (idempotency key {key}).");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_read_from_text_is_written_as_one_read_from_a_value() {
        let value = json!({
            "z": [1, -2, 0.5, 1e300, "s\"\u{1}é", null, true, {}],
            "a\u{7f}\"": {"b": [], "a": -9_223_372_036_854_775_808_i64, "é": u64::MAX},
            "": "x",
        });
        let json = serde_json::to_string(&value).unwrap();
        let from_text = ToolResult::success_from_text(&json).unwrap();
        assert_eq!(from_text, ToolResult::success(value));
        let text = ToolResult::success_from_text(r#""a \"b\"""#).unwrap();
        assert_eq!(text, ToolResult::success(json!("a \"b\"")));
        let wide = ToolResult::success_from_text(r#"{"n":-18446744073709551616}"#).unwrap();
        assert_eq!(wide.text, r#"{"n":-18446744073709551616}"#);
        assert_eq!(wide.content, json!({"n": "-18446744073709551616"}));
    }
}

//! Google Gemini (`generateContent`): a `functionDeclarations` tool, a `functionCall` part in, a
//! `functionResponse` part out.

use serde_json::{Value, json};

use super::{Arguments, ToolDefinition, ToolResult, ToolSet};
use crate::executor::Run;

impl ToolDefinition {
    /// A Gemini `functionDeclarations[i]` entry:
    /// `{"name","description","parametersJsonSchema"}`.
    ///
    /// The schema goes in `parametersJsonSchema`, which takes JSON Schema as written: the older
    /// `parameters` field takes an OpenAPI 3.0 subset that refuses the whole request over
    /// `additionalProperties` ("Unknown name"), which every tool's schema has.
    pub fn to_gemini(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "parametersJsonSchema": self.input_schema,
        })
    }
}

impl ToolResult {
    /// A Gemini `functionResponse` part answering the call of `name` (`id`, when the call had
    /// one): `{"functionResponse":{"id"?,"name","response"}}`, where `response` is
    /// `{"output": <the output as JSON, members sorted by name>}` on success and
    /// `{"error": <Self::text>}` on error, the two keys Gemini's API reference names for them.
    pub fn to_gemini_part(&self, id: &str, name: &str) -> Value {
        let response = if self.is_error {
            json!({ "error": self.text })
        } else {
            json!({ "output": self.content })
        };
        let mut answer = json!({ "name": name, "response": response });
        if !id.is_empty()
            && let Some(answer) = answer.as_object_mut()
        {
            answer.insert("id".into(), id.into());
        }
        json!({ "functionResponse": answer })
    }
}

impl ToolSet {
    /// The Gemini request's `tools` array: one tool holding every function declaration,
    /// `[{"functionDeclarations":[..]}]`.
    pub fn gemini_tools(&self) -> Vec<Value> {
        let declarations: Vec<Value> = self.definitions().map(ToolDefinition::to_gemini).collect();
        vec![json!({ "functionDeclarations": declarations })]
    }

    /// Dispatches one Gemini `functionCall` part (`{"functionCall":{"id"?,"name","args":{..}}}`,
    /// or the `functionCall` object alone, with no members but those three) and returns the
    /// `functionResponse` part to send back in the next `user` turn (see
    /// [`ToolResult::to_gemini_part`]). The `id` goes to tracing, not into the key. Anything
    /// else runs nothing and is answered with an error: another kind of part (text, a
    /// `functionResponse`), or a call of another API (a `type`, `input` or `arguments` member).
    /// Otherwise an Anthropic `server_tool_use` block, which Anthropic ran itself, would run a
    /// second time here, and a `tool_use` block would run without its `input`.
    pub async fn call_gemini(&self, run: &Run, part: &Value) -> Value {
        let call = part.get("functionCall").unwrap_or(part);
        let (id, bad_id) = super::call_id(call.get("id"), "`functionCall.id`");
        let name = super::call_name(call.get("name"), "`functionCall.name`");
        let bad = bad_id.or_else(|| not_a_call(part, call));
        let shown = name.as_deref().unwrap_or_default().to_owned();
        let args = Arguments::of(call.get("args"), false);
        let result = self.call_envelope(run, &id, bad, name, args).await;
        result.to_gemini_part(&id, &shown)
    }
}

/// The members of a Gemini `functionCall`.
const CALL_MEMBERS: [&str; 3] = ["id", "name", "args"];

/// Why `part` (whose call is `call`) is not a Gemini function call: not an object, a `type`
/// (no Gemini part has one), another kind of part, or a bare call with a member a
/// `functionCall` does not have.
fn not_a_call(part: &Value, call: &Value) -> Option<String> {
    let Some(members) = part.as_object() else {
        return Some(format!(
            "the part is {}, not an object; nothing was executed",
            crate::json_text::kind(part)
        ));
    };
    if let Some(kind) = part.get("type").or_else(|| call.get("type")) {
        let shown = kind.as_str().map_or_else(
            || crate::json_text::kind(kind).to_owned(),
            |k| format!("\"{}\"", super::shown(k, super::SHOWN_WORD_CHARS)),
        );
        return Some(format!(
            "the tool call has a `type` ({shown}), which a Gemini part does not; nothing was \
             executed{}",
            kind.as_str().map_or("", super::other_type_hint)
        ));
    }
    if !call.is_object() {
        return Some(format!(
            "the part's `functionCall` is {}, not an object; nothing was executed",
            crate::json_text::kind(call)
        ));
    }
    if part.get("functionCall").is_some() {
        return None;
    }
    let other = members.keys().find(|k| !CALL_MEMBERS.contains(&k.as_str()))?;
    let shown = super::shown(other, super::SHOWN_WORD_CHARS);
    Some(
        if ["text", "functionResponse", "executableCode", "inlineData"].contains(&other.as_str()) {
            format!("the part is a `{shown}` part, not a `functionCall`; nothing was executed")
        } else {
            format!(
                "the tool call has the member `{shown}`, which a Gemini `functionCall` (`id`, \
                 `name`, `args`) does not; nothing was executed"
            )
        },
    )
}

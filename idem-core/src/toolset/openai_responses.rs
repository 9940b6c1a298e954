//! OpenAI Responses API: `tools[i]` definitions, a `function_call` output item in, a
//! `function_call_output` input item out.

use serde_json::{Value, json};

use super::{Arguments, ToolDefinition, ToolResult, ToolSet};
use crate::executor::Run;

impl ToolDefinition {
    /// An OpenAI Responses `tools[i]` entry:
    /// `{"type":"function","name","description","parameters","strict":false}`.
    ///
    /// `strict` is written `false` because the Responses API takes an absent one as `true`, and
    /// strict mode refuses any schema with an optional property (every `Option` parameter).
    pub fn to_openai_responses(&self) -> Value {
        json!({
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.input_schema,
            "strict": false,
        })
    }
}

impl ToolResult {
    /// An OpenAI Responses input item answering the call `call_id`:
    /// `{"type":"function_call_output","call_id","output"}` (`output` is [`ToolResult::text`]).
    pub fn to_openai_responses_output(&self, call_id: &str) -> Value {
        json!({ "type": "function_call_output", "call_id": call_id, "output": self.text })
    }
}

impl ToolSet {
    /// OpenAI Responses `tools` array.
    pub fn openai_responses_tools(&self) -> Vec<Value> {
        self.definitions().map(ToolDefinition::to_openai_responses).collect()
    }

    /// Dispatches one OpenAI Responses `function_call` output item
    /// (`{"type":"function_call","id","call_id","name","arguments":"<JSON text>"}`; `arguments`
    /// given as an object is accepted too) and returns the input item
    /// `{"type":"function_call_output","call_id","output"}` to send back. The `call_id` goes to
    /// tracing, not into the key. An item of another type (an `mcp_call` or `web_search_call`,
    /// which OpenAI ran itself; a chat completions call), or whose `status` is present and not
    /// `completed` (`in_progress`, `incomplete`: the model had not finished writing it, and its
    /// arguments may be cut short), runs nothing and is answered with an error.
    pub async fn call_openai_responses(&self, run: &Run, item: &Value) -> Value {
        let (id, bad_id) = super::call_id(item.get("call_id"), "`call_id`");
        let refused = bad_id
            .or_else(|| super::wrong_type(item, "function_call"))
            .or_else(|| not_completed(item.get("status")));
        let name = super::call_name(item.get("name"), "`name`");
        let args = Arguments::of(item.get("arguments"), true);
        let result = self.call_envelope(run, &id, refused, name, args).await;
        result.to_openai_responses_output(&id)
    }
}

/// Why an item whose `status` is not `completed` is refused: `in_progress` and `incomplete`
/// mean the response ended (a token limit, a stream cut) before the model finished the call, so
/// its arguments may be a prefix of what it meant; anything else is not a status OpenAI sends
/// for a call to run. An absent status (an item written by hand) is taken.
fn not_completed(status: Option<&Value>) -> Option<String> {
    match status? {
        Value::Null => None,
        Value::String(done) if done == "completed" => None,
        Value::String(status) => Some(format!(
            "the function call's `status` is \"{}\", not \"completed\": the model had not \
             finished writing it, so its arguments may be cut short; nothing was executed. Call \
             the tool again with all of its arguments",
            super::shown(status, super::SHOWN_WORD_CHARS)
        )),
        other => Some(format!(
            "the function call's `status` is {}, not the string \"completed\"; nothing was \
             executed",
            crate::json_text::kind(other)
        )),
    }
}

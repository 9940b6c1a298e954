//! OpenAI chat completions: `tools[i]` definitions, `tool_calls[i]` in, a `tool` message out.

use serde_json::{Value, json};

use super::{Arguments, ToolDefinition, ToolResult, ToolSet};
use crate::executor::Run;

impl ToolDefinition {
    /// An OpenAI chat `tools[i]` entry: `{"type":"function","function":{"name","description","parameters"}}`.
    pub fn to_openai(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        })
    }
}

impl ToolResult {
    /// An OpenAI chat tool message: `{"role":"tool","tool_call_id","content"}`.
    pub fn to_openai_message(&self, tool_call_id: &str) -> Value {
        json!({ "role": "tool", "tool_call_id": tool_call_id, "content": self.text })
    }
}

impl ToolSet {
    /// OpenAI chat `tools` array.
    pub fn openai_tools(&self) -> Vec<Value> {
        self.definitions().map(ToolDefinition::to_openai).collect()
    }

    /// Dispatches one OpenAI chat `tool_calls` entry
    /// (`{"id","type":"function","function":{"name","arguments":"<JSON text>"}}`; `arguments`
    /// given as an object is accepted too) and returns the tool message
    /// `{"role":"tool","tool_call_id","content"}`. The `id` goes to tracing, not into the key. A
    /// call whose `type` is not `function` runs nothing and is answered with an error.
    pub async fn call_openai(&self, run: &Run, tool_call: &Value) -> Value {
        let (id, bad_id) = super::call_id(tool_call.get("id"), "`id`");
        let refused = bad_id.or_else(|| super::wrong_type(tool_call, "function"));
        let function = tool_call.get("function");
        let name = super::call_name(function.and_then(|f| f.get("name")), "`function.name`");
        let args = Arguments::of(function.and_then(|f| f.get("arguments")), true);
        let result = self.call_envelope(run, &id, refused, name, args).await;
        result.to_openai_message(&id)
    }
}

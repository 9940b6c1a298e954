//! Anthropic messages: `tools[i]` definitions, a `tool_use` block in, a `tool_result` block out.

use serde_json::{Value, json};

use super::{Arguments, ToolDefinition, ToolResult, ToolSet};
use crate::executor::Run;

impl ToolDefinition {
    /// An Anthropic `tools[i]` entry: `{"name","description","input_schema"}`.
    pub fn to_anthropic(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        })
    }
}

impl ToolResult {
    /// An Anthropic `tool_result` content block:
    /// `{"type":"tool_result","tool_use_id","content","is_error"}`.
    pub fn to_anthropic_block(&self, tool_use_id: &str) -> Value {
        json!({
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": self.text,
            "is_error": self.is_error,
        })
    }
}

impl ToolSet {
    /// Anthropic `tools` array.
    pub fn anthropic_tools(&self) -> Vec<Value> {
        self.definitions().map(ToolDefinition::to_anthropic).collect()
    }

    /// Dispatches one Anthropic `tool_use` content block (`{"type":"tool_use","id","name","input"}`)
    /// and returns the `tool_result` block `{"type":"tool_result","tool_use_id","content","is_error"}`.
    /// A block whose `type` is not `tool_use` (a `server_tool_use` or `mcp_tool_use` block, which
    /// Anthropic ran itself) runs nothing and is answered with an error result.
    pub async fn call_anthropic(&self, run: &Run, block: &Value) -> Value {
        let (id, bad_id) = super::call_id(block.get("id"), "`id`");
        let refused = bad_id.or_else(|| super::wrong_type(block, "tool_use"));
        let name = super::call_name(block.get("name"), "`name`");
        let args = Arguments::of(block.get("input"), false);
        let result = self.call_envelope(run, &id, refused, name, args).await;
        result.to_anthropic_block(&id)
    }
}

//! Anthropic dispatch of arbitrary input: the first byte picks the tool, the rest is read as
//! JSON (or, when it is not JSON, sent as a string) and becomes the `tool_use` block's `input`.
//! Every input gets a `tool_result`; a repeat gets the same answer.

#![no_main]

use idem_fuzz::{NAMES, idem, runtime, tools};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let Some((pick, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let name = NAMES[usize::from(*pick) % NAMES.len()];
    let input = serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::from(text));
    let tools = tools();
    let run = idem().run("fuzz");
    let block = json!({"type": "tool_use", "id": "toolu_1", "name": name, "input": input});
    let first = runtime().block_on(tools.call_anthropic(&run, &block));
    assert_eq!(first["type"], "tool_result");
    assert_eq!(first["tool_use_id"], "toolu_1");
    assert!(first["content"].is_string() && first["is_error"].is_boolean(), "{first}");
    let again = runtime().block_on(tools.call_anthropic(&run, &block));
    assert_eq!(first, again);
});

//! OpenAI dispatch of arbitrary argument text: the first byte picks the tool, the rest is
//! `function.arguments`. Every input gets a tool message; a repeat of the same call gets the
//! same answer (a replay, or the same refusal).

#![no_main]

use idem_fuzz::{NAMES, idem, runtime, tools};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Some((pick, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let name = NAMES[usize::from(*pick) % NAMES.len()];
    let tools = tools();
    let run = idem().run("fuzz");
    let call = json!({"id": "call_1", "type": "function",
                      "function": {"name": name, "arguments": text}});
    let first = runtime().block_on(tools.call_openai(&run, &call));
    assert_eq!(first["role"], "tool");
    assert_eq!(first["tool_call_id"], "call_1");
    assert!(first["content"].is_string(), "{first}");
    let again = runtime().block_on(tools.call_openai(&run, &call));
    assert_eq!(first, again);
});

//! An MCP request line: the first byte chooses between the whole line as fuzz text and a
//! `tools/call` whose `arguments` are the fuzz text. The line goes through idem-mcp's checks
//! (`jsonrpc::check_message`, what the stdio transport runs on every line); a well-formed
//! `tools/call` is then dispatched through `ToolSet::call_mcp`. A reply is always a JSON-RPC 2.0
//! message with `error` or `result`.

#![no_main]

use idem_fuzz::{NAMES, idem, runtime, tools};
use idem_mcp::jsonrpc::{Inbound, check_message};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((pick, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let line = if pick & 1 == 0 {
        text.to_owned()
    } else {
        let name = NAMES[usize::from(pick >> 1) % NAMES.len()];
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{name}","arguments":{text}}}}}"#
        )
    };
    match check_message(&line) {
        Inbound::Reply(reply) => {
            assert_eq!(reply["jsonrpc"], "2.0", "{reply}");
            assert!(reply.get("error").is_some() || reply.get("result").is_some(), "{reply}");
        }
        Inbound::Ignore => {}
        Inbound::Message(_) => {
            let Ok(message) = serde_json::from_str::<Value>(&line) else { return };
            if message["method"] != "tools/call" {
                return;
            }
            let run = idem().run("fuzz");
            match runtime().block_on(tools().call_mcp(&run, &message["params"])) {
                Ok(result) => {
                    assert!(result["isError"].is_boolean(), "{result}");
                    assert!(result["content"][0]["text"].is_string(), "{result}");
                }
                Err(e) => assert_eq!(e.code, -32602, "{e}"),
            }
        }
    }
});
